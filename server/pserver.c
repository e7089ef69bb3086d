/* Request handling of the pserver: validation first, then the table. */
#define _POSIX_C_SOURCE 200809L
#include "server/pserver.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/checkpoint.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "common/process.h"

enum { METHOD_REGISTER, METHOD_PUSH_PULL, METHOD_PULL, METHOD_DONE, METHOD_ROLLBACK };
const char *const pserver_methods[] = {WIRE_METHOD_REGISTER, WIRE_METHOD_PUSH_PULL,
                                       WIRE_METHOD_PULL, WIRE_METHOD_DONE, WIRE_METHOD_ROLLBACK};
const int pserver_method_count = 5;

ps_err pserver_init(pserver *ps, const pserver_config *cfg, ps_error *err) {
  memset(ps, 0, sizeof *ps);
  ps->cfg = *cfg;
  if (ps->cfg.checkpoint_dir == NULL) ps->cfg.checkpoint_dir = "";
  ps->incarnation = process_random_u64();
  ps->trainers = calloc((size_t)cfg->trainers, sizeof *ps->trainers);
  ps->step_slots = calloc((size_t)cfg->trainers, sizeof *ps->step_slots);
  ps->step_calls = calloc((size_t)cfg->trainers, sizeof *ps->step_calls);
  if (ps->trainers == NULL || ps->step_slots == NULL || ps->step_calls == NULL) {
    free(ps->trainers);
    free(ps->step_slots);
    free(ps->step_calls);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory");
  }
  for (int i = 0; i < cfg->trainers; i++) ps->trainers[i].last_step = -1;
  ps->active = cfg->trainers;
  int rc = pthread_mutex_init(&ps->lock, NULL);
  if (rc != 0) {
    free(ps->trainers);
    free(ps->step_slots);
    free(ps->step_calls);
    return ps_error_set(err, PS_ERR_INTERNAL, "pserver: mutex: %s", strerror(rc));
  }
  ps->stats_since = now_s();
  return PS_ERR_OK;
}

void pserver_destroy(pserver *ps) {
  for (int i = 0; i < PSERVER_SNAPSHOTS; i++) {
    if (ps->snapshots[i].data == NULL) continue;
    /* Still referenced after the wait: leaking beats freeing under gRPC. */
    if (rpc_lease_wait(&ps->snapshots[i].lease) == PS_ERR_OK) free(ps->snapshots[i].data);
  }
  if (ps->configured) {
    table_free(&ps->table);
    tensor_layout_free(&ps->checkpoint_layout);
  }
  wire_writer_free(&ps->reply);
  free(ps->refs);
  free(ps->seen);
  free(ps->trainers);
  free(ps->step_slots);
  free(ps->step_calls);
  pthread_mutex_destroy(&ps->lock);
}

/* --- replies ------------------------------------------------------------------ */

static void reply_message(rpc_call *call, const ProtobufCMessage *m) {
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

/* A snapshot no reply is sending from any more, filled with the current
 * parameters; NULL when all are busy (the caller then lets gRPC copy). */
static params_snapshot *take_snapshot(pserver *ps) {
  size_t n = ps->table.n;
  for (int i = 0; i < PSERVER_SNAPSHOTS; i++) {
    params_snapshot *snap = &ps->snapshots[i];
    if (atomic_load(&snap->lease.refs) != 0) continue;
    if (snap->data == NULL && (snap->data = malloc((n > 0 ? n : 1) * sizeof(float))) == NULL) {
      return NULL;
    }
    memcpy(snap->data, ps->table.params, n * sizeof(float));
    return snap;
  }
  return NULL;
}

/* Builds the ParamsReply of the whole shard into ps->reply, sending from
 * snap (or, without one, from the table with gRPC copying). */
static ps_err build_params_reply(pserver *ps, params_snapshot *snap, ps_error *err) {
  ps_table *t = &ps->table;
  if (wire_writer_begin(&ps->reply, t->map.shard_blocks[ps->cfg.id], err) != PS_ERR_OK) {
    return err->code;
  }
  const float *source = snap != NULL ? snap->data : t->params;
  rpc_lease *lease = snap != NULL ? &snap->lease : NULL;
  wire_writer_params_header(&ps->reply, ps->incarnation, (uint64_t)ps->version);
  for (size_t i = 0; i < t->map.block_count; i++) {
    const shard_block *b = &t->map.blocks[i];
    if (b->pserver != ps->cfg.id) continue;
    wire_writer_block(&ps->reply, b->id, source + b->shard_offset, b->count, lease);
  }
  return wire_writer_check(&ps->reply, err);
}

/* Answers each call with the current parameters, all from one snapshot. */
static void reply_params(pserver *ps, rpc_call *const *calls, int count) {
  ps_error err;
  params_snapshot *snap = take_snapshot(ps);
  ps_err rc = build_params_reply(ps, snap, &err);
  for (int i = 0; i < count; i++) {
    if (rc != PS_ERR_OK) {
      rpc_call_reply(calls[i], err.code, err.msg, NULL, 0);
      continue;
    }
    ps->stats_out += ps->table.n * sizeof(float);
    rpc_call_reply(calls[i], PS_ERR_OK, NULL, ps->reply.parts, ps->reply.part_count);
  }
}

static void refuse(rpc_call *call, const char *method, ps_err code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Answers with an error status, logging it: a bad request changes nothing. */
static void refuse(rpc_call *call, const char *method, ps_err code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  LOG_WARN("refused %s from %s: %s (%s)", method, rpc_call_peer(call), msg, ps_err_name(code));
  rpc_call_reply(call, code, msg, NULL, 0);
}

/* --- checks shared by the handlers (lock held) ----------------------------- */

/* Mutual TLS: a trainer acts only as the id its certificate names; answers if not. */
static ps_err check_identity(pserver *ps, rpc_call *call, const char *method, uint32_t trainer_id) {
  if (!ps->cfg.check_trainer_identity) return PS_ERR_OK;
  char want[32];
  snprintf(want, sizeof want, "trainer-%u", trainer_id);
  if (rpc_call_peer_has_name(call, want)) return PS_ERR_OK;
  const char *who = rpc_call_peer_identity(call);
  refuse(call, method, PS_ERR_PERMISSION_DENIED,
         "the client certificate names %s, not %s: a trainer may only act as the id its "
         "certificate names", who[0] != '\0' ? who : "no one", want);
  return PS_ERR_PERMISSION_DENIED;
}

/* Checks a request's key and config hash; returns PS_ERR_OK or answers. */
static ps_err check_sender(pserver *ps, rpc_call *call, const char *method, int has_key,
                           const wire_key *key, uint64_t hash) {
  if (!has_key) {
    refuse(call, method, PS_ERR_INVALID_ARGUMENT, "request without a key (trainer id, step)");
    return PS_ERR_INVALID_ARGUMENT;
  }
  if (key->trainer_id >= (uint32_t)ps->cfg.trainers) {
    refuse(call, method, PS_ERR_INVALID_ARGUMENT, "trainer id %u is not 0..%d", key->trainer_id,
           ps->cfg.trainers - 1);
    return PS_ERR_INVALID_ARGUMENT;
  }
  if (check_identity(ps, call, method, key->trainer_id) != PS_ERR_OK) return PS_ERR_PERMISSION_DENIED;
  if (!ps->configured || !ps->trainers[key->trainer_id].registered) {
    /* ABORTED: the pserver may have restarted; the trainer registers again. */
    refuse(call, method, PS_ERR_ABORTED, "trainer %u has not registered with this pserver "
           "(incarnation %016llx): register again", key->trainer_id,
           (unsigned long long)ps->incarnation);
    return PS_ERR_ABORTED;
  }
  if (hash != ps->job_hash) {
    refuse(call, method, PS_ERR_FAILED_PRECONDITION,
           "config hash %016llx differs from the job's %016llx", (unsigned long long)hash,
           (unsigned long long)ps->job_hash);
    return PS_ERR_FAILED_PRECONDITION;
  }
  if (key->incarnation != ps->trainers[key->trainer_id].incarnation) {
    refuse(call, method, PS_ERR_FAILED_PRECONDITION,
           "trainer %u incarnation %016llx is not the registered one: register again",
           key->trainer_id, (unsigned long long)key->incarnation);
    return PS_ERR_FAILED_PRECONDITION;
  }
  return PS_ERR_OK;
}

/* Checks that a push holds each of this pserver's blocks once, at its size. */
static ps_err check_blocks(pserver *ps, rpc_call *call, const wire_blocks_msg *m) {
  const shard_map *map = &ps->table.map;
  size_t want = map->shard_blocks[ps->cfg.id];
  if (m->block_count != want) {
    refuse(call, "PushPull", PS_ERR_INVALID_ARGUMENT, "push holds %zu blocks, pserver %d holds %zu",
           m->block_count, ps->cfg.id, want);
    return PS_ERR_INVALID_ARGUMENT;
  }
  memset(ps->seen, 0, map->block_count);
  for (size_t i = 0; i < m->block_count; i++) {
    const wire_block_ref *r = &m->blocks[i];
    if (r->id >= map->block_count || map->blocks[r->id].pserver != ps->cfg.id) {
      refuse(call, "PushPull", PS_ERR_INVALID_ARGUMENT, "block %u is not held by pserver %d",
             r->id, ps->cfg.id);
      return PS_ERR_INVALID_ARGUMENT;
    }
    if (ps->seen[r->id]) {
      refuse(call, "PushPull", PS_ERR_INVALID_ARGUMENT, "block %u appears twice", r->id);
      return PS_ERR_INVALID_ARGUMENT;
    }
    ps->seen[r->id] = 1;
    if (r->len != map->blocks[r->id].count * sizeof(float)) {
      refuse(call, "PushPull", PS_ERR_INVALID_ARGUMENT, "block %u has %zu bytes, expected %zu",
             r->id, r->len, map->blocks[r->id].count * sizeof(float));
      return PS_ERR_INVALID_ARGUMENT;
    }
  }
  return PS_ERR_OK;
}

/* --- handlers ---------------------------------------------------------------- */

static ps_err write_checkpoint_locked(pserver *ps, ps_error *err);

static ps_err configure(pserver *ps, const job_config *job, int trainer, ps_error *err) {
  int slots = job->update == UPDATE_SYNC ? job->trainers : 1;
  /* Refuse a job this pserver should not hold before allocating it. */
  double params = 0;
  for (int l = 1; l <= job->model.num_layers; l++) {
    params += ((double)job->model.sizes[l - 1] + 1) * job->model.sizes[l];
  }
  double mb = params / job->pservers * 4 * (3 + slots) / (1 << 20);
  if (mb > (double)ps->cfg.max_shard_mb) {
    return ps_error_set(err, PS_ERR_OUT_OF_RANGE,
                        "the job needs about %.0f MiB on each pserver, above --max-shard-mb %ld",
                        mb, ps->cfg.max_shard_mb);
  }
  /* Every pserver builds the whole map and a push carries all of its blocks:
   * bound both before allocating, then this pserver's exact count. */
  long max_blocks = ps->cfg.max_blocks_per_request;
  double all_blocks = 0;
  for (int l = 1; l <= job->model.num_layers; l++) {
    double w = (double)job->model.sizes[l - 1] * job->model.sizes[l], b = job->model.sizes[l];
    all_blocks += ceil(w / (double)job->block_size) + ceil(b / (double)job->block_size);
  }
  if (max_blocks > 0 && all_blocks > (double)max_blocks * job->pservers) {
    return ps_error_set(err, PS_ERR_OUT_OF_RANGE,
                        "block size %zu cuts the model into %.0f blocks, more than "
                        "--max-blocks-per-request %ld for each of %d pservers",
                        job->block_size, all_blocks, max_blocks, job->pservers);
  }
  if (table_init(&ps->table, job, ps->cfg.id, slots, err) != PS_ERR_OK) return err->code;
  if (max_blocks > 0 && ps->table.map.shard_blocks[ps->cfg.id] > (size_t)max_blocks) {
    size_t mine = ps->table.map.shard_blocks[ps->cfg.id];
    table_free(&ps->table);
    return ps_error_set(err, PS_ERR_OUT_OF_RANGE,
                        "a push to pserver %d would carry %zu blocks (block size %zu), more than "
                        "--max-blocks-per-request %ld", ps->cfg.id, mine, job->block_size,
                        max_blocks);
  }
  size_t blocks = ps->table.map.block_count;
  ps->refs_cap = blocks + 1;
  ps->refs = malloc(ps->refs_cap * sizeof *ps->refs);
  ps->seen = malloc(blocks > 0 ? blocks : 1);
  if (ps->refs == NULL || ps->seen == NULL) {
    free(ps->refs);
    free(ps->seen);
    ps->refs = NULL;
    ps->seen = NULL;
    table_free(&ps->table);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory for %zu blocks", blocks);
  }
  tensor_layout_init(&ps->checkpoint_layout);
  const char *names[3] = {"params", "optimizer.state1", "optimizer.state2"};
  for (int i = 0; i < 3; i++) {
    const tensor_info *src = &ps->table.storage.tensors[i];
    if (tensor_layout_add(&ps->checkpoint_layout, names[i], src->rank, src->shape, err) !=
        PS_ERR_OK) {
      free(ps->refs);
      free(ps->seen);
      ps->refs = NULL;
      ps->seen = NULL;
      tensor_layout_free(&ps->checkpoint_layout);
      table_free(&ps->table);
      return err->code;
    }
  }
  ps->job = *job;
  ps->job_hash = job_config_hash(job);
  ps->configured = 1;
  ps->configured_by = trainer;
  char text[1024];
  job_config_format(job, text, sizeof text);
  LOG_INFO("job from %s %d: %s; this pserver holds %zu of %zu blocks, %zu floats (%.1f MB)",
           trainer >= 0 ? "trainer" : "checkpoint", trainer, text,
           ps->table.map.shard_blocks[ps->cfg.id], blocks, ps->table.n,
           (double)ps->table.n * 4 / 1e6);
  return PS_ERR_OK;
}

/* Whether key would be a new incarnation of its trainer beyond
 * --max-registrations. A resent registration of the same incarnation is
 * free; each new one resets the trainer's state and aborts its waiting push,
 * so a crash-looping or hostile client cannot do that without end. */
static int registrations_exhausted(const pserver *ps, const Pstrain__RequestKey *key) {
  const trainer_state *tr = &ps->trainers[key->trainer_id];
  if (ps->cfg.max_registrations <= 0) return 0;
  if (tr->registered && tr->incarnation == key->incarnation) return 0;
  return tr->registrations >= ps->cfg.max_registrations;
}

static void handle_register(pserver *ps, rpc_call *call, const rpc_message *msg) {
  ps_error err;
  Pstrain__RegisterRequest *req = (Pstrain__RegisterRequest *)wire_unpack(
      &pstrain__register_request__descriptor, msg, &err);
  if (req == NULL) {
    refuse(call, "RegisterTrainer", err.code, "%s", err.msg);
    return;
  }
  job_config job;
  pthread_mutex_lock(&ps->lock);
  int was_configured = ps->configured;
  if (req->key == NULL || req->job == NULL) {
    refuse(call, "RegisterTrainer", PS_ERR_INVALID_ARGUMENT, "registration without key or job");
  } else if (req->key->trainer_id >= (uint32_t)ps->cfg.trainers) {
    refuse(call, "RegisterTrainer", PS_ERR_INVALID_ARGUMENT,
           "trainer id %u is not 0..%d (this pserver expects %d trainers)", req->key->trainer_id,
           ps->cfg.trainers - 1, ps->cfg.trainers);
  } else if (check_identity(ps, call, "RegisterTrainer", req->key->trainer_id) != PS_ERR_OK) {
    /* answered */
  } else if (req->pserver_id != (uint32_t)ps->cfg.id) {
    refuse(call, "RegisterTrainer", PS_ERR_FAILED_PRECONDITION,
           "trainer %u called this pserver %u, but it is pserver %d: the pserver lists differ",
           req->key->trainer_id, req->pserver_id, ps->cfg.id);
  } else if (wire_job_from_proto(req->job, &job, &err) != PS_ERR_OK) {
    refuse(call, "RegisterTrainer", PS_ERR_INVALID_ARGUMENT, "trainer %u: %s",
           req->key->trainer_id, err.msg);
  } else if (job.trainers != ps->cfg.trainers || job.pservers != ps->cfg.pservers) {
    refuse(call, "RegisterTrainer", PS_ERR_FAILED_PRECONDITION,
           "trainer %u expects %d trainers and %d pservers; this pserver was started for %d and %d",
           req->key->trainer_id, job.trainers, job.pservers, ps->cfg.trainers, ps->cfg.pservers);
  } else if (job_config_hash(&job) != req->config_hash) {
    refuse(call, "RegisterTrainer", PS_ERR_INVALID_ARGUMENT,
           "trainer %u's config hash does not match its job description", req->key->trainer_id);
  } else if (ps->configured && req->config_hash != ps->job_hash) {
    char diff[512];
    job_config_diff(&job, &ps->job, diff, sizeof diff);
    char whose[64];
    if (ps->configured_by >= 0) snprintf(whose, sizeof whose, "trainer %d's", ps->configured_by);
    else snprintf(whose, sizeof whose, "the checkpoint's");
    if (ps->cfg.authenticated) {
      refuse(call, "RegisterTrainer", PS_ERR_FAILED_PRECONDITION,
             "trainer %u's job differs from %s: %s", req->key->trainer_id, whose, diff);
    } else {
      /* Unauthenticated, anyone may ask: the job's values (seed, optimizer)
       * would help them register as a trainer. They go to the log only. */
      LOG_WARN("trainer %u's job differs from %s: %s", req->key->trainer_id, whose, diff);
      job_config_diff_fields(&job, &ps->job, diff, sizeof diff);
      refuse(call, "RegisterTrainer", PS_ERR_FAILED_PRECONDITION,
             "trainer %u's job differs from %s in: %s (the values are in the pserver's log; "
             "it sends them only to callers with the token or a client certificate)", req->key->trainer_id, whose, diff);
    }
  } else if (registrations_exhausted(ps, req->key)) {
    refuse(call, "RegisterTrainer", PS_ERR_RESOURCE_EXHAUSTED,
           "trainer %u has registered %ld incarnations, the most --max-registrations allows",
           req->key->trainer_id, ps->trainers[req->key->trainer_id].registrations);
  } else if (!ps->configured && configure(ps, &job, (int)req->key->trainer_id, &err) != PS_ERR_OK) {
    refuse(call, "RegisterTrainer", err.code, "%s", err.msg);
  } else {
    trainer_state *tr = &ps->trainers[req->key->trainer_id];
    if (tr->registered && tr->incarnation != req->key->incarnation) {
      /* A restarted trainer: nothing of the old process counts any more. */
      LOG_WARN("trainer %u registered again with a new incarnation", req->key->trainer_id);
      if (tr->pushed) {
        rpc_call_reply(tr->waiting, PS_ERR_ABORTED, "the trainer registered again", NULL, 0);
        tr->waiting = NULL;
        tr->pushed = 0;
        ps->pushed_count--;
      }
      tr->last_step = -1;
      tr->done = 0;
    }
    if (!tr->registered || tr->incarnation != req->key->incarnation) tr->registrations++;
    tr->registered = 1;
    tr->incarnation = req->key->incarnation;
    if (!was_configured && ps->cfg.checkpoint_dir[0] != '\0') {
      /* Step 0 too, so a pserver lost before the first periodic checkpoint
       * can come back and the others roll back to it. */
      if (write_checkpoint_locked(ps, &err) != PS_ERR_OK) {
        LOG_ERROR("checkpoint at step 0: %s", err.msg);
      }
    }
    LOG_INFO("trainer %u registered from %s", req->key->trainer_id, rpc_call_peer(call));
    Pstrain__RegisterReply reply = PSTRAIN__REGISTER_REPLY__INIT;
    reply.pserver_incarnation = ps->incarnation;
    reply.step = (uint64_t)ps->version;
    reply_message(call, &reply.base);
  }
  pthread_mutex_unlock(&ps->lock);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

static void log_stats(pserver *ps) {
  double now = now_s(), dt = now - ps->stats_since;
  if (dt <= 0) return;
  LOG_INFO("step %ld: %.1f pushes/s, in %.1f MB/s, out %.1f MB/s", ps->version,
           (double)ps->stats_pushes / dt, (double)ps->stats_in / dt / 1e6,
           (double)ps->stats_out / dt / 1e6);
  ps->stats_since = now;
  ps->stats_pushes = 0;
  ps->stats_in = ps->stats_out = 0;
}

/* Writes a checkpoint every cfg.checkpoint_every steps (lock held). A failed
 * write is logged and training goes on: the previous generation stays. */
static void maybe_checkpoint(pserver *ps, long step) {
  if (ps->cfg.checkpoint_dir[0] == '\0' || ps->cfg.checkpoint_every <= 0 ||
      step % ps->cfg.checkpoint_every != 0) {
    return;
  }
  ps_error err;
  if (write_checkpoint_locked(ps, &err) != PS_ERR_OK) LOG_ERROR("checkpoint at step %ld: %s", step, err.msg);
}

/* Sync: every active trainer has pushed: sum their slots in trainer-id order,
 * average, apply, and answer them all. */
static void complete_step(pserver *ps) {
  int n = ps->cfg.trainers, count = 0;
  int *slots = ps->step_slots;
  rpc_call **calls = ps->step_calls;
  for (int i = 0; i < n; i++) {
    if (!ps->trainers[i].pushed) continue;
    slots[count] = i;
    calls[count++] = ps->trainers[i].waiting;
    ps->trainers[i].pushed = 0;
    ps->trainers[i].waiting = NULL;
  }
  table_apply_sum(&ps->table, &ps->job.optimizer, slots, count, 1.0f / (float)count, ps->version);
  ps->version++;
  ps->pushed_count = 0;
  reply_params(ps, calls, count);
  maybe_checkpoint(ps, ps->version);
  if (ps->cfg.log_every > 0 && ps->version % ps->cfg.log_every == 0) log_stats(ps);
}

/* Sync: stores the push; when every active trainer has pushed, completes the
 * step. */
static void push_sync(pserver *ps, rpc_call *call, const rpc_message *msg,
                      const wire_blocks_msg *m) {
  uint32_t id = m->key.trainer_id;
  trainer_state *tr = &ps->trainers[id];
  long step = (long)m->key.step;
  if (tr->lost) {
    refuse(call, "PushPull", PS_ERR_FAILED_PRECONDITION,
           "trainer %u was dropped for missing a step (--on-trainer-loss continue)", id);
    return;
  }
  if (step == ps->version - 1 && !tr->pushed) {
    /* A resend of a push already applied (its reply was lost): answer again. */
    reply_params(ps, &call, 1);
    return;
  }
  if (step != ps->version) {
    /* Ahead: this pserver restarted or rolled back, which the trainer can
     * recover from. Behind: the trainer missed steps. */
    ps_err code = step > ps->version ? PS_ERR_ABORTED : PS_ERR_FAILED_PRECONDITION;
    refuse(call, "PushPull", code, "trainer %u pushed step %ld but the pserver is at step %ld",
           id, step, ps->version);
    return;
  }
  if (tr->pushed) {
    /* A resend while the step waits: the data is the same; keep the newer call. */
    rpc_call_reply(tr->waiting, PS_ERR_ABORTED, "superseded by a resend of the same push", NULL, 0);
    tr->waiting = call;
    return;
  }
  float *slot = table_slot(&ps->table, (int)id);
  for (size_t i = 0; i < m->block_count; i++) {
    const shard_block *b = &ps->table.map.blocks[m->blocks[i].id];
    wire_copy_block(msg, &m->blocks[i], slot + b->shard_offset);
  }
  tr->pushed = 1;
  tr->waiting = call;
  if (ps->pushed_count++ == 0) ps->step_started = now_s();
  if (ps->pushed_count == ps->active) complete_step(ps);
  if (ps->cfg.log_every > 0 && ps->version % ps->cfg.log_every == 0) log_stats(ps);
}

/* Async: applies the push at once (scaled by 1/N) and answers with a copy of
 * the current parameters. */
static void push_async(pserver *ps, rpc_call *call, const rpc_message *msg,
                       const wire_blocks_msg *m) {
  trainer_state *tr = &ps->trainers[m->key.trainer_id];
  long step = (long)m->key.step;
  if (step > tr->last_step) {
    float *slot = table_slot(&ps->table, 0);
    for (size_t i = 0; i < m->block_count; i++) {
      const shard_block *b = &ps->table.map.blocks[m->blocks[i].id];
      wire_copy_block(msg, &m->blocks[i], slot + b->shard_offset);
    }
    /* The schedule advances once per N pushes, as in sync mode. */
    const int slot0 = 0;
    table_apply_sum(&ps->table, &ps->job.optimizer, &slot0, 1, 1.0f / (float)ps->cfg.trainers,
                    ps->version / ps->cfg.trainers);
    ps->version++;
    tr->last_step = step;
    if (ps->version % ps->cfg.trainers == 0) maybe_checkpoint(ps, ps->version / ps->cfg.trainers);
    if (ps->cfg.log_every > 0 && ps->version % (ps->cfg.log_every * ps->cfg.trainers) == 0) {
      log_stats(ps);
    }
  }
  reply_params(ps, &call, 1);
}

static void handle_push(pserver *ps, rpc_call *call, const rpc_message *msg) {
  ps_error err;
  pthread_mutex_lock(&ps->lock);
  wire_blocks_msg m = {.blocks = ps->refs, .block_cap = ps->refs_cap};
  if (ps->stopping) {
    refuse(call, "PushPull", ps->stop_code, "%s", ps->stop_reason);
  } else if (!ps->configured) {
    refuse(call, "PushPull", PS_ERR_ABORTED, "no trainer has registered with this pserver yet "
           "(it may have restarted): register again");
  } else if (wire_parse_blocks(msg, &m, &err) != PS_ERR_OK) {
    refuse(call, "PushPull", err.code, "%s", err.msg);
  } else if (check_sender(ps, call, "PushPull", m.has_key, &m.key, m.config_hash) == PS_ERR_OK &&
             check_blocks(ps, call, &m) == PS_ERR_OK) {
    ps->stats_pushes++;
    ps->stats_in += msg->total;
    if (ps->job.update == UPDATE_SYNC) push_sync(ps, call, msg, &m);
    else push_async(ps, call, msg, &m);
  }
  pthread_mutex_unlock(&ps->lock);
}

/* A request's key as the block messages carry it; zero when absent. */
static wire_key key_of(const Pstrain__RequestKey *k) {
  wire_key key = {0, 0, 0};
  if (k != NULL) key = (wire_key){k->trainer_id, k->incarnation, k->step};
  return key;
}

static void handle_pull(pserver *ps, rpc_call *call, const rpc_message *msg) {
  ps_error err;
  Pstrain__PullRequest *req =
      (Pstrain__PullRequest *)wire_unpack(&pstrain__pull_request__descriptor, msg, &err);
  if (req == NULL) {
    refuse(call, "Pull", err.code, "%s", err.msg);
    return;
  }
  wire_key key = key_of(req->key);
  pthread_mutex_lock(&ps->lock);
  if (check_sender(ps, call, "Pull", req->key != NULL, &key, req->config_hash) == PS_ERR_OK) {
    reply_params(ps, &call, 1);
  }
  pthread_mutex_unlock(&ps->lock);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

static void handle_done(pserver *ps, rpc_call *call, const rpc_message *msg) {
  ps_error err;
  Pstrain__DoneRequest *req =
      (Pstrain__DoneRequest *)wire_unpack(&pstrain__done_request__descriptor, msg, &err);
  if (req == NULL) {
    refuse(call, "Done", err.code, "%s", err.msg);
    return;
  }
  wire_key key = key_of(req->key);
  pthread_mutex_lock(&ps->lock);
  if (check_sender(ps, call, "Done", req->key != NULL, &key, req->config_hash) == PS_ERR_OK) {
    trainer_state *tr = &ps->trainers[key.trainer_id];
    if (!tr->done) LOG_INFO("trainer %u is done at step %llu", key.trainer_id, (unsigned long long)key.step);
    tr->done = 1;
    Pstrain__DoneReply reply = PSTRAIN__DONE_REPLY__INIT;
    reply.pserver_incarnation = ps->incarnation;
    reply_message(call, &reply.base);
  }
  pthread_mutex_unlock(&ps->lock);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

static void handle_rollback(pserver *ps, rpc_call *call, const rpc_message *msg);

/* RegisterTrainer, Pull, Done and Rollback are small; only PushPull carries
 * tensors. */
#define SMALL_REQUEST_MAX (64 * 1024)

void pserver_handle(void *ctx, rpc_call *call, int method, const rpc_message *request) {
  pserver *ps = ctx;
  if (method != METHOD_PUSH_PULL && request->total > SMALL_REQUEST_MAX) {
    refuse(call, pserver_methods[method], PS_ERR_OUT_OF_RANGE,
           "a request of %zu bytes is larger than this method's limit of %d", request->total,
           SMALL_REQUEST_MAX);
    return;
  }
  switch (method) {
  case METHOD_REGISTER: handle_register(ps, call, request); break;
  case METHOD_PUSH_PULL: handle_push(ps, call, request); break;
  case METHOD_PULL: handle_pull(ps, call, request); break;
  case METHOD_DONE: handle_done(ps, call, request); break;
  case METHOD_ROLLBACK: handle_rollback(ps, call, request); break;
  default: rpc_call_reply(call, PS_ERR_UNSUPPORTED, "unknown method", NULL, 0); break;
  }
}

long pserver_version(pserver *ps) {
  pthread_mutex_lock(&ps->lock);
  long version = ps->version;
  pthread_mutex_unlock(&ps->lock);
  return version;
}

pserver_status pserver_poll(pserver *ps) {
  pthread_mutex_lock(&ps->lock);
  if (ps->status == PSERVER_RUNNING && ps->configured) {
    int done = 0;
    for (int i = 0; i < ps->cfg.trainers; i++) done += ps->trainers[i].done || ps->trainers[i].lost;
    if (done == ps->cfg.trainers) ps->status = PSERVER_FINISHED;
    if (ps->job.update == UPDATE_SYNC && ps->pushed_count > 0 &&
        now_s() - ps->step_started > ps->cfg.step_timeout && ps->cfg.continue_on_trainer_loss) {
      for (int i = 0; i < ps->cfg.trainers; i++) {
        trainer_state *tr = &ps->trainers[i];
        if (tr->pushed || tr->done || tr->lost) continue;
        tr->lost = 1;
        ps->active--;
        LOG_WARN("trainer %d missed step %ld for %.0f s (--step-timeout): continuing with %d "
                 "trainer(s) (--on-trainer-loss continue)",
                 i, ps->version, ps->cfg.step_timeout, ps->active);
      }
      if (ps->pushed_count == ps->active) complete_step(ps);
    } else if (ps->job.update == UPDATE_SYNC && ps->pushed_count > 0 &&
               now_s() - ps->step_started > ps->cfg.step_timeout) {
      char missing[256] = "";
      size_t used = 0;
      for (int i = 0; i < ps->cfg.trainers && used < sizeof missing; i++) {
        if (!ps->trainers[i].pushed) {
          used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                   used > 0 ? ", " : "", i);
        }
      }
      snprintf(ps->failure, sizeof ps->failure,
               "step %ld waited %.0f s (--step-timeout) for trainer(s) %s", ps->version,
               ps->cfg.step_timeout, missing);
      ps->status = PSERVER_FAILED;
    }
  }
  pserver_status status = ps->status;
  pthread_mutex_unlock(&ps->lock);
  return status;
}

/* Answers every waiting push with code (lock held); they are not applied. */
static void abort_waiting_locked(pserver *ps, ps_err code, const char *why) {
  for (int i = 0; i < ps->cfg.trainers; i++) {
    if (ps->trainers[i].waiting != NULL) {
      rpc_call_reply(ps->trainers[i].waiting, code, why, NULL, 0);
      ps->trainers[i].waiting = NULL;
      ps->trainers[i].pushed = 0;
    }
  }
  ps->pushed_count = 0;
}

void pserver_abort_waiting(pserver *ps, ps_err code, const char *why) {
  pthread_mutex_lock(&ps->lock);
  ps->stopping = 1;
  ps->stop_code = code;
  snprintf(ps->stop_reason, sizeof ps->stop_reason, "%s", why);
  abort_waiting_locked(ps, code, why);
  pthread_mutex_unlock(&ps->lock);
}

/* --- checkpoints ------------------------------------------------------------ */

static void shard_prefix(const pserver *ps, char *buf, size_t len) {
  snprintf(buf, len, "pserver-%d-of-%d-step-", ps->cfg.id, ps->cfg.pservers);
}

void pserver_checkpoint_path(const pserver *ps, long step, char *buf, size_t len) {
  char prefix[64];
  shard_prefix(ps, prefix, sizeof prefix);
  checkpoint_path(ps->cfg.checkpoint_dir, prefix, step, buf, len);
}

#define SHARD_FORMAT "pstrain-pserver-shard-1"

static ps_err write_checkpoint_locked(pserver *ps, ps_error *err) {
  if (!ps->configured || ps->cfg.checkpoint_dir[0] == '\0') return PS_ERR_OK;
  char prefix[64], id[16], count[16];
  shard_prefix(ps, prefix, sizeof prefix);
  snprintf(id, sizeof id, "%d", ps->cfg.id);
  snprintf(count, sizeof count, "%d", ps->cfg.pservers);
  const char *extra[] = {"pserver", id, "pservers", count, NULL};
  return checkpoint_write(ps->cfg.checkpoint_dir, prefix, SHARD_FORMAT, ps->version, &ps->job,
                          extra, &ps->checkpoint_layout, ps->table.params, err);
}

ps_err pserver_checkpoint(pserver *ps, ps_error *err) {
  pthread_mutex_lock(&ps->lock);
  ps_err rc = write_checkpoint_locked(ps, err);
  pthread_mutex_unlock(&ps->lock);
  return rc;
}

/* A checkpoint's shard number or count: 1 to 15 decimal digits, nothing else. */
static int parse_count(const char *text, long *out) {
  size_t n = strlen(text);
  if (n < 1 || n > 15 || strspn(text, "0123456789") != n) return 0;
  *out = strtol(text, NULL, 10);
  return 1;
}

/* Reads a checkpoint's metadata and checks it is this pserver's shard of a
 * well-formed job; *job and *step receive what it holds. err names path. */
static ps_err read_checkpoint_job(const pserver *ps, const char *path, job_config *job,
                                  long *step, ps_error *err) {
  safetensors_meta meta;
  if (checkpoint_read_job(path, SHARD_FORMAT, job, step, &meta, err) != PS_ERR_OK) {
    return err->code;
  }
  const char *id = safetensors_meta_get(&meta, "pserver");
  const char *count = safetensors_meta_get(&meta, "pservers");
  if (id == NULL || count == NULL) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s does not say which shard it holds", path);
  }
  long file_id, file_count;
  if (!parse_count(id, &file_id) || !parse_count(count, &file_count)) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: bad shard number '%s' of '%s'", path, id,
                        count);
  }
  if (file_id != ps->cfg.id || file_count != ps->cfg.pservers) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "%s holds shard %s of %s pservers, but this is pserver %d of %d", path, id,
                        count, ps->cfg.id, ps->cfg.pservers);
  }
  return PS_ERR_OK;
}

ps_err pserver_resume(pserver *ps, long resume_step, ps_error *err) {
  char path[4096];
  if (resume_step < 0) {
    long newest;
    char prefix[64];
    shard_prefix(ps, prefix, sizeof prefix);
    int n = checkpoint_list(ps->cfg.checkpoint_dir, prefix, &newest, 1);
    if (n < 0) {
      return ps_error_set(err, PS_ERR_IO, "--resume: cannot read %s: %s", ps->cfg.checkpoint_dir,
                          strerror(errno));
    }
    if (n == 0) {
      return ps_error_set(err, PS_ERR_IO, "--resume: no checkpoint of pserver %d of %d in %s",
                          ps->cfg.id, ps->cfg.pservers, ps->cfg.checkpoint_dir);
    }
    resume_step = newest;
  }
  pserver_checkpoint_path(ps, resume_step, path, sizeof path);
  job_config job;
  long step;
  if (read_checkpoint_job(ps, path, &job, &step, err) != PS_ERR_OK) {
    return ps_error_set(err, err->code, "--resume: %s", err->msg);
  }
  if (job.trainers != ps->cfg.trainers) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "--resume: %s was written for %d trainers; --trainers is %d", path,
                        job.trainers, ps->cfg.trainers);
  }
  if (step != resume_step || job.pservers != ps->cfg.pservers) { /* header vs name and job */
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "--resume: %s records step %ld and a job of %d "
                        "pservers; its name says step %ld of %d", path, step, job.pservers,
                        resume_step, ps->cfg.pservers);
  }
  pthread_mutex_lock(&ps->lock);
  ps_err rc = configure(ps, &job, -1, err);
  if (rc == PS_ERR_OK) {
    safetensors_meta meta;
    rc = safetensors_read(path, &ps->checkpoint_layout, ps->table.params, &meta, err);
    if (rc == PS_ERR_OK) {
      ps->version = step;
    } else {
      ps_error_set(err, rc, "--resume: %s", err->msg);
      table_free(&ps->table);
      tensor_layout_free(&ps->checkpoint_layout);
      free(ps->refs);
      free(ps->seen);
      ps->refs = NULL;
      ps->seen = NULL;
      ps->configured = 0;
    }
  }
  pthread_mutex_unlock(&ps->lock);
  if (rc == PS_ERR_OK) LOG_INFO("resumed from %s at step %ld", path, ps->version);
  return rc;
}

/* Loads this pserver's own checkpoint of `step` into the live table (lock
 * held). The file is read whole and checked before anything changes. */
static ps_err roll_back_locked(pserver *ps, long step, ps_error *err) {
  char path[4096];
  pserver_checkpoint_path(ps, step, path, sizeof path);
  job_config job;
  long file_step;
  if (read_checkpoint_job(ps, path, &job, &file_step, err) != PS_ERR_OK) return err->code;
  if (job_config_hash(&job) != ps->job_hash || file_step != step) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "%s holds step %ld of another job", path, file_step);
  }
  size_t n = ps->checkpoint_layout.total;
  float *data = malloc((n > 0 ? n : 1) * sizeof(float));
  if (data == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory reading %s", path);
  safetensors_meta meta;
  ps_err rc = safetensors_read(path, &ps->checkpoint_layout, data, &meta, err);
  if (rc == PS_ERR_OK) {
    memcpy(ps->table.params, data, n * sizeof(float));
    ps->version = step;
  }
  free(data);
  return rc;
}

static void handle_rollback(pserver *ps, rpc_call *call, const rpc_message *msg) {
  ps_error err;
  Pstrain__RollbackRequest *req =
      (Pstrain__RollbackRequest *)wire_unpack(&pstrain__rollback_request__descriptor, msg, &err);
  if (req == NULL) {
    refuse(call, "Rollback", err.code, "%s", err.msg);
    return;
  }
  wire_key key = key_of(req->key);
  long step = (long)req->step;
  pthread_mutex_lock(&ps->lock);
  if (check_sender(ps, call, "Rollback", req->key != NULL, &key, req->config_hash) != PS_ERR_OK) {
    goto out; /* answered */
  }
  if (ps->stopping) {
    refuse(call, "Rollback", ps->stop_code, "%s", ps->stop_reason);
    goto out;
  }
  if (ps->job.update != UPDATE_SYNC) {
    refuse(call, "Rollback", PS_ERR_FAILED_PRECONDITION, "only sync jobs roll back");
    goto out;
  }
  if (req->step > (uint64_t)ps->version) {
    refuse(call, "Rollback", PS_ERR_FAILED_PRECONDITION,
           "cannot roll forward from step %ld to %llu", ps->version,
           (unsigned long long)req->step);
    goto out;
  }
  /* At the step already (another trainer asked first): the step's pushes stay. */
  if (step != ps->version) {
    if (ps->cfg.checkpoint_dir[0] == '\0') {
      refuse(call, "Rollback", PS_ERR_FAILED_PRECONDITION,
             "pserver %d cannot roll back from step %ld to %ld: it has no --checkpoint-dir",
             ps->cfg.id, ps->version, step);
      goto out;
    }
    long from = ps->version;
    if (roll_back_locked(ps, step, &err) != PS_ERR_OK) {
      refuse(call, "Rollback", PS_ERR_FAILED_PRECONDITION,
             "pserver %d cannot roll back from step %ld to %ld: %s", ps->cfg.id, from, step,
             err.msg);
      goto out;
    }
    char why[128];
    snprintf(why, sizeof why, "pserver %d rolled back to step %ld", ps->cfg.id, step);
    abort_waiting_locked(ps, PS_ERR_ABORTED, why);
    LOG_WARN("rolled back from step %ld to %ld, loading its checkpoint: pserver %u restarted "
             "from there (asked by trainer %u)",
             from, step, req->restarted_pserver, key.trainer_id);
  }
  Pstrain__RollbackReply reply = PSTRAIN__ROLLBACK_REPLY__INIT;
  reply.pserver_incarnation = ps->incarnation;
  reply.step = (uint64_t)ps->version;
  reply_message(call, &reply.base);
out:
  pthread_mutex_unlock(&ps->lock);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

int pserver_has_checkpoint(const pserver *ps) {
  char prefix[64];
  long newest;
  shard_prefix(ps, prefix, sizeof prefix);
  return checkpoint_list(ps->cfg.checkpoint_dir, prefix, &newest, 1) > 0;
}
