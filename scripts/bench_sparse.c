/* Sparse table speed and memory: a table of dim 16 with row-wise AdaGrad is
 * filled to ROWS keys, then batches of 26 x 512 keys drawn from a Zipf-like
 * stream over those keys (density ~ 1/rank, like CTR ids) are deduplicated,
 * pulled, their gradients summed per key and pushed, as a trainer step
 * does. Prints keys/s (counting repeated keys) and the table's bytes per row,
 * at each size given (default 1M and 10M rows). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fp_env.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/sparse_table.h"

#define FIELDS 26
#define BATCH 512
#define DIM 16
#define KEYS (FIELDS * BATCH)

static void die(const char *what, const ps_error *err) {
  fprintf(stderr, "bench_sparse: %s: %s\n", what, err->msg);
  exit(1);
}

/* Key of rank r in field f: ranks of a field are spread over the 64-bit space. */
static uint64_t key_of(int f, uint64_t r) { return rng_mix64(((uint64_t)f << 48) ^ r); }

static void bench(size_t rows, int batches) {
  sparse_table_config cfg = {.name = "embedding", .id = 1, .dim = DIM, .seed = 7, .init_scale = 0.01f};
  cfg.opt = (sparse_optimizer_config){.kind = SPARSE_OPT_ADAGRAD, .lr = 0.05, .epsilon = 1e-8,
                                      .initial_accumulator = 0.0};
  sparse_table *t;
  ps_error err;
  if (sparse_table_create(&t, &cfg, &err) != PS_ERR_OK) die("creating the table", &err);
  float *vals = malloc((size_t)KEYS * DIM * sizeof(float));
  float *grads = malloc((size_t)KEYS * DIM * sizeof(float));
  uint64_t *keys = malloc((size_t)KEYS * sizeof(uint64_t));
  uint32_t *slot = malloc((size_t)KEYS * sizeof(uint32_t));
  if (!vals || !grads || !keys || !slot) {
    fprintf(stderr, "bench_sparse: out of memory\n");
    exit(1);
  }
  /* Fill: every rank of every field once. */
  size_t per_field = rows / FIELDS;
  double t0 = now_s();
  for (size_t r = 0; r < per_field; r += BATCH) {
    size_t n = 0;
    for (int f = 0; f < FIELDS; f++) {
      for (size_t j = r; j < r + BATCH && j < per_field; j++) keys[n++] = key_of(f, j);
    }
    if (sparse_table_pull(t, keys, n, NULL, 0, vals, &err) != PS_ERR_OK) die("filling", &err);
  }
  double fill_s = now_s() - t0;
  sparse_dedup d;
  sparse_dedup_init(&d);
  rng g;
  rng_seed(&g, 1, 2);
  /* The key stream is drawn before the clock starts. */
  double log_n = log((double)per_field + 1.0), unique = 0;
  uint64_t *stream = malloc((size_t)batches * KEYS * sizeof(uint64_t));
  if (stream == NULL) {
    fprintf(stderr, "bench_sparse: out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < (size_t)batches * KEYS; i++) {
    double u = (double)(rng_next(&g) >> 11) * (1.0 / 9007199254740992.0);
    uint64_t rank = (uint64_t)exp(u * log_n) - 1;
    stream[i] = key_of((int)(i % KEYS) / BATCH, rank < per_field ? rank : per_field - 1);
  }
  t0 = now_s();
  for (int b = 0; b < batches; b++) {
    memcpy(keys, stream + (size_t)b * KEYS, KEYS * sizeof *keys);
    if (sparse_dedup_run(&d, keys, KEYS, slot, &err) != PS_ERR_OK) die("dedup", &err);
    if (sparse_table_pull(t, d.unique, d.n_unique, d.counts, b + 1, vals, &err) != PS_ERR_OK) {
      die("pull", &err);
    }
    /* The model's gradient of each occurrence, summed per distinct key. */
    memset(grads, 0, d.n_unique * DIM * sizeof(float));
    for (int i = 0; i < KEYS; i++) {
      float *gr = grads + (size_t)slot[i] * DIM;
      for (int k = 0; k < DIM; k++) gr[k] += 1e-3f * (float)((i + k) % 7 - 3);
    }
    if (sparse_table_push(t, d.unique, d.n_unique, grads, b + 1, &err) != PS_ERR_OK) die("push", &err);
    unique += (double)d.n_unique;
  }
  double s = now_s() - t0;
  sparse_table_stats st;
  sparse_table_stats_get(t, &st);
  /* A snapshot in key order, as every checkpoint takes one under the pserver's lock. */
  uint64_t *dump_keys = malloc(st.rows * sizeof *dump_keys);
  float *dump_values = malloc(st.rows * DIM * sizeof *dump_values);
  float *dump_state = malloc(st.rows * sizeof *dump_state);
  int64_t *dump_meta = malloc(st.rows * 2 * sizeof *dump_meta);
  if (!dump_keys || !dump_values || !dump_state || !dump_meta) {
    fprintf(stderr, "bench_sparse: out of memory for a dump\n");
    exit(1);
  }
  t0 = now_s();
  if (sparse_table_dump(t, dump_keys, dump_values, dump_state, dump_meta, &err) != PS_ERR_OK) {
    die("dump", &err);
  }
  double dump_s = now_s() - t0;
  printf("rows %zu: %.2f M keys/s (%d keys, %.0f distinct per batch, %.3f ms a batch); "
         "%.1f bytes/row (values %d), %.1f MB; fill %.2f M rows/s; dump %.1f ms\n",
         st.rows, (double)KEYS * batches / s / 1e6, KEYS, unique / batches, s / batches * 1e3,
         st.bytes_per_row, DIM * 4, (double)st.bytes / 1048576.0, (double)st.rows / fill_s / 1e6,
         dump_s * 1e3);
  free(dump_keys);
  free(dump_values);
  free(dump_state);
  free(dump_meta);
  sparse_dedup_free(&d);
  sparse_table_destroy(t);
  free(vals);
  free(grads);
  free(keys);
  free(slot);
  free(stream);
}

int main(int argc, char **argv) {
  fp_env_flush_denormals(); /* as the trainer and pserver run (common/fp_env.h) */
  int batches = 300;
  if (argc == 1) {
    bench(1000000, batches);
    bench(10000000, batches);
    return 0;
  }
  for (int i = 1; i < argc; i++) {
    double m = atof(argv[i]);
    if (!(m > 0)) {
      fprintf(stderr, "usage: bench_sparse [MILLIONS_OF_ROWS ...] (default 1 10)\n");
      return 2;
    }
    bench((size_t)(m * 1e6), batches);
  }
  return 0;
}
