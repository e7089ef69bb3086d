/* A real pserver (in this process, over gRPC on 127.0.0.1) answers every
 * malformed or inconsistent request with the right status and leaves its
 * parameters byte-identical; good requests still work afterwards, a
 * completed sync step changes the parameters as the optimizer says, a push
 * sent twice (same trainer, incarnation and step) is applied once, and a
 * rollback loads the pserver's own checkpoint of an earlier step. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rpc.h"
#include "common/wire.h"
#include "server/pserver.h"
#include "tests/check.h"
#include "tests/pserver_testlib.h"

#define TRAINERS 2

static pserver ps;
static rpc_server *server;
static rpc_client *client;
static rpc_channel *channel;
static job_config job;
static uint64_t job_hash;
static tensor_layout layout;
static shard_map map;
static char ckdir[64];
static float *grads, *grads1; /* trainer 0's and trainer 1's gradients */
static uint8_t junk[64];      /* a corrupted message, see make_junk */

/* One call; returns its status, message in *msg (may be NULL). */
static ps_err call(const char *method, const rpc_part *parts, int count, char *msg,
                   rpc_reply *reply) {
  rpc_op op = {.channel = channel, .method = method, .parts = parts, .part_count = count,
               .timeout_s = 10};
  ps_error err;
  rpc_client_call_all(client, &op, 1, &err);
  if (msg != NULL) snprintf(msg, 384, "%s", op.message);
  if (reply != NULL) *reply = op.reply;
  else rpc_reply_free(&op.reply);
  return op.code;
}

static ps_err send_raw(const char *method, const void *bytes, size_t len, char *msg) {
  rpc_part part = {bytes, len, NULL};
  return call(method, &part, 1, msg, NULL);
}

static ps_err send_register(uint32_t trainer, uint64_t incarnation, const job_config *j,
                            uint32_t pserver_id, uint64_t hash, char *msg) {
  uint8_t buf[TESTLIB_REGISTER_MAX];
  size_t len = testlib_register_bytes(j, trainer, incarnation, hash, pserver_id, buf, sizeof buf);
  REQUIRE(len > 0);
  return send_raw(WIRE_METHOD_REGISTER, buf, len, msg);
}

/* How a test push departs from a good one. */
typedef struct push_spec {
  uint32_t trainer;
  uint64_t incarnation, step, hash;
  int drop_last, duplicate_first, short_first, foreign_block, no_key, no_blocks;
} push_spec;

static push_spec good0; /* trainer 0's good push of step 0 */

static ps_err send_push(const push_spec *s, const float *values, char *msg, rpc_reply *reply) {
  wire_writer w = {0};
  ps_error err;
  REQUIRE(wire_writer_begin(&w, map.block_count + 2, &err) == PS_ERR_OK);
  wire_key key = {s->trainer, s->incarnation, s->step};
  if (!s->no_key) wire_writer_push_header(&w, &key, s->hash);
  int first = 1;
  for (size_t i = 0; i < map.block_count; i++) {
    const shard_block *b = &map.blocks[i];
    if (b->pserver != 0 && !(s->foreign_block && first)) continue;
    if (s->drop_last && i == map.block_count - 1) continue;
    if (s->no_blocks) continue;
    size_t count = s->short_first && first ? b->count - 1 : b->count;
    wire_writer_block(&w, b->id, values + b->offset, count, NULL);
    if (s->duplicate_first && first) wire_writer_block(&w, b->id, values + b->offset, b->count, NULL);
    first = 0;
  }
  ps_err rc = call(WIRE_METHOD_PUSH_PULL, w.parts, w.part_count, msg, reply);
  wire_writer_free(&w);
  return rc;
}

static ps_err send_rollback(uint32_t trainer, uint64_t incarnation, uint64_t step, char *msg) {
  Pstrain__RequestKey key = PSTRAIN__REQUEST_KEY__INIT;
  key.trainer_id = trainer;
  key.incarnation = incarnation;
  key.step = step;
  Pstrain__RollbackRequest req = PSTRAIN__ROLLBACK_REQUEST__INIT;
  req.key = &key;
  req.config_hash = job_hash;
  req.step = step;
  uint8_t *buf;
  size_t len;
  ps_error err;
  REQUIRE(wire_pack(&req.base, &buf, &len, &err) == PS_ERR_OK);
  ps_err rc = send_raw(WIRE_METHOD_ROLLBACK, buf, len, msg);
  free(buf);
  return rc;
}

static float *snapshot(void) {
  float *copy = testlib_params_copy(&ps);
  REQUIRE(copy != NULL);
  return copy;
}

static int unchanged(const float *before) { return testlib_params_equal(&ps, before); }

static char last_msg[384];

/* A corrupted message where each message should be: a good DoneRequest
 * with every bit flipped (XOR, so each byte differs from the original). */
static void make_junk(void) {
  Pstrain__RequestKey k = PSTRAIN__REQUEST_KEY__INIT;
  Pstrain__DoneRequest d = PSTRAIN__DONE_REQUEST__INIT;
  k.trainer_id = 1;
  k.incarnation = 0x1234;
  d.key = &k;
  d.config_hash = 0x5678;
  REQUIRE(protobuf_c_message_get_packed_size(&d.base) <= sizeof junk);
  size_t n = protobuf_c_message_pack(&d.base, junk);
  REQUIRE(n > 8);
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = i < n ? junk[i] ^ 0xff : 0xa5;
}

/* Every case's fixture: a fresh pserver (with its own checkpoint directory)
 * serving the job below, nobody registered, a client connected to it. */
static void server_start(void) {
  ps_error err;
  snprintf(ckdir, sizeof ckdir, "/tmp/pstrain-test-pw-XXXXXX");
  REQUIRE(mkdtemp(ckdir) != NULL);
  pserver_config cfg = {.id = 0, .pservers = 1, .trainers = TRAINERS, .step_timeout = 60,
                        .log_every = 0, .max_shard_mb = 64, .checkpoint_dir = ckdir,
                        .max_blocks_per_request = 8, .max_registrations = 2};
  REQUIRE(pserver_init(&ps, &cfg, &err) == PS_ERR_OK);
  rpc_server_config rcfg = {.listen = "127.0.0.1:0", .methods = pserver_methods,
                            .method_count = pserver_method_count, .handler = pserver_handle,
                            .handler_ctx = &ps, .threads = 2, .max_message_bytes = 64 << 20};
  int port;
  REQUIRE(rpc_server_start(&server, &rcfg, &port, &err) == PS_ERR_OK);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  REQUIRE(rpc_client_create(&client, NULL, NULL, &err) == PS_ERR_OK);
  REQUIRE(rpc_channel_open(client, target, 64 << 20, 100, &channel, &err) == PS_ERR_OK);

  job = (job_config){.update = UPDATE_SYNC, .trainers = TRAINERS, .pservers = 1,
                     .block_size = 100, .seed = 7, .batch = 8, .steps = 10};
  REQUIRE(model_parse("mlp:20,16,4", &job.model, &err) == PS_ERR_OK);
  job.optimizer = (optimizer_config){.kind = OPTIMIZER_SGD, .lr = 0.5, .schedule = LR_CONSTANT,
                                     .step_size = 1, .gamma = 1, .total_steps = 1, .beta1 = 0.9,
                                     .beta2 = 0.999, .epsilon = 1e-8};
  job_hash = job_config_hash(&job);
  tensor_layout_init(&layout);
  REQUIRE(model_build_layout(&job.model, &layout, &err) == PS_ERR_OK);
  REQUIRE(shard_map_build(&map, &layout, job.block_size, 1, &err) == PS_ERR_OK);

  grads = calloc(layout.total, sizeof *grads);
  grads1 = malloc(layout.total * sizeof *grads1);
  REQUIRE(grads != NULL && grads1 != NULL);
  for (size_t i = 0; i < layout.total; i++) grads[i] = 0.01f * (float)(i % 7) - 0.03f;
  for (size_t i = 0; i < layout.total; i++) grads1[i] = 0.02f;
  good0 = (push_spec){.trainer = 0, .incarnation = 100, .step = 0, .hash = job_hash};
  make_junk();
}

static void server_stop(void) {
  free(grads);
  free(grads1);
  rpc_client_destroy(client);
  pserver_abort_waiting(&ps, PS_ERR_UNAVAILABLE, "test over");
  rpc_server_stop(server);
  pserver_destroy(&ps);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", ckdir);
  CHECK(system(cmd) == 0);
  shard_map_free(&map);
  tensor_layout_free(&layout);
}

/* Trainer 0 (incarnation 100) and trainer 1 (incarnation 200) register. */
static void register_both(void) {
  REQUIRE(send_register(0, 100, &job, 0, job_hash, last_msg) == PS_ERR_OK);
  REQUIRE(send_register(1, 200, &job, 0, job_hash, last_msg) == PS_ERR_OK);
}

/* Both trainers' pushes of step 0 (grads, grads1), each block once. */
static void step0_writers(wire_writer *w0, wire_writer *w1) {
  ps_error err;
  REQUIRE(wire_writer_begin(w0, map.block_count, &err) == PS_ERR_OK);
  REQUIRE(wire_writer_begin(w1, map.block_count, &err) == PS_ERR_OK);
  wire_key k0 = {0, 100, 0}, k1 = {1, 200, 0};
  wire_writer_push_header(w0, &k0, job_hash);
  wire_writer_push_header(w1, &k1, job_hash);
  for (size_t i = 0; i < map.block_count; i++) {
    wire_writer_block(w0, map.blocks[i].id, grads + map.blocks[i].offset, map.blocks[i].count, NULL);
    wire_writer_block(w1, map.blocks[i].id, grads1 + map.blocks[i].offset, map.blocks[i].count, NULL);
  }
}

/* Both trainers push step 0 together: the pserver completes the step. */
static void push_step0_from_both(void) {
  ps_error err;
  wire_writer w0 = {0}, w1 = {0};
  step0_writers(&w0, &w1);
  rpc_op ops[2] = {
      {.channel = channel, .method = WIRE_METHOD_PUSH_PULL, .parts = w0.parts,
       .part_count = w0.part_count, .timeout_s = 10},
      {.channel = channel, .method = WIRE_METHOD_PUSH_PULL, .parts = w1.parts,
       .part_count = w1.part_count, .timeout_s = 10}};
  REQUIRE(rpc_client_call_all(client, ops, 2, &err) == PS_ERR_OK);
  rpc_reply_free(&ops[0].reply);
  rpc_reply_free(&ops[1].reply);
  wire_writer_free(&w0);
  wire_writer_free(&w1);
}

static void case_malformed_and_oversized_bodies_refused(void) {
  server_start();
  CHECK_EQ_INT(send_raw(WIRE_METHOD_REGISTER, junk, sizeof junk, last_msg), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "malformed pstrain.RegisterRequest");
  CHECK_EQ_INT(send_raw(WIRE_METHOD_PUSH_PULL, junk, sizeof junk, last_msg), PS_ERR_ABORTED);
  CHECK_EQ_INT(send_raw(WIRE_METHOD_PULL, junk, sizeof junk, last_msg), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(send_raw(WIRE_METHOD_DONE, junk, sizeof junk, last_msg), PS_ERR_INVALID_ARGUMENT);

  /* Small methods refuse large bodies before parsing them. */
  uint8_t *big = calloc(100 * 1024, 1);
  REQUIRE(big != NULL);
  CHECK_EQ_INT(send_raw(WIRE_METHOD_REGISTER, big, 100 * 1024, last_msg), PS_ERR_OUT_OF_RANGE);
  CHECK_CONTAINS(last_msg, "larger than this method's limit");
  free(big);
  server_stop();
}

static void case_push_before_registration_refused(void) {
  server_start();
  CHECK_EQ_INT(send_push(&good0, grads, last_msg, NULL), PS_ERR_ABORTED);
  CHECK_CONTAINS(last_msg, "register again");
  server_stop();
}

static void case_bad_registrations_refused(void) {
  ps_error err;
  server_start();
  CHECK_EQ_INT(send_register(5, 1, &job, 0, job_hash, last_msg), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "trainer id 5 is not 0..1");
  CHECK_EQ_INT(send_register(0, 1, &job, 3, job_hash, last_msg), PS_ERR_FAILED_PRECONDITION);
  CHECK_CONTAINS(last_msg, "the pserver lists differ");
  CHECK_EQ_INT(send_register(0, 1, &job, 0, job_hash ^ 1, last_msg), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "config hash does not match");
  job_config three = job;
  three.trainers = 3;
  CHECK_EQ_INT(send_register(0, 1, &three, 0, job_config_hash(&three), last_msg),
               PS_ERR_FAILED_PRECONDITION);
  CHECK_CONTAINS(last_msg, "expects 3 trainers");
  job_config bad_lr = job;
  bad_lr.optimizer.lr = -1;
  CHECK_EQ_INT(send_register(0, 1, &bad_lr, 0, job_config_hash(&bad_lr), last_msg),
               PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "lr -1 must be > 0");

  job_config huge = job;
  REQUIRE(model_parse("mlp:65536,65536,10", &huge.model, &err) == PS_ERR_OK);
  CHECK_EQ_INT(send_register(0, 1, &huge, 0, job_config_hash(&huge), last_msg), PS_ERR_OUT_OF_RANGE);
  CHECK_CONTAINS(last_msg, "above --max-shard-mb 64");
  /* Block size 10 cuts mlp:20,16,4 into 32+2+7+1 blocks, above the 8 allowed. */
  job_config tiny_blocks = job;
  tiny_blocks.block_size = 10;
  CHECK_EQ_INT(send_register(0, 1, &tiny_blocks, 0, job_config_hash(&tiny_blocks), last_msg),
               PS_ERR_OUT_OF_RANGE);
  CHECK_CONTAINS(last_msg, "into 42 blocks, more than --max-blocks-per-request 8");
  server_stop();
}

/* Trainer 0 registers; trainer 1 with another model is refused by name. */
static void case_other_job_refused_by_field(void) {
  ps_error err;
  server_start();
  CHECK_EQ_INT(send_register(0, 100, &job, 0, job_hash, last_msg), PS_ERR_OK);
  job_config other = job;
  REQUIRE(model_parse("mlp:20,8,4", &other.model, &err) == PS_ERR_OK);
  CHECK_EQ_INT(send_register(1, 200, &other, 0, job_config_hash(&other), last_msg),
               PS_ERR_FAILED_PRECONDITION);
  /* Without a token the reply names the fields only; the values stay in the log. */
  CHECK_CONTAINS(last_msg, "trainer 1's job differs from trainer 0's in: model (the values are in");
  CHECK(strstr(last_msg, "mlp:20,16,4") == NULL);
  other.batch = 16;
  CHECK_EQ_INT(send_register(1, 200, &other, 0, job_config_hash(&other), last_msg),
               PS_ERR_FAILED_PRECONDITION);
  CHECK_CONTAINS(last_msg, "differs from trainer 0's in: model, batch (");
  /* Behind a token the caller is one of the job's: it is told the values. */
  pthread_mutex_lock(&ps.lock);
  ps.cfg.authenticated = 1;
  pthread_mutex_unlock(&ps.lock);
  CHECK_EQ_INT(send_register(1, 200, &other, 0, job_config_hash(&other), last_msg),
               PS_ERR_FAILED_PRECONDITION);
  CHECK_CONTAINS(last_msg,
                 "trainer 1's job differs from trainer 0's: model mlp:20,8,4 vs mlp:20,16,4; batch 16 vs 8");
  pthread_mutex_lock(&ps.lock);
  ps.cfg.authenticated = 0;
  pthread_mutex_unlock(&ps.lock);
  CHECK_EQ_INT(send_register(1, 200, &job, 0, job_hash, last_msg), PS_ERR_OK);
  server_stop();
}

/* Bad pushes from registered trainers: each refused, the table untouched. */
static void case_bad_pushes_refused_table_untouched(void) {
  ps_error err;
  server_start();
  register_both();
  float *before = snapshot();
  CHECK_EQ_INT(send_raw(WIRE_METHOD_PUSH_PULL, junk, sizeof junk, last_msg), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "malformed block message");
  push_spec s;
  s = good0; s.no_key = 1;
  CHECK_EQ_INT(send_push(&s, grads, last_msg, NULL), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "without a key");
  s = good0; s.trainer = 9;
  CHECK_EQ_INT(send_push(&s, grads, last_msg, NULL), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "trainer id 9 is not 0..1");
  s = good0; s.hash = job_hash + 1;
  CHECK_EQ_INT(send_push(&s, grads, last_msg, NULL), PS_ERR_FAILED_PRECONDITION);
  CHECK_CONTAINS(last_msg, "config hash");
  s = good0; s.incarnation = 101;
  CHECK_EQ_INT(send_push(&s, grads, last_msg, NULL), PS_ERR_FAILED_PRECONDITION);
  CHECK_CONTAINS(last_msg, "register again");
  /* A sync dense job takes any non-empty subset (a part, test_pserver_parts). */
  s = good0; s.no_blocks = 1;
  CHECK_EQ_INT(send_push(&s, grads, last_msg, NULL), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "push holds 0 blocks, pserver 0 holds");
  s = good0; s.duplicate_first = 1; s.drop_last = 1;
  CHECK_EQ_INT(send_push(&s, grads, last_msg, NULL), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "appears twice");
  /* More blocks than the whole map holds are refused while parsing. */
  {
    wire_writer w = {0};
    REQUIRE(wire_writer_begin(&w, 2 * map.block_count, &err) == PS_ERR_OK);
    wire_key key = {0, 100, 0};
    wire_writer_push_header(&w, &key, job_hash);
    for (int round = 0; round < 2; round++) {
      for (size_t i = 0; i < map.block_count; i++) {
        wire_writer_block(&w, map.blocks[i].id, grads + map.blocks[i].offset, map.blocks[i].count,
                          NULL);
      }
    }
    CHECK_EQ_INT(call(WIRE_METHOD_PUSH_PULL, w.parts, w.part_count, last_msg, NULL),
                 PS_ERR_OUT_OF_RANGE);
    CHECK_CONTAINS(last_msg, "message holds more than");
    wire_writer_free(&w);
  }
  s = good0; s.short_first = 1;
  CHECK_EQ_INT(send_push(&s, grads, last_msg, NULL), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "bytes, expected");
  s = good0; s.step = 5; /* ahead: the trainer can recover (register, roll back) */
  CHECK_EQ_INT(send_push(&s, grads, last_msg, NULL), PS_ERR_ABORTED);
  CHECK_CONTAINS(last_msg, "pushed step 5 but the pserver is at step 0");
  /* A block id the map does not have. */
  {
    wire_writer w = {0};
    REQUIRE(wire_writer_begin(&w, map.block_count, &err) == PS_ERR_OK);
    wire_key key = {0, 100, 0};
    wire_writer_push_header(&w, &key, job_hash);
    for (size_t i = 0; i < map.block_count; i++) {
      uint32_t id = i == 0 ? 999 : map.blocks[i].id;
      wire_writer_block(&w, id, grads + map.blocks[i].offset, map.blocks[i].count, NULL);
    }
    CHECK_EQ_INT(call(WIRE_METHOD_PUSH_PULL, w.parts, w.part_count, last_msg, NULL),
                 PS_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(last_msg, "block 999 is not held by pserver 0");
    wire_writer_free(&w);
  }
  /* An empty call body and a truncated good push. */
  CHECK_EQ_INT(send_raw(WIRE_METHOD_PUSH_PULL, "", 0, last_msg), PS_ERR_INVALID_ARGUMENT);
  CHECK(unchanged(before));
  free(before);
  server_stop();
}

/* A good sync step: trainer 0 waits until trainer 1 pushes; both get the
 * parameters after one SGD step on the mean gradient. Trainer 0's push is
 * sent twice: the copy either supersedes the waiting one (ABORTED) or
 * arrives after the step and gets its parameters; it counts once. */
static void case_sync_step_applies_mean_gradient_once(void) {
  ps_error err;
  server_start();
  register_both();
  float *before = snapshot();
  wire_writer w0 = {0}, w1 = {0};
  step0_writers(&w0, &w1);
  rpc_op ops[3];
  ops[0] = (rpc_op){.channel = channel, .method = WIRE_METHOD_PUSH_PULL, .parts = w0.parts,
                    .part_count = w0.part_count, .timeout_s = 10};
  ops[1] = (rpc_op){.channel = channel, .method = WIRE_METHOD_PUSH_PULL, .parts = w1.parts,
                    .part_count = w1.part_count, .timeout_s = 10};
  ops[2] = ops[0];
  rpc_client_call_all(client, ops, 3, &err);
  CHECK_EQ_INT(ops[1].code, PS_ERR_OK);
  int answered = (ops[0].code == PS_ERR_OK) + (ops[2].code == PS_ERR_OK);
  int superseded = (ops[0].code == PS_ERR_ABORTED) + (ops[2].code == PS_ERR_ABORTED);
  CHECK(answered >= 1 && answered + superseded == 2);
  if (ops[0].code != PS_ERR_OK) {
    rpc_reply_free(&ops[0].reply);
    ops[0].reply = ops[2].reply;
    ops[2].reply = (rpc_reply){0};
  }
  rpc_reply_free(&ops[2].reply);
  wire_block_ref refs[64];
  wire_blocks_msg m = {.blocks = refs, .block_cap = 64};
  REQUIRE(wire_parse_blocks(&ops[0].reply.message, &m, &err) == PS_ERR_OK);
  CHECK_EQ_INT(m.step, 1); /* version after one step */
  CHECK(m.pserver_incarnation == ps.incarnation);
  float *after = calloc(layout.total, sizeof *after);
  REQUIRE(after != NULL);
  for (size_t i = 0; i < m.block_count; i++) {
    wire_copy_block(&ops[0].reply.message, &m.blocks[i], after + map.blocks[m.blocks[i].id].offset);
  }
  int wrong = 0;
  for (size_t i = 0; i < layout.total; i++) {
    float want = before[i] - 0.5f * 0.5f * (grads[i] + grads1[i]);
    if (after[i] != want) wrong++;
  }
  CHECK_EQ_INT(wrong, 0);
  rpc_reply_free(&ops[0].reply);
  rpc_reply_free(&ops[1].reply);
  wire_writer_free(&w0);
  wire_writer_free(&w1);
  free(before);
  free(after);
  server_stop();
}

static void case_resent_and_stale_pushes_not_applied(void) {
  ps_error err;
  server_start();
  register_both();
  push_step0_from_both();
  /* A resent push of the finished step gets the same parameters, applied once. */
  float *stepped = snapshot();
  rpc_reply again;
  CHECK_EQ_INT(send_push(&good0, grads, last_msg, &again), PS_ERR_OK);
  rpc_reply_free(&again);
  CHECK(unchanged(stepped));
  /* A push behind the pserver's step (step 0 at step 1) is answered with
   * the current parameters and not applied (docs/operations.md: "a pserver already past
   * that step answers it with its parameters"); one ahead is ABORTED. */
  CHECK_EQ_INT(send_push(&good0, grads, last_msg, &again), PS_ERR_OK);
  wire_block_ref refs[64];
  wire_blocks_msg m = {.blocks = refs, .block_cap = 64};
  REQUIRE(wire_parse_blocks(&again.message, &m, &err) == PS_ERR_OK);
  CHECK_EQ_INT(m.step, 1); /* the pserver's step, not the push's */
  rpc_reply_free(&again);
  CHECK(unchanged(stepped));
  push_spec s = good0;
  s.step = 3;
  CHECK_EQ_INT(send_push(&s, grads, last_msg, NULL), PS_ERR_ABORTED);
  CHECK(unchanged(stepped));
  free(stepped);
  server_stop();
}

/* Rollbacks: forward and to a step without a checkpoint are refused; to
 * the current step is a no-op; to step 0 (written at registration) loads
 * the parameters from before the step. */
static void case_rollback_loads_own_checkpoint(void) {
  server_start();
  register_both();
  float *before = snapshot();
  push_step0_from_both();
  float *stepped = snapshot();
  CHECK_EQ_INT(send_rollback(0, 100, 5, last_msg), PS_ERR_FAILED_PRECONDITION);
  CHECK_CONTAINS(last_msg, "cannot roll forward from step 1 to 5");
  CHECK_EQ_INT(send_rollback(0, 100, 1, last_msg), PS_ERR_OK);
  CHECK(unchanged(stepped));
  char ck0[512];
  pserver_checkpoint_wait(&ps); /* step 0's checkpoint is written by the disk thread */
  pserver_checkpoint_path(&ps, 0, ck0, sizeof ck0);
  char hidden[600];
  snprintf(hidden, sizeof hidden, "%s.hidden", ck0);
  REQUIRE(rename(ck0, hidden) == 0);
  CHECK_EQ_INT(send_rollback(0, 100, 0, last_msg), PS_ERR_FAILED_PRECONDITION);
  CHECK_CONTAINS(last_msg, "cannot roll back from step 1 to 0");
  CHECK(unchanged(stepped));
  REQUIRE(rename(hidden, ck0) == 0);
  CHECK_EQ_INT(send_rollback(9, 100, 0, last_msg), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(send_rollback(0, 100, 0, last_msg), PS_ERR_OK);
  CHECK(unchanged(before));
  CHECK_EQ_INT(pserver_version(&ps), 0);
  /* Step 0 again from both trainers: the same parameters as the first time. */
  push_step0_from_both();
  CHECK(unchanged(stepped));
  free(before);
  free(stepped);
  server_stop();
}

/* A restarted trainer 1 registers again: the old incarnation's pushes are refused. */
static void case_restarted_trainer_replaces_old_incarnation(void) {
  server_start();
  register_both();
  push_step0_from_both();
  float *stepped = snapshot();
  CHECK_EQ_INT(send_register(1, 201, &job, 0, job_hash, last_msg), PS_ERR_OK);
  push_spec old1 = {.trainer = 1, .incarnation = 200, .step = 1, .hash = job_hash};
  CHECK_EQ_INT(send_push(&old1, grads, last_msg, NULL), PS_ERR_FAILED_PRECONDITION);
  CHECK_CONTAINS(last_msg, "register again");
  CHECK(unchanged(stepped));
  /* Trainer 1 has used its 2 incarnations (--max-registrations 2): a third is
   * refused; a resend of the current one is not a new registration. */
  CHECK_EQ_INT(send_register(1, 202, &job, 0, job_hash, last_msg), PS_ERR_RESOURCE_EXHAUSTED);
  CHECK_CONTAINS(last_msg, "trainer 1 has registered 2 incarnations, the most --max-registrations");
  CHECK_EQ_INT(send_register(1, 201, &job, 0, job_hash, last_msg), PS_ERR_OK);
  push_spec refused1 = {.trainer = 1, .incarnation = 202, .step = 1, .hash = job_hash};
  CHECK_EQ_INT(send_push(&refused1, grads, last_msg, NULL), PS_ERR_FAILED_PRECONDITION);
  CHECK_CONTAINS(last_msg, "register again");
  CHECK(unchanged(stepped));
  free(stepped);
  server_stop();
}

/* Done from both (trainer 1 restarted after step 0): the pserver reports finished. */
static void case_done_from_both_finishes(void) {
  ps_error err;
  server_start();
  register_both();
  push_step0_from_both();
  REQUIRE(send_register(1, 201, &job, 0, job_hash, last_msg) == PS_ERR_OK);
  Pstrain__RequestKey key = PSTRAIN__REQUEST_KEY__INIT;
  Pstrain__DoneRequest done = PSTRAIN__DONE_REQUEST__INIT;
  done.key = &key;
  done.config_hash = job_hash;
  uint8_t *buf;
  size_t len;
  for (uint32_t t = 0; t < TRAINERS; t++) {
    key.trainer_id = t;
    key.incarnation = t == 0 ? 100 : 201;
    REQUIRE(wire_pack(&done.base, &buf, &len, &err) == PS_ERR_OK);
    CHECK_EQ_INT(send_raw(WIRE_METHOD_DONE, buf, len, last_msg), PS_ERR_OK);
    free(buf);
  }
  CHECK_EQ_INT(pserver_poll(&ps), PSERVER_FINISHED);
  server_stop();
}

int main(void) {
  rpc_global_init();
  RUN_CASE(case_malformed_and_oversized_bodies_refused);
  RUN_CASE(case_push_before_registration_refused);
  RUN_CASE(case_bad_registrations_refused);
  RUN_CASE(case_other_job_refused_by_field);
  RUN_CASE(case_bad_pushes_refused_table_untouched);
  RUN_CASE(case_sync_step_applies_mean_gradient_once);
  RUN_CASE(case_resent_and_stale_pushes_not_applied);
  RUN_CASE(case_rollback_loads_own_checkpoint);
  RUN_CASE(case_restarted_trainer_replaces_old_incarnation);
  RUN_CASE(case_done_from_both_finishes);
  rpc_global_shutdown();
  return check_report("test_pserver_wire");
}
