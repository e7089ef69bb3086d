// CUDA kernels of the CUDA backend; the per-element math comes from the
// headers the CPU backend uses too.
#include "trainer/backend/cuda_kernels.h"

#include "trainer/backend/kernel_math.h"

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void bias_act_kernel(float *y, const float *bias, int rows, int cols, int relu) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<size_t>(rows) * cols) return;
  float v = y[i] + bias[i % cols];
  y[i] = relu ? kernel_relu(v) : v;
}

__global__ void act_bias_backward_kernel(float *dy, const float *y, float *dbias, int rows,
                                         int cols, int relu) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float sum = 0.0f;
  for (int r = 0; r < rows; r++) {
    size_t i = static_cast<size_t>(r) * cols + j;
    float g = relu ? kernel_relu_grad(dy[i], y[i]) : dy[i];
    dy[i] = g;
    sum += g;
  }
  dbias[j] = sum;
}

__global__ void softmax_xent_kernel(const float *logits, const int32_t *labels, int rows, int cols,
                                    float scale, float *dlogits, float *row_loss,
                                    int *row_correct) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  int32_t label = labels[r];
  if (label < 0 || label >= cols) {
    row_loss[r] = 0.0f;
    row_correct[r] = -1;
    return;
  }
  int hit = 0;
  size_t base = static_cast<size_t>(r) * cols;
  row_loss[r] = kernel_softmax_xent_row(logits + base, cols, label, scale,
                                        dlogits != nullptr ? dlogits + base : nullptr, &hit);
  row_correct[r] = hit;
}

__global__ void optimizer_kernel(int kind, optimizer_scalars s, float *params, const float *grads,
                                 float *state1, float *state2, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  if (kind == 0) {
    optimizer_sgd_elem(&params[i], grads[i], &s);
  } else if (kind == 1) {
    optimizer_momentum_elem(&params[i], &state1[i], grads[i], &s);
  } else {
    optimizer_adam_elem(&params[i], &state1[i], &state2[i], grads[i], &s);
  }
}

__global__ void relu_forward_kernel(float *y, const float *x, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = kernel_relu(x[i]);
}

__global__ void relu_backward_kernel(float *dx, const float *dy, const float *y, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) dx[i] = kernel_relu_grad(dy[i], y[i]);
}

__global__ void add_kernel(float *y, const float *a, const float *x, float scale, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = kernel_add_scaled(a[i], x[i], scale);
}

// One thread per channel row: the CPU's summation order, so the means agree.
__global__ void avgpool_forward_kernel(const float *x, float *y, size_t rows, int hw) {
  size_t r = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (r < rows) y[r] = kernel_channel_mean(x + r * hw, hw);
}

__global__ void avgpool_backward_kernel(const float *dy, float *dx, size_t rows, int hw) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < rows * hw) dx[i] = kernel_channel_mean_grad(dy[i / hw], hw);
}

}  // namespace

extern "C" cudaError_t cuda_relu_forward(float *y, const float *x, size_t n,
                                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  relu_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
  return cudaGetLastError();
}

extern "C" cudaError_t cuda_relu_backward(float *dx, const float *dy, const float *y, size_t n,
                                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dx, dy, y, n);
  return cudaGetLastError();
}

extern "C" cudaError_t cuda_add(float *y, const float *a, const float *x, float scale, size_t n,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, a, x, scale, n);
  return cudaGetLastError();
}

extern "C" cudaError_t cuda_avgpool_forward(const float *x, float *y, size_t rows, int hw,
                                            cudaStream_t stream) {
  if (rows == 0 || hw <= 0) return cudaSuccess;
  avgpool_forward_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(x, y, rows, hw);
  return cudaGetLastError();
}

extern "C" cudaError_t cuda_avgpool_backward(const float *dy, float *dx, size_t rows, int hw,
                                             cudaStream_t stream) {
  size_t n = rows * static_cast<size_t>(hw > 0 ? hw : 0);
  if (n == 0) return cudaSuccess;
  avgpool_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dy, dx, rows, hw);
  return cudaGetLastError();
}

extern "C" cudaError_t cuda_bias_act(float *y, const float *bias, int rows, int cols, int relu,
                                     cudaStream_t stream) {
  size_t n = static_cast<size_t>(rows) * cols;
  if (n == 0) return cudaSuccess;
  bias_act_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, bias, rows, cols, relu);
  return cudaGetLastError();
}

extern "C" cudaError_t cuda_act_bias_backward(float *dy, const float *y, float *dbias, int rows,
                                              int cols, int relu, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  act_bias_backward_kernel<<<blocks_for(cols), kThreads, 0, stream>>>(dy, y, dbias, rows, cols,
                                                                        relu);
  return cudaGetLastError();
}

extern "C" cudaError_t cuda_softmax_xent(const float *logits, const int32_t *labels, int rows,
                                         int cols, float scale, float *dlogits, float *row_loss,
                                         int *row_correct, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  softmax_xent_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(logits, labels, rows, cols, scale,
                                                                   dlogits, row_loss, row_correct);
  return cudaGetLastError();
}

extern "C" cudaError_t cuda_optimizer_step(int kind, optimizer_scalars scalars, float *params,
                                           const float *grads, float *state1, float *state2,
                                           size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  optimizer_kernel<<<blocks_for(n), kThreads, 0, stream>>>(kind, scalars, params, grads, state1,
                                                            state2, n);
  return cudaGetLastError();
}
