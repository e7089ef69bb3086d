/* The shapes of the convolutional layers' backend ops (backend.h): every
 * tensor is float32 NCHW, contiguous. Plain structs so the CPU tests and the
 * cuDNN descriptors read the same numbers. */
#ifndef PSTRAIN_TRAINER_BACKEND_LAYER_SHAPES_H
#define PSTRAIN_TRAINER_BACKEND_LAYER_SHAPES_H

/* x (n, c, h, w) convolved with weights (k, c, kh, kw), the same stride and
 * zero padding in both directions, gives y (n, k, oh, ow). */
typedef struct conv_shape {
  int n, c, h, w;
  int k, kh, kw;
  int stride, pad;
  int oh, ow; /* (h + 2 pad - kh) / stride + 1, likewise ow */
} conv_shape;

/* Max pooling of kh x kw windows (stride, padding that is never the max)
 * over x (n, c, h, w) gives y (n, c, oh, ow). */
typedef struct pool_shape {
  int n, c, h, w;
  int kh, kw;
  int stride, pad;
  int oh, ow;
} pool_shape;

/* Batch normalization of x (n, c, hw) per channel over n and hw. */
typedef struct bn_shape {
  int n, c, hw;
  float eps;
} bn_shape;

/* Output sizes; 0 when the window does not fit. */
static inline int conv_out_size(int in, int kernel, int stride, int pad) {
  int span = in + 2 * pad - kernel;
  return span < 0 || stride < 1 ? 0 : span / stride + 1;
}

#endif
