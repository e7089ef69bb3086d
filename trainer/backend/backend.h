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
} backend_ops;

struct backend {
  const backend_ops *ops;
  const char *name; /* "cpu" or "cuda" */
  int host_memory;  /* its memory is host memory: pointers may be read directly */
  int device;       /* the GPU's index (CUDA backend) */
  void *stream;     /* its cudaStream_t (CUDA backend), for NCCL */
  char description[128]; /* e.g. the BLAS and its kernel core, or the GPU's name */
};

/* The CPU backend; threads > 0 sets the BLAS thread count, 0 keeps its default. */
ps_err backend_cpu_create(backend **out, int threads, ps_error *err);

/* The CUDA backend on GPU `device` (built only with the CUDA toolkit). */
ps_err backend_cuda_create(backend **out, int device, ps_error *err);
/* GPUs visible to this process; 0 with the reason in why when none is. */
int backend_cuda_device_count(char *why, size_t why_len);

/* Picks a backend for --device auto|cpu|cuda (gpu: which device; -1 takes
 * OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID modulo the GPUs, else 0). Fails
 * with PS_ERR_UNSUPPORTED, saying which, when cuda is asked for and this
 * build has no CUDA backend or no GPU is visible; auto falls back to the CPU
 * and logs why. */
ps_err backend_open(backend **out, const char *device, int threads, int gpu, ps_error *err);

static inline void backend_destroy(backend *b) {
  if (b != NULL) b->ops->destroy(b);
}

#endif
