/* A table's whole rows with a disk tier: memory, buffer and disk merged in
 * key order (checkpoints, exports), a checkpoint's rows spread over memory
 * and disk (resume, rollback, re-sharding), and the tier's figures. These
 * run with the pserver's lock held and read or write the disk there: they
 * are not the request path (a checkpoint's copy, an export, a load). */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/grow.h"
#include "common/log.h"
#include "server/store/tier_internal.h"

/* A table's buffered rows, ascending: keys and whole rows. */
typedef struct sorted_rows {
  uint64_t *keys;
  float *rows;
  size_t n, row_floats;
} sorted_rows;

static const uint64_t *sort_keys;
static int by_key(const void *a, const void *b) {
  uint64_t x = sort_keys[*(const size_t *)a], y = sort_keys[*(const size_t *)b];
  return x < y ? -1 : x > y;
}

/* Sorts s by key (an index sort: rows move once). */
static int sort_rows(sorted_rows *s) {
  if (s->n < 2) return 1;
  size_t *order = malloc(s->n * sizeof *order);
  uint64_t *keys = malloc(s->n * sizeof *keys);
  float *rows = malloc(s->n * s->row_floats * sizeof *rows);
  if (order == NULL || keys == NULL || rows == NULL) {
    free(order);
    free(keys);
    free(rows);
    return 0;
  }
  for (size_t i = 0; i < s->n; i++) order[i] = i;
  sort_keys = s->keys; /* under the pserver's lock: one sort at a time */
  qsort(order, s->n, sizeof *order, by_key);
  for (size_t i = 0; i < s->n; i++) {
    keys[i] = s->keys[order[i]];
    memcpy(rows + i * s->row_floats, s->rows + order[i] * s->row_floats,
           s->row_floats * sizeof *rows);
  }
  free(order);
  free(s->keys);
  free(s->rows);
  s->keys = keys;
  s->rows = rows;
  return 1;
}

/* Appends a whole row to r as sparse_table_dump's parts. */
static void append_whole(pserver_rows *r, const sparse_table *t, uint64_t key, const float *row) {
  size_t at = r->rows++, dim = (size_t)r->dim, sf = (size_t)r->state_floats;
  r->keys[at] = key;
  memcpy(r->values + at * dim, row, dim * sizeof *row);
  if (sf > 0) memcpy(r->state + at * sf, row + dim, sf * sizeof *row);
  sparse_table_row_meta(t, row, &r->meta[2 * at]);
}

/* A table's rows as they were at one moment under the lock: memory's and
 * the buffer's copied (whole rows, ascending), the disk's as the row
 * store's snapshot; merged in key order by tier_snapshot_next, off the lock. */
struct store_tier_snapshot {
  store_tier *tr;
  int t;
  const sparse_table *hot; /* for its rows' layout only (fixed while the job lasts) */
  long horizon;
  sorted_rows mem, buf;
  row_disk_snapshot *disk;
  size_t rows; /* counted: store_tier_snapshot_count */
  /* the merge's place */
  size_t i, j;
  int dhave;
  uint64_t dkey;
  float *drow;
};

/* A table's whole rows into s (mu held for the buffer), sorted. */
static ps_err copy_rows(sparse_table *t, sorted_rows *s, size_t rf, ps_error *err) {
  sparse_table_stats st;
  sparse_table_stats_get(t, &st);
  s->row_floats = rf;
  s->n = 0;
  if (st.rows == 0) return PS_ERR_OK;
  s->keys = malloc(st.rows * sizeof *s->keys);
  s->rows = malloc(st.rows * rf * sizeof *s->rows);
  if (s->keys == NULL || s->rows == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "disk tier: out of memory for a copy of %zu rows",
                        st.rows);
  }
  size_t cursor = 0;
  s->n = sparse_table_scan(t, &cursor, st.rows, s->keys, s->rows);
  if (!sort_rows(s)) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "disk tier: out of memory sorting %zu rows", s->n);
  }
  return PS_ERR_OK;
}

void store_tier_snapshot_free(store_tier_snapshot *s) {
  if (s == NULL) return;
  if (s->disk != NULL) row_disk_snapshot_end(s->disk);
  free(s->mem.keys);
  free(s->mem.rows);
  free(s->buf.keys);
  free(s->buf.rows);
  free(s->drow);
  free(s);
}

ps_err store_tier_snapshot_take(pserver *ps, int t, store_tier_snapshot **out, ps_error *err) {
  store_tier *tr = tier_of(ps);
  *out = NULL;
  store_tier_snapshot *s = calloc(1, sizeof *s);
  if (s == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "disk tier: out of memory");
  s->tr = tr;
  s->t = t;
  s->hot = ps->store.tables[t];
  s->horizon = sparse_table_forgotten_before(s->hot);
  size_t rf = tr->row_floats[t];
  s->drow = malloc(rf * sizeof *s->drow);
  ps_err rc = s->drow != NULL ? copy_rows(ps->store.tables[t], &s->mem, rf, err)
                              : ps_error_set(err, PS_ERR_NO_MEMORY, "disk tier: out of memory");
  /* The buffer's copy and the disk's snapshot under mu: a row leaves the
   * buffer only after the disk holds it, so each row is in one or both. */
  pthread_mutex_lock(&tr->mu);
  if (rc == PS_ERR_OK) rc = copy_rows(tr->buffer[t], &s->buf, rf, err);
  if (rc == PS_ERR_OK) rc = row_disk_snapshot_begin(tr->disk, &s->disk, err);
  pthread_mutex_unlock(&tr->mu);
  if (rc != PS_ERR_OK) {
    store_tier_snapshot_free(s);
    return rc;
  }
  *out = s;
  return PS_ERR_OK;
}

void store_tier_snapshot_rewind(store_tier_snapshot *s) {
  s->i = s->j = 0;
  s->dhave = -2; /* not read yet */
  row_disk_snapshot_rewind(s->disk, s->t);
}

int store_tier_snapshot_next(store_tier_snapshot *s, uint64_t *key, const float **row,
                             ps_error *err) {
  size_t rf = s->tr->row_floats[s->t];
  for (;;) {
    if (s->dhave == -2) s->dhave = row_disk_snapshot_next(s->disk, s->t, &s->dkey, s->drow, err);
    if (s->dhave < 0) return -1;
    uint64_t k = 0;
    int any = 0;
    if (s->i < s->mem.n) k = s->mem.keys[s->i], any = 1;
    if (s->j < s->buf.n && (!any || s->buf.keys[s->j] < k)) k = s->buf.keys[s->j], any = 1;
    if (s->dhave == 1 && (!any || s->dkey < k)) k = s->dkey, any = 1;
    if (!any) return 0;
    /* Where a key is in several places, memory is newest, then the buffer. */
    const float *got = NULL;
    int forgettable = 1;
    if (s->i < s->mem.n && s->mem.keys[s->i] == k) {
      got = s->mem.rows + s->i++ * rf;
      forgettable = 0;
    }
    if (s->j < s->buf.n && s->buf.keys[s->j] == k) {
      if (got == NULL) got = s->buf.rows + s->j * rf;
      s->j++;
    }
    if (s->dhave == 1 && s->dkey == k) {
      if (got == NULL) got = s->drow; /* valid until the next call reads on */
      s->dhave = -2;
    }
    /* Rows moved out before eviction forgot their step are forgotten too. */
    if (!forgettable || sparse_table_row_step(s->hot, got) >= s->horizon) {
      *key = k;
      *row = got;
      return 1;
    }
  }
}

ps_err store_tier_snapshot_count(store_tier_snapshot *s, size_t *rows, ps_error *err) {
  store_tier_snapshot_rewind(s);
  size_t n = 0;
  uint64_t key;
  const float *row;
  int got;
  while ((got = store_tier_snapshot_next(s, &key, &row, err)) == 1) n++;
  if (got < 0) return err->code;
  *rows = s->rows = n;
  return PS_ERR_OK;
}

const sparse_table *store_tier_snapshot_table(const store_tier_snapshot *s) { return s->hot; }

ps_err store_tier_take_rows(pserver *ps, int t, pserver_rows *r, ps_error *err) {
  if (tier_of(ps) == NULL) return pserver_rows_take(r, ps->store.tables[t], err);
  store_tier_snapshot *s;
  if (store_tier_snapshot_take(ps, t, &s, err) != PS_ERR_OK) return err->code;
  size_t n = 0;
  ps_err rc = store_tier_snapshot_count(s, &n, err);
  r->rows = 0;
  if (rc == PS_ERR_OK) rc = pserver_rows_reserve(r, ps->store.tables[t], n, err);
  if (rc == PS_ERR_OK) {
    store_tier_snapshot_rewind(s);
    uint64_t key;
    const float *row;
    int got;
    while ((got = store_tier_snapshot_next(s, &key, &row, err)) == 1) {
      append_whole(r, ps->store.tables[t], key, row);
    }
    if (got < 0) rc = err->code;
  }
  store_tier_snapshot_free(s);
  return rc;
}

/* --- loads ------------------------------------------------------------------------------ */

static const int64_t *sort_meta;
static int by_recency(const void *a, const void *b) {
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  int64_t sx = sort_meta[2 * x], sy = sort_meta[2 * y];
  if (sx != sy) return sx > sy ? -1 : 1;
  return x < y ? -1 : x > y;
}

/* Checks what sparse_table_load would of the rows going to disk: no key
 * twice, meta in range. */
static ps_err check_rows(const sparse_table *t, const pserver_rows *r, ps_error *err) {
  const char *name = sparse_table_config_of(t)->name;
  for (size_t i = 0; i < r->rows; i++) {
    if (r->meta[2 * i] < 0 || r->meta[2 * i] > ((int64_t)1 << 40) - 2 || r->meta[2 * i + 1] < 0) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                          "table '%s': row %zu (key %llu) has last step %lld and count %lld",
                          name, i, (unsigned long long)r->keys[i], (long long)r->meta[2 * i],
                          (long long)r->meta[2 * i + 1]);
    }
  }
  uint64_t *keys = malloc((r->rows > 0 ? r->rows : 1) * sizeof *keys);
  if (keys == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "table '%s': out of memory", name);
  memcpy(keys, r->keys, r->rows * sizeof *keys);
  size_t *order = malloc((r->rows > 0 ? r->rows : 1) * sizeof *order);
  if (order == NULL) {
    free(keys);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "table '%s': out of memory", name);
  }
  for (size_t i = 0; i < r->rows; i++) order[i] = i;
  sort_keys = keys;
  qsort(order, r->rows, sizeof *order, by_key);
  ps_err rc = PS_ERR_OK;
  for (size_t i = 1; i < r->rows && rc == PS_ERR_OK; i++) {
    if (keys[order[i]] == keys[order[i - 1]]) {
      rc = ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "table '%s': key %llu appears twice",
                        name, (unsigned long long)keys[order[i]]);
    }
  }
  free(order);
  free(keys);
  return rc;
}

/* Writes rows order[from..n) of r to disk as whole rows, in batches. */
static ps_err write_rest(store_tier *tr, int t, const pserver_rows *r, const size_t *order,
                         size_t from, ps_error *err) {
  size_t rf = tr->row_floats[t], dim = (size_t)r->dim, sf = (size_t)r->state_floats;
  const sparse_table *hot = tr->ps->store.tables[t];
  size_t batch = write_rows_max(tr, t);
  uint64_t *keys = malloc(batch * sizeof *keys);
  float *rows = malloc(batch * rf * sizeof *rows);
  ps_err rc = keys != NULL && rows != NULL
                  ? PS_ERR_OK
                  : ps_error_set(err, PS_ERR_NO_MEMORY, "disk tier: out of memory");
  for (size_t at = from; rc == PS_ERR_OK && at < r->rows;) {
    size_t n = 0;
    for (; n < batch && at < r->rows; n++, at++) {
      size_t i = order[at];
      keys[n] = r->keys[i];
      sparse_table_row_pack(hot, r->values + i * dim, sf > 0 ? r->state + i * sf : NULL,
                            &r->meta[2 * i], rows + n * rf);
    }
    const uint64_t *kp[CTR_TABLES_MAX] = {0}, *dels[CTR_TABLES_MAX] = {0};
    const void *rp[CTR_TABLES_MAX] = {0};
    size_t counts[CTR_TABLES_MAX] = {0}, none[CTR_TABLES_MAX] = {0};
    kp[t] = keys;
    rp[t] = rows;
    counts[t] = n;
    rc = row_disk_write(tr->disk, kp, rp, counts, dels, none, err);
    if (rc == PS_ERR_OK) {
      pthread_mutex_lock(&tr->mu);
      tr->written[t] += n;
      pthread_mutex_unlock(&tr->mu);
    }
  }
  free(keys);
  free(rows);
  return rc;
}

/* The first k rows of order (the most lately seen) as the table's rows. */
static ps_err load_memory(sparse_table *hot, const pserver_rows *r, const size_t *order, size_t k,
                          ps_error *err) {
  pserver_rows part = {0};
  ps_err rc = pserver_rows_reserve(&part, hot, k, err);
  for (size_t i = 0; rc == PS_ERR_OK && i < k; i++) pserver_rows_append(&part, r, order[i]);
  if (rc == PS_ERR_OK) rc = pserver_rows_load(hot, &part, err);
  pserver_rows_free(&part);
  return rc;
}

ps_err store_tier_load_rows(pserver *ps, int t, const pserver_rows *r, ps_error *err) {
  store_tier *tr = tier_of(ps);
  sparse_table *hot = ps->store.tables[t];
  if (tr == NULL) return pserver_rows_load(hot, r, err);
  if (check_rows(hot, r, err) != PS_ERR_OK) return err->code;
  size_t *order = malloc((r->rows > 0 ? r->rows : 1) * sizeof *order);
  if (order == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "disk tier: out of memory");
  for (size_t i = 0; i < r->rows; i++) order[i] = i;
  sort_meta = r->meta;
  qsort(order, r->rows, sizeof *order, by_recency);
  /* The writer stops while the table's rows are replaced, the buffer's
   * rows of it go, and reads begun before are not installed (commits). */
  tier_writer_stop(tr);
  pthread_mutex_lock(&tr->mu);
  float *row = malloc(tr->row_floats[t] * sizeof *row);
  uint64_t *keys = NULL;
  size_t n = 0;
  sparse_table_stats bs;
  sparse_table_stats_get(tr->buffer[t], &bs);
  if (row != NULL && bs.rows > 0 && (keys = malloc(bs.rows * sizeof *keys)) != NULL) {
    float *rows = malloc(bs.rows * tr->row_floats[t] * sizeof *rows);
    size_t cursor = 0;
    if (rows != NULL) n = sparse_table_scan(tr->buffer[t], &cursor, bs.rows, keys, rows);
    free(rows);
  }
  for (size_t i = 0; i < n; i++) tier_buffer_take(tr, t, keys[i], row);
  tr->commits++;
  pthread_mutex_unlock(&tr->mu);
  free(keys);
  free(row);
  ps_err rc = row_disk_clear(tr->disk, t, err); /* a load replaces them */
  /* The most lately seen rows that fit its share of the memory, tried
   * smaller until they do; the rest to disk. */
  size_t k = r->rows, bytes = row_bytes(tr, t) + 24;
  size_t share = ps->cfg.table_budget->limit / (size_t)tr->tables * 9 / 10 / bytes;
  if (k > share) k = share;
  while (rc == PS_ERR_OK) {
    ps_error tried;
    ps_err lr = load_memory(hot, r, order, k, &tried);
    if (lr == PS_ERR_OK) break;
    if (lr != PS_ERR_RESOURCE_EXHAUSTED || k == 0) {
      *err = tried;
      rc = lr;
      break;
    }
    k = k * 3 / 4;
  }
  if (rc == PS_ERR_OK) rc = write_rest(tr, t, r, order, k, err);
  free(order);
  ps_error started;
  if (tier_writer_start(tr, &started) != PS_ERR_OK && rc == PS_ERR_OK) {
    *err = started;
    rc = started.code;
  }
  if (rc == PS_ERR_OK && k < r->rows) {
    LOG_INFO("disk tier: table '%s' loaded: %zu rows in memory, %zu on disk",
             sparse_table_config_of(hot)->name, k, r->rows - k);
  }
  return rc;
}

/* --- figures ---------------------------------------------------------------------------- */

void store_tier_stats_quick(const pserver *ps, store_tier_stats *out) {
  memset(out, 0, sizeof *out);
  store_tier *tr = ps->store.tier;
  if (tr == NULL) return;
  out->lookups = tr->lookups;
  out->ahead = tr->ahead_buffer + tr->ahead_disk;
  out->hits = tr->hits > out->ahead ? tr->hits - out->ahead : 0;
  for (int t = 0; t < tr->tables; t++) {
    sparse_table_stats st;
    sparse_table_stats_get(ps->store.tables[t], &st);
    out->rows_memory += st.rows;
  }
  row_disk_bytes(tr->disk, &out->disk_bytes_read, &out->disk_bytes_written);
}

void store_tier_stats_get(const pserver *ps, store_tier_stats *out) {
  store_tier_stats_quick(ps, out);
  store_tier *tr = ps->store.tier;
  if (tr == NULL) return;
  out->buffer_hits = tr->buffer_hits;
  out->disk_hits = tr->disk_hits;
  out->disk_misses = tr->disk_misses;
  out->reads_under_lock = tr->reads_under_lock;
  out->buffer_limit = tr->buffer_limit;
  pthread_mutex_lock(&tr->mu);
  for (int t = 0; t < tr->tables; t++) {
    sparse_table_stats st;
    sparse_table_stats_get(tr->buffer[t], &st);
    out->rows_buffer += st.rows;
  }
  pthread_mutex_unlock(&tr->mu);
  row_disk_stats ds;
  row_disk_stats_get(tr->disk, &ds);
  for (int t = 0; t < tr->tables; t++) out->rows_disk += ds.rows[t];
  out->file_bytes = ds.file_bytes;
}

void store_tier_log_stats(const pserver *ps, long step) {
  store_tier *tr = ps->store.tier;
  if (tr == NULL) return;
  store_tier_stats now;
  store_tier_stats_get(ps, &now);
  const store_tier_stats *was = &tr->logged;
  double t = now_s(), dt = tr->logged_at > 0 ? t - tr->logged_at : 0;
  uint64_t asked = now.lookups - was->lookups;
  double pct = asked > 0 ? 100.0 / (double)asked : 0;
  LOG_INFO("step %ld: disk tier: %llu rows in memory, %llu buffered, %llu on disk (%.1f MiB of "
           "files, %.0f bytes a row); of %llu rows asked for since the last line %.2f%% were in "
           "memory, %.2f%% "
           "brought in ahead, %.2f%% buffered, %.2f%% read from disk, %.2f%% new; disk %.2f MB/s "
           "read, %.2f MB/s written; "
           "since the start %.2f%% in memory, %.1f MB read, %.1f MB written%s",
           step, (unsigned long long)now.rows_memory, (unsigned long long)now.rows_buffer,
           (unsigned long long)now.rows_disk, (double)now.file_bytes / 1048576.0,
           now.rows_disk > 0 ? (double)now.file_bytes / (double)now.rows_disk : 0.0,
           (unsigned long long)asked, pct * (double)(now.hits - was->hits),
           pct * (double)(now.ahead - was->ahead),
           pct * (double)(now.buffer_hits - was->buffer_hits),
           pct * (double)(now.disk_hits - was->disk_hits),
           pct * (double)(now.disk_misses - was->disk_misses),
           dt > 0 ? (double)(now.disk_bytes_read - was->disk_bytes_read) / dt / 1e6 : 0.0,
           dt > 0 ? (double)(now.disk_bytes_written - was->disk_bytes_written) / dt / 1e6 : 0.0,
           now.lookups > 0 ? 100.0 * (double)now.hits / (double)now.lookups : 0.0,
           (double)now.disk_bytes_read / 1e6, (double)now.disk_bytes_written / 1e6,
           now.reads_under_lock > was->reads_under_lock ? " (some read with the lock held)" : "");
  tr->logged = now;
  tr->logged_at = t;
}
