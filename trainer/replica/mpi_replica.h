/* What the collective replica's files share (mpi.c, mpi_rows.c, nccl.c):
 * the sparse half's all-gather of keys and row gradients, and NCCL's dense
 * sum on the GPUs. Internal to trainer/replica; built only with MPI. */
#ifndef PSTRAIN_TRAINER_REPLICA_MPI_REPLICA_H
#define PSTRAIN_TRAINER_REPLICA_MPI_REPLICA_H

#include <mpi.h>

#include "trainer/replica/collective.h"
#include "trainer/replica/replica.h"
#include "trainer/train.h"

/* Returns a collective step's error naming what failed when an MPI call does. */
#define MPI_TRY(err, what, expr)                                                             \
  do {                                                                                       \
    int mpi_rc_ = (expr);                                                                    \
    if (mpi_rc_ != MPI_SUCCESS) {                                                            \
      char mpi_buf_[MPI_MAX_ERROR_STRING];                                                   \
      return ps_error_set((err), PS_ERR_UNAVAILABLE, "collective step: %s: %s", what,        \
                          collective_mpi_text(mpi_rc_, mpi_buf_));                           \
    }                                                                                        \
  } while (0)

typedef struct mpi_rows mpi_rows;

/* The exchange's buffers for batches of --batch on t->trainers ranks. */
ps_err mpi_rows_create(mpi_rows **out, const trainer *t, ps_error *err);
void mpi_rows_destroy(mpi_rows *x);
/* Every rank's keys of its batch b; the union's rows pulled from t->tables
 * at step, this rank's copied into t->rows. *total: the examples of every
 * rank's batch (0: nothing else happens this step). */
ps_err mpi_rows_pull(mpi_rows *x, trainer *t, long step, const data_batch *b, long long *total,
                     ps_error *err);
/* This rank's row gradients (t->row_grads) times scale, every rank's summed
 * in rank order into the union's. */
ps_err mpi_rows_gather_grads(mpi_rows *x, trainer *t, const data_batch *b, float scale,
                             ps_error *err);
/* The union's summed gradients into t->tables at step. */
ps_err mpi_rows_apply(mpi_rows *x, trainer *t, long step, ps_error *err);
/* Bytes sent + received so far. */
double mpi_rows_bytes(const mpi_rows *x);

/* Bytes a rank sends and receives to all-reduce n floats: a ring sends and
 * receives 2(N-1)/N of them each way. */
static inline double replica_ring_bytes(int ranks, size_t n) {
  return 4.0 * (ranks - 1) / ranks * (double)n * sizeof(float);
}

#ifdef PSTRAIN_HAVE_CUDA
/* nccl.c: NCCL on the backend's GPU; every rank calls it. */
ps_err replica_nccl_start(collective *coll, trainer *t, ps_error *err);
/* The dense gradients averaged on the GPUs (the model's grads_device). */
ps_err replica_nccl_mean(collective *coll, trainer *t, ps_error *err);
#endif

#endif
