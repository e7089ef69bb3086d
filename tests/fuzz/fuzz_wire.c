/* libFuzzer target: the message decoding both daemons run on received
 * bytes. The first byte picks how many segments the rest arrives in and the
 * block capacity. Invariants, each an abort (a finding):
 * - wire_parse_blocks: every block reference lies inside the message, and
 *   wire_copy_block of it yields exactly those bytes of the flat message,
 *   and wire_decode_block (bf16, fp16) the decoding of those bytes;
 *   never more blocks than the capacity; an accepted push written back with
 *   wire_writer parses to the same key, hash, dtype and blocks;
 * - protobuf-c unpacking of each small message, then wire_job_from_proto:
 *   an accepted job survives wire_job_to_proto, packing and unpacking with
 *   the same hash, and its text, hash and difference functions run;
 * - model_parse of the bytes as text. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/job.h"
#include "common/log.h"
#include "common/wire.h"
#include "tests/fuzz/fuzz_job.h"

static void finding(const char *what) {
  fprintf(stderr, "fuzz_wire: %s\n", what);
  abort();
}

/* Absolute offset of (segment, offset) in msg. */
static size_t absolute(const rpc_message *msg, size_t segment, size_t offset) {
  size_t at = 0;
  for (size_t i = 0; i < segment && i < msg->count; i++) at += msg->segments[i].len;
  return at + offset;
}

static void check_blocks(const rpc_message *msg, const uint8_t *flat, size_t cap) {
  wire_block_ref refs[64];
  wire_blocks_msg m = {.blocks = refs, .block_cap = cap};
  ps_error err;
  if (wire_parse_blocks(msg, &m, &err) != PS_ERR_OK) return;
  if (m.block_count > cap) finding("more blocks than the capacity");
  uint8_t *copy = malloc(msg->total > 0 ? msg->total : 1);
  if (copy == NULL) abort();
  for (size_t i = 0; i < m.block_count; i++) {
    const wire_block_ref *b = &m.blocks[i];
    if (b->len == 0) continue;
    if (b->segment >= msg->count || b->offset >= msg->segments[b->segment].len) {
      finding("a block starts outside its segment");
    }
    size_t start = absolute(msg, b->segment, b->offset);
    if (start > msg->total || b->len > msg->total - start) finding("a block overruns the message");
    wire_copy_block(msg, b, copy);
    if (memcmp(copy, flat + start, b->len) != 0) finding("a block's copy differs from its bytes");
    /* Elements may straddle segments: decoded in place as from flat bytes. */
    float *got = malloc(b->len * 2 + 4), *want = malloc(b->len * 2 + 4);
    if (got == NULL || want == NULL) abort();
    for (int d = WIRE_DTYPE_BF16; d <= WIRE_DTYPE_FP16 && b->len % 2 == 0; d++) {
      wire_decode_block(msg, b, (wire_dtype)d, got);
      wire_dtype_decode((wire_dtype)d, flat + start, want, b->len / 2);
      if (memcmp(got, want, b->len * 2) != 0) finding("a block decodes unlike its bytes");
    }
    free(got);
    free(want);
  }
  /* A push (key, no number in field 1) written back parses the same. */
  if (m.has_key && m.pserver_incarnation == 0 && m.block_count > 0) {
    wire_writer w = {0};
    if (wire_writer_begin(&w, m.block_count, &err) != PS_ERR_OK) abort();
    wire_writer_push_header(&w, &m.key, m.config_hash);
    wire_writer_dtype(&w, (wire_dtype)m.dtype);
    float *data = malloc(msg->total + sizeof(float));
    if (data == NULL) abort();
    int whole = 1;
    for (size_t i = 0; i < m.block_count; i++) whole &= m.blocks[i].len % sizeof(float) == 0;
    if (whole) {
      size_t at = 0;
      for (size_t i = 0; i < m.block_count; i++) {
        wire_copy_block(msg, &m.blocks[i], (uint8_t *)data + at);
        wire_writer_block(&w, m.blocks[i].id, (float *)((uint8_t *)data + at),
                          m.blocks[i].len / sizeof(float), NULL);
        at += m.blocks[i].len;
      }
      if (wire_writer_check(&w, &err) != PS_ERR_OK) finding("a parsed push does not fit its writer");
      rpc_segment segs[200];
      if (w.part_count > 200) abort();
      size_t total = 0;
      for (int i = 0; i < w.part_count; i++) {
        segs[i] = (rpc_segment){w.parts[i].data, w.parts[i].len};
        total += w.parts[i].len;
      }
      rpc_message again = {segs, (size_t)w.part_count, total};
      wire_block_ref refs2[64];
      wire_blocks_msg m2 = {.blocks = refs2, .block_cap = cap};
      if (wire_parse_blocks(&again, &m2, &err) != PS_ERR_OK) finding("a rewritten push is refused");
      if (!m2.has_key || memcmp(&m2.key, &m.key, sizeof m.key) != 0 ||
          m2.config_hash != m.config_hash || m2.dtype != m.dtype ||
          m2.block_count != m.block_count) {
        finding("a rewritten push parses differently");
      }
      for (size_t i = 0; i < m.block_count; i++) {
        if (m2.blocks[i].id != m.blocks[i].id || m2.blocks[i].len != m.blocks[i].len) {
          finding("a rewritten block parses differently");
        }
      }
    }
    free(data);
    wire_writer_free(&w);
  }
  free(copy);
}

static void check_job(const Pstrain__JobConfig *jc) {
  job_config job, back, reference;
  ps_error err;
  if (jc == NULL || wire_job_from_proto(jc, &job, &err) != PS_ERR_OK) return;
  Pstrain__JobConfig out;
  wire_job_parts oc;
  char text[256];
  wire_job_to_proto(&job, &out, &oc, text, sizeof text);
  uint8_t buf[1024];
  size_t len = protobuf_c_message_get_packed_size(&out.base);
  if (len > sizeof buf) finding("an accepted job packs to more than 1 KiB");
  protobuf_c_message_pack(&out.base, buf);
  Pstrain__JobConfig *again = pstrain__job_config__unpack(NULL, len, buf);
  if (again == NULL) finding("an accepted job does not unpack after packing");
  if (wire_job_from_proto(again, &back, &err) != PS_ERR_OK) finding("an accepted job is refused after a round trip");
  if (job_config_hash(&back) != job_config_hash(&job)) finding("a job's hash changes in a round trip");
  pstrain__job_config__free_unpacked(again, NULL);
  char line[1024], diff[512];
  job_config_format(&job, line, sizeof line);
  fuzz_job(&reference, UPDATE_SYNC);
  job_config_diff(&job, &reference, diff, sizeof diff);
  job_config_diff_fields(&job, &reference, diff, sizeof diff);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  log_set_level(LOG_LEVEL_ERROR);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t want = (size_t)(data[0] & 7) + 1, cap = (size_t)(data[0] >> 3) * 2 + 1; /* 1..63 */
  const uint8_t *body = data + 1;
  size_t len = size - 1;
  size_t count = len == 0 ? 0 : (want < len ? want : len);
  rpc_segment segs[8];
  for (size_t i = 0, from = 0; i < count; i++) {
    size_t to = len * (i + 1) / count;
    segs[i] = (rpc_segment){body + from, to - from};
    from = to;
  }
  rpc_message msg = {segs, count, len};
  check_blocks(&msg, body, cap);

  const ProtobufCMessageDescriptor *small[] = {
      &pstrain__register_request__descriptor, &pstrain__pull_request__descriptor,
      &pstrain__done_request__descriptor, &pstrain__job_config__descriptor,
      &pstrain__register_reply__descriptor, &pstrain__done_reply__descriptor,
      &pstrain__rollback_request__descriptor};
  for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
    ps_error err;
    ProtobufCMessage *m = wire_unpack(small[i], &msg, &err);
    if (m == NULL) continue;
    if (small[i] == &pstrain__register_request__descriptor) {
      check_job(((Pstrain__RegisterRequest *)m)->job);
    } else if (small[i] == &pstrain__job_config__descriptor) {
      check_job((Pstrain__JobConfig *)m);
    }
    protobuf_c_message_free_unpacked(m, NULL);
  }

  char *text = malloc(len + 1);
  if (text == NULL) abort();
  memcpy(text, body, len);
  text[len] = '\0';
  model_desc model;
  ps_error err;
  if (model_parse(text, &model, &err) == PS_ERR_OK) {
    char again[512];
    model_format(&model, again, sizeof again);
    model_desc back;
    if (model_parse(again, &back, &err) != PS_ERR_OK || memcmp(&back, &model, sizeof model) != 0) {
      finding("a parsed model formats to text that parses differently");
    }
  }
  free(text);
  return 0;
}
