/* The disk tier's store (server/store/row_disk.h, RocksDB):
 * rows of two tables of different widths read back byte for byte, missing
 * keys, duplicate keys, overwrites and deletes, an empty batch; snapshots
 * in ascending numeric key order (keys above 2^63 too) that do not see
 * later writes; the statistics; an old store removed at open; bad
 * arguments; a full disk (a small tmpfs in a mount namespace of its own:
 * root only, skipped with the reason otherwise); 300k rows written while
 * three threads read and a snapshot is open (memtable flushes and
 * compactions under them), the snapshot still as it began; the tier's
 * readers (tier_readers.h) reading what one MultiGet reads. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "server/store/row_disk.h"
#include "server/store/tier_readers.h"
#include "tests/check.h"

static char tmp[64];  /* this run's folder */
static char dir[128]; /* the store's: tmp/store (made by the store) */

/* A row's bytes from its key, table and version: every byte checks. */
static void fill(uint8_t *row, size_t bytes, uint64_t key, int t, unsigned version) {
  uint64_t x = key * 0x9E3779B97F4A7C15ull + (uint64_t)t * 131u + version * 7919u;
  for (size_t i = 0; i < bytes; i++) {
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    row[i] = (uint8_t)(x >> 56);
  }
}

static int row_is(const uint8_t *row, size_t bytes, uint64_t key, int t, unsigned version) {
  uint8_t want[256];
  fill(want, bytes, key, t, version);
  return memcmp(row, want, bytes) == 0;
}

static const size_t ROW_BYTES[2] = {76, 20};

static row_disk *open_store(void) {
  row_disk *d = NULL;
  ps_error err;
  ps_error_clear(&err);
  ps_err rc = row_disk_open(&d, dir, 2, ROW_BYTES, &err);
  if (rc != PS_ERR_OK) fprintf(stderr, "open: %s\n", err.msg);
  REQUIRE(rc == PS_ERR_OK);
  return d;
}

/* Writes n keys of table t (the other table nothing), version v. */
static ps_err put(row_disk *d, int t, const uint64_t *keys, size_t n, unsigned v, ps_error *err) {
  uint8_t *rows = malloc((n > 0 ? n : 1) * ROW_BYTES[t]);
  REQUIRE(rows != NULL);
  for (size_t i = 0; i < n; i++) fill(rows + i * ROW_BYTES[t], ROW_BYTES[t], keys[i], t, v);
  const uint64_t *k[2] = {NULL, NULL};
  const void *r[2] = {NULL, NULL};
  size_t cnt[2] = {0, 0}, dn[2] = {0, 0};
  const uint64_t *del[2] = {NULL, NULL};
  k[t] = keys;
  r[t] = rows;
  cnt[t] = n;
  ps_err rc = row_disk_write(d, k, r, cnt, del, dn, err);
  free(rows);
  return rc;
}

static ps_err drop(row_disk *d, int t, const uint64_t *keys, size_t n, ps_error *err) {
  const uint64_t *k[2] = {NULL, NULL}, *del[2] = {NULL, NULL};
  const void *r[2] = {NULL, NULL};
  size_t cnt[2] = {0, 0}, dn[2] = {0, 0};
  del[t] = keys;
  dn[t] = n;
  return row_disk_write(d, k, r, cnt, del, dn, err);
}

/* Whether key of table t reads back as version v (v < 0: absent). */
static int has(row_disk *d, int t, uint64_t key, int v) {
  uint8_t row[256], found = 9;
  ps_error err;
  REQUIRE(row_disk_read(d, t, &key, 1, row, &found, &err) == PS_ERR_OK);
  if (v < 0) return found == 0;
  return found == 1 && row_is(row, ROW_BYTES[t], key, t, (unsigned)v);
}

static int exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* The store's files: RocksDB's folder. */
static void data_path(char *out, size_t len) { snprintf(out, len, "%s/rows.rocksdb", dir); }

/* Two tables, both at once in one batch, read back in a shuffled order. */
static void case_two_tables(void) {
  row_disk *d = open_store();
  CHECK_EQ_STR(row_disk_path(d), dir);
  enum { N0 = 3000, N1 = 1200 };
  uint64_t *k0 = malloc(N0 * sizeof *k0), *k1 = malloc(N1 * sizeof *k1);
  uint8_t *r0 = malloc(N0 * ROW_BYTES[0]), *r1 = malloc(N1 * ROW_BYTES[1]);
  REQUIRE(k0 && k1 && r0 && r1);
  for (size_t i = 0; i < N0; i++) {
    k0[i] = (i * 2654435761u) ^ ((uint64_t)i << 40);
    fill(r0 + i * ROW_BYTES[0], ROW_BYTES[0], k0[i], 0, 1);
  }
  for (size_t i = 0; i < N1; i++) {
    k1[i] = k0[i]; /* the same keys in the other table: separate rows */
    fill(r1 + i * ROW_BYTES[1], ROW_BYTES[1], k1[i], 1, 1);
  }
  const uint64_t *k[2] = {k0, k1}, *del[2] = {NULL, NULL};
  const void *r[2] = {r0, r1};
  size_t n[2] = {N0, N1}, dn[2] = {0, 0};
  ps_error err;
  REQUIRE(row_disk_write(d, k, r, n, del, dn, &err) == PS_ERR_OK);

  /* Reversed, with missing keys between. */
  enum { M = 2 * N0 };
  uint64_t *q = malloc(M * sizeof *q);
  uint8_t *out = malloc(M * ROW_BYTES[0]), *found = malloc(M);
  REQUIRE(q && out && found);
  for (size_t i = 0; i < N0; i++) {
    q[2 * i] = k0[N0 - 1 - i];
    q[2 * i + 1] = k0[N0 - 1 - i] + 0x100000000000000ull; /* never written */
  }
  memset(found, 7, M);
  REQUIRE(row_disk_read(d, 0, q, M, out, found, &err) == PS_ERR_OK);
  int bad = 0;
  for (size_t i = 0; i < N0; i++) {
    bad += found[2 * i] != 1 || !row_is(out + 2 * i * ROW_BYTES[0], ROW_BYTES[0], q[2 * i], 0, 1);
    bad += found[2 * i + 1] != 0;
  }
  CHECK_EQ_INT(bad, 0);
  REQUIRE(row_disk_read(d, 1, q, M, out, found, &err) == PS_ERR_OK);
  bad = 0;
  for (size_t i = 0; i < N0; i++) {
    int want = N0 - 1 - i < N1;
    bad += found[2 * i] != want ||
           (want && !row_is(out + 2 * i * ROW_BYTES[1], ROW_BYTES[1], q[2 * i], 1, 1));
    bad += found[2 * i + 1] != 0;
  }
  CHECK_EQ_INT(bad, 0);
  /* No keys: nothing read, fine. */
  CHECK(row_disk_read(d, 0, q, 0, out, found, &err) == PS_ERR_OK);
  /* No such table. */
  CHECK(row_disk_read(d, 2, q, 1, out, found, &err) == PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "table 2");
  free(q);
  free(out);
  free(found);
  free(k0);
  free(k1);
  free(r0);
  free(r1);
  row_disk_close(d);
}

/* A key asked for several times in one read gets its row each time. */
static void case_duplicate_reads(void) {
  row_disk *d = open_store();
  uint64_t keys[3] = {5, 1, 9};
  ps_error err;
  REQUIRE(put(d, 0, keys, 3, 2, &err) == PS_ERR_OK);
  uint64_t q[7] = {9, 5, 9, 4, 1, 9, 4};
  uint8_t rows[7 * 76], found[7];
  REQUIRE(row_disk_read(d, 0, q, 7, rows, found, &err) == PS_ERR_OK);
  for (int i = 0; i < 7; i++) {
    if (q[i] == 4) {
      CHECK_EQ_INT(found[i], 0);
    } else {
      CHECK_EQ_INT(found[i], 1);
      CHECK(row_is(rows + i * 76, 76, q[i], 0, 2));
    }
  }
  row_disk_close(d);
}

/* A write replaces; within one batch the last of a key's rows wins; a
 * delete removes (absent keys ignored); a key put and deleted in one batch
 * is deleted (puts, then deletes). */
static void case_overwrite_delete(void) {
  row_disk *d = open_store();
  uint64_t keys[4] = {10, 20, 30, 40};
  ps_error err;
  REQUIRE(put(d, 0, keys, 4, 1, &err) == PS_ERR_OK);
  uint64_t two[2] = {20, 30};
  REQUIRE(put(d, 0, two, 2, 2, &err) == PS_ERR_OK);
  CHECK(has(d, 0, 10, 1));
  CHECK(has(d, 0, 20, 2));
  CHECK(has(d, 0, 30, 2));
  CHECK(has(d, 0, 40, 1));

  /* Key 50 twice in one batch: versions 3 then 4. */
  uint64_t k[2] = {50, 50};
  uint8_t r[2 * 76];
  fill(r, 76, 50, 0, 3);
  fill(r + 76, 76, 50, 0, 4);
  const uint64_t *kk[2] = {k, NULL}, *del[2] = {NULL, NULL};
  const void *rr[2] = {r, NULL};
  size_t n[2] = {2, 0}, dn[2] = {0, 0};
  REQUIRE(row_disk_write(d, kk, rr, n, del, dn, &err) == PS_ERR_OK);
  CHECK(has(d, 0, 50, 4));

  uint64_t gone[3] = {20, 777, 40};
  REQUIRE(drop(d, 0, gone, 3, &err) == PS_ERR_OK);
  CHECK(has(d, 0, 20, -1));
  CHECK(has(d, 0, 40, -1));
  CHECK(has(d, 0, 10, 1));
  CHECK(has(d, 0, 30, 2));

  /* Put and delete of 60 in one batch, and table 1 untouched by table 0's. */
  uint64_t k60 = 60;
  uint8_t r60[76];
  fill(r60, 76, 60, 0, 1);
  const uint64_t *kp[2] = {&k60, NULL}, *dp[2] = {&k60, NULL};
  const void *rp[2] = {r60, NULL};
  size_t np[2] = {1, 0}, dnp[2] = {1, 0};
  REQUIRE(row_disk_write(d, kp, rp, np, dp, dnp, &err) == PS_ERR_OK);
  CHECK(has(d, 0, 60, -1));
  CHECK(has(d, 1, 10, -1));

  /* An empty batch. */
  const uint64_t *none[2] = {NULL, NULL};
  const void *nr[2] = {NULL, NULL};
  size_t zero[2] = {0, 0};
  CHECK(row_disk_write(d, none, nr, zero, none, zero, &err) == PS_ERR_OK);
  CHECK(has(d, 0, 10, 1));
  row_disk_close(d);
}

static int u64_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Snapshots: ascending numeric order per table (not byte order: keys are
 * little-endian integers), tables iterated independently, later writes and
 * deletes unseen, seen by the next snapshot. */
static void case_snapshot(void) {
  row_disk *d = open_store();
  uint64_t keys[] = {UINT64_MAX,
                     1,
                     (1ull << 63) + 5,
                     256,
                     0,
                     255,
                     (1ull << 63),
                     65536,
                     (1ull << 63) - 1,
                     3,
                     0xFF00000000000000ull,
                     0x00FF000000000000ull};
  enum { N = sizeof keys / sizeof keys[0] };
  ps_error err;
  REQUIRE(put(d, 0, keys, N, 1, &err) == PS_ERR_OK);
  REQUIRE(put(d, 1, keys, 4, 1, &err) == PS_ERR_OK);
  uint64_t sorted[N];
  memcpy(sorted, keys, sizeof keys);
  qsort(sorted, N, sizeof sorted[0], u64_cmp);

  row_disk_snapshot *s;
  REQUIRE(row_disk_snapshot_begin(d, &s, &err) == PS_ERR_OK);
  /* After the snapshot: a new key, an overwrite, a delete. */
  uint64_t added = 1000;
  REQUIRE(put(d, 0, &added, 1, 1, &err) == PS_ERR_OK);
  REQUIRE(put(d, 0, &keys[1], 1, 9, &err) == PS_ERR_OK);
  REQUIRE(drop(d, 0, &keys[0], 1, &err) == PS_ERR_OK);

  uint64_t key;
  uint8_t row[76];
  /* Table 1 first, partly, then table 0, then the rest of table 1. */
  CHECK_EQ_INT(row_disk_snapshot_next(s, 1, &key, row, &err), 1);
  CHECK(key == 1 && row_is(row, 20, 1, 1, 1));
  int i = 0, bad = 0;
  while (row_disk_snapshot_next(s, 0, &key, row, &err) == 1) {
    bad += i >= N || key != sorted[i] || !row_is(row, 76, key, 0, 1);
    i++;
  }
  CHECK_EQ_INT(i, N);
  CHECK_EQ_INT(bad, 0);
  CHECK_EQ_INT(row_disk_snapshot_next(s, 0, &key, row, &err), 0); /* stays at the end */
  uint64_t want1[3] = {256, (1ull << 63) + 5, UINT64_MAX};
  for (int j = 0; j < 3; j++) {
    CHECK_EQ_INT(row_disk_snapshot_next(s, 1, &key, row, &err), 1);
    CHECK(key == want1[j]);
  }
  CHECK_EQ_INT(row_disk_snapshot_next(s, 1, &key, row, &err), 0);
  CHECK_EQ_INT(row_disk_snapshot_next(s, 5, &key, row, &err), -1);
  row_disk_snapshot_end(s);

  /* A new snapshot sees the writes. */
  REQUIRE(row_disk_snapshot_begin(d, &s, &err) == PS_ERR_OK);
  i = 0;
  int saw_added = 0, saw_max = 0, one_v9 = 0;
  uint64_t last = 0;
  bad = 0;
  while (row_disk_snapshot_next(s, 0, &key, row, &err) == 1) {
    bad += i > 0 && key <= last;
    last = key;
    saw_added += key == added;
    saw_max += key == UINT64_MAX;
    if (key == 1) one_v9 = row_is(row, 76, 1, 0, 9);
    i++;
  }
  CHECK_EQ_INT(bad, 0);
  CHECK_EQ_INT(i, N);
  CHECK_EQ_INT(saw_added, 1);
  CHECK_EQ_INT(saw_max, 0);
  CHECK(one_v9);
  row_disk_snapshot_end(s);
  /* An empty table's snapshot ends at once. */
  row_disk_close(d);
  d = open_store();
  REQUIRE(row_disk_snapshot_begin(d, &s, &err) == PS_ERR_OK);
  CHECK_EQ_INT(row_disk_snapshot_next(s, 0, &key, row, &err), 0);
  row_disk_snapshot_end(s);
  row_disk_close(d);
}


/* Counters of rows and bytes read (found only) and written; rows per
 * table; the file's size. */
static void case_stats(void) {
  row_disk *d = open_store();
  row_disk_stats st;
  row_disk_stats_get(d, &st);
  CHECK_EQ_INT(st.rows[0], 0);
  CHECK_EQ_INT(st.rows_written, 0);
  uint64_t keys[100];
  for (int i = 0; i < 100; i++) keys[i] = (uint64_t)i * 3;
  ps_error err;
  REQUIRE(put(d, 0, keys, 100, 1, &err) == PS_ERR_OK);
  REQUIRE(put(d, 1, keys, 40, 1, &err) == PS_ERR_OK);
  REQUIRE(drop(d, 1, keys, 10, &err) == PS_ERR_OK);
  uint64_t q[5] = {0, 3, 4, 6, 7}; /* 3 on disk */
  uint8_t rows[5 * 76], found[5];
  REQUIRE(row_disk_read(d, 0, q, 5, rows, found, &err) == PS_ERR_OK);
  row_disk_stats_get(d, &st);
  CHECK_EQ_INT(st.rows[0], 100);
  CHECK_EQ_INT(st.rows[1], 30);
  CHECK_EQ_INT(st.rows_written, 140);
  CHECK_EQ_INT(st.bytes_written, 100 * 76 + 40 * 20);
  CHECK_EQ_INT(st.rows_read, 3);
  CHECK_EQ_INT(st.bytes_read, 3 * 76);
  CHECK(st.file_bytes > 0);
  row_disk_close(d);
}

/* Reopening starts empty; close removes the files but not the folder. */
static void case_reopen_removes(void) {
  row_disk *d = open_store();
  uint64_t keys[3] = {1, 2, 3};
  ps_error err;
  REQUIRE(put(d, 0, keys, 3, 1, &err) == PS_ERR_OK);
  char path[256], lock[288];
  data_path(path, sizeof path);
  snprintf(lock, sizeof lock, "%s/LOCK", path); /* inside RocksDB's folder */
  CHECK(exists(path));
  CHECK(exists(lock));
  row_disk_close(d);
  CHECK(!exists(path));
  CHECK(!exists(lock));
  CHECK(exists(dir));

  /* A store left behind (as by a crash): copied aside before close, put back. */
  d = open_store();
  REQUIRE(put(d, 0, keys, 3, 1, &err) == PS_ERR_OK);
  char cmd[2048];
  /* The folder, and in it a file of no store's and a CURRENT naming no
   * MANIFEST: opened as it is, RocksDB would fail (or refuse: it exists). */
  snprintf(cmd, sizeof cmd, "cp -a '%s' '%s.keep'", path, path);
  REQUIRE(system(cmd) == 0);
  row_disk_close(d);
  snprintf(cmd, sizeof cmd,
           "mv '%s.keep' '%s' && echo junk > '%s/junk' && echo MANIFEST-999999 > '%s/CURRENT'",
           path, path, path, path);
  REQUIRE(system(cmd) == 0);
  char junk[300];
  snprintf(junk, sizeof junk, "%s/junk", path);
  REQUIRE(exists(junk));
  d = open_store();
  CHECK(has(d, 0, 1, -1));
  CHECK(has(d, 0, 3, -1));
  row_disk_stats st;
  row_disk_stats_get(d, &st);
  CHECK_EQ_INT(st.rows[0], 0);
  CHECK(!exists(junk));
  /* The store works: rows in, rows out. */
  REQUIRE(put(d, 0, keys, 3, 4, &err) == PS_ERR_OK);
  CHECK(has(d, 0, 2, 4));
  row_disk_close(d);
}

static void case_bad_arguments(void) {
  row_disk *d = (row_disk *)&d;
  ps_error err;
  size_t rb[9] = {76, 76, 76, 76, 76, 76, 76, 76, 76};
  CHECK(row_disk_open(&d, dir, 0, rb, &err) == PS_ERR_INVALID_ARGUMENT);
  CHECK(d == NULL);
  CHECK(row_disk_open(&d, dir, 9, rb, &err) == PS_ERR_INVALID_ARGUMENT);
  size_t zero = 0;
  CHECK(row_disk_open(&d, dir, 1, &zero, &err) == PS_ERR_INVALID_ARGUMENT);
  /* A file where the folder should be. */
  char file[PATH_MAX + 16];
  snprintf(file, sizeof file, "%s/afile", tmp);
  FILE *f = fopen(file, "w");
  REQUIRE(f != NULL);
  fclose(f);
  CHECK(row_disk_open(&d, file, 1, rb, &err) == PS_ERR_IO);
  CHECK_CONTAINS(err.msg, file);
  row_disk_close(NULL);
}

/* Clearing a table: its rows gone at once (both ends of the key range
 * included), the other table's kept, a snapshot begun before still sees
 * them; without one the files and count drop; rows written after are there. */
static void case_clear(void) {
  row_disk *d = open_store();
  enum { N = 20000 };
  uint64_t *keys = malloc(N * sizeof *keys);
  uint8_t *rows = malloc((size_t)N * ROW_BYTES[0]), *found = malloc(N);
  REQUIRE(keys && rows && found);
  for (size_t i = 0; i < N; i++) keys[i] = i * 7919 + 1;
  keys[0] = 0;
  keys[1] = UINT64_MAX;
  ps_error err;
  REQUIRE(put(d, 0, keys, N, 1, &err) == PS_ERR_OK);
  REQUIRE(put(d, 1, keys, 100, 1, &err) == PS_ERR_OK);
  row_disk_snapshot *s;
  REQUIRE(row_disk_snapshot_begin(d, &s, &err) == PS_ERR_OK);
  REQUIRE(row_disk_clear(d, 0, &err) == PS_ERR_OK);
  REQUIRE(row_disk_read(d, 0, keys, N, rows, found, &err) == PS_ERR_OK);
  size_t left = 0;
  for (size_t i = 0; i < N; i++) left += found[i];
  CHECK_EQ_INT(left, 0);
  REQUIRE(row_disk_read(d, 1, keys, 100, rows, found, &err) == PS_ERR_OK);
  int kept = 0;
  for (size_t i = 0; i < 100; i++) kept += found[i] && row_is(rows + i * ROW_BYTES[1], ROW_BYTES[1], keys[i], 1, 1);
  CHECK_EQ_INT(kept, 100);
  uint64_t key;
  uint8_t row[76];
  int seen = 0;
  while (row_disk_snapshot_next(s, 0, &key, row, &err) == 1) seen++;
  CHECK_EQ_INT(seen, N);
  row_disk_snapshot_end(s);
  /* The snapshot kept the rows in the files; with it gone a clear drops them. */
  row_disk_stats st;
  row_disk_stats_get(d, &st);
  uint64_t files_before = st.file_bytes;
  REQUIRE(row_disk_clear(d, 0, &err) == PS_ERR_OK);
  row_disk_stats_get(d, &st);
  CHECK_EQ_INT(st.rows[0], 0);
  CHECK_EQ_INT(st.rows[1], 100);
  CHECK(st.file_bytes < files_before);
  REQUIRE(put(d, 0, &keys[5], 1, 3, &err) == PS_ERR_OK);
  REQUIRE(row_disk_read(d, 0, &keys[5], 1, rows, found, &err) == PS_ERR_OK);
  CHECK(found[0] && row_is(rows, ROW_BYTES[0], keys[5], 0, 3));
  CHECK(row_disk_clear(d, 2, &err) == PS_ERR_INVALID_ARGUMENT);
  CHECK(row_disk_clear(d, -1, &err) == PS_ERR_INVALID_ARGUMENT);
  free(keys);
  free(rows);
  free(found);
  row_disk_close(d);
}

/* --- RocksDB: flushes and compactions under readers and a snapshot -------- */

enum { FL_TOTAL = 300000, FL_BATCH = 5000, FL_SNAP_AT = 100000, FL_V2 = 50000, FL_DEL_TO = 60000 };

/* Row i's key: spread over the whole uint64 range (above 2^63 too). */
static uint64_t fl_key(uint64_t i) { return (i + 1) * 0x9E3779B97F4A7C15ull; }

typedef struct flush_ctx {
  row_disk *d;
  atomic_uint_fast64_t written; /* rows 0..written-1 written (version 1) */
  atomic_int v2_from;           /* rows below FL_V2 may be version 2 from now */
  atomic_int stop;
  atomic_int reads, bad, errors;
} flush_ctx;

/* Random rows among those written, and keys never written: each row found
 * is whole and of a version it may have; each written row is found, but
 * those being deleted. */
static void *flush_reader(void *arg) {
  flush_ctx *c = arg;
  uint64_t seed = (uint64_t)(uintptr_t)&seed;
  enum { Q = 64 };
  uint64_t q[Q], idx[Q];
  uint8_t rows[Q * 76], found[Q];
  while (!atomic_load(&c->stop)) {
    uint64_t w = atomic_load(&c->written); /* rows below w were written before the read */
    for (int i = 0; i < Q; i++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      idx[i] = w > 0 && i % 8 != 0 ? (seed >> 33) % w : FL_TOTAL + (seed >> 33);
      q[i] = fl_key(idx[i]);
    }
    ps_error err;
    if (row_disk_read(c->d, 0, q, Q, rows, found, &err) != PS_ERR_OK) {
      fprintf(stderr, "reader: %s\n", err.msg);
      atomic_fetch_add(&c->errors, 1);
      continue;
    }
    /* Read after: no version 2 or delete can have been seen while v2 is 0,
     * and no row at or above w_after was written before the read ended. */
    int v2 = atomic_load(&c->v2_from);
    uint64_t w_after = atomic_load(&c->written);
    for (int i = 0; i < Q; i++) {
      uint64_t k = idx[i];
      int deleting = v2 && k >= FL_V2 && k < FL_DEL_TO;
      const uint8_t *r = rows + i * 76;
      int ok;
      if (!found[i]) {
        ok = k >= w || deleting;
      } else {
        ok = k < w_after &&
             (row_is(r, 76, q[i], 0, 1) || (v2 && k < FL_V2 && row_is(r, 76, q[i], 0, 2)));
      }
      if (!ok) atomic_fetch_add(&c->bad, 1);
    }
    atomic_fetch_add(&c->reads, 1);
  }
  return NULL;
}

/* Writes rows [from, to) at version v in batches. */
static void fl_write(flush_ctx *c, uint64_t from, uint64_t to, unsigned v, int publish) {
  static uint64_t keys[FL_BATCH];
  ps_error err;
  for (uint64_t base = from; base < to; base += FL_BATCH) {
    size_t n = to - base < FL_BATCH ? (size_t)(to - base) : FL_BATCH;
    for (size_t i = 0; i < n; i++) keys[i] = fl_key(base + i);
    ps_err rc = put(c->d, 0, keys, n, v, &err);
    if (rc != PS_ERR_OK) fprintf(stderr, "write: %s\n", err.msg);
    REQUIRE(rc == PS_ERR_OK);
    if (publish) atomic_store(&c->written, base + n);
  }
}

typedef struct fl_expect {
  uint64_t key;
  unsigned version;
} fl_expect;

static int fl_expect_cmp(const void *a, const void *b) {
  uint64_t x = ((const fl_expect *)a)->key, y = ((const fl_expect *)b)->key;
  return (x > y) - (x < y);
}

/* Iterates table 0 of s to its end, from where it is, against want[from..n). */
static int fl_scan(row_disk_snapshot *s, const fl_expect *want, size_t from, size_t n) {
  uint64_t key;
  uint8_t row[76];
  ps_error err;
  size_t i = from;
  int bad = 0, got;
  while ((got = row_disk_snapshot_next(s, 0, &key, row, &err)) == 1) {
    bad += i >= n || key != want[i].key || !row_is(row, 76, key, 0, want[i].version);
    i++;
  }
  if (got < 0) fprintf(stderr, "snapshot: %s\n", err.msg);
  bad += got < 0 || i != n;
  return bad;
}

typedef struct fl_scan_ctx {
  row_disk_snapshot *s;
  const fl_expect *want;
  size_t from, n;
  int bad;
} fl_scan_ctx;

/* The rest of a snapshot begun and partly iterated on the main thread, then its end. */
static void *fl_scan_thread(void *arg) {
  fl_scan_ctx *c = arg;
  c->bad = fl_scan(c->s, c->want, c->from, c->n);
  row_disk_snapshot_rewind(c->s, 0);
  c->bad += fl_scan(c->s, c->want, 0, c->n); /* again, from the start */
  row_disk_snapshot_end(c->s);
  return NULL;
}

/* 300k rows written in batches (some 25 MB of rows: memtables flushed,
 * files compacted) while three threads read; a snapshot begun at 100k rows
 * sees exactly them, in key order, after the rest, overwrites and deletes;
 * a new snapshot sees the latest. */
static void case_flushes_under_readers(void) {
  row_disk *d = open_store();
  flush_ctx c = {.d = d};
  pthread_t th[3];
  for (int i = 0; i < 3; i++) REQUIRE(pthread_create(&th[i], NULL, flush_reader, &c) == 0);
  ps_error err;

  fl_write(&c, 0, FL_SNAP_AT, 1, 1);
  row_disk_snapshot *s;
  REQUIRE(row_disk_snapshot_begin(d, &s, &err) == PS_ERR_OK);
  fl_expect *was = malloc(FL_SNAP_AT * sizeof *was);
  REQUIRE(was != NULL);
  for (uint64_t i = 0; i < FL_SNAP_AT; i++) was[i] = (fl_expect){fl_key(i), 1};
  qsort(was, FL_SNAP_AT, sizeof *was, fl_expect_cmp);

  fl_write(&c, FL_SNAP_AT, FL_TOTAL / 2, 1, 1);
  /* The first 1000 of the snapshot's rows, its iterator made mid-stream. */
  uint64_t key;
  uint8_t row[76];
  int bad = 0;
  for (size_t i = 0; i < 1000; i++) {
    bad += row_disk_snapshot_next(s, 0, &key, row, &err) != 1 || key != was[i].key ||
           !row_is(row, 76, key, 0, 1);
  }
  CHECK_EQ_INT(bad, 0);
  fl_write(&c, FL_TOTAL / 2, FL_TOTAL, 1, 1);
  /* Rows below FL_V2 rewritten (version 2), [FL_V2, FL_DEL_TO) deleted. */
  atomic_store(&c.v2_from, 1);
  fl_write(&c, 0, FL_V2, 2, 0);
  enum { NDEL = FL_DEL_TO - FL_V2 };
  uint64_t *del = malloc(NDEL * sizeof *del);
  REQUIRE(del != NULL);
  for (uint64_t i = 0; i < NDEL; i++) del[i] = fl_key(FL_V2 + i);
  for (size_t at = 0; at < NDEL; at += 2500) REQUIRE(drop(d, 0, del + at, 2500, &err) == PS_ERR_OK);
  free(del);

  /* The snapshot's rest on another thread, which ends it; the readers go on. */
  fl_scan_ctx sc = {.s = s, .want = was, .from = 1000, .n = FL_SNAP_AT};
  pthread_t scan;
  REQUIRE(pthread_create(&scan, NULL, fl_scan_thread, &sc) == 0);
  pthread_join(scan, NULL);
  CHECK_EQ_INT(sc.bad, 0);
  free(was);

  struct timespec pause = {0, 50 * 1000 * 1000};
  nanosleep(&pause, NULL);
  atomic_store(&c.stop, 1);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  CHECK_EQ_INT(atomic_load(&c.bad), 0);
  CHECK_EQ_INT(atomic_load(&c.errors), 0);
  CHECK(atomic_load(&c.reads) > 0);

  /* A new snapshot: the latest. */
  enum { NOW = FL_TOTAL - NDEL };
  fl_expect *now = malloc(NOW * sizeof *now);
  REQUIRE(now != NULL);
  size_t n = 0;
  for (uint64_t i = 0; i < FL_TOTAL; i++) {
    if (i >= FL_V2 && i < FL_DEL_TO) continue;
    now[n++] = (fl_expect){fl_key(i), i < FL_V2 ? 2u : 1u};
  }
  qsort(now, NOW, sizeof *now, fl_expect_cmp);
  REQUIRE(row_disk_snapshot_begin(d, &s, &err) == PS_ERR_OK);
  CHECK_EQ_INT(fl_scan(s, now, 0, NOW), 0);
  row_disk_snapshot_end(s);
  free(now);

  /* Every row read back at once, too. */
  uint64_t *q = malloc(FL_TOTAL * sizeof *q);
  uint8_t *rows = malloc((size_t)FL_TOTAL * 76), *found = malloc(FL_TOTAL);
  REQUIRE(q && rows && found);
  for (uint64_t i = 0; i < FL_TOTAL; i++) q[i] = fl_key(i);
  REQUIRE(row_disk_read(d, 0, q, FL_TOTAL, rows, found, &err) == PS_ERR_OK);
  bad = 0;
  for (uint64_t i = 0; i < FL_TOTAL; i++) {
    if (i >= FL_V2 && i < FL_DEL_TO) {
      bad += found[i] != 0;
    } else {
      bad += found[i] != 1 || !row_is(rows + i * 76, 76, q[i], 0, i < FL_V2 ? 2 : 1);
    }
  }
  CHECK_EQ_INT(bad, 0);
  free(q);
  free(rows);
  free(found);

  /* The rows are on disk (not all in memtables); the count is RocksDB's
   * estimate (overwritten and deleted keys may count until compacted). */
  row_disk_stats st;
  row_disk_stats_get(d, &st);
  CHECK(st.file_bytes > (uint64_t)16 << 20);
  CHECK(st.rows[0] >= NOW / 2 && st.rows[0] <= (uint64_t)FL_TOTAL + FL_V2 + NDEL);
  fprintf(stderr, "flushes: ~%llu rows (%d exact), files %llu bytes, %d reads alongside\n",
          (unsigned long long)st.rows[0], NOW, (unsigned long long)st.file_bytes,
          atomic_load(&c.reads));
  row_disk_close(d);
}

/* --- a full disk ---------------------------------------------------------- */

/* The tmpfs and the file beside the store, removed later to make room.
 * RocksDB writes 3 MiB SST files (a memtable's
 * rows) and resumes after a full disk only with a memtable's worth (4 MiB)
 * free: 6 of 12 MiB, so that the second flush fails and removing the file
 * makes room for it. */
#define FULL_TMPFS "size=12m"
#define FULL_FILLER_BLOCKS 96

/* In the child: fills a small tmpfs. Exit 0 passed, 77 cannot mount, else failed. */
static int full_disk_child(const char *mnt) {
  if (unshare(CLONE_NEWNS) != 0) return 77;
  /* Our mounts stay ours: nothing propagates back to the host. */
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return 77;
  if (mount("tmpfs", mnt, "tmpfs", 0, FULL_TMPFS) != 0) return 77;
  char store[256], filler[256];
  snprintf(store, sizeof store, "%s/store", mnt);
  snprintf(filler, sizeof filler, "%s/filler", mnt);
  FILE *f = fopen(filler, "w");
  static const char block[64 * 1024];
  for (int i = 0; f != NULL && i < FULL_FILLER_BLOCKS; i++) fwrite(block, 1, sizeof block, f);
  if (f == NULL || fclose(f) != 0) {
    fprintf(stderr, "full disk: writing %s failed\n", filler);
    return 1;
  }
  row_disk *d = NULL;
  ps_error err;
  if (row_disk_open(&d, store, 2, ROW_BYTES, &err) != PS_ERR_OK) {
    fprintf(stderr, "full disk: open: %s\n", err.msg);
    return 1;
  }
  enum { BATCH = 1000 };
  uint64_t keys[BATCH];
  uint64_t committed = 0;
  ps_err rc = PS_ERR_OK;
  for (int b = 0; b < 300 && rc == PS_ERR_OK; b++) {
    for (int i = 0; i < BATCH; i++) keys[i] = committed + 1 + (uint64_t)i;
    rc = put(d, 0, keys, BATCH, 1, &err);
    if (rc == PS_ERR_OK) committed += BATCH;
  }
  CHECK(rc == PS_ERR_RESOURCE_EXHAUSTED);
  CHECK_CONTAINS(err.msg, "disk full");
  CHECK_CONTAINS(err.msg, store);
  fprintf(stderr, "full disk after %llu rows: %s\n", (unsigned long long)committed, err.msg);
  CHECK(committed > 0);
  /* The failed batch left nothing; the committed rows are all there. */
  CHECK(has(d, 0, committed + 1, -1));
  CHECK(has(d, 0, committed + BATCH, -1));
  row_disk_stats st;
  row_disk_stats_get(d, &st);
  CHECK_EQ_INT(st.rows[0], committed);
  uint64_t *q = malloc(committed * sizeof *q);
  uint8_t *rows = malloc(committed * 76), *found = malloc(committed);
  REQUIRE(q && rows && found);
  for (uint64_t i = 0; i < committed; i++) q[i] = i + 1;
  REQUIRE(row_disk_read(d, 0, q, committed, rows, found, &err) == PS_ERR_OK);
  int bad = 0;
  for (uint64_t i = 0; i < committed; i++)
    bad += !found[i] || !row_is(rows + i * 76, 76, q[i], 0, 1);
  CHECK_EQ_INT(bad, 0);
  /* Room again (another file removed): writes go on. RocksDB's recovery
   * from its background error polls the free space every 5 s. */
  CHECK(unlink(filler) == 0);
  rc = put(d, 0, keys, 10, 2, &err);
  int tries = 0;
  for (; rc == PS_ERR_RESOURCE_EXHAUSTED && tries < 300; tries++) {
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
    rc = put(d, 0, keys, 10, 2, &err);
  }
  fprintf(stderr, "full disk: writes went on %.1f s after the room was made\n", tries * 0.1);
  if (rc != PS_ERR_OK) fprintf(stderr, "full disk: with room again: %s\n", err.msg);
  CHECK(rc == PS_ERR_OK);
  CHECK(has(d, 0, keys[0], 2));
  free(q);
  free(rows);
  free(found);
  row_disk_close(d);
  umount(mnt);
  return check_failures > 0 ? 1 : 0;
}

static void case_full_disk(void) {
  if (geteuid() != 0) {
    fprintf(stderr, "full disk: skipped: needs root to mount a small tmpfs\n");
    return;
  }
  char mnt[128];
  snprintf(mnt, sizeof mnt, "%s/small", tmp);
  REQUIRE(mkdir(mnt, 0755) == 0);
  fflush(stderr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  /* A fresh process (this program again): a child forked from this one
   * would lack RocksDB's background threads (the earlier cases' store
   * started them here), so its flushes would never run. */
  if (pid == 0) {
    execl("/proc/self/exe", "test_row_disk", "--full-disk", mnt, (char *)NULL);
    _exit(1);
  }
  int status;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) {
    fprintf(stderr, "full disk: skipped: no tmpfs in a mount namespace of our own here\n");
  } else {
    CHECK_EQ_INT(WEXITSTATUS(status), 0);
  }
  rmdir(mnt);
}

/* The tier's readers: 5,000 keys (some absent, some twice) read over four
 * threads and the caller equal one MultiGet's result byte for byte; a
 * read below a chunk's keys is the caller's alone; a bad table's error
 * comes back from a reader thread. */
static void case_readers(void) {
  row_disk *d = open_store();
  enum { N = 5000 };
  uint64_t *keys = malloc(N * sizeof *keys);
  REQUIRE(keys != NULL);
  for (size_t i = 0; i < N; i++) keys[i] = fl_key(i);
  ps_error err;
  REQUIRE(put(d, 0, keys, N, 3, &err) == PS_ERR_OK);
  /* Asked for: every other stored key, keys never stored, and repeats. */
  uint64_t *ask = malloc(N * sizeof *ask);
  REQUIRE(ask != NULL);
  for (size_t i = 0; i < N; i++) {
    ask[i] = i % 7 == 0 ? fl_key(N + i) : i % 11 == 0 ? fl_key(i / 2) : fl_key(i);
  }
  qsort(ask, N, sizeof *ask, u64_cmp);
  uint8_t *want = malloc(N * ROW_BYTES[0]), *got = malloc(N * ROW_BYTES[0]);
  uint8_t *want_found = malloc(N), *got_found = malloc(N);
  REQUIRE(want != NULL && got != NULL && want_found != NULL && got_found != NULL);
  REQUIRE(row_disk_read(d, 0, ask, N, want, want_found, &err) == PS_ERR_OK);
  tier_readers *r = NULL;
  REQUIRE(tier_readers_start(&r, d, 4, &err) == PS_ERR_OK);
  for (size_t n = 1; n <= N; n = n * 3 + 1) {
    memset(got, 0xEE, N * ROW_BYTES[0]);
    memset(got_found, 9, N);
    CHECK(tier_readers_read(r, 0, ask, n, got, ROW_BYTES[0], got_found, &err) == PS_ERR_OK);
    CHECK(memcmp(got_found, want_found, n) == 0);
    for (size_t i = 0; i < n; i++) {
      if (want_found[i]) CHECK(memcmp(got + i * ROW_BYTES[0], want + i * ROW_BYTES[0], ROW_BYTES[0]) == 0);
    }
  }
  size_t found = 0;
  for (size_t i = 0; i < N; i++) found += want_found[i];
  CHECK(found > N / 2 && found < N); /* both kinds were asked for */
  CHECK(tier_readers_read(r, 7, ask, N, got, ROW_BYTES[0], got_found, &err) ==
        PS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(err.msg, "no table 7") != NULL);
  tier_readers_stop(r);
  free(keys);
  free(ask);
  free(want);
  free(got);
  free(want_found);
  free(got_found);
  row_disk_close(d);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--full-disk") == 0) return full_disk_child(argv[2]);
  snprintf(tmp, sizeof tmp, "/tmp/pstrain-row-disk-XXXXXX");
  REQUIRE(mkdtemp(tmp) != NULL);
  snprintf(dir, sizeof dir, "%s/store", tmp);
  RUN_CASE(case_two_tables);
  RUN_CASE(case_duplicate_reads);
  RUN_CASE(case_overwrite_delete);
  RUN_CASE(case_snapshot);
  RUN_CASE(case_clear);
  RUN_CASE(case_flushes_under_readers);
  RUN_CASE(case_readers);
  RUN_CASE(case_stats);
  RUN_CASE(case_reopen_removes);
  RUN_CASE(case_bad_arguments);
  RUN_CASE(case_full_disk);
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  CHECK(system(cmd) == 0);
  return check_report("test_row_disk");
}
