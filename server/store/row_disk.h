/* The disk tier's store (--table-dir): the cold rows of a pserver's sparse
 * tables on local disk, key -> the row's bytes as the table holds them
 * (values, optimizer state, meta), in one RocksDB database
 * (row_disk_rocksdb.c: the folder DIR/rows.rocksdb, a column family per
 * table). Log-structured, so random-key batches are written sequentially,
 * its memory bounded (memtables, an 8 MiB block cache); LMDB, measured
 * too, rewrote a 4 KiB page per row (docs/disk-tier-design.md). Nothing
 * here is the truth: the store is made empty at open and rebuilt from the
 * checkpoint, so nothing is synced and no WAL written. Reads may run on
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
/* Closes and removes the store's files (RocksDB: its folder; not dir).
 * NULL: nothing. Every snapshot must have ended and no read be running. */
void row_disk_close(row_disk *d);
/* The directory (as given to open), for messages. */
const char *row_disk_path(const row_disk *d);

/* The bytes of rows read and written since the store opened (no I/O). */
void row_disk_bytes(row_disk *d, uint64_t *read, uint64_t *written);

/* Reads the rows of n keys of table t (any order, duplicates allowed) in one
 * consistent view (one MultiGet):
 * found[i] 1 and rows + i * row_bytes filled where key i is on disk, 0
 * otherwise. Thread-safe. */
ps_err row_disk_read(row_disk *d, int t, const uint64_t *keys, size_t n, void *rows,
                     uint8_t *found, ps_error *err);

/* Writes (replacing) the rows of n keys of each table (n[t] keys, rows[t]
 * n[t] * row_bytes[t] bytes) and deletes del_n[t] keys (absent ones
 * ignored), all in one WriteBatch: all or nothing. A full disk is
 * RESOURCE_EXHAUSTED naming the directory and saying "disk full"; the
 * store is as before then, its rows readable. A batch is refused while the
 * free space is less than it, the memtables and pending compactions need;
 * should a flush still fail for want of space, writes fail so until
 * RocksDB recovers (it polls the free space every 5 s). Other failures are
 * IO with the store's message. Writes never wait for a snapshot (a
 * memtable flush may stall one briefly). One writer thread. */
ps_err row_disk_write(row_disk *d, const uint64_t *const *keys, const void *const *rows,
                      const size_t *n, const uint64_t *const *del, const size_t *del_n,
                      ps_error *err);

/* Deletes every row of table t at once: a range tombstone (snapshots
 * still see the rows), then a compaction of the table that drops them
 * from its files (a sequential read of them, the caller waiting). */
ps_err row_disk_clear(row_disk *d, int t, ps_error *err);

/* A consistent snapshot of every table for a checkpoint (a RocksDB
 * snapshot and an iterator per table, made at the table's first next, kept
 * out of the block cache): taken where the caller's state is consistent,
 * iterated on another thread (begin, next and end may each run on a
 * different thread, one at a time), while writes go on. While it is open,
 * the files and memtables it reads stay (disk and memory a compaction or
 * flush would have freed). */
typedef struct row_disk_snapshot row_disk_snapshot;
ps_err row_disk_snapshot_begin(row_disk *d, row_disk_snapshot **out, ps_error *err);
/* The next row of table t in ascending key order (numeric, as
 * sparse_table_dump orders): 1 with *key and row (row_bytes[t]) set, 0 at
 * the end, -1 on error (err set). Tables are iterated independently. */
int row_disk_snapshot_next(row_disk_snapshot *s, int t, uint64_t *key, void *row, ps_error *err);
/* Table t's iteration starts again from its first row (the same snapshot). */
void row_disk_snapshot_rewind(row_disk_snapshot *s, int t);
void row_disk_snapshot_end(row_disk_snapshot *s);

/* Thread-safe. The row counts are RocksDB's estimate
 * ("rocksdb.estimate-num-keys": overwritten and deleted keys may be
 * counted until a compaction merges them; exact for rows written once);
 * file_bytes is the allocated blocks of every file in its folder (SST
 * files, MANIFEST, OPTIONS, LOG, the empty WAL). */
void row_disk_stats_get(row_disk *d, row_disk_stats *out);

#endif
