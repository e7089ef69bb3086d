/* The pserver's sparse tables (CTR jobs), driven through pserver_handle on
 * in-memory calls, pserver 0 of 2 with 2 trainers:
 * - sync: after the pull barrier and three steps, every reply's rows, the
 *   dense shard and the tables equal a local computation with sparse_table
 *   pull/push on the union of the trainers' keys (exact for keys one
 *   trainer touches, within 1e-6 where gradients are summed);
 * - admission counts both trainers' occurrences of a key in one step;
 * - async applies each push at once;
 * - the pull barrier waits for every trainer, refuses another step, and
 *   its --step-timeout stops the job or drops the missing trainer;
 * - a PULL_STEP of a step already pulled (a restarted trainer's) is
 *   answered at once with read-only rows;
 * - PULL_LOOKUP changes nothing; PULL_ALL returns every row once in key order;
 * - every refusal of a bad request leaves the tables and the shard unchanged;
 * - --max-table-mb fails every waiting pull naming the table. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/ctr_tables.h"
#include "common/job.h"
#include "common/shard_map.h"
#include "common/wire.h"
#include "server/pserver.h"
#include "tests/check.h"

#define TRAINERS 2
#define PSERVERS 2
#define DIM 4
#define MAXK 128
#define STEPS 3

static job_config job;
static tensor_layout layout;
static shard_map map;

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

static void reply_free(reply *r) {
  free(r->params);
  for (int t = 0; t < 2; t++) {
    free(r->values[t]);
    free(r->keys[t]);
  }
  memset(r, 0, sizeof *r);
}

static int dim_of(int t) { return t == CTR_TABLE_WIDE ? 1 : DIM; }

/* Sends the writer's message; the call is returned unanswered or answered. */
static rpc_call *send(pserver *ps, int method, const wire_writer *w) {
  size_t total = 0;
  for (int i = 0; i < w->part_count; i++) total += w->parts[i].len;
  uint8_t *buf = malloc(total > 0 ? total : 1);
  REQUIRE(buf != NULL);
  for (size_t at = 0, i = 0; i < (size_t)w->part_count; at += w->parts[i].len, i++) {
    memcpy(buf + at, w->parts[i].data, w->parts[i].len);
  }
  /* Two segments, as gRPC may hand a message over in slices. */
  rpc_segment segs[2] = {{buf, total / 2}, {buf + total / 2, total - total / 2}};
  rpc_message msg = {segs, 2, total};
  rpc_call *call = rpc_call_local_create("test");
  REQUIRE(call != NULL);
  pserver_handle(ps, call, method, &msg);
  free(buf);
  return call;
}

static int answered(rpc_call *call) { return rpc_call_local_result(call)->replies == 1; }

/* Reads an answered call's reply into r and frees the call. */
static void result(rpc_call *call, reply *r) {
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
static void register_as(pserver *ps, const job_config *j, uint32_t trainer, uint64_t incarnation) {
  Pstrain__RequestKey key = PSTRAIN__REQUEST_KEY__INIT;
  key.trainer_id = trainer;
  key.incarnation = incarnation != 0 ? incarnation : 100 + trainer;
  Pstrain__JobConfig jc;
  wire_job_parts oc;
  char text[256];
  wire_job_to_proto(j, &jc, &oc, text, sizeof text);
  Pstrain__RegisterRequest req = PSTRAIN__REGISTER_REQUEST__INIT;
  req.key = &key;
  req.config_hash = job_config_hash(j);
  req.job = &jc;
  uint8_t *buf;
  size_t len;
  ps_error err;
  REQUIRE(wire_pack(&req.base, &buf, &len, &err) == PS_ERR_OK);
  wire_writer w = {0};
  REQUIRE(wire_writer_begin(&w, 0, &err) == PS_ERR_OK);
  w.parts[0] = (rpc_part){buf, len, NULL};
  w.part_count = 1;
  reply r;
  result(send(ps, 0, &w), &r);
  CHECK_EQ_INT(r.code, PS_ERR_OK);
  reply_free(&r);
  wire_writer_free(&w);
  free(buf);
}

static void do_register(pserver *ps, const job_config *j, uint32_t trainer) {
  register_as(ps, j, trainer, 0);
}

/* A push: dense gradients (flat, may be NULL: no blocks), sparse grads and
 * next keys per table (NULL: the field left out). */
static rpc_call *push(pserver *ps, uint32_t trainer, uint64_t step, const float *dense,
                      const rows *grads, const rows *next) {
  wire_writer w = {0};
  ps_error err;
  REQUIRE(wire_writer_begin(&w, map.block_count, &err) == PS_ERR_OK);
  wire_key key = {trainer, 100 + trainer, step};
  wire_writer_push_header(&w, &key, job_config_hash(&job));
  for (size_t i = 0; i < map.block_count && dense != NULL; i++) {
    const shard_block *b = &map.blocks[i];
    if (b->pserver == 0) wire_writer_block(&w, b->id, dense + b->offset, b->count, NULL);
  }
  for (int t = 0; t < 2 && grads != NULL; t++) {
    wire_writer_sparse(&w, WIRE_SPARSE_GRADS, (uint32_t)t, grads[t].keys, grads[t].n,
                       grads[t].values, grads[t].n * (size_t)dim_of(t), NULL, NULL);
  }
  for (int t = 0; t < 2 && next != NULL; t++) {
    wire_writer_sparse(&w, WIRE_SPARSE_KEYS, (uint32_t)t, next[t].keys, next[t].n, NULL, 0,
                       next[t].counts, NULL);
  }
  REQUIRE(wire_writer_check(&w, &err) == PS_ERR_OK);
  rpc_call *call = send(ps, 1, &w);
  wire_writer_free(&w);
  return call;
}

static rpc_call *pull(pserver *ps, uint32_t trainer, uint64_t step, uint32_t kind,
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

static void make_job(update_mode update, int admit_after) {
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

static pserver_config make_config(void) {
  return (pserver_config){.id = 0, .pservers = PSERVERS, .trainers = TRAINERS,
                          .step_timeout = 60, .max_shard_mb = 64, .max_blocks_per_request = 64};
}

static void start(pserver *ps, const pserver_config *cfg) {
  ps_error err;
  REQUIRE(pserver_init(ps, cfg, &err) == PS_ERR_OK);
  for (uint32_t t = 0; t < TRAINERS; t++) do_register(ps, &job, t);
}

static void stop(pserver *ps) {
  pserver_abort_waiting(ps, PS_ERR_UNAVAILABLE, "test over");
  pserver_destroy(ps);
}

/* The i-th key pserver 0 owns at or after `from`. */
static uint64_t owned_key(uint64_t from, int i) {
  for (uint64_t k = from;; k++) {
    if (shard_of_key(k, PSERVERS) == 0 && i-- == 0) return k;
  }
}

/* Trainer r's keys at step s: 4 keys shared by both trainers, 3 its own,
 * the same keys in both tables (a batch's distinct keys), counts 1..3. */
static void batch_keys(int r, int s, rows *out) {
  for (int t = 0; t < 2; t++) {
    rows *o = &out[t];
    o->n = 0;
    for (int i = 0; i < 4; i++) o->keys[o->n++] = owned_key(1000 + 10 * (uint64_t)s, r ? 3 - i : i);
    for (int i = 0; i < 3; i++) o->keys[o->n++] = owned_key(5000 + 1000 * (uint64_t)r + 7 * (uint64_t)s, i);
    for (size_t k = 0; k < o->n; k++) o->counts[k] = (uint32_t)(1 + (k + (size_t)r + (size_t)s) % 3);
  }
}

static void batch_grads(int r, int s, rows *g) {
  batch_keys(r, s, g);
  for (int t = 0; t < 2; t++) {
    for (size_t i = 0; i < g[t].n * (size_t)dim_of(t); i++) {
      g[t].values[i] = 0.01f * (float)((i * 5 + (size_t)r * 3 + (size_t)s) % 13) - 0.06f;
    }
  }
}

static void dense_grads(int r, int s, float *g) {
  for (size_t i = 0; i < layout.total; i++) {
    g[i] = 0.001f * (float)((i * 7 + (size_t)r * 3 + (size_t)s) % 11) - 0.005f;
  }
}

/* The reference: local tables and the union. */
typedef struct reference {
  sparse_table *t[2];
} reference;

static void ref_init(reference *ref, size_t max_bytes) {
  ps_error err;
  for (int t = 0; t < 2; t++) {
    sparse_table_config c;
    ctr_table_config(&job, t, max_bytes, &c);
    REQUIRE(sparse_table_create(&ref->t[t], &c, &err) == PS_ERR_OK);
  }
}

static void ref_free(reference *ref) {
  for (int t = 0; t < 2; t++) sparse_table_destroy(ref->t[t]);
}

/* Union of a and b (a's order first), counts and values summed from 0 in
 * that order, as the pserver sums them. */
static void union_of(const rows *a, const rows *b, int dim, rows *u) {
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

/* Whether key is in both trainers' batches of step s. */
static int shared(uint64_t key, const rows *a, const rows *b) {
  int in_a = 0, in_b = 0;
  for (size_t k = 0; k < a->n; k++) in_a |= a->keys[k] == key;
  for (size_t k = 0; k < b->n; k++) in_b |= b->keys[k] == key;
  return in_a && in_b;
}

/* The pulled union's rows against each trainer's reply. */
static void check_rows(const reply *got, const rows *mine, const rows *u, const float *ref_rows,
                       int t, int exact) {
  int dim = dim_of(t);
  CHECK_EQ_INT((long)got->n[t], (long)(mine->n * (size_t)dim));
  if (got->n[t] != mine->n * (size_t)dim) return;
  for (size_t k = 0; k < mine->n; k++) {
    size_t j = 0;
    while (u->keys[j] != mine->keys[k]) j++;
    for (int d = 0; d < dim; d++) {
      float a = got->values[t][k * (size_t)dim + (size_t)d], b = ref_rows[j * (size_t)dim + (size_t)d];
      if (exact) CHECK(a == b);
      else CHECK(fabsf(a - b) <= 1e-6f);
    }
  }
}

/* Dumps a table (keys, values, state, meta) into one malloc'd buffer. */
static uint8_t *dump(sparse_table *t, size_t *len) {
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

static void snap_take(pserver *ps, snapshot *s) {
  for (int t = 0; t < ps->sparse_count; t++) s->tables[t] = dump(ps->sparse[t], &s->lens[t]);
  size_t n = ps->table.n;
  s->dense = malloc(3 * n * sizeof(float) + 1);
  REQUIRE(s->dense != NULL);
  memcpy(s->dense, ps->table.params, n * sizeof(float));
  memcpy(s->dense + n, ps->table.state1, n * sizeof(float));
  memcpy(s->dense + 2 * n, ps->table.state2, n * sizeof(float));
  s->version = ps->version;
}

static int snap_same(pserver *ps, const snapshot *s) {
  snapshot now = {0};
  snap_take(ps, &now);
  int same = now.version == s->version &&
             memcmp(now.dense, s->dense, 3 * ps->table.n * sizeof(float)) == 0;
  for (int t = 0; t < ps->sparse_count; t++) {
    same = same && now.lens[t] == s->lens[t] && memcmp(now.tables[t], s->tables[t], s->lens[t]) == 0;
    free(now.tables[t]);
  }
  free(now.dense);
  return same;
}

static void snap_free(snapshot *s) {
  for (int t = 0; t < 2; t++) free(s->tables[t]);
  free(s->dense);
}

/* --- sync ≡ local on the union ------------------------------------------------------ */

static void test_sync(void) {
  make_job(UPDATE_SYNC, 0);
  pserver ps;
  pserver_config cfg = make_config();
  start(&ps, &cfg);
  reference ref;
  ref_init(&ref, 0);
  size_t n = layout.total;
  float *want = malloc(n * sizeof *want), *m1 = calloc(n, sizeof *m1), *m2 = calloc(n, sizeof *m2);
  float *g[TRAINERS], *sum = malloc(n * sizeof *sum);
  for (int r = 0; r < TRAINERS; r++) g[r] = malloc(n * sizeof *g[r]);
  REQUIRE(want && m1 && m2 && sum && g[0] && g[1]);
  model_init_params(&job.model, &layout, job.seed, 0, n, want);
  static rows keys[TRAINERS][2], grads[TRAINERS][2], u[2];
  static float ref_rows[2][2 * MAXK * DIM];
  memset(keys, 0, sizeof keys);
  memset(grads, 0, sizeof grads);
  /* The pull barrier of step 0: trainer 0 waits for trainer 1. */
  for (int r = 0; r < TRAINERS; r++) batch_keys(r, 0, keys[r]);
  rpc_call *first = pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[0]);
  CHECK(!answered(first));
  rpc_call *second = pull(&ps, 1, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[1]);
  reply got[TRAINERS];
  result(first, &got[0]);
  result(second, &got[1]);
  ps_error err;
  for (int t = 0; t < 2; t++) {
    union_of(&keys[0][t], &keys[1][t], dim_of(t), &u[t]);
    REQUIRE(sparse_table_pull(ref.t[t], u[t].keys, u[t].n, u[t].counts, 0, ref_rows[t], &err) ==
            PS_ERR_OK);
  }
  for (int r = 0; r < TRAINERS; r++) {
    CHECK_EQ_INT(got[r].code, PS_ERR_OK);
    for (int t = 0; t < 2 && got[r].code == PS_ERR_OK; t++) {
      check_rows(&got[r], &keys[r][t], &u[t], ref_rows[t], t, 1);
    }
    reply_free(&got[r]);
  }
  for (int s = 0; s < STEPS; s++) {
    /* Each trainer pushes its gradients of step s and its keys of s + 1. */
    rows next[TRAINERS][2];
    memset(next, 0, sizeof next);
    for (int r = 0; r < TRAINERS; r++) {
      batch_grads(r, s, grads[r]);
      if (s + 1 < STEPS) batch_keys(r, s + 1, next[r]);
      dense_grads(r, s, g[r]);
    }
    first = push(&ps, 0, (uint64_t)s, g[0], grads[0], next[0]);
    CHECK(!answered(first));
    second = push(&ps, 1, (uint64_t)s, g[1], grads[1], next[1]);
    result(first, &got[0]);
    result(second, &got[1]);
    /* The reference: dense and sparse sums in trainer-id order, halved. */
    for (size_t i = 0; i < n; i++) sum[i] = (g[0][i] + g[1][i]) * 0.5f;
    optimizer_apply(&job.optimizer, s, want, sum, m1, m2, n);
    for (int t = 0; t < 2; t++) {
      union_of(&grads[0][t], &grads[1][t], dim_of(t), &u[t]);
      for (size_t i = 0; i < u[t].n * (size_t)dim_of(t); i++) u[t].values[i] *= 0.5f;
      REQUIRE(sparse_table_push(ref.t[t], u[t].keys, u[t].n, u[t].values, s, &err) == PS_ERR_OK);
    }
    long every = job.sparse.evict_after / 4 > 0 ? job.sparse.evict_after / 4 : 1;
    if ((s + 1) % every == 0) {
      for (int t = 0; t < 2; t++) sparse_table_evict(ref.t[t], s + 1);
    }
    for (int t = 0; t < 2; t++) {
      union_of(&next[0][t], &next[1][t], dim_of(t), &u[t]);
      REQUIRE(sparse_table_pull(ref.t[t], u[t].keys, u[t].n, u[t].counts, s + 1, ref_rows[t],
                                &err) == PS_ERR_OK);
    }
    for (int r = 0; r < TRAINERS; r++) {
      CHECK_EQ_INT(got[r].code, PS_ERR_OK);
      if (got[r].code != PS_ERR_OK) continue;
      CHECK_EQ_INT(got[r].step, s + 1);
      for (size_t b = 0; b < map.block_count; b++) {
        const shard_block *blk = &map.blocks[b];
        if (blk->pserver != 0) continue;
        CHECK(memcmp(got[r].params + blk->offset, want + blk->offset,
                     blk->count * sizeof(float)) == 0);
      }
      for (int t = 0; t < 2; t++) check_rows(&got[r], &next[r][t], &u[t], ref_rows[t], t, 1);
      reply_free(&got[r]);
    }
  }
  /* The tables hold the same rows: keys equal, values exact where one
   * trainer pushed, within 1e-6 where two gradients were summed. */
  for (int t = 0; t < 2; t++) {
    size_t la, lb;
    sparse_table_stats sa, sb;
    sparse_table_stats_get(ps.sparse[t], &sa);
    sparse_table_stats_get(ref.t[t], &sb);
    CHECK_EQ_INT((long)sa.rows, (long)sb.rows);
    uint8_t *a = dump(ps.sparse[t], &la), *b = dump(ref.t[t], &lb);
    CHECK(la == lb && memcmp(a, b, sa.rows * 8) == 0);
    const float *va = (const float *)(a + sa.rows * 24), *vb = (const float *)(b + sb.rows * 24);
    for (size_t i = 0; la == lb && i < sa.rows * (size_t)dim_of(t); i++) {
      CHECK(fabsf(va[i] - vb[i]) <= 1e-6f);
    }
    free(a);
    free(b);
  }
  /* Keys only trainer 1 touched at the last step are exact. */
  {
    rows last[TRAINERS][2];
    for (int r = 0; r < TRAINERS; r++) batch_keys(r, STEPS - 1, last[r]);
    for (int t = 0; t < 2; t++) {
      float a[DIM], b[DIM];
      for (size_t k = 0; k < last[1][t].n; k++) {
        uint64_t key = last[1][t].keys[k];
        if (shared(key, &last[0][t], &last[1][t])) continue;
        sparse_table_lookup(ps.sparse[t], &key, 1, a);
        sparse_table_lookup(ref.t[t], &key, 1, b);
        CHECK(memcmp(a, b, (size_t)dim_of(t) * sizeof(float)) == 0);
      }
    }
  }
  /* A resend of an applied push gets the rows read-only. */
  snapshot before;
  snap_take(&ps, &before);
  rows next1[2];
  batch_keys(1, 1, next1);
  result(push(&ps, 1, 0, g[1], grads[1], next1), &got[1]);
  CHECK_EQ_INT(got[1].code, PS_ERR_OK);
  CHECK(snap_same(&ps, &before));
  reply_free(&got[1]);
  snap_free(&before);
  stop(&ps);
  ref_free(&ref);
  for (int r = 0; r < TRAINERS; r++) free(g[r]);
  free(sum);
  free(want);
  free(m1);
  free(m2);
}

/* --- admission, async ---------------------------------------------------------------- */

/* --admit-after 2: a key once in each trainer's batch gets its row at the
 * step's merged pull; a key once in one batch does not. */
static void test_admission(void) {
  make_job(UPDATE_SYNC, 2);
  pserver ps;
  pserver_config cfg = make_config();
  start(&ps, &cfg);
  static rows keys[TRAINERS][2];
  memset(keys, 0, sizeof keys);
  uint64_t both = owned_key(77, 0), only = owned_key(77, 1);
  for (int t = 0; t < 2; t++) {
    keys[0][t].keys[0] = both;
    keys[0][t].keys[1] = only;
    keys[0][t].counts[0] = keys[0][t].counts[1] = 1;
    keys[0][t].n = 2;
    keys[1][t].keys[0] = both;
    keys[1][t].counts[0] = 1;
    keys[1][t].n = 1;
  }
  rpc_call *first = pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[0]);
  reply got[2];
  result(pull(&ps, 1, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[1]), &got[1]);
  result(first, &got[0]);
  CHECK_EQ_INT(got[0].code, PS_ERR_OK);
  if (got[0].code == PS_ERR_OK) {
    sparse_table_config c;
    ctr_table_config(&job, CTR_TABLE_EMBEDDING, 0, &c);
    float init[DIM], zeros[DIM] = {0};
    sparse_table_init_row(&c, both, init);
    CHECK(memcmp(got[0].values[1], init, sizeof init) == 0);
    CHECK(memcmp(got[0].values[1] + DIM, zeros, sizeof zeros) == 0);
    CHECK(memcmp(got[1].values[1], init, sizeof init) == 0);
  }
  sparse_table_stats st;
  sparse_table_stats_get(ps.sparse[CTR_TABLE_EMBEDDING], &st);
  CHECK_EQ_INT((long)st.rows, 1);
  CHECK_EQ_INT((long)st.admitted, 1);
  reply_free(&got[0]);
  reply_free(&got[1]);
  stop(&ps);
}

/* Async: each push is applied on arrival, scaled 1/N, at schedule step
 * version / N, and its next keys are pulled at the new version / N. */
static void test_async(void) {
  make_job(UPDATE_ASYNC, 0);
  pserver ps;
  pserver_config cfg = make_config();
  start(&ps, &cfg);
  reference ref;
  ref_init(&ref, 0);
  float *g = malloc(layout.total * sizeof *g);
  REQUIRE(g != NULL);
  static rows keys[2], grads[2], next[2];
  static float ref_rows[MAXK * DIM];
  ps_error err;
  /* Pulls are answered at once. */
  batch_keys(0, 0, keys);
  reply got;
  result(pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys), &got);
  CHECK_EQ_INT(got.code, PS_ERR_OK);
  reply_free(&got);
  for (int t = 0; t < 2; t++) {
    REQUIRE(sparse_table_pull(ref.t[t], keys[t].keys, keys[t].n, keys[t].counts, 0, ref_rows,
                              &err) == PS_ERR_OK);
  }
  for (int k = 0; k < 3; k++) {
    int r = k % TRAINERS;
    batch_grads(r, k, grads);
    batch_keys(r, k + 1, next);
    dense_grads(r, k, g);
    result(push(&ps, (uint32_t)r, (uint64_t)(k / TRAINERS), g, grads, next), &got);
    CHECK_EQ_INT(got.code, PS_ERR_OK);
    for (int t = 0; t < 2; t++) {
      for (size_t i = 0; i < grads[t].n * (size_t)dim_of(t); i++) grads[t].values[i] *= 0.5f;
      REQUIRE(sparse_table_push(ref.t[t], grads[t].keys, grads[t].n, grads[t].values,
                                k / TRAINERS, &err) == PS_ERR_OK);
      if ((k + 1) % TRAINERS == 0) sparse_table_evict(ref.t[t], (k + 1) / TRAINERS);
      REQUIRE(sparse_table_pull(ref.t[t], next[t].keys, next[t].n, next[t].counts,
                                (k + 1) / TRAINERS, ref_rows, &err) == PS_ERR_OK);
      if (got.code == PS_ERR_OK) check_rows(&got, &next[t], &next[t], ref_rows, t, 1);
    }
    reply_free(&got);
  }
  stop(&ps);
  ref_free(&ref);
  free(g);
}

/* --- the pull barrier -------------------------------------------------------------------- */

static void test_pull_barrier(void) {
  make_job(UPDATE_SYNC, 0);
  static rows keys[2];
  batch_keys(0, 0, keys);
  for (int cont = 0; cont < 2; cont++) {
    pserver ps;
    pserver_config cfg = make_config();
    cfg.step_timeout = 0.05;
    cfg.continue_on_trainer_loss = cont;
    start(&ps, &cfg);
    /* Another step than the pserver's is refused, saying where it is. */
    reply got;
    result(pull(&ps, 0, 3, PSTRAIN__PULL_KIND__PULL_STEP, keys), &got);
    CHECK_EQ_INT(got.code, PS_ERR_ABORTED);
    CHECK(strstr(got.msg, "at step 0") != NULL);
    rpc_call *first = pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys);
    CHECK(!answered(first));
    CHECK_EQ_INT(pserver_poll(&ps), PSERVER_RUNNING);
    nanosleep(&(struct timespec){0, 100000000}, NULL);
    pserver_status st = pserver_poll(&ps);
    if (cont) {
      /* Trainer 1 is dropped; trainer 0's pull completes alone. */
      CHECK_EQ_INT(st, PSERVER_RUNNING);
      CHECK(answered(first));
      result(first, &got);
      CHECK_EQ_INT(got.code, PS_ERR_OK);
      CHECK(ps.trainers[1].lost);
      reply_free(&got);
    } else {
      CHECK_EQ_INT(st, PSERVER_FAILED);
      CHECK(strstr(ps.failure, "pull barrier") != NULL && strstr(ps.failure, "trainer(s) 1") != NULL);
      CHECK(!answered(first));
      stop(&ps); /* answers it */
      result(first, &got);
      CHECK_EQ_INT(got.code, PS_ERR_UNAVAILABLE);
      continue;
    }
    stop(&ps);
  }
  /* A new incarnation drops its trainer's waiting pull. */
  pserver ps;
  pserver_config cfg = make_config();
  start(&ps, &cfg);
  rpc_call *first = pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys);
  register_as(&ps, &job, 0, 555);
  reply got;
  CHECK(answered(first));
  result(first, &got);
  CHECK_EQ_INT(got.code, PS_ERR_ABORTED);
  stop(&ps);
}

/* --- lookup, all, refusals, the table limit -------------------------------------------- */

/* A pserver after the step-0 barrier: both trainers' keys have rows. */
static void start_pulled(pserver *ps, const pserver_config *cfg) {
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

/* A PULL_STEP of the step whose merged pull is done (a restarted trainer's):
 * answered at once, read-only, without waiting for the other trainer. */
static void test_pull_after_barrier(void) {
  make_job(UPDATE_SYNC, 0);
  pserver ps;
  pserver_config cfg = make_config();
  start_pulled(&ps, &cfg);
  snapshot before;
  snap_take(&ps, &before);
  static rows keys[2];
  batch_keys(1, 0, keys);
  rpc_call *call = pull(&ps, 1, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys);
  CHECK(answered(call));
  reply got;
  result(call, &got);
  CHECK_EQ_INT(got.code, PS_ERR_OK);
  for (int t = 0; t < 2 && got.code == PS_ERR_OK; t++) {
    float want[MAXK * DIM];
    sparse_table_lookup(ps.sparse[t], keys[t].keys, keys[t].n, want);
    CHECK_EQ_INT((long)got.n[t], (long)(keys[t].n * (size_t)dim_of(t)));
    CHECK(memcmp(got.values[t], want, got.n[t] * sizeof(float)) == 0);
  }
  reply_free(&got);
  CHECK(snap_same(&ps, &before)); /* no second pull: admission counts stay */
  snap_free(&before);
  stop(&ps);
}

static void test_lookup_and_all(void) {
  make_job(UPDATE_SYNC, 0);
  pserver ps;
  pserver_config cfg = make_config();
  start_pulled(&ps, &cfg);
  snapshot before;
  snap_take(&ps, &before);
  /* Lookup: known keys' rows, zeros for a key without one; nothing changes. */
  static rows keys[2];
  batch_keys(1, 0, keys);
  for (int t = 0; t < 2; t++) keys[t].keys[keys[t].n++] = owned_key(900000, 0);
  reply got;
  result(pull(&ps, 0, 7, PSTRAIN__PULL_KIND__PULL_LOOKUP, keys), &got);
  CHECK_EQ_INT(got.code, PS_ERR_OK);
  for (int t = 0; t < 2 && got.code == PS_ERR_OK; t++) {
    float want[(MAXK + 1) * DIM];
    sparse_table_lookup(ps.sparse[t], keys[t].keys, keys[t].n, want);
    CHECK_EQ_INT((long)got.n[t], (long)(keys[t].n * (size_t)dim_of(t)));
    CHECK(memcmp(got.values[t], want, got.n[t] * sizeof(float)) == 0);
    for (int d = 0; d < dim_of(t); d++) CHECK(got.values[t][got.n[t] - 1 - (size_t)d] == 0.0f);
  }
  reply_free(&got);
  CHECK(snap_same(&ps, &before));
  /* All: every row once, ascending, as the dump has them. */
  result(pull(&ps, 1, 0, PSTRAIN__PULL_KIND__PULL_ALL, NULL), &got);
  CHECK_EQ_INT(got.code, PS_ERR_OK);
  for (int t = 0; t < 2 && got.code == PS_ERR_OK; t++) {
    sparse_table_stats st;
    sparse_table_stats_get(ps.sparse[t], &st);
    CHECK_EQ_INT((long)got.nkeys[t], (long)st.rows);
    CHECK_EQ_INT((long)got.n[t], (long)(st.rows * (size_t)dim_of(t)));
    for (size_t k = 1; k < got.nkeys[t]; k++) CHECK(got.keys[t][k - 1] < got.keys[t][k]);
    const float *values = (const float *)(before.tables[t] + st.rows * 24);
    CHECK(memcmp(got.keys[t], before.tables[t], st.rows * 8) == 0);
    CHECK(memcmp(got.values[t], values, got.n[t] * sizeof(float)) == 0);
  }
  reply_free(&got);
  CHECK(snap_same(&ps, &before));
  snap_free(&before);
  stop(&ps);
}

/* One bad request: its name, method (1 push, 2 pull) and the code it gets. */
typedef struct bad {
  const char *what;
  int method;
  ps_err code;
} bad;

/* What case `which` breaks in a good push's rows (the rest is in the writer). */
static void spoil(int which, rows *grads, rows *next) {
  switch (which) {
  case 2: next[0].n = 4 * 26 + 1;
    for (size_t k = 0; k < next[0].n; k++) { next[0].keys[k] = owned_key(20000, (int)k); next[0].counts[k] = 1; }
    break;
  case 3: grads[1].keys[1] = grads[1].keys[0]; break;
  case 4: for (uint64_t k = 1;; k++) if (shard_of_key(k, PSERVERS) != 0) { next[1].keys[0] = k; break; } break;
  case 7: next[0].counts[2] = 0; break;
  default: break;
  }
}

static void test_refusals(void) {
  make_job(UPDATE_SYNC, 0);
  pserver ps;
  pserver_config cfg = make_config();
  start_pulled(&ps, &cfg);
  float *g = calloc(layout.total, sizeof *g);
  REQUIRE(g != NULL);
  static const bad cases[] = {
      {"a table index the job does not have", 1, PS_ERR_INVALID_ARGUMENT},
      {"a table twice in one field", 1, PS_ERR_INVALID_ARGUMENT},
      {"more keys than a batch holds", 1, PS_ERR_INVALID_ARGUMENT},
      {"duplicate keys", 1, PS_ERR_INVALID_ARGUMENT},
      {"a key of another pserver", 1, PS_ERR_INVALID_ARGUMENT},
      {"gradients of the wrong width", 1, PS_ERR_INVALID_ARGUMENT},
      {"counts of the wrong length", 1, PS_ERR_INVALID_ARGUMENT},
      {"a count of 0", 1, PS_ERR_INVALID_ARGUMENT},
      {"a push with keys but a table missing", 1, PS_ERR_INVALID_ARGUMENT},
      {"a pull of another step", 2, PS_ERR_ABORTED},
      {"a pull with gradients", 2, PS_ERR_INVALID_ARGUMENT},
      {"an unknown pull kind", 2, PS_ERR_INVALID_ARGUMENT},
  };
  for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
    static rows grads[2], next[2];
    batch_grads(0, 0, grads);
    batch_keys(0, 1, next);
    spoil(c, grads, next);
    snapshot before;
    snap_take(&ps, &before);
    wire_writer w = {0};
    ps_error err;
    REQUIRE(wire_writer_begin(&w, map.block_count, &err) == PS_ERR_OK);
    wire_key key = {0, 100, c == 9 ? 1 : 0};
    wire_writer_push_header(&w, &key, job_config_hash(&job));
    for (size_t i = 0; i < map.block_count && cases[c].method == 1; i++) {
      const shard_block *b = &map.blocks[i];
      if (b->pserver == 0) wire_writer_block(&w, b->id, g + b->offset, b->count, NULL);
    }
    int tables = c == 8 ? 1 : 2;
    for (int t = 0; t < tables && (cases[c].method == 1 || c == 10); t++) {
      size_t values = grads[t].n * (size_t)dim_of(t) - (c == 5 && t == 1 ? 1 : 0);
      wire_writer_sparse(&w, WIRE_SPARSE_GRADS, c == 0 && t == 1 ? 5u : (uint32_t)t,
                         grads[t].keys, grads[t].n, grads[t].values, values, NULL, NULL);
    }
    for (int t = 0; t < 2; t++) {
      /* case 6: keys without their counts */
      wire_writer_sparse(&w, WIRE_SPARSE_KEYS, c == 1 ? 0u : (uint32_t)t, next[t].keys,
                         next[t].n, NULL, 0, c == 6 && t == 0 ? NULL : next[t].counts, NULL);
    }
    if (cases[c].method == 2) wire_writer_pull_kind(&w, c == 11 ? 9u : 0u);
    REQUIRE(wire_writer_check(&w, &err) == PS_ERR_OK);
    reply got;
    result(send(&ps, cases[c].method, &w), &got);
    if (got.code != cases[c].code) fprintf(stderr, "case %d (%s): %s\n", c, cases[c].what, got.msg);
    CHECK_EQ_INT(got.code, cases[c].code);
    CHECK(snap_same(&ps, &before));
    CHECK(!ps.trainers[0].pushed);
    reply_free(&got);
    snap_free(&before);
    wire_writer_free(&w);
  }
  stop(&ps);
  free(g);
  /* Sparse rows sent to an MLP job. */
  job_config ctr = job;
  REQUIRE(model_parse("mlp:6,5,3", &job.model, &(ps_error){0}) == PS_ERR_OK);
  job.sparse = (job_sparse){0};
  tensor_layout mlp_layout;
  shard_map mlp_map;
  ps_error err;
  tensor_layout_init(&mlp_layout);
  REQUIRE(model_build_layout(&job.model, &mlp_layout, &err) == PS_ERR_OK);
  REQUIRE(shard_map_build(&mlp_map, &mlp_layout, job.block_size, PSERVERS, &err) == PS_ERR_OK);
  start(&ps, &cfg);
  static rows keys[2];
  batch_keys(0, 0, keys);
  reply got;
  result(pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys), &got);
  CHECK_EQ_INT(got.code, PS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(got.msg, "without sparse tables") != NULL);
  /* Without keys it is answered as before. */
  rpc_call *plain = pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, NULL);
  CHECK(answered(plain));
  CHECK_EQ_INT(rpc_call_local_result(plain)->code, PS_ERR_OK);
  rpc_call_local_free(plain);
  stop(&ps);
  shard_map_free(&mlp_map);
  tensor_layout_free(&mlp_layout);
  job = ctr;
}

/* --max-table-mb: the merged pull passes a table's limit; both waiting
 * trainers are told, naming the table. */
static void test_max_table(void) {
  make_job(UPDATE_SYNC, 0);
  /* The smallest limit that holds both empty tables: no row fits then. */
  size_t limit = 0;
  for (int t = 0; t < 2; t++) {
    for (size_t lo = 1;; lo *= 2) {
      sparse_table_config c;
      ctr_table_config(&job, t, lo, &c);
      sparse_table *st;
      ps_error err;
      if (sparse_table_create(&st, &c, &err) == PS_ERR_OK) {
        sparse_table_destroy(st);
        if (lo > limit) limit = lo;
        break;
      }
    }
  }
  reference ref;
  ref_init(&ref, limit);
  static rows keys[TRAINERS][2];
  for (int r = 0; r < TRAINERS; r++) batch_keys(r, 0, keys[r]);
  /* Which table fails first, as the pserver pulls them (wide, embedding). */
  ps_error err;
  static float out[2 * MAXK * DIM];
  static rows u[2];
  char name[32] = "";
  for (int t = 0; t < 2 && name[0] == '\0'; t++) {
    union_of(&keys[0][t], &keys[1][t], dim_of(t), &u[t]);
    if (sparse_table_pull(ref.t[t], u[t].keys, u[t].n, u[t].counts, 0, out, &err) != PS_ERR_OK) {
      snprintf(name, sizeof name, "'%s'", t == 0 ? "wide" : "embedding");
    }
  }
  REQUIRE(name[0] != '\0');
  pserver ps;
  pserver_config cfg = make_config();
  cfg.max_table_bytes = limit;
  start(&ps, &cfg);
  rpc_call *first = pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[0]);
  rpc_call *second = pull(&ps, 1, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[1]);
  reply got[2];
  result(first, &got[0]);
  result(second, &got[1]);
  for (int r = 0; r < TRAINERS; r++) {
    CHECK_EQ_INT(got[r].code, PS_ERR_RESOURCE_EXHAUSTED);
    if (strstr(got[r].msg, name) == NULL) fprintf(stderr, "no %s in: %s\n", name, got[r].msg);
    CHECK(strstr(got[r].msg, name) != NULL);
    reply_free(&got[r]);
  }
  stop(&ps);
  ref_free(&ref);
}

int main(void) {
  ps_error err;
  rpc_global_init();
  make_job(UPDATE_SYNC, 0);
  tensor_layout_init(&layout);
  REQUIRE(model_build_layout(&job.model, &layout, &err) == PS_ERR_OK);
  REQUIRE(shard_map_build(&map, &layout, job.block_size, PSERVERS, &err) == PS_ERR_OK);
  test_sync();
  test_admission();
  test_async();
  test_pull_barrier();
  test_lookup_and_all();
  test_pull_after_barrier();
  test_refusals();
  test_max_table();
  shard_map_free(&map);
  tensor_layout_free(&layout);
  rpc_global_shutdown();
  return check_report("test_pserver_sparse");
}
