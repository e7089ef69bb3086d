/* What storm_client's files share: the storm's state, its request buffer,
 * the mutations, and the sparse rows of CTR requests (storm_sparse.c). */
#ifndef PSTRAIN_TESTS_STORM_H
#define PSTRAIN_TESTS_STORM_H

#include <stddef.h>
#include <stdint.h>

#include "common/ctr_tables.h"
#include "common/job.h"
#include "common/rng.h"
#include "common/shard_map.h"
#include "common/wire.h"

enum { M_REGISTER, M_PUSH, M_PULL, M_DONE, M_ROLLBACK, M_COUNT };

/* Mutations below MUT_GENERIC apply to every job; the rest (SMUT_*) to a
 * CTR job's sparse rows, in PushPull and Pull only. */
enum {
  MUT_NONE, MUT_BITS, MUT_TRUNCATE, MUT_TRAINER, MUT_STEP, MUT_HASH, MUT_HUGE_LENGTH,
  MUT_DUPLICATE, MUT_CONCAT, MUT_OTHER_METHOD, MUT_RANDOM, MUT_EMPTY, MUT_OVERSIZE,
  MUT_GENERIC,
  SMUT_TOO_MANY = MUT_GENERIC, SMUT_DUPLICATE_KEY, SMUT_FOREIGN_KEY, SMUT_VALUES_WIDTH,
  SMUT_COUNTS_WIDTH, SMUT_COUNT_ZERO, SMUT_TABLE_RANGE, SMUT_TABLE_TWICE, SMUT_WRONG_FIELD,
  MUT_COUNT
};
/* One SparseRows as the storm writes it: n keys; value_count floats when
 * has_values; count_n counts when has_counts (count_n != n only when a
 * mutation says so, at most n + 3). keys and counts have room for
 * STORM_ROWS_CAP(max_keys). */
#define STORM_ROWS_CAP(max_keys) ((max_keys) + 8)
typedef struct storm_rows {
  unsigned field; /* WIRE_SPARSE_GRADS or WIRE_SPARSE_KEYS */
  uint32_t table;
  uint64_t *keys;
  uint32_t *counts;
  size_t n, value_count, count_n;
  int has_values, has_counts;
} storm_rows;

typedef struct storm {
  job_config job;
  uint64_t hash, incarnation;
  tensor_layout layout;
  shard_map map;
  float *grads;
  uint8_t *wire;     /* grads in the job's --wire-dtype, as a trainer sends them */
  rng r;
  /* CTR jobs (tables > 0) */
  int tables, dim[CTR_TABLES_MAX];
  size_t max_keys;   /* a batch's keys per table: batch * 26 */
  uint64_t *pool;    /* (pservers, pool_n) distinct keys each pserver owns */
  size_t pool_n;
  float *values;     /* gradient values, room for any SparseRows sent */
  storm_rows rows[WIRE_MAX_SPARSE];
  int row_count;
} storm;

typedef struct buf {
  uint8_t *data;
  size_t len, cap;
} buf;

/* Grows b to hold cap bytes (exits when out of memory). */
void buf_reserve(buf *b, size_t cap);

/* n distinct keys pserver p owns, from a random place in its pool. */
const uint64_t *pick_keys(storm *s, int p, size_t n);
/* Adds a SparseRows of n keys to the request being built. */
storm_rows *rows_add(storm *s, unsigned field, uint32_t table, const uint64_t *keys, size_t n);
/* Mutates the valid SparseRows of a request to pserver p by kind (SMUT_*). */
void sparse_mutate(storm *s, int p, int kind);
/* A SparseRows whose counts do not match its keys, which wire_writer_sparse
 * cannot write: encoded here, appended to out. */
void append_rows(buf *out, const storm_rows *r, const float *values);

#endif
