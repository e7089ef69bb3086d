/* The compute backend interface: memory, GEMM and the layer kernels the
 * model needs, implemented by the CPU backend (CBLAS) and the CUDA backend
 * (cuBLAS + kernels). Pointers passed to the ops live in the backend's memory
 * (host memory for the CPU, device memory for CUDA) unless a parameter says
 * "host". Every op returns PS_ERR_OK or an error with a message. A backend is
 * used by one thread at a time. */
#ifndef PSTRAIN_TRAINER_BACKEND_H
#define PSTRAIN_TRAINER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/optimizer.h"
#include "trainer/backend/gemm.h"
#include "trainer/backend/layer_shapes.h"

typedef struct backend backend;

typedef struct backend_ops {
  void (*destroy)(backend *b);
  /* Zeroed memory of `bytes`; NULL with err set on failure. */
  void *(*alloc)(backend *b, size_t bytes, ps_error *err);
  void (*free)(backend *b, void *ptr);
  /* Host memory for transfers (pinned on a GPU); NULL with err set on failure. */
  void *(*host_alloc)(backend *b, size_t bytes, ps_error *err);
  void (*host_free)(backend *b, void *ptr);
  /* Host-to-backend and backend-to-host copies. */
  ps_err (*upload)(backend *b, void *dst, const void *host_src, size_t bytes, ps_error *err);
  ps_err (*download)(backend *b, void *host_dst, const void *src, size_t bytes, ps_error *err);
  /* A column-major SGEMM (see gemm.h for how row-major products map onto it). */
  ps_err (*gemm)(backend *b, const gemm_call *call, ps_error *err);
  /* y (rows, cols) = act(y + bias (cols)) per row; act is ReLU when relu != 0. */
  ps_err (*bias_act)(backend *b, float *y, const float *bias, int rows, int cols, int relu,
                     ps_error *err);
  /* When relu != 0, dy (rows, cols) *= (y > 0); then dbias (cols) = column sums of dy. */
  ps_err (*act_bias_backward)(backend *b, float *dy, const float *y, float *dbias, int rows,
                              int cols, int relu, ps_error *err);
  /* Softmax cross-entropy of logits (rows, cols) against labels (rows). Adds the
   * summed loss to *host_loss_sum and the count of correct arg-maxes to
   * *host_correct; when dlogits is not NULL writes scale * (softmax - onehot). */
  ps_err (*softmax_xent)(backend *b, const float *logits, const int32_t *labels, int rows,
                         int cols, float scale, float *dlogits, double *host_loss_sum,
                         long *host_correct, ps_error *err);
  /* One optimizer update of n parameters; state1/state2 as optimizer_apply. */
  ps_err (*optimizer_step)(backend *b, const optimizer_config *cfg, long step, float *params,
                           const float *grads, float *state1, float *state2, size_t n,
                           ps_error *err);

  /* The convolutional layers (layer_shapes.h; NCHW). Outputs are
   * overwritten unless a parameter says "accumulate". */
  /* y = conv(x, w) + bias per output channel (bias NULL: none). */
  ps_err (*conv_forward)(backend *b, const conv_shape *s, const float *x, const float *w,
                         const float *bias, float *y, ps_error *err);
  /* From dy (n, k, oh, ow): dw, dbias (NULL: none) and dx (NULL: not wanted). */
  ps_err (*conv_backward)(backend *b, const conv_shape *s, const float *x, const float *w,
                          const float *dy, float *dx, float *dw, float *dbias, ps_error *err);
  ps_err (*maxpool_forward)(backend *b, const pool_shape *s, const float *x, float *y,
                            ps_error *err);
  /* dx from x, y and dy: each window's dy goes to a position holding its max. */
  ps_err (*maxpool_backward)(backend *b, const pool_shape *s, const float *x, const float *y,
                             const float *dy, float *dx, ps_error *err);
  /* Global average pooling: y (n, c) = mean of x (n, c, hw) over hw; backward
   * spreads dy / hw over each channel's hw. */
  ps_err (*avgpool_forward)(backend *b, int n, int c, int hw, const float *x, float *y,
                            ps_error *err);
  ps_err (*avgpool_backward)(backend *b, int n, int c, int hw, const float *dy, float *dx,
                             ps_error *err);
  /* Batch norm in training: y = gamma (x - mean) * invstd + beta with the
   * batch's per-channel mean and biased variance, invstd = 1 / sqrt(var + eps);
   * save_mean and save_invstd (c) keep them for backward. When running_mean
   * is not NULL: running = (1 - momentum) running + momentum * batch value,
   * the variance unbiased (n hw / (n hw - 1)), as PyTorch and cuDNN do. */
  ps_err (*bn_forward_train)(backend *b, const bn_shape *s, const float *x, const float *gamma,
                             const float *beta, float *y, float *save_mean, float *save_invstd,
                             float *running_mean, float *running_var, float momentum,
                             ps_error *err);
  /* Batch norm in evaluation, with the given mean and variance. */
  ps_err (*bn_forward_infer)(backend *b, const bn_shape *s, const float *x, const float *gamma,
                             const float *beta, const float *mean, const float *var, float *y,
                             ps_error *err);
  /* dx (overwritten), dgamma and dbeta (c; added to when accumulate, else
   * overwritten) of the training-mode forward. */
  ps_err (*bn_backward)(backend *b, const bn_shape *s, const float *x, const float *dy,
                        const float *gamma, const float *save_mean, const float *save_invstd,
                        float *dx, float *dgamma, float *dbeta, int accumulate, ps_error *err);
  /* y = max(x, 0); y may be x. */
  ps_err (*relu_forward)(backend *b, float *y, const float *x, size_t n, ps_error *err);
  /* dx = dy where y > 0, else 0; dx may be dy. */
  ps_err (*relu_backward)(backend *b, float *dx, const float *dy, const float *y, size_t n,
                          ps_error *err);
  /* y = a + scale * x (element-wise); y may be a or x. */
  ps_err (*add)(backend *b, float *y, const float *a, const float *x, float scale, size_t n,
                ps_error *err);
  /* n floats within the backend's memory. */
  ps_err (*copy)(backend *b, float *dst, const float *src, size_t n, ps_error *err);
} backend_ops;

struct backend {
  const backend_ops *ops;
  const char *name; /* "cpu" or "cuda" */
  int host_memory;  /* its memory is host memory: pointers may be read directly */
  int device;       /* the GPU's index (CUDA backend) */
  void *stream;     /* its cudaStream_t (CUDA backend), for NCCL */
  char description[256]; /* e.g. the BLAS and its kernel core, or the GPU's name */
};

/* The CPU backend; threads > 0 sets the BLAS thread count, 0 keeps its default. */
ps_err backend_cpu_create(backend **out, int threads, ps_error *err);

/* The CUDA backend lives in the CUDA module (cuda_module.h), loaded by
 * backend_open or cuda_module_load (cuda_load.h) when a GPU is wanted. */

/* Picks a backend for --device auto|cpu|cuda (gpu: which device; -1 takes
 * OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID modulo the GPUs, else 0). Fails
 * with PS_ERR_UNSUPPORTED, saying which, when cuda is asked for and this
 * build has no CUDA backend, the CUDA module does not load or no GPU is
 * visible; auto falls back to the CPU and logs why. cpu never loads the
 * module; auto loads it only when the CUDA driver sees a GPU. */
ps_err backend_open(backend **out, const char *device, int threads, int gpu, ps_error *err);

static inline void backend_destroy(backend *b) {
  if (b != NULL) b->ops->destroy(b);
}

#endif
