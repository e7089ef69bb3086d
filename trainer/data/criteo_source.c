/* Criteo TSV as a data source, the next batch read ahead (see criteo_source.h). */
#define _POSIX_C_SOURCE 200809L
#include "trainer/data/criteo_source.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "trainer/job_progress.h"

#define FIELDS CRITEO_CAT_FIELDS

/* One batch's buffers; the source has two that trade places. */
typedef struct batch_bufs {
  ctr_example *examples; /* (batch) */
  uint64_t *keys;        /* (batch, 26) */
  uint32_t *slot;        /* (batch, 26) */
  sparse_dedup dedup;
  int count;
} batch_bufs;

typedef enum { AHEAD_IDLE, AHEAD_WORK, AHEAD_DONE, AHEAD_QUIT } ahead_state;

typedef struct criteo_source {
  data_source base;
  const char *path;
  int id, trainers; /* this trainer takes blocks id, id + trainers, ... */
  ctr_reader *reader;
  batch_bufs cur, ahead;
  /* Where the reader is: in the pass of epoch pos_epoch, past pos_off steps'
   * batches (those asked of the thread included). */
  long pos_epoch, pos_off;
  long asked; /* the step whose batch the thread reads or holds; -1: none */
  /* the read-ahead thread: reads into `ahead` after a rewind if `rewind` */
  int rewind;
  ps_err rc;
  ps_error err;
  ahead_state state;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int started;
} criteo_source;

ps_err criteo_dedup(const ctr_example *examples, int count, uint64_t *keys, uint32_t *slot,
                    sparse_dedup *d, ps_error *err) {
  for (int i = 0; i < count; i++) {
    memcpy(keys + (size_t)i * FIELDS, examples[i].keys, sizeof examples[i].keys);
  }
  return sparse_dedup_run(d, keys, (size_t)count * FIELDS, slot, err);
}

/* The next `batch` examples of the reader into b, deduplicated. */
static ps_err read_batch(criteo_source *s, batch_bufs *b, int rewind, ps_error *err) {
  b->count = 0;
  if (rewind && ctr_reader_rewind(s->reader, err) != PS_ERR_OK) return err->code;
  int count = 0;
  if (ctr_reader_next(s->reader, b->examples, (int)s->base.batch, &count, err) != PS_ERR_OK) {
    return err->code;
  }
  if (count > 0 && criteo_dedup(b->examples, count, b->keys, b->slot, &b->dedup, err) != PS_ERR_OK) {
    return err->code;
  }
  b->count = count;
  return PS_ERR_OK;
}

static void *ahead_main(void *arg) {
  criteo_source *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (s->state == AHEAD_IDLE || s->state == AHEAD_DONE) pthread_cond_wait(&s->cv, &s->mu);
    if (s->state == AHEAD_QUIT) break;
    pthread_mutex_unlock(&s->mu);
    ps_err rc = read_batch(s, &s->ahead, s->rewind, &s->err);
    pthread_mutex_lock(&s->mu);
    s->rc = rc;
    s->state = AHEAD_DONE;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Waits for the thread's batch (of s->asked); its status. */
static ps_err wait_ahead(criteo_source *s, ps_error *err) {
  pthread_mutex_lock(&s->mu);
  while (s->state == AHEAD_WORK) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  if (s->rc != PS_ERR_OK) {
    *err = s->err;
    return s->rc;
  }
  return PS_ERR_OK;
}

/* The thread's batch taken (into cur) or dropped; the thread idle. */
static ps_err finish_ahead(criteo_source *s, int take, ps_error *err) {
  ps_err rc = wait_ahead(s, err);
  pthread_mutex_lock(&s->mu);
  s->state = AHEAD_IDLE;
  pthread_mutex_unlock(&s->mu);
  s->asked = -1;
  if (rc != PS_ERR_OK || !take) return rc;
  batch_bufs t = s->cur;
  s->cur = s->ahead;
  s->ahead = t;
  return PS_ERR_OK;
}

/* Step's batch read here, in line: the reader moved to it first (a resumed
 * run, a job gone back, the first step). */
static ps_err seek_and_read(criteo_source *s, long step, ps_error *err) {
  const long epoch = step / s->base.steps_per_epoch, off = step % s->base.steps_per_epoch;
  int rewind = s->pos_epoch != epoch || s->pos_off > off;
  if (rewind) {
    if (ctr_reader_rewind(s->reader, err) != PS_ERR_OK) return err->code;
    s->pos_epoch = epoch;
    s->pos_off = 0;
  }
  for (long n = (off - s->pos_off) * s->base.batch; n > 0;) { /* the steps before it */
    int count = 0, want = n < s->base.batch ? (int)n : (int)s->base.batch;
    if (ctr_reader_next(s->reader, s->cur.examples, want, &count, err) != PS_ERR_OK) {
      return err->code;
    }
    if (count == 0) break;
    n -= count;
  }
  s->pos_off = off + 1;
  return read_batch(s, &s->cur, 0, err);
}

/* The thread starts on step's batch, rewinding the reader first when step
 * begins an epoch. */
static void ask_ahead(criteo_source *s, long step) {
  const long epoch = step / s->base.steps_per_epoch;
  pthread_mutex_lock(&s->mu);
  s->rewind = s->pos_epoch != epoch;
  s->state = AHEAD_WORK;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  s->pos_epoch = epoch;
  s->pos_off = step % s->base.steps_per_epoch + 1;
  s->asked = step;
}

static ps_err criteo_batch(data_source *d, long step, data_batch *out, ps_error *err) {
  criteo_source *s = (criteo_source *)d;
  if (step < 0 || step >= d->total_steps) {
    return ps_error_set(err, PS_ERR_INTERNAL, "data: step %ld is outside the job's 0..%ld", step,
                        d->total_steps - 1);
  }
  if (s->asked == step) {
    if (finish_ahead(s, 1, err) != PS_ERR_OK) return err->code;
  } else {
    if (s->asked >= 0) { /* the job went back: that batch is not the next */
      ps_error dropped;
      (void)finish_ahead(s, 0, &dropped); /* a bad line in it comes again when read again */
    }
    if (seek_and_read(s, step, err) != PS_ERR_OK) return err->code;
  }
  if (step + 1 < d->total_steps) ask_ahead(s, step + 1);
  *out = (data_batch){.size = s->cur.count, .examples = s->cur.examples, .slot = s->cur.slot,
                      .dedup = &s->cur.dedup};
  return PS_ERR_OK;
}

static ps_err criteo_keys_ahead(data_source *d, long step, const sparse_dedup **keys,
                                ps_error *err) {
  criteo_source *s = (criteo_source *)d;
  if (s->asked != step) return PS_ERR_OK;
  if (wait_ahead(s, err) != PS_ERR_OK) return err->code;
  *keys = s->ahead.count > 0 ? &s->ahead.dedup : NULL;
  return PS_ERR_OK;
}

/* Shard: the block of --batch lines the step reads; offset 0 (a block is
 * one step's batch). */
static void criteo_position(const data_source *d, long step, data_position *out) {
  const criteo_source *s = (const criteo_source *)d;
  *out = (data_position){.epoch = step / d->steps_per_epoch,
                         .shard = (step % d->steps_per_epoch) * s->trainers + s->id,
                         .offset = 0};
}

static void criteo_log_end(data_source *d) {
  criteo_source *s = (criteo_source *)d;
  long bad = ctr_reader_bad_lines(s->reader);
  if (bad > 0) LOG_WARN("skipped %ld malformed lines of %s (--skip-bad-lines)", bad, s->path);
}

static void bufs_free(batch_bufs *b) {
  sparse_dedup_free(&b->dedup);
  free(b->examples);
  free(b->keys);
  free(b->slot);
}

static void criteo_destroy(data_source *d) {
  criteo_source *s = (criteo_source *)d;
  if (s->started) {
    pthread_mutex_lock(&s->mu);
    while (s->state == AHEAD_WORK) pthread_cond_wait(&s->cv, &s->mu);
    s->state = AHEAD_QUIT;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
  }
  if (s->reader != NULL) ctr_reader_close(s->reader);
  bufs_free(&s->cur);
  bufs_free(&s->ahead);
  free(s);
}

static const data_source_ops criteo_ops = {
    .name = "criteo",
    .batch = criteo_batch,
    .keys_ahead = criteo_keys_ahead,
    .position = criteo_position,
    .log_end = criteo_log_end,
    .destroy = criteo_destroy,
};

static int bufs_alloc(batch_bufs *b, long batch) {
  sparse_dedup_init(&b->dedup);
  size_t keys = (size_t)batch * FIELDS;
  b->examples = calloc((size_t)batch, sizeof *b->examples);
  b->keys = calloc(keys, sizeof *b->keys);
  b->slot = calloc(keys, sizeof *b->slot);
  return b->examples != NULL && b->keys != NULL && b->slot != NULL;
}

/* The read-ahead thread, its lock and the two buffer sets. */
static ps_err start_ahead(criteo_source *s, ps_error *err) {
  if (!bufs_alloc(&s->cur, s->base.batch) || !bufs_alloc(&s->ahead, s->base.batch)) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory for batches of %ld", s->base.batch);
  }
  int e = pthread_mutex_init(&s->mu, NULL);
  if (e == 0 && (e = pthread_cond_init(&s->cv, NULL)) != 0) pthread_mutex_destroy(&s->mu);
  if (e == 0 && (e = pthread_create(&s->thread, NULL, ahead_main, s)) != 0) {
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
  }
  if (e != 0) {
    return ps_error_set(err, PS_ERR_INTERNAL, "starting the batch read-ahead thread: %s",
                        strerror(e));
  }
  s->started = 1;
  return PS_ERR_OK;
}

ps_err criteo_source_create(data_source **out, const char *path, const ctr_reader_options *opt,
                            long examples_per_epoch, int trainers, long batch, long epochs,
                            long max_steps, ps_error *err) {
  *out = NULL;
  criteo_source *s = calloc(1, sizeof *s);
  if (s == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "data: out of memory");
  s->base.ops = &criteo_ops;
  s->base.batch = batch;
  long global_batch = batch * trainers;
  s->base.steps_per_epoch = (examples_per_epoch + global_batch - 1) / global_batch;
  s->base.total_steps = job_total_steps(s->base.steps_per_epoch, epochs, max_steps);
  s->path = path;
  s->id = (int)opt->shard_index;
  s->trainers = trainers;
  s->asked = -1;
  if (ctr_reader_open(&s->reader, path, opt, err) != PS_ERR_OK ||
      start_ahead(s, err) != PS_ERR_OK) {
    criteo_destroy(&s->base);
    return err->code;
  }
  *out = &s->base;
  return PS_ERR_OK;
}
