/* RegisterTrainer: a trainer's registration checked (its id, identity, job
 * and incarnations) and accepted, the first one configuring the job. */
#define _POSIX_C_SOURCE 200809L
#include "server/pserver_internal.h"

#include <stdarg.h>
#include <stdio.h>

#include "common/clock.h"
#include "common/log.h"
#include "server/shard_queue.h"

/* Whether key would be a new incarnation of its trainer beyond
 * --max-registrations. A resent registration of the same incarnation is
 * free; each new one resets the trainer's state and aborts its waiting push,
 * so a crash-looping or hostile client cannot do that without end. */
static int registrations_exhausted(const pserver *ps, const Pstrain__RequestKey *key,
                                   const job_config *job) {
  const trainer_state *tr = &ps->trainers[key->trainer_id];
  if (ps->cfg.max_registrations <= 0) return 0;
  /* Elastic: pserver 0 gives ids out and counts each id's holders anew;
   * the others take the ids it gave. */
  if (job->elastic_min > 0 && ps->cfg.id != 0) return 0;
  if (tr->registered && tr->incarnation == key->incarnation) return 0;
  return tr->registrations >= ps->cfg.max_registrations;
}

/* A refusal: its status and message (code PS_ERR_OK: none). */
typedef struct refusal {
  ps_err code;
  char msg[512];
} refusal;

static ps_err refusal_set(refusal *r, ps_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static ps_err refusal_set(refusal *r, ps_err code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->msg, sizeof r->msg, fmt, ap);
  va_end(ap);
  return r->code = code;
}

/* Why a registration's job differs from the one this pserver holds. Only
 * authenticated callers are told the values: to anyone else they would help
 * register as a trainer, so they go to the log. */
static ps_err refuse_other_job(const pserver *ps, uint32_t trainer, const job_config *job,
                               refusal *r) {
  char diff[512], whose[64];
  job_config_diff(job, &ps->job, diff, sizeof diff);
  if (ps->configured_by >= 0) snprintf(whose, sizeof whose, "trainer %d's", ps->configured_by);
  else snprintf(whose, sizeof whose, "the checkpoint's");
  if (ps->cfg.authenticated) {
    return refusal_set(r, PS_ERR_FAILED_PRECONDITION, "trainer %u's job differs from %s: %s",
                       trainer, whose, diff);
  }
  LOG_WARN("trainer %u's job differs from %s: %s", trainer, whose, diff);
  job_config_diff_fields(job, &ps->job, diff, sizeof diff);
  return refusal_set(r, PS_ERR_FAILED_PRECONDITION,
                     "trainer %u's job differs from %s in: %s (the values are in the pserver's "
                     "log; it sends them only to callers with the token or a client "
                     "certificate)", trainer, whose, diff);
}

/* Checks a registration (lock held; identity already checked); *job
 * receives its job. Returns PS_ERR_OK or the refusal in r. */
static ps_err check_registration(const pserver *ps, const Pstrain__RegisterRequest *req,
                                 job_config *job, refusal *r) {
  uint32_t id = req->key->trainer_id;
  ps_error err;
  if (req->pserver_id != (uint32_t)ps->cfg.id) {
    return refusal_set(r, PS_ERR_FAILED_PRECONDITION,
                       "trainer %u called this pserver %u, but it is pserver %d: the pserver "
                       "lists differ", id, req->pserver_id, ps->cfg.id);
  }
  if (wire_job_from_proto(req->job, job, &err) != PS_ERR_OK) {
    return refusal_set(r, PS_ERR_INVALID_ARGUMENT, "trainer %u: %s", id, err.msg);
  }
  if (job->trainers != ps->cfg.trainers || job->pservers != ps->cfg.pservers) {
    return refusal_set(r, PS_ERR_FAILED_PRECONDITION,
                       "trainer %u expects %d trainers and %d pservers; this pserver was "
                       "started for %d and %d", id, job->trainers, job->pservers,
                       ps->cfg.trainers, ps->cfg.pservers);
  }
  if (job_config_hash(job) != req->config_hash) {
    return refusal_set(r, PS_ERR_INVALID_ARGUMENT,
                       "trainer %u's config hash does not match its job description", id);
  }
  if (ps->configured && req->config_hash != ps->job_hash) return refuse_other_job(ps, id, job, r);
  if (registrations_exhausted(ps, req->key, job)) {
    return refusal_set(r, PS_ERR_RESOURCE_EXHAUSTED,
                       "trainer %u has registered %ld incarnations, the most "
                       "--max-registrations allows", id, ps->trainers[id].registrations);
  }
  return PS_ERR_OK;
}

/* Accepts a checked registration: the job is configured (the first one),
 * the trainer's state starts over for a new incarnation. */
static void accept_registration(pserver *ps, rpc_call *call, const Pstrain__RequestKey *key) {
  trainer_state *tr = &ps->trainers[key->trainer_id];
  int id = (int)key->trainer_id;
  uint64_t step = ps->mode->register_step(ps, id);
  int fresh = !tr->registered || tr->incarnation != key->incarnation;
  if (fresh) tr->away = 0; /* ssp: a new process holds others back until it leaves */
  if (tr->registered && tr->incarnation != key->incarnation) {
    /* A restarted trainer: nothing of the old process counts any more. */
    LOG_WARN("trainer %u registered again with a new incarnation", key->trainer_id);
    pserver_drop_waiting(ps, id, PS_ERR_ABORTED, "the trainer registered again");
    if (ps->shards != NULL) shard_queue_gone(ps->shards, id, "registered again (a new process)");
    tr->last_step = -1;
    tr->done = 0;
  }
  if (fresh) tr->registrations++;
  tr->registered = 1;
  tr->incarnation = key->incarnation;
  tr->last_seen = now_s();
  if (tr->reserved_for == key->incarnation) tr->reserved_until = 0; /* the joiner came */
  LOG_INFO("trainer %u registered from %s", key->trainer_id, rpc_call_peer(call));
  Pstrain__RegisterReply reply = PSTRAIN__REGISTER_REPLY__INIT;
  reply.pserver_incarnation = ps->incarnation;
  reply.step = step;
  reply.disk_tier = ps->store.tier != NULL;
  pserver_reply_message(call, &reply.base);
}

/* Why pserver 0 gives no id to a joining trainer now (NULL: it may). */
static const char *no_assignment(const pserver *ps) {
  if (ps->cfg.id != 0) return "only pserver 0 gives trainer ids";
  if (ps->configured && ps->job.elastic_min == 0) {
    return "this job is not elastic: its trainers are given --id";
  }
  if (ps->cfg.check_trainer_identity) {
    return "elastic trainers' ids are given out: not with --tls-check-trainer-id";
  }
  return NULL;
}

/* Elastic jobs: pserver 0 gives a joining trainer the lowest id that
 * nobody holds (pserver_id_held), kept for its incarnation a while so it
 * can open its data and register; a resent request gets the same id. */
static void assign_id(pserver *ps, rpc_call *call, const Pstrain__RegisterRequest *req) {
  double now = now_s();
  uint64_t incarnation = req->key->incarnation;
  const char *why = no_assignment(ps);
  if (why != NULL) {
    pserver_refuse(call, "RegisterTrainer", PS_ERR_FAILED_PRECONDITION, "%s", why);
    return;
  }
  int id = -1;
  for (int i = 0; i < ps->cfg.trainers && id < 0; i++) {
    const trainer_state *tr = &ps->trainers[i];
    if (tr->reserved_for == incarnation && tr->reserved_until > now) id = i;
  }
  for (int i = 0; i < ps->cfg.trainers && id < 0; i++) {
    if (!pserver_id_held(ps, i, now)) id = i;
  }
  if (id < 0) {
    pserver_refuse(call, "RegisterTrainer", PS_ERR_RESOURCE_EXHAUSTED,
                   "every trainer id (0..%d) is held: the job has its most trainers",
                   ps->cfg.trainers - 1);
    return;
  }
  trainer_state *tr = &ps->trainers[id];
  if (tr->reserved_for != incarnation) {
    tr->reserved_for = incarnation;
    tr->registrations = 0; /* a new holder: its own --max-registrations */
    LOG_INFO("trainer id %d given to a joining trainer from %s", id, rpc_call_peer(call));
  }
  tr->reserved_until = now + PSERVER_JOIN_SECONDS;
  Pstrain__RegisterReply reply = PSTRAIN__REGISTER_REPLY__INIT;
  reply.pserver_incarnation = ps->incarnation;
  reply.trainer_id = (uint32_t)id;
  pserver_reply_message(call, &reply.base);
}

void pserver_handle_register(pserver *ps, rpc_call *call, const rpc_message *msg) {
  ps_error err;
  Pstrain__RegisterRequest *req = (Pstrain__RegisterRequest *)wire_unpack(
      &pstrain__register_request__descriptor, msg, &err);
  if (req == NULL) {
    pserver_refuse(call, "RegisterTrainer", err.code, "%s", err.msg);
    return;
  }
  job_config job;
  refusal r = {PS_ERR_OK, ""};
  pthread_mutex_lock(&ps->lock);
  if (req->key != NULL && req->assign_id) {
    assign_id(ps, call, req);
    goto out; /* answered */
  } else if (req->key == NULL || req->job == NULL) {
    refusal_set(&r, PS_ERR_INVALID_ARGUMENT, "registration without key or job");
  } else if (req->key->trainer_id >= (uint32_t)ps->cfg.trainers) {
    refusal_set(&r, PS_ERR_INVALID_ARGUMENT,
                "trainer id %u is not 0..%d (this pserver expects %d trainers)",
                req->key->trainer_id, ps->cfg.trainers - 1, ps->cfg.trainers);
  } else if (pserver_check_identity(ps, call, "RegisterTrainer", req->key->trainer_id) != PS_ERR_OK) {
    goto out; /* answered */
  } else if (check_registration(ps, req, &job, &r) == PS_ERR_OK && !ps->configured) {
    if (pserver_configure(ps, &job, (int)req->key->trainer_id, &err) != PS_ERR_OK) {
      refusal_set(&r, err.code, "%s", err.msg);
    } else {
      /* Step 0 too, so a pserver lost before the first periodic checkpoint
       * can come back and the others roll back to it. */
      pserver_checkpoint_due(ps);
    }
  }
  if (r.code != PS_ERR_OK) pserver_refuse(call, "RegisterTrainer", r.code, "%s", r.msg);
  else accept_registration(ps, call, req->key);
out:
  pthread_mutex_unlock(&ps->lock);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}
