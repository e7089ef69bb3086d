/* Synchronous updates (--update sync): a step is applied once every
 * active trainer has pushed it, the gradients summed in trainer-id order
 * and averaged, and every push answered with the new parameters; the step's
 * deadline (--step-timeout) drops or names the trainers it waits for.
 * Jobs with tables also meet at a pull barrier before their first step
 * (and after a rollback): the union of every trainer's keys is pulled
 * once. Lock held throughout. */
#define _POSIX_C_SOURCE 200809L
#include "server/mode/sync.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/job_limits.h"
#include "common/log.h"
#include "server/pserver_internal.h"
#include "server/pserver_straggler.h"
#include "server/shard_queue.h"

typedef struct sync_trainer {
  rpc_call *waiting;   /* whole pushes: its push, answered when the step completes */
  rpc_call *pull_call; /* its pull at the barrier (NULL: none); its keys kept by the store */
} sync_trainer;

typedef struct sync_state {
  const sync_step_ops *step; /* NULL: whole pushes (this file) */
  void *step_state;
  sync_trainer *trainers; /* (trainers) */
  int pulled_count;       /* trainers at the pull barrier */
  long pulled_step;       /* the step of the last merged pull (-1: none since the tables were
                           * loaded): every active trainer's keys of it are in */
  double pull_started;    /* when the first of them arrived */
  rpc_call **pull_calls;  /* (trainers) a completed barrier's calls */
  int *pull_ids;          /* (trainers) ... and their trainers */
  /* The step being answered (its slots in ps->step_slots), for what
   * follows its replies (step_replied). */
  long reply_step;
  int reply_count;
  double reply_started;
  sync_members *members; /* handed-out data: the members of each step; else NULL */
} sync_state;

static sync_state *state_of(const pserver *ps) { return ps->mode_state; }

void *sync_step_state(const pserver *ps) { return state_of(ps)->step_state; }
void sync_step_set_state(pserver *ps, void *state) { state_of(ps)->step_state = state; }

int sync_in_step(const pserver *ps, int i) {
  const sync_members *sm = state_of(ps)->members;
  return sm != NULL ? sync_members_expected(ps, sm, i) : !ps->trainers[i].lost;
}

/* With handed-out data the trainers waited for are the step's members
 * present; a step left without any takes the joiners waiting (pserver 0). */
static void recount(pserver *ps) {
  sync_state *st = state_of(ps);
  if (st->members == NULL) return;
  sync_members_admit_waiting(ps, st->members, st->step->started(ps));
  ps->active = sync_members_count(ps, st->members);
}

void sync_step_replying(pserver *ps, int count) {
  sync_members *sm = state_of(ps)->members;
  if (sm != NULL) sync_members_decide(ps, sm, count);
}

void sync_step_begun(pserver *ps) {
  sync_members *sm = state_of(ps)->members;
  if (sm == NULL) return;
  sync_members_begin_step(ps, sm);
  recount(ps);
}

int pserver_sync_members_save(const pserver *ps, char *buf, size_t len) {
  if (ps->mode != &pserver_mode_sync || state_of(ps)->members == NULL) return 0;
  sync_members_save(state_of(ps)->members, buf, len);
  return 1;
}

ps_err pserver_sync_members_restore(pserver *ps, const char *text, ps_error *err) {
  if (ps->mode != &pserver_mode_sync || state_of(ps)->members == NULL) return PS_ERR_OK;
  PS_TRY(sync_members_restore(ps, state_of(ps)->members, text, err));
  recount(ps);
  return PS_ERR_OK;
}

long sync_schedule_step(const pserver *ps) {
  const sync_members *sm = state_of(ps)->members;
  return sm != NULL ? sync_members_schedule_step(sm, ps->cfg.trainers) : ps->updates;
}

void pserver_sync_write_members(const pserver *ps, wire_writer *w) {
  if (ps->mode != &pserver_mode_sync || state_of(ps)->members == NULL) return;
  sync_members_write(ps, state_of(ps)->members, w);
}

/* --- whole pushes ------------------------------------------------------------------ */

/* A step's pushes are answered (their rows pulled at the new step, unless
 * rc says why not): checkpoint, statistics, metrics. */
static void step_replied(pserver *ps, ps_err rc, void *ctx) {
  (void)ctx;
  sync_state *st = state_of(ps);
  if (rc == PS_ERR_OK) st->pulled_step = st->reply_step + 1;
  timeline_span(ps->cfg.timeline, "reply", st->reply_step, st->reply_started);
  pserver_after_step(ps, ps->step_slots, st->reply_count);
}

/* Every active trainer has pushed: apply and answer them. */
static void complete_step(pserver *ps) {
  int n = ps->cfg.trainers, count = 0;
  int *slots = ps->step_slots;
  rpc_call **calls = ps->step_calls;
  sync_trainer *st = state_of(ps)->trainers;
  for (int i = 0; i < n; i++) {
    if (!ps->trainers[i].pushed) continue;
    slots[count] = i;
    calls[count++] = st[i].waiting;
    ps->trainers[i].pushed = 0;
    st[i].waiting = NULL;
  }
  ps->pushed_count = 0;
  long step = ps->updates;
  double t0 = now_s();
  ps_error err;
  if (store_apply_step(ps, slots, count, &err) != PS_ERR_OK) {
    /* Out of memory merging: a table may already hold the step, so it cannot
     * be taken again; the job stops, naming why (a checkpoint resumes it). */
    snprintf(ps->failure, sizeof ps->failure, "step %ld: %.400s", step, err.msg);
    ps->status = PSERVER_FAILED;
    for (int i = 0; i < count; i++) pserver_refuse(calls[i], "PushPull", err.code, "%s", err.msg);
    return;
  }
  sync_step_replying(ps, count);
  ps->updates++;
  sync_step_begun(ps);
  sync_state *state = state_of(ps);
  state->reply_step = step;
  state->reply_count = count;
  state->reply_started = timeline_span(ps->cfg.timeline, "apply", step, t0);
  store_reply_step(ps, slots, calls, count, step_replied, NULL);
}

static void whole_push(pserver *ps, rpc_call *call, const rpc_message *msg,
                       const wire_blocks_msg *m) {
  uint32_t id = m->key.trainer_id;
  trainer_state *tr = &ps->trainers[id];
  sync_trainer *st = &state_of(ps)->trainers[id];
  long step = (long)m->key.step;
  double arrived = now_s();
  if (tr->pushed) {
    /* A resend while the step waits: the data is the same; keep the newer call. */
    rpc_call_reply(st->waiting, PS_ERR_ABORTED, "superseded by a resend of the same push", NULL, 0);
    st->waiting = call;
    return;
  }
  store_keep_push(ps, (int)id, msg, m);
  tr->pushed = 1;
  st->waiting = call;
  double stored = timeline_span_arg(ps->cfg.timeline, "push", step, arrived, "trainer", id);
  if (ps->pushed_count++ == 0) ps->step_started = stored;
  if (ps->pushed_count == ps->active) {
    double last = timeline_span_arg(ps->cfg.timeline, "wait-for-last", step, ps->step_started,
                                    "trainer", id);
    pserver_straggler_note(ps, (int)id, last);
    pserver_metrics_sync_wait(ps->cfg.metrics, last - ps->step_started, id);
    complete_step(ps);
  }
}

/* Behind: its next keys' rows are read only (the merged pull created them). */
static void whole_reply_behind(pserver *ps, rpc_call *call, const wire_blocks_msg *m) {
  (void)m;
  store_reply_lookup(ps, call);
}

static void whole_drop(pserver *ps, int trainer, ps_err code, const char *why) {
  for (int i = trainer < 0 ? 0 : trainer; i < (trainer < 0 ? ps->cfg.trainers : trainer + 1);
       i++) {
    sync_trainer *st = &state_of(ps)->trainers[i];
    if (!ps->trainers[i].pushed) continue;
    rpc_call_reply(st->waiting, code, why, NULL, 0);
    st->waiting = NULL;
    ps->trainers[i].pushed = 0;
    ps->pushed_count--;
  }
  if (trainer < 0) ps->pushed_count = 0;
}

static void whole_try_complete(pserver *ps) {
  if (ps->pushed_count > 0 && ps->pushed_count == ps->active) complete_step(ps);
}

static int whole_started(const pserver *ps) { return ps->pushed_count > 0; }

static const sync_step_ops sync_step_whole = {
    .parts = 0,
    .push = whole_push,
    .reply_behind = whole_reply_behind,
    .drop = whole_drop,
    .try_complete = whole_try_complete,
    .started = whole_started,
};

/* --- the pull barrier (jobs with tables) --------------------------------------------------- */

/* Answers trainer's waiting pull (or every one: trainer -1) with code. */
static void drop_pulls(pserver *ps, int trainer, ps_err code, const char *why) {
  sync_state *st = state_of(ps);
  for (int i = trainer < 0 ? 0 : trainer; i < (trainer < 0 ? ps->cfg.trainers : trainer + 1);
       i++) {
    if (st->trainers[i].pull_call == NULL) continue;
    rpc_call_reply(st->trainers[i].pull_call, code, why, NULL, 0);
    st->trainers[i].pull_call = NULL;
    st->pulled_count--;
  }
}

/* The barrier's pulls are answered: its step's keys are in, unless rc. */
static void pulls_replied(pserver *ps, ps_err rc, void *ctx) {
  (void)ctx;
  if (rc == PS_ERR_OK) state_of(ps)->pulled_step = ps->updates;
}

/* Completes the barrier when every active trainer waits there. */
static void pull_try_complete(pserver *ps) {
  sync_state *st = state_of(ps);
  if (st->pulled_count == 0 || st->pulled_count < ps->active) return;
  int count = 0;
  for (int i = 0; i < ps->cfg.trainers; i++) {
    if (st->trainers[i].pull_call == NULL) continue;
    st->pull_calls[count] = st->trainers[i].pull_call;
    st->pull_ids[count++] = i;
    st->trainers[i].pull_call = NULL;
  }
  st->pulled_count = 0;
  store_reply_pulls(ps, st->pull_ids, st->pull_calls, count, ps->updates, pulls_replied, NULL);
}

/* A checked PULL_STEP with keys: waits at the barrier of the current step
 * (a restarted trainer's of a step already pulled: read-only rows). */
static void pull_step(pserver *ps, rpc_call *call, const wire_blocks_msg *m) {
  sync_state *st = state_of(ps);
  uint32_t id = m->key.trainer_id;
  if (ps->stopping) {
    pserver_refuse(call, "Pull", ps->stop_code, "%s", ps->stop_reason);
    return;
  }
  if (st->members != NULL) {
    sync_members_pull(ps, st->members, call, m, st->step->started(ps));
    recount(ps);
    return;
  }
  if (ps->trainers[id].lost) {
    pserver_refuse(call, "Pull", PS_ERR_FAILED_PRECONDITION,
                   "trainer %u was dropped for missing a step (--on-trainer-loss continue)", id);
    return;
  }
  if (m->key.step != (uint64_t)ps->updates) {
    pserver_refuse(call, "Pull", PS_ERR_ABORTED,
                   "trainer %u pulled the rows of step %llu but the pserver is at step %ld", id,
                   (unsigned long long)m->key.step, ps->updates);
    return;
  }
  if (st->pulled_step == ps->updates) {
    /* A restarted trainer: its old incarnation's keys of this step were in the merged pull
     * (admission counted them) and the others wait at their pushes: read-only rows. */
    store_reply_lookup(ps, call);
    return;
  }
  sync_trainer *tr = &st->trainers[id];
  if (tr->pull_call != NULL) {
    /* A resend while the barrier waits: keep the newer call and its keys. */
    rpc_call_reply(tr->pull_call, PS_ERR_ABORTED, "superseded by a resend of the same pull", NULL, 0);
  } else if (st->pulled_count++ == 0) {
    st->pull_started = now_s();
  }
  tr->pull_call = call;
  store_keep_pull(ps, (int)id);
  pull_try_complete(ps);
}

/* --- the mode ------------------------------------------------------------------------ */

static void push(pserver *ps, rpc_call *call, const rpc_message *msg, const wire_blocks_msg *m) {
  const sync_step_ops *step_ops = state_of(ps)->step;
  uint32_t id = m->key.trainer_id;
  long step = (long)m->key.step;
  if (ps->trainers[id].lost) {
    pserver_refuse(call, "PushPull", PS_ERR_FAILED_PRECONDITION,
                   "trainer %u was dropped for missing a step (--on-trainer-loss continue)", id);
    return;
  }
  sync_members *sm = state_of(ps)->members;
  if (step < ps->updates && sm != NULL) {
    /* The step completed without this trainer (silent past its lease, or
     * before a reset): ABORTED, so it joins the steps again. */
    pserver_refuse(call, "PushPull", PS_ERR_ABORTED,
                   "trainer %u pushed step %ld, which this pserver completed without it (it was "
                   "not heard from within --trainer-lease): it joins the steps again", id, step);
    return;
  }
  if (step < ps->updates) {
    /* Behind: a resend of a push already applied (its reply was lost), or one
     * from before a rollback. Answered with the parameters, not applied: the
     * reply's step tells the trainer where the pserver is. */
    step_ops->reply_behind(ps, call, m);
    return;
  }
  if (step > ps->updates) {
    /* Ahead: this pserver restarted or rolled back; the trainer recovers. */
    pserver_refuse(call, "PushPull", PS_ERR_ABORTED,
                   "trainer %u pushed step %ld but the pserver is at step %ld", id, step,
                   ps->updates);
    return;
  }
  if (sm != NULL) {
    if (sync_members_check_push(ps, sm, call, msg, m) != PS_ERR_OK) return;
    recount(ps); /* the first push of a step names its members here */
  }
  step_ops->push(ps, call, msg, m);
}

/* A trainer registering again, dropped, or a stop (-1): its held push
 * and its pull at the barrier are answered. */
static void drop(pserver *ps, int trainer, ps_err code, const char *why) {
  sync_state *st = state_of(ps);
  st->step->drop(ps, trainer, code, why);
  drop_pulls(ps, trainer, code, why);
  if (st->members == NULL) return;
  sync_members_drop(ps, st->members, trainer, code, why);
  if (trainer < 0) return;
  /* Registered again (a new process): its memberships end; the step goes on. */
  sync_members_leave(ps, st->members, trainer, sync_members_number(st->members, trainer), why);
  recount(ps);
  st->step->try_complete(ps);
}

/* Handed-out data: membership `number` of trainer ended (it has no data
 * for now, or is done): not waited for under it. */
static void end_membership(pserver *ps, int trainer, uint32_t number, const char *why) {
  sync_state *st = state_of(ps);
  if (st->members == NULL) return;
  sync_members_leave(ps, st->members, trainer, number, why);
  recount(ps);
  st->step->try_complete(ps);
}

static void done(pserver *ps, int trainer) {
  if (state_of(ps)->members == NULL) return;
  end_membership(ps, trainer, sync_members_number(state_of(ps)->members, trainer), "done");
}

static void leave(pserver *ps, int trainer, uint64_t number) {
  end_membership(ps, trainer, number > UINT32_MAX ? UINT32_MAX : (uint32_t)number,
                 "no data for now");
}

/* Whether trainer i is at the barrier that is late: the step's pushes, or
 * (pull) the pull barrier of jobs with tables. */
static int at_barrier(const pserver *ps, int i, int pull) {
  return pull ? state_of(ps)->trainers[i].pull_call != NULL : ps->trainers[i].pushed;
}

/* --on-trainer-loss continue: drops the trainers the barrier waits for. */
static void drop_missing_trainers(pserver *ps, int pull) {
  for (int i = 0; i < ps->cfg.trainers; i++) {
    trainer_state *tr = &ps->trainers[i];
    if (at_barrier(ps, i, pull) || tr->done || tr->lost) continue;
    tr->lost = 1;
    ps->active--;
    LOG_WARN("trainer %d missed %s %ld for %.0f s (--step-timeout): continuing with %d "
             "trainer(s) (--on-trainer-loss continue)", i,
             pull ? "the pull barrier of step" : "step", ps->updates, ps->cfg.step_timeout,
             ps->active);
    drop(ps, i, PS_ERR_FAILED_PRECONDITION,
         "the trainer was dropped for missing a step (--on-trainer-loss continue)");
  }
  state_of(ps)->step->try_complete(ps);
  pull_try_complete(ps);
}

/* --on-trainer-loss stop: the job fails naming the missing trainers. */
static void fail_step(pserver *ps, int pull) {
  char missing[256] = "";
  size_t used = 0;
  for (int i = 0; i < ps->cfg.trainers && used < sizeof missing; i++) {
    if (!at_barrier(ps, i, pull)) {
      used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                               used > 0 ? ", " : "", i);
    }
  }
  snprintf(ps->failure, sizeof ps->failure,
           "%s %ld waited %.0f s (--step-timeout) for trainer(s) %s",
           pull ? "the pull barrier of step" : "step", ps->updates, ps->cfg.step_timeout,
           missing);
  ps->status = PSERVER_FAILED;
}

/* Handed-out data: members that went silent within the step leave it
 * (their shards go back at once); a member's or joiner's shard is not
 * taken from it while it waits in a step (for this pserver or another). */
static void poll_members(pserver *ps, double now) {
  const sync_state *st = state_of(ps);
  int was[PSTRAIN_MAX_TRAINERS];
  for (int i = 0; i < ps->cfg.trainers; i++) was[i] = sync_members_expected(ps, st->members, i);
  if (sync_members_poll(ps, st->members, now, st->step->started(ps)) > 0) {
    for (int i = 0; i < ps->cfg.trainers; i++) {
      if (was[i] && !sync_members_expected(ps, st->members, i) && ps->shards != NULL) {
        shard_queue_gone(ps->shards, i, "left the steps (silent)");
      }
    }
    recount(ps);
    st->step->try_complete(ps);
  }
  for (int i = 0; i < ps->cfg.trainers && ps->shards != NULL; i++) {
    if (sync_members_expected(ps, st->members, i) || sync_members_waiting(st->members, i)) {
      shard_queue_renew(ps->shards, i, now);
    }
  }
}

static void poll(pserver *ps, double now) {
  const sync_state *st = state_of(ps);
  if (st->members != NULL) poll_members(ps, now);
  int late = st->step->started(ps) && now - ps->step_started > ps->cfg.step_timeout;
  int late_pull = st->pulled_count > 0 && now - st->pull_started > ps->cfg.step_timeout;
  if ((late || late_pull) && ps->cfg.continue_on_trainer_loss) drop_missing_trainers(ps, !late);
  else if (late || late_pull) fail_step(ps, !late);
}

static uint64_t register_step(pserver *ps, int trainer) {
  (void)trainer;
  return (uint64_t)ps->updates;
}

static int takes_parts(const pserver *ps) { return state_of(ps)->step->parts; }

/* New tables: the next pull is merged again. */
static void rolled_back(pserver *ps) { state_of(ps)->pulled_step = -1; }

static void deconfigure(pserver *ps) {
  sync_state *st = state_of(ps);
  if (st == NULL) return;
  if (st->trainers != NULL) drop_pulls(ps, -1, PS_ERR_ABORTED, "the pserver dropped its job");
  if (st->step != NULL && st->step->free != NULL) st->step->free(ps);
  sync_members_free(ps, st->members);
  free(st->trainers);
  free(st->pull_calls);
  free(st->pull_ids);
  free(st);
  ps->mode_state = NULL;
}

static ps_err configure(pserver *ps, ps_error *err) {
  size_t n = (size_t)ps->cfg.trainers;
  sync_state *st = calloc(1, sizeof *st);
  if (st == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory for sync");
  ps->mode_state = st;
  st->pulled_step = -1;
  st->trainers = calloc(n, sizeof *st->trainers);
  st->pull_calls = calloc(n, sizeof *st->pull_calls);
  st->pull_ids = calloc(n, sizeof *st->pull_ids);
  if (st->trainers == NULL || st->pull_calls == NULL || st->pull_ids == NULL) {
    deconfigure(ps);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory for sync");
  }
  /* Chosen once: a dense store takes a step in parts; rows need it whole. */
  st->step = store_applies_parts(&ps->store) ? &sync_step_dense : &sync_step_whole;
  if (ps->job.shard_steps > 0 && sync_members_create(ps, &st->members, err) != PS_ERR_OK) {
    deconfigure(ps);
    return err->code;
  }
  if (st->members != NULL) ps->active = 0; /* nobody has joined a step yet */
  if (st->step->configure != NULL && st->step->configure(ps, err) != PS_ERR_OK) {
    deconfigure(ps);
    return err->code;
  }
  return PS_ERR_OK;
}

const pserver_mode_ops pserver_mode_sync = {
    .slots_per_trainer = 1,
    .configure = configure,
    .deconfigure = deconfigure,
    .takes_parts = takes_parts,
    .register_step = register_step,
    .push = push,
    .pull_step = pull_step,
    .done = done,
    .leave = leave,
    .drop = drop,
    .poll = poll,
    .rolled_back = rolled_back,
};

int pserver_sync_members_pull(pserver *ps, rpc_call *call, const wire_blocks_msg *m) {
  if (ps->mode != &pserver_mode_sync || state_of(ps)->members == NULL) return 0;
  int joins = m->kind == PSTRAIN__PULL_KIND__PULL_JOIN;
  if (!joins && m->kind != PSTRAIN__PULL_KIND__PULL_STEP) return 0;
  pull_step(ps, call, m);
  return 1;
}
