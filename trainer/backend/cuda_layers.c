/* The CUDA backend's convolution, max pooling and batch norm through cuDNN's
 * legacy (descriptor) API, which cuDNN 9 still ships in libcudnn_cnn and
 * libcudnn_ops. The numbers the descriptors get come from cudnn_plan.c, which
 * the CPU tests check; what is here is the calls. Every cuDNN and CUDA call is
 * checked: a failure names the call, file:line and the library's message. */
#include "trainer/backend/cuda_layers.h"
#include "trainer/backend/cuda_try.h"

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <stdlib.h>

#include "trainer/backend/cudnn_plan.h"

/* The most workspace one convolution algorithm may ask for. */
#define MAX_WORKSPACE ((size_t)512 << 20)

struct cuda_layers {
  cudnnHandle_t handle;
  cudnnTensorDescriptor_t x, y, bias;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  cudnnPoolingDescriptor_t pool;
  void *workspace; /* device */
  size_t workspace_bytes;
  cudnn_algo_cache algos;
};

#define CUDNN_TRY(err, expr)                                                                     \
  do {                                                                                           \
    cudnnStatus_t cudnn_rc_ = (expr);                                                            \
    if (cudnn_rc_ != CUDNN_STATUS_SUCCESS) {                                                     \
      return ps_error_set((err), PS_ERR_BACKEND, "%s:%d: %s failed: %s", __FILE__, __LINE__,     \
                          #expr, cudnnGetErrorString(cudnn_rc_));                                \
    }                                                                                            \
  } while (0)

static const float one = 1.0f, zero = 0.0f;

void cuda_layers_destroy(cuda_layers *l) {
  if (l == NULL) return;
  /* Teardown errors have no caller to go to. */
  if (l->pool != NULL) cudnnDestroyPoolingDescriptor(l->pool);
  if (l->conv != NULL) cudnnDestroyConvolutionDescriptor(l->conv);
  if (l->w != NULL) cudnnDestroyFilterDescriptor(l->w);
  if (l->bias != NULL) cudnnDestroyTensorDescriptor(l->bias);
  if (l->y != NULL) cudnnDestroyTensorDescriptor(l->y);
  if (l->x != NULL) cudnnDestroyTensorDescriptor(l->x);
  if (l->handle != NULL) cudnnDestroy(l->handle);
  cudaFree(l->workspace);
  cudnn_algo_cache_free(&l->algos);
  free(l);
}

static ps_err layers_init(cuda_layers *l, cudaStream_t stream, ps_error *err) {
  CUDNN_TRY(err, cudnnCreate(&l->handle));
  CUDNN_TRY(err, cudnnSetStream(l->handle, stream));
  CUDNN_TRY(err, cudnnCreateTensorDescriptor(&l->x));
  CUDNN_TRY(err, cudnnCreateTensorDescriptor(&l->y));
  CUDNN_TRY(err, cudnnCreateTensorDescriptor(&l->bias));
  CUDNN_TRY(err, cudnnCreateFilterDescriptor(&l->w));
  CUDNN_TRY(err, cudnnCreateConvolutionDescriptor(&l->conv));
  CUDNN_TRY(err, cudnnCreatePoolingDescriptor(&l->pool));
  return PS_ERR_OK;
}

/* The backend's cuDNN state, made on first use (a model without these layers
 * never loads cuDNN's kernels). */
static ps_err layers_of(backend *b, cuda_layers **out, ps_error *err) {
  cuda_layers **slot = cuda_backend_layers(b);
  if (*slot == NULL) {
    cuda_layers *l = calloc(1, sizeof *l);
    if (l == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "cuDNN state: out of memory");
    if (layers_init(l, (cudaStream_t)b->stream, err) != PS_ERR_OK) {
      cuda_layers_destroy(l);
      return err->code;
    }
    *slot = l;
  }
  *out = *slot;
  return PS_ERR_OK;
}

static ps_err set_tensor(cudnnTensorDescriptor_t d, const cudnn_tensor4 *t, ps_error *err) {
  CUDNN_TRY(err, cudnnSetTensor4dDescriptorEx(d, CUDNN_DATA_FLOAT, t->n, t->c, t->h, t->w,
                                              t->stride_n, t->stride_c, t->stride_h, t->stride_w));
  return PS_ERR_OK;
}

static ps_err ensure_workspace(cuda_layers *l, size_t bytes, ps_error *err) {
  if (bytes <= l->workspace_bytes) return PS_ERR_OK;
  /* cudaFree waits for the work queued on the old buffer. */
  CUDA_TRY(err, cudaFree(l->workspace));
  l->workspace = NULL;
  l->workspace_bytes = 0;
  CUDA_TRY(err, cudaMalloc(&l->workspace, bytes));
  l->workspace_bytes = bytes;
  return PS_ERR_OK;
}

/* Sets x, y, bias, w and conv for a conv shape. */
static ps_err set_conv(cuda_layers *l, const conv_shape *s, ps_error *err) {
  cudnn_conv_plan p;
  PS_TRY(cudnn_conv_plan_make(s, &p, err));
  PS_TRY(set_tensor(l->x, &p.x, err));
  PS_TRY(set_tensor(l->y, &p.y, err));
  PS_TRY(set_tensor(l->bias, &p.bias, err));
  CUDNN_TRY(err, cudnnSetFilter4dDescriptor(l->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, p.w.k,
                                            p.w.c, p.w.h, p.w.w));
  CUDNN_TRY(err, cudnnSetConvolution2dDescriptor(l->conv, p.pad_h, p.pad_w, p.stride_h,
                                                 p.stride_w, p.dilation_h, p.dilation_w,
                                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  /* FMA math: no TF32 tensor ops, so float32 results match the CPU's. */
  CUDNN_TRY(err, cudnnSetConvolutionMathType(l->conv, CUDNN_FMA_MATH));
  return PS_ERR_OK;
}

static int is_tensor_op(cudnnMathType_t m) {
  return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

static ps_err no_algo(const char *which, const conv_shape *s, ps_error *err) {
  return ps_error_set(err, PS_ERR_BACKEND,
                      "cuDNN offers no %s algorithm without tensor ops and within %zu MiB of "
                      "workspace for conv x (%d, %d, %d, %d), w (%d, %d, %d, %d), stride %d, pad %d",
                      which, MAX_WORKSPACE >> 20, s->n, s->c, s->h, s->w, s->k, s->c, s->kh, s->kw,
                      s->stride, s->pad);
}

enum { MAX_PERF = 16 };

/* cuDNN's heuristics (the _v7 queries: no benchmarking runs, no memory of
 * their own) pick the three algorithms of a shape once; the cache keeps them.
 * The descriptors must be set for s. */
static ps_err conv_algos(cuda_layers *l, const conv_shape *s, const cudnn_conv_algos **out,
                         ps_error *err) {
  *out = cudnn_algo_cache_find(&l->algos, s);
  if (*out != NULL) return PS_ERR_OK;
  cudnn_conv_algos a = {0};
  cudnn_algo_candidate cand[MAX_PERF];
  int got = 0, pick;

  cudnnConvolutionFwdAlgoPerf_t fwd[MAX_PERF];
  CUDNN_TRY(err, cudnnGetConvolutionForwardAlgorithm_v7(l->handle, l->x, l->w, l->conv, l->y,
                                                        MAX_PERF, &got, fwd));
  for (int i = 0; i < got; i++) {
    cand[i] = (cudnn_algo_candidate){.algo = (int)fwd[i].algo,
                                     .ok = fwd[i].status == CUDNN_STATUS_SUCCESS,
                                     .tensor_ops = is_tensor_op(fwd[i].mathType),
                                     .workspace = fwd[i].memory};
  }
  if ((pick = cudnn_pick_algo(cand, got, MAX_WORKSPACE)) < 0) return no_algo("forward", s, err);
  a.fwd = cand[pick].algo;
  CUDNN_TRY(err, cudnnGetConvolutionForwardWorkspaceSize(l->handle, l->x, l->w, l->conv, l->y,
                                                         (cudnnConvolutionFwdAlgo_t)a.fwd,
                                                         &a.fwd_workspace));

  cudnnConvolutionBwdDataAlgoPerf_t bd[MAX_PERF];
  CUDNN_TRY(err, cudnnGetConvolutionBackwardDataAlgorithm_v7(l->handle, l->w, l->y, l->conv,
                                                             l->x, MAX_PERF, &got, bd));
  for (int i = 0; i < got; i++) {
    cand[i] = (cudnn_algo_candidate){.algo = (int)bd[i].algo,
                                     .ok = bd[i].status == CUDNN_STATUS_SUCCESS,
                                     .tensor_ops = is_tensor_op(bd[i].mathType),
                                     .workspace = bd[i].memory};
  }
  if ((pick = cudnn_pick_algo(cand, got, MAX_WORKSPACE)) < 0) {
    return no_algo("backward data", s, err);
  }
  a.bwd_data = cand[pick].algo;
  CUDNN_TRY(err, cudnnGetConvolutionBackwardDataWorkspaceSize(
                     l->handle, l->w, l->y, l->conv, l->x,
                     (cudnnConvolutionBwdDataAlgo_t)a.bwd_data, &a.bwd_data_workspace));

  cudnnConvolutionBwdFilterAlgoPerf_t bf[MAX_PERF];
  CUDNN_TRY(err, cudnnGetConvolutionBackwardFilterAlgorithm_v7(l->handle, l->x, l->y, l->conv,
                                                               l->w, MAX_PERF, &got, bf));
  for (int i = 0; i < got; i++) {
    cand[i] = (cudnn_algo_candidate){.algo = (int)bf[i].algo,
                                     .ok = bf[i].status == CUDNN_STATUS_SUCCESS,
                                     .tensor_ops = is_tensor_op(bf[i].mathType),
                                     .workspace = bf[i].memory};
  }
  if ((pick = cudnn_pick_algo(cand, got, MAX_WORKSPACE)) < 0) {
    return no_algo("backward filter", s, err);
  }
  a.bwd_filter = cand[pick].algo;
  CUDNN_TRY(err, cudnnGetConvolutionBackwardFilterWorkspaceSize(
                     l->handle, l->x, l->y, l->conv, l->w,
                     (cudnnConvolutionBwdFilterAlgo_t)a.bwd_filter, &a.bwd_filter_workspace));

  *out = cudnn_algo_cache_put(&l->algos, s, &a, err);
  return *out != NULL ? PS_ERR_OK : err->code;
}

ps_err cuda_conv_forward(backend *b, const conv_shape *s, const float *x, const float *w,
                         const float *bias, float *y, ps_error *err) {
  cuda_layers *l = NULL;
  const cudnn_conv_algos *a = NULL;
  PS_TRY(layers_of(b, &l, err));
  PS_TRY(set_conv(l, s, err));
  PS_TRY(conv_algos(l, s, &a, err));
  PS_TRY(ensure_workspace(l, a->fwd_workspace, err));
  CUDNN_TRY(err, cudnnConvolutionForward(l->handle, &one, l->x, x, l->w, w, l->conv,
                                         (cudnnConvolutionFwdAlgo_t)a->fwd, l->workspace,
                                         a->fwd_workspace, &zero, l->y, y));
  if (bias != NULL) CUDNN_TRY(err, cudnnAddTensor(l->handle, &one, l->bias, bias, &one, l->y, y));
  return PS_ERR_OK;
}

ps_err cuda_conv_backward(backend *b, const conv_shape *s, const float *x, const float *w,
                          const float *dy, float *dx, float *dw, float *dbias, ps_error *err) {
  cuda_layers *l = NULL;
  const cudnn_conv_algos *a = NULL;
  PS_TRY(layers_of(b, &l, err));
  PS_TRY(set_conv(l, s, err));
  PS_TRY(conv_algos(l, s, &a, err));
  size_t need = a->bwd_filter_workspace;
  if (dx != NULL && a->bwd_data_workspace > need) need = a->bwd_data_workspace;
  PS_TRY(ensure_workspace(l, need, err));
  if (dbias != NULL) {
    CUDNN_TRY(err, cudnnConvolutionBackwardBias(l->handle, &one, l->y, dy, &zero, l->bias, dbias));
  }
  if (dw != NULL) {
    CUDNN_TRY(err, cudnnConvolutionBackwardFilter(
                       l->handle, &one, l->x, x, l->y, dy, l->conv,
                       (cudnnConvolutionBwdFilterAlgo_t)a->bwd_filter, l->workspace,
                       a->bwd_filter_workspace, &zero, l->w, dw));
  }
  if (dx != NULL) {
    CUDNN_TRY(err, cudnnConvolutionBackwardData(l->handle, &one, l->w, w, l->y, dy, l->conv,
                                                (cudnnConvolutionBwdDataAlgo_t)a->bwd_data,
                                                l->workspace, a->bwd_data_workspace, &zero, l->x,
                                                dx));
  }
  return PS_ERR_OK;
}

/* Sets x, y and pool for max pooling of shape s. */
static ps_err set_pool(cuda_layers *l, const pool_shape *s, ps_error *err) {
  cudnn_pool_plan p;
  PS_TRY(cudnn_pool_plan_make(s, &p, err));
  PS_TRY(set_tensor(l->x, &p.x, err));
  PS_TRY(set_tensor(l->y, &p.y, err));
  CUDNN_TRY(err, cudnnSetPooling2dDescriptor(l->pool, CUDNN_POOLING_MAX_DETERMINISTIC,
                                             CUDNN_NOT_PROPAGATE_NAN, p.window_h, p.window_w,
                                             p.pad_h, p.pad_w, p.stride_h, p.stride_w));
  return PS_ERR_OK;
}

ps_err cuda_maxpool_forward(backend *b, const pool_shape *s, const float *x, float *y,
                            ps_error *err) {
  cuda_layers *l = NULL;
  PS_TRY(layers_of(b, &l, err));
  PS_TRY(set_pool(l, s, err));
  CUDNN_TRY(err, cudnnPoolingForward(l->handle, l->pool, &one, l->x, x, &zero, l->y, y));
  return PS_ERR_OK;
}

ps_err cuda_maxpool_backward(backend *b, const pool_shape *s, const float *x, const float *y,
                             const float *dy, float *dx, ps_error *err) {
  cuda_layers *l = NULL;
  PS_TRY(layers_of(b, &l, err));
  PS_TRY(set_pool(l, s, err));
  CUDNN_TRY(err, cudnnPoolingBackward(l->handle, l->pool, &one, l->y, y, l->y, dy, l->x, x, &zero,
                                      l->x, dx));
  return PS_ERR_OK;
}

/* Sets x (n, c, hw, 1) and bias as the (1, c, 1, 1) parameter tensor. */
static ps_err set_bn(cuda_layers *l, const bn_shape *s, cudnn_bn_plan *p, ps_error *err) {
  PS_TRY(cudnn_bn_plan_make(s, p, err));
  PS_TRY(set_tensor(l->x, &p->x, err));
  PS_TRY(set_tensor(l->bias, &p->param, err));
  return PS_ERR_OK;
}

ps_err cuda_bn_forward_train(backend *b, const bn_shape *s, const float *x, const float *gamma,
                             const float *beta, float *y, float *save_mean, float *save_invstd,
                             float *running_mean, float *running_var, float momentum,
                             ps_error *err) {
  cuda_layers *l = NULL;
  cudnn_bn_plan p;
  PS_TRY(layers_of(b, &l, err));
  PS_TRY(set_bn(l, s, &p, err));
  /* No running statistics: cuDNN takes NULL for both. */
  if (running_mean == NULL) running_var = NULL;
  CUDNN_TRY(err, cudnnBatchNormalizationForwardTraining(
                     l->handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, l->x, x, l->x, y, l->bias,
                     gamma, beta, (double)momentum, running_mean, running_var, p.eps, save_mean,
                     save_invstd));
  return PS_ERR_OK;
}

ps_err cuda_bn_forward_infer(backend *b, const bn_shape *s, const float *x, const float *gamma,
                             const float *beta, const float *mean, const float *var, float *y,
                             ps_error *err) {
  cuda_layers *l = NULL;
  cudnn_bn_plan p;
  PS_TRY(layers_of(b, &l, err));
  PS_TRY(set_bn(l, s, &p, err));
  CUDNN_TRY(err, cudnnBatchNormalizationForwardInference(
                     l->handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, l->x, x, l->x, y, l->bias,
                     gamma, beta, mean, var, p.eps));
  return PS_ERR_OK;
}

ps_err cuda_bn_backward(backend *b, const bn_shape *s, const float *x, const float *dy,
                        const float *gamma, const float *save_mean, const float *save_invstd,
                        float *dx, float *dgamma, float *dbeta, int accumulate, ps_error *err) {
  cuda_layers *l = NULL;
  cudnn_bn_plan p;
  PS_TRY(layers_of(b, &l, err));
  PS_TRY(set_bn(l, s, &p, err));
  const float *param_beta = accumulate ? &one : &zero;
  CUDNN_TRY(err, cudnnBatchNormalizationBackward(
                     l->handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, param_beta, l->x, x,
                     l->x, dy, l->x, dx, l->bias, gamma, dgamma, dbeta, p.eps, save_mean,
                     save_invstd));
  return PS_ERR_OK;
}
