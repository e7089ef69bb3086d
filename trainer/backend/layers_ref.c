/* The reference layers (layers_ref.h): every output element computed on its
 * own from the definition, sums in double in a fixed order, so the result is
 * deterministic and accurate enough to judge the fast paths by. */
#include "trainer/backend/layers_ref.h"

#include <math.h>
#include <string.h>

#include "trainer/backend/kernel_math.h"

/* One output element of the convolution: bias + the window's products. */
static float conv_point(const conv_shape *s, const float *x, const float *w, const float *bias,
                        int i, int kk, int oy, int ox) {
  double acc = bias != NULL ? bias[kk] : 0.0;
  for (int ci = 0; ci < s->c; ci++) {
    const float *plane = x + ((size_t)i * s->c + ci) * s->h * s->w;
    const float *filter = w + ((size_t)kk * s->c + ci) * s->kh * s->kw;
    for (int ki = 0; ki < s->kh; ki++) {
      int iy = oy * s->stride - s->pad + ki;
      if (iy < 0 || iy >= s->h) continue;
      for (int kj = 0; kj < s->kw; kj++) {
        int ix = ox * s->stride - s->pad + kj;
        if (ix < 0 || ix >= s->w) continue;
        acc += (double)plane[(size_t)iy * s->w + ix] * filter[ki * s->kw + kj];
      }
    }
  }
  return (float)acc;
}

void layers_ref_conv_forward(const conv_shape *s, const float *x, const float *w,
                             const float *bias, float *y) {
  size_t o = 0;
  for (int i = 0; i < s->n; i++)
    for (int kk = 0; kk < s->k; kk++)
      for (int oy = 0; oy < s->oh; oy++)
        for (int ox = 0; ox < s->ow; ox++) y[o++] = conv_point(s, x, w, bias, i, kk, oy, ox);
}

/* dw[kk][ci][ki][kj]: dy times the input each output read at that tap. */
static float conv_dw_point(const conv_shape *s, const float *x, const float *dy, int kk, int ci,
                           int ki, int kj) {
  double acc = 0.0;
  for (int i = 0; i < s->n; i++) {
    const float *plane = x + ((size_t)i * s->c + ci) * s->h * s->w;
    const float *grad = dy + ((size_t)i * s->k + kk) * s->oh * s->ow;
    for (int oy = 0; oy < s->oh; oy++) {
      int iy = oy * s->stride - s->pad + ki;
      if (iy < 0 || iy >= s->h) continue;
      for (int ox = 0; ox < s->ow; ox++) {
        int ix = ox * s->stride - s->pad + kj;
        if (ix < 0 || ix >= s->w) continue;
        acc += (double)grad[oy * s->ow + ox] * plane[(size_t)iy * s->w + ix];
      }
    }
  }
  return (float)acc;
}

/* dx[i][ci][iy][ix]: every output whose window covers the input, gathered. */
static float conv_dx_point(const conv_shape *s, const float *w, const float *dy, int i, int ci,
                           int iy, int ix) {
  double acc = 0.0;
  for (int kk = 0; kk < s->k; kk++) {
    const float *grad = dy + ((size_t)i * s->k + kk) * s->oh * s->ow;
    const float *filter = w + ((size_t)kk * s->c + ci) * s->kh * s->kw;
    for (int ki = 0; ki < s->kh; ki++) {
      int ty = iy + s->pad - ki; /* = oy * stride */
      if (ty < 0 || ty % s->stride != 0 || ty / s->stride >= s->oh) continue;
      for (int kj = 0; kj < s->kw; kj++) {
        int tx = ix + s->pad - kj;
        if (tx < 0 || tx % s->stride != 0 || tx / s->stride >= s->ow) continue;
        acc += (double)grad[(ty / s->stride) * s->ow + tx / s->stride] * filter[ki * s->kw + kj];
      }
    }
  }
  return (float)acc;
}

void layers_ref_conv_backward(const conv_shape *s, const float *x, const float *w,
                              const float *dy, float *dx, float *dw, float *dbias) {
  size_t o = 0;
  for (int kk = 0; kk < s->k; kk++)
    for (int ci = 0; ci < s->c; ci++)
      for (int ki = 0; ki < s->kh; ki++)
        for (int kj = 0; kj < s->kw; kj++) dw[o++] = conv_dw_point(s, x, dy, kk, ci, ki, kj);
  if (dbias != NULL) {
    size_t ohw = (size_t)s->oh * s->ow;
    for (int kk = 0; kk < s->k; kk++) {
      double acc = 0.0;
      for (int i = 0; i < s->n; i++) {
        const float *grad = dy + ((size_t)i * s->k + kk) * ohw;
        for (size_t p = 0; p < ohw; p++) acc += grad[p];
      }
      dbias[kk] = (float)acc;
    }
  }
  if (dx == NULL) return;
  o = 0;
  for (int i = 0; i < s->n; i++)
    for (int ci = 0; ci < s->c; ci++)
      for (int iy = 0; iy < s->h; iy++)
        for (int ix = 0; ix < s->w; ix++) dx[o++] = conv_dx_point(s, w, dy, i, ci, iy, ix);
}

/* The window's max and the offset in the plane of its first occurrence (-1
 * when the window holds no input position). */
static float pool_window_max(const pool_shape *s, const float *plane, int oy, int ox,
                             long *where) {
  float m = 0.0f;
  *where = -1;
  for (int ki = 0; ki < s->kh; ki++) {
    int iy = oy * s->stride - s->pad + ki;
    if (iy < 0 || iy >= s->h) continue;
    for (int kj = 0; kj < s->kw; kj++) {
      int ix = ox * s->stride - s->pad + kj;
      if (ix < 0 || ix >= s->w) continue;
      float v = plane[(size_t)iy * s->w + ix];
      if (*where < 0 || v > m) {
        m = v;
        *where = (long)iy * s->w + ix;
      }
    }
  }
  return m;
}

void layers_ref_maxpool_forward(const pool_shape *s, const float *x, float *y) {
  size_t hw = (size_t)s->h * s->w, o = 0;
  for (size_t p = 0; p < (size_t)s->n * s->c; p++)
    for (int oy = 0; oy < s->oh; oy++)
      for (int ox = 0; ox < s->ow; ox++) {
        long where;
        y[o++] = pool_window_max(s, x + p * hw, oy, ox, &where);
      }
}

/* The first position equal to y: the forward's max, as backend.h specifies
 * from x and y (not from a recorded index). */
void layers_ref_maxpool_backward(const pool_shape *s, const float *x, const float *y,
                                 const float *dy, float *dx) {
  size_t hw = (size_t)s->h * s->w, ohw = (size_t)s->oh * s->ow;
  memset(dx, 0, (size_t)s->n * s->c * hw * sizeof *dx);
  for (size_t p = 0; p < (size_t)s->n * s->c; p++) {
    const float *plane = x + p * hw;
    for (int oy = 0; oy < s->oh; oy++)
      for (int ox = 0; ox < s->ow; ox++) {
        size_t o = p * ohw + (size_t)oy * s->ow + ox;
        for (int ki = 0, done = 0; ki < s->kh && !done; ki++) {
          int iy = oy * s->stride - s->pad + ki;
          if (iy < 0 || iy >= s->h) continue;
          for (int kj = 0; kj < s->kw && !done; kj++) {
            int ix = ox * s->stride - s->pad + kj;
            if (ix < 0 || ix >= s->w || plane[(size_t)iy * s->w + ix] != y[o]) continue;
            dx[p * hw + (size_t)iy * s->w + ix] += dy[o];
            done = 1;
          }
        }
      }
  }
}

void layers_ref_avgpool_forward(int n, int c, int hw, const float *x, float *y) {
  for (size_t p = 0; p < (size_t)n * c; p++) {
    double acc = 0.0;
    for (int j = 0; j < hw; j++) acc += x[p * hw + j];
    y[p] = (float)(acc / hw);
  }
}

void layers_ref_avgpool_backward(int n, int c, int hw, const float *dy, float *dx) {
  for (size_t p = 0; p < (size_t)n * c; p++) {
    float g = dy[p] / (float)hw;
    for (int j = 0; j < hw; j++) dx[p * hw + j] = g;
  }
}

/* Channel ch's sum of f(x) over n and hw, f picked by `square` around mean. */
static double bn_channel_sum(const bn_shape *s, const float *x, int ch, int square, double mean) {
  double acc = 0.0;
  for (int i = 0; i < s->n; i++) {
    const float *row = x + ((size_t)i * s->c + ch) * s->hw;
    for (int j = 0; j < s->hw; j++) {
      double d = row[j] - mean;
      acc += square ? d * d : row[j];
    }
  }
  return acc;
}

void layers_ref_bn_forward_train(const bn_shape *s, const float *x, const float *gamma,
                                 const float *beta, float *y, float *save_mean,
                                 float *save_invstd, float *running_mean, float *running_var,
                                 float momentum) {
  double m = (double)s->n * s->hw;
  for (int ch = 0; ch < s->c; ch++) {
    double mean = bn_channel_sum(s, x, ch, 0, 0.0) / m;
    double var = bn_channel_sum(s, x, ch, 1, mean) / m; /* two passes: no cancellation */
    float fmean = (float)mean, invstd = 1.0f / sqrtf((float)var + s->eps);
    save_mean[ch] = fmean;
    save_invstd[ch] = invstd;
    if (running_mean != NULL) {
      float unbiased = (float)(m > 1.0 ? var * m / (m - 1.0) : var);
      running_mean[ch] = (1.0f - momentum) * running_mean[ch] + momentum * fmean;
      running_var[ch] = (1.0f - momentum) * running_var[ch] + momentum * unbiased;
    }
    for (int i = 0; i < s->n; i++) {
      size_t off = ((size_t)i * s->c + ch) * s->hw;
      for (int j = 0; j < s->hw; j++)
        y[off + j] = gamma[ch] * (x[off + j] - fmean) * invstd + beta[ch];
    }
  }
}

void layers_ref_bn_forward_infer(const bn_shape *s, const float *x, const float *gamma,
                                 const float *beta, const float *mean, const float *var,
                                 float *y) {
  for (int ch = 0; ch < s->c; ch++) {
    float invstd = 1.0f / sqrtf(var[ch] + s->eps);
    for (int i = 0; i < s->n; i++) {
      size_t off = ((size_t)i * s->c + ch) * s->hw;
      for (int j = 0; j < s->hw; j++)
        y[off + j] = gamma[ch] * (x[off + j] - mean[ch]) * invstd + beta[ch];
    }
  }
}

/* dx = gamma invstd / M (M dy - sum dy - xhat sum(dy xhat)), M = n hw. */
void layers_ref_bn_backward(const bn_shape *s, const float *x, const float *dy,
                            const float *gamma, const float *save_mean, const float *save_invstd,
                            float *dx, float *dgamma, float *dbeta, int accumulate) {
  double m = (double)s->n * s->hw;
  for (int ch = 0; ch < s->c; ch++) {
    float mean = save_mean[ch], invstd = save_invstd[ch];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int i = 0; i < s->n; i++) {
      size_t off = ((size_t)i * s->c + ch) * s->hw;
      for (int j = 0; j < s->hw; j++) {
        sum_dy += dy[off + j];
        sum_dy_xhat += (double)dy[off + j] * ((x[off + j] - mean) * invstd);
      }
    }
    dgamma[ch] = (float)sum_dy_xhat + (accumulate ? dgamma[ch] : 0.0f);
    dbeta[ch] = (float)sum_dy + (accumulate ? dbeta[ch] : 0.0f);
    float k = (float)(gamma[ch] * invstd / m), fm = (float)m;
    float sdy = (float)sum_dy, sdyx = (float)sum_dy_xhat;
    for (int i = 0; i < s->n; i++) {
      size_t off = ((size_t)i * s->c + ch) * s->hw;
      for (int j = 0; j < s->hw; j++) {
        float xhat = (x[off + j] - mean) * invstd;
        dx[off + j] = k * (fm * dy[off + j] - sdy - xhat * sdyx);
      }
    }
  }
}

void layers_ref_relu_forward(float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = kernel_relu(x[i]);
}

void layers_ref_relu_backward(float *dx, const float *dy, const float *y, size_t n) {
  for (size_t i = 0; i < n; i++) dx[i] = kernel_relu_grad(dy[i], y[i]);
}

void layers_ref_add(float *y, const float *a, const float *x, float scale, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = a[i] + scale * x[i];
}

void layers_ref_copy(float *dst, const float *src, size_t n) {
  if (dst != src) memmove(dst, src, n * sizeof *dst);
}
