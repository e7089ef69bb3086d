/* What the sparse-table tests share: a table's settings, creating one,
 * its row count, a full snapshot for bitwise comparisons, a checked pull. */
#ifndef PSTRAIN_TESTS_SPARSE_TABLE_TESTLIB_H
#define PSTRAIN_TESTS_SPARSE_TABLE_TESTLIB_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sparse_table.h"
#include "tests/check.h"

static inline sparse_table_config config(sparse_optimizer_kind kind, int dim) {
  sparse_table_config c = {.name = "embedding", .id = 3, .dim = dim, .seed = 42, .init_scale = 0.5f};
  c.opt = (sparse_optimizer_config){.kind = kind, .lr = 0.1, .epsilon = 1e-6,
                                    .initial_accumulator = 0.1, .beta1 = 0.9, .beta2 = 0.999};
  return c;
}

static inline sparse_table *make(const sparse_table_config *c) {
  sparse_table *t;
  ps_error err;
  ps_err rc = sparse_table_create(&t, c, &err);
  if (rc != PS_ERR_OK) fprintf(stderr, "create: %s\n", err.msg);
  REQUIRE(rc == PS_ERR_OK);
  return t;
}

static inline size_t rows_of(const sparse_table *t) {
  sparse_table_stats s;
  sparse_table_stats_get(t, &s);
  return s.rows;
}

/* A table's full snapshot, for bitwise comparisons. */
typedef struct snap {
  size_t n, dim, sf;
  uint64_t *keys;
  float *values, *state;
  int64_t *meta;
} snap;

static inline snap take(const sparse_table *t) {
  snap s = {rows_of(t), (size_t)sparse_table_config_of(t)->dim,
            (size_t)sparse_table_state_floats(sparse_table_config_of(t)), NULL, NULL, NULL, NULL};
  s.keys = malloc((s.n + 1) * sizeof *s.keys);
  s.values = malloc((s.n * s.dim + 1) * sizeof(float));
  s.state = malloc((s.n * s.sf + 1) * sizeof(float));
  s.meta = malloc((2 * s.n + 1) * sizeof(int64_t));
  REQUIRE(s.keys && s.values && s.state && s.meta);
  ps_error err;
  REQUIRE(sparse_table_dump(t, s.keys, s.values, s.state, s.meta, &err) == PS_ERR_OK);
  return s;
}

static inline int snap_equal(const snap *a, const snap *b) {
  return a->n == b->n && a->dim == b->dim && a->sf == b->sf &&
         memcmp(a->keys, b->keys, a->n * sizeof *a->keys) == 0 &&
         memcmp(a->values, b->values, a->n * a->dim * sizeof(float)) == 0 &&
         memcmp(a->state, b->state, a->n * a->sf * sizeof(float)) == 0 &&
         memcmp(a->meta, b->meta, 2 * a->n * sizeof(int64_t)) == 0;
}

static inline void snap_free(snap *s) {
  free(s->keys);
  free(s->values);
  free(s->state);
  free(s->meta);
}

static inline void pull_ok(sparse_table *t, const uint64_t *keys, size_t n, const uint32_t *counts, long step,
                    float *out) {
  ps_error err;
  ps_err rc = sparse_table_pull(t, keys, n, counts, step, out, &err);
  if (rc != PS_ERR_OK) fprintf(stderr, "pull: %s\n", err.msg);
  CHECK(rc == PS_ERR_OK);
}

#endif
