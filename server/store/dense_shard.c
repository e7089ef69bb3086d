/* Shard storage, initialization and the aggregated update. */
#include "server/store/dense_shard.h"

#include <string.h>

ps_err dense_shard_init(dense_shard *t, const job_config *job, int pserver, int slots,
                        ps_error *err) {
  memset(t, 0, sizeof *t);
  t->pserver = pserver;
  t->slots = slots;
  tensor_layout_init(&t->layout);
  tensor_layout_init(&t->storage);
  if (model_build_layout(&job->model, &t->layout, err) != PS_ERR_OK ||
      shard_map_build(&t->map, &t->layout, job->block_size, job->pservers, err) != PS_ERR_OK) {
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
      tensor_group_init(&t->group, &t->storage, 1, err) != PS_ERR_OK) {
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
    model_init_params(&job->model, &t->layout, job->seed, b->offset, b->count,
                      t->params + b->shard_offset);
  }
  return PS_ERR_OK;
}

void dense_shard_free(dense_shard *t) {
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

void dense_shard_apply_range(dense_shard *t, const optimizer_config *opt, const int *slots,
                             int count, float scale, long step, size_t offset, size_t n) {
  float sum[DENSE_SHARD_CHUNK];
  const optimizer_scalars s = optimizer_scalars_at(opt, step);
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
    optimizer_apply_scalars(opt->kind, &s, t->params + p, sum,
                            states >= 1 ? t->state1 + p : NULL,
                            states >= 2 ? t->state2 + p : NULL, len);
  }
}
