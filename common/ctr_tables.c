#include "common/ctr_tables.h"

#include <stdio.h>
#include <string.h>

int ctr_table_count(const model_desc *model) {
  switch (model->kind) {
  case MODEL_CTR: return 2;
  case MODEL_LR: return 1;
  default: return 0;
  }
}

void ctr_table_config(const job_config *job, int table, size_t max_bytes,
                      sparse_table_config *out) {
  memset(out, 0, sizeof *out);
  int wide = table == CTR_TABLE_WIDE;
  snprintf(out->name, sizeof out->name, "%s", wide ? "wide" : "embedding");
  out->id = (uint32_t)table;
  out->dim = wide ? 1 : job->model.embed_dim;
  out->seed = job->seed;
  out->init_scale = wide ? 0.0f : CTR_EMBED_INIT;
  out->opt = job_sparse_optimizer(&job->sparse);
  out->max_bytes = max_bytes;
  out->admit_after = (int)job->sparse.admit_after;
  out->evict_after = job->sparse.evict_after;
}
