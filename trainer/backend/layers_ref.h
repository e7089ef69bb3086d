/* A plain reference of the convolutional layers' backend ops (backend.h):
 * direct loops, sums in double, no BLAS. The tests check these by finite
 * differences and the backends' fast paths against them. Arguments are the
 * ops' own, without the backend and the error: these cannot fail. */
#ifndef PSTRAIN_TRAINER_BACKEND_LAYERS_REF_H
#define PSTRAIN_TRAINER_BACKEND_LAYERS_REF_H

#include <stddef.h>

#include "trainer/backend/layer_shapes.h"

void layers_ref_conv_forward(const conv_shape *s, const float *x, const float *w,
                             const float *bias, float *y);
void layers_ref_conv_backward(const conv_shape *s, const float *x, const float *w,
                              const float *dy, float *dx, float *dw, float *dbias);

/* A window with no input position in it (only when pad >= the kernel) gives
 * 0 and passes no gradient. */
void layers_ref_maxpool_forward(const pool_shape *s, const float *x, float *y);
/* Each window's dy goes to the first position, in row-major window order,
 * holding its max; overlapping windows add up. */
void layers_ref_maxpool_backward(const pool_shape *s, const float *x, const float *y,
                                 const float *dy, float *dx);

void layers_ref_avgpool_forward(int n, int c, int hw, const float *x, float *y);
void layers_ref_avgpool_backward(int n, int c, int hw, const float *dy, float *dx);

/* The running variance uses n hw / (n hw - 1), or 1 when n hw is 1. */
void layers_ref_bn_forward_train(const bn_shape *s, const float *x, const float *gamma,
                                 const float *beta, float *y, float *save_mean,
                                 float *save_invstd, float *running_mean, float *running_var,
                                 float momentum);
void layers_ref_bn_forward_infer(const bn_shape *s, const float *x, const float *gamma,
                                 const float *beta, const float *mean, const float *var,
                                 float *y);
void layers_ref_bn_backward(const bn_shape *s, const float *x, const float *dy,
                            const float *gamma, const float *save_mean, const float *save_invstd,
                            float *dx, float *dgamma, float *dbeta, int accumulate);

void layers_ref_relu_forward(float *y, const float *x, size_t n);
void layers_ref_relu_backward(float *dx, const float *dy, const float *y, size_t n);
void layers_ref_add(float *y, const float *a, const float *x, float scale, size_t n);
void layers_ref_copy(float *dst, const float *src, size_t n);

#endif
