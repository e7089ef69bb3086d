/* Sparse rows of a CTR job between a trainer and its pservers (see
 * ps_client_sparse.h): the key split, the SparseRows each message carries
 * and the checks of the rows that come back. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/client/ps_client_sparse.h"

#include <stdlib.h>
#include <string.h>

#include "common/criteo.h"
#include "common/log.h"
#include "common/shard_map.h"

static void keys_free(ps_sparse_keys *k) {
  free(k->keys);
  free(k->counts);
  free(k->at);
  free(k->first);
  memset(k, 0, sizeof *k);
}

static int keys_alloc(ps_sparse_keys *k, size_t cap, int pservers) {
  memset(k, 0, sizeof *k);
  k->cap = cap;
  k->keys = malloc(cap * sizeof *k->keys);
  k->counts = malloc(cap * sizeof *k->counts);
  k->at = malloc(cap * sizeof *k->at);
  k->first = calloc((size_t)pservers + 1, sizeof *k->first);
  return k->keys != NULL && k->counts != NULL && k->at != NULL && k->first != NULL;
}

/* Rows of keys in pserver p's part of k. */
static size_t part_of(const ps_sparse_keys *k, int p) { return k->first[p + 1] - k->first[p]; }

/* The client's sparse ops: what a message carries, what its reply holds. */
static ps_err sparse_append(void *ctx, int p, wire_writer *w, rpc_lease *lease, ps_error *err);
static ps_err sparse_take(void *ctx, int p, const rpc_message *msg, const wire_blocks_msg *m,
                          ps_error *err);

ps_err ps_sparse_init(ps_sparse *s, ps_client *c, int batch, ps_error *err) {
  memset(s, 0, sizeof *s);
  s->c = c;
  s->tables = ctr_table_count(&c->job.model);
  s->dim[CTR_TABLE_WIDE] = 1;
  s->dim[CTR_TABLE_EMBEDDING] = c->job.model.embed_dim;
  s->max_keys = (size_t)batch * CRITEO_CAT_FIELDS;
  int pservers = c->job.pservers, ok = s->tables > 0;
  size_t cap = s->max_keys > 0 ? s->max_keys : 1;
  ok = ok && keys_alloc(&s->cur, cap, pservers) && keys_alloc(&s->next, cap, pservers) &&
       keys_alloc(&s->look, cap, pservers);
  s->fill = calloc((size_t)pservers, sizeof *s->fill);
  ok = ok && s->fill != NULL;
  for (int i = 0; i < s->tables && ok; i++) {
    s->grads[i] = malloc(cap * (size_t)s->dim[i] * sizeof(float));
    s->rows[i] = malloc(cap * (size_t)s->dim[i] * sizeof(float));
    ok = s->grads[i] != NULL && s->rows[i] != NULL;
  }
  if (!ok) {
    ps_sparse_free(s);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver mode: out of memory for %zu keys a batch",
                        cap);
  }
  s->ops = (ps_client_sparse_ops){.ctx = s, .append = sparse_append, .take = sparse_take};
  c->sparse = &s->ops;
  return PS_ERR_OK;
}

void ps_sparse_free(ps_sparse *s) {
  if (s->c != NULL && s->c->sparse == &s->ops) s->c->sparse = NULL;
  keys_free(&s->cur);
  keys_free(&s->next);
  keys_free(&s->look);
  free(s->fill);
  for (int i = 0; i < CTR_TABLES_MAX; i++) {
    free(s->grads[i]);
    free(s->rows[i]);
    free(s->all[i].keys);
    free(s->all[i].rows);
  }
  memset(s, 0, sizeof *s);
}

ps_err ps_sparse_split(ps_sparse *s, ps_sparse_keys *k, const uint64_t *keys,
                       const uint32_t *counts, size_t n, ps_error *err) {
  const int pservers = s->c->job.pservers;
  if (n > k->cap) {
    return ps_error_set(err, PS_ERR_OUT_OF_RANGE, "pserver mode: %zu distinct keys, at most %zu",
                        n, k->cap);
  }
  memset(k->first, 0, ((size_t)pservers + 1) * sizeof *k->first);
  for (size_t j = 0; j < n; j++) k->first[shard_of_key(keys[j], pservers) + 1]++;
  for (int p = 0; p < pservers; p++) {
    k->first[p + 1] += k->first[p];
    s->fill[p] = k->first[p];
  }
  /* A stable placement: each pserver's keys keep the batch's order. */
  for (size_t j = 0; j < n; j++) {
    size_t at = s->fill[shard_of_key(keys[j], pservers)]++;
    k->keys[at] = keys[j];
    k->counts[at] = counts != NULL ? counts[j] : 1;
    k->at[j] = (uint32_t)at;
  }
  k->n = n;
  return PS_ERR_OK;
}

void ps_sparse_scatter(const ps_sparse *s, const ps_sparse_keys *k, float *const *out) {
  for (int i = 0; i < s->tables; i++) {
    if (out[i] == NULL) continue;
    const size_t dim = (size_t)s->dim[i];
    for (size_t j = 0; j < k->n; j++) {
      memcpy(out[i] + j * dim, s->rows[i] + (size_t)k->at[j] * dim, dim * sizeof(float));
    }
  }
}

static ps_err sparse_append(void *ctx, int p, wire_writer *w, rpc_lease *lease, ps_error *err) {
  ps_sparse *s = ctx;
  const ps_sparse_keys *g = s->send_grads, *k = s->send_keys;
  for (int i = 0; i < s->tables && g != NULL; i++) {
    size_t n = part_of(g, p), dim = (size_t)s->dim[i];
    wire_writer_sparse(w, WIRE_SPARSE_GRADS, (uint32_t)i, g->keys + g->first[p], n,
                       s->grads[i] + g->first[p] * dim, n * dim, NULL, lease);
    s->c->bytes_sent += n * (8 + 4 * dim);
  }
  for (int i = 0; i < s->tables && k != NULL; i++) {
    size_t n = part_of(k, p);
    wire_writer_sparse(w, WIRE_SPARSE_KEYS, (uint32_t)i, k->keys + k->first[p], n, NULL, 0,
                       k->counts + k->first[p], lease);
    s->c->bytes_sent += n * 12;
  }
  return wire_writer_check(w, err);
}

static ps_err dump_append(ps_sparse_dump *d, int dim, const rpc_message *msg,
                          const wire_sparse_ref *r, ps_error *err) {
  size_t n = r->keys.len / 8;
  if (d->n + n > d->cap) {
    size_t cap = (d->n + n) * 2;
    uint64_t *keys = realloc(d->keys, cap * sizeof *keys);
    if (keys != NULL) d->keys = keys;
    float *rows = realloc(d->rows, cap * (size_t)dim * sizeof *rows);
    if (rows != NULL) d->rows = rows;
    if (keys == NULL || rows == NULL) {
      return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory for %zu rows", d->n + n);
    }
    d->cap = cap;
  }
  wire_copy_block(msg, &r->keys, d->keys + d->n);
  wire_copy_block(msg, &r->values, d->rows + d->n * (size_t)dim);
  d->n += n;
  return PS_ERR_OK;
}

/* Checks every SparseRows of the reply before copying any. */
static ps_err sparse_take(void *ctx, int p, const rpc_message *msg, const wire_blocks_msg *m,
                          ps_error *err) {
  ps_sparse *s = ctx;
  const ps_sparse_keys *k = s->send_keys;
  const wire_sparse_ref *found[CTR_TABLES_MAX] = {NULL, NULL};
  for (size_t i = 0; i < m->sparse_count; i++) {
    const wire_sparse_ref *r = &m->sparse[i];
    if (r->field != WIRE_SPARSE_ROWS) continue;
    if (r->table >= (uint32_t)s->tables || found[r->table] != NULL) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA, "rows of table %u, %s", r->table,
                          r->table >= (uint32_t)s->tables ? "which the job lacks" : "twice");
    }
    const size_t dim = (size_t)s->dim[r->table];
    size_t n = s->want_all ? r->keys.len / 8 : k != NULL ? part_of(k, p) : 0;
    if ((s->want_all && r->keys.len % 8 != 0) || r->values.len != n * dim * sizeof(float)) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                          "rows of table %u: %zu key bytes and %zu value bytes for %zu rows of %zu",
                          r->table, r->keys.len, r->values.len, n, dim);
    }
    found[r->table] = r;
  }
  for (int i = 0; i < s->tables; i++) {
    if (found[i] == NULL) {
      if (!s->want_all && (k == NULL || part_of(k, p) == 0)) continue; /* nothing was asked */
      return ps_error_set(err, PS_ERR_CORRUPT_DATA, "no rows of table %d in the reply", i);
    }
    if (s->want_all) {
      if (dump_append(&s->all[i], s->dim[i], msg, found[i], err) != PS_ERR_OK) return err->code;
    } else if (found[i]->values.len > 0) {
      wire_copy_block(msg, &found[i]->values, s->rows[i] + k->first[p] * (size_t)s->dim[i]);
    }
  }
  return PS_ERR_OK;
}

ps_err ps_sparse_pull_step(ps_sparse *s, long step, float *params, ps_error *err) {
  s->send_grads = NULL;
  s->send_keys = &s->next;
  s->want_all = 0;
  return ps_client_pull_kind(s->c, step, PSTRAIN__PULL_KIND__PULL_STEP, params, err);
}

ps_err ps_sparse_prefetch(ps_sparse *s, long step, ps_error *err) {
  s->send_grads = NULL;
  s->send_keys = &s->next;
  s->want_all = 0;
  return ps_client_prefetch(s->c, step, err);
}

ps_err ps_sparse_push_pull(ps_sparse *s, long step, const float *dense_grads,
                           float *const *grads, float *params, double recover_timeout,
                           long *resume_at, ps_error *err) {
  for (int i = 0; i < s->tables; i++) {
    const size_t dim = (size_t)s->dim[i];
    for (size_t j = 0; j < s->cur.n; j++) {
      memcpy(s->grads[i] + (size_t)s->cur.at[j] * dim, grads[i] + j * dim, dim * sizeof(float));
    }
  }
  s->send_grads = &s->cur;
  s->send_keys = &s->next;
  s->want_all = 0;
  *resume_at = step + 1;
  ps_err rc = ps_client_push_pull(s->c, step, dense_grads, params, err);
  if (rc != PS_ERR_OK && ps_client_recoverable(rc) && recover_timeout > 0) {
    LOG_WARN("%s: recovering (--recover-timeout %.0f s)", err->msg, recover_timeout);
    rc = ps_client_recover(s->c, step, dense_grads, params, recover_timeout, resume_at, err);
  }
  return rc;
}

/* A read failed with rc (err says why): recovers when it may. PS_ERR_OK when
 * recovered: read again if *resume_at == step, else the job went back there. */
static ps_err recover_read(ps_sparse *s, long step, ps_err rc, float *params,
                           double recover_timeout, long *resume_at, ps_error *err) {
  if (!ps_client_recoverable(rc) || recover_timeout <= 0) return rc;
  LOG_WARN("%s: recovering (--recover-timeout %.0f s)", err->msg, recover_timeout);
  return ps_client_recover(s->c, step, NULL, params, recover_timeout, resume_at, err);
}

ps_err ps_sparse_pull_dense(ps_sparse *s, long step, float *params, ps_error *err) {
  PS_TRY(ps_sparse_split(s, &s->look, NULL, NULL, 0, err));
  s->send_grads = NULL;
  s->send_keys = &s->look;
  s->want_all = 0;
  return ps_client_pull_kind(s->c, step, PSTRAIN__PULL_KIND__PULL_LOOKUP, params, err);
}

ps_err ps_sparse_lookup(ps_sparse *s, long step, const uint64_t *keys, const uint32_t *counts,
                        size_t n, float *const *out, float *params, double recover_timeout,
                        long *resume_at, ps_error *err) {
  *resume_at = step;
  /* At most a batch's keys a message: what a pserver accepts. */
  for (size_t at = 0; at < n; at += s->max_keys) {
    size_t chunk = n - at < s->max_keys ? n - at : s->max_keys;
    if (ps_sparse_split(s, &s->look, keys + at, counts != NULL ? counts + at : NULL, chunk, err) !=
        PS_ERR_OK) {
      return err->code;
    }
    for (int tries = 0;; tries++) {
      s->send_grads = NULL;
      s->send_keys = &s->look;
      s->want_all = 0;
      ps_err rc = ps_client_pull_kind(s->c, step, PSTRAIN__PULL_KIND__PULL_LOOKUP, params, err);
      if (rc == PS_ERR_OK) break;
      if (tries > 0) return rc;
      rc = recover_read(s, step, rc, params, recover_timeout, resume_at, err);
      if (rc != PS_ERR_OK || *resume_at < step) return rc; /* went back: the caller goes there */
    }
    float *dst[CTR_TABLES_MAX] = {NULL, NULL};
    for (int i = 0; i < s->tables; i++) {
      dst[i] = out[i] != NULL ? out[i] + at * (size_t)s->dim[i] : NULL;
    }
    ps_sparse_scatter(s, &s->look, dst);
  }
  return PS_ERR_OK;
}

ps_err ps_sparse_pull_all(ps_sparse *s, long step, float *params, double recover_timeout,
                          ps_error *err) {
  if (ps_sparse_split(s, &s->look, NULL, NULL, 0, err) != PS_ERR_OK) return err->code;
  for (int tries = 0;; tries++) {
    s->send_grads = NULL;
    s->send_keys = &s->look;
    s->want_all = 1;
    for (int i = 0; i < s->tables; i++) s->all[i].n = 0;
    ps_err rc = ps_client_pull_kind(s->c, step, PSTRAIN__PULL_KIND__PULL_ALL, params, err);
    s->want_all = 0;
    long resume_at = step;
    if (rc == PS_ERR_OK || tries > 0) return rc;
    rc = recover_read(s, step, rc, params, recover_timeout, &resume_at, err);
    if (rc != PS_ERR_OK) return rc;
    if (resume_at < step) {
      return ps_error_set(err, PS_ERR_ABORTED,
                          "the pservers went back to step %ld while their rows were read at "
                          "step %ld",
                          resume_at, step);
    }
  }
}
