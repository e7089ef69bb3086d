/* A real pserver (in this process, over gRPC on 127.0.0.1) of a bf16 job:
 * pushes of another dtype, and bf16 pushes of the wrong byte count, are
 * refused INVALID_ARGUMENT naming both and leave the table byte-identical;
 * a sync step of two bf16 pushes keeps float32 master weights equal to the
 * step on the bf16-rounded gradients, and the reply (and a pull) carries
 * those parameters rounded to bf16, at 2 bytes per float. */
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
static char last_msg[384];

static ps_err call(const char *method, const rpc_part *parts, int count, rpc_reply *reply) {
  rpc_op op = {.channel = channel, .method = method, .parts = parts, .part_count = count,
               .timeout_s = 10};
  ps_error err;
  rpc_client_call_all(client, &op, 1, &err);
  snprintf(last_msg, sizeof last_msg, "%s", op.message);
  if (reply != NULL) *reply = op.reply;
  else rpc_reply_free(&op.reply);
  return op.code;
}

static ps_err send_packed(const char *method, const ProtobufCMessage *m, rpc_reply *reply) {
  uint8_t *buf;
  size_t len;
  ps_error err;
  REQUIRE(wire_pack(m, &buf, &len, &err) == PS_ERR_OK);
  rpc_part part = {buf, len, NULL};
  ps_err rc = call(method, &part, 1, reply);
  free(buf);
  return rc;
}

static ps_err send_register(uint32_t trainer, uint64_t incarnation) {
  uint8_t buf[TESTLIB_REGISTER_MAX];
  size_t len = testlib_register_bytes(&job, trainer, incarnation, job_hash, 0, buf, sizeof buf);
  REQUIRE(len > 0);
  return call(WIRE_METHOD_REGISTER, &(rpc_part){buf, len, NULL}, 1, NULL);
}

/* A push of grads converted to `dtype`, declared as `declared`; the first
 * block's bytes cut by `cut` (may be negative: longer). */
static void build_push(wire_writer *w, uint32_t trainer, uint64_t incarnation, const float *grads,
                       wire_dtype dtype, wire_dtype declared, long cut, uint8_t *scratch) {
  ps_error err;
  REQUIRE(wire_writer_begin(w, map.block_count, &err) == PS_ERR_OK);
  wire_key key = {trainer, incarnation, 0};
  wire_writer_push_header(w, &key, job_hash);
  wire_writer_dtype(w, declared);
  size_t size = wire_dtype_size(dtype);
  wire_dtype_encode(dtype, grads, scratch, layout.total);
  for (size_t i = 0; i < map.block_count; i++) {
    const shard_block *b = &map.blocks[i];
    size_t len = b->count * size - (i == 0 ? (size_t)cut : 0);
    wire_writer_block_bytes(w, b->id, scratch + b->offset * size, len, NULL);
  }
  REQUIRE(wire_writer_check(w, &err) == PS_ERR_OK);
}

static ps_err push(uint32_t trainer, uint64_t incarnation, const float *grads, wire_dtype dtype,
                   wire_dtype declared, long cut) {
  wire_writer w = {0};
  uint8_t *scratch = malloc(layout.total * 4 + 8);
  REQUIRE(scratch != NULL);
  build_push(&w, trainer, incarnation, grads, dtype, declared, cut, scratch);
  ps_err rc = call(WIRE_METHOD_PUSH_PULL, w.parts, w.part_count, NULL);
  wire_writer_free(&w);
  free(scratch);
  return rc;
}

static float *table_copy(void) {
  float *copy = testlib_params_copy(&ps);
  REQUIRE(copy != NULL);
  return copy;
}

static int table_equals(const float *want) { return testlib_params_equal(&ps, want); }

/* Checks a ParamsReply holds bf16 blocks of 2 bytes a float at `version`,
 * each equal to bf16(want); returns the mismatches. */
static int check_reply(const rpc_message *msg, uint64_t version, const float *want) {
  ps_error err;
  wire_block_ref refs[64];
  wire_blocks_msg m = {.blocks = refs, .block_cap = 64};
  REQUIRE(wire_parse_blocks(msg, &m, &err) == PS_ERR_OK);
  CHECK_EQ_INT(m.dtype, WIRE_DTYPE_BF16);
  CHECK_EQ_INT(m.step, version);
  CHECK_EQ_INT(m.block_count, map.block_count);
  float *got = calloc(layout.total, sizeof *got);
  REQUIRE(got != NULL);
  size_t bytes = 0;
  for (size_t i = 0; i < m.block_count; i++) {
    const shard_block *b = &map.blocks[m.blocks[i].id];
    CHECK_EQ_INT(m.blocks[i].len, b->count * 2);
    bytes += m.blocks[i].len;
    wire_decode_block(msg, &m.blocks[i], WIRE_DTYPE_BF16, got + b->offset);
  }
  CHECK_EQ_INT(bytes, layout.total * 2);
  int wrong = 0;
  for (size_t i = 0; i < layout.total; i++) {
    if (got[i] != wire_bf16_to_f32(wire_f32_to_bf16(want[i]))) wrong++;
  }
  free(got);
  return wrong;
}

static float *g0, *g1; /* trainer 0's and trainer 1's gradients */

/* Every case's fixture: a fresh pserver of the bf16 job, nobody registered,
 * a client connected to it, and the gradients. */
static void server_start(void) {
  ps_error err;
  pserver_config cfg = {.id = 0, .pservers = 1, .trainers = TRAINERS, .step_timeout = 60,
                        .log_every = 0, .max_shard_mb = 64, .checkpoint_dir = "",
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
                     .block_size = 100, .seed = 7, .batch = 8, .steps = 10,
                     .wire_dtype = WIRE_DTYPE_BF16};
  REQUIRE(model_parse("mlp:20,16,4", &job.model, &err) == PS_ERR_OK);
  job.optimizer = (optimizer_config){.kind = OPTIMIZER_SGD, .lr = 0.5, .schedule = LR_CONSTANT,
                                     .step_size = 1, .gamma = 1, .total_steps = 1, .beta1 = 0.9,
                                     .beta2 = 0.999, .epsilon = 1e-8};
  job_hash = job_config_hash(&job);
  tensor_layout_init(&layout);
  REQUIRE(model_build_layout(&job.model, &layout, &err) == PS_ERR_OK);
  REQUIRE(shard_map_build(&map, &layout, job.block_size, 1, &err) == PS_ERR_OK);

  /* Gradients that bf16 cannot hold exactly: rounding shows. */
  g0 = malloc(layout.total * sizeof *g0);
  g1 = malloc(layout.total * sizeof *g1);
  REQUIRE(g0 != NULL && g1 != NULL);
  for (size_t i = 0; i < layout.total; i++) {
    g0[i] = 0.0123457f * (float)(i % 11) - 0.0617f;
    g1[i] = 0.0200003f + 1e-4f * (float)(i % 5);
  }
}

static void server_stop(void) {
  free(g0);
  free(g1);
  rpc_client_destroy(client);
  pserver_abort_waiting(&ps, PS_ERR_UNAVAILABLE, "test over");
  rpc_server_stop(server);
  pserver_destroy(&ps);
  shard_map_free(&map);
  tensor_layout_free(&layout);
}

static void register_both(void) {
  REQUIRE(send_register(0, 100) == PS_ERR_OK);
  REQUIRE(send_register(1, 200) == PS_ERR_OK);
}

static void case_bf16_job_registers(void) {
  server_start();
  CHECK_EQ_INT(send_register(0, 100), PS_ERR_OK);
  CHECK_EQ_INT(send_register(1, 200), PS_ERR_OK);
  CHECK_EQ_INT(ps.job.wire_dtype, WIRE_DTYPE_BF16);
  server_stop();
}

/* Refused, naming both dtypes or the byte counts; nothing stored. */
static void case_other_dtype_or_size_refused(void) {
  server_start();
  register_both();
  float *before = table_copy();
  CHECK_EQ_INT(push(0, 100, g0, WIRE_DTYPE_F32, WIRE_DTYPE_F32, 0), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "push holds f32 blocks, the job's --wire-dtype is bf16");
  CHECK_EQ_INT(push(0, 100, g0, WIRE_DTYPE_FP16, WIRE_DTYPE_FP16, 0), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "push holds fp16 blocks, the job's --wire-dtype is bf16");
  CHECK_EQ_INT(push(0, 100, g0, WIRE_DTYPE_F32, WIRE_DTYPE_BF16, 0), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "block 0 has 320 bytes, expected 160 (80 bf16 elements)");
  CHECK_EQ_INT(push(0, 100, g0, WIRE_DTYPE_BF16, WIRE_DTYPE_BF16, 2), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "block 0 has 158 bytes, expected 160");
  CHECK_EQ_INT(push(0, 100, g0, WIRE_DTYPE_BF16, WIRE_DTYPE_BF16, 1), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(last_msg, "block 0 has 159 bytes, expected 160");
  CHECK(table_equals(before));
  free(before);
  server_stop();
}

/* The initial pull: parameters in bf16. */
static void case_initial_pull_in_bf16(void) {
  server_start();
  register_both();
  float *before = table_copy();
  Pstrain__RequestKey key = PSTRAIN__REQUEST_KEY__INIT;
  key.trainer_id = 0;
  key.incarnation = 100;
  Pstrain__PullRequest pull = PSTRAIN__PULL_REQUEST__INIT;
  pull.key = &key;
  pull.config_hash = job_hash;
  rpc_reply reply;
  CHECK_EQ_INT(send_packed(WIRE_METHOD_PULL, &pull.base, &reply), PS_ERR_OK);
  CHECK_EQ_INT(check_reply(&reply.message, 0, before), 0);
  rpc_reply_free(&reply);
  free(before);
  server_stop();
}

/* A sync step of two bf16 pushes: float32 master weights moved by the
 * mean of the bf16-rounded gradients, answered in bf16. */
static void case_sync_step_on_rounded_gradients(void) {
  ps_error err;
  server_start();
  register_both();
  float *before = table_copy();
  wire_writer w[TRAINERS] = {{0}};
  uint8_t *scratch[TRAINERS];
  rpc_op ops[TRAINERS];
  const float *grads[TRAINERS] = {g0, g1};
  for (uint32_t t = 0; t < TRAINERS; t++) {
    scratch[t] = malloc(layout.total * 2);
    REQUIRE(scratch[t] != NULL);
    build_push(&w[t], t, t == 0 ? 100 : 200, grads[t], WIRE_DTYPE_BF16, WIRE_DTYPE_BF16, 0,
               scratch[t]);
    ops[t] = (rpc_op){.channel = channel, .method = WIRE_METHOD_PUSH_PULL, .parts = w[t].parts,
                      .part_count = w[t].part_count, .timeout_s = 10};
  }
  REQUIRE(rpc_client_call_all(client, ops, TRAINERS, &err) == PS_ERR_OK);
  float *want = malloc(layout.total * sizeof *want);
  REQUIRE(want != NULL);
  int moved = 0;
  for (size_t i = 0; i < layout.total; i++) {
    float q0 = wire_bf16_to_f32(wire_f32_to_bf16(g0[i]));
    float q1 = wire_bf16_to_f32(wire_f32_to_bf16(g1[i]));
    want[i] = before[i] - 0.5f * 0.5f * (q0 + q1);
    /* Not the float32 gradients' step: the rounding reached the table. */
    moved += want[i] != before[i] - 0.5f * 0.5f * (g0[i] + g1[i]);
  }
  CHECK(moved > 0);
  CHECK(table_equals(want));
  for (int t = 0; t < TRAINERS; t++) {
    CHECK_EQ_INT(ops[t].code, PS_ERR_OK);
    CHECK_EQ_INT(check_reply(&ops[t].reply.message, 1, want), 0);
    rpc_reply_free(&ops[t].reply);
    wire_writer_free(&w[t]);
    free(scratch[t]);
  }
  free(want);
  free(before);
  server_stop();
}

int main(void) {
  rpc_global_init();
  RUN_CASE(case_bf16_job_registers);
  RUN_CASE(case_other_dtype_or_size_refused);
  RUN_CASE(case_initial_pull_in_bf16);
  RUN_CASE(case_sync_step_on_rounded_gradients);
  rpc_global_shutdown();
  return check_report("test_pserver_wire_dtype");
}
