/* The pserver's sparse tables (CTR jobs) merging pushes, driven through
 * pserver_handle on in-memory calls, pserver 0 of 2 with 2 trainers:
 * - sync: after the pull barrier and three steps, every reply's rows, the
 *   dense shard and the tables equal a local computation with sparse_table
 *   pull/push on the union of the trainers' keys (exact for keys one
 *   trainer touches, within 1e-6 where gradients are summed);
 * - admission counts both trainers' occurrences of a key in one step;
 * - async applies each push at once.
 * The pull barrier and lookups: test_pserver_sparse_pull; refusals and
 * --max-table-mb: test_pserver_sparse_refusals. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/pserver_sparse_testlib.h"

#define STEPS 3

/* A push: dense gradients (flat, may be NULL: no blocks), sparse grads and
 * next keys per table (NULL: the field left out). */
static rpc_call *push(pserver *ps, uint32_t trainer, uint64_t step, const float *dense,
                      const rows *grads, const rows *next) {
  wire_writer w = {0};
  ps_error err;
  REQUIRE(wire_writer_begin(&w, map.block_count, &err) == PS_ERR_OK);
  wire_key key = {trainer, 100 + trainer, step};
  wire_writer_push_header(&w, &key, job_config_hash(&job));
  for (size_t i = 0; i < map.block_count && dense != NULL; i++) {
    const shard_block *b = &map.blocks[i];
    if (b->pserver == 0) wire_writer_block(&w, b->id, dense + b->offset, b->count, NULL);
  }
  for (int t = 0; t < 2 && grads != NULL; t++) {
    wire_writer_sparse(&w, WIRE_SPARSE_GRADS, (uint32_t)t, grads[t].keys, grads[t].n,
                       grads[t].values, grads[t].n * (size_t)dim_of(t), NULL, NULL);
  }
  for (int t = 0; t < 2 && next != NULL; t++) {
    wire_writer_sparse(&w, WIRE_SPARSE_KEYS, (uint32_t)t, next[t].keys, next[t].n, NULL, 0,
                       next[t].counts, NULL);
  }
  REQUIRE(wire_writer_check(&w, &err) == PS_ERR_OK);
  rpc_call *call = send(ps, 1, &w);
  wire_writer_free(&w);
  return call;
}

static void dense_grads(int r, int s, float *g) {
  for (size_t i = 0; i < layout.total; i++) {
    g[i] = 0.001f * (float)((i * 7 + (size_t)r * 3 + (size_t)s) % 11) - 0.005f;
  }
}

/* Whether key is in both trainers' batches of step s. */
static int shared(uint64_t key, const rows *a, const rows *b) {
  int in_a = 0, in_b = 0;
  for (size_t k = 0; k < a->n; k++) in_a |= a->keys[k] == key;
  for (size_t k = 0; k < b->n; k++) in_b |= b->keys[k] == key;
  return in_a && in_b;
}

/* The pulled union's rows against each trainer's reply. */
static void check_rows(const reply *got, const rows *mine, const rows *u, const float *ref_rows,
                       int t, int exact) {
  int dim = dim_of(t);
  CHECK_EQ_INT((long)got->n[t], (long)(mine->n * (size_t)dim));
  if (got->n[t] != mine->n * (size_t)dim) return;
  for (size_t k = 0; k < mine->n; k++) {
    size_t j = 0;
    while (u->keys[j] != mine->keys[k]) j++;
    for (int d = 0; d < dim; d++) {
      float a = got->values[t][k * (size_t)dim + (size_t)d], b = ref_rows[j * (size_t)dim + (size_t)d];
      if (exact) CHECK(a == b);
      else CHECK(fabsf(a - b) <= 1e-6f);
    }
  }
}

/* --- sync ≡ local on the union ------------------------------------------------------ */

static void test_sync(void) {
  make_job(UPDATE_SYNC, 0);
  pserver ps;
  pserver_config cfg = make_config();
  start(&ps, &cfg);
  reference ref;
  ref_init(&ref, 0);
  size_t n = layout.total;
  float *want = malloc(n * sizeof *want), *m1 = calloc(n, sizeof *m1), *m2 = calloc(n, sizeof *m2);
  float *g[TRAINERS], *sum = malloc(n * sizeof *sum);
  for (int r = 0; r < TRAINERS; r++) g[r] = malloc(n * sizeof *g[r]);
  REQUIRE(want && m1 && m2 && sum && g[0] && g[1]);
  model_init_params(&layout, job.seed, 0, n, want);
  static rows keys[TRAINERS][2], grads[TRAINERS][2], u[2];
  static float ref_rows[2][2 * MAXK * DIM];
  memset(keys, 0, sizeof keys);
  memset(grads, 0, sizeof grads);
  /* The pull barrier of step 0: trainer 0 waits for trainer 1. */
  for (int r = 0; r < TRAINERS; r++) batch_keys(r, 0, keys[r]);
  rpc_call *first = pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[0]);
  CHECK(!answered(first));
  rpc_call *second = pull(&ps, 1, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[1]);
  reply got[TRAINERS];
  result(first, &got[0]);
  result(second, &got[1]);
  ps_error err;
  for (int t = 0; t < 2; t++) {
    union_of(&keys[0][t], &keys[1][t], dim_of(t), &u[t]);
    REQUIRE(sparse_table_pull(ref.t[t], u[t].keys, u[t].n, u[t].counts, 0, ref_rows[t], &err) ==
            PS_ERR_OK);
  }
  for (int r = 0; r < TRAINERS; r++) {
    CHECK_EQ_INT(got[r].code, PS_ERR_OK);
    for (int t = 0; t < 2 && got[r].code == PS_ERR_OK; t++) {
      check_rows(&got[r], &keys[r][t], &u[t], ref_rows[t], t, 1);
    }
    reply_free(&got[r]);
  }
  for (int s = 0; s < STEPS; s++) {
    /* Each trainer pushes its gradients of step s and its keys of s + 1. */
    rows next[TRAINERS][2];
    memset(next, 0, sizeof next);
    for (int r = 0; r < TRAINERS; r++) {
      batch_grads(r, s, grads[r]);
      if (s + 1 < STEPS) batch_keys(r, s + 1, next[r]);
      dense_grads(r, s, g[r]);
    }
    first = push(&ps, 0, (uint64_t)s, g[0], grads[0], next[0]);
    CHECK(!answered(first));
    second = push(&ps, 1, (uint64_t)s, g[1], grads[1], next[1]);
    result(first, &got[0]);
    result(second, &got[1]);
    /* The reference: dense and sparse sums in trainer-id order, halved. */
    for (size_t i = 0; i < n; i++) sum[i] = (g[0][i] + g[1][i]) * 0.5f;
    optimizer_apply(&job.optimizer, s, want, sum, m1, m2, n);
    for (int t = 0; t < 2; t++) {
      union_of(&grads[0][t], &grads[1][t], dim_of(t), &u[t]);
      for (size_t i = 0; i < u[t].n * (size_t)dim_of(t); i++) u[t].values[i] *= 0.5f;
      REQUIRE(sparse_table_push(ref.t[t], u[t].keys, u[t].n, u[t].values, s, &err) == PS_ERR_OK);
    }
    long every = job.sparse.evict_after / 4 > 0 ? job.sparse.evict_after / 4 : 1;
    if ((s + 1) % every == 0) {
      for (int t = 0; t < 2; t++) sparse_table_evict(ref.t[t], s + 1);
    }
    for (int t = 0; t < 2; t++) {
      union_of(&next[0][t], &next[1][t], dim_of(t), &u[t]);
      REQUIRE(sparse_table_pull(ref.t[t], u[t].keys, u[t].n, u[t].counts, s + 1, ref_rows[t],
                                &err) == PS_ERR_OK);
    }
    for (int r = 0; r < TRAINERS; r++) {
      CHECK_EQ_INT(got[r].code, PS_ERR_OK);
      if (got[r].code != PS_ERR_OK) continue;
      CHECK_EQ_INT(got[r].step, s + 1);
      for (size_t b = 0; b < map.block_count; b++) {
        const shard_block *blk = &map.blocks[b];
        if (blk->pserver != 0) continue;
        CHECK(memcmp(got[r].params + blk->offset, want + blk->offset,
                     blk->count * sizeof(float)) == 0);
      }
      for (int t = 0; t < 2; t++) check_rows(&got[r], &next[r][t], &u[t], ref_rows[t], t, 1);
      reply_free(&got[r]);
    }
  }
  /* The tables hold the same rows: keys equal, values exact where one
   * trainer pushed, within 1e-6 where two gradients were summed. */
  for (int t = 0; t < 2; t++) {
    size_t la, lb;
    sparse_table_stats sa, sb;
    sparse_table_stats_get(ps.store.tables[t], &sa);
    sparse_table_stats_get(ref.t[t], &sb);
    CHECK_EQ_INT((long)sa.rows, (long)sb.rows);
    uint8_t *a = dump(ps.store.tables[t], &la), *b = dump(ref.t[t], &lb);
    CHECK(la == lb && memcmp(a, b, sa.rows * 8) == 0);
    const float *va = (const float *)(a + sa.rows * 24), *vb = (const float *)(b + sb.rows * 24);
    for (size_t i = 0; la == lb && i < sa.rows * (size_t)dim_of(t); i++) {
      CHECK(fabsf(va[i] - vb[i]) <= 1e-6f);
    }
    free(a);
    free(b);
  }
  /* Keys only trainer 1 touched at the last step are exact. */
  {
    rows last[TRAINERS][2];
    for (int r = 0; r < TRAINERS; r++) batch_keys(r, STEPS - 1, last[r]);
    for (int t = 0; t < 2; t++) {
      float a[DIM], b[DIM];
      for (size_t k = 0; k < last[1][t].n; k++) {
        uint64_t key = last[1][t].keys[k];
        if (shared(key, &last[0][t], &last[1][t])) continue;
        sparse_table_lookup(ps.store.tables[t], &key, 1, a);
        sparse_table_lookup(ref.t[t], &key, 1, b);
        CHECK(memcmp(a, b, (size_t)dim_of(t) * sizeof(float)) == 0);
      }
    }
  }
  /* A resend of an applied push gets the rows read-only. */
  snapshot before;
  snap_take(&ps, &before);
  rows next1[2];
  batch_keys(1, 1, next1);
  result(push(&ps, 1, 0, g[1], grads[1], next1), &got[1]);
  CHECK_EQ_INT(got[1].code, PS_ERR_OK);
  CHECK(snap_same(&ps, &before));
  reply_free(&got[1]);
  snap_free(&before);
  stop(&ps);
  ref_free(&ref);
  for (int r = 0; r < TRAINERS; r++) free(g[r]);
  free(sum);
  free(want);
  free(m1);
  free(m2);
}

/* --- admission, async ---------------------------------------------------------------- */

/* --admit-after 2: a key once in each trainer's batch gets its row at the
 * step's merged pull; a key once in one batch does not. */
static void test_admission(void) {
  make_job(UPDATE_SYNC, 2);
  pserver ps;
  pserver_config cfg = make_config();
  start(&ps, &cfg);
  static rows keys[TRAINERS][2];
  memset(keys, 0, sizeof keys);
  uint64_t both = owned_key(77, 0), only = owned_key(77, 1);
  for (int t = 0; t < 2; t++) {
    keys[0][t].keys[0] = both;
    keys[0][t].keys[1] = only;
    keys[0][t].counts[0] = keys[0][t].counts[1] = 1;
    keys[0][t].n = 2;
    keys[1][t].keys[0] = both;
    keys[1][t].counts[0] = 1;
    keys[1][t].n = 1;
  }
  rpc_call *first = pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[0]);
  reply got[2];
  result(pull(&ps, 1, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[1]), &got[1]);
  result(first, &got[0]);
  CHECK_EQ_INT(got[0].code, PS_ERR_OK);
  if (got[0].code == PS_ERR_OK) {
    sparse_table_config c;
    ctr_table_config(&job, CTR_TABLE_EMBEDDING, 0, &c);
    float init[DIM], zeros[DIM] = {0};
    sparse_table_init_row(&c, both, init);
    CHECK(memcmp(got[0].values[1], init, sizeof init) == 0);
    CHECK(memcmp(got[0].values[1] + DIM, zeros, sizeof zeros) == 0);
    CHECK(memcmp(got[1].values[1], init, sizeof init) == 0);
  }
  sparse_table_stats st;
  sparse_table_stats_get(ps.store.tables[CTR_TABLE_EMBEDDING], &st);
  CHECK_EQ_INT((long)st.rows, 1);
  CHECK_EQ_INT((long)st.admitted, 1);
  reply_free(&got[0]);
  reply_free(&got[1]);
  stop(&ps);
}

/* Async: each push is applied on arrival, scaled 1/N (whole: as it is), at
 * schedule step version / N, and its next keys are pulled at the new
 * version / N. */
static void async_rows(int whole) {
  make_job(UPDATE_ASYNC, 0);
  job.async_whole = whole;
  pserver ps;
  pserver_config cfg = make_config();
  start(&ps, &cfg);
  reference ref;
  ref_init(&ref, 0);
  float *g = malloc(layout.total * sizeof *g);
  REQUIRE(g != NULL);
  static rows keys[2], grads[2], next[2];
  static float ref_rows[MAXK * DIM];
  ps_error err;
  /* Pulls are answered at once. */
  batch_keys(0, 0, keys);
  reply got;
  result(pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys), &got);
  CHECK_EQ_INT(got.code, PS_ERR_OK);
  reply_free(&got);
  for (int t = 0; t < 2; t++) {
    REQUIRE(sparse_table_pull(ref.t[t], keys[t].keys, keys[t].n, keys[t].counts, 0, ref_rows,
                              &err) == PS_ERR_OK);
  }
  for (int k = 0; k < 3; k++) {
    int r = k % TRAINERS;
    batch_grads(r, k, grads);
    batch_keys(r, k + 1, next);
    dense_grads(r, k, g);
    result(push(&ps, (uint32_t)r, (uint64_t)(k / TRAINERS), g, grads, next), &got);
    CHECK_EQ_INT(got.code, PS_ERR_OK);
    for (int t = 0; t < 2; t++) {
      for (size_t i = 0; i < grads[t].n * (size_t)dim_of(t) && !whole; i++) {
        grads[t].values[i] *= 1.0f / TRAINERS;
      }
      REQUIRE(sparse_table_push(ref.t[t], grads[t].keys, grads[t].n, grads[t].values,
                                k / TRAINERS, &err) == PS_ERR_OK);
      if ((k + 1) % TRAINERS == 0) sparse_table_evict(ref.t[t], (k + 1) / TRAINERS);
      REQUIRE(sparse_table_pull(ref.t[t], next[t].keys, next[t].n, next[t].counts,
                                (k + 1) / TRAINERS, ref_rows, &err) == PS_ERR_OK);
      if (got.code == PS_ERR_OK) check_rows(&got, &next[t], &next[t], ref_rows, t, 1);
    }
    reply_free(&got);
  }
  stop(&ps);
  ref_free(&ref);
  free(g);
}

static void test_async(void) { async_rows(0); }
static void test_async_whole(void) { async_rows(1); }

int main(void) {
  fixture_init();
  test_sync();
  test_admission();
  test_async();
  test_async_whole();
  fixture_free();
  return check_report("test_pserver_sparse");
}
