/* libFuzzer target: a fresh pserver (pserver 0 of 2, 2 trainers, the tiny
 * fuzz job) per input, optionally with both trainers registered, fed the
 * input's requests through pserver_handle on in-memory calls. Invariants,
 * each an abort (a finding): every call is answered exactly once (deferred
 * sync pushes at the end, by pserver_abort_waiting); a refused request
 * leaves the parameters, optimizer state, step and registrations
 * byte-identical; an accepted Pull is answered with exactly this pserver's
 * blocks at their sizes (a PULL_PREFETCH with none: an acknowledgement),
 * an accepted PushPull with some of them (a sync
 * push in parts gets the blocks it pushed), each once; an accepted
 * registration gets a
 * RegisterReply. With FUZZ_MODE_CTR the job has sparse tables: their rows
 * (a dump) are part of what a refusal must leave alone, and a sync Pull may
 * wait at the pull barrier like a push. FUZZ_MODE_GEO makes the job geo. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/rpc.h"
#include "tests/fuzz/fuzz_job.h"

#define MAX_CALLS 512

static void finding(const char *what, int request) {
  fprintf(stderr, "fuzz_pserver: request %d: %s\n", request, what);
  abort();
}

/* Everything a refused request must leave alone. */
typedef struct state_copy {
  int configured;
  long version;
  uint64_t job_hash;
  trainer_state trainers[2];
  size_t bytes;
  uint8_t *data; /* params, state1, state2, then each sparse table's dump */
} state_copy;

/* Bytes of a sparse table's dump (keys, values, state, meta). */
static size_t dump_bytes(const sparse_table *t) {
  sparse_table_stats st;
  sparse_table_stats_get(t, &st);
  const sparse_table_config *c = sparse_table_config_of(t);
  return st.rows * (8 + 16 + 4 * ((size_t)c->dim + (size_t)sparse_table_state_floats(c)));
}

static void dump_table(const sparse_table *t, uint8_t *out) {
  sparse_table_stats st;
  sparse_table_stats_get(t, &st);
  const sparse_table_config *c = sparse_table_config_of(t);
  uint64_t *keys = (uint64_t *)out;
  int64_t *meta = (int64_t *)(out + st.rows * 8);
  float *values = (float *)(out + st.rows * 24);
  float *state = values + st.rows * (size_t)c->dim;
  ps_error err;
  if (sparse_table_dump(t, keys, values, state, meta, &err) != PS_ERR_OK) fuzz_die("dump", &err);
}

static void take(const pserver *ps, state_copy *s) {
  s->configured = ps->configured;
  s->version = ps->updates;
  s->job_hash = ps->job_hash;
  memcpy(s->trainers, ps->trainers, sizeof s->trainers);
  size_t dense = ps->configured ? 3 * ps->store.dense.n * sizeof(float) : 0;
  s->bytes = dense;
  for (int t = 0; t < ps->store.table_count; t++) s->bytes += dump_bytes(ps->store.tables[t]);
  /* 8-aligned for the dumps' keys */
  s->data = malloc(s->bytes + 8);
  if (s->data == NULL) abort();
  for (size_t at = dense, t = 0; t < (size_t)ps->store.table_count; at += dump_bytes(ps->store.tables[t]), t++) {
    uint8_t *aligned = malloc(dump_bytes(ps->store.tables[t]) + 8);
    if (aligned == NULL) abort();
    dump_table(ps->store.tables[t], aligned);
    memcpy(s->data + at, aligned, dump_bytes(ps->store.tables[t]));
    free(aligned);
  }
  if (s->bytes > 0) {
    memcpy(s->data, ps->store.dense.params, ps->store.dense.n * sizeof(float));
    memcpy(s->data + ps->store.dense.n * sizeof(float), ps->store.dense.state1, ps->store.dense.n * sizeof(float));
    memcpy(s->data + 2 * ps->store.dense.n * sizeof(float), ps->store.dense.state2,
           ps->store.dense.n * sizeof(float));
  }
}

static int same(const pserver *ps, const state_copy *s) {
  state_copy now;
  take(ps, &now);
  int equal = now.configured == s->configured && now.version == s->version &&
              now.job_hash == s->job_hash && now.bytes == s->bytes &&
              memcmp(now.data, s->data, s->bytes) == 0;
  for (int t = 0; t < 2 && equal; t++) {
    /* waiting may legitimately differ only by which call of the same push waits */
    equal = now.trainers[t].registered == s->trainers[t].registered &&
            now.trainers[t].incarnation == s->trainers[t].incarnation &&
            now.trainers[t].done == s->trainers[t].done &&
            now.trainers[t].pushed == s->trainers[t].pushed &&
            now.trainers[t].last_step == s->trainers[t].last_step &&
            now.trainers[t].registrations == s->trainers[t].registrations;
  }
  free(now.data);
  return equal;
}

/* What an accepted parameter reply holds of this pserver's blocks. */
typedef enum { BLOCKS_SOME, BLOCKS_ALL, BLOCKS_NONE } blocks_wanted;

/* A PULL_PREFETCH is acknowledged at once with no blocks (its rows are read
 * in after the answer). */
static int is_prefetch(const rpc_message *request) {
  wire_block_ref none[1];
  wire_blocks_msg m = {.blocks = none, .block_cap = 0};
  ps_error err;
  return wire_parse_blocks(request, &m, &err) == PS_ERR_OK &&
         m.kind == PSTRAIN__PULL_KIND__PULL_PREFETCH;
}

/* An accepted PushPull or Pull reply: this pserver's blocks (all of them
 * for a Pull, some for a PushPull, none for a prefetch), each once, at size. */
static void check_params_reply(const pserver *ps, const rpc_local_result *r, int request,
                               blocks_wanted wanted) {
  const shard_map *map = &ps->store.dense.map;
  wire_block_ref refs[64];
  unsigned char seen[64] = {0};
  rpc_segment seg = {r->bytes, r->len};
  rpc_message msg = {&seg, 1, r->len};
  wire_blocks_msg m = {.blocks = refs, .block_cap = 64};
  ps_error err;
  if (wire_parse_blocks(&msg, &m, &err) != PS_ERR_OK) finding("an unreadable parameter reply", request);
  size_t want = map->shard_blocks[0];
  if (m.pserver_incarnation != ps->incarnation ||
      (wanted == BLOCKS_ALL    ? m.block_count != want
       : wanted == BLOCKS_NONE ? m.block_count != 0
                               : m.block_count < 1 || m.block_count > want)) {
    finding("a parameter reply with the wrong incarnation or block count", request);
  }
  for (size_t i = 0; i < m.block_count; i++) {
    const wire_block_ref *b = &m.blocks[i];
    if (b->id >= map->block_count || b->id >= sizeof seen || seen[b->id]++ ||
        map->blocks[b->id].pserver != 0 || b->len != map->blocks[b->id].count * sizeof(float)) {
      finding("a parameter reply with a wrong or repeated block", request);
    }
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  log_set_role("fuzz_pserver");
  log_set_level(LOG_LEVEL_ERROR); /* every refusal is a warning: too many lines */
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t mode = data[0];
  job_config job;
  if (mode & FUZZ_MODE_CTR) fuzz_ctr_job(&job, fuzz_update(mode));
  else fuzz_job(&job, fuzz_update(mode));
  pserver_config cfg = fuzz_pserver_config(NULL);
  cfg.authenticated = (mode & FUZZ_MODE_TOKEN) != 0;
  static pserver ps;
  ps_error err;
  if (pserver_init(&ps, &cfg, &err) != PS_ERR_OK) fuzz_die("pserver_init", &err);
  static rpc_call *calls[MAX_CALLS];
  int ncalls = 0;
  uint8_t body[1024];

  if (mode & FUZZ_MODE_REGISTERED) {
    for (uint32_t t = 0; t < 2; t++) {
      size_t len = fuzz_register_bytes(&job, t, FUZZ_INCARNATION(t), 0, body, sizeof body);
      rpc_segment seg = {body, len};
      rpc_message msg = {&seg, 1, len};
      rpc_call *c = rpc_call_local_create("setup");
      if (c == NULL) abort();
      pserver_handle(&ps, c, 0, &msg);
      if (rpc_call_local_result(c)->code != PS_ERR_OK) fuzz_die("registering", NULL);
      rpc_call_local_free(c);
    }
  }

  size_t at = 1;
  for (int request = 0; at < size && ncalls < MAX_CALLS; request++) {
    uint8_t op = data[at++];
    size_t len = 0;
    if (at + 2 <= size) len = (size_t)data[at] | (size_t)data[at + 1] << 8;
    at = at + 2 <= size ? at + 2 : size;
    if (len > size - at) len = size - at;
    const uint8_t *bytes = data + at;
    at += len;
    int method = (op & 7) % pserver_method_count;
    /* The body in up to 8 non-empty segments of near-equal size. */
    size_t want = (size_t)((op >> 3) & 7) + 1, count = len == 0 ? 0 : (want < len ? want : len);
    rpc_segment segs[8];
    for (size_t i = 0, from = 0; i < count; i++) {
      size_t to = len * (i + 1) / count;
      segs[i] = (rpc_segment){bytes + from, to - from};
      from = to;
    }
    rpc_message msg = {segs, count, len};

    state_copy before;
    take(&ps, &before);
    rpc_call *c = rpc_call_local_create("fuzz");
    if (c == NULL) abort();
    calls[ncalls++] = c;
    pserver_handle(&ps, c, method, &msg);
    const rpc_local_result *r = rpc_call_local_result(c);
    if (r->replies > 1) finding("a call answered twice", request);
    /* RESOURCE_EXHAUSTED may follow an applied step whose next pull passed
     * --max-table-mb: the step stays applied, the trainers are told. */
    if (r->replies == 1 && r->code != PS_ERR_OK && r->code != PS_ERR_RESOURCE_EXHAUSTED &&
        !same(&ps, &before)) {
      finding("a refused request changed the pserver", request);
    }
    if (r->replies == 1 && r->code == PS_ERR_OK) {
      if (method == 1) check_params_reply(&ps, r, request, BLOCKS_SOME);
      if (method == 2) {
        check_params_reply(&ps, r, request, is_prefetch(&msg) ? BLOCKS_NONE : BLOCKS_ALL);
      }
      if (method == 0) {
        Pstrain__RegisterReply *reply = pstrain__register_reply__unpack(NULL, r->len, r->bytes);
        if (reply == NULL || reply->pserver_incarnation != ps.incarnation) {
          finding("an unreadable registration reply", request);
        }
        pstrain__register_reply__free_unpacked(reply, NULL);
      }
    }
    /* Sync pushes wait for the step; a CTR job's keyed pulls for the barrier. */
    int may_wait = method == 1 || (method == 2 && ps.store.table_count > 0);
    if (r->replies == 0 && !may_wait) finding("a request other than a push or pull left unanswered", request);
    free(before.data);
    for (int i = 0; i < ncalls; i++) {
      if (rpc_call_local_result(calls[i])->replies > 1) finding("an earlier call answered twice", request);
    }
  }

  pserver_abort_waiting(&ps, PS_ERR_UNAVAILABLE, "fuzz input over");
  for (int i = 0; i < ncalls; i++) {
    if (rpc_call_local_result(calls[i])->replies != 1) finding("a call not answered exactly once", i);
    rpc_call_local_free(calls[i]);
  }
  pserver_destroy(&ps);
  return 0;
}
