/* Collective mode over MPI: every rank joins the MPI job and checks that
 * all train the same thing; each step all-reduces the gradients in host
 * memory (through staging copies when the model is on a GPU) and applies
 * the optimizer locally. On GPUs with NCCL, updater_nccl.c takes the steps
 * over. Built only with MPI (PSTRAIN_HAVE_MPI). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "trainer/train.h"
#include "trainer/updater_collective.h"

/* Joins the MPI job and checks every rank trains the same thing. */
static ps_err join_collective(trainer *t, collective *coll, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  job_config job;
  trainer_job(t, 1, &job);
  const job_extra extras[] = {{"epochs", o->epochs},
                              {"training samples", t->train.count},
                              {"max steps", o->max_steps}};
  char config[2048];
  if (job_config_agreement(&job, extras, sizeof extras / sizeof extras[0], config, sizeof config,
                           err) != PS_ERR_OK) {
    return err->code;
  }
  return collective_check_agreement(coll, config, err);
}

#ifndef PSTRAIN_HAVE_NCCL
/* Without NCCL a GPU model's gradients go through host memory (mpi_apply). */
static ps_err updater_nccl_start(collective_updater *c, ps_error *err) {
  (void)c;
  return ps_error_set(err, PS_ERR_UNSUPPORTED, "this build has no NCCL");
}
#endif

/* Every rank must take the same road: all on GPUs (NCCL) or all on CPUs. */
static ps_err mpi_start(updater *u, ps_error *err) {
  collective_updater *c = (collective_updater *)u;
  trainer *t = u->t;
  char backend_text[64];
  snprintf(backend_text, sizeof backend_text, "device=%s", t->be->name);
  if (collective_check_agreement(&c->coll, backend_text, err) != PS_ERR_OK) return err->code;
  if (strcmp(t->be->name, "cuda") != 0) return PS_ERR_OK;
  if (updater_nccl_start(c, err) == PS_ERR_OK) return PS_ERR_OK;
  if (err->code != PS_ERR_UNSUPPORTED) return err->code;
  LOG_WARN("collective mode on GPUs without NCCL (%s): gradients go through host memory",
           err->msg);
  return PS_ERR_OK;
}

static ps_err mpi_apply(updater *u, long step, long *next, ps_error *err) {
  collective_updater *c = (collective_updater *)u;
  trainer *t = u->t;
  size_t n = t->model->layout.total;
  if (t->staged && model_get_grads(t->model, t->host_grads, err) != PS_ERR_OK) return err->code;
  double start = now_s();
  if (collective_allreduce_mean(&c->coll, t->host_grads, n, err) != PS_ERR_OK) return err->code;
  u->comm_seconds += now_s() - start;
  start = timeline_span(t->tl, "allreduce", step, start);
  u->comm_bytes += updater_ring_bytes(t->trainers, n);
  if (t->staged && model_set_grads(t->model, t->host_grads, err) != PS_ERR_OK) return err->code;
  if (model_apply_optimizer(t->model, &t->settings.optimizer, step, err) != PS_ERR_OK) {
    return err->code;
  }
  timeline_span(t->tl, "apply", step, start);
  *next = step + 1;
  return PS_ERR_OK;
}

ps_err updater_mpi_broadcast(updater *u, void *data, size_t bytes, ps_error *err) {
  return collective_broadcast(&((collective_updater *)u)->coll, data, bytes, err);
}

void updater_mpi_destroy(updater *u) {
  collective_updater *c = (collective_updater *)u;
  collective_finalize(&c->coll);
  free(c);
}

static const updater_ops mpi_ops = {
    .name = "mpi",
    .holds_state = 1,
    .start = mpi_start,
    .apply = mpi_apply,
    .broadcast = updater_mpi_broadcast,
    .destroy = updater_mpi_destroy,
};

ps_err updater_mpi_create(trainer *t, updater **out, ps_error *err) {
  collective_updater *c = calloc(1, sizeof *c);
  if (c == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory");
  c->base.ops = &mpi_ops;
  c->base.t = t;
  t->mode_label = "collective";
  if (collective_init(&c->coll, err) != PS_ERR_OK) goto fail;
  t->id = c->coll.rank;
  t->trainers = c->coll.size;
  if (join_collective(t, &c->coll, err) != PS_ERR_OK) goto fail;
  *out = &c->base;
  return PS_ERR_OK;
fail:
  updater_mpi_destroy(&c->base);
  return err->code;
}
