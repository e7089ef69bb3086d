/* What the MPI and NCCL updaters share: a collective job starts as an MPI
 * one (updater_mpi.c); on GPUs with NCCL, NCCL's ops take over the steps
 * (updater_nccl.c) while MPI still carries the start-up messages. Internal
 * to those two files. */
#ifndef PSTRAIN_TRAINER_UPDATER_COLLECTIVE_H
#define PSTRAIN_TRAINER_UPDATER_COLLECTIVE_H

#include "trainer/collective.h"
#include "trainer/updater.h"

typedef struct collective_updater {
  updater base;
  collective coll;
} collective_updater;

/* Bytes a rank sends and receives to all-reduce n floats: a ring sends and
 * receives 2(N-1)/N of them each way. */
static inline double updater_ring_bytes(int ranks, size_t n) {
  return 4.0 * (ranks - 1) / ranks * (double)n * sizeof(float);
}

/* MPI's broadcast, finish and destroy, which NCCL's ops reuse. */
ps_err updater_mpi_broadcast(updater *u, void *data, size_t bytes, ps_error *err);
void updater_mpi_destroy(updater *u);

#ifdef PSTRAIN_HAVE_NCCL
/* Sets up NCCL on the backend's GPU; on success u's ops become NCCL's. Every
 * rank calls it. */
ps_err updater_nccl_start(collective_updater *c, ps_error *err);
#endif

#endif
