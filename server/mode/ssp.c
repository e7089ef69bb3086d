/* Bounded staleness (--update ssp): pushes are applied on arrival as in
 * async; the reply to trainer i's push of step t (its fresh parameters) is
 * held until every active trainer has pushed step t - S. A trainer is let
 * go into step t + 1 only while the slowest has pushed t - S, so no trainer
 * ever computes more than S steps ahead of the slowest; S = 0 is sync's
 * barrier. Lock held throughout. */
#define _POSIX_C_SOURCE 200809L
#include "server/pserver_internal.h"

#include <limits.h>
#include <stdio.h>

#include "common/clock.h"
#include "common/log.h"

/* The last step trainer tr pushed; one that has not pushed here yet stands
 * just before the step the job started at on this pserver (0, or a
 * resumed checkpoint's). */
static long position(const pserver *ps, const trainer_state *tr) {
  return tr->last_step >= 0 ? tr->last_step : ps->ssp_base - 1;
}

/* The position of the slowest active trainer (LONG_MAX: none is active).
 * Done and dropped trainers hold no one back. */
static long slowest(const pserver *ps) {
  long lo = LONG_MAX;
  for (int i = 0; i < ps->cfg.trainers; i++) {
    const trainer_state *tr = &ps->trainers[i];
    if (!tr->done && !tr->lost && position(ps, tr) < lo) lo = position(ps, tr);
  }
  return lo;
}

uint64_t pserver_ssp_register_step(pserver *ps) {
  int n = ps->cfg.trainers, fresh = 1;
  for (int i = 0; i < n; i++) fresh &= ps->trainers[i].last_step < 0;
  if (fresh) ps->ssp_base = ps->updates / n;
  long lo = LONG_MAX;
  for (int i = 0; i < n; i++) {
    const trainer_state *tr = &ps->trainers[i];
    if (!tr->lost && position(ps, tr) < lo) lo = position(ps, tr);
  }
  if (lo == LONG_MAX) return (uint64_t)ps->updates;
  return (uint64_t)(lo + 1) * (uint64_t)n;
}

/* Whether a trainer that pushed `step` may go on, given the slowest. */
static int may_go(const pserver *ps, long step, long low) {
  return low == LONG_MAX || step - ps->job.staleness <= low;
}

/* Records the lead a trainer is let go with: its step less the slowest's. */
static void note_lead(pserver *ps, long step, long low) {
  long lead = low == LONG_MAX || step < low ? 0 : step - low;
  if (lead > ps->ssp_max_lead) ps->ssp_max_lead = lead;
}

/* CTR jobs: the held push's next keys wait in the trainer's sparse `next`
 * rows, and come back into the request's for the reply (the request then
 * being handled has been answered: its buffers are free). */
static void swap_keys(pserver *ps, int id) {
  store_rows *sp = ps->store.rows;
  for (int t = 0; t < CTR_TABLES_MAX; t++) {
    sparse_rows keep = sp->trainers[id].next[t];
    sp->trainers[id].next[t] = sp->req[SPARSE_FIELD_KEYS][t];
    sp->req[SPARSE_FIELD_KEYS][t] = keep;
  }
}

static void hold(pserver *ps, int id, rpc_call *call) {
  trainer_state *tr = &ps->trainers[id];
  tr->held = call;
  tr->held_since = now_s();
  ps->ssp_held++;
  if (ps->store.rows != NULL) {
    tr->held_keys = ps->store.rows->req_present[SPARSE_FIELD_KEYS];
    swap_keys(ps, id);
  }
}

static void release(pserver *ps, int id, long low) {
  trainer_state *tr = &ps->trainers[id];
  rpc_call *call = tr->held;
  double held = now_s() - tr->held_since;
  tr->held = NULL;
  ps->ssp_held_s += held;
  note_lead(ps, tr->last_step, low);
  pserver_metrics_ssp(ps->cfg.metrics, held, ps->ssp_max_lead);
  if (ps->store.rows != NULL) {
    swap_keys(ps, id);
    ps->store.rows->req_present[SPARSE_FIELD_KEYS] = tr->held_keys;
  }
  pserver_reply_async(ps, call, 1);
  if (ps->store.rows != NULL) {
    for (int t = 0; t < CTR_TABLES_MAX; t++) ps->store.rows->req[SPARSE_FIELD_KEYS][t].n = 0;
    ps->store.rows->req_present[SPARSE_FIELD_KEYS] = 0;
  }
}

void pserver_ssp_release(pserver *ps) {
  if (!ps->configured || ps->job.update != UPDATE_SSP) return;
  long low = slowest(ps);
  for (int i = 0; i < ps->cfg.trainers; i++) {
    trainer_state *tr = &ps->trainers[i];
    if (tr->held != NULL && may_go(ps, tr->last_step, low)) release(ps, i, low);
  }
}

void pserver_push_ssp(pserver *ps, rpc_call *call, const rpc_message *msg,
                      const wire_blocks_msg *m) {
  uint32_t id = m->key.trainer_id;
  trainer_state *tr = &ps->trainers[id];
  long step = (long)m->key.step;
  if (tr->lost) {
    pserver_refuse(call, "PushPull", PS_ERR_FAILED_PRECONDITION,
                   "trainer %u was dropped for holding the others back (--on-trainer-loss "
                   "continue)", id);
    return;
  }
  if (tr->held != NULL) {
    if (step == tr->last_step) {
      /* A resend while held: the data is the same; keep the newer call
       * (a CTR push's next keys are already kept). */
      rpc_call_reply(tr->held, PS_ERR_ABORTED, "superseded by a resend of the same push", NULL, 0);
      tr->held = call;
      return;
    }
    pserver_refuse(call, "PushPull", PS_ERR_FAILED_PRECONDITION,
                   "trainer %u pushed step %ld while its push of step %ld waits for the "
                   "slowest trainer", id, step, tr->last_step);
    return;
  }
  int applied = pserver_apply_async(ps, call, msg, m);
  if (applied < 0) return;
  if (!applied) {
    pserver_reply_async(ps, call, 0); /* a resend of a step already let go */
    return;
  }
  ps->ssp_pushes++;
  long low = slowest(ps);
  if (may_go(ps, step, low)) {
    note_lead(ps, step, low);
    pserver_metrics_ssp(ps->cfg.metrics, 0.0, ps->ssp_max_lead);
    pserver_reply_async(ps, call, 1);
  } else {
    hold(ps, (int)id, call);
  }
  pserver_ssp_release(ps); /* this push may be the one others waited for */
}

void pserver_ssp_drop(pserver *ps, int trainer, ps_err code, const char *why) {
  for (int i = 0; i < ps->cfg.trainers; i++) {
    trainer_state *tr = &ps->trainers[i];
    if ((trainer >= 0 && i != trainer) || tr->held == NULL) continue;
    rpc_call_reply(tr->held, code, why, NULL, 0);
    tr->held = NULL;
  }
}

void pserver_ssp_poll(pserver *ps, double now) {
  /* The push held longest, and whether it waited past --step-timeout. */
  int oldest = -1;
  for (int i = 0; i < ps->cfg.trainers; i++) {
    const trainer_state *tr = &ps->trainers[i];
    if (tr->held != NULL && (oldest < 0 || tr->held_since < ps->trainers[oldest].held_since)) {
      oldest = i;
    }
  }
  if (oldest < 0 || now - ps->trainers[oldest].held_since <= ps->cfg.step_timeout) return;
  long need = ps->trainers[oldest].last_step - ps->job.staleness;
  char missing[256] = "";
  size_t used = 0;
  for (int i = 0; i < ps->cfg.trainers; i++) {
    trainer_state *tr = &ps->trainers[i];
    if (tr->done || tr->lost || tr->last_step >= need) continue;
    if (used < sizeof missing) {
      used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d (at step %ld)",
                               used > 0 ? ", " : "", i, tr->last_step);
    }
    if (ps->cfg.continue_on_trainer_loss) {
      tr->lost = 1;
      ps->active--;
      LOG_WARN("trainer %d has not pushed step %ld for %.0f s (--step-timeout): continuing "
               "with %d trainer(s) (--on-trainer-loss continue)", i, need,
               ps->cfg.step_timeout, ps->active);
    }
  }
  if (ps->cfg.continue_on_trainer_loss) {
    pserver_ssp_release(ps);
    return;
  }
  snprintf(ps->failure, sizeof ps->failure,
           "trainer %d's push of step %ld waited %.0f s (--step-timeout, --staleness %d) for "
           "trainer(s) %s", oldest, ps->trainers[oldest].last_step, ps->cfg.step_timeout,
           ps->job.staleness, missing);
  ps->status = PSERVER_FAILED;
}

void pserver_ssp_log(const pserver *ps, const char *when) {
  if (ps->job.update != UPDATE_SSP) return;
  LOG_INFO("%s: ssp: max lead %ld step(s) (--staleness %d); %ld of %ld pushes held, %.1f ms "
           "held on average", when, ps->ssp_max_lead, ps->job.staleness, ps->ssp_held,
           ps->ssp_pushes, ps->ssp_held > 0 ? ps->ssp_held_s / (double)ps->ssp_held * 1e3 : 0.0);
}
