/* What the pieces of the RPC layer share: the call and its tags, byte
 * buffers from parts and received buffers as segments, status mapping,
 * channel arguments, credentials. Included only by common/rpc_*.c: nothing
 * outside them sees gRPC. */
#ifndef PSTRAIN_COMMON_RPC_INTERNAL_H
#define PSTRAIN_COMMON_RPC_INTERNAL_H

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#include "common/rpc.h"

/* --- status mapping (rpc_message.c) ---------------------------------------- */

ps_err rpc_err_from_status(grpc_status_code status);
grpc_status_code rpc_status_from_err(ps_err code);

/* --- messages (rpc_message.c) ---------------------------------------------- */

/* A byte buffer over the parts: borrowed ones by reference, the rest copied.
 * NULL when out of memory. */
grpc_byte_buffer *rpc_buffer_from_parts(const rpc_part *parts, int count);

/* The slices of a received buffer, kept referenced while they are read. */
typedef struct rpc_received {
  grpc_byte_buffer *bb;
  grpc_slice *slices;
  rpc_segment *segments;
  size_t count;
} rpc_received;

/* Takes ownership of bb (even on failure) and fills msg with views of its
 * slices, valid until rpc_received_free. */
ps_err rpc_received_init(rpc_received *r, grpc_byte_buffer *bb, rpc_message *msg, ps_error *err);
void rpc_received_free(rpc_received *r);

/* Takes ownership of bb (even on failure) and makes it a reply. */
ps_err rpc_reply_take(grpc_byte_buffer *bb, rpc_reply *out, ps_error *err);

/* Message size limits both ways and, with max_reconnect_ms > 0, reconnect
 * backoff. args needs room for 5 entries; the result points into it. */
grpc_channel_args rpc_channel_args(grpc_arg *args, size_t max_message_bytes, int max_reconnect_ms);

/* Now + seconds on the monotonic clock; no deadline for seconds <= 0. */
gpr_timespec rpc_deadline_in(double seconds);

/* --- credentials (rpc_credentials.c) --------------------------------------- */

/* Plaintext, or TLS from the PEM files (read here; gRPC copies the texts).
 * Checks the settings first, as tls_check_server / tls_check_client do. */
ps_err rpc_server_credentials(const tls_config *tls, grpc_server_credentials **out,
                              ps_error *err);
ps_err rpc_client_credentials(const tls_config *tls, grpc_channel_credentials **out,
                              ps_error *err);

/* --- server calls (rpc_server.c, rpc_local.c) ------------------------------ */

/* What a completion on the server's queue is about. */
typedef enum {
  RPC_TAG_REQUEST,  /* a call arrived (its metadata, not its body) */
  RPC_TAG_READ,     /* an authorized call's request body was read */
  RPC_TAG_DONE,     /* the reply left: the call can go */
  RPC_TAG_SHUTDOWN, /* the server stopped */
} rpc_tag_kind;

typedef struct rpc_tag {
  rpc_tag_kind kind;
  rpc_call *call;
} rpc_tag;

struct rpc_call {
  rpc_server *srv; /* NULL for an in-memory call */
  int method;      /* index in the config's methods; -1: a method not served */
  grpc_call *call;
  grpc_call_details asked; /* method -1: the path and host asked for */
  int counted;     /* arrived: counts in the server's open calls until freed */
  gpr_timespec deadline;
  grpc_metadata_array request_metadata;
  grpc_byte_buffer *payload;
  rpc_tag request_tag, read_tag, done_tag;
  grpc_byte_buffer *reply;
  grpc_slice details;
  int cancelled;
  char peer[128];
  char identity[128];      /* the verified client certificate's name, or "" */
  rpc_local_result *local; /* an in-memory call: replies are recorded here */
};

/* Records the reply of an in-memory call (rpc_local.c). */
void rpc_local_reply(rpc_call *c, ps_err code, const char *message, const rpc_part *parts,
                     int part_count);

#endif
