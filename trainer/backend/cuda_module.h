/* The CUDA module (libpstrain_cuda.so, a CMake MODULE built only with the
 * CUDA toolkit): everything that calls CUDA, cuBLAS, cuDNN or NCCL, loaded
 * by cuda_load.c on first need so that a CPU run never maps those libraries
 * (their start-up alone cost ~150 ms of CPU per process) and a machine
 * without them still runs the trainer on its CPU.
 *
 * The module exports one function, CUDA_MODULE_ENTRY, returning a constant
 * table. Its undefined pstrain symbols (ps_error_set, log_write...) resolve
 * against the executable that loads it, so it shares that executable's log
 * level and sink; CMakeLists.txt exports them (CUDA_MODULE_IMPORTS). */
#ifndef PSTRAIN_TRAINER_BACKEND_CUDA_MODULE_H
#define PSTRAIN_TRAINER_BACKEND_CUDA_MODULE_H

#include <stddef.h>

#include "common/error.h"
#include "common/tensor.h"
#include "trainer/backend/backend.h"

/* Bump when this table, backend, backend_ops, ps_error or tensor_layout
 * changes meaning; the loader also compares the sizes below. */
#define CUDA_MODULE_ABI 1
#define CUDA_MODULE_ENTRY "pstrain_cuda_module"
#define CUDA_MODULE_FILE "libpstrain_cuda.so"
/* sizeof(ncclUniqueId) (NCCL_UNIQUE_ID_BYTES), sent over MPI by collective.c. */
#define CUDA_MODULE_NCCL_ID_BYTES 128

/* Collective mode's NCCL state, owned by the collective (collective.h). */
typedef struct cuda_nccl {
  void *comm;         /* ncclComm_t once nccl_init succeeded, else NULL */
  void *stream;       /* the CUDA backend's cudaStream_t NCCL runs on */
  float *frozen_sums; /* device: non-trainable tensors' sums, NULL until needed */
  size_t frozen_len;
} cuda_nccl;

typedef struct cuda_module {
  int abi;                                 /* CUDA_MODULE_ABI of the module's build */
  size_t backend_size, ops_size, error_size, layout_size; /* sizeof, checked by the loader */
  const char *built_with;                  /* e.g. "CUDA 13.0, cuDNN, NCCL" */
  int cudnn;                               /* the convolutional layers' ops are there */

  /* GPUs visible to this process; 0 with the reason in why when none is. */
  int (*device_count)(char *why, size_t why_len);
  /* The CUDA backend on GPU `device`. */
  ps_err (*backend_create)(backend **out, int device, ps_error *err);

  /* NCCL; all NULL when the module was built without it. Rank 0 makes the
   * id (CUDA_MODULE_NCCL_ID_BYTES), the caller sends it to every rank. */
  ps_err (*nccl_unique_id)(unsigned char *id, ps_error *err);
  /* Joins the communicator of `ranks` ranks on GPU `device`, on `stream`. */
  ps_err (*nccl_init)(cuda_nccl *n, int device, int ranks, int rank, const unsigned char *id,
                      void *stream, ps_error *err);
  /* ncclAvg of n floats in device memory in place, layout's non-trainable
   * tensors summed instead (collective_allreduce_mean's rule); waits. */
  ps_err (*nccl_allreduce_mean)(cuda_nccl *n, float *grads, size_t count,
                                const tensor_layout *layout, ps_error *err);
  /* Frees the sums and destroys the communicator; logs failures. */
  void (*nccl_finalize)(cuda_nccl *n);
} cuda_module;

typedef const cuda_module *(*cuda_module_entry_fn)(void);

/* Inside the module only (backend_cuda.c, cuda_nccl.c, cuda_module.c). */
int backend_cuda_device_count(char *why, size_t why_len);
ps_err backend_cuda_create(backend **out, int device, ps_error *err);
ps_err cuda_nccl_unique_id(unsigned char *id, ps_error *err);
ps_err cuda_nccl_init(cuda_nccl *n, int device, int ranks, int rank, const unsigned char *id,
                      void *stream, ps_error *err);
ps_err cuda_nccl_allreduce_mean(cuda_nccl *n, float *grads, size_t count,
                                const tensor_layout *layout, ps_error *err);
void cuda_nccl_finalize(cuda_nccl *n);

#endif
