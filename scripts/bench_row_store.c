/* Fixed-width rows on local disk, for the disk tier of sparse tables (issue
 * 27): RocksDB (its C API), LMDB and a purpose-built log-structured file
 * compared on the same data. A row is key uint64 -> float32[dim + 1 + 2]
 * (values, row-wise AdaGrad's accumulator, 8 bytes of meta: last step and
 * count), 76 bytes at dim 16.
 *
 * Each store is loaded with the table's keys (in rank order: random key
 * order), then runs `steps` steps: a batch of `batch` distinct keys drawn
 * Zipf-like (skew 1.1, as CTR ids) from `keys` keys is read in one batched
 * call (a miss is a new row, made from its key), updated (values moved,
 * accumulator grown, meta set to the step) and written back in one batched
 * call, as an eviction's write-back would. Every store gets the same keys
 * and rows in the same order; a checksum of every row read must agree.
 *
 * No fsync anywhere (RocksDB without its WAL, LMDB MDB_NOSYNC, the log never
 * syncs): the checkpoint is the truth, the tier's files are rebuilt after a
 * crash. Each store runs in its own child process, so the resident memory
 * reported is its own. Standalone: not linked into pserver or trainer.
 *
 *   bench_row_store [--keys 2000000] [--batch 4096] [--dim 16] [--steps 200]
 *                   [--skew 1.1] [--dir /tmp/pstrain-row-store]
 *                   [--stores rocksdb,lmdb,log] [--cache-mb 64] [--memtable-mb 16]
 *                   [--cold] [--keep] */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <lmdb.h>
#include <rocksdb/c.h>

/* --- options, helpers ---------------------------------------------------------- */

typedef struct options {
  size_t keys, batch, steps;
  int dim;
  double skew;
  const char *dir;
  char stores[128];
  size_t cache_mb, memtable_mb;
  int cold, keep;
} options;

static options opt = {.keys = 2000000, .batch = 4096, .steps = 200, .dim = 16, .skew = 1.1,
                      .dir = "/tmp/pstrain-row-store", .stores = "rocksdb,lmdb,log",
                      .cache_mb = 64, .memtable_mb = 16};

static const char *current = "bench_row_store";

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "bench_row_store: %s: ", current);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (p == NULL) die("out of memory (%zu bytes)", n);
  return p;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* The key of Zipf rank r: ranks spread over the 64-bit space. */
static uint64_t key_of(uint64_t rank) { return mix64(rank + 0x9e3779b97f4a7c15ULL); }

static size_t row_floats(void) { return (size_t)opt.dim + 3; }
static size_t row_bytes(void) { return row_floats() * sizeof(float); }

/* A new row: values from the key, accumulator 0.1, meta 0. */
static void init_row(uint64_t key, float *row) {
  for (int j = 0; j < opt.dim; j++) {
    uint64_t h = mix64(key ^ ((uint64_t)j << 56));
    row[j] = ((float)(h >> 40) / 16777216.0f - 0.5f) * 0.02f;
  }
  row[opt.dim] = 0.1f;
  uint64_t meta = 0;
  memcpy(row + opt.dim + 1, &meta, sizeof meta);
}

/* What a step does to a row it read: an AdaGrad-like move, the meta set. */
static void update_row(float *row, size_t step, size_t i) {
  for (int j = 0; j < opt.dim; j++) row[j] += 1e-3f * (float)((int)((step + i + (size_t)j) % 7) - 3);
  row[opt.dim] += 0.01f;
  uint64_t meta;
  memcpy(&meta, row + opt.dim + 1, sizeof meta);
  meta = ((uint64_t)step << 24) | (((meta & 0xffffff) + 1) & 0xffffff);
  memcpy(row + opt.dim + 1, &meta, sizeof meta);
}

static uint64_t checksum_rows(uint64_t h, const float *rows, size_t n) {
  const uint32_t *w = (const uint32_t *)(const void *)rows;
  for (size_t i = 0; i < n * row_floats(); i++) h = mix64(h ^ w[i]) + i;
  return h;
}

/* Resident and file-backed resident bytes, from /proc/self/statm. */
static void rss(double *resident, double *shared) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long size = 0, res = 0, sh = 0;
  if (f == NULL || fscanf(f, "%lu %lu %lu", &size, &res, &sh) != 3) die("reading /proc/self/statm");
  fclose(f);
  double page = (double)sysconf(_SC_PAGESIZE);
  *resident = (double)res * page;
  *shared = (double)sh * page;
}

static uint64_t tree_blocks, tree_files;
static int tree_add(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)path, (void)ftw;
  if (flag == FTW_F) {
    tree_blocks += (uint64_t)st->st_blocks * 512;
    tree_files++;
  }
  return 0;
}
/* Bytes allocated on disk under dir (st_blocks: sparse files count what they hold). */
static double disk_bytes(const char *dir) {
  tree_blocks = tree_files = 0;
  if (nftw(dir, tree_add, 16, FTW_PHYS) != 0) die("walking %s: %s", dir, strerror(errno));
  return (double)tree_blocks;
}

static int tree_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)ftw;
  if ((flag == FTW_DP ? rmdir(path) : unlink(path)) != 0) die("removing %s: %s", path, strerror(errno));
  return 0;
}
static void rm_tree(const char *dir) {
  struct stat st;
  if (lstat(dir, &st) != 0) return;
  if (nftw(dir, tree_rm, 16, FTW_DEPTH | FTW_PHYS) != 0) die("removing %s", dir);
}

/* --cold: written-back pages to disk, then out of the page cache. */
static int tree_drop(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)ftw;
  if (flag != FTW_F) return 0;
  int fd = open(path, O_RDWR);
  if (fd < 0) die("opening %s: %s", path, strerror(errno));
  if (fdatasync(fd) != 0) die("fdatasync %s: %s", path, strerror(errno));
  int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  if (rc != 0) die("posix_fadvise %s: %s", path, strerror(rc));
  close(fd);
  return 0;
}
static void drop_cache(const char *dir) {
  if (nftw(dir, tree_drop, 16, FTW_PHYS) != 0) die("dropping %s from the page cache", dir);
}

typedef struct kidx {
  uint64_t key;
  uint32_t i;
} kidx;
static int kidx_cmp(const void *a, const void *b) {
  uint64_t x = ((const kidx *)a)->key, y = ((const kidx *)b)->key;
  return x < y ? -1 : x > y;
}
static int u64_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* --- the stores ------------------------------------------------------------------ */

typedef struct store_mem {
  double total;   /* memory the store itself reports holding (cache, index, buffers) */
  double per_key; /* of which grows with the keys on disk (index, filters) */
  char what[96];
} store_mem;

typedef struct store_ops {
  const char *name;
  void *(*open)(const char *dir);
  /* found[i] = 0: no row for keys[i] (rows[i] untouched) */
  void (*get)(void *s, const uint64_t *keys, size_t n, float *rows, uint8_t *found);
  void (*put)(void *s, const uint64_t *keys, const float *rows, size_t n);
  void (*settle)(void *s); /* everything written reaches the files (no fsync) */
  void *(*cold)(void *s, const char *dir); /* --cold: out of the page cache; returns the store */
  void (*mem)(void *s, size_t live, store_mem *m);
  void (*close)(void *s);
} store_ops;

/* RocksDB: a block-based table without compression (rows are random floats),
 * a full Bloom filter of 10 bits a key, an LRU block cache of --cache-mb, a
 * memtable of --memtable-mb (2 of them), no WAL. Reads: batched MultiGet. */
typedef struct rdb {
  rocksdb_t *db;
  rocksdb_options_t *o;
  rocksdb_block_based_table_options_t *t;
  rocksdb_cache_t *cache;
  rocksdb_filterpolicy_t *bloom;
  rocksdb_readoptions_t *ro;
  rocksdb_writeoptions_t *wo;
  rocksdb_column_family_handle_t *cf;
  rocksdb_writebatch_t *wb;
  char (*kbuf)[8];
  const char **kptr;
  size_t *ksize;
  rocksdb_pinnableslice_t **vals;
  char **errs;
  size_t cap;
} rdb;

static void rdb_check(char *err, const char *what) {
  if (err != NULL) die("%s: %s", what, err);
}

static void be64(char *out, uint64_t k) {
  for (int i = 0; i < 8; i++) out[i] = (char)(k >> (56 - 8 * i));
}

static void *rdb_open(const char *dir) {
  rdb *s = xmalloc(sizeof *s);
  memset(s, 0, sizeof *s);
  s->o = rocksdb_options_create();
  rocksdb_options_set_create_if_missing(s->o, 1);
  rocksdb_options_set_compression(s->o, rocksdb_no_compression);
  rocksdb_options_set_write_buffer_size(s->o, opt.memtable_mb << 20);
  rocksdb_options_set_max_write_buffer_number(s->o, 2);
  rocksdb_options_set_max_background_jobs(s->o, 2);
  s->t = rocksdb_block_based_options_create();
  s->cache = rocksdb_cache_create_lru(opt.cache_mb << 20);
  rocksdb_block_based_options_set_block_cache(s->t, s->cache);
  s->bloom = rocksdb_filterpolicy_create_bloom_full(10);
  rocksdb_block_based_options_set_filter_policy(s->t, s->bloom); /* the table options own it */
  rocksdb_options_set_block_based_table_factory(s->o, s->t);
  const char *names[1] = {"default"};
  const rocksdb_options_t *cfo[1] = {s->o};
  char *err = NULL;
  s->db = rocksdb_open_column_families(s->o, dir, 1, names, cfo, &s->cf, &err);
  rdb_check(err, "rocksdb_open");
  s->ro = rocksdb_readoptions_create();
  s->wo = rocksdb_writeoptions_create();
  rocksdb_writeoptions_disable_WAL(s->wo, 1);
  rocksdb_writeoptions_set_sync(s->wo, 0);
  s->wb = rocksdb_writebatch_create();
  return s;
}

static void rdb_reserve(rdb *s, size_t n) {
  if (n <= s->cap) return;
  free(s->kbuf), free(s->kptr), free(s->ksize), free(s->vals), free(s->errs);
  s->kbuf = xmalloc(n * sizeof *s->kbuf);
  s->kptr = xmalloc(n * sizeof *s->kptr);
  s->ksize = xmalloc(n * sizeof *s->ksize);
  s->vals = xmalloc(n * sizeof *s->vals);
  s->errs = xmalloc(n * sizeof *s->errs);
  s->cap = n;
}

static void rdb_get(void *p, const uint64_t *keys, size_t n, float *rows, uint8_t *found) {
  rdb *s = p;
  rdb_reserve(s, n);
  for (size_t i = 0; i < n; i++) {
    be64(s->kbuf[i], keys[i]);
    s->kptr[i] = s->kbuf[i];
    s->ksize[i] = 8;
  }
  rocksdb_batched_multi_get_cf(s->db, s->ro, s->cf, n, s->kptr, s->ksize, s->vals, s->errs, false);
  for (size_t i = 0; i < n; i++) {
    rdb_check(s->errs[i], "rocksdb multi_get");
    found[i] = s->vals[i] != NULL;
    if (!found[i]) continue;
    size_t len;
    const char *v = rocksdb_pinnableslice_value(s->vals[i], &len);
    if (len != row_bytes()) die("multi_get: a row of %zu bytes, expected %zu", len, row_bytes());
    memcpy(rows + i * row_floats(), v, len);
    rocksdb_pinnableslice_destroy(s->vals[i]);
  }
}

static void rdb_put(void *p, const uint64_t *keys, const float *rows, size_t n) {
  rdb *s = p;
  rocksdb_writebatch_clear(s->wb);
  for (size_t i = 0; i < n; i++) {
    char k[8];
    be64(k, keys[i]);
    rocksdb_writebatch_put(s->wb, k, 8, (const char *)(rows + i * row_floats()), row_bytes());
  }
  char *err = NULL;
  rocksdb_write(s->db, s->wo, s->wb, &err);
  rdb_check(err, "rocksdb_write");
}

static void rdb_settle(void *p) {
  rdb *s = p;
  rocksdb_flushoptions_t *f = rocksdb_flushoptions_create();
  rocksdb_flushoptions_set_wait(f, 1);
  char *err = NULL;
  rocksdb_flush(s->db, f, &err);
  rocksdb_flushoptions_destroy(f);
  rdb_check(err, "rocksdb_flush");
}

static void *rdb_cold(void *p, const char *dir) {
  rdb_settle(p);
  drop_cache(dir); /* RocksDB preads its files (no mmap); its block cache stays as it was */
  return p;
}

static double rdb_prop(rdb *s, const char *name) {
  char *v = rocksdb_property_value(s->db, name);
  if (v == NULL) die("rocksdb property %s unknown", name);
  double d = strtod(v, NULL);
  rocksdb_free(v);
  return d;
}

static void rdb_mem(void *p, size_t live, store_mem *m) {
  rdb *s = p;
  double cache = (double)rocksdb_cache_get_usage(s->cache);
  double tables = rdb_prop(s, "rocksdb.estimate-table-readers-mem"); /* index + Bloom filters */
  double memtables = rdb_prop(s, "rocksdb.cur-size-all-mem-tables");
  m->total = cache + tables + memtables;
  m->per_key = live ? tables / (double)live : 0;
  snprintf(m->what, sizeof m->what, "block cache %.1f + index/filters %.1f + memtables %.1f MiB",
           cache / 1048576, tables / 1048576, memtables / 1048576);
}

static void rdb_close(void *p) {
  rdb *s = p;
  rocksdb_column_family_handle_destroy(s->cf);
  rocksdb_close(s->db);
  rocksdb_writebatch_destroy(s->wb);
  rocksdb_readoptions_destroy(s->ro);
  rocksdb_writeoptions_destroy(s->wo);
  rocksdb_options_destroy(s->o);
  rocksdb_block_based_options_destroy(s->t);
  rocksdb_cache_destroy(s->cache);
  free(s->kbuf), free(s->kptr), free(s->ksize), free(s->vals), free(s->errs);
  free(s);
}

/* LMDB: one B+tree, 8-byte integer keys, MDB_WRITEMAP | MDB_NOSYNC |
 * MDB_NOMETASYNC (no fsync), MDB_NORDAHEAD (random reads). A batch is one
 * transaction, its keys in key order. No cache of its own: the page cache. */
typedef struct ldb {
  MDB_env *env;
  MDB_dbi dbi;
  kidx *order;
  size_t cap;
} ldb;

static void ldb_check(int rc, const char *what) {
  if (rc != MDB_SUCCESS) die("%s: %s", what, mdb_strerror(rc));
}

static void *ldb_open(const char *dir) {
  ldb *s = xmalloc(sizeof *s);
  memset(s, 0, sizeof *s);
  ldb_check(mdb_env_create(&s->env), "mdb_env_create");
  /* Room for every key 4x over (copy-on-write pages, half-full leaves), at least 1 GiB. */
  size_t map = (opt.keys + opt.steps * opt.batch) * (row_bytes() + 24) * 4;
  if (map < ((size_t)1 << 30)) map = (size_t)1 << 30;
  ldb_check(mdb_env_set_mapsize(s->env, map), "mdb_env_set_mapsize");
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) die("mkdir %s: %s", dir, strerror(errno));
  ldb_check(mdb_env_open(s->env, dir, MDB_WRITEMAP | MDB_NOSYNC | MDB_NOMETASYNC | MDB_NORDAHEAD, 0644),
            "mdb_env_open");
  MDB_txn *txn;
  ldb_check(mdb_txn_begin(s->env, NULL, 0, &txn), "mdb_txn_begin");
  ldb_check(mdb_dbi_open(txn, NULL, MDB_INTEGERKEY, &s->dbi), "mdb_dbi_open");
  ldb_check(mdb_txn_commit(txn), "mdb_txn_commit");
  return s;
}

static const kidx *ldb_sorted(ldb *s, const uint64_t *keys, size_t n) {
  if (n > s->cap) {
    free(s->order);
    s->order = xmalloc(n * sizeof *s->order);
    s->cap = n;
  }
  for (size_t i = 0; i < n; i++) s->order[i] = (kidx){keys[i], (uint32_t)i};
  qsort(s->order, n, sizeof *s->order, kidx_cmp);
  return s->order;
}

static void ldb_get(void *p, const uint64_t *keys, size_t n, float *rows, uint8_t *found) {
  ldb *s = p;
  const kidx *o = ldb_sorted(s, keys, n);
  MDB_txn *txn;
  ldb_check(mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn), "mdb_txn_begin (read)");
  for (size_t j = 0; j < n; j++) {
    uint64_t k = o[j].key;
    MDB_val key = {sizeof k, &k}, val;
    int rc = mdb_get(txn, s->dbi, &key, &val);
    size_t i = o[j].i;
    found[i] = rc == MDB_SUCCESS;
    if (rc == MDB_NOTFOUND) continue;
    ldb_check(rc, "mdb_get");
    if (val.mv_size != row_bytes()) die("mdb_get: a row of %zu bytes", val.mv_size);
    memcpy(rows + i * row_floats(), val.mv_data, val.mv_size);
  }
  mdb_txn_abort(txn);
}

static void ldb_put(void *p, const uint64_t *keys, const float *rows, size_t n) {
  ldb *s = p;
  const kidx *o = ldb_sorted(s, keys, n);
  MDB_txn *txn;
  ldb_check(mdb_txn_begin(s->env, NULL, 0, &txn), "mdb_txn_begin (write)");
  for (size_t j = 0; j < n; j++) {
    uint64_t k = o[j].key;
    MDB_val key = {sizeof k, &k}, val = {row_bytes(), (void *)(rows + (size_t)o[j].i * row_floats())};
    ldb_check(mdb_put(txn, s->dbi, &key, &val, 0), "mdb_put");
  }
  ldb_check(mdb_txn_commit(txn), "mdb_txn_commit");
}

static void ldb_settle(void *p) { (void)p; /* a committed transaction is in the file's pages */ }

static void ldb_close(void *p) {
  ldb *s = p;
  mdb_dbi_close(s->env, s->dbi);
  mdb_env_close(s->env);
  free(s->order);
  free(s);
}

static void *ldb_cold(void *p, const char *dir) {
  ldb *s = p;
  ldb_check(mdb_env_sync(s->env, 1), "mdb_env_sync");
  ldb_close(s); /* unmapped, so the page cache can let the pages go */
  drop_cache(dir);
  return ldb_open(dir);
}

static void ldb_mem(void *p, size_t live, store_mem *m) {
  ldb *s = p;
  MDB_txn *txn;
  MDB_stat st;
  ldb_check(mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn), "mdb_txn_begin (stat)");
  ldb_check(mdb_stat(txn, s->dbi, &st), "mdb_stat");
  mdb_txn_abort(txn);
  double branch = (double)st.ms_branch_pages * st.ms_psize;
  m->total = branch;
  m->per_key = live ? branch / (double)live : 0;
  snprintf(m->what, sizeof m->what, "branch pages %.1f MiB (page cache; %zu leaf pages, depth %u)",
           branch / 1048576, (size_t)st.ms_leaf_pages, st.ms_depth);
}

/* The log: records of key + row appended to one file; an in-memory
 * open-addressing index key -> record number (8 + 4 bytes a slot, load
 * factor at most 0.7). A read looks the batch's keys up, sorts them by
 * offset and preads them, neighbours within 4 KiB in one call; a write
 * appends the batch in one pwrite and points the index at it. Old records
 * stay (no compaction here: the bytes per row after the run show the cost). */
#define LOG_EMPTY UINT32_MAX
typedef struct logs {
  int fd;
  size_t rec;   /* bytes a record */
  uint64_t n_recs;
  uint64_t *ikeys;
  uint32_t *irec;
  size_t icap, live;
  int shift;
  char *buf;
  size_t buf_cap;
  uint64_t *order;
  size_t order_cap;
} logs;

static size_t log_slot(const logs *s, uint64_t key, int *hit) {
  size_t mask = s->icap - 1, i = (size_t)(mix64(key ^ 0x6a09e667f3bcc909ULL) >> s->shift);
  for (;; i = (i + 1) & mask) {
    if (s->irec[i] == LOG_EMPTY) {
      *hit = 0;
      return i;
    }
    if (s->ikeys[i] == key) {
      *hit = 1;
      return i;
    }
  }
}

static void log_index_alloc(logs *s, size_t cap) {
  s->icap = cap;
  s->shift = 64;
  for (size_t c = cap; c > 1; c >>= 1) s->shift--;
  s->ikeys = xmalloc(cap * sizeof *s->ikeys);
  s->irec = xmalloc(cap * sizeof *s->irec);
  memset(s->irec, 0xff, cap * sizeof *s->irec);
}

static void log_index_grow(logs *s, size_t need) {
  if (need * 10 <= s->icap * 7) return;
  size_t cap = s->icap;
  while (need * 10 > cap * 7) cap *= 2;
  uint64_t *ok = s->ikeys;
  uint32_t *orec = s->irec;
  size_t ocap = s->icap;
  log_index_alloc(s, cap);
  for (size_t i = 0; i < ocap; i++) {
    if (orec[i] == LOG_EMPTY) continue;
    int hit;
    size_t j = log_slot(s, ok[i], &hit);
    s->ikeys[j] = ok[i];
    s->irec[j] = orec[i];
  }
  free(ok);
  free(orec);
}

static void *log_open(const char *dir) {
  logs *s = xmalloc(sizeof *s);
  memset(s, 0, sizeof *s);
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) die("mkdir %s: %s", dir, strerror(errno));
  char path[4096];
  snprintf(path, sizeof path, "%s/rows.log", dir);
  s->fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (s->fd < 0) die("opening %s: %s", path, strerror(errno));
  s->rec = 8 + row_bytes();
  log_index_alloc(s, 1024);
  return s;
}

static void log_buf(logs *s, size_t n) {
  if (n <= s->buf_cap) return;
  free(s->buf);
  s->buf = xmalloc(n);
  s->buf_cap = n;
}

static void log_get(void *p, const uint64_t *keys, size_t n, float *rows, uint8_t *found) {
  logs *s = p;
  if (n > s->order_cap) {
    free(s->order);
    s->order = xmalloc(n * sizeof *s->order);
    s->order_cap = n;
  }
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    int hit;
    size_t slot = log_slot(s, keys[i], &hit);
    found[i] = (uint8_t)hit;
    if (hit) s->order[m++] = ((uint64_t)s->irec[slot] << 32) | i; /* record number, then index */
  }
  qsort(s->order, m, sizeof *s->order, u64_cmp);
  const size_t gap = 4096, max_run = (size_t)1 << 20;
  log_buf(s, max_run + s->rec);
  for (size_t a = 0; a < m;) {
    uint64_t first = s->order[a] >> 32;
    size_t b = a + 1;
    while (b < m) {
      uint64_t r = s->order[b] >> 32;
      if ((r - (s->order[b - 1] >> 32)) * s->rec > gap || (r + 1 - first) * s->rec > max_run) break;
      b++;
    }
    size_t len = ((s->order[b - 1] >> 32) + 1 - first) * s->rec;
    off_t off = (off_t)(first * s->rec);
    for (size_t got = 0; got < len;) {
      ssize_t r = pread(s->fd, s->buf + got, len - got, off + (off_t)got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) die("pread: %s", r < 0 ? strerror(errno) : "past the end");
      got += (size_t)r;
    }
    for (size_t j = a; j < b; j++) {
      size_t i = (size_t)(s->order[j] & 0xffffffffu);
      const char *rec = s->buf + ((s->order[j] >> 32) - first) * s->rec;
      uint64_t k;
      memcpy(&k, rec, 8);
      if (k != keys[i]) die("record %llu holds key %016llx, not %016llx",
                            (unsigned long long)(s->order[j] >> 32), (unsigned long long)k,
                            (unsigned long long)keys[i]);
      memcpy(rows + i * row_floats(), rec + 8, row_bytes());
    }
    a = b;
  }
}

static void log_put(void *p, const uint64_t *keys, const float *rows, size_t n) {
  logs *s = p;
  if (s->n_recs + n >= LOG_EMPTY) die("more than 2^32 - 1 records: compaction needed");
  log_buf(s, n * s->rec);
  for (size_t i = 0; i < n; i++) {
    memcpy(s->buf + i * s->rec, &keys[i], 8);
    memcpy(s->buf + i * s->rec + 8, rows + i * row_floats(), row_bytes());
  }
  off_t off = (off_t)(s->n_recs * s->rec);
  size_t len = n * s->rec;
  for (size_t put = 0; put < len;) {
    ssize_t r = pwrite(s->fd, s->buf + put, len - put, off + (off_t)put);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) die("pwrite: %s", r < 0 ? strerror(errno) : "wrote nothing");
    put += (size_t)r;
  }
  log_index_grow(s, s->live + n);
  for (size_t i = 0; i < n; i++) {
    int hit;
    size_t slot = log_slot(s, keys[i], &hit);
    if (!hit) {
      s->ikeys[slot] = keys[i];
      s->live++;
    }
    s->irec[slot] = (uint32_t)(s->n_recs + i);
  }
  s->n_recs += n;
}

static void log_settle(void *p) { (void)p; /* pwrite: in the page cache, the file's */ }

static void *log_cold(void *p, const char *dir) {
  drop_cache(dir); /* the index stays in memory: it is the store's */
  return p;
}

static void log_mem(void *p, size_t live, store_mem *m) {
  logs *s = p;
  double index = (double)s->icap * (sizeof *s->ikeys + sizeof *s->irec);
  m->total = index + (double)s->buf_cap;
  m->per_key = live ? index / (double)live : 0;
  snprintf(m->what, sizeof m->what, "index %.1f MiB (%zu slots, load %.2f) + buffer %.1f MiB",
           index / 1048576, s->icap, (double)s->live / (double)s->icap,
           (double)s->buf_cap / 1048576);
}

static void log_close(void *p) {
  logs *s = p;
  if (close(s->fd) != 0) die("close: %s", strerror(errno));
  free(s->ikeys), free(s->irec), free(s->buf), free(s->order);
  free(s);
}

static const store_ops STORES[] = {
    {"rocksdb", rdb_open, rdb_get, rdb_put, rdb_settle, rdb_cold, rdb_mem, rdb_close},
    {"lmdb", ldb_open, ldb_get, ldb_put, ldb_settle, ldb_cold, ldb_mem, ldb_close},
    {"log", log_open, log_get, log_put, log_settle, log_cold, log_mem, log_close},
};
#define N_STORES (sizeof STORES / sizeof STORES[0])

/* --- the workload -------------------------------------------------------------- */

/* Step s's distinct keys are batches[s * batch ..]: drawn before any store runs. */
static uint64_t *draw_batches(void) {
  uint64_t *out = xmalloc(opt.steps * opt.batch * sizeof *out);
  size_t cap = 1;
  while (cap < opt.batch * 2) cap <<= 1;
  uint64_t *set = xmalloc(cap * sizeof *set);
  uint64_t state = 0x1234567;
  double k = (double)opt.keys, a = 1.0 - opt.skew;
  double top = fabs(a) < 1e-9 ? log(k + 1) : pow(k + 1, a) - 1;
  for (size_t st = 0; st < opt.steps; st++) {
    memset(set, 0xff, cap * sizeof *set); /* UINT64_MAX: empty (no rank is) */
    uint64_t *b = out + st * opt.batch;
    size_t n = 0, draws = 0, seq = 0;
    while (n < opt.batch) {
      uint64_t rank;
      if (draws++ < 64 * opt.batch) {
        double u = (double)(mix64(state++) >> 11) * (1.0 / 9007199254740992.0);
        double x = fabs(a) < 1e-9 ? exp(u * top) : pow(u * top + 1, 1.0 / a);
        rank = (uint64_t)x - 1; /* x in [1, keys + 1) */
        if (rank >= opt.keys) rank = opt.keys - 1;
      } else {
        rank = seq++; /* a skew so steep that draws repeat: the lowest ranks not yet in */
      }
      size_t i = (size_t)mix64(rank) & (cap - 1);
      while (set[i] != UINT64_MAX && set[i] != rank) i = (i + 1) & (cap - 1);
      if (set[i] == rank) continue;
      set[i] = rank;
      b[n++] = key_of(rank);
    }
  }
  free(set);
  return out;
}

typedef struct result {
  int ok;
  double load_s, get_s, put_s, run_s;
  uint64_t loaded, live, misses, rows_read, rows_written;
  double disk_load, disk_run;
  double rss_base, rss_end, file_end;
  store_mem mem;
  uint64_t checksum;
} result;

static void run_store(const store_ops *ops, const uint64_t *batches, result *res) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/%s", opt.dir, ops->name);
  rm_tree(dir);
  double sh;
  rss(&res->rss_base, &sh);
  void *s = ops->open(dir);
  /* Load: every key, rank order, in batches of 16Ki. */
  const size_t chunk = 16384;
  size_t bmax = opt.batch > chunk ? opt.batch : chunk;
  float *rows = xmalloc(bmax * row_bytes());
  uint64_t *keys = xmalloc(bmax * sizeof *keys);
  uint8_t *found = xmalloc(bmax);
  double t0 = now_s();
  for (size_t r = 0; r < opt.keys; r += chunk) {
    size_t n = opt.keys - r < chunk ? opt.keys - r : chunk;
    for (size_t i = 0; i < n; i++) {
      keys[i] = key_of(r + i);
      init_row(keys[i], rows + i * row_floats());
    }
    ops->put(s, keys, rows, n);
  }
  ops->settle(s);
  res->load_s = now_s() - t0;
  res->loaded = res->live = opt.keys;
  res->disk_load = disk_bytes(dir);
  if (opt.cold) s = ops->cold(s, dir);
  uint64_t h = 0;
  double start = now_s();
  for (size_t st = 0; st < opt.steps; st++) {
    const uint64_t *b = batches + st * opt.batch;
    double a = now_s();
    ops->get(s, b, opt.batch, rows, found);
    double m = now_s();
    res->get_s += m - a;
    for (size_t i = 0; i < opt.batch; i++) {
      if (!found[i]) {
        init_row(b[i], rows + i * row_floats());
        res->misses++;
        res->live++;
      }
    }
    h = checksum_rows(h, rows, opt.batch);
    for (size_t i = 0; i < opt.batch; i++) update_row(rows + i * row_floats(), st + 1, i);
    double c = now_s();
    ops->put(s, b, rows, opt.batch);
    res->put_s += now_s() - c;
  }
  res->run_s = now_s() - start;
  ops->settle(s);
  res->rows_read = res->rows_written = opt.steps * opt.batch;
  res->checksum = h;
  res->disk_run = disk_bytes(dir);
  ops->mem(s, res->live, &res->mem);
  rss(&res->rss_end, &res->file_end);
  ops->close(s);
  if (!opt.keep) rm_tree(dir);
  free(rows), free(keys), free(found);
  res->ok = 1;
}

/* --- main -------------------------------------------------------------------------- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_row_store [--keys N] [--batch N] [--dim D] [--steps N] [--skew S]\n"
          "                       [--dir DIR] [--stores rocksdb,lmdb,log] [--cache-mb MB]\n"
          "                       [--memtable-mb MB] [--cold] [--keep]\n"
          "Fixed-width rows (key -> float32[dim + 3]) in RocksDB, LMDB and a log-structured\n"
          "file: load --keys rows, then --steps steps each reading --batch distinct keys\n"
          "(Zipf-like, --skew) in one batch and writing them back in one. No fsync.\n"
          "  --keys 2000000 --batch 4096 --dim 16 --steps 200 --skew 1.1\n"
          "  --dir /tmp/pstrain-row-store (a folder per store, removed after unless --keep)\n"
          "  --cache-mb 64: RocksDB's block cache (LMDB and the log: the page cache only)\n"
          "  --memtable-mb 16: RocksDB's write buffer (2 of them)\n"
          "  --cold: after the load, the files synced and dropped from the page cache\n");
}

static size_t parse_size(const char *flag, const char *v, size_t lo) {
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo) {
    fprintf(stderr, "bench_row_store: %s wants an integer >= %zu, not '%s'\n", flag, lo, v);
    exit(2);
  }
  return (size_t)x;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--cold")) { opt.cold = 1; continue; }
    if (!strcmp(a, "--keep")) { opt.keep = 1; continue; }
    if (i + 1 >= argc) {
      fprintf(stderr, "bench_row_store: %s needs a value (or unknown; --help)\n", a);
      return 2;
    }
    const char *v = argv[++i];
    if (!strcmp(a, "--keys")) opt.keys = parse_size(a, v, 1);
    else if (!strcmp(a, "--batch")) opt.batch = parse_size(a, v, 1);
    else if (!strcmp(a, "--steps")) opt.steps = parse_size(a, v, 1);
    else if (!strcmp(a, "--dim")) opt.dim = (int)parse_size(a, v, 1);
    else if (!strcmp(a, "--cache-mb")) opt.cache_mb = parse_size(a, v, 1);
    else if (!strcmp(a, "--memtable-mb")) opt.memtable_mb = parse_size(a, v, 1);
    else if (!strcmp(a, "--dir")) opt.dir = v;
    else if (!strcmp(a, "--stores")) snprintf(opt.stores, sizeof opt.stores, "%s", v);
    else if (!strcmp(a, "--skew")) {
      char *end;
      opt.skew = strtod(v, &end);
      if (end == v || *end != '\0' || opt.skew < 0 || opt.skew > 5) {
        fprintf(stderr, "bench_row_store: --skew wants 0..5, not '%s'\n", v);
        return 2;
      }
    } else {
      fprintf(stderr, "bench_row_store: unknown argument '%s' (--help)\n", a);
      return 2;
    }
  }
  if (opt.dim > 1024 || opt.batch > opt.keys || opt.batch > ((size_t)1 << 24)) {
    fprintf(stderr, "bench_row_store: --dim <= 1024 and --batch <= min(--keys, 2^24) please\n");
    return 2;
  }
  const store_ops *chosen[N_STORES];
  size_t n_chosen = 0;
  char list[128];
  snprintf(list, sizeof list, "%s", opt.stores);
  for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    size_t j = 0;
    while (j < N_STORES && strcmp(STORES[j].name, t) != 0) j++;
    if (j == N_STORES) {
      fprintf(stderr, "bench_row_store: unknown store '%s' (rocksdb, lmdb, log)\n", t);
      return 2;
    }
    chosen[n_chosen++] = &STORES[j];
  }
  if (n_chosen == 0) {
    fprintf(stderr, "bench_row_store: --stores names none\n");
    return 2;
  }
  if (mkdir(opt.dir, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "bench_row_store: mkdir %s: %s\n", opt.dir, strerror(errno));
    return 1;
  }

  double t0 = now_s();
  uint64_t *batches = draw_batches();
  double draw_s = now_s() - t0;
  printf("rows: key 8 B -> %zu floats (%zu B: dim %d + accumulator + meta); keys %zu, batch %zu "
         "distinct (skew %.2f), steps %zu; dir %s%s; RocksDB cache %zu MiB, memtable %zu MiB x2; "
         "drawing the keys took %.1f s\n",
         row_floats(), row_bytes(), opt.dim, opt.keys, opt.batch, opt.skew, opt.steps, opt.dir,
         opt.cold ? " (--cold)" : "", opt.cache_mb, opt.memtable_mb, draw_s);
  fflush(stdout);

  result res[N_STORES];
  int failed = 0;
  for (size_t c = 0; c < n_chosen; c++) {
    memset(&res[c], 0, sizeof res[c]);
    int fds[2];
    if (pipe(fds) != 0) {
      perror("bench_row_store: pipe");
      return 1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
      perror("bench_row_store: fork");
      return 1;
    }
    if (pid == 0) {
      close(fds[0]);
      current = chosen[c]->name;
      result r;
      memset(&r, 0, sizeof r);
      run_store(chosen[c], batches, &r);
      if (write(fds[1], &r, sizeof r) != (ssize_t)sizeof r) die("writing the result");
      _exit(0);
    }
    close(fds[1]);
    ssize_t got = 0;
    while (got < (ssize_t)sizeof res[c]) {
      ssize_t r = read(fds[0], (char *)&res[c] + got, sizeof res[c] - (size_t)got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += r;
    }
    close(fds[0]);
    int status;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        got != (ssize_t)sizeof res[c]) {
      res[c].ok = 0;
      failed = 1;
      fprintf(stderr, "bench_row_store: %s failed\n", chosen[c]->name);
    }
  }

  const double MiB = 1048576.0;
  printf("\n| store | load rows/s | steps/s | rows read/s | rows written/s | disk B/row "
         "after load | after run | RSS MiB (file-backed) | store memory MiB | index B/key |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|\n");
  uint64_t sum0 = 0;
  int sums_differ = 0, have_sum = 0;
  for (size_t c = 0; c < n_chosen; c++) {
    const result *r = &res[c];
    if (!r->ok) {
      printf("| %s | failed (see above) | | | | | | | | |\n", chosen[c]->name);
      continue;
    }
    if (!have_sum) sum0 = r->checksum, have_sum = 1;
    else if (r->checksum != sum0) sums_differ = 1;
    printf("| %s | %.0f | %.1f | %.0f | %.0f | %.1f | %.1f | %.0f (%.0f) | %.1f | %.2f |\n",
           chosen[c]->name, (double)r->loaded / r->load_s, (double)opt.steps / r->run_s,
           (double)r->rows_read / r->get_s, (double)r->rows_written / r->put_s,
           r->disk_load / (double)r->loaded, r->disk_run / (double)r->live, r->rss_end / MiB,
           r->file_end / MiB, r->mem.total / MiB, r->mem.per_key);
  }
  printf("\n");
  for (size_t c = 0; c < n_chosen; c++) {
    const result *r = &res[c];
    if (!r->ok) continue;
    printf("%s: load %.1f s; run %.2f s (reads %.2f s, writes %.2f s); misses %llu; "
           "%s; RSS at start %.0f MiB; checksum %016llx\n",
           chosen[c]->name, r->load_s, r->run_s, r->get_s, r->put_s,
           (unsigned long long)r->misses, r->mem.what, r->rss_base / MiB,
           (unsigned long long)r->checksum);
  }
  if (sums_differ) {
    fprintf(stderr, "bench_row_store: the stores read different rows (checksums differ)\n");
    failed = 1;
  }
  free(batches);
  return failed;
}
