/* fuzz_ctr's third use of an input (see fuzz_ctr.c): the input as a
 * safetensors file (safetensors_file_read) whose TABLE.keys/values/state/meta
 * tensors (as trainer/ctr_checkpoint.c writes them) go to sparse_table_load
 * of six table kinds. An accepted load dumps back the loaded rows in
 * ascending key order, bit for bit, and trains on; a refused one leaves the
 * table's dump as it was. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/safetensors.h"
#include "common/sparse_table.h"
#include "tests/fuzz/fuzz_ctr.h"

typedef struct table_kind {
  const char *name;
  int dim;
  sparse_optimizer_kind opt;
} table_kind;

/* The tables ctr_train makes ("wide" of dim 1, "embedding"), each optimizer. */
static const table_kind kinds[] = {
    {"wide", 1, SPARSE_OPT_ADAGRAD},      {"wide", 1, SPARSE_OPT_ADAM},
    {"wide", 1, SPARSE_OPT_SGD},          {"embedding", 4, SPARSE_OPT_ADAGRAD},
    {"embedding", 4, SPARSE_OPT_ADAM},    {"embedding", 4, SPARSE_OPT_SGD}};

typedef struct dump {
  size_t rows;
  uint64_t *keys;
  float *values, *state;
  int64_t *meta;
} dump;

static void dump_take(const sparse_table *t, dump *d) {
  sparse_table_stats st;
  sparse_table_stats_get(t, &st);
  const sparse_table_config *c = sparse_table_config_of(t);
  size_t n = st.rows, sf = (size_t)sparse_table_state_floats(c);
  d->rows = n;
  d->keys = xmalloc(n * sizeof *d->keys);
  d->values = xmalloc(n * (size_t)c->dim * sizeof *d->values);
  d->state = xmalloc(n * sf * sizeof *d->state);
  d->meta = xmalloc(n * 2 * sizeof *d->meta);
  ps_error err;
  if (sparse_table_dump(t, d->keys, d->values, d->state, d->meta, &err) != PS_ERR_OK) {
    finding("a dump failed", err.msg);
  }
}

static void dump_free(dump *d) {
  free(d->keys);
  free(d->values);
  free(d->state);
  free(d->meta);
}

static int dumps_equal(const dump *a, const dump *b, size_t dim, size_t sf) {
  size_t n = a->rows;
  return a->rows == b->rows && memcmp(a->keys, b->keys, n * sizeof *a->keys) == 0 &&
         memcmp(a->values, b->values, n * dim * sizeof(float)) == 0 &&
         memcmp(a->state, b->state, n * sf * sizeof(float)) == 0 &&
         memcmp(a->meta, b->meta, n * 2 * sizeof(int64_t)) == 0;
}

/* As trainer/ctr_checkpoint.c's find: TABLE.WHAT with this dtype and shape. */
static const safetensors_tensor *find(const safetensors_file *f, const char *table,
                                      const char *what, safetensors_dtype dtype, long rows,
                                      long cols) {
  char name[TENSOR_NAME_MAX];
  snprintf(name, sizeof name, "%s.%s", table, what);
  const safetensors_tensor *p = safetensors_file_find(f, name);
  int rank = cols > 0 ? 2 : 1;
  if (p == NULL || p->dtype != dtype || p->rank != rank || (rows >= 0 && p->shape[0] != rows) ||
      (cols > 0 && p->shape[1] != cols)) {
    return NULL;
  }
  return p;
}

static const uint64_t *order_keys;
static int by_key(const void *a, const void *b) {
  uint64_t x = order_keys[*(const size_t *)a], y = order_keys[*(const size_t *)b];
  return (x > y) - (x < y);
}

/* An accepted load dumps back exactly the file's rows, by ascending key. */
static void check_loaded(const dump *d, size_t n, const safetensors_tensor *keys,
                         const safetensors_tensor *values, const safetensors_tensor *state,
                         const safetensors_tensor *meta, size_t dim, size_t sf) {
  if (d->rows != n) finding("a loaded table does not hold the file's rows", NULL);
  /* Aligned copies of the file's bytes (tensors need not be aligned). */
  uint64_t *k = xmalloc(n * sizeof *k);
  int64_t *m = xmalloc(2 * n * sizeof *m);
  memcpy(k, keys->data, n * sizeof *k);
  memcpy(m, meta->data, 2 * n * sizeof *m);
  size_t *order = xmalloc(n * sizeof *order);
  for (size_t i = 0; i < n; i++) order[i] = i;
  order_keys = k;
  qsort(order, n, sizeof *order, by_key);
  for (size_t i = 0; i < n; i++) {
    size_t j = order[i];
    int64_t count = m[2 * j + 1] > 0xffffff ? 0xffffff : m[2 * j + 1];
    const char *v = (const char *)values->data + j * dim * sizeof(float);
    const char *s = state != NULL ? (const char *)state->data + j * sf * sizeof(float) : NULL;
    if (d->keys[i] != k[j] || memcmp(d->values + i * dim, v, dim * sizeof(float)) != 0 ||
        (s != NULL && memcmp(d->state + i * sf, s, sf * sizeof(float)) != 0) ||
        d->meta[2 * i] != m[2 * j] || d->meta[2 * i + 1] != count) {
      finding("a loaded table dumps other rows than the file's", NULL);
    }
  }
  free(order);
  free(m);
  free(k);
}

static void check_table(const safetensors_file *f, const table_kind *kind) {
  sparse_table_config c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "%s", kind->name);
  c.id = kind->dim == 1 ? 0 : 1;
  c.dim = kind->dim;
  c.seed = 7;
  c.init_scale = 0.01f;
  c.opt = (sparse_optimizer_config){kind->opt, 0.05, 1e-8, 0.1, 0.9, 0.999};
  size_t sf = (size_t)sparse_table_state_floats(&c), dim = (size_t)c.dim;
  /* Room for 1024 rows and a map of 64 slots: loads of 45 rows or more are refused. */
  c.max_bytes = 1024 * (dim + sf + 2) * sizeof(float) + 64 * 12;
  c.evict_after = 50;
  sparse_table *t;
  ps_error err;
  if (sparse_table_create(&t, &c, &err) != PS_ERR_OK) finding("creating a table", err.msg);
  const uint64_t base[3] = {1, 2, 3};
  float rows[8 * SPARSE_TABLE_MAX_DIM];
  if (sparse_table_pull(t, base, 3, NULL, 5, rows, &err) != PS_ERR_OK) finding("a pull", err.msg);
  dump before, after;
  dump_take(t, &before);

  const safetensors_tensor *keys = find(f, kind->name, "keys", SAFETENSORS_U64, -1, 0);
  long n = keys != NULL ? keys->shape[0] : 0;
  const safetensors_tensor *values = find(f, kind->name, "values", SAFETENSORS_F32, n, c.dim);
  const safetensors_tensor *state =
      sf > 0 ? find(f, kind->name, "state", SAFETENSORS_F32, n, (long)sf) : NULL;
  const safetensors_tensor *meta = find(f, kind->name, "meta", SAFETENSORS_I64, n, 2);
  if (keys == NULL || values == NULL || (sf > 0 && state == NULL) || meta == NULL) {
    dump_free(&before);
    sparse_table_destroy(t);
    return;
  }
  ps_err rc = sparse_table_load(t, (size_t)n, keys->data, values->data,
                                state != NULL ? state->data : NULL, meta->data, &err);
  dump_take(t, &after);
  if (rc == PS_ERR_OK) {
    check_loaded(&after, (size_t)n, keys, values, state, meta, dim, sf);
    /* The loaded table trains: pull up to 3 loaded keys and 2 new ones at
     * the newest step, push, evict; a loaded key reads its row. */
    uint64_t pull_keys[5];
    size_t m = 0;
    long step = 0;
    for (size_t i = 0; i < after.rows; i++) {
      if (after.meta[2 * i] > step) step = (long)after.meta[2 * i];
    }
    for (; m < 3 && m < after.rows; m++) pull_keys[m] = after.keys[m];
    pull_keys[m++] = 0x5eed0001u;
    pull_keys[m++] = 0x5eed0002u;
    int dup = 0;
    for (size_t i = 0; i + 2 < m; i++) dup |= after.keys[i] == 0x5eed0001u || after.keys[i] == 0x5eed0002u;
    if (!dup && sparse_table_pull(t, pull_keys, m, NULL, step, rows, &err) == PS_ERR_OK) {
      if (memcmp(rows, after.values, (m - 2) * dim * sizeof(float)) != 0) {
        finding("a pull of a loaded key does not read its loaded row", NULL);
      }
      float grads[5 * SPARSE_TABLE_MAX_DIM];
      for (size_t i = 0; i < m * dim; i++) grads[i] = 0.5f;
      if (sparse_table_push(t, pull_keys, m, grads, step, &err) != PS_ERR_OK) {
        finding("a push after a load", err.msg);
      }
      (void)sparse_table_evict(t, step);
    }
  } else {
    if (err.msg[0] == '\0' || strstr(err.msg, kind->name) == NULL) {
      finding("a refused load does not say which table", err.msg);
    }
    if (!dumps_equal(&before, &after, dim, sf)) finding("a refused load changed the table", err.msg);
  }
  dump_free(&after);
  dump_free(&before);
  sparse_table_destroy(t);
}

void check_checkpoint(const char *path, const uint8_t *data, size_t size) {
  write_file(path, data, size);
  static safetensors_file f;
  ps_error err;
  if (safetensors_file_read(path, &f, &err) != PS_ERR_OK) {
    if (strstr(err.msg, path) == NULL) finding("a refused file's error does not name it", err.msg);
    return;
  }
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) check_table(&f, &kinds[k]);
  safetensors_file_free(&f);
}
