/* The sparse tables' side of the pserver's requests (CTR jobs): checks of
 * the SparseRows a push or pull carries, the sync step's merge (union of the
 * trainers' keys in trainer-id order, gradients and counts summed in that
 * order, one push per table), the async and geo paths and the pull kinds
 * (the sync pull barrier is the sync mode's). Every row a reply carries is
 * pulled or read in one batched lookup per step (store_lookup_submit),
 * which may complete later. Lock held throughout; every reply's rows are
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
#include "server/store/tier.h"

/* --- memory ------------------------------------------------------------------ */

static void rows_pull_free(struct rows_pull *p);

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
  for (int t = 0; t < CTR_TABLES_MAX; t++) free(sp->out[t]);
  rows_pull_free(sp->spare);
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

/* --- a request's rows kept across passes ----------------------------------------- */

struct store_rows_stash {
  sparse_rows req[SPARSE_FIELDS][CTR_TABLES_MAX];
  int present[SPARSE_FIELDS];
  int full;
};

/* Swaps the request's rows with the stash's (buffers and all: no copy). */
static void swap_stash(store_rows *sp, store_rows_stash *s) {
  for (int f = 0; f < SPARSE_FIELDS; f++) {
    int present = sp->req_present[f];
    sp->req_present[f] = s->present[f];
    s->present[f] = present;
    for (int t = 0; t < CTR_TABLES_MAX; t++) {
      sparse_rows keep = sp->req[f][t];
      sp->req[f][t] = s->req[f][t];
      s->req[f][t] = keep;
    }
  }
}

void store_stash_rows(pserver *ps, store_rows_stash **stash) {
  if (ps->store.rows == NULL) return;
  if (*stash == NULL && (*stash = calloc(1, sizeof **stash)) == NULL) return; /* checked again */
  swap_stash(ps->store.rows, *stash);
  (*stash)->full = 1;
}

int store_unstash_rows(pserver *ps, store_rows_stash *stash) {
  if (stash == NULL || !stash->full || ps->store.rows == NULL) return 0;
  swap_stash(ps->store.rows, stash);
  stash->full = 0;
  return 1;
}

void store_rows_stash_free(store_rows_stash *stash) {
  if (stash == NULL) return;
  for (int f = 0; f < SPARSE_FIELDS; f++) {
    for (int t = 0; t < CTR_TABLES_MAX; t++) sparse_rows_free(&stash->req[f][t]);
  }
  free(stash);
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
    if (rows[i]->n > 0) memcpy(sp->all + at, rows[i]->keys, rows[i]->n * sizeof *sp->all);
  }
  if (sparse_dedup_run(&sp->dedup, sp->all, total, sp->slot, err) != PS_ERR_OK) return err->code;
  size_t u = sp->dedup.n_unique;
  if (sum_counts && u > 0) memset(sp->counts, 0, u * sizeof *sp->counts);
  if (sum_values && u > 0) memset(sp->sums, 0, u * (size_t)dim * sizeof *sp->sums);
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

/* --- batched pulls and reads, and their replies ---------------------------------- */

/* One step's batch of rows on its way from the merge to the replies: per
 * table the union of its calls' keys, their summed counts and rows (the
 * lookup's), and where each call's keys lie in the union. Owned by the
 * store from the merge until the lookup is done, as a later completion
 * needs it intact: the requests' buffers are reused meanwhile. */
typedef struct rows_pull {
  store_lookup lookup;
  uint64_t *keys[CTR_TABLES_MAX];
  uint32_t *counts[CTR_TABLES_MAX];
  float *rows[CTR_TABLES_MAX];   /* (n, dim) */
  uint32_t *at[CTR_TABLES_MAX];  /* every call's keys' rows in the union, calls' order */
  size_t *from[CTR_TABLES_MAX];  /* (count + 1): call i's are at[from[i] .. from[i + 1]) */
  size_t keys_cap[CTR_TABLES_MAX], counts_cap[CTR_TABLES_MAX], rows_cap[CTR_TABLES_MAX];
  size_t at_cap[CTR_TABLES_MAX], from_cap[CTR_TABLES_MAX];
  rpc_call **calls; /* (count) */
  size_t calls_cap;
  int count;
  int tables; /* in each reply: the job's, or 0 for a reply without rows */
  store_replied then;
  void *then_ctx;
} rows_pull;

static void rows_pull_free(rows_pull *p) {
  if (p == NULL) return;
  for (int t = 0; t < CTR_TABLES_MAX; t++) {
    free(p->keys[t]);
    free(p->counts[t]);
    free(p->rows[t]);
    free(p->at[t]);
    free(p->from[t]);
  }
  free(p->calls);
  free(p);
}

/* The spare batch's memory, or a new one (NULL: out of memory). Today
 * every batch completes before the next starts, so one is reused. */
static rows_pull *pull_take(store_rows *sp) {
  rows_pull *p = sp->spare;
  sp->spare = NULL;
  return p != NULL ? p : calloc(1, sizeof *p);
}

static void pull_give(store_rows *sp, rows_pull *p) {
  if (sp->spare == NULL) sp->spare = p;
  else rows_pull_free(p);
}

static const float no_rows[1];

/* Gathers call `index`'s rows of each table out of its batch's union. */
static void add_pulled_rows(pserver *ps, int index, wire_writer *w, void *ctx) {
  store_rows *sp = ps->store.rows;
  const rows_pull *p = ctx;
  for (int t = 0; t < p->tables; t++) {
    size_t from = p->from[t][index], n = p->from[t][index + 1] - from;
    size_t dim = (size_t)dim_of(ps, t);
    if (n > 0 && !grow(&sp->out[t], &sp->out_cap[t], n * dim, sizeof(float))) {
      w->status = PS_ERR_NO_MEMORY;
      w->refused = "out of memory for a reply's rows";
      return;
    }
    float *out = sp->out[t];
    for (size_t k = 0; k < n; k++) {
      memcpy(out + k * dim, p->rows[t] + (size_t)p->at[t][from + k] * dim, dim * sizeof(float));
    }
    wire_writer_sparse(w, WIRE_SPARSE_ROWS, (uint32_t)t, NULL, 0, n > 0 ? out : no_rows, n * dim,
                       NULL, NULL);
    ps->stats_out += n * dim * sizeof(float);
  }
}

/* Merges table t's keys of the calls (which[i][t], calls' order) into the
 * batch: the union, its counts summed (create), each call's places. */
static ps_err pull_merge(pserver *ps, rows_pull *p, int t, store_rows_which *which, int count,
                         ps_error *err) {
  store_rows *sp = ps->store.rows;
  sparse_rows **rows = sp->rowp;
  size_t total = 0, dim = (size_t)dim_of(ps, t);
  for (int i = 0; i < count; i++) total += (rows[i] = which[i][t])->n;
  if (merge(sp, rows, count, (int)dim, p->lookup.create, 0, err) != PS_ERR_OK) return err->code;
  size_t u = sp->dedup.n_unique;
  if (!grow(&p->keys[t], &p->keys_cap[t], u, sizeof *p->keys[t]) ||
      !grow(&p->counts[t], &p->counts_cap[t], u, sizeof *p->counts[t]) ||
      !grow(&p->rows[t], &p->rows_cap[t], u * dim, sizeof *p->rows[t]) ||
      !grow(&p->at[t], &p->at_cap[t], total, sizeof *p->at[t]) ||
      !grow(&p->from[t], &p->from_cap[t], (size_t)count + 1, sizeof *p->from[t])) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory for %zu rows", u);
  }
  if (u > 0) { /* no keys: the merge's buffers may not exist yet */
    memcpy(p->keys[t], sp->dedup.unique, u * sizeof *p->keys[t]);
    if (p->lookup.create) memcpy(p->counts[t], sp->counts, u * sizeof *p->counts[t]);
  }
  if (total > 0) memcpy(p->at[t], sp->slot, total * sizeof *p->at[t]);
  p->from[t][0] = 0;
  for (int i = 0; i < count; i++) p->from[t][i + 1] = p->from[t][i] + rows[i]->n;
  p->lookup.keys[t] = p->keys[t];
  p->lookup.counts[t] = p->counts[t];
  p->lookup.n[t] = u;
  p->lookup.rows[t] = p->rows[t];
  return PS_ERR_OK;
}

static void refuse_all(rpc_call *const *calls, int count, ps_err rc, const char *why) {
  for (int i = 0; i < count; i++) pserver_refuse(calls[i], "PushPull/Pull", rc, "%s", why);
}

/* The batch's end: every call answered (with its rows, or the error),
 * the memory kept for the next, then what follows the replies. */
static void pull_done(pserver *ps, store_lookup *l, ps_err rc, void *ctx) {
  rows_pull *p = ctx;
  if (rc == PS_ERR_RESOURCE_EXHAUSTED) store_rows_stop_at_limit(ps, l->err.msg);
  if (rc != PS_ERR_OK) {
    refuse_all(p->calls, p->count, rc, l->err.msg);
  } else {
    pserver_reply_params_rows(ps, p->calls, p->count, add_pulled_rows, p);
  }
  store_replied then = p->then;
  void *then_ctx = p->then_ctx;
  pull_give(ps->store.rows, p);
  if (then != NULL) then(ps, rc, then_ctx);
}

/* Answers each call with the parameters and the rows of its keys
 * (which[i][t]; tables 0: no rows), the union of all of them pulled at
 * step (create) or read, in one batched lookup; then `then` (NULL: none). */
static void pull_reply(pserver *ps, store_rows_which *which, rpc_call *const *calls, int count,
                       int tables, int create, long step, store_replied then, void *then_ctx) {
  store_rows *sp = ps->store.rows;
  ps_error err;
  rows_pull *p = pull_take(sp);
  if (p == NULL) {
    ps_error_set(&err, PS_ERR_NO_MEMORY, "pserver: out of memory for a step's rows");
  } else if (!grow(&p->calls, &p->calls_cap, (size_t)count, sizeof *p->calls)) {
    ps_error_set(&err, PS_ERR_NO_MEMORY, "pserver: out of memory for %d replies", count);
  } else {
    p->lookup = (store_lookup){.create = create, .step = step, .done = pull_done, .ctx = p};
    err.code = PS_ERR_OK;
    for (int t = 0; t < tables && err.code == PS_ERR_OK; t++) {
      if (pull_merge(ps, p, t, which, count, &err) == PS_ERR_OK) p->lookup.tables = t + 1;
    }
  }
  if (p == NULL || err.code != PS_ERR_OK) {
    refuse_all(calls, count, err.code, err.msg);
    if (p != NULL) pull_give(sp, p);
    if (then != NULL) then(ps, err.code, then_ctx);
    return;
  }
  if (count > 0) memcpy(p->calls, calls, (size_t)count * sizeof *calls);
  p->count = count;
  p->tables = tables;
  p->then = then;
  p->then_ctx = then_ctx;
  store_lookup_submit(ps, &p->lookup);
}

/* Pulls the union of the calls' keys (which[i], calls' order) at step. */
static void pull_reply_all(pserver *ps, store_rows_which *which, rpc_call *const *calls,
                           int count, long step, store_replied then, void *then_ctx) {
  pull_reply(ps, which, calls, count, ps->store.table_count, 1, step, then, then_ctx);
}

/* Reads the rows of the checked rows' keys of field for call, creating
 * nothing; with none of field sent (present 0), only the parameters. */
static void read_reply(pserver *ps, rpc_call *call, int field, int present) {
  store_rows_which *which = ps->store.rows->which;
  for (int t = 0; t < ps->store.table_count; t++) which[0][t] = &ps->store.rows->req[field][t];
  pull_reply(ps, which, &call, 1, present ? ps->store.table_count : 0, 0, 0, NULL, NULL);
}

void store_rows_reply_step(pserver *ps, const int *slots, rpc_call *const *calls, int count,
                           store_replied done, void *ctx) {
  maybe_evict(ps, ps->updates);
  store_rows_which *which = ps->store.rows->which;
  for (int i = 0; i < count; i++) {
    for (int t = 0; t < ps->store.table_count; t++) {
      which[i][t] = &ps->store.rows->trainers[slots[i]].next[t];
    }
  }
  pull_reply_all(ps, which, calls, count, ps->updates, done, ctx);
}

ps_err store_rows_apply_async(pserver *ps, int scale_n, long step, ps_error *err) {
  float scale = 1.0f / (float)scale_n;
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
  pull_reply_all(ps, which, &call, 1, ps->updates / n, NULL, NULL);
}

void store_rows_reply_lookup(pserver *ps, rpc_call *call) {
  store_rows *sp = ps->store.rows;
  if (sp == NULL) {
    pserver_reply_params(ps, &call, 1);
    return;
  }
  read_reply(ps, call, SPARSE_FIELD_KEYS, sp->req_present[SPARSE_FIELD_KEYS]);
}

/* Table t's rows with a disk tier (memory, buffer and disk) into r. */
static ps_err all_tier_rows(pserver *ps, int t, sparse_rows *r, ps_error *err) {
  pserver_rows all = {0};
  ps_err rc = store_tier_take_rows(ps, t, &all, err);
  size_t dim = (size_t)dim_of(ps, t);
  if (rc == PS_ERR_OK && !rows_reserve(r, all.rows, all.rows * dim)) {
    rc = ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory for every row of a table");
  }
  if (rc == PS_ERR_OK) {
    memcpy(r->keys, all.keys, all.rows * sizeof *r->keys);
    memcpy(r->values, all.values, all.rows * dim * sizeof *r->values);
    r->n = all.rows;
  }
  pserver_rows_free(&all);
  return rc;
}

/* Every row with its key, ascending (sparse_table_dump), per table. */
static void add_all_rows(pserver *ps, int index, wire_writer *w, void *ctx) {
  (void)index;
  (void)ctx;
  store_rows *sp = ps->store.rows;
  for (int t = 0; t < ps->store.table_count && ps->store.tier != NULL; t++) {
    sparse_rows *r = &sp->req[SPARSE_FIELD_KEYS][t];
    ps_error err;
    if (all_tier_rows(ps, t, r, &err) != PS_ERR_OK) {
      LOG_ERROR("PULL_ALL: %s", err.msg);
      w->status = err.code;
      w->refused = "reading a table's rows failed (the pserver's log says why)";
      return;
    }
    wire_writer_sparse(w, WIRE_SPARSE_ROWS, (uint32_t)t, r->keys, r->n, r->values,
                       r->n * (size_t)dim_of(ps, t), NULL, NULL);
    ps->stats_out += r->n * ((size_t)dim_of(ps, t) * sizeof(float) + sizeof(uint64_t));
  }
  for (int t = 0; t < ps->store.table_count && ps->store.tier == NULL; t++) {
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

void store_rows_reply_pulls(pserver *ps, const int *ids, rpc_call *const *calls, int count,
                            long step, store_replied done, void *ctx) {
  store_rows *sp = ps->store.rows;
  for (int i = 0; i < count; i++) {
    for (int t = 0; t < ps->store.table_count; t++) sp->which[i][t] = &sp->trainers[ids[i]].pull[t];
  }
  pull_reply_all(ps, sp->which, calls, count, step, done, ctx);
}

/* A PULL_STEP outside the sync barrier: the rows of its keys at once. */
void store_rows_pull_now(pserver *ps, rpc_call *call) {
  store_rows_which *which = ps->store.rows->which;
  for (int t = 0; t < ps->store.table_count; t++) {
    which[0][t] = &ps->store.rows->req[SPARSE_FIELD_KEYS][t];
  }
  pull_reply_all(ps, which, &call, 1, ps->updates / ps->cfg.trainers, NULL, NULL);
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

void store_rows_stop_at_limit(pserver *ps, const char *why) {
  if (ps->status != PSERVER_RUNNING) return;
  snprintf(ps->failure, sizeof ps->failure, "%.500s", why);
  ps->status = PSERVER_FAILED;
}

ps_err store_rows_add(pserver *ps, float scale, long step, uint64_t *added, ps_error *err) {
  for (int t = 0; t < ps->store.table_count; t++) {
    const sparse_rows *r = &ps->store.rows->req[SPARSE_FIELD_GRADS][t];
    if (sparse_table_add_rows(ps->store.tables[t], r->keys, r->n, r->values, scale, step, err) !=
        PS_ERR_OK) {
      /* An earlier table may hold this push already: it cannot be taken again. */
      if (err->code == PS_ERR_RESOURCE_EXHAUSTED) store_rows_stop_at_limit(ps, err->msg);
      return err->code;
    }
    *added += r->n;
  }
  return PS_ERR_OK;
}

/* The fresh rows of the pushed keys, in their order: read after their
 * changes are applied (or were, for a resend); every table answered. */
void store_rows_reply_fresh(pserver *ps, rpc_call *call) {
  read_reply(ps, call, SPARSE_FIELD_GRADS, 1);
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
