/* What the pserver sparse-table tests share: pserver 0 of 2 with 2 trainers
 * on a CTR job, driven through pserver_handle on in-memory calls; requests
 * and their parsed replies, each trainer's keys and gradients per step, the
 * local reference tables, and a snapshot of what a request may change.
 * Each test program includes it once: the job, its layout and shard map are
 * that program's (fixture_init builds them). */
#ifndef PSTRAIN_TESTS_PSERVER_SPARSE_TESTLIB_H
#define PSTRAIN_TESTS_PSERVER_SPARSE_TESTLIB_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ctr_tables.h"
#include "common/job.h"
#include "common/shard_map.h"
#include "common/wire.h"
#include "server/pserver.h"
#include "tests/check.h"
#include "tests/pserver_testlib.h"

#define TRAINERS 2
#define PSERVERS 2
#define DIM 4
#define MAXK 128

static job_config job;
static tensor_layout layout;
static shard_map map;

/* --- requests and replies ---------------------------------------------------------- */

/* Rows of one table in a request: keys with counts or values. */
typedef struct rows {
  uint64_t keys[MAXK];
  uint32_t counts[MAXK];
  float values[MAXK * DIM];
  size_t n;
} rows;

/* A reply: code, message, dense params (flat, pserver 0's blocks), rows. */
typedef struct reply {
  ps_err code;
  char msg[512];
  long step;
  float *params;
  size_t n[2];           /* values per table */
  float *values[2];
  size_t nkeys[2];
  uint64_t *keys[2];
} reply;

static inline void reply_free(reply *r) {
  free(r->params);
  for (int t = 0; t < 2; t++) {
    free(r->values[t]);
    free(r->keys[t]);
  }
  memset(r, 0, sizeof *r);
}

static inline int dim_of(int t) { return t == CTR_TABLE_WIDE ? 1 : DIM; }

/* Sends the writer's message, in two slices; the call is returned unanswered
 * or answered. */
static inline rpc_call *send(pserver *ps, int method, const wire_writer *w) {
  rpc_call *call = testlib_handle(ps, method, w->parts, w->part_count, 2);
  REQUIRE(call != NULL);
  return call;
}

static inline int answered(rpc_call *call) { return rpc_call_local_result(call)->replies == 1; }

/* Reads an answered call's reply into r and frees the call. */
static inline void result(rpc_call *call, reply *r) {
  const rpc_local_result *res = rpc_call_local_result(call);
  REQUIRE(res->replies == 1);
  memset(r, 0, sizeof *r);
  r->code = res->code;
  snprintf(r->msg, sizeof r->msg, "%s", res->message);
  if (r->code == PS_ERR_OK) {
    rpc_segment seg = {res->bytes, res->len};
    rpc_message msg = {&seg, 1, res->len};
    wire_block_ref refs[64];
    wire_blocks_msg m = {.blocks = refs, .block_cap = 64};
    ps_error err;
    REQUIRE(wire_parse_blocks(&msg, &m, &err) == PS_ERR_OK);
    r->step = (long)m.step;
    r->params = calloc(layout.total, sizeof(float));
    REQUIRE(r->params != NULL);
    for (size_t i = 0; i < m.block_count; i++) {
      wire_copy_block(&msg, &m.blocks[i], r->params + map.blocks[m.blocks[i].id].offset);
    }
    for (size_t i = 0; i < m.sparse_count; i++) {
      const wire_sparse_ref *s = &m.sparse[i];
      REQUIRE(s->field == WIRE_SPARSE_ROWS && s->table < 2 && r->values[s->table] == NULL);
      r->n[s->table] = s->values.len / 4;
      r->values[s->table] = malloc(s->values.len + 4);
      r->nkeys[s->table] = s->keys.len / 8;
      r->keys[s->table] = malloc(s->keys.len + 8);
      REQUIRE(r->values[s->table] != NULL && r->keys[s->table] != NULL);
      wire_copy_block(&msg, &s->values, r->values[s->table]);
      wire_copy_block(&msg, &s->keys, r->keys[s->table]);
    }
  }
  rpc_call_local_free(call);
}

/* Registers trainer with `incarnation` (0: the trainer's usual 100 + id). */
static inline void register_as(pserver *ps, const job_config *j, uint32_t trainer,
                               uint64_t incarnation) {
  uint8_t buf[TESTLIB_REGISTER_MAX];
  size_t len = testlib_register_bytes(j, trainer, incarnation != 0 ? incarnation : 100 + trainer,
                                      job_config_hash(j), 0, buf, sizeof buf);
  REQUIRE(len > 0);
  rpc_call *call = testlib_handle(ps, 0, &(rpc_part){buf, len, NULL}, 1, 2);
  REQUIRE(call != NULL);
  reply r;
  result(call, &r);
  CHECK_EQ_INT(r.code, PS_ERR_OK);
  reply_free(&r);
}

static inline void do_register(pserver *ps, const job_config *j, uint32_t trainer) {
  register_as(ps, j, trainer, 0);
}

/* A pull of `kind` with keys per table (NULL: the field left out). */
static inline rpc_call *pull(pserver *ps, uint32_t trainer, uint64_t step, uint32_t kind,
                             const rows *keys) {
  wire_writer w = {0};
  ps_error err;
  REQUIRE(wire_writer_begin(&w, 0, &err) == PS_ERR_OK);
  wire_key key = {trainer, 100 + trainer, step};
  wire_writer_push_header(&w, &key, job_config_hash(&job));
  for (int t = 0; t < 2 && keys != NULL; t++) {
    wire_writer_sparse(&w, WIRE_SPARSE_KEYS, (uint32_t)t, keys[t].keys, keys[t].n, NULL, 0,
                       keys[t].counts, NULL);
  }
  wire_writer_pull_kind(&w, kind);
  REQUIRE(wire_writer_check(&w, &err) == PS_ERR_OK);
  rpc_call *call = send(ps, 2, &w);
  wire_writer_free(&w);
  return call;
}

/* --- the job and its data ------------------------------------------------------ */

static inline void make_job(update_mode update, int admit_after) {
  ps_error err;
  job = (job_config){.update = update, .trainers = TRAINERS, .pservers = PSERVERS,
                     .block_size = 64, .seed = 3, .batch = 4, .steps = 10};
  REQUIRE(model_parse("ctr:4:8", &job.model, &err) == PS_ERR_OK);
  job.optimizer = (optimizer_config){.kind = OPTIMIZER_ADAM, .lr = 0.01, .schedule = LR_CONSTANT,
                                     .step_size = 1, .gamma = 1, .total_steps = 10,
                                     .beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-8};
  sparse_optimizer_config so = {.kind = SPARSE_OPT_ADAGRAD, .lr = 0.1, .epsilon = 1e-8,
                                .initial_accumulator = 0.1};
  job.sparse = job_sparse_of(&so, admit_after, 2);
}

static inline pserver_config make_config(void) {
  return (pserver_config){.id = 0, .pservers = PSERVERS, .trainers = TRAINERS,
                          .step_timeout = 60, .max_shard_mb = 64, .max_blocks_per_request = 64};
}

static inline void start(pserver *ps, const pserver_config *cfg) {
  ps_error err;
  REQUIRE(pserver_init(ps, cfg, &err) == PS_ERR_OK);
  for (uint32_t t = 0; t < TRAINERS; t++) do_register(ps, &job, t);
}

static inline void stop(pserver *ps) {
  pserver_abort_waiting(ps, PS_ERR_UNAVAILABLE, "test over");
  pserver_destroy(ps);
}

/* The i-th key pserver 0 owns at or after `from`. */
static inline uint64_t owned_key(uint64_t from, int i) {
  for (uint64_t k = from;; k++) {
    if (shard_of_key(k, PSERVERS) == 0 && i-- == 0) return k;
  }
}

/* Trainer r's keys at step s: 4 keys shared by both trainers, 3 its own,
 * the same keys in both tables (a batch's distinct keys), counts 1..3. */
static inline void batch_keys(int r, int s, rows *out) {
  for (int t = 0; t < 2; t++) {
    rows *o = &out[t];
    o->n = 0;
    for (int i = 0; i < 4; i++) o->keys[o->n++] = owned_key(1000 + 10 * (uint64_t)s, r ? 3 - i : i);
    for (int i = 0; i < 3; i++) o->keys[o->n++] = owned_key(5000 + 1000 * (uint64_t)r + 7 * (uint64_t)s, i);
    for (size_t k = 0; k < o->n; k++) o->counts[k] = (uint32_t)(1 + (k + (size_t)r + (size_t)s) % 3);
  }
}

static inline void batch_grads(int r, int s, rows *g) {
  batch_keys(r, s, g);
  for (int t = 0; t < 2; t++) {
    for (size_t i = 0; i < g[t].n * (size_t)dim_of(t); i++) {
      g[t].values[i] = 0.01f * (float)((i * 5 + (size_t)r * 3 + (size_t)s) % 13) - 0.06f;
    }
  }
}

/* A pserver after the step-0 barrier: both trainers' keys have rows. */
static inline void start_pulled(pserver *ps, const pserver_config *cfg) {
  start(ps, cfg);
  static rows keys[TRAINERS][2];
  for (int r = 0; r < TRAINERS; r++) batch_keys(r, 0, keys[r]);
  rpc_call *first = pull(ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[0]);
  reply got;
  result(pull(ps, 1, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[1]), &got);
  CHECK_EQ_INT(got.code, PS_ERR_OK);
  reply_free(&got);
  result(first, &got);
  reply_free(&got);
}

/* --- the reference, snapshots ------------------------------------------------------ */

/* The reference: local tables and the union. */
typedef struct reference {
  sparse_table *t[2];
} reference;

static inline void ref_init(reference *ref, size_t max_bytes) {
  ps_error err;
  for (int t = 0; t < 2; t++) {
    sparse_table_config c;
    ctr_table_config(&job, t, max_bytes, &c);
    REQUIRE(sparse_table_create(&ref->t[t], &c, &err) == PS_ERR_OK);
  }
}

static inline void ref_free(reference *ref) {
  for (int t = 0; t < 2; t++) sparse_table_destroy(ref->t[t]);
}

/* Union of a and b (a's order first), counts and values summed from 0 in
 * that order, as the pserver sums them. */
static inline void union_of(const rows *a, const rows *b, int dim, rows *u) {
  const rows *in[2] = {a, b};
  size_t d = (size_t)dim;
  u->n = 0;
  for (int s = 0; s < 2; s++) {
    for (size_t k = 0; k < in[s]->n; k++) {
      size_t j = 0;
      while (j < u->n && u->keys[j] != in[s]->keys[k]) j++;
      if (j == u->n) {
        u->keys[u->n++] = in[s]->keys[k];
        u->counts[j] = 0;
        for (size_t i = 0; i < d; i++) u->values[j * d + i] = 0.0f;
      }
      u->counts[j] += in[s]->counts[k];
      for (size_t i = 0; i < d; i++) u->values[j * d + i] += in[s]->values[k * d + i];
    }
  }
}

/* Dumps a table (keys, values, state, meta) into one malloc'd buffer. */
static inline uint8_t *dump(sparse_table *t, size_t *len) {
  sparse_table_stats st;
  sparse_table_stats_get(t, &st);
  const sparse_table_config *c = sparse_table_config_of(t);
  size_t rows_n = st.rows, sf = (size_t)sparse_table_state_floats(c);
  *len = rows_n * (8 + (size_t)c->dim * 4 + sf * 4 + 16) + 1;
  uint8_t *buf = calloc(*len, 1);
  REQUIRE(buf != NULL);
  uint64_t *keys = (uint64_t *)buf;
  int64_t *meta = (int64_t *)(buf + rows_n * 8);
  float *values = (float *)(buf + rows_n * 24);
  float *state = values + rows_n * (size_t)c->dim;
  ps_error err;
  REQUIRE(sparse_table_dump(t, keys, values, state, meta, &err) == PS_ERR_OK);
  return buf;
}

/* Everything a refused request must leave alone: both tables and the shard. */
typedef struct snapshot {
  uint8_t *tables[2];
  size_t lens[2];
  float *dense;
  long version;
} snapshot;

static inline void snap_take(pserver *ps, snapshot *s) {
  for (int t = 0; t < ps->store.table_count; t++) s->tables[t] = dump(ps->store.tables[t], &s->lens[t]);
  size_t n = ps->store.dense.n;
  s->dense = malloc(3 * n * sizeof(float) + 1);
  REQUIRE(s->dense != NULL);
  memcpy(s->dense, ps->store.dense.params, n * sizeof(float));
  memcpy(s->dense + n, ps->store.dense.state1, n * sizeof(float));
  memcpy(s->dense + 2 * n, ps->store.dense.state2, n * sizeof(float));
  s->version = ps->updates;
}

static inline int snap_same(pserver *ps, const snapshot *s) {
  snapshot now = {0};
  snap_take(ps, &now);
  int same = now.version == s->version &&
             memcmp(now.dense, s->dense, 3 * ps->store.dense.n * sizeof(float)) == 0;
  for (int t = 0; t < ps->store.table_count; t++) {
    same = same && now.lens[t] == s->lens[t] && memcmp(now.tables[t], s->tables[t], s->lens[t]) == 0;
    free(now.tables[t]);
  }
  free(now.dense);
  return same;
}

static inline void snap_free(snapshot *s) {
  for (int t = 0; t < 2; t++) free(s->tables[t]);
  free(s->dense);
}

/* The job every test starts from fixes the layout and the shard map. */
static inline void fixture_init(void) {
  ps_error err;
  rpc_global_init();
  make_job(UPDATE_SYNC, 0);
  tensor_layout_init(&layout);
  REQUIRE(model_build_layout(&job.model, &layout, &err) == PS_ERR_OK);
  REQUIRE(shard_map_build(&map, &layout, job.block_size, PSERVERS, &err) == PS_ERR_OK);
}

static inline void fixture_free(void) {
  shard_map_free(&map);
  tensor_layout_free(&layout);
  rpc_global_shutdown();
}

#endif
