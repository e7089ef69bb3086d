/* In-memory calls: a call no network carries, so tests and fuzz targets can
 * drive a handler directly; its reply is recorded instead of sent. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc_internal.h"

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
void rpc_local_reply(rpc_call *c, ps_err code, const char *message, const rpc_part *parts,
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
