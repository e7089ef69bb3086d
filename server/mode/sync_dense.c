/* The dense sync step, in parts (a store without tables): a push may carry any subset of
 * a trainer's blocks for the step (an overlapped trainer pushes a layer as
 * soon as backward has it; recovery and older trainers push all at once, the
 * one-part case). Each block is applied once every active trainer has
 * delivered it, with dense_shard_apply_sum's math over its range (sum in trainer-id
 * order, 1/N, the optimizer at the step: bitwise what the whole-shard apply
 * gives), and each held call is answered as soon as all of its blocks are
 * applied, with those blocks only. The step completes (updates++, checkpoint,
 * statistics) once every block is applied. Lock held throughout. */
#define _POSIX_C_SOURCE 200809L
#include "server/mode/sync.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "server/pserver_internal.h"
#include "server/pserver_straggler.h"

/* A push held until its blocks are applied: its ids are pool[first, first+count). */
typedef struct parts_call {
  rpc_call *call;
  int trainer;
  size_t first, count;
} parts_call;

typedef struct sync_dense {
  size_t blocks;            /* map.block_count */
  size_t mine;              /* this pserver's blocks */
  unsigned char *delivered; /* (trainers, blocks): trainer delivered block this step */
  size_t *delivered_count;  /* (trainers) */
  unsigned char *applied;   /* (blocks) applied this step */
  size_t applied_count;
  unsigned char *mark;      /* (blocks) scratch: blocks of the replies being built */
  int started;              /* some block delivered this step */
  parts_call *calls;
  size_t call_count, call_cap;
  uint32_t *pool;
  size_t pool_count, pool_cap, pool_max; /* pool_max: refuse beyond (resends without end) */
} sync_dense;

static sync_dense *dense_of(const pserver *ps) { return sync_step_state(ps); }

static void dense_free(pserver *ps);

static ps_err dense_configure(pserver *ps, ps_error *err) {
  sync_dense *pp = calloc(1, sizeof *pp);
  size_t blocks = ps->store.dense.map.block_count, trainers = (size_t)ps->cfg.trainers;
  if (pp == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory for parts");
  sync_step_set_state(ps, pp);
  pp->blocks = blocks;
  pp->mine = ps->store.dense.map.shard_blocks[ps->cfg.id];
  pp->delivered = calloc(trainers * blocks + 1, 1);
  pp->delivered_count = calloc(trainers, sizeof *pp->delivered_count);
  pp->applied = calloc(blocks + 1, 1);
  pp->mark = calloc(blocks + 1, 1);
  /* Each trainer's blocks twice over: every ordinary flow (parts, a whole
   * resend, a part resent) fits; only endless overlapping resends do not. */
  pp->pool_max = 2 * trainers * (pp->mine + 1);
  if (pp->delivered == NULL || pp->delivered_count == NULL || pp->applied == NULL ||
      pp->mark == NULL) {
    dense_free(ps);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory for parts of %zu blocks",
                        blocks);
  }
  return PS_ERR_OK;
}

static void dense_free(pserver *ps) {
  sync_dense *pp = dense_of(ps);
  if (pp == NULL) return;
  free(pp->delivered);
  free(pp->delivered_count);
  free(pp->applied);
  free(pp->mark);
  free(pp->calls);
  free(pp->pool);
  free(pp);
  sync_step_set_state(ps, NULL);
}

/* The step's clock runs once a push of it arrived (or completed one). */
static int dense_started(const pserver *ps) {
  return ps->pushed_count > 0 || dense_of(ps)->started;
}

/* --- replies ----------------------------------------------------------------------- */

/* A snapshot no reply sends from any more, holding the marked blocks'
 * parameters; NULL when all are busy (gRPC then copies from the table). */
static params_snapshot *snapshot_marked(pserver *ps) {
  const dense_shard *t = &ps->store.dense;
  const unsigned char *mark = dense_of(ps)->mark;
  size_t size = wire_dtype_size(ps->job.wire_dtype);
  for (int i = 0; i < PSERVER_SNAPSHOTS; i++) {
    params_snapshot *snap = &ps->snapshots[i];
    if (atomic_load(&snap->lease.refs) != 0) continue;
    if (snap->data == NULL &&
        (snap->data = malloc((t->n > 0 ? t->n : 1) * sizeof(float))) == NULL) {
      return NULL;
    }
    for (size_t b = 0; b < t->map.block_count; b++) {
      if (!mark[b]) continue;
      const shard_block *blk = &t->map.blocks[b];
      wire_dtype_encode(ps->job.wire_dtype, t->params + blk->shard_offset,
                        (uint8_t *)snap->data + blk->shard_offset * size, blk->count);
    }
    return snap;
  }
  return NULL;
}

/* Answers call with the parameters of blocks ids (count), as of `version`. */
static void reply_blocks(pserver *ps, rpc_call *call, const uint32_t *ids, size_t count,
                         long version, params_snapshot *snap) {
  ps_error err;
  const dense_shard *t = &ps->store.dense;
  if (wire_writer_begin(&ps->reply, count, &err) != PS_ERR_OK) {
    rpc_call_reply(call, err.code, err.msg, NULL, 0);
    return;
  }
  const uint8_t *source =
      snap != NULL ? (const uint8_t *)snap->data : pserver_reply_source_unleased(ps);
  if (source == NULL) {
    pserver_refuse(call, "PushPull", PS_ERR_NO_MEMORY, "pserver: out of memory converting the "
                   "parameters to %s", wire_dtype_name(ps->job.wire_dtype));
    return;
  }
  size_t size = wire_dtype_size(ps->job.wire_dtype);
  rpc_lease *lease = snap != NULL ? &snap->lease : NULL;
  wire_writer_params_header(&ps->reply, ps->incarnation, (uint64_t)version);
  pserver_sync_write_members(ps, &ps->reply);
  wire_writer_dtype(&ps->reply, ps->job.wire_dtype);
  size_t floats = 0;
  for (size_t i = 0; i < count; i++) {
    const shard_block *b = &t->map.blocks[ids[i]];
    wire_writer_block_bytes(&ps->reply, b->id, source + b->shard_offset * size, b->count * size,
                            lease);
    floats += b->count;
  }
  if (wire_writer_check(&ps->reply, &err) != PS_ERR_OK) {
    rpc_call_reply(call, err.code, err.msg, NULL, 0);
    return;
  }
  ps->stats_out += floats * size;
  rpc_call_reply(call, PS_ERR_OK, NULL, ps->reply.parts, ps->reply.part_count);
}

/* A push of a step already applied: answered with its blocks' parameters. */
static void dense_reply_behind(pserver *ps, rpc_call *call, const wire_blocks_msg *m) {
  uint32_t ids[64];
  uint32_t *list = m->block_count <= 64 ? ids : malloc(m->block_count * sizeof *list);
  if (list == NULL) {
    pserver_refuse(call, "PushPull", PS_ERR_NO_MEMORY, "pserver: out of memory for a reply");
    return;
  }
  sync_dense *pp = dense_of(ps);
  memset(pp->mark, 0, pp->blocks);
  for (size_t i = 0; i < m->block_count; i++) {
    list[i] = m->blocks[i].id;
    pp->mark[list[i]] = 1;
  }
  reply_blocks(ps, call, list, m->block_count, ps->updates, snapshot_marked(ps));
  if (list != ids) free(list);
}

/* --- held calls -------------------------------------------------------------------- */

/* Removes held call i, keeping the others in arrival order (their pool
 * ids ascend with it, which compact() relies on); its ids are reclaimed by
 * compact(). */
static void remove_call(sync_dense *pp, size_t i) {
  memmove(&pp->calls[i], &pp->calls[i + 1], (pp->call_count - i - 1) * sizeof *pp->calls);
  pp->call_count--;
}

/* Packs the pool to the ids of the calls still held. */
static void compact(sync_dense *pp) {
  size_t used = 0;
  for (size_t i = 0; i < pp->call_count; i++) {
    parts_call *c = &pp->calls[i];
    memmove(pp->pool + used, pp->pool + c->first, c->count * sizeof *pp->pool);
    c->first = used;
    used += c->count;
  }
  pp->pool_count = used;
}

/* Room for one more held call of count ids; 0 (nothing changed) when the
 * pool would pass its bound or memory runs out. */
static int reserve(sync_dense *pp, size_t count) {
  compact(pp);
  if (pp->pool_count + count > pp->pool_max) return 0;
  if (pp->pool_count + count > pp->pool_cap) {
    size_t cap = (pp->pool_count + count) * 2;
    if (cap > pp->pool_max) cap = pp->pool_max;
    uint32_t *grown = realloc(pp->pool, cap * sizeof *grown);
    if (grown == NULL) return 0;
    pp->pool = grown;
    pp->pool_cap = cap;
  }
  if (pp->call_count == pp->call_cap) {
    size_t cap = pp->call_cap > 0 ? pp->call_cap * 2 : 16;
    parts_call *grown = realloc(pp->calls, cap * sizeof *grown);
    if (grown == NULL) return 0;
    pp->calls = grown;
    pp->call_cap = cap;
  }
  return 1;
}

/* Whether held call c's ids all lie in the message's blocks (seen marks). */
static int covered_by(const sync_dense *pp, const parts_call *c, const unsigned char *seen) {
  for (size_t k = 0; k < c->count; k++) {
    if (!seen[pp->pool[c->first + k]]) return 0;
  }
  return 1;
}

/* --- the step ---------------------------------------------------------------------- */

/* The active trainers in id order (the sum's order); returns their count. */
static int active_slots(const pserver *ps, int *slots) {
  int count = 0;
  for (int i = 0; i < ps->cfg.trainers; i++) {
    if (sync_in_step(ps, i)) slots[count++] = i;
  }
  return count;
}

/* Forgets what was delivered and applied of the step. */
static void reset_step(pserver *ps) {
  sync_dense *pp = dense_of(ps);
  memset(pp->delivered, 0, (size_t)ps->cfg.trainers * pp->blocks);
  memset(pp->delivered_count, 0, (size_t)ps->cfg.trainers * sizeof *pp->delivered_count);
  memset(pp->applied, 0, pp->blocks);
  pp->applied_count = 0;
  pp->started = 0;
  for (int i = 0; i < ps->cfg.trainers; i++) ps->trainers[i].pushed = 0;
  ps->pushed_count = 0;
}

/* Resets the step's bookkeeping once every block is applied. */
static void finish_step(pserver *ps, const int *slots, int count) {
  reset_step(ps);
  ps->updates++;
  sync_step_begun(ps);
  ps->step_torn = 0;
  pserver_after_step(ps, slots, count);
}

/* Applies and answers what every active trainer has delivered (after drops). */
static void dense_try_apply(pserver *ps) {
  sync_dense *pp = dense_of(ps);
  if (pp == NULL || !pp->started) return;
  int *slots = ps->step_slots;
  int count = active_slots(ps, slots);
  if (count == 0) return;
  const dense_shard *t = &ps->store.dense;
  long step = ps->updates;
  optimizer_config opt;
  long at = store_optimizer_at(ps, sync_schedule_step(ps), &opt);
  double t0 = now_s();
  size_t newly = 0;
  /* Apply every block each active trainer has delivered, in runs of
   * consecutive blocks (one range each: shard offsets ascend with ids). */
  size_t run_start = 0, run_floats = 0;
  for (size_t b = 0; b <= pp->blocks; b++) {
    int ready = b < pp->blocks && t->map.blocks[b].pserver == ps->cfg.id && !pp->applied[b];
    for (int s = 0; s < count && ready; s++) {
      ready = pp->delivered[(size_t)slots[s] * pp->blocks + b];
    }
    if (ready && run_floats > 0 && t->map.blocks[b].shard_offset != run_start + run_floats) {
      dense_shard_apply_range(&ps->store.dense, &opt, slots, count, 1.0f / (float)count, at,
                              run_start, run_floats);
      run_floats = 0;
    }
    if (ready) {
      if (run_floats == 0) run_start = t->map.blocks[b].shard_offset;
      run_floats += t->map.blocks[b].count;
      pp->applied[b] = 1;
      newly++;
    } else if (run_floats > 0) {
      dense_shard_apply_range(&ps->store.dense, &opt, slots, count, 1.0f / (float)count, at,
                              run_start, run_floats);
      run_floats = 0;
    }
  }
  if (newly > 0) {
    pp->applied_count += newly;
    if (pp->applied_count == pp->mine) sync_step_replying(ps, count);
    t0 = timeline_span(ps->cfg.timeline, "apply", step, t0);
  }
  /* Even with nothing new applied: a resent part of applied blocks. */
  /* Answer every held call whose blocks are all applied, from one snapshot. */
  memset(pp->mark, 0, pp->blocks);
  int answerable = 0;
  for (size_t i = 0; i < pp->call_count; i++) {
    parts_call *c = &pp->calls[i];
    int all = 1;
    for (size_t k = 0; k < c->count && all; k++) all = pp->applied[pp->pool[c->first + k]];
    if (!all) continue;
    for (size_t k = 0; k < c->count; k++) pp->mark[pp->pool[c->first + k]] = 1;
    answerable = 1;
  }
  params_snapshot *snap = answerable ? snapshot_marked(ps) : NULL;
  for (size_t i = 0; i < pp->call_count;) {
    parts_call *c = &pp->calls[i];
    int all = 1;
    for (size_t k = 0; k < c->count && all; k++) all = pp->applied[pp->pool[c->first + k]];
    if (!all) {
      i++;
      continue;
    }
    reply_blocks(ps, c->call, pp->pool + c->first, c->count, step + 1, snap);
    remove_call(pp, i);
  }
  if (answerable) timeline_span(ps->cfg.timeline, "reply", step, t0);
  if (pp->applied_count == pp->mine) finish_step(ps, slots, count);
}

/* A checked push of the current step carrying any of the trainer's blocks
 * (each once): stored, held, and whatever it completes applied and answered. */
static void dense_push(pserver *ps, rpc_call *call, const rpc_message *msg,
                       const wire_blocks_msg *m) {
  sync_dense *pp = dense_of(ps);
  uint32_t id = m->key.trainer_id;
  trainer_state *tr = &ps->trainers[id];
  double arrived = now_s();
  if (!reserve(pp, m->block_count)) {
    pserver_refuse(call, "PushPull", PS_ERR_RESOURCE_EXHAUSTED,
                   "trainer %u holds too many pushes of step %ld waiting (resends of "
                   "overlapping parts)", id, ps->updates);
    return;
  }
  /* Blocks it delivered already this step are resends: the data is the same. */
  unsigned char *mine = pp->delivered + (size_t)id * pp->blocks;
  float *slot = dense_shard_slot(&ps->store.dense, (int)id);
  memset(pp->mark, 0, pp->blocks);
  for (size_t i = 0; i < m->block_count; i++) {
    uint32_t b = m->blocks[i].id;
    pp->mark[b] = 1;
    if (mine[b]) continue;
    wire_decode_block(msg, &m->blocks[i], ps->job.wire_dtype,
                      slot + ps->store.dense.map.blocks[b].shard_offset);
    mine[b] = 1;
    pp->delivered_count[id]++;
  }
  /* Its held calls this one covers are superseded: this one answers for them. */
  for (size_t i = 0; i < pp->call_count;) {
    parts_call *c = &pp->calls[i];
    if (c->trainer == (int)id && covered_by(pp, c, pp->mark)) {
      rpc_call_reply(c->call, PS_ERR_ABORTED, "superseded by a resend of the same blocks", NULL,
                     0);
      remove_call(pp, i);
    } else {
      i++;
    }
  }
  compact(pp);
  parts_call *c = &pp->calls[pp->call_count++];
  *c = (parts_call){call, (int)id, pp->pool_count, m->block_count};
  for (size_t i = 0; i < m->block_count; i++) pp->pool[pp->pool_count++] = m->blocks[i].id;
  long step = ps->updates;
  double stored = timeline_span_arg(ps->cfg.timeline, "push", step, arrived, "trainer", id);
  if (!pp->started) {
    pp->started = 1;
    ps->step_started = stored;
  }
  if (!tr->pushed && pp->delivered_count[id] == pp->mine) {
    tr->pushed = 1;
    if (++ps->pushed_count == ps->active) {
      double last = timeline_span_arg(ps->cfg.timeline, "wait-for-last", step, ps->step_started,
                                      "trainer", id);
      pserver_straggler_note(ps, (int)id, last);
      pserver_metrics_sync_wait(ps->cfg.metrics, last - ps->step_started, id);
    }
  }
  dense_try_apply(ps);
}

/* Answers the held pushes of trainer (-1: all, and the step starts over)
 * with code; one trainer's unapplied blocks are forgotten. */
static void dense_drop(pserver *ps, int trainer, ps_err code, const char *why) {
  sync_dense *pp = dense_of(ps);
  if (pp == NULL) return;
  for (size_t i = 0; i < pp->call_count;) {
    parts_call *c = &pp->calls[i];
    if (trainer >= 0 && c->trainer != trainer) {
      i++;
      continue;
    }
    rpc_call_reply(c->call, code, why, NULL, 0);
    remove_call(pp, i);
  }
  compact(pp);
  if (trainer < 0) {
    /* Everything waiting is answered: the step starts over (a rollback
     * reloads what was applied of it; a stop ends it, and the blocks already
     * applied must not reach a checkpoint labelled with the step before). */
    if (pp->applied_count > 0) ps->step_torn = 1;
    reset_step(ps);
    return;
  }
  /* One trainer (registered again, or dropped): what it delivered and is not
   * applied yet is forgotten, so it pushes those blocks again. */
  unsigned char *mine = pp->delivered + (size_t)trainer * pp->blocks;
  for (size_t b = 0; b < pp->blocks; b++) {
    if (mine[b] && !pp->applied[b]) {
      mine[b] = 0;
      pp->delivered_count[trainer]--;
    }
  }
  if (ps->trainers[trainer].pushed) {
    ps->trainers[trainer].pushed = 0;
    ps->pushed_count--;
  }
  /* The step's clock runs while something of it is held. */
  pp->started = pp->applied_count > 0;
  for (int i = 0; i < ps->cfg.trainers && !pp->started; i++) {
    pp->started = pp->delivered_count[i] > 0;
  }
}

const sync_step_ops sync_step_dense = {
    .parts = 1,
    .configure = dense_configure,
    .free = dense_free,
    .push = dense_push,
    .reply_behind = dense_reply_behind,
    .drop = dense_drop,
    .try_complete = dense_try_apply,
    .started = dense_started,
};
