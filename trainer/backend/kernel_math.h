/* Per-element and per-row math of the model's layers, shared by the CPU
 * backend's loops and the CUDA kernels so the CPU tests check what the GPU
 * computes. Row-major throughout. */
#ifndef PSTRAIN_TRAINER_KERNEL_MATH_H
#define PSTRAIN_TRAINER_KERNEL_MATH_H

#include <math.h>
#include <stdint.h>

#include "common/host_device.h"

/* ReLU as a max, not a branch: signs are random, branches mispredict. */
static inline PS_HOST_DEVICE float kernel_relu(float y) { return y > 0.0f ? y : 0.0f; }

/* Gradient through ReLU given its output y: dy where y > 0, else 0. */
static inline PS_HOST_DEVICE float kernel_relu_grad(float dy, float y) {
  return y > 0.0f ? dy : 0.0f;
}

/* y = a + scale * x, one element (the backend's add op). */
static inline PS_HOST_DEVICE float kernel_add_scaled(float a, float x, float scale) {
  return a + scale * x;
}

/* Global average pooling of one channel's hw values: their sum, in index
 * order, divided by hw. */
static inline PS_HOST_DEVICE float kernel_channel_mean(const float *x, int hw) {
  float sum = 0.0f;
  for (int i = 0; i < hw; i++) sum += x[i];
  return sum / (float)hw;
}

/* Its gradient at each of the hw positions. */
static inline PS_HOST_DEVICE float kernel_channel_mean_grad(float dy, int hw) {
  return dy / (float)hw;
}

/* Softmax cross-entropy of one row of logits against `label`. Returns the
 * row's loss, sets *correct to 1 when the arg-max is the label, and, when
 * dlogits is not NULL, writes scale * (softmax - onehot) there. Subtracting
 * the row maximum keeps exp() finite. */
static inline PS_HOST_DEVICE float kernel_softmax_xent_row(const float *logits, int cols,
                                                           int32_t label, float scale,
                                                           float *dlogits, int *correct) {
  float max = logits[0];
  int arg_max = 0;
  for (int j = 1; j < cols; j++) {
    if (logits[j] > max) {
      max = logits[j];
      arg_max = j;
    }
  }
  float sum = 0.0f;
  for (int j = 0; j < cols; j++) sum += expf(logits[j] - max);
  float log_sum = logf(sum);
  if (dlogits != 0) {
    float inv = 1.0f / sum;
    for (int j = 0; j < cols; j++) {
      float p = expf(logits[j] - max) * inv;
      dlogits[j] = scale * (p - (j == label ? 1.0f : 0.0f));
    }
  }
  *correct = arg_max == label;
  return log_sum - (logits[label] - max);
}

#endif
