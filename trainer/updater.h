/* The updater: how a trainer's step turns its gradients into the next
 * parameters and keeps the replicas in step. One implementation per way
 * (local optimizer, pserver push-pull, MPI all-reduce, NCCL all-reduce),
 * chosen once at start as the compute backend is; the training loop calls
 * it without knowing which. A new way to stay in step is a new file here,
 * not a branch in the loop. Used by the trainer's one thread. */
#ifndef PSTRAIN_TRAINER_UPDATER_H
#define PSTRAIN_TRAINER_UPDATER_H

#include <stddef.h>

#include "common/error.h"

struct trainer;
typedef struct updater updater;

typedef struct updater_ops {
  const char *name; /* "local", "pserver", "geo", "mpi", "nccl" */
  /* 1: the trainers hold the whole model and its optimizer state, so trainer
   * 0 checkpoints it; 0: the pservers hold it and write the checkpoints. */
  int holds_state;
  /* Called once the model exists and any --resume has loaded it: connects,
   * takes the initial parameters (setting the trainer's start_step where
   * the job stands) and checks every replica computes alike. NULL: nothing. */
  ps_err (*start)(updater *u, ps_error *err);
  /* The update of zero-based step `step` from the model's gradients. On
   * success *next is step + 1, or an earlier step the job went back to
   * (pserver recovery), whose parameters the model then holds. */
  ps_err (*apply)(updater *u, long step, long *next, ps_error *err);
  /* Gives every replica trainer 0's `bytes` bytes at data (host memory).
   * NULL: there is one replica, nothing to send. */
  ps_err (*broadcast)(updater *u, void *data, size_t bytes, ps_error *err);
  /* After the last of `steps` steps: says goodbye, logs totals. NULL: nothing. */
  ps_err (*finish)(updater *u, long steps, ps_error *err);
  /* Leaves the job and frees u; u may be half started. */
  void (*destroy)(updater *u);
} updater_ops;

/* Implementations put this first in their own struct. */
struct updater {
  const updater_ops *ops;
  struct trainer *t;   /* the model, its host buffers and the settings */
  double comm_seconds; /* in push-pull or all-reduce, since the start */
  double comm_bytes;   /* sent + received by this trainer, since the start */
};

/* Joins the job the trainer's settings name (--mode), before the data is
 * shared out: sets t->id, t->trainers and t->mode_label. t's data must be
 * loaded; its model need not exist yet. PS_ERR_UNSUPPORTED, saying so, when
 * this build lacks the mode. On error *out is NULL and nothing is held. */
ps_err updater_create(struct trainer *t, updater **out, ps_error *err);

/* The implementations updater_create chooses between. */
ps_err updater_local_create(struct trainer *t, updater **out, ps_error *err);
ps_err updater_pserver_create(struct trainer *t, updater **out, ps_error *err);
ps_err updater_geo_create(struct trainer *t, updater **out, ps_error *err);
#ifdef PSTRAIN_HAVE_MPI
ps_err updater_mpi_create(struct trainer *t, updater **out, ps_error *err);
#endif

static inline ps_err updater_start(updater *u, ps_error *err) {
  return u->ops->start != NULL ? u->ops->start(u, err) : PS_ERR_OK;
}

static inline ps_err updater_apply(updater *u, long step, long *next, ps_error *err) {
  return u->ops->apply(u, step, next, err);
}

static inline ps_err updater_broadcast(updater *u, void *data, size_t bytes, ps_error *err) {
  return u->ops->broadcast != NULL ? u->ops->broadcast(u, data, bytes, err) : PS_ERR_OK;
}

static inline ps_err updater_finish(updater *u, long steps, ps_error *err) {
  return u->ops->finish != NULL ? u->ops->finish(u, steps, err) : PS_ERR_OK;
}

static inline void updater_destroy(updater *u) {
  if (u != NULL) u->ops->destroy(u);
}

#endif
