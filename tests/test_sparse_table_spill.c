/* Sparse tables with a spill (the disk tier's side of a table, without the
 * disk): rows past the memory budget move out whole instead of the pull
 * being refused, come back by install, and a table plus what moved out
 * equals, bitwise, a table that never had a limit. The spill here is a
 * second table (as the tier's buffer is). */
#include <stdatomic.h>

#include "common/rng.h"
#include "tests/sparse_table_testlib.h"

typedef struct sink {
  sparse_table *rows;  /* what moved out */
  uint64_t pinned[64]; /* keys that must stay */
  int n_pinned;
  const uint64_t *batch; /* and the batch being brought back and pulled (as a request's) */
  size_t batch_n;
  int full;            /* put refuses everything */
  int begins;
} sink;

static void sink_begin(void *ctx) { ((sink *)ctx)->begins++; }

static int sink_pinned(void *ctx, const sparse_table *t, uint64_t key) {
  (void)t;
  sink *s = ctx;
  for (int i = 0; i < s->n_pinned; i++) {
    if (s->pinned[i] == key) return 1;
  }
  for (size_t i = 0; i < s->batch_n; i++) {
    if (s->batch[i] == key) return 1;
  }
  return 0;
}

static int sink_put(void *ctx, const sparse_table *t, uint64_t key, const float *row) {
  (void)t;
  sink *s = ctx;
  ps_error err;
  return !s->full && sparse_table_install(s->rows, &key, 1, row, &err) == PS_ERR_OK;
}

static sparse_table *make_sink_table(const sparse_table_config *c) {
  sparse_table_config plain = *c;
  plain.budget = NULL;
  plain.spill = NULL;
  return make(&plain);
}

/* The rows of keys that moved out come back (what the tier's prepare does). */
static void bring_back(sparse_table *t, sink *s, const uint64_t *keys, size_t n) {
  size_t rf = sparse_table_row_floats(sparse_table_config_of(t));
  float *row = malloc(rf * sizeof *row);
  REQUIRE(row);
  for (size_t i = 0; i < n; i++) {
    if (sparse_table_has(t, keys[i]) || !sparse_table_take(s->rows, keys[i], row)) continue;
    ps_error err;
    ps_err rc = sparse_table_install(t, &keys[i], 1, row, &err);
    if (rc != PS_ERR_OK) fprintf(stderr, "install: %s\n", err.msg);
    REQUIRE(rc == PS_ERR_OK);
  }
  free(row);
}

/* The union of two disjoint tables, ascending, as one snapshot. */
static snap merged(const sparse_table *a, const sparse_table *b) {
  snap x = take(a), y = take(b), m = {x.n + y.n, x.dim, x.sf, NULL, NULL, NULL, NULL};
  m.keys = malloc((m.n + 1) * sizeof *m.keys);
  m.values = malloc((m.n * m.dim + 1) * sizeof(float));
  m.state = malloc((m.n * m.sf + 1) * sizeof(float));
  m.meta = malloc((2 * m.n + 1) * sizeof(int64_t));
  REQUIRE(m.keys && m.values && m.state && m.meta);
  size_t i = 0, j = 0;
  for (size_t k = 0; k < m.n; k++) {
    const snap *from = j >= y.n || (i < x.n && x.keys[i] < y.keys[j]) ? &x : &y;
    size_t at = from == &x ? i++ : j++;
    m.keys[k] = from->keys[at];
    memcpy(m.values + k * m.dim, from->values + at * m.dim, m.dim * sizeof(float));
    memcpy(m.state + k * m.sf, from->state + at * m.sf, m.sf * sizeof(float));
    memcpy(m.meta + 2 * k, from->meta + 2 * at, 2 * sizeof(int64_t));
  }
  snap_free(&x);
  snap_free(&y);
  return m;
}

static void test_equals_unlimited(sparse_optimizer_kind kind) {
  sparse_budget budget = {.limit = (size_t)(0.25 * 1048576)};
  atomic_init(&budget.used, 0);
  snprintf(budget.source, sizeof budget.source, "--table-memory-mb 0.25");
  sparse_table_config c = config(kind, 16);
  sparse_table *ref = make(&c);
  sink s = {.rows = make_sink_table(&c)};
  sparse_spill spill = {sink_begin, sink_pinned, sink_put, &s};
  c.budget = &budget;
  c.spill = &spill;
  sparse_table *t = make(&c);
  enum { UNIVERSE = 12000, BATCH = 400, STEPS = 80 };
  uint64_t keys[BATCH];
  float *out = malloc(BATCH * 16 * sizeof(float)), *out_ref = malloc(BATCH * 16 * sizeof(float));
  float *grads = malloc(BATCH * 16 * sizeof(float));
  REQUIRE(out && out_ref && grads);
  rng r;
  rng_seed(&r, 7, 1);
  int same = 1;
  for (long step = 0; step < STEPS; step++) {
    size_t n = 0;
    while (n < BATCH) { /* distinct keys, skewed to small ones */
      /* half the draws from the first 500 keys: a hot set that stays in memory */
      uint64_t k = 1000 + (rng_below(&r, 2) ? rng_below(&r, 500) : rng_below(&r, UNIVERSE));
      int dup = 0;
      for (size_t i = 0; i < n && !dup; i++) dup = keys[i] == k;
      if (!dup) keys[n++] = k;
    }
    s.batch = keys;
    s.batch_n = n;
    bring_back(t, &s, keys, n);
    ps_error err;
    ps_err rc = sparse_table_pull(t, keys, n, NULL, step, out, &err);
    if (rc != PS_ERR_OK) fprintf(stderr, "pull: %s\n", err.msg);
    REQUIRE(rc == PS_ERR_OK);
    pull_ok(ref, keys, n, NULL, step, out_ref);
    same &= memcmp(out, out_ref, n * 16 * sizeof(float)) == 0;
    for (size_t i = 0; i < n * 16; i++) grads[i] = 0.01f * (float)((i * 7 + (size_t)step) % 13) - 0.06f;
    REQUIRE(sparse_table_push(t, keys, n, grads, step, &err) == PS_ERR_OK);
    REQUIRE(sparse_table_push(ref, keys, n, grads, step, &err) == PS_ERR_OK);
    CHECK(atomic_load(&budget.used) <= budget.limit);
  }
  CHECK(same);
  sparse_table_stats st;
  sparse_table_stats_get(t, &st);
  CHECK(st.moved_out > 0);
  CHECK(st.moved_in > 0);
  CHECK(rows_of(t) < rows_of(ref));
  CHECK(s.begins > 0);
  snap want = take(ref), got = merged(t, s.rows);
  CHECK(snap_equal(&want, &got));
  snap_free(&want);
  snap_free(&got);
  sparse_table_destroy(t);
  sparse_table_destroy(ref);
  sparse_table_destroy(s.rows);
  CHECK_EQ_INT(atomic_load(&budget.used), 0);
  free(out);
  free(out_ref);
  free(grads);
}

static void test_equals_unlimited_adagrad(void) { test_equals_unlimited(SPARSE_OPT_ADAGRAD); }
static void test_equals_unlimited_adam(void) { test_equals_unlimited(SPARSE_OPT_ADAM); }

/* A table of 16-float rows (adagrad) under a budget of `mb` MiB whose rows
 * move out to a sink table; everything lives in x, which must not move. */
typedef struct spilled {
  sparse_budget budget;
  sink s;
  sparse_spill spill;
  sparse_table *t;
} spilled;

static void spilled_open(spilled *x, double mb) {
  memset(x, 0, sizeof *x);
  x->budget.limit = (size_t)(mb * 1048576);
  atomic_init(&x->budget.used, 0);
  snprintf(x->budget.source, sizeof x->budget.source, "--table-memory-mb %g", mb);
  sparse_table_config c = config(SPARSE_OPT_ADAGRAD, 16);
  x->s.rows = make_sink_table(&c);
  x->spill = (sparse_spill){sink_begin, sink_pinned, sink_put, &x->s};
  c.budget = &x->budget;
  c.spill = &x->spill;
  x->t = make(&c);
}

static void spilled_close(spilled *x) {
  sparse_table_destroy(x->t);
  sparse_table_destroy(x->s.rows);
}

/* Pinned rows and the pull's own rows stay; a full spill refuses, changing nothing. */
static void test_pins_and_full(void) {
  spilled x;
  spilled_open(&x, 0.2);
  sparse_table *t = x.t;
  sink *s = &x.s;
  uint64_t keys[8000];
  for (int i = 0; i < 8000; i++) keys[i] = 5 + (uint64_t)i * 11;
  float *out = malloc(8000 * 16 * sizeof(float));
  REQUIRE(out);
  /* The oldest rows: the first pulled. Pin a few of them. */
  pull_ok(t, keys, 500, NULL, 0, out);
  for (int i = 0; i < 32; i++) s->pinned[s->n_pinned++] = keys[i * 3];
  for (long step = 1; step < 16; step++) pull_ok(t, keys + step * 500, 500, NULL, step, out);
  sparse_table_stats st;
  sparse_table_stats_get(t, &st);
  CHECK(st.moved_out > 0);
  for (int i = 0; i < s->n_pinned; i++) CHECK(sparse_table_has(t, s->pinned[i]));
  CHECK(!sparse_table_has(t, keys[1])); /* old and not pinned: moved */
  CHECK(sparse_table_has(s->rows, keys[1]));
  for (int i = 7500; i < 8000; i++) CHECK(sparse_table_has(t, keys[i])); /* the last pull's */
  CHECK_EQ_INT(rows_of(t) + rows_of(s->rows), 8000);
  /* A full spill: the pull that needs room is refused and nothing changes. */
  s->full = 1;
  snap before = take(t);
  uint64_t fresh[4000];
  for (int i = 0; i < 4000; i++) fresh[i] = 900000 + (uint64_t)i;
  ps_error err;
  CHECK(sparse_table_pull(t, fresh, 4000, NULL, 20, out, &err) == PS_ERR_RESOURCE_EXHAUSTED);
  CHECK_CONTAINS(err.msg, "--table-memory-mb");
  snap after = take(t);
  /* The pull marked its found rows seen before asking for room: none were found. */
  CHECK(snap_equal(&before, &after));
  snap_free(&before);
  snap_free(&after);
  spilled_close(&x);
  free(out);
}

/* Rows used often stay in memory past rows seen later but used once, for
 * a while (SPILL_USE_STEPS, 4096 steps, per doubling of their count): after
 * that, newer rows win. */
static void test_frequent_rows_stay(void) {
  spilled x;
  spilled_open(&x, 0.2);
  sparse_table *t = x.t;
  enum { HOT = 100, BATCH = 500 };
  uint64_t hot[HOT], batch[BATCH];
  for (int i = 0; i < HOT; i++) hot[i] = 7 + (uint64_t)i * 13;
  float *out = malloc(BATCH * 16 * sizeof(float)), *grads = calloc(BATCH * 16, sizeof(float));
  REQUIRE(out && grads);
  ps_error err;
  /* The hot rows: pulled and pushed at steps 0..7 (count 8, last seen at 7). */
  for (long step = 0; step < 8; step++) {
    pull_ok(t, hot, HOT, NULL, step, out);
    REQUIRE(sparse_table_push(t, hot, HOT, grads, step, &err) == PS_ERR_OK);
  }
  /* New rows, each used once at steps 8..39: by recency alone the hot rows,
   * the oldest, would be the first to move out. */
  uint64_t next_key = 1000000;
  for (long step = 8; step < 40; step++) {
    for (int i = 0; i < BATCH; i++) batch[i] = next_key++;
    pull_ok(t, batch, BATCH, NULL, step, out);
    REQUIRE(sparse_table_push(t, batch, BATCH, grads, step, &err) == PS_ERR_OK);
  }
  sparse_table_stats st;
  sparse_table_stats_get(t, &st);
  CHECK(st.moved_out > 0);
  for (int i = 0; i < HOT; i++) CHECK(sparse_table_has(t, hot[i]));
  CHECK(!sparse_table_has(t, 1000000)); /* the first once-used row: moved */
  CHECK(sparse_table_has(x.s.rows, 1000000));
  /* 16,384 steps later (7 + 4096 * log2(9) is 12,991): new rows used once outrank them. */
  for (long step = 16384; step < 16424; step++) {
    for (int i = 0; i < BATCH; i++) batch[i] = next_key++;
    pull_ok(t, batch, BATCH, NULL, step, out);
    REQUIRE(sparse_table_push(t, batch, BATCH, grads, step, &err) == PS_ERR_OK);
  }
  for (int i = 0; i < HOT; i++) CHECK(!sparse_table_has(t, hot[i]) && sparse_table_has(x.s.rows, hot[i]));
  CHECK_EQ_INT(rows_of(t) + rows_of(x.s.rows), HOT + (size_t)(next_key - 1000000));
  spilled_close(&x);
  free(out);
  free(grads);
}

/* Take, scan, pack and the whole row's parts agree with a dump. */
static void test_whole_rows(void) {
  sparse_table_config c = config(SPARSE_OPT_ADAM, 4);
  sparse_table *t = make(&c);
  uint64_t keys[100];
  for (int i = 0; i < 100; i++) keys[i] = 3 + (uint64_t)i;
  float out[400];
  pull_ok(t, keys, 100, NULL, 9, out);
  size_t rf = sparse_table_row_floats(&c);
  CHECK_EQ_INT(rf, 4 + 8 + 2);
  uint64_t got_keys[100];
  float *rows = malloc(100 * rf * sizeof(float));
  REQUIRE(rows);
  size_t cursor = 0, n = 0, k;
  while ((k = sparse_table_scan(t, &cursor, 7, got_keys + n, rows + n * rf)) > 0) n += k;
  CHECK_EQ_INT(n, 100);
  snap s = take(t);
  for (size_t i = 0; i < n; i++) {
    size_t at = (size_t)(got_keys[i] - 3); /* dump order is ascending keys 3..102 */
    CHECK(memcmp(rows + i * rf, s.values + at * 4, 4 * sizeof(float)) == 0);
    int64_t meta[2];
    sparse_table_row_meta(t, rows + i * rf, meta);
    CHECK(meta[0] == s.meta[2 * at] && meta[1] == s.meta[2 * at + 1]);
    CHECK_EQ_INT(sparse_table_row_step(t, rows + i * rf), 9);
    float packed[14];
    sparse_table_row_pack(t, s.values + at * 4, s.state + at * 8, s.meta + 2 * at, packed);
    CHECK(memcmp(packed, rows + i * rf, rf * sizeof(float)) == 0);
  }
  float row[14];
  CHECK(sparse_table_take(t, 50, row));
  CHECK(!sparse_table_has(t, 50));
  CHECK(!sparse_table_take(t, 50, row));
  CHECK_EQ_INT(rows_of(t), 99);
  ps_error err;
  REQUIRE(sparse_table_install(t, (uint64_t[]){50}, 1, row, &err) == PS_ERR_OK);
  snap again = take(t);
  CHECK(snap_equal(&s, &again));
  snap_free(&s);
  snap_free(&again);
  free(rows);
  sparse_table_destroy(t);
}

int main(void) {
  RUN_CASE(test_equals_unlimited_adagrad);
  RUN_CASE(test_equals_unlimited_adam);
  RUN_CASE(test_pins_and_full);
  RUN_CASE(test_frequent_rows_stay);
  RUN_CASE(test_whole_rows);
  return check_report("test_sparse_table_spill");
}
