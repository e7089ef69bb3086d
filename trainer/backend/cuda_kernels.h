/* The CUDA kernels of the CUDA backend, behind a C API: each launches on
 * `stream` and returns the launch's cudaError_t (asynchronous errors surface
 * at the next synchronizing call). All pointers are device memory. The math
 * per element is kernel_math.h's and optimizer_math.h's, shared with the CPU
 * backend, so the CPU tests check it. */
#ifndef PSTRAIN_TRAINER_CUDA_KERNELS_H
#define PSTRAIN_TRAINER_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/optimizer_math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y (rows, cols) = act(y + bias) per row. */
cudaError_t cuda_bias_act(float *y, const float *bias, int rows, int cols, int relu,
                          cudaStream_t stream);

/* dy *= (y > 0) when relu; dbias (cols) = column sums of dy, summed in row
 * order (deterministic). */
cudaError_t cuda_act_bias_backward(float *dy, const float *y, float *dbias, int rows, int cols,
                                   int relu, cudaStream_t stream);

/* Per row: row_loss[r], row_correct[r]; dlogits = scale * (softmax - onehot)
 * when not NULL. Labels outside 0..cols-1 give row_correct[r] = -1. */
cudaError_t cuda_softmax_xent(const float *logits, const int32_t *labels, int rows, int cols,
                              float scale, float *dlogits, float *row_loss, int *row_correct,
                              cudaStream_t stream);

/* One optimizer update (kind as optimizer_kind: 0 sgd, 1 momentum, 2 adam). */
cudaError_t cuda_optimizer_step(int kind, optimizer_scalars scalars, float *params,
                                const float *grads, float *state1, float *state2, size_t n,
                                cudaStream_t stream);

/* y = max(x, 0) over n elements; y may be x. */
cudaError_t cuda_relu_forward(float *y, const float *x, size_t n, cudaStream_t stream);

/* dx = dy where y > 0, else 0; dx may be dy. */
cudaError_t cuda_relu_backward(float *dx, const float *dy, const float *y, size_t n,
                               cudaStream_t stream);

/* y = a + scale * x; y may be a or x. */
cudaError_t cuda_add(float *y, const float *a, const float *x, float scale, size_t n,
                     cudaStream_t stream);

/* Global average pooling: y (rows) = mean of each row of x (rows, hw), and
 * its backward dx (rows, hw) = dy (rows) / hw. rows is n * c. */
cudaError_t cuda_avgpool_forward(const float *x, float *y, size_t rows, int hw,
                                 cudaStream_t stream);
cudaError_t cuda_avgpool_backward(const float *dy, float *dx, size_t rows, int hw,
                                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
