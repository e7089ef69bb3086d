/* Shard storage, initialization and the aggregated update. */
#include "server/store/dense_shard.h"

#include <stdlib.h>
#include <string.h>

/* Collects this pserver's blocks of non-trainable tensors as merged shard
 * ranges (blocks are packed in ascending offset order). */
static ps_err find_frozen(dense_shard *t, ps_error *err) {
  for (size_t i = 0; i < t->map.block_count; i++) {
    const shard_block *b = &t->map.blocks[i];
    if (b->pserver != t->pserver || t->layout.tensors[b->tensor].trainable) continue;
    dense_range *last = t->frozen_count > 0 ? &t->frozen[t->frozen_count - 1] : NULL;
    if (last != NULL && last->offset + last->count == b->shard_offset) {
      last->count += b->count;
      continue;
    }
    dense_range *grown = realloc(t->frozen, (t->frozen_count + 1) * sizeof *grown);
    if (grown == NULL) {
      return ps_error_set(err, PS_ERR_NO_MEMORY, "dense shard: out of memory for its ranges");
    }
    t->frozen = grown;
    t->frozen[t->frozen_count++] = (dense_range){b->shard_offset, b->count};
  }
  return PS_ERR_OK;
}

ps_err dense_shard_init(dense_shard *t, const job_config *job, int pserver, int slots,
                        ps_error *err) {
  tensor_layout layout;
  tensor_layout_init(&layout);
  if (model_build_layout(&job->model, &layout, err) != PS_ERR_OK) {
    tensor_layout_free(&layout);
    memset(t, 0, sizeof *t);
    return err->code;
  }
  return dense_shard_init_layout(t, &layout, job->block_size, job->pservers, pserver, slots,
                                 job->seed, err);
}

ps_err dense_shard_init_layout(dense_shard *t, tensor_layout *layout, size_t block_size,
                               int pservers, int pserver, int slots, uint64_t seed,
                               ps_error *err) {
  memset(t, 0, sizeof *t);
  t->pserver = pserver;
  t->slots = slots;
  t->layout = *layout;
  tensor_layout_init(layout);
  tensor_layout_init(&t->storage);
  if (shard_map_build(&t->map, &t->layout, block_size, pservers, err) != PS_ERR_OK) {
    dense_shard_free(t);
    return err->code;
  }
  t->n = t->map.shard_floats[pserver];
  long n = t->n > 0 ? (long)t->n : 1;
  long grads_shape[2] = {slots, n};
  if (tensor_layout_add(&t->storage, "params", 1, &n, err) != PS_ERR_OK ||
      tensor_layout_add(&t->storage, "state1", 1, &n, err) != PS_ERR_OK ||
      tensor_layout_add(&t->storage, "state2", 1, &n, err) != PS_ERR_OK ||
      tensor_layout_add(&t->storage, "grads", 2, grads_shape, err) != PS_ERR_OK ||
      tensor_group_init(&t->group, &t->storage, 1, err) != PS_ERR_OK ||
      find_frozen(t, err) != PS_ERR_OK) {
    dense_shard_free(t);
    return err->code;
  }
  t->params = tensor_group_tensor(&t->group, 0, 0);
  t->state1 = tensor_group_tensor(&t->group, 0, 1);
  t->state2 = tensor_group_tensor(&t->group, 0, 2);
  t->grads = tensor_group_tensor(&t->group, 0, 3);
  for (size_t i = 0; i < t->map.block_count; i++) {
    const shard_block *b = &t->map.blocks[i];
    if (b->pserver != pserver) continue;
    model_init_params(&t->layout, seed, b->offset, b->count, t->params + b->shard_offset);
  }
  return PS_ERR_OK;
}

void dense_shard_free(dense_shard *t) {
  free(t->frozen);
  tensor_group_free(&t->group);
  tensor_layout_free(&t->storage);
  shard_map_free(&t->map);
  tensor_layout_free(&t->layout);
  memset(t, 0, sizeof *t);
}

/* One pass over the shard: each chunk of DENSE_SHARD_CHUNK floats is summed (slots
 * in the order given), scaled and applied while it is in L1. Per element the
 * operations and their order are those of summing whole slots, scaling, then
 * optimizer_apply: the results are the same bits (test_table_fused). */
void dense_shard_apply_sum(dense_shard *t, const optimizer_config *opt, const int *slots,
                           int count, float scale, long step) {
  dense_shard_apply_range(t, opt, slots, count, scale, step, 0, t->n);
}

/* The fused pass over shard floats [offset, offset + n), all trainable. */
static void apply_trainable(dense_shard *t, const optimizer_config *opt,
                            const optimizer_scalars *s, const int *slots, int count, float scale,
                            size_t offset, size_t n) {
  float sum[DENSE_SHARD_CHUNK];
  int states = optimizer_state_per_param(opt->kind);
  const float *first = dense_shard_slot(t, slots[0]) + offset;
  for (size_t at = 0; at < n; at += DENSE_SHARD_CHUNK) {
    size_t len = n - at < DENSE_SHARD_CHUNK ? n - at : DENSE_SHARD_CHUNK;
    memcpy(sum, first + at, len * sizeof *sum);
    for (int k = 1; k < count; k++) {
      const float *restrict g = dense_shard_slot(t, slots[k]) + offset + at;
      for (size_t i = 0; i < len; i++) sum[i] += g[i];
    }
    if (scale != 1.0f) {
      for (size_t i = 0; i < len; i++) sum[i] *= scale;
    }
    size_t p = offset + at;
    optimizer_apply_scalars(opt->kind, s, t->params + p, sum,
                            states >= 1 ? t->state1 + p : NULL,
                            states >= 2 ? t->state2 + p : NULL, len);
  }
}

/* Non-trainable floats (batch norm's running statistics): the pushes carry
 * changes, from one trainer, zeros from the rest; their sum is added as it
 * is, neither scaled nor stepped. */
static void apply_frozen(dense_shard *t, const int *slots, int count, size_t offset, size_t n) {
  for (size_t i = offset; i < offset + n; i++) {
    float sum = dense_shard_slot(t, slots[0])[i];
    for (int k = 1; k < count; k++) sum += dense_shard_slot(t, slots[k])[i];
    t->params[i] += sum;
  }
}

/* The math is per element, so cutting the range around the frozen ones
 * gives the trainable floats the same bits as one pass. */
void dense_shard_apply_range(dense_shard *t, const optimizer_config *opt, const int *slots,
                             int count, float scale, long step, size_t offset, size_t n) {
  const optimizer_scalars s = optimizer_scalars_at(opt, step);
  size_t at = offset, end = offset + n;
  for (size_t f = 0; f < t->frozen_count && at < end; f++) {
    const dense_range *r = &t->frozen[f];
    if (r->offset + r->count <= at) continue;
    if (r->offset >= end) break;
    if (r->offset > at) apply_trainable(t, opt, &s, slots, count, scale, at, r->offset - at);
    size_t lo = r->offset > at ? r->offset : at, hi = r->offset + r->count < end ? r->offset + r->count : end;
    apply_frozen(t, slots, count, lo, hi - lo);
    at = r->offset + r->count;
  }
  if (at < end) apply_trainable(t, opt, &s, slots, count, scale, at, end - at);
}
