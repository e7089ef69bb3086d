/* protobuf-c for small messages; the protobuf wire format by hand for the
 * block messages (tag = field << 3 | wire type; varints; length-delimited). */
#include "common/wire.h"

#include <stdlib.h>
#include <string.h>

#include "common/job_limits.h"

enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_FIXED32 = 5 };

/* Longest field header of a block: tag, length, id tag, id, data tag, length. */
#define BLOCK_HEADER_MAX (1 + 10 + 1 + 5 + 1 + 10)
#define MESSAGE_HEADER_MAX 64
/* A members list (field 10) naming every trainer id, with its tag and length. */
#define MEMBERS_ROOM_BYTES (WIRE_MEMBERS_MAX(PSTRAIN_MAX_TRAINERS) + 12)
/* Longest header of a SparseRows: tag, length, table, and three data headers. */
#define SPARSE_HEADER_MAX (1 + 10 + 1 + 5 + 3 * (1 + 10))
/* Room wire_writer_begin keeps beyond the blocks: the SparseRows, a pull
 * kind, a dtype, the deltas flag and a data position. */
#define POSITION_MAX (2 + 1 + 3 * 11)
#define SPARSE_ROOM_BYTES (WIRE_MAX_SPARSE * SPARSE_HEADER_MAX + 3 * (1 + 5) + POSITION_MAX)
#define SPARSE_ROOM_PARTS (WIRE_MAX_SPARSE * 4 + 2)

/* --- protobuf-c ------------------------------------------------------------- */

ProtobufCMessage *wire_unpack(const ProtobufCMessageDescriptor *desc, const rpc_message *msg,
                              ps_error *err) {
  uint8_t *flat = malloc(msg->total > 0 ? msg->total : 1);
  if (flat == NULL) {
    ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory unpacking a %s", desc->name);
    return NULL;
  }
  size_t at = 0;
  for (size_t i = 0; i < msg->count; i++) {
    memcpy(flat + at, msg->segments[i].data, msg->segments[i].len);
    at += msg->segments[i].len;
  }
  ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, msg->total, flat);
  free(flat);
  if (m == NULL) {
    ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "malformed %s (%zu bytes)", desc->name, msg->total);
  }
  return m;
}

ps_err wire_pack(const ProtobufCMessage *m, uint8_t **out, size_t *len, ps_error *err) {
  size_t size = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(size > 0 ? size : 1);
  if (buf == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory packing a message");
  *len = protobuf_c_message_pack(m, buf);
  *out = buf;
  return PS_ERR_OK;
}

/* --- writing block messages ------------------------------------------------- */

size_t wire_put_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (uint8_t)v;
  return n;
}

static size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static uint8_t tag(unsigned field, unsigned wire_type) { return (uint8_t)(field << 3 | wire_type); }

ps_err wire_writer_begin(wire_writer *w, size_t max_blocks, ps_error *err) {
  if (max_blocks > WIRE_WRITER_MAX_BLOCKS ||
      max_blocks > (SIZE_MAX - MESSAGE_HEADER_MAX - SPARSE_ROOM_BYTES - MEMBERS_ROOM_BYTES) /
                        BLOCK_HEADER_MAX) {
    return ps_error_set(err, PS_ERR_OUT_OF_RANGE, "a message of %zu blocks: more than %zu",
                        max_blocks, (size_t)WIRE_WRITER_MAX_BLOCKS);
  }
  size_t bytes =
      MESSAGE_HEADER_MAX + max_blocks * BLOCK_HEADER_MAX + SPARSE_ROOM_BYTES + MEMBERS_ROOM_BYTES;
  /* fits: max_blocks <= WIRE_WRITER_MAX_BLOCKS */
  int parts = (int)(2 * max_blocks + 3 + SPARSE_ROOM_PARTS);
  if (bytes > w->bytes_cap) {
    uint8_t *grown = realloc(w->bytes, bytes);
    if (grown == NULL) {
      return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory for a message of %zu blocks",
                          max_blocks);
    }
    w->bytes = grown;
    w->bytes_cap = bytes;
  }
  if (parts > w->part_cap) {
    if ((size_t)parts > SIZE_MAX / sizeof *w->parts) {
      return ps_error_set(err, PS_ERR_OUT_OF_RANGE, "a message of %zu blocks is too large",
                          max_blocks);
    }
    rpc_part *grown = realloc(w->parts, (size_t)parts * sizeof *grown);
    if (grown == NULL) {
      return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory for a message of %zu blocks",
                          max_blocks);
    }
    w->parts = grown;
    w->part_cap = parts;
  }
  w->bytes_used = 0;
  w->part_count = 0;
  w->block_room = max_blocks;
  w->block_count = 0;
  w->sparse_count = 0;
  w->has_header = 0;
  w->status = PS_ERR_OK;
  w->refused = NULL;
  return PS_ERR_OK;
}

void wire_writer_free(wire_writer *w) {
  free(w->bytes);
  free(w->parts);
  memset(w, 0, sizeof *w);
}

ps_err wire_writer_check(const wire_writer *w, ps_error *err) {
  if (w->status == PS_ERR_OK) return PS_ERR_OK;
  return ps_error_set(err, w->status, "building a block message: %s", w->refused);
}

/* Records the first refusal; later appends are skipped. */
static ps_err refuse(wire_writer *w, const char *what) {
  if (w->status == PS_ERR_OK) {
    w->status = PS_ERR_OUT_OF_RANGE;
    w->refused = what;
  }
  return w->status;
}

/* Appends header bytes, extending the last part when it is header bytes too. */
static ps_err add_bytes(wire_writer *w, const uint8_t *src, size_t len) {
  if (w->status != PS_ERR_OK) return w->status;
  if (w->bytes == NULL || len > w->bytes_cap - w->bytes_used) {
    return refuse(w, "more field headers than wire_writer_begin made room for");
  }
  uint8_t *dst = w->bytes + w->bytes_used;
  rpc_part *last = w->part_count > 0 ? &w->parts[w->part_count - 1] : NULL;
  int extend = last != NULL && last->lease == NULL && (const uint8_t *)last->data + last->len == dst;
  if (!extend && w->part_count >= w->part_cap) {
    return refuse(w, "more parts than wire_writer_begin made room for");
  }
  memcpy(dst, src, len);
  w->bytes_used += len;
  if (extend) {
    last->len += len;
  } else {
    w->parts[w->part_count++] = (rpc_part){dst, len, NULL};
  }
  return PS_ERR_OK;
}

/* One header per message, before its blocks. */
static ps_err check_header(wire_writer *w) {
  if (w->status != PS_ERR_OK) return w->status;
  if (w->has_header) return refuse(w, "a second message header");
  w->has_header = 1;
  return PS_ERR_OK;
}

ps_err wire_writer_push_header(wire_writer *w, const wire_key *key, uint64_t config_hash) {
  if (check_header(w) != PS_ERR_OK) return w->status;
  uint8_t sub[32], buf[MESSAGE_HEADER_MAX];
  size_t s = 0, n = 0;
  sub[s++] = tag(1, WT_VARINT);
  s += wire_put_varint(sub + s, key->trainer_id);
  sub[s++] = tag(2, WT_VARINT);
  s += wire_put_varint(sub + s, key->incarnation);
  sub[s++] = tag(3, WT_VARINT);
  s += wire_put_varint(sub + s, key->step);
  buf[n++] = tag(1, WT_LEN);
  n += wire_put_varint(buf + n, s);
  memcpy(buf + n, sub, s);
  n += s;
  buf[n++] = tag(2, WT_VARINT);
  n += wire_put_varint(buf + n, config_hash);
  return add_bytes(w, buf, n);
}

ps_err wire_writer_params_header(wire_writer *w, uint64_t incarnation, uint64_t step) {
  if (check_header(w) != PS_ERR_OK) return w->status;
  uint8_t buf[MESSAGE_HEADER_MAX];
  size_t n = 0;
  buf[n++] = tag(1, WT_VARINT);
  n += wire_put_varint(buf + n, incarnation);
  buf[n++] = tag(2, WT_VARINT);
  n += wire_put_varint(buf + n, step);
  return add_bytes(w, buf, n);
}

ps_err wire_writer_dtype(wire_writer *w, wire_dtype dtype) {
  if (dtype == WIRE_DTYPE_F32) return w->status; /* absent reads f32: messages as before */
  uint8_t buf[1 + 5];
  size_t n = 0;
  buf[n++] = tag(WIRE_FIELD_DTYPE, WT_VARINT);
  n += wire_put_varint(buf + n, (uint32_t)dtype);
  return add_bytes(w, buf, n);
}

ps_err wire_writer_position(wire_writer *w, const wire_position *p) {
  uint8_t sub[3 * 11], buf[2 + 1 + sizeof sub];
  size_t s = 0, n = 0;
  sub[s++] = tag(1, WT_VARINT);
  s += wire_put_varint(sub + s, p->epoch);
  sub[s++] = tag(2, WT_VARINT);
  s += wire_put_varint(sub + s, p->shard);
  sub[s++] = tag(3, WT_VARINT);
  s += wire_put_varint(sub + s, p->offset);
  buf[n++] = tag(WIRE_FIELD_POSITION, WT_LEN);
  n += wire_put_varint(buf + n, s);
  memcpy(buf + n, sub, s);
  return add_bytes(w, buf, n + s);
}

ps_err wire_writer_members(wire_writer *w, const uint8_t *list, size_t len) {
  uint8_t head[1 + 10];
  size_t n = 0;
  head[n++] = tag(WIRE_FIELD_MEMBERS, WT_LEN);
  n += wire_put_varint(head + n, len);
  if (add_bytes(w, head, n) != PS_ERR_OK) return w->status;
  return len > 0 ? add_bytes(w, list, len) : w->status;
}

ps_err wire_writer_deltas(wire_writer *w) {
  const uint8_t buf[2] = {tag(WIRE_FIELD_DELTAS, WT_VARINT), 1};
  return add_bytes(w, buf, sizeof buf);
}

ps_err wire_writer_block(wire_writer *w, uint32_t id, const float *data, size_t count,
                         rpc_lease *lease) {
  if (w->status != PS_ERR_OK) return w->status;
  /* The block's inner length adds up to 17 header bytes to its data. */
  if (count > (SIZE_MAX - BLOCK_HEADER_MAX) / sizeof(float)) {
    return refuse(w, "a block too large for a message");
  }
  return wire_writer_block_bytes(w, id, data, count * sizeof(float), lease);
}

ps_err wire_writer_block_bytes(wire_writer *w, uint32_t id, const void *data, size_t data_len,
                               rpc_lease *lease) {
  if (w->status != PS_ERR_OK) return w->status;
  if (w->block_count >= w->block_room) {
    return refuse(w, "more blocks than wire_writer_begin made room for");
  }
  if (data_len > SIZE_MAX - BLOCK_HEADER_MAX) return refuse(w, "a block too large for a message");
  size_t inner = 1 + varint_size(id) + 1 + varint_size(data_len) + data_len;
  uint8_t buf[BLOCK_HEADER_MAX];
  size_t n = 0;
  buf[n++] = tag(3, WT_LEN);
  n += wire_put_varint(buf + n, inner);
  buf[n++] = tag(1, WT_VARINT);
  n += wire_put_varint(buf + n, id);
  buf[n++] = tag(2, WT_LEN);
  n += wire_put_varint(buf + n, data_len);
  /* Room for the data's part too, so a block is written whole or not at all. */
  if (data_len > 0 && w->part_count >= w->part_cap - 1) {
    return refuse(w, "more parts than wire_writer_begin made room for");
  }
  if (add_bytes(w, buf, n) != PS_ERR_OK) return w->status;
  if (data_len > 0) w->parts[w->part_count++] = (rpc_part){data, data_len, lease};
  w->block_count++;
  return PS_ERR_OK;
}

/* A length-delimited field's header (tag and length) into buf; returns its size. */
static size_t len_header(uint8_t *buf, unsigned field, size_t len) {
  size_t n = 0;
  buf[n++] = tag(field, WT_LEN);
  n += wire_put_varint(buf + n, len);
  return n;
}

ps_err wire_writer_sparse(wire_writer *w, unsigned field, uint32_t table, const uint64_t *keys,
                          size_t n, const float *values, size_t value_count,
                          const uint32_t *counts, rpc_lease *lease) {
  if (w->status != PS_ERR_OK) return w->status;
  if (w->sparse_count >= WIRE_MAX_SPARSE) return refuse(w, "more than WIRE_MAX_SPARSE SparseRows");
  if (field == 0 || field > 15) return refuse(w, "a SparseRows field number above 15");
  size_t limit = (SIZE_MAX - SPARSE_HEADER_MAX) / 4;
  if (n > limit / 2 || value_count > limit / 2) return refuse(w, "a SparseRows too large");
  const void *data[3] = {keys, values, counts};
  size_t lens[3] = {keys != NULL ? n * 8 : 0, values != NULL ? value_count * 4 : 0,
                    counts != NULL ? n * 4 : 0};
  size_t inner = 1 + varint_size(table);
  for (int i = 0; i < 3; i++) {
    if (data[i] != NULL) inner += 1 + varint_size(lens[i]) + lens[i];
  }
  uint8_t buf[SPARSE_HEADER_MAX];
  size_t h = len_header(buf, field, inner);
  buf[h++] = tag(1, WT_VARINT);
  h += wire_put_varint(buf + h, table);
  if (add_bytes(w, buf, h) != PS_ERR_OK) return w->status;
  for (int i = 0; i < 3; i++) {
    if (data[i] == NULL) continue;
    h = len_header(buf, (unsigned)(2 + i), lens[i]);
    if (add_bytes(w, buf, h) != PS_ERR_OK) return w->status;
    if (lens[i] == 0) continue;
    if (w->part_count >= w->part_cap) return refuse(w, "more parts than wire_writer_begin made room for");
    w->parts[w->part_count++] = (rpc_part){data[i], lens[i], lease};
  }
  w->sparse_count++;
  return PS_ERR_OK;
}

ps_err wire_writer_pull_kind(wire_writer *w, uint32_t kind) {
  uint8_t buf[1 + 5];
  size_t n = 0;
  buf[n++] = tag(6, WT_VARINT);
  n += wire_put_varint(buf + n, kind);
  return add_bytes(w, buf, n);
}

/* --- reading block messages ------------------------------------------------- */

/* A read position over the segments of a message, bounded by `end` bytes
 * from the message start (the end of the enclosing field). */
typedef struct cursor {
  const rpc_message *msg;
  size_t segment, offset; /* next byte */
  size_t at, end;         /* bytes consumed from the message start; limit */
} cursor;

static int cursor_byte(cursor *c, uint8_t *out) {
  if (c->at >= c->end) return 0;
  while (c->offset >= c->msg->segments[c->segment].len) {
    c->segment++;
    c->offset = 0;
  }
  *out = c->msg->segments[c->segment].data[c->offset++];
  c->at++;
  return 1;
}

static int cursor_skip(cursor *c, size_t n) {
  if (n > c->end - c->at) return 0;
  c->at += n;
  while (n > 0) {
    size_t left = c->msg->segments[c->segment].len - c->offset;
    if (left == 0) {
      c->segment++;
      c->offset = 0;
      continue;
    }
    size_t step = n < left ? n : left;
    c->offset += step;
    n -= step;
  }
  return 1;
}

static int read_varint(cursor *c, uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    uint8_t b;
    if (!cursor_byte(c, &b)) return 0;
    v |= (uint64_t)(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *out = v;
      return 1;
    }
  }
  return 0; /* more than 10 bytes */
}

/* Reads a tag; protobuf field numbers stop at 2^29 - 1. */
static int read_tag(cursor *c, unsigned *field, unsigned *wire_type) {
  uint64_t t;
  if (!read_varint(c, &t) || (t >> 3) > 0x1fffffff) return 0;
  *field = (unsigned)(t >> 3);
  *wire_type = (unsigned)(t & 7);
  return 1;
}

/* Skips a field of the given wire type whose tag was read. */
static int skip_field(cursor *c, unsigned wire_type) {
  uint64_t v;
  switch (wire_type) {
  case WT_VARINT: return read_varint(c, &v);
  case WT_FIXED64: return cursor_skip(c, 8);
  case WT_FIXED32: return cursor_skip(c, 4);
  case WT_LEN: return read_varint(c, &v) && cursor_skip(c, v);
  default: return 0; /* groups are not used by proto3 */
  }
}

/* Reads a length prefix and returns the end of the field, or 0 if it overruns. */
static int read_len(cursor *c, size_t *field_end) {
  uint64_t len;
  if (!read_varint(c, &len) || len > c->end - c->at) return 0;
  *field_end = c->at + (size_t)len;
  return 1;
}

/* A nested message of varint fields 1..3 (RequestKey, DataPosition) into
 * v[0..2]; absent fields keep their value (a message given twice merges, as
 * protobuf's), others are skipped. */
static int parse_three_varints(cursor *c, uint64_t v[3]) {
  size_t end, outer = c->end;
  if (!read_len(c, &end)) return 0;
  c->end = end;
  while (c->at < c->end) {
    unsigned field, wt;
    if (!read_tag(c, &field, &wt)) return 0;
    if (wt == WT_VARINT && field >= 1 && field <= 3) {
      if (!read_varint(c, &v[field - 1])) return 0;
    } else if (!skip_field(c, wt)) {
      return 0;
    }
  }
  c->end = outer;
  return 1;
}

static int parse_key(cursor *c, wire_key *key) {
  uint64_t v[3] = {key->trainer_id, key->incarnation, key->step};
  if (!parse_three_varints(c, v) || v[0] > UINT32_MAX) return 0;
  *key = (wire_key){(uint32_t)v[0], v[1], v[2]};
  return 1;
}

static int parse_position(cursor *c, wire_position *p) {
  uint64_t v[3] = {p->epoch, p->shard, p->offset};
  if (!parse_three_varints(c, v)) return 0;
  *p = (wire_position){v[0], v[1], v[2]};
  return 1;
}

/* Records where a length-delimited field's data lies and skips it. */
static int parse_bytes(cursor *c, wire_block_ref *ref) {
  size_t data_end;
  if (!read_len(c, &data_end)) return 0;
  ref->len = data_end - c->at;
  /* Normalize the position so it points into a segment with bytes left. */
  while (c->segment < c->msg->count && c->offset >= c->msg->segments[c->segment].len &&
         ref->len > 0) {
    c->segment++;
    c->offset = 0;
  }
  ref->segment = c->segment;
  ref->offset = c->offset;
  return cursor_skip(c, ref->len);
}

static int parse_block(cursor *c, wire_block_ref *ref) {
  size_t end, outer = c->end;
  int has_id = 0;
  if (!read_len(c, &end)) return 0;
  c->end = end;
  memset(ref, 0, sizeof *ref);
  while (c->at < c->end) {
    uint64_t v;
    unsigned field, wt;
    if (!read_tag(c, &field, &wt)) return 0;
    if (field == 1 && wt == WT_VARINT) {
      if (!read_varint(c, &v) || v > UINT32_MAX) return 0;
      ref->id = (uint32_t)v;
      has_id = 1;
    } else if (field == 2 && wt == WT_LEN) {
      if (!parse_bytes(c, ref)) return 0;
    } else if (!skip_field(c, wt)) {
      return 0;
    }
  }
  c->end = outer;
  (void)has_id; /* proto3: an absent id is block 0 */
  return 1;
}

static int parse_sparse(cursor *c, unsigned field, wire_sparse_ref *ref) {
  size_t end, outer = c->end;
  if (!read_len(c, &end)) return 0;
  c->end = end;
  memset(ref, 0, sizeof *ref);
  ref->field = field;
  while (c->at < c->end) {
    uint64_t v;
    unsigned f, wt;
    if (!read_tag(c, &f, &wt)) return 0;
    if (f == 1 && wt == WT_VARINT) {
      if (!read_varint(c, &v) || v > UINT32_MAX) return 0;
      ref->table = (uint32_t)v;
    } else if (f >= 2 && f <= 4 && wt == WT_LEN) {
      wire_block_ref *dst = f == 2 ? &ref->keys : f == 3 ? &ref->values : &ref->counts;
      if (!parse_bytes(c, dst)) return 0;
    } else if (!skip_field(c, wt)) {
      return 0;
    }
  }
  c->end = outer;
  return 1;
}

ps_err wire_parse_blocks(const rpc_message *msg, wire_blocks_msg *out, ps_error *err) {
  cursor c = {msg, 0, 0, 0, msg->total};
  out->has_key = 0;
  memset(&out->key, 0, sizeof out->key);
  out->pserver_incarnation = 0;
  out->step = 0;
  out->block_count = 0;
  out->kind = 0;
  out->dtype = 0;
  out->deltas = 0;
  out->has_position = 0;
  memset(&out->position, 0, sizeof out->position);
  memset(&out->members, 0, sizeof out->members);
  out->sparse_count = 0;
  while (c.at < c.end) {
    unsigned field, wt;
    if (!read_tag(&c, &field, &wt)) goto malformed;
    if (field == 1 && wt == WT_LEN) {
      if (!parse_key(&c, &out->key)) goto malformed;
      out->has_key = 1;
    } else if (field == 1 && wt == WT_VARINT) {
      if (!read_varint(&c, &out->pserver_incarnation)) goto malformed;
    } else if (field == 2 && wt == WT_VARINT) {
      /* config_hash in a PushRequest: the same member. */
      if (!read_varint(&c, &out->step)) goto malformed;
    } else if (field == 3 && wt == WT_LEN) {
      if (out->block_count == out->block_cap) {
        return ps_error_set(err, PS_ERR_OUT_OF_RANGE, "message holds more than %zu blocks",
                            out->block_cap);
      }
      if (!parse_block(&c, &out->blocks[out->block_count])) goto malformed;
      out->block_count++;
    } else if ((field == 4 || field == 5) && wt == WT_LEN) {
      if (out->sparse_count == WIRE_MAX_SPARSE) {
        return ps_error_set(err, PS_ERR_OUT_OF_RANGE, "message holds more than %d SparseRows",
                            WIRE_MAX_SPARSE);
      }
      if (!parse_sparse(&c, field, &out->sparse[out->sparse_count])) goto malformed;
      out->sparse_count++;
    } else if (field == 6 && wt == WT_VARINT) {
      uint64_t v;
      if (!read_varint(&c, &v) || v > UINT32_MAX) goto malformed;
      out->kind = (uint32_t)v;
    } else if (field == WIRE_FIELD_DTYPE && wt == WT_VARINT) {
      uint64_t v;
      if (!read_varint(&c, &v) || v > UINT32_MAX) goto malformed;
      out->dtype = (uint32_t)v;
    } else if (field == WIRE_FIELD_DELTAS && wt == WT_VARINT) {
      uint64_t v;
      if (!read_varint(&c, &v) || v > 1) goto malformed;
      out->deltas = (int)v;
    } else if (field == WIRE_FIELD_POSITION && wt == WT_LEN) {
      if (!parse_position(&c, &out->position)) goto malformed;
      out->has_position = 1;
    } else if (field == WIRE_FIELD_MEMBERS && wt == WT_LEN) {
      if (!parse_bytes(&c, &out->members)) goto malformed;
    } else if (field == 0 || !skip_field(&c, wt)) {
      goto malformed;
    }
  }
  return PS_ERR_OK;
malformed:
  return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                      "malformed block message: bad protobuf encoding near byte %zu of %zu", c.at,
                      msg->total);
}

void wire_copy_block(const rpc_message *msg, const wire_block_ref *ref, void *dst) {
  uint8_t *out = dst;
  size_t left = ref->len, segment = ref->segment, offset = ref->offset;
  while (left > 0) {
    const rpc_segment *s = &msg->segments[segment];
    size_t n = s->len - offset < left ? s->len - offset : left;
    memcpy(out, s->data + offset, n);
    out += n;
    left -= n;
    segment++;
    offset = 0;
  }
}
