/* Collective mode for the CTR models: the key and gradient exchange of a
 * step over MPI (see ctr_collective.h). Built only with MPI. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/ctr_collective.h"

#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/clock.h"
#include "common/log.h"
#include "trainer/collective.h"

#define FIELDS CRITEO_CAT_FIELDS

/* Floats per key in the gradients' exchange: one row of each table. */
static size_t floats_per_key(const ctr_trainer *t) {
  size_t per = 0;
  for (int i = 0; i < t->model->tables; i++) per += (size_t)t->model->dim[i];
  return per;
}

struct ctr_exchange {
  collective coll;
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
  float *dense;                  /* (layout.total) the dense gradients */
  double bytes, seconds;         /* sent + received, and time in steps, since the start */
  long steps;
};

#define MPI_TRY(err, what, expr)                                                         \
  do {                                                                                   \
    int mpi_rc_ = (expr);                                                                \
    if (mpi_rc_ != MPI_SUCCESS) {                                                        \
      char mpi_buf_[MPI_MAX_ERROR_STRING];                                               \
      return ps_error_set((err), PS_ERR_UNAVAILABLE, "collective CTR step: %s: %s", what, \
                          collective_mpi_text(mpi_rc_, mpi_buf_));                                  \
    }                                                                                    \
  } while (0)

ps_err ctr_collective_start(ctr_trainer *t, ps_error *err) {
  struct ctr_exchange *x = calloc(1, sizeof *x);
  if (x == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "collective mode: out of memory");
  t->exchange = x;
  if (collective_init(&x->coll, err) != PS_ERR_OK) return err->code;
  t->rank = x->coll.rank;
  t->ranks = x->coll.size;
  const trainer_options *o = &t->settings.opt;
  if (o->resume) {
    return ps_error_set(err, PS_ERR_UNSUPPORTED,
                        "--resume: not in collective mode for --model %s in this version; its "
                        "checkpoints resume in --mode local with --batch %ld",
                        o->model, o->batch * t->ranks);
  }
  return PS_ERR_OK;
}

static long long file_size(const char *path) {
  struct stat st;
  if (path[0] == '\0' || stat(path, &st) != 0) return -1;
  return (long long)st.st_size;
}

/* Everything that changes the replicas' bits, as "key=value;..." text. */
/* The job (its fields include the sparse tables' settings) and what else
 * every rank must share. */
static ps_err agreement_text(const ctr_trainer *t, char *buf, size_t len, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  job_config job;
  ctr_trainer_job(t, &job);
  const job_extra extras[] = {{"epochs", o->epochs},
                              {"training examples", t->examples_per_epoch},
                              {"max steps", o->max_steps},
                              {"data bytes", (long)file_size(o->data)},
                              {"test data bytes", (long)file_size(o->test_data)},
                              {"test samples", o->test_samples}};
  if (job_config_agreement(&job, extras, sizeof extras / sizeof extras[0], buf, len, err) !=
      PS_ERR_OK) {
    return err->code;
  }
  size_t used = strlen(buf);
  int n = snprintf(buf + used, len - used, ";max table MiB=%.17g;device=%s", o->max_table_mb,
                   t->be->name);
  if (n < 0 || (size_t)n >= len - used) {
    return ps_error_set(err, PS_ERR_OUT_OF_RANGE, "collective mode: configuration text too long");
  }
  return PS_ERR_OK;
}

ps_err ctr_collective_ready(ctr_trainer *t, ps_error *err) {
  struct ctr_exchange *x = t->exchange;
  char config[4096];
  if (agreement_text(t, config, sizeof config, err) != PS_ERR_OK ||
      collective_check_agreement(&x->coll, config, err) != PS_ERR_OK) {
    return err->code;
  }
  const size_t ranks = (size_t)t->ranks, per = floats_per_key(t);
  x->max_keys = (size_t)t->settings.opt.batch * FIELDS;
  size_t all = ranks * x->max_keys;
  /* Before allocating: a batch too large is that, not "out of memory". */
  if (all * per > (size_t)INT32_MAX) {
    return ps_error_set(err, PS_ERR_OUT_OF_RANGE,
                        "collective mode: --batch %ld on %d ranks exchanges more values than an "
                        "MPI count holds",
                        t->settings.opt.batch, t->ranks);
  }
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
  x->dense = calloc(t->model->layout.total, sizeof(float));
  if (!ok || x->recv_counts == NULL || x->displs == NULL || x->sizes == NULL ||
      x->all_keys == NULL || x->all_counts == NULL || x->all_slot == NULL || x->counts == NULL ||
      x->send == NULL || x->recv == NULL || x->dense == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY,
                        "collective mode: out of memory for the exchange of %zu keys", all);
  }
  LOG_INFO("collective CTR mode: rank %d of %d, every rank holds every table", t->rank, t->ranks);
  return PS_ERR_OK;
}

/* Counts and displacements of an Allgatherv of `per` elements per key. */
static size_t layout_gather(struct ctr_exchange *x, int ranks, size_t per) {
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
static ps_err gather_keys(ctr_trainer *t, int count, long long *total, ps_error *err) {
  struct ctr_exchange *x = t->exchange;
  const sparse_dedup *d = t->batch.dedup;
  long long mine[2] = {count > 0 ? (long long)d->n_unique : 0, count};
  MPI_TRY(err, "gathering the batch sizes",
          MPI_Allgather(mine, 2, MPI_LONG_LONG, x->sizes, 2, MPI_LONG_LONG, MPI_COMM_WORLD));
  size_t keys = layout_gather(x, t->ranks, 1);
  *total = 0;
  for (int r = 0; r < t->ranks; r++) *total += x->sizes[2 * r + 1];
  MPI_TRY(err, "gathering the keys",
          MPI_Allgatherv(d->unique, (int)mine[0], MPI_UINT64_T, x->all_keys, x->recv_counts,
                         x->displs, MPI_UINT64_T, MPI_COMM_WORLD));
  MPI_TRY(err, "gathering the key counts",
          MPI_Allgatherv(d->counts, (int)mine[0], MPI_UINT32_T, x->all_counts, x->recv_counts,
                         x->displs, MPI_UINT32_T, MPI_COMM_WORLD));
  x->bytes += (double)(keys - (size_t)mine[0]) * 12.0 +
              (double)mine[0] * 12.0 * (double)(t->ranks - 1) + 32.0 * t->ranks;
  if (sparse_dedup_run(&x->uni, x->all_keys, keys, x->all_slot, err) != PS_ERR_OK) {
    return err->code;
  }
  memset(x->counts, 0, x->uni.n_unique * sizeof *x->counts);
  for (size_t i = 0; i < keys; i++) x->counts[x->all_slot[i]] += x->all_counts[i];
  return PS_ERR_OK;
}

/* Step (7): every rank's gradients, summed in rank order into the union's. */
static ps_err gather_grads(ctr_trainer *t, size_t mine, ps_error *err) {
  struct ctr_exchange *x = t->exchange;
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
  size_t values = layout_gather(x, t->ranks, per);
  MPI_TRY(err, "gathering the sparse gradients",
          MPI_Allgatherv(x->send, (int)(mine * per), MPI_FLOAT, x->recv, x->recv_counts,
                         x->displs, MPI_FLOAT, MPI_COMM_WORLD));
  x->bytes += (double)(values - mine * per) * 4.0 + (double)(mine * per) * 4.0 * (t->ranks - 1);
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

/* Step (9): the dense gradients summed over the ranks, as the MLP's
 * collective mode does (an all-reduce leaves the same sum on every rank). */
static ps_err sum_dense(ctr_trainer *t, float scale, int computed, ps_error *err) {
  struct ctr_exchange *x = t->exchange;
  const size_t n = t->model->layout.total;
  if (computed) {
    if (model_get_grads(t->model, x->dense, err) != PS_ERR_OK) return err->code;
    for (size_t i = 0; i < n; i++) x->dense[i] *= scale;
  } else {
    memset(x->dense, 0, n * sizeof(float));
  }
  MPI_TRY(err, "summing the dense gradients",
          MPI_Allreduce(MPI_IN_PLACE, x->dense, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
  x->bytes += 2.0 * 2.0 * (double)(t->ranks - 1) / t->ranks * (double)n * 4.0;
  return model_set_grads(t->model, x->dense, err);
}

ps_err ctr_collective_step(ctr_trainer *t, int count, long step, double *loss_sum,
                           ps_error *err) {
  struct ctr_exchange *x = t->exchange;
  const int tables = t->model->tables;
  const double start = now_s(), bytes_before = x->bytes;
  long long total = 0;
  if (gather_keys(t, count, &total, err) != PS_ERR_OK) return err->code;
  t->comm_seconds += now_s() - start;
  if (total == 0) return PS_ERR_OK; /* no rank had examples: nothing to learn */
  const size_t u = x->uni.n_unique, mine = count > 0 ? t->batch.dedup->n_unique : 0;
  for (int i = 0; i < tables; i++) {
    if (sparse_table_pull(t->tables[i], x->uni.unique, u, x->counts, step, x->rows[i], err) !=
        PS_ERR_OK) {
      return err->code;
    }
  }
  const size_t first = (size_t)x->displs[t->rank]; /* this rank's keys among all */
  for (int i = 0; i < tables; i++) {
    const size_t dim = (size_t)t->model->dim[i];
    for (size_t j = 0; j < mine; j++) {
      const uint32_t s = x->all_slot[first + j];
      memcpy(t->rows[i] + j * dim, x->rows[i] + (size_t)s * dim, dim * sizeof(float));
    }
  }
  double t0 = timeline_span(t->tl, "pull", step, start); /* the keys' all-gather, the rows */
  /* Each rank's share of the global batch's mean loss. */
  const float scale = (float)((double)count / (double)total);
  if (count > 0) {
    model_batch b = ctr_batch_of(t, t->batch.examples, t->batch.slot, t->batch.dedup, count);
    model_outputs out = {0};
    PS_TRY(model_forward(t->model, &b, 1, &out, err));
    *loss_sum += out.loss_sum;
    t0 = timeline_span(t->tl, "forward", step, t0);
    PS_TRY(model_backward(t->model, &b, t->row_grads, err));
    for (int i = 0; i < tables; i++) {
      float *g = t->row_grads[i];
      for (size_t j = 0; j < mine * (size_t)t->model->dim[i]; j++) g[j] *= scale;
    }
    t0 = timeline_span(t->tl, "backward", step, t0);
  }
  PS_TRY(gather_grads(t, mine, err));
  PS_TRY(sum_dense(t, scale, count > 0, err));
  t->comm_seconds += now_s() - t0;
  t0 = timeline_span(t->tl, "allreduce", step, t0); /* the rows' all-gather, the dense sum */
  PS_TRY(model_apply_optimizer(t->model, &t->settings.optimizer, step, err));
  for (int i = 0; i < tables; i++) {
    PS_TRY(sparse_table_push(t->tables[i], x->uni.unique, u, x->grads[i], step, err));
  }
  timeline_span(t->tl, "apply", step, t0);
  x->steps++;
  x->seconds += now_s() - start;
  LOG_DEBUG("step %ld: %zu keys in the union, %.0f bytes sent + received", step, u,
            x->bytes - bytes_before);
  return PS_ERR_OK;
}

void ctr_collective_metrics(const ctr_trainer *t, char *buf, size_t len) {
  const struct ctr_exchange *x = t->exchange;
  snprintf(buf, len, ",\"bytes_per_step\":%.0f", x->steps > 0 ? x->bytes / (double)x->steps : 0.0);
}

void ctr_collective_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

void ctr_collective_stop(ctr_trainer *t) {
  struct ctr_exchange *x = t->exchange;
  if (x == NULL) return;
  if (x->steps > 0) {
    LOG_INFO("collective CTR mode, rank %d: %ld steps, %.0f bytes sent + received per step "
             "(%.1f MiB in all), %.2fs in steps",
             t->rank, x->steps, x->bytes / (double)x->steps, x->bytes / 1048576.0, x->seconds);
  }
  collective_finalize(&x->coll);
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
  free(x->dense);
  free(x);
  t->exchange = NULL;
}
