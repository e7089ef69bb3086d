/* CPU/GPU parity (label "gpu"): every CUDA kernel, cuBLAS through the shared
 * gemm mapping, and a whole forward + backward step of the reference MLP
 * give the CPU backend's results on random inputs, within relative error
 * (max |gpu - cpu| / max |cpu|): 1e-5 for element-wise kernels (nvcc fuses
 * multiply-adds), 1e-4 for GEMMs and the full step (other summation orders).
 * The convolutional layers' ops (conv, max and global average pooling, batch
 * norm, relu, add, copy) are compared with a double-precision reference kept
 * here and, where the CPU backend has the op, with the CPU backend too:
 * 1e-5 element-wise (relu, add, copy, pooling), 1e-4 conv and batch norm.
 * The CUDA backend comes from the CUDA module, as the trainer's does
 * (cuda_load.h; ctest sets PSTRAIN_CUDA_MODULE).
 * Exits 77 (skipped) where no GPU is visible or the build has no CUDA. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fp_env.h"
#include "common/rng.h"
#include "tests/check.h"
#include "trainer/backend/backend.h"
#include "trainer/model/mlp.h"
#ifdef PSTRAIN_HAVE_CUDA
#include "trainer/backend/cuda_load.h"
#endif

#ifndef PSTRAIN_HAVE_CUDA
int main(void) {
  fprintf(stderr, "SKIP: this build has no CUDA backend\n");
  return 77;
}
#else

static rng r;
static backend *cpu, *gpu;
static const cuda_module *cuda;

static void fill(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = (float)(rng_next(&r) >> 40) / 16777216.0f * 2.0f - 1.0f;
}

static double rel_error(const float *want, const float *got, size_t n) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < n; i++) {
    diff = fmax(diff, fabs((double)want[i] - got[i]));
    scale = fmax(scale, fabs((double)want[i]));
  }
  return diff / scale;
}

/* A device copy of host data. */
static float *to_gpu(const void *host, size_t bytes) {
  ps_error err;
  void *d = gpu->ops->alloc(gpu, bytes, &err);
  REQUIRE(d != NULL);
  REQUIRE(gpu->ops->upload(gpu, d, host, bytes, &err) == PS_ERR_OK);
  return d;
}

static void from_gpu(void *host, const void *dev, size_t bytes) {
  ps_error err;
  REQUIRE(gpu->ops->download(gpu, host, dev, bytes, &err) == PS_ERR_OK);
}

static void check_gemm(int ta, int tb, int M, int N, int K) {
  ps_error err;
  size_t a_n = (size_t)M * K, b_n = (size_t)K * N, c_n = (size_t)M * N;
  float *A = malloc(a_n * 4), *B = malloc(b_n * 4), *C = malloc(c_n * 4), *G = malloc(c_n * 4);
  REQUIRE(A && B && C && G);
  fill(A, a_n);
  fill(B, b_n);
  fill(C, c_n);
  float *dA = to_gpu(A, a_n * 4), *dB = to_gpu(B, b_n * 4), *dC = to_gpu(C, c_n * 4);
  int lda = ta ? M : K, ldb = tb ? K : N;
  gemm_call hc = gemm_row_major(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 0.25f, C, N);
  gemm_call dc = gemm_row_major(ta, tb, M, N, K, 0.5f, dA, lda, dB, ldb, 0.25f, dC, N);
  REQUIRE(cpu->ops->gemm(cpu, &hc, &err) == PS_ERR_OK);
  REQUIRE(gpu->ops->gemm(gpu, &dc, &err) == PS_ERR_OK);
  from_gpu(G, dC, c_n * 4);
  double e = rel_error(C, G, c_n);
  if (e > 1e-4) fprintf(stderr, "gemm ta=%d tb=%d %dx%dx%d: rel error %g\n", ta, tb, M, N, K, e);
  CHECK(e <= 1e-4);
  gpu->ops->free(gpu, dA);
  gpu->ops->free(gpu, dB);
  gpu->ops->free(gpu, dC);
  free(A);
  free(B);
  free(C);
  free(G);
}

/* --- the convolutional layers: references, in double ------------------------- */

static void ref_conv_forward(const conv_shape *s, const float *x, const float *w,
                             const float *bias, float *y) {
  for (int n = 0; n < s->n; n++)
    for (int k = 0; k < s->k; k++)
      for (int oy = 0; oy < s->oh; oy++)
        for (int ox = 0; ox < s->ow; ox++) {
          double acc = bias != NULL ? bias[k] : 0.0;
          for (int c = 0; c < s->c; c++)
            for (int i = 0; i < s->kh; i++)
              for (int j = 0; j < s->kw; j++) {
                int iy = oy * s->stride - s->pad + i, ix = ox * s->stride - s->pad + j;
                if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
                acc += (double)x[((size_t)(n * s->c + c) * s->h + iy) * s->w + ix] *
                       w[((size_t)(k * s->c + c) * s->kh + i) * s->kw + j];
              }
          y[((size_t)(n * s->k + k) * s->oh + oy) * s->ow + ox] = (float)acc;
        }
}

static void ref_conv_backward(const conv_shape *s, const float *x, const float *w,
                              const float *dy, float *dx, float *dw, float *dbias) {
  size_t xn = (size_t)s->n * s->c * s->h * s->w, wn = (size_t)s->k * s->c * s->kh * s->kw;
  double *ddx = calloc(xn, sizeof *ddx), *ddw = calloc(wn, sizeof *ddw);
  double *ddb = calloc((size_t)s->k, sizeof *ddb);
  REQUIRE(ddx && ddw && ddb);
  for (int n = 0; n < s->n; n++)
    for (int k = 0; k < s->k; k++)
      for (int oy = 0; oy < s->oh; oy++)
        for (int ox = 0; ox < s->ow; ox++) {
          double g = dy[((size_t)(n * s->k + k) * s->oh + oy) * s->ow + ox];
          ddb[k] += g;
          for (int c = 0; c < s->c; c++)
            for (int i = 0; i < s->kh; i++)
              for (int j = 0; j < s->kw; j++) {
                int iy = oy * s->stride - s->pad + i, ix = ox * s->stride - s->pad + j;
                if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
                size_t xi = ((size_t)(n * s->c + c) * s->h + iy) * s->w + ix;
                size_t wi = ((size_t)(k * s->c + c) * s->kh + i) * s->kw + j;
                ddx[xi] += g * w[wi];
                ddw[wi] += g * x[xi];
              }
        }
  for (size_t i = 0; i < xn; i++) dx[i] = (float)ddx[i];
  for (size_t i = 0; i < wn; i++) dw[i] = (float)ddw[i];
  for (int k = 0; k < s->k; k++) dbias[k] = (float)ddb[k];
  free(ddx);
  free(ddw);
  free(ddb);
}

/* Max pooling; padding is never the max; backward sends dy to the window's
 * first max (the inputs are distinct, so there are no ties). */
static void ref_maxpool(const pool_shape *s, const float *x, float *y, const float *dy,
                        float *dx) {
  if (dx != NULL) memset(dx, 0, (size_t)s->n * s->c * s->h * s->w * sizeof *dx);
  for (int nc = 0; nc < s->n * s->c; nc++)
    for (int oy = 0; oy < s->oh; oy++)
      for (int ox = 0; ox < s->ow; ox++) {
        size_t best = 0;
        float m = -INFINITY;
        for (int i = 0; i < s->kh; i++)
          for (int j = 0; j < s->kw; j++) {
            int iy = oy * s->stride - s->pad + i, ix = ox * s->stride - s->pad + j;
            if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
            size_t xi = ((size_t)nc * s->h + iy) * s->w + ix;
            if (x[xi] > m) {
              m = x[xi];
              best = xi;
            }
          }
        size_t yi = ((size_t)nc * s->oh + oy) * s->ow + ox;
        if (y != NULL) y[yi] = m;
        if (dx != NULL) dx[best] += dy[yi];
      }
}

/* Batch norm in training: y, the batch mean and invstd, the running update. */
static void ref_bn_train(const bn_shape *s, const float *x, const float *gamma, const float *beta,
                         float *y, float *mean, float *invstd, float *run_mean, float *run_var,
                         float momentum) {
  double m = (double)s->n * s->hw;
  for (int c = 0; c < s->c; c++) {
    double sum = 0, sq = 0;
    for (int n = 0; n < s->n; n++)
      for (int i = 0; i < s->hw; i++) sum += x[((size_t)n * s->c + c) * s->hw + i];
    double mu = sum / m;
    for (int n = 0; n < s->n; n++)
      for (int i = 0; i < s->hw; i++) {
        double d = x[((size_t)n * s->c + c) * s->hw + i] - mu;
        sq += d * d;
      }
    double var = sq / m, is = 1.0 / sqrt(var + s->eps);
    for (int n = 0; n < s->n; n++)
      for (int i = 0; i < s->hw; i++) {
        size_t k = ((size_t)n * s->c + c) * s->hw + i;
        y[k] = (float)(gamma[c] * (x[k] - mu) * is + beta[c]);
      }
    mean[c] = (float)mu;
    invstd[c] = (float)is;
    if (run_mean != NULL) {
      run_mean[c] = (float)((1.0 - momentum) * run_mean[c] + momentum * mu);
      run_var[c] = (float)((1.0 - momentum) * run_var[c] + momentum * var * m / (m - 1));
    }
  }
}

static void ref_bn_backward(const bn_shape *s, const float *x, const float *dy,
                            const float *gamma, const float *mean, const float *invstd, float *dx,
                            float *dgamma, float *dbeta, int accumulate) {
  double m = (double)s->n * s->hw;
  for (int c = 0; c < s->c; c++) {
    double sdy = 0, sdyx = 0;
    for (int n = 0; n < s->n; n++)
      for (int i = 0; i < s->hw; i++) {
        size_t k = ((size_t)n * s->c + c) * s->hw + i;
        sdy += dy[k];
        sdyx += dy[k] * (x[k] - mean[c]) * invstd[c];
      }
    for (int n = 0; n < s->n; n++)
      for (int i = 0; i < s->hw; i++) {
        size_t k = ((size_t)n * s->c + c) * s->hw + i;
        double xhat = (x[k] - mean[c]) * invstd[c];
        dx[k] = (float)(gamma[c] * invstd[c] / m * (m * dy[k] - sdy - xhat * sdyx));
      }
    dgamma[c] = (float)(sdyx + (accumulate ? dgamma[c] : 0.0));
    dbeta[c] = (float)(sdy + (accumulate ? dbeta[c] : 0.0));
  }
}

/* Compares one output with the reference and, when the CPU backend has the op
 * (cpu_out not NULL), with the CPU backend; says which when over tol. */
static void check_out(const char *what, const float *ref, const float *cpu_out, const float *got,
                      size_t n, double tol) {
  double e = rel_error(ref, got, n);
  if (e > tol) fprintf(stderr, "%s: GPU vs reference: rel error %g > %g\n", what, e, tol);
  CHECK(e <= tol);
  if (cpu_out != NULL) {
    e = rel_error(cpu_out, got, n);
    if (e > tol) fprintf(stderr, "%s: GPU vs CPU backend: rel error %g > %g\n", what, e, tol);
    CHECK(e <= tol);
  }
}

static float *host_floats(size_t n) {
  float *p = malloc((n > 0 ? n : 1) * sizeof *p);
  REQUIRE(p != NULL);
  return p;
}

/* Distinct values in [-1, 1): a random permutation of a grid, so max pooling has no ties. */
static void fill_distinct(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = -1.0f + 2.0f * (float)i / (float)n;
  for (size_t i = n; i > 1; i--) {
    size_t j = rng_next(&r) % i;
    float t = x[i - 1];
    x[i - 1] = x[j];
    x[j] = t;
  }
}

static conv_shape conv_of(int n, int c, int h, int w, int k, int kh, int stride, int pad) {
  conv_shape s = {.n = n, .c = c, .h = h, .w = w, .k = k, .kh = kh, .kw = kh, .stride = stride,
                  .pad = pad};
  s.oh = conv_out_size(h, kh, stride, pad);
  s.ow = conv_out_size(w, kh, stride, pad);
  return s;
}

static void check_conv(const conv_shape *s, int with_bias, int with_dx) {
  ps_error err;
  char what[160];
  size_t xn = (size_t)s->n * s->c * s->h * s->w, wn = (size_t)s->k * s->c * s->kh * s->kw;
  size_t yn = (size_t)s->n * s->k * s->oh * s->ow, kn = (size_t)s->k;
  float *x = host_floats(xn), *w = host_floats(wn), *b = host_floats(kn), *dy = host_floats(yn);
  float *y = host_floats(yn), *dx = host_floats(xn), *dw = host_floats(wn), *db = host_floats(kn);
  float *gy = host_floats(yn), *gdx = host_floats(xn), *gdw = host_floats(wn);
  float *gdb = host_floats(kn);
  fill(x, xn);
  fill(w, wn);
  fill(b, kn);
  fill(dy, yn);
  const float *bias = with_bias ? b : NULL;
  ref_conv_forward(s, x, w, bias, y);
  ref_conv_backward(s, x, w, dy, dx, dw, db);
  float *d_x = to_gpu(x, xn * 4), *d_w = to_gpu(w, wn * 4), *d_b = to_gpu(b, kn * 4);
  float *d_dy = to_gpu(dy, yn * 4), *d_y = to_gpu(y, yn * 4), *d_dx = to_gpu(x, xn * 4);
  float *d_dw = to_gpu(w, wn * 4), *d_db = to_gpu(b, kn * 4);
  if (gpu->ops->conv_forward(gpu, s, d_x, d_w, with_bias ? d_b : NULL, d_y, &err) != PS_ERR_OK ||
      gpu->ops->conv_backward(gpu, s, d_x, d_w, d_dy, with_dx ? d_dx : NULL, d_dw,
                              with_bias ? d_db : NULL, &err) != PS_ERR_OK) {
    fprintf(stderr, "FAIL: conv on the GPU: %s\n", err.msg);
    exit(1);
  }
  from_gpu(gy, d_y, yn * 4);
  from_gpu(gdx, d_dx, xn * 4);
  from_gpu(gdw, d_dw, wn * 4);
  from_gpu(gdb, d_db, kn * 4);
  /* The CPU backend's results, where it has the ops. */
  float *cy = NULL, *cdx = NULL, *cdw = NULL, *cdb = NULL;
  if (cpu->ops->conv_forward != NULL && cpu->ops->conv_backward != NULL) {
    cy = host_floats(yn);
    cdx = host_floats(xn);
    cdw = host_floats(wn);
    cdb = host_floats(kn);
    REQUIRE(cpu->ops->conv_forward(cpu, s, x, w, bias, cy, &err) == PS_ERR_OK);
    REQUIRE(cpu->ops->conv_backward(cpu, s, x, w, dy, with_dx ? cdx : NULL, cdw,
                                    with_bias ? cdb : NULL, &err) == PS_ERR_OK);
  }
  snprintf(what, sizeof what, "conv x (%d,%d,%d,%d) w (%d,%d,%d,%d) stride %d pad %d%s%s", s->n,
           s->c, s->h, s->w, s->k, s->c, s->kh, s->kw, s->stride, s->pad,
           with_bias ? " +bias" : "", with_dx ? " +dx" : "");
  fprintf(stderr, "  %s\n", what);
  if (!with_bias) ref_conv_forward(s, x, w, NULL, y);
  check_out("conv y", y, cy, gy, yn, 1e-4);
  check_out("conv dw", dw, cdw, gdw, wn, 1e-4);
  if (with_bias) check_out("conv dbias", db, cdb, gdb, kn, 1e-4);
  else CHECK(memcmp(gdb, b, kn * 4) == 0); /* dbias NULL: left alone */
  if (with_dx) check_out("conv dx", dx, cdx, gdx, xn, 1e-4);
  else CHECK(memcmp(gdx, x, xn * 4) == 0); /* dx NULL: left alone */
  float *bufs[] = {x, w, b, dy, y, dx, dw, db, gy, gdx, gdw, gdb, cy, cdx, cdw, cdb};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
  float *dbufs[] = {d_x, d_w, d_b, d_dy, d_y, d_dx, d_dw, d_db};
  for (size_t i = 0; i < sizeof dbufs / sizeof *dbufs; i++) gpu->ops->free(gpu, dbufs[i]);
}

static void check_maxpool(const pool_shape *s) {
  ps_error err;
  size_t xn = (size_t)s->n * s->c * s->h * s->w, yn = (size_t)s->n * s->c * s->oh * s->ow;
  float *x = host_floats(xn), *y = host_floats(yn), *dy = host_floats(yn), *dx = host_floats(xn);
  float *gy = host_floats(yn), *gdx = host_floats(xn), *cy = NULL, *cdx = NULL;
  fill_distinct(x, xn);
  fill(dy, yn);
  ref_maxpool(s, x, y, dy, dx);
  float *d_x = to_gpu(x, xn * 4), *d_y = to_gpu(y, yn * 4), *d_dy = to_gpu(dy, yn * 4);
  float *d_dx = to_gpu(x, xn * 4);
  if (gpu->ops->maxpool_forward(gpu, s, d_x, d_y, &err) != PS_ERR_OK ||
      gpu->ops->maxpool_backward(gpu, s, d_x, d_y, d_dy, d_dx, &err) != PS_ERR_OK) {
    fprintf(stderr, "FAIL: max pooling on the GPU: %s\n", err.msg);
    exit(1);
  }
  from_gpu(gy, d_y, yn * 4);
  from_gpu(gdx, d_dx, xn * 4);
  if (cpu->ops->maxpool_forward != NULL && cpu->ops->maxpool_backward != NULL) {
    cy = host_floats(yn);
    cdx = host_floats(xn);
    REQUIRE(cpu->ops->maxpool_forward(cpu, s, x, cy, &err) == PS_ERR_OK);
    REQUIRE(cpu->ops->maxpool_backward(cpu, s, x, cy, dy, cdx, &err) == PS_ERR_OK);
  }
  fprintf(stderr, "  maxpool x (%d,%d,%d,%d) %dx%d stride %d pad %d\n", s->n, s->c, s->h, s->w,
          s->kh, s->kw, s->stride, s->pad);
  check_out("maxpool y", y, cy, gy, yn, 1e-5);
  check_out("maxpool dx", dx, cdx, gdx, xn, 1e-5);
  float *bufs[] = {x, y, dy, dx, gy, gdx, cy, cdx};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
  gpu->ops->free(gpu, d_x);
  gpu->ops->free(gpu, d_y);
  gpu->ops->free(gpu, d_dy);
  gpu->ops->free(gpu, d_dx);
}

static void check_avgpool(int n, int c, int hw) {
  ps_error err;
  size_t xn = (size_t)n * c * hw, yn = (size_t)n * c;
  float *x = host_floats(xn), *y = host_floats(yn), *dy = host_floats(yn), *dx = host_floats(xn);
  float *gy = host_floats(yn), *gdx = host_floats(xn), *cy = NULL, *cdx = NULL;
  fill(x, xn);
  fill(dy, yn);
  for (size_t row = 0; row < yn; row++) {
    double sum = 0;
    for (int i = 0; i < hw; i++) sum += x[row * hw + i];
    y[row] = (float)(sum / hw);
    for (int i = 0; i < hw; i++) dx[row * hw + i] = (float)((double)dy[row] / hw);
  }
  float *d_x = to_gpu(x, xn * 4), *d_y = to_gpu(y, yn * 4), *d_dy = to_gpu(dy, yn * 4);
  float *d_dx = to_gpu(x, xn * 4);
  REQUIRE(gpu->ops->avgpool_forward(gpu, n, c, hw, d_x, d_y, &err) == PS_ERR_OK);
  REQUIRE(gpu->ops->avgpool_backward(gpu, n, c, hw, d_dy, d_dx, &err) == PS_ERR_OK);
  from_gpu(gy, d_y, yn * 4);
  from_gpu(gdx, d_dx, xn * 4);
  if (cpu->ops->avgpool_forward != NULL && cpu->ops->avgpool_backward != NULL) {
    cy = host_floats(yn);
    cdx = host_floats(xn);
    REQUIRE(cpu->ops->avgpool_forward(cpu, n, c, hw, x, cy, &err) == PS_ERR_OK);
    REQUIRE(cpu->ops->avgpool_backward(cpu, n, c, hw, dy, cdx, &err) == PS_ERR_OK);
  }
  check_out("avgpool y", y, cy, gy, yn, 1e-5);
  check_out("avgpool dx", dx, cdx, gdx, xn, 1e-5);
  float *bufs[] = {x, y, dy, dx, gy, gdx, cy, cdx};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
  gpu->ops->free(gpu, d_x);
  gpu->ops->free(gpu, d_y);
  gpu->ops->free(gpu, d_dy);
  gpu->ops->free(gpu, d_dx);
}

/* Training forward (with and without running statistics), backward
 * (overwriting and accumulating dgamma, dbeta) and the inference forward. */
static void check_bn(const bn_shape *s, int running) {
  ps_error err;
  size_t xn = (size_t)s->n * s->c * s->hw, cn = (size_t)s->c;
  float *x = host_floats(xn), *dy = host_floats(xn), *y = host_floats(xn), *dx = host_floats(xn);
  float *gamma = host_floats(cn), *beta = host_floats(cn), *mean = host_floats(cn);
  float *invstd = host_floats(cn), *rm = host_floats(cn), *rv = host_floats(cn);
  float *dg = host_floats(cn), *dbt = host_floats(cn), *gv = host_floats(xn), *gc = host_floats(cn);
  float *var = host_floats(cn);
  fill(x, xn);
  for (size_t i = 0; i < xn; i++) x[i] = 3.0f * x[i] + 0.5f; /* mean and scale not 0, 1 */
  fill(dy, xn);
  fill(gamma, cn);
  fill(beta, cn);
  for (size_t c = 0; c < cn; c++) {
    rm[c] = 0.0f;
    rv[c] = 1.0f;
  }
  float *d_x = to_gpu(x, xn * 4), *d_y = to_gpu(x, xn * 4), *d_g = to_gpu(gamma, cn * 4);
  float *d_b = to_gpu(beta, cn * 4), *d_m = to_gpu(rm, cn * 4), *d_is = to_gpu(rm, cn * 4);
  float *d_rm = to_gpu(rm, cn * 4), *d_rv = to_gpu(rv, cn * 4), *d_dy = to_gpu(dy, xn * 4);
  float *d_dx = to_gpu(x, xn * 4), *d_dg = to_gpu(gamma, cn * 4), *d_db = to_gpu(beta, cn * 4);
  const float momentum = 0.1f;
  if (gpu->ops->bn_forward_train(gpu, s, d_x, d_g, d_b, d_y, d_m, d_is, running ? d_rm : NULL,
                                 running ? d_rv : NULL, momentum, &err) != PS_ERR_OK) {
    fprintf(stderr, "FAIL: batch norm (training) on the GPU: %s\n", err.msg);
    exit(1);
  }
  ref_bn_train(s, x, gamma, beta, y, mean, invstd, running ? rm : NULL, rv, momentum);
  float *cy = NULL, *cm = NULL, *cis = NULL, *crm = NULL, *crv = NULL;
  int cpu_bn = cpu->ops->bn_forward_train != NULL && cpu->ops->bn_backward != NULL &&
               cpu->ops->bn_forward_infer != NULL;
  if (cpu_bn) {
    cy = host_floats(xn);
    cm = host_floats(cn);
    cis = host_floats(cn);
    crm = host_floats(cn);
    crv = host_floats(cn);
    for (size_t c = 0; c < cn; c++) {
      crm[c] = 0.0f;
      crv[c] = 1.0f;
    }
    REQUIRE(cpu->ops->bn_forward_train(cpu, s, x, gamma, beta, cy, cm, cis, running ? crm : NULL,
                                       running ? crv : NULL, momentum, &err) == PS_ERR_OK);
  }
  fprintf(stderr, "  batch norm (%d,%d,%d) eps %g%s\n", s->n, s->c, s->hw, (double)s->eps,
          running ? " +running" : "");
  from_gpu(gv, d_y, xn * 4);
  check_out("bn y", y, cy, gv, xn, 1e-4);
  from_gpu(gc, d_m, cn * 4);
  check_out("bn save_mean", mean, cm, gc, cn, 1e-4);
  from_gpu(gc, d_is, cn * 4);
  check_out("bn save_invstd", invstd, cis, gc, cn, 1e-4);
  from_gpu(gc, d_rm, cn * 4);
  check_out("bn running_mean", rm, running ? crm : NULL, gc, cn, 1e-4);
  from_gpu(gc, d_rv, cn * 4);
  check_out("bn running_var", rv, running ? crv : NULL, gc, cn, 1e-4);

  /* Backward from the GPU's own saved statistics, overwriting then accumulating. */
  for (int acc = 0; acc <= 1; acc++) {
    for (size_t c = 0; c < cn; c++) {
      dg[c] = 0.25f * (float)c;
      dbt[c] = -0.5f + 0.125f * (float)c;
    }
    REQUIRE(gpu->ops->upload(gpu, d_dg, dg, cn * 4, &err) == PS_ERR_OK);
    REQUIRE(gpu->ops->upload(gpu, d_db, dbt, cn * 4, &err) == PS_ERR_OK);
    float *cdx = NULL, *cdg = NULL, *cdb = NULL;
    if (cpu_bn) {
      cdx = host_floats(xn);
      cdg = host_floats(cn);
      cdb = host_floats(cn);
      memcpy(cdg, dg, cn * 4);
      memcpy(cdb, dbt, cn * 4);
      REQUIRE(cpu->ops->bn_backward(cpu, s, x, dy, gamma, cm, cis, cdx, cdg, cdb, acc, &err) ==
              PS_ERR_OK);
    }
    if (gpu->ops->bn_backward(gpu, s, d_x, d_dy, d_g, d_m, d_is, d_dx, d_dg, d_db, acc, &err) !=
        PS_ERR_OK) {
      fprintf(stderr, "FAIL: batch norm backward on the GPU: %s\n", err.msg);
      exit(1);
    }
    ref_bn_backward(s, x, dy, gamma, mean, invstd, dx, dg, dbt, acc);
    from_gpu(gv, d_dx, xn * 4);
    check_out(acc ? "bn dx (accumulate)" : "bn dx", dx, cdx, gv, xn, 1e-4);
    from_gpu(gc, d_dg, cn * 4);
    check_out(acc ? "bn dgamma (accumulate)" : "bn dgamma", dg, cdg, gc, cn, 1e-4);
    from_gpu(gc, d_db, cn * 4);
    check_out(acc ? "bn dbeta (accumulate)" : "bn dbeta", dbt, cdb, gc, cn, 1e-4);
    free(cdx);
    free(cdg);
    free(cdb);
  }

  /* Inference with a given mean and variance. */
  for (size_t c = 0; c < cn; c++) {
    mean[c] = 0.1f * (float)c - 0.3f;
    var[c] = 0.5f + 0.25f * (float)c;
  }
  for (size_t i = 0; i < xn; i++) {
    size_t c = (i / (size_t)s->hw) % cn;
    y[i] = (float)(gamma[c] * (x[i] - (double)mean[c]) / sqrt((double)var[c] + s->eps) + beta[c]);
  }
  REQUIRE(gpu->ops->upload(gpu, d_m, mean, cn * 4, &err) == PS_ERR_OK);
  REQUIRE(gpu->ops->upload(gpu, d_rv, var, cn * 4, &err) == PS_ERR_OK);
  if (gpu->ops->bn_forward_infer(gpu, s, d_x, d_g, d_b, d_m, d_rv, d_y, &err) != PS_ERR_OK) {
    fprintf(stderr, "FAIL: batch norm (inference) on the GPU: %s\n", err.msg);
    exit(1);
  }
  from_gpu(gv, d_y, xn * 4);
  if (cpu_bn) REQUIRE(cpu->ops->bn_forward_infer(cpu, s, x, gamma, beta, mean, var, cy, &err) ==
                      PS_ERR_OK);
  check_out("bn infer y", y, cy, gv, xn, 1e-4);

  float *bufs[] = {x, dy, y, dx, gamma, beta, mean, invstd, rm, rv, dg, dbt, gv, gc, var,
                   cy, cm, cis, crm, crv};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
  float *dbufs[] = {d_x, d_y, d_g, d_b, d_m, d_is, d_rm, d_rv, d_dy, d_dx, d_dg, d_db};
  for (size_t i = 0; i < sizeof dbufs / sizeof *dbufs; i++) gpu->ops->free(gpu, dbufs[i]);
}

/* relu forward and backward (in place too), add (in place on a and on x), copy. */
static void check_elementwise(void) {
  ps_error err;
  enum { EN = 10007 };
  static float x[EN], y[EN], dy[EN], a[EN], want[EN], got[EN], cpu_out[EN];
  fill(x, EN);
  fill(dy, EN);
  fill(a, EN);
  float *d_x = to_gpu(x, sizeof x), *d_y = to_gpu(x, sizeof x), *d_dy = to_gpu(dy, sizeof dy);
  float *d_a = to_gpu(a, sizeof a);
  int have_cpu = cpu->ops->relu_forward != NULL && cpu->ops->relu_backward != NULL &&
                 cpu->ops->add != NULL && cpu->ops->copy != NULL;

  for (int i = 0; i < EN; i++) y[i] = x[i] > 0 ? x[i] : 0.0f;
  REQUIRE(gpu->ops->relu_forward(gpu, d_y, d_x, EN, &err) == PS_ERR_OK);
  from_gpu(got, d_y, sizeof got);
  if (have_cpu) REQUIRE(cpu->ops->relu_forward(cpu, cpu_out, x, EN, &err) == PS_ERR_OK);
  check_out("relu_forward", y, have_cpu ? cpu_out : NULL, got, EN, 1e-5);
  /* In place: y = relu(y). */
  REQUIRE(gpu->ops->relu_forward(gpu, d_x, d_x, EN, &err) == PS_ERR_OK);
  from_gpu(got, d_x, sizeof got);
  CHECK(memcmp(got, y, sizeof got) == 0);

  for (int i = 0; i < EN; i++) want[i] = y[i] > 0 ? dy[i] : 0.0f;
  float *d_dx = to_gpu(a, sizeof a);
  REQUIRE(gpu->ops->relu_backward(gpu, d_dx, d_dy, d_y, EN, &err) == PS_ERR_OK);
  from_gpu(got, d_dx, sizeof got);
  if (have_cpu) REQUIRE(cpu->ops->relu_backward(cpu, cpu_out, dy, y, EN, &err) == PS_ERR_OK);
  check_out("relu_backward", want, have_cpu ? cpu_out : NULL, got, EN, 1e-5);
  REQUIRE(gpu->ops->relu_backward(gpu, d_dy, d_dy, d_y, EN, &err) == PS_ERR_OK); /* dx = dy */
  from_gpu(got, d_dy, sizeof got);
  CHECK(memcmp(got, want, sizeof got) == 0);

  /* add: y = a + scale x, into a fresh buffer, then in place on a, then on x. */
  REQUIRE(gpu->ops->upload(gpu, d_x, x, sizeof x, &err) == PS_ERR_OK);
  for (int i = 0; i < EN; i++) want[i] = (float)((double)a[i] + -0.75 * x[i]);
  REQUIRE(gpu->ops->add(gpu, d_y, d_a, d_x, -0.75f, EN, &err) == PS_ERR_OK);
  from_gpu(got, d_y, sizeof got);
  if (have_cpu) REQUIRE(cpu->ops->add(cpu, cpu_out, a, x, -0.75f, EN, &err) == PS_ERR_OK);
  check_out("add", want, have_cpu ? cpu_out : NULL, got, EN, 1e-5);
  REQUIRE(gpu->ops->add(gpu, d_a, d_a, d_x, -0.75f, EN, &err) == PS_ERR_OK);
  from_gpu(got, d_a, sizeof got);
  check_out("add (y = a)", want, NULL, got, EN, 1e-5);
  REQUIRE(gpu->ops->upload(gpu, d_a, a, sizeof a, &err) == PS_ERR_OK);
  REQUIRE(gpu->ops->add(gpu, d_x, d_a, d_x, -0.75f, EN, &err) == PS_ERR_OK);
  from_gpu(got, d_x, sizeof got);
  check_out("add (y = x)", want, NULL, got, EN, 1e-5);

  /* copy: bitwise, n floats and not one more. */
  REQUIRE(gpu->ops->upload(gpu, d_y, dy, sizeof dy, &err) == PS_ERR_OK);
  REQUIRE(gpu->ops->copy(gpu, d_y, d_a, EN - 1, &err) == PS_ERR_OK);
  from_gpu(got, d_y, sizeof got);
  CHECK(memcmp(got, a, (EN - 1) * sizeof *a) == 0);
  CHECK(got[EN - 1] == dy[EN - 1]);
  gpu->ops->free(gpu, d_x);
  gpu->ops->free(gpu, d_y);
  gpu->ops->free(gpu, d_dy);
  gpu->ops->free(gpu, d_a);
  gpu->ops->free(gpu, d_dx);
}

/* The convolutional layers' ops against the reference and the CPU backend. */
static void case_layers(void) {
  ps_error err;
  fprintf(stderr, "convolutional layers:\n");
  check_elementwise();
  check_avgpool(4, 16, 64);
  check_avgpool(3, 5, 49);
  const int have_cudnn = cuda->cudnn;
  if (!have_cudnn) {
    /* Without cuDNN the cuDNN ops say so. */
    conv_shape s = conv_of(2, 3, 8, 8, 4, 3, 1, 1);
    CHECK_EQ_INT(gpu->ops->conv_forward(gpu, &s, NULL, NULL, NULL, NULL, &err),
                 PS_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "no cuDNN") != NULL);
    fprintf(stderr, "  this build has no cuDNN: conv, max pooling and batch norm not compared\n");
    return;
  }
  const conv_shape convs[] = {
      conv_of(4, 1, 28, 28, 6, 5, 1, 2),  /* LeNet conv1, "same" */
      conv_of(4, 6, 14, 14, 16, 5, 1, 0), /* LeNet conv2, "valid" */
      conv_of(4, 8, 16, 16, 8, 3, 1, 1),  /* ResNet 3x3 stride 1 */
      conv_of(4, 8, 16, 16, 16, 3, 2, 1), /* ResNet 3x3 stride 2 */
      conv_of(4, 8, 16, 16, 16, 1, 2, 0), /* ResNet 1x1 stride 2 shortcut */
      conv_of(2, 3, 9, 7, 5, 3, 2, 0),    /* odd sizes */
  };
  for (size_t i = 0; i < sizeof convs / sizeof *convs; i++) {
    check_conv(&convs[i], 1, 1);
    check_conv(&convs[i], (int)(i % 2), 0); /* the cached algorithms, dx or dbias not wanted */
  }
  /* A shape whose oh the plan refuses is an error, not a crash. */
  conv_shape bad = convs[2];
  bad.oh = 15;
  CHECK_EQ_INT(gpu->ops->conv_forward(gpu, &bad, NULL, NULL, NULL, NULL, &err),
               PS_ERR_INVALID_ARGUMENT);
  const pool_shape pools[] = {
      {.n = 4, .c = 6, .h = 28, .w = 28, .kh = 2, .kw = 2, .stride = 2, .oh = 14, .ow = 14},
      {.n = 2, .c = 3, .h = 7, .w = 9, .kh = 2, .kw = 2, .stride = 2, .oh = 3, .ow = 4},
      {.n = 2, .c = 4, .h = 9, .w = 9, .kh = 3, .kw = 3, .stride = 2, .pad = 1, .oh = 5, .ow = 5},
  };
  for (size_t i = 0; i < sizeof pools / sizeof *pools; i++) check_maxpool(&pools[i]);
  bn_shape bns[] = {{.n = 8, .c = 16, .hw = 64, .eps = 1e-5f}, {.n = 3, .c = 5, .hw = 49,
                                                                .eps = 1e-3f}};
  for (size_t i = 0; i < sizeof bns / sizeof *bns; i++) {
    check_bn(&bns[i], 1);
    check_bn(&bns[i], 0);
  }
}

static void case_gemm(void) {
  for (int ta = 0; ta <= 1; ta++) {
    for (int tb = 0; tb <= 1; tb++) {
      check_gemm(ta, tb, 64, 256, 784);
      check_gemm(ta, tb, 37, 11, 5);
    }
  }
}

/* bias + activation and its backward. */
static void case_bias_act_and_backward(void) {
  ps_error err;
  enum { ROWS = 64, COLS = 130 };
  float y[ROWS * COLS], y0[ROWS * COLS], bias[COLS], dy[ROWS * COLS], db[COLS];
  float gy[ROWS * COLS], gdy[ROWS * COLS], gdb[COLS];
  for (int relu = 0; relu <= 1; relu++) {
    fill(y0, ROWS * COLS);
    fill(bias, COLS);
    memcpy(y, y0, sizeof y);
    float *dy_dev = to_gpu(y0, sizeof y0), *db_dev = to_gpu(bias, sizeof bias);
    REQUIRE(cpu->ops->bias_act(cpu, y, bias, ROWS, COLS, relu, &err) == PS_ERR_OK);
    REQUIRE(gpu->ops->bias_act(gpu, dy_dev, db_dev, ROWS, COLS, relu, &err) == PS_ERR_OK);
    from_gpu(gy, dy_dev, sizeof gy);
    CHECK(rel_error(y, gy, ROWS * COLS) <= 1e-5);
    fill(dy, ROWS * COLS);
    float *g_dev = to_gpu(dy, sizeof dy), *y_dev = to_gpu(y, sizeof y);
    float *gb_dev = to_gpu(bias, sizeof bias);
    REQUIRE(cpu->ops->act_bias_backward(cpu, dy, y, db, ROWS, COLS, relu, &err) == PS_ERR_OK);
    REQUIRE(gpu->ops->act_bias_backward(gpu, g_dev, y_dev, gb_dev, ROWS, COLS, relu, &err) ==
            PS_ERR_OK);
    from_gpu(gdy, g_dev, sizeof gdy);
    from_gpu(gdb, gb_dev, sizeof gdb);
    CHECK(rel_error(dy, gdy, ROWS * COLS) <= 1e-5);
    CHECK(rel_error(db, gdb, COLS) <= 1e-5);
    gpu->ops->free(gpu, dy_dev);
    gpu->ops->free(gpu, db_dev);
    gpu->ops->free(gpu, g_dev);
    gpu->ops->free(gpu, y_dev);
    gpu->ops->free(gpu, gb_dev);
  }
}

/* Softmax cross-entropy; a bad label is an error on the GPU too. */
static void case_softmax_xent(void) {
  ps_error err;
  enum { ROWS = 64 };
  float logits[ROWS * 10], dl[ROWS * 10], gdl[ROWS * 10];
  int32_t labels[ROWS];
  fill(logits, ROWS * 10);
  for (int i = 0; i < ROWS * 10; i++) logits[i] *= 8.0f;
  for (int i = 0; i < ROWS; i++) labels[i] = (int32_t)(rng_next(&r) % 10);
  float *l_dev = to_gpu(logits, sizeof logits), *dl_dev = to_gpu(logits, sizeof logits);
  int32_t *lab_dev = (int32_t *)to_gpu(labels, sizeof labels);
  double closs = 0, gloss = 0;
  long ccorrect = 0, gcorrect = 0;
  REQUIRE(cpu->ops->softmax_xent(cpu, logits, labels, ROWS, 10, 1.0f / ROWS, dl, &closs, &ccorrect,
                                 &err) == PS_ERR_OK);
  REQUIRE(gpu->ops->softmax_xent(gpu, l_dev, lab_dev, ROWS, 10, 1.0f / ROWS, dl_dev, &gloss,
                                 &gcorrect, &err) == PS_ERR_OK);
  from_gpu(gdl, dl_dev, sizeof gdl);
  CHECK_NEAR(gloss, closs, 1e-5 * fabs(closs));
  CHECK_EQ_INT(gcorrect, ccorrect);
  CHECK(rel_error(dl, gdl, ROWS * 10) <= 1e-5);
  labels[3] = 12;
  REQUIRE(gpu->ops->upload(gpu, lab_dev, labels, sizeof labels, &err) == PS_ERR_OK);
  CHECK_EQ_INT(gpu->ops->softmax_xent(gpu, l_dev, lab_dev, ROWS, 10, 1.0f, NULL, &gloss, &gcorrect,
                                      &err),
               PS_ERR_INVALID_ARGUMENT);
  gpu->ops->free(gpu, l_dev);
  gpu->ops->free(gpu, dl_dev);
  gpu->ops->free(gpu, lab_dev);
}

/* Optimizers, three steps each. */
static void case_optimizers(void) {
  ps_error err;
  enum { N = 10000 };
  static float w[N], g[N], s1[N], s2[N], gw[N];
  for (int kind = 0; kind < 3; kind++) {
    optimizer_config c = {.kind = (optimizer_kind)kind, .lr = 0.01, .weight_decay = 0.01,
                          .momentum = 0.9, .beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-8,
                          .schedule = LR_COSINE, .total_steps = 10, .step_size = 1, .gamma = 1};
    fill(w, N);
    memset(s1, 0, sizeof s1);
    memset(s2, 0, sizeof s2);
    float *w_dev = to_gpu(w, sizeof w), *s1_dev = to_gpu(s1, sizeof s1);
    float *s2_dev = to_gpu(s2, sizeof s2), *g_dev = to_gpu(w, sizeof w);
    for (long step = 0; step < 3; step++) {
      fill(g, N);
      REQUIRE(gpu->ops->upload(gpu, g_dev, g, sizeof g, &err) == PS_ERR_OK);
      REQUIRE(cpu->ops->optimizer_step(cpu, &c, step, w, g, s1, s2, N, &err) == PS_ERR_OK);
      REQUIRE(gpu->ops->optimizer_step(gpu, &c, step, w_dev, g_dev, s1_dev, s2_dev, N, &err) ==
              PS_ERR_OK);
    }
    from_gpu(gw, w_dev, sizeof gw);
    double e = rel_error(w, gw, N);
    if (e > 1e-5) fprintf(stderr, "optimizer %d: rel error %g\n", kind, e);
    CHECK(e <= 1e-5);
    gpu->ops->free(gpu, w_dev);
    gpu->ops->free(gpu, s1_dev);
    gpu->ops->free(gpu, s2_dev);
    gpu->ops->free(gpu, g_dev);
  }
}

/* A whole forward + backward step of the reference MLP. */
static void case_mlp_step(void) {
  ps_error err;
  model_desc d;
  REQUIRE(model_parse("mlp:784,256,128,10", &d, &err) == PS_ERR_OK);
  mlp *mc, *mg;
  REQUIRE(mlp_create(&mc, &d, cpu, 64, 5, &err) == PS_ERR_OK);
  REQUIRE(mlp_create(&mg, &d, gpu, 64, 5, &err) == PS_ERR_OK);
  for (int i = 0; i < 64 * 784; i++) {
    float v = (float)(rng_next(&r) >> 40) / 16777216.0f;
    mlp_host_inputs(mc)[i] = v;
    mlp_host_inputs(mg)[i] = v;
  }
  for (int i = 0; i < 64; i++) mlp_host_labels(mc)[i] = mlp_host_labels(mg)[i] = i % 10;
  double lc = 0, lg = 0;
  long cc = 0, cg = 0;
  REQUIRE(mlp_load_batch(mc, 64, &err) == PS_ERR_OK && mlp_load_batch(mg, 64, &err) == PS_ERR_OK);
  REQUIRE(mlp_forward(mc, 64, 1, &lc, &cc, &err) == PS_ERR_OK);
  REQUIRE(mlp_forward(mg, 64, 1, &lg, &cg, &err) == PS_ERR_OK);
  REQUIRE(mlp_backward(mc, 64, &err) == PS_ERR_OK && mlp_backward(mg, 64, &err) == PS_ERR_OK);
  size_t n = mc->layout.total;
  float *gc = malloc(n * 4), *gg = malloc(n * 4);
  REQUIRE(gc && gg);
  REQUIRE(mlp_get_grads(mc, gc, &err) == PS_ERR_OK && mlp_get_grads(mg, gg, &err) == PS_ERR_OK);
  CHECK_NEAR(lg, lc, 1e-4 * fabs(lc));
  for (int t = 0; t < mc->layout.count; t++) {
    const tensor_info *info = &mc->layout.tensors[t];
    double e = rel_error(gc + info->offset, gg + info->offset, info->count);
    if (e > 1e-4) fprintf(stderr, "%s gradient: rel error %g\n", info->name, e);
    CHECK(e <= 1e-4);
  }
  free(gc);
  free(gg);
  mlp_destroy(mc);
  mlp_destroy(mg);
}

int main(void) {
  fp_env_flush_denormals(); /* as the trainer and pserver run (common/fp_env.h) */
  char why[256] = "";
  ps_error err;
  /* The build made the module: its failing to load is a failure, not a skip. */
  cuda = cuda_module_load(&err);
  if (cuda == NULL) {
    fprintf(stderr, "FAIL: %s\n", err.msg);
    return 1;
  }
  if (cuda->device_count(why, sizeof why) == 0) {
    fprintf(stderr, "SKIP: no GPU is visible (%s)\n", why);
    return 77;
  }
  REQUIRE(backend_cpu_create(&cpu, 1, &err) == PS_ERR_OK);
  if (cuda->backend_create(&gpu, 0, &err) != PS_ERR_OK) {
    fprintf(stderr, "FAIL: a GPU is visible but the CUDA backend did not open: %s\n", err.msg);
    return 1;
  }
  fprintf(stderr, "parity on %s\n", gpu->description);
  /* One generator, seeded here, gives every case its random inputs: run in
   * this order, each case sees the inputs it was written against. */
  rng_seed(&r, 2024, 0);
  RUN_CASE(case_gemm);
  RUN_CASE(case_bias_act_and_backward);
  RUN_CASE(case_softmax_xent);
  RUN_CASE(case_optimizers);
  RUN_CASE(case_layers);
  RUN_CASE(case_mlp_step);
  backend_destroy(gpu);
  backend_destroy(cpu);
  return check_report("test_gpu_parity");
}
#endif
