/* The replica interface: how a trainer's step turns the model's gradients
 * into the next parameters and keeps the replicas of the model in step,
 * for the dense parameters and the sparse tables alike. One implementation
 * per way, chosen once from --mode and --update: local (the optimizer here),
 * pserver (sync, async, SSP: push-pull with the pservers), geo (local steps,
 * an exchange of the change every K), mpi (all-reduce, the tables' rows
 * all-gathered) and nccl (mpi with the dense sum on the GPUs). No
 * implementation knows which model it serves: it sees a dense tensor group
 * and 0..n tables of rows (trainer/model/model.h). The training loop
 * (train.c) calls the ops without knowing which. One thread. */
#ifndef PSTRAIN_TRAINER_REPLICA_REPLICA_H
#define PSTRAIN_TRAINER_REPLICA_REPLICA_H

#include <stddef.h>

#include "common/error.h"
#include "common/sparse_table.h"
#include "trainer/data/data_source.h"

struct trainer;
typedef struct replica replica;

typedef struct replica_ops {
  const char *name; /* "local", "pserver", "geo", "mpi", "nccl" */
  /* 1: every trainer holds the whole model and its optimizer state (the
   * tables in t->tables), so trainer 0 checkpoints it; 0: the pservers hold
   * it and write the checkpoints. */
  int holds_state;
  /* Once the model and the tables exist and any --resume has loaded them:
   * connects, takes the initial parameters (setting t->start_step where
   * the job stands) and checks every replica trains alike. NULL: nothing. */
  ps_err (*start)(replica *r, ps_error *err);
  /* The rows of step's batch b (its distinct keys) into t->rows, before
   * forward. NULL: the model has no tables to read (never with tables). */
  ps_err (*pull)(replica *r, long step, const data_batch *b, ps_error *err);
  /* The update of step from the dense gradients in the model and the row
   * gradients in t->row_grads (b->size 0: this trainer had no examples).
   * On success *next is step + 1, or an earlier step the job went back to
   * (pserver recovery), whose parameters the model then holds. */
  ps_err (*push)(replica *r, long step, const data_batch *b, long *next, ps_error *err);
  /* Evaluation: the rows of d's keys, read only, into t->rows (zeros for
   * keys never trained). Sets t->rewind_to when the job went back. */
  ps_err (*lookup)(replica *r, const sparse_dedup *d, ps_error *err);
  /* Before --export: the whole model into this process (the model's dense
   * parameters, every row into t->tables). NULL: it is here already. */
  ps_err (*gather)(replica *r, ps_error *err);
  /* Gives every replica trainer 0's `bytes` bytes at data (host memory).
   * NULL: there is one replica, nothing to send. */
  ps_err (*broadcast)(replica *r, void *data, size_t bytes, ps_error *err);
  /* The metrics row's fields of this way (",\"bytes_per_step\":..."), for
   * models with tables. NULL: none. */
  void (*metrics)(const replica *r, char *buf, size_t len);
  /* Before an evaluation of handed-out data: the model takes the
   * pservers' current dense parameters (others pushed since this trainer's
   * last push, or it pushed nothing). NULL: the model has them. */
  ps_err (*refresh)(replica *r, ps_error *err);
  /* Handed-out data (--shard-steps): asks pserver 0 for the next shard
   * (see data_shard_fn). NULL: this way hands out nothing. */
  ps_err (*next_shard)(replica *r, long epoch, long finished, data_shard *out, ps_error *err);
  /* After the last of `steps` steps: says goodbye, logs totals. NULL: nothing. */
  ps_err (*finish)(replica *r, long steps, ps_error *err);
  /* A failure on this trainer: ends the others too where they would wait
   * for it (collective). NULL: nothing. */
  void (*abort)(replica *r, int status);
  /* Leaves the job and frees r; r may be half started. */
  void (*destroy)(replica *r);
} replica_ops;

/* Implementations put this first in their own struct. */
struct replica {
  const replica_ops *ops;
  struct trainer *t;   /* the model, its tables, host buffers and the settings */
  double comm_seconds; /* in push-pull, exchanges or all-reduce, since the start */
  double comm_bytes;   /* sent + received by this trainer, since the start */
  /* start checked that every replica trains alike: from here a failure is
   * every trainer's (before, one may wait for the others: abort). */
  int agreed;
};

/* Joins the job the trainer's settings name (--mode, --update), before the
 * data is shared out: sets t->id, t->trainers and t->mode_label.
 * PS_ERR_UNSUPPORTED, saying so, when this build lacks the way. On error
 * *out is NULL and nothing is held. */
ps_err replica_create(struct trainer *t, replica **out, ps_error *err);

/* The implementations replica_create chooses between. */
ps_err replica_local_create(struct trainer *t, replica **out, ps_error *err);
/* label: "pserver-sync", ... for metrics; parts: backward may push the
 * dense gradients in parts (--overlap; the sync update applies them so);
 * leaves: with handed-out data a trainer without data tells the pservers
 * so (ssp: it holds no one back). */
ps_err replica_pserver_create(struct trainer *t, const char *label, int parts, int leaves,
                              replica **out, ps_error *err);
ps_err replica_geo_create(struct trainer *t, replica **out, ps_error *err);
#ifdef PSTRAIN_HAVE_MPI
ps_err replica_mpi_create(struct trainer *t, replica **out, ps_error *err);
#endif

/* What several replicas share: the rows of b's keys read from t->tables
 * at step (rows created and counted), a "pull" span; the tables' rows
 * updated from t->row_grads and the dense optimizer step, an "apply" span;
 * the tables' eviction of rows not seen for --evict-after steps. */
ps_err replica_pull_local(struct trainer *t, long step, const data_batch *b, ps_error *err);
ps_err replica_apply_local(struct trainer *t, long step, const data_batch *b, ps_error *err);
void replica_evict_local(struct trainer *t, long step);
ps_err replica_lookup_local(replica *r, const sparse_dedup *d, ps_error *err);

static inline ps_err replica_start(replica *r, ps_error *err) {
  return r->ops->start != NULL ? r->ops->start(r, err) : PS_ERR_OK;
}
static inline ps_err replica_pull(replica *r, long step, const data_batch *b, ps_error *err) {
  return r->ops->pull != NULL ? r->ops->pull(r, step, b, err) : PS_ERR_OK;
}
static inline ps_err replica_push(replica *r, long step, const data_batch *b, long *next,
                                  ps_error *err) {
  return r->ops->push(r, step, b, next, err);
}
static inline ps_err replica_lookup(replica *r, const sparse_dedup *d, ps_error *err) {
  return r->ops->lookup(r, d, err);
}
static inline ps_err replica_gather(replica *r, ps_error *err) {
  return r->ops->gather != NULL ? r->ops->gather(r, err) : PS_ERR_OK;
}
static inline ps_err replica_broadcast(replica *r, void *data, size_t bytes, ps_error *err) {
  return r->ops->broadcast != NULL ? r->ops->broadcast(r, data, bytes, err) : PS_ERR_OK;
}
static inline void replica_metrics(const replica *r, char *buf, size_t len) {
  buf[0] = '\0';
  if (r->ops->metrics != NULL) r->ops->metrics(r, buf, len);
}
static inline ps_err replica_refresh(replica *r, ps_error *err) {
  return r->ops->refresh != NULL ? r->ops->refresh(r, err) : PS_ERR_OK;
}
static inline ps_err replica_next_shard(replica *r, long epoch, long finished, data_shard *out,
                                        ps_error *err) {
  if (r->ops->next_shard == NULL) {
    return ps_error_set(err, PS_ERR_UNSUPPORTED, "--mode %s hands out no data (--shard-steps)",
                        r->ops->name);
  }
  return r->ops->next_shard(r, epoch, finished, out, err);
}
static inline ps_err replica_finish(replica *r, long steps, ps_error *err) {
  return r->ops->finish != NULL ? r->ops->finish(r, steps, err) : PS_ERR_OK;
}
static inline void replica_abort(replica *r, int status) {
  if (r != NULL && r->ops->abort != NULL) r->ops->abort(r, status);
}
static inline void replica_destroy(replica *r) {
  if (r != NULL) r->ops->destroy(r);
}

#endif
