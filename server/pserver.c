/* The pserver's request path: dispatch, validation of every request before
 * it touches the store, pull, done, rollback's checks, the deadline poll.
 * Registration is pserver_register.c's, what a push does the job's mode's
 * (server/mode/), the disk pserver_checkpoint.c's. */
#define _POSIX_C_SOURCE 200809L
#include "server/pserver_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/process.h"
#include "server/shard_queue.h"
#include "server/store/tier.h"

enum {
  METHOD_REGISTER,
  METHOD_PUSH_PULL,
  METHOD_PULL,
  METHOD_DONE,
  METHOD_ROLLBACK,
  METHOD_NEXT_SHARD
};
const char *const pserver_methods[] = {WIRE_METHOD_REGISTER, WIRE_METHOD_PUSH_PULL,
                                       WIRE_METHOD_PULL,     WIRE_METHOD_DONE,
                                       WIRE_METHOD_ROLLBACK, WIRE_METHOD_NEXT_SHARD};
const int pserver_method_count = 6;

static void free_trainers(pserver *ps) {
  free(ps->trainers);
  free(ps->step_slots);
  free(ps->step_calls);
}

ps_err pserver_init(pserver *ps, const pserver_config *cfg, ps_error *err) {
  memset(ps, 0, sizeof *ps);
  ps->cfg = *cfg;
  if (ps->cfg.checkpoint_dir == NULL) ps->cfg.checkpoint_dir = "";
  ps->incarnation = process_random_u64();
  ps->trainers = calloc((size_t)cfg->trainers, sizeof *ps->trainers);
  ps->step_slots = calloc((size_t)cfg->trainers, sizeof *ps->step_slots);
  ps->step_calls = calloc((size_t)cfg->trainers, sizeof *ps->step_calls);
  if (ps->trainers == NULL || ps->step_slots == NULL || ps->step_calls == NULL) {
    free_trainers(ps);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory");
  }
  for (int i = 0; i < cfg->trainers; i++) ps->trainers[i].last_step = -1;
  ps->active = cfg->trainers;
  int rc = pthread_mutex_init(&ps->lock, NULL);
  if (rc != 0) {
    free_trainers(ps);
    return ps_error_set(err, PS_ERR_INTERNAL, "pserver: mutex: %s", strerror(rc));
  }
  if (pserver_checkpoint_start(ps, err) != PS_ERR_OK) {
    pthread_mutex_destroy(&ps->lock);
    free_trainers(ps);
    return err->code;
  }
  ps->stats_since = now_s();
  ps->stats_logged = -1;
  return PS_ERR_OK;
}

void pserver_destroy(pserver *ps) {
  pserver_checkpoint_stop(ps); /* writes what is due first */
  for (int i = 0; i < PSERVER_SNAPSHOTS; i++) {
    if (ps->snapshots[i].data == NULL) continue;
    /* Still referenced after the wait: leaking beats freeing under gRPC. */
    if (rpc_lease_wait(&ps->snapshots[i].lease) == PS_ERR_OK) free(ps->snapshots[i].data);
  }
  if (ps->configured) pserver_deconfigure(ps);
  wire_writer_free(&ps->reply);
  free(ps->reply_scratch);
  free_trainers(ps);
  pthread_mutex_destroy(&ps->lock);
}

/* --- replies -------------------------------------------------------------------- */

void pserver_reply_message(rpc_call *call, const ProtobufCMessage *m) {
  uint8_t *buf;
  size_t len;
  ps_error err;
  if (wire_pack(m, &buf, &len, &err) != PS_ERR_OK) {
    rpc_call_reply(call, err.code, err.msg, NULL, 0);
    return;
  }
  rpc_part part = {buf, len, NULL};
  rpc_call_reply(call, PS_ERR_OK, NULL, &part, 1);
  free(buf);
}

void pserver_refuse(rpc_call *call, const char *method, ps_err code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  LOG_WARN("refused %s from %s: %s (%s)", method, rpc_call_peer(call), msg, ps_err_name(code));
  rpc_call_reply(call, code, msg, NULL, 0);
}

/* --- checks shared by the handlers (lock held) ----------------------------------- */

ps_err pserver_check_identity(pserver *ps, rpc_call *call, const char *method,
                              uint32_t trainer_id) {
  if (!ps->cfg.check_trainer_identity) return PS_ERR_OK;
  char want[32];
  snprintf(want, sizeof want, "trainer-%u", trainer_id);
  if (rpc_call_peer_has_name(call, want)) return PS_ERR_OK;
  const char *who = rpc_call_peer_identity(call);
  pserver_refuse(call, method, PS_ERR_PERMISSION_DENIED,
         "the client certificate names %s, not %s: a trainer may only act as the id its "
         "certificate names", who[0] != '\0' ? who : "no one", want);
  return PS_ERR_PERMISSION_DENIED;
}

ps_err pserver_check_sender(pserver *ps, rpc_call *call, const char *method, int has_key,
                           const wire_key *key, uint64_t hash) {
  if (!has_key) {
    pserver_refuse(call, method, PS_ERR_INVALID_ARGUMENT, "request without a key (trainer id, step)");
    return PS_ERR_INVALID_ARGUMENT;
  }
  if (key->trainer_id >= (uint32_t)ps->cfg.trainers) {
    pserver_refuse(call, method, PS_ERR_INVALID_ARGUMENT, "trainer id %u is not 0..%d", key->trainer_id,
           ps->cfg.trainers - 1);
    return PS_ERR_INVALID_ARGUMENT;
  }
  if (pserver_check_identity(ps, call, method, key->trainer_id) != PS_ERR_OK) {
    return PS_ERR_PERMISSION_DENIED;
  }
  if (!ps->configured || !ps->trainers[key->trainer_id].registered) {
    /* ABORTED: the pserver may have restarted; the trainer registers again. */
    pserver_refuse(call, method, PS_ERR_ABORTED, "trainer %u has not registered with this pserver "
           "(incarnation %016llx): register again", key->trainer_id,
           (unsigned long long)ps->incarnation);
    return PS_ERR_ABORTED;
  }
  if (hash != ps->job_hash) {
    pserver_refuse(call, method, PS_ERR_FAILED_PRECONDITION,
           "config hash %016llx differs from the job's %016llx", (unsigned long long)hash,
           (unsigned long long)ps->job_hash);
    return PS_ERR_FAILED_PRECONDITION;
  }
  if (key->incarnation != ps->trainers[key->trainer_id].incarnation) {
    pserver_refuse(call, method, PS_ERR_FAILED_PRECONDITION,
           "trainer %u incarnation %016llx is not the registered one: register again",
           key->trainer_id, (unsigned long long)key->incarnation);
    return PS_ERR_FAILED_PRECONDITION;
  }
  ps->trainers[key->trainer_id].last_seen = now_s();
  return PS_ERR_OK;
}

/* Checks that a push holds each of this pserver's blocks once, at its size,
 * in the job's wire dtype. */
static ps_err check_blocks(pserver *ps, rpc_call *call, const wire_blocks_msg *m) {
  const shard_map *map = &ps->store.dense.map;
  wire_dtype dtype = ps->job.wire_dtype;
  size_t size = wire_dtype_size(dtype);
  if (m->dtype != (uint32_t)dtype) {
    pserver_refuse(call, "PushPull", PS_ERR_INVALID_ARGUMENT,
                   "push holds %s blocks, the job's --wire-dtype is %s",
                   wire_dtype_name((wire_dtype)m->dtype), wire_dtype_name(dtype));
    return PS_ERR_INVALID_ARGUMENT;
  }
  size_t want = map->shard_blocks[ps->cfg.id];
  /* Sync dense jobs take a step's blocks in parts; others all at once. */
  int takes_parts = ps->mode->takes_parts != NULL && ps->mode->takes_parts(ps);
  int parts = takes_parts && m->block_count > 0 && m->block_count < want;
  if (m->block_count != want && !parts) {
    pserver_refuse(call, "PushPull", PS_ERR_INVALID_ARGUMENT, "push holds %zu blocks, pserver %d holds %zu%s",
           m->block_count, ps->cfg.id, want,
           takes_parts ? "" : " (this job's pushes carry all of them)");
    return PS_ERR_INVALID_ARGUMENT;
  }
  memset(ps->seen, 0, map->block_count);
  for (size_t i = 0; i < m->block_count; i++) {
    const wire_block_ref *r = &m->blocks[i];
    if (r->id >= map->block_count || map->blocks[r->id].pserver != ps->cfg.id) {
      pserver_refuse(call, "PushPull", PS_ERR_INVALID_ARGUMENT, "block %u is not held by pserver %d",
             r->id, ps->cfg.id);
      return PS_ERR_INVALID_ARGUMENT;
    }
    if (ps->seen[r->id]) {
      pserver_refuse(call, "PushPull", PS_ERR_INVALID_ARGUMENT, "block %u appears twice", r->id);
      return PS_ERR_INVALID_ARGUMENT;
    }
    ps->seen[r->id] = 1;
    if (r->len != map->blocks[r->id].count * size) {
      pserver_refuse(call, "PushPull", PS_ERR_INVALID_ARGUMENT,
                     "block %u has %zu bytes, expected %zu (%zu %s elements)", r->id, r->len,
                     map->blocks[r->id].count * size, map->blocks[r->id].count,
                     wire_dtype_name(dtype));
      return PS_ERR_INVALID_ARGUMENT;
    }
  }
  return PS_ERR_OK;
}

/* A push's deltas flag against the job's mode: geo pushes in geo jobs
 * only, and only geo pushes there; answers and returns the code if not. */
static ps_err check_deltas(pserver *ps, rpc_call *call, const wire_blocks_msg *m) {
  if (m->deltas == ps->mode->deltas) return PS_ERR_OK;
  if (ps->mode->deltas) {
    pserver_refuse(call, "PushPull", PS_ERR_FAILED_PRECONDITION,
                   "this job's update is %s: a push carries parameter changes (deltas), not "
                   "gradients", update_mode_name(ps->job.update));
  } else {
    pserver_refuse(call, "PushPull", PS_ERR_FAILED_PRECONDITION,
                   "a push of GEO parameter changes (deltas) to a job whose update is %s",
                   update_mode_name(ps->job.update));
  }
  return PS_ERR_FAILED_PRECONDITION;
}

void pserver_drop_waiting(pserver *ps, int trainer, ps_err code, const char *why) {
  if (ps->mode->drop != NULL) ps->mode->drop(ps, trainer, code, why);
}

/* --- push, pull, done, rollback ------------------------------------------------------ */

/* Lock held, the request's rows checked: 1 when they are all in memory (or
 * new), 0 when some must be read from disk first (no lock), -1 when the
 * call was refused. */
static int rows_in_memory(pserver *ps, rpc_call *call, const char *method, tier_fetch *fetch) {
  ps_error err;
  int rc = store_tier_prepare(ps, fetch, &err);
  if (rc < 0) pserver_refuse(call, method, err.code, "%s", err.msg);
  if (rc == 1) store_stash_rows(ps, &fetch->stash); /* the next pass takes them back */
  return rc < 0 ? -1 : rc == 0;
}

/* An evaluation's lookup reads rows: with a disk tier they are served from
 * where they are, not brought into the tables. Returns 1. */
static int lookup_is_read_only(tier_fetch *fetch, const wire_blocks_msg *m) {
  fetch->read_only = m->kind == PSTRAIN__PULL_KIND__PULL_LOOKUP;
  return 1;
}

/* The request's rows checked, or on a later pass taken back as checked. */
static ps_err checked_rows(pserver *ps, rpc_call *call, const char *method, const rpc_message *msg,
                           const wire_blocks_msg *m, int pull, tier_fetch *fetch) {
  if (store_unstash_rows(ps, fetch->stash)) return PS_ERR_OK;
  return store_check_rows(ps, call, method, msg, m, pull);
}

/* No lock: the rows a pass asked for, read; 1 (refused) when that failed. */
static int read_rows(pserver *ps, rpc_call *call, const char *method, tier_fetch *fetch) {
  ps_error err;
  if (store_tier_read(ps, fetch, &err) == PS_ERR_OK) return 0;
  pserver_refuse(call, method, err.code, "%s", err.msg); /* the next pass stops the job */
  return 1;
}

/* One pass: 1 when the call was handled (answered or kept), 0 to come again. */
static int handle_push_pass(pserver *ps, rpc_call *call, const rpc_message *msg, tier_fetch *fetch) {
  ps_error err;
  int handled = 1;
  pthread_mutex_lock(&ps->lock);
  wire_blocks_msg m = {.blocks = ps->refs, .block_cap = ps->refs_cap};
  if (ps->stopping) {
    pserver_refuse(call, "PushPull", ps->stop_code, "%s", ps->stop_reason);
  } else if (!ps->configured) {
    pserver_refuse(call, "PushPull", PS_ERR_ABORTED, "no trainer has registered with this pserver yet "
           "(it may have restarted): register again");
  } else if (wire_parse_blocks(msg, &m, &err) != PS_ERR_OK) {
    pserver_refuse(call, "PushPull", err.code, "%s", err.msg);
  } else if (pserver_check_sender(ps, call, "PushPull", m.has_key, &m.key, m.config_hash) == PS_ERR_OK &&
             check_blocks(ps, call, &m) == PS_ERR_OK &&
             check_deltas(ps, call, &m) == PS_ERR_OK &&
             pserver_check_position(ps, call, &m) == PS_ERR_OK &&
             checked_rows(ps, call, "PushPull", msg, &m, 0, fetch) == PS_ERR_OK &&
             (handled = rows_in_memory(ps, call, "PushPull", fetch)) == 1) {
    ps->stats_pushes++;
    ps->stats_in += msg->total;
    pserver_metrics_push(ps->cfg.metrics, m.key.trainer_id, msg->total);
    ps->mode->push(ps, call, msg, &m);
    pserver_shards_progress(ps, &m);
    store_tier_prefetch_done(ps, (int)m.key.trainer_id); /* its rows are the push's now */
  }
  pthread_mutex_unlock(&ps->lock);
  if (handled == 0) handled = read_rows(ps, call, "PushPull", fetch);
  return handled != 0;
}

/* With a disk tier, a request whose rows are on disk is handled in
 * passes: its rows read with the lock released, then handled again from
 * the start (its message is still the call's) with them in memory. */
static void handle_push(pserver *ps, rpc_call *call, const rpc_message *msg) {
  tier_fetch fetch = {0};
  store_tier_wait_room(ps);
  for (int handled = 0; !handled;) {
    handled = handle_push_pass(ps, call, msg, &fetch);
  }
  tier_fetch_free(&fetch);
}

/* A request's key as the block messages carry it; zero when absent. */
static wire_key key_of(const Pstrain__RequestKey *k) {
  wire_key key = {0, 0, 0};
  if (k != NULL) key = (wire_key){k->trainer_id, k->incarnation, k->step};
  return key;
}

/* A Pull: the parameters, and for CTR jobs rows by kind (store/rows.c;
 * a step's pull goes to the mode).
 * It parses like a PushRequest; it may carry a batch's keys per table, so
 * its size limit comes from the job. */
static int handle_pull_pass(pserver *ps, rpc_call *call, const rpc_message *msg, tier_fetch *fetch) {
  ps_error err;
  int handled = 1;
  pthread_mutex_lock(&ps->lock);
  size_t limit = store_pull_limit(ps);
  wire_block_ref none[1];
  wire_blocks_msg m = {.blocks = none, .block_cap = 0};
  if (msg->total > limit) {
    pserver_refuse(call, "Pull", PS_ERR_OUT_OF_RANGE,
                   "a request of %zu bytes is larger than this method's limit of %zu",
                   msg->total, limit);
  } else if (wire_parse_blocks(msg, &m, &err) != PS_ERR_OK) {
    pserver_refuse(call, "Pull", err.code, "%s", err.msg);
  } else if (pserver_check_sender(ps, call, "Pull", m.has_key, &m.key, m.config_hash) == PS_ERR_OK &&
             checked_rows(ps, call, "Pull", msg, &m, 1, fetch) == PS_ERR_OK &&
             lookup_is_read_only(fetch, &m)) {
    if (m.kind == PSTRAIN__PULL_KIND__PULL_PREFETCH) {
      /* Answered now; the rows come in after (handle_pull), off the trainer's path. */
      store_tier_prefetch_begin(ps, fetch, (int)m.key.trainer_id);
      store_tier_answer_prefetch(ps, call);
    } else if ((handled = rows_in_memory(ps, call, "Pull", fetch)) == 1) {
      if (pserver_sync_members_pull(ps, call, &m)) {
        /* a sync job's handed-out data: joins, and pulls of a step to come */
      } else if (m.kind == PSTRAIN__PULL_KIND__PULL_JOIN) {
        pserver_refuse(call, "Pull", PS_ERR_FAILED_PRECONDITION,
                       "PULL_JOIN is for sync jobs whose data is handed out (--shard-steps)");
      } else {
        store_pull(ps, call, &m);
      }
      store_tier_release(ps);
    }
  }
  pthread_mutex_unlock(&ps->lock);
  if (handled == 0) handled = read_rows(ps, call, "Pull", fetch);
  return handled != 0;
}

static void handle_pull(pserver *ps, rpc_call *call, const rpc_message *msg) {
  tier_fetch fetch = {0};
  store_tier_wait_room(ps);
  for (int handled = 0; !handled;) {
    handled = handle_pull_pass(ps, call, msg, &fetch);
  }
  /* A prefetch, answered: its rows on disk read and installed (the call is gone). */
  if (fetch.prefetch) store_tier_prefetch_finish(ps, &fetch);
  tier_fetch_free(&fetch);
}


static void handle_done(pserver *ps, rpc_call *call, const rpc_message *msg) {
  ps_error err;
  Pstrain__DoneRequest *req =
      (Pstrain__DoneRequest *)wire_unpack(&pstrain__done_request__descriptor, msg, &err);
  if (req == NULL) {
    pserver_refuse(call, "Done", err.code, "%s", err.msg);
    return;
  }
  wire_key key = key_of(req->key);
  pthread_mutex_lock(&ps->lock);
  if (pserver_check_sender(ps, call, "Done", req->key != NULL, &key, req->config_hash) != PS_ERR_OK) {
    /* answered */
  } else if (req->stopped && ps->job.elastic_min == 0) {
    pserver_refuse(call, "Done", PS_ERR_FAILED_PRECONDITION,
                   "trainer %u says it stops before the job's end, but the job is not elastic "
                   "(--elastic): its trainers are fixed", key.trainer_id);
  } else {
    trainer_state *tr = &ps->trainers[key.trainer_id];
    if (req->leave) {
      /* No data for now: back when it joins (sync) or pushes (ssp) again. */
      if (ps->mode->leave != NULL) ps->mode->leave(ps, (int)key.trainer_id, key.step);
    } else if (req->stopped) {
      /* Gone before the data is trained: no step waits for it, its id is
       * free, pserver 0 counts what its process applied. */
      LOG_INFO("trainer %u stops at its step %llu (asked to)", key.trainer_id,
               (unsigned long long)key.step);
      tr->registered = 0;
      if (ps->mode->done != NULL) ps->mode->done(ps, (int)key.trainer_id);
      if (ps->shards != NULL) shard_queue_gone(ps->shards, (int)key.trainer_id, "stopped");
    } else {
      if (!tr->done) LOG_INFO("trainer %u is done at step %llu", key.trainer_id, (unsigned long long)key.step);
      tr->done = 1;
      if (ps->mode->done != NULL) ps->mode->done(ps, (int)key.trainer_id); /* it holds no one back */
      if (ps->shards != NULL) shard_queue_release(ps->shards, (int)key.trainer_id, "is done");
    }
    Pstrain__DoneReply reply = PSTRAIN__DONE_REPLY__INIT;
    reply.pserver_incarnation = ps->incarnation;
    pserver_reply_message(call, &reply.base);
  }
  pthread_mutex_unlock(&ps->lock);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

/* Checks a rollback under the lock and answers it at once when there is
 * nothing to read; else the disk's reader loads the file and answers. */
static void handle_rollback(pserver *ps, rpc_call *call, const rpc_message *msg) {
  ps_error err;
  Pstrain__RollbackRequest *req =
      (Pstrain__RollbackRequest *)wire_unpack(&pstrain__rollback_request__descriptor, msg, &err);
  if (req == NULL) {
    pserver_refuse(call, "Rollback", err.code, "%s", err.msg);
    return;
  }
  wire_key key = key_of(req->key);
  long step = (long)req->step;
  uint64_t generation = req->generation;
  pthread_mutex_lock(&ps->lock);
  /* A reset of handed-out sync reloads even at the step, once per
   * generation (run_rollback checks again when it answers). */
  int seen = generation != 0 && generation == ps->reset_generation;
  int reload = !seen && (step != ps->updates || generation != 0);
  if (pserver_check_sender(ps, call, "Rollback", req->key != NULL, &key, req->config_hash) != PS_ERR_OK) {
    /* answered */
  } else if (ps->stopping) {
    pserver_refuse(call, "Rollback", ps->stop_code, "%s", ps->stop_reason);
  } else if (ps->mode->rolled_back == NULL) {
    pserver_refuse(call, "Rollback", PS_ERR_FAILED_PRECONDITION, "only sync jobs roll back");
  } else if (generation != 0 && ps->job.shard_steps == 0) {
    pserver_refuse(call, "Rollback", PS_ERR_INVALID_ARGUMENT,
                   "a rollback names a generation, but this job's data is not handed out");
  } else if (!seen && req->step > (uint64_t)ps->updates) {
    pserver_refuse(call, "Rollback", PS_ERR_FAILED_PRECONDITION,
                   "cannot roll forward from step %ld to %llu", ps->updates,
                   (unsigned long long)req->step);
  } else if (reload && ps->cfg.checkpoint_dir[0] == '\0') {
    pserver_refuse(call, "Rollback", PS_ERR_FAILED_PRECONDITION,
                   "pserver %d cannot roll back from step %ld to %ld: it has no --checkpoint-dir",
                   ps->cfg.id, ps->updates, step);
  } else if (reload) {
    pserver_rollback_queue(ps, call, step, key.trainer_id, req->restarted_pserver, generation);
  } else {
    /* At the step already (another trainer asked first): the step's pushes stay. */
    Pstrain__RollbackReply reply = PSTRAIN__ROLLBACK_REPLY__INIT;
    reply.pserver_incarnation = ps->incarnation;
    reply.step = (uint64_t)ps->updates;
    pserver_reply_message(call, &reply.base);
  }
  pthread_mutex_unlock(&ps->lock);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

/* RegisterTrainer, Done and Rollback are small; PushPull carries tensors,
 * Pull a batch's keys (its limit is in handle_pull). */
#define SMALL_REQUEST_MAX (64 * 1024)

void pserver_handle(void *ctx, rpc_call *call, int method, const rpc_message *request) {
  pserver *ps = ctx;
  double started = now_s();
  if (method != METHOD_PUSH_PULL && method != METHOD_PULL && request->total > SMALL_REQUEST_MAX) {
    pserver_refuse(call, pserver_methods[method], PS_ERR_OUT_OF_RANGE,
           "a request of %zu bytes is larger than this method's limit of %d", request->total,
           SMALL_REQUEST_MAX);
    return;
  }
  switch (method) {
  case METHOD_REGISTER: pserver_handle_register(ps, call, request); break;
  case METHOD_PUSH_PULL: handle_push(ps, call, request); break;
  case METHOD_PULL: handle_pull(ps, call, request); break;
  case METHOD_DONE: handle_done(ps, call, request); break;
  case METHOD_ROLLBACK: handle_rollback(ps, call, request); break;
  case METHOD_NEXT_SHARD: pserver_handle_next_shard(ps, call, request); break;
  default: rpc_call_reply(call, PS_ERR_UNSUPPORTED, "unknown method", NULL, 0); break;
  }
  pserver_metrics_rpc(ps->cfg.metrics, method, now_s() - started);
}

void pserver_log_summary(pserver *ps) {
  pthread_mutex_lock(&ps->lock);
  if (ps->configured) {
    pserver_log_table_stats(ps, ps->updates);
    if (ps->mode->log != NULL) ps->mode->log(ps, "job");
  }
  pthread_mutex_unlock(&ps->lock);
}

long pserver_version(pserver *ps) {
  pthread_mutex_lock(&ps->lock);
  long version = ps->updates;
  pthread_mutex_unlock(&ps->lock);
  return version;
}

pserver_status pserver_poll(pserver *ps) {
  pthread_mutex_lock(&ps->lock);
  if (ps->status == PSERVER_RUNNING && ps->configured) {
    double now = now_s();
    if (ps->job.elastic_min > 0) {
      pserver_elastic_poll(ps, now); /* trainers come and go */
    } else {
      int done = 0;
      for (int i = 0; i < ps->cfg.trainers; i++) done += ps->trainers[i].done || ps->trainers[i].lost;
      if (done == ps->cfg.trainers) ps->status = PSERVER_FINISHED;
    }
    if (ps->mode->poll != NULL) ps->mode->poll(ps, now);
    pserver_shards_poll(ps, now);
  }
  pserver_status status = ps->status;
  pthread_mutex_unlock(&ps->lock);
  return status;
}

void pserver_abort_waiting_locked(pserver *ps, ps_err code, const char *why) {
  if (ps->configured) pserver_drop_waiting(ps, -1, code, why);
}

void pserver_abort_waiting(pserver *ps, ps_err code, const char *why) {
  pthread_mutex_lock(&ps->lock);
  ps->stopping = 1;
  ps->stop_code = code;
  snprintf(ps->stop_reason, sizeof ps->stop_reason, "%s", why);
  pserver_abort_waiting_locked(ps, code, why);
  pthread_mutex_unlock(&ps->lock);
  /* Rollbacks being read are answered (refused) before the server stops. */
  pserver_checkpoint_wait(ps);
}
