/* GEO-SGD (--update geo): trainers step their own optimizer and every K
 * steps push the change of their parameters since their last exchange
 * (PushRequest.deltas; with tables: the rows touched since then). The pserver
 * adds change / N on arrival, with no optimizer of its own, and answers
 * with the fresh values, which become the trainer's next base. The job's
 * step is the trainers' steps merged so far / N, as async counts pushes.
 * Lock held throughout. */
#define _POSIX_C_SOURCE 200809L
#include "server/pserver_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/log.h"

/* Since the job started here: pushes merged, rows in them, and the step
 * trainers started at (0, or a checkpoint's). */
typedef struct geo_state {
  long pushes;
  uint64_t rows;
  long base;
} geo_state;

static geo_state *state_of(const pserver *ps) { return ps->mode_state; }

/* What a registration's reply says the step is (merged trainer steps, as
 * async counts): N times the trainer's last exchange when it pushed here
 * before (called before its state is reset), else times the job's step
 * before any trainer pushed here. */
static uint64_t register_step(pserver *ps, int trainer) {
  /* A trainer that pushed here before goes on from its last exchange; one
   * that has not from where the job stood before any trainer pushed here
   * (0, or a checkpoint's step), not from what the others did since. */
  int n = ps->cfg.trainers, fresh = 1;
  for (int i = 0; i < n; i++) fresh &= ps->trainers[i].last_step < 0;
  if (fresh) state_of(ps)->base = ps->updates / n;
  long last = ps->trainers[trainer].last_step;
  return (uint64_t)(last >= 0 ? last : state_of(ps)->base) * (uint64_t)n;
}

/* A checked push: changes / N added to the weights (and rows), the fresh
 * values answered; a resend (step applied before) only answered. */
static void push(pserver *ps, rpc_call *call, const rpc_message *msg, const wire_blocks_msg *m) {
  uint32_t id = m->key.trainer_id;
  trainer_state *tr = &ps->trainers[id];
  long step = (long)m->key.step, n = ps->cfg.trainers;
  if (store_push_has_keys(ps)) {
    pserver_refuse(call, "PushPull", PS_ERR_INVALID_ARGUMENT,
                   "a geo push carries no sparse_keys: the fresh rows of its sparse_grads' keys "
                   "come back");
    return;
  }
  if (step > tr->last_step) {
    /* The steps this push covers: since its last exchange, at most K. */
    long covered = step - (tr->last_step > 0 ? tr->last_step : 0);
    if (covered > ps->job.geo_steps) covered = ps->job.geo_steps;
    /* Elastic: the change counts as one of the trainers there now. */
    float scale = 1.0f / (float)(ps->job.elastic_min > 0 ? pserver_live_trainers(ps, now_s()) : n);
    double t0 = now_s();
    ps_error err;
    if (store_add_changes(ps, msg, m, scale, ps->updates / n, &state_of(ps)->rows, &err) !=
        PS_ERR_OK) {
      pserver_refuse(call, "PushPull", err.code, "%s", err.msg);
      return;
    }
    timeline_span_arg(ps->cfg.timeline, "apply", ps->updates / n, t0, "trainer", id);
    long from = ps->updates / n;
    ps->updates += covered;
    tr->last_step = step;
    state_of(ps)->pushes++;
    pserver_metrics_after_step(ps->cfg.metrics, ps, (const int[]){(int)id}, 1, ps->updates / n);
    pserver_after_steps(ps, from, ps->updates / n);
  }
  /* A resend of a push applied before is only answered. */
  store_reply_fresh(ps, call);
}

/* The pushes and rows merged after `when`. */
static void log_merged(const pserver *ps, const char *when) {
  LOG_INFO("%s: geo: %ld pushes merged (--geo-steps %d), %llu rows", when, state_of(ps)->pushes,
           ps->job.geo_steps, (unsigned long long)state_of(ps)->rows);
}

static ps_err configure(pserver *ps, ps_error *err) {
  if ((ps->mode_state = calloc(1, sizeof(geo_state))) == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory for the geo state");
  }
  return PS_ERR_OK;
}

static void deconfigure(pserver *ps) {
  free(ps->mode_state);
  ps->mode_state = NULL;
}

/* Pushes carry changes, applied on arrival: nothing waits. */
const pserver_mode_ops pserver_mode_geo = {
    .deltas = 1,
    .configure = configure,
    .deconfigure = deconfigure,
    .register_step = register_step,
    .push = push,
    .pull_step = pserver_async_pull_step,
    .log = log_merged,
};
