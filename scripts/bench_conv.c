/* Times forward + backward of LeNet's and ResNet's convolution and pooling
 * layers (batch 64) for the plain reference (layers_ref.c) and the CPU
 * backend's fast paths: im2col + SGEMM over groups of images, and the ops
 * table's choice (oneDNN where the build has it), printing ms per call and
 * GFLOP/s. The group size and the oneDNN rule were picked by these numbers.
 *   bench_conv [--threads N] [--iters N] [--ref-iters N (0: skip)]
 *              [--paths all|im2col|ops]  */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rng.h"
#include "trainer/backend/backend.h"
#include "trainer/backend/layers_cpu.h"
#include "trainer/backend/layers_ref.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float *random_floats(size_t n, rng *r) {
  float *p = malloc((n > 0 ? n : 1) * sizeof *p);
  if (p == NULL) {
    fprintf(stderr, "bench_conv: out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < n; i++) p[i] = (float)(rng_next(r) >> 40) / 16777216.0f - 0.5f;
  return p;
}

typedef struct conv_bufs {
  float *x, *w, *bias, *y, *dy, *dx, *dw, *dbias;
} conv_bufs;

/* The ops table's choice (oneDNN where built and picked) in the group slot. */
#define OPS_PATH 1000

/* group < 0: the reference; OPS_PATH: backend.h's ops; else im2col + SGEMM
 * with that group (0: its default). */
static double time_conv(backend *be, const conv_shape *s, conv_bufs *t, int group, int iters) {
  ps_error err;
  double best = 1e30;
  for (int it = 0; it < iters + (group >= 0); it++) { /* the fast path: one warm-up */
    double t0 = now_s();
    if (group < 0) {
      layers_ref_conv_forward(s, t->x, t->w, t->bias, t->y);
      layers_ref_conv_backward(s, t->x, t->w, t->dy, t->dx, t->dw, t->dbias);
    } else if (group == OPS_PATH) {
      if (be->ops->conv_forward(be, s, t->x, t->w, t->bias, t->y, &err) != PS_ERR_OK ||
          be->ops->conv_backward(be, s, t->x, t->w, t->dy, t->dx, t->dw, t->dbias, &err) !=
              PS_ERR_OK) {
        fprintf(stderr, "bench_conv: %s\n", err.msg);
        exit(1);
      }
    } else if (cpu_conv_forward_group(be, s, t->x, t->w, t->bias, t->y, group, &err) != PS_ERR_OK ||
               cpu_conv_backward_group(be, s, t->x, t->w, t->dy, t->dx, t->dw, t->dbias, group,
                                       &err) != PS_ERR_OK) {
      fprintf(stderr, "bench_conv: %s\n", err.msg);
      exit(1);
    }
    double dt = now_s() - t0;
    if (it > 0 || group < 0) best = dt < best ? dt : best;
  }
  return best;
}

/* Which conv paths run: "all", "im2col" or "ops" (one per process keeps
 * OpenBLAS's and OpenMP's spinning threads from slowing each other). */
static const char *paths = "all";

static void bench_conv(backend *be, const char *name, conv_shape s, int iters, int ref_iters) {
  s.oh = conv_out_size(s.h, s.kh, s.stride, s.pad);
  s.ow = conv_out_size(s.w, s.kw, s.stride, s.pad);
  rng r;
  rng_seed(&r, 1, 0);
  size_t nx = (size_t)s.n * s.c * s.h * s.w, nw = (size_t)s.k * s.c * s.kh * s.kw;
  size_t ny = (size_t)s.n * s.k * s.oh * s.ow;
  conv_bufs t = {random_floats(nx, &r), random_floats(nw, &r), random_floats(s.k, &r),
                 random_floats(ny, &r), random_floats(ny, &r), random_floats(nx, &r),
                 random_floats(nw, &r), random_floats(s.k, &r)};
  /* forward + data + filter gradients: three GEMMs of this size */
  double flops = 3.0 * 2.0 * (double)ny * s.c * s.kh * s.kw;
  int groups[] = {-1, 1, 4, 16, s.n, OPS_PATH};
  for (size_t g = 0; g < sizeof groups / sizeof *groups; g++) {
    if (groups[g] < 0 && ref_iters <= 0) continue;
    if (groups[g] >= 0 && strcmp(paths, "all") != 0 &&
        strcmp(paths, groups[g] == OPS_PATH ? "ops" : "im2col") != 0)
      continue;
    double sec = time_conv(be, &s, &t, groups[g], groups[g] < 0 ? ref_iters : iters);
    char label[32];
    if (groups[g] < 0) snprintf(label, sizeof label, "reference");
    else if (groups[g] == OPS_PATH)
      snprintf(label, sizeof label, "%s", conv_cpu_uses_dnnl(be, &s) ? "op: oneDNN" : "op: im2col");
    else snprintf(label, sizeof label, "fast group %d", groups[g]);
    printf("%-34s %-14s fwd+bwd %9.2f ms  %7.2f GFLOP/s\n", name, label, sec * 1e3,
           flops / sec * 1e-9);
  }
  free(t.x), free(t.w), free(t.bias), free(t.y), free(t.dy), free(t.dx), free(t.dw), free(t.dbias);
}

static void bench_pool(backend *be, const char *name, pool_shape s, int iters, int ref_iters) {
  s.oh = conv_out_size(s.h, s.kh, s.stride, s.pad);
  s.ow = conv_out_size(s.w, s.kw, s.stride, s.pad);
  rng r;
  rng_seed(&r, 2, 0);
  size_t nx = (size_t)s.n * s.c * s.h * s.w, ny = (size_t)s.n * s.c * s.oh * s.ow;
  float *x = random_floats(nx, &r), *y = random_floats(ny, &r), *dy = random_floats(ny, &r);
  float *dx = random_floats(nx, &r);
  ps_error err;
  for (int ref = 1; ref >= 0; ref--) {
    int n = ref ? ref_iters : iters;
    double best = 1e30;
    for (int it = 0; it < n; it++) {
      double t0 = now_s();
      if (ref) {
        layers_ref_maxpool_forward(&s, x, y);
        layers_ref_maxpool_backward(&s, x, y, dy, dx);
      } else if (cpu_maxpool_forward(be, &s, x, y, &err) != PS_ERR_OK ||
                 cpu_maxpool_backward(be, &s, x, y, dy, dx, &err) != PS_ERR_OK) {
        fprintf(stderr, "bench_conv: %s\n", err.msg);
        exit(1);
      }
      double dt = now_s() - t0;
      best = dt < best ? dt : best;
    }
    if (n > 0)
      printf("%-34s %-14s fwd+bwd %9.2f ms\n", name, ref ? "reference" : "fast", best * 1e3);
  }
  free(x), free(y), free(dy), free(dx);
}

int main(int argc, char **argv) {
  int threads = 0, iters = 5, ref_iters = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--threads") == 0) threads = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--iters") == 0) iters = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--ref-iters") == 0) ref_iters = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--paths") == 0) paths = argv[i + 1];
  }
  backend *be;
  ps_error err;
  if (backend_cpu_create(&be, threads, &err) != PS_ERR_OK) {
    fprintf(stderr, "bench_conv: %s\n", err.msg);
    return 1;
  }
  printf("OpenBLAS core %s, %d thread(s); best of %d (reference: %d)\nbackend: %s\n",
         openblas_get_corename(), openblas_get_num_threads(), iters, ref_iters, be->description);
  bench_conv(be, "lenet conv1 1->20 5x5 p2 28x28 n64",
             (conv_shape){64, 1, 28, 28, 20, 5, 5, 1, 2, 0, 0}, iters, ref_iters);
  bench_pool(be, "lenet pool1 2x2 s2 20x28x28 n64",
             (pool_shape){64, 20, 28, 28, 2, 2, 2, 0, 0, 0}, iters, ref_iters);
  bench_conv(be, "lenet conv2 20->20 5x5 p2 14x14",
             (conv_shape){64, 20, 14, 14, 20, 5, 5, 1, 2, 0, 0}, iters, ref_iters);
  bench_pool(be, "lenet pool2 2x2 s2 20x14x14 n64",
             (pool_shape){64, 20, 14, 14, 2, 2, 2, 0, 0, 0}, iters, ref_iters);
  bench_conv(be, "resnet20 first 3->16 3x3 p1 32x32",
             (conv_shape){64, 3, 32, 32, 16, 3, 3, 1, 1, 0, 0}, iters, ref_iters);
  bench_conv(be, "resnet20 16->16 3x3 p1 32x32 n64",
             (conv_shape){64, 16, 32, 32, 16, 3, 3, 1, 1, 0, 0}, iters, ref_iters);
  bench_conv(be, "resnet18 64->64 3x3 p1 32x32 n64",
             (conv_shape){64, 64, 32, 32, 64, 3, 3, 1, 1, 0, 0}, iters, ref_iters);
  backend_destroy(be);
  return 0;
}
