/* The replica interface (trainer/replica/replica.h): --mode picks the
 * implementation and the trainer's place in the job; the local replica's
 * step is the optimizer's, bitwise, and with tables also the rows' pull and
 * update; a mode the build lacks is refused by name. The pserver and
 * collective steps are checked against local training by the equivalence
 * tests (test_pserver_equivalence, test_collective, test_ctr_*). */
#define _POSIX_C_SOURCE 200809L
#include <string.h>

#include "common/ctr_tables.h"
#include "common/fp_env.h"
#include "tests/check.h"
#include "trainer/train.h"

static options_result parse(trainer_settings *s, ps_error *err, const char *const *args) {
  char *argv[32];
  int argc = 0;
  argv[argc++] = (char *)"trainer";
  for (int i = 0; args[i] != NULL; i++) argv[argc++] = (char *)args[i];
  ps_error_clear(err);
  return trainer_settings_load(s, argc, argv, err);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_local(void) {
  trainer_settings s;
  ps_error err;
  REQUIRE(parse(&s, &err, ARGS("--mode", "local", "--optimizer", "adam", "--lr", "0.01",
                               "--lr-schedule", "constant")) == OPTIONS_OK);
  trainer t;
  memset(&t, 0, sizeof t);
  t.settings = s;
  t.id = 7;
  t.trainers = 5;
  replica *up = NULL;
  REQUIRE(replica_create(&t, &up, &err) == PS_ERR_OK);
  CHECK_EQ_STR(up->ops->name, "local");
  CHECK_EQ_INT(up->ops->holds_state, 1);
  CHECK_EQ_STR(t.mode_label, "local");
  CHECK_EQ_INT(t.id, 0);
  CHECK_EQ_INT(t.trainers, 1);
  /* One replica: nothing to start, nothing to send. */
  CHECK_EQ_INT(replica_start(up, &err), PS_ERR_OK);
  int word = 42;
  CHECK_EQ_INT(replica_broadcast(up, &word, sizeof word, &err), PS_ERR_OK);
  CHECK_EQ_INT(word, 42);

  /* Three steps through the replica equal three optimizer steps, bitwise. */
  backend *be;
  model_desc d;
  model *a, *b;
  REQUIRE(backend_cpu_create(&be, 1, &err) == PS_ERR_OK);
  REQUIRE(model_parse("mlp:6,5,3", &d, &err) == PS_ERR_OK);
  REQUIRE(model_create(&a, &d, be, 4, 3, &err) == PS_ERR_OK);
  REQUIRE(model_create(&b, &d, be, 4, 3, &err) == PS_ERR_OK);
  t.model = a;
  size_t n = a->layout.total;
  float first = a->params_host[0];
  for (long step = 0; step < 3; step++) {
    for (size_t i = 0; i < n; i++) {
      a->grads_host[i] = b->grads_host[i] = 0.01f * (float)((long)(i % 7) - 3 + step);
    }
    long next = -1;
    data_batch batch = {.size = 4};
    CHECK_EQ_INT(replica_push(up, step, &batch, &next, &err), PS_ERR_OK);
    CHECK_EQ_INT(next, step + 1);
    CHECK_EQ_INT(model_apply_optimizer(b, &t.settings.optimizer, step, &err), PS_ERR_OK);
  }
  CHECK(a->params_host[0] != first);
  CHECK(memcmp(a->params_host, b->params_host, n * sizeof *a->params_host) == 0);
  CHECK(up->comm_seconds == 0.0 && up->comm_bytes == 0.0);
  CHECK_EQ_INT(replica_finish(up, 3, &err), PS_ERR_OK);
  replica_destroy(up);
  model_destroy(a);
  model_destroy(b);
  backend_destroy(be);
}

/* A model with a table (LR's wide table): the local replica's pull is the
 * table's pull, its push the dense optimizer and the table's push, bitwise;
 * a step without examples changes nothing. */
static void test_local_tables(void) {
  trainer_settings s;
  ps_error err;
  REQUIRE(parse(&s, &err, ARGS("--mode", "local", "--model", "lr", "--data",
                               PSTRAIN_SOURCE_DIR "/tests/data/criteo-sample.tsv", "--optimizer",
                               "sgd", "--lr", "0.1", "--lr-schedule", "constant")) == OPTIONS_OK);
  trainer t;
  memset(&t, 0, sizeof t);
  t.settings = s;
  t.steps_per_epoch = 10;
  replica *up = NULL;
  REQUIRE(replica_create(&t, &up, &err) == PS_ERR_OK);
  backend *be;
  REQUIRE(backend_cpu_create(&be, 1, &err) == PS_ERR_OK);
  REQUIRE(model_create(&t.model, &s.model, be, 4, 3, &err) == PS_ERR_OK);
  REQUIRE(t.model->tables == 1);
  job_config job;
  trainer_job(&t, &job);
  sparse_table_config c;
  ctr_table_config(&job, 0, 0, &c);
  sparse_table *twin;
  REQUIRE(sparse_table_create(&t.tables[0], &c, &err) == PS_ERR_OK);
  REQUIRE(sparse_table_create(&twin, &c, &err) == PS_ERR_OK);
  const size_t dim = (size_t)t.model->dim[0];
  float rows[4], grads[4] = {0.5f, -0.25f, 1.0f, 0.0f}, want[4];
  t.rows[0] = rows;
  t.row_grads[0] = grads;
  uint64_t keys[5] = {11, 7, 11, 900, 7};
  uint32_t slot[5];
  sparse_dedup d;
  sparse_dedup_init(&d);
  REQUIRE(sparse_dedup_run(&d, keys, 5, slot, &err) == PS_ERR_OK);
  CHECK_EQ_INT(d.n_unique, 3);
  data_batch b = {.size = 2, .dedup = &d};
  for (long step = 0; step < 2; step++) {
    CHECK_EQ_INT(replica_pull(up, step, &b, &err), PS_ERR_OK);
    CHECK_EQ_INT(sparse_table_pull(twin, d.unique, d.n_unique, d.counts, step, want, &err),
                 PS_ERR_OK);
    CHECK(memcmp(rows, want, d.n_unique * dim * sizeof(float)) == 0);
    long next = -1;
    CHECK_EQ_INT(replica_push(up, step, &b, &next, &err), PS_ERR_OK);
    CHECK_EQ_INT(next, step + 1);
    CHECK_EQ_INT(sparse_table_push(twin, d.unique, d.n_unique, grads, step, &err), PS_ERR_OK);
  }
  sparse_table_lookup(t.tables[0], d.unique, d.n_unique, rows);
  sparse_table_lookup(twin, d.unique, d.n_unique, want);
  CHECK(memcmp(rows, want, d.n_unique * dim * sizeof(float)) == 0);
  CHECK(want[0] != 0.0f); /* the pushes moved the rows */
  /* No examples: no pull, no update. */
  data_batch none = {.size = 0, .dedup = &d};
  long next = -1;
  CHECK_EQ_INT(replica_pull(up, 2, &none, &err), PS_ERR_OK);
  CHECK_EQ_INT(replica_push(up, 2, &none, &next, &err), PS_ERR_OK);
  CHECK_EQ_INT(next, 3);
  sparse_table_lookup(t.tables[0], d.unique, d.n_unique, rows);
  CHECK(memcmp(rows, want, d.n_unique * dim * sizeof(float)) == 0);
  sparse_dedup_free(&d);
  sparse_table_destroy(twin);
  sparse_table_destroy(t.tables[0]);
  replica_destroy(up);
  model_destroy(t.model);
  backend_destroy(be);
}

static void test_pserver(void) {
  trainer_settings s;
  ps_error err;
  REQUIRE(parse(&s, &err, ARGS("--mode", "pserver", "--pservers", "127.0.0.1:1,127.0.0.1:2",
                               "--trainers", "3", "--id", "2", "--update", "async")) ==
          OPTIONS_OK);
  trainer t;
  memset(&t, 0, sizeof t);
  t.settings = s;
  replica *up = NULL;
  REQUIRE(replica_create(&t, &up, &err) == PS_ERR_OK);
  CHECK_EQ_STR(up->ops->name, "pserver");
  CHECK_EQ_INT(up->ops->holds_state, 0); /* the pservers write the checkpoints */
  CHECK_EQ_STR(t.mode_label, "pserver-async");
  CHECK_EQ_INT(t.id, 2);
  CHECK_EQ_INT(t.trainers, 3);
  int word = 42;
  CHECK_EQ_INT(replica_broadcast(up, &word, sizeof word, &err), PS_ERR_UNSUPPORTED);
  CHECK_CONTAINS(err.msg, "from the pservers");
  replica_destroy(up); /* never started: nothing to close */
}

static void test_collective_unbuilt(void) {
#ifndef PSTRAIN_HAVE_MPI
  trainer_settings s;
  ps_error err;
  REQUIRE(parse(&s, &err, ARGS("--mode", "collective")) == OPTIONS_OK);
  trainer t;
  memset(&t, 0, sizeof t);
  t.settings = s;
  replica *up = NULL;
  CHECK_EQ_INT(replica_create(&t, &up, &err), PS_ERR_UNSUPPORTED);
  CHECK_CONTAINS(err.msg, "--mode collective: this build has no MPI");
  CHECK(up == NULL);
#endif
}

int main(void) {
  fp_env_flush_denormals(); /* as the trainer and pserver run (common/fp_env.h) */
  test_local();
  test_local_tables();
  test_pserver();
  test_collective_unbuilt();
  return check_report("test_replica");
}
