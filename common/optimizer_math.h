/* Per-element optimizer updates, shared by the CPU loop (optimizer.c) and
 * the CUDA kernels, so the math the GPU runs is the math the CPU tests check.
 * Step-dependent scalars (learning rate, bias corrections) are worked out
 * once per step on the host into an optimizer_scalars. */
#ifndef PSTRAIN_COMMON_OPTIMIZER_MATH_H
#define PSTRAIN_COMMON_OPTIMIZER_MATH_H

#include <math.h>

#include "common/host_device.h"

typedef struct optimizer_scalars {
  float lr;           /* learning rate of this step, after the schedule */
  float weight_decay;
  float momentum;     /* momentum SGD */
  float beta1, beta2; /* Adam */
  float one_minus_beta1, one_minus_beta2; /* in double first: 1 - 0.999f loses digits */
  float epsilon;
  float bias_correction1; /* 1 - beta1^t, t = step + 1 */
  float bias_correction2; /* 1 - beta2^t */
} optimizer_scalars;

/* SGD with L2 weight decay added to the gradient. */
static inline PS_HOST_DEVICE void optimizer_sgd_elem(float *w, float g, const optimizer_scalars *s) {
  g += s->weight_decay * *w;
  *w -= s->lr * g;
}

/* Momentum SGD (velocity form used by PyTorch): v = mu v + g; w -= lr v. */
static inline PS_HOST_DEVICE void optimizer_momentum_elem(float *w, float *v, float g,
                                                          const optimizer_scalars *s) {
  g += s->weight_decay * *w;
  *v = s->momentum * *v + g;
  *w -= s->lr * *v;
}

/* Adam with decoupled weight decay (AdamW): the decay does not pass through
 * the moment estimates. */
static inline PS_HOST_DEVICE void optimizer_adam_elem(float *w, float *m, float *v, float g,
                                                      const optimizer_scalars *s) {
  *m = s->beta1 * *m + s->one_minus_beta1 * g;
  *v = s->beta2 * *v + s->one_minus_beta2 * g * g;
  float m_hat = *m / s->bias_correction1;
  float v_hat = *v / s->bias_correction2;
  *w -= s->lr * (m_hat / (sqrtf(v_hat) + s->epsilon) + s->weight_decay * *w);
}

#endif
