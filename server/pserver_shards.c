/* The data handed out (jobs with --shard-steps): pserver 0's NextShard and
 * the positions pushes carry (the queue itself is shard_queue.c); elastic
 * jobs' membership (who is a member, when the job is over, too few). */
#define _POSIX_C_SOURCE 200809L
#include "server/pserver_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/clock.h"
#include "common/safetensors.h"
#include "common/log.h"
#include "server/shard_queue.h"

ps_err pserver_shards_configure(pserver *ps, const job_config *job, int trainer, ps_error *err) {
  (void)trainer;
  if (job->shard_steps == 0 || ps->cfg.id != 0) return PS_ERR_OK;
  shard_queue *q = malloc(sizeof *q);
  if (q == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory");
  if (shard_queue_init(q, job, ps->cfg.trainer_lease, err) != PS_ERR_OK) {
    free(q);
    return err->code;
  }
  ps->shards = q;
  return PS_ERR_OK;
}

void pserver_shards_deconfigure(pserver *ps) {
  if (ps->shards == NULL) return;
  shard_queue_free(ps->shards);
  free(ps->shards);
  ps->shards = NULL;
}

ps_err pserver_shards_save(pserver *ps, char **text, ps_error *err) {
  if (*text == NULL && (*text = malloc(SAFETENSORS_META_VALUE_MAX)) == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory for the shard queue");
  }
  return shard_queue_save(ps->shards, *text, SAFETENSORS_META_VALUE_MAX, err);
}

ps_err pserver_handed_read(const char *path, int want_queue, pserver_handed_state *out,
                           ps_error *err) {
  *out = (pserver_handed_state){NULL, NULL};
  safetensors_meta *meta = malloc(sizeof *meta);
  if (meta == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory reading %s", path);
  ps_err rc = safetensors_read(path, NULL, NULL, meta, err);
  const char *queue = rc == PS_ERR_OK ? safetensors_meta_get(meta, PSERVER_SHARD_QUEUE_KEY) : NULL;
  const char *members = rc == PS_ERR_OK ? safetensors_meta_get(meta, PSERVER_MEMBERS_KEY) : NULL;
  if (rc == PS_ERR_OK && want_queue && queue == NULL) {
    rc = ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s holds no shard queue, but the job's data is "
                      "handed out in shards", path);
  }
  if (rc == PS_ERR_OK && want_queue && (out->queue = strdup(queue)) == NULL) {
    rc = ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory reading %s", path);
  }
  if (rc == PS_ERR_OK && members != NULL && (out->members = strdup(members)) == NULL) {
    rc = ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory reading %s", path);
  }
  free(meta);
  if (rc != PS_ERR_OK) pserver_handed_free(out);
  return rc;
}

void pserver_handed_free(pserver_handed_state *h) {
  free(h->queue);
  free(h->members);
  *h = (pserver_handed_state){NULL, NULL};
}

ps_err pserver_handed_apply(pserver *ps, const pserver_handed_state *h, ps_error *err) {
  if (ps->shards != NULL && h->queue != NULL) {
    PS_TRY(shard_queue_load(ps->shards, h->queue, now_s(), err));
  }
  return pserver_sync_members_restore(ps, h->members, err);
}

ps_err pserver_shards_resume(pserver *ps, int count, long step, ps_error *err) {
  if (ps->job.shard_steps == 0) return PS_ERR_OK;
  int own = count == ps->cfg.pservers; /* not re-sharded: this pserver's own file */
  if (ps->shards == NULL && !own) return PS_ERR_OK;
  char prefix[64], path[4096];
  snprintf(prefix, sizeof prefix, "pserver-%d-of-%d-step-", own ? ps->cfg.id : 0, count);
  checkpoint_path(ps->cfg.checkpoint_dir, prefix, step, path, sizeof path);
  pserver_handed_state h;
  ps_err rc = pserver_handed_read(path, ps->shards != NULL, &h, err);
  if (rc == PS_ERR_OK && !own) {
    free(h.members); /* pserver 0's old counters are not this pserver's */
    h.members = NULL;
  }
  if (rc == PS_ERR_OK) rc = pserver_handed_apply(ps, &h, err); /* not serving yet */
  if (rc != PS_ERR_OK) ps_error_set(err, rc, "%s: %s", path, err->msg);
  pserver_handed_free(&h);
  return rc;
}

ps_err pserver_check_position(pserver *ps, rpc_call *call, const wire_blocks_msg *m) {
  int handed = ps->job.shard_steps > 0;
  if (m->has_position == handed) return PS_ERR_OK;
  pserver_refuse(call, "PushPull", PS_ERR_FAILED_PRECONDITION,
                 handed ? "this job's data is handed out in shards: a push names where its "
                          "batch begins"
                        : "a push names a data position, but this job's data is not handed out "
                          "in shards");
  return PS_ERR_FAILED_PRECONDITION;
}

void pserver_shards_progress(pserver *ps, const wire_blocks_msg *m) {
  if (ps->shards == NULL) return;
  (void)shard_queue_progress(ps->shards, (int)m->key.trainer_id, &m->position, now_s());
}

/* --- elastic membership ------------------------------------------------------------ */

/* A member: registered, not done, heard from within `within` seconds. */
static int member(const trainer_state *tr, double now, double within) {
  return tr->registered && !tr->done && !tr->lost && now - tr->last_seen <= within;
}

int pserver_is_member(const pserver *ps, int i, double now) {
  return member(&ps->trainers[i], now, ps->cfg.trainer_lease);
}

int pserver_id_held(const pserver *ps, int i, double now) {
  const trainer_state *tr = &ps->trainers[i];
  return tr->reserved_until > now || member(tr, now, ps->cfg.trainer_lease);
}

int pserver_live_trainers(const pserver *ps, double now) {
  int n = 0;
  for (int i = 0; i < ps->cfg.trainers; i++) {
    n += member(&ps->trainers[i], now, ps->cfg.trainer_lease);
  }
  return n > 0 ? n : 1;
}

void pserver_elastic_poll(pserver *ps, double now) {
  int done = 0, present = 0, live = 0;
  for (int i = 0; i < ps->cfg.trainers; i++) {
    const trainer_state *tr = &ps->trainers[i];
    done += tr->done;
    /* Gone for good: silent three leases (a trainer waiting for the
     * epoch's last shards is silent here up to about one). */
    present += member(tr, now, 3 * ps->cfg.trainer_lease);
    live += member(tr, now, ps->cfg.trainer_lease);
  }
  if (done > 0 && present == 0) {
    LOG_INFO("every trainer that joined is done or gone (%d done)", done);
    ps->status = PSERVER_FINISHED;
    return;
  }
  int trained = ps->shards != NULL && ps->shards->epoch >= ps->shards->epochs;
  if (ps->cfg.id != 0 || live >= ps->job.elastic_min || trained) {
    if (ps->below_min_since > 0) LOG_INFO("elastic: %d trainer(s): training again", live);
    ps->below_min_since = 0;
    return;
  }
  if (ps->below_min_since == 0) {
    ps->below_min_since = now;
    LOG_WARN("elastic: %d trainer(s), fewer than the job's minimum %d: waiting (at most "
             "--step-timeout %.0f s)", live, ps->job.elastic_min, ps->cfg.step_timeout);
  } else if (now - ps->below_min_since > ps->cfg.step_timeout) {
    snprintf(ps->failure, sizeof ps->failure,
             "elastic: fewer than %d trainers for %.0f s (--step-timeout): the job stops",
             ps->job.elastic_min, ps->cfg.step_timeout);
    ps->status = PSERVER_FAILED; /* main logs it */
  }
}

void pserver_shards_poll(pserver *ps, double now) {
  shard_queue *q = ps->shards;
  if (q == NULL) return;
  shard_queue_expire(q, now);
  /* A process gone while it held no shard (killed while it waited for
   * one, or had left a sync job's steps): what it applied this epoch is
   * counted for it once it has been silent three leases. A live trainer
   * without a shard asks for one every 50 ms. */
  for (int i = 0; i < q->trainers; i++) {
    const trainer_state *tr = &ps->trainers[i];
    if (q->held[i] >= 0 || (q->by_process[i] == 0 && q->unreported[i] == 0) || tr->done) continue;
    if (now - tr->last_seen <= 3 * ps->cfg.trainer_lease) continue;
    shard_queue_gone(q, i, "silent three leases holding no shard");
  }
}

/* --- NextShard ---------------------------------------------------------------------- */

/* Answers a NextShard of a checked sender from the queue. */
static void answer(pserver *ps, rpc_call *call, const Pstrain__NextShardRequest *req) {
  ps_error err;
  shard_grant g;
  /* An elastic job below its minimum: shards wait for more trainers. */
  int may_grant = ps->below_min_since == 0;
  long epoch = (long)req->epoch;
  if (req->went_back && epoch > ps->shards->epoch) epoch = ps->shards->epoch;
  if (shard_queue_next(ps->shards, (int)req->key->trainer_id, epoch, req->finished,
                       (long)req->finished_shard, may_grant, now_s(), &g, &err) != PS_ERR_OK) {
    pserver_refuse(call, "NextShard", err.code, "%s", err.msg);
    return;
  }
  Pstrain__NextShardReply reply = PSTRAIN__NEXT_SHARD_REPLY__INIT;
  reply.answer = (Pstrain__ShardAnswer)g.answer;
  reply.epoch = (uint64_t)g.epoch;
  reply.shard = (uint64_t)g.shard;
  reply.offset = (uint64_t)g.offset;
  reply.end = (uint64_t)g.end;
  reply.first = (uint64_t)g.first;
  reply.wait_s = g.answer == SHARD_ANSWER_WAIT ? 0.05 : 0.0;
  reply.pserver_incarnation = ps->incarnation;
  if (g.answer == SHARD_ANSWER_GRANT) {
    LOG_DEBUG("shards: trainer %u takes shard %ld of epoch %ld from example %ld of %ld",
              req->key->trainer_id, g.shard, g.epoch + 1, g.offset, g.end);
  }
  pserver_reply_message(call, &reply.base);
}

void pserver_handle_next_shard(pserver *ps, rpc_call *call, const rpc_message *msg) {
  ps_error err;
  Pstrain__NextShardRequest *req = (Pstrain__NextShardRequest *)wire_unpack(
      &pstrain__next_shard_request__descriptor, msg, &err);
  if (req == NULL) {
    pserver_refuse(call, "NextShard", err.code, "%s", err.msg);
    return;
  }
  wire_key key = {0, 0, 0};
  if (req->key != NULL) key = (wire_key){req->key->trainer_id, req->key->incarnation, 0};
  pthread_mutex_lock(&ps->lock);
  if (pserver_check_sender(ps, call, "NextShard", req->key != NULL, &key, req->config_hash) !=
      PS_ERR_OK) {
    /* answered */
  } else if (ps->job.shard_steps == 0) {
    pserver_refuse(call, "NextShard", PS_ERR_FAILED_PRECONDITION,
                   "this job's data is not handed out in shards (no --shard-steps)");
  } else if (ps->shards == NULL) {
    pserver_refuse(call, "NextShard", PS_ERR_FAILED_PRECONDITION,
                   "pserver %d does not hand out the data: pserver 0 does", ps->cfg.id);
  } else if (req->epoch > (uint64_t)ps->shards->epochs) {
    pserver_refuse(call, "NextShard", PS_ERR_INVALID_ARGUMENT, "epoch %llu of a job of %d",
                   (unsigned long long)req->epoch + 1, ps->shards->epochs);
  } else if (ps->stopping) {
    pserver_refuse(call, "NextShard", ps->stop_code, "%s", ps->stop_reason);
  } else {
    answer(ps, call, req);
  }
  pthread_mutex_unlock(&ps->lock);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}
