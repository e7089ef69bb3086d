/* PULL_PREFETCH: the next batch's keys sent to the pservers with a disk
 * tier while this trainer computes, without waiting for their answers. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/client/ps_client.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"

/* Pserver p's tier figures from its answer to a prefetch. */
static ps_err take_tier_stats(ps_client *c, int p, const rpc_message *msg, ps_error *err) {
  Pstrain__ParamsReply *reply =
      (Pstrain__ParamsReply *)wire_unpack(&pstrain__params_reply__descriptor, msg, err);
  if (reply == NULL) {
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "prefetching: pserver %d at %s answered: %s", p,
                        c->targets.items[p], why);
  }
  if (reply->tier != NULL) {
    const Pstrain__TierStats *s = reply->tier;
    c->tier_stats[p] = (ps_tier_stats){s->lookups, s->hits, s->ahead, s->rows_memory,
                                       s->disk_bytes_read, s->disk_bytes_written};
  }
  protobuf_c_message_free_unpacked(&reply->base, NULL);
  return PS_ERR_OK;
}

/* Whether pserver p gets this step's prefetch: while its tier has written
 * nothing to disk every row is in memory and a prefetch is a call for
 * nothing (a fifth of the speed of 2 small pservers on 2 cores), so it is
 * asked only every PREFETCH_PROBE_STEPS steps whether rows went out yet. */
#define PREFETCH_PROBE_STEPS 32
static int prefetch_to(const ps_client *c, int p, long step) {
  return c->pserver_tier[p] &&
         (c->tier_stats[p].disk_bytes_written > 0 || step % PREFETCH_PROBE_STEPS == 0);
}

ps_err ps_client_prefetch_collect(ps_client *c, ps_error *err) {
  ps_err rc = PS_ERR_OK;
  while (c->prefetch_in_flight > 0) {
    /* Every op has its deadline: this wait ends by then. */
    rpc_op *op = rpc_client_next(c->prefetch_rpc, c->rpc_timeout + 60);
    if (op == NULL) break; /* not reached: the deadlines end them */
    c->prefetch_in_flight--;
    int p = c->prefetch_target[op - c->prefetch_ops];
    if (rc == PS_ERR_OK && op->code != PS_ERR_OK) {
      rc = ps_error_set(err, op->code, "prefetching step %ld's rows: pserver %d at %s: %s",
                        c->prefetch_step, p, c->targets.items[p], op->message);
    } else if (op->code == PS_ERR_OK) {
      ps_error e;
      if (take_tier_stats(c, p, &op->reply.message, &e) != PS_ERR_OK && rc == PS_ERR_OK) {
        *err = e;
        rc = e.code;
      }
    }
    if (op->code == PS_ERR_OK) rpc_reply_free(&op->reply);
  }
  return rc;
}

void ps_client_prefetch_abort(ps_client *c) {
  for (int k = 0; k < c->prefetch_started; k++) rpc_client_cancel(&c->prefetch_ops[k]);
  ps_error ignored;
  (void)ps_client_prefetch_collect(c, &ignored);
}

ps_err ps_client_prefetch(ps_client *c, long step, ps_error *err) {
  if (c->tier_pservers == 0 || c->sparse == NULL) return PS_ERR_OK;
  /* The last step's answers (long in by now): their writers are reused. */
  ps_error collect_err;
  ps_err collected = ps_client_prefetch_collect(c, &collect_err);
  ps_err rc = PS_ERR_OK;
  double start = now_s();
  wire_key key = {(uint32_t)c->trainer_id, c->incarnation, (uint64_t)step};
  int k = 0;
  for (int p = 0; p < c->job.pservers; p++) {
    if (!prefetch_to(c, p, step)) continue;
    wire_writer *w = &c->prefetch_writers[p];
    if (wire_writer_begin(w, 0, err) != PS_ERR_OK) return err->code;
    wire_writer_push_header(w, &key, c->hash);
    /* Copied (no lease): the keys' array changes before the answer is collected. */
    if (c->sparse->append(c->sparse->ctx, p, w, NULL, err) != PS_ERR_OK) return err->code;
    wire_writer_pull_kind(w, PSTRAIN__PULL_KIND__PULL_PREFETCH);
    if (wire_writer_check(w, err) != PS_ERR_OK) return err->code;
    c->prefetch_ops[k] = (rpc_op){.channel = c->channels[p], .method = WIRE_METHOD_PULL,
                                  .parts = w->parts, .part_count = w->part_count,
                                  .timeout_s = c->rpc_timeout};
    c->prefetch_target[k++] = p;
  }
  c->prefetch_step = step;
  c->prefetch_started = 0;
  for (int i = 0; i < k; i++) {
    rpc_op *op = &c->prefetch_ops[i];
    rpc_client_start(c->prefetch_rpc, op);
    if (op->internal == NULL) { /* not started: op->code says why */
      int p = c->prefetch_target[i];
      rc = ps_error_set(err, op->code, "prefetching step %ld's rows: pserver %d at %s: %s", step,
                        p, c->targets.items[p], op->message);
      break;
    }
    c->prefetch_started++;
    c->prefetch_in_flight++;
  }
  c->comm_seconds += now_s() - start;
  if (rc == PS_ERR_OK && collected != PS_ERR_OK) {
    *err = collect_err;
    rc = collected;
  }
  return rc;
}
