/* The sparse tables' side of the pserver's requests (CTR jobs): checks of
 * the SparseRows a push or pull carries, the sync step's merge (union of the
 * trainers' keys in trainer-id order, gradients and counts summed in that
 * order, one push and one pull per table), the async and geo paths and the
 * pull kinds (the sync pull barrier is the sync mode's). Lock held
 * throughout; every reply's rows are
 * copied by the RPC layer (lease NULL), so the scratch is reused at once. */
#define _POSIX_C_SOURCE 200809L
#include "server/store/rows.h"

#include "server/pserver_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/shard_map.h"

/* --- memory ------------------------------------------------------------------ */

/* Grows *p to hold n elements of size elem (kept when large enough). */
static int grow(void *p, size_t *cap, size_t n, size_t elem) {
  if (n <= *cap && *(void **)p != NULL) return 1;
  size_t want = n > 16 ? n : 16;
  if (!grow_array(p, want, elem)) return 0;
  *cap = want;
  return 1;
}

static int rows_reserve(sparse_rows *r, size_t n, size_t values) {
  size_t keys_cap = r->keys_cap, counts_cap = r->keys_cap;
  if (!grow(&r->keys, &keys_cap, n, sizeof *r->keys) ||
      !grow(&r->counts, &counts_cap, n, sizeof *r->counts)) {
    return 0;
  }
  r->keys_cap = keys_cap < counts_cap ? keys_cap : counts_cap;
  return grow(&r->values, &r->values_cap, values, sizeof *r->values);
}

void sparse_rows_free(sparse_rows *r) {
  free(r->keys);
  free(r->values);
  free(r->counts);
  memset(r, 0, sizeof *r);
}

static int dim_of(const pserver *ps, int t) {
  return sparse_table_config_of(ps->store.tables[t])->dim;
}

ps_err store_rows_configure(pserver *ps, ps_error *err) {
  if (ps->store.table_count == 0) return PS_ERR_OK;
  size_t n = (size_t)ps->cfg.trainers;
  store_rows *sp = calloc(1, sizeof *sp);
  if (sp != NULL) {
    sp->trainers = calloc(n, sizeof *sp->trainers);
    sp->which = calloc(n, sizeof *sp->which);
    sp->rowp = calloc(n, sizeof *sp->rowp);
  }
  if (sp == NULL || sp->trainers == NULL || sp->which == NULL || sp->rowp == NULL) {
    if (sp != NULL) {
      free(sp->trainers);
      free(sp->which);
      free(sp->rowp);
    }
    free(sp);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory for the sparse state");
  }
  sparse_dedup_init(&sp->dedup);
  sp->max_keys = (size_t)ps->job.batch * CRITEO_CAT_FIELDS * /* geo: the rows of K steps */
                 (ps->job.geo_steps > 0 ? (size_t)ps->job.geo_steps : 1);
  ps->store.rows = sp;
  return PS_ERR_OK;
}

void store_rows_deconfigure(pserver *ps) {
  store_rows *sp = ps->store.rows;
  if (sp == NULL) return;
  for (int i = 0; i < ps->cfg.trainers; i++) {
    for (int t = 0; t < CTR_TABLES_MAX; t++) {
      sparse_rows_free(&sp->trainers[i].grads[t]);
      sparse_rows_free(&sp->trainers[i].next[t]);
      sparse_rows_free(&sp->trainers[i].pull[t]);
    }
  }
  for (int f = 0; f < SPARSE_FIELDS; f++) {
    for (int t = 0; t < CTR_TABLES_MAX; t++) sparse_rows_free(&sp->req[f][t]);
  }
  for (int t = 0; t < CTR_TABLES_MAX; t++) {
    free(sp->rows[t]);
    free(sp->out[t]);
  }
  sparse_dedup_free(&sp->dedup);
  free(sp->all);
  free(sp->slot);
  free(sp->counts);
  free(sp->sums);
  free(sp->trainers);
  free(sp->which);
  free(sp->rowp);
  free(sp);
  ps->store.rows = NULL;
}

/* --- checks ------------------------------------------------------------------- */

size_t store_rows_pull_limit(const pserver *ps) {
  size_t small = 64 * 1024;
  if (!ps->configured || ps->store.rows == NULL) return small;
  /* keys (8 bytes) and counts (4) of a batch's keys per table, plus headers */
  return small + (size_t)ps->store.table_count * (ps->store.rows->max_keys * 12 + 64);
}

/* Checks one SparseRows and copies it to its req slot; refusal text in why. */
static ps_err check_rows(pserver *ps, const rpc_message *msg, const wire_sparse_ref *ref,
                         int field, int counts_optional, char *why, size_t len) {
  store_rows *sp = ps->store.rows;
  const char *name = sparse_table_config_of(ps->store.tables[ref->table])->name;
  const char *what = field == SPARSE_FIELD_GRADS ? "sparse_grads" : "sparse_keys";
  size_t n = ref->keys.len / 8, dim = (size_t)dim_of(ps, (int)ref->table);
  if (ref->keys.len % 8 != 0) {
    snprintf(why, len, "%s of table %s: %zu bytes of keys, not a multiple of 8", what, name,
             ref->keys.len);
    return PS_ERR_INVALID_ARGUMENT;
  }
  if (n > sp->max_keys) {
    snprintf(why, len, "%s of table %s: %zu keys, more than a batch of %ld can hold (%zu)", what,
             name, n, ps->job.batch, sp->max_keys);
    return PS_ERR_INVALID_ARGUMENT;
  }
  int has_counts = 0;
  if (field == SPARSE_FIELD_GRADS && ref->values.len != n * dim * 4) {
    snprintf(why, len, "sparse_grads of table %s: %zu bytes of values for %zu keys of %zu floats",
             name, ref->values.len, n, dim);
    return PS_ERR_INVALID_ARGUMENT;
  }
  if (field == SPARSE_FIELD_KEYS) {
    has_counts = ref->counts.len > 0 || !counts_optional;
    if (has_counts && ref->counts.len != n * 4) {
      snprintf(why, len, "sparse_keys of table %s: %zu bytes of counts for %zu keys", name,
               ref->counts.len, n);
      return PS_ERR_INVALID_ARGUMENT;
    }
  }
  sparse_rows *r = &sp->req[field][ref->table];
  size_t values = field == SPARSE_FIELD_GRADS ? n * dim : 0;
  /* slot only grows here: all_cap stays the bound all three arrays hold */
  size_t slot_cap = sp->all_cap;
  if (!rows_reserve(r, n, values) || !grow(&sp->slot, &slot_cap, n, sizeof *sp->slot)) {
    snprintf(why, len, "out of memory for %zu keys of table %s", n, name);
    return PS_ERR_NO_MEMORY;
  }
  /* keys and counts arrive unaligned, maybe split over segments: copy first */
  wire_copy_block(msg, &ref->keys, r->keys);
  if (values > 0) wire_copy_block(msg, &ref->values, r->values);
  if (has_counts) wire_copy_block(msg, &ref->counts, r->counts);
  else if (field == SPARSE_FIELD_KEYS) for (size_t i = 0; i < n; i++) r->counts[i] = 1;
  r->n = n;
  for (size_t i = 0; i < n; i++) {
    if (has_counts && !counts_optional && r->counts[i] == 0) {
      snprintf(why, len, "%s of table %s: key %llu has a count of 0", what, name,
               (unsigned long long)r->keys[i]);
      return PS_ERR_INVALID_ARGUMENT;
    }
    if (shard_of_key(r->keys[i], ps->cfg.pservers) != ps->cfg.id) {
      snprintf(why, len, "%s of table %s: key %llu belongs to pserver %d, not %d", what, name,
               (unsigned long long)r->keys[i], shard_of_key(r->keys[i], ps->cfg.pservers),
               ps->cfg.id);
      return PS_ERR_INVALID_ARGUMENT;
    }
  }
  ps_error err;
  if (sparse_dedup_run(&sp->dedup, r->keys, n, sp->slot, &err) != PS_ERR_OK) {
    snprintf(why, len, "checking %s of table %s: %.200s", what, name, err.msg);
    return err.code;
  }
  if (sp->dedup.n_unique != n) {
    for (size_t i = 0; i < n; i++) {
      if (sp->slot[i] != i) {
        snprintf(why, len, "%s of table %s: key %llu appears twice", what, name,
                 (unsigned long long)r->keys[i]);
        break;
      }
    }
    return PS_ERR_INVALID_ARGUMENT;
  }
  return PS_ERR_OK;
}

ps_err store_rows_check(pserver *ps, rpc_call *call, const char *method,
                            const rpc_message *msg, const wire_blocks_msg *m, int pull) {
  store_rows *sp = ps->store.rows;
  if (m->sparse_count > 0 && sp == NULL) {
    pserver_refuse(call, method, PS_ERR_INVALID_ARGUMENT,
                   "sparse rows sent to a job without sparse tables (an MLP model)");
    return PS_ERR_INVALID_ARGUMENT;
  }
  if (sp == NULL) return PS_ERR_OK;
  int seen[SPARSE_FIELDS][CTR_TABLES_MAX] = {{0}};
  for (int f = 0; f < SPARSE_FIELDS; f++) {
    sp->req_present[f] = 0;
    for (int t = 0; t < CTR_TABLES_MAX; t++) sp->req[f][t].n = 0;
  }
  char why[400];
  for (size_t i = 0; i < m->sparse_count; i++) {
    const wire_sparse_ref *ref = &m->sparse[i];
    int f = ref->field == WIRE_SPARSE_GRADS ? SPARSE_FIELD_GRADS : SPARSE_FIELD_KEYS;
    ps_err rc = PS_ERR_INVALID_ARGUMENT;
    if (pull && f == SPARSE_FIELD_GRADS) {
      snprintf(why, sizeof why, "a Pull carries no sparse_grads");
    } else if (ref->table >= (uint32_t)ps->store.table_count) {
      snprintf(why, sizeof why, "table %u: the job has %d sparse table(s)", ref->table,
               ps->store.table_count);
    } else if (seen[f][ref->table]) {
      snprintf(why, sizeof why, "table %s appears twice in %s",
               sparse_table_config_of(ps->store.tables[ref->table])->name,
               f == SPARSE_FIELD_GRADS ? "sparse_grads" : "sparse_keys");
    } else {
      rc = check_rows(ps, msg, ref, f, pull && m->kind == PSTRAIN__PULL_KIND__PULL_LOOKUP, why,
                      sizeof why);
    }
    if (rc != PS_ERR_OK) {
      pserver_refuse(call, method, rc, "%s", why);
      return rc;
    }
    seen[f][ref->table] = 1;
    sp->req_present[f] = 1;
  }
  for (int f = 0; f < SPARSE_FIELDS; f++) {
    for (int t = 0; t < ps->store.table_count && sp->req_present[f]; t++) {
      if (seen[f][t]) continue;
      pserver_refuse(call, method, PS_ERR_INVALID_ARGUMENT,
                     "%s without table %s: every table comes, with or without keys",
                     f == SPARSE_FIELD_GRADS ? "sparse_grads" : "sparse_keys",
                     sparse_table_config_of(ps->store.tables[t])->name);
      return PS_ERR_INVALID_ARGUMENT;
    }
  }
  return PS_ERR_OK;
}

/* --- merging the trainers' rows ------------------------------------------------ */

/* The union of rows[0..count) (in that order) into sp->dedup.unique, each
 * key's slot in it in sp->slot; counts summed into sp->counts and values
 * (dim each) summed into sp->sums when asked. */
static ps_err merge(store_rows *sp, sparse_rows *const *rows, int count, int dim,
                    int sum_counts, int sum_values, ps_error *err) {
  size_t total = 0;
  for (int i = 0; i < count; i++) total += rows[i]->n;
  size_t slot_cap = sp->all_cap, counts_cap = sp->all_cap, all_cap = sp->all_cap;
  if (!grow(&sp->all, &all_cap, total, sizeof *sp->all) ||
      !grow(&sp->slot, &slot_cap, total, sizeof *sp->slot) ||
      !grow(&sp->counts, &counts_cap, total, sizeof *sp->counts) ||
      (sum_values && !grow(&sp->sums, &sp->sums_cap, total * (size_t)dim, sizeof *sp->sums))) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory merging %zu keys", total);
  }
  size_t cap = all_cap < slot_cap ? all_cap : slot_cap;
  sp->all_cap = cap < counts_cap ? cap : counts_cap;
  for (size_t i = 0, at = 0; i < (size_t)count; at += rows[i]->n, i++) {
    memcpy(sp->all + at, rows[i]->keys, rows[i]->n * sizeof *sp->all);
  }
  if (sparse_dedup_run(&sp->dedup, sp->all, total, sp->slot, err) != PS_ERR_OK) return err->code;
  size_t u = sp->dedup.n_unique;
  if (sum_counts) memset(sp->counts, 0, u * sizeof *sp->counts);
  if (sum_values) memset(sp->sums, 0, u * (size_t)dim * sizeof *sp->sums);
  for (size_t i = 0, at = 0; i < (size_t)count; at += rows[i]->n, i++) {
    for (size_t k = 0; k < rows[i]->n; k++) {
      size_t s = sp->slot[at + k];
      if (sum_counts) {
        uint64_t c = (uint64_t)sp->counts[s] + rows[i]->counts[k];
        sp->counts[s] = c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
      }
      if (sum_values) {
        float *dst = sp->sums + s * (size_t)dim;
        const float *src = rows[i]->values + k * (size_t)dim;
        for (int j = 0; j < dim; j++) dst[j] += src[j];
      }
    }
  }
  return PS_ERR_OK;
}

/* Pulls the union of rows[0..count) with summed counts at step into
 * sp->rows[table] (union order); sp->slot maps each trainer's keys. */
static ps_err merged_pull(pserver *ps, int t, sparse_rows *const *rows, int count, long step,
                          ps_error *err) {
  store_rows *sp = ps->store.rows;
  int dim = dim_of(ps, t);
  if (merge(sp, rows, count, dim, 1, 0, err) != PS_ERR_OK) return err->code;
  size_t u = sp->dedup.n_unique;
  if (!grow(&sp->rows[t], &sp->rows_cap[t], u * (size_t)dim, sizeof(float))) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory for %zu rows", u);
  }
  sp->merged[t] = u;
  return sparse_table_pull(ps->store.tables[t], sp->dedup.unique, u, sp->counts, step, sp->rows[t],
                           err);
}

ps_err store_rows_apply_step(pserver *ps, const int *slots, int count, ps_error *err) {
  store_rows *sp = ps->store.rows;
  sparse_rows **rows = sp->rowp;
  for (int t = 0; t < ps->store.table_count; t++) {
    int dim = dim_of(ps, t);
    for (int i = 0; i < count; i++) rows[i] = &sp->trainers[slots[i]].grads[t];
    if (merge(sp, rows, count, dim, 0, 1, err) != PS_ERR_OK) return err->code;
    size_t n = sp->dedup.n_unique * (size_t)dim;
    float scale = 1.0f / (float)count;
    for (size_t j = 0; j < n; j++) sp->sums[j] *= scale;
    if (sparse_table_push(ps->store.tables[t], sp->dedup.unique, sp->dedup.n_unique, sp->sums,
                          ps->updates, err) != PS_ERR_OK) {
      return err->code;
    }
  }
  return PS_ERR_OK;
}

/* Eviction as local training does it after step `done` - 1. */
static void maybe_evict(pserver *ps, long done) {
  long after = ps->job.sparse.evict_after, every = after / 4 > 0 ? after / 4 : 1;
  if (after <= 0 || done % every != 0) return;
  for (int t = 0; t < ps->store.table_count; t++) sparse_table_evict(ps->store.tables[t], done);
}

/* --- replies -------------------------------------------------------------------- */

/* Where each reply's rows come from: trainer i's keys (of rows[i][table])
 * index the last merged pull of that table through slots from `offset`. */
typedef struct merged_reply {
  store_rows_which *rows;
} merged_reply;

static const float no_rows[1];

/* Gathers trainer `index`'s rows out of each table's merged pull. */
static void add_merged_rows(pserver *ps, int index, wire_writer *w, void *ctx) {
  store_rows *sp = ps->store.rows;
  merged_reply *mr = ctx;
  for (int t = 0; t < ps->store.table_count; t++) {
    const sparse_rows *r = mr->rows[index][t];
    size_t dim = (size_t)dim_of(ps, t);
    if (r->n > 0 && !grow(&sp->out[t], &sp->out_cap[t], r->n * dim, sizeof(float))) {
      w->status = PS_ERR_NO_MEMORY;
      w->refused = "out of memory for a reply's rows";
      return;
    }
    float *out = sp->out[t];
    for (size_t k = 0; k < r->n; k++) {
      memcpy(out + k * dim, sp->rows[t] + (size_t)r->counts[k] * dim, dim * sizeof(float));
    }
    wire_writer_sparse(w, WIRE_SPARSE_ROWS, (uint32_t)t, NULL, 0, r->n > 0 ? out : no_rows,
                       r->n * dim, NULL, NULL);
    ps->stats_out += r->n * dim * sizeof(float);
  }
}

/* Replaces each trainer's counts by its keys' slots in the union: the
 * counts were summed already, and replies need only where each row lies. */
static void keep_slots(store_rows *sp, sparse_rows *const *rows, int count) {
  for (size_t i = 0, at = 0; i < (size_t)count; at += rows[i]->n, i++) {
    for (size_t k = 0; k < rows[i]->n; k++) rows[i]->counts[k] = sp->slot[at + k];
  }
}

ps_err store_rows_pull_reply(pserver *ps, store_rows_which *which, rpc_call *const *calls,
                             int count, long step) {
  ps_error err;
  sparse_rows **rows = ps->store.rows->rowp;
  for (int t = 0; t < ps->store.table_count; t++) {
    for (int i = 0; i < count; i++) rows[i] = which[i][t];
    if (merged_pull(ps, t, rows, count, step, &err) != PS_ERR_OK) {
      for (int i = 0; i < count; i++) {
        pserver_refuse(calls[i], "PushPull/Pull", err.code, "%s", err.msg);
      }
      return err.code;
    }
    keep_slots(ps->store.rows, rows, count);
  }
  merged_reply mr = {.rows = which};
  pserver_reply_params_rows(ps, calls, count, add_merged_rows, &mr);
  return PS_ERR_OK;
}

ps_err store_rows_reply_step(pserver *ps, const int *slots, rpc_call *const *calls, int count) {
  maybe_evict(ps, ps->updates);
  store_rows_which *which = ps->store.rows->which;
  for (int i = 0; i < count; i++) {
    for (int t = 0; t < ps->store.table_count; t++) {
      which[i][t] = &ps->store.rows->trainers[slots[i]].next[t];
    }
  }
  return store_rows_pull_reply(ps, which, calls, count, ps->updates);
}

ps_err store_rows_apply_async(pserver *ps, long step, ps_error *err) {
  float scale = 1.0f / (float)ps->cfg.trainers;
  for (int t = 0; t < ps->store.table_count; t++) {
    sparse_rows *r = &ps->store.rows->req[SPARSE_FIELD_GRADS][t];
    size_t n = r->n * (size_t)dim_of(ps, t);
    for (size_t j = 0; j < n; j++) r->values[j] *= scale;
    if (sparse_table_push(ps->store.tables[t], r->keys, r->n, r->values, step, err) != PS_ERR_OK) {
      return err->code;
    }
  }
  return PS_ERR_OK;
}

void store_rows_reply_async(pserver *ps, rpc_call *call) {
  int n = ps->cfg.trainers;
  if (ps->updates % n == 0) maybe_evict(ps, ps->updates / n);
  store_rows_which *which = ps->store.rows->which;
  for (int t = 0; t < ps->store.table_count; t++) {
    which[0][t] = &ps->store.rows->req[SPARSE_FIELD_KEYS][t];
  }
  store_rows_pull_reply(ps, which, &call, 1, ps->updates / n);
}

/* A read-only reply: its call, and the batched lookup of its keys' rows
 * (failed_at: the table whose rows found no memory, -1 none). */
typedef struct lookup_reply {
  rpc_call *call;
  int failed_at;
  store_lookup lookup;
} lookup_reply;

/* Writes the looked-up rows of the checked keys of each table. */
static void add_lookup_rows(pserver *ps, int index, wire_writer *w, void *ctx) {
  (void)index;
  const lookup_reply *lr = ctx;
  store_rows *sp = ps->store.rows;
  if (sp == NULL || !sp->req_present[SPARSE_FIELD_KEYS]) return;
  for (int t = 0; t < ps->store.table_count; t++) {
    const sparse_rows *r = &sp->req[SPARSE_FIELD_KEYS][t];
    size_t dim = (size_t)dim_of(ps, t);
    if (t == lr->failed_at) {
      w->status = PS_ERR_NO_MEMORY;
      w->refused = "out of memory for a reply's rows";
      return;
    }
    wire_writer_sparse(w, WIRE_SPARSE_ROWS, (uint32_t)t, NULL, 0, r->n > 0 ? sp->out[t] : no_rows,
                       r->n * dim, NULL, NULL);
    ps->stats_out += r->n * dim * sizeof(float);
  }
}

static void lookup_done(pserver *ps, store_lookup *l, ps_err rc, void *ctx) {
  (void)l;
  (void)rc; /* in memory, a lookup cannot fail */
  lookup_reply *lr = ctx;
  pserver_reply_params_rows(ps, &lr->call, 1, add_lookup_rows, lr);
}

void store_rows_reply_lookup(pserver *ps, rpc_call *call) {
  store_rows *sp = ps->store.rows;
  /* Completes before submit returns (rows in memory), so the stack will do. */
  lookup_reply lr = {.call = call, .failed_at = -1};
  lr.lookup = (store_lookup){.done = lookup_done, .ctx = &lr};
  for (int t = 0; sp != NULL && sp->req_present[SPARSE_FIELD_KEYS] &&
                  t < ps->store.table_count; t++) {
    const sparse_rows *r = &sp->req[SPARSE_FIELD_KEYS][t];
    size_t dim = (size_t)dim_of(ps, t);
    if (r->n > 0 && !grow(&sp->out[t], &sp->out_cap[t], r->n * dim, sizeof(float))) {
      lr.failed_at = t;
      break;
    }
    lr.lookup.keys[t] = r->keys;
    lr.lookup.n[t] = r->n;
    lr.lookup.rows[t] = sp->out[t];
    lr.lookup.tables = t + 1;
  }
  store_lookup_submit(ps, &lr.lookup);
}

/* Every row with its key, ascending (sparse_table_dump), per table. */
static void add_all_rows(pserver *ps, int index, wire_writer *w, void *ctx) {
  (void)index;
  (void)ctx;
  store_rows *sp = ps->store.rows;
  for (int t = 0; t < ps->store.table_count; t++) {
    sparse_table_stats st;
    sparse_table_stats_get(ps->store.tables[t], &st);
    size_t dim = (size_t)dim_of(ps, t);
    sparse_rows *r = &sp->req[SPARSE_FIELD_KEYS][t];
    ps_error err;
    if (!rows_reserve(r, st.rows, st.rows * dim)) {
      w->status = PS_ERR_NO_MEMORY;
      w->refused = "out of memory for every row of a table";
      return;
    }
    if (sparse_table_dump(ps->store.tables[t], r->keys, r->values, NULL, NULL, &err) != PS_ERR_OK) {
      LOG_ERROR("PULL_ALL: %s", err.msg);
      w->status = err.code;
      w->refused = "dumping a table's rows failed (the pserver's log says why)";
      return;
    }
    r->n = st.rows;
    wire_writer_sparse(w, WIRE_SPARSE_ROWS, (uint32_t)t, r->keys, r->n, r->values, r->n * dim,
                       NULL, NULL);
    ps->stats_out += r->n * (dim * sizeof(float) + sizeof(uint64_t));
  }
}

/* --- pulls and keys -------------------------------------------------------------- */

/* Swaps the checked rows of field of each table into dst (the request's
 * buffers are reused for the next one). */
static void take_rows(store_rows *sp, int field, sparse_rows *dst) {
  for (int t = 0; t < CTR_TABLES_MAX; t++) {
    sparse_rows keep = dst[t];
    dst[t] = sp->req[field][t];
    sp->req[field][t] = keep;
    sp->req[field][t].n = 0;
  }
}

void store_rows_keep_pull(pserver *ps, int id) {
  take_rows(ps->store.rows, SPARSE_FIELD_KEYS, ps->store.rows->trainers[id].pull);
}

ps_err store_rows_reply_pulls(pserver *ps, const int *ids, rpc_call *const *calls, int count,
                              long step) {
  store_rows *sp = ps->store.rows;
  for (int i = 0; i < count; i++) {
    for (int t = 0; t < ps->store.table_count; t++) sp->which[i][t] = &sp->trainers[ids[i]].pull[t];
  }
  return store_rows_pull_reply(ps, sp->which, calls, count, step);
}

/* A PULL_STEP outside the sync barrier: the rows of its keys at once. */
void store_rows_pull_now(pserver *ps, rpc_call *call) {
  store_rows_which *which = ps->store.rows->which;
  for (int t = 0; t < ps->store.table_count; t++) {
    which[0][t] = &ps->store.rows->req[SPARSE_FIELD_KEYS][t];
  }
  store_rows_pull_reply(ps, which, &call, 1, ps->updates / ps->cfg.trainers);
}

void store_rows_pull(pserver *ps, rpc_call *call, const wire_blocks_msg *m) {
  switch (m->kind) {
  case PSTRAIN__PULL_KIND__PULL_STEP:
    if (ps->store.rows != NULL && ps->store.rows->req_present[SPARSE_FIELD_KEYS]) {
      ps->mode->pull_step(ps, call, m);
    } else {
      pserver_reply_params(ps, &call, 1);
    }
    break;
  case PSTRAIN__PULL_KIND__PULL_LOOKUP: store_rows_reply_lookup(ps, call); break;
  case PSTRAIN__PULL_KIND__PULL_ALL:
    if (ps->store.rows == NULL) {
      pserver_reply_params(ps, &call, 1);
      break;
    }
    pserver_reply_params_rows(ps, &call, 1, add_all_rows, NULL);
    /* gRPC copied the reply: the tables' copy is not kept (an export is rare). */
    for (int t = 0; t < ps->store.table_count; t++) {
      sparse_rows_free(&ps->store.rows->req[SPARSE_FIELD_KEYS][t]);
    }
    break;
  default:
    pserver_refuse(call, "Pull", PS_ERR_INVALID_ARGUMENT, "unknown pull kind %u", m->kind);
    break;
  }
}

void store_rows_keep_push(pserver *ps, int id) {
  store_rows *sp = ps->store.rows;
  sparse_trainer *tr = &sp->trainers[id];
  take_rows(sp, SPARSE_FIELD_GRADS, tr->grads);
  take_rows(sp, SPARSE_FIELD_KEYS, tr->next);
}

/* --- geo ------------------------------------------------------------------------- */

ps_err store_rows_add(pserver *ps, float scale, long step, uint64_t *added, ps_error *err) {
  for (int t = 0; t < ps->store.table_count; t++) {
    const sparse_rows *r = &ps->store.rows->req[SPARSE_FIELD_GRADS][t];
    if (sparse_table_add_rows(ps->store.tables[t], r->keys, r->n, r->values, scale, step, err) !=
        PS_ERR_OK) {
      return err->code;
    }
    *added += r->n;
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
    size_t dim = (size_t)dim_of(ps, t);
    if (r->n > 0) sparse_table_lookup(ps->store.tables[t], r->keys, r->n, r->values);
    wire_writer_sparse(w, WIRE_SPARSE_ROWS, (uint32_t)t, NULL, 0, r->n > 0 ? r->values : no_rows,
                       r->n * dim, NULL, NULL);
    ps->stats_out += r->n * dim * sizeof(float);
  }
}

void store_rows_reply_fresh(pserver *ps, rpc_call *call) {
  pserver_reply_params_rows(ps, &call, 1, add_fresh_rows, NULL);
}

/* --- keys parked with a held reply (ssp) ------------------------------------------ */

/* The held push's next keys wait in the trainer's `next` rows, and come
 * back into the request's for the reply (the request then being handled
 * has been answered: its buffers are free). */
static void swap_keys(store_rows *sp, int id) {
  for (int t = 0; t < CTR_TABLES_MAX; t++) {
    sparse_rows keep = sp->trainers[id].next[t];
    sp->trainers[id].next[t] = sp->req[SPARSE_FIELD_KEYS][t];
    sp->req[SPARSE_FIELD_KEYS][t] = keep;
  }
}

int store_rows_park_keys(pserver *ps, int id) {
  int present = ps->store.rows->req_present[SPARSE_FIELD_KEYS];
  swap_keys(ps->store.rows, id);
  return present;
}

void store_rows_unpark_keys(pserver *ps, int id, int present) {
  swap_keys(ps->store.rows, id);
  ps->store.rows->req_present[SPARSE_FIELD_KEYS] = present;
}

void store_rows_forget_keys(pserver *ps) {
  for (int t = 0; t < CTR_TABLES_MAX; t++) ps->store.rows->req[SPARSE_FIELD_KEYS][t].n = 0;
  ps->store.rows->req_present[SPARSE_FIELD_KEYS] = 0;
}
