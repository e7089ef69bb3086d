/* The data-source interface: the batch of each job step for this trainer,
 * whatever the format and wherever it comes from, so the training loop only
 * asks for "step s". A source knows its share of the data (the trainer's
 * shard), the epochs (steps_per_epoch steps each) and how to get back to any
 * step (resume, or a job that went back after a pserver recovery): a step
 * that does not follow the last one is found by seeking. A source may read
 * ahead; the next step's distinct keys are then known before that step
 * (pserver mode sends them with this step's push). One caller thread.
 *
 * Implementations: idx_source.c (IDX images with the seeded sampler),
 * criteo_source.c (Criteo TSV through the reader thread, the next batch read
 * and deduplicated on a thread of its own). */
#ifndef PSTRAIN_TRAINER_DATA_DATA_SOURCE_H
#define PSTRAIN_TRAINER_DATA_DATA_SOURCE_H

#include <stdint.h>

#include "common/criteo.h"
#include "common/error.h"
#include "common/sparse_table.h"

/* A batch that is not there (handed-out data): the trainer's epoch, or the
 * job, has every example trained. */
enum { DATA_MORE = 0, DATA_EPOCH_OVER = 1, DATA_JOB_OVER = 2 };

/* One step's batch, valid until the next call on its source. */
typedef struct data_batch {
  int size;                    /* examples: 0 where the data ran out (bad lines skipped) */
  int over;                    /* DATA_MORE, or no batch: DATA_EPOCH_OVER, DATA_JOB_OVER */
  float *inputs;               /* classifiers: (size, width), scaled to [0, 1] */
  int32_t *labels;             /* classifiers: (size) */
  ctr_example *examples;       /* Criteo: (size) */
  uint32_t *slot;              /* Criteo: (size, 26) each key's index among the distinct */
  const sparse_dedup *dedup;   /* Criteo: the distinct keys and their counts */
} data_batch;

typedef struct data_source data_source;

/* Where a step's batch begins in the data, as a (shard, offset) pair in an
 * epoch's pass: the data is cut into shards (IDX: each trainer's strided
 * share of the epoch's permutation; Criteo: the file's blocks of --batch
 * lines, trainer r of N taking r, r+N, ...) and the batch starts `offset`
 * examples into its shard. Today a trainer's shards follow from its id;
 * elastic trainers will be handed shards, and a position is what moves. */
typedef struct data_position {
  long epoch;
  long shard;
  long offset;
} data_position;

/* Handed-out data (--shard-steps): what pserver 0 answers a trainer asking
 * for data. A grant is examples [first + offset, first + end) of epoch's
 * order (those before offset trained already). */
typedef enum {
  DATA_SHARD_GRANT = 0, /* proto ShardAnswer's values */
  DATA_SHARD_WAIT = 1,  /* every shard of the epoch is held: ask again after wait_s */
  DATA_SHARD_EPOCH_DONE = 2, /* the trainer's epoch is trained; go on in `epoch` */
  DATA_SHARD_JOB_DONE = 3,
} data_shard_answer;

typedef struct data_shard {
  data_shard_answer answer;
  long epoch, shard, offset, end, first;
  double wait_s;
} data_shard;

/* Asks for data: the trainer is in epoch `epoch`; finished >= 0: it trained
 * that shard to its end (its last push answered by every pserver). */
typedef ps_err (*data_shard_fn)(void *ctx, long epoch, long finished, data_shard *out,
                                ps_error *err);

typedef struct data_source_ops {
  const char *name;
  /* The batch of zero-based job step `step` into *out. */
  ps_err (*batch)(data_source *d, long step, data_batch *out, ps_error *err);
  /* The distinct keys of step's batch when it was read ahead (*keys NULL
   * when not: no step follows, or the format has no keys). Waits for it. */
  ps_err (*keys_ahead)(data_source *d, long step, const sparse_dedup **keys, ps_error *err);
  /* Where step's batch begins (a step of the job, not read). NULL: the
   * source has no positions (evaluation batches). */
  void (*position)(const data_source *d, long step, data_position *out);
  /* Logs what the run's data came to (bad lines skipped, ...). NULL: nothing. */
  void (*log_end)(data_source *d);
  void (*destroy)(data_source *d);
} data_source_ops;

/* Implementations put this first in their own struct. */
struct data_source {
  const data_source_ops *ops;
  long batch;           /* examples per step of this trainer */
  long steps_per_epoch; /* equal on every trainer, so sync steps line up */
  long total_steps;     /* of the job: nothing is read beyond */
};

static inline ps_err data_source_batch(data_source *d, long step, data_batch *out, ps_error *err) {
  return d->ops->batch(d, step, out, err);
}
static inline ps_err data_source_keys_ahead(data_source *d, long step, const sparse_dedup **keys,
                                            ps_error *err) {
  *keys = NULL;
  return d->ops->keys_ahead != NULL ? d->ops->keys_ahead(d, step, keys, err) : PS_ERR_OK;
}
/* Position of step's batch; all -1 where the source has none. */
static inline data_position data_source_position(const data_source *d, long step) {
  data_position p = {-1, -1, -1};
  if (d->ops->position != NULL) d->ops->position(d, step, &p);
  return p;
}
static inline void data_source_log_end(data_source *d) {
  if (d->ops->log_end != NULL) d->ops->log_end(d);
}
static inline void data_source_destroy(data_source *d) {
  if (d != NULL) d->ops->destroy(d);
}

#endif
