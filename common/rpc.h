/* pstrain's RPC layer: the only module that calls gRPC's C core. A server
 * with worker threads that hands each request to one handler and lets it
 * reply at once or later (a sync step answers when every trainer has
 * pushed); a client that runs several calls at once with deadlines. Messages
 * travel as lists of parts so tensor data is sent from where it lies, and
 * arrive as lists of segments so it can be read in place. gRPC status codes
 * map to ps_err here and nowhere else. Not for message encoding (wire.h). */
#ifndef PSTRAIN_COMMON_RPC_H
#define PSTRAIN_COMMON_RPC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/tls.h"

/* Starts and stops gRPC for the process; call once each, from main, after
 * blocking the signals the process handles itself (gRPC starts threads). */
void rpc_global_init(void);
void rpc_global_shutdown(void);

/* A received message: a view of its bytes in one or more segments. */
typedef struct rpc_segment {
  const uint8_t *data;
  size_t len;
} rpc_segment;

typedef struct rpc_message {
  const rpc_segment *segments;
  size_t count;
  size_t total; /* bytes over all segments */
} rpc_message;

/* Counts the gRPC slices still pointing at borrowed memory, so its owner can
 * wait before changing or freeing it. Zero-initialize; never copy. */
typedef struct rpc_lease {
  atomic_int refs;
} rpc_lease;

/* Waits (sleeping in short steps) until no slice references lease's memory.
 * Returns PS_ERR_OK, or PS_ERR_TIMEOUT after 30 s with references still held:
 * the memory must then be neither changed nor freed. */
ps_err rpc_lease_wait(rpc_lease *lease);

/* One piece of an outgoing message. With a lease, data is borrowed: sent from
 * where it lies and left untouched until rpc_lease_wait returns. Without one,
 * it is copied when the call starts. */
typedef struct rpc_part {
  const void *data;
  size_t len;
  rpc_lease *lease;
} rpc_part;

/* --- server -------------------------------------------------------------- */

typedef struct rpc_server rpc_server;
typedef struct rpc_call rpc_call;

/* Called on a worker thread for each request. `request` is valid only until
 * the handler returns. The handler must call rpc_call_reply exactly once for
 * the call, then or later, from any thread. */
typedef void (*rpc_handler)(void *ctx, rpc_call *call, int method, const rpc_message *request);

/* What a server allows its peers; zero fields keep gRPC's defaults (none
 * of these limits). Calls over max_open_calls are answered
 * RESOURCE_EXHAUSTED with their body unread; a call of a method not served is
 * answered UNIMPLEMENTED at once. */
typedef struct rpc_server_limits {
  int max_open_calls;          /* calls arrived and not yet gone (held, reading, answering) */
  int max_streams;             /* concurrent HTTP/2 streams per connection */
  double max_idle_s;           /* close a connection without calls for this long, and one
                                  that has not finished its handshake (at most 120 s) */
  double max_age_s;            /* send GOAWAY to a connection this old ... */
  double age_grace_s;          /* ... and close it this much later, calls or not */
  double keepalive_s;          /* ping each peer after this long without traffic; closed
                                  when the ping is not answered in 20 s */
  const char *open_calls_flag; /* what sets max_open_calls, named in refusals (or NULL) */
  size_t max_receive_bytes;    /* gRPC's resource quota: memory its connections and the
                                  request bodies being received may take; past it gRPC
                                  resets calls (RESOURCE_EXHAUSTED at the caller). 0: none */
} rpc_server_limits;

/* Counters of calls the server turned away, for logs and metrics. */
typedef struct rpc_server_stats {
  int open_calls;              /* now */
  uint64_t refused_busy;       /* over max_open_calls, since start */
  uint64_t unimplemented;      /* of methods not served, since start */
  char last_unknown[192];      /* the latest unknown method and its peer ("" when none) */
} rpc_server_stats;

typedef struct rpc_server_config {
  const char *listen;          /* "HOST:PORT"; port 0 picks a free one */
  const char *const *methods;  /* full paths, e.g. "/pstrain.PServer/PushPull" */
  int method_count;
  rpc_handler handler;
  void *handler_ctx;
  int threads;                 /* worker threads, >= 1 */
  size_t max_message_bytes;    /* both directions */
  const char *token;           /* when set, every call must carry "authorization: Bearer
                                  TOKEN"; others get UNAUTHENTICATED before their request
                                  body is read, and never reach the handler. Copied at
                                  start. */
  const tls_config *tls;       /* NULL or empty: plaintext. With cert and key: TLS; with a
                                  CA as well, clients must present a certificate it signed
                                  (others fail the handshake). Files are read at start. */
  rpc_server_limits limits;
} rpc_server_config;

/* Binds and starts serving. *bound_port receives the port actually bound. */
ps_err rpc_server_start(rpc_server **out, const rpc_server_config *cfg, int *bound_port,
                        ps_error *err);

/* Answers a call. code PS_ERR_OK sends the parts as the reply message; any
 * other code sends that status with message (parts are ignored). Thread-safe. */
void rpc_call_reply(rpc_call *call, ps_err code, const char *message, const rpc_part *parts,
                    int part_count);

/* The peer's address, e.g. "ipv4:127.0.0.1:51234". Valid until the reply. */
const char *rpc_call_peer(const rpc_call *call);

/* The name in the peer's verified client certificate (its SAN or CN), or ""
 * when the server does not verify client certificates. Valid until the reply. */
const char *rpc_call_peer_identity(const rpc_call *call);

/* Whether the peer's verified client certificate carries name as its common
 * name or one of its subject alternative names; 0 without one. Call before
 * the reply. */
int rpc_call_peer_has_name(const rpc_call *call, const char *name);

/* Request-body bytes the server has read so far, over all calls (only
 * authorized calls' bodies are read). Thread-safe. */
size_t rpc_server_received_bytes(const rpc_server *srv);

/* The counters of calls turned away so far. Thread-safe. */
void rpc_server_stats_get(rpc_server *srv, rpc_server_stats *out);

/* Stops accepting calls, gives replies under way a moment to leave, cancels
 * every call still open, waits for the workers and frees the server, all
 * within about timeout_s seconds. Every deferred call must have been answered
 * before. PS_ERR_TIMEOUT (logged) when gRPC has not let go by then: the
 * server is abandoned, not freed, and the process should exit without
 * rpc_global_shutdown. */
ps_err rpc_server_stop_within(rpc_server *srv, double timeout_s);

/* rpc_server_stop_within with 30 s. */
void rpc_server_stop(rpc_server *srv);

/* --- in-memory calls ---------------------------------------------------------
 * A call no network carries, to drive a handler directly (fuzz targets,
 * tests): rpc_call_reply on it records the reply instead of sending it. A
 * handler may answer it at once or keep it and answer later, as a real call.
 * The creator owns it and frees it with rpc_call_local_free after the reply
 * (never a real call). Replies after the first are counted, not recorded. */
typedef struct rpc_local_result {
  int replies;       /* rpc_call_reply calls so far: 1 once answered, never more */
  ps_err code;       /* of the first reply */
  char message[512]; /* its status message (truncated) */
  uint8_t *bytes;    /* its message when code is PS_ERR_OK; owned by the call */
  size_t len;
} rpc_local_result;

/* NULL when out of memory. peer is what rpc_call_peer returns (may be NULL). */
rpc_call *rpc_call_local_create(const char *peer);
const rpc_local_result *rpc_call_local_result(const rpc_call *call);
void rpc_call_local_free(rpc_call *call);

/* --- client -------------------------------------------------------------- */

typedef struct rpc_client rpc_client;
typedef struct rpc_channel rpc_channel;

/* A client owns one completion queue and is used by one thread at a time.
 * With a token (may be NULL), every call carries "authorization: Bearer TOKEN".
 * With tls (NULL or empty: plaintext), channels verify the server's
 * certificate against tls->ca and the target's host (or tls->server_name),
 * presenting tls->cert when given; the files are read here. */
ps_err rpc_client_create(rpc_client **out, const char *token, const tls_config *tls,
                         ps_error *err);
void rpc_client_destroy(rpc_client *client);

/* A channel to target ("HOST:PORT"), reconnecting at most every
 * max_reconnect_ms while the peer is away. Owned by the client. */
ps_err rpc_channel_open(rpc_client *client, const char *target, size_t max_message_bytes,
                        int max_reconnect_ms, rpc_channel **out, ps_error *err);

/* A received reply; free with rpc_reply_free. */
typedef struct rpc_reply {
  rpc_message message;
  void *internal; /* the byte buffer and its slices */
} rpc_reply;

void rpc_reply_free(rpc_reply *reply);

/* Builds a received message from parts through gRPC's own byte buffer and
 * reader, as a reply arrives (tests use it to hand the reader slices of
 * chosen sizes, tiny ones included). */
ps_err rpc_reply_from_parts(const rpc_part *parts, int count, rpc_reply *out, ps_error *err);

/* One call of a batch. Fill the inputs; rpc_client_call_all fills the rest. */
typedef struct rpc_op {
  rpc_channel *channel;
  const char *method;     /* full path; must outlive the call */
  const rpc_part *parts;
  int part_count;
  double timeout_s;
  int wait_for_ready;     /* wait (until the deadline) for the peer to come up */
  /* results */
  ps_err code;
  char message[384];      /* the peer's status message, or why the call failed; for a
                             wait_for_ready call that timed out, why the channel could
                             not connect, where gRPC says */
  rpc_reply reply;        /* when code == PS_ERR_OK */
  void *internal;         /* rpc_client_start's call while it runs */
} rpc_op;

/* Starts every op at once and waits for all of them. Returns PS_ERR_OK when
 * every op succeeded; otherwise the first failing op's code, with err naming
 * its target. Each op's own result is in the op. */
ps_err rpc_client_call_all(rpc_client *client, rpc_op *ops, int count, ps_error *err);

/* Calls started one by one and collected as they finish (an overlapped
 * step's pushes). rpc_client_start starts op (it must stay where it is until
 * collected) and returns at once; on failure to start, op->code says why and
 * it is not in flight. rpc_client_next waits up to timeout_s seconds (0:
 * only looks) for a started op to finish, fills its result and returns it;
 * NULL when none finished in time or none is in flight. Every started op
 * must be collected before rpc_client_call_all or rpc_client_destroy, which
 * would take its completion; ops started this way do not diagnose
 * wait_for_ready timeouts. */
void rpc_client_start(rpc_client *client, rpc_op *op);
rpc_op *rpc_client_next(rpc_client *client, double timeout_s);
/* Ops started and not yet collected. */
int rpc_client_in_flight(const rpc_client *client);
/* Cancels a started op that is not collected yet (nothing otherwise): it
 * finishes at once with PS_ERR_CANCELLED, still to be collected. */
void rpc_client_cancel(rpc_op *op);

/* The target a channel was opened to. */
const char *rpc_channel_target(const rpc_channel *channel);

#endif
