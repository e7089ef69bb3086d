/* The pserver's job: its store and mode configured, the replies' parameter
 * snapshots, the statistics line and what follows a step. The steps
 * themselves are the modes' (server/mode/). Lock held throughout. */
#define _POSIX_C_SOURCE 200809L
#include "server/pserver_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/tb_events.h"
#include "server/pserver_straggler.h"
#include "server/store/tier.h"

/* --- the job's table ----------------------------------------------------------- */

/* Refuses a job whose shard or push would be larger than this pserver's
 * limits, from the job alone (before allocating anything). */
/* A network's parameters and blocks, from its layout (bounded by net.h's
 * limits, so cheap to build before anything else). */
static ps_err net_size(const job_config *job, double *params, double *blocks, ps_error *err) {
  tensor_layout layout;
  tensor_layout_init(&layout);
  ps_err rc = model_build_layout(&job->model, &layout, err);
  for (int t = 0; rc == PS_ERR_OK && t < layout.count; t++) {
    *params += (double)layout.tensors[t].count;
    *blocks += ceil((double)layout.tensors[t].count / (double)job->block_size);
  }
  tensor_layout_free(&layout);
  return rc;
}

static ps_err check_job_size(const pserver *ps, const job_config *job, int slots, ps_error *err) {
  double params = 0, all_blocks = 0;
  if (job->model.kind == MODEL_NET) PS_TRY(net_size(job, &params, &all_blocks, err));
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
  return PS_ERR_OK;
}

void pserver_deconfigure(pserver *ps) {
  if (ps->mode != NULL && ps->mode->deconfigure != NULL) ps->mode->deconfigure(ps);
  ps->mode = NULL;
  pserver_shards_deconfigure(ps);
  store_free(ps);
  tensor_layout_free(&ps->checkpoint_layout);
  free(ps->refs);
  free(ps->seen);
  ps->refs = NULL;
  ps->seen = NULL;
  ps->refs_cap = 0;
  free(ps->reply_scratch); /* gRPC copied from it: free to go */
  ps->reply_scratch = NULL;
  ps->configured = 0;
}

/* The rest of configure, after the store: scratch and the checkpoint layout. */
static ps_err configure_scratch(pserver *ps, const job_config *job, ps_error *err) {
  long max_blocks = ps->cfg.max_blocks_per_request;
  size_t mine = ps->store.dense.map.shard_blocks[ps->cfg.id];
  if (max_blocks > 0 && mine > (size_t)max_blocks) {
    return ps_error_set(err, PS_ERR_OUT_OF_RANGE,
                        "a push to pserver %d would carry %zu blocks (block size %zu), more than "
                        "--max-blocks-per-request %ld", ps->cfg.id, mine,
                        job->block_size, max_blocks);
  }
  size_t blocks = ps->store.dense.map.block_count;
  ps->refs_cap = blocks + 1;
  ps->refs = malloc(ps->refs_cap * sizeof *ps->refs);
  ps->seen = malloc(blocks > 0 ? blocks : 1);
  if (ps->refs == NULL || ps->seen == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory for %zu blocks", blocks);
  }
  const char *names[3] = {"params", "optimizer.state1", "optimizer.state2"};
  for (int i = 0; i < 3; i++) {
    const tensor_info *src = &ps->store.dense.storage.tensors[i];
    if (tensor_layout_add(&ps->checkpoint_layout, names[i], src->rank, src->shape, err) !=
        PS_ERR_OK) {
      return err->code;
    }
  }
  return PS_ERR_OK;
}

ps_err pserver_configure(pserver *ps, const job_config *job, int trainer, ps_error *err) {
  const pserver_mode_ops *mode = pserver_mode_of(job->update);
  int slots = mode->slots_per_trainer ? job->trainers : 1;
  if (check_job_size(ps, job, slots, err) != PS_ERR_OK) return err->code;
  tensor_layout_init(&ps->checkpoint_layout);
  if (store_init(ps, job, slots, err) != PS_ERR_OK ||
      configure_scratch(ps, job, err) != PS_ERR_OK) {
    pserver_deconfigure(ps);
    return err->code;
  }
  ps->job = *job;
  ps->mode = mode;
  if (store_configure_rows(ps, err) != PS_ERR_OK ||
      (mode->configure != NULL && mode->configure(ps, err) != PS_ERR_OK) ||
      pserver_shards_configure(ps, job, trainer, err) != PS_ERR_OK) {
    pserver_deconfigure(ps);
    return err->code;
  }
  ps->job_hash = job_config_hash(job);
  ps->configured = 1;
  ps->configured_by = trainer;
  char text[1024];
  job_config_format(job, text, sizeof text);
  LOG_INFO("job from %s %d: %s; this pserver holds %zu of %zu blocks, %zu floats (%.1f MB)",
           trainer >= 0 ? "trainer" : "checkpoint", trainer, text,
           ps->store.dense.map.shard_blocks[ps->cfg.id], ps->store.dense.map.block_count,
           ps->store.dense.n,
           (double)ps->store.dense.n * 4 / 1e6);
  /* A sync step receives every trainer's push at once (dense blocks; rows on top). */
  double step_bytes = (double)ps->cfg.trainers * (double)ps->store.dense.n *
                      (double)wire_dtype_size(job->wire_dtype);
  if (ps->cfg.max_receive_bytes > 0 && step_bytes > (double)ps->cfg.max_receive_bytes) {
    LOG_WARN("a step's pushes to this pserver (%d trainer(s) x %.1f MB) exceed --max-receive-mb "
             "%zu: gRPC would reset some of them (RESOURCE_EXHAUSTED); raise it",
             ps->cfg.trainers, step_bytes / ps->cfg.trainers / 1e6,
             ps->cfg.max_receive_bytes >> 20);
  }
  return PS_ERR_OK;
}

/* --- replies ------------------------------------------------------------------- */

/* A snapshot no reply is sending from any more, filled with the current
 * parameters in the job's wire dtype; NULL when all are busy (the caller
 * then lets gRPC copy). */
static params_snapshot *take_snapshot(pserver *ps) {
  size_t n = ps->store.dense.n;
  for (int i = 0; i < PSERVER_SNAPSHOTS; i++) {
    params_snapshot *snap = &ps->snapshots[i];
    if (atomic_load(&snap->lease.refs) != 0) continue;
    if (snap->data == NULL && (snap->data = malloc((n > 0 ? n : 1) * sizeof(float))) == NULL) {
      return NULL;
    }
    wire_dtype_encode(ps->job.wire_dtype, ps->store.dense.params, snap->data, n);
    return snap;
  }
  return NULL;
}

/* Where a reply without a snapshot sends from, gRPC copying: the table, or
 * for a 16-bit wire dtype its conversion in ps->reply_scratch (NULL: out of
 * memory). */
const void *pserver_reply_source_unleased(pserver *ps) {
  size_t n = ps->store.dense.n;
  if (ps->job.wire_dtype == WIRE_DTYPE_F32) return ps->store.dense.params;
  if (ps->reply_scratch == NULL &&
      (ps->reply_scratch = malloc((n > 0 ? n : 1) * sizeof(float))) == NULL) {
    return NULL;
  }
  wire_dtype_encode(ps->job.wire_dtype, ps->store.dense.params, ps->reply_scratch, n);
  return ps->reply_scratch;
}

/* Builds the ParamsReply of the whole shard into ps->reply, sending from
 * snap (or, without one, with gRPC copying). */
static ps_err build_params_reply(pserver *ps, params_snapshot *snap, ps_error *err) {
  dense_shard *t = &ps->store.dense;
  if (wire_writer_begin(&ps->reply, t->map.shard_blocks[ps->cfg.id], err) != PS_ERR_OK) {
    return err->code;
  }
  const uint8_t *source = snap != NULL ? (const uint8_t *)snap->data : pserver_reply_source_unleased(ps);
  if (source == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory converting the "
                        "parameters to %s", wire_dtype_name(ps->job.wire_dtype));
  }
  size_t size = wire_dtype_size(ps->job.wire_dtype);
  rpc_lease *lease = snap != NULL ? &snap->lease : NULL;
  wire_writer_params_header(&ps->reply, ps->incarnation, (uint64_t)ps->updates);
  pserver_sync_write_members(ps, &ps->reply);
  wire_writer_dtype(&ps->reply, ps->job.wire_dtype);
  for (size_t i = 0; i < t->map.block_count; i++) {
    const shard_block *b = &t->map.blocks[i];
    if (b->pserver != ps->cfg.id) continue;
    wire_writer_block_bytes(&ps->reply, b->id, source + b->shard_offset * size, b->count * size,
                            lease);
  }
  return wire_writer_check(&ps->reply, err);
}

void pserver_reply_params(pserver *ps, rpc_call *const *calls, int count) {
  pserver_reply_params_rows(ps, calls, count, NULL, NULL);
}

void pserver_reply_params_rows(pserver *ps, rpc_call *const *calls, int count,
                               pserver_rows_fn rows, void *ctx) {
  ps_error err;
  params_snapshot *snap = take_snapshot(ps);
  ps_err rc = build_params_reply(ps, snap, &err);
  for (int i = 0; i < count; i++) {
    if (rows != NULL) {
      /* Each reply its own rows: the blocks again (cheap), then the rows. */
      if (i > 0) rc = build_params_reply(ps, snap, &err);
      if (rc == PS_ERR_OK) {
        rows(ps, i, &ps->reply, ctx);
        rc = wire_writer_check(&ps->reply, &err);
      }
    }
    if (rc != PS_ERR_OK) {
      rpc_call_reply(calls[i], err.code, err.msg, NULL, 0);
      continue;
    }
    ps->stats_out += ps->store.dense.n * wire_dtype_size(ps->job.wire_dtype);
    rpc_call_reply(calls[i], PS_ERR_OK, NULL, ps->reply.parts, ps->reply.part_count);
  }
}

/* --- statistics and checkpoints after a step ------------------------------------ */

/* The statistics line's tables part: per table rows, MiB, bytes/row, ... */
void pserver_log_table_stats(const pserver *ps, long step) {
  for (int t = 0; t < ps->store.table_count; t++) {
    sparse_table_stats st;
    sparse_table_stats_get(ps->store.tables[t], &st);
    LOG_INFO("step %ld: table %s: %zu rows, %.1f MiB (%.1f bytes per row), %llu admitted, "
             "%llu refused, %llu evicted", step, sparse_table_config_of(ps->store.tables[t])->name,
             st.rows, (double)st.bytes / 1048576.0, st.bytes_per_row,
             (unsigned long long)st.admitted, (unsigned long long)st.refused,
             (unsigned long long)st.evicted);
  }
  const sparse_budget *b = ps->cfg.table_budget;
  if (b != NULL && ps->store.table_count > 0 && b->limit != SIZE_MAX) {
    double used = (double)atomic_load(&((sparse_budget *)b)->used);
    LOG_INFO("step %ld: tables: %.1f MiB of their %.1f MiB budget (%.0f%%, %s)", step,
             used / 1048576.0, (double)b->limit / 1048576.0, 100.0 * used / (double)b->limit,
             b->source);
  }
  store_tier_log_stats(ps, step);
}

/* The statistics line's values as one TensorBoard event (--tensorboard).
 * A failed write is logged once; the pserver goes on serving. */
static void tensorboard_stats(pserver *ps, long step, double dt) {
  if (ps->cfg.tensorboard == NULL || ps->tensorboard_failed) return;
  enum { TABLES = 16 };
  tb_scalar v[8 + 2 * TABLES];
  char tags[2 * TABLES][80];
  int n = 0;
  v[n++] = (tb_scalar){"pserver/pushes_per_s", (double)ps->stats_pushes / dt};
  v[n++] = (tb_scalar){"pserver/in_MB_per_s", (double)ps->stats_in / dt / 1e6};
  v[n++] = (tb_scalar){"pserver/out_MB_per_s", (double)ps->stats_out / dt / 1e6};
  if (ps->stats_steps > 0) { /* sync steps completed by a push (pserver_straggler.c) */
    v[n++] = (tb_scalar){"pserver/last_push_wait_ms",
                         ps->stats_wait_s / (double)ps->stats_steps * 1e3};
  }
  for (int t = 0; t < ps->store.table_count && t < TABLES; t++) {
    sparse_table_stats st;
    sparse_table_stats_get(ps->store.tables[t], &st);
    const char *name = sparse_table_config_of(ps->store.tables[t])->name;
    snprintf(tags[2 * t], sizeof tags[0], "tables/%s/rows", name);
    snprintf(tags[2 * t + 1], sizeof tags[0], "tables/%s/MiB", name);
    v[n++] = (tb_scalar){tags[2 * t], (double)st.rows};
    v[n++] = (tb_scalar){tags[2 * t + 1], (double)st.bytes / 1048576.0};
  }
  if (ps->store.tier != NULL) { /* --table-dir: where rows are, and the hit rate so far */
    store_tier_stats ts;
    store_tier_stats_get(ps, &ts);
    v[n++] = (tb_scalar){"tier/rows_in_memory", (double)ts.rows_memory};
    v[n++] = (tb_scalar){"tier/rows_on_disk", (double)ts.rows_disk};
    v[n++] = (tb_scalar){"tier/memory_hit_percent",
                         ts.lookups > 0 ? 100.0 * (double)ts.hits / (double)ts.lookups : 0.0};
    v[n++] = (tb_scalar){"tier/disk_MiB", (double)ts.file_bytes / 1048576.0};
  }
  ps_error err;
  if (tb_writer_write(ps->cfg.tensorboard, step, v, n, &err) != PS_ERR_OK) {
    LOG_ERROR("%s; no more statistics are written there, the pserver goes on", err.msg);
    ps->tensorboard_failed = 1;
  }
}

/* One line per --log-every steps: called once when a step completes, so a
 * step is never logged twice (a second line would cover no time). */
static void log_stats(pserver *ps, long step) {
  if (ps->cfg.log_every <= 0 || step % ps->cfg.log_every != 0 || step == ps->stats_logged) return;
  double now = now_s(), dt = now - ps->stats_since;
  if (dt <= 0) return;
  LOG_INFO("step %ld: %.1f pushes/s, in %.1f MB/s, out %.1f MB/s", step,
           (double)ps->stats_pushes / dt, (double)ps->stats_in / dt / 1e6,
           (double)ps->stats_out / dt / 1e6);
  tensorboard_stats(ps, step, dt);
  ps->stats_logged = step;
  ps->stats_since = now;
  ps->stats_pushes = 0;
  ps->stats_in = ps->stats_out = 0;
  pserver_straggler_log(ps, step);
  char when[32];
  snprintf(when, sizeof when, "step %ld", step);
  if (ps->mode->log != NULL) ps->mode->log(ps, when);
  pserver_log_table_stats(ps, step);
}

/* A checkpoint every cfg.checkpoint_every steps: the state is copied here
 * and written by the disk thread. */
static void maybe_checkpoint(pserver *ps, long step) {
  if (ps->cfg.checkpoint_dir[0] == '\0' || ps->cfg.checkpoint_every <= 0 ||
      step % ps->cfg.checkpoint_every != 0) {
    return;
  }
  pserver_checkpoint_due(ps);
}

void pserver_after_step(pserver *ps, const int *slots, int count) {
  maybe_checkpoint(ps, ps->updates);
  log_stats(ps, ps->updates);
  timeline_flush(ps->cfg.timeline);
  pserver_metrics_after_step(ps->cfg.metrics, ps, slots, count, ps->updates);
}

void pserver_after_async_step(pserver *ps, long step) {
  maybe_checkpoint(ps, step);
  log_stats(ps, step);
  timeline_flush(ps->cfg.timeline);
}

void pserver_after_steps(pserver *ps, long from, long to) {
  long every = ps->cfg.checkpoint_every, log = ps->cfg.log_every;
  if (ps->cfg.checkpoint_dir[0] != '\0' && every > 0 && to / every > from / every) {
    pserver_checkpoint_due(ps);
  }
  if (log > 0 && to / log > from / log) log_stats(ps, to / log * log);
  timeline_flush(ps->cfg.timeline);
}
