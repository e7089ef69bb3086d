/* The disk tier's state, shared by its files: tier.c (the spill, the
 * buffer's writer, open and close), tier_request.c (a request's rows) and
 * tier_contents.c (a table's whole rows: checkpoints, exports, loads;
 * figures). */
#ifndef PSTRAIN_SERVER_STORE_TIER_INTERNAL_H
#define PSTRAIN_SERVER_STORE_TIER_INTERNAL_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/sparse_table.h"
#include "server/pserver_internal.h"
#include "server/store/row_disk.h"
#include "server/store/tier.h"
#include "server/store/tier_readers.h"

/* Bytes of rows the writer takes out of the buffer per transaction, and a
 * load writes per transaction (rows of 4 KiB and of 76 bytes alike). */
#define TIER_WRITE_BYTES ((size_t)4 << 20)

/* A set of keys: open addressing, cleared by a new stamp. */
typedef struct key_set {
  uint64_t *keys;
  uint32_t *stamp;
  size_t cap;
  uint32_t now;
} key_set;

/* A trainer's prefetched keys per table, kept in memory until its push. */
typedef struct tier_ahead {
  uint64_t *keys[CTR_TABLES_MAX];
  size_t n[CTR_TABLES_MAX], cap[CTR_TABLES_MAX];
} tier_ahead;

struct store_tier {
  pserver *ps;
  uint64_t serial; /* which tier this is: one per job configured, never reused */
  row_disk *disk;
  tier_readers *readers;
  char dir[4096];
  int tables;
  size_t row_floats[CTR_TABLES_MAX];
  sparse_spill spill;
  /* Under mu: the buffer (rows on their way to disk), its bytes, the
   * write-backs done, a writer's failure. */
  pthread_mutex_t mu;
  pthread_cond_t wake, drained;
  sparse_table *buffer[CTR_TABLES_MAX];
  size_t buffer_bytes, buffer_limit;
  size_t buffer_rows_max[CTR_TABLES_MAX]; /* rows each table's buffer has storage for */
  size_t buffer_reserved; /* bytes of that storage, taken out of the tables' budget */
  uint64_t commits;
  uint64_t written[CTR_TABLES_MAX]; /* rows ever written to disk: none, nothing to read */
  int stop, failed;
  char failure[512];
  pthread_t writer;
  int writer_running;
  /* Under the pserver's lock. */
  key_set pins[CTR_TABLES_MAX];
  tier_ahead *ahead; /* (ahead_trainers) */
  int ahead_trainers;
  uint64_t ahead_buffer, ahead_disk; /* rows prefetches took back from the buffer, read */
  key_set asked;
  uint32_t *missing; /* a request's keys not in memory (their indices) */
  tier_fetch *serving; /* a read-only request's rows, while it is handled */
  uint64_t *install_keys;
  float *install_rows;
  size_t install_cap;
  uint64_t lookups, hits, buffer_hits, disk_hits, disk_misses, reads_under_lock;
  store_tier_stats logged; /* at the last statistics line, for its rates */
  double logged_at;
};


static inline int key_set_reset(key_set *s, size_t n) {
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

static inline size_t key_set_slot(const key_set *s, uint64_t key) {
  uint64_t h = (key ^ 0x9e3779b97f4a7c15ULL) * 0xbf58476d1ce4e5b9ULL;
  return (size_t)(h >> 32) & (s->cap - 1);
}

static inline void key_set_add(key_set *s, uint64_t key) {
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

static inline int key_set_has(const key_set *s, uint64_t key) {
  if (s->cap == 0) return 0;
  size_t mask = s->cap - 1;
  for (size_t i = key_set_slot(s, key);; i = (i + 1) & mask) {
    if (s->stamp[i] != s->now) return 0;
    if (s->keys[i] == key) return 1;
  }
}

static inline void key_set_free(key_set *s) {
  free(s->keys);
  free(s->stamp);
  memset(s, 0, sizeof *s);
}


static inline store_tier *tier_of(pserver *ps) { return ps->store.tier; }
static inline size_t row_bytes(const store_tier *tr, int t) {
  return tr->row_floats[t] * sizeof(float);
}
/* Rows of table t in one write. */
static inline size_t write_rows_max(const store_tier *tr, int t) {
  size_t n = TIER_WRITE_BYTES / row_bytes(tr, t);
  return n > 16 ? n : 16;
}

/* mu held: key's buffered row of table t taken out into row: 1, or 0 without one. */
int tier_buffer_take(store_tier *tr, int t, uint64_t key, float *row);
/* Empty buffer tables for the job's tables (mu held or no writer). */
ps_err tier_buffers_create(store_tier *tr, ps_error *err);
/* The writer thread: started, and stopped (joined; it takes only mu). */
ps_err tier_writer_start(store_tier *tr, ps_error *err);
void tier_writer_stop(store_tier *tr);

#endif
