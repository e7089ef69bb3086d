/* The disk tier's store (server/store/row_disk.h) in RocksDB, through its C
 * API: one database, the folder DIR/rows.rocksdb, with a column family per
 * table ("t0", "t1", ...; "default" stays empty).
 *
 * Why RocksDB: the tier writes batches of tens of thousands of rows at
 * random keys. A B+tree (LMDB) rewrites a 4 KiB page for each of them and
 * keeps the batch's dirty pages in anonymous memory until the commit; a
 * log-structured tree buffers the rows in a bounded memtable and writes
 * them out sorted, sequentially, as SST files that compactions merge later.
 *
 * Keys are 8 bytes big-endian, so RocksDB's bytewise order is numeric order
 * (the snapshot's ascending iteration relies on it). Values are the rows'
 * bytes as the table holds them.
 *
 * Memory is bounded and small (it runs beside the tables, under the same
 * memory cgroup): memtables of 4 MiB, 2 per column family, 16 MiB for all
 * of them together; one LRU block cache of 8 MiB shared by the column
 * families for data blocks; the index and filter blocks held by the table
 * readers (about 1.7 bytes a key: in the shared cache, the data blocks every
 * read brings evicted them, and reads went to disk for filters, 15% of the
 * pserver's time in perf); no compression; one background job; no mmap reads.
 *
 * Nothing is durable: no WAL, no sync (the checkpoint is the truth; the
 * folder is removed at open and at close). */
#define _GNU_SOURCE /* nftw's FTW_DEPTH, FTW_PHYS */
#include "server/store/row_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <rocksdb/c.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define ROW_DISK_PATH_MAX 4096
#define ROW_DISK_FOLDER "rows.rocksdb"

/* The options (row_disk.h and the comment above say why). */
#define RDB_WRITE_BUFFER ((size_t)4 << 20)   /* a memtable */
#define RDB_MEMTABLE_BLOOM 0.02 /* of a memtable's bytes: ~16 bits a row of 76 bytes */
#define RDB_WRITE_BUFFERS 2                  /* memtables per column family */
#define RDB_ALL_WRITE_BUFFERS ((size_t)16 << 20) /* every column family's together */
#define RDB_WAL_CAP ((uint64_t)64 << 10) /* the empty WAL files' preallocation */
#define RDB_MANIFEST_PREALLOC ((size_t)64 << 10)
#define RDB_BLOCK_CACHE ((size_t)8 << 20)
#define RDB_BLOOM_BITS 10.0
#define RDB_MAX_OPEN_FILES 256
#define RDB_BACKGROUND_JOBS 1
#define RDB_LOG_WARN 2 /* rocksdb::InfoLogLevel::WARN_LEVEL (not in c.h) */
/* A write is refused (disk full) unless this much is free beyond what the
 * memtables, the batch and pending compactions will write (MANIFEST,
 * OPTIONS, LOG). */
#define RDB_ROOM_SLACK ((uint64_t)1 << 20)
/* A row's bytes in a memtable beyond its key and value (skiplist node,
 * sequence number, lengths), and a delete's. */
#define RDB_ROW_OVERHEAD 32
#define RDB_DELETE_BYTES 48

struct row_disk {
  rocksdb_t *db;
  rocksdb_options_t *opt;
  rocksdb_block_based_table_options_t *table_opt;
  rocksdb_cache_t *cache;
  rocksdb_readoptions_t *read_opt;
  rocksdb_writeoptions_t *write_opt;
  rocksdb_column_family_handle_t *cf[ROW_DISK_TABLES_MAX + 1]; /* [0] default, [1 + t] table t */
  int tables;
  size_t row_bytes[ROW_DISK_TABLES_MAX];
  char dir[ROW_DISK_PATH_MAX];
  char path[ROW_DISK_PATH_MAX + 32]; /* DIR/rows.rocksdb */

  /* Reads run on several threads. */
  _Atomic uint64_t rows_read, bytes_read, rows_written, bytes_written;
};

struct row_disk_snapshot {
  row_disk *d;
  const rocksdb_snapshot_t *snap;
  rocksdb_readoptions_t *read_opt; /* the snapshot's, not filling the block cache */
  rocksdb_iterator_t *it[ROW_DISK_TABLES_MAX]; /* made at a table's first next */
  int started[ROW_DISK_TABLES_MAX];
};

static rocksdb_column_family_handle_t *table_cf(const row_disk *d, int t) { return d->cf[1 + t]; }

/* --- keys and errors ------------------------------------------------------ */

static void key_put(char out[8], uint64_t k) {
  for (int i = 0; i < 8; i++) out[i] = (char)(uint8_t)(k >> (56 - 8 * i));
}

static uint64_t key_get(const char *in) {
  uint64_t k = 0;
  for (int i = 0; i < 8; i++) k = k << 8 | (uint8_t)in[i];
  return k;
}

/* Whether RocksDB's message says the disk is full (its Status NoSpace, or
 * the errno text of a write that failed). */
static int text_disk_full(const char *msg) {
  return strstr(msg, "No space left on device") != NULL || strstr(msg, "NoSpace") != NULL ||
         strstr(msg, "Disk quota exceeded") != NULL;
}

/* Copies RocksDB's error text into msg (for the message) and frees it. */
static void take_error(char *rdb_err, char *msg, size_t len) {
  snprintf(msg, len, "%s", rdb_err);
  rocksdb_free(rdb_err);
}

/* An error of RocksDB's (rdb_err, freed here) as a ps_err: a full disk is
 * RESOURCE_EXHAUSTED saying so, "Corruption" CORRUPT_DATA, the rest IO. */
static ps_err rdb_fail(ps_error *err, const row_disk *d, char *rdb_err, const char *doing) {
  char msg[384];
  take_error(rdb_err, msg, sizeof msg);
  if (text_disk_full(msg)) {
    return ps_error_set(err, PS_ERR_RESOURCE_EXHAUSTED, "row store %s: disk full %s: %s", d->dir,
                        doing, msg);
  }
  ps_err code = strncmp(msg, "Corruption", 10) == 0 ? PS_ERR_CORRUPT_DATA : PS_ERR_IO;
  return ps_error_set(err, code, "row store %s: %s: %s", d->dir, doing, msg);
}

/* --- files ---------------------------------------------------------------- */

/* mkdir -p. */
static ps_err make_dirs(const char *dir, ps_error *err) {
  char path[ROW_DISK_PATH_MAX];
  snprintf(path, sizeof path, "%s", dir);
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char c = *p;
    *p = '\0';
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
      return ps_error_set(err, PS_ERR_IO, "row store: making directory %s: %s", path,
                          strerror(errno));
    }
    *p = c;
    if (c == '\0') break;
  }
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return ps_error_set(err, PS_ERR_IO, "row store: %s is not a directory", dir);
  }
  return PS_ERR_OK;
}

/* nftw's callbacks share no state but the first failure's errno and path. */
static __thread int remove_errno;
static __thread char remove_failed[ROW_DISK_PATH_MAX];

static int remove_one(const char *path, const struct stat *st, int type, struct FTW *ftw) {
  (void)st;
  (void)ftw;
  int rc = type == FTW_DP ? rmdir(path) : unlink(path);
  if (rc != 0 && errno != ENOENT && remove_errno == 0) {
    remove_errno = errno;
    snprintf(remove_failed, sizeof remove_failed, "%s", path);
  }
  return 0; /* on with the rest */
}

/* rm -rf path (a folder or a file; absent is fine). */
static ps_err remove_tree(const char *path, const char *what, ps_error *err) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return PS_ERR_OK;
    return ps_error_set(err, PS_ERR_IO, "row store: removing %s %s: %s", what, path,
                        strerror(errno));
  }
  remove_errno = 0;
  remove_failed[0] = '\0';
  if (!S_ISDIR(st.st_mode)) {
    if (unlink(path) != 0 && errno != ENOENT) {
      remove_errno = errno;
      snprintf(remove_failed, sizeof remove_failed, "%s", path);
    }
  } else if (nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0 && remove_errno == 0) {
    remove_errno = errno != 0 ? errno : EIO;
    snprintf(remove_failed, sizeof remove_failed, "%s", path);
  }
  if (remove_errno != 0) {
    return ps_error_set(err, PS_ERR_IO, "row store: removing %s %s: %s: %s", what, path,
                        remove_failed, strerror(remove_errno));
  }
  return PS_ERR_OK;
}

/* The folder's files' allocated blocks (SST files, the empty WAL, MANIFEST,
 * OPTIONS, LOG). Files that compactions delete meanwhile are skipped. */
static uint64_t folder_bytes(const char *path) {
  DIR *dir = opendir(path);
  if (dir == NULL) return 0;
  uint64_t bytes = 0;
  int fd = dirfd(dir);
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    struct stat st;
    if (e->d_name[0] == '.') continue;
    if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
      bytes += (uint64_t)st.st_blocks * 512;
    }
  }
  closedir(dir);
  return bytes;
}

/* --- open and close ------------------------------------------------------- */

ps_err row_disk_open(row_disk **out, const char *dir, int tables, const size_t *row_bytes,
                     ps_error *err) {
  *out = NULL;
  if (tables < 1 || tables > ROW_DISK_TABLES_MAX) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "row store %s: %d tables (1 to %d)", dir,
                        tables, ROW_DISK_TABLES_MAX);
  }
  for (int t = 0; t < tables; t++) {
    if (row_bytes[t] == 0 || row_bytes[t] > UINT32_MAX) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                          "row store %s: table %d's rows are %zu bytes", dir, t, row_bytes[t]);
    }
  }
  /* RocksDB's file names under the folder: 000123.sst, MANIFEST-000004, ... */
  if (dir[0] == '\0' || strlen(dir) + sizeof ROW_DISK_FOLDER + 64 > ROW_DISK_PATH_MAX) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "row store: directory \"%s\" (empty or too long)", dir);
  }
  ps_err code = make_dirs(dir, err);
  if (code != PS_ERR_OK) return code;

  row_disk *d = calloc(1, sizeof *d);
  if (d == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "row store %s: no memory", dir);
  d->tables = tables;
  for (int t = 0; t < tables; t++) d->row_bytes[t] = row_bytes[t];
  snprintf(d->dir, sizeof d->dir, "%s", dir);
  snprintf(d->path, sizeof d->path, "%s/%s", dir, ROW_DISK_FOLDER);
  atomic_init(&d->rows_read, 0);
  atomic_init(&d->bytes_read, 0);
  atomic_init(&d->rows_written, 0);
  atomic_init(&d->bytes_written, 0);

  /* A store left by an earlier run is never trusted: the checkpoint is. */
  code = remove_tree(d->path, "the old store", err);
  if (code != PS_ERR_OK) {
    free(d);
    return code;
  }

  d->opt = rocksdb_options_create();
  d->table_opt = rocksdb_block_based_options_create();
  d->cache = rocksdb_cache_create_lru(RDB_BLOCK_CACHE);
  d->read_opt = rocksdb_readoptions_create();
  d->write_opt = rocksdb_writeoptions_create();
  if (d->opt == NULL || d->table_opt == NULL || d->cache == NULL || d->read_opt == NULL ||
      d->write_opt == NULL) {
    row_disk_close(d);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "row store %s: no memory for RocksDB's options",
                        dir);
  }
  rocksdb_options_t *o = d->opt;
  rocksdb_options_set_create_if_missing(o, 1);
  rocksdb_options_set_create_missing_column_families(o, 1);
  rocksdb_options_set_error_if_exists(o, 1); /* removed above: it must be new */
  rocksdb_options_set_compression(o, rocksdb_no_compression); /* rows are floats */
  /* Most rows a request reads are old, in SST files, not in the memtables:
   * a Bloom filter over each memtable's keys answers "not here" without
   * its skiplist search (~20 key comparisons, a sixth of the pserver's
   * time in perf). */
  rocksdb_options_set_memtable_whole_key_filtering(o, 1);
  rocksdb_options_set_memtable_prefix_bloom_size_ratio(o, RDB_MEMTABLE_BLOOM);
  rocksdb_options_set_write_buffer_size(o, RDB_WRITE_BUFFER);
  rocksdb_options_set_max_write_buffer_number(o, RDB_WRITE_BUFFERS);
  rocksdb_options_set_db_write_buffer_size(o, RDB_ALL_WRITE_BUFFERS);
  /* No WAL is written, but RocksDB still makes a WAL file per memtable and
   * preallocates it (fallocate) to 1.1 write buffers, unless the total WAL
   * size is capped lower: 4.4 MiB of disk each for nothing. The cap cannot
   * trigger flushes, as it would with a WAL: nothing is written to one. */
  rocksdb_options_set_max_total_wal_size(o, RDB_WAL_CAP);
  /* The MANIFEST (a few KiB of file edits here) is preallocated 4 MiB by default. */
  rocksdb_options_set_manifest_preallocation_size(o, RDB_MANIFEST_PREALLOC);
  /* Two cores are shared with the pserver's threads and the trainers. */
  rocksdb_options_set_max_background_jobs(o, RDB_BACKGROUND_JOBS);
  rocksdb_options_set_max_open_files(o, RDB_MAX_OPEN_FILES);
  rocksdb_options_set_allow_mmap_reads(o, 0); /* mapped files would count as this process's */
  /* The LOG file: warnings and errors only; no statistics dumped in it. */
  rocksdb_options_set_info_log_level(o, RDB_LOG_WARN);
  rocksdb_options_set_keep_log_file_num(o, 1);
  rocksdb_options_set_stats_dump_period_sec(o, 0);
  rocksdb_options_set_stats_persist_period_sec(o, 0);
  /* Data blocks in the bounded cache; index and filters with the table
   * readers, where reads of data blocks cannot evict them. */
  rocksdb_block_based_options_set_block_cache(d->table_opt, d->cache);
  rocksdb_block_based_options_set_cache_index_and_filter_blocks(d->table_opt, 0);
  /* The full Bloom filter, owned by the table options once set. */
  rocksdb_filterpolicy_t *bloom = rocksdb_filterpolicy_create_bloom_full(RDB_BLOOM_BITS);
  rocksdb_block_based_options_set_filter_policy(d->table_opt, bloom);
  rocksdb_options_set_block_based_table_factory(o, d->table_opt);
  /* Nothing is durable: no WAL, no sync. */
  rocksdb_writeoptions_disable_WAL(d->write_opt, 1);
  rocksdb_writeoptions_set_sync(d->write_opt, 0);

  const char *names[ROW_DISK_TABLES_MAX + 1];
  char name_buf[ROW_DISK_TABLES_MAX][8];
  const rocksdb_options_t *cf_opt[ROW_DISK_TABLES_MAX + 1];
  names[0] = "default";
  for (int t = 0; t < tables; t++) {
    snprintf(name_buf[t], sizeof name_buf[t], "t%d", t);
    names[1 + t] = name_buf[t];
  }
  for (int i = 0; i <= tables; i++) cf_opt[i] = o;
  char *rdb_err = NULL;
  d->db = rocksdb_open_column_families(o, d->path, tables + 1, names, cf_opt, d->cf, &rdb_err);
  if (rdb_err != NULL || d->db == NULL) {
    if (rdb_err != NULL) {
      code = rdb_fail(err, d, rdb_err, "opening RocksDB in " ROW_DISK_FOLDER);
    } else {
      code = ps_error_set(err, PS_ERR_IO, "row store %s: opening RocksDB in %s failed", dir,
                          d->path);
    }
    d->db = NULL;
    memset(d->cf, 0, sizeof d->cf);
    row_disk_close(d);
    return code;
  }
  *out = d;
  return PS_ERR_OK;
}

void row_disk_close(row_disk *d) {
  if (d == NULL) return;
  /* Every snapshot must have ended, and no read be running. Closing waits
   * for a running flush or compaction. */
  if (d->db != NULL) {
    for (int i = 0; i <= d->tables; i++) {
      if (d->cf[i] != NULL) rocksdb_column_family_handle_destroy(d->cf[i]);
    }
    rocksdb_close(d->db);
  }
  if (d->write_opt != NULL) rocksdb_writeoptions_destroy(d->write_opt);
  if (d->read_opt != NULL) rocksdb_readoptions_destroy(d->read_opt);
  if (d->opt != NULL) rocksdb_options_destroy(d->opt);
  if (d->table_opt != NULL) rocksdb_block_based_options_destroy(d->table_opt);
  if (d->cache != NULL) rocksdb_cache_destroy(d->cache);
  /* Best effort: what cannot be removed now is removed at the next open. */
  if (d->path[0] != '\0') {
    ps_error err;
    if (remove_tree(d->path, "the store", &err) != PS_ERR_OK) fprintf(stderr, "%s\n", err.msg);
  }
  free(d);
}

const char *row_disk_path(const row_disk *d) { return d->dir; }

/* --- read ----------------------------------------------------------------- */

typedef struct key_at {
  uint64_t key;
  size_t at; /* its index in the caller's arrays */
} key_at;

static int key_at_cmp(const void *a, const void *b) {
  const key_at *x = a, *y = b;
  if (x->key != y->key) return (x->key > y->key) - (x->key < y->key);
  return (x->at > y->at) - (x->at < y->at);
}

ps_err row_disk_read(row_disk *d, int t, const uint64_t *keys, size_t n, void *rows, uint8_t *found,
                     ps_error *err) {
  if (t < 0 || t >= d->tables) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "row store %s: no table %d (%d tables)",
                        d->dir, t, d->tables);
  }
  if (n == 0) return PS_ERR_OK;
  size_t rb = d->row_bytes[t];
  /* Sorted and without duplicates: MultiGet takes them in order (no copy,
   * no sort of its own) and reads each block once. */
  key_at *s = malloc(n * sizeof *s);
  char(*kbuf)[8] = malloc(n * sizeof *kbuf);
  const char **kptr = malloc(n * sizeof *kptr);
  size_t *klen = malloc(n * sizeof *klen);
  rocksdb_pinnableslice_t **vals = calloc(n, sizeof *vals);
  char **errs = calloc(n, sizeof *errs);
  ps_err code = PS_ERR_OK;
  if (s == NULL || kbuf == NULL || kptr == NULL || klen == NULL || vals == NULL || errs == NULL) {
    code = ps_error_set(err, PS_ERR_NO_MEMORY, "row store %s: no memory to read %zu keys", d->dir,
                        n);
    goto out;
  }
  for (size_t i = 0; i < n; i++) s[i] = (key_at){keys[i], i};
  qsort(s, n, sizeof *s, key_at_cmp);
  size_t u = 0; /* distinct keys */
  for (size_t i = 0; i < n; i++) {
    if (i > 0 && s[i].key == s[i - 1].key) continue;
    key_put(kbuf[u], s[i].key);
    kptr[u] = kbuf[u];
    klen[u] = 8;
    u++;
  }
  /* One call: one consistent view of the table (an implicit snapshot). */
  rocksdb_batched_multi_get_cf(d->db, d->read_opt, table_cf(d, t), u, kptr, klen, vals, errs, 1);

  uint64_t hits = 0;
  size_t j = 0; /* s[i]'s distinct key: vals[j] */
  for (size_t i = 0; i < n; i++) {
    if (i > 0 && s[i].key != s[i - 1].key) j++;
    if (code != PS_ERR_OK) continue;
    if (errs[j] != NULL) {
      char doing[96];
      snprintf(doing, sizeof doing, "reading %zu rows of table %d", n, t);
      code = rdb_fail(err, d, errs[j], doing);
      errs[j] = NULL;
      continue;
    }
    if (vals[j] == NULL) {
      found[s[i].at] = 0;
      continue;
    }
    size_t len;
    const char *v = rocksdb_pinnableslice_value(vals[j], &len);
    if (len != rb) {
      code = ps_error_set(err, PS_ERR_CORRUPT_DATA,
                          "row store %s: reading %zu rows of table %d: key %" PRIu64
                          "'s row is %zu bytes, not %zu",
                          d->dir, n, t, s[i].key, len, rb);
      continue;
    }
    memcpy((char *)rows + s[i].at * rb, v, rb);
    found[s[i].at] = 1;
    hits++;
  }
  for (size_t i = 0; i < u; i++) {
    if (vals[i] != NULL) rocksdb_pinnableslice_destroy(vals[i]);
    if (errs[i] != NULL) rocksdb_free(errs[i]);
  }
  if (code == PS_ERR_OK) {
    atomic_fetch_add_explicit(&d->rows_read, hits, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->bytes_read, hits * rb, memory_order_relaxed);
    ps_error_clear(err);
  }
out:
  free(s);
  free(kbuf);
  free(kptr);
  free(klen);
  free(vals);
  free(errs);
  return code;
}

/* --- write ---------------------------------------------------------------- */

/* A property of every table's column family, summed (0 where unknown). */
static uint64_t tables_property(row_disk *d, const char *name) {
  uint64_t sum = 0;
  for (int t = 0; t < d->tables; t++) {
    uint64_t v;
    if (rocksdb_property_int_cf(d->db, table_cf(d, t), name, &v) == 0) sum += v;
  }
  return sum;
}

/* Whether the disk has room for the batch (batch_bytes in a memtable) and
 * for what the store will write anyway: its memtables' rows (flushed to
 * SST files) and the compactions pending. Checked before RocksDB sees the
 * batch because RocksDB 7.8 copes badly with a full disk: a flush that
 * fails stops every write until its own recovery, which polls the free
 * space every 5 s, needs a memtable's worth free (4 MiB) and was seen to
 * stay stuck (an SST file's preallocation held); and Debian's build, with
 * its assertions on, was seen to abort the process in WritableFileWriter
 * after a failed append. Here a full disk is an error of the one write,
 * and writes go on as soon as there is room. Best effort: another process
 * can fill the disk between the check and the flush (then RocksDB's error
 * is mapped the same way, below). *free_bytes, *need_bytes: for the message. */
static int room_for(row_disk *d, uint64_t batch_bytes, uint64_t *free_bytes,
                    uint64_t *need_bytes) {
  struct statvfs vfs;
  if (statvfs(d->path, &vfs) != 0) return 1; /* cannot tell: RocksDB will say */
  *free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
  *need_bytes = batch_bytes + tables_property(d, "rocksdb.cur-size-all-mem-tables") +
                tables_property(d, "rocksdb.estimate-pending-compaction-bytes") + RDB_ROOM_SLACK;
  return *free_bytes >= *need_bytes;
}

typedef struct key_order {
  uint64_t key;
  size_t index;
} key_order;

static int by_key_then_index(const void *a, const void *b) {
  const key_order *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

/* One WriteBatch, written once: RocksDB applies it to the memtables whole
 * or not at all. A batch's puts of one key: the last wins (the batch's
 * order); deletes come after the puts. No sync is
 * needed after it: the rows go to a memtable (bounded: 4 MiB, two per
 * column family), and a full one is flushed to an SST file by a background
 * job, sequentially, so dirty page cache stays a few MiB at any time.
 *
 * A full disk: refused before RocksDB sees the batch (room_for). Should a
 * flush still fail for want of space, RocksDB sets its background error
 * and writes stop (each fails with that error, RESOURCE_EXHAUSTED, the
 * batch not applied) until its own recovery (room_for says why that is a
 * last resort). The rows written before stay readable either way (in the
 * memtables that could not be flushed). */
ps_err row_disk_write(row_disk *d, const uint64_t *const *keys, const void *const *rows,
                      const size_t *n, const uint64_t *const *del, const size_t *del_n,
                      ps_error *err) {
  size_t total_rows = 0, total_del = 0;
  uint64_t bytes = 0;
  for (int t = 0; t < d->tables; t++) {
    total_rows += n[t];
    total_del += del_n[t];
    bytes += (uint64_t)n[t] * d->row_bytes[t];
  }
  if (total_rows == 0 && total_del == 0) {
    ps_error_clear(err);
    return PS_ERR_OK;
  }
  uint64_t free_bytes = 0, need_bytes = 0;
  uint64_t batch_bytes = bytes + (uint64_t)total_rows * (8 + RDB_ROW_OVERHEAD) +
                         (uint64_t)total_del * RDB_DELETE_BYTES;
  if (!room_for(d, batch_bytes, &free_bytes, &need_bytes)) {
    return ps_error_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                        "row store %s: disk full writing a batch (%zu rows, %zu deletes): %" PRIu64
                        " bytes free, the batch and the store's pending flushes and compactions "
                        "need about %" PRIu64 "; the store is as before the batch",
                        d->dir, total_rows, total_del, free_bytes, need_bytes);
  }
  rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
  if (wb == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "row store %s: no memory for a write batch",
                        d->dir);
  }
  /* The puts in key order (a key's puts in the batch's): each memtable
   * insert then starts from the last one's place in the skiplist, where
   * random order searched it from the top (inserts were a fifth of the
   * pserver's time in perf). */
  size_t most = 0;
  for (int t = 0; t < d->tables; t++) most = n[t] > most ? n[t] : most;
  key_order *order = most > 0 ? malloc(most * sizeof *order) : NULL;
  if (most > 0 && order == NULL) {
    rocksdb_writebatch_destroy(wb);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "row store %s: no memory to sort a write batch",
                        d->dir);
  }
  for (int t = 0; t < d->tables; t++) {
    size_t rb = d->row_bytes[t];
    for (size_t i = 0; i < n[t]; i++) order[i] = (key_order){keys[t][i], i};
    if (n[t] > 1) qsort(order, n[t], sizeof *order, by_key_then_index);
    for (size_t j = 0; j < n[t]; j++) {
      char k[8];
      key_put(k, order[j].key);
      rocksdb_writebatch_put_cf(wb, table_cf(d, t), k, 8,
                                (const char *)rows[t] + order[j].index * rb, rb);
    }
  }
  free(order);
  for (int t = 0; t < d->tables; t++) {
    for (size_t i = 0; i < del_n[t]; i++) {
      char k[8];
      key_put(k, del[t][i]);
      rocksdb_writebatch_delete_cf(wb, table_cf(d, t), k, 8);
    }
  }
  char *rdb_err = NULL;
  rocksdb_write(d->db, d->write_opt, wb, &rdb_err);
  rocksdb_writebatch_destroy(wb);
  if (rdb_err != NULL) {
    char doing[128];
    snprintf(doing, sizeof doing,
             "writing a batch (%zu rows, %zu deletes; the store is as before it)", total_rows,
             total_del);
    return rdb_fail(err, d, rdb_err, doing);
  }
  atomic_fetch_add_explicit(&d->rows_written, total_rows, memory_order_relaxed);
  atomic_fetch_add_explicit(&d->bytes_written, bytes, memory_order_relaxed);
  ps_error_clear(err);
  return PS_ERR_OK;
}

ps_err row_disk_clear(row_disk *d, int t, ps_error *err) {
  if (t < 0 || t >= d->tables) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "row store %s: no table %d (%d tables)",
                        d->dir, t, d->tables);
  }
  /* [0, 2^64 - 1 followed by one byte): every 8-byte key, compared bytewise. */
  char lo[8], hi[9];
  key_put(lo, 0);
  key_put(hi, UINT64_MAX);
  hi[8] = 0;
  char *rdb_err = NULL;
  rocksdb_delete_range_cf(d->db, d->write_opt, table_cf(d, t), lo, sizeof lo, hi, sizeof hi,
                          &rdb_err);
  if (rdb_err != NULL) {
    char doing[64];
    snprintf(doing, sizeof doing, "clearing table %d", t);
    return rdb_fail(err, d, rdb_err, doing);
  }
  /* Without it the tombstone stays until compactions reach it: the files
   * keep their bytes and the entries' estimate counts them. */
  rocksdb_compact_range_cf(d->db, table_cf(d, t), NULL, 0, NULL, 0);
  return PS_ERR_OK;
}

/* --- snapshot ------------------------------------------------------------- */

ps_err row_disk_snapshot_begin(row_disk *d, row_disk_snapshot **out, ps_error *err) {
  *out = NULL;
  row_disk_snapshot *s = calloc(1, sizeof *s);
  if (s == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "row store %s: no memory", d->dir);
  s->d = d;
  s->read_opt = rocksdb_readoptions_create();
  s->snap = rocksdb_create_snapshot(d->db);
  if (s->read_opt == NULL || s->snap == NULL) {
    row_disk_snapshot_end(s);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "row store %s: beginning a snapshot: no memory",
                        d->dir);
  }
  rocksdb_readoptions_set_snapshot(s->read_opt, s->snap);
  /* A checkpoint's scan reads every block once: kept out of the block
   * cache, it does not push out the blocks the pulls read. */
  rocksdb_readoptions_set_fill_cache(s->read_opt, 0);
  *out = s;
  return PS_ERR_OK;
}

int row_disk_snapshot_next(row_disk_snapshot *s, int t, uint64_t *key, void *row, ps_error *err) {
  row_disk *d = s->d;
  if (t < 0 || t >= d->tables) {
    ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "row store %s: no table %d (%d tables)", d->dir, t,
                 d->tables);
    return -1;
  }
  /* The iterator is made lazily: a table never iterated pins nothing. It
   * sees the snapshot whenever it is made. */
  if (s->it[t] == NULL) {
    s->it[t] = rocksdb_create_iterator_cf(d->db, s->read_opt, table_cf(d, t));
    if (s->it[t] == NULL) {
      ps_error_set(err, PS_ERR_NO_MEMORY, "row store %s: a snapshot's iterator of table %d: "
                   "no memory", d->dir, t);
      return -1;
    }
  }
  rocksdb_iterator_t *it = s->it[t];
  if (!s->started[t]) {
    rocksdb_iter_seek_to_first(it);
    s->started[t] = 1;
  } else if (rocksdb_iter_valid(it)) {
    rocksdb_iter_next(it);
  }
  if (!rocksdb_iter_valid(it)) {
    char *rdb_err = NULL;
    rocksdb_iter_get_error(it, &rdb_err);
    if (rdb_err != NULL) {
      char doing[64];
      snprintf(doing, sizeof doing, "a snapshot's next row of table %d", t);
      rdb_fail(err, d, rdb_err, doing);
      return -1;
    }
    return 0; /* the end (and it stays there) */
  }
  size_t klen, vlen;
  const char *k = rocksdb_iter_key(it, &klen);
  const char *v = rocksdb_iter_value(it, &vlen);
  if (klen != 8 || vlen != d->row_bytes[t]) {
    ps_error_set(err, PS_ERR_CORRUPT_DATA,
                 "row store %s: a snapshot's next row of table %d: a key of %zu bytes and a row "
                 "of %zu (8 and %zu expected)",
                 d->dir, t, klen, vlen, d->row_bytes[t]);
    return -1;
  }
  *key = key_get(k);
  memcpy(row, v, vlen);
  return 1;
}

void row_disk_snapshot_rewind(row_disk_snapshot *s, int t) {
  if (t < 0 || t >= s->d->tables) return;
  s->started[t] = 0; /* the next seeks to the first row again */
}

void row_disk_snapshot_end(row_disk_snapshot *s) {
  if (s == NULL) return;
  for (int t = 0; t < s->d->tables; t++) {
    if (s->it[t] != NULL) rocksdb_iter_destroy(s->it[t]);
  }
  if (s->read_opt != NULL) rocksdb_readoptions_destroy(s->read_opt);
  if (s->snap != NULL) rocksdb_release_snapshot(s->d->db, s->snap);
  free(s);
}

/* --- stats ---------------------------------------------------------------- */

void row_disk_bytes(row_disk *d, uint64_t *read, uint64_t *written) {
  *read = atomic_load_explicit(&d->bytes_read, memory_order_relaxed);
  *written = atomic_load_explicit(&d->bytes_written, memory_order_relaxed);
}

void row_disk_stats_get(row_disk *d, row_disk_stats *out) {
  memset(out, 0, sizeof *out);
  out->rows_read = atomic_load_explicit(&d->rows_read, memory_order_relaxed);
  out->bytes_read = atomic_load_explicit(&d->bytes_read, memory_order_relaxed);
  out->rows_written = atomic_load_explicit(&d->rows_written, memory_order_relaxed);
  out->bytes_written = atomic_load_explicit(&d->bytes_written, memory_order_relaxed);
  out->file_bytes = folder_bytes(d->path);
  for (int t = 0; t < d->tables; t++) {
    uint64_t v;
    if (rocksdb_property_int_cf(d->db, table_cf(d, t), "rocksdb.estimate-num-keys", &v) == 0) {
      out->rows[t] = v;
    }
  }
}
