/* The pserver round trip for scripts/bench-wire: registers with a running
 * pserver as the only trainer of a model whose parameters are SIZE bytes,
 * then pushes SIZE bytes of gradients and gets SIZE bytes of parameters
 * back, through the trainer's own client code, for SECONDS; prints the
 * payload moved per second (both directions) and the round-trip time. With
 * CERT_DIR (scripts/make-certs) it talks mutual TLS as trainer 0. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/process.h"
#include "common/rpc.h"
#include "trainer/client/ps_client.h"

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: bench_wire PSERVER_HOST:PORT SIZE_BYTES SECONDS [CERT_DIR]\n");
    return 2;
  }
  char cert[4096], key[4096], ca[4096];
  tls_config tls = {cert, key, ca, NULL};
  if (argc == 5) {
    snprintf(cert, sizeof cert, "%s/trainer-0.pem", argv[4]);
    snprintf(key, sizeof key, "%s/trainer-0.key", argv[4]);
    snprintf(ca, sizeof ca, "%s/ca.pem", argv[4]);
  }
  log_set_role("bench_wire");
  log_set_level(LOG_LEVEL_WARN);
  long size = atol(argv[2]);
  double seconds = atof(argv[3]);
  /* mlp:IN,OUT holds IN*OUT+OUT floats: OUT=256 and IN chosen to fit SIZE. */
  long floats = size / 4, out = floats >= 65536 ? 256 : 128, in = floats / out - 1;
  if (in < 1 || seconds <= 0) {
    fprintf(stderr, "bench_wire: SIZE must be at least 1 KB and SECONDS > 0\n");
    return 2;
  }
  char model[64];
  snprintf(model, sizeof model, "mlp:%ld,%ld", in, out);
  ps_error err;
  job_config job = {.update = UPDATE_SYNC, .trainers = 1, .pservers = 1, .block_size = 32768,
                    .seed = 1, .batch = 1, .steps = 1L << 40};
  endpoint_list list;
  if (model_parse(model, &job.model, &err) != PS_ERR_OK ||
      endpoints_parse(argv[1], "pserver", &list, &err) != PS_ERR_OK) {
    fprintf(stderr, "bench_wire: %s\n", err.msg);
    return 2;
  }
  job.optimizer = (optimizer_config){.kind = OPTIMIZER_SGD, .lr = 1e-9, .schedule = LR_CONSTANT,
                                     .step_size = 1, .gamma = 1, .total_steps = 1, .beta1 = 0.9,
                                     .beta2 = 0.999, .epsilon = 1e-8};
  rpc_global_init();
  process_tune_malloc();
  ps_client c;
  if (ps_client_connect(&c, &list, &job, 0, 0, 30, 60, NULL, argc == 5 ? &tls : NULL, &err) != PS_ERR_OK) {
    fprintf(stderr, "bench_wire: %s\n", err.msg);
    return 1;
  }
  size_t n = c.map.total;
  float *params = calloc(n, sizeof *params), *grads = calloc(n, sizeof *grads);
  if (params == NULL || grads == NULL || ps_client_pull(&c, params, &err) != PS_ERR_OK) {
    fprintf(stderr, "bench_wire: %s\n", params == NULL || grads == NULL ? "out of memory" : err.msg);
    return 1;
  }
  for (size_t i = 0; i < n; i++) grads[i] = 1e-3f * (float)(i % 13);
  long step = 0;
  for (; step < 20; step++) { /* warm up connections and buffers */
    if (ps_client_push_pull(&c, step, grads, params, &err) != PS_ERR_OK) goto fail;
  }
  long rounds = 0;
  double start = now_s(), elapsed;
  do {
    if (ps_client_push_pull(&c, step++, grads, params, &err) != PS_ERR_OK) goto fail;
    rounds++;
    elapsed = now_s() - start;
  } while (elapsed < seconds);
  double payload = 2.0 * (double)n * sizeof(float) * (double)rounds;
  printf("model %s\nmessage_bytes %zu\nround_trips %ld\nround_trip_ms %.3f\npayload_gb_per_s %.3f\n",
         model, n * sizeof(float), rounds, elapsed / (double)rounds * 1e3, payload / elapsed / 1e9);
  if (ps_client_done(&c, step, &err) != PS_ERR_OK) goto fail;
  ps_client_close(&c);
  free(params);
  free(grads);
  rpc_global_shutdown();
  return 0;
fail:
  fprintf(stderr, "bench_wire: %s\n", err.msg);
  return 1;
}
