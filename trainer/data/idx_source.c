/* IDX images with the seeded sampler as a data source (see idx_source.h). */
#include "trainer/data/idx_source.h"

#include <stdlib.h>

#include "trainer/job_progress.h"
#include "trainer/data/sampler.h"
#include "trainer/trainer_config.h"

typedef struct idx_source {
  data_source base;
  const dataset *train;
  sampler order;
  long per_epoch; /* samples trained per epoch: equal on every trainer, so sync steps line up */
  long epoch; /* whose permutation order holds; -1: none yet */
  float *inputs;
  int32_t *labels;
} idx_source;

/* A resumed run or a job gone back starts mid-epoch: the permutation is the
 * epoch's, so the step's place in it puts the data where it was. */
static ps_err idx_batch(data_source *d, long step, data_batch *out, ps_error *err) {
  idx_source *s = (idx_source *)d;
  long epoch = step / d->steps_per_epoch;
  if (step < 0 || step >= d->total_steps) {
    return ps_error_set(err, PS_ERR_INTERNAL, "data: step %ld is outside the job's 0..%ld", step,
                        d->total_steps - 1);
  }
  if (epoch != s->epoch) {
    sampler_start_epoch(&s->order, epoch);
    s->epoch = epoch;
  }
  long first = (step % d->steps_per_epoch) * d->batch;
  long left = s->per_epoch - first;
  int count = (int)(left < d->batch ? left : d->batch);
  sampler_gather(s->train, s->order.order + first, count, s->inputs, s->labels);
  *out = (data_batch){.size = count, .inputs = s->inputs, .labels = s->labels};
  return PS_ERR_OK;
}

/* Shard: this trainer's share of the epoch's permutation; offset: the
 * step's first sample in it. */
static void idx_position(const data_source *d, long step, data_position *out) {
  const idx_source *s = (const idx_source *)d;
  *out = (data_position){.epoch = step / d->steps_per_epoch, .shard = s->order.id,
                         .offset = (step % d->steps_per_epoch) * d->batch};
}

static void idx_destroy(data_source *d) {
  idx_source *s = (idx_source *)d;
  sampler_free(&s->order);
  free(s);
}

static const data_source_ops idx_ops = {
    .name = "idx", .batch = idx_batch, .position = idx_position, .destroy = idx_destroy};

ps_err idx_source_create(data_source **out, const dataset *train, uint64_t seed, int id,
                         int trainers, long batch, long epochs, long max_steps, float *inputs,
                         int32_t *labels, ps_error *err) {
  *out = NULL;
  if (train->count < trainers) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "%ld training samples cannot be shared by %d trainers", train->count,
                        trainers);
  }
  idx_source *s = calloc(1, sizeof *s);
  if (s == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "data: out of memory");
  if (sampler_init(&s->order, seed, train->count, id, trainers, err) != PS_ERR_OK) {
    free(s);
    return err->code;
  }
  s->base.ops = &idx_ops;
  s->base.batch = batch;
  s->per_epoch = train->count / trainers;
  s->base.steps_per_epoch = (s->per_epoch + batch - 1) / batch;
  s->base.total_steps = job_total_steps(s->base.steps_per_epoch, epochs, max_steps);
  s->train = train;
  s->epoch = -1;
  s->inputs = inputs;
  s->labels = labels;
  *out = &s->base;
  return PS_ERR_OK;
}

long idx_source_per_epoch(const data_source *d) { return ((const idx_source *)d)->per_epoch; }

/* --- the test set's evaluation batches --------------------------------------------- */

typedef struct idx_eval {
  data_source base;
  const dataset *test;
  long *indices; /* (TRAINER_EVAL_BATCH) */
  float *inputs;
  int32_t *labels;
} idx_eval;

static ps_err idx_eval_batch(data_source *d, long k, data_batch *out, ps_error *err) {
  (void)err;
  idx_eval *s = (idx_eval *)d;
  long start = k * d->batch, total = s->test->count;
  int count = start >= total ? 0 : (int)(total - start < d->batch ? total - start : d->batch);
  for (int i = 0; i < count; i++) s->indices[i] = start + i;
  if (count > 0) sampler_gather(s->test, s->indices, count, s->inputs, s->labels);
  *out = (data_batch){.size = count, .inputs = s->inputs, .labels = s->labels};
  return PS_ERR_OK;
}

static void idx_eval_destroy(data_source *d) {
  idx_eval *s = (idx_eval *)d;
  free(s->indices);
  free(s);
}

static const data_source_ops idx_eval_ops = {
    .name = "idx-eval", .batch = idx_eval_batch, .destroy = idx_eval_destroy};

ps_err idx_eval_create(data_source **out, const dataset *test, float *inputs, int32_t *labels,
                       ps_error *err) {
  *out = NULL;
  idx_eval *s = calloc(1, sizeof *s);
  long *indices = malloc(TRAINER_EVAL_BATCH * sizeof *indices);
  if (s == NULL || indices == NULL) {
    free(s);
    free(indices);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "evaluation data: out of memory");
  }
  s->base.ops = &idx_eval_ops;
  s->base.batch = TRAINER_EVAL_BATCH;
  s->base.steps_per_epoch = (test->count + TRAINER_EVAL_BATCH - 1) / TRAINER_EVAL_BATCH;
  s->base.total_steps = s->base.steps_per_epoch;
  s->test = test;
  s->indices = indices;
  s->inputs = inputs;
  s->labels = labels;
  *out = &s->base;
  return PS_ERR_OK;
}
