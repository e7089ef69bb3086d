/* The RPC server: request slots posted per method, worker threads on one
 * completion queue, authentication, replies, shutdown.
 *
 * A call's life: its slot completes when the call's metadata has arrived
 * (methods are registered without reading the payload), the worker checks the
 * token and reads the client certificate's name, and refuses an unauthorized
 * call at once: its body is never read, so HTTP/2 flow control stops the
 * sender after a window's worth. An authorized call then reads its body
 * (RPC_TAG_READ) and goes to the handler, which replies now or later; the
 * reply's completion (RPC_TAG_DONE) frees the call.
 *
 * Calls of methods not served arrive through slots of their own
 * (grpc_server_request_call) and are answered UNIMPLEMENTED at once: without
 * such slots gRPC would keep them, unanswered, for ever. A call that arrives
 * while max_open_calls are open is refused RESOURCE_EXHAUSTED unread. */
#define _POSIX_C_SOURCE 200809L
#include <grpc/support/alloc.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/rpc_internal.h"

/* Request slots kept posted per method: enough for every trainer's calls. */
#define RPC_SLOTS_PER_METHOD 64
/* Slots for methods not served: each call is answered and its slot posted
 * again at once, so a few keep up with a flood. */
#define RPC_UNKNOWN_SLOTS 8

struct rpc_server {
  rpc_server_config cfg;
  char *bearer;       /* "Bearer TOKEN" when a token is required, else NULL */
  int verify_clients; /* TLS with a CA: every peer has a verified certificate */
  grpc_server *server;
  grpc_completion_queue *cq;
  void **method_handles;
  pthread_t *threads;
  int thread_count;
  rpc_tag shutdown_tag;
  pthread_mutex_t post_lock; /* orders posting slots against shutdown */
  int stopping;              /* under post_lock */
  atomic_int shutdown_seen;
  atomic_int workers_done;      /* workers past their loop (stop waits for all) */
  atomic_size_t received_bytes; /* request bodies read, for rpc_server_received_bytes */
  atomic_int open_calls;        /* arrived and not yet freed */
  atomic_int live_calls;        /* allocated and not yet freed: posted slots and open calls */
  atomic_uint_least64_t refused_busy, unimplemented;
  pthread_mutex_t stats_lock;   /* guards last_unknown */
  char last_unknown[192];
};

/* The method a call asked for, for messages. */
static const char *method_of(const rpc_call *c) {
  return c->method >= 0 ? c->srv->cfg.methods[c->method] : "an unknown method";
}

static void call_free(rpc_call *c) {
  if (c->counted) atomic_fetch_sub(&c->srv->open_calls, 1);
  atomic_fetch_sub(&c->srv->live_calls, 1);
  if (c->method < 0) grpc_call_details_destroy(&c->asked);
  grpc_metadata_array_destroy(&c->request_metadata);
  if (c->payload != NULL) grpc_byte_buffer_destroy(c->payload);
  if (c->reply != NULL) grpc_byte_buffer_destroy(c->reply);
  grpc_slice_unref(c->details);
  if (c->call != NULL) grpc_call_unref(c->call);
  free(c);
}

static void post_request(rpc_server *srv, int method) {
  pthread_mutex_lock(&srv->post_lock);
  if (srv->stopping) {
    pthread_mutex_unlock(&srv->post_lock);
    return;
  }
  rpc_call *c = calloc(1, sizeof *c);
  if (c == NULL) {
    pthread_mutex_unlock(&srv->post_lock);
    LOG_ERROR("rpc: out of memory posting a request slot for %s",
              method >= 0 ? srv->cfg.methods[method] : "unknown methods");
    return;
  }
  atomic_fetch_add(&srv->live_calls, 1);
  c->srv = srv;
  c->method = method;
  c->details = grpc_empty_slice();
  c->request_tag = (rpc_tag){RPC_TAG_REQUEST, c};
  c->read_tag = (rpc_tag){RPC_TAG_READ, c};
  c->done_tag = (rpc_tag){RPC_TAG_DONE, c};
  grpc_metadata_array_init(&c->request_metadata);
  grpc_call_error rc;
  if (method < 0) {
    grpc_call_details_init(&c->asked);
    rc = grpc_server_request_call(srv->server, &c->call, &c->asked, &c->request_metadata,
                                  srv->cq, srv->cq, &c->request_tag);
  } else {
    /* No payload pointer: the methods are registered with GRPC_SRM_PAYLOAD_NONE. */
    rc = grpc_server_request_registered_call(srv->server, srv->method_handles[method], &c->call,
                                             &c->deadline, &c->request_metadata, NULL, srv->cq,
                                             srv->cq, &c->request_tag);
  }
  pthread_mutex_unlock(&srv->post_lock);
  if (rc != GRPC_CALL_OK) {
    LOG_ERROR("rpc: posting a request slot for %s failed (%s)", method_of(c),
              grpc_call_error_to_string(rc));
    call_free(c);
  }
}

void rpc_call_reply(rpc_call *c, ps_err code, const char *message, const rpc_part *parts,
                    int part_count) {
  if (c->local != NULL) {
    rpc_local_reply(c, code, message, parts, part_count);
    return;
  }
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  int n = 0;
  ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n++].data.send_initial_metadata.count = 0;
  if (code == PS_ERR_OK && part_count > 0) {
    c->reply = rpc_buffer_from_parts(parts, part_count);
    if (c->reply == NULL) {
      code = PS_ERR_NO_MEMORY;
      message = "pserver out of memory building the reply";
    } else {
      ops[n].op = GRPC_OP_SEND_MESSAGE;
      ops[n++].data.send_message.send_message = c->reply;
    }
  }
  grpc_slice_unref(c->details);
  c->details = grpc_slice_from_copied_string(message != NULL ? message : "");
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.trailing_metadata_count = 0;
  ops[n].data.send_status_from_server.status = rpc_status_from_err(code);
  ops[n++].data.send_status_from_server.status_details = &c->details;
  ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
  grpc_call_error rc = grpc_call_start_batch(c->call, ops, (size_t)n, &c->done_tag, NULL);
  if (rc != GRPC_CALL_OK) {
    LOG_ERROR("rpc: answering a call of %s from %s failed (%s)", method_of(c), c->peer,
              grpc_call_error_to_string(rc));
    call_free(c); /* no completion will come for a batch that did not start */
  }
}

const char *rpc_call_peer(const rpc_call *call) { return call->peer; }

const char *rpc_call_peer_identity(const rpc_call *call) { return call->identity; }

size_t rpc_server_received_bytes(const rpc_server *srv) {
  return atomic_load(&((rpc_server *)srv)->received_bytes);
}

void rpc_server_stats_get(rpc_server *srv, rpc_server_stats *out) {
  out->open_calls = atomic_load(&srv->open_calls);
  out->refused_busy = atomic_load(&srv->refused_busy);
  out->unimplemented = atomic_load(&srv->unimplemented);
  pthread_mutex_lock(&srv->stats_lock);
  snprintf(out->last_unknown, sizeof out->last_unknown, "%s", srv->last_unknown);
  pthread_mutex_unlock(&srv->stats_lock);
}

/* A call of a method not served: UNIMPLEMENTED, its body never read. The
 * path is the caller's bytes: only printable ones go into messages. */
static void answer_unknown(rpc_call *c) {
  rpc_server *srv = c->srv;
  char path[96];
  size_t len = GRPC_SLICE_LENGTH(c->asked.method);
  const uint8_t *bytes = GRPC_SLICE_START_PTR(c->asked.method);
  size_t n = len < sizeof path - 1 ? len : sizeof path - 1;
  for (size_t i = 0; i < n; i++) {
    path[i] = bytes[i] >= 0x20 && bytes[i] < 0x7f ? (char)bytes[i] : '?';
  }
  path[n] = '\0';
  atomic_fetch_add(&srv->unimplemented, 1);
  pthread_mutex_lock(&srv->stats_lock);
  snprintf(srv->last_unknown, sizeof srv->last_unknown, "%s from %.60s", path, c->peer);
  pthread_mutex_unlock(&srv->stats_lock);
  char message[160];
  snprintf(message, sizeof message, "method %s%s is not served here", path,
           len > n ? "..." : "");
  rpc_call_reply(c, PS_ERR_UNSUPPORTED, message, NULL, 0);
}

/* Whether the call's auth context has property `property` equal to name
 * (NULL name: copies the first value into out instead). */
static int auth_find(const rpc_call *call, const char *property, const char *name, char *out,
                     size_t out_len) {
  grpc_auth_context *ctx = grpc_call_auth_context(call->call);
  if (ctx == NULL) return 0;
  int found = 0;
  grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ctx, property);
  for (const grpc_auth_property *p; !found && (p = grpc_auth_property_iterator_next(&it)) != NULL;) {
    if (p->value == NULL) continue;
    if (name == NULL) {
      snprintf(out, out_len, "%.*s", (int)p->value_length, p->value);
      found = 1;
    } else {
      found = strlen(name) == p->value_length && memcmp(name, p->value, p->value_length) == 0;
    }
  }
  grpc_auth_context_release(ctx);
  return found;
}

int rpc_call_peer_has_name(const rpc_call *call, const char *name) {
  if (call->srv == NULL || !call->srv->verify_clients) return 0;
  return auth_find(call, "x509_common_name", name, NULL, 0) ||
         auth_find(call, "x509_subject_alternative_name", name, NULL, 0);
}

/* Whether the call carries the expected bearer token; the comparison takes
 * the same time wherever the first difference is. */
static int authorized(const rpc_server *srv, const rpc_call *c) {
  if (srv->bearer == NULL) return 1;
  size_t want_len = strlen(srv->bearer);
  for (size_t i = 0; i < c->request_metadata.count; i++) {
    const grpc_metadata *md = &c->request_metadata.metadata[i];
    if (grpc_slice_str_cmp(md->key, "authorization") != 0) continue;
    size_t len = GRPC_SLICE_LENGTH(md->value);
    const uint8_t *got = GRPC_SLICE_START_PTR(md->value);
    unsigned diff = (unsigned)(len != want_len);
    for (size_t k = 0; k < want_len; k++) {
      uint8_t byte = k < len ? got[k] : 0;
      diff |= (unsigned)(byte ^ (uint8_t)srv->bearer[k]);
    }
    return diff == 0;
  }
  return 0;
}

/* A call's metadata has arrived: who it is from, whether it may go on. Only
 * an authorized call has its body read. (A client without the certificate a
 * CA requires never gets this far: its TLS handshake fails.) */
static void on_arrival(rpc_call *c) {
  rpc_server *srv = c->srv;
  c->counted = 1;
  int open = atomic_fetch_add(&srv->open_calls, 1) + 1;
  char *peer = grpc_call_get_peer(c->call);
  snprintf(c->peer, sizeof c->peer, "%s", peer != NULL ? peer : "unknown peer");
  gpr_free(peer);
  if (c->method < 0) {
    answer_unknown(c);
    return;
  }
  int limit = srv->cfg.limits.max_open_calls;
  if (limit > 0 && open > limit) {
    /* Logged in sums by the caller of rpc_server_stats_get: a flood of lines
     * would cost more than the calls. */
    atomic_fetch_add(&srv->refused_busy, 1);
    char message[160];
    snprintf(message, sizeof message, "the server is busy: it holds %d open calls, its limit%s%s%s"
             "; try again later", limit, srv->cfg.limits.open_calls_flag != NULL ? " (" : "",
             srv->cfg.limits.open_calls_flag != NULL ? srv->cfg.limits.open_calls_flag : "",
             srv->cfg.limits.open_calls_flag != NULL ? ")" : "");
    rpc_call_reply(c, PS_ERR_RESOURCE_EXHAUSTED, message, NULL, 0);
    return;
  }
  if (srv->verify_clients &&
      !auth_find(c, "x509_subject_alternative_name", NULL, c->identity, sizeof c->identity)) {
    auth_find(c, "x509_common_name", NULL, c->identity, sizeof c->identity);
  }
  if (!authorized(srv, c)) {
    LOG_WARN("refused %s from %s: missing or wrong token (UNAUTHENTICATED)", method_of(c),
             c->peer);
    rpc_call_reply(c, PS_ERR_UNAUTHENTICATED, "missing or wrong token", NULL, 0);
    return;
  }
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->payload;
  grpc_call_error rc = grpc_call_start_batch(c->call, &op, 1, &c->read_tag, NULL);
  if (rc != GRPC_CALL_OK) {
    LOG_ERROR("rpc: reading a call of %s from %s failed (%s)", method_of(c), c->peer,
              grpc_call_error_to_string(rc));
    rpc_call_reply(c, PS_ERR_INTERNAL, "the server could not read the request", NULL, 0);
  }
}

/* An authorized call's body is read (or the call ended without one). */
static void on_read(rpc_call *c) {
  if (c->payload == NULL) {
    rpc_call_reply(c, PS_ERR_INVALID_ARGUMENT, "the call carried no request message", NULL, 0);
    return;
  }
  rpc_received r;
  rpc_message msg;
  ps_error err;
  grpc_byte_buffer *payload = c->payload;
  c->payload = NULL;
  if (rpc_received_init(&r, payload, &msg, &err) != PS_ERR_OK) {
    rpc_call_reply(c, err.code, err.msg, NULL, 0);
    return;
  }
  atomic_fetch_add(&c->srv->received_bytes, msg.total);
  c->srv->cfg.handler(c->srv->cfg.handler_ctx, c, c->method, &msg);
  rpc_received_free(&r);
}

static void *worker_main(void *arg) {
  rpc_server *srv = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    rpc_tag *tag = ev.tag;
    switch (tag->kind) {
    case RPC_TAG_REQUEST:
      if (!ev.success) { /* a slot given back at shutdown */
        call_free(tag->call);
        break;
      }
      post_request(srv, tag->call->method);
      on_arrival(tag->call);
      break;
    case RPC_TAG_READ:
      /* A failed read (the call was cancelled) leaves no payload: the reply
       * then goes to a dead call and its completion frees it. */
      on_read(tag->call);
      break;
    case RPC_TAG_DONE:
      call_free(tag->call);
      break;
    case RPC_TAG_SHUTDOWN:
      atomic_store(&srv->shutdown_seen, 1);
      break;
    }
  }
  atomic_fetch_add(&srv->workers_done, 1);
  return NULL;
}

/* Frees the server's own memory once gRPC is done with it. */
static void server_release(rpc_server *srv) {
  free(srv->method_handles);
  free(srv->threads);
  free(srv->bearer);
  pthread_mutex_destroy(&srv->post_lock);
  pthread_mutex_destroy(&srv->stats_lock);
  free(srv);
}

/* Frees a server that never started serving. */
static void server_free(rpc_server *srv) {
  if (srv->server != NULL) grpc_server_destroy(srv->server);
  if (srv->cq != NULL) {
    grpc_completion_queue_shutdown(srv->cq);
    while (grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(srv->cq);
  }
  server_release(srv);
}

static void add_ms(grpc_arg *args, size_t *n, const char *key, double seconds) {
  double ms = seconds * 1000.0;
  args[*n].type = GRPC_ARG_INTEGER;
  args[*n].key = (char *)key;
  args[(*n)++].value.integer = ms >= (double)INT_MAX ? INT_MAX : (int)ms;
}

/* Message sizes and the limits; args needs room for 14 entries. quota: the
 * resource quota to pass, or NULL. */
static grpc_channel_args server_args(grpc_arg *args, const rpc_server_config *cfg,
                                     grpc_resource_quota *quota) {
  grpc_channel_args ca = rpc_channel_args(args, cfg->max_message_bytes, 0);
  const rpc_server_limits *l = &cfg->limits;
  size_t n = ca.num_args;
  if (l->max_streams > 0) {
    args[n].type = GRPC_ARG_INTEGER;
    args[n].key = (char *)GRPC_ARG_MAX_CONCURRENT_STREAMS;
    args[n++].value.integer = l->max_streams;
  }
  if (l->max_idle_s > 0) {
    add_ms(args, &n, GRPC_ARG_MAX_CONNECTION_IDLE_MS, l->max_idle_s);
    /* A connection that never finishes its handshake is not "idle" to gRPC. */
    add_ms(args, &n, GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
           l->max_idle_s < 120 ? l->max_idle_s : 120);
  }
  if (l->max_age_s > 0) {
    add_ms(args, &n, GRPC_ARG_MAX_CONNECTION_AGE_MS, l->max_age_s);
    add_ms(args, &n, GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, l->age_grace_s);
  }
  /* Channelz (gRPC's introspection service) is not served here: its record
   * of every connection would be bookkeeping nobody reads. */
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = (char *)GRPC_ARG_ENABLE_CHANNELZ;
  args[n++].value.integer = 0;
  if (l->keepalive_s > 0) {
    add_ms(args, &n, GRPC_ARG_KEEPALIVE_TIME_MS, l->keepalive_s);
    add_ms(args, &n, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20);
  }
  if (quota != NULL) {
    /* Every connection's buffers and every body being received are charged
     * to it; over it gRPC's chttp2 transport resets the largest streams
     * (ENHANCE_YOUR_CALM) instead of the process growing. */
    args[n].type = GRPC_ARG_POINTER;
    args[n].key = (char *)GRPC_ARG_RESOURCE_QUOTA;
    args[n].value.pointer.p = quota;
    args[n++].value.pointer.vtable = (grpc_arg_pointer_vtable *)grpc_resource_quota_arg_vtable();
  }
  ca.num_args = n;
  return ca;
}

/* The gRPC server with its queue and methods, not yet listening. */
static ps_err server_create(rpc_server *srv, ps_error *err) {
  const rpc_server_config *cfg = &srv->cfg;
  grpc_arg args[14];
  grpc_resource_quota *quota = NULL;
  if (cfg->limits.max_receive_bytes > 0) {
    quota = grpc_resource_quota_create("pstrain-rpc-server");
    if (quota == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: cannot create a quota");
    grpc_resource_quota_resize(quota, cfg->limits.max_receive_bytes);
  }
  grpc_channel_args ca = server_args(args, cfg, quota);
  srv->server = grpc_server_create(&ca, NULL);
  if (quota != NULL) grpc_resource_quota_unref(quota); /* the server holds its own reference */
  srv->cq = grpc_completion_queue_create_for_next(NULL);
  srv->method_handles = calloc((size_t)cfg->method_count, sizeof *srv->method_handles);
  srv->threads = calloc((size_t)cfg->threads, sizeof *srv->threads);
  if (srv->server == NULL || srv->cq == NULL || srv->method_handles == NULL ||
      srv->threads == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: cannot create the gRPC server");
  }
  grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
  for (int m = 0; m < cfg->method_count; m++) {
    /* PAYLOAD_NONE: a call is handed over when its metadata arrives, so the
     * token is checked before any of the body is read. */
    srv->method_handles[m] =
        grpc_server_register_method(srv->server, cfg->methods[m], NULL, GRPC_SRM_PAYLOAD_NONE, 0);
    if (srv->method_handles[m] == NULL) {
      return ps_error_set(err, PS_ERR_INTERNAL, "rpc: registering method %s failed",
                          cfg->methods[m]);
    }
  }
  return PS_ERR_OK;
}

/* Binds cfg->listen with the credentials tls asks for; the port, 0 on failure. */
static int server_listen(rpc_server *srv, const rpc_server_config *cfg, ps_error *err) {
  grpc_server_credentials *creds = NULL;
  if (rpc_server_credentials(cfg->tls, &creds, err) != PS_ERR_OK) return 0;
  int port = grpc_server_add_http2_port(srv->server, cfg->listen, creds);
  grpc_server_credentials_release(creds);
  if (port != 0) return port;
  if (tls_enabled(cfg->tls)) {
    ps_error_set(err, PS_ERR_UNAVAILABLE,
                 "cannot listen on %s over TLS: the address is in use, not local or malformed, "
                 "or gRPC refused the certificate %s with the key %s (do they belong together?)",
                 cfg->listen, cfg->tls->cert, cfg->tls->key);
  } else {
    ps_error_set(err, PS_ERR_UNAVAILABLE,
                 "cannot listen on %s: the address is in use, not local, or malformed",
                 cfg->listen);
  }
  return 0;
}

ps_err rpc_server_start(rpc_server **out, const rpc_server_config *cfg, int *bound_port,
                        ps_error *err) {
  rpc_server *srv = calloc(1, sizeof *srv);
  if (srv == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory");
  srv->cfg = *cfg;
  srv->cfg.token = NULL; /* the caller's copies may go: srv->bearer holds the token */
  srv->cfg.tls = NULL;
  srv->shutdown_tag = (rpc_tag){RPC_TAG_SHUTDOWN, NULL};
  int mrc = pthread_mutex_init(&srv->post_lock, NULL);
  if (mrc != 0) {
    free(srv);
    return ps_error_set(err, PS_ERR_INTERNAL, "rpc: mutex: %s", strerror(mrc));
  }
  if ((mrc = pthread_mutex_init(&srv->stats_lock, NULL)) != 0) {
    pthread_mutex_destroy(&srv->post_lock);
    free(srv);
    return ps_error_set(err, PS_ERR_INTERNAL, "rpc: mutex: %s", strerror(mrc));
  }
  if (cfg->token != NULL && cfg->token[0] != '\0') {
    size_t len = strlen(cfg->token) + 8;
    srv->bearer = malloc(len);
    if (srv->bearer == NULL) {
      server_free(srv);
      return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory");
    }
    snprintf(srv->bearer, len, "Bearer %s", cfg->token);
  }
  srv->verify_clients = tls_enabled(cfg->tls) && cfg->tls->ca != NULL && cfg->tls->ca[0] != '\0';
  int port = 0;
  if (server_create(srv, err) != PS_ERR_OK || (port = server_listen(srv, cfg, err)) == 0) {
    server_free(srv);
    return err->code;
  }
  grpc_server_start(srv->server);
  for (int m = 0; m < cfg->method_count; m++) {
    for (int i = 0; i < RPC_SLOTS_PER_METHOD; i++) post_request(srv, m);
  }
  for (int i = 0; i < RPC_UNKNOWN_SLOTS; i++) post_request(srv, -1);
  for (int t = 0; t < cfg->threads; t++) {
    int rc = pthread_create(&srv->threads[t], NULL, worker_main, srv);
    if (rc != 0) {
      srv->thread_count = t;
      rpc_server_stop(srv);
      return ps_error_set(err, PS_ERR_INTERNAL, "rpc: starting a worker thread: %s", strerror(rc));
    }
  }
  srv->thread_count = cfg->threads;
  *bound_port = port;
  *out = srv;
  return PS_ERR_OK;
}

/* Frees what is left after a drain; workers never run at the same time. */
static void drain_until_shutdown(grpc_completion_queue *cq) {
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) return;
    rpc_tag *tag = ev.tag;
    if (ev.type == GRPC_OP_COMPLETE && tag->kind != RPC_TAG_SHUTDOWN) call_free(tag->call);
  }
}

static double monotonic_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Waits until *flag reaches want or the clock passes deadline; whether it did. */
static int wait_until(atomic_int *flag, int want, double deadline) {
  const struct timespec pause = {0, 1000 * 1000};
  while (atomic_load(flag) < want) {
    if (monotonic_s() >= deadline) return 0;
    nanosleep(&pause, NULL);
  }
  return 1;
}

/* Waits until *count falls to 0 or the clock passes deadline; whether it did. */
static int wait_for_zero(atomic_int *count, double deadline) {
  const struct timespec pause = {0, 1000 * 1000};
  while (atomic_load(count) > 0) {
    if (monotonic_s() >= deadline) return 0;
    nanosleep(&pause, NULL);
  }
  return 1;
}

ps_err rpc_server_stop_within(rpc_server *srv, double timeout_s) {
  if (srv == NULL) return PS_ERR_OK;
  double start = monotonic_s(), deadline = start + timeout_s;
  pthread_mutex_lock(&srv->post_lock);
  srv->stopping = 1;
  pthread_mutex_unlock(&srv->post_lock);
  grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_tag);
  if (srv->thread_count > 0) {
    /* Replies already under way (a last Done) get a quarter of the time, at
     * most 5 s, to leave; then whatever is still open is cancelled. A call
     * still reading its body then completes its read, is answered and freed
     * by a worker. */
    double grace = timeout_s / 4 < 5 ? timeout_s / 4 : 5;
    wait_until(&srv->shutdown_seen, 1, start + grace);
    grpc_server_cancel_all_calls(srv->server);
    if (!wait_until(&srv->shutdown_seen, 1, deadline)) {
      LOG_ERROR("rpc: stopping the server: %d call(s) still open %.1f s after cancelling them "
                "(a handler that has not answered, or gRPC still closing connections): leaving "
                "the server to the process's exit", atomic_load(&srv->open_calls), timeout_s);
      return PS_ERR_TIMEOUT;
    }
    /* The shutdown is published once the connections are gone, while a call
     * may still be between a worker and its reply (a failed read being
     * answered, a handler answering later): a batch started on it after the
     * queue's shutdown aborts the process in gRPC. So every call is freed
     * first; the slots came back failed at the shutdown. */
    if (!wait_for_zero(&srv->live_calls, deadline)) {
      LOG_ERROR("rpc: stopping the server: %d call(s) not yet answered %.1f s after the stop "
                "began (a handler holding a call): leaving the server to the process's exit",
                atomic_load(&srv->open_calls), monotonic_s() - start);
      return PS_ERR_TIMEOUT;
    }
  } else {
    grpc_server_cancel_all_calls(srv->server);
  }
  /* Without workers the shutdown tag is drained below with the rest (no call
   * can be reading: only workers start reads). */
  grpc_server_destroy(srv->server);
  grpc_completion_queue_shutdown(srv->cq);
  if (srv->thread_count > 0) {
    /* A worker inside a handler that never returns would hold the queue. */
    if (!wait_until(&srv->workers_done, srv->thread_count, deadline + 1.0)) {
      LOG_ERROR("rpc: stopping the server: a worker is still busy %.1f s after the stop began: "
                "leaving the server to the process's exit", monotonic_s() - start);
      return PS_ERR_TIMEOUT;
    }
    for (int t = 0; t < srv->thread_count; t++) pthread_join(srv->threads[t], NULL);
  } else {
    drain_until_shutdown(srv->cq);
  }
  grpc_completion_queue_destroy(srv->cq);
  server_release(srv);
  return PS_ERR_OK;
}

void rpc_server_stop(rpc_server *srv) { (void)rpc_server_stop_within(srv, 30.0); }
