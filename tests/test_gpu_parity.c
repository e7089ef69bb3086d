/* CPU/GPU parity (label "gpu"): every CUDA kernel, cuBLAS through the shared
 * gemm mapping, and a whole forward + backward step of the reference MLP
 * give the CPU backend's results on random inputs, within relative error
 * (max |gpu - cpu| / max |cpu|): 1e-5 for element-wise kernels (nvcc fuses
 * multiply-adds), 1e-4 for GEMMs and the full step (other summation orders).
 * Exits 77 (skipped) where no GPU is visible or the build has no CUDA. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fp_env.h"
#include "common/rng.h"
#include "tests/check.h"
#include "trainer/backend/backend.h"
#include "trainer/model/mlp.h"

#ifndef PSTRAIN_HAVE_CUDA
int main(void) {
  fprintf(stderr, "SKIP: this build has no CUDA backend\n");
  return 77;
}
#else

static rng r;
static backend *cpu, *gpu;

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

int main(void) {
  fp_env_flush_denormals(); /* as the trainer and pserver run (common/fp_env.h) */
  char why[256] = "";
  if (backend_cuda_device_count(why, sizeof why) == 0) {
    fprintf(stderr, "SKIP: no GPU is visible (%s)\n", why);
    return 77;
  }
  ps_error err;
  REQUIRE(backend_cpu_create(&cpu, 1, &err) == PS_ERR_OK);
  if (backend_cuda_create(&gpu, 0, &err) != PS_ERR_OK) {
    fprintf(stderr, "FAIL: a GPU is visible but the CUDA backend did not open: %s\n", err.msg);
    return 1;
  }
  fprintf(stderr, "parity on %s\n", gpu->description);
  rng_seed(&r, 2024, 0);

  for (int ta = 0; ta <= 1; ta++) {
    for (int tb = 0; tb <= 1; tb++) {
      check_gemm(ta, tb, 64, 256, 784);
      check_gemm(ta, tb, 37, 11, 5);
    }
  }

  /* bias + activation and its backward. */
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

  /* Softmax cross-entropy. */
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
  /* A bad label is an error on the GPU too. */
  labels[3] = 12;
  REQUIRE(gpu->ops->upload(gpu, lab_dev, labels, sizeof labels, &err) == PS_ERR_OK);
  CHECK_EQ_INT(gpu->ops->softmax_xent(gpu, l_dev, lab_dev, ROWS, 10, 1.0f, NULL, &gloss, &gcorrect,
                                      &err),
               PS_ERR_INVALID_ARGUMENT);

  /* Optimizers, three steps each. */
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

  /* A whole forward + backward step of the reference MLP. */
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
  gpu->ops->free(gpu, l_dev);
  gpu->ops->free(gpu, dl_dev);
  gpu->ops->free(gpu, lab_dev);
  backend_destroy(gpu);
  backend_destroy(cpu);
  return check_report("test_gpu_parity");
}
#endif
