/* Recovery when a pserver went away, restarted or rolled back: register
 * again, and go on from where the pservers are (resending the push, or
 * rolling every pserver back to a restarted one's checkpoint); a sync job
 * with handed-out data resets its steps instead, and its trainers join
 * them again. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "trainer/client/ps_client_internal.h"

int ps_client_recoverable(ps_err code) {
  return code == PS_ERR_UNAVAILABLE || code == PS_ERR_ABORTED;
}

/* Asks every pserver to roll back to step (a no-op where it is there); a
 * nonzero generation resets a sync job with handed-out data (each pserver
 * reloads the step's checkpoint once per generation, and may be past the
 * step when it did already). */
static ps_err roll_back_all(ps_client *c, long step, int restarted, uint64_t generation,
                            ps_error *err) {
  Pstrain__RequestKey key;
  ps_client_fill_key(c, step, &key);
  Pstrain__RollbackRequest req = PSTRAIN__ROLLBACK_REQUEST__INIT;
  req.key = &key;
  req.config_hash = c->hash;
  req.step = (uint64_t)step;
  req.restarted_pserver = (uint32_t)(restarted >= 0 ? restarted : 0);
  req.generation = generation;
  char what[64];
  snprintf(what, sizeof what, "rolling back to step %ld", step);
  ps_err rc = ps_client_send_to_all(c, WIRE_METHOD_ROLLBACK, &req.base, what, err);
  for (int p = 0; p < c->job.pservers && rc == PS_ERR_OK; p++) {
    Pstrain__RollbackReply *reply = (Pstrain__RollbackReply *)wire_unpack(
        &pstrain__rollback_reply__descriptor, &c->ops[p].reply.message, err);
    if (reply == NULL) {
      rc = ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: pserver %d sent a bad reply", what, p);
      break;
    }
    if (reply->pserver_incarnation != c->pserver_incarnation[p] ||
        (generation == 0 && reply->step != (uint64_t)step)) {
      rc = ps_error_set(err, PS_ERR_ABORTED, "%s: pserver %d is at step %llu (incarnation %016llx)",
                        what, p, (unsigned long long)reply->step,
                        (unsigned long long)reply->pserver_incarnation);
    }
    protobuf_c_message_free_unpacked(&reply->base, NULL);
  }
  ps_client_free_replies(c);
  return rc;
}

/* One ps_client_recover call, across its attempts. */
typedef struct {
  ps_client *c;
  long step;        /* the step whose call failed */
  double start;     /* when recovery began, for the log */
  int attempt;      /* one-based */
  long *steps;      /* each pserver's step, from the latest registration */
  uint64_t *before; /* each pserver's incarnation as this trainer last saw it */
} recovery;

/* Logs each pserver that restarted since it was last seen and returns the
 * last of them (-1: none), which a roll back names. */
static int note_restarts(recovery *r) {
  ps_client *c = r->c;
  int restarted = -1;
  for (int p = 0; p < c->job.pservers; p++) {
    if (c->pserver_incarnation[p] != r->before[p]) {
      restarted = p;
      if (p == 0) c->went_back = 1; /* its queue may be back in an earlier epoch */
      LOG_WARN("pserver %d at %s restarted (new incarnation %016llx) at step %ld", p,
               c->targets.items[p], (unsigned long long)c->pserver_incarnation[p], r->steps[p]);
      r->before[p] = c->pserver_incarnation[p];
    }
  }
  return restarted;
}

/* Every pserver has step's state or the next: a read is simply taken again
 * by the caller; a push is resent, and applied once (a pserver past it
 * answers with its parameters). */
static ps_err resume_at_step(recovery *r, const float *grads, float *params, long *resume_at,
                             ps_error *err) {
  if (grads == NULL) {
    *resume_at = r->step;
    LOG_INFO("step %ld: recovered in %.2f s (%d attempt(s)): every pserver is at the step",
             r->step, now_s() - r->start, r->attempt);
    return PS_ERR_OK;
  }
  ps_err rc = ps_client_push_pull(r->c, r->step, grads, params, err);
  if (rc == PS_ERR_OK) {
    *resume_at = r->step + 1;
    LOG_INFO("step %ld: recovered in %.2f s (%d attempt(s)): push resent", r->step,
             now_s() - r->start, r->attempt);
  }
  return rc;
}

/* A pserver came back from an older checkpoint: all go back to its step. */
static ps_err roll_back_to(recovery *r, long lo, int restarted, float *params, long *resume_at,
                           ps_error *err) {
  ps_err rc = roll_back_all(r->c, lo, restarted, 0, err);
  /* A CTR job's pull needs the keys of step lo: the caller's. */
  if (rc == PS_ERR_OK && r->c->sparse == NULL) rc = ps_client_pull(r->c, params, err);
  if (rc == PS_ERR_OK) {
    *resume_at = lo;
    LOG_WARN("step %ld: recovered in %.2f s (%d attempt(s)): every pserver rolled back to "
             "step %ld; steps %ld to %ld are taken again",
             r->step, now_s() - r->start, r->attempt, lo, lo, r->step);
  }
  return rc;
}

/* One attempt: registers again (waiting up to left seconds), then picks the
 * step to go on from by where the pservers are. */
static ps_err recover_once(recovery *r, double left, const float *grads, float *params,
                           long *resume_at, ps_error *err) {
  ps_client *c = r->c;
  ps_err rc = ps_client_register_all(c, left, r->steps, err);
  if (rc != PS_ERR_OK) return rc;
  int restarted = note_restarts(r);
  long lo = r->steps[0], hi = r->steps[0];
  for (int p = 1; p < c->job.pservers; p++) {
    if (r->steps[p] < lo) lo = r->steps[p];
    if (r->steps[p] > hi) hi = r->steps[p];
  }
  int sync = c->job.update == UPDATE_SYNC;
  if (sync && (hi > r->step + 1 || lo > r->step)) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "step %ld: the pservers are at steps %ld to %ld, ahead of this trainer",
                        r->step, lo, hi);
  }
  if (!sync || lo >= r->step) return resume_at_step(r, grads, params, resume_at, err);
  return roll_back_to(r, lo, restarted, params, resume_at, err);
}

/* Runs attempt(r, left, ctx) until it succeeds, fails for good, or
 * timeout seconds have passed (100 ms between attempts). */
static ps_err recover_loop(ps_client *c, long step, double timeout,
                           ps_err (*attempt)(recovery *r, double left, void *ctx, ps_error *err),
                           void *ctx, ps_error *err) {
  int n = c->job.pservers;
  recovery r = {.c = c, .step = step, .start = now_s()};
  double deadline = r.start + timeout;
  r.steps = malloc((size_t)n * sizeof *r.steps);
  r.before = malloc((size_t)n * sizeof *r.before);
  if (r.steps == NULL || r.before == NULL) {
    free(r.steps);
    free(r.before);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "ps client: out of memory");
  }
  memcpy(r.before, c->pserver_incarnation, (size_t)n * sizeof *r.before);
  ps_err rc;
  char last[sizeof err->msg];
  snprintf(last, sizeof last, "%s", err->msg);
  for (r.attempt = 1;; r.attempt++) {
    double left = deadline - now_s();
    if (left <= 0) {
      char at[40] = "";
      if (step >= 0) snprintf(at, sizeof at, "step %ld: ", step);
      rc = ps_error_set(err, PS_ERR_UNAVAILABLE,
                        "%sgave up after %.0f s (--recover-timeout) and %d attempt(s); "
                        "last error: %s",
                        at, timeout, r.attempt - 1, last);
      break;
    }
    rc = attempt(&r, left, ctx, err);
    /* success is not recoverable either: it ends the loop too */
    if (!ps_client_recoverable(rc)) break;
    snprintf(last, sizeof last, "%s", err->msg);
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  free(r.steps);
  free(r.before);
  return rc;
}

typedef struct resend {
  const float *grads;
  float *params;
  long *resume_at;
} resend;

static ps_err recover_attempt(recovery *r, double left, void *ctx, ps_error *err) {
  resend *s = ctx;
  return recover_once(r, left, s->grads, s->params, s->resume_at, err);
}

ps_err ps_client_recover(ps_client *c, long step, const float *grads, float *params,
                         double timeout, long *resume_at, ps_error *err) {
  resend s = {grads, params, resume_at};
  return recover_loop(c, step, timeout, recover_attempt, &s, err);
}

/* --- sync jobs with handed-out data ------------------------------------------------ */

/* The pservers as this trainer registered with them: every trainer that
 * recovers from the same restart names the same reset. */
static uint64_t generation_of(const ps_client *c) {
  uint64_t g = 1469598103934665603ull;
  for (int p = 0; p < c->job.pservers; p++) {
    g = (g ^ c->pserver_incarnation[p]) * 1099511628211ull;
  }
  return g != 0 ? g : 1;
}

typedef struct member_recovery {
  int reset; /* a pserver restarted: every pserver goes back to the oldest step */
} member_recovery;

static ps_err member_attempt(recovery *r, double left, void *ctx, ps_error *err) {
  member_recovery *m = ctx;
  ps_client *c = r->c;
  PS_TRY(ps_client_register_all(c, left, r->steps, err));
  int restarted = note_restarts(r);
  if (restarted >= 0) m->reset = 1;
  if (!m->reset) {
    /* Nobody restarted: the pservers need not wait for this membership. */
    if (c->member_number != 0) PS_TRY(ps_client_leave(c, err));
    LOG_WARN("recovered in %.2f s (%d attempt(s)): no pserver restarted; this trainer left "
             "the steps and joins them again", now_s() - r->start, r->attempt);
    return PS_ERR_OK;
  }
  long lo = r->steps[0];
  for (int p = 1; p < c->job.pservers; p++) lo = r->steps[p] < lo ? r->steps[p] : lo;
  PS_TRY(roll_back_all(c, lo, restarted, generation_of(c), err));
  c->went_back = 1;
  LOG_WARN("recovered in %.2f s (%d attempt(s)): every pserver went back to step %ld (its "
           "checkpoint: pserver 0's queue hands out again what was trained since); this "
           "trainer joins the steps again", now_s() - r->start, r->attempt, lo);
  return PS_ERR_OK;
}

ps_err ps_client_recover_member(ps_client *c, double timeout, ps_error *err) {
  member_recovery m = {0};
  ps_err rc = recover_loop(c, -1, timeout, member_attempt, &m, err);
  c->member_number = 0; /* ended either way */
  return rc;
}
