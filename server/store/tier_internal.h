/* The disk tier's state, shared by its two files: tier.c (the spill, the
 * buffer's writer, a request's rows, open and close) and tier_contents.c
 * (a table's whole rows: checkpoints, exports, loads; figures). */
#ifndef PSTRAIN_SERVER_STORE_TIER_INTERNAL_H
#define PSTRAIN_SERVER_STORE_TIER_INTERNAL_H

#include <pthread.h>

#include "common/sparse_table.h"
#include "server/pserver_internal.h"
#include "server/store/row_disk.h"
#include "server/store/tier.h"

/* Bytes of rows the writer takes out of the buffer per transaction, and a
 * load writes per transaction (rows of 4 KiB and of 76 bytes alike). */
#define TIER_WRITE_BYTES ((size_t)4 << 20)
/* Keys a load deletes per transaction. */
#define TIER_DELETE_BATCH 32768

/* A set of keys: open addressing, cleared by a new stamp. */
typedef struct key_set {
  uint64_t *keys;
  uint32_t *stamp;
  size_t cap;
  uint32_t now;
} key_set;

struct store_tier {
  pserver *ps;
  row_disk *disk;
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
