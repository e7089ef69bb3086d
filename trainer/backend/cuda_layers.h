/* The CUDA backend's convolutional layers through cuDNN (cuda_layers.c, built
 * only when CMake found cuDNN beside the toolkit; PSTRAIN_HAVE_CUDNN). The
 * functions are backend ops (backend.h) of a CUDA backend; they keep one
 * cuDNN handle per backend, on its stream, made on first use, with a growing
 * workspace and the per-shape algorithm cache of cudnn_plan.h. */
#ifndef PSTRAIN_TRAINER_CUDA_LAYERS_H
#define PSTRAIN_TRAINER_CUDA_LAYERS_H

#include "trainer/backend/backend.h"

typedef struct cuda_layers cuda_layers;

/* The backend's slot for its cuda_layers (backend_cuda.c); NULL until first use. */
cuda_layers **cuda_backend_layers(backend *b);
void cuda_layers_destroy(cuda_layers *l);

ps_err cuda_conv_forward(backend *b, const conv_shape *s, const float *x, const float *w,
                         const float *bias, float *y, ps_error *err);
ps_err cuda_conv_backward(backend *b, const conv_shape *s, const float *x, const float *w,
                          const float *dy, float *dx, float *dw, float *dbias, ps_error *err);
ps_err cuda_maxpool_forward(backend *b, const pool_shape *s, const float *x, float *y,
                            ps_error *err);
ps_err cuda_maxpool_backward(backend *b, const pool_shape *s, const float *x, const float *y,
                             const float *dy, float *dx, ps_error *err);
ps_err cuda_bn_forward_train(backend *b, const bn_shape *s, const float *x, const float *gamma,
                             const float *beta, float *y, float *save_mean, float *save_invstd,
                             float *running_mean, float *running_var, float momentum,
                             ps_error *err);
ps_err cuda_bn_forward_infer(backend *b, const bn_shape *s, const float *x, const float *gamma,
                             const float *beta, const float *mean, const float *var, float *y,
                             ps_error *err);
ps_err cuda_bn_backward(backend *b, const bn_shape *s, const float *x, const float *dy,
                        const float *gamma, const float *save_mean, const float *save_invstd,
                        float *dx, float *dgamma, float *dbeta, int accumulate, ps_error *err);

#endif
