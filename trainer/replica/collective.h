/* Collective mode over MPI: rank and size from the launcher, a check at
 * start that every rank trains the same job (naming the rank and the field
 * that differ), and the all-reduce that averages gradients each step. Built
 * only when CMake found MPI (PSTRAIN_HAVE_MPI); its NCCL part only with the
 * CUDA toolkit (PSTRAIN_HAVE_CUDA), through the CUDA module's NCCL calls. */
#ifndef PSTRAIN_TRAINER_COLLECTIVE_H
#define PSTRAIN_TRAINER_COLLECTIVE_H

#include <stddef.h>

#include "common/error.h"
#include "common/tensor.h"
#include "trainer/backend/cuda_module.h"

typedef struct collective {
  int rank, size;
  int initialized; /* MPI_Init was called here */
  const cuda_module *cuda; /* set once collective_use_nccl succeeded */
  cuda_nccl nccl;          /* NCCL's communicator, stream and sums */
} collective;

/* Initializes MPI, reads rank and size, and checks them against
 * PADDLE_TRAINER_ID / PADDLE_TRAINERS_NUM where those are set. */
ps_err collective_init(collective *c, ps_error *err);

/* Every rank passes its configuration as "key=value;key=value;..."; fails
 * with PS_ERR_INVALID_ARGUMENT on every rank when any rank's differs from
 * rank 0's, each differing rank having logged the fields (before any rank
 * returns). */
ps_err collective_check_agreement(collective *c, const char *config, ps_error *err);

/* Replaces grads (n floats, host memory) by their mean over all ranks;
 * the floats of layout's non-trainable tensors (changes one rank sends,
 * model.h) by their sum. layout NULL: every float is a gradient. */
ps_err collective_allreduce_mean(collective *c, float *grads, size_t n,
                                 const tensor_layout *layout, ps_error *err);

#ifdef PSTRAIN_HAVE_CUDA
/* Sets up NCCL on GPU `device` with its unique id sent over MPI, so that
 * gradients in device memory are averaged on the GPUs (collective_
 * allreduce_mean_device). `stream` is the CUDA backend's cudaStream_t. Every
 * rank must call it. PS_ERR_UNSUPPORTED when the CUDA module has no NCCL. */
ps_err collective_use_nccl(collective *c, int device, void *stream, ps_error *err);

/* ncclAllReduce with ncclAvg of n floats in device memory, in place; the
 * non-trainable tensors' floats summed, as collective_allreduce_mean. */
ps_err collective_allreduce_mean_device(collective *c, float *grads, size_t n,
                                        const tensor_layout *layout, ps_error *err);
#endif

/* Sends rank 0's `bytes` bytes at data to every other rank (host memory). */
ps_err collective_broadcast(collective *c, void *data, size_t bytes, ps_error *err);

void collective_finalize(collective *c);

/* An MPI error code as text for a message; buf holds MPI_MAX_ERROR_STRING. */
const char *collective_mpi_text(int rc, char *buf);

#endif
