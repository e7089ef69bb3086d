/* The wire format: block messages written by hand are valid protobuf that
 * protobuf-c reads back, protobuf-c's encoding parses here, parsing works
 * however the bytes are split into segments, and malformed bytes are refused.
 * Also the job hash and its field-by-field difference, and endpoint lists. */
#include <stdlib.h>
#include <string.h>

#include "common/endpoints.h"
#include "common/job.h"
#include "common/wire.h"
#include "tests/check.h"

/* Flattens parts into one buffer. */
static uint8_t *flatten(const wire_writer *w, size_t *len) {
  size_t total = 0;
  for (int i = 0; i < w->part_count; i++) total += w->parts[i].len;
  uint8_t *buf = malloc(total);
  REQUIRE(buf != NULL);
  size_t at = 0;
  for (int i = 0; i < w->part_count; i++) {
    memcpy(buf + at, w->parts[i].data, w->parts[i].len);
    at += w->parts[i].len;
  }
  *len = total;
  return buf;
}

/* A message over buf split into pieces of `piece` bytes. */
static rpc_message split(const uint8_t *buf, size_t len, size_t piece, rpc_segment *segs) {
  size_t n = 0;
  for (size_t at = 0; at < len; at += piece) {
    segs[n].data = buf + at;
    segs[n].len = len - at < piece ? len - at : piece;
    n++;
  }
  rpc_message m = {segs, n, len};
  return m;
}

int main(void) {
  ps_error err;
  float a[5] = {1.5f, -2.0f, 0.0f, 3.25f, 1e-7f}, b[300];
  for (int i = 0; i < 300; i++) b[i] = (float)i * 0.5f;

  /* Hand-written PushRequest -> protobuf-c. */
  wire_writer w = {0};
  REQUIRE(wire_writer_begin(&w, 2, &err) == PS_ERR_OK);
  wire_key key = {3, 0xfeedfacecafeULL, 4242};
  wire_writer_push_header(&w, &key, 0x1234567890abcdefULL);
  wire_writer_block(&w, 7, a, 5, NULL);
  wire_writer_block(&w, 300, b, 300, NULL);
  size_t len;
  uint8_t *buf = flatten(&w, &len);
  Pstrain__PushRequest *req = pstrain__push_request__unpack(NULL, len, buf);
  REQUIRE(req != NULL && req->key != NULL && req->n_gradients == 2);
  CHECK_EQ_INT(req->key->trainer_id, 3);
  CHECK(req->key->incarnation == 0xfeedfacecafeULL);
  CHECK_EQ_INT(req->key->step, 4242);
  CHECK(req->config_hash == 0x1234567890abcdefULL);
  CHECK_EQ_INT(req->gradients[1]->id, 300);
  REQUIRE(req->gradients[0]->data.len == sizeof a);
  CHECK(memcmp(req->gradients[0]->data.data, a, sizeof a) == 0);
  CHECK(memcmp(req->gradients[1]->data.data, b, sizeof b) == 0);
  pstrain__push_request__free_unpacked(req, NULL);

  /* ... and parsed here, however it is split. */
  rpc_segment segs[4096];
  wire_block_ref refs[4];
  const size_t pieces[] = {len, 1, 3, 7, 64, 1000};
  for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
    rpc_message msg = split(buf, len, pieces[k], segs);
    wire_blocks_msg m = {.blocks = refs, .block_cap = 4};
    REQUIRE(wire_parse_blocks(&msg, &m, &err) == PS_ERR_OK);
    CHECK(m.has_key);
    CHECK_EQ_INT(m.key.step, 4242);
    CHECK(m.config_hash == 0x1234567890abcdefULL);
    REQUIRE(m.block_count == 2);
    CHECK_EQ_INT(m.blocks[0].id, 7);
    float got[300];
    wire_copy_block(&msg, &m.blocks[1], got);
    CHECK(memcmp(got, b, sizeof b) == 0);
    wire_copy_block(&msg, &m.blocks[0], got);
    CHECK(memcmp(got, a, sizeof a) == 0);
  }

  /* Too many blocks for the caller's array. */
  rpc_message whole = split(buf, len, len, segs);
  wire_blocks_msg small = {.blocks = refs, .block_cap = 1};
  CHECK_EQ_INT(wire_parse_blocks(&whole, &small, &err), PS_ERR_OUT_OF_RANGE);
  /* Every truncation of the message is refused, never read past. */
  int accepted = 0;
  for (size_t cut = 1; cut < len; cut++) {
    rpc_message msg = split(buf, cut, 5, segs);
    wire_blocks_msg m = {.blocks = refs, .block_cap = 4};
    if (wire_parse_blocks(&msg, &m, &err) == PS_ERR_OK) accepted++;
  }
  /* Cuts exactly between top-level fields are well-formed shorter messages. */
  CHECK(accepted <= 3);
  /* Garbage. */
  uint8_t junk[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  rpc_message jm = split(junk, sizeof junk, 16, segs);
  wire_blocks_msg m = {.blocks = refs, .block_cap = 4};
  CHECK_EQ_INT(wire_parse_blocks(&jm, &m, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "malformed block message");
  uint8_t overlong[4] = {0x1a, 0x7f, 0x08, 0x01}; /* block claims 127 bytes, has 2 */
  jm = split(overlong, sizeof overlong, 4, segs);
  CHECK_EQ_INT(wire_parse_blocks(&jm, &m, &err), PS_ERR_INVALID_ARGUMENT);
  free(buf);

  /* ParamsReply packed by protobuf-c parses here. */
  Pstrain__Block blk = PSTRAIN__BLOCK__INIT;
  blk.id = 2;
  blk.data.data = (uint8_t *)a;
  blk.data.len = sizeof a;
  Pstrain__Block *blks[1] = {&blk};
  Pstrain__ParamsReply reply = PSTRAIN__PARAMS_REPLY__INIT;
  reply.pserver_incarnation = 99;
  reply.step = 17;
  reply.n_params = 1;
  reply.params = blks;
  uint8_t *packed;
  REQUIRE(wire_pack(&reply.base, &packed, &len, &err) == PS_ERR_OK);
  rpc_message pm = split(packed, len, 2, segs);
  m = (wire_blocks_msg){.blocks = refs, .block_cap = 4};
  REQUIRE(wire_parse_blocks(&pm, &m, &err) == PS_ERR_OK);
  CHECK(!m.has_key);
  CHECK_EQ_INT(m.pserver_incarnation, 99);
  CHECK_EQ_INT(m.step, 17);
  REQUIRE(m.block_count == 1);
  float got[5];
  wire_copy_block(&pm, &m.blocks[0], got);
  CHECK(memcmp(got, a, sizeof a) == 0);
  /* wire_unpack refuses bytes that are not the message. */
  CHECK(wire_unpack(&pstrain__register_request__descriptor, &jm, &err) == NULL);
  CHECK_CONTAINS(err.msg, "malformed pstrain.RegisterRequest");
  free(packed);
  wire_writer_free(&w);

  /* Job descriptions: to the message and back, hash, difference. */
  job_config job = {.update = UPDATE_SYNC, .trainers = 2, .pservers = 2, .block_size = 32768,
                    .seed = 1, .batch = 64, .steps = 100};
  REQUIRE(model_parse("mlp:784,256,128,10", &job.model, &err) == PS_ERR_OK);
  job.optimizer = (optimizer_config){.kind = OPTIMIZER_ADAM, .lr = 0.001, .beta1 = 0.9,
                                     .beta2 = 0.999, .epsilon = 1e-8, .schedule = LR_COSINE,
                                     .step_size = 1000, .gamma = 0.5, .total_steps = 5000};
  Pstrain__JobConfig jc;
  Pstrain__OptimizerConfig oc;
  char text[256];
  wire_job_to_proto(&job, &jc, &oc, text, sizeof text);
  job_config back;
  REQUIRE(wire_job_from_proto(&jc, &back, &err) == PS_ERR_OK);
  CHECK(job_config_hash(&back) == job_config_hash(&job));
  char diff[512];
  job_config_diff(&job, &back, diff, sizeof diff);
  CHECK_EQ_STR(diff, "");
  job_config other = job;
  REQUIRE(model_parse("mlp:784,128,10", &other.model, &err) == PS_ERR_OK);
  other.trainers = 3;
  other.batch = 32;
  CHECK(job_config_hash(&other) != job_config_hash(&job));
  job_config_diff(&other, &job, diff, sizeof diff);
  CHECK_CONTAINS(diff, "model mlp:784,128,10 vs mlp:784,256,128,10");
  CHECK_CONTAINS(diff, "trainers 3 vs 2");
  CHECK_CONTAINS(diff, "batch 32 vs 64");
  /* Names only, for peers without the token: no value leaks. */
  job_config_diff_fields(&other, &job, diff, sizeof diff);
  CHECK_EQ_STR(diff, "model, trainers, batch");
  oc.lr = -1;
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  oc.lr = 0.001;
  jc.update = "eventually";
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "'eventually' is not sync or async");

  /* Endpoint lists. */
  endpoint_list list;
  REQUIRE(endpoints_parse("127.0.0.1:7000,host-b:7001,[::1]:7002", "--pservers", &list, &err) ==
          PS_ERR_OK);
  CHECK_EQ_INT(list.count, 3);
  CHECK_EQ_STR(list.items[1], "host-b:7001");
  CHECK_EQ_INT(endpoints_parse("", "--pservers", &list, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(endpoints_parse("a:1,,b:2", "--pservers", &list, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "entry 2 is empty");
  CHECK_EQ_INT(endpoints_parse("localhost", "--pservers", &list, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "'localhost' is not HOST:PORT");
  CHECK_EQ_INT(endpoints_parse("h:70000", "--pservers", &list, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(endpoints_parse("a:1,b:2,A:1", "--pservers", &list, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "entry 3 'A:1' repeats entry 1");
  CHECK_EQ_INT(endpoints_parse("a:1,b c:2", "--pservers", &list, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "'b c:2' is not HOST:PORT (the host has a ' ')");
  char host[64];
  REQUIRE(endpoint_host("[::1]:7002", host, sizeof host, &err) == PS_ERR_OK);
  CHECK_EQ_STR(host, "::1");
  REQUIRE(endpoint_host("10.88.0.2:7000", host, sizeof host, &err) == PS_ERR_OK);
  CHECK_EQ_STR(host, "10.88.0.2");
  CHECK_EQ_INT(endpoint_resolve("127.0.0.1:7000", "--pservers", 0, &err), PS_ERR_OK);
  CHECK_EQ_INT(endpoint_resolve("no-such-host.invalid:7000", "--pservers", 0, &err),
               PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "--pservers: host 'no-such-host.invalid' of 'no-such-host.invalid:7000' does not resolve");
  return check_report("test_wire");
}
