/* The store's operations: where the dense shard and the sparse tables meet,
 * so the update modes call one thing for every model. The only file that
 * asks whether the job has tables (ps->store.rows). */
#include "server/store/store.h"

#include <string.h>

#include "common/clock.h"
#include "server/pserver_internal.h"
#include "server/store/rows.h"
#include "server/store/tier.h"

ps_err store_init(pserver *ps, const job_config *job, int slots, ps_error *err) {
  pserver_store *s = &ps->store;
  if (dense_shard_init(&s->dense, job, ps->cfg.id, slots, err) != PS_ERR_OK) return err->code;
  for (int i = 0; i < ctr_table_count(&job->model); i++) {
    sparse_table_config c;
    ctr_table_config(job, i, ps->cfg.max_table_bytes, &c);
    c.budget = ps->cfg.table_budget;
    if (sparse_table_create(&s->tables[i], &c, err) != PS_ERR_OK) return err->code;
    s->table_count = i + 1;
  }
  return PS_ERR_OK;
}

ps_err store_configure_rows(pserver *ps, ps_error *err) {
  if (store_rows_configure(ps, err) != PS_ERR_OK) return err->code;
  return store_tier_open(ps, err);
}

void store_free(pserver *ps) {
  pserver_store *s = &ps->store;
  store_tier_close(ps);
  store_rows_deconfigure(ps);
  dense_shard_free(&s->dense);
  for (int i = 0; i < s->table_count; i++) sparse_table_destroy(s->tables[i]);
  memset(s->tables, 0, sizeof s->tables);
  s->table_count = 0;
}

ps_err store_check_rows(pserver *ps, rpc_call *call, const char *method, const rpc_message *msg,
                        const wire_blocks_msg *m, int pull) {
  return store_rows_check(ps, call, method, msg, m, pull);
}

size_t store_pull_limit(const pserver *ps) { return store_rows_pull_limit(ps); }

void store_pull(pserver *ps, rpc_call *call, const wire_blocks_msg *m) {
  store_rows_pull(ps, call, m);
}

int store_applies_parts(const pserver_store *s) { return s->rows == NULL; }

/* The push's dense blocks decoded into gradient slot `slot`. */
static void decode_blocks(pserver *ps, int slot, const rpc_message *msg,
                          const wire_blocks_msg *m) {
  dense_shard *d = &ps->store.dense;
  float *g = dense_shard_slot(d, slot);
  for (size_t i = 0; i < m->block_count; i++) {
    const shard_block *b = &d->map.blocks[m->blocks[i].id];
    wire_decode_block(msg, &m->blocks[i], ps->job.wire_dtype, g + b->shard_offset);
  }
}

long store_optimizer_at(const pserver *ps, long schedule, optimizer_config *opt) {
  *opt = ps->job.optimizer;
  if (ps->job.elastic_min == 0) return schedule;
  /* The rate pinned at the schedule's step; Adam's bias correction at the
   * steps made. */
  opt->lr = optimizer_lr_at(&ps->job.optimizer, schedule);
  opt->schedule = LR_CONSTANT;
  return ps->job.update == UPDATE_SYNC ? ps->updates : (long)ps->made_steps;
}

/* --- sync ---------------------------------------------------------------------- */

void store_keep_push(pserver *ps, int trainer, const rpc_message *msg,
                     const wire_blocks_msg *m) {
  if (ps->store.rows != NULL) store_rows_keep_push(ps, trainer);
  decode_blocks(ps, trainer, msg, m);
}

ps_err store_apply_step(pserver *ps, const int *slots, int count, ps_error *err) {
  if (ps->store.rows != NULL && store_rows_apply_step(ps, slots, count, err) != PS_ERR_OK) {
    return err->code;
  }
  /* Sum in trainer-id order, average, apply. */
  optimizer_config opt;
  long step = store_optimizer_at(ps, sync_schedule_step(ps), &opt);
  dense_shard_apply_sum(&ps->store.dense, &opt, slots, count, 1.0f / (float)count, step);
  return PS_ERR_OK;
}

void store_reply_step(pserver *ps, const int *slots, rpc_call *const *calls, int count,
                      store_replied done, void *ctx) {
  if (ps->store.rows != NULL) {
    store_rows_reply_step(ps, slots, calls, count, done, ctx);
    return;
  }
  pserver_reply_params(ps, calls, count);
  done(ps, PS_ERR_OK, ctx);
}

/* --- async and ssp ----------------------------------------------------------------- */

ps_err store_apply_push(pserver *ps, const rpc_message *msg, const wire_blocks_msg *m, int n,
                        long step, ps_error *err) {
  if (ps->store.rows != NULL && store_rows_apply_async(ps, n, step, err) != PS_ERR_OK) {
    return err->code;
  }
  decode_blocks(ps, 0, msg, m);
  const int slot0 = 0;
  optimizer_config opt;
  long at = store_optimizer_at(ps, step, &opt);
  dense_shard_apply_sum(&ps->store.dense, &opt, &slot0, 1, 1.0f / (float)n, at);
  return PS_ERR_OK;
}

void store_reply_push(pserver *ps, rpc_call *call, int applied) {
  if (ps->store.rows != NULL && applied) store_rows_reply_async(ps, call);
  else if (ps->store.rows != NULL) store_rows_reply_lookup(ps, call);
  else pserver_reply_params(ps, &call, 1);
}

void store_pull_now(pserver *ps, rpc_call *call) { store_rows_pull_now(ps, call); }

void store_reply_lookup(pserver *ps, rpc_call *call) { store_rows_reply_lookup(ps, call); }

/* --- geo --------------------------------------------------------------------------- */

ps_err store_add_changes(pserver *ps, const rpc_message *msg, const wire_blocks_msg *m,
                         float scale, long step, uint64_t *rows, ps_error *err) {
  if (ps->store.rows != NULL && store_rows_add(ps, scale, step, rows, err) != PS_ERR_OK) {
    return err->code;
  }
  /* weights += change * scale, block by block (decoded in the gradient slot);
   * a non-trainable tensor's change (one trainer's) is added whole. */
  dense_shard *d = &ps->store.dense;
  float *slot = dense_shard_slot(d, 0);
  for (size_t i = 0; i < m->block_count; i++) {
    const shard_block *b = &d->map.blocks[m->blocks[i].id];
    float *g = slot + b->shard_offset, *w = d->params + b->shard_offset;
    float s = d->layout.tensors[b->tensor].trainable ? scale : 1.0f;
    wire_decode_block(msg, &m->blocks[i], ps->job.wire_dtype, g);
    for (size_t k = 0; k < b->count; k++) w[k] += g[k] * s;
  }
  return PS_ERR_OK;
}

void store_reply_fresh(pserver *ps, rpc_call *call) {
  if (ps->store.rows != NULL) store_rows_reply_fresh(ps, call);
  else pserver_reply_params(ps, &call, 1);
}

/* --- the sync pull barrier ------------------------------------------------------------ */

void store_keep_pull(pserver *ps, int trainer) { store_rows_keep_pull(ps, trainer); }

void store_reply_pulls(pserver *ps, const int *trainers, rpc_call *const *calls, int count,
                       long step, store_replied done, void *ctx) {
  store_rows_reply_pulls(ps, trainers, calls, count, step, done, ctx);
}

/* --- keys of a push -------------------------------------------------------------- */

int store_push_has_keys(const pserver *ps) {
  return ps->store.rows != NULL && ps->store.rows->req_present[SPARSE_FIELD_KEYS];
}

int store_park_keys(pserver *ps, int trainer) {
  return ps->store.rows != NULL ? store_rows_park_keys(ps, trainer) : 0;
}

void store_unpark_keys(pserver *ps, int trainer, int present) {
  if (ps->store.rows != NULL) store_rows_unpark_keys(ps, trainer, present);
}

void store_forget_keys(pserver *ps) {
  if (ps->store.rows != NULL) store_rows_forget_keys(ps);
}

/* --- row lookups ------------------------------------------------------------------- */

void store_lookup_submit(pserver *ps, store_lookup *l) {
  /* Every row is in memory: pull or read now, complete at once. */
  ps_err rc = PS_ERR_OK;
  for (int t = 0; t < l->tables && t < ps->store.table_count && rc == PS_ERR_OK; t++) {
    sparse_table *table = ps->store.tables[t];
    if (l->create) {
      /* An empty pull too: the table's own bookkeeping sees every step. */
      rc = sparse_table_pull(table, l->keys[t], l->n[t], l->counts[t], l->step, l->rows[t],
                             &l->err);
    } else if (l->n[t] > 0) {
      sparse_table_lookup(table, l->keys[t], l->n[t], l->rows[t]);
      store_tier_lookup_rows(ps, t, l->keys[t], l->n[t], l->rows[t]); /* rows not brought in */
    }
  }
  l->done(ps, l, rc, l->ctx);
}
