/* The CPU backend's convolutional-layer ops (backend.h's contracts), shared
 * between backend_cpu.c's table, conv_cpu.c and layers_cpu.c. */
#ifndef PSTRAIN_TRAINER_BACKEND_LAYERS_CPU_H
#define PSTRAIN_TRAINER_BACKEND_LAYERS_CPU_H

#include <stddef.h>

#include "trainer/backend/backend.h"
#include "trainer/backend/conv_dnnl.h"
#include "trainer/backend/cpu_pool.h"

/* The CPU backend's scratch memory: at least `floats` floats, valid until
 * the next call; NULL with err set when it cannot grow. */
float *backend_cpu_scratch(backend *b, size_t floats, ps_error *err);

/* The backend's --threads (OpenBLAS's count where it was 0). */
int backend_cpu_threads(backend *b);

/* Its worker threads, for ops that split their work (cpu_pool.h). */
cpu_pool *backend_cpu_pool(backend *b);

/* The CPU backend's oneDNN convolutions; NULL in a build without oneDNN. */
conv_dnnl *backend_cpu_dnnl(backend *b);

/* Sums of n floats in a fixed order (eight float lanes, then double), so
 * results do not depend on threads and the loop vectorizes. */
double cpu_sum(const float *x, size_t n);

/* Convolution (conv_cpu.c): im2col + SGEMM over groups of up to `group`
 * images per GEMM (0: the default, chosen by scripts/bench_conv). The ops
 * cpu_conv_forward and cpu_conv_backward use oneDNN instead where the build
 * has it and conv_cpu_uses_dnnl says so. */
int conv_cpu_uses_dnnl(backend *b, const conv_shape *s);
ps_err cpu_conv_forward_group(backend *b, const conv_shape *s, const float *x, const float *w,
                              const float *bias, float *y, int group, ps_error *err);
ps_err cpu_conv_backward_group(backend *b, const conv_shape *s, const float *x, const float *w,
                               const float *dy, float *dx, float *dw, float *dbias, int group,
                               ps_error *err);
ps_err cpu_conv_forward(backend *b, const conv_shape *s, const float *x, const float *w,
                        const float *bias, float *y, ps_error *err);
ps_err cpu_conv_backward(backend *b, const conv_shape *s, const float *x, const float *w,
                         const float *dy, float *dx, float *dw, float *dbias, ps_error *err);

/* Pooling, batch norm and the element-wise ops (layers_cpu.c). */
ps_err cpu_maxpool_forward(backend *b, const pool_shape *s, const float *x, float *y,
                           ps_error *err);
ps_err cpu_maxpool_backward(backend *b, const pool_shape *s, const float *x, const float *y,
                            const float *dy, float *dx, ps_error *err);
ps_err cpu_avgpool_forward(backend *b, int n, int c, int hw, const float *x, float *y,
                           ps_error *err);
ps_err cpu_avgpool_backward(backend *b, int n, int c, int hw, const float *dy, float *dx,
                            ps_error *err);
ps_err cpu_bn_forward_train(backend *b, const bn_shape *s, const float *x, const float *gamma,
                            const float *beta, float *y, float *save_mean, float *save_invstd,
                            float *running_mean, float *running_var, float momentum,
                            ps_error *err);
ps_err cpu_bn_forward_infer(backend *b, const bn_shape *s, const float *x, const float *gamma,
                            const float *beta, const float *mean, const float *var, float *y,
                            ps_error *err);
ps_err cpu_bn_backward(backend *b, const bn_shape *s, const float *x, const float *dy,
                       const float *gamma, const float *save_mean, const float *save_invstd,
                       float *dx, float *dgamma, float *dbeta, int accumulate, ps_error *err);
ps_err cpu_relu_forward(backend *b, float *y, const float *x, size_t n, ps_error *err);
ps_err cpu_relu_backward(backend *b, float *dx, const float *dy, const float *y, size_t n,
                         ps_error *err);
ps_err cpu_add(backend *b, float *y, const float *a, const float *x, float scale, size_t n,
               ps_error *err);
ps_err cpu_layer_copy(backend *b, float *dst, const float *src, size_t n, ps_error *err);

#endif
