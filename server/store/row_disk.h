/* The disk tier's store (--table-dir): the cold rows of a pserver's sparse
 * tables in one LMDB environment on local disk, one database per table,
 * key -> the row's bytes as the table holds them (values, optimizer state,
 * meta). Nothing here is the truth: the files are made empty at open and
 * rebuilt from the checkpoint, so nothing is ever synced for durability
 * (only to keep dirty pages few under a memory cgroup). Reads may run on
 * several threads at once; writes are one thread's (the tier's writer). */
#ifndef PSTRAIN_SERVER_STORE_ROW_DISK_H
#define PSTRAIN_SERVER_STORE_ROW_DISK_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#define ROW_DISK_TABLES_MAX 8

typedef struct row_disk row_disk;

typedef struct row_disk_stats {
  uint64_t rows[ROW_DISK_TABLES_MAX]; /* rows each table holds on disk */
  uint64_t file_bytes;                /* disk space the files take (allocated blocks) */
  uint64_t bytes_read, bytes_written; /* row bytes since open */
  uint64_t rows_read, rows_written;
} row_disk_stats;

/* Makes dir (and parents) if missing, removes any store left there (never
 * trusted: the checkpoint is the truth) and opens an empty one for
 * `tables` tables whose rows are row_bytes[t] bytes. */
ps_err row_disk_open(row_disk **out, const char *dir, int tables, const size_t *row_bytes,
                     ps_error *err);
/* Closes and removes the store's files (not dir). NULL: nothing. Every
 * snapshot must have ended and no read be running. */
void row_disk_close(row_disk *d);
/* The directory (as given to open), for messages. */
const char *row_disk_path(const row_disk *d);

/* Reads the rows of n keys of table t (any order, duplicates allowed) in one
 * read transaction: found[i] 1 and rows + i * row_bytes filled where key i
 * is on disk, 0 otherwise. Thread-safe. */
ps_err row_disk_read(row_disk *d, int t, const uint64_t *keys, size_t n, void *rows,
                     uint8_t *found, ps_error *err);

/* Writes (replacing) the rows of n keys of each table (n[t] keys, rows[t]
 * n[t] * row_bytes[t] bytes) and deletes del_n[t] keys (absent ones
 * ignored), all in one write transaction: all or nothing. A full disk is
 * RESOURCE_EXHAUSTED naming the directory; the store is as before then.
 * The map grows as needed; growing needs every transaction closed, so while
 * a snapshot is open a write that must grow waits for its end (a
 * checkpoint's length; reads are not held up meanwhile). So the thread
 * that writes must not be the one that still has to end a snapshot.
 * One writer thread. */
ps_err row_disk_write(row_disk *d, const uint64_t *const *keys, const void *const *rows,
                      const size_t *n, const uint64_t *const *del, const size_t *del_n,
                      ps_error *err);

/* A consistent snapshot of every table (an LMDB read transaction) for a
 * checkpoint: taken where the caller's state is consistent, iterated on
 * another thread (begin, next and end may each run on a different thread,
 * one at a time), while writes go on. */
typedef struct row_disk_snapshot row_disk_snapshot;
ps_err row_disk_snapshot_begin(row_disk *d, row_disk_snapshot **out, ps_error *err);
/* The next row of table t in ascending key order (numeric, as
 * sparse_table_dump orders): 1 with *key and row (row_bytes[t]) set, 0 at
 * the end, -1 on error (err set). Tables are iterated independently. */
int row_disk_snapshot_next(row_disk_snapshot *s, int t, uint64_t *key, void *row, ps_error *err);
/* Table t's iteration starts again from its first row (the same snapshot). */
void row_disk_snapshot_rewind(row_disk_snapshot *s, int t);
void row_disk_snapshot_end(row_disk_snapshot *s);

/* Thread-safe. The row counts stay 0 when no read transaction can be had
 * (every reader slot taken). */
void row_disk_stats_get(row_disk *d, row_disk_stats *out);

#endif
