/* Pserver 0's shard queue (server/shard_queue.c): shards granted in order,
 * a push's position recording what came before it, a shard given back from
 * where it was trained (its trainer gone, or its lease passed), stale
 * reports not counted, "wait" while others hold the epoch's last shards,
 * the epoch's count exact, then the next epoch, then the job's end. */
#include <string.h>

#include "server/shard_queue.h"
#include "tests/check.h"

/* 1000 examples in shards of 4 x 64 = 256: three of 256 and one of 232. */
static void init(shard_queue *q, int trainers, int epochs) {
  ps_error err;
  job_config job = {.trainers = trainers, .batch = 64, .shard_steps = 4, .epoch_examples = 1000,
                    .epochs = epochs};
  REQUIRE(shard_queue_init(q, &job, 5.0, &err) == PS_ERR_OK);
  CHECK_EQ_INT(q->shards, 4);
}

static shard_grant next(shard_queue *q, int trainer, long epoch, long finished, double now) {
  ps_error err;
  shard_grant g;
  REQUIRE(shard_queue_next(q, trainer, epoch, finished >= 0, finished, now, &g, &err) ==
          PS_ERR_OK);
  return g;
}

static void push(shard_queue *q, int trainer, long epoch, long shard, long offset, int counted) {
  wire_position p = {(uint64_t)epoch, (uint64_t)shard, (uint64_t)offset};
  CHECK_EQ_INT(shard_queue_progress(q, trainer, &p, 0.0), counted);
}

static void test_order_and_end(void) {
  shard_queue q;
  init(&q, 2, 2);
  shard_grant a = next(&q, 0, 0, -1, 0), b = next(&q, 1, 0, -1, 0);
  CHECK_EQ_INT(a.answer, SHARD_ANSWER_GRANT);
  CHECK_EQ_INT(a.shard, 0);
  CHECK_EQ_INT(b.shard, 1);
  CHECK_EQ_INT(b.first, 256);
  CHECK_EQ_INT(b.end, 256);
  a = next(&q, 0, 0, 0, 0);
  CHECK_EQ_INT(a.shard, 2);
  a = next(&q, 0, 0, 2, 0);
  CHECK_EQ_INT(a.shard, 3);
  CHECK_EQ_INT(a.end, 232); /* the epoch's last examples */
  CHECK_EQ_INT(q.trained, 512);
  /* Every shard held or done: trainer 0 waits, then trainer 1 finishes. */
  shard_grant w = next(&q, 0, 0, 3, 0);
  CHECK_EQ_INT(w.answer, SHARD_ANSWER_WAIT);
  CHECK_EQ_INT(q.trained, 744);
  b = next(&q, 1, 0, 1, 0);
  CHECK_EQ_INT(b.answer, SHARD_ANSWER_EPOCH_DONE);
  CHECK_EQ_INT(b.epoch, 1);
  CHECK_EQ_INT(q.epoch, 1);
  CHECK_EQ_INT(q.trained, 0); /* the new epoch's */
  /* Epoch 2 by trainer 1 alone; trainer 0 learns its epoch ended. */
  for (long s = -1, k = 0; k < 4; k++) {
    b = next(&q, 1, 1, s, 0);
    CHECK_EQ_INT(b.answer, SHARD_ANSWER_GRANT);
    CHECK_EQ_INT(b.epoch, 1);
    s = b.shard;
    if (k == 3) CHECK_EQ_INT(next(&q, 1, 1, s, 0).answer, SHARD_ANSWER_JOB_DONE);
  }
  CHECK_EQ_INT(next(&q, 0, 0, -1, 0).answer, SHARD_ANSWER_JOB_DONE);
  shard_queue_free(&q);
}

static void test_given_back(void) {
  shard_queue q;
  init(&q, 2, 1);
  shard_grant a = next(&q, 0, 0, -1, 0);
  push(&q, 0, 0, a.shard, 0, 1);
  push(&q, 0, 0, a.shard, 64, 1);
  push(&q, 0, 0, a.shard, 128, 1); /* the batches before 128 were answered by every pserver */
  CHECK_EQ_INT(q.trained, 128);
  push(&q, 0, 0, 2, 0, 0);         /* a shard it does not hold */
  push(&q, 0, 0, a.shard, 64, 0);  /* going back */
  shard_queue_gone(&q, 0, "registered again");
  CHECK_EQ_INT(q.by_process[0], 0);
  CHECK_EQ_INT(q.trained_by[0], 128);
  shard_grant b = next(&q, 1, 0, -1, 0);
  CHECK_EQ_INT(b.shard, a.shard); /* first in line */
  CHECK_EQ_INT(b.offset, 128);
  CHECK_EQ_INT(b.end, 256);
  push(&q, 0, 0, a.shard, 192, 0); /* the gone one's late push: not counted */
  push(&q, 1, 0, b.shard, 192, 1);
  CHECK_EQ_INT(q.trained_by[1], 64);
  /* Its lease passes: back again from 192. */
  shard_queue_expire(&q, 4.0);
  CHECK_EQ_INT(q.held[1], b.shard);
  shard_queue_expire(&q, 5.5);
  CHECK_EQ_INT(q.held[1], -1);
  /* Finishing a shard it no longer holds counts nothing. */
  shard_grant c = next(&q, 1, 0, b.shard, 6.0);
  CHECK_EQ_INT(c.shard, b.shard);
  CHECK_EQ_INT(c.offset, 192);
  CHECK_EQ_INT(q.trained, 192);
  /* Everything trained once: 1000 exactly. */
  long s = c.shard;
  for (;;) {
    shard_grant g = next(&q, 1, 0, s, 7.0);
    if (g.answer != SHARD_ANSWER_GRANT) {
      CHECK_EQ_INT(g.answer, SHARD_ANSWER_JOB_DONE);
      break;
    }
    s = g.shard;
  }
  CHECK_EQ_INT(q.epoch, 1);
  CHECK_EQ_INT(q.trained, 1000);
  CHECK_EQ_INT(q.trained_by[0] + q.trained_by[1], 1000);
  shard_queue_free(&q);
}

static void test_refusals(void) {
  shard_queue q;
  init(&q, 1, 2);
  ps_error err;
  shard_grant g;
  CHECK_EQ_INT(shard_queue_next(&q, 0, 1, 0, 0, 0, &g, &err), PS_ERR_FAILED_PRECONDITION);
  CHECK_CONTAINS(err.msg, "asks for data of epoch 2; the queue hands out epoch 1");
  /* Asking again while holding one gives the held one back. */
  g = next(&q, 0, 0, -1, 0);
  shard_grant h = next(&q, 0, 0, -1, 0);
  CHECK_EQ_INT(h.shard, g.shard);
  CHECK_EQ_INT(q.returned, 1);
  shard_queue_free(&q);
}

int main(void) {
  test_order_and_end();
  test_given_back();
  test_refusals();
  return check_report("test_shard_queue");
}
