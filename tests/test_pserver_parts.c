/* The sync step in parts (server/mode/sync_dense.c), driven through
 * pserver_handle on in-memory calls that the pserver may hold:
 * - trainers pushing a step's blocks in parts, in any order, one of them
 *   pushing all at once, give parameters bitwise equal to whole pushes;
 * - a part is answered only when every trainer's blocks of it are applied,
 *   with exactly its blocks and the step after;
 * - a part resent while held supersedes the first (ABORTED); one resent
 *   after it was applied is answered at once and its data ignored;
 * - an empty push, a repeated block, a foreign block are refused and change
 *   nothing; async jobs refuse parts;
 * - a pserver stopped with a step half applied leaves its last checkpoint
 *   as it was (else --resume would apply those blocks twice). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "common/job.h"
#include "common/wire.h"
#include "server/pserver.h"
#include "tests/check.h"
#include "tests/pserver_testlib.h"

#define TRAINERS 2
#define STEPS 4

static job_config job;
static tensor_layout layout;
static shard_map map;
static size_t n;

/* A held push: its call (freed by finish()); its bytes are freed once the
 * handler returns, as the RPC server frees a body. */
typedef struct held {
  rpc_call *call;
} held;

/* Flat range of layer l (1-based): its weight and bias. */
static void layer_range(int l, size_t *lo, size_t *hi) {
  const tensor_info *w = &layout.tensors[2 * (l - 1)], *b = &layout.tensors[2 * (l - 1) + 1];
  *lo = w->offset;
  *hi = b->offset + b->count;
}

/* Sends trainer's blocks with offsets in [lo, hi) of step (extra: one more
 * block id appended, for refusals; UINT32_MAX none); returns the held call. */
static held send_part(pserver *ps, uint32_t trainer, uint64_t step, const float *grads,
                      size_t lo, size_t hi, uint32_t extra) {
  wire_writer w = {0};
  ps_error err;
  REQUIRE(wire_writer_begin(&w, map.block_count + 1, &err) == PS_ERR_OK);
  wire_key key = {trainer, 100 + trainer, step};
  wire_writer_push_header(&w, &key, job_config_hash(&job));
  for (size_t i = 0; i < map.block_count; i++) {
    const shard_block *b = &map.blocks[i];
    if (b->pserver != 0 || b->offset < lo || b->offset >= hi) continue;
    wire_writer_block(&w, b->id, grads + b->offset, b->count, NULL);
  }
  if (extra != UINT32_MAX && extra < map.block_count) {
    wire_writer_block(&w, extra, grads + map.blocks[extra].offset, map.blocks[extra].count, NULL);
  } else if (extra != UINT32_MAX) {
    wire_writer_block(&w, extra, grads, 1, NULL); /* an id no pserver holds */
  }
  REQUIRE(wire_writer_check(&w, &err) == PS_ERR_OK);
  held h = {testlib_handle(ps, 1, w.parts, w.part_count, 1)};
  REQUIRE(h.call != NULL);
  wire_writer_free(&w);
  return h;
}

static int answered(const held *h) { return rpc_call_local_result(h->call)->replies == 1; }

/* Checks h's reply: code; when OK, exactly the blocks of pserver 0 in [lo,
 * hi), at want_step, copied into params. Frees h. */
#define finish(...) finish_at(__LINE__, __VA_ARGS__)
static void finish_at(int line, held *h, ps_err code, uint64_t want_step, size_t lo, size_t hi,
                      float *params) {
  const rpc_local_result *r = rpc_call_local_result(h->call);
  if (r->replies != 1 || r->code != code) {
    fprintf(stderr, "line %d: %d replies, code %d (want %d): %s\n", line, r->replies, r->code,
            code, r->message);
  }
  CHECK_EQ_INT(r->replies, 1);
  CHECK_EQ_INT(r->code, code);
  if (r->replies == 1 && r->code == PS_ERR_OK && code == PS_ERR_OK) {
    rpc_segment rs = {r->bytes, r->len};
    rpc_message reply = {&rs, 1, r->len};
    wire_block_ref refs[64];
    wire_blocks_msg m = {.blocks = refs, .block_cap = 64};
    ps_error err;
    REQUIRE(wire_parse_blocks(&reply, &m, &err) == PS_ERR_OK);
    CHECK_EQ_INT((long)m.step, (long)want_step);
    size_t want = 0;
    for (size_t i = 0; i < map.block_count; i++) {
      want += map.blocks[i].pserver == 0 && map.blocks[i].offset >= lo && map.blocks[i].offset < hi;
    }
    CHECK_EQ_INT((long)m.block_count, (long)want);
    for (size_t i = 0; i < m.block_count; i++) {
      const shard_block *b = &map.blocks[m.blocks[i].id];
      CHECK(b->offset >= lo && b->offset < hi);
      if (params != NULL) wire_copy_block(&reply, &m.blocks[i], params + b->offset);
    }
  }
  rpc_call_local_free(h->call);
}

static void do_register(pserver *ps, uint32_t trainer) {
  uint8_t buf[TESTLIB_REGISTER_MAX];
  size_t len = testlib_register_bytes(&job, trainer, 100 + trainer, job_config_hash(&job), 0, buf,
                                      sizeof buf);
  REQUIRE(len > 0);
  rpc_call *call = testlib_handle(ps, 0, &(rpc_part){buf, len, NULL}, 1, 1);
  REQUIRE(call != NULL);
  CHECK_EQ_INT(rpc_call_local_result(call)->code, PS_ERR_OK);
  rpc_call_local_free(call);
}

static void start_in(pserver *ps, update_mode update, const char *checkpoint_dir) {
  ps_error err;
  job.update = update;
  pserver_config cfg = {.id = 0, .pservers = 1, .trainers = TRAINERS, .step_timeout = 60,
                        .max_shard_mb = 64, .max_blocks_per_request = 64,
                        .checkpoint_dir = checkpoint_dir};
  REQUIRE(pserver_init(ps, &cfg, &err) == PS_ERR_OK);
  for (uint32_t t = 0; t < TRAINERS; t++) do_register(ps, t);
}

static void start(pserver *ps, update_mode update) { start_in(ps, update, ""); }

static void stop(pserver *ps) {
  pserver_abort_waiting(ps, PS_ERR_UNAVAILABLE, "test over");
  pserver_destroy(ps);
}

/* Trainer t's gradient of step s: different per trainer, step and element. */
static void gradient(float *g, uint32_t t, uint64_t s) {
  for (size_t i = 0; i < n; i++) g[i] = 0.01f * (float)((i * 7 + t * 5 + s * 3) % 13) - 0.06f;
}

/* The parameters after each step with whole pushes (today's step). */
static void reference(float *after) {
  pserver ps;
  start(&ps, UPDATE_SYNC);
  float *g = malloc(n * sizeof *g);
  REQUIRE(g != NULL);
  for (uint64_t s = 0; s < STEPS; s++) {
    gradient(g, 1, s);
    held h1 = send_part(&ps, 1, s, g, 0, n, UINT32_MAX);
    CHECK(!answered(&h1));
    gradient(g, 0, s);
    held h0 = send_part(&ps, 0, s, g, 0, n, UINT32_MAX);
    finish(&h1, PS_ERR_OK, s + 1, 0, n, NULL);
    finish(&h0, PS_ERR_OK, s + 1, 0, n, after + s * n);
  }
  free(g);
  stop(&ps);
}

/* Parts in both trainers' orders, a whole push among them, resends. */
static void test_parts_equal_whole(const float *want) {
  pserver ps;
  start(&ps, UPDATE_SYNC);
  float *g0 = malloc(n * sizeof *g0), *g1 = malloc(n * sizeof *g1);
  float *got = malloc(n * sizeof *got), *junk = malloc(n * sizeof *junk);
  REQUIRE(g0 && g1 && got && junk);
  for (size_t i = 0; i < n; i++) junk[i] = 1000.0f;
  size_t lo[4], hi[4];
  for (int l = 1; l <= 3; l++) layer_range(l, &lo[l], &hi[l]);
  for (uint64_t s = 0; s < STEPS; s++) {
    gradient(g0, 0, s);
    gradient(g1, 1, s);
    memset(got, 0, n * sizeof *got);
    /* Trainer 0: last layer first, as backward produces them. */
    held a3 = send_part(&ps, 0, s, g0, lo[3], hi[3], UINT32_MAX);
    held a2 = send_part(&ps, 0, s, g0, lo[2], hi[2], UINT32_MAX);
    CHECK(!answered(&a3) && !answered(&a2));
    if (s == 1) {
      /* Trainer 1 all at once: each of trainer 0's parts completes as it comes. */
      held b = send_part(&ps, 1, s, g1, 0, n, UINT32_MAX);
      finish(&a3, PS_ERR_OK, s + 1, lo[3], hi[3], got);
      finish(&a2, PS_ERR_OK, s + 1, lo[2], hi[2], got);
      CHECK(!answered(&b));
      held a1 = send_part(&ps, 0, s, g0, lo[1], hi[1], UINT32_MAX);
      finish(&a1, PS_ERR_OK, s + 1, lo[1], hi[1], got);
      finish(&b, PS_ERR_OK, s + 1, 0, n, NULL);
    } else if (s == 2) {
      /* Trainer 0 all three layers held; trainer 1's layer 3 answers the
       * oldest held call first, then layer 1 and 2 (held calls answered out
       * of arrival order, the pool compacted under the rest). */
      held a1 = send_part(&ps, 0, s, g0, lo[1], hi[1], UINT32_MAX);
      held b3 = send_part(&ps, 1, s, g1, lo[3], hi[3], UINT32_MAX);
      finish(&a3, PS_ERR_OK, s + 1, lo[3], hi[3], got);
      finish(&b3, PS_ERR_OK, s + 1, lo[3], hi[3], NULL);
      held b1 = send_part(&ps, 1, s, g1, lo[1], hi[1], UINT32_MAX);
      finish(&a1, PS_ERR_OK, s + 1, lo[1], hi[1], got);
      finish(&b1, PS_ERR_OK, s + 1, lo[1], hi[1], NULL);
      CHECK(!answered(&a2));
      held b2 = send_part(&ps, 1, s, g1, lo[2], hi[2], UINT32_MAX);
      finish(&a2, PS_ERR_OK, s + 1, lo[2], hi[2], got);
      finish(&b2, PS_ERR_OK, s + 1, lo[2], hi[2], NULL);
    } else {
      /* Trainer 0's layer 1, resent while held (junk data, ignored): the
       * first is superseded. */
      held a1 = send_part(&ps, 0, s, g0, lo[1], hi[1], UINT32_MAX);
      held a1_again = send_part(&ps, 0, s, junk, lo[1], hi[1], UINT32_MAX);
      finish(&a1, PS_ERR_ABORTED, 0, 0, 0, NULL);
      CHECK(!answered(&a1_again));
      /* Trainer 1 out of order: layer 1 (answering trainer 0's), then 3,
       * layer 3 resent after it was applied (junk, answered at once), then
       * 2 (completing the step). */
      held b1 = send_part(&ps, 1, s, g1, lo[1], hi[1], UINT32_MAX);
      finish(&a1_again, PS_ERR_OK, s + 1, lo[1], hi[1], got);
      finish(&b1, PS_ERR_OK, s + 1, lo[1], hi[1], NULL);
      CHECK(!answered(&a3));
      held b3 = send_part(&ps, 1, s, g1, lo[3], hi[3], UINT32_MAX);
      finish(&a3, PS_ERR_OK, s + 1, lo[3], hi[3], got);
      finish(&b3, PS_ERR_OK, s + 1, lo[3], hi[3], NULL);
      held again = send_part(&ps, 1, s, junk, lo[3], hi[3], UINT32_MAX);
      finish(&again, PS_ERR_OK, s + 1, lo[3], hi[3], NULL);
      CHECK(!answered(&a2));
      held b2 = send_part(&ps, 1, s, g1, lo[2], hi[2], UINT32_MAX);
      finish(&a2, PS_ERR_OK, s + 1, lo[2], hi[2], got);
      finish(&b2, PS_ERR_OK, s + 1, lo[2], hi[2], NULL);
    }
    CHECK(memcmp(got, want + s * n, n * sizeof *got) == 0);
    CHECK_EQ_INT(pserver_version(&ps), (long)s + 1);
  }
  free(g0);
  free(g1);
  free(got);
  free(junk);
  stop(&ps);
}

/* Bad parts are refused and change nothing; async refuses parts. */
static void test_refusals(void) {
  pserver ps;
  start(&ps, UPDATE_SYNC);
  float *g = malloc(n * sizeof *g), *before = malloc(n * sizeof *before);
  REQUIRE(g && before);
  gradient(g, 0, 0);
  size_t lo, hi;
  layer_range(2, &lo, &hi);
  pthread_mutex_lock(&ps.lock);
  memcpy(before, ps.store.dense.params, n * sizeof *before);
  pthread_mutex_unlock(&ps.lock);
  held empty = send_part(&ps, 0, 0, g, 0, 0, UINT32_MAX);
  finish(&empty, PS_ERR_INVALID_ARGUMENT, 0, 0, 0, NULL);
  /* Layer 2's first block again: repeated. */
  uint32_t first2 = 0;
  while (map.blocks[first2].offset < lo) first2++;
  held twice = send_part(&ps, 0, 0, g, lo, hi, first2);
  finish(&twice, PS_ERR_INVALID_ARGUMENT, 0, 0, 0, NULL);
  /* A block this pserver does not hold. */
  held foreign = send_part(&ps, 0, 0, g, lo, hi, (uint32_t)map.block_count);
  finish(&foreign, PS_ERR_INVALID_ARGUMENT, 0, 0, 0, NULL);
  /* None of them stored: trainer 1's whole push waits for all of trainer 0's. */
  held whole = send_part(&ps, 1, 0, g, 0, n, UINT32_MAX);
  held good = send_part(&ps, 0, 0, g, lo, hi, UINT32_MAX);
  CHECK(!answered(&whole));
  finish(&good, PS_ERR_OK, 1, lo, hi, NULL); /* layer 2 complete */
  pthread_mutex_lock(&ps.lock);
  CHECK_EQ_INT(ps.updates, 0);
  CHECK(memcmp(before, ps.store.dense.params, map.blocks[first2].shard_offset * sizeof *before) == 0);
  CHECK(memcmp(before, ps.store.dense.params, n * sizeof *before) != 0);
  pthread_mutex_unlock(&ps.lock);
  stop(&ps);
  finish(&whole, PS_ERR_UNAVAILABLE, 0, 0, 0, NULL);

  start(&ps, UPDATE_ASYNC);
  held part = send_part(&ps, 0, 0, g, lo, hi, UINT32_MAX);
  finish(&part, PS_ERR_INVALID_ARGUMENT, 0, 0, 0, NULL);
  pthread_mutex_lock(&ps.lock);
  CHECK_EQ_INT(ps.updates, 0);
  pthread_mutex_unlock(&ps.lock);
  stop(&ps);
  free(g);
  free(before);
}

/* The bytes of a file, or NULL when it cannot be read; *len its size. */
static unsigned char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  unsigned char *buf = NULL;
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && (buf = malloc((size_t)st.st_size + 1)) != NULL) {
    *len = fread(buf, 1, (size_t)st.st_size, f);
  }
  fclose(f);
  return buf;
}

/* --overlap's step cut off by a stop after one layer was applied: the
 * final checkpoint is not written, step 0's file stays as it was. */
static void test_stop_half_applied(void) {
  char dir[] = "/tmp/test_pserver_parts.XXXXXX";
  REQUIRE(mkdtemp(dir) != NULL);
  pserver ps;
  ps_error err;
  start_in(&ps, UPDATE_SYNC, dir);
  CHECK_EQ_INT(pserver_checkpoint(&ps, &err), PS_ERR_OK);
  char path[512];
  pserver_checkpoint_path(&ps, 0, path, sizeof path);
  size_t before_len = 0, after_len = 0;
  unsigned char *before = read_all(path, &before_len);
  REQUIRE(before != NULL);
  float *g = malloc(n * sizeof *g), *got = malloc(n * sizeof *got);
  REQUIRE(g != NULL && got != NULL);
  size_t lo, hi;
  layer_range(3, &lo, &hi);
  gradient(g, 0, 0);
  held a3 = send_part(&ps, 0, 0, g, lo, hi, UINT32_MAX);
  held b3 = send_part(&ps, 1, 0, g, lo, hi, UINT32_MAX);
  finish(&a3, PS_ERR_OK, 1, lo, hi, got);
  finish(&b3, PS_ERR_OK, 1, lo, hi, NULL);
  CHECK_EQ_INT(pserver_version(&ps), 0);
  pserver_abort_waiting(&ps, PS_ERR_UNAVAILABLE, "stopping");
  CHECK_EQ_INT(pserver_checkpoint(&ps, &err), PS_ERR_OK);
  unsigned char *after = read_all(path, &after_len);
  REQUIRE(after != NULL);
  CHECK(before_len == after_len && memcmp(before, after, before_len) == 0);
  free(before);
  free(after);
  free(g);
  free(got);
  stop(&ps);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK_EQ_INT(system(cmd), 0);
}

int main(void) {
  ps_error err;
  rpc_global_init();
  job = (job_config){.update = UPDATE_SYNC, .trainers = TRAINERS, .pservers = 1,
                     .block_size = 64, .seed = 3, .batch = 8, .steps = 10};
  REQUIRE(model_parse("mlp:12,8,3,2", &job.model, &err) == PS_ERR_OK);
  job.optimizer = (optimizer_config){.kind = OPTIMIZER_ADAM, .lr = 0.1, .schedule = LR_STEP,
                                     .step_size = 1, .gamma = 0.5, .total_steps = 10,
                                     .beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-8};
  tensor_layout_init(&layout);
  REQUIRE(model_build_layout(&job.model, &layout, &err) == PS_ERR_OK);
  REQUIRE(shard_map_build(&map, &layout, job.block_size, 1, &err) == PS_ERR_OK);
  n = layout.total;
  float *want = malloc(STEPS * n * sizeof *want);
  REQUIRE(want != NULL);
  reference(want);
  test_parts_equal_whole(want);
  test_refusals();
  test_stop_half_applied();
  free(want);
  shard_map_free(&map);
  tensor_layout_free(&layout);
  rpc_global_shutdown();
  return check_report("test_pserver_parts");
}
