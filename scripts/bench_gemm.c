/* The GEMM-only ceiling for scripts/bench-compute: runs exactly the GEMMs one
 * training step of an MLP issues (forward, weight gradients, input gradients
 * of all but the first layer), through the same backend and gemm mapping as
 * trainer/model/mlp.c, and prints samples/s. Nothing else: no data, no kernels. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "trainer/backend/backend.h"
#include "trainer/model/mlp.h"

static int run_step(mlp *m, int batch, ps_error *err) {
  const backend_ops *ops = m->be->ops;
  const model_desc *d = &m->desc;
  float *dy = m->grad_bufs;
  float *dx = m->grad_bufs + (size_t)m->max_batch * (size_t)m->max_width;
  for (int l = 1; l <= d->num_layers; l++) {
    int in = d->sizes[l - 1], out = d->sizes[l];
    const float *w = m->params + m->layout.tensors[2 * (l - 1)].offset;
    gemm_call c = gemm_row_major(false, true, batch, out, in, 1.0f, m->acts + m->act_offsets[l - 1],
                                 in, w, in, 0.0f, m->acts + m->act_offsets[l], out);
    if (ops->gemm(m->be, &c, err) != PS_ERR_OK) return -1;
  }
  for (int l = d->num_layers; l >= 1; l--) {
    int in = d->sizes[l - 1], out = d->sizes[l];
    const float *w = m->params + m->layout.tensors[2 * (l - 1)].offset;
    float *dw = m->grads + m->layout.tensors[2 * (l - 1)].offset;
    gemm_call c = gemm_row_major(true, false, out, in, batch, 1.0f, dy, out,
                                 m->acts + m->act_offsets[l - 1], in, 0.0f, dw, in);
    if (ops->gemm(m->be, &c, err) != PS_ERR_OK) return -1;
    if (l > 1) {
      gemm_call x = gemm_row_major(false, false, batch, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
      if (ops->gemm(m->be, &x, err) != PS_ERR_OK) return -1;
      float *t = dy;
      dy = dx;
      dx = t;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 5 && argc != 6) {
    fprintf(stderr, "usage: bench_gemm MODEL BATCH THREADS SECONDS [cpu|cuda]\n");
    return 2;
  }
  const char *device = argc == 6 ? argv[5] : "cpu";
  log_set_role("bench_gemm");
  ps_error err;
  model_desc desc;
  int batch = atoi(argv[2]), threads = atoi(argv[3]);
  double seconds = atof(argv[4]);
  if (model_parse(argv[1], &desc, &err) != PS_ERR_OK || batch < 1 || threads < 0 || seconds <= 0) {
    fprintf(stderr, "bench_gemm: bad arguments: %s\n", batch < 1 ? "batch" : err.msg);
    return 2;
  }
  backend *be;
  mlp *m;
  if (backend_open(&be, device, threads, -1, &err) != PS_ERR_OK ||
      mlp_create(&m, &desc, be, batch, 1, &err) != PS_ERR_OK) {
    fprintf(stderr, "bench_gemm: %s\n", err.msg);
    return 1;
  }
  for (int i = 0; i < 20; i++) { /* warm up caches and BLAS buffers */
    if (run_step(m, batch, &err) != 0) goto fail;
  }
  /* A download waits for queued GPU work; on the CPU it is a no-op copy. */
  float probe;
  long steps = 0;
  double start = now_s(), elapsed;
  do {
    for (int i = 0; i < 10; i++) {
      if (run_step(m, batch, &err) != 0) goto fail;
    }
    if (be->ops->download(be, &probe, m->params, sizeof probe, &err) != PS_ERR_OK) goto fail;
    steps += 10;
    elapsed = now_s() - start;
  } while (elapsed < seconds);
  printf("gemm_only_samples_per_s %.1f\nsteps %ld\nbackend %s\n", (double)steps * batch / elapsed,
         steps, be->description);
  mlp_destroy(m);
  backend_destroy(be);
  return 0;
fail:
  fprintf(stderr, "bench_gemm: %s\n", err.msg);
  return 1;
}
