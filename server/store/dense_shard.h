/* A pserver's shard of the model: its blocks' parameters packed in one
 * array, the optimizer state beside them, and one gradient slot per trainer
 * (sync mode sums them in trainer order). One allocation. Not locked: the
 * caller (pserver.c) serializes access. */
#ifndef PSTRAIN_SERVER_TABLE_H
#define PSTRAIN_SERVER_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/job.h"
#include "common/shard_map.h"
#include "common/tensor.h"

/* A range of shard floats: {offset, count} in the packed shard. */
typedef struct dense_range {
  size_t offset, count;
} dense_range;

typedef struct dense_shard {
  int pserver;           /* this pserver's id in the map */
  tensor_layout layout;  /* the whole model's */
  shard_map map;
  size_t n;              /* floats in this shard */
  tensor_layout storage; /* params, state1, state2, grads (slots x n) */
  tensor_group group;
  float *params, *state1, *state2;
  float *grads; /* (slots, n) */
  int slots;
  /* The shard's floats of non-trainable tensors, which the optimizer skips
   * (they take the pushes' sum as a change):
   * ascending, adjacent ones merged; NULL when every tensor trains. */
  dense_range *frozen;
  size_t frozen_count;
} dense_shard;

/* Builds the layout and shard map of job, allocates this pserver's shard
 * and initializes its parameters from job->seed exactly as a whole model
 * would be (model_init_params). slots: gradient slots (trainers in sync
 * mode, 1 in async). */
ps_err dense_shard_init(dense_shard *t, const job_config *job, int pserver, int slots,
                        ps_error *err);
/* The same over a layout the caller built (each tensor's init rule and
 * trainable flag as it says); the shard takes it over and leaves *layout
 * empty, even on error. */
ps_err dense_shard_init_layout(dense_shard *t, tensor_layout *layout, size_t block_size,
                               int pservers, int pserver, int slots, uint64_t seed,
                               ps_error *err);
void dense_shard_free(dense_shard *t);

/* The gradient slot of `slot` (n floats). */
static inline float *dense_shard_slot(dense_shard *t, int slot) {
  return t->grads + (size_t)slot * t->n;
}

/* Floats per piece of dense_shard_apply_sum's single pass (4 KiB on the stack). */
#define DENSE_SHARD_CHUNK 1024

/* Sums the gradient slots listed in `slots` (count of them, in that order),
 * scales by `scale` (when not 1), and applies the optimizer at zero-based
 * step `step`, in one pass of DENSE_SHARD_CHUNK-float pieces. The slots are only
 * read. Non-trainable tensors' floats (t->frozen) take the slots' sum as a
 * change, unscaled and without the optimizer (model.h: batch norm's running
 * statistics); their optimizer state stays zero. */
void dense_shard_apply_sum(dense_shard *t, const optimizer_config *opt, const int *slots,
                           int count, float scale, long step);

/* dense_shard_apply_sum over the n floats from shard offset `offset` only, with
 * the same per-element math (an overlapped step applies a part's blocks). */
void dense_shard_apply_range(dense_shard *t, const optimizer_config *opt, const int *slots,
                             int count, float scale, long step, size_t offset, size_t n);

#endif
