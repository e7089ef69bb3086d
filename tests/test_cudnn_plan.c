/* The numbers the CUDA backend hands cuDNN's descriptors (cudnn_plan.h),
 * checked on the CPU: tensor dims and NCHW strides, filter dims, convolution
 * and pooling parameters and the output dims cuDNN computes for LeNet's and
 * ResNet's layers; refusal of shapes whose oh, ow cuDNN would not produce;
 * the algorithm pick; the per-shape algorithm cache's hits, misses and growth. */
#include <limits.h>
#include <math.h>

#include "tests/check.h"
#include "trainer/backend/cudnn_plan.h"

static conv_shape conv(int n, int c, int h, int w, int k, int kh, int stride, int pad) {
  conv_shape s = {.n = n, .c = c, .h = h, .w = w, .k = k, .kh = kh, .kw = kh, .stride = stride,
                  .pad = pad};
  s.oh = conv_out_size(h, kh, stride, pad);
  s.ow = conv_out_size(w, kh, stride, pad);
  return s;
}

static void check_packed(const cudnn_tensor4 *t, int n, int c, int h, int w) {
  CHECK_EQ_INT(t->n, n);
  CHECK_EQ_INT(t->c, c);
  CHECK_EQ_INT(t->h, h);
  CHECK_EQ_INT(t->w, w);
  CHECK_EQ_INT(t->stride_w, 1);
  CHECK_EQ_INT(t->stride_h, w);
  CHECK_EQ_INT(t->stride_c, h * w);
  CHECK_EQ_INT(t->stride_n, c * h * w);
}

/* A conv shape's plan: x, y, bias, filter and the convolution's parameters. */
static void check_conv(conv_shape s, int oh, int ow) {
  cudnn_conv_plan p;
  ps_error err;
  CHECK_EQ_INT(s.oh, oh);
  CHECK_EQ_INT(s.ow, ow);
  REQUIRE(cudnn_conv_plan_make(&s, &p, &err) == PS_ERR_OK);
  check_packed(&p.x, s.n, s.c, s.h, s.w);
  check_packed(&p.y, s.n, s.k, oh, ow);
  check_packed(&p.bias, 1, s.k, 1, 1);
  CHECK_EQ_INT(p.w.k, s.k);
  CHECK_EQ_INT(p.w.c, s.c);
  CHECK_EQ_INT(p.w.h, s.kh);
  CHECK_EQ_INT(p.w.w, s.kw);
  CHECK_EQ_INT(p.pad_h, s.pad);
  CHECK_EQ_INT(p.pad_w, s.pad);
  CHECK_EQ_INT(p.stride_h, s.stride);
  CHECK_EQ_INT(p.stride_w, s.stride);
  CHECK_EQ_INT(p.dilation_h, 1);
  CHECK_EQ_INT(p.dilation_w, 1);
}

static void test_conv_plans(void) {
  /* LeNet: 5x5 convs, "same" then "valid". */
  check_conv(conv(64, 1, 28, 28, 6, 5, 1, 2), 28, 28);
  check_conv(conv(64, 6, 14, 14, 16, 5, 1, 0), 10, 10);
  /* ResNet on CIFAR: 3x3 stride 1 and 2, 1x1 stride 2 shortcut, 7x7 stride 2 stem. */
  check_conv(conv(128, 16, 32, 32, 16, 3, 1, 1), 32, 32);
  check_conv(conv(128, 16, 32, 32, 32, 3, 2, 1), 16, 16);
  check_conv(conv(128, 16, 32, 32, 32, 1, 2, 0), 16, 16);
  check_conv(conv(128, 32, 16, 16, 64, 3, 2, 1), 8, 8);
  check_conv(conv(8, 3, 224, 224, 64, 7, 2, 3), 112, 112);
  /* Odd sizes: stride 2 drops the last row and column. */
  check_conv(conv(2, 3, 7, 9, 4, 3, 2, 0), 3, 4);
  /* A non-square kernel. */
  conv_shape r = conv(2, 3, 10, 12, 5, 3, 1, 1);
  r.kw = 5;
  r.ow = conv_out_size(12, 5, 1, 1);
  check_conv(r, 10, 10);

  /* cuDNN's output formula, dilation included. */
  CHECK_EQ_INT(cudnn_conv_out_dim(32, 3, 1, 1, 1), 32);
  CHECK_EQ_INT(cudnn_conv_out_dim(32, 3, 1, 2, 1), 16);
  CHECK_EQ_INT(cudnn_conv_out_dim(32, 3, 2, 1, 2), 32);
  CHECK_EQ_INT(cudnn_conv_out_dim(4, 5, 0, 1, 1), 0);
  CHECK_EQ_INT(cudnn_conv_out_dim(4, 3, 0, 0, 1), 0);
  for (int in = 1; in < 40; in++) {
    for (int k = 1; k <= 7; k++) {
      for (int st = 1; st <= 3; st++) {
        for (int pad = 0; pad <= 3; pad++) {
          CHECK_EQ_INT(cudnn_conv_out_dim(in, k, pad, st, 1), conv_out_size(in, k, st, pad));
        }
      }
    }
  }
}

static void test_conv_refusals(void) {
  cudnn_conv_plan p;
  ps_error err;
  conv_shape s = conv(4, 3, 32, 32, 8, 3, 1, 1);
  s.oh = 31; /* the shape's author forgot the padding */
  CHECK_EQ_INT(cudnn_conv_plan_make(&s, &p, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(err.msg, "32x32") != NULL && strstr(err.msg, "31x32") != NULL);
  s = conv(4, 3, 32, 32, 8, 3, 2, 1);
  s.ow = 17;
  CHECK_EQ_INT(cudnn_conv_plan_make(&s, &p, &err), PS_ERR_INVALID_ARGUMENT);
  s = conv(4, 3, 2, 2, 8, 5, 1, 0); /* the kernel is larger than the padded input */
  CHECK_EQ_INT(cudnn_conv_plan_make(&s, &p, &err), PS_ERR_INVALID_ARGUMENT);
  s = conv(0, 3, 32, 32, 8, 3, 1, 1);
  CHECK_EQ_INT(cudnn_conv_plan_make(&s, &p, &err), PS_ERR_INVALID_ARGUMENT);
  s = conv(4, 3, 32, 32, 8, 3, 1, 1);
  s.stride = 0;
  CHECK_EQ_INT(cudnn_conv_plan_make(&s, &p, &err), PS_ERR_INVALID_ARGUMENT);
  s = conv(4, 3, 32, 32, 8, 3, 1, 1);
  s.pad = -1;
  CHECK_EQ_INT(cudnn_conv_plan_make(&s, &p, &err), PS_ERR_INVALID_ARGUMENT);
  /* 2^31 elements: cuDNN's int strides cannot hold it. */
  s = conv(65536, 512, 8, 8, 8, 1, 1, 0);
  CHECK_EQ_INT(cudnn_conv_plan_make(&s, &p, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(err.msg, "2^31") != NULL);
}

static void test_pool_plans(void) {
  cudnn_pool_plan p;
  ps_error err;
  /* LeNet's and ResNet's 2x2 stride 2 max pools, and the 3x3 stride 2 pad 1 of an ImageNet stem. */
  pool_shape s = {.n = 64, .c = 6, .h = 28, .w = 28, .kh = 2, .kw = 2, .stride = 2, .pad = 0,
                  .oh = 14, .ow = 14};
  REQUIRE(cudnn_pool_plan_make(&s, &p, &err) == PS_ERR_OK);
  check_packed(&p.x, 64, 6, 28, 28);
  check_packed(&p.y, 64, 6, 14, 14);
  CHECK_EQ_INT(p.window_h, 2);
  CHECK_EQ_INT(p.window_w, 2);
  CHECK_EQ_INT(p.stride_h, 2);
  CHECK_EQ_INT(p.stride_w, 2);
  CHECK_EQ_INT(p.pad_h, 0);
  CHECK_EQ_INT(p.pad_w, 0);
  s = (pool_shape){.n = 2, .c = 16, .h = 10, .w = 10, .kh = 2, .kw = 2, .stride = 2, .oh = 5,
                   .ow = 5};
  REQUIRE(cudnn_pool_plan_make(&s, &p, &err) == PS_ERR_OK);
  check_packed(&p.y, 2, 16, 5, 5);
  s = (pool_shape){.n = 2, .c = 64, .h = 112, .w = 112, .kh = 3, .kw = 3, .stride = 2, .pad = 1,
                   .oh = 56, .ow = 56};
  REQUIRE(cudnn_pool_plan_make(&s, &p, &err) == PS_ERR_OK);
  CHECK_EQ_INT(p.pad_h, 1);
  check_packed(&p.y, 2, 64, 56, 56);
  /* Odd input: the last row and column fall out of the 2x2 windows. */
  s = (pool_shape){.n = 1, .c = 1, .h = 7, .w = 5, .kh = 2, .kw = 2, .stride = 2, .oh = 3, .ow = 2};
  REQUIRE(cudnn_pool_plan_make(&s, &p, &err) == PS_ERR_OK);
  /* Refusals: wrong output dims, padding as large as the window, zero sizes. */
  s.oh = 4;
  CHECK_EQ_INT(cudnn_pool_plan_make(&s, &p, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(err.msg, "3x2") != NULL);
  s = (pool_shape){.n = 1, .c = 1, .h = 8, .w = 8, .kh = 2, .kw = 2, .stride = 2, .pad = 2,
                   .oh = 6, .ow = 6};
  CHECK_EQ_INT(cudnn_pool_plan_make(&s, &p, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(err.msg, "padding") != NULL);
  s = (pool_shape){.n = 1, .c = 0, .h = 8, .w = 8, .kh = 2, .kw = 2, .stride = 2, .oh = 4, .ow = 4};
  CHECK_EQ_INT(cudnn_pool_plan_make(&s, &p, &err), PS_ERR_INVALID_ARGUMENT);
}

static void test_bn_plans(void) {
  cudnn_bn_plan p;
  ps_error err;
  bn_shape s = {.n = 128, .c = 16, .hw = 32 * 32, .eps = 1e-5f};
  REQUIRE(cudnn_bn_plan_make(&s, &p, &err) == PS_ERR_OK);
  check_packed(&p.x, 128, 16, 1024, 1);
  check_packed(&p.param, 1, 16, 1, 1);
  CHECK(p.eps == (double)1e-5f);
  s.eps = -1e-5f;
  CHECK_EQ_INT(cudnn_bn_plan_make(&s, &p, &err), PS_ERR_INVALID_ARGUMENT);
  s.eps = NAN;
  CHECK_EQ_INT(cudnn_bn_plan_make(&s, &p, &err), PS_ERR_INVALID_ARGUMENT);
  s = (bn_shape){.n = 4, .c = 0, .hw = 1, .eps = 1e-5f};
  CHECK_EQ_INT(cudnn_bn_plan_make(&s, &p, &err), PS_ERR_INVALID_ARGUMENT);
}

static void test_pick(void) {
  cudnn_algo_candidate c[] = {
      {.algo = 6, .ok = 0, .workspace = 0},          /* not supported for the shape */
      {.algo = 1, .ok = 1, .tensor_ops = 1},         /* TF32: breaks parity */
      {.algo = 7, .ok = 1, .workspace = 1 << 30},    /* too much workspace */
      {.algo = 2, .ok = 1, .workspace = 4096},
      {.algo = 0, .ok = 1, .workspace = 0},
  };
  CHECK_EQ_INT(cudnn_pick_algo(c, 5, (size_t)256 << 20), 3);
  CHECK_EQ_INT(cudnn_pick_algo(c, 5, (size_t)2 << 30), 2);
  CHECK_EQ_INT(cudnn_pick_algo(c, 5, 0), 4);
  CHECK_EQ_INT(cudnn_pick_algo(c, 2, (size_t)2 << 30), -1);
  CHECK_EQ_INT(cudnn_pick_algo(c, 0, 0), -1);
}

static void test_cache(void) {
  cudnn_algo_cache cache = {0};
  ps_error err;
  conv_shape a = conv(64, 1, 28, 28, 6, 5, 1, 2);
  CHECK(cudnn_algo_cache_find(&cache, &a) == NULL);
  CHECK_EQ_INT(cache.misses, 1);
  cudnn_conv_algos al = {.fwd = 1, .bwd_data = 2, .bwd_filter = 3, .fwd_workspace = 100,
                         .bwd_data_workspace = 300, .bwd_filter_workspace = 200};
  CHECK_EQ_INT(cudnn_conv_algos_workspace(&al), 300);
  REQUIRE(cudnn_algo_cache_put(&cache, &a, &al, &err) != NULL);
  const cudnn_conv_algos *got = cudnn_algo_cache_find(&cache, &a);
  REQUIRE(got != NULL);
  CHECK_EQ_INT(cache.hits, 1);
  CHECK_EQ_INT(got->fwd, 1);
  CHECK_EQ_INT(got->bwd_data, 2);
  CHECK_EQ_INT(got->bwd_filter, 3);
  CHECK_EQ_INT(got->bwd_data_workspace, 300);
  /* Every field is part of the key: a different batch, channel count, stride
   * or output size is another shape. */
  conv_shape b = a;
  b.n = 32;
  CHECK(cudnn_algo_cache_find(&cache, &b) == NULL);
  b = a;
  b.k = 8;
  CHECK(cudnn_algo_cache_find(&cache, &b) == NULL);
  b = a;
  b.kw = 3;
  CHECK(cudnn_algo_cache_find(&cache, &b) == NULL);
  b = a;
  b.oh = 27;
  CHECK(cudnn_algo_cache_find(&cache, &b) == NULL);
  CHECK_EQ_INT(cache.misses, 5);
  CHECK_EQ_INT(cache.hits, 1);
  /* Growth past the first allocation keeps every entry. */
  for (int i = 0; i < 40; i++) {
    conv_shape s = conv(1 + i, 3, 32, 32, 16, 3, 1, 1);
    cudnn_conv_algos v = {.fwd = i, .bwd_data = i + 1, .bwd_filter = i + 2,
                          .fwd_workspace = (size_t)i * 10};
    REQUIRE(cudnn_algo_cache_put(&cache, &s, &v, &err) != NULL);
  }
  CHECK_EQ_INT(cache.count, 41);
  CHECK(cache.capacity >= 41);
  for (int i = 0; i < 40; i++) {
    conv_shape s = conv(1 + i, 3, 32, 32, 16, 3, 1, 1);
    const cudnn_conv_algos *v = cudnn_algo_cache_find(&cache, &s);
    REQUIRE(v != NULL);
    CHECK_EQ_INT(v->fwd, i);
    CHECK_EQ_INT(v->bwd_filter, i + 2);
    CHECK_EQ_INT(v->fwd_workspace, (size_t)i * 10);
  }
  CHECK_EQ_INT(cache.hits, 41);
  got = cudnn_algo_cache_find(&cache, &a);
  REQUIRE(got != NULL);
  CHECK_EQ_INT(got->fwd, 1);
  /* A second put of a shape replaces its entry. */
  al.fwd = 5;
  REQUIRE(cudnn_algo_cache_put(&cache, &a, &al, &err) != NULL);
  CHECK_EQ_INT(cache.count, 41);
  CHECK_EQ_INT(cudnn_algo_cache_find(&cache, &a)->fwd, 5);
  cudnn_algo_cache_free(&cache);
  CHECK_EQ_INT(cache.count, 0);
  CHECK(cudnn_algo_cache_find(&cache, &a) == NULL);
}

int main(void) {
  test_conv_plans();
  test_conv_refusals();
  test_pool_plans();
  test_bn_plans();
  test_pick();
  test_cache();
  return check_report("test_cudnn_plan");
}
