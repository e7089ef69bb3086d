/* The CPU backend: GEMMs through OpenBLAS's CBLAS, layer kernels as plain
 * loops over the shared per-element math (the convolutional layers' in
 * conv_cpu.c and layers_cpu.c). Memory is ordinary host memory. */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/backend/backend.h"
#include "common/log.h"
#include "trainer/backend/conv_dnnl.h"
#include "trainer/backend/kernel_math.h"
#include "trainer/backend/layers_cpu.h"

/* The backend with the convolutions' scratch (im2col columns), grown on
 * demand and kept: a training step asks for the same sizes every time. */
typedef struct cpu_backend {
  backend base;
  float *scratch;
  size_t scratch_len; /* floats */
  conv_dnnl *dnnl;    /* oneDNN's convolutions; NULL in a build without it */
  int threads;        /* OpenBLAS's, restored after the convolutions' parts */
  cpu_pool *pool;     /* threads - 1 workers for the layer ops */
} cpu_backend;

static void cpu_destroy(backend *b) {
  cpu_backend *cb = (cpu_backend *)b;
  conv_dnnl_destroy(cb->dnnl);
  cpu_pool_destroy(cb->pool);
  free(cb->scratch);
  free(cb);
}

conv_dnnl *backend_cpu_dnnl(backend *b) { return ((cpu_backend *)b)->dnnl; }

int backend_cpu_threads(backend *b) { return ((cpu_backend *)b)->threads; }

cpu_pool *backend_cpu_pool(backend *b) { return ((cpu_backend *)b)->pool; }

float *backend_cpu_scratch(backend *b, size_t floats, ps_error *err) {
  cpu_backend *cb = (cpu_backend *)b;
  if (floats <= cb->scratch_len && cb->scratch != NULL) return cb->scratch;
  void *ptr = NULL;
  size_t bytes = (floats > 0 ? floats : 1) * sizeof(float);
  int rc = posix_memalign(&ptr, 64, (bytes + 63) / 64 * 64);
  if (rc != 0) {
    ps_error_set(err, PS_ERR_NO_MEMORY, "cpu backend: growing the scratch to %zu bytes: %s",
                 bytes, strerror(rc));
    return NULL;
  }
  free(cb->scratch);
  cb->scratch = ptr;
  cb->scratch_len = floats;
  return cb->scratch;
}

static void *cpu_alloc(backend *b, size_t bytes, ps_error *err) {
  (void)b;
  void *ptr = NULL;
  size_t rounded = (bytes + 63) / 64 * 64;
  int rc = posix_memalign(&ptr, 64, rounded > 0 ? rounded : 64);
  if (rc != 0) {
    ps_error_set(err, PS_ERR_NO_MEMORY, "cpu backend: allocating %zu bytes: %s", bytes,
                 strerror(rc));
    return NULL;
  }
  memset(ptr, 0, rounded);
  return ptr;
}

static void cpu_free(backend *b, void *ptr) {
  (void)b;
  free(ptr);
}

static void *cpu_host_alloc(backend *b, size_t bytes, ps_error *err) {
  return cpu_alloc(b, bytes, err);
}

static ps_err cpu_copy(backend *b, void *dst, const void *src, size_t bytes, ps_error *err) {
  (void)b;
  (void)err;
  if (dst != src) memcpy(dst, src, bytes);
  return PS_ERR_OK;
}

static ps_err cpu_gemm(backend *b, const gemm_call *c, ps_error *err) {
  (void)b;
  (void)err;
  cblas_sgemm(CblasColMajor, c->trans_a ? CblasTrans : CblasNoTrans,
              c->trans_b ? CblasTrans : CblasNoTrans, c->m, c->n, c->k, c->alpha, c->a, c->lda,
              c->b, c->ldb, c->beta, c->c, c->ldc);
  return PS_ERR_OK;
}

static ps_err cpu_bias_act(backend *b, float *restrict y, const float *restrict bias, int rows,
                           int cols, int relu, ps_error *err) {
  (void)b;
  (void)err;
  for (int r = 0; r < rows; r++) {
    float *row = y + (size_t)r * cols;
    if (relu) {
      for (int j = 0; j < cols; j++) row[j] = kernel_relu(row[j] + bias[j]);
    } else {
      for (int j = 0; j < cols; j++) row[j] += bias[j];
    }
  }
  return PS_ERR_OK;
}

static ps_err cpu_act_bias_backward(backend *b, float *restrict dy, const float *restrict y,
                                    float *restrict dbias, int rows, int cols, int relu,
                                    ps_error *err) {
  (void)b;
  (void)err;
  memset(dbias, 0, (size_t)cols * sizeof *dbias);
  for (int r = 0; r < rows; r++) {
    float *drow = dy + (size_t)r * cols;
    const float *yrow = y + (size_t)r * cols;
    if (relu) {
      for (int j = 0; j < cols; j++) drow[j] = kernel_relu_grad(drow[j], yrow[j]);
    }
    for (int j = 0; j < cols; j++) dbias[j] += drow[j];
  }
  return PS_ERR_OK;
}

static ps_err cpu_softmax_xent(backend *b, const float *logits, const int32_t *labels, int rows,
                               int cols, float scale, float *dlogits, double *host_loss_sum,
                               long *host_correct, ps_error *err) {
  (void)b;
  double loss = 0.0;
  long correct = 0;
  for (int r = 0; r < rows; r++) {
    if (labels[r] < 0 || labels[r] >= cols) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "label %d of row %d is not a class 0..%d",
                          labels[r], r, cols - 1);
    }
    int hit;
    loss += kernel_softmax_xent_row(logits + (size_t)r * cols, cols, labels[r], scale,
                                    dlogits != NULL ? dlogits + (size_t)r * cols : NULL, &hit);
    correct += hit;
  }
  *host_loss_sum += loss;
  *host_correct += correct;
  return PS_ERR_OK;
}

static ps_err cpu_optimizer_step(backend *b, const optimizer_config *cfg, long step, float *params,
                                 const float *grads, float *state1, float *state2, size_t n,
                                 ps_error *err) {
  (void)b;
  (void)err;
  optimizer_apply(cfg, step, params, grads, state1, state2, n);
  return PS_ERR_OK;
}

static const backend_ops cpu_ops = {
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .gemm = cpu_gemm,
    .bias_act = cpu_bias_act,
    .act_bias_backward = cpu_act_bias_backward,
    .softmax_xent = cpu_softmax_xent,
    .optimizer_step = cpu_optimizer_step,
    .conv_forward = cpu_conv_forward,
    .conv_backward = cpu_conv_backward,
    .maxpool_forward = cpu_maxpool_forward,
    .maxpool_backward = cpu_maxpool_backward,
    .avgpool_forward = cpu_avgpool_forward,
    .avgpool_backward = cpu_avgpool_backward,
    .bn_forward_train = cpu_bn_forward_train,
    .bn_forward_infer = cpu_bn_forward_infer,
    .bn_backward = cpu_bn_backward,
    .relu_forward = cpu_relu_forward,
    .relu_backward = cpu_relu_backward,
    .add = cpu_add,
    .copy = cpu_layer_copy,
};

ps_err backend_cpu_create(backend **out, int threads, ps_error *err) {
  cpu_backend *cb = calloc(1, sizeof *cb);
  if (cb == NULL)
    return ps_error_set(err, PS_ERR_NO_MEMORY, "creating the cpu backend: out of memory");
  backend *b = &cb->base;
  b->ops = &cpu_ops;
  b->name = "cpu";
  b->host_memory = 1;
  /* Denormals: flushed by main() for the whole process (common/fp_env.h). */
  if (threads > 0) openblas_set_num_threads(threads);
  cb->threads = openblas_get_num_threads();
  cb->pool = cpu_pool_create(cb->threads);
  if (cb->pool == NULL) {
    free(cb);
    return ps_error_set(err, PS_ERR_NO_MEMORY,
                        "creating the cpu backend's thread pool: out of memory");
  }
  ps_error dnnl_err;
  if (conv_dnnl_create(&cb->dnnl, threads, &dnnl_err) != PS_ERR_OK) {
    LOG_WARN("cpu backend: convolutions through im2col + BLAS: %s", dnnl_err.msg);
    cb->dnnl = NULL;
  }
  const char *idle = getenv("OPENBLAS_THREAD_TIMEOUT"); /* trainer/main.c sets it */
  snprintf(b->description, sizeof b->description,
           "%s; kernel core %s; %d thread(s), idle after 2^%s cycles%s", openblas_get_config(),
           openblas_get_corename(), openblas_get_num_threads(), idle != NULL ? idle : "28",
           cb->dnnl != NULL ? "; oneDNN convolutions" : "");
  *out = b;
  return PS_ERR_OK;
}
