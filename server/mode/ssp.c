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
#include <stdlib.h>

#include "common/clock.h"
#include "common/log.h"
#include "server/shard_queue.h"

/* A trainer's push held until the slowest is near. */
typedef struct ssp_trainer {
  rpc_call *held;    /* its push of last_step (NULL: none held) */
  double held_since; /* when that push arrived */
  int held_keys;     /* tables: the held push brought next keys (parked in the store) */
  long shift;        /* handed-out data: steps added to its own when it came back from
                      * having no data, so it stands level with the slowest */
} ssp_trainer;

/* What the bound saw since the job started here: the largest lead a
 * trainer was let go with, pushes applied, how many were held and for how
 * long. */
typedef struct ssp_state {
  ssp_trainer *trainers; /* (trainers) */
  long max_lead;
  long base; /* the step trainers started at here (0, or a checkpoint's) */
  long pushes, held;
  double held_s;
} ssp_state;

static ssp_state *state_of(const pserver *ps) { return ps->mode_state; }

/* The last step trainer i pushed (shifted, see ssp_trainer); one that has
 * not pushed here yet stands just before the step the job started at on
 * this pserver (0, or a resumed checkpoint's). */
static long position(const pserver *ps, int i) {
  const trainer_state *tr = &ps->trainers[i];
  return tr->last_step >= 0 ? tr->last_step + state_of(ps)->trainers[i].shift
                            : state_of(ps)->base - 1;
}

/* Whether trainer i holds the others back: not done, dropped or without
 * data for now (handed-out data); in elastic jobs also a member by its
 * lease that has pushed (a joiner starts level with the slowest). */
static int holds_back(const pserver *ps, int i, double now) {
  const trainer_state *tr = &ps->trainers[i];
  if (tr->done || tr->lost || tr->away) return 0;
  if (ps->job.elastic_min == 0) return 1;
  return tr->last_step >= 0 && pserver_is_member(ps, i, now);
}

/* The position of the slowest trainer holding others back (LONG_MAX: none). */
static long slowest(const pserver *ps) {
  long lo = LONG_MAX;
  double now = now_s();
  for (int i = 0; i < ps->cfg.trainers; i++) {
    if (holds_back(ps, i, now) && position(ps, i) < lo) lo = position(ps, i);
  }
  return lo;
}

/* What a registration's reply says the pserver's step is (in pushes, as
 * async counts): the slowest trainer's next step, the registering one's
 * last push included (called before it is reset), so a trainer joining
 * late starts at step 0, rather than at the average async would give. A
 * restarted trainer that was the slowest goes on where it was; one that led
 * goes back to the slowest's step and takes up to S steps again, whose
 * earlier pushes stay applied (as a restarted async trainer's do). */
static uint64_t register_step(pserver *ps, int trainer) {
  (void)trainer;
  int n = ps->cfg.trainers, fresh = 1;
  for (int i = 0; i < n; i++) fresh &= ps->trainers[i].last_step < 0;
  if (fresh) state_of(ps)->base = ps->updates / n;
  long lo = LONG_MAX;
  for (int i = 0; i < n; i++) {
    if (ps->job.elastic_min > 0 ? !holds_back(ps, i, now_s()) : ps->trainers[i].lost) continue;
    if (position(ps, i) < lo) lo = position(ps, i);
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
  if (lead > state_of(ps)->max_lead) state_of(ps)->max_lead = lead;
}

/* The push's next keys wait in the store while its reply is held. */
static void hold(pserver *ps, int id, rpc_call *call) {
  ssp_trainer *h = &state_of(ps)->trainers[id];
  h->held = call;
  h->held_since = now_s();
  state_of(ps)->held++;
  h->held_keys = store_park_keys(ps, id);
}

static void release(pserver *ps, int id, long low) {
  ssp_state *st = state_of(ps);
  ssp_trainer *h = &st->trainers[id];
  rpc_call *call = h->held;
  double held = now_s() - h->held_since;
  h->held = NULL;
  st->held_s += held;
  note_lead(ps, position(ps, id), low);
  pserver_metrics_ssp(ps->cfg.metrics, held, st->max_lead);
  store_unpark_keys(ps, id, h->held_keys);
  store_reply_push(ps, call, 1);
  store_forget_keys(ps);
}

/* Answers the held pushes the slowest trainer now allows (after a push,
 * a Done, a trainer dropped). */
static void release_allowed(pserver *ps) {
  long low = slowest(ps);
  for (int i = 0; i < ps->cfg.trainers; i++) {
    ssp_trainer *h = &state_of(ps)->trainers[i];
    if (h->held != NULL && may_go(ps, position(ps, i), low)) release(ps, i, low);
  }
}

static void done(pserver *ps, int trainer) {
  (void)trainer;
  release_allowed(ps);
}

/* Handed-out data: no data for now; back level with the slowest when it pushes again. */
static void leave(pserver *ps, int trainer, uint64_t number) {
  (void)number;
  ps->trainers[trainer].away = 1;
  release_allowed(ps);
}

/* A checked push: applied as async; its reply waits while the trainer is
 * more than job.staleness steps ahead of the slowest. */
static void push(pserver *ps, rpc_call *call, const rpc_message *msg, const wire_blocks_msg *m) {
  uint32_t id = m->key.trainer_id;
  trainer_state *tr = &ps->trainers[id];
  ssp_trainer *h = &state_of(ps)->trainers[id];
  long step = (long)m->key.step;
  if (tr->lost) {
    pserver_refuse(call, "PushPull", PS_ERR_FAILED_PRECONDITION,
                   "trainer %u was dropped for holding the others back (--on-trainer-loss "
                   "continue)", id);
    return;
  }
  if (h->held != NULL) {
    if (step == tr->last_step) {
      /* A resend while held: the data is the same; keep the newer call
       * (a push's next keys are already kept). */
      rpc_call_reply(h->held, PS_ERR_ABORTED, "superseded by a resend of the same push", NULL, 0);
      h->held = call;
      return;
    }
    pserver_refuse(call, "PushPull", PS_ERR_FAILED_PRECONDITION,
                   "trainer %u pushed step %ld while its push of step %ld waits for the "
                   "slowest trainer", id, step, tr->last_step);
    return;
  }
  if (tr->away && step > tr->last_step) {
    /* Back with data: it stands level with the slowest of those training. */
    long low = slowest(ps), was = tr->last_step >= 0 ? tr->last_step : step - 1;
    if (low != LONG_MAX && low - was > h->shift) h->shift = low - was;
    if (tr->last_step < 0) tr->last_step = was;
    tr->away = 0;
  }
  int applied = pserver_async_apply(ps, call, msg, m);
  if (applied < 0) return;
  if (!applied) {
    store_reply_push(ps, call, 0); /* a resend of a step already let go */
    return;
  }
  state_of(ps)->pushes++;
  long low = slowest(ps);
  if (may_go(ps, position(ps, (int)id), low)) {
    note_lead(ps, position(ps, (int)id), low);
    pserver_metrics_ssp(ps->cfg.metrics, 0.0, state_of(ps)->max_lead);
    store_reply_push(ps, call, 1);
  } else {
    hold(ps, (int)id, call);
  }
  release_allowed(ps); /* this push may be the one others waited for */
}

/* Answers trainer's held push (every one: trainer -1) with code; not released. */
static void drop(pserver *ps, int trainer, ps_err code, const char *why) {
  for (int i = 0; i < ps->cfg.trainers; i++) {
    ssp_trainer *h = &state_of(ps)->trainers[i];
    if (trainer >= 0 && i == trainer) h->shift = 0; /* a new process, or dropped */
    if ((trainer >= 0 && i != trainer) || h->held == NULL) continue;
    rpc_call_reply(h->held, code, why, NULL, 0);
    h->held = NULL;
  }
}

/* A push held past --step-timeout: drops (continue) or names (stop) the
 * trainers it waits for. */
static void poll(pserver *ps, double now) {
  if (ps->status != PSERVER_RUNNING) return; /* finished by this poll */
  /* Elastic: a member whose lease passed holds no one back any more. */
  if (ps->job.elastic_min > 0) release_allowed(ps);
  /* A trainer waiting here for the slowest keeps its shard (handed-out data). */
  for (int i = 0; i < ps->cfg.trainers && ps->shards != NULL; i++) {
    if (state_of(ps)->trainers[i].held != NULL) shard_queue_renew(ps->shards, i, now);
  }
  const ssp_trainer *held = state_of(ps)->trainers;
  /* The push held longest, and whether it waited past --step-timeout. */
  int oldest = -1;
  for (int i = 0; i < ps->cfg.trainers; i++) {
    if (held[i].held != NULL && (oldest < 0 || held[i].held_since < held[oldest].held_since)) {
      oldest = i;
    }
  }
  if (oldest < 0 || now - held[oldest].held_since <= ps->cfg.step_timeout) return;
  long need = position(ps, oldest) - ps->job.staleness;
  char missing[256] = "";
  size_t used = 0;
  for (int i = 0; i < ps->cfg.trainers; i++) {
    trainer_state *tr = &ps->trainers[i];
    if (!holds_back(ps, i, now) || position(ps, i) >= need) continue;
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
    release_allowed(ps);
    return;
  }
  snprintf(ps->failure, sizeof ps->failure,
           "trainer %d's push of step %ld waited %.0f s (--step-timeout, --staleness %d) for "
           "trainer(s) %s", oldest, ps->trainers[oldest].last_step, ps->cfg.step_timeout,
           ps->job.staleness, missing);
  ps->status = PSERVER_FAILED;
}

/* What the bound saw (max lead, pushes held, time held) after `when`. */
static void log_bound(const pserver *ps, const char *when) {
  const ssp_state *st = state_of(ps);
  LOG_INFO("%s: ssp: max lead %ld step(s) (--staleness %d); %ld of %ld pushes held, %.1f ms "
           "held on average", when, st->max_lead, ps->job.staleness, st->held, st->pushes,
           st->held > 0 ? st->held_s / (double)st->held * 1e3 : 0.0);
}

static ps_err configure(pserver *ps, ps_error *err) {
  ssp_state *st = calloc(1, sizeof *st);
  if (st != NULL) st->trainers = calloc((size_t)ps->cfg.trainers, sizeof *st->trainers);
  if (st == NULL || st->trainers == NULL) {
    free(st);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory for the ssp state");
  }
  ps->mode_state = st;
  return PS_ERR_OK;
}

static void deconfigure(pserver *ps) {
  ssp_state *st = state_of(ps);
  if (st == NULL) return;
  free(st->trainers);
  free(st);
  ps->mode_state = NULL;
}

const pserver_mode_ops pserver_mode_ssp = {
    .configure = configure,
    .deconfigure = deconfigure,
    .register_step = register_step,
    .push = push,
    .pull_step = pserver_async_pull_step,
    .done = done,
    .leave = leave,
    .drop = drop,
    .poll = poll,
    .log = log_bound,
};
