/* The disk tier below a pserver's sparse tables (--table-dir): the tables
 * keep the rows seen most lately within --table-memory-mb; the others move
 * to a write-back buffer and from there, on the tier's writer thread, to the
 * row store on local disk (row_disk.h). A request's rows come back before
 * its handling: store_tier_prepare (under the pserver's lock) takes buffered
 * rows back and names the rows to read; the handler reads them with the lock
 * released (store_tier_read) and handles the request again, the read rows
 * installed then. A row is in exactly one of: a table, the buffer, the disk
 * (where an older copy may stay behind a newer one above it): a row is read
 * from disk only when it is in neither, and a buffered row leaves the buffer
 * only once the disk holds the same bytes, so none is read stale. */
#ifndef PSTRAIN_SERVER_STORE_TIER_H
#define PSTRAIN_SERVER_STORE_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "common/ctr_tables.h"
#include "common/error.h"
#include "common/rpc.h"
#include "server/pserver_shard_file.h"

struct pserver;
typedef struct store_tier store_tier;

/* A request's rows to read from disk, carried across its handling's passes. */
typedef struct tier_fetch {
  uint64_t *keys[CTR_TABLES_MAX];
  float *rows[CTR_TABLES_MAX]; /* whole rows, read */
  uint8_t *found[CTR_TABLES_MAX];
  size_t n[CTR_TABLES_MAX], cap[CTR_TABLES_MAX];
  uint64_t commits; /* the tier's write-backs when the keys were chosen */
  struct store_rows_stash *stash; /* the request's checked rows, between passes */
  /* A read-only request (an evaluation's lookup): its rows from the buffer
   * and the disk are served from here, not installed in the tables (they
   * would take memory and push out rows training uses). Sorted by key. */
  int read_only;
  uint64_t *ov_keys[CTR_TABLES_MAX];
  float *ov_rows[CTR_TABLES_MAX]; /* whole rows */
  size_t ov_n[CTR_TABLES_MAX], ov_cap[CTR_TABLES_MAX];
  int read;         /* rows read for those keys */
  int passes;
  /* A PULL_PREFETCH, answered: best effort (rows that cannot be made room
   * for, or keep moving out, are left for the push), not counted as asked
   * for; set while rows remain to read (store_tier_prefetch_finish). */
  int best_effort, prefetch;
  uint64_t tier_serial; /* the tier that named its keys (a job reset opens another) */
} tier_fetch;

void tier_fetch_free(tier_fetch *f);

typedef struct store_tier_stats {
  uint64_t lookups, hits, buffer_hits, disk_hits, disk_misses; /* keys asked for by requests */
  uint64_t rows_memory, rows_buffer, rows_disk;
  uint64_t disk_bytes_read, disk_bytes_written, file_bytes;
  /* Rows prefetches brought into memory (from the buffer or the disk)
   * before their request came, which found them there: not counted in
   * hits, so hits are what memory held by itself. */
  uint64_t ahead;
  uint64_t reads_under_lock; /* rows read with the lock held (a request's rows moved out
                                between its passes again and again, exports, loads) */
  size_t buffer_limit;       /* bytes of the budget kept for the buffer */
} store_tier_stats;

/* For a job with tables and cfg.table_dir set (nothing otherwise): opens the
 * store in table_dir/pserver-<id> (emptied), takes the buffer's share out
 * of the tables' budget and starts the writer; the tables' rows move out
 * from then on. */
ps_err store_tier_open(struct pserver *ps, ps_error *err);
/* Stops the writer and removes the store's files. */
void store_tier_close(struct pserver *ps);

/* Lock held, the request's rows checked (store_rows' req): installs the
 * rows f read (still valid), takes buffered ones back; 1 when rows must be
 * read first (the caller releases the lock, calls store_tier_read and
 * handles the request again), 0 when every row it names is in memory or
 * new, -1 on error (err: the request is refused with it). */
int store_tier_prepare(struct pserver *ps, tier_fetch *f, ps_error *err);
/* Lock held, after a read-only request was handled: its rows are no longer
 * served (store_tier_lookup_rows). */
void store_tier_release(struct pserver *ps);
/* Lock held: the read-only request's rows of table t that are not in
 * memory, from its buffer and disk copies, into rows (n x dim); rows of
 * keys in memory are left as the table wrote them. */
void store_tier_lookup_rows(struct pserver *ps, int t, const uint64_t *keys, size_t n,
                            float *rows);
/* Lock held, a PULL_PREFETCH's keys checked (store_rows' req): they stay
 * in memory from now until the trainer's next push (pinned), its buffered
 * rows come back now, and f->prefetch is set when some are on disk, to read
 * with store_tier_prefetch_finish once the call is answered. Best effort:
 * a failure leaves the rows to the push. Nothing without a tier. */
void store_tier_prefetch_begin(struct pserver *ps, tier_fetch *f, int trainer);
/* Lock held: answers a PULL_PREFETCH with the tier's figures (no rows;
 * zeros without a tier). */
void store_tier_answer_prefetch(struct pserver *ps, rpc_call *call);
/* No lock, the prefetch answered: reads its rows and installs them (as a
 * request's passes; dropped when the job was reset meanwhile). */
void store_tier_prefetch_finish(struct pserver *ps, tier_fetch *f);
/* Lock held: trainer's prefetched keys are no longer held (its push came). */
void store_tier_prefetch_done(struct pserver *ps, int trainer);
/* No lock: reads f's rows from disk. */
ps_err store_tier_read(struct pserver *ps, tier_fetch *f, ps_error *err);
/* No lock: waits (bounded) while the buffer is over its share, so requests
 * do not outrun the disk. */
void store_tier_wait_room(struct pserver *ps);

/* A table's rows at one moment, to read off the lock (a checkpoint of a
 * table mostly on disk, never all in memory): taken with the lock held
 * (memory's and the buffer's rows copied, the disk's a snapshot), then
 * iterated ascending, once or again after a rewind, on any one thread. */
typedef struct store_tier_snapshot store_tier_snapshot;
ps_err store_tier_snapshot_take(struct pserver *ps, int t, store_tier_snapshot **out,
                                ps_error *err);
/* Counts the rows (a pass over them); rewinds first. */
ps_err store_tier_snapshot_count(store_tier_snapshot *s, size_t *rows, ps_error *err);
void store_tier_snapshot_rewind(store_tier_snapshot *s);
/* The next row, ascending: 1 with *key and *row (a whole row, valid until
 * the next call), 0 at the end, -1 on error. */
int store_tier_snapshot_next(store_tier_snapshot *s, uint64_t *key, const float **row,
                             ps_error *err);
/* The table whose rows these are (their layout: sparse_table_row_meta). */
const struct sparse_table *store_tier_snapshot_table(const store_tier_snapshot *s);
void store_tier_snapshot_free(store_tier_snapshot *s);

/* Lock held: every row of table t (memory, buffer and disk), ascending, into r. */
ps_err store_tier_take_rows(struct pserver *ps, int t, pserver_rows *r, ps_error *err);
/* Lock held: table t's rows become r's (its buffered and disk rows gone):
 * the ones seen most lately that fit in memory, the rest on disk. */
ps_err store_tier_load_rows(struct pserver *ps, int t, const pserver_rows *r, ps_error *err);

/* Zeros without a tier. */
void store_tier_stats_get(const struct pserver *ps, store_tier_stats *out);
/* Lock held: the figures cheap to take on every request (lookups, hits,
 * ahead, rows in memory, disk bytes; the rest zero). */
void store_tier_stats_quick(const struct pserver *ps, store_tier_stats *out);
/* The statistics line's part (nothing without a tier): rows where, the hit
 * rate and the disk's bytes per second since the last line. */
void store_tier_log_stats(const struct pserver *ps, long step);

#endif
