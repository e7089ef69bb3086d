/* GEO-SGD's sparse half (pserver_replica.h): the rows a trainer touched
 * since the last exchange, each with its value when first touched, and the
 * exchange's rows: each row's change goes to the pserver owning its key,
 * which adds change / N and answers with the fresh row, which replaces the
 * local one. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/replica/pserver_replica.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "common/clock.h"
#include "common/ctr_tables.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/shard_map.h"

typedef struct geo_rows geo_rows;

struct geo_rows {
  ps_client *c;                          /* borrowed */
  const ps_client_sparse_ops *eval_ops;  /* c->sparse outside exchanges */
  ps_client_sparse_ops ops;              /* an exchange's rows */
  int tables, pservers;
  size_t dim[CTR_TABLES_MAX];
  sparse_table *local[CTR_TABLES_MAX];   /* t's tables, borrowed */
  /* Rows touched since the last exchange, in first-touch order: keys and
   * their values when first touched, the base of their change. */
  size_t n, cap;
  uint64_t *keys;
  float *base[CTR_TABLES_MAX];           /* (cap, dim) */
  /* An exchange's: keys grouped by pserver (pserver p's from first[p]),
   * their changes and, in the same order, the fresh rows that come back. */
  uint64_t *grouped;
  uint32_t *at;                          /* (cap) where keys[j] lies in grouped */
  float *change[CTR_TABLES_MAX], *fresh[CTR_TABLES_MAX]; /* (cap, dim) */
  size_t *first, *fill;                  /* (pservers + 1), (pservers) */
  /* keys' index + 1 by key (open addressing, 0: empty, at most half full) */
  uint32_t *slots;
  size_t slot_cap;
};

/* --- the rows touched since the last exchange ------------------------------------ */

static size_t slot_of(const geo_rows *g, uint64_t key, int *found) {
  size_t mask = g->slot_cap - 1, i = (size_t)rng_mix64(key) & mask;
  for (; g->slots[i] != 0; i = (i + 1) & mask) {
    if (g->keys[g->slots[i] - 1] == key) {
      *found = 1;
      return i;
    }
  }
  *found = 0;
  return i;
}

/* Room for `need` touched rows; a failure leaves what is there intact. */
static ps_err reserve(geo_rows *g, size_t need, ps_error *err) {
  if (need > UINT32_MAX / 4) {
    return ps_error_set(err, PS_ERR_OUT_OF_RANGE, "--update geo: %zu rows touched between "
                        "exchanges, too many (use a smaller --geo-steps)", need);
  }
  if (need > g->cap || g->keys == NULL) {
    size_t cap = 2 * g->cap > need ? 2 * g->cap : need;
    int ok = grow_array(&g->keys, cap, sizeof *g->keys) && grow_array(&g->grouped, cap, sizeof *g->grouped) &&
             grow_array(&g->at, cap, sizeof *g->at);
    for (int t = 0; t < g->tables && ok; t++) {
      ok = grow_array(&g->base[t], cap * g->dim[t], sizeof(float)) &&
           grow_array(&g->change[t], cap * g->dim[t], sizeof(float)) &&
           grow_array(&g->fresh[t], cap * g->dim[t], sizeof(float));
    }
    if (!ok) {
      return ps_error_set(err, PS_ERR_NO_MEMORY, "--update geo: out of memory for %zu rows", cap);
    }
    g->cap = cap;
  }
  if (2 * need <= g->slot_cap && g->slots != NULL) return PS_ERR_OK;
  size_t slot_cap = 16;
  while (slot_cap < 2 * need) slot_cap *= 2;
  uint32_t *slots = calloc(slot_cap, sizeof *slots);
  if (slots == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "--update geo: out of memory for %zu rows", need);
  }
  free(g->slots);
  g->slots = slots;
  g->slot_cap = slot_cap;
  for (size_t j = 0; j < g->n; j++) {
    int found;
    g->slots[slot_of(g, g->keys[j], &found)] = (uint32_t)(j + 1);
  }
  return PS_ERR_OK;
}

ps_err geo_rows_note(geo_rows *g, const data_batch *b, float *const *rows, ps_error *err) {
  const sparse_dedup *d = b->dedup;
  if (reserve(g, g->n + d->n_unique, err) != PS_ERR_OK) return err->code;
  for (size_t j = 0; j < d->n_unique; j++) {
    int found;
    size_t s = slot_of(g, d->unique[j], &found);
    if (found) continue;
    g->slots[s] = (uint32_t)(g->n + 1);
    g->keys[g->n] = d->unique[j];
    for (int i = 0; i < g->tables; i++) {
      memcpy(g->base[i] + g->n * g->dim[i], rows[i] + j * g->dim[i], g->dim[i] * sizeof(float));
    }
    g->n++;
  }
  return PS_ERR_OK;
}

/* --- the exchange's sparse rows (the client's sparse ops) --------------------------- */

static size_t part_of(const geo_rows *g, int p) { return g->first[p + 1] - g->first[p]; }

static ps_err geo_append(void *ctx, int p, wire_writer *w, rpc_lease *lease, ps_error *err) {
  geo_rows *g = ctx;
  size_t from = g->first[p], n = part_of(g, p);
  for (int t = 0; t < g->tables; t++) {
    wire_writer_sparse(w, WIRE_SPARSE_GRADS, (uint32_t)t, g->grouped + from, n,
                       g->change[t] + from * g->dim[t], n * g->dim[t], NULL, lease);
    g->c->bytes_sent += n * (8 + 4 * g->dim[t]);
  }
  return wire_writer_check(w, err);
}

/* Checks pserver p's fresh rows (every table's, in the order sent) before
 * copying any. */
static ps_err geo_take(void *ctx, int p, const rpc_message *msg, const wire_blocks_msg *m,
                       ps_error *err) {
  geo_rows *g = ctx;
  size_t from = g->first[p], n = part_of(g, p);
  const wire_sparse_ref *found[CTR_TABLES_MAX] = {NULL, NULL};
  for (size_t i = 0; i < m->sparse_count; i++) {
    const wire_sparse_ref *r = &m->sparse[i];
    if (r->field != WIRE_SPARSE_ROWS) continue;
    if (r->table >= (uint32_t)g->tables || found[r->table] != NULL) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA, "rows of table %u, %s", r->table,
                          r->table >= (uint32_t)g->tables ? "which the job lacks" : "twice");
    }
    if (r->values.len != n * g->dim[r->table] * sizeof(float)) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                          "table %u: %zu bytes of fresh rows for the %zu rows sent", r->table,
                          r->values.len, n);
    }
    found[r->table] = r;
  }
  for (int t = 0; t < g->tables; t++) {
    if (found[t] == NULL && n > 0) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA, "no fresh rows of table %d in the reply", t);
    }
  }
  for (int t = 0; t < g->tables && n > 0; t++) {
    wire_copy_block(msg, &found[t]->values, g->fresh[t] + from * g->dim[t]);
  }
  return PS_ERR_OK;
}

/* --- the exchange --------------------------------------------------------------------- */

/* Groups the touched keys by owner (shard_of_key), each pserver's in
 * first-touch order, writes each row's change there and lends the client
 * the ops that send them. */
void geo_rows_begin(geo_rows *g) {
  memset(g->first, 0, ((size_t)g->pservers + 1) * sizeof *g->first);
  for (size_t j = 0; j < g->n; j++) g->first[shard_of_key(g->keys[j], g->pservers) + 1]++;
  for (int p = 0; p < g->pservers; p++) {
    g->first[p + 1] += g->first[p];
    g->fill[p] = g->first[p];
  }
  for (size_t j = 0; j < g->n; j++) {
    g->at[j] = (uint32_t)g->fill[shard_of_key(g->keys[j], g->pservers)]++;
    g->grouped[g->at[j]] = g->keys[j];
  }
  for (int t = 0; t < g->tables; t++) {
    const size_t dim = g->dim[t];
    float *now = g->fresh[t]; /* the current rows, first-touch order, until the reply */
    sparse_table_lookup(g->local[t], g->keys, g->n, now);
    for (size_t j = 0; j < g->n; j++) {
      float *out = g->change[t] + (size_t)g->at[j] * dim;
      for (size_t k = 0; k < dim; k++) out[k] = now[j * dim + k] - g->base[t][j * dim + k];
    }
  }
  g->c->sparse = &g->ops;
}

ps_err geo_rows_end(geo_rows *g, ps_err rc, long done, ps_error *err) {
  g->c->sparse = g->eval_ops;
  if (rc != PS_ERR_OK) return rc;
  for (int i = 0; i < g->tables; i++) {
    if (sparse_table_set_rows(g->local[i], g->grouped, g->n, g->fresh[i], done - 1, err) !=
        PS_ERR_OK) {
      return err->code;
    }
  }
  memset(g->slots, 0, g->slot_cap * sizeof *g->slots);
  g->n = 0;
  return PS_ERR_OK;
}

/* --- life ------------------------------------------------------------------------------ */

void geo_rows_destroy(geo_rows *g) {
  if (g == NULL) return;
  if (g->c != NULL && g->c->sparse == &g->ops) g->c->sparse = g->eval_ops;
  free(g->keys);
  free(g->grouped);
  free(g->at);
  for (int t = 0; t < CTR_TABLES_MAX; t++) {
    free(g->base[t]);
    free(g->change[t]);
    free(g->fresh[t]);
  }
  free(g->first);
  free(g->fill);
  free(g->slots);
  free(g);
}

ps_err geo_rows_create(geo_rows **out, trainer *t, ps_client *c, ps_error *err) {
  *out = NULL;
  geo_rows *g = calloc(1, sizeof *g);
  if (g == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "--update geo: out of memory");
  g->c = c;
  g->eval_ops = c->sparse;
  g->ops = (ps_client_sparse_ops){.ctx = g, .append = geo_append, .take = geo_take};
  g->tables = t->model->tables;
  for (int i = 0; i < g->tables; i++) {
    g->local[i] = t->tables[i];
    g->dim[i] = (size_t)sparse_table_config_of(t->tables[i])->dim;
  }
  g->pservers = c->job.pservers;
  g->first = calloc((size_t)g->pservers + 1, sizeof *g->first);
  g->fill = calloc((size_t)g->pservers, sizeof *g->fill);
  if (g->first == NULL || g->fill == NULL) {
    geo_rows_destroy(g);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "--update geo: out of memory");
  }
  /* A batch's keys to start with; more as the interval touches them. */
  if (reserve(g, (size_t)c->job.batch * CRITEO_CAT_FIELDS, err) != PS_ERR_OK) {
    geo_rows_destroy(g);
    return err->code;
  }
  *out = g;
  return PS_ERR_OK;
}
