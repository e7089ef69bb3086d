/* gRPC C core behind pstrain's RPC API: completion queues, worker threads,
 * byte buffers over borrowed or copied slices, deadlines, status mapping. */
#define _POSIX_C_SOURCE 200809L
#include "common/rpc.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

/* Request slots kept posted per method: enough for every trainer's calls. */
#define RPC_SLOTS_PER_METHOD 64

void rpc_global_init(void) { grpc_init(); }
void rpc_global_shutdown(void) { grpc_shutdown(); }

static ps_err err_from_status(grpc_status_code status) {
  switch (status) {
  case GRPC_STATUS_OK: return PS_ERR_OK;
  case GRPC_STATUS_CANCELLED: return PS_ERR_CANCELLED;
  case GRPC_STATUS_INVALID_ARGUMENT: return PS_ERR_INVALID_ARGUMENT;
  case GRPC_STATUS_DEADLINE_EXCEEDED: return PS_ERR_TIMEOUT;
  case GRPC_STATUS_PERMISSION_DENIED: return PS_ERR_PERMISSION_DENIED;
  case GRPC_STATUS_RESOURCE_EXHAUSTED: return PS_ERR_RESOURCE_EXHAUSTED;
  case GRPC_STATUS_FAILED_PRECONDITION: return PS_ERR_FAILED_PRECONDITION;
  case GRPC_STATUS_ABORTED: return PS_ERR_ABORTED;
  case GRPC_STATUS_OUT_OF_RANGE: return PS_ERR_OUT_OF_RANGE;
  case GRPC_STATUS_UNIMPLEMENTED: return PS_ERR_UNSUPPORTED;
  case GRPC_STATUS_UNAVAILABLE: return PS_ERR_UNAVAILABLE;
  case GRPC_STATUS_DATA_LOSS: return PS_ERR_CORRUPT_DATA;
  case GRPC_STATUS_UNAUTHENTICATED: return PS_ERR_UNAUTHENTICATED;
  default: return PS_ERR_INTERNAL;
  }
}

static grpc_status_code status_from_err(ps_err code) {
  switch (code) {
  case PS_ERR_OK: return GRPC_STATUS_OK;
  case PS_ERR_INVALID_ARGUMENT: return GRPC_STATUS_INVALID_ARGUMENT;
  case PS_ERR_CORRUPT_DATA: return GRPC_STATUS_INVALID_ARGUMENT;
  case PS_ERR_NO_MEMORY: return GRPC_STATUS_RESOURCE_EXHAUSTED;
  case PS_ERR_UNSUPPORTED: return GRPC_STATUS_UNIMPLEMENTED;
  case PS_ERR_FAILED_PRECONDITION: return GRPC_STATUS_FAILED_PRECONDITION;
  case PS_ERR_OUT_OF_RANGE: return GRPC_STATUS_OUT_OF_RANGE;
  case PS_ERR_UNAVAILABLE: return GRPC_STATUS_UNAVAILABLE;
  case PS_ERR_TIMEOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
  case PS_ERR_CANCELLED: return GRPC_STATUS_CANCELLED;
  case PS_ERR_ABORTED: return GRPC_STATUS_ABORTED;
  case PS_ERR_UNAUTHENTICATED: return GRPC_STATUS_UNAUTHENTICATED;
  case PS_ERR_PERMISSION_DENIED: return GRPC_STATUS_PERMISSION_DENIED;
  case PS_ERR_RESOURCE_EXHAUSTED: return GRPC_STATUS_RESOURCE_EXHAUSTED;
  default: return GRPC_STATUS_INTERNAL;
  }
}

/* --- parts and messages ---------------------------------------------------- */

static void lease_release(void *lease) { atomic_fetch_sub(&((rpc_lease *)lease)->refs, 1); }

ps_err rpc_lease_wait(rpc_lease *lease) {
  const struct timespec pause = {0, 50 * 1000};
  for (long waited_us = 0; atomic_load(&lease->refs) > 0; waited_us += 50) {
    if (waited_us > 30L * 1000 * 1000) {
      LOG_WARN("rpc: gRPC still holds %d reference(s) to a buffer after 30 s",
               atomic_load(&lease->refs));
      return PS_ERR_TIMEOUT;
    }
    nanosleep(&pause, NULL);
  }
  return PS_ERR_OK;
}

/* A byte buffer over the parts: borrowed ones by reference, the rest copied. */
static grpc_byte_buffer *buffer_from_parts(const rpc_part *parts, int count) {
  grpc_slice stack_slices[32];
  grpc_slice *slices = count <= 32 ? stack_slices : malloc((size_t)count * sizeof *slices);
  if (slices == NULL) return NULL;
  for (int i = 0; i < count; i++) {
    if (parts[i].lease != NULL) {
      atomic_fetch_add(&parts[i].lease->refs, 1);
      slices[i] = grpc_slice_new_with_user_data((void *)parts[i].data, parts[i].len, lease_release,
                                                parts[i].lease);
    } else {
      slices[i] = grpc_slice_from_copied_buffer(parts[i].data, parts[i].len);
    }
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(slices, (size_t)count);
  for (int i = 0; i < count; i++) grpc_slice_unref(slices[i]);
  if (slices != stack_slices) free(slices);
  return bb;
}

/* The slices of a received buffer, kept referenced while they are read. */
typedef struct received {
  grpc_byte_buffer *bb;
  grpc_slice *slices;
  rpc_segment *segments;
  size_t count;
} received;

static void received_free(received *r) {
  for (size_t i = 0; i < r->count; i++) grpc_slice_unref(r->slices[i]);
  free(r->slices);
  free(r->segments);
  if (r->bb != NULL) grpc_byte_buffer_destroy(r->bb);
  memset(r, 0, sizeof *r);
}

/* Takes ownership of bb and fills msg with views of its slices. */
static ps_err received_init(received *r, grpc_byte_buffer *bb, rpc_message *msg, ps_error *err) {
  memset(r, 0, sizeof *r);
  r->bb = bb;
  grpc_byte_buffer_reader reader;
  if (!grpc_byte_buffer_reader_init(&reader, bb)) {
    received_free(r);
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "rpc: cannot read a received message");
  }
  size_t cap = 0, total = 0;
  grpc_slice slice;
  ps_err rc = PS_ERR_OK;
  while (grpc_byte_buffer_reader_next(&reader, &slice)) {
    if (r->count == cap) {
      cap = cap == 0 ? 8 : 2 * cap;
      grpc_slice *s = realloc(r->slices, cap * sizeof *s);
      rpc_segment *g = s == NULL ? NULL : realloc(r->segments, cap * sizeof *g);
      if (s != NULL) r->slices = s;
      if (g == NULL) {
        grpc_slice_unref(slice);
        rc = ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory reading a message");
        break;
      }
      r->segments = g;
    }
    r->slices[r->count++] = slice;
    total += GRPC_SLICE_LENGTH(slice);
  }
  grpc_byte_buffer_reader_destroy(&reader);
  if (rc != PS_ERR_OK) {
    received_free(r);
    return rc;
  }
  /* Small slices keep their bytes inside the grpc_slice struct itself, so
   * pointers are taken only now, from the array's final place. */
  for (size_t i = 0; i < r->count; i++) {
    r->segments[i].data = GRPC_SLICE_START_PTR(r->slices[i]);
    r->segments[i].len = GRPC_SLICE_LENGTH(r->slices[i]);
  }
  msg->segments = r->segments;
  msg->count = r->count;
  msg->total = total;
  return PS_ERR_OK;
}

static grpc_channel_args make_args(grpc_arg *args, size_t max_message_bytes, int max_reconnect_ms) {
  int limit = max_message_bytes > (size_t)INT32_MAX ? INT32_MAX : (int)max_message_bytes;
  int n = 0;
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[n++].value.integer = limit;
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[n++].value.integer = limit;
  if (max_reconnect_ms > 0) {
    /* The default backoff grows to 120 s; a restarted peer should be found at once. */
    args[n].type = GRPC_ARG_INTEGER;
    args[n].key = (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
    args[n++].value.integer = max_reconnect_ms;
    args[n].type = GRPC_ARG_INTEGER;
    args[n].key = (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS;
    args[n++].value.integer = max_reconnect_ms < 100 ? max_reconnect_ms : 100;
    args[n].type = GRPC_ARG_INTEGER;
    args[n].key = (char *)GRPC_ARG_MIN_RECONNECT_BACKOFF_MS;
    args[n++].value.integer = max_reconnect_ms < 100 ? max_reconnect_ms : 100;
  }
  grpc_channel_args ca = {(size_t)n, args};
  return ca;
}

static gpr_timespec deadline_in(double seconds) {
  if (seconds <= 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_micros((int64_t)(seconds * 1e6), GPR_TIMESPAN));
}

/* --- server ---------------------------------------------------------------- */

typedef enum { TAG_REQUEST, TAG_DONE, TAG_SHUTDOWN } tag_kind;

typedef struct rpc_tag {
  tag_kind kind;
  rpc_call *call;
} rpc_tag;

struct rpc_call {
  rpc_server *srv;
  int method;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array request_metadata;
  grpc_byte_buffer *payload;
  rpc_tag request_tag, done_tag;
  grpc_byte_buffer *reply;
  grpc_slice details;
  int cancelled;
  char peer[128];
  char identity[128]; /* the verified client certificate's name, or "" */
  rpc_local_result *local; /* an in-memory call: replies are recorded here */
};

struct rpc_server {
  rpc_server_config cfg;
  char *bearer; /* "Bearer TOKEN" when a token is required, else NULL */
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
};

static void call_free(rpc_call *c) {
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
    LOG_ERROR("rpc: out of memory posting a request slot for %s", srv->cfg.methods[method]);
    return;
  }
  c->srv = srv;
  c->method = method;
  c->details = grpc_empty_slice();
  c->request_tag = (rpc_tag){TAG_REQUEST, c};
  c->done_tag = (rpc_tag){TAG_DONE, c};
  grpc_metadata_array_init(&c->request_metadata);
  grpc_call_error rc = grpc_server_request_registered_call(
      srv->server, srv->method_handles[method], &c->call, &c->deadline, &c->request_metadata,
      &c->payload, srv->cq, srv->cq, &c->request_tag);
  pthread_mutex_unlock(&srv->post_lock);
  if (rc != GRPC_CALL_OK) {
    LOG_ERROR("rpc: posting a request slot for %s failed (grpc_call_error %d)",
              srv->cfg.methods[method], (int)rc);
    call_free(c);
  }
}

static void local_reply(rpc_call *c, ps_err code, const char *message, const rpc_part *parts,
                        int part_count);

void rpc_call_reply(rpc_call *c, ps_err code, const char *message, const rpc_part *parts,
                    int part_count) {
  if (c->local != NULL) {
    local_reply(c, code, message, parts, part_count);
    return;
  }
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  int n = 0;
  ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n++].data.send_initial_metadata.count = 0;
  if (code == PS_ERR_OK && part_count > 0) {
    c->reply = buffer_from_parts(parts, part_count);
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
  ops[n].data.send_status_from_server.status = status_from_err(code);
  ops[n++].data.send_status_from_server.status_details = &c->details;
  ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
  grpc_call_error rc = grpc_call_start_batch(c->call, ops, (size_t)n, &c->done_tag, NULL);
  if (rc != GRPC_CALL_OK) {
    LOG_ERROR("rpc: answering a %s call from %s failed (grpc_call_error %d)",
              c->srv->cfg.methods[c->method], c->peer, (int)rc);
    call_free(c); /* no completion will come for a batch that did not start */
  }
}

const char *rpc_call_peer(const rpc_call *call) { return call->peer; }

const char *rpc_call_peer_identity(const rpc_call *call) { return call->identity; }

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
  if (!call->srv->verify_clients) return 0;
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

static void handle_request(rpc_call *c) {
  char *peer = grpc_call_get_peer(c->call);
  snprintf(c->peer, sizeof c->peer, "%s", peer != NULL ? peer : "unknown peer");
  gpr_free(peer);
  if (c->srv->verify_clients &&
      !auth_find(c, "x509_subject_alternative_name", NULL, c->identity, sizeof c->identity)) {
    auth_find(c, "x509_common_name", NULL, c->identity, sizeof c->identity);
  }
  if (!authorized(c->srv, c)) {
    LOG_WARN("refused %s from %s: missing or wrong token (UNAUTHENTICATED)",
             c->srv->cfg.methods[c->method], c->peer);
    rpc_call_reply(c, PS_ERR_UNAUTHENTICATED, "missing or wrong token", NULL, 0);
    return;
  }
  if (c->payload == NULL) {
    rpc_call_reply(c, PS_ERR_INVALID_ARGUMENT, "the call carried no request message", NULL, 0);
    return;
  }
  received r;
  rpc_message msg;
  ps_error err;
  grpc_byte_buffer *payload = c->payload;
  c->payload = NULL;
  if (received_init(&r, payload, &msg, &err) != PS_ERR_OK) {
    rpc_call_reply(c, err.code, err.msg, NULL, 0);
    return;
  }
  c->srv->cfg.handler(c->srv->cfg.handler_ctx, c, c->method, &msg);
  received_free(&r);
}

static void *worker_main(void *arg) {
  rpc_server *srv = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    rpc_tag *tag = ev.tag;
    switch (tag->kind) {
    case TAG_REQUEST:
      if (!ev.success) { /* a slot given back at shutdown */
        call_free(tag->call);
        break;
      }
      post_request(srv, tag->call->method);
      handle_request(tag->call);
      break;
    case TAG_DONE:
      call_free(tag->call);
      break;
    case TAG_SHUTDOWN:
      atomic_store(&srv->shutdown_seen, 1);
      break;
    }
  }
  return NULL;
}

/* Frees the server's own memory once gRPC is done with it. */
static void server_release(rpc_server *srv) {
  free(srv->method_handles);
  free(srv->threads);
  free(srv->bearer);
  pthread_mutex_destroy(&srv->post_lock);
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

/* Plaintext, or TLS from the PEM files (gRPC copies the texts). */
static ps_err server_credentials(const tls_config *tls, grpc_server_credentials **out,
                                 ps_error *err) {
  if (!tls_enabled(tls)) {
    *out = grpc_insecure_server_credentials_create();
    return PS_ERR_OK;
  }
  if (tls_check_server(tls, err) != PS_ERR_OK) return err->code;
  char *cert = NULL, *key = NULL, *ca = NULL;
  int has_ca = tls->ca != NULL && tls->ca[0] != '\0';
  if (tls_read_pem(tls->cert, "--tls-cert", "CERTIFICATE", &cert, err) == PS_ERR_OK &&
      tls_read_pem(tls->key, "--tls-key", "PRIVATE KEY", &key, err) == PS_ERR_OK &&
      (!has_ca || tls_read_pem(tls->ca, "--tls-ca", "CERTIFICATE", &ca, err) == PS_ERR_OK)) {
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    *out = grpc_ssl_server_credentials_create_ex(
        ca, &pair, 1,
        has_ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
               : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
    if (*out == NULL) ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "gRPC refused the TLS settings");
  }
  if (key != NULL) memset(key, 0, strlen(key));
  free(cert);
  free(key);
  free(ca);
  return *out != NULL ? PS_ERR_OK : err->code;
}

ps_err rpc_server_start(rpc_server **out, const rpc_server_config *cfg, int *bound_port,
                        ps_error *err) {
  rpc_server *srv = calloc(1, sizeof *srv);
  if (srv == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory");
  srv->cfg = *cfg;
  srv->shutdown_tag = (rpc_tag){TAG_SHUTDOWN, NULL};
  int mrc = pthread_mutex_init(&srv->post_lock, NULL);
  if (mrc != 0) {
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
  srv->cfg.token = NULL; /* the caller's copy may go; srv->bearer holds it */
  grpc_arg args[5];
  grpc_channel_args ca = make_args(args, cfg->max_message_bytes, 0);
  srv->server = grpc_server_create(&ca, NULL);
  srv->cq = grpc_completion_queue_create_for_next(NULL);
  srv->method_handles = calloc((size_t)cfg->method_count, sizeof *srv->method_handles);
  srv->threads = calloc((size_t)cfg->threads, sizeof *srv->threads);
  if (srv->server == NULL || srv->cq == NULL || srv->method_handles == NULL ||
      srv->threads == NULL) {
    server_free(srv);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: cannot create the gRPC server");
  }
  grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
  for (int m = 0; m < cfg->method_count; m++) {
    srv->method_handles[m] = grpc_server_register_method(
        srv->server, cfg->methods[m], NULL, GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    if (srv->method_handles[m] == NULL) {
      server_free(srv);
      return ps_error_set(err, PS_ERR_INTERNAL, "rpc: registering method %s failed",
                          cfg->methods[m]);
    }
  }
  grpc_server_credentials *creds = NULL;
  if (server_credentials(cfg->tls, &creds, err) != PS_ERR_OK) {
    server_free(srv);
    return err->code;
  }
  srv->verify_clients = tls_enabled(cfg->tls) && cfg->tls->ca != NULL && cfg->tls->ca[0] != '\0';
  srv->cfg.tls = NULL; /* the caller's copy may go */
  int port = grpc_server_add_http2_port(srv->server, cfg->listen, creds);
  grpc_server_credentials_release(creds);
  if (port == 0) {
    server_free(srv);
    if (tls_enabled(cfg->tls)) {
      return ps_error_set(err, PS_ERR_UNAVAILABLE,
                          "cannot listen on %s over TLS: the address is in use, not local or "
                          "malformed, or gRPC refused the certificate %s with the key %s (do "
                          "they belong together?)", cfg->listen, cfg->tls->cert, cfg->tls->key);
    }
    return ps_error_set(err, PS_ERR_UNAVAILABLE,
                        "cannot listen on %s: the address is in use, not local, or malformed",
                        cfg->listen);
  }
  grpc_server_start(srv->server);
  for (int m = 0; m < cfg->method_count; m++) {
    for (int i = 0; i < RPC_SLOTS_PER_METHOD; i++) post_request(srv, m);
  }
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
    if (ev.type == GRPC_OP_COMPLETE && tag->kind != TAG_SHUTDOWN) call_free(tag->call);
  }
}

void rpc_server_stop(rpc_server *srv) {
  if (srv == NULL) return;
  pthread_mutex_lock(&srv->post_lock);
  srv->stopping = 1;
  pthread_mutex_unlock(&srv->post_lock);
  grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_tag);
  if (srv->thread_count > 0) {
    /* Replies already under way (a last Done) get up to 5 s to leave; then
     * whatever is still open is cancelled. */
    const struct timespec pause = {0, 1000 * 1000};
    for (int waited_ms = 0; !atomic_load(&srv->shutdown_seen) && waited_ms < 5000; waited_ms++) {
      nanosleep(&pause, NULL);
    }
    grpc_server_cancel_all_calls(srv->server);
    while (!atomic_load(&srv->shutdown_seen)) nanosleep(&pause, NULL);
  } else {
    grpc_server_cancel_all_calls(srv->server);
  }
  /* Without workers the shutdown tag is drained below with the rest. */
  grpc_server_destroy(srv->server);
  grpc_completion_queue_shutdown(srv->cq);
  if (srv->thread_count > 0) {
    for (int t = 0; t < srv->thread_count; t++) pthread_join(srv->threads[t], NULL);
  } else {
    drain_until_shutdown(srv->cq);
  }
  grpc_completion_queue_destroy(srv->cq);
  server_release(srv);
}

/* --- in-memory calls -------------------------------------------------------- */

rpc_call *rpc_call_local_create(const char *peer) {
  rpc_call *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->local = calloc(1, sizeof *c->local);
  if (c->local == NULL) {
    free(c);
    return NULL;
  }
  c->method = -1;
  snprintf(c->peer, sizeof c->peer, "%s", peer != NULL ? peer : "local");
  return c;
}

const rpc_local_result *rpc_call_local_result(const rpc_call *call) { return call->local; }

void rpc_call_local_free(rpc_call *call) {
  if (call == NULL) return;
  free(call->local->bytes);
  free(call->local);
  free(call);
}

/* Records the first reply (its parts copied: borrowed memory is not kept). */
static void local_reply(rpc_call *c, ps_err code, const char *message, const rpc_part *parts,
                        int part_count) {
  rpc_local_result *r = c->local;
  if (r->replies++ > 0) return;
  r->code = code;
  snprintf(r->message, sizeof r->message, "%s", message != NULL ? message : "");
  if (code != PS_ERR_OK) return;
  size_t total = 0;
  for (int i = 0; i < part_count; i++) total += parts[i].len;
  r->bytes = malloc(total > 0 ? total : 1);
  if (r->bytes == NULL) {
    r->code = PS_ERR_NO_MEMORY;
    snprintf(r->message, sizeof r->message, "out of memory recording a local reply");
    return;
  }
  for (int i = 0; i < part_count; i++) {
    memcpy(r->bytes + r->len, parts[i].data, parts[i].len);
    r->len += parts[i].len;
  }
}

/* --- client ---------------------------------------------------------------- */

struct rpc_channel {
  grpc_channel *channel;
  char target[256];
};

struct rpc_client {
  grpc_completion_queue *cq;
  grpc_channel_credentials *creds; /* plaintext or TLS, shared by the channels */
  char server_name[256];           /* TLS: override of the name verified, or "" */
  int tls;
  grpc_metadata auth;   /* authorization: Bearer TOKEN */
  int has_auth;
  rpc_channel **channels;
  int channel_count;
};

/* Plaintext, or TLS from the PEM files (gRPC copies the texts). */
static ps_err client_credentials(const tls_config *tls, grpc_channel_credentials **out,
                                 ps_error *err) {
  if (!tls_enabled(tls)) {
    *out = grpc_insecure_credentials_create();
    return PS_ERR_OK;
  }
  if (tls_check_client(tls, err) != PS_ERR_OK) return err->code;
  char *cert = NULL, *key = NULL, *ca = NULL;
  int has_pair = tls->cert != NULL && tls->cert[0] != '\0';
  *out = NULL;
  if (tls_read_pem(tls->ca, "--tls-ca", "CERTIFICATE", &ca, err) == PS_ERR_OK &&
      (!has_pair ||
       (tls_read_pem(tls->cert, "--tls-cert", "CERTIFICATE", &cert, err) == PS_ERR_OK &&
        tls_read_pem(tls->key, "--tls-key", "PRIVATE KEY", &key, err) == PS_ERR_OK))) {
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    *out = grpc_ssl_credentials_create_ex(ca, has_pair ? &pair : NULL, NULL, NULL);
    if (*out == NULL) ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "gRPC refused the TLS settings");
  }
  if (key != NULL) memset(key, 0, strlen(key));
  free(cert);
  free(key);
  free(ca);
  return *out != NULL ? PS_ERR_OK : err->code;
}

ps_err rpc_client_create(rpc_client **out, const char *token, const tls_config *tls,
                         ps_error *err) {
  rpc_client *c = calloc(1, sizeof *c);
  if (c == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory");
  if (client_credentials(tls, &c->creds, err) != PS_ERR_OK) {
    free(c);
    return err->code;
  }
  c->tls = tls_enabled(tls);
  if (c->tls && tls->server_name != NULL) {
    snprintf(c->server_name, sizeof c->server_name, "%s", tls->server_name);
  }
  if (token != NULL && token[0] != '\0') {
    char *value = malloc(strlen(token) + 8);
    if (value == NULL) {
      grpc_channel_credentials_release(c->creds);
      free(c);
      return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory");
    }
    sprintf(value, "Bearer %s", token);
    c->auth.key = grpc_slice_from_static_string("authorization");
    c->auth.value = grpc_slice_from_copied_string(value);
    free(value);
    c->has_auth = 1;
  }
  c->cq = grpc_completion_queue_create_for_next(NULL);
  if (c->cq == NULL) {
    if (c->has_auth) grpc_slice_unref(c->auth.value);
    grpc_channel_credentials_release(c->creds);
    free(c);
    return ps_error_set(err, PS_ERR_INTERNAL, "rpc: cannot create a completion queue");
  }
  *out = c;
  return PS_ERR_OK;
}

void rpc_client_destroy(rpc_client *c) {
  if (c == NULL) return;
  for (int i = 0; i < c->channel_count; i++) {
    grpc_channel_destroy(c->channels[i]->channel);
    free(c->channels[i]);
  }
  free(c->channels);
  grpc_completion_queue_shutdown(c->cq);
  while (grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(c->cq);
  if (c->has_auth) grpc_slice_unref(c->auth.value);
  grpc_channel_credentials_release(c->creds);
  free(c);
}

ps_err rpc_channel_open(rpc_client *c, const char *target, size_t max_message_bytes,
                        int max_reconnect_ms, rpc_channel **out, ps_error *err) {
  rpc_channel *ch = calloc(1, sizeof *ch);
  rpc_channel **grown = realloc(c->channels, (size_t)(c->channel_count + 1) * sizeof *grown);
  if (ch == NULL || grown == NULL) {
    free(ch);
    if (grown != NULL) c->channels = grown;
    return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory opening a channel");
  }
  c->channels = grown;
  snprintf(ch->target, sizeof ch->target, "%s", target);
  grpc_arg args[6];
  grpc_channel_args ca = make_args(args, max_message_bytes, max_reconnect_ms);
  if (c->server_name[0] != '\0') {
    args[ca.num_args].type = GRPC_ARG_STRING;
    args[ca.num_args].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
    args[ca.num_args++].value.string = c->server_name;
  }
  ch->channel = grpc_channel_create(target, c->creds, &ca);
  if (ch->channel == NULL) {
    free(ch);
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "rpc: cannot create a channel to '%s'",
                        target);
  }
  c->channels[c->channel_count++] = ch;
  *out = ch;
  return PS_ERR_OK;
}

const char *rpc_channel_target(const rpc_channel *channel) { return channel->target; }

typedef struct reply_internal {
  received r;
} reply_internal;

void rpc_reply_free(rpc_reply *reply) {
  reply_internal *ri = reply->internal;
  if (ri != NULL) {
    received_free(&ri->r);
    free(ri);
  }
  memset(reply, 0, sizeof *reply);
}

ps_err rpc_reply_from_parts(const rpc_part *parts, int count, rpc_reply *out, ps_error *err) {
  memset(out, 0, sizeof *out);
  reply_internal *ri = calloc(1, sizeof *ri);
  grpc_byte_buffer *bb = buffer_from_parts(parts, count);
  if (ri == NULL || bb == NULL) {
    free(ri);
    if (bb != NULL) grpc_byte_buffer_destroy(bb);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory building a message");
  }
  if (received_init(&ri->r, bb, &out->message, err) != PS_ERR_OK) {
    free(ri);
    return err->code;
  }
  out->internal = ri;
  return PS_ERR_OK;
}

typedef struct call_state {
  grpc_call *call;
  grpc_byte_buffer *request;
  grpc_metadata_array initial, trailing;
  grpc_byte_buffer *response;
  grpc_status_code status;
  grpc_slice details;
  const char *error_string;
  int started;
} call_state;

/* gRPC's last connection error, shortened, with what it likely means. */
static void explain_connect_error(const rpc_client *c, const char *text, char *why, size_t len) {
  static const char prefix[] = "failed to connect to all addresses; last error: ";
  if (strncmp(text, prefix, sizeof prefix - 1) == 0) text += sizeof prefix - 1;
  const char *hint = "";
  if (c->tls && strstr(text, "Peer name") != NULL) {
    hint = "TLS: the pserver's certificate does not carry the name dialled (give --tls-server-name "
           "a name it carries, or make it a certificate for this address)";
  } else if (c->tls && (strstr(text, "andshake") != NULL || strstr(text, "certificate") != NULL)) {
    hint = "the TLS handshake failed: is the pserver's certificate signed by the --tls-ca CA, and "
           "does the pserver serve TLS?";
  } else if (c->tls && strstr(text, "Socket closed") != NULL) {
    hint = "the pserver closed the TLS handshake: one with --tls-ca requires this trainer's "
           "--tls-cert and --tls-key, signed by that CA";
  } else if (!c->tls && strstr(text, "Socket closed") != NULL) {
    hint = "this trainer talks plaintext: if the pserver serves TLS, give --tls-ca (and "
           "--tls-cert, --tls-key)";
  }
  snprintf(why, len, "%s%s%s", text, hint[0] != '\0' ? "; " : "", hint);
}

/* Why a channel does not connect: a wait-for-ready call that times out
 * says only "Deadline Exceeded", but a fail-fast call on a failing channel
 * ends at once with gRPC's last connection error. Leaves why as it is when
 * the probe reaches the server (the channel works) or learns nothing within
 * 2 s (a server never answers a method it does not serve). */
static void probe_connection(rpc_client *c, rpc_channel *ch, char *why, size_t len) {
  grpc_call *call = grpc_channel_create_call(
      ch->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq,
      grpc_slice_from_static_string("/pstrain.Probe/Connect"), NULL, deadline_in(2), NULL);
  if (call == NULL) return;
  grpc_metadata_array trailing;
  grpc_metadata_array_init(&trailing);
  grpc_status_code status = GRPC_STATUS_OK;
  grpc_slice details = grpc_empty_slice();
  const char *error_string = NULL;
  grpc_op g[3];
  memset(g, 0, sizeof g);
  g[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  g[1].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  g[2].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  g[2].data.recv_status_on_client.trailing_metadata = &trailing;
  g[2].data.recv_status_on_client.status = &status;
  g[2].data.recv_status_on_client.status_details = &details;
  g[2].data.recv_status_on_client.error_string = &error_string;
  if (grpc_call_start_batch(call, g, 3, &status, NULL) == GRPC_CALL_OK) {
    grpc_event ev;
    do {
      ev = grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    } while (ev.type != GRPC_OP_COMPLETE || ev.tag != &status);
    char *text = grpc_slice_to_c_string(details);
    if (status == GRPC_STATUS_UNAVAILABLE && text != NULL) explain_connect_error(c, text, why, len);
    gpr_free(text);
  }
  if (error_string != NULL) gpr_free((void *)error_string);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&trailing);
  grpc_call_unref(call);
}

ps_err rpc_client_call_all(rpc_client *c, rpc_op *ops, int count, ps_error *err) {
  call_state *states = calloc((size_t)count, sizeof *states);
  if (states == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory for calls");
  int started = 0;
  for (int i = 0; i < count; i++) {
    rpc_op *op = &ops[i];
    call_state *s = &states[i];
    memset(&op->reply, 0, sizeof op->reply);
    op->code = PS_ERR_OK;
    op->message[0] = '\0';
    grpc_metadata_array_init(&s->initial);
    grpc_metadata_array_init(&s->trailing);
    s->details = grpc_empty_slice();
    s->call = grpc_channel_create_call(op->channel->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq,
                                       grpc_slice_from_static_string(op->method), NULL,
                                       deadline_in(op->timeout_s), NULL);
    s->request = buffer_from_parts(op->parts, op->part_count);
    if (s->call == NULL || s->request == NULL) {
      op->code = PS_ERR_INTERNAL;
      snprintf(op->message, sizeof op->message, "cannot create the call");
      continue;
    }
    grpc_op g[6];
    memset(g, 0, sizeof g);
    g[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    g[0].data.send_initial_metadata.count = c->has_auth ? 1 : 0;
    g[0].data.send_initial_metadata.metadata = c->has_auth ? &c->auth : NULL;
    g[0].flags = op->wait_for_ready ? GRPC_INITIAL_METADATA_WAIT_FOR_READY |
                                          GRPC_INITIAL_METADATA_WAIT_FOR_READY_EXPLICITLY_SET
                                    : 0;
    g[1].op = GRPC_OP_SEND_MESSAGE;
    g[1].data.send_message.send_message = s->request;
    g[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    g[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    g[3].data.recv_initial_metadata.recv_initial_metadata = &s->initial;
    g[4].op = GRPC_OP_RECV_MESSAGE;
    g[4].data.recv_message.recv_message = &s->response;
    g[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    g[5].data.recv_status_on_client.trailing_metadata = &s->trailing;
    g[5].data.recv_status_on_client.status = &s->status;
    g[5].data.recv_status_on_client.status_details = &s->details;
    g[5].data.recv_status_on_client.error_string = &s->error_string;
    grpc_call_error rc = grpc_call_start_batch(s->call, g, 6, s, NULL);
    if (rc != GRPC_CALL_OK) {
      op->code = PS_ERR_INTERNAL;
      snprintf(op->message, sizeof op->message, "starting the call failed (grpc_call_error %d)",
               (int)rc);
      continue;
    }
    s->started = 1;
    started++;
  }
  /* Every started call completes, at the latest at its deadline. */
  for (int done = 0; done < started;) {
    grpc_event ev = grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_OP_COMPLETE) done++;
  }
  ps_err first = PS_ERR_OK;
  int first_index = -1;
  for (int i = 0; i < count; i++) {
    rpc_op *op = &ops[i];
    call_state *s = &states[i];
    if (s->started) {
      op->code = err_from_status(s->status);
      if (op->code != PS_ERR_OK) {
        char *details = grpc_slice_to_c_string(s->details);
        snprintf(op->message, sizeof op->message, "%s", details != NULL ? details : "");
        gpr_free(details);
        if (op->code == PS_ERR_TIMEOUT && op->wait_for_ready) {
          probe_connection(c, op->channel, op->message, sizeof op->message);
        }
        if (s->response != NULL) grpc_byte_buffer_destroy(s->response);
      } else if (s->response == NULL) {
        op->code = PS_ERR_CORRUPT_DATA;
        snprintf(op->message, sizeof op->message, "the reply carried no message");
      } else {
        reply_internal *ri = calloc(1, sizeof *ri);
        ps_error rerr;
        if (ri == NULL) {
          grpc_byte_buffer_destroy(s->response);
          op->code = PS_ERR_NO_MEMORY;
          snprintf(op->message, sizeof op->message, "out of memory reading the reply");
        } else if (received_init(&ri->r, s->response, &op->reply.message, &rerr) != PS_ERR_OK) {
          free(ri);
          op->code = rerr.code;
          snprintf(op->message, sizeof op->message, "%.380s", rerr.msg);
        } else {
          op->reply.internal = ri;
        }
      }
    }
    if (op->code != PS_ERR_OK && first == PS_ERR_OK) {
      first = op->code;
      first_index = i;
    }
    if (s->error_string != NULL) gpr_free((void *)s->error_string);
    grpc_slice_unref(s->details);
    grpc_metadata_array_destroy(&s->initial);
    grpc_metadata_array_destroy(&s->trailing);
    if (s->request != NULL) grpc_byte_buffer_destroy(s->request);
    if (s->call != NULL) grpc_call_unref(s->call);
  }
  free(states);
  if (first != PS_ERR_OK) {
    rpc_op *op = &ops[first_index];
    return ps_error_set(err, first, "%s %s: %s (%s)", op->channel->target, op->method, op->message,
                        ps_err_name(first));
  }
  return PS_ERR_OK;
}
