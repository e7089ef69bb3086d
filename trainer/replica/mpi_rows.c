/* Collective mode's sparse half (mpi_replica.h): every rank keeps a full
 * replica of every table and each step the ranks all-gather their batches'
 * distinct keys and counts, pull the union of the keys (in rank order, with
 * the summed counts) from their own replica, compute the gradients of
 * their own examples, all-gather them and sum them in rank order, so every
 * replica applies the same update and stays bitwise equal to the others.
 * Built only with MPI. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "trainer/replica/mpi_replica.h"
#define FIELDS CRITEO_CAT_FIELDS

/* Floats per key in the gradients' exchange: one row of each table. */
static size_t floats_per_key(const trainer *t) {
  size_t per = 0;
  for (int i = 0; i < t->model->tables; i++) per += (size_t)t->model->dim[i];
  return per;
}

struct mpi_rows {
  int rank, ranks;
  int *recv_counts, *displs;     /* (ranks) per Allgatherv, in elements */
  long long *sizes;              /* (ranks, 2): distinct keys and examples of each rank */
  size_t max_keys;               /* distinct keys of one rank's batch at most */
  uint64_t *all_keys;            /* (ranks * max_keys) every rank's distinct keys */
  uint32_t *all_counts;          /* their occurrences */
  uint32_t *all_slot;            /* their index in the union */
  sparse_dedup uni;              /* the union, in rank order */
  uint32_t *counts;              /* the union's summed occurrences */
  float *rows[MODEL_TABLES_MAX];  /* the union's rows as pulled, per table */
  float *grads[MODEL_TABLES_MAX]; /* the union's gradients, summed over ranks */
  float *send, *recv;            /* (max_keys, per key), (ranks * max_keys, per key) */
  double bytes;                  /* sent + received, since the start */
  long long total;               /* the step's examples over every rank */
};


/* Counts and displacements of an Allgatherv of `per` elements per key. */
static size_t layout_gather(mpi_rows *x, int ranks, size_t per) {
  size_t at = 0;
  for (int r = 0; r < ranks; r++) {
    x->recv_counts[r] = (int)((size_t)x->sizes[2 * r] * per);
    x->displs[r] = (int)at;
    at += (size_t)x->recv_counts[r];
  }
  return at;
}

/* Steps (2) and (3): every rank's keys, and their union in rank order with
 * the summed counts; sets *total to the examples of the global batch. */
static ps_err gather_keys(mpi_rows *x, const trainer *t, const data_batch *b, ps_error *err) {
  const sparse_dedup *d = b->dedup;
  const int count = b->size;
  long long *total = &x->total;
  long long mine[2] = {count > 0 ? (long long)d->n_unique : 0, count};
  MPI_TRY(err, "gathering the batch sizes",
          MPI_Allgather(mine, 2, MPI_LONG_LONG, x->sizes, 2, MPI_LONG_LONG, MPI_COMM_WORLD));
  size_t keys = layout_gather(x, t->trainers, 1);
  *total = 0;
  for (int r = 0; r < t->trainers; r++) *total += x->sizes[2 * r + 1];
  MPI_TRY(err, "gathering the keys",
          MPI_Allgatherv(d->unique, (int)mine[0], MPI_UINT64_T, x->all_keys, x->recv_counts,
                         x->displs, MPI_UINT64_T, MPI_COMM_WORLD));
  MPI_TRY(err, "gathering the key counts",
          MPI_Allgatherv(d->counts, (int)mine[0], MPI_UINT32_T, x->all_counts, x->recv_counts,
                         x->displs, MPI_UINT32_T, MPI_COMM_WORLD));
  x->bytes += (double)(keys - (size_t)mine[0]) * 12.0 +
              (double)mine[0] * 12.0 * (double)(t->trainers - 1) + 32.0 * t->trainers;
  if (sparse_dedup_run(&x->uni, x->all_keys, keys, x->all_slot, err) != PS_ERR_OK) {
    return err->code;
  }
  memset(x->counts, 0, x->uni.n_unique * sizeof *x->counts);
  for (size_t i = 0; i < keys; i++) x->counts[x->all_slot[i]] += x->all_counts[i];
  return PS_ERR_OK;
}

/* Step (7): every rank's gradients, summed in rank order into the union's. */
static ps_err gather_grads(mpi_rows *x, const trainer *t, size_t mine, ps_error *err) {
  const int tables = t->model->tables;
  const size_t per = floats_per_key(t);
  for (size_t j = 0; j < mine; j++) {
    float *to = x->send + j * per;
    for (int i = 0; i < tables; i++) {
      const size_t dim = (size_t)t->model->dim[i];
      memcpy(to, t->row_grads[i] + j * dim, dim * sizeof(float));
      to += dim;
    }
  }
  size_t values = layout_gather(x, t->trainers, per);
  MPI_TRY(err, "gathering the sparse gradients",
          MPI_Allgatherv(x->send, (int)(mine * per), MPI_FLOAT, x->recv, x->recv_counts,
                         x->displs, MPI_FLOAT, MPI_COMM_WORLD));
  x->bytes += (double)(values - mine * per) * 4.0 + (double)(mine * per) * 4.0 * (t->trainers - 1);
  const size_t u = x->uni.n_unique;
  for (int i = 0; i < tables; i++) {
    memset(x->grads[i], 0, u * (size_t)t->model->dim[i] * sizeof(float));
  }
  /* The keys come in the order gather_keys received them. */
  for (size_t k = 0; k < values / per; k++) {
    const float *g = x->recv + k * per;
    const uint32_t s = x->all_slot[k];
    for (int i = 0; i < tables; i++) {
      const size_t dim = (size_t)t->model->dim[i];
      float *row = x->grads[i] + (size_t)s * dim;
      for (size_t c = 0; c < dim; c++) row[c] += g[c];
      g += dim;
    }
  }
  return PS_ERR_OK;
}

ps_err mpi_rows_create(mpi_rows **out, const trainer *t, ps_error *err) {
  *out = NULL;
  const size_t ranks = (size_t)t->trainers, per = floats_per_key(t);
  const size_t max_keys = (size_t)t->settings.opt.batch * FIELDS, all = ranks * max_keys;
  /* Before allocating: a batch too large is that, not "out of memory". */
  if (all * per > (size_t)INT32_MAX) {
    return ps_error_set(err, PS_ERR_OUT_OF_RANGE,
                        "collective mode: --batch %ld on %d ranks exchanges more values than an "
                        "MPI count holds",
                        t->settings.opt.batch, t->trainers);
  }
  mpi_rows *x = calloc(1, sizeof *x);
  if (x == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "collective mode: out of memory");
  x->rank = t->id;
  x->ranks = t->trainers;
  x->max_keys = max_keys;
  sparse_dedup_init(&x->uni);
  x->recv_counts = calloc(ranks, sizeof *x->recv_counts);
  x->displs = calloc(ranks, sizeof *x->displs);
  x->sizes = calloc(2 * ranks, sizeof *x->sizes);
  x->all_keys = calloc(all, sizeof *x->all_keys);
  x->all_counts = calloc(all, sizeof *x->all_counts);
  x->all_slot = calloc(all, sizeof *x->all_slot);
  x->counts = calloc(all, sizeof *x->counts);
  int ok = 1;
  for (int i = 0; i < t->model->tables; i++) {
    x->rows[i] = calloc(all * (size_t)t->model->dim[i], sizeof(float));
    x->grads[i] = calloc(all * (size_t)t->model->dim[i], sizeof(float));
    ok = ok && x->rows[i] != NULL && x->grads[i] != NULL;
  }
  x->send = calloc(x->max_keys * per, sizeof(float));
  x->recv = calloc(all * per, sizeof(float));
  if (!ok || x->recv_counts == NULL || x->displs == NULL || x->sizes == NULL ||
      x->all_keys == NULL || x->all_counts == NULL || x->all_slot == NULL || x->counts == NULL ||
      x->send == NULL || x->recv == NULL) {
    mpi_rows_destroy(x);
    return ps_error_set(err, PS_ERR_NO_MEMORY,
                        "collective mode: out of memory for the exchange of %zu keys", all);
  }
  *out = x;
  return PS_ERR_OK;
}

void mpi_rows_destroy(mpi_rows *x) {
  if (x == NULL) return;
  sparse_dedup_free(&x->uni);
  free(x->recv_counts);
  free(x->displs);
  free(x->sizes);
  free(x->all_keys);
  free(x->all_counts);
  free(x->all_slot);
  free(x->counts);
  for (int i = 0; i < MODEL_TABLES_MAX; i++) {
    free(x->rows[i]);
    free(x->grads[i]);
  }
  free(x->send);
  free(x->recv);
  free(x);
}

ps_err mpi_rows_pull(mpi_rows *x, trainer *t, long step, const data_batch *b, long long *total,
                     ps_error *err) {
  const int tables = t->model->tables;
  PS_TRY(gather_keys(x, t, b, err));
  *total = x->total;
  if (x->total == 0) return PS_ERR_OK; /* no rank had examples: nothing to learn */
  const size_t u = x->uni.n_unique, mine = b->size > 0 ? b->dedup->n_unique : 0;
  for (int i = 0; i < tables; i++) {
    PS_TRY(sparse_table_pull(t->tables[i], x->uni.unique, u, x->counts, step, x->rows[i], err));
  }
  const size_t first = (size_t)x->displs[x->rank]; /* this rank's keys among all */
  for (int i = 0; i < tables; i++) {
    const size_t dim = (size_t)t->model->dim[i];
    for (size_t j = 0; j < mine; j++) {
      const uint32_t s = x->all_slot[first + j];
      memcpy(t->rows[i] + j * dim, x->rows[i] + (size_t)s * dim, dim * sizeof(float));
    }
  }
  return PS_ERR_OK;
}

ps_err mpi_rows_gather_grads(mpi_rows *x, trainer *t, const data_batch *b, float scale,
                             ps_error *err) {
  const size_t mine = b->size > 0 ? b->dedup->n_unique : 0;
  if (b->size > 0) {
    for (int i = 0; i < t->model->tables; i++) {
      float *g = t->row_grads[i];
      for (size_t j = 0; j < mine * (size_t)t->model->dim[i]; j++) g[j] *= scale;
    }
  }
  return gather_grads(x, t, mine, err);
}

ps_err mpi_rows_apply(mpi_rows *x, trainer *t, long step, ps_error *err) {
  for (int i = 0; i < t->model->tables; i++) {
    PS_TRY(sparse_table_push(t->tables[i], x->uni.unique, x->uni.n_unique, x->grads[i], step,
                             err));
  }
  return PS_ERR_OK;
}

double mpi_rows_bytes(const mpi_rows *x) { return x->bytes; }
