/* The RPC client: credentials and a bearer token shared by its channels, one
 * completion queue, batches of calls started together and awaited together,
 * and why a channel does not connect when a call cannot say. */
#define _POSIX_C_SOURCE 200809L
#include <grpc/support/alloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/rpc_internal.h"

struct rpc_channel {
  grpc_channel *channel;
  char target[256];
};

struct rpc_client {
  grpc_completion_queue *cq;
  grpc_channel_credentials *creds; /* plaintext or TLS, shared by the channels */
  char server_name[256];           /* TLS: override of the name verified, or "" */
  int tls;
  grpc_metadata auth; /* authorization: Bearer TOKEN */
  int has_auth;
  rpc_channel **channels;
  int channel_count;
  int in_flight; /* rpc_client_start's calls not yet collected */
};

ps_err rpc_client_create(rpc_client **out, const char *token, const tls_config *tls,
                         ps_error *err) {
  rpc_client *c = calloc(1, sizeof *c);
  if (c == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory");
  if (rpc_client_credentials(tls, &c->creds, err) != PS_ERR_OK) {
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
  grpc_channel_args ca = rpc_channel_args(args, max_message_bytes, max_reconnect_ms);
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

/* --- connection diagnosis ------------------------------------------------------ */

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
      grpc_slice_from_static_string("/pstrain.Probe/Connect"), NULL, rpc_deadline_in(2), NULL);
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

/* --- batches of calls ----------------------------------------------------------- */

/* One call of a batch while it runs: what gRPC fills, and what to free. */
typedef struct call_state {
  grpc_call *call;
  grpc_byte_buffer *request;
  grpc_metadata_array initial, trailing;
  grpc_byte_buffer *response;
  grpc_status_code status;
  grpc_slice details;
  const char *error_string;
  int started;
  rpc_op *op; /* rpc_client_start: whose call this is */
} call_state;

/* Creates op's call and starts its one batch (send all, receive all). Returns
 * whether it started; otherwise op says why. */
static int call_start(rpc_client *c, rpc_op *op, call_state *s) {
  memset(&op->reply, 0, sizeof op->reply);
  op->code = PS_ERR_OK;
  op->message[0] = '\0';
  grpc_metadata_array_init(&s->initial);
  grpc_metadata_array_init(&s->trailing);
  s->details = grpc_empty_slice();
  s->call = grpc_channel_create_call(op->channel->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq,
                                     grpc_slice_from_static_string(op->method), NULL,
                                     rpc_deadline_in(op->timeout_s), NULL);
  s->request = rpc_buffer_from_parts(op->parts, op->part_count);
  if (s->call == NULL || s->request == NULL) {
    op->code = PS_ERR_INTERNAL;
    snprintf(op->message, sizeof op->message, "cannot create the call");
    return 0;
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
    snprintf(op->message, sizeof op->message, "starting the call failed (%s)",
             grpc_call_error_to_string(rc));
    return 0;
  }
  s->started = 1;
  return 1;
}

/* Waits until started batches have completed: each does, at the latest at
 * its deadline. */
static void calls_wait(rpc_client *c, int started) {
  for (int done = 0; done < started;) {
    grpc_event ev = grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_OP_COMPLETE) done++;
  }
}

/* Fills op's result from its finished call and frees the call's state. */
static void call_collect(rpc_client *c, rpc_op *op, call_state *s, int diagnose) {
  if (s->started) {
    op->code = rpc_err_from_status(s->status);
    if (op->code != PS_ERR_OK) {
      char *details = grpc_slice_to_c_string(s->details);
      snprintf(op->message, sizeof op->message, "%s", details != NULL ? details : "");
      /* HTTP/2 ENHANCE_YOUR_CALM (11): gRPC's memory quota on the server, which says only this. */
      if (op->code == PS_ERR_RESOURCE_EXHAUSTED && details != NULL &&
          strstr(details, "RST_STREAM with error code 11") != NULL) {
        snprintf(op->message, sizeof op->message,
                 "the server reset the call: it holds too much memory of requests being received "
                 "(a pserver's --max-receive-mb)");
      }
      gpr_free(details);
      if (op->code == PS_ERR_TIMEOUT && op->wait_for_ready && diagnose) {
        probe_connection(c, op->channel, op->message, sizeof op->message);
      }
      if (s->response != NULL) grpc_byte_buffer_destroy(s->response);
    } else if (s->response == NULL) {
      op->code = PS_ERR_CORRUPT_DATA;
      snprintf(op->message, sizeof op->message, "the reply carried no message");
    } else {
      ps_error rerr;
      if (rpc_reply_take(s->response, &op->reply, &rerr) != PS_ERR_OK) {
        op->code = rerr.code;
        snprintf(op->message, sizeof op->message, "%.380s", rerr.msg);
      }
    }
  }
  if (s->error_string != NULL) gpr_free((void *)s->error_string);
  grpc_slice_unref(s->details);
  grpc_metadata_array_destroy(&s->initial);
  grpc_metadata_array_destroy(&s->trailing);
  if (s->request != NULL) grpc_byte_buffer_destroy(s->request);
  if (s->call != NULL) grpc_call_unref(s->call);
}

ps_err rpc_client_call_all(rpc_client *c, rpc_op *ops, int count, ps_error *err) {
  call_state *states = calloc((size_t)count, sizeof *states);
  if (states == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory for calls");
  int started = 0;
  for (int i = 0; i < count; i++) started += call_start(c, &ops[i], &states[i]);
  calls_wait(c, started);
  int first = -1;
  for (int i = 0; i < count; i++) {
    call_collect(c, &ops[i], &states[i], 1);
    if (ops[i].code != PS_ERR_OK && first < 0) first = i;
  }
  free(states);
  if (first >= 0) {
    const rpc_op *op = &ops[first];
    return ps_error_set(err, op->code, "%s %s: %s (%s)", op->channel->target, op->method,
                        op->message, ps_err_name(op->code));
  }
  return PS_ERR_OK;
}

/* --- calls started one by one ------------------------------------------------------ */

void rpc_client_start(rpc_client *c, rpc_op *op) {
  call_state *s = calloc(1, sizeof *s);
  op->internal = NULL;
  if (s == NULL) {
    op->code = PS_ERR_NO_MEMORY;
    snprintf(op->message, sizeof op->message, "rpc: out of memory starting a call");
    return;
  }
  s->op = op;
  if (!call_start(c, op, s)) {
    call_collect(c, op, s, 0); /* frees what was made; op keeps why */
    free(s);
    return;
  }
  op->internal = s;
  c->in_flight++;
}

rpc_op *rpc_client_next(rpc_client *c, double timeout_s) {
  if (c->in_flight == 0) return NULL;
  gpr_timespec deadline = timeout_s > 0 ? rpc_deadline_in(timeout_s)
                                        : gpr_time_0(GPR_CLOCK_MONOTONIC);
  grpc_event ev = grpc_completion_queue_next(c->cq, deadline, NULL);
  if (ev.type != GRPC_OP_COMPLETE) return NULL;
  call_state *s = ev.tag;
  rpc_op *op = s->op;
  call_collect(c, op, s, 0);
  free(s);
  op->internal = NULL;
  c->in_flight--;
  return op;
}

int rpc_client_in_flight(const rpc_client *c) { return c->in_flight; }

void rpc_client_cancel(rpc_op *op) {
  call_state *s = op->internal;
  if (s == NULL) return;
  grpc_call_error rc = grpc_call_cancel(s->call, NULL);
  /* Only fails for a call not started, which an op in flight is not. */
  if (rc != GRPC_CALL_OK) LOG_WARN("cancelling a call: %s", grpc_call_error_to_string(rc));
}
