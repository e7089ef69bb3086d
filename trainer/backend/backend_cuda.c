/* The CUDA backend: parameters, gradients and activations in device memory,
 * GEMMs through cuBLAS (column-major, the same gemm_call the CPU backend
 * runs), layer kernels in cuda_kernels.cu, convolution, max pooling and
 * batch norm through cuDNN (cuda_layers.c; without cuDNN those ops fail with
 * PS_ERR_UNSUPPORTED), host buffers pinned. Every CUDA and cuBLAS call is
 * checked; a failure names file:line, the call and the library's own message. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/backend/backend.h"
#include "trainer/backend/cuda_kernels.h"
#include "trainer/backend/cuda_layers.h"
#include "trainer/backend/cuda_module.h"
#include "trainer/backend/cuda_try.h"

typedef struct cuda_backend {
  backend base;
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  float *row_loss;       /* (scratch_rows) device */
  int *row_correct;      /* (scratch_rows) device */
  float *host_loss;      /* (scratch_rows) pinned */
  int *host_correct;     /* (scratch_rows) pinned */
  int scratch_rows;
  cuda_layers *layers;   /* cuDNN's handle and workspace, made on first use */
} cuda_backend;

#define CUBLAS_TRY(err, expr)                                                                    \
  do {                                                                                           \
    cublasStatus_t blas_rc_ = (expr);                                                            \
    if (blas_rc_ != CUBLAS_STATUS_SUCCESS) {                                                     \
      return ps_error_set((err), PS_ERR_BACKEND, "%s:%d: %s failed: %s", __FILE__, __LINE__,     \
                          #expr, cublasGetStatusString(blas_rc_));                               \
    }                                                                                            \
  } while (0)

static cuda_backend *cb(backend *b) { return (cuda_backend *)b; }

cuda_layers **cuda_backend_layers(backend *b) { return &cb(b)->layers; }

static void cuda_destroy(backend *b) {
  cuda_backend *c = cb(b);
#ifdef PSTRAIN_HAVE_CUDNN
  cuda_layers_destroy(c->layers);
#endif
  /* Teardown errors have no caller to go to; the process is ending its use. */
  cudaFree(c->row_loss);
  cudaFree(c->row_correct);
  cudaFreeHost(c->host_loss);
  cudaFreeHost(c->host_correct);
  if (c->blas != NULL) cublasDestroy(c->blas);
  if (c->stream != NULL) cudaStreamDestroy(c->stream);
  free(c);
}

static void *cuda_alloc(backend *b, size_t bytes, ps_error *err) {
  (void)b;
  void *ptr = NULL;
  cudaError_t rc = cudaMalloc(&ptr, bytes > 0 ? bytes : 4);
  if (rc == cudaSuccess) rc = cudaMemset(ptr, 0, bytes > 0 ? bytes : 4);
  if (rc != cudaSuccess) {
    cudaFree(ptr);
    ps_error_set(err, PS_ERR_NO_MEMORY, "cuda backend: allocating %zu bytes on the GPU: %s", bytes,
                 cudaGetErrorString(rc));
    return NULL;
  }
  return ptr;
}

static void cuda_free(backend *b, void *ptr) {
  (void)b;
  if (ptr != NULL) cudaFree(ptr);
}

static void *cuda_host_alloc(backend *b, size_t bytes, ps_error *err) {
  (void)b;
  void *ptr = NULL;
  cudaError_t rc = cudaMallocHost(&ptr, bytes > 0 ? bytes : 4);
  if (rc != cudaSuccess) {
    ps_error_set(err, PS_ERR_NO_MEMORY, "cuda backend: pinning %zu bytes of host memory: %s",
                 bytes, cudaGetErrorString(rc));
    return NULL;
  }
  return ptr;
}

static void cuda_host_free(backend *b, void *ptr) {
  (void)b;
  if (ptr != NULL) cudaFreeHost(ptr);
}

static ps_err cuda_upload(backend *b, void *dst, const void *src, size_t bytes, ps_error *err) {
  cuda_backend *c = cb(b);
  CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
  /* The caller reuses its host buffer at once: wait for the copy. */
  CUDA_TRY(err, cudaStreamSynchronize(c->stream));
  return PS_ERR_OK;
}

static ps_err cuda_download(backend *b, void *dst, const void *src, size_t bytes, ps_error *err) {
  cuda_backend *c = cb(b);
  CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
  CUDA_TRY(err, cudaStreamSynchronize(c->stream));
  return PS_ERR_OK;
}

static ps_err cuda_gemm(backend *b, const gemm_call *g, ps_error *err) {
  cuda_backend *c = cb(b);
  CUBLAS_TRY(err, cublasSgemm(c->blas, g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                              g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g->m, g->n, g->k, &g->alpha,
                              g->a, g->lda, g->b, g->ldb, &g->beta, g->c, g->ldc));
  return PS_ERR_OK;
}

static ps_err cuda_bias_act_op(backend *b, float *y, const float *bias, int rows, int cols,
                               int relu, ps_error *err) {
  CUDA_TRY(err, cuda_bias_act(y, bias, rows, cols, relu, cb(b)->stream));
  return PS_ERR_OK;
}

static ps_err cuda_act_bias_backward_op(backend *b, float *dy, const float *y, float *dbias,
                                        int rows, int cols, int relu, ps_error *err) {
  CUDA_TRY(err, cuda_act_bias_backward(dy, y, dbias, rows, cols, relu, cb(b)->stream));
  return PS_ERR_OK;
}

/* Grows the per-row loss scratch to `rows`. */
static ps_err ensure_scratch(cuda_backend *c, int rows, ps_error *err) {
  if (rows <= c->scratch_rows) return PS_ERR_OK;
  cudaFree(c->row_loss);
  cudaFree(c->row_correct);
  cudaFreeHost(c->host_loss);
  cudaFreeHost(c->host_correct);
  c->row_loss = NULL;
  c->row_correct = NULL;
  c->host_loss = NULL;
  c->host_correct = NULL;
  c->scratch_rows = 0;
  CUDA_TRY(err, cudaMalloc((void **)&c->row_loss, (size_t)rows * sizeof(float)));
  CUDA_TRY(err, cudaMalloc((void **)&c->row_correct, (size_t)rows * sizeof(int)));
  CUDA_TRY(err, cudaMallocHost((void **)&c->host_loss, (size_t)rows * sizeof(float)));
  CUDA_TRY(err, cudaMallocHost((void **)&c->host_correct, (size_t)rows * sizeof(int)));
  c->scratch_rows = rows;
  return PS_ERR_OK;
}

static ps_err cuda_softmax_xent_op(backend *b, const float *logits, const int32_t *labels, int rows,
                                   int cols, float scale, float *dlogits, double *host_loss_sum,
                                   long *host_correct, ps_error *err) {
  cuda_backend *c = cb(b);
  if (ensure_scratch(c, rows, err) != PS_ERR_OK) return err->code;
  CUDA_TRY(err, cuda_softmax_xent(logits, labels, rows, cols, scale, dlogits, c->row_loss,
                                  c->row_correct, c->stream));
  CUDA_TRY(err, cudaMemcpyAsync(c->host_loss, c->row_loss, (size_t)rows * sizeof(float),
                                cudaMemcpyDeviceToHost, c->stream));
  CUDA_TRY(err, cudaMemcpyAsync(c->host_correct, c->row_correct, (size_t)rows * sizeof(int),
                                cudaMemcpyDeviceToHost, c->stream));
  CUDA_TRY(err, cudaStreamSynchronize(c->stream));
  double loss = 0.0;
  long correct = 0;
  for (int r = 0; r < rows; r++) {
    if (c->host_correct[r] < 0) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "a label of row %d is not a class 0..%d",
                          r, cols - 1);
    }
    loss += c->host_loss[r];
    correct += c->host_correct[r];
  }
  *host_loss_sum += loss;
  *host_correct += correct;
  return PS_ERR_OK;
}

static ps_err cuda_optimizer_step_op(backend *b, const optimizer_config *cfg, long step,
                                     float *params, const float *grads, float *state1,
                                     float *state2, size_t n, ps_error *err) {
  optimizer_scalars s = optimizer_scalars_at(cfg, step);
  CUDA_TRY(err, cuda_optimizer_step((int)cfg->kind, s, params, grads, state1, state2, n,
                                    cb(b)->stream));
  return PS_ERR_OK;
}

#ifndef PSTRAIN_HAVE_CUDNN
/* Built without cuDNN: the ops that need it say so. */
static ps_err no_cudnn(const char *op, ps_error *err) {
  return ps_error_set(err, PS_ERR_UNSUPPORTED,
                      "this build has no cuDNN: the CUDA backend's %s needs it (CMake found no "
                      "libcudnn and cudnn.h beside the CUDA toolkit; install cuDNN and rebuild, "
                      "or run on --device cpu)",
                      op);
}

ps_err cuda_conv_forward(backend *b, const conv_shape *s, const float *x, const float *w,
                         const float *bias, float *y, ps_error *err) {
  (void)b, (void)s, (void)x, (void)w, (void)bias, (void)y;
  return no_cudnn("conv_forward", err);
}
ps_err cuda_conv_backward(backend *b, const conv_shape *s, const float *x, const float *w,
                          const float *dy, float *dx, float *dw, float *dbias, ps_error *err) {
  (void)b, (void)s, (void)x, (void)w, (void)dy, (void)dx, (void)dw, (void)dbias;
  return no_cudnn("conv_backward", err);
}
ps_err cuda_maxpool_forward(backend *b, const pool_shape *s, const float *x, float *y,
                            ps_error *err) {
  (void)b, (void)s, (void)x, (void)y;
  return no_cudnn("maxpool_forward", err);
}
ps_err cuda_maxpool_backward(backend *b, const pool_shape *s, const float *x, const float *y,
                             const float *dy, float *dx, ps_error *err) {
  (void)b, (void)s, (void)x, (void)y, (void)dy, (void)dx;
  return no_cudnn("maxpool_backward", err);
}
ps_err cuda_bn_forward_train(backend *b, const bn_shape *s, const float *x, const float *gamma,
                             const float *beta, float *y, float *save_mean, float *save_invstd,
                             float *running_mean, float *running_var, float momentum,
                             ps_error *err) {
  (void)b, (void)s, (void)x, (void)gamma, (void)beta, (void)y, (void)save_mean;
  (void)save_invstd, (void)running_mean, (void)running_var, (void)momentum;
  return no_cudnn("bn_forward_train", err);
}
ps_err cuda_bn_forward_infer(backend *b, const bn_shape *s, const float *x, const float *gamma,
                             const float *beta, const float *mean, const float *var, float *y,
                             ps_error *err) {
  (void)b, (void)s, (void)x, (void)gamma, (void)beta, (void)mean, (void)var, (void)y;
  return no_cudnn("bn_forward_infer", err);
}
ps_err cuda_bn_backward(backend *b, const bn_shape *s, const float *x, const float *dy,
                        const float *gamma, const float *save_mean, const float *save_invstd,
                        float *dx, float *dgamma, float *dbeta, int accumulate, ps_error *err) {
  (void)b, (void)s, (void)x, (void)dy, (void)gamma, (void)save_mean, (void)save_invstd;
  (void)dx, (void)dgamma, (void)dbeta, (void)accumulate;
  return no_cudnn("bn_backward", err);
}
#endif

static ps_err cuda_avgpool_forward_op(backend *b, int n, int c, int hw, const float *x, float *y,
                                      ps_error *err) {
  CUDA_TRY(err, cuda_avgpool_forward(x, y, (size_t)n * c, hw, cb(b)->stream));
  return PS_ERR_OK;
}

static ps_err cuda_avgpool_backward_op(backend *b, int n, int c, int hw, const float *dy,
                                       float *dx, ps_error *err) {
  CUDA_TRY(err, cuda_avgpool_backward(dy, dx, (size_t)n * c, hw, cb(b)->stream));
  return PS_ERR_OK;
}

static ps_err cuda_relu_forward_op(backend *b, float *y, const float *x, size_t n, ps_error *err) {
  CUDA_TRY(err, cuda_relu_forward(y, x, n, cb(b)->stream));
  return PS_ERR_OK;
}

static ps_err cuda_relu_backward_op(backend *b, float *dx, const float *dy, const float *y,
                                    size_t n, ps_error *err) {
  CUDA_TRY(err, cuda_relu_backward(dx, dy, y, n, cb(b)->stream));
  return PS_ERR_OK;
}

static ps_err cuda_add_op(backend *b, float *y, const float *a, const float *x, float scale,
                          size_t n, ps_error *err) {
  CUDA_TRY(err, cuda_add(y, a, x, scale, n, cb(b)->stream));
  return PS_ERR_OK;
}

static ps_err cuda_copy_op(backend *b, float *dst, const float *src, size_t n, ps_error *err) {
  if (n == 0 || dst == src) return PS_ERR_OK;
  CUDA_TRY(err, cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                cb(b)->stream));
  return PS_ERR_OK;
}

static const backend_ops cuda_ops = {
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .gemm = cuda_gemm,
    .bias_act = cuda_bias_act_op,
    .act_bias_backward = cuda_act_bias_backward_op,
    .softmax_xent = cuda_softmax_xent_op,
    .optimizer_step = cuda_optimizer_step_op,
    .conv_forward = cuda_conv_forward,
    .conv_backward = cuda_conv_backward,
    .maxpool_forward = cuda_maxpool_forward,
    .maxpool_backward = cuda_maxpool_backward,
    .avgpool_forward = cuda_avgpool_forward_op,
    .avgpool_backward = cuda_avgpool_backward_op,
    .bn_forward_train = cuda_bn_forward_train,
    .bn_forward_infer = cuda_bn_forward_infer,
    .bn_backward = cuda_bn_backward,
    .relu_forward = cuda_relu_forward_op,
    .relu_backward = cuda_relu_backward_op,
    .add = cuda_add_op,
    .copy = cuda_copy_op,
};

int backend_cuda_device_count(char *why, size_t why_len) {
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    /* No driver reads as "driver version is insufficient": no GPU either way. */
    snprintf(why, why_len, "cudaGetDeviceCount: %s", cudaGetErrorString(rc));
    return 0;
  }
  if (count == 0) snprintf(why, why_len, "cudaGetDeviceCount found no device");
  return count;
}

ps_err backend_cuda_create(backend **out, int device, ps_error *err) {
  cuda_backend *c = calloc(1, sizeof *c);
  if (c == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "creating the cuda backend: out of memory");
  c->base.ops = &cuda_ops;
  c->base.name = "cuda";
  c->base.host_memory = 0;
  c->device = device;
  ps_err rc = PS_ERR_OK;
  struct cudaDeviceProp prop;
  cudaError_t crc = cudaSetDevice(device);
  if (crc == cudaSuccess) crc = cudaGetDeviceProperties(&prop, device);
  if (crc == cudaSuccess) crc = cudaStreamCreate(&c->stream);
  if (crc != cudaSuccess) {
    rc = ps_error_set(err, PS_ERR_BACKEND, "opening GPU %d: %s", device, cudaGetErrorString(crc));
  } else {
    cublasStatus_t brc = cublasCreate(&c->blas);
    if (brc == CUBLAS_STATUS_SUCCESS) brc = cublasSetStream(c->blas, c->stream);
    if (brc != CUBLAS_STATUS_SUCCESS) {
      rc = ps_error_set(err, PS_ERR_BACKEND, "creating the cuBLAS handle on GPU %d: %s", device,
                        cublasGetStatusString(brc));
    }
  }
  if (rc != PS_ERR_OK) {
    cuda_destroy(&c->base);
    return rc;
  }
  c->base.device = device;
  c->base.stream = c->stream;
  snprintf(c->base.description, sizeof c->base.description, "GPU %d: %.80s, compute %d.%d",
           device, prop.name, prop.major, prop.minor);
  *out = &c->base;
  return PS_ERR_OK;
}
