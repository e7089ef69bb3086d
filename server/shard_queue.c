/* The shard queue of pserver 0 (see shard_queue.h). */
#define _POSIX_C_SOURCE 200809L
#include "server/shard_queue.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"

/* Examples in shard s of an epoch. */
static long shard_size(const shard_queue *q, long s) {
  long first = s * q->shard_examples, left = q->epoch_examples - first;
  return left < q->shard_examples ? left : q->shard_examples;
}

static void start_epoch(shard_queue *q) {
  for (long s = 0; s < q->shards; s++) {
    q->offset[s] = 0;
    q->owner[s] = -1;
    q->returned_at[s] = 0;
  }
  for (int t = 0; t < q->trainers; t++) {
    q->held[t] = -1;
    q->trained_by[t] = 0;
    q->by_process[t] = 0;
  }
  q->trained = q->done = q->returned = 0;
}

ps_err shard_queue_init(shard_queue *q, const job_config *job, double lease_s, ps_error *err) {
  memset(q, 0, sizeof *q);
  q->epochs = job->epochs;
  q->trainers = job->trainers;
  q->epoch_examples = job->epoch_examples;
  q->shard_examples = (long)job->shard_steps * job->batch;
  q->shards = (q->epoch_examples + q->shard_examples - 1) / q->shard_examples;
  q->lease_s = lease_s;
  q->offset = calloc((size_t)q->shards, sizeof *q->offset);
  q->owner = calloc((size_t)q->shards, sizeof *q->owner);
  q->returned_at = calloc((size_t)q->shards, sizeof *q->returned_at);
  q->held = calloc((size_t)q->trainers, sizeof *q->held);
  q->deadline = calloc((size_t)q->trainers, sizeof *q->deadline);
  q->trained_by = calloc((size_t)q->trainers, sizeof *q->trained_by);
  q->by_process = calloc((size_t)q->trainers, sizeof *q->by_process);
  q->unreported = calloc((size_t)q->trainers, sizeof *q->unreported);
  q->unreported_epoch = calloc((size_t)q->trainers, sizeof *q->unreported_epoch);
  if (q->offset == NULL || q->owner == NULL || q->returned_at == NULL || q->held == NULL ||
      q->deadline == NULL || q->trained_by == NULL || q->by_process == NULL ||
      q->unreported == NULL || q->unreported_epoch == NULL) {
    shard_queue_free(q);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "the shard queue: out of memory for %ld shards",
                        q->shards);
  }
  start_epoch(q);
  LOG_INFO("shards: %ld examples per epoch in %ld shards of %ld, %d epochs, handed out here "
           "(lease %.1f s)", q->epoch_examples, q->shards, q->shard_examples, q->epochs, lease_s);
  return PS_ERR_OK;
}

void shard_queue_free(shard_queue *q) {
  free(q->offset);
  free(q->owner);
  free(q->returned_at);
  free(q->held);
  free(q->deadline);
  free(q->trained_by);
  free(q->by_process);
  free(q->unreported);
  free(q->unreported_epoch);
  memset(q, 0, sizeof *q);
}

/* Records shard s trained up to offset (by trainer). */
static void record(shard_queue *q, int trainer, long s, long offset) {
  long more = offset - q->offset[s];
  q->offset[s] = offset;
  q->trained += more;
  q->trained_by[trainer] += more;
  q->by_process[trainer] += more;
}

/* Every shard of the epoch trained: the counts logged, the next epoch's queue. */
static void end_epoch(shard_queue *q) {
  char by[512];
  size_t n = 0;
  by[0] = '\0';
  for (int t = 0; t < q->trainers && n < sizeof by; t++) {
    int w = snprintf(by + n, sizeof by - n, "%s%d: %ld", t > 0 ? ", " : "", t, q->trained_by[t]);
    if (w < 0) break;
    n += (size_t)w;
  }
  LOG_INFO("shards: epoch %ld trained: %ld examples of %ld (%ld shards, %ld returned to the "
           "queue; by trainer %s)",
           q->epoch + 1, q->trained, q->epoch_examples, q->shards, q->returned, by);
  /* Each trainer reports this epoch once it hears it ended (EPOCH_DONE);
   * until then a process gone is counted for it. A trainer that applied
   * nothing of it keeps what it had not reported of an earlier one. */
  for (int t = 0; t < q->trainers; t++) {
    if (q->by_process[t] == 0) continue;
    q->unreported[t] = q->by_process[t];
    q->unreported_epoch[t] = q->epoch;
  }
  q->epoch++;
  if (q->epoch < q->epochs) start_epoch(q);
}

void shard_queue_release(shard_queue *q, int trainer, const char *why) {
  long s = q->held[trainer];
  if (s < 0) return;
  q->held[trainer] = -1;
  q->owner[s] = -1;
  q->returned++;
  q->returned_at[s] = now_s();
  LOG_WARN("shards: trainer %d %s: shard %ld of epoch %ld goes back to the queue at example %ld "
           "of %ld", trainer, why, s, q->epoch + 1, q->offset[s], shard_size(q, s));
}

void shard_queue_gone(shard_queue *q, int trainer, const char *why) {
  shard_queue_release(q, trainer, why);
  if (q->unreported[trainer] > 0) {
    LOG_INFO("shards: trainer %d's process applied %ld examples of epoch %ld (counted)", trainer,
             q->unreported[trainer], q->unreported_epoch[trainer] + 1);
    q->unreported[trainer] = 0;
  }
  if (q->epoch < q->epochs) {
    LOG_INFO("shards: trainer %d's process applied %ld examples of epoch %ld (counted)",
             trainer, q->by_process[trainer], q->epoch + 1);
  }
  q->by_process[trainer] = 0;
}

void shard_queue_renew(shard_queue *q, int trainer, double now) {
  if (q->held[trainer] >= 0) q->deadline[trainer] = now + q->lease_s;
}

void shard_queue_expire(shard_queue *q, double now) {
  for (int t = 0; t < q->trainers; t++) {
    if (q->held[t] >= 0 && now > q->deadline[t]) {
      char why[96];
      snprintf(why, sizeof why, "sent nothing for its lease of %.1f s (gone, or stalled)",
               q->lease_s);
      shard_queue_gone(q, t, why);
    }
  }
}

/* Whether shard s of epoch may be taken up by whoever trained it from
 * `offset`: nobody holds it and it is trained no further than that. */
static int free_from(const shard_queue *q, uint64_t epoch, uint64_t s, uint64_t offset) {
  return epoch == (uint64_t)q->epoch && s < (uint64_t)q->shards && q->owner[s] < 0 &&
         (uint64_t)q->offset[s] <= offset && offset <= (uint64_t)shard_size(q, (long)s) &&
         q->offset[s] < shard_size(q, (long)s);
}

/* Trainer goes on with shard s, which nobody holds: pserver 0 came back
 * from a checkpoint older than the trainer's shard, or the trainer's lease
 * passed and nobody took its shard since. Its own shard, if another, goes back. */
static void take_up(shard_queue *q, int trainer, long s, long offset) {
  if (q->held[trainer] >= 0) shard_queue_release(q, trainer, "went on with another shard");
  q->owner[s] = trainer;
  q->held[trainer] = s;
  q->returned_at[s] = 0;
  LOG_INFO("shards: trainer %d goes on with shard %ld of epoch %ld from example %ld (nobody held "
           "it: pserver 0 restarted, or the trainer's lease had passed)", trainer, s,
           q->epoch + 1, offset);
}

int shard_queue_progress(shard_queue *q, int trainer, const wire_position *p, double now) {
  if ((uint64_t)q->held[trainer] != p->shard && free_from(q, p->epoch, p->shard, p->offset)) {
    take_up(q, trainer, (long)p->shard, (long)p->offset);
  }
  long s = q->held[trainer];
  if (s < 0 || (uint64_t)s != p->shard || (uint64_t)q->epoch != p->epoch ||
      p->offset < (uint64_t)q->offset[s] || p->offset > (uint64_t)shard_size(q, s)) {
    LOG_WARN("shards: trainer %d pushed a batch at shard %llu of epoch %llu, example %llu, which "
             "another trainer holds or trained: not counted", trainer,
             (unsigned long long)p->shard, (unsigned long long)p->epoch + 1,
             (unsigned long long)p->offset);
    return 0;
  }
  record(q, trainer, s, (long)p->offset);
  q->deadline[trainer] = now + q->lease_s;
  return 1;
}

/* The first shard of the epoch nobody holds with examples left. */
static long free_shard(const shard_queue *q) {
  for (long s = 0; s < q->shards; s++) {
    if (q->owner[s] < 0 && q->offset[s] < shard_size(q, s)) return s;
  }
  return -1;
}

ps_err shard_queue_next(shard_queue *q, int trainer, long trainer_epoch, int finished,
                        long finished_shard, int may_grant, double now, shard_grant *out,
                        ps_error *err) {
  memset(out, 0, sizeof *out);
  if (trainer_epoch > q->epoch && q->epoch < q->epochs) { /* refused: nothing changes */
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "trainer %d asks for data of epoch %ld; the queue hands out epoch %ld",
                        trainer, trainer_epoch + 1, q->epoch + 1);
  }
  long held = q->held[trainer];
  if (finished && held != finished_shard && finished_shard >= 0 &&
      free_from(q, (uint64_t)trainer_epoch, (uint64_t)finished_shard,
                (uint64_t)shard_size(q, finished_shard < q->shards ? finished_shard : 0))) {
    take_up(q, trainer, finished_shard, q->offset[finished_shard]);
    held = finished_shard;
  }
  if (finished && held >= 0 && held == finished_shard && trainer_epoch == q->epoch) {
    record(q, trainer, held, shard_size(q, held));
    q->owner[held] = -1;
    q->held[trainer] = -1;
    if (++q->done == q->shards) end_epoch(q);
  } else {
    if (finished) {
      LOG_WARN("shards: trainer %d finished shard %ld of epoch %ld, which another trainer holds "
               "or trained: not counted", trainer, finished_shard, trainer_epoch + 1);
    }
    /* A trainer asks when it is done with its shard: one it holds goes back. */
    if (held >= 0) shard_queue_release(q, trainer, "asked for another shard");
  }
  out->epoch = q->epoch;
  if (q->epoch >= q->epochs || trainer_epoch < q->epoch) {
    /* The trainer ends its epoch: its own row says what it applied. */
    if (q->unreported_epoch[trainer] <= trainer_epoch) q->unreported[trainer] = 0;
    out->answer = q->epoch >= q->epochs ? SHARD_ANSWER_JOB_DONE : SHARD_ANSWER_EPOCH_DONE;
    return PS_ERR_OK;
  }
  long s = may_grant ? free_shard(q) : -1;
  if (s < 0) {
    out->answer = SHARD_ANSWER_WAIT; /* the last shards are being trained */
    return PS_ERR_OK;
  }
  q->owner[s] = trainer;
  q->held[trainer] = s;
  q->deadline[trainer] = now + q->lease_s;
  if (q->returned_at[s] > 0) {
    LOG_INFO("shards: trainer %d takes shard %ld of epoch %ld from example %ld, %.3f s after it "
             "went back to the queue", trainer, s, q->epoch + 1, q->offset[s],
             now_s() - q->returned_at[s]);
    q->returned_at[s] = 0;
  }
  *out = (shard_grant){.answer = SHARD_ANSWER_GRANT, .epoch = q->epoch, .shard = s,
                       .offset = q->offset[s], .end = shard_size(q, s),
                       .first = s * q->shard_examples};
  return PS_ERR_OK;
}

/* --- checkpoints ------------------------------------------------------------------ */

/* Appends to buf at *at; 0 when it does not fit. */
static int put(char *buf, size_t len, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int put(char *buf, size_t len, size_t *at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = *at < len ? vsnprintf(buf + *at, len - *at, fmt, ap) : -1;
  va_end(ap);
  if (n < 0 || (size_t)n >= len - *at) return 0;
  *at += (size_t)n;
  return 1;
}

ps_err shard_queue_save(const shard_queue *q, char *buf, size_t len, ps_error *err) {
  size_t at = 0;
  int over = q->epoch >= q->epochs; /* every epoch trained: no shards to say */
  int ok = put(buf, len, &at, "epoch=%ld returned=%ld done=", q->epoch, q->returned);
  for (long s = 0; s < q->shards && ok; s += 4) {
    unsigned bits = 0;
    for (long k = 0; k < 4 && s + k < q->shards && !over; k++) {
      if (q->offset[s + k] == shard_size(q, s + k)) bits |= 1u << k;
    }
    ok = put(buf, len, &at, "%x", bits);
  }
  ok = ok && put(buf, len, &at, " partial=");
  for (long s = 0; s < q->shards && ok && !over; s++) {
    if (q->offset[s] > 0 && q->offset[s] < shard_size(q, s)) {
      ok = put(buf, len, &at, "%ld:%ld:%d;", s, q->offset[s], q->owner[s]);
    } else if (q->owner[s] >= 0 && q->offset[s] == 0) {
      ok = put(buf, len, &at, "%ld:0:%d;", s, q->owner[s]);
    }
  }
  if (!ok) {
    return ps_error_set(err, PS_ERR_OUT_OF_RANGE,
                        "the shard queue (%ld shards) needs more than %zu bytes of a "
                        "checkpoint's metadata: use a larger --shard-steps", q->shards, len);
  }
  return PS_ERR_OK;
}

static ps_err bad_text(ps_error *err, const char *why) {
  return ps_error_set(err, PS_ERR_CORRUPT_DATA, "the checkpoint's shard queue: %s", why);
}

ps_err shard_queue_load(shard_queue *q, const char *text, double now, ps_error *err) {
  long epoch, returned;
  int used = 0;
  if (sscanf(text, "epoch=%ld returned=%ld done=%n", &epoch, &returned, &used) != 2 || used == 0) {
    return bad_text(err, "no epoch, returned count or done shards");
  }
  if (epoch < 0 || epoch > q->epochs || returned < 0) return bad_text(err, "epoch out of range");
  const char *p = text + used;
  long digits = (q->shards + 3) / 4;
  if ((long)strspn(p, "0123456789abcdef") != digits || p[digits] != ' ') {
    return bad_text(err, "the done shards are not one bit per shard of this job");
  }
  start_epoch(q);
  for (int t = 0; t < q->trainers; t++) q->unreported[t] = 0;
  q->epoch = epoch;
  q->returned = returned;
  for (long s = 0; s < q->shards; s++) {
    char c = p[s / 4];
    unsigned bits = (unsigned)(c <= '9' ? c - '0' : c - 'a' + 10);
    if (bits & 1u << (s % 4)) {
      q->offset[s] = shard_size(q, s);
      q->trained += q->offset[s];
      q->done++;
    }
  }
  p += digits;
  if (strncmp(p, " partial=", 9) != 0) return bad_text(err, "no part-trained shards");
  p += 9;
  while (*p != '\0') {
    long s, offset;
    int owner, n = 0;
    if (sscanf(p, "%ld:%ld:%d;%n", &s, &offset, &owner, &n) != 3 || n == 0) {
      return bad_text(err, "a part-trained shard is not SHARD:OFFSET:OWNER;");
    }
    if (s < 0 || s >= q->shards || offset < 0 || offset >= shard_size(q, s) || q->offset[s] != 0 ||
        owner < -1 || owner >= q->trainers || (owner >= 0 && q->held[owner] >= 0)) {
      return bad_text(err, "a part-trained shard out of range, twice, or a trainer holding two");
    }
    q->offset[s] = offset;
    q->trained += offset;
    if (owner >= 0) {
      q->owner[s] = owner;
      q->held[owner] = s;
      q->deadline[owner] = now + q->lease_s;
    }
    p += n;
  }
  if (q->epoch == q->epochs && (q->trained != 0 || q->done != 0)) {
    return bad_text(err, "shards after the last epoch");
  }
  if (q->epoch == q->epochs) {
    LOG_INFO("shards: resumed with every epoch's data trained");
  } else {
    LOG_INFO("shards: epoch %ld resumed: %ld examples of %ld trained, %ld of %ld shards done",
             q->epoch + 1, q->trained, q->epoch_examples, q->done, q->shards);
  }
  return PS_ERR_OK;
}
