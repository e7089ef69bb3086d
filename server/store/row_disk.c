/* The disk tier's store (server/store/row_disk.h): one LMDB environment,
 * DIR/rows.mdb and DIR/rows.mdb-lock (MDB_NOSUBDIR), one database per table
 * ("t0", "t1", ...) keyed by the native uint64 (MDB_INTEGERKEY: numeric
 * order, which the snapshot's ascending iteration relies on).
 *
 * The map starts at 1 GiB of address space (the file grows only as pages
 * are written: no MDB_WRITEMAP) and doubles when a write finds it full.
 * PSTRAIN_ROW_DISK_MAP_BYTES, read at open, sets the starting size instead
 * (tests start it small to force growth).
 *
 * LMDB may change the map's size only while this process has no
 * transaction open (it unmaps and maps again under the readers' pointers).
 * A gate (a mutex and a condition, below) counts the open transactions and
 * lets a resize wait for none. It is not a pthread rwlock because a
 * snapshot's transaction is begun on one thread and ended on another,
 * and a rwlock must be unlocked by the thread that locked it. */
#define _GNU_SOURCE /* EDQUOT */
#include "server/store/row_disk.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* MDB_INTEGERKEY keys are size_t (or unsigned int): ours are uint64_t. */
_Static_assert(sizeof(size_t) == sizeof(uint64_t), "row_disk needs a 64-bit size_t");

#define ROW_DISK_PATH_MAX 4096
#define ROW_DISK_FILE "rows.mdb"
#define ROW_DISK_MAP_DEFAULT ((size_t)1 << 30)
/* Threads reading at once (pulls, the checkpoint's snapshot, stats), each
 * taking a reader slot while its transaction is open. */
#define ROW_DISK_READERS 126

struct row_disk {
  MDB_env *env;
  MDB_dbi dbi[ROW_DISK_TABLES_MAX];
  int tables;
  size_t row_bytes[ROW_DISK_TABLES_MAX];
  size_t map_bytes; /* the map's size; changed only by a resize, under the gate */
  char dir[ROW_DISK_PATH_MAX];
  char path[ROW_DISK_PATH_MAX + 16];      /* DIR/rows.mdb */
  char lock_path[ROW_DISK_PATH_MAX + 32]; /* DIR/rows.mdb-lock */

  /* The gate. users: transactions open (reads, snapshots, stats, the
   * writer's). A resize sets resizing, waits for users 0, resizes. New
   * users wait while a resize is pending, so a stream of short reads cannot
   * starve it; except while a snapshot is open: the resize waits for the
   * checkpoint anyway, and reads must not stall for that long. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int users, snapshots, resizing;

  /* Reads run on several threads. */
  _Atomic uint64_t rows_read, bytes_read, rows_written, bytes_written;
};

struct row_disk_snapshot {
  row_disk *d;
  MDB_txn *txn;
  MDB_cursor *cur[ROW_DISK_TABLES_MAX];
  int started[ROW_DISK_TABLES_MAX], done[ROW_DISK_TABLES_MAX];
};

/* --- the gate ------------------------------------------------------------- */

static void gate_enter(row_disk *d, int snapshot) {
  pthread_mutex_lock(&d->mu);
  while (d->resizing && (d->users == 0 || d->snapshots == 0)) pthread_cond_wait(&d->cv, &d->mu);
  d->users++;
  d->snapshots += snapshot;
  pthread_mutex_unlock(&d->mu);
}

static void gate_leave(row_disk *d, int snapshot) {
  pthread_mutex_lock(&d->mu);
  d->users--;
  d->snapshots -= snapshot;
  if (d->users == 0) pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
}

/* Doubles the map (grow) or sets it to the size the file's meta page says
 * (after MDB_MAP_RESIZED), with no transaction open in this process. The
 * caller holds none. */
static ps_err resize(row_disk *d, int grow, ps_error *err) {
  pthread_mutex_lock(&d->mu);
  while (d->resizing) pthread_cond_wait(&d->cv, &d->mu);
  d->resizing = 1;
  while (d->users > 0) pthread_cond_wait(&d->cv, &d->mu);
  pthread_mutex_unlock(&d->mu);

  /* Alone now: map_bytes is read and written only here (and at open). */
  size_t was = d->map_bytes, bytes = grow ? was * 2 : 0;
  int rc = grow && was > SIZE_MAX / 2 ? ENOMEM : mdb_env_set_mapsize(d->env, bytes);
  MDB_envinfo info;
  if (rc == 0) rc = mdb_env_info(d->env, &info);
  if (rc == 0) d->map_bytes = info.me_mapsize;

  pthread_mutex_lock(&d->mu);
  d->resizing = 0;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  if (rc != 0) {
    return ps_error_set(err, rc == ENOMEM ? PS_ERR_NO_MEMORY : PS_ERR_INTERNAL,
                        "row store %s: %s the map (%zu bytes): %s", d->dir,
                        grow ? "doubling" : "taking the file's size for", was, mdb_strerror(rc));
  }
  return PS_ERR_OK;
}

/* --- errors --------------------------------------------------------------- */

/* LMDB returns its own codes and errno values alike. */
static ps_err mdb_code(int rc) {
  switch (rc) {
    case ENOSPC:
    case EDQUOT:
    case MDB_READERS_FULL:
      return PS_ERR_RESOURCE_EXHAUSTED;
    case ENOMEM:
      return PS_ERR_NO_MEMORY;
    case EIO:
      return PS_ERR_IO;
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_BAD_VALSIZE:
      return PS_ERR_CORRUPT_DATA;
    default:
      return PS_ERR_INTERNAL;
  }
}

static int disk_full(int rc) { return rc == ENOSPC || rc == EDQUOT; }

/* Whether a write's rc means the disk is full. pwrite's ENOSPC comes
 * through as it is, but LMDB reports a short write (the disk filled part
 * way through a run of pages: the usual way it fills) as EIO; then the
 * free space decides: less than the batch could need (twice its bytes and
 * 1 MiB of tree pages) is full. *free_bytes: what statvfs said, or -1. */
static int write_disk_full(const row_disk *d, int rc, uint64_t batch_bytes, long long *free_bytes) {
  *free_bytes = -1;
  if (disk_full(rc)) return 1;
  if (rc != EIO) return 0;
  struct statvfs vfs;
  if (statvfs(d->dir, &vfs) != 0) return 0;
  uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
  *free_bytes = avail > (uint64_t)LLONG_MAX ? LLONG_MAX : (long long)avail;
  return avail < 2 * batch_bytes + ((uint64_t)1 << 20);
}

/* --- open and close ------------------------------------------------------- */

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

static ps_err remove_file(const char *path, ps_error *err) {
  if (unlink(path) != 0 && errno != ENOENT) {
    return ps_error_set(err, PS_ERR_IO, "row store: removing the old store file %s: %s", path,
                        strerror(errno));
  }
  return PS_ERR_OK;
}

/* The starting map size: PSTRAIN_ROW_DISK_MAP_BYTES or 1 GiB. */
static ps_err start_map_bytes(size_t *out, ps_error *err) {
  *out = ROW_DISK_MAP_DEFAULT;
  const char *text = getenv("PSTRAIN_ROW_DISK_MAP_BYTES");
  if (text == NULL || text[0] == '\0') return PS_ERR_OK;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v == 0 || v > SIZE_MAX / 4) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "row store: PSTRAIN_ROW_DISK_MAP_BYTES=%s is not a positive byte count",
                        text);
  }
  *out = (size_t)v;
  return PS_ERR_OK;
}

ps_err row_disk_open(row_disk **out, const char *dir, int tables, const size_t *row_bytes,
                     ps_error *err) {
  *out = NULL;
  if (tables < 1 || tables > ROW_DISK_TABLES_MAX) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "row store %s: %d tables (1 to %d)", dir,
                        tables, ROW_DISK_TABLES_MAX);
  }
  for (int t = 0; t < tables; t++) {
    /* LMDB's value size limit is 4 GiB; a row is far smaller. */
    if (row_bytes[t] == 0 || row_bytes[t] > UINT32_MAX) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                          "row store %s: table %d's rows are %zu bytes", dir, t, row_bytes[t]);
    }
  }
  if (dir[0] == '\0' ||
      strlen(dir) + sizeof ROW_DISK_FILE + sizeof "-lock" + 1 > ROW_DISK_PATH_MAX) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "row store: directory \"%s\" (empty or too long)", dir);
  }
  size_t map_bytes;
  ps_err code = start_map_bytes(&map_bytes, err);
  if (code == PS_ERR_OK) code = make_dirs(dir, err);
  if (code != PS_ERR_OK) return code;

  row_disk *d = calloc(1, sizeof *d);
  if (d == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "row store %s: no memory", dir);
  d->tables = tables;
  for (int t = 0; t < tables; t++) d->row_bytes[t] = row_bytes[t];
  snprintf(d->dir, sizeof d->dir, "%s", dir);
  snprintf(d->path, sizeof d->path, "%s/%s", dir, ROW_DISK_FILE);
  snprintf(d->lock_path, sizeof d->lock_path, "%s-lock", d->path);
  atomic_init(&d->rows_read, 0);
  atomic_init(&d->bytes_read, 0);
  atomic_init(&d->rows_written, 0);
  atomic_init(&d->bytes_written, 0);
  if (pthread_mutex_init(&d->mu, NULL) != 0 || pthread_cond_init(&d->cv, NULL) != 0) {
    free(d);
    return ps_error_set(err, PS_ERR_INTERNAL, "row store %s: making its lock failed", dir);
  }

  /* A store left by an earlier run is never trusted: the checkpoint is. */
  code = remove_file(d->path, err);
  if (code == PS_ERR_OK) code = remove_file(d->lock_path, err);
  if (code != PS_ERR_OK) {
    row_disk_close(d);
    return code;
  }

  const char *doing = "creating the environment";
  int rc = mdb_env_create(&d->env);
  if (rc == 0) {
    doing = "setting the map size";
    rc = mdb_env_set_mapsize(d->env, map_bytes);
  }
  if (rc == 0) {
    doing = "setting the number of databases";
    rc = mdb_env_set_maxdbs(d->env, (MDB_dbi)tables);
  }
  if (rc == 0) {
    doing = "setting the number of readers";
    rc = mdb_env_set_maxreaders(d->env, ROW_DISK_READERS);
  }
  if (rc == 0) {
    /* NOSYNC, NOMETASYNC: nothing here needs to survive a crash (the
     * checkpoint is the truth). NORDAHEAD: reads are random rows, and
     * readahead would fill the page cache with neighbours. NOTLS: a reader
     * slot per transaction, not per thread, so a snapshot can be begun on
     * one thread and iterated on another. No WRITEMAP: pages are written
     * with pwrite, so a full disk is an error from the commit, not a SIGBUS
     * on a store into the map. */
    doing = "opening the environment";
    rc = mdb_env_open(d->env, d->path,
                      MDB_NOSUBDIR | MDB_NOSYNC | MDB_NOMETASYNC | MDB_NORDAHEAD | MDB_NOTLS, 0600);
  }
  if (rc != 0) {
    code = ps_error_set(err, disk_full(rc) ? PS_ERR_RESOURCE_EXHAUSTED : mdb_code(rc),
                        "row store %s: %s: %s%s", dir, doing, mdb_strerror(rc),
                        disk_full(rc) ? " (disk full)" : "");
    row_disk_close(d);
    return code;
  }
  MDB_envinfo info;
  d->map_bytes = mdb_env_info(d->env, &info) == 0 ? info.me_mapsize : map_bytes;

  MDB_txn *txn;
  doing = "beginning the transaction that makes the tables";
  rc = mdb_txn_begin(d->env, NULL, 0, &txn);
  for (int t = 0; rc == 0 && t < tables; t++) {
    char name[16];
    snprintf(name, sizeof name, "t%d", t);
    doing = "making a table's database";
    rc = mdb_dbi_open(txn, name, MDB_CREATE | MDB_INTEGERKEY, &d->dbi[t]);
    if (rc != 0) mdb_txn_abort(txn);
  }
  if (rc == 0) {
    doing = "committing the tables";
    rc = mdb_txn_commit(txn);
  }
  if (rc != 0) {
    code = ps_error_set(err, disk_full(rc) ? PS_ERR_RESOURCE_EXHAUSTED : mdb_code(rc),
                        "row store %s: %s: %s%s", dir, doing, mdb_strerror(rc),
                        disk_full(rc) ? " (disk full)" : "");
    row_disk_close(d);
    return code;
  }
  *out = d;
  return PS_ERR_OK;
}

void row_disk_close(row_disk *d) {
  if (d == NULL) return;
  /* Every snapshot must have ended, and no read be running. */
  if (d->env != NULL) mdb_env_close(d->env);
  /* Best effort: a file that cannot be removed is removed at the next open. */
  if (d->env != NULL) {
    if (unlink(d->path) != 0 && errno != ENOENT) {
      fprintf(stderr, "row store: removing %s: %s\n", d->path, strerror(errno));
    }
    if (unlink(d->lock_path) != 0 && errno != ENOENT) {
      fprintf(stderr, "row store: removing %s: %s\n", d->lock_path, strerror(errno));
    }
  }
  pthread_cond_destroy(&d->cv);
  pthread_mutex_destroy(&d->mu);
  free(d);
}

const char *row_disk_path(const row_disk *d) { return d->dir; }

/* --- read ----------------------------------------------------------------- */

typedef struct key_at {
  uint64_t key;
  size_t at; /* its index in the caller's arrays */
} key_at;

/* By key, then by index: a sort that keeps equal keys in the caller's
 * order (the last of a batch's duplicate puts wins). */
static int key_at_cmp(const void *a, const void *b) {
  const key_at *x = a, *y = b;
  if (x->key != y->key) return (x->key > y->key) - (x->key < y->key);
  return (x->at > y->at) - (x->at < y->at);
}

static key_at *sorted_keys(const uint64_t *keys, size_t n) {
  key_at *s = malloc((n > 0 ? n : 1) * sizeof *s);
  if (s == NULL) return NULL;
  for (size_t i = 0; i < n; i++) s[i] = (key_at){keys[i], i};
  qsort(s, n, sizeof *s, key_at_cmp);
  return s;
}

ps_err row_disk_read(row_disk *d, int t, const uint64_t *keys, size_t n, void *rows, uint8_t *found,
                     ps_error *err) {
  if (t < 0 || t >= d->tables) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "row store %s: no table %d (%d tables)",
                        d->dir, t, d->tables);
  }
  if (n == 0) return PS_ERR_OK;
  size_t rb = d->row_bytes[t];
  /* In key order the B+tree's pages are visited once each, left to right. */
  key_at *s = sorted_keys(keys, n);
  if (s == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "row store %s: no memory to sort %zu keys", d->dir,
                        n);
  }
  ps_err code = PS_ERR_OK;
  for (;;) {
    gate_enter(d, 0);
    MDB_txn *txn;
    int rc = mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn);
    if (rc == MDB_MAP_RESIZED) {
      /* Another process grew the map (never this one's writer, which
       * resizes with no transaction open): take its size and retry. */
      gate_leave(d, 0);
      code = resize(d, 0, err);
      if (code != PS_ERR_OK) break;
      continue;
    }
    if (rc != 0) {
      gate_leave(d, 0);
      code = ps_error_set(err, mdb_code(rc),
                          "row store %s: beginning a read of %zu rows of table %d: %s", d->dir, n,
                          t, mdb_strerror(rc));
      break;
    }
    uint64_t hits = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
      uint64_t key = s[i].key;
      MDB_val k = {sizeof key, &key}, v;
      rc = mdb_get(txn, d->dbi[t], &k, &v);
      if (rc == MDB_NOTFOUND) {
        found[s[i].at] = 0;
        rc = 0;
      } else if (rc == 0 && v.mv_size != rb) {
        rc = MDB_BAD_VALSIZE;
      } else if (rc == 0) {
        memcpy((char *)rows + s[i].at * rb, v.mv_data, rb);
        found[s[i].at] = 1;
        hits++;
      }
    }
    mdb_txn_abort(txn);
    gate_leave(d, 0);
    if (rc != 0) {
      code = ps_error_set(err, mdb_code(rc),
                          "row store %s: reading %zu rows of table %d (%zu bytes each): %s", d->dir,
                          n, t, rb, mdb_strerror(rc));
      break;
    }
    atomic_fetch_add_explicit(&d->rows_read, hits, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->bytes_read, hits * rb, memory_order_relaxed);
    ps_error_clear(err);
    break;
  }
  free(s);
  return code;
}

/* --- write ---------------------------------------------------------------- */

/* One attempt at the whole batch in one transaction; rc 0 or LMDB's code,
 * with what failed in *doing. The transaction is gone either way. */
static int write_once(row_disk *d, key_at *const *sorted, const void *const *rows, const size_t *n,
                      const uint64_t *const *del, const size_t *del_n, const char **doing) {
  MDB_txn *txn;
  *doing = "beginning the write";
  int rc = mdb_txn_begin(d->env, NULL, 0, &txn);
  if (rc != 0) return rc;
  for (int t = 0; t < d->tables; t++) {
    size_t rb = d->row_bytes[t];
    *doing = "writing rows";
    for (size_t i = 0; i < n[t]; i++) {
      uint64_t key = sorted[t][i].key;
      MDB_val k = {sizeof key, &key};
      MDB_val v = {rb, (void *)((const char *)rows[t] + sorted[t][i].at * rb)};
      rc = mdb_put(txn, d->dbi[t], &k, &v, 0);
      if (rc != 0) goto fail;
    }
    *doing = "deleting rows";
    for (size_t i = 0; i < del_n[t]; i++) {
      uint64_t key = del[t][i];
      MDB_val k = {sizeof key, &key};
      rc = mdb_del(txn, d->dbi[t], &k, NULL);
      if (rc == MDB_NOTFOUND) rc = 0;
      if (rc != 0) goto fail;
    }
  }
  *doing = "committing the write";
  return mdb_txn_commit(txn); /* it frees the transaction, failed or not */
fail:
  mdb_txn_abort(txn);
  return rc;
}

ps_err row_disk_write(row_disk *d, const uint64_t *const *keys, const void *const *rows,
                      const size_t *n, const uint64_t *const *del, const size_t *del_n,
                      ps_error *err) {
  key_at *sorted[ROW_DISK_TABLES_MAX] = {0};
  size_t total_rows = 0, total_del = 0;
  uint64_t bytes = 0;
  ps_err code = PS_ERR_OK;
  /* Puts in key order: each leaf page is dirtied once and the tree
   * walked left to right. */
  for (int t = 0; t < d->tables; t++) {
    total_rows += n[t];
    total_del += del_n[t];
    bytes += (uint64_t)n[t] * d->row_bytes[t];
    if (n[t] == 0) continue;
    sorted[t] = sorted_keys(keys[t], n[t]);
    if (sorted[t] == NULL) {
      code = ps_error_set(err, PS_ERR_NO_MEMORY, "row store %s: no memory to sort %zu keys", d->dir,
                          n[t]);
      goto out;
    }
  }
  if (total_rows == 0 && total_del == 0) goto out;

  for (;;) {
    const char *doing;
    gate_enter(d, 0);
    int rc = write_once(d, sorted, rows, n, del, del_n, &doing);
    gate_leave(d, 0);
    if (rc == MDB_MAP_FULL) {
      /* Grow and retry the whole batch (the failed one was aborted). With a
       * snapshot open this waits for its end: a checkpoint's length. */
      code = resize(d, 1, err);
      if (code != PS_ERR_OK) goto out;
      continue;
    }
    if (rc == MDB_MAP_RESIZED) { /* another process grew it: take its size */
      code = resize(d, 0, err);
      if (code != PS_ERR_OK) goto out;
      continue;
    }
    long long free_bytes;
    if (write_disk_full(d, rc, bytes + (uint64_t)(total_rows + total_del) * 16, &free_bytes)) {
      char room[64] = "";
      if (free_bytes >= 0) snprintf(room, sizeof room, ", %lld bytes free", free_bytes);
      code = ps_error_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                          "row store %s: disk full %s (%zu rows, %zu deletes%s): %s; the store is "
                          "as before the batch",
                          d->dir, doing, total_rows, total_del, room, mdb_strerror(rc));
      goto out;
    }
    if (rc != 0) {
      code = ps_error_set(err, mdb_code(rc), "row store %s: %s (%zu rows, %zu deletes): %s", d->dir,
                          doing, total_rows, total_del, mdb_strerror(rc));
      goto out;
    }
    break;
  }
  /* Not for durability (nothing here survives a restart): the commit left
   * its pages dirty in the page cache, and dirty pages count against the
   * memory cgroup and are slow to reclaim; under NOSYNC they would pile up
   * batch after batch. Writing them back now keeps them few (clean pages
   * can be dropped at once). */
  int rc = mdb_env_sync(d->env, 1);
  if (rc != 0) {
    /* The batch is committed and readable; the disk failed under it. */
    code = ps_error_set(err, disk_full(rc) ? PS_ERR_RESOURCE_EXHAUSTED : PS_ERR_IO,
                        "row store %s: writing a committed batch back to disk%s: %s", d->dir,
                        disk_full(rc) ? " (disk full)" : "", mdb_strerror(rc));
    goto out;
  }
  atomic_fetch_add_explicit(&d->rows_written, total_rows, memory_order_relaxed);
  atomic_fetch_add_explicit(&d->bytes_written, bytes, memory_order_relaxed);

out:
  for (int t = 0; t < d->tables; t++) free(sorted[t]);
  if (code == PS_ERR_OK) ps_error_clear(err);
  return code;
}

/* --- snapshot ------------------------------------------------------------- */

ps_err row_disk_snapshot_begin(row_disk *d, row_disk_snapshot **out, ps_error *err) {
  *out = NULL;
  row_disk_snapshot *s = calloc(1, sizeof *s);
  if (s == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "row store %s: no memory", d->dir);
  s->d = d;
  /* Counted in the gate until the end: the map must not move under it. */
  for (;;) {
    gate_enter(d, 1);
    int rc = mdb_txn_begin(d->env, NULL, MDB_RDONLY, &s->txn);
    if (rc == MDB_MAP_RESIZED) {
      gate_leave(d, 1);
      ps_err code = resize(d, 0, err);
      if (code != PS_ERR_OK) {
        free(s);
        return code;
      }
      continue;
    }
    if (rc != 0) {
      gate_leave(d, 1);
      free(s);
      return ps_error_set(err, mdb_code(rc), "row store %s: beginning a snapshot: %s", d->dir,
                          mdb_strerror(rc));
    }
    break;
  }
  for (int t = 0; t < d->tables; t++) {
    int rc = mdb_cursor_open(s->txn, d->dbi[t], &s->cur[t]);
    if (rc != 0) {
      ps_err code = ps_error_set(err, mdb_code(rc),
                                 "row store %s: opening a snapshot's cursor on table %d: %s",
                                 d->dir, t, mdb_strerror(rc));
      row_disk_snapshot_end(s);
      return code;
    }
  }
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
  if (s->done[t]) return 0;
  MDB_val k, v;
  int rc = mdb_cursor_get(s->cur[t], &k, &v, s->started[t] ? MDB_NEXT : MDB_FIRST);
  s->started[t] = 1;
  if (rc == MDB_NOTFOUND) {
    s->done[t] = 1;
    return 0;
  }
  if (rc == 0 && (k.mv_size != sizeof *key || v.mv_size != d->row_bytes[t])) rc = MDB_BAD_VALSIZE;
  if (rc != 0) {
    ps_error_set(err, mdb_code(rc), "row store %s: a snapshot's next row of table %d: %s", d->dir,
                 t, mdb_strerror(rc));
    return -1;
  }
  memcpy(key, k.mv_data, sizeof *key);
  memcpy(row, v.mv_data, v.mv_size);
  return 1;
}

void row_disk_snapshot_rewind(row_disk_snapshot *s, int t) {
  if (t < 0 || t >= s->d->tables) return;
  s->started[t] = 0;
  s->done[t] = 0;
}

void row_disk_snapshot_end(row_disk_snapshot *s) {
  if (s == NULL) return;
  for (int t = 0; t < s->d->tables; t++) {
    if (s->cur[t] != NULL) mdb_cursor_close(s->cur[t]);
  }
  mdb_txn_abort(s->txn);
  gate_leave(s->d, 1);
  free(s);
}

/* --- stats ---------------------------------------------------------------- */

void row_disk_stats_get(row_disk *d, row_disk_stats *out) {
  memset(out, 0, sizeof *out);
  out->rows_read = atomic_load_explicit(&d->rows_read, memory_order_relaxed);
  out->bytes_read = atomic_load_explicit(&d->bytes_read, memory_order_relaxed);
  out->rows_written = atomic_load_explicit(&d->rows_written, memory_order_relaxed);
  out->bytes_written = atomic_load_explicit(&d->bytes_written, memory_order_relaxed);
  struct stat st;
  if (stat(d->path, &st) == 0) out->file_bytes = (uint64_t)st.st_blocks * 512;
  /* The row counts need a read transaction; without one (no reader slot)
   * they stay 0 this time. */
  gate_enter(d, 0);
  MDB_txn *txn;
  if (mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn) == 0) {
    for (int t = 0; t < d->tables; t++) {
      MDB_stat ms;
      if (mdb_stat(txn, d->dbi[t], &ms) == 0) out->rows[t] = ms.ms_entries;
    }
    mdb_txn_abort(txn);
  }
  gate_leave(d, 0);
}
