/* A pserver checkpoint's tensors: the copies of the sparse tables taken
 * for it, the tensor list written, and the checked read of a file. */
#define _POSIX_C_SOURCE 200809L
#include "server/pserver_shard_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "common/checkpoint.h"
#include "common/shard_map.h"
#include "server/store/tier.h"

ps_err pserver_rows_reserve(pserver_rows *r, const sparse_table *t, size_t rows, ps_error *err) {
  const sparse_table_config *c = sparse_table_config_of(t);
  snprintf(r->name, sizeof r->name, "%s", c->name);
  r->dim = c->dim;
  r->state_floats = sparse_table_state_floats(c);
  if (rows <= r->cap && r->keys != NULL) return PS_ERR_OK;
  /* A quarter more: re-sharding appends file by file (pages never touched
   * cost no memory). */
  size_t cap = rows + rows / 4 + 16;
  size_t dim = (size_t)r->dim, sf = (size_t)r->state_floats;
  if (!grow_array(&r->keys, cap, sizeof *r->keys) ||
      !grow_array(&r->values, cap * dim, sizeof *r->values) ||
      (sf > 0 && !grow_array(&r->state, cap * sf, sizeof *r->state)) ||
      !grow_array(&r->meta, cap * 2, sizeof *r->meta)) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "table %s: out of memory for a copy of %zu rows",
                        r->name, rows);
  }
  r->cap = cap;
  return PS_ERR_OK;
}

ps_err pserver_rows_take(pserver_rows *r, const sparse_table *t, ps_error *err) {
  sparse_table_stats st;
  sparse_table_stats_get(t, &st);
  r->rows = 0;
  if (pserver_rows_reserve(r, t, st.rows, err) != PS_ERR_OK) return err->code;
  if (sparse_table_dump(t, r->keys, r->values, r->state_floats > 0 ? r->state : NULL, r->meta,
                        err) != PS_ERR_OK) {
    return err->code;
  }
  r->rows = st.rows;
  return PS_ERR_OK;
}

void pserver_rows_append(pserver_rows *dst, const pserver_rows *src, size_t i) {
  size_t at = dst->rows++, dim = (size_t)dst->dim, sf = (size_t)dst->state_floats;
  dst->keys[at] = src->keys[i];
  memcpy(dst->values + at * dim, src->values + i * dim, dim * sizeof *dst->values);
  if (sf > 0) memcpy(dst->state + at * sf, src->state + i * sf, sf * sizeof *dst->state);
  dst->meta[2 * at] = src->meta[2 * i];
  dst->meta[2 * at + 1] = src->meta[2 * i + 1];
}

void pserver_rows_free(pserver_rows *r) {
  store_tier_snapshot_free(r->snap);
  free(r->keys);
  free(r->values);
  free(r->state);
  free(r->meta);
  memset(r, 0, sizeof *r);
}

ps_err pserver_rows_load(sparse_table *t, const pserver_rows *r, ps_error *err) {
  return sparse_table_load(t, r->rows, r->keys, r->values, r->state_floats > 0 ? r->state : NULL,
                           r->meta, err);
}

ps_err pserver_rows_checkpoint(pserver *ps, int t, pserver_rows *r, ps_error *err) {
  if (ps->store.tier == NULL) return pserver_rows_take(r, ps->store.tables[t], err);
  const sparse_table_config *c = sparse_table_config_of(ps->store.tables[t]);
  snprintf(r->name, sizeof r->name, "%s", c->name);
  r->dim = c->dim;
  r->state_floats = sparse_table_state_floats(c);
  r->rows = 0;
  return store_tier_snapshot_take(ps, t, &r->snap, err);
}

enum { FILL_KEYS, FILL_VALUES, FILL_STATE, FILL_META };

/* A snapshot's rows, one field of each in order, as many whole rows as fit. */
static long fill_rows(void *ctx, void *buf, size_t max, ps_error *err) {
  pserver_shard_fill *f = ctx;
  if (!f->started) {
    store_tier_snapshot_rewind(f->snap);
    f->started = 1;
  }
  size_t per = f->what == FILL_KEYS     ? sizeof(uint64_t)
               : f->what == FILL_VALUES ? f->dim * sizeof(float)
               : f->what == FILL_STATE  ? f->state_floats * sizeof(float)
                                        : 2 * sizeof(int64_t);
  if (max < per) {
    ps_error_set(err, PS_ERR_INTERNAL, "a checkpoint's chunk of %zu bytes is less than a row's %zu",
                 max, per);
    return -1;
  }
  const sparse_table *t = store_tier_snapshot_table(f->snap);
  char *out = buf;
  size_t put = 0;
  while (put + per <= max) {
    uint64_t key;
    const float *row;
    int got = store_tier_snapshot_next(f->snap, &key, &row, err);
    if (got < 0) return -1;
    if (got == 0) break;
    switch (f->what) {
    case FILL_KEYS: memcpy(out + put, &key, per); break;
    case FILL_VALUES: memcpy(out + put, row, per); break;
    case FILL_STATE: memcpy(out + put, row + f->dim, per); break;
    default: {
      int64_t meta[2];
      sparse_table_row_meta(t, row, meta);
      memcpy(out + put, meta, per);
    }
    }
    put += per;
  }
  return (long)put;
}

/* Table i's tensor `what` of rows r: over its arrays, or filled from its snapshot. */
static safetensors_tensor rows_tensor(const pserver_rows *r, int what, pserver_shard_fill *fill) {
  static const char *const names[] = {"keys", "values", "state", "meta"};
  safetensors_dtype dtype = what == FILL_KEYS   ? SAFETENSORS_U64
                            : what == FILL_META ? SAFETENSORS_I64
                                                : SAFETENSORS_F32;
  long cols = what == FILL_KEYS ? 0 : what == FILL_VALUES ? r->dim
                                    : what == FILL_STATE  ? r->state_floats
                                                          : 2;
  void *data = what == FILL_KEYS     ? (void *)r->keys
               : what == FILL_VALUES ? (void *)r->values
               : what == FILL_STATE  ? (void *)r->state
                                     : (void *)r->meta;
  safetensors_tensor out = safetensors_tensor_of(r->name, names[what], dtype, r->rows, cols,
                                                 r->snap != NULL ? NULL : data);
  if (r->snap != NULL) {
    *fill = (pserver_shard_fill){r->snap, what, (size_t)r->dim, (size_t)r->state_floats, 0};
    out.fill = fill_rows;
    out.fill_ctx = fill;
  }
  return out;
}

int pserver_shard_tensors(const tensor_layout *layout, const float *data,
                          const pserver_rows *rows, int tables, safetensors_tensor *out,
                          pserver_shard_fill *fills) {
  int count = 0;
  for (int i = 0; i < layout->count && i < 3; i++) {
    const tensor_info *info = &layout->tensors[i];
    safetensors_tensor *p = &out[count++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", info->name);
    p->dtype = SAFETENSORS_F32;
    p->rank = info->rank;
    for (int d = 0; d < info->rank; d++) p->shape[d] = info->shape[d];
    p->data = (void *)(data + info->offset);
  }
  for (int i = 0; i < tables; i++) {
    const pserver_rows *r = &rows[i];
    for (int what = FILL_KEYS; what <= FILL_META; what++) {
      if (what == FILL_STATE && r->state_floats == 0) continue;
      out[count] = rows_tensor(r, what, &fills[count]);
      count++;
    }
  }
  return count;
}

/* --- reading ------------------------------------------------------------------------ */

/* A checkpoint's shard number or count: 1 to 9 decimal digits, nothing else. */
static int parse_count(const char *text, int *out) {
  size_t n = strlen(text);
  if (n < 1 || n > 9 || strspn(text, "0123456789") != n) return 0;
  *out = (int)strtol(text, NULL, 10);
  return 1;
}

ps_err pserver_shard_file_job(const char *path, job_config *job, long *step, int *id, int *count,
                              ps_error *err) {
  safetensors_meta meta;
  if (checkpoint_read_job(path, PSERVER_SHARD_FORMAT, job, step, &meta, err) != PS_ERR_OK) {
    return err->code;
  }
  const char *id_text = safetensors_meta_get(&meta, "pserver");
  const char *count_text = safetensors_meta_get(&meta, "pservers");
  if (id_text == NULL || count_text == NULL) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s does not say which shard it holds", path);
  }
  if (!parse_count(id_text, id) || !parse_count(count_text, count) || *id >= *count) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: bad shard number '%s' of '%s'", path,
                        id_text, count_text);
  }
  return PS_ERR_OK;
}

/* The tensor name of dtype and shape (rows < 0: any), or NULL with err set. */
static const safetensors_tensor *find(const safetensors_file *f, const char *path,
                                      const char *name, safetensors_dtype dtype, long rows,
                                      long cols, ps_error *err) {
  const safetensors_tensor *p = safetensors_file_find(f, name);
  int rank = cols > 0 ? 2 : 1;
  if (p == NULL || p->dtype != dtype || p->rank != rank || (rows >= 0 && p->shape[0] != rows) ||
      p->shape[0] < 0 || (cols > 0 && p->shape[1] != cols)) {
    ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: tensor %s is missing or has another dtype or shape",
                 path, name);
    return NULL;
  }
  return p;
}

/* Points r at table t's tensors in f and checks its keys. */
static ps_err find_rows(const safetensors_file *f, const char *path, const sparse_table *t,
                        int owner, int owners, pserver_rows *r, ps_error *err) {
  const sparse_table_config *c = sparse_table_config_of(t);
  memset(r, 0, sizeof *r);
  snprintf(r->name, sizeof r->name, "%s", c->name);
  r->dim = c->dim;
  r->state_floats = sparse_table_state_floats(c);
  char name[TENSOR_NAME_MAX];
  snprintf(name, sizeof name, "%s.keys", c->name);
  const safetensors_tensor *keys = find(f, path, name, SAFETENSORS_U64, -1, 0, err);
  if (keys == NULL) return err->code;
  long rows = keys->shape[0];
  snprintf(name, sizeof name, "%s.values", c->name);
  const safetensors_tensor *values = find(f, path, name, SAFETENSORS_F32, rows, r->dim, err);
  if (values == NULL) return err->code;
  const safetensors_tensor *state = NULL;
  if (r->state_floats > 0) {
    snprintf(name, sizeof name, "%s.state", c->name);
    state = find(f, path, name, SAFETENSORS_F32, rows, r->state_floats, err);
    if (state == NULL) return err->code;
  }
  snprintf(name, sizeof name, "%s.meta", c->name);
  const safetensors_tensor *meta = find(f, path, name, SAFETENSORS_I64, rows, 2, err);
  if (meta == NULL) return err->code;
  r->rows = (size_t)rows;
  r->keys = keys->data;
  r->values = values->data;
  r->state = state != NULL ? state->data : NULL;
  r->meta = meta->data;
  /* Ascending (as dumps write them) rules out duplicates before a load. */
  for (size_t i = 0; i < r->rows; i++) {
    if (i > 0 && r->keys[i] <= r->keys[i - 1]) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: table %s's keys are not ascending at "
                          "row %zu", path, c->name, i);
    }
    if (shard_of_key(r->keys[i], owners) != owner) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: table %s's key %llu (row %zu) belongs "
                          "to pserver %d of %d, not to %d", path, c->name,
                          (unsigned long long)r->keys[i], i, shard_of_key(r->keys[i], owners),
                          owners, owner);
    }
  }
  return PS_ERR_OK;
}

ps_err pserver_shard_file_read(const char *path, size_t floats, sparse_table *const *tables,
                               int count, int owner, int owners, pserver_shard_file *out,
                               ps_error *err) {
  memset(out, 0, sizeof *out);
  if (safetensors_file_read(path, &out->file, err) != PS_ERR_OK) return err->code;
  const char *names[3] = {"params", "optimizer.state1", "optimizer.state2"};
  int expected = 3;
  ps_err rc = PS_ERR_OK;
  for (int i = 0; i < 3 && rc == PS_ERR_OK; i++) {
    const safetensors_tensor *p = find(&out->file, path, names[i], SAFETENSORS_F32, (long)floats,
                                       0, err);
    if (p == NULL) rc = err->code;
    else out->dense[i] = p->data;
  }
  for (int i = 0; i < count && rc == PS_ERR_OK; i++) {
    rc = find_rows(&out->file, path, tables[i], owner, owners, &out->rows[i], err);
    expected += out->rows[i].state_floats > 0 ? 4 : 3;
  }
  if (rc == PS_ERR_OK && out->file.count != expected) {
    rc = ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s holds %d tensors; this job's shard has %d",
                      path, out->file.count, expected);
  }
  out->tables = count;
  if (rc != PS_ERR_OK) pserver_shard_file_free(out);
  return rc;
}

void pserver_shard_file_free(pserver_shard_file *f) {
  safetensors_file_free(&f->file);
  memset(f, 0, sizeof *f);
}
