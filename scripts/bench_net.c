/* Steady-state training steps of a network on the CPU backend: forward,
 * backward and a momentum-SGD step over random images already in memory,
 * as scripts/bench_net_torch.py times PyTorch. Prints one JSON line.
 *   bench_net NETWORK|FILE C H W BATCH THREADS SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/fp_env.h"
#include "common/rng.h"
#include "trainer/model/model.h"

static int step(model *m, const model_batch *b, const optimizer_config *opt, long s) {
  model_outputs out = {0};
  ps_error err;
  if (model_forward(m, b, 1, &out, &err) != PS_ERR_OK ||
      model_backward(m, b, NULL, &err) != PS_ERR_OK ||
      model_apply_optimizer(m, opt, s, &err) != PS_ERR_OK) {
    fprintf(stderr, "bench_net: %s\n", err.msg);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 8) {
    fprintf(stderr, "usage: bench_net NETWORK|FILE C H W BATCH THREADS SECONDS\n");
    return 2;
  }
  fp_env_flush_denormals();
  int c = atoi(argv[2]), h = atoi(argv[3]), w = atoi(argv[4]), batch = atoi(argv[5]);
  int threads = atoi(argv[6]);
  double seconds = atof(argv[7]);
  model_desc d;
  ps_error err;
  ps_err rc = strchr(argv[1], '/') != NULL || strchr(argv[1], '.') != NULL
                  ? model_read_file(argv[1], &d, &err)
                  : model_parse(argv[1], &d, &err);
  if (rc == PS_ERR_OK) rc = model_set_input(&d, c, h, w, &err);
  backend *be = NULL;
  model *m = NULL;
  if (rc == PS_ERR_OK) rc = backend_cpu_create(&be, threads, &err);
  if (rc == PS_ERR_OK) rc = model_create(&m, &d, be, batch, 1, &err);
  if (rc != PS_ERR_OK) {
    fprintf(stderr, "bench_net: %s\n", err.msg);
    return 1;
  }
  size_t width = (size_t)c * h * w;
  rng r;
  rng_seed(&r, 5, 0);
  for (size_t i = 0; i < (size_t)batch * width; i++) m->inputs[i] = (float)(rng_next(&r) >> 40) / 16777216.0f;
  for (int i = 0; i < batch; i++) m->labels[i] = (int32_t)(rng_next(&r) % 10);
  model_batch b = {.size = batch, .inputs = m->inputs, .labels = m->labels};
  optimizer_config opt = {.kind = OPTIMIZER_MOMENTUM, .lr = 0.01, .momentum = 0.9,
                          .schedule = LR_CONSTANT, .total_steps = 1};
  for (long s = 0; s < 3; s++) { /* warm-up: allocations, caches */
    if (step(m, &b, &opt, s) != 0) return 1;
  }
  long steps = 0;
  double start = now_s(), elapsed = 0;
  while (elapsed < seconds || steps < 3) {
    if (step(m, &b, &opt, 3 + steps) != 0) return 1;
    steps++;
    elapsed = now_s() - start;
  }
  printf("{\"network\":\"%s\",\"batch\":%d,\"threads\":%d,\"steps\":%ld,\"seconds\":%.3f,"
         "\"samples_per_s\":%.1f,\"parameters\":%zu,\"backend\":\"%s\"}\n",
         d.net.name, batch, threads, steps, elapsed, steps * batch / elapsed, m->layout.total,
         be->description);
  model_destroy(m);
  backend_destroy(be);
  return 0;
}
