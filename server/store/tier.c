/* The disk tier (tier.h), rows on their way out: the spill the tables move
 * rows to, the buffer and its writer thread, and the tier's start and end.
 * A request's rows coming back are tier_request.c's; a table's whole rows
 * tier_contents.c's. Locks: the pserver's, then the tier's `mu` (buffer,
 * commits, failure); the writer takes only `mu`, so the tier can be stopped
 * with the pserver's lock held. */
#include "server/store/tier.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "server/pserver_internal.h"
#include "server/store/rows.h"
#include "server/store/tier_internal.h"

/* The buffer's share of --table-memory-mb (1/8): about two of the tables'
 * moves of 1/16 each. */
#define TIER_BUFFER_SHARE 8
#define TIER_BUFFER_MIN ((size_t)64 << 10)
/* Threads reading a request's rows beside the handler's own (tier_readers.h). */
#define TIER_READERS 7

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
 * checked rows, and every trainer's kept pushes, next keys, pulls and
 * prefetched keys. */
static void spill_begin(void *ctx) {
  store_tier *tr = ctx;
  pserver *ps = tr->ps;
  store_rows *sp = ps->store.rows;
  for (int t = 0; t < tr->tables; t++) {
    size_t n = sp->req[SPARSE_FIELD_GRADS][t].n + sp->req[SPARSE_FIELD_KEYS][t].n;
    for (int i = 0; i < ps->cfg.trainers; i++) {
      n += sp->trainers[i].grads[t].n + sp->trainers[i].next[t].n + sp->trainers[i].pull[t].n;
    }
    for (int i = 0; i < tr->ahead_trainers; i++) n += tr->ahead[i].n[t];
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
    for (int i = 0; i < tr->ahead_trainers; i++) {
      for (size_t k = 0; k < tr->ahead[i].n[t]; k++) key_set_add(s, tr->ahead[i].keys[t][k]);
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
  tier_readers_stop(tr->readers);
  row_disk_close(tr->disk);
  for (int t = 0; t < CTR_TABLES_MAX; t++) {
    sparse_table_destroy(tr->buffer[t]);
    key_set_free(&tr->pins[t]);
  }
  for (int i = 0; i < tr->ahead_trainers; i++) {
    for (int t = 0; t < CTR_TABLES_MAX; t++) free(tr->ahead[i].keys[t]);
  }
  free(tr->ahead);
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
  static atomic_uint_fast64_t opened;
  tr->ps = ps;
  tr->serial = atomic_fetch_add(&opened, 1) + 1;
  tr->tables = ps->store.table_count;
  tr->ahead = calloc((size_t)ps->cfg.trainers, sizeof *tr->ahead);
  if (tr->ahead == NULL) {
    free(tr);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "disk tier: out of memory");
  }
  tr->ahead_trainers = ps->cfg.trainers;
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
  if (rc == PS_ERR_OK) rc = tier_readers_start(&tr->readers, tr->disk, TIER_READERS, err);
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

