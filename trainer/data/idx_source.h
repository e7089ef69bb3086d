/* IDX images as a data source (data_source.h): each epoch every trainer
 * computes the same seeded permutation and takes its strided share
 * (sampler.h); step s of an epoch is the share's s-th run of `batch`
 * samples, gathered into the model's input buffers. */
#ifndef PSTRAIN_TRAINER_DATA_IDX_SOURCE_H
#define PSTRAIN_TRAINER_DATA_IDX_SOURCE_H

#include "trainer/data/data_source.h"
#include "trainer/data/idx.h"

/* train is borrowed and must outlive the source; batches are gathered into
 * inputs (batch, channels * rows * cols) and labels (batch). Trainer id
 * of `trainers`. */
ps_err idx_source_create(data_source **out, const dataset *train, uint64_t seed, int id,
                         int trainers, long batch, long epochs, long max_steps, float *inputs,
                         int32_t *labels, ps_error *err);

/* The test set's evaluation batches (TRAINER_EVAL_BATCH each, in order;
 * size 0 past the end), gathered into inputs and labels; test is borrowed. */
ps_err idx_eval_create(data_source **out, const dataset *test, float *inputs, int32_t *labels,
                       ps_error *err);

/* Samples each trainer trains per epoch (the data over the trainers, rounded down). */
long idx_source_per_epoch(const data_source *d);

#endif
