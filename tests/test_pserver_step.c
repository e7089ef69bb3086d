/* The pserver's step, driven through pserver_handle on in-memory calls:
 * - async update math: a push of gradient g from one of N trainers changes
 *   the weights by exactly optimizer_apply on g/N (g with --async-push
 *   whole) at schedule step (pushes applied so far) / N;
 * - the statistics line: one per --log-every steps, each with a rate that
 *   covers the interval (no second line for the same step). */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/job.h"
#include "common/wire.h"
#include "server/pserver.h"
#include "tests/check.h"
#include "tests/pserver_testlib.h"

#define TRAINERS 2

static job_config job;
static tensor_layout layout;
static shard_map map;

/* Calls the handler with one message made of parts; returns the reply's
 * code, params (when not NULL) receiving the parameters replied. */
static ps_err handle(pserver *ps, int method, const rpc_part *parts, int count, float *params) {
  rpc_call *call = testlib_handle(ps, method, parts, count, 1);
  REQUIRE(call != NULL);
  const rpc_local_result *r = rpc_call_local_result(call);
  REQUIRE(r->replies == 1);
  ps_err code = r->code;
  if (code == PS_ERR_OK && params != NULL) {
    rpc_segment rs = {r->bytes, r->len};
    rpc_message reply = {&rs, 1, r->len};
    wire_block_ref refs[64];
    wire_blocks_msg m = {.blocks = refs, .block_cap = 64};
    ps_error err;
    REQUIRE(wire_parse_blocks(&reply, &m, &err) == PS_ERR_OK);
    for (size_t i = 0; i < m.block_count; i++) {
      wire_copy_block(&reply, &m.blocks[i], params + map.blocks[m.blocks[i].id].offset);
    }
  }
  rpc_call_local_free(call);
  return code;
}

static void do_register(pserver *ps, uint32_t trainer) {
  uint8_t buf[TESTLIB_REGISTER_MAX];
  size_t len = testlib_register_bytes(&job, trainer, 100 + trainer, job_config_hash(&job), 0, buf,
                                      sizeof buf);
  REQUIRE(len > 0);
  rpc_part part = {buf, len, NULL};
  CHECK_EQ_INT(handle(ps, 0, &part, 1, NULL), PS_ERR_OK);
}

static ps_err push(pserver *ps, uint32_t trainer, uint64_t step, const float *grads,
                   float *params) {
  wire_writer w = {0};
  ps_error err;
  REQUIRE(wire_writer_begin(&w, map.block_count, &err) == PS_ERR_OK);
  wire_key key = {trainer, 100 + trainer, step};
  testlib_push_blocks(&w, &map, &key, job_config_hash(&job), grads, -1);
  ps_err rc = handle(ps, 1, w.parts, w.part_count, params);
  wire_writer_free(&w);
  return rc;
}

static void make_job(update_mode update) {
  ps_error err;
  job = (job_config){.update = update, .trainers = TRAINERS, .pservers = 1, .block_size = 64,
                     .seed = 3, .batch = 8, .steps = 10};
  REQUIRE(model_parse("mlp:12,8,3", &job.model, &err) == PS_ERR_OK);
  /* Adam with a step schedule: the update depends on the step it is taken at. */
  job.optimizer = (optimizer_config){.kind = OPTIMIZER_ADAM, .lr = 0.1, .schedule = LR_STEP,
                                     .step_size = 1, .gamma = 0.5, .total_steps = 10,
                                     .beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-8};
}

/* Async: push k (0-based, over all trainers) applies g/N (whole: g) at step k / N. */
static void async_math(int whole) {
  ps_error err;
  make_job(UPDATE_ASYNC);
  job.async_whole = whole;
  pserver ps;
  pserver_config cfg = {.id = 0, .pservers = 1, .trainers = TRAINERS, .step_timeout = 60,
                        .max_shard_mb = 64, .max_blocks_per_request = 64};
  REQUIRE(pserver_init(&ps, &cfg, &err) == PS_ERR_OK);
  for (uint32_t t = 0; t < TRAINERS; t++) do_register(&ps, t);
  size_t n = layout.total;
  float *grads = malloc(n * sizeof *grads), *scaled = malloc(n * sizeof *scaled);
  float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
  float *m1 = calloc(n, sizeof *m1), *m2 = calloc(n, sizeof *m2);
  REQUIRE(grads && scaled && want && got && m1 && m2);
  model_init_params(&layout, job.seed, 0, n, want);
  /* Five pushes alternating trainers: schedule steps 0, 0, 1, 1, 2. */
  for (int k = 0; k < 5; k++) {
    uint32_t trainer = (uint32_t)(k % TRAINERS);
    for (size_t i = 0; i < n; i++) grads[i] = 0.01f * (float)((i * 7 + (size_t)k) % 11) - 0.05f;
    for (size_t i = 0; i < n; i++) scaled[i] = whole ? grads[i] : grads[i] * (1.0f / TRAINERS);
    optimizer_apply(&job.optimizer, k / TRAINERS, want, scaled, m1, m2, n);
    CHECK_EQ_INT(push(&ps, trainer, (uint64_t)(k / TRAINERS), grads, got), PS_ERR_OK);
    CHECK(memcmp(got, want, n * sizeof *got) == 0);
  }
  /* A push of a step its trainer has applied already changes nothing. */
  CHECK_EQ_INT(push(&ps, 0, 0, grads, got), PS_ERR_OK);
  CHECK(memcmp(got, want, n * sizeof *got) == 0);
  pserver_abort_waiting(&ps, PS_ERR_UNAVAILABLE, "test over");
  pserver_destroy(&ps);
  free(grads);
  free(scaled);
  free(want);
  free(got);
  free(m1);
  free(m2);
}

static void test_async_math(void) { async_math(0); }
static void test_async_math_whole(void) { async_math(1); }

/* Sync, --log-every 5, 20 steps: four lines, steps 5..20, each once, no
 * rate of 0 pushes/s and none from an interval of no time. */
static void test_stats_lines(void) {
  ps_error err;
  make_job(UPDATE_SYNC);
  char path[] = "/tmp/pstrain-test-stats-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  int saved = dup(STDERR_FILENO);
  REQUIRE(saved >= 0 && dup2(fd, STDERR_FILENO) >= 0);
  pserver ps;
  pserver_config cfg = {.id = 0, .pservers = 1, .trainers = TRAINERS, .step_timeout = 60,
                        .log_every = 5, .max_shard_mb = 64, .max_blocks_per_request = 64};
  REQUIRE(pserver_init(&ps, &cfg, &err) == PS_ERR_OK);
  for (uint32_t t = 0; t < TRAINERS; t++) do_register(&ps, t);
  float *grads = calloc(layout.total, sizeof *grads);
  REQUIRE(grads != NULL);
  /* Trainer 1 pushes first, so trainer 0's push completes each step and
   * later pushes of the next step arrive at a step divisible by 5. */
  for (uint64_t step = 0; step < 20; step++) {
    wire_writer w = {0};
    REQUIRE(wire_writer_begin(&w, map.block_count, &err) == PS_ERR_OK);
    wire_key key = {1, 101, step};
    testlib_push_blocks(&w, &map, &key, job_config_hash(&job), grads, -1);
    rpc_call *first = testlib_handle(&ps, 1, w.parts, w.part_count, 1); /* waits for trainer 0 */
    REQUIRE(first != NULL);
    CHECK_EQ_INT(push(&ps, 0, step, grads, NULL), PS_ERR_OK);
    CHECK_EQ_INT(rpc_call_local_result(first)->code, PS_ERR_OK);
    rpc_call_local_free(first);
    wire_writer_free(&w);
    nanosleep(&(struct timespec){0, 2000000}, NULL); /* every interval covers time */
  }
  pserver_abort_waiting(&ps, PS_ERR_UNAVAILABLE, "test over");
  pserver_destroy(&ps);
  free(grads);
  REQUIRE(dup2(saved, STDERR_FILENO) >= 0);
  close(saved);
  FILE *f = fdopen(fd, "r");
  REQUIRE(f != NULL && fseek(f, 0, SEEK_SET) == 0);
  char line[1024];
  long steps[16];
  int lines = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    const char *at = strstr(line, "pushes/s");
    if (at == NULL) continue;
    const char *s = strstr(line, "step ");
    double rate = 0;
    REQUIRE(s != NULL && lines < 16);
    CHECK(sscanf(s, "step %ld: %lf pushes/s", &steps[lines], &rate) == 2);
    /* 2 pushes per step, at most a few ms each: between 1 and 1e6 per s. */
    if (!(rate >= 1 && rate < 1e6)) fprintf(stderr, "insane rate in: %s", line);
    CHECK(rate >= 1 && rate < 1e6);
    lines++;
  }
  fclose(f);
  unlink(path);
  CHECK_EQ_INT(lines, 4);
  for (int i = 0; i < lines; i++) CHECK_EQ_INT(steps[i], 5 * (i + 1));
}

int main(void) {
  ps_error err;
  rpc_global_init();
  make_job(UPDATE_SYNC);
  tensor_layout_init(&layout);
  REQUIRE(model_build_layout(&job.model, &layout, &err) == PS_ERR_OK);
  REQUIRE(shard_map_build(&map, &layout, job.block_size, 1, &err) == PS_ERR_OK);
  test_async_math();
  test_async_math_whole();
  test_stats_lines();
  shard_map_free(&map);
  tensor_layout_free(&layout);
  rpc_global_shutdown();
  return check_report("test_pserver_step");
}
