/* The CTR model's compute alone, the ceiling for the local trainer: one step
 * is the model's forward + backward + the dense optimizer (Adam) on a batch of
 * random examples whose slots point at random rows (no tables, no reader, no
 * row optimizer). Also runs the MLP's part of the same step alone (input
 * upload, GEMMs and kernels, logits download, backward from dlogits with the
 * input gradient, optimizer), so the rest (gathers, scatters, wide part, loss)
 * is the difference. Prints examples/s of both and that share. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "common/fp_env.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rng.h"
#include "trainer/backend/backend.h"
#include "trainer/model/ctr_core.h"

#define ROUNDS 5
#define UNIQUE_PER_EXAMPLE 12 /* about 6k distinct keys in a Criteo batch of 512 */

typedef struct bench {
  model *m;
  model_batch b;
  float *row_grads[MODEL_TABLES_MAX];
  optimizer_config opt;
  long step;
} bench;

static int full_step(bench *s, ps_error *err) {
  model_outputs out = {0};
  if (model_forward(s->m, &s->b, 1, &out, err) != PS_ERR_OK ||
      model_backward(s->m, &s->b, s->row_grads, err) != PS_ERR_OK ||
      model_apply_optimizer(s->m, &s->opt, s->step++, err) != PS_ERR_OK) {
    return -1;
  }
  return 0;
}

/* What full_step does on the MLP, without the host work around it. */
static int mlp_step(bench *s, ps_error *err) {
  ctr_core *c = (ctr_core *)s->m;
  mlp *d = c->deep;
  int n = s->b.size;
  if (mlp_load_inputs(d, n, err) != PS_ERR_OK || mlp_forward_logits(d, n, err) != PS_ERR_OK ||
      mlp_get_logits(d, n, c->logits, err) != PS_ERR_OK ||
      mlp_backward_from(d, n, c->dlogits, c->dinputs, err) != PS_ERR_OK ||
      mlp_apply_optimizer(d, &s->opt, s->step++, err) != PS_ERR_OK) {
    return -1;
  }
  return 0;
}

/* Examples per second of `step` over at least `seconds`, after a warm-up. */
static double measure(bench *s, int (*step)(bench *, ps_error *), double seconds, ps_error *err) {
  for (int i = 0; i < 10; i++) {
    if (step(s, err) != 0) return -1;
  }
  long steps = 0;
  double start = now_s(), elapsed;
  do {
    for (int i = 0; i < 10; i++) {
      if (step(s, err) != 0) return -1;
    }
    steps += 10;
    elapsed = now_s() - start;
  } while (elapsed < seconds);
  return (double)steps * s->b.size / elapsed;
}

int main(int argc, char **argv) {
  fp_env_flush_denormals(); /* as the trainer and pserver run (common/fp_env.h) */
  if (argc < 5 || argc > 6) {
    fprintf(stderr, "usage: bench_ctr_model MODEL BATCH THREADS SECONDS (in all) [cpu|cuda]\n"
                    "  e.g. bench_ctr_model ctr:16:256,128 512 1 5\n");
    return 2;
  }
  log_set_role("bench_ctr_model");
  ps_error err;
  model_desc desc;
  int batch = atoi(argv[2]), threads = atoi(argv[3]);
  double seconds = atof(argv[4]);
  if (model_parse(argv[1], &desc, &err) != PS_ERR_OK || desc.kind != MODEL_CTR || batch < 1 ||
      threads < 0 || seconds <= 0) {
    fprintf(stderr, "bench_ctr_model: bad arguments (a ctr:DIM:H1,... model, batch >= 1)\n");
    return 2;
  }
  backend *be;
  bench s = {.opt = {.kind = OPTIMIZER_ADAM, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999,
                     .epsilon = 1e-8, .schedule = LR_CONSTANT}};
  if (backend_open(&be, argc == 6 ? argv[5] : "cpu", threads, -1, &err) != PS_ERR_OK ||
      model_create(&s.m, &desc, be, batch, 1, &err) != PS_ERR_OK) {
    fprintf(stderr, "bench_ctr_model: %s\n", err.msg);
    return 1;
  }
  size_t unique = (size_t)batch * UNIQUE_PER_EXAMPLE, dim = (size_t)desc.embed_dim;
  ctr_example *ex = calloc((size_t)batch, sizeof *ex);
  uint32_t *slot = malloc((size_t)batch * CRITEO_CAT_FIELDS * sizeof *slot);
  float *wide = malloc(unique * sizeof *wide), *deep = malloc(unique * dim * sizeof *deep);
  s.row_grads[CTR_TABLE_WIDE] = malloc(unique * sizeof(float));
  s.row_grads[CTR_TABLE_EMBEDDING] = malloc(unique * dim * sizeof(float));
  if (!ex || !slot || !wide || !deep || !s.row_grads[0] || !s.row_grads[1]) {
    fprintf(stderr, "bench_ctr_model: out of memory for the batch\n");
    return 1;
  }
  rng r;
  rng_seed(&r, 7, 0);
  for (int i = 0; i < batch; i++) {
    ex[i].label = (float)(rng_next(&r) % 4 == 0);
    for (int j = 0; j < CRITEO_INT_FIELDS; j++) ex[i].dense[j] = (float)(rng_next(&r) % 8) * 0.5f;
  }
  for (int i = 0; i < batch * CRITEO_CAT_FIELDS; i++) slot[i] = (uint32_t)(rng_next(&r) % unique);
  for (size_t i = 0; i < unique; i++) wide[i] = 0.01f * (float)(rng_next(&r) % 11) - 0.05f;
  for (size_t i = 0; i < unique * dim; i++) deep[i] = 0.01f * (float)(rng_next(&r) % 11) - 0.05f;
  s.b = (model_batch){.size = batch, .examples = ex, .slot = slot, .unique = unique,
                      .rows = {wide, deep}};

  /* Interleaved rounds, the best of each: other load on the machine slows
   * single rounds, and would otherwise fall on one side of the difference. */
  double full = 0, mlp_only = 0;
  for (int round = 0; round < ROUNDS; round++) {
    double f = measure(&s, full_step, seconds / (2 * ROUNDS), &err);
    double g = f < 0 ? -1 : measure(&s, mlp_step, seconds / (2 * ROUNDS), &err);
    if (f < 0 || g < 0) {
      fprintf(stderr, "bench_ctr_model: %s\n", err.msg);
      return 1;
    }
    full = f > full ? f : full;
    mlp_only = g > mlp_only ? g : mlp_only;
  }
  /* Time per example: full = mlp part + host part (gathers, scatters, wide, loss). */
  double host_share = 1.0 - full / mlp_only;
  printf("model %s batch %d threads %d backend %s\n", argv[1], batch, threads, be->description);
  printf("examples_per_s %.1f\nmlp_only_examples_per_s %.1f\nhost_share %.3f\n", full, mlp_only,
         host_share);
  free(ex);
  free(slot);
  free(wide);
  free(deep);
  free(s.row_grads[CTR_TABLE_WIDE]);
  free(s.row_grads[CTR_TABLE_EMBEDDING]);
  model_destroy(s.m);
  backend_destroy(be);
  return 0;
}
