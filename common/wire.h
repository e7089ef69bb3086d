/* Encoding and decoding of pstrain's messages (proto/pstrain.proto). Small
 * messages go through protobuf-c. The two block messages (PushRequest,
 * ParamsReply) are written and read here directly in the protobuf wire
 * format, so block data is sent from where it lies and copied once, from
 * the received segments straight to its destination. Not thread-safe per
 * writer; parsing is pure. */
#ifndef PSTRAIN_COMMON_WIRE_H
#define PSTRAIN_COMMON_WIRE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/job.h"
#include "common/rpc.h"
#include "common/wire_dtype.h"
#include "pstrain.pb-c.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pstrain sends float32 in host order, which must be little-endian"
#endif

#define WIRE_METHOD_REGISTER "/pstrain.PServer/RegisterTrainer"
#define WIRE_METHOD_PUSH_PULL "/pstrain.PServer/PushPull"
#define WIRE_METHOD_PULL "/pstrain.PServer/Pull"
#define WIRE_METHOD_DONE "/pstrain.PServer/Done"
#define WIRE_METHOD_ROLLBACK "/pstrain.PServer/Rollback"
#define WIRE_METHOD_NEXT_SHARD "/pstrain.PServer/NextShard"

typedef struct wire_key {
  uint32_t trainer_id;
  uint64_t incarnation;
  uint64_t step;
} wire_key;

/* --- small messages through protobuf-c -------------------------------------- */

/* Unpacks msg as desc's type; free the result with
 * protobuf_c_message_free_unpacked(result, NULL). NULL with err set when the
 * bytes are not such a message. */
ProtobufCMessage *wire_unpack(const ProtobufCMessageDescriptor *desc, const rpc_message *msg,
                              ps_error *err);

/* Packs m into a malloc'd buffer (*out, *len), owned by the caller. */
ps_err wire_pack(const ProtobufCMessage *m, uint8_t **out, size_t *len, ps_error *err);

/* The sub-messages a JobConfig points to. */
typedef struct wire_job_parts {
  Pstrain__OptimizerConfig optimizer;
  Pstrain__SparseConfig sparse;
} wire_job_parts;

/* Job description to and from its message. The proto structs point into
 * `text` (model name) and `parts`, which must outlive them. */
void wire_job_to_proto(const job_config *job, Pstrain__JobConfig *out, wire_job_parts *parts,
                       char *text, size_t text_len);
/* Checks every field as strictly as the command line would. */
ps_err wire_job_from_proto(const Pstrain__JobConfig *in, job_config *job, ps_error *err);

/* --- block messages ---------------------------------------------------------- */

/* Builds a block message as rpc parts: headers copied, block data borrowed.
 * wire_writer_begin sizes it; an append beyond that room, or a size that
 * would overflow, is refused: nothing is written past a buffer, the writer
 * keeps the first refusal in `status` and skips later appends, and
 * wire_writer_check reports it. Check before sending the parts. */
typedef struct wire_writer {
  uint8_t *bytes; /* field headers; owned */
  size_t bytes_cap, bytes_used;
  rpc_part *parts; /* owned */
  int part_cap, part_count;
  size_t block_room, block_count; /* blocks wire_writer_begin allowed; written */
  size_t sparse_count;            /* SparseRows written */
  int has_header;
  ps_err status;       /* PS_ERR_OK, or the first refused append's code */
  const char *refused; /* what that append was */
} wire_writer;

/* Most SparseRows one message may hold (each field counted alone): two
 * tables, gradients and keys, with room to spare. */
#define WIRE_MAX_SPARSE 8
/* SparseRows' field numbers in the messages that carry them. */
enum {
  WIRE_SPARSE_GRADS = 4, /* PushRequest.sparse_grads */
  WIRE_SPARSE_ROWS = 4,  /* ParamsReply.sparse_rows */
  WIRE_SPARSE_KEYS = 5,  /* PushRequest.sparse_keys and PullRequest.sparse_keys */
};
/* PushRequest.dtype and ParamsReply.dtype: the dense blocks' element type. */
#define WIRE_FIELD_DTYPE 7
/* PushRequest.deltas: a geo push of parameter changes. */
#define WIRE_FIELD_DELTAS 8
/* PushRequest.position: where the batch begins in a handed-out shard. */
#define WIRE_FIELD_POSITION 9
/* PushRequest.members and ParamsReply.members: the step's members. */
#define WIRE_FIELD_MEMBERS 10

/* A DataPosition: the batch's epoch, shard and examples into the shard. */
typedef struct wire_position {
  uint64_t epoch, shard, offset;
} wire_position;

/* Most blocks one message may hold: its parts (two a block, and the
 * SparseRows') are counted in an int. */
#define WIRE_WRITER_MAX_BLOCKS (((size_t)INT_MAX - 64) / 2)

/* Sizes the writer for one header and up to max_blocks blocks; call before
 * each message. */
ps_err wire_writer_begin(wire_writer *w, size_t max_blocks, ps_error *err);
void wire_writer_free(wire_writer *w);
/* PushRequest's fields 1 (key) and 2 (config hash). */
ps_err wire_writer_push_header(wire_writer *w, const wire_key *key, uint64_t config_hash);
/* ParamsReply's fields 1 (incarnation) and 2 (step). */
ps_err wire_writer_params_header(wire_writer *w, uint64_t incarnation, uint64_t step);
/* The blocks' dtype (field 7), after the header; nothing for f32, which an
 * absent field means. */
ps_err wire_writer_dtype(wire_writer *w, wire_dtype dtype);
/* PushRequest.deltas (field 8) set, after the header: a geo push. */
ps_err wire_writer_deltas(wire_writer *w);
/* PushRequest.position (field 9), after the header: a handed-out shard's batch. */
ps_err wire_writer_position(wire_writer *w, const wire_position *p);
/* PushRequest.members or ParamsReply.members (field 10): a members list
 * (wire_members_encode) of len bytes, copied. */
ps_err wire_writer_members(wire_writer *w, const uint8_t *list, size_t len);

/* A step's members as the members field holds them: varint pairs (trainer
 * id, membership number) in ascending id; seq[i] is trainer i's number (0:
 * not a member). The most bytes n trainers take: */
#define WIRE_MEMBERS_MAX(n) ((size_t)(n) * 10)
/* A protobuf varint of v at p (up to 10 bytes); returns its length. */
size_t wire_put_varint(uint8_t *p, uint64_t v);
/* Encodes seq[0..n) into out (WIRE_MEMBERS_MAX(n) bytes of room); returns the length. */
size_t wire_members_encode(const uint32_t *seq, int n, uint8_t *out);
/* Decodes len bytes into seq[0..n) (zeroed first); refuses ids not below n,
 * out of order, a zero number, and malformed varints, changing nothing. */
ps_err wire_members_decode(const uint8_t *data, size_t len, uint32_t *seq, int n, ps_error *err);
/* A Block (field 3) whose data is borrowed under lease (NULL: copied). */
ps_err wire_writer_block(wire_writer *w, uint32_t id, const float *data, size_t count,
                         rpc_lease *lease);
/* The same with data_len bytes of any dtype (converted by the caller). */
ps_err wire_writer_block_bytes(wire_writer *w, uint32_t id, const void *data, size_t data_len,
                               rpc_lease *lease);
/* A SparseRows in field `field` (WIRE_SPARSE_*) of table `table`: n keys
 * (NULL: none sent), value_count floats (NULL: none), n counts (NULL: none).
 * Data is borrowed under lease (NULL: copied). At most WIRE_MAX_SPARSE per
 * message, after the blocks. */
ps_err wire_writer_sparse(wire_writer *w, unsigned field, uint32_t table, const uint64_t *keys,
                          size_t n, const float *values, size_t value_count,
                          const uint32_t *counts, rpc_lease *lease);
/* PullRequest.kind (field 6), after the sparse keys. */
ps_err wire_writer_pull_kind(wire_writer *w, uint32_t kind);
/* PS_ERR_OK when every append since wire_writer_begin fit; else the first
 * refusal, described in err. */
ps_err wire_writer_check(const wire_writer *w, ps_error *err);

/* Where a block's data lies in a received message. */
typedef struct wire_block_ref {
  uint32_t id;
  size_t segment, offset; /* start of the data */
  size_t len;             /* bytes */
} wire_block_ref;

/* Where a SparseRows' fields lie (len 0: absent). */
typedef struct wire_sparse_ref {
  unsigned field; /* WIRE_SPARSE_* */
  uint32_t table;
  wire_block_ref keys, values, counts; /* their id is unused */
} wire_sparse_ref;

/* A parsed PushRequest (has_key, key, config_hash), PullRequest (the same,
 * and kind) or ParamsReply (pserver_incarnation, step); absent fields read 0. */
typedef struct wire_blocks_msg {
  int has_key;                  /* field 1 was a RequestKey: a PushRequest */
  wire_key key;
  uint64_t pserver_incarnation; /* field 1 as a number: a ParamsReply */
  union {                       /* field 2, named for each message */
    uint64_t config_hash;       /* PushRequest */
    uint64_t step;              /* ParamsReply: the parameters' version */
  };
  size_t block_count;
  wire_block_ref *blocks; /* caller's array of block_cap entries */
  size_t block_cap;
  uint32_t kind;          /* PullRequest.kind */
  uint32_t dtype;         /* field 7: the blocks' wire_dtype (0, f32, when absent) */
  int deltas;             /* PushRequest.deltas: a geo push of parameter changes */
  int has_position;       /* PushRequest.position was present */
  wire_position position;
  wire_block_ref members; /* field 10's bitmap (len 0: absent) */
  size_t sparse_count;
  wire_sparse_ref sparse[WIRE_MAX_SPARSE];
} wire_blocks_msg;

/* Parses a PushRequest, PullRequest or ParamsReply without copying block
 * data. Refuses malformed bytes, more than block_cap blocks and more than
 * WIRE_MAX_SPARSE SparseRows; unknown fields are skipped. */
ps_err wire_parse_blocks(const rpc_message *msg, wire_blocks_msg *out, ps_error *err);

/* Copies a block's data (ref->len bytes) to dst. */
void wire_copy_block(const rpc_message *msg, const wire_block_ref *ref, void *dst);
/* Converts a block of dtype elements (ref->len / wire_dtype_size of them;
 * the caller checked the length) to float32 at dst (wire_dtype.c). */
void wire_decode_block(const rpc_message *msg, const wire_block_ref *ref, wire_dtype dtype,
                       float *dst);

#endif
