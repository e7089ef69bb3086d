/* The pserver's sparse tables (CTR jobs) answering pulls, driven through
 * pserver_handle on in-memory calls, pserver 0 of 2 with 2 trainers:
 * - the pull barrier waits for every trainer, refuses another step, and
 *   its --step-timeout stops the job or drops the missing trainer;
 * - a PULL_STEP of a step already pulled (a restarted trainer's) is
 *   answered at once with read-only rows;
 * - PULL_LOOKUP changes nothing; PULL_ALL returns every row once in key order. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/pserver_sparse_testlib.h"

/* --- the pull barrier -------------------------------------------------------------------- */

static void test_pull_barrier(void) {
  make_job(UPDATE_SYNC, 0);
  static rows keys[2];
  batch_keys(0, 0, keys);
  for (int cont = 0; cont < 2; cont++) {
    pserver ps;
    pserver_config cfg = make_config();
    cfg.step_timeout = 0.05;
    cfg.continue_on_trainer_loss = cont;
    start(&ps, &cfg);
    /* Another step than the pserver's is refused, saying where it is. */
    reply got;
    result(pull(&ps, 0, 3, PSTRAIN__PULL_KIND__PULL_STEP, keys), &got);
    CHECK_EQ_INT(got.code, PS_ERR_ABORTED);
    CHECK(strstr(got.msg, "at step 0") != NULL);
    rpc_call *first = pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys);
    CHECK(!answered(first));
    CHECK_EQ_INT(pserver_poll(&ps), PSERVER_RUNNING);
    nanosleep(&(struct timespec){0, 100000000}, NULL);
    pserver_status st = pserver_poll(&ps);
    if (cont) {
      /* Trainer 1 is dropped; trainer 0's pull completes alone. */
      CHECK_EQ_INT(st, PSERVER_RUNNING);
      CHECK(answered(first));
      result(first, &got);
      CHECK_EQ_INT(got.code, PS_ERR_OK);
      CHECK(ps.trainers[1].lost);
      reply_free(&got);
    } else {
      CHECK_EQ_INT(st, PSERVER_FAILED);
      CHECK(strstr(ps.failure, "pull barrier") != NULL && strstr(ps.failure, "trainer(s) 1") != NULL);
      CHECK(!answered(first));
      stop(&ps); /* answers it */
      result(first, &got);
      CHECK_EQ_INT(got.code, PS_ERR_UNAVAILABLE);
      continue;
    }
    stop(&ps);
  }
  /* A new incarnation drops its trainer's waiting pull. */
  pserver ps;
  pserver_config cfg = make_config();
  start(&ps, &cfg);
  rpc_call *first = pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys);
  register_as(&ps, &job, 0, 555);
  reply got;
  CHECK(answered(first));
  result(first, &got);
  CHECK_EQ_INT(got.code, PS_ERR_ABORTED);
  stop(&ps);
}

/* --- a pull after the barrier, lookup, all ------------------------------------------- */

/* A PULL_STEP of the step whose merged pull is done (a restarted trainer's):
 * answered at once, read-only, without waiting for the other trainer. */
static void test_pull_after_barrier(void) {
  make_job(UPDATE_SYNC, 0);
  pserver ps;
  pserver_config cfg = make_config();
  start_pulled(&ps, &cfg);
  snapshot before;
  snap_take(&ps, &before);
  static rows keys[2];
  batch_keys(1, 0, keys);
  rpc_call *call = pull(&ps, 1, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys);
  CHECK(answered(call));
  reply got;
  result(call, &got);
  CHECK_EQ_INT(got.code, PS_ERR_OK);
  for (int t = 0; t < 2 && got.code == PS_ERR_OK; t++) {
    float want[MAXK * DIM];
    sparse_table_lookup(ps.store.tables[t], keys[t].keys, keys[t].n, want);
    CHECK_EQ_INT((long)got.n[t], (long)(keys[t].n * (size_t)dim_of(t)));
    CHECK(memcmp(got.values[t], want, got.n[t] * sizeof(float)) == 0);
  }
  reply_free(&got);
  CHECK(snap_same(&ps, &before)); /* no second pull: admission counts stay */
  snap_free(&before);
  stop(&ps);
}

static void test_lookup_and_all(void) {
  make_job(UPDATE_SYNC, 0);
  pserver ps;
  pserver_config cfg = make_config();
  start_pulled(&ps, &cfg);
  snapshot before;
  snap_take(&ps, &before);
  /* Lookup: known keys' rows, zeros for a key without one; nothing changes. */
  static rows keys[2];
  batch_keys(1, 0, keys);
  for (int t = 0; t < 2; t++) keys[t].keys[keys[t].n++] = owned_key(900000, 0);
  reply got;
  result(pull(&ps, 0, 7, PSTRAIN__PULL_KIND__PULL_LOOKUP, keys), &got);
  CHECK_EQ_INT(got.code, PS_ERR_OK);
  for (int t = 0; t < 2 && got.code == PS_ERR_OK; t++) {
    float want[(MAXK + 1) * DIM];
    sparse_table_lookup(ps.store.tables[t], keys[t].keys, keys[t].n, want);
    CHECK_EQ_INT((long)got.n[t], (long)(keys[t].n * (size_t)dim_of(t)));
    CHECK(memcmp(got.values[t], want, got.n[t] * sizeof(float)) == 0);
    for (int d = 0; d < dim_of(t); d++) CHECK(got.values[t][got.n[t] - 1 - (size_t)d] == 0.0f);
  }
  reply_free(&got);
  CHECK(snap_same(&ps, &before));
  /* All: every row once, ascending, as the dump has them. */
  result(pull(&ps, 1, 0, PSTRAIN__PULL_KIND__PULL_ALL, NULL), &got);
  CHECK_EQ_INT(got.code, PS_ERR_OK);
  for (int t = 0; t < 2 && got.code == PS_ERR_OK; t++) {
    sparse_table_stats st;
    sparse_table_stats_get(ps.store.tables[t], &st);
    CHECK_EQ_INT((long)got.nkeys[t], (long)st.rows);
    CHECK_EQ_INT((long)got.n[t], (long)(st.rows * (size_t)dim_of(t)));
    for (size_t k = 1; k < got.nkeys[t]; k++) CHECK(got.keys[t][k - 1] < got.keys[t][k]);
    const float *values = (const float *)(before.tables[t] + st.rows * 24);
    CHECK(memcmp(got.keys[t], before.tables[t], st.rows * 8) == 0);
    CHECK(memcmp(got.values[t], values, got.n[t] * sizeof(float)) == 0);
  }
  reply_free(&got);
  CHECK(snap_same(&ps, &before));
  snap_free(&before);
  stop(&ps);
}

int main(void) {
  fixture_init();
  test_pull_barrier();
  test_lookup_and_all();
  test_pull_after_barrier();
  fixture_free();
  return check_report("test_pserver_sparse_pull");
}
