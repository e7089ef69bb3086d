/* The replica interface (trainer/replica/replica.h): --mode picks the
 * implementation and the trainer's place in the job; the local replica's
 * step is the optimizer's, bitwise, and with tables also the rows' pull and
 * update; a mode the build lacks is refused by name. The pserver and
 * collective steps are checked against local training by the equivalence
 * tests (test_pserver_equivalence, test_collective, test_ctr_*). */
#define _POSIX_C_SOURCE 200809L
#include <string.h>

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
  test_pserver();
  test_collective_unbuilt();
  return check_report("test_replica");
}
