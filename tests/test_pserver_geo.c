/* The pserver's GEO-SGD path (--update geo), driven through pserver_handle
 * on in-memory calls:
 * - dense: each trainer's change d is added as exactly w += d * (1/N), no
 *   optimizer (the job's Adam is never applied), and the reply holds the
 *   fresh weights; a resend of a step applied before changes nothing; the
 *   job's step counts merged trainer steps (a push covers at most K); a
 *   trainer registering again is told its last exchange's step;
 * - CTR: pushed rows' changes / N land on the rows (new rows from their
 *   initial values), the reply holds the fresh rows in the order sent, a
 *   push may carry more keys than one batch (up to K batches');
 * - refusals, each leaving the weights as they were: a gradient push
 *   (no deltas flag) in a geo job, a geo push in a sync job, a geo push
 *   carrying sparse_keys. */
#define _POSIX_C_SOURCE 200809L
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
#define K 10
#define MAXROWS 256
#define DIM 4
#define MAXDENSE 2048

static job_config job;
static tensor_layout layout;
static shard_map map;

/* A reply: code, message, step, dense params (flat) and rows per table. */
typedef struct reply {
  ps_err code;
  char msg[512];
  long step;
  float params[MAXDENSE];
  size_t values[2];
  float rows[2][MAXROWS * DIM];
} reply;

static void call(pserver *ps, int method, const rpc_part *parts, int count, reply *r) {
  rpc_call *c = testlib_handle(ps, method, parts, count, 1);
  REQUIRE(c != NULL);
  const rpc_local_result *res = rpc_call_local_result(c);
  REQUIRE(res->replies == 1);
  memset(r, 0, sizeof *r);
  r->code = res->code;
  snprintf(r->msg, sizeof r->msg, "%s", res->message);
  if (r->code == PS_ERR_OK && method != 0) {
    rpc_segment rs = {res->bytes, res->len};
    rpc_message m_reply = {&rs, 1, res->len};
    wire_block_ref refs[64];
    wire_blocks_msg m = {.blocks = refs, .block_cap = 64};
    ps_error err;
    REQUIRE(wire_parse_blocks(&m_reply, &m, &err) == PS_ERR_OK);
    r->step = (long)m.step;
    REQUIRE(layout.total <= MAXDENSE);
    for (size_t i = 0; i < m.block_count; i++) {
      wire_copy_block(&m_reply, &m.blocks[i], r->params + map.blocks[m.blocks[i].id].offset);
    }
    for (size_t i = 0; i < m.sparse_count; i++) {
      const wire_sparse_ref *s = &m.sparse[i];
      REQUIRE(s->field == WIRE_SPARSE_ROWS && s->table < 2 && s->values.len <= sizeof r->rows[0]);
      r->values[s->table] = s->values.len / 4;
      wire_copy_block(&m_reply, &s->values, r->rows[s->table]);
    }
  } else if (r->code == PS_ERR_OK) {
    Pstrain__RegisterReply *rr = pstrain__register_reply__unpack(NULL, res->len, res->bytes);
    REQUIRE(rr != NULL);
    r->step = (long)rr->step;
    pstrain__register_reply__free_unpacked(rr, NULL);
  }
  rpc_call_local_free(c);
}

/* Registers trainer with incarnation 100 + id + 1000 * again; the reply's step. */
static long do_register(pserver *ps, uint32_t trainer, int again) {
  uint8_t buf[TESTLIB_REGISTER_MAX];
  size_t len = testlib_register_bytes(&job, trainer, 100 + trainer + 1000 * (uint64_t)again,
                                      job_config_hash(&job), 0, buf, sizeof buf);
  REQUIRE(len > 0);
  reply r;
  call(ps, 0, &(rpc_part){buf, len, NULL}, 1, &r);
  CHECK_EQ_INT(r.code, PS_ERR_OK);
  return r.step;
}

/* Rows of a push: keys and values per table (NULL grads: none sent). */
typedef struct rows {
  uint64_t keys[MAXROWS];
  float values[MAXROWS * DIM];
  size_t n;
} rows;

/* A push of pserver 0's blocks of `dense`, flagged as deltas or not, with
 * sparse changes (may be NULL) and, to be refused, next keys. */
static void push(pserver *ps, uint32_t trainer, uint64_t incarnation, uint64_t step,
                 const float *dense, int deltas, const rows *grads, int with_keys, reply *r) {
  wire_writer w = {0};
  ps_error err;
  REQUIRE(wire_writer_begin(&w, map.block_count, &err) == PS_ERR_OK);
  wire_key key = {trainer, incarnation, step};
  wire_writer_push_header(&w, &key, job_config_hash(&job));
  if (deltas) wire_writer_deltas(&w);
  for (size_t i = 0; i < map.block_count; i++) {
    const shard_block *b = &map.blocks[i];
    if (b->pserver == 0) wire_writer_block(&w, b->id, dense + b->offset, b->count, NULL);
  }
  for (int t = 0; t < 2 && grads != NULL; t++) {
    size_t dim = t == CTR_TABLE_WIDE ? 1 : DIM;
    wire_writer_sparse(&w, WIRE_SPARSE_GRADS, (uint32_t)t, grads[t].keys, grads[t].n,
                       grads[t].values, grads[t].n * dim, NULL, NULL);
  }
  static const uint32_t one = 1;
  for (int t = 0; t < 2 && with_keys; t++) {
    wire_writer_sparse(&w, WIRE_SPARSE_KEYS, (uint32_t)t, grads[t].keys, 1, NULL, 0, &one, NULL);
  }
  REQUIRE(wire_writer_check(&w, &err) == PS_ERR_OK);
  call(ps, 1, w.parts, w.part_count, r);
  wire_writer_free(&w);
}

static void make_job(update_mode update, const char *model, int pservers) {
  ps_error err;
  job = (job_config){.update = update, .geo_steps = update == UPDATE_GEO ? K : 0,
                     .trainers = TRAINERS, .pservers = pservers, .block_size = 64, .seed = 3,
                     .batch = 2, .steps = 100};
  REQUIRE(model_parse(model, &job.model, &err) == PS_ERR_OK);
  job.optimizer = (optimizer_config){.kind = OPTIMIZER_ADAM, .lr = 0.1, .schedule = LR_CONSTANT,
                                     .step_size = 1, .gamma = 1, .total_steps = 100,
                                     .beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-8};
  sparse_optimizer_config so = {.kind = SPARSE_OPT_ADAGRAD, .lr = 0.1, .epsilon = 1e-8,
                                .initial_accumulator = 0.1};
  job.sparse = job_sparse_of(&so, 0, 0);
  tensor_layout_free(&layout);
  shard_map_free(&map);
  tensor_layout_init(&layout);
  REQUIRE(model_build_layout(&job.model, &layout, &err) == PS_ERR_OK);
  REQUIRE(shard_map_build(&map, &layout, job.block_size, pservers, &err) == PS_ERR_OK);
  REQUIRE(layout.total <= MAXDENSE);
}

static void start(pserver *ps, int pservers) {
  ps_error err;
  pserver_config cfg = {.id = 0, .pservers = pservers, .trainers = TRAINERS, .step_timeout = 60,
                        .max_shard_mb = 64, .max_blocks_per_request = 64};
  REQUIRE(pserver_init(ps, &cfg, &err) == PS_ERR_OK);
  for (uint32_t t = 0; t < TRAINERS; t++) CHECK_EQ_INT(do_register(ps, t, 0), 0);
}

static void stop(pserver *ps) {
  pserver_abort_waiting(ps, PS_ERR_UNAVAILABLE, "test over");
  pserver_destroy(ps);
}

/* A trainer's change: depends on trainer and step, some exact in float. */
static void change(float *d, size_t n, int trainer, int step) {
  for (size_t i = 0; i < n; i++) {
    d[i] = 0.01f * (float)((i * 7 + (size_t)(trainer * 3 + step)) % 13) - 0.06f;
  }
}

static void test_dense(void) {
  make_job(UPDATE_GEO, "mlp:12,8,3", 1);
  pserver ps;
  start(&ps, 1);
  size_t n = layout.total;
  float want[MAXDENSE], d[MAXDENSE];
  static reply r;
  model_init_params(&layout, job.seed, 0, n, want);
  const float scale = 1.0f / TRAINERS;
  /* Trainer 0 then 1 at step K, then trainer 0's last 3 steps. */
  const int who[3] = {0, 1, 0}, step[3] = {K, K, K + 3};
  const long version[3] = {K, 2 * K, 2 * K + 3};
  for (int k = 0; k < 3; k++) {
    change(d, n, who[k], step[k]);
    for (size_t i = 0; i < n; i++) want[i] += d[i] * scale;
    push(&ps, (uint32_t)who[k], 100 + (uint64_t)who[k], (uint64_t)step[k], d, 1, NULL, 0, &r);
    CHECK_EQ_INT(r.code, PS_ERR_OK);
    CHECK(memcmp(r.params, want, n * sizeof *want) == 0);
    CHECK_EQ_INT(r.step, version[k]);
  }
  /* A resend of an applied step is answered, not applied. */
  change(d, n, 1, 99);
  push(&ps, 1, 101, K, d, 1, NULL, 0, &r);
  CHECK_EQ_INT(r.code, PS_ERR_OK);
  CHECK(memcmp(r.params, want, n * sizeof *want) == 0);
  CHECK_EQ_INT(r.step, version[2]);
  /* Gradients (no deltas flag) in a geo job: refused, nothing applied. */
  push(&ps, 1, 101, 2 * K, d, 0, NULL, 0, &r);
  CHECK_EQ_INT(r.code, PS_ERR_FAILED_PRECONDITION);
  CHECK(strstr(r.msg, "update is geo: a push carries parameter changes (deltas)") != NULL);
  push(&ps, 1, 101, K, d, 1, NULL, 0, &r);
  CHECK(memcmp(r.params, want, n * sizeof *want) == 0);
  /* Trainer 1 again (a new process): it goes on from its last exchange. */
  CHECK_EQ_INT(do_register(&ps, 1, 1), (long)K * TRAINERS);
  stop(&ps);
}

/* A geo push to a sync job is refused; the weights stay initial. */
static void test_wrong_job(void) {
  make_job(UPDATE_SYNC, "mlp:12,8,3", 1);
  pserver ps;
  start(&ps, 1);
  float init[MAXDENSE], d[MAXDENSE];
  static reply r;
  model_init_params(&layout, job.seed, 0, layout.total, init);
  change(d, layout.total, 0, 1);
  push(&ps, 0, 100, 0, d, 1, NULL, 0, &r);
  CHECK_EQ_INT(r.code, PS_ERR_FAILED_PRECONDITION);
  CHECK(strstr(r.msg, "a push of GEO parameter changes (deltas) to a job whose update is sync") !=
        NULL);
  CHECK(memcmp(ps.store.dense.params, init, layout.total * sizeof *init) == 0);
  stop(&ps);
}

/* The i-th key pserver 0 of 2 owns at or after `from`. */
static uint64_t owned_key(uint64_t from, int i) {
  for (uint64_t k = from;; k++) {
    if (shard_of_key(k, 2) == 0 && i-- == 0) return k;
  }
}

static void test_ctr(void) {
  make_job(UPDATE_GEO, "ctr:4:8", 2);
  pserver ps;
  start(&ps, 2);
  sparse_table_config cfg[2];
  for (int t = 0; t < 2; t++) ctr_table_config(&job, t, 0, &cfg[t]);
  static rows g[2];
  static float want[2][MAXROWS * DIM];
  static reply r;
  static float dense[MAXDENSE], want_dense[MAXDENSE];
  model_init_params(&layout, job.seed, 0, layout.total, want_dense);
  /* More keys than a batch of 2 holds (52), fewer than K batches. */
  const size_t nkeys = 60;
  for (int k = 0; k < 2; k++) {
    for (int t = 0; t < 2; t++) {
      size_t dim = (size_t)cfg[t].dim;
      g[t].n = nkeys;
      for (size_t j = 0; j < nkeys; j++) {
        /* Trainer 1's keys overlap trainer 0's last half. */
        g[t].keys[j] = owned_key(1000, (int)(j + (size_t)k * nkeys / 2));
        for (size_t c = 0; c < dim; c++) {
          g[t].values[j * dim + c] = 0.125f * (float)((j + c + (size_t)k) % 5) - 0.25f;
        }
      }
    }
    if (k == 0) {
      /* sparse_keys in a geo push: refused, no row created. */
      push(&ps, 0, 100, K, want_dense, 1, g, 1, &r);
      CHECK_EQ_INT(r.code, PS_ERR_INVALID_ARGUMENT);
      CHECK(strstr(r.msg, "a geo push carries no sparse_keys") != NULL);
      sparse_table_stats st;
      sparse_table_stats_get(ps.store.tables[0], &st);
      CHECK_EQ_INT(st.rows, 0);
    }
    change(dense, layout.total, k, K);
    for (size_t i = 0; i < layout.total; i++) want_dense[i] += dense[i] * 0.5f;
    push(&ps, (uint32_t)k, 100 + (uint64_t)k, K, dense, 1, g, 0, &r);
    CHECK_EQ_INT(r.code, PS_ERR_OK);
    for (int t = 0; t < 2; t++) {
      size_t dim = (size_t)cfg[t].dim;
      CHECK_EQ_INT(r.values[t], nkeys * dim);
      for (size_t j = 0; j < nkeys; j++) {
        /* Expected: the row before (its initial value, or trainer 0's) plus change / 2. */
        float before[DIM];
        int seen = k == 1 && j < nkeys / 2;
        if (seen) memcpy(before, want[t] + (j + nkeys / 2) * dim, dim * sizeof(float));
        else sparse_table_init_row(&cfg[t], g[t].keys[j], before);
        for (size_t c = 0; c < dim; c++) {
          float expect = before[c] + g[t].values[j * dim + c] * 0.5f;
          if (r.rows[t][j * dim + c] != expect) {
            fprintf(stderr, "push %d table %d row %zu col %zu: %g, expected %g\n", k, t, j, c,
                    (double)r.rows[t][j * dim + c], (double)expect);
            check_failures++;
          }
        }
      }
      memcpy(want[t], r.rows[t], nkeys * dim * sizeof(float));
    }
    /* The dense blocks this pserver holds moved by change / 2, exactly. */
    for (size_t i = 0; i < map.block_count; i++) {
      const shard_block *b = &map.blocks[i];
      if (b->pserver != 0) continue;
      CHECK(memcmp(r.params + b->offset, want_dense + b->offset, b->count * sizeof(float)) == 0);
    }
  }
  sparse_table_stats st;
  sparse_table_stats_get(ps.store.tables[1], &st);
  CHECK_EQ_INT(st.rows, nkeys + nkeys / 2);
  stop(&ps);
}

int main(void) {
  rpc_global_init();
  tensor_layout_init(&layout);
  memset(&map, 0, sizeof map);
  test_dense();
  test_wrong_job();
  test_ctr();
  shard_map_free(&map);
  tensor_layout_free(&layout);
  rpc_global_shutdown();
  return check_report("test_pserver_geo");
}
