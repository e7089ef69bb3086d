/* Pserver checkpoints with sparse tables, in-process pservers:
 * - re-sharding: 2 pservers of a job (CTR with lazy Adam rows, LR with SGD
 *   rows, MLP) filled and checkpointed; 3 new pservers resume from their
 *   files: every key is in exactly one of them, owned by it, its row, state
 *   and meta equal the original's, the dense parameters and optimizer state
 *   (as one flat array) equal; then 3 -> 2 and 2 -> 1 from those files;
 * - the same count resumes the same rows;
 * - refusals: a missing old shard's file (named), another trainer count;
 * - rollback: rows and dense shard after a rollback equal the checkpoint's. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/job.h"
#include "common/log.h"
#include "common/rpc.h"
#include "server/pserver_internal.h"
#include "tests/check.h"

#define TRAINERS 2
#define KEYS 300
#define STEP 5
#define MAXP 3

static job_config job;
static size_t total; /* floats in the whole dense model */
static float *want[3]; /* the checkpointed params, state1, state2 (flat) */

/* One table's rows of all the original pservers, ascending keys. */
typedef struct rows_ref {
  size_t rows;
  int dim, sf;
  uint64_t *keys;
  float *values, *state;
  int64_t *meta;
} rows_ref;
static rows_ref ref[CTR_TABLES_MAX];

static void make_job(const char *model, sparse_optimizer_kind kind) {
  ps_error err;
  memset(&job, 0, sizeof job);
  job = (job_config){.update = UPDATE_SYNC, .trainers = TRAINERS, .pservers = 2,
                     .block_size = 16, .seed = 5, .batch = 8, .steps = 100};
  REQUIRE(model_parse(model, &job.model, &err) == PS_ERR_OK);
  job.optimizer = (optimizer_config){.kind = OPTIMIZER_ADAM, .lr = 0.01, .schedule = LR_CONSTANT,
                                     .step_size = 1, .gamma = 1, .total_steps = 100,
                                     .beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-8};
  if (model_is_ctr(&job.model)) {
    sparse_optimizer_config so = {.kind = kind, .lr = 0.05, .epsilon = 1e-8,
                                  .initial_accumulator = 0.1, .beta1 = 0.9, .beta2 = 0.999};
    job.sparse = job_sparse_of(&so, 0, 0);
  }
}

static void make_dir(char *dir) { REQUIRE(mkdtemp(dir) != NULL); }

static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  REQUIRE(d != NULL);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    REQUIRE(unlink(path) == 0);
  }
  closedir(d);
  REQUIRE(rmdir(dir) == 0);
}

/* Copies the files of `count` pservers from one folder to another. */
static void copy_files(const char *from, const char *to, int count) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "-of-%d-step-", count);
  DIR *d = opendir(from);
  REQUIRE(d != NULL);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strstr(e->d_name, prefix) == NULL) continue;
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s/%s", from, e->d_name);
    snprintf(dst, sizeof dst, "%s/%s", to, e->d_name);
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    REQUIRE(in != NULL && out != NULL);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) REQUIRE(fwrite(buf, 1, n, out) == n);
    REQUIRE(fclose(in) == 0 && fclose(out) == 0);
  }
  closedir(d);
}

static void start(pserver *ps, int id, int count, const char *dir) {
  ps_error err;
  pserver_config cfg = {.id = id, .pservers = count, .trainers = TRAINERS, .step_timeout = 60,
                        .max_shard_mb = 64, .checkpoint_dir = dir};
  REQUIRE(pserver_init(ps, &cfg, &err) == PS_ERR_OK);
}

static void stop(pserver *ps) {
  pserver_abort_waiting(ps, PS_ERR_UNAVAILABLE, "test over");
  pserver_destroy(ps);
}

static uint64_t key_of(int i) { return (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ULL; }

/* Training-like traffic on pserver id's rows at `step`: pulls of the keys
 * it owns among [from, to), then a push of gradients of every second one. */
static void touch_rows(pserver *ps, int from, int to, long step) {
  ps_error err;
  uint64_t keys[2 * KEYS];
  float *rows = malloc((size_t)2 * KEYS * 64 * sizeof *rows);
  REQUIRE(rows != NULL);
  for (int t = 0; t < ps->store.table_count; t++) {
    size_t n = 0;
    for (int i = from; i < to; i++) {
      if (shard_of_key(key_of(i), ps->cfg.pservers) == ps->cfg.id) keys[n++] = key_of(i);
    }
    REQUIRE(sparse_table_pull(ps->store.tables[t], keys, n, NULL, step, rows, &err) == PS_ERR_OK);
    int dim = sparse_table_config_of(ps->store.tables[t])->dim;
    size_t half = 0;
    for (size_t i = 0; i < n; i += 2) {
      keys[half] = keys[i];
      for (int d = 0; d < dim; d++) rows[half * (size_t)dim + (size_t)d] = 0.01f * (float)(i % 7 + d) - 0.02f;
      half++;
    }
    REQUIRE(sparse_table_push(ps->store.tables[t], keys, half, rows, step, &err) == PS_ERR_OK);
  }
  free(rows);
}

static void dump(const sparse_table *t, rows_ref *r) {
  ps_error err;
  sparse_table_stats st;
  sparse_table_stats_get(t, &st);
  const sparse_table_config *c = sparse_table_config_of(t);
  r->rows = st.rows;
  r->dim = c->dim;
  r->sf = sparse_table_state_floats(c);
  size_t n = st.rows + 1;
  r->keys = malloc(n * sizeof *r->keys);
  r->values = malloc(n * (size_t)r->dim * sizeof *r->values);
  r->state = malloc(n * (size_t)(r->sf + 1) * sizeof *r->state);
  r->meta = malloc(n * 2 * sizeof *r->meta);
  REQUIRE(r->keys && r->values && r->state && r->meta);
  REQUIRE(sparse_table_dump(t, r->keys, r->values, r->sf > 0 ? r->state : NULL, r->meta, &err) ==
          PS_ERR_OK);
}

static void rows_free(rows_ref *r) {
  free(r->keys);
  free(r->values);
  free(r->state);
  free(r->meta);
  memset(r, 0, sizeof *r);
}

/* Appends b's rows to a (the reference gathers all pservers' rows). */
static void rows_append(rows_ref *a, const rows_ref *b) {
  size_t n = a->rows + b->rows + 1;
  a->dim = b->dim;
  a->sf = b->sf;
  REQUIRE((a->keys = realloc(a->keys, n * sizeof *a->keys)) != NULL);
  REQUIRE((a->values = realloc(a->values, n * (size_t)a->dim * sizeof *a->values)) != NULL);
  REQUIRE((a->state = realloc(a->state, n * (size_t)(a->sf + 1) * sizeof *a->state)) != NULL);
  REQUIRE((a->meta = realloc(a->meta, n * 2 * sizeof *a->meta)) != NULL);
  memcpy(a->keys + a->rows, b->keys, b->rows * sizeof *a->keys);
  memcpy(a->values + a->rows * (size_t)a->dim, b->values, b->rows * (size_t)a->dim * sizeof(float));
  memcpy(a->state + a->rows * (size_t)a->sf, b->state, b->rows * (size_t)a->sf * sizeof(float));
  memcpy(a->meta + a->rows * 2, b->meta, b->rows * 2 * sizeof *a->meta);
  a->rows += b->rows;
}

/* Index of key in r, or -1. */
static long find_key(const rows_ref *r, uint64_t key) {
  for (size_t i = 0; i < r->rows; i++) {
    if (r->keys[i] == key) return (long)i;
  }
  return -1;
}

/* Fills `count` fresh pservers (rows and dense state), checkpoints them at
 * STEP in dir and records the reference; they stay up for the caller. */
static void fill_and_checkpoint(pserver *ps, int count, const char *dir) {
  ps_error err;
  tensor_layout layout;
  tensor_layout_init(&layout);
  REQUIRE(model_build_layout(&job.model, &layout, &err) == PS_ERR_OK);
  total = layout.total;
  tensor_layout_free(&layout);
  for (int j = 0; j < 3; j++) {
    REQUIRE((want[j] = malloc(total * sizeof(float))) != NULL);
    for (size_t i = 0; i < total; i++) want[j][i] = (float)j + 0.001f * (float)(i % 997);
  }
  for (int p = 0; p < count; p++) {
    start(&ps[p], p, count, dir);
    pthread_mutex_lock(&ps[p].lock);
    REQUIRE(pserver_configure(&ps[p], &job, 0, &err) == PS_ERR_OK);
    dense_shard *t = &ps[p].store.dense;
    shard_map_gather(&t->map, p, want[0], t->params);
    shard_map_gather(&t->map, p, want[1], t->state1);
    shard_map_gather(&t->map, p, want[2], t->state2);
    touch_rows(&ps[p], 0, KEYS, 2);
    touch_rows(&ps[p], KEYS / 3, KEYS, 3);
    ps[p].updates = STEP;
    for (int i = 0; i < ps[p].store.table_count; i++) {
      rows_ref r;
      dump(ps[p].store.tables[i], &r);
      CHECK(r.rows > 0);
      rows_append(&ref[i], &r);
      rows_free(&r);
    }
    pthread_mutex_unlock(&ps[p].lock);
    CHECK_EQ_INT(pserver_checkpoint(&ps[p], &err), PS_ERR_OK);
  }
}

/* The `count` resumed pservers hold the reference exactly once. */
static void check_resumed(pserver *ps, int count) {
  job_config resumed = job;
  resumed.pservers = count;
  float *flat[3];
  for (int j = 0; j < 3; j++) REQUIRE((flat[j] = calloc(total, sizeof(float))) != NULL);
  size_t rows[CTR_TABLES_MAX] = {0};
  for (int p = 0; p < count; p++) {
    CHECK(ps[p].configured);
    CHECK_EQ_INT(ps[p].updates, STEP);
    CHECK_EQ_INT(ps[p].job.pservers, count);
    CHECK(ps[p].job_hash == job_config_hash(&resumed));
    dense_shard *t = &ps[p].store.dense;
    shard_map_scatter(&t->map, p, t->params, flat[0]);
    shard_map_scatter(&t->map, p, t->state1, flat[1]);
    shard_map_scatter(&t->map, p, t->state2, flat[2]);
    for (int i = 0; i < ps[p].store.table_count; i++) {
      rows_ref got;
      dump(ps[p].store.tables[i], &got);
      rows[i] += got.rows;
      int dim = got.dim, sf = got.sf;
      for (size_t r = 0; r < got.rows; r++) {
        CHECK_EQ_INT(shard_of_key(got.keys[r], count), p);
        long at = find_key(&ref[i], got.keys[r]);
        CHECK(at >= 0);
        if (at < 0) continue;
        CHECK(memcmp(got.values + r * (size_t)dim, ref[i].values + (size_t)at * (size_t)dim,
                     (size_t)dim * sizeof(float)) == 0);
        CHECK(memcmp(got.state + r * (size_t)sf, ref[i].state + (size_t)at * (size_t)sf,
                     (size_t)sf * sizeof(float)) == 0);
        CHECK(got.meta[2 * r] == ref[i].meta[2 * at] &&
              got.meta[2 * r + 1] == ref[i].meta[2 * at + 1]);
      }
      rows_free(&got);
    }
  }
  /* Each resumed key owned by its pserver and found in the reference, as
   * many rows as the reference: every key exactly once. */
  for (int i = 0; i < ps[0].store.table_count; i++) CHECK_EQ_INT((long)rows[i], (long)ref[i].rows);
  for (int j = 0; j < 3; j++) {
    CHECK(memcmp(flat[j], want[j], total * sizeof(float)) == 0);
    free(flat[j]);
  }
}

/* Resumes `count` pservers from dir and checks them against the reference. */
static void resume_and_check(const char *dir, int count) {
  pserver ps[MAXP];
  ps_error err;
  for (int p = 0; p < count; p++) {
    start(&ps[p], p, count, dir);
    ps_err rc = pserver_resume(&ps[p], -1, &err);
    CHECK_EQ_INT(rc, PS_ERR_OK);
    if (rc != PS_ERR_OK) fprintf(stderr, "resume: %s\n", err.msg);
  }
  check_resumed(ps, count);
  for (int p = 0; p < count; p++) stop(&ps[p]);
}

/* A rollback of pserver 0 to STEP after more traffic restores its rows. */
static void check_rollback(pserver *ps) {
  pthread_mutex_lock(&ps->lock);
  rows_ref before[CTR_TABLES_MAX];
  for (int i = 0; i < ps->store.table_count; i++) dump(ps->store.tables[i], &before[i]);
  touch_rows(ps, 0, KEYS, STEP);
  touch_rows(ps, KEYS / 2, KEYS + KEYS / 2, STEP + 1); /* new rows too */
  for (size_t i = 0; i < ps->store.dense.n; i++) ps->store.dense.params[i] += 1.0f;
  ps->updates = STEP + 2;
  pthread_mutex_unlock(&ps->lock);
  rpc_call *call = rpc_call_local_create("rollback");
  REQUIRE(call != NULL);
  pthread_mutex_lock(&ps->lock);
  pserver_rollback_queue(ps, call, STEP, 0, 1, 0);
  pthread_mutex_unlock(&ps->lock);
  pserver_checkpoint_wait(ps);
  const rpc_local_result *r = rpc_call_local_result(call);
  CHECK_EQ_INT(r->replies, 1);
  CHECK_EQ_INT(r->code, PS_ERR_OK);
  rpc_call_local_free(call);
  pthread_mutex_lock(&ps->lock);
  CHECK_EQ_INT(ps->updates, STEP);
  float *mine = malloc((ps->store.dense.n + 1) * sizeof(float));
  REQUIRE(mine != NULL);
  shard_map_gather(&ps->store.dense.map, 0, want[0], mine);
  CHECK(memcmp(mine, ps->store.dense.params, ps->store.dense.n * sizeof(float)) == 0);
  free(mine);
  for (int i = 0; i < ps->store.table_count; i++) {
    rows_ref after;
    dump(ps->store.tables[i], &after);
    CHECK_EQ_INT((long)after.rows, (long)before[i].rows);
    CHECK(after.rows == before[i].rows &&
          memcmp(after.keys, before[i].keys, after.rows * sizeof *after.keys) == 0 &&
          memcmp(after.values, before[i].values, after.rows * (size_t)after.dim * sizeof(float)) == 0 &&
          memcmp(after.state, before[i].state, after.rows * (size_t)after.sf * sizeof(float)) == 0 &&
          memcmp(after.meta, before[i].meta, after.rows * 2 * sizeof *after.meta) == 0);
    rows_free(&after);
    rows_free(&before[i]);
  }
  /* The pserver serves on with the loaded tables; two more checkpoints
   * (the copies' buffers come and go), the newest resumed as it was. */
  touch_rows(ps, 0, KEYS, STEP);
  ps->updates = STEP + 1;
  pthread_mutex_unlock(&ps->lock);
  ps_error err;
  CHECK_EQ_INT(pserver_checkpoint(ps, &err), PS_ERR_OK);
  pthread_mutex_lock(&ps->lock);
  touch_rows(ps, KEYS, 2 * KEYS, STEP + 1);
  ps->updates = STEP + 2;
  for (int i = 0; i < ps->store.table_count; i++) dump(ps->store.tables[i], &before[i]);
  pthread_mutex_unlock(&ps->lock);
  CHECK_EQ_INT(pserver_checkpoint(ps, &err), PS_ERR_OK);
  pserver again;
  start(&again, 0, 2, ps->cfg.checkpoint_dir);
  CHECK_EQ_INT(pserver_resume(&again, -1, &err), PS_ERR_OK);
  CHECK_EQ_INT(again.updates, STEP + 2);
  CHECK(again.configured && memcmp(again.store.dense.params, ps->store.dense.params,
                                   ps->store.dense.n * sizeof(float)) == 0);
  for (int i = 0; again.configured && i < ps->store.table_count; i++) {
    rows_ref got;
    dump(again.store.tables[i], &got);
    CHECK(got.rows == before[i].rows &&
          memcmp(got.keys, before[i].keys, got.rows * sizeof *got.keys) == 0 &&
          memcmp(got.values, before[i].values, got.rows * (size_t)got.dim * sizeof(float)) == 0 &&
          memcmp(got.meta, before[i].meta, got.rows * 2 * sizeof *got.meta) == 0);
    rows_free(&got);
    rows_free(&before[i]);
  }
  stop(&again);
}

static void test_reshard(const char *model, sparse_optimizer_kind kind) {
  fprintf(stderr, "--- %s\n", model);
  make_job(model, kind);
  char a[] = "/tmp/pstrain-test-reshard-a-XXXXXX", b[] = "/tmp/pstrain-test-reshard-b-XXXXXX";
  char c[] = "/tmp/pstrain-test-reshard-c-XXXXXX", d[] = "/tmp/pstrain-test-reshard-d-XXXXXX";
  make_dir(a);
  make_dir(b);
  make_dir(c);
  make_dir(d);
  pserver old[2];
  fill_and_checkpoint(old, 2, a);

  /* The same count resumes its own files. */
  resume_and_check(a, 2);
  /* 2 -> 3, each new pserver writing its own file of STEP into a. */
  resume_and_check(a, 3);
  /* 3 -> 2 from those files alone; 2 -> 1 from the originals. */
  copy_files(a, b, 3);
  resume_and_check(b, 2);
  copy_files(a, c, 2);
  resume_and_check(c, 1);

  /* Refusals: shard 1 of 2 missing (named); another trainer count. */
  char path[512], old0[512];
  snprintf(old0, sizeof old0, "%s/pserver-0-of-2-step-%09d.safetensors", a, STEP);
  snprintf(path, sizeof path, "%s/pserver-0-of-2-step-%09d.safetensors", d, STEP);
  REQUIRE(link(old0, path) == 0);
  pserver ps;
  ps_error err;
  start(&ps, 0, 3, d);
  CHECK_EQ_INT(pserver_resume(&ps, -1, &err), PS_ERR_IO);
  CHECK_CONTAINS(err.msg, "pserver-1-of-2-step-000000005.safetensors");
  CHECK(!ps.configured);
  stop(&ps);
  snprintf(old0, sizeof old0, "%s/pserver-1-of-2-step-%09d.safetensors", a, STEP);
  snprintf(path, sizeof path, "%s/pserver-1-of-2-step-%09d.safetensors", d, STEP);
  REQUIRE(link(old0, path) == 0);
  pserver_config cfg = {.id = 0, .pservers = 3, .trainers = TRAINERS + 1, .step_timeout = 60,
                        .max_shard_mb = 64, .checkpoint_dir = d};
  REQUIRE(pserver_init(&ps, &cfg, &err) == PS_ERR_OK);
  CHECK_EQ_INT(pserver_resume(&ps, -1, &err), PS_ERR_FAILED_PRECONDITION);
  CHECK_CONTAINS(err.msg, "trainers");
  CHECK(!ps.configured);
  stop(&ps);

  check_rollback(&old[0]);
  for (int p = 0; p < 2; p++) stop(&old[p]);
  for (int i = 0; i < CTR_TABLES_MAX; i++) rows_free(&ref[i]);
  for (int j = 0; j < 3; j++) free(want[j]);
  remove_dir(a);
  remove_dir(b);
  remove_dir(c);
  remove_dir(d);
}

int main(void) {
  rpc_global_init();
  log_set_level(LOG_LEVEL_WARN);
  test_reshard("ctr:4:8", SPARSE_OPT_ADAM);
  test_reshard("lr", SPARSE_OPT_SGD);
  test_reshard("mlp:12,8,3", SPARSE_OPT_ADAGRAD);
  rpc_global_shutdown();
  return check_report("test_pserver_reshard");
}
