/* Sparse tables: deduplication, deterministic rows, the row optimizers
 * against double-precision references (lazy Adam too), and a push reusing
 * its pull's rows. The table's rows over time are test_sparse_table_rows. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/sparse_table.h"
#include "tests/check.h"
#include "tests/sparse_table_testlib.h"

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
  test_push_reuses_pull();
  return check_report("test_sparse_table");
}
