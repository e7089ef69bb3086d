/* Sparse tables' rows over time: eviction (with a map stress test against a
 * plain reference), admission, the memory limit, the budget tables share,
 * GEO's add and set of rows, dump and load, and the bytes the table reports. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/sparse_table.h"
#include "tests/check.h"
#include "tests/sparse_table_testlib.h"

static void test_eviction(void) {
  sparse_table_config c = config(SPARSE_OPT_SGD, 3);
  c.evict_after = 10;
  sparse_table *t = make(&c);
  float out[30];
  uint64_t old_keys[] = {1, 2, 3, 4}, new_keys[] = {5, 6, 7};
  pull_ok(t, old_keys, 4, NULL, 0, out);
  pull_ok(t, new_keys, 3, NULL, 5, out);
  pull_ok(t, old_keys + 3, 1, NULL, 8, out); /* key 4 seen again at 8 */
  float g[3] = {1, 1, 1};
  ps_error err;
  REQUIRE(sparse_table_push(t, old_keys, 1, g, 8, &err) == PS_ERR_OK); /* key 1 moves */
  CHECK_EQ_INT(sparse_table_evict(t, 10), 0); /* before 0: none */
  CHECK_EQ_INT(sparse_table_evict(t, 11), 3); /* before 1: keys 1, 2, 3 */
  snap s = take(t);
  CHECK(s.n == 4 && s.keys[0] == 4 && s.keys[1] == 5 && s.keys[2] == 6 && s.keys[3] == 7);
  snap_free(&s);
  sparse_table_stats st;
  sparse_table_stats_get(t, &st);
  CHECK_EQ_INT(st.evicted, 3);
  /* Key 1 comes back as its initial row, not as pushed. */
  float init[3];
  pull_ok(t, old_keys, 1, NULL, 12, out);
  sparse_table_init_row(&c, 1, init);
  CHECK(memcmp(out, init, sizeof init) == 0);
  CHECK_EQ_INT(sparse_table_evict(t, 16), 3); /* before 6: keys 5, 6, 7 */
  CHECK_EQ_INT(rows_of(t), 2);
  sparse_table_destroy(t);
  /* Without evict_after, nothing goes. */
  c.evict_after = 0;
  t = make(&c);
  pull_ok(t, old_keys, 4, NULL, 0, out);
  CHECK_EQ_INT(sparse_table_evict(t, 1000000), 0);
  CHECK_EQ_INT(rows_of(t), 4);
  sparse_table_destroy(t);
}

/* 100k random pulls, pushes and evictions over 20k keys against a plain
 * array: after many backward shifts the map still finds every live key
 * with its own values, and loses none. */
static void test_eviction_stress(void) {
  enum { U = 20000, DIM = 2 };
  sparse_table_config c = config(SPARSE_OPT_SGD, DIM);
  c.evict_after = 50;
  c.opt.lr = 1.0;
  sparse_table *t = make(&c);
  static float ref[U][DIM];
  static long seen[U];
  static char live[U];
  rng r;
  rng_seed(&r, 9, 9);
  size_t ops = 0, live_n = 0, created = 0, bad = 0;
  uint64_t admitted = 0;
  for (long step = 0; ops < 100000; step++) {
    uint64_t keys[64];
    float out[64 * DIM], g[64 * DIM];
    uint32_t idx[64];
    size_t n = 0;
    for (int j = 0; j < 64; j++) {
      /* A skewed draw, and distinct within the batch. */
      uint32_t k = (uint32_t)(rng_below(&r, 1 + rng_below(&r, U)));
      int dup = 0;
      for (size_t q = 0; q < n; q++) dup |= idx[q] == k;
      if (dup) continue;
      idx[n] = k;
      keys[n++] = rng_mix64(k) ^ 0x5555; /* any 64-bit values, zero included if it comes */
    }
    pull_ok(t, keys, n, NULL, step, out);
    for (size_t q = 0; q < n; q++) {
      uint32_t k = idx[q];
      if (!live[k]) {
        sparse_table_init_row(&c, keys[q], ref[k]);
        live[k] = 1;
        live_n++;
        created++;
      }
      seen[k] = step;
      bad += memcmp(out + q * DIM, ref[k], sizeof ref[k]) != 0;
      for (int d = 0; d < DIM; d++) {
        g[q * DIM + d] = (float)(step % 7) * 0.125f + (float)d;
        ref[k][d] -= 1.0f * g[q * DIM + d];
      }
    }
    ps_error err;
    REQUIRE(sparse_table_push(t, keys, n, g, step, &err) == PS_ERR_OK);
    ops += n;
    if (step % 7 == 0) {
      size_t expect = 0;
      for (int k = 0; k < U; k++) {
        if (live[k] && seen[k] < step - c.evict_after) {
          live[k] = 0;
          expect++;
        }
      }
      live_n -= expect;
      size_t got = sparse_table_evict(t, step);
      if (got != expect) bad++;
    }
    if (rows_of(t) != live_n) bad++;
  }
  sparse_table_stats st;
  sparse_table_stats_get(t, &st);
  admitted = st.admitted;
  CHECK_EQ_INT(bad, 0);
  CHECK_EQ_INT(admitted, created);
  CHECK(st.evicted > 10000);
  sparse_table_destroy(t);
}

/* A push reuses the rows its pull found only while nothing moved them:
 * table a pushes the array it pulled, b a copy (always looked up again);
 * between pull and push come in-place key changes, evictions of the pulled
 * rows, loads (rows renumbered, or none left), other pulls and admission
 * refusals. */
static void test_admission(void) {
  sparse_table_config c = config(SPARSE_OPT_SGD, 2);
  c.admit_after = 3;
  sparse_table *t = make(&c);
  uint64_t k = 77, k2[2] = {88, 99};
  float out[4], g[4] = {1, 1, 1, 1}, init[2];
  ps_error err;
  pull_ok(t, &k, 1, NULL, 0, out);
  CHECK(out[0] == 0.0f && out[1] == 0.0f);
  CHECK(sparse_table_push(t, &k, 1, g, 0, &err) == PS_ERR_OK); /* dropped */
  pull_ok(t, &k, 1, NULL, 1, out);
  CHECK(out[0] == 0.0f && out[1] == 0.0f);
  sparse_table_stats s;
  sparse_table_stats_get(t, &s);
  CHECK(s.rows == 0 && s.refused == 2 && s.admitted == 0);
  pull_ok(t, &k, 1, NULL, 2, out); /* third occurrence: a row */
  sparse_table_init_row(&c, k, init);
  CHECK(memcmp(out, init, sizeof init) == 0);
  /* counts[] adds occurrences: 3 at once admits, 2 does not. */
  uint32_t counts[2] = {3, 2};
  pull_ok(t, k2, 2, counts, 3, out);
  sparse_table_init_row(&c, 88, init);
  CHECK(memcmp(out, init, sizeof init) == 0);
  CHECK(out[2] == 0.0f && out[3] == 0.0f);
  sparse_table_stats_get(t, &s);
  CHECK(s.rows == 2 && s.refused == 3 && s.admitted == 2);
  counts[1] = 1;
  pull_ok(t, k2 + 1, 1, counts + 1, 4, out);
  CHECK_EQ_INT(rows_of(t), 3);
  /* The 4 MB filter is counted. */
  CHECK(s.bytes > (size_t)4 << 20);
  sparse_table_destroy(t);
}

static void test_limit(void) {
  sparse_table_config c = config(SPARSE_OPT_ADAGRAD, 16);
  /* Rows of 19 floats: 1000 rows fit in slab 0's 1024; a map of 2048 slots. */
  c.max_bytes = 1024 * 19 * 4 + 2048 * 12;
  sparse_table *t = make(&c);
  uint64_t keys[1200];
  for (int i = 0; i < 1200; i++) keys[i] = 1000 + (uint64_t)i;
  float *out = malloc(1200 * 16 * sizeof(float));
  REQUIRE(out);
  pull_ok(t, keys, 1000, NULL, 0, out);
  snap before = take(t);
  sparse_table_stats s0, s1;
  sparse_table_stats_get(t, &s0);
  CHECK_EQ_INT(s0.bytes, c.max_bytes);
  ps_error err;
  CHECK(sparse_table_pull(t, keys + 900, 200, NULL, 1, out, &err) == PS_ERR_RESOURCE_EXHAUSTED);
  CHECK_CONTAINS(err.msg, "table 'embedding' would pass its limit of");
  CHECK_CONTAINS(err.msg, "MB (--max-table-mb) at 1100 rows");
  snap after = take(t);
  CHECK(snap_equal(&before, &after));
  sparse_table_stats_get(t, &s1);
  CHECK(memcmp(&s0, &s1, sizeof s0) == 0);
  /* Loading more than fits is refused the same way, changing nothing. */
  CHECK(sparse_table_load(t, 1200, keys, out, NULL, NULL, &err) == PS_ERR_RESOURCE_EXHAUSTED);
  CHECK_CONTAINS(err.msg, "table 'embedding'");
  snap_free(&after);
  after = take(t);
  CHECK(snap_equal(&before, &after));
  snap_free(&before);
  snap_free(&after);
  sparse_table_destroy(t);

  /* With eviction on, the least recently seen rows make room. */
  c.evict_after = 1000;
  t = make(&c);
  for (int i = 0; i < 10; i++) pull_ok(t, keys + 100 * i, 100, NULL, i, out); /* rows 100i.. seen at i */
  pull_ok(t, keys + 500, 100, NULL, 20, out); /* keys 500..599 seen again */
  pull_ok(t, keys + 950, 200, NULL, 21, out); /* 150 new rows: slab 0 holds 1024, so 126 must go */
  snap s = take(t);
  /* Seen at 0 and 1 (200 rows) go: 150 needed and the threshold takes whole steps. */
  CHECK_EQ_INT(s.n, 1000 - 200 + 150);
  CHECK(s.keys[0] == 1200);
  int kept = 1;
  for (size_t i = 0; i < s.n; i++) kept = kept && s.keys[i] >= 1200;
  CHECK(kept);
  snap_free(&s);
  sparse_table_stats_get(t, &s1);
  CHECK_EQ_INT(s1.evicted, 200);
  CHECK(s1.bytes <= c.max_bytes);
  /* Nothing is evictable when every row was seen at this step. */
  sparse_table_destroy(t);
  t = make(&c);
  pull_ok(t, keys, 1000, NULL, 5, out);
  CHECK(sparse_table_pull(t, keys + 1000, 100, NULL, 5, out, &err) == PS_ERR_RESOURCE_EXHAUSTED);
  CHECK_EQ_INT(rows_of(t), 1000);
  sparse_table_destroy(t);
  free(out);
}

/* Two tables on one budget: it holds what both hold; growth past it is
 * refused naming the table, its rows and bytes, the budget and its source,
 * changing nothing; a load counts in place of the old rows; a table
 * destroyed gives its bytes back. */
static void test_budget(void) {
  sparse_budget budget = {.limit = 0};
  atomic_init(&budget.used, 0);
  snprintf(budget.source, sizeof budget.source, "--table-memory-mb 0.3");
  budget.limit = (size_t)(0.3 * 1048576);
  sparse_table_config c = config(SPARSE_OPT_ADAGRAD, 16); /* rows of 19 floats */
  c.budget = &budget;
  sparse_table *a = make(&c);
  snprintf(c.name, sizeof c.name, "wide");
  c.dim = 1;
  c.id = 1;
  sparse_table *w = make(&c);
  sparse_table_stats sa, sw;
  sparse_table_stats_get(a, &sa);
  sparse_table_stats_get(w, &sw);
  CHECK_EQ_INT(atomic_load(&budget.used), sa.bytes + sw.bytes);
  uint64_t keys[4000];
  for (int i = 0; i < 4000; i++) keys[i] = 77 + (uint64_t)i * 3;
  float *out = malloc(4000 * 16 * sizeof(float));
  REQUIRE(out);
  pull_ok(w, keys, 4000, NULL, 0, out);   /* the wide table: 4000 rows of 1 + 3 floats */
  pull_ok(a, keys, 1000, NULL, 0, out);   /* slab 0 of the embedding: 1024 rows */
  sparse_table_stats_get(a, &sa);
  sparse_table_stats_get(w, &sw);
  CHECK_EQ_INT(atomic_load(&budget.used), sa.bytes + sw.bytes);
  snap before = take(a);
  ps_error err;
  /* 2048 rows of 76 bytes and a map of 4096 slots (200 KiB): with the wide
   * table's 160 KiB past 0.3 MiB. */
  CHECK(sparse_table_pull(a, keys, 2000, NULL, 1, out, &err) == PS_ERR_RESOURCE_EXHAUSTED);
  CHECK_CONTAINS(err.msg, "table 'embedding' would hold 2000 rows in");
  CHECK_CONTAINS(err.msg, "past their budget of 0.3 MiB (--table-memory-mb 0.3)");
  snap after = take(a);
  CHECK(snap_equal(&before, &after));
  sparse_table_stats stats;
  sparse_table_stats_get(a, &stats);
  CHECK_EQ_INT(stats.bytes, sa.bytes);
  CHECK_EQ_INT(atomic_load(&budget.used), sa.bytes + sw.bytes);
  /* GEO's add is refused the same way; a load of the same rows fits in place of them. */
  CHECK(sparse_table_add_rows(a, keys, 2000, out, 1.0f, 1, &err) == PS_ERR_RESOURCE_EXHAUSTED);
  CHECK_CONTAINS(err.msg, "budget");
  REQUIRE(sparse_table_load(a, before.n, before.keys, before.values, before.state, before.meta,
                            &err) == PS_ERR_OK);
  sparse_table_stats_get(a, &stats);
  CHECK_EQ_INT(atomic_load(&budget.used), stats.bytes + sw.bytes);
  CHECK(sparse_table_load(a, 2000, keys, out, NULL, NULL, &err) == PS_ERR_RESOURCE_EXHAUSTED);
  CHECK_CONTAINS(err.msg, "budget");
  CHECK_EQ_INT(atomic_load(&budget.used), stats.bytes + sw.bytes);
  /* Without the wide table the embedding grows. */
  sparse_table_destroy(w);
  sparse_table_stats_get(a, &stats);
  CHECK_EQ_INT(atomic_load(&budget.used), stats.bytes);
  pull_ok(a, keys, 2000, NULL, 1, out);
  sparse_table_stats_get(a, &stats);
  CHECK_EQ_INT(atomic_load(&budget.used), stats.bytes);
  CHECK(stats.bytes <= budget.limit);
  sparse_table_destroy(a);
  CHECK_EQ_INT(atomic_load(&budget.used), 0);
  snap_free(&before);
  snap_free(&after);
  free(out);
}

/* add_rows: row += v * scale, missing rows made from their initial values
 * even where admission would refuse them; set_rows: row = v; neither
 * touches optimizer state; past max_bytes nothing changes. */
static void test_add_set_rows(void) {
  sparse_table_config c = config(SPARSE_OPT_ADAGRAD, 3);
  c.admit_after = 5;
  sparse_table *t = make(&c);
  uint64_t keys[3] = {7, 8, 9};
  float v[9], out[9], init[3];
  for (int i = 0; i < 9; i++) v[i] = 0.25f * (float)(i - 4);
  ps_error err;
  CHECK(sparse_table_add_rows(t, keys, 2, v, 0.5f, 3, &err) == PS_ERR_OK);
  CHECK_EQ_INT(rows_of(t), 2);
  sparse_table_lookup(t, keys, 2, out);
  for (int j = 0; j < 2; j++) {
    sparse_table_init_row(&c, keys[j], init);
    for (int k = 0; k < 3; k++) CHECK(out[j * 3 + k] == init[k] + v[j * 3 + k] * 0.5f);
  }
  CHECK(sparse_table_add_rows(t, keys + 1, 2, v, 0.25f, 4, &err) == PS_ERR_OK);
  float again[9];
  sparse_table_lookup(t, keys, 3, again);
  sparse_table_init_row(&c, keys[2], init);
  for (int k = 0; k < 3; k++) {
    CHECK(again[k] == out[k]);
    CHECK(again[3 + k] == out[3 + k] + v[k] * 0.25f);
    CHECK(again[6 + k] == init[k] + v[3 + k] * 0.25f);
  }
  CHECK(sparse_table_set_rows(t, keys, 3, v, 5, &err) == PS_ERR_OK);
  sparse_table_lookup(t, keys, 3, out);
  CHECK(memcmp(out, v, sizeof v) == 0);
  snap s = take(t);
  for (size_t i = 0; i < s.n; i++) CHECK(s.state[i] == (float)c.opt.initial_accumulator);
  CHECK_EQ_INT(s.meta[0], 5); /* last seen at the set */
  snap_free(&s);
  sparse_table_destroy(t);
  c.admit_after = 0;
  c.max_bytes = 1024 * 6 * 4 + 16 * 12; /* slab 0 and a map of 16 slots: 11 rows */
  t = make(&c);
  uint64_t many[12];
  float vals[36] = {0};
  for (int i = 0; i < 12; i++) many[i] = 100 + (uint64_t)i;
  CHECK(sparse_table_add_rows(t, many, 11, vals, 1.0f, 0, &err) == PS_ERR_OK);
  snap before = take(t);
  CHECK(sparse_table_add_rows(t, many, 12, v, 1.0f, 1, &err) == PS_ERR_RESOURCE_EXHAUSTED);
  CHECK_CONTAINS(err.msg, "table 'embedding' would pass its limit");
  snap after = take(t);
  CHECK(snap_equal(&before, &after));
  snap_free(&before);
  snap_free(&after);
  sparse_table_destroy(t);
}

static void test_dump_load(void) {
  sparse_table_config c = config(SPARSE_OPT_ADAM, 6);
  sparse_table *a = make(&c), *b = make(&c);
  uint64_t keys[50];
  float out[300], g[300];
  for (int i = 0; i < 50; i++) keys[i] = rng_mix64((uint64_t)i * 31);
  for (int i = 0; i < 300; i++) g[i] = 0.01f * (float)(i % 11) - 0.05f;
  ps_error err;
  for (long step = 0; step < 4; step++) {
    size_t n = 20 + (size_t)step * 10;
    pull_ok(a, keys, n, NULL, step, out);
    REQUIRE(sparse_table_push(a, keys, n, g, step, &err) == PS_ERR_OK);
  }
  snap sa = take(a);
  REQUIRE(sparse_table_load(b, sa.n, sa.keys, sa.values, sa.state, sa.meta, &err) == PS_ERR_OK);
  snap sb = take(b);
  CHECK(snap_equal(&sa, &sb));
  /* Both go on alike. */
  pull_ok(a, keys, 50, NULL, 4, out);
  REQUIRE(sparse_table_push(a, keys, 50, g, 4, &err) == PS_ERR_OK);
  pull_ok(b, keys, 50, NULL, 4, out);
  REQUIRE(sparse_table_push(b, keys, 50, g, 4, &err) == PS_ERR_OK);
  snap_free(&sa);
  snap_free(&sb);
  sa = take(a);
  sb = take(b);
  CHECK(snap_equal(&sa, &sb));
  /* A duplicate key is refused and b keeps its rows. */
  uint64_t dup_keys[3] = {5, 6, 5};
  float vals[18] = {0};
  CHECK(sparse_table_load(b, 3, dup_keys, vals, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "appears twice");
  int64_t bad_meta[6] = {0, 0, -1, 0, 0, 0};
  uint64_t ok_keys[3] = {5, 6, 7};
  CHECK(sparse_table_load(b, 3, ok_keys, vals, NULL, bad_meta, &err) == PS_ERR_INVALID_ARGUMENT);
  snap sc = take(b);
  CHECK(snap_equal(&sb, &sc));
  /* Without state and meta: fresh state; an empty load empties the table. */
  REQUIRE(sparse_table_load(b, 3, ok_keys, vals, NULL, NULL, &err) == PS_ERR_OK);
  snap sd = take(b);
  CHECK(sd.n == 3 && sd.state[0] == 0.0f && sd.meta[1] == 0);
  REQUIRE(sparse_table_load(b, 0, NULL, NULL, NULL, NULL, &err) == PS_ERR_OK);
  CHECK_EQ_INT(rows_of(b), 0);
  snap_free(&sa);
  snap_free(&sb);
  snap_free(&sc);
  snap_free(&sd);
  sparse_table_destroy(a);
  sparse_table_destroy(b);
}

/* A dump is in ascending key order with each key's own row, for keys that
 * differ in any 11-bit digit (the radix sort's) or only in the top bits,
 * and for a table whose keys share all digits but one. */
static void test_dump_order(void) {
  sparse_table_config c = config(SPARSE_OPT_SGD, 2);
  c.init_scale = 0.5f;
  sparse_table *t = make(&c);
  enum { N = 5000 };
  static uint64_t keys[N];
  static float out[2 * N];
  for (int i = 0; i < N; i++) {
    uint64_t k = rng_mix64((uint64_t)i + 1);
    if (i % 5 == 1) k = (uint64_t)i << 55; /* top bits only */
    if (i % 5 == 2) k = (uint64_t)i;       /* low bits only */
    if (i % 5 == 3) k = 0xabcdef0123456789ULL ^ ((uint64_t)i << 22);
    keys[i] = k;
  }
  sparse_dedup d;
  sparse_dedup_init(&d);
  static uint32_t slot[N];
  ps_error err;
  REQUIRE(sparse_dedup_run(&d, keys, N, slot, &err) == PS_ERR_OK);
  pull_ok(t, d.unique, d.n_unique, NULL, 0, out);
  snap s = take(t);
  CHECK_EQ_INT(s.n, d.n_unique);
  int ordered = 1, rows_match = 1;
  float row[2];
  for (size_t i = 0; i < s.n; i++) {
    if (i > 0 && s.keys[i] <= s.keys[i - 1]) ordered = 0;
    sparse_table_lookup(t, &s.keys[i], 1, row);
    if (memcmp(row, s.values + 2 * i, sizeof row) != 0) rows_match = 0;
  }
  CHECK(ordered);
  CHECK(rows_match);
  snap_free(&s);
  sparse_dedup_free(&d);
  sparse_table_destroy(t);
}

static void test_stats_and_config(void) {
  sparse_table_config c = config(SPARSE_OPT_ADAGRAD, 16);
  sparse_table *t = make(&c);
  uint64_t keys[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  float out[160];
  sparse_table_stats s;
  sparse_table_stats_get(t, &s);
  CHECK_EQ_INT(s.bytes, 16 * 12); /* an empty map of 16 slots */
  CHECK(s.bytes_per_row == 0.0);
  pull_ok(t, keys, 10, NULL, 0, out);
  sparse_table_stats_get(t, &s);
  /* Slab 0 of 1024 rows of 16 values + 1 accumulator + 2 meta floats; 16 map slots. */
  CHECK_EQ_INT(s.bytes, 1024 * (16 + 1 + 2) * 4 + 16 * 12);
  CHECK_NEAR(s.bytes_per_row, (1024.0 * 76 + 192) / 10, 1e-9);
  CHECK_EQ_INT(sparse_table_state_floats(&c), 1);
  c.opt.kind = SPARSE_OPT_ADAM;
  CHECK_EQ_INT(sparse_table_state_floats(&c), 32);
  c.opt.kind = SPARSE_OPT_SGD;
  CHECK_EQ_INT(sparse_table_state_floats(&c), 0);
  sparse_table_destroy(t);

  sparse_optimizer_kind k;
  ps_error err;
  const char *names[] = {"adagrad", "adam", "sgd"};
  for (int i = 0; i < SPARSE_OPT_KIND_COUNT; i++) {
    CHECK(sparse_optimizer_parse(names[i], &k, &err) == PS_ERR_OK && (int)k == i);
    CHECK_EQ_STR(sparse_optimizer_name((sparse_optimizer_kind)i), names[i]);
    CHECK(strstr(SPARSE_OPTIMIZER_CHOICES, names[i]) != NULL);
  }
  CHECK(sparse_optimizer_parse("rmsprop", &k, &err) == PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, SPARSE_OPTIMIZER_CHOICES);
  CHECK_EQ_STR(sparse_optimizer_name((sparse_optimizer_kind)7), "unknown");

  sparse_table_config bad[6];
  for (int i = 0; i < 6; i++) bad[i] = config(SPARSE_OPT_ADAGRAD, 8);
  bad[0].dim = 0;
  bad[1].dim = SPARSE_TABLE_MAX_DIM + 1;
  bad[2].opt.lr = 0;
  bad[3].name[0] = '\0';
  bad[4].admit_after = 256;
  bad[5].max_bytes = 100; /* less than an empty map */
  for (int i = 0; i < 6; i++) {
    sparse_table *x = NULL;
    ps_err rc = sparse_table_create(&x, &bad[i], &err);
    CHECK(rc == (i == 5 ? PS_ERR_RESOURCE_EXHAUSTED : PS_ERR_INVALID_ARGUMENT));
    CHECK(x == NULL);
  }
}

int main(void) {
  test_eviction();
  test_eviction_stress();
  test_admission();
  test_limit();
  test_budget();
  test_add_set_rows();
  test_dump_load();
  test_dump_order();
  test_stats_and_config();
  return check_report("test_sparse_table_rows");
}
