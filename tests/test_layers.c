/* The convolutional layers: the reference (layers_ref.c) against central
 * finite differences, then the CPU backend's fast path against the
 * reference.
 *
 * Gradient check: loss = sum(proj * y) in double for a random proj, so the
 * analytic gradient is the backward with dy = proj. Every input element is
 * checked: |analytic - numeric| <= 1e-3 + 1e-2 |numeric|, step h = 1e-2
 * (1e-3 for max pooling, whose inputs are spaced 2e-2 apart so no step
 * changes a window's arg-max; ReLU inputs stay 5e-2 away from 0).
 *
 * Fast vs reference: max |fast - ref| <= tol * max(1, max |ref|) with tol
 * 1e-5 for the convolution (float SGEMM vs double sums) and batch norm
 * (float lanes vs double), 1e-6 for average pooling and add; max pooling,
 * ReLU and copy bitwise. The fast path's results must repeat bit for bit,
 * on one thread and on three (the convolutions split the batch). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "tests/check.h"
#include "trainer/backend/backend.h"
#include "trainer/backend/layers_cpu.h"
#include "trainer/backend/layers_ref.h"

#define GC_ATOL 1e-3
#define GC_RTOL 1e-2
#define TOL_CONV 1e-5
#define TOL_BN 1e-5
#define TOL_EXACTISH 1e-6

static rng r;
static backend *be;

static float *floats(size_t n) {
  float *p = calloc(n > 0 ? n : 1, sizeof *p);
  REQUIRE(p != NULL);
  return p;
}

static float uniform(float lo, float hi) {
  return lo + (hi - lo) * ((float)(rng_next(&r) >> 40) / 16777216.0f);
}

static float *random_floats(size_t n, float lo, float hi) {
  float *p = floats(n);
  for (size_t i = 0; i < n; i++) p[i] = uniform(lo, hi);
  return p;
}

static double dot(const float *a, const float *b, size_t n) {
  double acc = 0.0;
  for (size_t i = 0; i < n; i++) acc += (double)a[i] * b[i];
  return acc;
}

/* ---- gradient checks of the reference ---------------------------------- */

typedef double (*loss_fn)(void *ctx);

/* Checks analytic[i] against the central difference of f in p[i], all i. */
static void gradcheck(const char *what, float *p, size_t n, const float *analytic, loss_fn f,
                      void *ctx, float h) {
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    float save = p[i], up = save + h, down = save - h;
    p[i] = up;
    double lp = f(ctx);
    p[i] = down;
    double lm = f(ctx);
    p[i] = save;
    double numeric = (lp - lm) / ((double)up - (double)down);
    if (!(fabs(analytic[i] - numeric) <= GC_ATOL + GC_RTOL * fabs(numeric))) {
      if (bad < 5)
        fprintf(stderr, "%s[%zu]: analytic %.7g, numeric %.7g\n", what, i, analytic[i], numeric);
      bad++;
    }
  }
  if (bad > 0) fprintf(stderr, "gradcheck %s: %d of %zu elements off\n", what, bad, n);
  CHECK(bad == 0);
}

typedef struct conv_case {
  conv_shape s;
  float *x, *w, *bias, *y, *proj;
  size_t nx, nw, ny;
} conv_case;

static conv_case conv_make(int n, int c, int h, int w, int k, int kh, int kw, int stride,
                           int pad) {
  conv_case t = {.s = {n, c, h, w, k, kh, kw, stride, pad, conv_out_size(h, kh, stride, pad),
                       conv_out_size(w, kw, stride, pad)}};
  t.nx = (size_t)n * c * h * w;
  t.nw = (size_t)k * c * kh * kw;
  t.ny = (size_t)n * k * t.s.oh * t.s.ow;
  REQUIRE(t.ny > 0);
  t.x = random_floats(t.nx, -1, 1);
  t.w = random_floats(t.nw, -1, 1);
  t.bias = random_floats((size_t)k, -1, 1);
  t.y = floats(t.ny);
  t.proj = random_floats(t.ny, -1, 1);
  return t;
}

static void conv_free(conv_case *t) {
  free(t->x), free(t->w), free(t->bias), free(t->y), free(t->proj);
}

static double conv_loss(void *ctx) {
  conv_case *t = ctx;
  layers_ref_conv_forward(&t->s, t->x, t->w, t->bias, t->y);
  return dot(t->proj, t->y, t->ny);
}

static void gradcheck_conv(int stride, int pad, int kh, int kw) {
  conv_case t = conv_make(2, 3, 7, 7, 4, kh, kw, stride, pad);
  float *dx = floats(t.nx), *dw = floats(t.nw), *db = floats((size_t)t.s.k);
  layers_ref_conv_backward(&t.s, t.x, t.w, t.proj, dx, dw, db);
  gradcheck("conv dx", t.x, t.nx, dx, conv_loss, &t, 1e-2f);
  gradcheck("conv dw", t.w, t.nw, dw, conv_loss, &t, 1e-2f);
  gradcheck("conv dbias", t.bias, (size_t)t.s.k, db, conv_loss, &t, 1e-2f);
  free(dx), free(dw), free(db);
  conv_free(&t);
}

typedef struct pool_case {
  pool_shape s;
  float *x, *y, *proj;
  size_t nx, ny;
} pool_case;

/* Distinct inputs 2e-2 apart (a shuffled ladder, half of it negative, so
 * padding must never win), or few levels with ties when `ties`. */
static pool_case pool_make(int n, int c, int h, int w, int k, int stride, int pad, int ties) {
  pool_case t = {.s = {n, c, h, w, k, k, stride, pad, conv_out_size(h, k, stride, pad),
                       conv_out_size(w, k, stride, pad)}};
  t.nx = (size_t)n * c * h * w;
  t.ny = (size_t)n * c * t.s.oh * t.s.ow;
  t.x = floats(t.nx);
  for (size_t i = 0; i < t.nx; i++)
    t.x[i] = ties ? (float)(rng_below(&r, 3)) - 2.0f : 0.02f * ((float)i - (float)t.nx / 2);
  for (size_t i = t.nx; i > 1; i--) { /* Fisher-Yates */
    size_t j = rng_below(&r, i);
    float tmp = t.x[i - 1];
    t.x[i - 1] = t.x[j];
    t.x[j] = tmp;
  }
  t.y = floats(t.ny);
  t.proj = random_floats(t.ny, -1, 1);
  return t;
}

static void pool_free(pool_case *t) { free(t->x), free(t->y), free(t->proj); }

static double pool_loss(void *ctx) {
  pool_case *t = ctx;
  layers_ref_maxpool_forward(&t->s, t->x, t->y);
  return dot(t->proj, t->y, t->ny);
}

static void gradcheck_maxpool(int k, int stride, int pad) {
  pool_case t = pool_make(2, 3, 7, 7, k, stride, pad, 0);
  float *dx = floats(t.nx);
  layers_ref_maxpool_forward(&t.s, t.x, t.y);
  layers_ref_maxpool_backward(&t.s, t.x, t.y, t.proj, dx);
  gradcheck("maxpool dx", t.x, t.nx, dx, pool_loss, &t, 1e-3f);
  free(dx);
  pool_free(&t);
}

typedef struct flat_case {
  int n, c, hw;
  float *x, *a, *y, *proj, *gamma, *beta, scale;
  size_t nx, ny;
} flat_case;

static flat_case flat_make(int n, int c, int hw) {
  flat_case t = {.n = n, .c = c, .hw = hw, .nx = (size_t)n * c * hw, .scale = -0.75f};
  t.x = random_floats(t.nx, -1, 1);
  t.a = random_floats(t.nx, -1, 1);
  t.y = floats(t.nx);
  t.proj = random_floats(t.nx, -1, 1);
  t.gamma = random_floats((size_t)c, 0.5f, 1.5f);
  t.beta = random_floats((size_t)c, -0.5f, 0.5f);
  return t;
}

static void flat_free(flat_case *t) {
  free(t->x), free(t->a), free(t->y), free(t->proj), free(t->gamma), free(t->beta);
}

static double avgpool_loss(void *ctx) {
  flat_case *t = ctx;
  layers_ref_avgpool_forward(t->n, t->c, t->hw, t->x, t->y);
  return dot(t->proj, t->y, (size_t)t->n * t->c);
}

static double bn_loss(void *ctx) {
  flat_case *t = ctx;
  bn_shape s = {t->n, t->c, t->hw, 1e-5f};
  float mean[16], invstd[16];
  REQUIRE(t->c <= 16);
  layers_ref_bn_forward_train(&s, t->x, t->gamma, t->beta, t->y, mean, invstd, NULL, NULL, 0);
  return dot(t->proj, t->y, t->nx);
}

static double relu_loss(void *ctx) {
  flat_case *t = ctx;
  layers_ref_relu_forward(t->y, t->x, t->nx);
  return dot(t->proj, t->y, t->nx);
}

static double add_loss(void *ctx) {
  flat_case *t = ctx;
  layers_ref_add(t->y, t->a, t->x, t->scale, t->nx);
  return dot(t->proj, t->y, t->nx);
}

static void gradcheck_flat(void) {
  flat_case t = flat_make(2, 3, 49);
  float *dx = floats(t.nx), *dgamma = floats(3), *dbeta = floats(3);
  layers_ref_avgpool_backward(t.n, t.c, t.hw, t.proj, dx); /* proj's first n c: dy */
  gradcheck("avgpool dx", t.x, t.nx, dx, avgpool_loss, &t, 1e-2f);

  bn_shape s = {t.n, t.c, t.hw, 1e-5f};
  float mean[3], invstd[3];
  layers_ref_bn_forward_train(&s, t.x, t.gamma, t.beta, t.y, mean, invstd, NULL, NULL, 0);
  layers_ref_bn_backward(&s, t.x, t.proj, t.gamma, mean, invstd, dx, dgamma, dbeta, 0);
  gradcheck("bn dx", t.x, t.nx, dx, bn_loss, &t, 1e-2f);
  gradcheck("bn dgamma", t.gamma, 3, dgamma, bn_loss, &t, 1e-2f);
  gradcheck("bn dbeta", t.beta, 3, dbeta, bn_loss, &t, 1e-2f);

  for (size_t i = 0; i < t.nx; i++) /* away from ReLU's kink */
    t.x[i] = (t.x[i] < 0 ? -0.05f : 0.05f) + t.x[i];
  layers_ref_relu_forward(t.y, t.x, t.nx);
  layers_ref_relu_backward(dx, t.proj, t.y, t.nx);
  gradcheck("relu dx", t.x, t.nx, dx, relu_loss, &t, 1e-2f);

  float *dx_scaled = floats(t.nx);
  for (size_t i = 0; i < t.nx; i++) dx_scaled[i] = t.scale * t.proj[i];
  gradcheck("add da", t.a, t.nx, t.proj, add_loss, &t, 1e-2f);
  gradcheck("add dx", t.x, t.nx, dx_scaled, add_loss, &t, 1e-2f);
  free(dx), free(dgamma), free(dbeta), free(dx_scaled);
  flat_free(&t);
}

/* ---- the fast path against the reference ------------------------------- */

/* max |fast - ref| <= tol max(1, max |ref|); tol 0: bitwise. */
static void compare(const char *what, const float *fast, const float *ref, size_t n, double tol) {
  double worst = 0.0, scale = 1.0;
  for (size_t i = 0; i < n; i++) scale = fabs(ref[i]) > scale ? fabs(ref[i]) : scale;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)fast[i] - ref[i]);
    worst = d > worst || d != d ? d : worst;
  }
  int ok = tol == 0.0 ? memcmp(fast, ref, n * sizeof *fast) == 0 : worst <= tol * scale;
  if (!ok)
    fprintf(stderr, "%s: max |fast - ref| %.3g, scale %.3g, tol %.3g\n", what, worst, scale, tol);
  CHECK(ok);
}

static void fast_conv_case(int n, int c, int h, int w, int k, int kh, int kw, int stride, int pad) {
  ps_error err;
  conv_case t = conv_make(n, c, h, w, k, kh, kw, stride, pad);
  float *ry = floats(t.ny), *rdx = floats(t.nx), *rdw = floats(t.nw), *rdb = floats((size_t)k);
  float *fy = floats(t.ny), *fdx = floats(t.nx), *fdw = floats(t.nw), *fdb = floats((size_t)k);
  float *again = floats(t.ny > t.nx ? t.ny : t.nx);
  layers_ref_conv_forward(&t.s, t.x, t.w, t.bias, ry);
  layers_ref_conv_backward(&t.s, t.x, t.w, t.proj, rdx, rdw, rdb);
  int groups[] = {0, 1, 2, n};
  for (size_t g = 0; g < sizeof groups / sizeof *groups; g++) {
    memset(fdx, 0x7f, t.nx * sizeof *fdx); /* garbage: outputs are overwritten */
    REQUIRE(cpu_conv_forward_group(be, &t.s, t.x, t.w, t.bias, fy, groups[g], &err) == PS_ERR_OK);
    REQUIRE(cpu_conv_backward_group(be, &t.s, t.x, t.w, t.proj, fdx, fdw, fdb, groups[g], &err) ==
            PS_ERR_OK);
    compare("conv y", fy, ry, t.ny, TOL_CONV);
    compare("conv dx", fdx, rdx, t.nx, TOL_CONV);
    compare("conv dw", fdw, rdw, t.nw, TOL_CONV);
    compare("conv dbias", fdb, rdb, (size_t)k, TOL_CONV);
  }
  /* Through the table (oneDNN where the build has it): all outputs; then no
   * bias, no dx, no dbias; then the same bits again. */
  memset(fdx, 0x7f, t.nx * sizeof *fdx);
  REQUIRE(be->ops->conv_forward(be, &t.s, t.x, t.w, t.bias, fy, &err) == PS_ERR_OK);
  REQUIRE(be->ops->conv_backward(be, &t.s, t.x, t.w, t.proj, fdx, fdw, fdb, &err) == PS_ERR_OK);
  compare("conv op y", fy, ry, t.ny, TOL_CONV);
  compare("conv op dx", fdx, rdx, t.nx, TOL_CONV);
  compare("conv op dw", fdw, rdw, t.nw, TOL_CONV);
  compare("conv op dbias", fdb, rdb, (size_t)k, TOL_CONV);
  layers_ref_conv_forward(&t.s, t.x, t.w, NULL, ry);
  REQUIRE(be->ops->conv_forward(be, &t.s, t.x, t.w, NULL, fy, &err) == PS_ERR_OK);
  compare("conv y without bias", fy, ry, t.ny, TOL_CONV);
  REQUIRE(be->ops->conv_forward(be, &t.s, t.x, t.w, NULL, again, &err) == PS_ERR_OK);
  CHECK(memcmp(fy, again, t.ny * sizeof *fy) == 0);
  REQUIRE(be->ops->conv_backward(be, &t.s, t.x, t.w, t.proj, NULL, fdw, NULL, &err) == PS_ERR_OK);
  compare("conv dw alone", fdw, rdw, t.nw, TOL_CONV);
  REQUIRE(be->ops->conv_backward(be, &t.s, t.x, t.w, t.proj, again, fdw, fdb, &err) == PS_ERR_OK);
  REQUIRE(be->ops->conv_backward(be, &t.s, t.x, t.w, t.proj, fdx, fdw, fdb, &err) == PS_ERR_OK);
  CHECK(memcmp(fdx, again, t.nx * sizeof *fdx) == 0);
  free(ry), free(rdx), free(rdw), free(rdb), free(fy), free(fdx), free(fdw), free(fdb), free(again);
  conv_free(&t);
}

static void fast_maxpool_case(int n, int c, int h, int w, int k, int stride, int pad, int ties) {
  ps_error err;
  pool_case t = pool_make(n, c, h, w, k, stride, pad, ties);
  float *ry = floats(t.ny), *rdx = floats(t.nx), *fy = floats(t.ny), *fdx = floats(t.nx);
  layers_ref_maxpool_forward(&t.s, t.x, ry);
  layers_ref_maxpool_backward(&t.s, t.x, ry, t.proj, rdx);
  memset(fdx, 0x7f, t.nx * sizeof *fdx);
  REQUIRE(be->ops->maxpool_forward(be, &t.s, t.x, fy, &err) == PS_ERR_OK);
  REQUIRE(be->ops->maxpool_backward(be, &t.s, t.x, fy, t.proj, fdx, &err) == PS_ERR_OK);
  compare("maxpool y", fy, ry, t.ny, 0.0);
  compare("maxpool dx", fdx, rdx, t.nx, 0.0);
  free(ry), free(rdx), free(fy), free(fdx);
  pool_free(&t);
}

/* Ties go to the first position in row-major window order; overlapping
 * windows add up. One 3x3 plane, 2x2 windows at stride 1. */
static void maxpool_ties(void) {
  pool_shape s = {1, 1, 3, 3, 2, 2, 1, 0, 2, 2};
  const float x[9] = {1, 5, 5, 5, 5, 2, 0, 3, 5}, dy[4] = {1, 10, 100, 1000};
  float y[4], ref_dx[9], fast_dx[9];
  ps_error err;
  layers_ref_maxpool_forward(&s, x, y);
  layers_ref_maxpool_backward(&s, x, y, dy, ref_dx);
  REQUIRE(cpu_maxpool_backward(be, &s, x, y, dy, fast_dx, &err) == PS_ERR_OK);
  /* windows: {1,5,5,5}->x[1]; {5,5,5,2}->x[1]; {5,5,0,3}->x[3]; {5,2,3,5}->x[4] */
  const float want[9] = {0, 11, 0, 100, 1000, 0, 0, 0, 0};
  compare("maxpool ties (reference)", ref_dx, want, 9, 0.0);
  compare("maxpool ties (fast)", fast_dx, want, 9, 0.0);
}

/* Running statistics against the formula in double: PyTorch's update with
 * the unbiased variance, for the reference and the fast path alike. */
static void check_running(const flat_case *t, const float *rm0, const float *rv0,
                          const float *rm, const float *rv, float momentum) {
  size_t m = (size_t)t->n * t->hw;
  for (int ch = 0; ch < t->c; ch++) {
    double sum = 0.0, sq = 0.0;
    for (int i = 0; i < t->n; i++)
      for (int j = 0; j < t->hw; j++) sum += t->x[((size_t)i * t->c + ch) * t->hw + j];
    double mean = sum / m;
    for (int i = 0; i < t->n; i++)
      for (int j = 0; j < t->hw; j++) {
        double d = t->x[((size_t)i * t->c + ch) * t->hw + j] - mean;
        sq += d * d;
      }
    CHECK_NEAR(rm[ch], (1 - momentum) * rm0[ch] + momentum * mean, 1e-6);
    CHECK_NEAR(rv[ch], (1 - momentum) * rv0[ch] + momentum * sq / (m - 1), 1e-6);
  }
}

static void fast_bn_case(int n, int c, int hw) {
  ps_error err;
  flat_case t = flat_make(n, c, hw);
  bn_shape s = {n, c, hw, 1e-5f};
  size_t nc = (size_t)c;
  float *ry = floats(t.nx), *fy = floats(t.nx), *rdx = floats(t.nx), *fdx = floats(t.nx);
  float *rm[2], *rv[2], *rmean[2], *rinv[2], *dg[2], *db[2];
  float *rm0 = random_floats(nc, -1, 1), *rv0 = random_floats(nc, 0.5f, 2);
  for (int k = 0; k < 2; k++) { /* 0: reference, 1: fast */
    rm[k] = floats(nc), rv[k] = floats(nc), rmean[k] = floats(nc), rinv[k] = floats(nc);
    dg[k] = floats(nc), db[k] = floats(nc);
    memcpy(rm[k], rm0, nc * sizeof *rm0);
    memcpy(rv[k], rv0, nc * sizeof *rv0);
  }
  layers_ref_bn_forward_train(&s, t.x, t.gamma, t.beta, ry, rmean[0], rinv[0], rm[0], rv[0], 0.1f);
  REQUIRE(be->ops->bn_forward_train(be, &s, t.x, t.gamma, t.beta, fy, rmean[1], rinv[1], rm[1],
                                    rv[1], 0.1f, &err) == PS_ERR_OK);
  compare("bn train y", fy, ry, t.nx, TOL_BN);
  compare("bn save_mean", rmean[1], rmean[0], nc, TOL_BN);
  compare("bn save_invstd", rinv[1], rinv[0], nc, TOL_BN);
  check_running(&t, rm0, rv0, rm[0], rv[0], 0.1f);
  check_running(&t, rm0, rv0, rm[1], rv[1], 0.1f);
  /* Backward from the reference's saved statistics, then accumulating. */
  layers_ref_bn_backward(&s, t.x, t.proj, t.gamma, rmean[0], rinv[0], rdx, dg[0], db[0], 0);
  REQUIRE(be->ops->bn_backward(be, &s, t.x, t.proj, t.gamma, rmean[0], rinv[0], fdx, dg[1], db[1],
                               0, &err) == PS_ERR_OK);
  compare("bn dx", fdx, rdx, t.nx, TOL_BN);
  compare("bn dgamma", dg[1], dg[0], nc, TOL_BN);
  compare("bn dbeta", db[1], db[0], nc, TOL_BN);
  float once_g = dg[1][0], once_b = db[1][0];
  layers_ref_bn_backward(&s, t.x, t.proj, t.gamma, rmean[0], rinv[0], rdx, dg[0], db[0], 1);
  REQUIRE(be->ops->bn_backward(be, &s, t.x, t.proj, t.gamma, rmean[0], rinv[0], fy, dg[1], db[1],
                               1, &err) == PS_ERR_OK);
  CHECK(memcmp(fy, fdx, t.nx * sizeof *fy) == 0); /* deterministic */
  CHECK_NEAR(dg[1][0], 2.0f * once_g, 1e-5);
  CHECK_NEAR(db[1][0], 2.0f * once_b, 1e-5);
  compare("bn dgamma accumulated", dg[1], dg[0], nc, TOL_BN);
  compare("bn dbeta accumulated", db[1], db[0], nc, TOL_BN);
  /* Inference with the running statistics; training without them. */
  layers_ref_bn_forward_infer(&s, t.x, t.gamma, t.beta, rm[0], rv[0], ry);
  REQUIRE(be->ops->bn_forward_infer(be, &s, t.x, t.gamma, t.beta, rm[0], rv[0], fy, &err) ==
          PS_ERR_OK);
  compare("bn infer y", fy, ry, t.nx, TOL_BN);
  memcpy(rm[1], rm0, nc * sizeof *rm0);
  REQUIRE(be->ops->bn_forward_train(be, &s, t.x, t.gamma, t.beta, ry, rmean[1], rinv[1], NULL,
                                    NULL, 0.1f, &err) == PS_ERR_OK);
  REQUIRE(be->ops->bn_forward_train(be, &s, t.x, t.gamma, t.beta, fy, rmean[1], rinv[1], NULL,
                                    NULL, 0.1f, &err) == PS_ERR_OK);
  CHECK(memcmp(fy, ry, t.nx * sizeof *fy) == 0); /* deterministic */
  for (int k = 0; k < 2; k++) {
    free(rm[k]), free(rv[k]), free(rmean[k]), free(rinv[k]), free(dg[k]), free(db[k]);
  }
  free(ry), free(fy), free(rdx), free(fdx), free(rm0), free(rv0);
  flat_free(&t);
}

static void fast_elementwise_case(int n, int c, int hw) {
  ps_error err;
  flat_case t = flat_make(n, c, hw);
  size_t nc = (size_t)n * c;
  float *ry = floats(t.nx), *fy = floats(t.nx), *rdx = floats(t.nx), *fdx = floats(t.nx);
  layers_ref_avgpool_forward(n, c, hw, t.x, ry);
  REQUIRE(be->ops->avgpool_forward(be, n, c, hw, t.x, fy, &err) == PS_ERR_OK);
  compare("avgpool y", fy, ry, nc, TOL_EXACTISH);
  layers_ref_avgpool_backward(n, c, hw, t.proj, rdx);
  REQUIRE(be->ops->avgpool_backward(be, n, c, hw, t.proj, fdx, &err) == PS_ERR_OK);
  compare("avgpool dx", fdx, rdx, t.nx, TOL_EXACTISH);

  layers_ref_relu_forward(ry, t.x, t.nx);
  REQUIRE(be->ops->relu_forward(be, fy, t.x, t.nx, &err) == PS_ERR_OK);
  compare("relu y", fy, ry, t.nx, 0.0);
  layers_ref_relu_backward(rdx, t.proj, ry, t.nx);
  memcpy(fdx, t.proj, t.nx * sizeof *fdx);
  REQUIRE(be->ops->relu_backward(be, fdx, fdx, fy, t.nx, &err) == PS_ERR_OK); /* in place */
  compare("relu dx", fdx, rdx, t.nx, 0.0);
  memcpy(fy, t.x, t.nx * sizeof *fy);
  REQUIRE(be->ops->relu_forward(be, fy, fy, t.nx, &err) == PS_ERR_OK); /* in place */
  compare("relu y in place", fy, ry, t.nx, 0.0);

  layers_ref_add(ry, t.a, t.x, t.scale, t.nx);
  memcpy(fy, t.a, t.nx * sizeof *fy);
  REQUIRE(be->ops->add(be, fy, fy, t.x, t.scale, t.nx, &err) == PS_ERR_OK); /* y is a */
  compare("add y", fy, ry, t.nx, TOL_EXACTISH);
  for (size_t i = 0; i < t.nx; i++) CHECK_NEAR(ry[i], t.a[i] + t.scale * t.x[i], 1e-6);

  REQUIRE(be->ops->copy(be, fy, t.x, t.nx, &err) == PS_ERR_OK);
  compare("copy", fy, t.x, t.nx, 0.0);
  free(ry), free(fy), free(rdx), free(fdx);
  flat_free(&t);
}

/* The fast path's cases on the current backend. */
static void fast_cases(void) {
  fast_conv_case(2, 3, 7, 7, 4, 3, 3, 1, 1);
  fast_conv_case(5, 3, 9, 11, 6, 3, 3, 2, 1);  /* batch 5, odd sizes, stride 2 */
  fast_conv_case(5, 8, 5, 7, 4, 1, 1, 1, 0);   /* pointwise: no im2col */
  fast_conv_case(5, 8, 7, 9, 4, 1, 1, 2, 0);   /* 1x1 at stride 2 */
  fast_conv_case(3, 4, 14, 14, 5, 5, 5, 1, 2); /* LeNet-like */
  fast_conv_case(5, 3, 10, 9, 4, 3, 2, 2, 0);  /* non-square kernel */
  /* conv_direct's shapes (with AVX2): many tiles and a partial one, dx
   * direct too; 5x5; a padded row of 9 (7x7); dx not direct (3 channels). */
  fast_conv_case(3, 16, 28, 28, 16, 3, 3, 1, 1);
  fast_conv_case(2, 20, 14, 14, 20, 5, 5, 1, 2);
  fast_conv_case(4, 8, 7, 7, 12, 3, 3, 1, 1);
  fast_conv_case(2, 3, 9, 5, 8, 3, 3, 1, 1);
  fast_maxpool_case(5, 3, 9, 11, 3, 2, 1, 0);
  fast_maxpool_case(2, 3, 8, 8, 2, 2, 0, 0);
  fast_maxpool_case(5, 2, 7, 9, 3, 1, 1, 1); /* ties */
  fast_maxpool_case(5, 2, 9, 7, 2, 2, 0, 1);  /* ties, odd size: the last row unused */
  maxpool_ties();
  fast_bn_case(5, 3, 77);
  fast_bn_case(2, 4, 49);
  fast_bn_case(64, 2, 64);
  fast_elementwise_case(5, 3, 77);
  fast_elementwise_case(2, 4, 1);
  fast_bn_case(9, 7, 1100);          /* over the split threshold: channels across threads */
  fast_elementwise_case(7, 5, 2000); /* the same for the element-wise ops */

}

/* The worker pool: every item of a run done exactly once, for each part
 * count, many runs in a row (a lost wake-up would hang, a double run count
 * twice). */
typedef struct pool_count {
  int counts[1000];
} pool_count;

static void pool_count_part(void *ctx, int part, int parts) {
  pool_count *c = ctx;
  size_t lo, hi;
  cpu_pool_range(sizeof c->counts / sizeof *c->counts, part, parts, &lo, &hi);
  for (size_t i = lo; i < hi; i++) c->counts[i]++;
}

/* Another thread's runs on the same pool, concurrently with the main one's. */
typedef struct pool_rival {
  cpu_pool *pool;
  pool_count count;
} pool_rival;

static void *pool_rival_main(void *arg) {
  pool_rival *rival = arg;
  for (int i = 0; i < 300; i++) cpu_pool_run(rival->pool, 3, pool_count_part, &rival->count);
  return NULL;
}

static void pool_runs(void) {
  cpu_pool *p = cpu_pool_create(3);
  REQUIRE(p != NULL);
  CHECK(cpu_pool_threads(p) == 3);
  pool_count c = {{0}};
  int runs = 0;
  for (int round = 0; round < 200; round++)
    for (int parts = 0; parts <= 4; parts++, runs++) cpu_pool_run(p, parts, pool_count_part, &c);
  int wrong = 0;
  for (size_t i = 0; i < sizeof c.counts / sizeof *c.counts; i++) wrong += c.counts[i] != runs;
  CHECK(wrong == 0);
  size_t lo, hi;
  cpu_pool_range(10, 0, 3, &lo, &hi);
  CHECK(lo == 0 && hi == 4);
  cpu_pool_range(10, 2, 3, &lo, &hi);
  CHECK(lo == 7 && hi == 10);
  /* Two threads' runs at once: each item of each run counted once. */
  pool_rival rival = {.pool = p};
  pool_count mine = {{0}};
  pthread_t tid;
  REQUIRE(pthread_create(&tid, NULL, pool_rival_main, &rival) == 0);
  for (int i = 0; i < 300; i++) cpu_pool_run(p, 3, pool_count_part, &mine);
  REQUIRE(pthread_join(tid, NULL) == 0);
  wrong = 0;
  for (size_t i = 0; i < sizeof mine.counts / sizeof *mine.counts; i++)
    wrong += mine.counts[i] != 300 || rival.count.counts[i] != 300;
  CHECK(wrong == 0);
  cpu_pool_destroy(p);
}

int main(void) {
  ps_error err;
  rng_seed(&r, 17, 0);
  REQUIRE(backend_cpu_create(&be, 1, &err) == PS_ERR_OK);

  for (int stride = 1; stride <= 2; stride++)
    for (int pad = 0; pad <= 1; pad++) gradcheck_conv(stride, pad, 3, 3);
  gradcheck_conv(2, 1, 3, 2); /* a non-square kernel: kh and kw not mixed up */
  gradcheck_maxpool(3, 1, 1);   /* overlapping windows */
  gradcheck_maxpool(3, 2, 1);
  gradcheck_maxpool(2, 2, 0);
  gradcheck_flat();
  pool_runs();

  fast_cases();
  backend_destroy(be);
  /* Three threads: the convolutions split the batch into parts (2, 2, 1
   * images of 5), against the reference and bit for bit run after run. */
  REQUIRE(backend_cpu_create(&be, 3, &err) == PS_ERR_OK);
  fast_cases();
  backend_destroy(be);
  return check_report("test_layers");
}
