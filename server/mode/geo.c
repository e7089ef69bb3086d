/* GEO-SGD (--update geo): trainers step their own optimizer and every K
 * steps push the change of their parameters since their last exchange
 * (PushRequest.deltas; CTR jobs: the rows touched since then). The pserver
 * adds change / N on arrival, with no optimizer of its own, and answers
 * with the fresh values, which become the trainer's next base. The job's
 * step is the trainers' steps merged so far / N, as async counts pushes.
 * Lock held throughout. */
#define _POSIX_C_SOURCE 200809L
#include "server/pserver_internal.h"

#include <stdio.h>

#include "common/clock.h"
#include "common/log.h"

static const float no_rows[1];

ps_err pserver_geo_check(pserver *ps, rpc_call *call, const wire_blocks_msg *m) {
  int geo = ps->job.update == UPDATE_GEO;
  if (m->deltas == geo) return PS_ERR_OK;
  if (geo) {
    pserver_refuse(call, "PushPull", PS_ERR_FAILED_PRECONDITION,
                   "this job's update is geo: a push carries parameter changes (deltas), not "
                   "gradients");
  } else {
    pserver_refuse(call, "PushPull", PS_ERR_FAILED_PRECONDITION,
                   "a push of GEO parameter changes (deltas) to a job whose update is %s",
                   update_mode_name(ps->job.update));
  }
  return PS_ERR_FAILED_PRECONDITION;
}

uint64_t pserver_geo_register_step(pserver *ps, int trainer) {
  /* A trainer that pushed here before goes on from its last exchange; one
   * that has not from where the job stood before any trainer pushed here
   * (0, or a checkpoint's step), not from what the others did since. */
  int n = ps->cfg.trainers, fresh = 1;
  for (int i = 0; i < n; i++) fresh &= ps->trainers[i].last_step < 0;
  if (fresh) ps->geo_base = ps->updates / n;
  long last = ps->trainers[trainer].last_step;
  return (uint64_t)(last >= 0 ? last : ps->geo_base) * (uint64_t)n;
}

/* weights += change * scale, block by block (decoded in the gradient slot). */
static void add_blocks(pserver *ps, const rpc_message *msg, const wire_blocks_msg *m,
                       float scale) {
  float *slot = dense_shard_slot(&ps->store.dense, 0);
  for (size_t i = 0; i < m->block_count; i++) {
    const shard_block *b = &ps->store.dense.map.blocks[m->blocks[i].id];
    float *d = slot + b->shard_offset, *w = ps->store.dense.params + b->shard_offset;
    wire_decode_block(msg, &m->blocks[i], ps->job.wire_dtype, d);
    for (size_t k = 0; k < b->count; k++) w[k] += d[k] * scale;
  }
}

/* The pushed rows' changes * scale into each table (rows created as needed). */
static ps_err add_rows(pserver *ps, float scale, long step, ps_error *err) {
  for (int t = 0; t < ps->store.table_count; t++) {
    const sparse_rows *r = &ps->store.rows->req[SPARSE_FIELD_GRADS][t];
    if (sparse_table_add_rows(ps->store.tables[t], r->keys, r->n, r->values, scale, step, err) !=
        PS_ERR_OK) {
      return err->code;
    }
    ps->geo_rows += r->n;
  }
  return PS_ERR_OK;
}

/* The fresh rows of the pushed keys, in their order: read into the pushed
 * values' buffer, whose changes are applied (or were, for a resend). */
static void add_fresh_rows(pserver *ps, int index, wire_writer *w, void *ctx) {
  (void)index;
  (void)ctx;
  for (int t = 0; t < ps->store.table_count; t++) {
    sparse_rows *r = &ps->store.rows->req[SPARSE_FIELD_GRADS][t];
    size_t dim = (size_t)sparse_table_config_of(ps->store.tables[t])->dim;
    if (r->n > 0) sparse_table_lookup(ps->store.tables[t], r->keys, r->n, r->values);
    wire_writer_sparse(w, WIRE_SPARSE_ROWS, (uint32_t)t, NULL, 0, r->n > 0 ? r->values : no_rows,
                       r->n * dim, NULL, NULL);
    ps->stats_out += r->n * dim * sizeof(float);
  }
}

void pserver_push_geo(pserver *ps, rpc_call *call, const rpc_message *msg,
                      const wire_blocks_msg *m) {
  uint32_t id = m->key.trainer_id;
  trainer_state *tr = &ps->trainers[id];
  long step = (long)m->key.step, n = ps->cfg.trainers;
  if (ps->store.rows != NULL && ps->store.rows->req_present[SPARSE_FIELD_KEYS]) {
    pserver_refuse(call, "PushPull", PS_ERR_INVALID_ARGUMENT,
                   "a geo push carries no sparse_keys: the fresh rows of its sparse_grads' keys "
                   "come back");
    return;
  }
  if (step > tr->last_step) {
    /* The steps this push covers: since its last exchange, at most K. */
    long covered = step - (tr->last_step > 0 ? tr->last_step : 0);
    if (covered > ps->job.geo_steps) covered = ps->job.geo_steps;
    float scale = 1.0f / (float)n;
    double t0 = now_s();
    ps_error err;
    if (ps->store.rows != NULL && add_rows(ps, scale, ps->updates / n, &err) != PS_ERR_OK) {
      pserver_refuse(call, "PushPull", err.code, "%s", err.msg);
      return;
    }
    add_blocks(ps, msg, m, scale);
    timeline_span_arg(ps->cfg.timeline, "apply", ps->updates / n, t0, "trainer", id);
    long from = ps->updates / n;
    ps->updates += covered;
    tr->last_step = step;
    ps->geo_pushes++;
    pserver_metrics_after_step(ps->cfg.metrics, ps, (const int[]){(int)id}, 1, ps->updates / n);
    pserver_after_steps(ps, from, ps->updates / n);
  }
  /* A resend of a push applied before is only answered. */
  if (ps->store.rows != NULL) pserver_reply_params_rows(ps, &call, 1, add_fresh_rows, NULL);
  else pserver_reply_params(ps, &call, 1);
}

void pserver_geo_log(const pserver *ps, const char *when) {
  if (ps->job.update != UPDATE_GEO) return;
  LOG_INFO("%s: geo: %ld pushes merged (--geo-steps %d), %llu rows", when, ps->geo_pushes,
           ps->job.geo_steps, (unsigned long long)ps->geo_rows);
}
