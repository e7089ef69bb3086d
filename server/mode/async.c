/* Asynchronous updates (--update async): each push is applied on arrival,
 * scaled 1/N (or whole: the job's async_whole), and answered with the
 * fresh parameters; the job's step is the pushes applied / N, so the
 * schedule advances as in sync mode, by examples applied. No state of its
 * own beyond each trainer's last step. Lock held throughout. */
#define _POSIX_C_SOURCE 200809L
#include "server/pserver_internal.h"

#include "common/clock.h"

int pserver_async_apply(pserver *ps, rpc_call *call, const rpc_message *msg,
                        const wire_blocks_msg *m) {
  trainer_state *tr = &ps->trainers[m->key.trainer_id];
  long step = (long)m->key.step;
  int n = ps->cfg.trainers;
  if (step <= tr->last_step) return 0;
  ps_error err;
  double t0 = now_s();
  /* Elastic: N pushes of the trainers there now make one sync-sized step. */
  int scale_n = ps->job.async_whole     ? 1
                : ps->job.elastic_min > 0 ? pserver_live_trainers(ps, now_s())
                                          : n;
  if (store_apply_push(ps, msg, m, scale_n, ps->updates / n, &err) != PS_ERR_OK) {
    pserver_refuse(call, "PushPull", err.code, "%s", err.msg);
    return -1;
  }
  timeline_span_arg(ps->cfg.timeline, "apply", ps->updates / n, t0, "trainer", tr - ps->trainers);
  ps->updates++;
  ps->made_steps += 1.0 / scale_n; /* elastic: Adam's steps (store_optimizer_at) */
  tr->last_step = step;
  pserver_metrics_after_step(ps->cfg.metrics, ps, (const int[]){(int)m->key.trainer_id}, 1,
                             ps->updates / n);
  if (ps->updates % n == 0) pserver_after_async_step(ps, ps->updates / n);
  return 1;
}

uint64_t pserver_async_register_step(pserver *ps, int trainer) {
  (void)trainer;
  return (uint64_t)ps->updates;
}

void pserver_async_pull_step(pserver *ps, rpc_call *call, const wire_blocks_msg *m) {
  (void)m;
  store_pull_now(ps, call);
}

/* The current parameters; with tables, the rows of the push's next keys
 * (created as a pull would when applied, read only when a resend). */
static void push(pserver *ps, rpc_call *call, const rpc_message *msg, const wire_blocks_msg *m) {
  int applied = pserver_async_apply(ps, call, msg, m);
  if (applied >= 0) store_reply_push(ps, call, applied);
}

/* Nothing waits and nothing is held: the operations async lacks are NULL. */
const pserver_mode_ops pserver_mode_async = {
    .register_step = pserver_async_register_step,
    .push = push,
    .pull_step = pserver_async_pull_step,
};
