/* Collective mode over MPI: every rank joins the MPI job, checks that all
 * train the same thing and holds the whole model. Each step the dense
 * gradients are all-reduced in host memory (on GPUs with NCCL, in device
 * memory: nccl.c) and the tables' rows all-gathered (mpi_rows.c); every
 * rank applies the same update. A step of N ranks with --batch b is a local
 * step with --batch N*b. Built only with MPI (PSTRAIN_HAVE_MPI). */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/clock.h"
#include "common/ctr_tables.h"
#include "common/log.h"
#include "trainer/replica/mpi_replica.h"

typedef struct mpi_replica {
  replica base;
  collective coll;
  int nccl;         /* the dense sum is NCCL's */
  mpi_rows *rows;   /* models with tables: the rows' exchange */
  long long total;  /* the step's examples on every rank (models with tables) */
  float *dense;     /* (layout.total) models with tables: the dense gradients, scaled */
  long steps;       /* taken with examples */
} mpi_replica;

static long long file_size(const char *path) {
  struct stat st;
  if (path[0] == '\0' || stat(path, &st) != 0) return -1;
  return (long long)st.st_size;
}

/* Everything that changes the replicas' bits: the job and what else every
 * rank must share, as "key=value;..." text. */
static ps_err agreement_text(const trainer *t, char *buf, size_t len, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  job_config job;
  trainer_job(t, &job);
  job.optimizer.total_steps = 0; /* follows from the batch and the data, compared as such */
  long data_bytes = t->files.criteo ? (long)file_size(o->data) : -1;
  const job_extra extras[] = {{"epochs", o->epochs},
                              {"training examples", t->files.examples},
                              {"max steps", o->max_steps},
                              {"data bytes", data_bytes},
                              {"test data bytes", (long)file_size(o->test_data)},
                              {"test samples", o->test_samples}};
  PS_TRY(job_config_agreement(&job, extras, sizeof extras / sizeof extras[0], buf, len, err));
  size_t used = strlen(buf);
  int n = snprintf(buf + used, len - used, ";max table MiB=%.17g;device=%s", o->max_table_mb,
                   t->be->name);
  if (n < 0 || (size_t)n >= len - used) {
    return ps_error_set(err, PS_ERR_OUT_OF_RANGE, "collective mode: configuration text too long");
  }
  return PS_ERR_OK;
}

/* Every rank must train alike and take the same road: all on GPUs (NCCL)
 * or all on CPUs. */
static ps_err mpi_start(replica *r, ps_error *err) {
  mpi_replica *m = (mpi_replica *)r;
  trainer *t = r->t;
  char config[4096];
  PS_TRY(agreement_text(t, config, sizeof config, err));
  PS_TRY(collective_check_agreement(&m->coll, config, err));
  r->agreed = 1; /* from here every rank fails alike */
  if (t->model->tables > 0) {
    PS_TRY(mpi_rows_create(&m->rows, t, err));
    m->dense = calloc(t->model->layout.total > 0 ? t->model->layout.total : 1, sizeof(float));
    if (m->dense == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "collective: out of memory");
    LOG_INFO("collective mode: rank %d of %d, every rank holds every table", t->id, t->trainers);
  }
  if (strcmp(t->be->name, "cuda") != 0) return PS_ERR_OK;
#ifdef PSTRAIN_HAVE_CUDA
  if (t->model->tables > 0) {
    LOG_INFO("collective: the dense gradients are summed in host memory, scaled by each rank's "
             "examples");
    return PS_ERR_OK;
  }
  if (replica_nccl_start(&m->coll, t, err) == PS_ERR_OK) {
    m->nccl = 1;
    return PS_ERR_OK;
  }
  if (err->code != PS_ERR_UNSUPPORTED) return err->code;
#else
  ps_error_set(err, PS_ERR_UNSUPPORTED, "this build has no NCCL");
#endif
  LOG_WARN("collective mode on GPUs without NCCL (%s): gradients go through host memory",
           err->msg);
  return PS_ERR_OK;
}

/* Models with tables: every rank's keys, the union's rows. */
static ps_err mpi_pull(replica *r, long step, const data_batch *b, ps_error *err) {
  mpi_replica *m = (mpi_replica *)r;
  if (m->rows == NULL) return PS_ERR_OK;
  const double start = now_s();
  PS_TRY(mpi_rows_pull(m->rows, r->t, step, b, &m->total, err));
  r->comm_seconds += now_s() - start;
  if (m->total > 0) timeline_span(r->t->tl, "pull", step, start); /* the keys' all-gather, the rows */
  return PS_ERR_OK;
}

/* The dense gradients scaled by this rank's share of the examples, summed
 * over the ranks (an all-reduce leaves the same sum on every rank). */
static ps_err sum_dense(mpi_replica *m, float scale, int computed, ps_error *err) {
  trainer *t = m->base.t;
  const size_t n = t->model->layout.total;
  if (computed) {
    PS_TRY(model_get_grads(t->model, m->dense, err));
    for (size_t i = 0; i < n; i++) m->dense[i] *= scale;
  } else {
    memset(m->dense, 0, n * sizeof(float));
  }
  MPI_TRY(err, "summing the dense gradients",
          MPI_Allreduce(MPI_IN_PLACE, m->dense, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
  m->base.comm_bytes += replica_ring_bytes(t->trainers, n);
  return model_set_grads(t->model, m->dense, err);
}

/* Models with tables: the rows' gradients all-gathered, the dense ones
 * summed, each rank's weighted by its examples; then the same update on
 * every replica. */
static ps_err push_with_rows(mpi_replica *m, long step, const data_batch *b, ps_error *err) {
  trainer *t = m->base.t;
  if (m->total == 0) return PS_ERR_OK; /* no rank had examples: nothing to learn */
  double t0 = now_s();
  const float scale = (float)((double)b->size / (double)m->total);
  const double rows_before = mpi_rows_bytes(m->rows);
  PS_TRY(mpi_rows_gather_grads(m->rows, t, b, scale, err));
  PS_TRY(sum_dense(m, scale, b->size > 0, err));
  m->base.comm_bytes += mpi_rows_bytes(m->rows) - rows_before;
  m->base.comm_seconds += now_s() - t0;
  t0 = timeline_span(t->tl, "allreduce", step, t0); /* the rows' all-gather, the dense sum */
  PS_TRY(model_apply_optimizer(t->model, &t->settings.optimizer, step, err));
  PS_TRY(mpi_rows_apply(m->rows, t, step, err));
  timeline_span(t->tl, "apply", step, t0);
  m->steps++;
  return PS_ERR_OK;
}

/* Models without tables: every rank has a batch of the same size, so the
 * mean of the gradients. */
static ps_err push_dense(mpi_replica *m, long step, ps_error *err) {
  trainer *t = m->base.t;
  size_t n = t->model->layout.total;
  double start = now_s();
#ifdef PSTRAIN_HAVE_CUDA
  if (m->nccl) {
    PS_TRY(replica_nccl_mean(&m->coll, t, err));
    m->base.comm_seconds += now_s() - start;
    m->base.comm_bytes += replica_ring_bytes(t->trainers, n);
    m->steps++;
    return model_apply_optimizer(t->model, &t->settings.optimizer, step, err);
  }
#endif
  if (t->staged) PS_TRY(model_get_grads(t->model, t->host_grads, err));
  start = now_s();
  PS_TRY(collective_allreduce_mean(&m->coll, t->host_grads, n, &t->model->layout, err));
  m->base.comm_seconds += now_s() - start;
  start = timeline_span(t->tl, "allreduce", step, start);
  m->base.comm_bytes += replica_ring_bytes(t->trainers, n);
  if (t->staged) PS_TRY(model_set_grads(t->model, t->host_grads, err));
  PS_TRY(model_apply_optimizer(t->model, &t->settings.optimizer, step, err));
  timeline_span(t->tl, "apply", step, start);
  m->steps++;
  return PS_ERR_OK;
}

static ps_err mpi_push(replica *r, long step, const data_batch *b, long *next, ps_error *err) {
  mpi_replica *m = (mpi_replica *)r;
  PS_TRY(m->rows != NULL ? push_with_rows(m, step, b, err) : push_dense(m, step, err));
  replica_evict_local(r->t, step);
  *next = step + 1;
  return PS_ERR_OK;
}

static ps_err mpi_broadcast(replica *r, void *data, size_t bytes, ps_error *err) {
  return collective_broadcast(&((mpi_replica *)r)->coll, data, bytes, err);
}

static void mpi_metrics(const replica *r, char *buf, size_t len) {
  const mpi_replica *m = (const mpi_replica *)r;
  snprintf(buf, len, ",\"bytes_per_step\":%.0f",
           m->steps > 0 ? r->comm_bytes / (double)m->steps : 0.0);
}

static ps_err mpi_finish(replica *r, long steps, ps_error *err) {
  (void)steps;
  (void)err;
  const mpi_replica *m = (const mpi_replica *)r;
  if (m->steps > 0) {
    LOG_INFO("collective mode, rank %d: %ld steps, %.0f bytes sent + received per step (%.1f MiB "
             "in all), %.2fs communicating",
             r->t->id, m->steps, r->comm_bytes / (double)m->steps, r->comm_bytes / 1048576.0,
             r->comm_seconds);
  }
  return PS_ERR_OK;
}

static void mpi_abort(replica *r, int status) {
  (void)r;
  MPI_Abort(MPI_COMM_WORLD, status);
}

static void mpi_destroy(replica *r) {
  mpi_replica *m = (mpi_replica *)r;
  collective_finalize(&m->coll);
  mpi_rows_destroy(m->rows);
  free(m->dense);
  free(m);
}

static const replica_ops mpi_ops = {
    .name = "mpi",
    .holds_state = 1,
    .start = mpi_start,
    .pull = mpi_pull,
    .push = mpi_push,
    .lookup = replica_lookup_local,
    .broadcast = mpi_broadcast,
    .metrics = mpi_metrics,
    .finish = mpi_finish,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
};

ps_err replica_mpi_create(trainer *t, replica **out, ps_error *err) {
  mpi_replica *m = calloc(1, sizeof *m);
  if (m == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory");
  m->base.ops = &mpi_ops;
  m->base.t = t;
  t->mode_label = "collective";
  if (collective_init(&m->coll, err) != PS_ERR_OK) goto fail;
  t->id = m->coll.rank;
  t->trainers = m->coll.size;
  const trainer_options *o = &t->settings.opt;
  if (o->resume && ctr_table_count(&t->settings.model) > 0) {
    ps_error_set(err, PS_ERR_UNSUPPORTED,
                 "--resume: not in collective mode for --model %s in this version; its "
                 "checkpoints resume in --mode local with --batch %ld",
                 o->model, o->batch * t->trainers);
    *out = &m->base; /* the caller ends every rank: the others may not fail here */
    return err->code;
  }
  *out = &m->base;
  return PS_ERR_OK;
fail:
  mpi_destroy(&m->base);
  return err->code;
}
