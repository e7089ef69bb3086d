/* The disk tier (tier.h), rows coming back for a request: a request's
 * pass finds which of its rows are not in memory, takes buffered ones
 * back, names the rest to read with the lock released and installs them
 * on the next pass; an evaluation's lookup is served them instead; and
 * requests wait while the buffer is over half full. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "server/store/tier.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/grow.h"
#include "common/log.h"
#include "server/pserver_internal.h"
#include "server/store/rows.h"
#include "server/store/tier_internal.h"

/* A request's passes before its last rows are read with the lock held. */
#define TIER_PASSES 4
/* How long a request waits for the writer to make room in the buffer. */
#define TIER_WAIT_SECONDS 60

/* --- a request's rows ------------------------------------------------------------------ */

void tier_fetch_free(tier_fetch *f) {
  store_rows_stash_free(f->stash);
  for (int t = 0; t < CTR_TABLES_MAX; t++) {
    free(f->ov_keys[t]);
    free(f->ov_rows[t]);
  }
  for (int t = 0; t < CTR_TABLES_MAX; t++) {
    free(f->keys[t]);
    free(f->rows[t]);
    free(f->found[t]);
  }
  memset(f, 0, sizeof *f);
}

static int install_reserve(store_tier *tr, size_t n) {
  size_t max_floats = 0;
  for (int t = 0; t < tr->tables; t++) {
    if (tr->row_floats[t] > max_floats) max_floats = tr->row_floats[t];
  }
  if (n <= tr->install_cap) return 1;
  if (!grow_array(&tr->install_keys, n, sizeof *tr->install_keys) ||
      !grow_array(&tr->install_rows, n * max_floats, sizeof *tr->install_rows)) {
    return 0;
  }
  tr->install_cap = n;
  return 1;
}

static int fetch_reserve(tier_fetch *f, int t, size_t n, size_t row_floats) {
  if (n <= f->cap[t]) return 1;
  if (!grow_array(&f->keys[t], n, sizeof *f->keys[t]) ||
      !grow_array(&f->rows[t], n * row_floats, sizeof *f->rows[t]) ||
      !grow_array(&f->found[t], n, sizeof *f->found[t])) {
    return 0;
  }
  f->cap[t] = n;
  return 1;
}

/* Installs the first n rows of the install list into table t; on failure
 * the rows taken from the buffer for it go back there. */
static ps_err install(store_tier *tr, int t, size_t n, ps_error *err) {
  if (n == 0) return PS_ERR_OK;
  ps_err rc = sparse_table_install(tr->ps->store.tables[t], tr->install_keys, n,
                                   tr->install_rows, err);
  if (rc != PS_ERR_OK) {
    pthread_mutex_lock(&tr->mu);
    for (size_t i = 0; i < n; i++) {
      const float *row = tr->install_rows + i * tr->row_floats[t];
      tr->buffer_bytes += row_bytes(tr, t);
      ps_error ignored;
      if (sparse_table_install(tr->buffer[t], &tr->install_keys[i], 1, row, &ignored) !=
          PS_ERR_OK) {
        tr->buffer_bytes -= row_bytes(tr, t);
      }
    }
    pthread_mutex_unlock(&tr->mu);
  }
  return rc;
}

/* mu held: key's buffered row into row: taken out of the buffer, or with
 * peek copied (a read-only request); 0 without one. */
static int buffer_get(store_tier *tr, int t, uint64_t key, float *row, int peek) {
  if (!peek) return tier_buffer_take(tr, t, key, row);
  const float *held = sparse_table_peek(tr->buffer[t], key);
  if (held == NULL) return 0;
  memcpy(row, held, row_bytes(tr, t));
  return 1;
}

static const uint64_t *serve_keys;
static int by_serve_key(const void *a, const void *b) {
  uint64_t x = serve_keys[*(const size_t *)a], y = serve_keys[*(const size_t *)b];
  return x < y ? -1 : x > y;
}

/* A read-only request's rows: the first n of the install list, after the
 * first `keep` served already (0: this pass's replace the last's), sorted by
 * key. */
static ps_err serve(store_tier *tr, int t, tier_fetch *f, size_t keep, size_t n, ps_error *err) {
  size_t rf = tr->row_floats[t], all = keep + n;
  f->ov_n[t] = keep;
  if (n == 0) return PS_ERR_OK;
  size_t *order = malloc(all * sizeof *order);
  uint64_t *keys = malloc(all * sizeof *keys);
  float *rows = malloc(all * rf * sizeof *rows);
  if (order == NULL || keys == NULL || rows == NULL) {
    free(order);
    free(keys);
    free(rows);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "disk tier: out of memory for %zu rows", all);
  }
  /* The served rows and the new ones side by side, then sorted into place. */
  if (keep > 0) {
    memcpy(keys, f->ov_keys[t], keep * sizeof *keys);
    memcpy(rows, f->ov_rows[t], keep * rf * sizeof *rows);
  }
  memcpy(keys + keep, tr->install_keys, n * sizeof *keys);
  memcpy(rows + keep * rf, tr->install_rows, n * rf * sizeof *rows);
  for (size_t i = 0; i < all; i++) order[i] = i;
  serve_keys = keys; /* under the pserver's lock: one sort at a time */
  qsort(order, all, sizeof *order, by_serve_key);
  if (all > f->ov_cap[t] && (!grow_array(&f->ov_keys[t], all, sizeof *f->ov_keys[t]) ||
                             !grow_array(&f->ov_rows[t], all * rf, sizeof *f->ov_rows[t]))) {
    free(order);
    free(keys);
    free(rows);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "disk tier: out of memory for %zu rows", all);
  }
  if (all > f->ov_cap[t]) f->ov_cap[t] = all;
  for (size_t i = 0; i < all; i++) {
    f->ov_keys[t][i] = keys[order[i]];
    memcpy(f->ov_rows[t] + i * rf, rows + order[i] * rf, rf * sizeof(float));
  }
  free(order);
  free(keys);
  free(rows);
  f->ov_n[t] = all;
  return PS_ERR_OK;
}

/* One table's pass (mu held for the buffer and f's validity, dropped
 * around installs): f's rows installed where still missing, buffered rows
 * taken back, the rest named in f. Returns rows left to read, or -1. */
static long prepare_table(store_tier *tr, int t, tier_fetch *f, int valid, ps_error *err) {
  pserver *ps = tr->ps;
  sparse_table *hot = ps->store.tables[t];
  const sparse_rows *lists[2] = {&ps->store.rows->req[SPARSE_FIELD_GRADS][t],
                                 &ps->store.rows->req[SPARSE_FIELD_KEYS][t]};
  size_t total = lists[0]->n + lists[1]->n, rf = tr->row_floats[t];
  long horizon = sparse_table_forgotten_before(hot);
  if (!install_reserve(tr, total + f->n[t]) || !key_set_reset(&tr->asked, f->n[t]) ||
      !grow_array(&tr->missing, total > 0 ? total : 1, sizeof *tr->missing)) {
    ps_error_set(err, PS_ERR_NO_MEMORY, "disk tier: out of memory for a request's %zu rows", total);
    return -1;
  }
  size_t inst = 0;
  pthread_mutex_lock(&tr->mu);
  /* The rows read last pass: the buffer is newer where it has them. */
  for (size_t i = 0; valid && i < f->n[t]; i++) {
    uint64_t key = f->keys[t][i];
    key_set_add(&tr->asked, key);
    if (sparse_table_has(hot, key)) continue;
    float *row = tr->install_rows + inst * rf;
    int have = buffer_get(tr, t, key, row, f->read_only);
    if (!have && f->found[t][i]) {
      memcpy(row, f->rows[t] + i * rf, rf * sizeof(float));
      have = 1;
    }
    if (have && sparse_table_row_step(hot, row) >= horizon) tr->install_keys[inst++] = key;
  }
  size_t to_read = 0;
  /* Where the request's rows were when it came (a prefetch's count apart). */
  int first = f->passes == 1 && !f->best_effort;
  int disk_empty = tr->written[t] == 0; /* nothing to read: every other row is new */
  for (int l = 0; l < 2; l++) {
    size_t missing = sparse_table_missing(hot, lists[l]->keys, lists[l]->n, tr->missing);
    tr->lookups += first * lists[l]->n;
    tr->hits += first * (lists[l]->n - missing);
    for (size_t m = 0; m < missing; m++) {
      uint64_t key = lists[l]->keys[tr->missing[m]];
      if (valid && key_set_has(&tr->asked, key)) continue; /* read: new, or installed above */
      float *row = tr->install_rows + inst * rf;
      if (buffer_get(tr, t, key, row, f->read_only)) {
        tr->buffer_hits += first;
        tr->ahead_buffer += f->best_effort && f->passes == 1;
        if (sparse_table_row_step(hot, row) >= horizon) tr->install_keys[inst++] = key;
        continue;
      }
      if (disk_empty) {
        tr->disk_misses += first;
        continue;
      }
      if (!fetch_reserve(f, t, to_read + 1, rf)) {
        pthread_mutex_unlock(&tr->mu);
        install(tr, t, inst, err);
        ps_error_set(err, PS_ERR_NO_MEMORY, "disk tier: out of memory for a request's rows");
        return -1;
      }
      /* f's old keys were all seen above (valid) or are dropped (not): reuse them. */
      f->keys[t][to_read++] = key;
    }
  }
  pthread_mutex_unlock(&tr->mu);
  if (f->read_only) {
    if (serve(tr, t, f, 0, inst, err) != PS_ERR_OK) return -1;
  } else if (install(tr, t, inst, err) != PS_ERR_OK) {
    return -1;
  }
  f->n[t] = to_read;
  return (long)to_read;
}

/* Lock held: reads f's rows now (the last pass, an export, a load). */
static ps_err read_now(store_tier *tr, tier_fetch *f, ps_error *err) {
  for (int t = 0; t < tr->tables; t++) {
    if (f->n[t] == 0) continue;
    if (row_disk_read(tr->disk, t, f->keys[t], f->n[t], f->rows[t], f->found[t], err) !=
        PS_ERR_OK) {
      return err->code;
    }
    tr->reads_under_lock += f->n[t];
  }
  return PS_ERR_OK;
}

static void count_reads(store_tier *tr, const tier_fetch *f) {
  for (int t = 0; t < tr->tables; t++) {
    for (size_t i = 0; i < f->n[t]; i++) {
      if (f->best_effort) tr->ahead_disk += f->found[t][i];
      else if (f->found[t][i]) tr->disk_hits++;
      else tr->disk_misses++;
    }
  }
}

static int prepare(store_tier *tr, tier_fetch *f, ps_error *err);

int store_tier_prepare(pserver *ps, tier_fetch *f, ps_error *err) {
  store_tier *tr = tier_of(ps);
  if (tr == NULL || ps->store.rows == NULL) return 0;
  int rc = prepare(tr, f, err);
  /* The request is refused, and a sync step cannot go on without it: the
   * job stops now, naming why (not at a step timeout). */
  if (rc < 0) store_rows_stop_at_limit(ps, err->msg);
  return rc;
}

static int prepare(store_tier *tr, tier_fetch *f, ps_error *err) {
  pserver *ps = tr->ps;
  pthread_mutex_lock(&tr->mu);
  int failed = tr->failed, valid = f->read && f->commits == tr->commits;
  if (failed) ps_error_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s", tr->failure);
  pthread_mutex_unlock(&tr->mu);
  if (failed) return -1;
  if (valid) count_reads(tr, f);
  f->passes++;
  f->tier_serial = tr->serial;
  long left = 0;
  for (int t = 0; t < tr->tables; t++) {
    long n = prepare_table(tr, t, f, valid, err);
    if (n < 0) return -1;
    left += n;
  }
  f->read = 0;
  if (left == 0) {
    tr->serving = f->read_only ? f : NULL;
    return 0;
  }
  if (f->passes < TIER_PASSES) {
    pthread_mutex_lock(&tr->mu);
    f->commits = tr->commits;
    pthread_mutex_unlock(&tr->mu);
    return 1;
  }
  if (f->best_effort) { /* a prefetch: the push reads what is left */
    for (int t = 0; t < tr->tables; t++) f->n[t] = 0;
    return 0;
  }
  /* Moved out again between passes, again and again: read them now. With
   * the lock held no row can enter the buffer, so the disk is current. */
  if (read_now(tr, f, err) != PS_ERR_OK) return -1;
  count_reads(tr, f);
  for (int t = 0; t < tr->tables; t++) {
    sparse_table *hot = ps->store.tables[t];
    long horizon = sparse_table_forgotten_before(hot);
    size_t inst = 0, rf = tr->row_floats[t];
    for (size_t i = 0; i < f->n[t]; i++) {
      const float *row = f->rows[t] + i * rf;
      if (!f->found[t][i] || sparse_table_row_step(hot, row) < horizon) continue;
      tr->install_keys[inst] = f->keys[t][i];
      memcpy(tr->install_rows + inst * rf, row, rf * sizeof(float));
      inst++;
    }
    /* A read-only request's, beside what this pass found in the buffer. */
    if (f->read_only) {
      if (serve(tr, t, f, f->ov_n[t], inst, err) != PS_ERR_OK) return -1;
    } else if (install(tr, t, inst, err) != PS_ERR_OK) {
      return -1;
    }
    f->n[t] = 0;
  }
  tr->serving = f->read_only ? f : NULL;
  return 0;
}

static int by_key(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

ps_err store_tier_read(pserver *ps, tier_fetch *f, ps_error *err) {
  store_tier *tr = tier_of(ps);
  if (tr == NULL || tr->serial != f->tier_serial) {
    f->read = 0; /* the job was reset meanwhile: the next pass finds where rows are now */
    return PS_ERR_OK;
  }
  for (int t = 0; t < tr->tables; t++) {
    /* Sorted, each reader's range of keys lies in blocks of its own. */
    if (f->n[t] > 1) qsort(f->keys[t], f->n[t], sizeof *f->keys[t], by_key);
    if (f->n[t] > 0 && tier_readers_read(tr->readers, t, f->keys[t], f->n[t], f->rows[t],
                                         row_bytes(tr, t), f->found[t], err) != PS_ERR_OK) {
      pthread_mutex_lock(&tr->mu); /* the job stops at the next request's pass */
      tr->failed = 1;
      snprintf(tr->failure, sizeof tr->failure, "disk tier: reading rows failed: %.450s", err->msg);
      pthread_mutex_unlock(&tr->mu);
      return err->code;
    }
  }
  f->read = 1;
  return PS_ERR_OK;
}

/* --- a trainer's next keys, ahead of its push ----------------------------------------- */

void store_tier_prefetch_begin(pserver *ps, tier_fetch *f, int trainer) {
  store_tier *tr = tier_of(ps);
  f->prefetch = 0;
  if (tr == NULL || ps->store.rows == NULL || trainer < 0 || trainer >= tr->ahead_trainers) {
    return;
  }
  tier_ahead *a = &tr->ahead[trainer];
  for (int t = 0; t < tr->tables; t++) {
    const sparse_rows *r = &ps->store.rows->req[SPARSE_FIELD_KEYS][t];
    a->n[t] = 0;
    if (r->n > a->cap[t]) {
      if (!grow_array(&a->keys[t], r->n, sizeof *a->keys[t])) return; /* not held: best effort */
      a->cap[t] = r->n;
    }
    memcpy(a->keys[t], r->keys, r->n * sizeof *r->keys);
    a->n[t] = r->n;
  }
  f->best_effort = 1;
  ps_error err;
  int rc = prepare(tr, f, &err);
  if (rc < 0) LOG_DEBUG("disk tier: a prefetch of trainer %d's rows left to its push: %s",
                        trainer, err.msg);
  if (rc == 1) {
    store_stash_rows(ps, &f->stash);
    f->prefetch = 1;
  }
}

void store_tier_answer_prefetch(pserver *ps, rpc_call *call) {
  store_tier_stats st;
  store_tier_stats_quick(ps, &st);
  Pstrain__TierStats tier = PSTRAIN__TIER_STATS__INIT;
  tier.lookups = st.lookups;
  tier.hits = st.hits;
  tier.ahead = st.ahead;
  tier.rows_memory = st.rows_memory;
  tier.disk_bytes_read = st.disk_bytes_read;
  tier.disk_bytes_written = st.disk_bytes_written;
  Pstrain__ParamsReply ack = PSTRAIN__PARAMS_REPLY__INIT;
  ack.pserver_incarnation = ps->incarnation;
  ack.tier = &tier;
  pserver_reply_message(call, &ack.base);
}

void store_tier_prefetch_finish(pserver *ps, tier_fetch *f) {
  for (int again = 1; again;) {
    ps_error err;
    if (store_tier_read(ps, f, &err) != PS_ERR_OK) return; /* the next request stops the job */
    again = 0;
    pthread_mutex_lock(&ps->lock);
    store_tier *tr = tier_of(ps);
    if (!ps->stopping && tr != NULL && tr->serial == f->tier_serial &&
        store_unstash_rows(ps, f->stash)) {
      int rc = prepare(tr, f, &err);
      if (rc < 0) LOG_DEBUG("disk tier: a prefetch's rows left to the push: %s", err.msg);
      if (rc == 1) {
        store_stash_rows(ps, &f->stash);
        again = 1;
      }
    }
    pthread_mutex_unlock(&ps->lock);
  }
}

void store_tier_prefetch_done(pserver *ps, int trainer) {
  store_tier *tr = tier_of(ps);
  if (tr == NULL || trainer < 0 || trainer >= tr->ahead_trainers) return;
  for (int t = 0; t < tr->tables; t++) tr->ahead[trainer].n[t] = 0;
}

/* mu held: whether a table's buffer is over half its rows. */
static int buffer_half_full(store_tier *tr) {
  for (int t = 0; t < tr->tables; t++) {
    sparse_table_stats st;
    sparse_table_stats_get(tr->buffer[t], &st);
    if (st.rows > tr->buffer_rows_max[t] / 2) return 1;
  }
  return 0;
}

void store_tier_wait_room(pserver *ps) {
  /* The tier lives from the job's configuration to the pserver's end. */
  pthread_mutex_lock(&ps->lock);
  store_tier *tr = tier_of(ps);
  pthread_mutex_unlock(&ps->lock);
  if (tr == NULL) return;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += TIER_WAIT_SECONDS;
  pthread_mutex_lock(&tr->mu);
  while (buffer_half_full(tr) && !tr->failed && !tr->stop) {
    pthread_cond_signal(&tr->wake);
    if (pthread_cond_timedwait(&tr->drained, &tr->mu, &until) == ETIMEDOUT) break;
  }
  pthread_mutex_unlock(&tr->mu);
}

void store_tier_release(pserver *ps) {
  if (tier_of(ps) != NULL) tier_of(ps)->serving = NULL;
}

void store_tier_lookup_rows(pserver *ps, int t, const uint64_t *keys, size_t n, float *rows) {
  store_tier *tr = tier_of(ps);
  if (tr == NULL || tr->serving == NULL || tr->serving->ov_n[t] == 0) return;
  const tier_fetch *f = tr->serving;
  const sparse_table *hot = ps->store.tables[t];
  size_t dim = (size_t)sparse_table_config_of(hot)->dim, rf = tr->row_floats[t];
  for (size_t i = 0; i < n; i++) {
    if (sparse_table_has(hot, keys[i])) continue;
    size_t lo = 0, hi = f->ov_n[t];
    while (lo < hi) { /* the first served key >= keys[i] */
      size_t mid = lo + (hi - lo) / 2;
      if (f->ov_keys[t][mid] < keys[i]) lo = mid + 1;
      else hi = mid;
    }
    if (lo < f->ov_n[t] && f->ov_keys[t][lo] == keys[i]) {
      memcpy(rows + i * dim, f->ov_rows[t] + lo * rf, dim * sizeof(float));
    }
  }
}
