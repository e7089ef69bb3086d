/* Direct convolution for stride-1 "same" layers (ResNet's 3x3 pad 1,
 * LeNet's 5x5 pad 2) on x86-64 CPUs with AVX2 and FMA: no im2col and no
 * GEMM packing, which were 37% of a ResNet-20 step (perf) at these layers'
 * 16 to 64 channels. conv_cpu.c uses it for the forward, for dx (itself
 * such a convolution, with flipped weights) and for dw. */
#ifndef PSTRAIN_TRAINER_BACKEND_CONV_DIRECT_H
#define PSTRAIN_TRAINER_BACKEND_CONV_DIRECT_H

#include <stddef.h>

#include "trainer/backend/layer_shapes.h"

/* Whether this CPU and s (its forward) take the direct path. */
int conv_direct_fits(const conv_shape *s);

/* Floats of packed weights, and of scratch for one image. */
size_t conv_direct_packed_size(const conv_shape *s);
size_t conv_direct_scratch_size(const conv_shape *s);

/* Packs w (k, c, kh, kw) for s; with `flip`, w is the weights of the
 * convolution whose dx s computes: w (c, k, kh, kw), each kernel rotated
 * by 180 degrees (s->c is that convolution's k). */
void conv_direct_pack(const conv_shape *s, const float *w, int flip, float *packed);

/* One image: y (k, oh, ow) = the convolution of x (c, h, w) with the
 * packed weights, plus bias (NULL: none). The sum over (ci, ki, kj) runs
 * in that order in fused multiply-adds, whatever the batch. */
void conv_direct_image(const conv_shape *s, const float *packed, const float *bias,
                       const float *x, float *y, float *scratch);

/* Whether dw of s takes the direct path too (conv_direct_fits, 3x3 or
 * 5x5), and dw of one image into dw (k, c, kh, kw), added to it with
 * `accumulate`; scratch as for the forward. */
int conv_direct_dw_fits(const conv_shape *s);
void conv_direct_dw_image(const conv_shape *s, const float *x, const float *dy, float *dw,
                          int accumulate, float *scratch);

#endif
