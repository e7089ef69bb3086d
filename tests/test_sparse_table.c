/* Sparse tables: deduplication, deterministic rows, the row optimizers
 * against double-precision references, eviction (with a map stress test
 * against a plain reference), admission, the memory limit, dump and load,
 * GEO's add and set of rows, and the bytes the table reports. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/sparse_table.h"
#include "tests/check.h"

static sparse_table_config config(sparse_optimizer_kind kind, int dim) {
  sparse_table_config c = {.name = "embedding", .id = 3, .dim = dim, .seed = 42, .init_scale = 0.5f};
  c.opt = (sparse_optimizer_config){.kind = kind, .lr = 0.1, .epsilon = 1e-6,
                                    .initial_accumulator = 0.1, .beta1 = 0.9, .beta2 = 0.999};
  return c;
}

static sparse_table *make(const sparse_table_config *c) {
  sparse_table *t;
  ps_error err;
  ps_err rc = sparse_table_create(&t, c, &err);
  if (rc != PS_ERR_OK) fprintf(stderr, "create: %s\n", err.msg);
  REQUIRE(rc == PS_ERR_OK);
  return t;
}

static size_t rows_of(const sparse_table *t) {
  sparse_table_stats s;
  sparse_table_stats_get(t, &s);
  return s.rows;
}

/* A table's full snapshot, for bitwise comparisons. */
typedef struct snap {
  size_t n, dim, sf;
  uint64_t *keys;
  float *values, *state;
  int64_t *meta;
} snap;

static snap take(const sparse_table *t) {
  snap s = {rows_of(t), (size_t)sparse_table_config_of(t)->dim,
            (size_t)sparse_table_state_floats(sparse_table_config_of(t)), NULL, NULL, NULL, NULL};
  s.keys = malloc((s.n + 1) * sizeof *s.keys);
  s.values = malloc((s.n * s.dim + 1) * sizeof(float));
  s.state = malloc((s.n * s.sf + 1) * sizeof(float));
  s.meta = malloc((2 * s.n + 1) * sizeof(int64_t));
  REQUIRE(s.keys && s.values && s.state && s.meta);
  ps_error err;
  REQUIRE(sparse_table_dump(t, s.keys, s.values, s.state, s.meta, &err) == PS_ERR_OK);
  return s;
}

static int snap_equal(const snap *a, const snap *b) {
  return a->n == b->n && a->dim == b->dim && a->sf == b->sf &&
         memcmp(a->keys, b->keys, a->n * sizeof *a->keys) == 0 &&
         memcmp(a->values, b->values, a->n * a->dim * sizeof(float)) == 0 &&
         memcmp(a->state, b->state, a->n * a->sf * sizeof(float)) == 0 &&
         memcmp(a->meta, b->meta, 2 * a->n * sizeof(int64_t)) == 0;
}

static void snap_free(snap *s) {
  free(s->keys);
  free(s->values);
  free(s->state);
  free(s->meta);
}

static void pull_ok(sparse_table *t, const uint64_t *keys, size_t n, const uint32_t *counts, long step,
                    float *out) {
  ps_error err;
  ps_err rc = sparse_table_pull(t, keys, n, counts, step, out, &err);
  if (rc != PS_ERR_OK) fprintf(stderr, "pull: %s\n", err.msg);
  CHECK(rc == PS_ERR_OK);
}

static void test_dedup(void) {
  sparse_dedup d;
  sparse_dedup_init(&d);
  ps_error err;
  uint32_t slot[16];
  const uint64_t keys[] = {7, 3, 7, 0, 3, 7, UINT64_MAX};
  REQUIRE(sparse_dedup_run(&d, keys, 7, slot, &err) == PS_ERR_OK);
  CHECK_EQ_INT(d.n_unique, 4);
  const uint64_t want_u[] = {7, 3, 0, UINT64_MAX};
  const uint32_t want_c[] = {3, 2, 1, 1}, want_s[] = {0, 1, 0, 2, 1, 0, 3};
  for (int j = 0; j < 4; j++) {
    CHECK(d.unique[j] == want_u[j]);
    CHECK_EQ_INT(d.counts[j], want_c[j]);
  }
  for (int i = 0; i < 7; i++) CHECK_EQ_INT(slot[i], want_s[i]);
  REQUIRE(sparse_dedup_run(&d, keys, 0, slot, &err) == PS_ERR_OK);
  CHECK_EQ_INT(d.n_unique, 0);
  REQUIRE(sparse_dedup_run(&d, keys + 1, 1, slot, &err) == PS_ERR_OK);
  CHECK(d.n_unique == 1 && d.unique[0] == 3 && d.counts[0] == 1 && slot[0] == 0);
  const uint64_t same[] = {5, 5, 5, 5, 5};
  REQUIRE(sparse_dedup_run(&d, same, 5, slot, &err) == PS_ERR_OK);
  CHECK(d.n_unique == 1 && d.unique[0] == 5 && d.counts[0] == 5);
  for (int i = 0; i < 5; i++) CHECK_EQ_INT(slot[i], 0);
  /* Growth far past the first capacity, then a small batch again (map reused and empty). */
  size_t n = 200000;
  uint64_t *big = malloc(n * sizeof *big);
  uint32_t *bslot = malloc(n * sizeof *bslot);
  REQUIRE(big && bslot);
  for (size_t i = 0; i < n; i++) big[i] = (i * 7919) % 70001; /* 70001 is prime: every residue */
  REQUIRE(sparse_dedup_run(&d, big, n, bslot, &err) == PS_ERR_OK);
  CHECK_EQ_INT(d.n_unique, 70001);
  int bad = 0;
  for (size_t i = 0; i < n; i++) bad += d.unique[bslot[i]] != big[i] || (i < 70001 && bslot[i] != i);
  uint64_t total = 0;
  for (size_t j = 0; j < d.n_unique; j++) total += d.counts[j];
  CHECK_EQ_INT(bad, 0);
  CHECK_EQ_INT(total, n);
  CHECK_EQ_INT(d.counts[0], 3);       /* key 0 at i = 0, 70001, 140002 */
  CHECK_EQ_INT(d.counts[70000], 2);   /* first seen at i = 70000; 200000 - 70000 < 2 * 70001 */
  REQUIRE(sparse_dedup_run(&d, keys, 7, slot, &err) == PS_ERR_OK);
  CHECK_EQ_INT(d.n_unique, 4);
  for (int i = 0; i < 7; i++) CHECK_EQ_INT(slot[i], want_s[i]);
  free(big);
  free(bslot);
  sparse_dedup_free(&d);
}

static void test_init_deterministic(void) {
  sparse_table_config c = config(SPARSE_OPT_ADAGRAD, 5);
  sparse_table *a = make(&c), *b = make(&c);
  enum { N = 3000 };
  uint64_t keys[N], rev[N];
  for (int i = 0; i < N; i++) keys[i] = rng_mix64((uint64_t)i) ^ (uint64_t)i;
  for (int i = 0; i < N; i++) rev[i] = keys[N - 1 - i];
  float *out = malloc(N * 5 * sizeof(float));
  REQUIRE(out);
  pull_ok(a, keys, N, NULL, 0, out);
  for (int i = 0; i < N; i += 100) pull_ok(b, rev + i, 100, NULL, 0, out + i * 5);
  snap sa = take(a), sb = take(b);
  CHECK(snap_equal(&sa, &sb));
  for (size_t i = 1; i < sa.n; i++) CHECK(sa.keys[i - 1] < sa.keys[i]);
  /* Each row is sparse_table_init_row's, in +-init_scale, and another table id differs. */
  float row[5], in_range = 1;
  int matches = 0;
  for (int i = 0; i < N; i++) {
    sparse_table_init_row(&c, rev[i], row);
    matches += memcmp(row, out + i * 5, sizeof row) == 0;
    for (int k = 0; k < 5; k++) in_range = in_range && fabsf(row[k]) <= 0.5f;
  }
  CHECK_EQ_INT(matches, N);
  CHECK(in_range);
  sparse_table_config other = c;
  other.id = 4;
  float row2[5];
  sparse_table_init_row(&other, keys[0], row2);
  sparse_table_init_row(&c, keys[0], row);
  CHECK(memcmp(row, row2, sizeof row) != 0);
  /* The first values, pinned: a change to the rows' initialization is a change of format. */
  sparse_table_init_row(&c, 12345, row);
  float expect[5];
  uint64_t stream = rng_mix64(rng_mix64(12345) + 3);
  for (int k = 0; k < 5; k++) expect[k] = (2.0f * rng_uniform_at(42, stream, (uint64_t)k) - 1.0f) * 0.5f;
  CHECK(memcmp(row, expect, sizeof row) == 0);
  sparse_table_config zero = c;
  zero.init_scale = 0;
  sparse_table_init_row(&zero, 12345, row);
  for (int k = 0; k < 5; k++) CHECK(row[k] == 0.0f);
  snap_free(&sa);
  snap_free(&sb);
  free(out);
  sparse_table_destroy(a);
  sparse_table_destroy(b);
}

static void test_pull_creates_missing(void) {
  sparse_table_config c = config(SPARSE_OPT_SGD, 4);
  sparse_table *t = make(&c);
  uint64_t k1[] = {10, 20, 30}, k2[] = {20, 40, 10, 50};
  float out[16];
  pull_ok(t, k1, 3, NULL, 0, out);
  CHECK_EQ_INT(rows_of(t), 3);
  float g[12];
  for (int i = 0; i < 12; i++) g[i] = 1.0f;
  ps_error err;
  CHECK(sparse_table_push(t, k1, 3, g, 0, &err) == PS_ERR_OK);
  pull_ok(t, k2, 4, NULL, 1, out);
  sparse_table_stats s;
  sparse_table_stats_get(t, &s);
  CHECK_EQ_INT(s.rows, 5);
  CHECK_EQ_INT(s.admitted, 5);
  CHECK_EQ_INT(s.refused, 0);
  /* 20 and 10 kept their pushed values; 40 and 50 are new. */
  float init[4];
  sparse_table_init_row(&c, 20, init);
  for (int k = 0; k < 4; k++) CHECK(out[k] == init[k] - 0.1f * 1.0f);
  sparse_table_init_row(&c, 40, init);
  CHECK(memcmp(out + 4, init, sizeof init) == 0);
  /* Pushing a key without a row does nothing. */
  uint64_t ghost = 99;
  CHECK(sparse_table_push(t, &ghost, 1, g, 1, &err) == PS_ERR_OK);
  CHECK_EQ_INT(rows_of(t), 5);
  CHECK(sparse_table_pull(t, k1, 1, NULL, -1, out, &err) == PS_ERR_INVALID_ARGUMENT);
  sparse_table_destroy(t);
}

/* Loads rows with values near 1 (so relative errors mean something) and runs
 * `steps` pushes of known gradients, checking against double precision. */
static void check_optimizer(sparse_optimizer_kind kind, int dim) {
  sparse_table_config c = config(kind, dim);
  sparse_table *t = make(&c);
  enum { R = 3 };
  uint64_t keys[R] = {11, 22, 33};
  float *w0 = malloc(R * (size_t)dim * sizeof(float)), *g = malloc(R * (size_t)dim * sizeof(float));
  float *out = malloc(R * (size_t)dim * sizeof(float));
  double *w = malloc(R * (size_t)dim * sizeof(double)), *m = calloc(R * (size_t)dim, sizeof(double));
  double *v = calloc(R * (size_t)dim, sizeof(double)), acc[R];
  REQUIRE(w0 && g && out && w && m && v);
  for (int i = 0; i < R * dim; i++) w[i] = w0[i] = 1.0f + 0.01f * (float)i;
  for (int r = 0; r < R; r++) acc[r] = (double)(float)0.1;
  ps_error err;
  REQUIRE(sparse_table_load(t, R, keys, w0, NULL, NULL, &err) == PS_ERR_OK);
  double worst = 0;
  int sgd_exact = 1;
  float wf_sgd[R * 64];
  for (int i = 0; i < R * dim && i < R * 64; i++) wf_sgd[i] = w0[i];
  for (int step = 0; step < 5; step++) {
    for (int i = 0; i < R * dim; i++) g[i] = (float)sin(0.7 * i + 1.3 * step) * (1.0f + (float)step);
    REQUIRE(sparse_table_push(t, keys, R, g, step, &err) == PS_ERR_OK);
    for (int r = 0; r < R; r++) {
      double *wr = w + r * dim, *mr = m + r * dim, *vr = v + r * dim;
      const float *gr = g + r * dim;
      if (kind == SPARSE_OPT_ADAGRAD) {
        double sq = 0;
        for (int k = 0; k < dim; k++) sq += (double)gr[k] * gr[k];
        acc[r] += sq / dim;
        for (int k = 0; k < dim; k++) wr[k] -= c.opt.lr * gr[k] / (sqrt(acc[r]) + c.opt.epsilon);
      } else if (kind == SPARSE_OPT_ADAM) {
        double tt = step + 1;
        for (int k = 0; k < dim; k++) {
          mr[k] = c.opt.beta1 * mr[k] + (1 - c.opt.beta1) * gr[k];
          vr[k] = c.opt.beta2 * vr[k] + (1 - c.opt.beta2) * (double)gr[k] * gr[k];
          double mh = mr[k] / (1 - pow(c.opt.beta1, tt)), vh = vr[k] / (1 - pow(c.opt.beta2, tt));
          wr[k] -= c.opt.lr * mh / (sqrt(vh) + c.opt.epsilon);
        }
      } else {
        for (int k = 0; k < dim; k++) wf_sgd[r * dim + k] -= (float)c.opt.lr * gr[k];
      }
    }
    pull_ok(t, keys, R, NULL, step, out);
    for (int i = 0; i < R * dim; i++) {
      if (kind == SPARSE_OPT_SGD) {
        sgd_exact = sgd_exact && out[i] == wf_sgd[i];
      } else {
        double rel = fabs(out[i] - w[i]) / fabs(w[i]);
        if (rel > worst) worst = rel;
      }
    }
  }
  if (kind == SPARSE_OPT_SGD) CHECK(sgd_exact);
  else CHECK_NEAR(worst, 0, 1e-6);
  snap s = take(t);
  for (size_t r = 0; r < s.n; r++) CHECK_EQ_INT(s.meta[2 * r + 1], 5); /* update counts */
  if (kind == SPARSE_OPT_ADAGRAD) {
    for (int r = 0; r < R; r++) CHECK_NEAR(s.state[r], acc[r], 1e-6 * acc[r]);
  }
  snap_free(&s);
  free(w0);
  free(g);
  free(out);
  free(w);
  free(m);
  free(v);
  sparse_table_destroy(t);
}

static void test_lazy_adam(void) {
  sparse_table_config c = config(SPARSE_OPT_ADAM, 8);
  sparse_table *t = make(&c);
  uint64_t keys[6] = {1, 2, 3, 4, 5, 6};
  float out[48], g[48];
  for (int i = 0; i < 48; i++) g[i] = 0.25f * (float)(i % 5) - 0.5f;
  ps_error err;
  pull_ok(t, keys, 6, NULL, 0, out);
  REQUIRE(sparse_table_push(t, keys, 6, g, 0, &err) == PS_ERR_OK);
  snap before = take(t);
  /* Steps 1..3 touch only keys 2 and 5. */
  uint64_t some[2] = {2, 5};
  for (long step = 1; step <= 3; step++) {
    pull_ok(t, some, 2, NULL, step, out);
    REQUIRE(sparse_table_push(t, some, 2, g, step, &err) == PS_ERR_OK);
  }
  snap after = take(t);
  REQUIRE(before.n == 6 && after.n == 6);
  for (size_t r = 0; r < 6; r++) {
    int touched = after.keys[r] == 2 || after.keys[r] == 5;
    int same = memcmp(before.values + r * 8, after.values + r * 8, 8 * sizeof(float)) == 0 &&
               memcmp(before.state + r * 16, after.state + r * 16, 16 * sizeof(float)) == 0 &&
               memcmp(before.meta + 2 * r, after.meta + 2 * r, 2 * sizeof(int64_t)) == 0;
    CHECK(touched ? !same : same);
    CHECK_EQ_INT(after.meta[2 * r + 1], touched ? 4 : 1);
    CHECK_EQ_INT(after.meta[2 * r], touched ? 3 : 0);
  }
  snap_free(&before);
  snap_free(&after);
  sparse_table_destroy(t);
}

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
static void test_push_reuses_pull(void) {
  enum { N = 24, U = 300, DIM = 3 };
  sparse_table_config c = config(SPARSE_OPT_ADAGRAD, DIM);
  c.admit_after = 2;
  c.evict_after = 6;
  sparse_table *a = make(&c), *b = make(&c);
  rng r;
  rng_seed(&r, 5, 5);
  uint64_t ka[N], kb[N], other[N];
  float out_a[N * DIM], out_b[N * DIM], g[N * DIM];
  size_t bad = 0;
  ps_error err;
  for (long step = 0; step < 400; step++) {
    uint64_t first = rng_below(&r, U);
    for (int i = 0; i < N; i++) { /* distinct: 7 and U are coprime */
      ka[i] = rng_mix64((first + 7 * (uint64_t)i) % U);
      other[i] = ka[i] + 1;
    }
    memcpy(kb, ka, sizeof ka);
    pull_ok(a, ka, N, NULL, step, out_a);
    pull_ok(b, kb, N, NULL, step, out_b);
    bad += memcmp(out_a, out_b, sizeof out_a) != 0;
    switch (step < 390 ? rng_below(&r, 12) : 0) { /* the last steps leave rows */
    case 1: /* other keys in the same array */
      ka[rng_below(&r, N)] ^= 0x10000;
      for (int i = 0; i < N; i += 3) ka[i] = rng_mix64(ka[i]);
      memcpy(kb, ka, sizeof ka);
      break;
    case 2: /* the pulled rows go (and the next pull refills the free list) */
      CHECK(sparse_table_evict(a, step + c.evict_after + 1) ==
            sparse_table_evict(b, step + c.evict_after + 1));
      break;
    case 3: { /* rows renumbered */
      snap sa = take(a), sb = take(b);
      REQUIRE(sparse_table_load(a, sa.n, sa.keys, sa.values, sa.state, sa.meta, &err) == PS_ERR_OK);
      REQUIRE(sparse_table_load(b, sb.n, sb.keys, sb.values, sb.state, sb.meta, &err) == PS_ERR_OK);
      snap_free(&sa);
      snap_free(&sb);
      break;
    }
    case 5: /* every row gone */
      REQUIRE(sparse_table_load(a, 0, NULL, NULL, NULL, NULL, &err) == PS_ERR_OK);
      REQUIRE(sparse_table_load(b, 0, NULL, NULL, NULL, NULL, &err) == PS_ERR_OK);
      break;
    case 4: /* another pull between */
      pull_ok(a, other, N, NULL, step, out_a);
      pull_ok(b, other, N, NULL, step, out_b);
      break;
    default: break;
    }
    for (int i = 0; i < N * DIM; i++) g[i] = (float)((step + i) % 5) * 0.25f - 0.5f;
    uint64_t copy[N];
    memcpy(copy, kb, sizeof copy);
    REQUIRE(sparse_table_push(a, ka, N, g, step, &err) == PS_ERR_OK);
    REQUIRE(sparse_table_push(b, copy, N, g, step, &err) == PS_ERR_OK);
  }
  snap sa = take(a), sb = take(b);
  CHECK(snap_equal(&sa, &sb));
  CHECK(sa.n > 100);
  CHECK_EQ_INT(bad, 0);
  snap_free(&sa);
  snap_free(&sb);
  sparse_table_destroy(a);
  sparse_table_destroy(b);
}

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
  test_dedup();
  test_init_deterministic();
  test_pull_creates_missing();
  for (int kind = 0; kind < SPARSE_OPT_KIND_COUNT; kind++) {
    check_optimizer((sparse_optimizer_kind)kind, 5);
    check_optimizer((sparse_optimizer_kind)kind, 16);
    check_optimizer((sparse_optimizer_kind)kind, 19);
  }
  test_lazy_adam();
  test_eviction();
  test_eviction_stress();
  test_push_reuses_pull();
  test_admission();
  test_limit();
  test_add_set_rows();
  test_dump_load();
  test_dump_order();
  test_stats_and_config();
  return check_report("test_sparse_table");
}
