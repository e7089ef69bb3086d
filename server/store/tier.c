/* The disk tier (tier.h): the spill the tables move rows to, the buffer and
 * its writer thread, a request's rows brought back, and the tables' whole
 * contents (memory, buffer, disk) for checkpoints, exports and loads.
 * Locks: the pserver's, then the tier's `mu` (buffer, commits, failure);
 * the writer takes only `mu`, so the tier can be stopped with the pserver's
 * lock held. */
#define _GNU_SOURCE /* pthread_timedjoin_np is not used; clock for timed waits */
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

/* The buffer's share of --table-memory-mb (1/8): about two of the tables'
 * moves of 1/16 each. */
#define TIER_BUFFER_SHARE 8
#define TIER_BUFFER_MIN ((size_t)64 << 10)
/* A request's passes before its last rows are read with the lock held. */
#define TIER_PASSES 4
/* How long a request waits for the writer to make room in the buffer. */
#define TIER_WAIT_SECONDS 60

static int key_set_reset(key_set *s, size_t n) {
  size_t cap = 64;
  while (cap < 2 * n) cap *= 2;
  if (cap > s->cap) {
    uint64_t *k = realloc(s->keys, cap * sizeof *k);
    if (k != NULL) s->keys = k;
    uint32_t *st = k != NULL ? realloc(s->stamp, cap * sizeof *st) : NULL;
    if (st == NULL) return 0;
    s->stamp = st;
    memset(s->stamp, 0, cap * sizeof *st);
    s->cap = cap;
    s->now = 0;
  }
  if (++s->now == 0) {
    memset(s->stamp, 0, s->cap * sizeof *s->stamp);
    s->now = 1;
  }
  return 1;
}

static size_t key_set_slot(const key_set *s, uint64_t key) {
  uint64_t h = (key ^ 0x9e3779b97f4a7c15ULL) * 0xbf58476d1ce4e5b9ULL;
  return (size_t)(h >> 32) & (s->cap - 1);
}

static void key_set_add(key_set *s, uint64_t key) {
  size_t mask = s->cap - 1;
  for (size_t i = key_set_slot(s, key);; i = (i + 1) & mask) {
    if (s->stamp[i] != s->now) {
      s->stamp[i] = s->now;
      s->keys[i] = key;
      return;
    }
    if (s->keys[i] == key) return;
  }
}

/* Index of key in the set's insertion... only membership is needed. */
static int key_set_has(const key_set *s, uint64_t key) {
  if (s->cap == 0) return 0;
  size_t mask = s->cap - 1;
  for (size_t i = key_set_slot(s, key);; i = (i + 1) & mask) {
    if (s->stamp[i] != s->now) return 0;
    if (s->keys[i] == key) return 1;
  }
}

static void key_set_free(key_set *s) {
  free(s->keys);
  free(s->stamp);
  memset(s, 0, sizeof *s);
}


static int table_index(const store_tier *tr, const sparse_table *t) {
  for (int i = 0; i < tr->tables; i++) {
    if (tr->ps->store.tables[i] == t) return i;
  }
  return -1;
}


/* --- the spill ------------------------------------------------------------------ */

static void add_rows(key_set *s, const sparse_rows *r) {
  for (size_t i = 0; i < r->n; i++) key_set_add(s, r->keys[i]);
}

/* The keys a request or a kept step holds stay in memory: the request's
 * checked rows, and every trainer's kept pushes, next keys and pulls. */
static void spill_begin(void *ctx) {
  store_tier *tr = ctx;
  pserver *ps = tr->ps;
  store_rows *sp = ps->store.rows;
  for (int t = 0; t < tr->tables; t++) {
    size_t n = sp->req[SPARSE_FIELD_GRADS][t].n + sp->req[SPARSE_FIELD_KEYS][t].n;
    for (int i = 0; i < ps->cfg.trainers; i++) {
      n += sp->trainers[i].grads[t].n + sp->trainers[i].next[t].n + sp->trainers[i].pull[t].n;
    }
    key_set *s = &tr->pins[t];
    if (!key_set_reset(s, n)) {
      /* No memory for the pins: nothing may move (the move fails, named). */
      s->now = UINT32_MAX;
      continue;
    }
    add_rows(s, &sp->req[SPARSE_FIELD_GRADS][t]);
    add_rows(s, &sp->req[SPARSE_FIELD_KEYS][t]);
    for (int i = 0; i < ps->cfg.trainers; i++) {
      add_rows(s, &sp->trainers[i].grads[t]);
      add_rows(s, &sp->trainers[i].next[t]);
      add_rows(s, &sp->trainers[i].pull[t]);
    }
  }
}

static int spill_pinned(void *ctx, const sparse_table *table, uint64_t key) {
  store_tier *tr = ctx;
  int t = table_index(tr, table);
  if (t < 0 || tr->pins[t].now == UINT32_MAX) return 1;
  return key_set_has(&tr->pins[t], key);
}

/* mu held: row into the buffer; 0 when it is past twice its share or out of memory. */
static int buffer_put(store_tier *tr, int t, uint64_t key, const float *row) {
  /* Past its reserved rows the buffer grows for now (one request's moves at
   * most: requests wait while it is over half full) rather than refuse a
   * move the request needs. */
  ps_error err;
  if (sparse_table_install(tr->buffer[t], &key, 1, row, &err) != PS_ERR_OK) return 0;
  tr->buffer_bytes += row_bytes(tr, t);
  return 1;
}

static int spill_put(void *ctx, const sparse_table *table, uint64_t key, const float *row) {
  store_tier *tr = ctx;
  int t = table_index(tr, table);
  if (t < 0) return 0;
  pthread_mutex_lock(&tr->mu);
  int ok = buffer_put(tr, t, key, row);
  if (ok && tr->buffer_bytes >= tr->buffer_limit / 8) pthread_cond_signal(&tr->wake);
  pthread_mutex_unlock(&tr->mu);
  return ok;
}

int tier_buffer_take(store_tier *tr, int t, uint64_t key, float *row) {
  if (!sparse_table_take(tr->buffer[t], key, row)) return 0;
  tr->buffer_bytes -= row_bytes(tr, t);
  return 1;
}

/* --- the writer ------------------------------------------------------------------ */

typedef struct write_batch {
  uint64_t *keys[CTR_TABLES_MAX];
  float *rows[CTR_TABLES_MAX];
  size_t n[CTR_TABLES_MAX];
  float *row; /* one row, to compare */
} write_batch;

static void write_batch_free(write_batch *b) {
  for (int t = 0; t < CTR_TABLES_MAX; t++) {
    free(b->keys[t]);
    free(b->rows[t]);
  }
  free(b->row);
}

/* mu held: every written row still buffered with the same bytes leaves the
 * buffer (the disk holds it now); one changed since goes back in. */
static void drop_written(store_tier *tr, write_batch *b) {
  for (int t = 0; t < tr->tables; t++) {
    size_t rb = row_bytes(tr, t);
    for (size_t i = 0; i < b->n[t]; i++) {
      if (!tier_buffer_take(tr, t, b->keys[t][i], b->row)) continue;
      if (memcmp(b->row, b->rows[t] + i * tr->row_floats[t], rb) != 0) {
        tr->buffer_bytes += rb; /* back in whatever the limit says: it was in */
        ps_error err;
        if (sparse_table_install(tr->buffer[t], &b->keys[t][i], 1, b->row, &err) != PS_ERR_OK) {
          /* Cannot happen: the row's own place was just freed. */
          tr->failed = 1;
          snprintf(tr->failure, sizeof tr->failure, "disk tier: a buffered row could not be "
                   "put back: %.400s", err.msg);
        }
      }
    }
  }
}

static void *writer_main(void *arg) {
  store_tier *tr = arg;
  write_batch b = {0};
  size_t max_floats = 0;
  for (int t = 0; t < tr->tables; t++) {
    b.keys[t] = malloc(write_rows_max(tr, t) * sizeof *b.keys[t]);
    b.rows[t] = malloc(write_rows_max(tr, t) * tr->row_floats[t] * sizeof(float));
    if (tr->row_floats[t] > max_floats) max_floats = tr->row_floats[t];
  }
  b.row = malloc(max_floats * sizeof(float));
  pthread_mutex_lock(&tr->mu);
  int ok = b.row != NULL;
  for (int t = 0; t < tr->tables; t++) ok = ok && b.keys[t] != NULL && b.rows[t] != NULL;
  if (!ok) {
    tr->failed = 1;
    snprintf(tr->failure, sizeof tr->failure, "disk tier: out of memory for the writer's batch");
  }
  while (ok && !tr->stop) {
    if (tr->buffer_bytes == 0) {
      pthread_cond_wait(&tr->wake, &tr->mu);
      continue;
    }
    const void *rows[CTR_TABLES_MAX];
    const uint64_t *keys[CTR_TABLES_MAX];
    /* A share of the transaction's bytes per table. */
    for (int t = 0; t < tr->tables; t++) {
      size_t cursor = 0;
      b.n[t] = sparse_table_scan(tr->buffer[t], &cursor, write_rows_max(tr, t) / (size_t)tr->tables,
                                 b.keys[t], b.rows[t]);
      keys[t] = b.keys[t];
      rows[t] = b.rows[t];
    }
    pthread_mutex_unlock(&tr->mu);
    ps_error err;
    size_t none[CTR_TABLES_MAX] = {0};
    ps_err rc = row_disk_write(tr->disk, keys, rows, b.n, NULL, none, &err);
    pthread_mutex_lock(&tr->mu);
    if (rc != PS_ERR_OK) {
      tr->failed = 1;
      snprintf(tr->failure, sizeof tr->failure, "disk tier: writing rows failed: %.450s", err.msg);
      break;
    }
    drop_written(tr, &b);
    for (int t = 0; t < tr->tables; t++) tr->written[t] += b.n[t];
    tr->commits++;
    pthread_cond_broadcast(&tr->drained);
  }
  pthread_cond_broadcast(&tr->drained);
  pthread_mutex_unlock(&tr->mu);
  write_batch_free(&b);
  return NULL;
}

ps_err tier_writer_start(store_tier *tr, ps_error *err) {
  tr->stop = 0;
  int rc = pthread_create(&tr->writer, NULL, writer_main, tr);
  if (rc != 0) {
    return ps_error_set(err, PS_ERR_INTERNAL, "disk tier: starting its writer thread: %s",
                        strerror(rc));
  }
  tr->writer_running = 1;
  return PS_ERR_OK;
}

void tier_writer_stop(store_tier *tr) {
  if (!tr->writer_running) return;
  pthread_mutex_lock(&tr->mu);
  tr->stop = 1;
  pthread_cond_broadcast(&tr->wake);
  pthread_mutex_unlock(&tr->mu);
  pthread_join(tr->writer, NULL);
  tr->writer_running = 0;
}

/* --- open and close ----------------------------------------------------------------- */

ps_err tier_buffers_create(store_tier *tr, ps_error *err) {
  for (int t = 0; t < tr->tables; t++) {
    sparse_table_config c = *sparse_table_config_of(tr->ps->store.tables[t]);
    c.budget = NULL; /* its reserved storage is taken out of the budget, below */
    c.spill = NULL;
    c.max_bytes = 0;
    c.admit_after = 0;
    c.evict_after = 0;
    sparse_table_destroy(tr->buffer[t]);
    tr->buffer[t] = NULL;
    if (sparse_table_create(&tr->buffer[t], &c, err) != PS_ERR_OK) return err->code;
    /* Every table's buffer as many rows (a key has a row in each), its
     * storage reserved: it never grows, so the budget bounds memory and
     * buffer together. */
    size_t per_row = 0;
    for (int u = 0; u < tr->tables; u++) per_row += row_bytes(tr, u) + 24; /* + the map's */
    size_t rows = tr->buffer_limit / per_row;
    tr->buffer_rows_max[t] = rows > 64 ? rows : 64;
    if (sparse_table_reserve(tr->buffer[t], tr->buffer_rows_max[t], err) != PS_ERR_OK) {
      return err->code;
    }
    sparse_table_stats st;
    sparse_table_stats_get(tr->buffer[t], &st);
    tr->buffer_reserved += st.bytes;
  }
  tr->buffer_bytes = 0;
  return PS_ERR_OK;
}

static void tier_free(store_tier *tr) {
  tier_writer_stop(tr);
  row_disk_close(tr->disk);
  for (int t = 0; t < CTR_TABLES_MAX; t++) {
    sparse_table_destroy(tr->buffer[t]);
    key_set_free(&tr->pins[t]);
  }
  key_set_free(&tr->asked);
  free(tr->missing);
  free(tr->install_keys);
  free(tr->install_rows);
  pthread_mutex_destroy(&tr->mu);
  pthread_cond_destroy(&tr->wake);
  pthread_cond_destroy(&tr->drained);
  free(tr);
}

ps_err store_tier_open(pserver *ps, ps_error *err) {
  if (ps->cfg.table_dir == NULL || ps->cfg.table_dir[0] == '\0' || ps->store.table_count == 0) {
    return PS_ERR_OK;
  }
  sparse_budget *budget = ps->cfg.table_budget;
  if (budget == NULL || budget->limit == SIZE_MAX) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "--table-dir needs a memory budget for the tables: set --table-memory-mb "
                        "(no memory limit could be read)");
  }
  store_tier *tr = calloc(1, sizeof *tr);
  if (tr == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "disk tier: out of memory");
  tr->ps = ps;
  tr->tables = ps->store.table_count;
  pthread_mutex_init(&tr->mu, NULL);
  pthread_cond_init(&tr->wake, NULL);
  pthread_cond_init(&tr->drained, NULL);
  snprintf(tr->dir, sizeof tr->dir, "%s/pserver-%d", ps->cfg.table_dir, ps->cfg.id);
  size_t bytes[CTR_TABLES_MAX];
  for (int t = 0; t < tr->tables; t++) {
    tr->row_floats[t] = sparse_table_row_floats(sparse_table_config_of(ps->store.tables[t]));
    bytes[t] = row_bytes(tr, t);
  }
  /* The buffer's share of the budget left for rows (admission filters are
   * held already). */
  size_t held = atomic_load(&budget->used);
  tr->buffer_limit = (budget->limit > held ? budget->limit - held : 0) / TIER_BUFFER_SHARE;
  if (tr->buffer_limit < TIER_BUFFER_MIN) tr->buffer_limit = TIER_BUFFER_MIN;
  ps_err rc = tier_buffers_create(tr, err);
  if (rc == PS_ERR_OK && tr->buffer_reserved >= budget->limit - held) {
    rc = ps_error_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                      "disk tier: its buffer's %.1f MiB leave no room for rows in the tables' "
                      "budget of %.1f MiB (%s)",
                      (double)tr->buffer_reserved / 1048576.0, (double)budget->limit / 1048576.0,
                      budget->source);
  }
  if (rc == PS_ERR_OK) rc = row_disk_open(&tr->disk, tr->dir, tr->tables, bytes, err);
  if (rc == PS_ERR_OK) rc = tier_writer_start(tr, err);
  if (rc != PS_ERR_OK) {
    tier_free(tr);
    return rc;
  }
  budget->limit -= tr->buffer_reserved; /* given back at close */
  tr->spill = (sparse_spill){.begin = spill_begin, .pinned = spill_pinned, .put = spill_put,
                             .ctx = tr};
  for (int t = 0; t < tr->tables; t++) sparse_table_set_spill(ps->store.tables[t], &tr->spill);
  ps->store.tier = tr;
  LOG_INFO("disk tier: rows past %.1f MiB in memory move to %s (%.1f MiB of --table-memory-mb "
           "for rows on their way there)",
           (double)budget->limit / 1048576.0, row_disk_path(tr->disk),
           (double)tr->buffer_reserved / 1048576.0);
  return PS_ERR_OK;
}

void store_tier_close(pserver *ps) {
  store_tier *tr = tier_of(ps);
  if (tr == NULL) return;
  for (int t = 0; t < tr->tables; t++) {
    if (ps->store.tables[t] != NULL) sparse_table_set_spill(ps->store.tables[t], NULL);
  }
  if (ps->cfg.table_budget != NULL) ps->cfg.table_budget->limit += tr->buffer_reserved;
  tier_free(tr);
  ps->store.tier = NULL;
}

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
  int first = f->passes == 1; /* where the request's rows were when it came */
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
      if (f->found[t][i]) tr->disk_hits++;
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

ps_err store_tier_read(pserver *ps, tier_fetch *f, ps_error *err) {
  store_tier *tr = tier_of(ps);
  for (int t = 0; t < tr->tables; t++) {
    if (f->n[t] > 0 &&
        row_disk_read(tr->disk, t, f->keys[t], f->n[t], f->rows[t], f->found[t], err) !=
            PS_ERR_OK) {
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
