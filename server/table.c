/* Shard storage, initialization and the aggregated update. */
#include "server/table.h"

#include <string.h>

ps_err table_init(table *t, const job_config *job, int pserver, int slots, ps_error *err) {
  memset(t, 0, sizeof *t);
  t->pserver = pserver;
  t->slots = slots;
  tensor_layout_init(&t->layout);
  tensor_layout_init(&t->storage);
  if (model_build_layout(&job->model, &t->layout, err) != PS_ERR_OK ||
      shard_map_build(&t->map, &t->layout, job->block_size, job->pservers, err) != PS_ERR_OK) {
    table_free(t);
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
    table_free(t);
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

void table_free(table *t) {
  tensor_group_free(&t->group);
  tensor_layout_free(&t->storage);
  shard_map_free(&t->map);
  tensor_layout_free(&t->layout);
  memset(t, 0, sizeof *t);
}

void table_apply_sum(table *t, const optimizer_config *opt, const int *slots, int count,
                     float scale, long step) {
  float *restrict sum = table_slot(t, slots[0]);
  for (int s = 1; s < count; s++) {
    const float *restrict g = table_slot(t, slots[s]);
    for (size_t i = 0; i < t->n; i++) sum[i] += g[i];
  }
  if (scale != 1.0f) {
    for (size_t i = 0; i < t->n; i++) sum[i] *= scale;
  }
  int states = optimizer_state_per_param(opt->kind);
  optimizer_apply(opt, step, t->params, sum, states >= 1 ? t->state1 : NULL,
                  states >= 2 ? t->state2 : NULL, t->n);
}

void table_apply_sum_range(table *t, const optimizer_config *opt, const int *slots, int count,
                           float scale, long step, size_t offset, size_t n) {
  float *restrict sum = table_slot(t, slots[0]) + offset;
  for (int s = 1; s < count; s++) {
    const float *restrict g = table_slot(t, slots[s]) + offset;
    for (size_t i = 0; i < n; i++) sum[i] += g[i];
  }
  if (scale != 1.0f) {
    for (size_t i = 0; i < n; i++) sum[i] *= scale;
  }
  int states = optimizer_state_per_param(opt->kind);
  optimizer_apply(opt, step, t->params + offset, sum, states >= 1 ? t->state1 + offset : NULL,
                  states >= 2 ? t->state2 + offset : NULL, n);
}
