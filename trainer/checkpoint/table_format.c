/* Checkpoints of a model with tables (format "pstrain-ctr-1", ctr-step-N):
 * the dense parameters and their optimizer state, and each table's keys,
 * rows, row optimizer state and row meta, in one safetensors file; and the
 * --export of any model: its dense tensors by name and each table's keys
 * and rows. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/checkpoint/formats.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/log.h"

#define CTR_FORMAT "pstrain-ctr-1"
#define CTR_PREFIX "ctr-step-"
/* Dense tensors, and four per table. */
#define MAX_PARTS (2 + 2 * 4)

/* A table's snapshot, ascending keys (so equal tables write equal bytes). */
typedef struct table_dump {
  size_t rows;
  int dim, state_floats;
  uint64_t *keys;
  float *values, *state;
  int64_t *meta;
} table_dump;

static void table_dump_free(table_dump *d) {
  free(d->keys);
  free(d->values);
  free(d->state);
  free(d->meta);
  memset(d, 0, sizeof *d);
}

static ps_err table_dump_take(const sparse_table *table, int with_state, table_dump *d,
                              ps_error *err) {
  memset(d, 0, sizeof *d);
  sparse_table_stats st;
  sparse_table_stats_get(table, &st);
  const sparse_table_config *c = sparse_table_config_of(table);
  d->rows = st.rows;
  d->dim = c->dim;
  d->state_floats = with_state ? sparse_table_state_floats(c) : 0;
  size_t n = d->rows > 0 ? d->rows : 1;
  d->keys = malloc(n * sizeof *d->keys);
  d->values = malloc(n * (size_t)d->dim * sizeof *d->values);
  d->state = d->state_floats > 0 ? malloc(n * (size_t)d->state_floats * sizeof *d->state) : NULL;
  d->meta = with_state ? malloc(n * 2 * sizeof *d->meta) : NULL;
  if (d->keys == NULL || d->values == NULL || (d->state_floats > 0 && d->state == NULL) ||
      (with_state && d->meta == NULL)) {
    table_dump_free(d);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "table %s: out of memory for a copy of %zu rows",
                        c->name, st.rows);
  }
  if (sparse_table_dump(table, d->keys, d->values, d->state, d->meta, err) != PS_ERR_OK) {
    table_dump_free(d);
    return err->code;
  }
  return PS_ERR_OK;
}

/* The job of the checkpoint: one process with the global batch (collective
 * checkpoints resume in local mode). */
static void local_job(const trainer *t, job_config *job) {
  trainer_job(t, job);
  job->batch = t->settings.opt.batch * t->trainers;
  job->trainers = 1;
}

ps_err table_checkpoint_write(trainer *t, long step, ps_error *err) {
  size_t n = t->model->layout.total;
  float *dense = malloc(3 * n * sizeof *dense);
  if (dense == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "checkpoint: out of memory");
  table_dump dumps[MODEL_TABLES_MAX];
  memset(dumps, 0, sizeof dumps);
  sparse_table *const *tables = t->tables;
  safetensors_tensor parts[MAX_PARTS];
  int count = 0;
  ps_err rc = model_get_params(t->model, dense, err);
  if (rc == PS_ERR_OK) rc = model_get_state(t->model, dense + n, err);
  parts[count++] = safetensors_tensor_of("dense", "params", SAFETENSORS_F32, n, 0, dense);
  parts[count++] = safetensors_tensor_of("dense", "state", SAFETENSORS_F32, 2 * n, 0, dense + n);
  for (int i = 0; i < t->model->tables && rc == PS_ERR_OK; i++) {
    if ((rc = table_dump_take(tables[i], 1, &dumps[i], err)) != PS_ERR_OK) break;
    const char *name = sparse_table_config_of(tables[i])->name;
    table_dump *d = &dumps[i];
    parts[count++] = safetensors_tensor_of(name, "keys", SAFETENSORS_U64, d->rows, 0, d->keys);
    parts[count++] = safetensors_tensor_of(name, "values", SAFETENSORS_F32,
        d->rows, d->dim, d->values);
    if (d->state_floats > 0) {
      parts[count++] = safetensors_tensor_of(name, "state", SAFETENSORS_F32,
          d->rows, d->state_floats, d->state);
    }
    parts[count++] = safetensors_tensor_of(name, "meta", SAFETENSORS_I64, d->rows, 2, d->meta);
  }
  if (rc == PS_ERR_OK) {
    job_config job;
    local_job(t, &job);
    /* The tables' settings are part of the job (its "sparse=[...]"). */
    const char *extra[] = {"trainers", "1", "mode", "local", NULL};
    rc = checkpoint_write_tensors(t->settings.opt.checkpoint_dir, CTR_PREFIX, CTR_FORMAT, step,
                                  &job, extra, parts, count, err);
  }
  for (int i = 0; i < MODEL_TABLES_MAX; i++) table_dump_free(&dumps[i]);
  free(dense);
  return rc;
}

/* Checks a tensor's dtype and shape; rows < 0 takes the file's. */
static const safetensors_tensor *find(const safetensors_file *f, const char *path,
                                      const char *table, const char *what,
                                      safetensors_dtype dtype, long rows, long cols,
                                      ps_error *err) {
  char name[TENSOR_NAME_MAX];
  snprintf(name, sizeof name, "%s.%s", table, what);
  const safetensors_tensor *p = safetensors_file_find(f, name);
  int rank = cols > 0 ? 2 : 1;
  if (p == NULL || p->dtype != dtype || p->rank != rank || (rows >= 0 && p->shape[0] != rows) ||
      (cols > 0 && p->shape[1] != cols)) {
    ps_error_set(err, PS_ERR_CORRUPT_DATA,
                 "--resume: %s: tensor %s is missing or has another dtype or shape", path, name);
    return NULL;
  }
  return p;
}

static ps_err load_table(sparse_table *table, const safetensors_file *f, const char *path,
                         ps_error *err) {
  const sparse_table_config *c = sparse_table_config_of(table);
  int state_floats = sparse_table_state_floats(c);
  const safetensors_tensor *keys = find(f, path, c->name, "keys", SAFETENSORS_U64, -1, 0, err);
  if (keys == NULL) return err->code;
  long rows = keys->shape[0];
  const safetensors_tensor *values =
      find(f, path, c->name, "values", SAFETENSORS_F32, rows, c->dim, err);
  const safetensors_tensor *state =
      values == NULL || state_floats == 0
          ? NULL
          : find(f, path, c->name, "state", SAFETENSORS_F32, rows, state_floats, err);
  const safetensors_tensor *meta =
      values == NULL || (state_floats > 0 && state == NULL)
          ? NULL
          : find(f, path, c->name, "meta", SAFETENSORS_I64, rows, 2, err);
  if (meta == NULL) return err->code;
  if (sparse_table_load(table, (size_t)rows, keys->data, values->data,
                        state != NULL ? state->data : NULL, meta->data, err) != PS_ERR_OK) {
    return ps_error_set(err, err->code, "--resume: %s: %s", path, err->msg);
  }
  return PS_ERR_OK;
}

ps_err table_checkpoint_resume(trainer *t, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  char path[4096];
  job_config job;
  safetensors_meta meta;
  long step = 0;
  local_job(t, &job);
  if (checkpoint_resume_open(o->checkpoint_dir, CTR_PREFIX, CTR_FORMAT, "CTR", o->resume_step,
                             &job, path, sizeof path, &step, &meta, err) != PS_ERR_OK) {
    return err->code;
  }
  safetensors_file f;
  if (safetensors_file_read(path, &f, err) != PS_ERR_OK) {
    return ps_error_set(err, err->code, "--resume: %s", err->msg);
  }
  size_t n = t->model->layout.total;
  const safetensors_tensor *params =
      find(&f, path, "dense", "params", SAFETENSORS_F32, (long)n, 0, err);
  const safetensors_tensor *state =
      params == NULL ? NULL
                     : find(&f, path, "dense", "state", SAFETENSORS_F32, 2 * (long)n, 0, err);
  ps_err rc = state == NULL ? err->code : PS_ERR_OK;
  for (int i = 0; i < t->model->tables && rc == PS_ERR_OK; i++) {
    rc = load_table(t->tables[i], &f, path, err);
  }
  if (rc == PS_ERR_OK) rc = model_set_params(t->model, params->data, err);
  if (rc == PS_ERR_OK) rc = model_set_state(t->model, state->data, err);
  safetensors_file_free(&f);
  if (rc != PS_ERR_OK) return rc;
  t->start_step = step;
  LOG_INFO("resuming from %s at step %ld", path, step);
  return PS_ERR_OK;
}

ps_err trainer_checkpoint_export(trainer *t, const char *path, ps_error *err) {
  const tensor_layout *layout = &t->model->layout;
  float *dense = malloc((layout->total > 0 ? layout->total : 1) * sizeof *dense);
  safetensors_tensor *parts = calloc((size_t)layout->count + 4, sizeof *parts);
  table_dump dumps[MODEL_TABLES_MAX];
  memset(dumps, 0, sizeof dumps);
  if (dense == NULL || parts == NULL) {
    free(dense);
    free(parts);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "--export: out of memory");
  }
  ps_err rc = model_get_params(t->model, dense, err);
  int count = 0;
  for (int i = 0; i < layout->count; i++) {
    const tensor_info *info = &layout->tensors[i];
    parts[count] = safetensors_tensor_of("", info->name, SAFETENSORS_F32, (size_t)info->shape[0],
                        0, dense + info->offset);
    parts[count].rank = info->rank; /* a convolution's weights are 4-D */
    memcpy(parts[count].shape, info->shape, sizeof info->shape);
    count++;
  }
  sparse_table *const *tables = t->tables;
  for (int i = 0; i < t->model->tables && rc == PS_ERR_OK; i++) {
    if ((rc = table_dump_take(tables[i], 0, &dumps[i], err)) != PS_ERR_OK) break;
    const char *name = sparse_table_config_of(tables[i])->name;
    parts[count++] = safetensors_tensor_of(name, "keys", SAFETENSORS_U64,
        dumps[i].rows, 0, dumps[i].keys);
    parts[count++] = safetensors_tensor_of(name, "rows", SAFETENSORS_F32,
        dumps[i].rows, dumps[i].dim,
                          dumps[i].values);
  }
  if (rc == PS_ERR_OK) {
    char model_text[MODEL_TEXT_MAX];
    model_format(&t->settings.model, model_text, sizeof model_text);
    /* input_norm: how images enter the model (CIFAR-10), for readers of the file. */
    const char *metadata[] = {"format", "pt", "model", model_text, "producer", "pstrain",
                              NULL, NULL, NULL};
    if (t->settings.input_norm[0] != '\0') {
      metadata[6] = "input_norm";
      metadata[7] = t->settings.input_norm;
    }
    rc = safetensors_write_tensors(path, parts, count, metadata, 0, err);
  }
  if (rc == PS_ERR_OK) {
    LOG_INFO("exported the model%s to %s", t->model->tables > 0 ? " and its tables" : "", path);
  }
  for (int i = 0; i < MODEL_TABLES_MAX; i++) table_dump_free(&dumps[i]);
  free(parts);
  free(dense);
  return rc;
}
