/* The overlapped sync step's calls: parts pushed as backward produces them,
 * replies awaited and copied at the end of the step. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/client/ps_client_parts.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

enum { PART_RUNNING, PART_COLLECTED, PART_DONE };

struct ps_client_parts {
  long step;
  int open;
  size_t cap;           /* calls a step may make: one per block at most */
  rpc_op *ops;          /* (cap) */
  wire_writer *writers; /* (cap) */
  int *pserver, *state; /* (cap) */
  size_t *first, *count; /* (cap) call k's ids: ids[first[k], first[k] + count[k]) */
  uint32_t *ids;        /* (blocks) */
  unsigned char *sent;  /* (blocks) pushed this step */
  size_t calls, ids_used;
  int failed;           /* a call failed: err holds the first */
  ps_error err;
};

void ps_client_parts_abort(ps_client *c) {
  struct ps_client_parts *pp = c->parts;
  if (pp == NULL || !pp->open) return;
  for (size_t k = 0; k < pp->calls; k++) rpc_client_cancel(&pp->ops[k]);
  /* Cancelled calls finish at once; the bound is for a gRPC that does not. */
  double give_up = now_s() + 10;
  while (rpc_client_in_flight(c->rpc) > 0 && now_s() < give_up) {
    rpc_op *op = rpc_client_next(c->rpc, 1.0);
    if (op != NULL && op->code == PS_ERR_OK) rpc_reply_free(&op->reply);
  }
  pp->open = 0;
}

void ps_client_parts_free(ps_client *c) {
  struct ps_client_parts *pp = c->parts;
  if (pp == NULL) return;
  if (pp->writers != NULL) {
    for (size_t k = 0; k < pp->cap; k++) wire_writer_free(&pp->writers[k]);
  }
  free(pp->ops);
  free(pp->writers);
  free(pp->pserver);
  free(pp->state);
  free(pp->first);
  free(pp->count);
  free(pp->ids);
  free(pp->sent);
  free(pp);
  c->parts = NULL;
}

static ps_err parts_alloc(ps_client *c, ps_error *err) {
  size_t blocks = c->map.block_count > 0 ? c->map.block_count : 1;
  struct ps_client_parts *pp = calloc(1, sizeof *pp);
  if (pp == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "ps client: out of memory for parts");
  c->parts = pp;
  pp->cap = blocks;
  pp->ops = calloc(blocks, sizeof *pp->ops);
  pp->writers = calloc(blocks, sizeof *pp->writers);
  pp->pserver = calloc(blocks, sizeof *pp->pserver);
  pp->state = calloc(blocks, sizeof *pp->state);
  pp->first = calloc(blocks, sizeof *pp->first);
  pp->count = calloc(blocks, sizeof *pp->count);
  pp->ids = calloc(blocks, sizeof *pp->ids);
  pp->sent = calloc(blocks, 1);
  if (pp->ops == NULL || pp->writers == NULL || pp->pserver == NULL || pp->state == NULL ||
      pp->first == NULL || pp->count == NULL || pp->ids == NULL || pp->sent == NULL) {
    ps_client_parts_free(c);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "ps client: out of memory for parts");
  }
  return PS_ERR_OK;
}

ps_err ps_client_parts_begin(ps_client *c, long step, ps_error *err) {
  if (c->parts == NULL && parts_alloc(c, err) != PS_ERR_OK) return err->code;
  struct ps_client_parts *pp = c->parts;
  if (pp->open) {
    return ps_error_set(err, PS_ERR_INTERNAL, "step %ld: the parts of step %ld are not finished",
                        step, pp->step);
  }
  pp->step = step;
  pp->open = 1;
  pp->calls = pp->ids_used = 0;
  pp->failed = 0;
  memset(pp->sent, 0, c->map.block_count);
  return PS_ERR_OK;
}

int ps_client_parts_open(const ps_client *c) { return c->parts != NULL && c->parts->open; }

/* Keeps the first failure of the step. */
static void fail(struct ps_client_parts *pp, ps_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(struct ps_client_parts *pp, ps_err code, const char *fmt, ...) {
  if (pp->failed) return;
  pp->failed = 1;
  pp->err.code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pp->err.msg, sizeof pp->err.msg, fmt, ap);
  va_end(ap);
}

/* Takes what finished without waiting (this also moves gRPC's work on). */
static void poll_finished(ps_client *c) {
  rpc_op *op;
  while ((op = rpc_client_next(c->rpc, 0)) != NULL) c->parts->state[op - c->parts->ops] = PART_COLLECTED;
}

ps_err ps_client_parts_push(ps_client *c, const float *grads, size_t lo, size_t hi,
                            ps_error *err) {
  struct ps_client_parts *pp = c->parts;
  if (pp == NULL || !pp->open) {
    return ps_error_set(err, PS_ERR_INTERNAL, "ps client: a part pushed outside a step");
  }
  wire_key key = {(uint32_t)c->trainer_id, c->incarnation, (uint64_t)pp->step};
  /* Sent from grads as they lie, or each block from its conversion. */
  wire_dtype dtype = c->job.wire_dtype;
  size_t size = wire_dtype_size(dtype);
  for (int p = 0; p < c->job.pservers; p++) {
    size_t first = pp->ids_used, floats = 0;
    for (size_t i = 0; i < c->map.block_count; i++) {
      const shard_block *b = &c->map.blocks[i];
      if (b->pserver != p || b->offset < lo || b->offset >= hi || pp->sent[i]) continue;
      pp->sent[i] = 1;
      pp->ids[pp->ids_used++] = b->id;
      floats += b->count;
    }
    size_t count = pp->ids_used - first;
    if (count == 0) continue;
    size_t k = pp->calls; /* at most one call per block: within cap */
    wire_writer *w = &pp->writers[k];
    if (wire_writer_begin(w, count, err) != PS_ERR_OK) return err->code;
    wire_writer_push_header(w, &key, c->hash);
    wire_writer_dtype(w, dtype);
    for (size_t j = first; j < pp->ids_used; j++) {
      const shard_block *b = &c->map.blocks[pp->ids[j]];
      const uint8_t *source = (const uint8_t *)(grads + b->offset);
      if (dtype != WIRE_DTYPE_F32) {
        source = c->wire_grads + b->offset * size;
        wire_dtype_encode(dtype, grads + b->offset, c->wire_grads + b->offset * size, b->count);
      }
      wire_writer_block_bytes(w, b->id, source, b->count * size, &c->lease);
    }
    if (wire_writer_check(w, err) != PS_ERR_OK) return err->code;
    pp->calls++;
    pp->pserver[k] = p;
    pp->first[k] = first;
    pp->count[k] = count;
    pp->ops[k] = (rpc_op){.channel = c->channels[p], .method = WIRE_METHOD_PUSH_PULL,
                          .parts = w->parts, .part_count = w->part_count,
                          .timeout_s = c->rpc_timeout};
    pp->state[k] = PART_RUNNING;
    rpc_client_start(c->rpc, &pp->ops[k]);
    if (pp->ops[k].internal == NULL) pp->state[k] = PART_COLLECTED; /* failed to start */
    c->bytes_sent += floats * size;
  }
  poll_finished(c);
  return PS_ERR_OK;
}

/* Checks call k's reply (its blocks exactly, version step + 1) and copies
 * its blocks into params; a bad reply changes nothing. */
static void take_reply(ps_client *c, size_t k, float *params) {
  struct ps_client_parts *pp = c->parts;
  rpc_op *op = &pp->ops[k];
  int p = pp->pserver[k];
  const char *target = c->targets.items[p];
  long step = pp->step;
  pp->state[k] = PART_DONE;
  if (op->code == PS_ERR_TIMEOUT) {
    fail(pp, PS_ERR_TIMEOUT, "step %ld: pserver %d at %s did not answer within %.0f s "
         "(--rpc-timeout)", step, p, target, op->timeout_s);
    return;
  }
  if (op->code != PS_ERR_OK) {
    fail(pp, op->code, "step %ld: pserver %d at %s: %s (%s)", step, p, target, op->message,
         ps_err_name(op->code));
    return;
  }
  const rpc_message *msg = &op->reply.message;
  wire_blocks_msg m = {.blocks = c->refs, .block_cap = c->refs_cap};
  ps_error perr;
  if (wire_parse_blocks(msg, &m, &perr) != PS_ERR_OK) {
    fail(pp, perr.code, "step %ld: pserver %d at %s sent a bad reply: %s", step, p, target,
         perr.msg);
  } else if (m.pserver_incarnation != c->pserver_incarnation[p]) {
    fail(pp, PS_ERR_FAILED_PRECONDITION, "step %ld: pserver %d at %s restarted (new "
         "incarnation); its state is not the job's any more", step, p, target);
  } else if (m.step != (uint64_t)step + 1) {
    fail(pp, PS_ERR_FAILED_PRECONDITION, "step %ld: pserver %d at %s answered with step %llu, "
         "expected %ld", step, p, target, (unsigned long long)m.step, step + 1);
  } else if (m.dtype != (uint32_t)c->job.wire_dtype) {
    fail(pp, PS_ERR_CORRUPT_DATA, "step %ld: pserver %d at %s sent %s blocks, the job's "
         "--wire-dtype is %s", step, p, target, wire_dtype_name((wire_dtype)m.dtype),
         wire_dtype_name(c->job.wire_dtype));
  } else if (m.block_count != pp->count[k]) {
    fail(pp, PS_ERR_CORRUPT_DATA, "step %ld: pserver %d sent %zu blocks for a part of %zu",
         step, p, m.block_count, pp->count[k]);
  } else {
    memset(c->seen, 0, c->map.block_count);
    for (size_t j = 0; j < pp->count[k]; j++) c->seen[pp->ids[pp->first[k] + j]] = 1;
    for (size_t i = 0; i < m.block_count; i++) {
      const wire_block_ref *r = &m.blocks[i];
      if (r->id >= c->map.block_count || c->seen[r->id] != 1) {
        fail(pp, PS_ERR_CORRUPT_DATA, "step %ld: pserver %d sent block %u, which the part did "
             "not push (or twice)", step, p, r->id);
        break;
      }
      c->seen[r->id] = 2;
      size_t want = c->map.blocks[r->id].count * wire_dtype_size(c->job.wire_dtype);
      if (r->len != want) {
        fail(pp, PS_ERR_CORRUPT_DATA, "step %ld: pserver %d sent block %u with %zu bytes, "
             "expected %zu", step, p, r->id, r->len, want);
        break;
      }
    }
    if (!pp->failed) {
      for (size_t i = 0; i < m.block_count; i++) {
        wire_decode_block(msg, &m.blocks[i], c->job.wire_dtype,
                          params + c->map.blocks[m.blocks[i].id].offset);
      }
    }
  }
  c->bytes_received += msg->total;
  rpc_reply_free(&op->reply);
}

ps_err ps_client_parts_finish(ps_client *c, const float *grads, float *params, ps_error *err) {
  struct ps_client_parts *pp = c->parts;
  if (pp == NULL || !pp->open) {
    return ps_error_set(err, PS_ERR_INTERNAL, "ps client: no parts to finish");
  }
  double start = now_s();
  /* Blocks no part carried (none when backward reported every layer). */
  ps_err rc = ps_client_parts_push(c, grads, 0, c->map.total, err);
  if (rc != PS_ERR_OK) fail(pp, rc, "%s", err->msg);
  /* Every started call ends by its deadline: wait for all, even after a failure. */
  for (size_t k = 0; k < pp->calls; k++) {
    if (pp->state[k] == PART_COLLECTED) take_reply(c, k, params);
  }
  /* Each call ends by its deadline; past it and a margin, cancel the rest. */
  double give_up = start + c->rpc_timeout + 10;
  while (rpc_client_in_flight(c->rpc) > 0) {
    rpc_op *op = rpc_client_next(c->rpc, 1.0);
    if (op != NULL) take_reply(c, (size_t)(op - pp->ops), params);
    if (op == NULL && now_s() > give_up) {
      fail(pp, PS_ERR_TIMEOUT, "step %ld: a part's call outlived its deadline; cancelled",
           pp->step);
      for (size_t k = 0; k < pp->calls; k++) rpc_client_cancel(&pp->ops[k]);
    }
  }
  pp->open = 0;
  /* The gradients are overwritten next step: gRPC must be done with them. */
  if (rpc_lease_wait(&c->lease) != PS_ERR_OK) {
    fail(pp, PS_ERR_INTERNAL, "step %ld: gRPC kept the gradient buffer for 30 s", pp->step);
  }
  c->comm_seconds += now_s() - start;
  if (pp->failed) return ps_error_set(err, pp->err.code, "%s", pp->err.msg);
  return PS_ERR_OK;
}
