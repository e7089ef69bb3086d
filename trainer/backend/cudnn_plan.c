/* The cuDNN descriptors' numbers for the layer shapes, and the per-shape
 * algorithm cache (cudnn_plan.h). Plain C: the CPU tests run all of it. */
#include "trainer/backend/cudnn_plan.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

cudnn_tensor4 cudnn_tensor_nchw(int n, int c, int h, int w) {
  cudnn_tensor4 t = {.n = n, .c = c, .h = h, .w = w, .stride_w = 1, .stride_h = w,
                     .stride_c = h * w, .stride_n = c * h * w};
  return t;
}

int cudnn_conv_out_dim(int in, int filter, int pad, int stride, int dilation) {
  if (in < 1 || filter < 1 || pad < 0 || stride < 1 || dilation < 1) return 0;
  long span = (long)in + 2L * pad - ((long)(filter - 1) * dilation + 1);
  return span < 0 ? 0 : (int)(span / stride + 1);
}

/* n c h w elements fit cuDNN's int strides. */
static int fits_int(int n, int c, int h, int w) {
  return (long long)n * c * h * w < (long long)INT_MAX;
}

ps_err cudnn_conv_plan_make(const conv_shape *s, cudnn_conv_plan *p, ps_error *err) {
  if (s->n < 1 || s->c < 1 || s->h < 1 || s->w < 1 || s->k < 1 || s->kh < 1 || s->kw < 1 ||
      s->stride < 1 || s->pad < 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "conv shape x (%d, %d, %d, %d), w (%d, %d, %d, %d), stride %d, pad %d: "
                        "dimensions and stride must be positive, pad not negative",
                        s->n, s->c, s->h, s->w, s->k, s->c, s->kh, s->kw, s->stride, s->pad);
  }
  int oh = cudnn_conv_out_dim(s->h, s->kh, s->pad, s->stride, 1);
  int ow = cudnn_conv_out_dim(s->w, s->kw, s->pad, s->stride, 1);
  if (oh != s->oh || ow != s->ow || oh < 1 || ow < 1) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "conv shape x (%d, %d, %d, %d), kernel %dx%d, stride %d, pad %d: the "
                        "output is %dx%d (as cuDNN computes it), the shape says %dx%d",
                        s->n, s->c, s->h, s->w, s->kh, s->kw, s->stride, s->pad, oh, ow, s->oh,
                        s->ow);
  }
  if (!fits_int(s->n, s->c, s->h, s->w) || !fits_int(s->n, s->k, oh, ow) ||
      !fits_int(s->k, s->c, s->kh, s->kw)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "conv shape x (%d, %d, %d, %d) to y (%d, %d, %d, %d): a tensor has 2^31 "
                        "elements or more (cuDNN's strides are ints)",
                        s->n, s->c, s->h, s->w, s->n, s->k, oh, ow);
  }
  p->x = cudnn_tensor_nchw(s->n, s->c, s->h, s->w);
  p->y = cudnn_tensor_nchw(s->n, s->k, oh, ow);
  p->bias = cudnn_tensor_nchw(1, s->k, 1, 1);
  p->w = (cudnn_filter4){.k = s->k, .c = s->c, .h = s->kh, .w = s->kw};
  p->pad_h = p->pad_w = s->pad;
  p->stride_h = p->stride_w = s->stride;
  p->dilation_h = p->dilation_w = 1;
  return PS_ERR_OK;
}

ps_err cudnn_pool_plan_make(const pool_shape *s, cudnn_pool_plan *p, ps_error *err) {
  if (s->n < 1 || s->c < 1 || s->h < 1 || s->w < 1 || s->kh < 1 || s->kw < 1 || s->stride < 1 ||
      s->pad < 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "pool shape x (%d, %d, %d, %d), window %dx%d, stride %d, pad %d: "
                        "dimensions and stride must be positive, pad not negative",
                        s->n, s->c, s->h, s->w, s->kh, s->kw, s->stride, s->pad);
  }
  if (s->pad >= s->kh || s->pad >= s->kw) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "pool shape: padding %d is not smaller than the window %dx%d (a window "
                        "of padding alone has no max; cuDNN refuses it)",
                        s->pad, s->kh, s->kw);
  }
  int oh = cudnn_conv_out_dim(s->h, s->kh, s->pad, s->stride, 1);
  int ow = cudnn_conv_out_dim(s->w, s->kw, s->pad, s->stride, 1);
  if (oh != s->oh || ow != s->ow || oh < 1 || ow < 1) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "pool shape x (%d, %d, %d, %d), window %dx%d, stride %d, pad %d: the "
                        "output is %dx%d (as cuDNN computes it), the shape says %dx%d",
                        s->n, s->c, s->h, s->w, s->kh, s->kw, s->stride, s->pad, oh, ow, s->oh,
                        s->ow);
  }
  if (!fits_int(s->n, s->c, s->h, s->w)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "pool shape x (%d, %d, %d, %d): 2^31 elements or more (cuDNN's strides "
                        "are ints)",
                        s->n, s->c, s->h, s->w);
  }
  p->x = cudnn_tensor_nchw(s->n, s->c, s->h, s->w);
  p->y = cudnn_tensor_nchw(s->n, s->c, oh, ow);
  p->window_h = s->kh;
  p->window_w = s->kw;
  p->pad_h = p->pad_w = s->pad;
  p->stride_h = p->stride_w = s->stride;
  return PS_ERR_OK;
}

ps_err cudnn_bn_plan_make(const bn_shape *s, cudnn_bn_plan *p, ps_error *err) {
  if (s->n < 1 || s->c < 1 || s->hw < 1 || !fits_int(s->n, s->c, s->hw, 1)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "batch norm shape (%d, %d, %d): dimensions must be positive and the "
                        "tensor under 2^31 elements",
                        s->n, s->c, s->hw);
  }
  if (!isfinite(s->eps) || s->eps < 0.0f) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "batch norm eps %g: must be finite and not negative", (double)s->eps);
  }
  p->x = cudnn_tensor_nchw(s->n, s->c, s->hw, 1);
  p->param = cudnn_tensor_nchw(1, s->c, 1, 1);
  p->eps = s->eps;
  return PS_ERR_OK;
}

int cudnn_pick_algo(const cudnn_algo_candidate *c, int count, size_t max_workspace) {
  for (int i = 0; i < count; i++) {
    if (c[i].ok && !c[i].tensor_ops && c[i].workspace <= max_workspace) return i;
  }
  return -1;
}

size_t cudnn_conv_algos_workspace(const cudnn_conv_algos *a) {
  size_t m = a->fwd_workspace;
  if (a->bwd_data_workspace > m) m = a->bwd_data_workspace;
  if (a->bwd_filter_workspace > m) m = a->bwd_filter_workspace;
  return m;
}

int conv_shape_equal(const conv_shape *a, const conv_shape *b) {
  return a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w && a->k == b->k &&
         a->kh == b->kh && a->kw == b->kw && a->stride == b->stride && a->pad == b->pad &&
         a->oh == b->oh && a->ow == b->ow;
}

static cudnn_algo_cache_entry *find_entry(cudnn_algo_cache *cache, const conv_shape *s) {
  for (int i = 0; i < cache->count; i++) {
    if (conv_shape_equal(&cache->entries[i].shape, s)) return &cache->entries[i];
  }
  return NULL;
}

const cudnn_conv_algos *cudnn_algo_cache_find(cudnn_algo_cache *cache, const conv_shape *s) {
  cudnn_algo_cache_entry *e = find_entry(cache, s);
  if (e == NULL) {
    cache->misses++;
    return NULL;
  }
  cache->hits++;
  return &e->algos;
}

const cudnn_conv_algos *cudnn_algo_cache_put(cudnn_algo_cache *cache, const conv_shape *s,
                                             const cudnn_conv_algos *algos, ps_error *err) {
  cudnn_algo_cache_entry *e = find_entry(cache, s);
  if (e == NULL) {
    if (cache->count == cache->capacity) {
      int cap = cache->capacity > 0 ? 2 * cache->capacity : 8;
      cudnn_algo_cache_entry *grown = realloc(cache->entries, (size_t)cap * sizeof *grown);
      if (grown == NULL) {
        ps_error_set(err, PS_ERR_NO_MEMORY, "cuDNN algorithm cache: out of memory at %d shapes",
                     cache->count);
        return NULL;
      }
      cache->entries = grown;
      cache->capacity = cap;
    }
    e = &cache->entries[cache->count++];
    e->shape = *s;
  }
  e->algos = *algos;
  return &e->algos;
}

void cudnn_algo_cache_free(cudnn_algo_cache *cache) {
  free(cache->entries);
  cache->entries = NULL;
  cache->count = cache->capacity = 0;
}
