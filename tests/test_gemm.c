/* The row-major to column-major GEMM mapping that both backends use, through
 * the CPU backend, against plain loops: every transpose combination, padded
 * leading dimensions and beta; and the shared layer math (bias + ReLU, its
 * backward, softmax cross-entropy) against direct double-precision sums. */
#include <math.h>
#include <stdlib.h>

#include "common/rng.h"
#include "tests/check.h"
#include "trainer/backend/backend.h"
#include "trainer/backend/kernel_math.h"

static rng r;

static float uniform(void) { return (float)(rng_next(&r) >> 40) / 16777216.0f * 2.0f - 1.0f; }

static void fill(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = uniform();
}

/* Element (i, j) of op(X) where X is row-major with leading dimension ld. */
static float at(const float *x, int ld, int trans, int i, int j) {
  return trans ? x[(size_t)j * ld + i] : x[(size_t)i * ld + j];
}

static void check_gemm(backend *be, int ta, int tb, int M, int N, int K, float beta) {
  /* Stored shapes: A is (M,K) or (K,M); B is (K,N) or (N,K); padding of 3. */
  int a_rows = ta ? K : M, a_cols = ta ? M : K;
  int b_rows = tb ? N : K, b_cols = tb ? K : N;
  int lda = a_cols + 3, ldb = b_cols + 3, ldc = N + 3;
  float *A = calloc((size_t)a_rows * lda, sizeof *A);
  float *B = calloc((size_t)b_rows * ldb, sizeof *B);
  float *C = calloc((size_t)M * ldc, sizeof *C);
  float *C0 = calloc((size_t)M * ldc, sizeof *C0);
  REQUIRE(A && B && C && C0);
  fill(A, (size_t)a_rows * lda);
  fill(B, (size_t)b_rows * ldb);
  fill(C0, (size_t)M * ldc);
  for (size_t i = 0; i < (size_t)M * ldc; i++) C[i] = C0[i];

  gemm_call call = gemm_row_major(ta, tb, M, N, K, 0.75f, A, lda, B, ldb, beta, C, ldc);
  ps_error err;
  REQUIRE(be->ops->gemm(be, &call, &err) == PS_ERR_OK);

  int bad = 0;
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      double want = beta * C0[(size_t)i * ldc + j];
      for (int k = 0; k < K; k++) want += 0.75 * at(A, lda, ta, i, k) * at(B, ldb, tb, k, j);
      if (fabs(C[(size_t)i * ldc + j] - want) > 1e-4 * (1 + fabs(want))) bad++;
    }
    /* Padding columns of C are left alone. */
    for (int j = N; j < ldc; j++) bad += C[(size_t)i * ldc + j] != C0[(size_t)i * ldc + j];
  }
  if (bad != 0) fprintf(stderr, "gemm ta=%d tb=%d %dx%dx%d beta=%g: %d wrong\n", ta, tb, M, N, K, beta, bad);
  CHECK_EQ_INT(bad, 0);
  free(A);
  free(B);
  free(C);
  free(C0);
}

/* A one-thread CPU backend; the random inputs seeded with seed. */
static backend *backend_fixture(uint64_t seed) {
  backend *be;
  ps_error err;
  rng_seed(&r, seed, 0);
  REQUIRE(backend_cpu_create(&be, 1, &err) == PS_ERR_OK);
  return be;
}

/* Every transpose combination, padded leading dimensions and beta. */
static void case_gemm_against_loops(void) {
  backend *be = backend_fixture(99);
  for (int ta = 0; ta <= 1; ta++) {
    for (int tb = 0; tb <= 1; tb++) {
      check_gemm(be, ta, tb, 7, 5, 3, 0.0f);
      check_gemm(be, ta, tb, 64, 33, 17, 0.0f);
      check_gemm(be, ta, tb, 9, 1, 30, 0.5f);
    }
  }
  backend_destroy(be);
}

/* The mapping itself: operands and sizes swap, flags travel with them. */
static void case_row_major_mapping(void) {
  float a = 0, b = 0, c = 0;
  gemm_call g = gemm_row_major(true, false, 2, 3, 4, 1.0f, &a, 2, &b, 3, 0.0f, &c, 3);
  CHECK(g.a == &b && g.b == &a && g.c == &c);
  CHECK_EQ_INT(g.m, 3);
  CHECK_EQ_INT(g.n, 2);
  CHECK_EQ_INT(g.k, 4);
  CHECK(g.trans_a == false && g.trans_b == true);
  CHECK_EQ_INT(g.lda, 3);
  CHECK_EQ_INT(g.ldb, 2);
}

/* bias + ReLU and its backward; without ReLU only the bias is added. */
static void case_bias_relu_and_backward(void) {
  ps_error err;
  backend *be = backend_fixture(100);
  enum { ROWS = 5, COLS = 6 };
  float y[ROWS * COLS], x[ROWS * COLS], bias[COLS], dy[ROWS * COLS], dy0[ROWS * COLS], db[COLS];
  fill(x, ROWS * COLS);
  fill(bias, COLS);
  fill(dy0, ROWS * COLS);
  for (int i = 0; i < ROWS * COLS; i++) y[i] = x[i];
  REQUIRE(be->ops->bias_act(be, y, bias, ROWS, COLS, 1, &err) == PS_ERR_OK);
  int bad = 0, zeros = 0;
  for (int i = 0; i < ROWS * COLS; i++) {
    float want = x[i] + bias[i % COLS];
    want = want > 0 ? want : 0;
    bad += y[i] != want;
    zeros += y[i] == 0;
  }
  CHECK_EQ_INT(bad, 0);
  CHECK(zeros > 0 && zeros < ROWS * COLS); /* both sides of the ReLU were exercised */
  for (int i = 0; i < ROWS * COLS; i++) dy[i] = dy0[i];
  REQUIRE(be->ops->act_bias_backward(be, dy, y, db, ROWS, COLS, 1, &err) == PS_ERR_OK);
  for (int j = 0; j < COLS; j++) {
    double want = 0;
    for (int i = 0; i < ROWS; i++) {
      float g1 = y[i * COLS + j] > 0 ? dy0[i * COLS + j] : 0.0f;
      CHECK_NEAR(dy[i * COLS + j], g1, 0);
      want += g1;
    }
    CHECK_NEAR(db[j], want, 1e-6);
  }
  for (int i = 0; i < ROWS * COLS; i++) y[i] = x[i];
  REQUIRE(be->ops->bias_act(be, y, bias, ROWS, COLS, 0, &err) == PS_ERR_OK);
  CHECK_NEAR(y[7], x[7] + bias[1], 0);
  backend_destroy(be);
}

/* Softmax cross-entropy against a double-precision reference; a label
 * outside the classes is an error, not a read out of bounds. */
static void case_softmax_xent(void) {
  ps_error err;
  backend *be = backend_fixture(101);
  float logits[2 * 4] = {1.0f, 2.0f, 3.0f, 4.0f, 100.0f, -50.0f, 0.0f, 99.0f};
  int32_t labels[2] = {2, 3};
  float dlogits[8];
  double loss = 0;
  long correct = 0;
  REQUIRE(be->ops->softmax_xent(be, logits, labels, 2, 4, 0.5f, dlogits, &loss, &correct, &err) ==
          PS_ERR_OK);
  double z0 = exp(1) + exp(2) + exp(3) + exp(4);
  double want_loss0 = log(z0) - 3.0;
  double z1 = 1.0 + exp(-150.0) + exp(-100.0) + exp(-1.0); /* shifted by the max, 100 */
  double want_loss1 = log(z1) - (99.0 - 100.0);
  CHECK_NEAR(loss, want_loss0 + want_loss1, 1e-5);
  CHECK_EQ_INT(correct, 0); /* row 0 picks 3 (label 2), row 1 picks 0 (label 3) */
  CHECK_NEAR(dlogits[2], 0.5 * (exp(3) / z0 - 1.0), 1e-6);
  CHECK_NEAR(dlogits[0], 0.5 * exp(1) / z0, 1e-6);
  CHECK_NEAR(dlogits[4], 0.5 * (1.0 / z1), 1e-6);
  CHECK_NEAR(dlogits[7], 0.5 * (exp(-1.0) / z1 - 1.0), 1e-6);
  int hit;
  float row_loss = kernel_softmax_xent_row(logits, 4, 3, 1.0f, NULL, &hit);
  CHECK_EQ_INT(hit, 1);
  CHECK_NEAR(row_loss, log(z0) - 4.0, 1e-6);
  labels[1] = 4;
  CHECK_EQ_INT(be->ops->softmax_xent(be, logits, labels, 2, 4, 1.0f, NULL, &loss, &correct, &err),
               PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "label 4 of row 1");
  backend_destroy(be);
}

static void case_backend_name(void) {
  backend *be = backend_fixture(99);
  CHECK_EQ_STR(be->name, "cpu");
  CHECK_CONTAINS(be->description, "1 thread");
  backend_destroy(be);
}

int main(void) {
  RUN_CASE(case_gemm_against_loops);
  RUN_CASE(case_row_major_mapping);
  RUN_CASE(case_bias_relu_and_backward);
  RUN_CASE(case_softmax_xent);
  RUN_CASE(case_backend_name);
  return check_report("test_gemm");
}
