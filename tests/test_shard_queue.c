/* Pserver 0's shard queue (server/shard_queue.c): shards granted in order,
 * a push's position recording what came before it, a shard given back from
 * where it was trained (its trainer gone, or its lease passed), stale
 * reports not counted, "wait" while others hold the epoch's last shards,
 * the epoch's count exact, then the next epoch, then the job's end; the
 * queue saved for a checkpoint and loaded again, a trainer taking up the
 * shard it pushes from when nobody holds it; a process gone after its
 * epoch ended counted for that epoch. */
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
  REQUIRE(shard_queue_next(q, trainer, epoch, finished >= 0, finished, 1, now, &g, &err) ==
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
  init(&q, 3, 1);
  shard_grant a = next(&q, 0, 0, -1, 0);
  push(&q, 0, 0, a.shard, 0, 1);
  push(&q, 0, 0, a.shard, 64, 1);
  push(&q, 0, 0, a.shard, 128, 1); /* the batches before 128 were answered by every pserver */
  CHECK_EQ_INT(q.trained, 128);
  shard_grant x = next(&q, 2, 0, -1, 0);
  CHECK_EQ_INT(x.shard, 1);
  push(&q, 0, 0, x.shard, 0, 0);   /* a shard another trainer holds */
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
  /* Leases pass (trainer 1 pushed at 0.0, trainer 2 never): both shards go back. */
  shard_queue_expire(&q, 4.0);
  CHECK_EQ_INT(q.held[1], b.shard);
  shard_queue_expire(&q, 5.5);
  CHECK_EQ_INT(q.held[1], -1);
  CHECK_EQ_INT(q.held[2], -1);
  /* Nobody took trainer 1's shard since: finishing it counts (it was stalled, not gone). */
  shard_grant c = next(&q, 1, 0, b.shard, 6.0);
  CHECK_EQ_INT(q.trained, 256);
  CHECK_EQ_INT(c.shard, x.shard);
  CHECK_EQ_INT(c.offset, 0);
  push(&q, 2, 0, x.shard, 64, 0); /* trainer 2 back: trainer 1 holds its shard now */
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
  CHECK_EQ_INT(q.trained_by[0] + q.trained_by[1] + q.trained_by[2], 1000);
  shard_queue_free(&q);
}

/* A checkpoint's text and back; a trainer that went on after the
 * checkpoint takes up the shard it pushes from. */
static void test_saved_and_loaded(void) {
  ps_error err;
  shard_queue q, r;
  char text[256];
  init(&q, 2, 2);
  shard_grant a = next(&q, 0, 0, -1, 0), b = next(&q, 1, 0, -1, 0);
  push(&q, 0, 0, a.shard, 128, 1);
  b = next(&q, 1, 0, b.shard, 0); /* shard 1 done; trainer 1 on shard 2 */
  push(&q, 1, 0, b.shard, 64, 1);
  REQUIRE(shard_queue_save(&q, text, sizeof text, &err) == PS_ERR_OK);
  CHECK_EQ_STR(text, "epoch=0 returned=0 done=2 partial=0:128:0;2:64:1;");
  CHECK_EQ_INT(shard_queue_save(&q, text, 20, &err), PS_ERR_OUT_OF_RANGE);
  CHECK_CONTAINS(err.msg, "use a larger --shard-steps");
  REQUIRE(shard_queue_save(&q, text, sizeof text, &err) == PS_ERR_OK);
  init(&r, 2, 2);
  REQUIRE(shard_queue_load(&r, text, 100.0, &err) == PS_ERR_OK);
  CHECK_EQ_INT(r.trained, 128 + 256 + 64);
  CHECK_EQ_INT(r.done, 1);
  CHECK_EQ_INT(r.held[0], 0);
  CHECK_EQ_INT(r.held[1], 2);
  /* Trainer 0 had finished shard 0 and gone on to shard 3 before pserver 0 went down. */
  push(&r, 0, 0, 3, 128, 1);
  CHECK_EQ_INT(r.held[0], 3);
  CHECK_EQ_INT(r.owner[0], -1);
  CHECK_EQ_INT(r.returned, 1);
  CHECK_EQ_INT(r.trained, 128 + 256 + 64 + 128);
  shard_grant g = next(&r, 1, 0, -1, 100.0); /* trainer 1 gives shard 2 up: shard 0 first */
  CHECK_EQ_INT(g.shard, 0);
  CHECK_EQ_INT(g.offset, 128);
  /* Bad texts are refused, saying why (the pserver then does not start). */
  CHECK_EQ_INT(shard_queue_load(&r, "epoch=7 returned=0 done=0 partial=", 0, &err),
               PS_ERR_CORRUPT_DATA);
  CHECK_EQ_INT(shard_queue_load(&r, "epoch=0 returned=0 done=00 partial=", 0, &err),
               PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "one bit per shard");
  CHECK_EQ_INT(shard_queue_load(&r, "epoch=0 returned=0 done=0 partial=1:300:0;", 0, &err),
               PS_ERR_CORRUPT_DATA);
  CHECK_EQ_INT(shard_queue_load(&r, "epoch=0 returned=0 done=0 partial=1:3:0;2:3:0;", 0, &err),
               PS_ERR_CORRUPT_DATA);
  /* The job's end saves as no shards. */
  shard_queue_free(&q);
  init(&q, 1, 1);
  for (long s = -1;;) {
    shard_grant h = next(&q, 0, 0, s, 0);
    if (h.answer != SHARD_ANSWER_GRANT) break;
    s = h.shard;
  }
  REQUIRE(shard_queue_save(&q, text, sizeof text, &err) == PS_ERR_OK);
  CHECK_EQ_STR(text, "epoch=1 returned=0 done=0 partial=");
  shard_queue_free(&r);
  init(&r, 1, 1);
  REQUIRE(shard_queue_load(&r, text, 0, &err) == PS_ERR_OK);
  CHECK_EQ_INT(next(&r, 0, 0, -1, 0).answer, SHARD_ANSWER_JOB_DONE);
  shard_queue_free(&q);
  shard_queue_free(&r);
}

static void test_refusals(void) {
  shard_queue q;
  init(&q, 1, 2);
  ps_error err;
  shard_grant g;
  CHECK_EQ_INT(shard_queue_next(&q, 0, 1, 0, 0, 1, 0, &g, &err), PS_ERR_FAILED_PRECONDITION);
  CHECK_CONTAINS(err.msg, "asks for data of epoch 2; the queue hands out epoch 1");
  /* Asking again while holding one gives the held one back. */
  g = next(&q, 0, 0, -1, 0);
  shard_grant h = next(&q, 0, 0, -1, 0);
  CHECK_EQ_INT(h.shard, g.shard);
  CHECK_EQ_INT(q.returned, 1);
  /* An elastic job below its minimum: the trainer waits, whatever is free. */
  shard_grant w;
  REQUIRE(shard_queue_next(&q, 0, 0, 0, 0, 0, 0, &w, &err) == PS_ERR_OK);
  CHECK_EQ_INT(w.answer, SHARD_ANSWER_WAIT);
  CHECK_EQ_INT(q.held[0], -1);
  CHECK_EQ_INT(q.owner[h.shard], -1);
  shard_queue_free(&q);
}

/* A process gone after the epoch it trained in ended, before it heard so:
 * what it applied of that epoch is counted for it (its row never came); a
 * trainer told the epoch ended reports its own. */
static void test_gone_after_epoch(void) {
  shard_queue q;
  init(&q, 2, 2);
  shard_grant a = next(&q, 0, 0, -1, 0);
  shard_grant b = next(&q, 0, 0, a.shard, 0); /* trainer 0 trained shard 0, holds shard 1 */
  CHECK_EQ_INT(q.by_process[0], 256);
  shard_queue_release(&q, 0, "sent nothing for its lease");
  for (long s = -1, k = 0; k < 4; k++) { /* trainer 1 trains shards 1 to 3 */
    shard_grant g = next(&q, 1, 0, s, 0);
    if (k == 3) {
      CHECK_EQ_INT(g.answer, SHARD_ANSWER_EPOCH_DONE);
      break;
    }
    CHECK_EQ_INT(g.shard, b.shard + k);
    s = g.shard;
  }
  CHECK_EQ_INT(q.epoch, 1);
  CHECK_EQ_INT(q.unreported[0], 256);
  CHECK_EQ_INT(q.unreported_epoch[0], 0);
  CHECK_EQ_INT(q.unreported[1], 0); /* told: its row says it */
  shard_queue_gone(&q, 0, "silent three leases holding no shard");
  CHECK_EQ_INT(q.unreported[0], 0);
  CHECK_EQ_INT(q.by_process[0], 0);
  shard_queue_free(&q);
}

int main(void) {
  test_order_and_end();
  test_given_back();
  test_gone_after_epoch();
  test_saved_and_loaded();
  test_refusals();
  return check_report("test_shard_queue");
}
