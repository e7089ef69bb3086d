/* The wire format: block messages written by hand are valid protobuf that
 * protobuf-c reads back, protobuf-c's encoding parses here, parsing works
 * however the bytes are split into segments, and malformed bytes are refused:
 * every prefix of every message kind (or, where a prefix ends between two
 * top-level fields and so is a valid shorter message, it decodes to exactly
 * the fields before the cut), and every single flipped bit of a block message
 * (refused or decoded differently when it hits a header; only that bit of
 * the data when it hits block data). The writer refuses appends beyond the
 * room it was given and sizes that would overflow. Also the job hash and its
 * field-by-field difference, and endpoint lists. */
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

/* Where each top-level field of a valid encoding ends (0 first): the only
 * places a cut leaves a well-formed, shorter message. A plain walk of the
 * protobuf encoding, independent of wire.c's parser. */
static uint64_t test_varint(const uint8_t *buf, size_t *at) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    uint8_t b = buf[(*at)++];
    v |= (uint64_t)(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
}

static size_t field_ends(const uint8_t *buf, size_t len, size_t *ends, size_t cap) {
  size_t n = 0, at = 0;
  ends[n++] = 0;
  while (at < len) {
    uint64_t tag = test_varint(buf, &at);
    switch (tag & 7) {
    case 0: test_varint(buf, &at); break;
    case 1: at += 8; break;
    case 2: at += (size_t)test_varint(buf, &at); break;
    case 5: at += 4; break;
    default: REQUIRE(!"a wire type the messages do not use");
    }
    REQUIRE(n < cap);
    ends[n++] = at;
  }
  REQUIRE(at == len);
  return n;
}

static int is_end(const size_t *ends, size_t n, size_t cut) {
  for (size_t i = 0; i < n; i++) {
    if (ends[i] == cut) return 1;
  }
  return 0;
}

/* Checks a parse against protobuf-c's reading of the same bytes. */
static void check_same_as_protobuf_c(const rpc_message *msg, const wire_blocks_msg *m,
                                     const ProtobufCMessage *ref) {
  Pstrain__Block **blocks;
  size_t n;
  if (ref->descriptor == &pstrain__push_request__descriptor) {
    const Pstrain__PushRequest *r = (const Pstrain__PushRequest *)ref;
    CHECK_EQ_INT(m->has_key, r->key != NULL);
    if (r->key != NULL) {
      CHECK(m->key.trainer_id == r->key->trainer_id && m->key.incarnation == r->key->incarnation &&
            m->key.step == r->key->step);
    }
    CHECK(m->config_hash == r->config_hash);
    blocks = r->gradients;
    n = r->n_gradients;
  } else {
    const Pstrain__ParamsReply *r = (const Pstrain__ParamsReply *)ref;
    CHECK(m->pserver_incarnation == r->pserver_incarnation && m->step == r->step);
    blocks = r->params;
    n = r->n_params;
  }
  REQUIRE(m->block_count == n);
  for (size_t i = 0; i < n; i++) {
    CHECK_EQ_INT(m->blocks[i].id, blocks[i]->id);
    REQUIRE(m->blocks[i].len == blocks[i]->data.len);
    uint8_t got[2048];
    REQUIRE(m->blocks[i].len <= sizeof got);
    wire_copy_block(msg, &m->blocks[i], got);
    CHECK(m->blocks[i].len == 0 || memcmp(got, blocks[i]->data.data, m->blocks[i].len) == 0);
  }
}

/* Every prefix of a block message is refused, except those ending between
 * top-level fields: those are valid shorter messages (fewer blocks, or no
 * blocks and fewer header fields), read here exactly as protobuf-c reads
 * them. The pserver and the client refuse them by their block count. */
static void check_block_prefixes(const uint8_t *buf, size_t len,
                                 const ProtobufCMessageDescriptor *desc) {
  size_t ends[64];
  size_t n_ends = field_ends(buf, len, ends, 64);
  rpc_segment segs[4096];
  wire_block_ref refs[4];
  int valid = 0;
  for (size_t cut = 0; cut < len; cut++) {
    rpc_message msg = split(buf, cut, 3, segs);
    wire_blocks_msg m = {.blocks = refs, .block_cap = 4};
    ps_error err;
    ps_err rc = wire_parse_blocks(&msg, &m, &err);
    ProtobufCMessage *ref = protobuf_c_message_unpack(desc, NULL, cut, buf);
    if (!is_end(ends, n_ends, cut)) {
      if (rc == PS_ERR_OK || ref != NULL) {
        fprintf(stderr, "%s cut at %zu of %zu: accepted (here %d, protobuf-c %d)\n", desc->name,
                cut, len, rc == PS_ERR_OK, ref != NULL);
        check_failures++;
      }
      CHECK(rc != PS_ERR_OK && strstr(err.msg, "malformed block message") != NULL);
    } else {
      valid++;
      REQUIRE(rc == PS_ERR_OK && ref != NULL);
      check_same_as_protobuf_c(&msg, &m, ref);
    }
    if (ref != NULL) protobuf_c_message_free_unpacked(ref, NULL);
  }
  CHECK_EQ_INT(valid, n_ends - 1); /* every end but the whole message's */
}

/* Flips every bit of a written block message, one at a time. A flip in
 * block data reads back as that data with that bit flipped and nothing else
 * changed; a flip in a field header is refused or reads back differently
 * (another id, key, length or count), never as the original message. */
static void check_block_bit_flips(const wire_writer *w, const uint8_t *buf, size_t len,
                                  const ProtobufCMessageDescriptor *desc) {
  (void)desc;
  unsigned char *header = calloc(len, 1);
  uint8_t *copy = malloc(len);
  REQUIRE(header != NULL && copy != NULL);
  size_t at = 0;
  for (int i = 0; i < w->part_count; i++) {
    const uint8_t *p = w->parts[i].data;
    int is_header = p >= w->bytes && p < w->bytes + w->bytes_used;
    memset(header + at, is_header, w->parts[i].len);
    at += w->parts[i].len;
  }
  rpc_segment segs[4096];
  wire_block_ref refs0[4], refs[4];
  ps_error err;
  rpc_message orig = split(buf, len, 7, segs);
  wire_blocks_msg m0 = {.blocks = refs0, .block_cap = 4};
  REQUIRE(wire_parse_blocks(&orig, &m0, &err) == PS_ERR_OK);
  int refused = 0, differ = 0, data_flips = 0;
  for (size_t pos = 0; pos < len; pos++) {
    for (int bit = 0; bit < 8; bit++) {
      memcpy(copy, buf, len);
      copy[pos] ^= (uint8_t)(1u << bit);
      rpc_message msg = split(copy, len, 7, segs);
      wire_blocks_msg m = {.blocks = refs, .block_cap = 4};
      ps_err rc = wire_parse_blocks(&msg, &m, &err);
      int same = 0;
      if (rc == PS_ERR_OK) {
        same = m.has_key == m0.has_key && memcmp(&m.key, &m0.key, sizeof m.key) == 0 &&
               m.pserver_incarnation == m0.pserver_incarnation && m.step == m0.step &&
               m.block_count == m0.block_count;
        for (size_t i = 0; same && i < m.block_count; i++) {
          /* Blocks lie inside the message; positions are 7-byte segments. */
          CHECK(m.blocks[i].segment * 7 + m.blocks[i].offset + m.blocks[i].len <= len);
          same = m.blocks[i].id == m0.blocks[i].id && m.blocks[i].len == m0.blocks[i].len &&
                 m.blocks[i].segment == m0.blocks[i].segment &&
                 m.blocks[i].offset == m0.blocks[i].offset;
        }
      } else {
        CHECK(rc == PS_ERR_INVALID_ARGUMENT || rc == PS_ERR_OUT_OF_RANGE);
      }
      if (header[pos]) {
        if (same) {
          fprintf(stderr, "bit %d of header byte %zu flipped: read as the original\n", bit, pos);
          check_failures++;
        }
        refused += rc != PS_ERR_OK;
        differ += rc == PS_ERR_OK;
      } else {
        data_flips++;
        if (!same) {
          fprintf(stderr, "bit %d of data byte %zu flipped: the message changed shape\n", bit, pos);
          check_failures++;
        }
      }
    }
  }
  CHECK(refused > 0 && differ > 0 && data_flips > 0);
  free(copy);
  free(header);
}

/* Each small message, through wire_unpack: a prefix ending between
 * top-level fields is the message without its later fields (it packs back
 * to exactly the prefix); every other prefix is refused. */
static void check_prefixes_of(const ProtobufCMessage *whole) {
  const ProtobufCMessageDescriptor *desc = whole->descriptor;
  uint8_t *buf;
  size_t len;
  ps_error err;
  REQUIRE(wire_pack(whole, &buf, &len, &err) == PS_ERR_OK);
  size_t ends[64];
  size_t n_ends = field_ends(buf, len, ends, 64);
  CHECK(n_ends >= 3); /* the test messages set at least two fields */
  rpc_segment segs[4096];
  for (size_t cut = 0; cut <= len; cut++) {
    rpc_message msg = split(buf, cut, 5, segs);
    ProtobufCMessage *m = wire_unpack(desc, &msg, &err);
    if (!is_end(ends, n_ends, cut)) {
      if (m != NULL) {
        fprintf(stderr, "%s cut at %zu of %zu: accepted\n", desc->name, cut, len);
        check_failures++;
        protobuf_c_message_free_unpacked(m, NULL);
      } else {
        CHECK_CONTAINS(err.msg, "malformed");
      }
      continue;
    }
    REQUIRE(m != NULL);
    uint8_t again[2048];
    REQUIRE(protobuf_c_message_get_packed_size(m) <= sizeof again);
    size_t n = protobuf_c_message_pack(m, again);
    if (n != cut || memcmp(again, buf, cut) != 0) {
      fprintf(stderr, "%s cut at %zu: reads as other fields than the prefix's\n", desc->name, cut);
      check_failures++;
    }
    protobuf_c_message_free_unpacked(m, NULL);
  }
  free(buf);
}

static void job_fixture(job_config *job, Pstrain__JobConfig *jc, wire_job_parts *oc, char *text,
                        size_t text_len);

/* Every prefix of each small message (a job among them) is refused or the
 * message without its later fields. */
static void case_small_message_prefixes(void) {
  job_config job;
  Pstrain__JobConfig job_proto, *jc = &job_proto;
  wire_job_parts oc;
  char text[256];
  job_fixture(&job, jc, &oc, text, sizeof text);
  jc->update = "eventually"; /* a job the pserver would refuse packs and parses alike */
  Pstrain__RequestKey key = PSTRAIN__REQUEST_KEY__INIT;
  key.trainer_id = 5;
  key.incarnation = 0x1122334455667788ULL;
  key.step = 300;
  Pstrain__RegisterRequest reg = PSTRAIN__REGISTER_REQUEST__INIT;
  reg.key = &key;
  reg.config_hash = 0xabcdef0123456789ULL;
  reg.job = jc;
  reg.pserver_id = 2;
  Pstrain__RegisterReply reg_reply = PSTRAIN__REGISTER_REPLY__INIT;
  reg_reply.pserver_incarnation = 77;
  reg_reply.step = 300;
  Pstrain__PullRequest pull = PSTRAIN__PULL_REQUEST__INIT;
  pull.key = &key;
  pull.config_hash = 1;
  Pstrain__DoneRequest done = PSTRAIN__DONE_REQUEST__INIT;
  done.key = &key;
  done.config_hash = 2;
  Pstrain__DoneReply done_reply = PSTRAIN__DONE_REPLY__INIT;
  done_reply.pserver_incarnation = 1ULL << 40;
  Pstrain__RollbackRequest rollback = PSTRAIN__ROLLBACK_REQUEST__INIT;
  rollback.key = &key;
  rollback.config_hash = 3;
  rollback.step = 200;
  rollback.restarted_pserver = 1;
  Pstrain__RollbackReply rollback_reply = PSTRAIN__ROLLBACK_REPLY__INIT;
  rollback_reply.pserver_incarnation = 9;
  rollback_reply.step = 200;
  const ProtobufCMessage *all[] = {&reg.base,      &reg_reply.base,      &pull.base,
                                   &done.base,     &done_reply.base,     &rollback.base,
                                   &rollback_reply.base, &jc->base, &key.base};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    /* DoneReply has one field: two ends (0 and the whole). */
    if (all[i] == &done_reply.base) continue;
    check_prefixes_of(all[i]);
  }
  /* The one-field message: its only proper prefix that parses is empty. */
  uint8_t *buf;
  size_t len;
  ps_error err;
  REQUIRE(wire_pack(&done_reply.base, &buf, &len, &err) == PS_ERR_OK);
  rpc_segment segs[64];
  for (size_t cut = 1; cut < len; cut++) {
    rpc_message msg = split(buf, cut, 1, segs);
    CHECK(wire_unpack(&pstrain__done_reply__descriptor, &msg, &err) == NULL);
  }
  free(buf);
}

/* The writer refuses what does not fit the room wire_writer_begin made and
 * sizes that would overflow, writes nothing past its buffers, and says so. */
static void case_writer_limits(void) {
  ps_error err;
  wire_writer w = {0};
  float data[4] = {1, 2, 3, 4};
  /* Never begun: nothing to write into. */
  CHECK_EQ_INT(wire_writer_block(&w, 1, data, 4, NULL), PS_ERR_OUT_OF_RANGE);
  CHECK_EQ_INT(wire_writer_check(&w, &err), PS_ERR_OUT_OF_RANGE);
  /* Room counts that overflow the part count or the byte count. */
  CHECK_EQ_INT(wire_writer_begin(&w, SIZE_MAX, &err), PS_ERR_OUT_OF_RANGE);
  CHECK_EQ_INT(wire_writer_begin(&w, WIRE_WRITER_MAX_BLOCKS + 1, &err), PS_ERR_OUT_OF_RANGE);
  CHECK_CONTAINS(err.msg, "blocks: more than");
  /* One block of room: the second is refused whole, and so is all after it. */
  REQUIRE(wire_writer_begin(&w, 1, &err) == PS_ERR_OK);
  CHECK_EQ_INT(w.status, PS_ERR_OK); /* begin clears an earlier refusal */
  wire_key key = {1, 2, 3};
  CHECK_EQ_INT(wire_writer_push_header(&w, &key, 42), PS_ERR_OK);
  CHECK_EQ_INT(wire_writer_block(&w, 0, data, 4, NULL), PS_ERR_OK);
  CHECK_EQ_INT(wire_writer_check(&w, &err), PS_ERR_OK);
  int parts = w.part_count;
  size_t used = w.bytes_used;
  CHECK_EQ_INT(wire_writer_block(&w, 1, data, 4, NULL), PS_ERR_OUT_OF_RANGE);
  CHECK_EQ_INT(wire_writer_block(&w, 2, data, 0, NULL), PS_ERR_OUT_OF_RANGE);
  CHECK_EQ_INT(w.part_count, parts);
  CHECK_EQ_INT(w.bytes_used, used);
  CHECK_EQ_INT(wire_writer_check(&w, &err), PS_ERR_OUT_OF_RANGE);
  CHECK_CONTAINS(err.msg, "building a block message: more blocks than wire_writer_begin");
  /* One header per message: the largest fits, a second is refused. */
  REQUIRE(wire_writer_begin(&w, 0, &err) == PS_ERR_OK);
  wire_key big = {UINT32_MAX, UINT64_MAX, UINT64_MAX};
  CHECK_EQ_INT(wire_writer_push_header(&w, &big, UINT64_MAX), PS_ERR_OK);
  CHECK_EQ_INT(wire_writer_params_header(&w, 1, 2), PS_ERR_OUT_OF_RANGE);
  CHECK(w.bytes_used <= w.bytes_cap);
  CHECK_EQ_INT(wire_writer_check(&w, &err), PS_ERR_OUT_OF_RANGE);
  CHECK_CONTAINS(err.msg, "a second message header");
  /* Room for none: the first block is refused. */
  REQUIRE(wire_writer_begin(&w, 0, &err) == PS_ERR_OK);
  CHECK_EQ_INT(wire_writer_block(&w, 0, data, 1, NULL), PS_ERR_OUT_OF_RANGE);
  CHECK_EQ_INT(w.part_count, 0);
  /* A block whose byte length overflows size_t; its data is never read. */
  REQUIRE(wire_writer_begin(&w, 2, &err) == PS_ERR_OK);
  CHECK_EQ_INT(wire_writer_block(&w, 0, data, SIZE_MAX / sizeof(float), NULL), PS_ERR_OUT_OF_RANGE);
  CHECK_EQ_INT(wire_writer_check(&w, &err), PS_ERR_OUT_OF_RANGE);
  CHECK_CONTAINS(err.msg, "too large");
  /* The most a begin sizes for fits exactly: header and every block. */
  REQUIRE(wire_writer_begin(&w, 3, &err) == PS_ERR_OK);
  CHECK_EQ_INT(wire_writer_params_header(&w, UINT64_MAX, UINT64_MAX), PS_ERR_OK);
  for (uint32_t id = 0; id < 3; id++) {
    CHECK_EQ_INT(wire_writer_block(&w, UINT32_MAX - id, data, 4, NULL), PS_ERR_OK);
  }
  CHECK_EQ_INT(wire_writer_check(&w, &err), PS_ERR_OK);
  CHECK(w.part_count <= w.part_cap && w.bytes_used <= w.bytes_cap);
  wire_writer_free(&w);
}

/* The push every block case reads: two blocks, data_a and data_b. */
static float data_a[5] = {1.5f, -2.0f, 0.0f, 3.25f, 1e-7f}, data_b[300];
static const wire_key push_key = {3, 0xfeedfacecafeULL, 4242};
/* The ways a case splits a message into segments. */
static const size_t piece_sizes[] = {0 /* whole */, 1, 3, 7, 64, 1000};

/* Writes the push into w (begun here) and returns it flattened, *len bytes. */
static uint8_t *push_fixture(wire_writer *w, size_t *len) {
  ps_error err;
  for (int i = 0; i < 300; i++) data_b[i] = (float)i * 0.5f;
  REQUIRE(wire_writer_begin(w, 2, &err) == PS_ERR_OK);
  wire_writer_push_header(w, &push_key, 0x1234567890abcdefULL);
  wire_writer_block(w, 7, data_a, 5, NULL);
  wire_writer_block(w, 300, data_b, 300, NULL);
  return flatten(w, len);
}

/* Hand-written PushRequest -> protobuf-c. */
static void case_push_read_by_protobuf_c(void) {
  wire_writer w = {0};
  size_t len;
  uint8_t *buf = push_fixture(&w, &len);
  Pstrain__PushRequest *req = pstrain__push_request__unpack(NULL, len, buf);
  REQUIRE(req != NULL && req->key != NULL && req->n_gradients == 2);
  CHECK_EQ_INT(req->key->trainer_id, 3);
  CHECK(req->key->incarnation == 0xfeedfacecafeULL);
  CHECK_EQ_INT(req->key->step, 4242);
  CHECK(req->config_hash == 0x1234567890abcdefULL);
  CHECK_EQ_INT(req->gradients[1]->id, 300);
  REQUIRE(req->gradients[0]->data.len == sizeof data_a);
  CHECK(memcmp(req->gradients[0]->data.data, data_a, sizeof data_a) == 0);
  CHECK(memcmp(req->gradients[1]->data.data, data_b, sizeof data_b) == 0);
  pstrain__push_request__free_unpacked(req, NULL);
  free(buf);
  wire_writer_free(&w);
}

/* ... and parsed here, however it is split; too many blocks for the
 * caller's array; every prefix and every flipped bit: refused, or exactly
 * what it says. */
static void case_push_parsed_however_split(void) {
  ps_error err;
  wire_writer w = {0};
  size_t len;
  uint8_t *buf = push_fixture(&w, &len);
  rpc_segment segs[4096];
  wire_block_ref refs[4];
  for (size_t k = 0; k < sizeof piece_sizes / sizeof piece_sizes[0]; k++) {
    rpc_message msg = split(buf, len, piece_sizes[k] ? piece_sizes[k] : len, segs);
    wire_blocks_msg m = {.blocks = refs, .block_cap = 4};
    REQUIRE(wire_parse_blocks(&msg, &m, &err) == PS_ERR_OK);
    CHECK(m.has_key);
    CHECK_EQ_INT(m.key.step, 4242);
    CHECK(m.config_hash == 0x1234567890abcdefULL);
    REQUIRE(m.block_count == 2);
    CHECK_EQ_INT(m.blocks[0].id, 7);
    float got[300];
    wire_copy_block(&msg, &m.blocks[1], got);
    CHECK(memcmp(got, data_b, sizeof data_b) == 0);
    wire_copy_block(&msg, &m.blocks[0], got);
    CHECK(memcmp(got, data_a, sizeof data_a) == 0);
  }

  rpc_message whole = split(buf, len, len, segs);
  wire_blocks_msg small = {.blocks = refs, .block_cap = 1};
  CHECK_EQ_INT(wire_parse_blocks(&whole, &small, &err), PS_ERR_OUT_OF_RANGE);
  check_block_prefixes(buf, len, &pstrain__push_request__descriptor);
  check_block_bit_flips(&w, buf, len, &pstrain__push_request__descriptor);
  free(buf);
  wire_writer_free(&w);
}

/* Garbage: a varint longer than 10 bytes, a block longer than the message;
 * wire_unpack refuses bytes that are not the message. */
static void case_malformed_bytes_refused(void) {
  ps_error err;
  rpc_segment segs[16];
  wire_block_ref refs[4];
  uint8_t junk[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  rpc_message jm = split(junk, sizeof junk, 16, segs);
  wire_blocks_msg m = {.blocks = refs, .block_cap = 4};
  CHECK_EQ_INT(wire_parse_blocks(&jm, &m, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "malformed block message");
  uint8_t overlong[4] = {0x1a, 0x7f, 0x08, 0x01}; /* block claims 127 bytes, has 2 */
  jm = split(overlong, sizeof overlong, 4, segs);
  CHECK_EQ_INT(wire_parse_blocks(&jm, &m, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK(wire_unpack(&pstrain__register_request__descriptor, &jm, &err) == NULL);
  CHECK_CONTAINS(err.msg, "malformed pstrain.RegisterRequest");
}

/* ParamsReply packed by protobuf-c parses here; each prefix refused or the shorter message. */
static void case_params_reply_from_protobuf_c(void) {
  ps_error err;
  rpc_segment segs[4096];
  wire_block_ref refs[4];
  size_t len;
  Pstrain__Block blk = PSTRAIN__BLOCK__INIT;
  blk.id = 2;
  blk.data.data = (uint8_t *)data_a;
  blk.data.len = sizeof data_a;
  Pstrain__Block *blks[1] = {&blk};
  Pstrain__ParamsReply reply = PSTRAIN__PARAMS_REPLY__INIT;
  reply.pserver_incarnation = 99;
  reply.step = 17;
  reply.n_params = 1;
  reply.params = blks;
  uint8_t *packed;
  REQUIRE(wire_pack(&reply.base, &packed, &len, &err) == PS_ERR_OK);
  rpc_message pm = split(packed, len, 2, segs);
  wire_blocks_msg m = {.blocks = refs, .block_cap = 4};
  REQUIRE(wire_parse_blocks(&pm, &m, &err) == PS_ERR_OK);
  CHECK(!m.has_key);
  CHECK_EQ_INT(m.pserver_incarnation, 99);
  CHECK_EQ_INT(m.step, 17);
  REQUIRE(m.block_count == 1);
  float got[5];
  wire_copy_block(&pm, &m.blocks[0], got);
  CHECK(memcmp(got, data_a, sizeof data_a) == 0);
  check_block_prefixes(packed, len, &pstrain__params_reply__descriptor);
  free(packed);
}

/* SparseRows: a push with a block, gradients and next keys -> protobuf-c,
 * and parsed here however it is split; every prefix and flipped bit. */
static void case_sparse_rows_round_trip(void) {
  ps_error err;
  wire_writer w = {0};
  size_t len;
  rpc_segment segs[4096];
  wire_block_ref refs[4];
  uint64_t keys[3] = {1, 0xffffffffffffffffULL, 1ULL << 40};
  uint32_t counts[3] = {2, 1, 7};
  float vals[6] = {0.5f, -1.0f, 2.0f, 3.0f, -4.5f, 1e-3f};
  REQUIRE(wire_writer_begin(&w, 1, &err) == PS_ERR_OK);
  wire_writer_push_header(&w, &push_key, 77);
  wire_writer_block(&w, 1, data_a, 5, NULL);
  wire_writer_sparse(&w, WIRE_SPARSE_GRADS, 1, keys, 3, vals, 6, NULL, NULL);
  wire_writer_sparse(&w, WIRE_SPARSE_KEYS, 0, keys, 2, NULL, 0, counts, NULL);
  wire_writer_sparse(&w, WIRE_SPARSE_KEYS, 1, keys, 0, NULL, 0, counts, NULL);
  REQUIRE(wire_writer_check(&w, &err) == PS_ERR_OK);
  uint8_t *sb = flatten(&w, &len);
  Pstrain__PushRequest *sr = pstrain__push_request__unpack(NULL, len, sb);
  REQUIRE(sr != NULL && sr->n_sparse_grads == 1 && sr->n_sparse_keys == 2);
  CHECK_EQ_INT(sr->sparse_grads[0]->table, 1);
  REQUIRE(sr->sparse_grads[0]->keys.len == sizeof keys);
  CHECK(memcmp(sr->sparse_grads[0]->keys.data, keys, sizeof keys) == 0);
  CHECK(memcmp(sr->sparse_grads[0]->values.data, vals, sizeof vals) == 0);
  CHECK_EQ_INT(sr->sparse_grads[0]->counts.len, 0);
  CHECK_EQ_INT(sr->sparse_keys[0]->table, 0);
  REQUIRE(sr->sparse_keys[0]->counts.len == 8);
  CHECK(memcmp(sr->sparse_keys[0]->counts.data, counts, 8) == 0);
  CHECK_EQ_INT(sr->sparse_keys[1]->keys.len, 0);
  pstrain__push_request__free_unpacked(sr, NULL);
  for (size_t k = 0; k < sizeof piece_sizes / sizeof piece_sizes[0]; k++) {
    rpc_message msg = split(sb, len, piece_sizes[k] ? piece_sizes[k] : len, segs);
    wire_blocks_msg pm2 = {.blocks = refs, .block_cap = 4};
    REQUIRE(wire_parse_blocks(&msg, &pm2, &err) == PS_ERR_OK);
    REQUIRE(pm2.block_count == 1 && pm2.sparse_count == 3);
    CHECK_EQ_INT(pm2.sparse[0].field, WIRE_SPARSE_GRADS);
    CHECK_EQ_INT(pm2.sparse[0].table, 1);
    uint64_t gk[3];
    float gv[6];
    REQUIRE(pm2.sparse[0].keys.len == sizeof gk && pm2.sparse[0].values.len == sizeof gv);
    wire_copy_block(&msg, &pm2.sparse[0].keys, gk);
    wire_copy_block(&msg, &pm2.sparse[0].values, gv);
    CHECK(memcmp(gk, keys, sizeof keys) == 0 && memcmp(gv, vals, sizeof vals) == 0);
    CHECK_EQ_INT(pm2.sparse[1].field, WIRE_SPARSE_KEYS);
    uint32_t gc[2];
    REQUIRE(pm2.sparse[1].counts.len == sizeof gc && pm2.sparse[1].keys.len == 16);
    wire_copy_block(&msg, &pm2.sparse[1].counts, gc);
    CHECK(gc[0] == 2 && gc[1] == 1);
    CHECK_EQ_INT(pm2.sparse[2].keys.len, 0);
  }
  check_block_prefixes(sb, len, &pstrain__push_request__descriptor);
  free(sb);
  wire_writer_free(&w);
}

/* A push's data position (handed-out data): protobuf-c reads what the
 * writer wrote, the parser reads it back however split, and a message
 * without one parses with has_position 0. */
static void case_data_position(void) {
  ps_error err;
  wire_writer w = {0};
  size_t len;
  rpc_segment segs[4096];
  wire_block_ref refs[4];
  const wire_position at = {3, 1ULL << 40, 4096};
  REQUIRE(wire_writer_begin(&w, 1, &err) == PS_ERR_OK);
  wire_writer_push_header(&w, &push_key, 77);
  wire_writer_position(&w, &at);
  wire_writer_block(&w, 1, data_a, 5, NULL);
  REQUIRE(wire_writer_check(&w, &err) == PS_ERR_OK);
  uint8_t *buf = flatten(&w, &len);
  Pstrain__PushRequest *r = pstrain__push_request__unpack(NULL, len, buf);
  REQUIRE(r != NULL && r->position != NULL);
  CHECK(r->position->epoch == 3 && r->position->shard == 1ULL << 40 &&
        r->position->offset == 4096);
  pstrain__push_request__free_unpacked(r, NULL);
  for (size_t k = 0; k < sizeof piece_sizes / sizeof piece_sizes[0]; k++) {
    rpc_message msg = split(buf, len, piece_sizes[k] ? piece_sizes[k] : len, segs);
    wire_blocks_msg m = {.blocks = refs, .block_cap = 4};
    REQUIRE(wire_parse_blocks(&msg, &m, &err) == PS_ERR_OK);
    CHECK_EQ_INT(m.has_position, 1);
    CHECK(m.position.epoch == 3 && m.position.shard == 1ULL << 40 && m.position.offset == 4096);
    CHECK_EQ_INT(m.block_count, 1);
  }
  check_block_prefixes(buf, len, &pstrain__push_request__descriptor);
  free(buf);
  REQUIRE(wire_writer_begin(&w, 1, &err) == PS_ERR_OK);
  wire_writer_push_header(&w, &push_key, 77);
  REQUIRE(wire_writer_check(&w, &err) == PS_ERR_OK);
  buf = flatten(&w, &len);
  rpc_message msg = split(buf, len, len, segs);
  wire_blocks_msg m = {.blocks = refs, .block_cap = 4};
  REQUIRE(wire_parse_blocks(&msg, &m, &err) == PS_ERR_OK);
  CHECK_EQ_INT(m.has_position, 0);
  free(buf);
  wire_writer_free(&w);
}

/* A sync step's members (handed-out data): encoded, carried by a push
 * that protobuf-c reads as bytes, parsed back however split and decoded;
 * bad lists are refused and change nothing. */
static void case_members(void) {
  ps_error err;
  uint32_t seq[300] = {0}, back[300];
  seq[0] = 7;
  seq[3] = 1;
  seq[299] = 1u << 30;
  uint8_t list[WIRE_MEMBERS_MAX(300)];
  size_t len = wire_members_encode(seq, 300, list);
  CHECK_EQ_INT(len, 2 + 2 + 2 + 5);
  wire_writer w = {0};
  rpc_segment segs[4096];
  wire_block_ref refs[4];
  REQUIRE(wire_writer_begin(&w, 1, &err) == PS_ERR_OK);
  wire_writer_push_header(&w, &push_key, 77);
  wire_writer_members(&w, list, len);
  wire_writer_block(&w, 1, data_a, 5, NULL);
  REQUIRE(wire_writer_check(&w, &err) == PS_ERR_OK);
  size_t total;
  uint8_t *buf = flatten(&w, &total);
  Pstrain__PushRequest *r = pstrain__push_request__unpack(NULL, total, buf);
  REQUIRE(r != NULL);
  CHECK(r->members.len == len && memcmp(r->members.data, list, len) == 0);
  pstrain__push_request__free_unpacked(r, NULL);
  for (size_t k = 0; k < sizeof piece_sizes / sizeof piece_sizes[0]; k++) {
    rpc_message msg = split(buf, total, piece_sizes[k] ? piece_sizes[k] : total, segs);
    wire_blocks_msg m = {.blocks = refs, .block_cap = 4};
    REQUIRE(wire_parse_blocks(&msg, &m, &err) == PS_ERR_OK);
    REQUIRE(m.members.len == len);
    uint8_t copy[sizeof list];
    wire_copy_block(&msg, &m.members, copy);
    REQUIRE(wire_members_decode(copy, len, back, 300, &err) == PS_ERR_OK);
    CHECK(memcmp(back, seq, sizeof seq) == 0);
  }
  free(buf);
  wire_writer_free(&w);
  /* Refused, back[] untouched: an id past the job's trainers, ids out of
   * order, a zero number, a cut varint. */
  const uint8_t past[] = {0x80, 0x02, 1}, order[] = {3, 1, 0, 1}, zero[] = {2, 0}, cut[] = {2, 0x81};
  CHECK_EQ_INT(wire_members_decode(past, sizeof past, back, 256, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "trainer 256 (number 1) after trainer -1, in a job of 256");
  CHECK_EQ_INT(wire_members_decode(order, sizeof order, back, 300, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "trainer 0 (number 1) after trainer 3");
  CHECK_EQ_INT(wire_members_decode(zero, sizeof zero, back, 300, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(wire_members_decode(cut, sizeof cut, back, 300, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "malformed");
  CHECK(memcmp(back, seq, sizeof seq) == 0);
  CHECK_EQ_INT(wire_members_decode(list, 0, back, 300, &err), PS_ERR_OK);
  CHECK(back[0] == 0 && back[299] == 0);
}

/* A PullRequest's kind; more SparseRows than a message may hold. */
static void case_pull_kind_and_sparse_limit(void) {
  ps_error err;
  wire_writer w = {0};
  size_t len;
  rpc_segment segs[4096];
  wire_block_ref refs[4];
  uint64_t keys[3] = {1, 0xffffffffffffffffULL, 1ULL << 40};
  REQUIRE(wire_writer_begin(&w, 0, &err) == PS_ERR_OK);
  wire_writer_push_header(&w, &push_key, 77);
  wire_writer_sparse(&w, WIRE_SPARSE_KEYS, 1, keys, 3, NULL, 0, NULL, NULL);
  wire_writer_pull_kind(&w, PSTRAIN__PULL_KIND__PULL_LOOKUP);
  REQUIRE(wire_writer_check(&w, &err) == PS_ERR_OK);
  uint8_t *sb = flatten(&w, &len);
  Pstrain__PullRequest *pr = pstrain__pull_request__unpack(NULL, len, sb);
  REQUIRE(pr != NULL && pr->n_sparse_keys == 1);
  CHECK(pr->kind == PSTRAIN__PULL_KIND__PULL_LOOKUP);
  pstrain__pull_request__free_unpacked(pr, NULL);
  rpc_message msg = split(sb, len, 5, segs);
  wire_blocks_msg pm3 = {.blocks = refs, .block_cap = 4};
  REQUIRE(wire_parse_blocks(&msg, &pm3, &err) == PS_ERR_OK);
  CHECK_EQ_INT(pm3.kind, PSTRAIN__PULL_KIND__PULL_LOOKUP);
  CHECK_EQ_INT(pm3.sparse_count, 1);
  free(sb);
  wire_writer_free(&w);
  REQUIRE(wire_writer_begin(&w, 0, &err) == PS_ERR_OK);
  for (int i = 0; i <= WIRE_MAX_SPARSE; i++) {
    wire_writer_sparse(&w, WIRE_SPARSE_KEYS, 0, keys, 1, NULL, 0, NULL, NULL);
  }
  CHECK_EQ_INT(wire_writer_check(&w, &err), PS_ERR_OUT_OF_RANGE);
  CHECK_CONTAINS(err.msg, "WIRE_MAX_SPARSE");
  wire_writer_free(&w);
}

/* An Adam, cosine-schedule job of 2 trainers and 2 pservers, and its message. */
static void job_fixture(job_config *job, Pstrain__JobConfig *jc, wire_job_parts *oc, char *text,
                        size_t text_len) {
  ps_error err;
  *job = (job_config){.update = UPDATE_SYNC, .trainers = 2, .pservers = 2, .block_size = 32768,
                      .seed = 1, .batch = 64, .steps = 100};
  REQUIRE(model_parse("mlp:784,256,128,10", &job->model, &err) == PS_ERR_OK);
  job->optimizer = (optimizer_config){.kind = OPTIMIZER_ADAM, .lr = 0.001, .beta1 = 0.9,
                                      .beta2 = 0.999, .epsilon = 1e-8, .schedule = LR_COSINE,
                                      .step_size = 1000, .gamma = 0.5, .total_steps = 5000};
  wire_job_to_proto(job, jc, oc, text, text_len);
}

/* Job descriptions: to the message and back, hash, difference. */
static void case_job_round_trip_hash_and_diff(void) {
  ps_error err;
  job_config job;
  Pstrain__JobConfig jc;
  wire_job_parts oc;
  char text[256];
  job_fixture(&job, &jc, &oc, text, sizeof text);
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
  oc.optimizer.lr = -1;
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  oc.optimizer.lr = 0.001;
  jc.update = "eventually";
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "'eventually' is not sync, async, ssp or geo");
}

/* Endpoint lists: parsed, refused with the entry named, hosts, resolution. */
static void case_endpoint_lists(void) {
  ps_error err;
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
}

int main(void) {
  RUN_CASE(case_push_read_by_protobuf_c);
  RUN_CASE(case_push_parsed_however_split);
  RUN_CASE(case_malformed_bytes_refused);
  RUN_CASE(case_params_reply_from_protobuf_c);
  RUN_CASE(case_sparse_rows_round_trip);
  RUN_CASE(case_pull_kind_and_sparse_limit);
  RUN_CASE(case_data_position);
  RUN_CASE(case_members);
  RUN_CASE(case_job_round_trip_hash_and_diff);
  RUN_CASE(case_small_message_prefixes);
  RUN_CASE(case_writer_limits);
  RUN_CASE(case_endpoint_lists);
  return check_report("test_wire");
}
