/* Handed-out data as a data source (see handed_source.h). */
#define _POSIX_C_SOURCE 200809L
#include "trainer/data/handed_source.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"

typedef struct handed_source {
  data_source base;
  data_source *inner;
  data_shard_fn next_shard;
  void *ctx;
  long epoch;       /* the trainer's */
  data_shard shard; /* held when answer is DATA_SHARD_GRANT */
  int holds;
  long next;        /* examples into the shard the next batch begins at */
  long step;        /* the step whose batch was read last (-1: none) */
  data_position at; /* ... and where it begins */
} handed_source;

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Asks pserver 0 until it grants a shard or says the epoch or job is over
 * (it answers wait while other trainers hold the epoch's last shards:
 * their leases bound that). *over: DATA_MORE with a shard held, or why not. */
static ps_err ask(handed_source *s, int *over, ps_error *err) {
  long finished = s->holds ? s->shard.shard : -1; /* its last push was answered */
  s->holds = 0;
  double since = now_s(), logged = since;
  for (;;) {
    data_shard a;
    PS_TRY(s->next_shard(s->ctx, s->epoch, finished, &a, err));
    finished = -1; /* said */
    if (a.answer == DATA_SHARD_GRANT) {
      s->shard = a;
      s->holds = 1;
      s->next = a.offset;
      *over = DATA_MORE;
      if (a.epoch < s->epoch) {
        /* A pserver restarted from a checkpoint of the epoch before: this
         * one ends, that one is trained on from the shard held. */
        LOG_WARN("handed-out data: the job went back to epoch %ld (a pserver restarted from a "
                 "checkpoint of it): epoch %ld ends here", a.epoch + 1, s->epoch + 1);
        s->epoch = a.epoch;
        *over = DATA_EPOCH_OVER;
      }
      return PS_ERR_OK;
    }
    if (a.answer == DATA_SHARD_EPOCH_DONE || a.answer == DATA_SHARD_JOB_DONE) {
      *over = a.answer == DATA_SHARD_JOB_DONE ? DATA_JOB_OVER : DATA_EPOCH_OVER;
      if (a.answer == DATA_SHARD_EPOCH_DONE) s->epoch = a.epoch;
      return PS_ERR_OK;
    }
    double now = now_s();
    if (now - logged >= 10) {
      LOG_INFO("waiting %.0f s for other trainers to finish epoch %ld's last shards", now - since,
               s->epoch + 1);
      logged = now;
    }
    sleep_s(a.wait_s);
  }
}

/* The inner source's step of the batch at s->next in the shard held. */
static long inner_step(const handed_source *s) {
  long first = s->shard.first + s->next;
  return s->shard.epoch * s->inner->steps_per_epoch + first / s->base.batch;
}

static ps_err handed_batch(data_source *d, long step, data_batch *out, ps_error *err) {
  handed_source *s = (handed_source *)d;
  if (s->step >= 0 && step != s->step + 1) {
    return ps_error_set(err, PS_ERR_INTERNAL,
                        "handed-out data: step %ld after step %ld (the data goes forward only)",
                        step, s->step);
  }
  if (!s->holds || s->next >= s->shard.end) {
    int over = DATA_MORE;
    PS_TRY(ask(s, &over, err));
    if (over != DATA_MORE) {
      *out = (data_batch){.over = over};
      return PS_ERR_OK;
    }
  }
  PS_TRY(data_source_batch(s->inner, inner_step(s), out, err));
  s->step = step;
  s->at = (data_position){.epoch = s->shard.epoch, .shard = s->shard.shard, .offset = s->next};
  long left = s->shard.end - s->next;
  s->next += left < d->batch ? left : d->batch;
  return PS_ERR_OK;
}

/* Within the shard the next batch is the inner source's next step (read
 * ahead); past its end the next shard is not known yet. */
static ps_err handed_keys_ahead(data_source *d, long step, const sparse_dedup **keys,
                                ps_error *err) {
  handed_source *s = (handed_source *)d;
  if (step != s->step + 1 || !s->holds || s->next >= s->shard.end) return PS_ERR_OK;
  return data_source_keys_ahead(s->inner, inner_step(s), keys, err);
}

static void handed_position(const data_source *d, long step, data_position *out) {
  const handed_source *s = (const handed_source *)d;
  if (step == s->step) *out = s->at;
}

static void handed_log_end(data_source *d) { data_source_log_end(((handed_source *)d)->inner); }

static void handed_destroy(data_source *d) {
  handed_source *s = (handed_source *)d;
  data_source_destroy(s->inner);
  free(s);
}

static const data_source_ops handed_ops = {
    .name = "handed",
    .batch = handed_batch,
    .keys_ahead = handed_keys_ahead,
    .position = handed_position,
    .log_end = handed_log_end,
    .destroy = handed_destroy,
};

ps_err handed_source_create(data_source **out, data_source *inner, data_shard_fn next_shard,
                            void *ctx, long steps_per_epoch, long epochs, ps_error *err) {
  *out = NULL;
  handed_source *s = calloc(1, sizeof *s);
  if (s == NULL) {
    data_source_destroy(inner);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "data: out of memory");
  }
  s->base.ops = &handed_ops;
  s->base.batch = inner->batch;
  s->base.steps_per_epoch = steps_per_epoch;
  /* The fixed split's, for progress lines: the data decides when a trainer
   * is done (a faster one takes more steps). */
  s->base.total_steps = steps_per_epoch * epochs;
  s->inner = inner;
  s->next_shard = next_shard;
  s->ctx = ctx;
  s->step = -1;
  *out = &s->base;
  return PS_ERR_OK;
}

long handed_source_epoch(const data_source *d) { return ((const handed_source *)d)->epoch; }

void handed_source_give_up(data_source *d) {
  handed_source *s = (handed_source *)d;
  s->holds = 0; /* not said finished: pserver 0 hands its rest out again */
  s->step = -1;
}
