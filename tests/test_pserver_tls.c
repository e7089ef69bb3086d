/* A pserver with mutual TLS and the trainer-id check (in this process, over
 * gRPC on 127.0.0.1, certificates from scripts/make-certs): each trainer
 * registers with its own certificate; one that claims another trainer's id,
 * at registration or in a pull, push or done carrying that trainer's
 * incarnation, gets PERMISSION_DENIED, and the parameters and step stay as
 * they were. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc.h"
#include "server/pserver.h"
#include "tests/check.h"
#include "trainer/client/ps_client.h"

static char dir[] = "/tmp/pstrain-test-pserver-tls-XXXXXX";

static tls_config trainer_tls(int id, char *cert, char *key, char *ca, size_t len) {
  snprintf(cert, len, "%s/trainer-%d.pem", dir, id);
  snprintf(key, len, "%s/trainer-%d.key", dir, id);
  snprintf(ca, len, "%s/ca.pem", dir);
  return (tls_config){cert, key, ca, NULL};
}

static pserver ps;
static rpc_server *server;
static endpoint_list list;
static job_config job;
static char cert[300], key[300], ca[300]; /* the server's */

/* Every case's fixture: a fresh pserver with mutual TLS and the trainer-id
 * check, nobody registered. */
static void server_start(void) {
  ps_error err;
  pserver_config cfg = {.id = 0, .pservers = 1, .trainers = 2, .step_timeout = 60,
                        .log_every = 0, .max_shard_mb = 64, .checkpoint_dir = "",
                        .check_trainer_identity = 1};
  REQUIRE(pserver_init(&ps, &cfg, &err) == PS_ERR_OK);
  snprintf(cert, sizeof cert, "%s/server.pem", dir);
  snprintf(key, sizeof key, "%s/server.key", dir);
  snprintf(ca, sizeof ca, "%s/ca.pem", dir);
  static tls_config server_tls;
  server_tls = (tls_config){cert, key, ca, NULL};
  rpc_server_config rcfg = {.listen = "127.0.0.1:0", .methods = pserver_methods,
                            .method_count = pserver_method_count, .handler = pserver_handle,
                            .handler_ctx = &ps, .threads = 2, .max_message_bytes = 64 << 20,
                            .tls = &server_tls};
  int port;
  REQUIRE(rpc_server_start(&server, &rcfg, &port, &err) == PS_ERR_OK);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  REQUIRE(endpoints_parse(target, "pserver", &list, &err) == PS_ERR_OK);

  job = (job_config){.update = UPDATE_SYNC, .trainers = 2, .pservers = 1, .block_size = 100,
                     .seed = 7, .batch = 8, .steps = 10};
  REQUIRE(model_parse("mlp:20,16,4", &job.model, &err) == PS_ERR_OK);
  job.optimizer = (optimizer_config){.kind = OPTIMIZER_SGD, .lr = 0.5, .schedule = LR_CONSTANT,
                                     .step_size = 1, .gamma = 1, .total_steps = 1, .beta1 = 0.9,
                                     .beta2 = 0.999, .epsilon = 1e-8};
}

static void server_stop(void) {
  pserver_abort_waiting(&ps, PS_ERR_UNAVAILABLE, "the test is over");
  rpc_server_stop(server);
  pserver_destroy(&ps);
}

/* trainer-1's certificate claiming id 0 at registration. */
static void case_other_trainers_id_refused_at_registration(void) {
  ps_error err;
  server_start();
  char c1[300], k1[300], a1[300];
  tls_config as1 = trainer_tls(1, c1, k1, a1, sizeof c1);
  ps_client impostor;
  CHECK_EQ_INT(ps_client_connect(&impostor, &list, &job, 0, 0, 10, 10, NULL, &as1, &err),
               PS_ERR_PERMISSION_DENIED);
  CHECK_CONTAINS(err.msg, "names trainer-1, not trainer-0");
  CHECK_EQ_INT(ps.configured, 0);
  server_stop();
}

/* Trainer 1 knows trainer 0's incarnation and acts as trainer 0 in a pull,
 * a push and a done: refused, the parameters and step as they were; each
 * trainer as itself still works. */
static void case_other_trainers_id_refused_in_calls(void) {
  ps_error err;
  server_start();
  char c0[300], k0[300], a0[300], c1[300], k1[300], a1[300];
  tls_config as0 = trainer_tls(0, c0, k0, a0, sizeof c0), as1 = trainer_tls(1, c1, k1, a1, sizeof c1);
  ps_client t0, t1;
  REQUIRE(ps_client_connect(&t0, &list, &job, 0, 0, 10, 10, NULL, &as0, &err) == PS_ERR_OK);
  REQUIRE(ps_client_connect(&t1, &list, &job, 1, 0, 10, 10, NULL, &as1, &err) == PS_ERR_OK);
  size_t n = t0.map.total;
  float *before = calloc(n, sizeof *before), *buf = calloc(n, sizeof *buf);
  float *grads = calloc(n, sizeof *grads);
  REQUIRE(before != NULL && buf != NULL && grads != NULL);
  for (size_t i = 0; i < n; i++) grads[i] = 1.0f;
  REQUIRE(ps_client_pull(&t0, before, &err) == PS_ERR_OK);
  t1.trainer_id = 0;
  uint64_t own = t1.incarnation;
  t1.incarnation = t0.incarnation;
  CHECK_EQ_INT(ps_client_pull(&t1, buf, &err), PS_ERR_PERMISSION_DENIED);
  CHECK_CONTAINS(err.msg, "names trainer-1, not trainer-0");
  CHECK_EQ_INT(ps_client_push_pull(&t1, 0, grads, buf, &err), PS_ERR_PERMISSION_DENIED);
  CHECK_EQ_INT(ps_client_done(&t1, 0, &err), PS_ERR_PERMISSION_DENIED);
  t1.trainer_id = 1;
  t1.incarnation = own;

  CHECK_EQ_INT(pserver_version(&ps), 0);
  pthread_mutex_lock(&ps.lock);
  CHECK_EQ_INT(ps.trainers[0].pushed, 0);
  CHECK_EQ_INT(ps.trainers[0].done, 0);
  CHECK_EQ_INT(ps.pushed_count, 0);
  pthread_mutex_unlock(&ps.lock);
  REQUIRE(ps_client_pull(&t0, buf, &err) == PS_ERR_OK);
  CHECK(memcmp(before, buf, n * sizeof *buf) == 0);
  /* Each trainer as itself still works. */
  CHECK_EQ_INT(ps_client_pull(&t1, buf, &err), PS_ERR_OK);
  CHECK_EQ_INT(ps_client_done(&t1, 0, &err), PS_ERR_OK);
  free(before);
  free(buf);
  free(grads);
  ps_client_close(&t0);
  ps_client_close(&t1);
  server_stop();
}

int main(void) {
  REQUIRE(mkdtemp(dir) != NULL);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s/scripts/make-certs %s --trainers 2 2>/dev/null",
           PSTRAIN_SOURCE_DIR, dir);
  REQUIRE(system(cmd) == 0);
  rpc_global_init();
  RUN_CASE(case_other_trainers_id_refused_at_registration);
  RUN_CASE(case_other_trainers_id_refused_in_calls);
  rpc_global_shutdown();
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK_EQ_INT(system(cmd), 0);
  return check_report("test_pserver_tls");
}
