/* The CPU backend's pooling, batch-norm and element-wise ops: the
 * reference's arithmetic (layers_ref.c) with the window bounds hoisted out
 * of the inner loops and the sums in eight float lanes, which vectorize and
 * stay deterministic (no threads, a fixed order). */
#include <math.h>
#include <string.h>

#include "trainer/backend/kernel_math.h"
#include "trainer/backend/layers_cpu.h"

#define LANES 8

double cpu_sum(const float *x, size_t n) {
  float lane[LANES] = {0};
  size_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int l = 0; l < LANES; l++) lane[l] += x[i + l];
  double acc = 0.0;
  for (int l = 0; l < LANES; l++) acc += lane[l];
  for (; i < n; i++) acc += x[i];
  return acc;
}

/* Sum of (a - mean) * (b - mean_b) where b is a when b == NULL. */
static double dot_centered(const float *a, float mean, const float *b, size_t n) {
  float lane[LANES] = {0};
  const float *other = b != NULL ? b : a;
  float mean_b = b != NULL ? 0.0f : mean;
  size_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int l = 0; l < LANES; l++) lane[l] += (a[i + l] - mean) * (other[i + l] - mean_b);
  double acc = 0.0;
  for (int l = 0; l < LANES; l++) acc += lane[l];
  for (; i < n; i++) acc += (double)(a[i] - mean) * (other[i] - mean_b);
  return acc;
}

/* The input rows or columns [lo, hi) that output o's window covers. */
static void window(int o, int stride, int pad, int k, int in, int *lo, int *hi) {
  int start = o * stride - pad;
  *lo = start < 0 ? 0 : start;
  *hi = start + k > in ? in : start + k;
}

/* 2x2 windows at stride 2, unpadded (LeNet's, VGG's): they tile the input,
 * so each output reads its four inputs without window bounds. */
static int pool_is_2x2(const pool_shape *s) {
  return s->kh == 2 && s->kw == 2 && s->stride == 2 && s->pad == 0 && s->oh == s->h / 2 &&
         s->ow == s->w / 2;
}

/* The reference's order: the window's first element, then each in turn
 * replacing the max only when greater (the same bits, NaN included). */
static void maxpool_2x2_forward(const pool_shape *s, const float *restrict x, float *restrict y) {
  size_t hw = (size_t)s->h * s->w;
  for (size_t p = 0; p < (size_t)s->n * s->c; p++)
    for (int oy = 0; oy < s->oh; oy++) {
      const float *r0 = x + p * hw + (size_t)(2 * oy) * s->w, *r1 = r0 + s->w;
      float *out = y + (p * s->oh + oy) * s->ow;
      for (int ox = 0; ox < s->ow; ox++) {
        float m = r0[2 * ox], v = r0[2 * ox + 1];
        m = v > m ? v : m;
        v = r1[2 * ox];
        m = v > m ? v : m;
        v = r1[2 * ox + 1];
        out[ox] = v > m ? v : m;
      }
    }
}

/* The gradient goes to the window's first input equal to its max (0 + g,
 * as the reference adds onto zeros); the rest, and the rows and columns no
 * window covers, get 0. Writes every dx element: no memset first. */
static void maxpool_2x2_backward(const pool_shape *s, const float *restrict x,
                                 const float *restrict y, const float *restrict dy,
                                 float *restrict dx) {
  size_t hw = (size_t)s->h * s->w;
  for (size_t p = 0; p < (size_t)s->n * s->c; p++) {
    for (int oy = 0; oy < s->oh; oy++) {
      size_t r = p * hw + (size_t)(2 * oy) * s->w, o = (p * s->oh + oy) * s->ow;
      for (int ox = 0; ox < s->ow; ox++) {
        size_t a = r + 2 * ox, b = a + 1, c = a + s->w, d = c + 1;
        float m = y[o + ox], g = 0.0f + dy[o + ox];
        /* Bitwise & and |: no branches, the loop vectorizes. */
        int ea = x[a] == m, eb = x[b] == m, ec = x[c] == m, ed = x[d] == m;
        int ha = ea, hb = eb & !ea, hc = ec & !(ea | eb), hd = ed & !(ea | eb | ec);
        dx[a] = ha ? g : 0.0f;
        dx[b] = hb ? g : 0.0f;
        dx[c] = hc ? g : 0.0f;
        dx[d] = hd ? g : 0.0f;
      }
      if (s->w % 2) dx[r + s->w - 1] = dx[r + 2 * (size_t)s->w - 1] = 0.0f;
    }
    if (s->h % 2)
      for (int j = 0; j < s->w; j++) dx[p * hw + (size_t)(s->h - 1) * s->w + j] = 0.0f;
  }
}

ps_err cpu_maxpool_forward(backend *b, const pool_shape *s, const float *x, float *y,
                           ps_error *err) {
  (void)b;
  (void)err;
  if (pool_is_2x2(s)) {
    maxpool_2x2_forward(s, x, y);
    return PS_ERR_OK;
  }
  size_t hw = (size_t)s->h * s->w;
  for (size_t p = 0; p < (size_t)s->n * s->c; p++) {
    const float *plane = x + p * hw;
    for (int oy = 0; oy < s->oh; oy++) {
      int y0, y1;
      window(oy, s->stride, s->pad, s->kh, s->h, &y0, &y1);
      for (int ox = 0; ox < s->ow; ox++) {
        int x0, x1;
        window(ox, s->stride, s->pad, s->kw, s->w, &x0, &x1);
        float m = 0.0f; /* an empty window (pad >= kernel): 0, as the reference */
        if (y0 < y1 && x0 < x1) m = plane[(size_t)y0 * s->w + x0];
        for (int iy = y0; iy < y1; iy++)
          for (int ix = x0; ix < x1; ix++) {
            float v = plane[(size_t)iy * s->w + ix];
            m = v > m ? v : m;
          }
        *y++ = m;
      }
    }
  }
  return PS_ERR_OK;
}

/* Adds g at the first position of the window [y0, y1) x [x0, x1) equal to m. */
static void route_to_max(const pool_shape *s, const float *plane, float *dplane, int y0, int y1,
                         int x0, int x1, float m, float g) {
  for (int iy = y0; iy < y1; iy++)
    for (int ix = x0; ix < x1; ix++) {
      size_t at = (size_t)iy * s->w + ix;
      if (plane[at] == m) {
        dplane[at] += g;
        return;
      }
    }
}

ps_err cpu_maxpool_backward(backend *b, const pool_shape *s, const float *x, const float *y,
                            const float *dy, float *dx, ps_error *err) {
  (void)b;
  (void)err;
  if (pool_is_2x2(s)) {
    maxpool_2x2_backward(s, x, y, dy, dx);
    return PS_ERR_OK;
  }
  size_t hw = (size_t)s->h * s->w;
  memset(dx, 0, (size_t)s->n * s->c * hw * sizeof *dx);
  for (size_t p = 0; p < (size_t)s->n * s->c; p++) {
    for (int oy = 0; oy < s->oh; oy++) {
      int y0, y1;
      window(oy, s->stride, s->pad, s->kh, s->h, &y0, &y1);
      for (int ox = 0; ox < s->ow; ox++) {
        int x0, x1;
        window(ox, s->stride, s->pad, s->kw, s->w, &x0, &x1);
        route_to_max(s, x + p * hw, dx + p * hw, y0, y1, x0, x1, *y++, *dy++);
      }
    }
  }
  return PS_ERR_OK;
}

ps_err cpu_avgpool_forward(backend *b, int n, int c, int hw, const float *x, float *y,
                           ps_error *err) {
  (void)b;
  (void)err;
  for (size_t p = 0; p < (size_t)n * c; p++) y[p] = (float)(cpu_sum(x + p * hw, hw) / hw);
  return PS_ERR_OK;
}

ps_err cpu_avgpool_backward(backend *b, int n, int c, int hw, const float *dy, float *dx,
                            ps_error *err) {
  (void)b;
  (void)err;
  for (size_t p = 0; p < (size_t)n * c; p++) {
    float g = dy[p] / (float)hw;
    for (int j = 0; j < hw; j++) dx[p * hw + j] = g;
  }
  return PS_ERR_OK;
}

/* --- work split over the backend's threads ----------------------------------
 * Batch norm by channels, the element-wise ops by ranges: each output's
 * arithmetic is the same whatever the split, so the bits do not depend on
 * --threads. Ops under SPLIT_MIN floats run on the calling thread. */

#define SPLIT_MIN 65536

static int split_parts(backend *b, size_t work, size_t units) {
  int t = cpu_pool_threads(backend_cpu_pool(b));
  if (work < SPLIT_MIN || units < 2) return 1;
  return (size_t)t < units ? t : (int)units;
}

typedef struct bn_job {
  const bn_shape *s;
  const float *x, *dy, *gamma, *beta, *mean, *invstd;
  float *y, *dx, *save_mean, *save_invstd, *running_mean, *running_var, *dgamma, *dbeta;
  float momentum;
  int accumulate;
} bn_job;

static void bn_forward_train_channels(const bn_job *job, int ch0, int ch1) {
  const bn_shape *s = job->s;
  const float *x = job->x, *gamma = job->gamma, *beta = job->beta;
  float *y = job->y, *save_mean = job->save_mean, *save_invstd = job->save_invstd;
  float *running_mean = job->running_mean, *running_var = job->running_var, momentum = job->momentum;
  double m = (double)s->n * s->hw;
  size_t stride = (size_t)s->c * s->hw;
  for (int ch = ch0; ch < ch1; ch++) {
    const float *xc = x + (size_t)ch * s->hw;
    double sum = 0.0, sq = 0.0;
    for (int i = 0; i < s->n; i++) sum += cpu_sum(xc + i * stride, s->hw);
    float mean = (float)(sum / m);
    /* Two passes, around the mean: no cancellation in the variance. */
    for (int i = 0; i < s->n; i++) sq += dot_centered(xc + i * stride, mean, NULL, s->hw);
    double var = sq / m;
    float invstd = 1.0f / sqrtf((float)var + s->eps);
    save_mean[ch] = mean;
    save_invstd[ch] = invstd;
    if (running_mean != NULL) {
      float unbiased = (float)(m > 1.0 ? var * m / (m - 1.0) : var);
      running_mean[ch] = (1.0f - momentum) * running_mean[ch] + momentum * mean;
      running_var[ch] = (1.0f - momentum) * running_var[ch] + momentum * unbiased;
    }
    float g = gamma[ch], bt = beta[ch];
    for (int i = 0; i < s->n; i++) {
      const float *in = xc + i * stride;
      float *out = y + (size_t)ch * s->hw + i * stride;
      for (int j = 0; j < s->hw; j++) out[j] = g * (in[j] - mean) * invstd + bt;
    }
  }
}

static void bn_forward_train_part(void *ctx, int part, int parts) {
  const bn_job *j = ctx;
  size_t ch0, ch1;
  cpu_pool_range((size_t)j->s->c, part, parts, &ch0, &ch1);
  bn_forward_train_channels(j, (int)ch0, (int)ch1);
}

ps_err cpu_bn_forward_train(backend *b, const bn_shape *s, const float *x, const float *gamma,
                            const float *beta, float *y, float *save_mean, float *save_invstd,
                            float *running_mean, float *running_var, float momentum,
                            ps_error *err) {
  (void)err;
  bn_job j = {.s = s, .x = x, .gamma = gamma, .beta = beta, .y = y, .save_mean = save_mean,
              .save_invstd = save_invstd, .running_mean = running_mean,
              .running_var = running_var, .momentum = momentum};
  size_t work = (size_t)s->n * s->c * s->hw;
  cpu_pool_run(backend_cpu_pool(b), split_parts(b, work, (size_t)s->c), bn_forward_train_part, &j);
  return PS_ERR_OK;
}

ps_err cpu_bn_forward_infer(backend *b, const bn_shape *s, const float *x, const float *gamma,
                            const float *beta, const float *mean, const float *var, float *y,
                            ps_error *err) {
  (void)b;
  (void)err;
  for (int ch = 0; ch < s->c; ch++) {
    float invstd = 1.0f / sqrtf(var[ch] + s->eps), g = gamma[ch], bt = beta[ch], mu = mean[ch];
    for (int i = 0; i < s->n; i++) {
      size_t off = ((size_t)i * s->c + ch) * s->hw;
      for (int j = 0; j < s->hw; j++) y[off + j] = g * (x[off + j] - mu) * invstd + bt;
    }
  }
  return PS_ERR_OK;
}

static void bn_backward_channels(const bn_job *job, int ch0, int ch1) {
  const bn_shape *s = job->s;
  const float *x = job->x, *dy = job->dy, *gamma = job->gamma, *save_mean = job->mean;
  const float *save_invstd = job->invstd;
  float *dx = job->dx, *dgamma = job->dgamma, *dbeta = job->dbeta;
  int accumulate = job->accumulate;
  double m = (double)s->n * s->hw;
  size_t stride = (size_t)s->c * s->hw;
  for (int ch = ch0; ch < ch1; ch++) {
    float mean = save_mean[ch], invstd = save_invstd[ch];
    size_t base = (size_t)ch * s->hw;
    double sum_dy = 0.0, sum_dy_xc = 0.0;
    for (int i = 0; i < s->n; i++) {
      sum_dy += cpu_sum(dy + base + i * stride, s->hw);
      sum_dy_xc += dot_centered(x + base + i * stride, mean, dy + base + i * stride, s->hw);
    }
    double sum_dy_xhat = sum_dy_xc * invstd;
    dgamma[ch] = (float)sum_dy_xhat + (accumulate ? dgamma[ch] : 0.0f);
    dbeta[ch] = (float)sum_dy + (accumulate ? dbeta[ch] : 0.0f);
    float k = (float)(gamma[ch] * invstd / m), fm = (float)m;
    float sdy = (float)sum_dy, sdyx = (float)sum_dy_xhat;
    for (int i = 0; i < s->n; i++) {
      const float *in = x + base + i * stride, *g = dy + base + i * stride;
      float *out = dx + base + i * stride;
      for (int j = 0; j < s->hw; j++)
        out[j] = k * (fm * g[j] - sdy - (in[j] - mean) * invstd * sdyx);
    }
  }
}

static void bn_backward_part(void *ctx, int part, int parts) {
  const bn_job *j = ctx;
  size_t ch0, ch1;
  cpu_pool_range((size_t)j->s->c, part, parts, &ch0, &ch1);
  bn_backward_channels(j, (int)ch0, (int)ch1);
}

ps_err cpu_bn_backward(backend *b, const bn_shape *s, const float *x, const float *dy,
                       const float *gamma, const float *save_mean, const float *save_invstd,
                       float *dx, float *dgamma, float *dbeta, int accumulate, ps_error *err) {
  (void)err;
  bn_job j = {.s = s, .x = x, .dy = dy, .gamma = gamma, .mean = save_mean, .invstd = save_invstd,
              .dx = dx, .dgamma = dgamma, .dbeta = dbeta, .accumulate = accumulate};
  size_t work = (size_t)s->n * s->c * s->hw;
  cpu_pool_run(backend_cpu_pool(b), split_parts(b, work, (size_t)s->c), bn_backward_part, &j);
  return PS_ERR_OK;
}

typedef enum { EW_RELU, EW_RELU_GRAD, EW_ADD } ew_kind;

typedef struct ew_job {
  ew_kind kind;
  float *out;
  const float *a, *x; /* relu: x; relu grad: a = dy, x = y; add: out = a + scale x */
  float scale;
  size_t n;
} ew_job;

static void ew_part(void *ctx, int part, int parts) {
  const ew_job *j = ctx;
  size_t lo, hi;
  cpu_pool_range(j->n, part, parts, &lo, &hi);
  float *out = j->out; /* may be a or x: in place */
  const float *a = j->a, *x = j->x;
  switch (j->kind) {
  case EW_RELU:
    for (size_t i = lo; i < hi; i++) out[i] = kernel_relu(x[i]);
    break;
  case EW_RELU_GRAD:
    for (size_t i = lo; i < hi; i++) out[i] = kernel_relu_grad(a[i], x[i]);
    break;
  case EW_ADD:
    for (size_t i = lo; i < hi; i++) out[i] = a[i] + j->scale * x[i];
    break;
  }
}

static void ew_run(backend *b, ew_job *j) {
  cpu_pool_run(backend_cpu_pool(b), split_parts(b, j->n, j->n), ew_part, j);
}

ps_err cpu_relu_forward(backend *b, float *y, const float *x, size_t n, ps_error *err) {
  (void)err;
  ew_job j = {.kind = EW_RELU, .out = y, .x = x, .n = n};
  ew_run(b, &j);
  return PS_ERR_OK;
}

ps_err cpu_relu_backward(backend *b, float *dx, const float *dy, const float *y, size_t n,
                         ps_error *err) {
  (void)err;
  ew_job j = {.kind = EW_RELU_GRAD, .out = dx, .a = dy, .x = y, .n = n};
  ew_run(b, &j);
  return PS_ERR_OK;
}

ps_err cpu_add(backend *b, float *y, const float *a, const float *x, float scale, size_t n,
               ps_error *err) {
  (void)err;
  ew_job j = {.kind = EW_ADD, .out = y, .a = a, .x = x, .scale = scale, .n = n};
  ew_run(b, &j);
  return PS_ERR_OK;
}

ps_err cpu_layer_copy(backend *b, float *dst, const float *src, size_t n, ps_error *err) {
  (void)b;
  (void)err;
  if (dst != src) memmove(dst, src, n * sizeof *dst);
  return PS_ERR_OK;
}
