/* Convolutions through oneDNN for the CPU backend (conv_dnnl.c). In a
 * build without oneDNN, create gives NULL and the calls fail UNSUPPORTED. */
#ifndef PSTRAIN_TRAINER_BACKEND_CONV_DNNL_H
#define PSTRAIN_TRAINER_BACKEND_CONV_DNNL_H

#include "common/error.h"
#include "trainer/backend/layer_shapes.h"

/* The engine, the stream and the per-shape primitives. */
typedef struct conv_dnnl conv_dnnl;

/* threads > 0 sets oneDNN's (OpenMP) thread count for its calls. */
ps_err conv_dnnl_create(conv_dnnl **out, int threads, ps_error *err);
void conv_dnnl_destroy(conv_dnnl *d);

/* backend.h's conv_forward and conv_backward. */
ps_err conv_dnnl_forward(conv_dnnl *d, const conv_shape *s, const float *x, const float *w,
                         const float *bias, float *y, ps_error *err);
ps_err conv_dnnl_backward(conv_dnnl *d, const conv_shape *s, const float *x, const float *w,
                          const float *dy, float *dx, float *dw, float *dbias, ps_error *err);

#endif
