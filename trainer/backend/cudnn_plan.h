/* What the CUDA backend's cuDNN descriptors get for the convolutional
 * layers' shapes (layer_shapes.h), worked out in plain C so the CPU tests
 * check every number but the cuDNN calls themselves: tensor dims and NCHW
 * strides, filter dims, convolution and pooling parameters, the output dims
 * cuDNN computes (which must equal the shape's oh, ow), and a cache that
 * keeps cuDNN's algorithm choice and workspace sizes per convolution shape,
 * so the choice is made once per shape. No CUDA header here. */
#ifndef PSTRAIN_TRAINER_BACKEND_CUDNN_PLAN_H
#define PSTRAIN_TRAINER_BACKEND_CUDNN_PLAN_H

#include <stddef.h>

#include "common/error.h"
#include "trainer/backend/layer_shapes.h"

/* A 4-d float tensor: dims and strides in elements (cudnnSetTensor4dDescriptorEx). */
typedef struct cudnn_tensor4 {
  int n, c, h, w;
  int stride_n, stride_c, stride_h, stride_w;
} cudnn_tensor4;

/* A filter (cudnnSetFilter4dDescriptor, CUDNN_TENSOR_NCHW). */
typedef struct cudnn_filter4 {
  int k, c, h, w;
} cudnn_filter4;

typedef struct cudnn_conv_plan {
  cudnn_tensor4 x, y;
  cudnn_tensor4 bias; /* (1, k, 1, 1) for cudnnAddTensor / ConvolutionBackwardBias */
  cudnn_filter4 w;
  /* cudnnSetConvolution2dDescriptor, CUDNN_CROSS_CORRELATION, float. */
  int pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
} cudnn_conv_plan;

typedef struct cudnn_pool_plan {
  cudnn_tensor4 x, y;
  /* cudnnSetPooling2dDescriptor. */
  int window_h, window_w, pad_h, pad_w, stride_h, stride_w;
} cudnn_pool_plan;

typedef struct cudnn_bn_plan {
  cudnn_tensor4 x;     /* (n, c, hw, 1): x, y, dx, dy */
  cudnn_tensor4 param; /* (1, c, 1, 1): gamma, beta, means, variances (SPATIAL) */
  double eps;
} cudnn_bn_plan;

/* A packed NCHW tensor's descriptor. */
cudnn_tensor4 cudnn_tensor_nchw(int n, int c, int h, int w);

/* cuDNN's output size of a convolution (1 + (in + 2 pad - ((filter - 1)
 * dilation + 1)) / stride) and of a pooling window (dilation 1); 0 when the
 * window does not fit or an argument is out of range. */
int cudnn_conv_out_dim(int in, int filter, int pad, int stride, int dilation);

/* Fill a plan from a shape; PS_ERR_INVALID_ARGUMENT, saying which, when a
 * dimension is not positive, a tensor has INT_MAX elements or more (cuDNN's
 * strides are ints), or the output dims cuDNN would compute differ from the
 * shape's oh, ow. */
ps_err cudnn_conv_plan_make(const conv_shape *s, cudnn_conv_plan *p, ps_error *err);
/* Max pooling; the padding must be smaller than the window (cuDNN's rule). */
ps_err cudnn_pool_plan_make(const pool_shape *s, cudnn_pool_plan *p, ps_error *err);
/* Batch norm (SPATIAL): eps must be finite and >= 0 (CUDNN_BN_MIN_EPSILON). */
ps_err cudnn_bn_plan_make(const bn_shape *s, cudnn_bn_plan *p, ps_error *err);

/* Picking among the algorithms cuDNN's heuristics offer, best first
 * (cudnnGetConvolution*Algorithm_v7's perf results): the first whose status
 * is success, that uses no tensor-op math (TF32 would break the CPU parity),
 * and whose workspace fits max_workspace. Returns its index, -1 when none. */
typedef struct cudnn_algo_candidate {
  int algo;
  int ok;         /* status == CUDNN_STATUS_SUCCESS */
  int tensor_ops; /* mathType is a tensor-op math */
  size_t workspace;
} cudnn_algo_candidate;
int cudnn_pick_algo(const cudnn_algo_candidate *c, int count, size_t max_workspace);

/* The choices for one convolution shape (the cuDNN enums as ints). */
typedef struct cudnn_conv_algos {
  int fwd, bwd_data, bwd_filter;
  size_t fwd_workspace, bwd_data_workspace, bwd_filter_workspace;
} cudnn_conv_algos;

/* The largest of the three workspaces. */
size_t cudnn_conv_algos_workspace(const cudnn_conv_algos *a);

typedef struct cudnn_algo_cache_entry {
  conv_shape shape;
  cudnn_conv_algos algos;
} cudnn_algo_cache_entry;

/* Keyed by every field of conv_shape. Zero-initialise; free with
 * cudnn_algo_cache_free. A model has a handful of conv shapes: linear search. */
typedef struct cudnn_algo_cache {
  cudnn_algo_cache_entry *entries;
  int count, capacity;
  long hits, misses;
} cudnn_algo_cache;

int conv_shape_equal(const conv_shape *a, const conv_shape *b);
/* The entry for s, counting a hit, or NULL, counting a miss. */
const cudnn_conv_algos *cudnn_algo_cache_find(cudnn_algo_cache *cache, const conv_shape *s);
/* Adds (or replaces) the entry for s; returns the cached copy, NULL with err
 * set when out of memory. */
const cudnn_conv_algos *cudnn_algo_cache_put(cudnn_algo_cache *cache, const conv_shape *s,
                                             const cudnn_conv_algos *algos, ps_error *err);
void cudnn_algo_cache_free(cudnn_algo_cache *cache);

#endif
