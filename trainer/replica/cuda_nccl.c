/* Collective mode's NCCL calls, in the CUDA module (cuda_module.h): the
 * communicator, the in-place gradient average on the GPUs and its teardown.
 * MPI stays in collective.c, which sends the unique id made here. Built
 * only with NCCL (PSTRAIN_HAVE_NCCL). */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <string.h>

#include "common/log.h"
#include "trainer/backend/cuda_module.h"

_Static_assert(sizeof(ncclUniqueId) == CUDA_MODULE_NCCL_ID_BYTES,
               "collective.c sends CUDA_MODULE_NCCL_ID_BYTES of the NCCL id");

#define NCCL_TRY(err, expr)                                                                     \
  do {                                                                                          \
    ncclResult_t nccl_rc_ = (expr);                                                             \
    if (nccl_rc_ != ncclSuccess) {                                                              \
      return ps_error_set((err), PS_ERR_UNAVAILABLE, "%s:%d: %s failed: %s", __FILE__, __LINE__, \
                          #expr, ncclGetErrorString(nccl_rc_));                                 \
    }                                                                                           \
  } while (0)

#define CUDA_TRY(err, what, expr)                                                              \
  do {                                                                                         \
    cudaError_t cuda_rc_ = (expr);                                                             \
    if (cuda_rc_ != cudaSuccess) {                                                             \
      return ps_error_set((err), PS_ERR_BACKEND, "%s: %s", (what), cudaGetErrorString(cuda_rc_)); \
    }                                                                                          \
  } while (0)

ps_err cuda_nccl_unique_id(unsigned char *id, ps_error *err) {
  ncclUniqueId uid;
  NCCL_TRY(err, ncclGetUniqueId(&uid));
  memcpy(id, &uid, sizeof uid);
  return PS_ERR_OK;
}

ps_err cuda_nccl_init(cuda_nccl *n, int device, int ranks, int rank, const unsigned char *id,
                      void *stream, ps_error *err) {
  ncclUniqueId uid;
  memcpy(&uid, id, sizeof uid);
  cudaError_t crc = cudaSetDevice(device);
  if (crc != cudaSuccess) {
    return ps_error_set(err, PS_ERR_BACKEND, "cudaSetDevice(%d) for NCCL: %s", device,
                        cudaGetErrorString(crc));
  }
  ncclComm_t comm;
  NCCL_TRY(err, ncclCommInitRank(&comm, ranks, uid, rank));
  n->comm = comm;
  n->stream = stream;
  return PS_ERR_OK;
}

/* The non-trainable floats' sums, out of place into n->frozen_sums, before
 * the average overwrites them; put back after. */
static ps_err frozen_sums(cuda_nccl *n, float *grads, const tensor_layout *layout, int restore,
                          ps_error *err) {
  size_t at = 0;
  for (int t = 0; layout != NULL && t < layout->count; t++) {
    const tensor_info *info = &layout->tensors[t];
    if (info->trainable) continue;
    if (!restore && at + info->count > n->frozen_len) {
      if (n->frozen_sums != NULL) CUDA_TRY(err, "freeing the NCCL sums", cudaFree(n->frozen_sums));
      n->frozen_sums = NULL;
      n->frozen_len = 0;
      size_t want = layout->total; /* an upper bound: grown once */
      CUDA_TRY(err, "allocating the NCCL sums", cudaMalloc((void **)&n->frozen_sums, want * sizeof(float)));
      n->frozen_len = want;
    }
    float *side = n->frozen_sums + at, *own = grads + info->offset;
    if (restore) {
      CUDA_TRY(err, "copying the NCCL sums back",
               cudaMemcpyAsync(own, side, info->count * sizeof(float), cudaMemcpyDeviceToDevice,
                               (cudaStream_t)n->stream));
    } else {
      NCCL_TRY(err, ncclAllReduce(own, side, info->count, ncclFloat, ncclSum, (ncclComm_t)n->comm,
                                  (cudaStream_t)n->stream));
    }
    at += info->count;
  }
  return PS_ERR_OK;
}

ps_err cuda_nccl_allreduce_mean(cuda_nccl *n, float *grads, size_t count,
                                const tensor_layout *layout, ps_error *err) {
  PS_TRY(frozen_sums(n, grads, layout, 0, err));
  NCCL_TRY(err, ncclAllReduce(grads, grads, count, ncclFloat, ncclAvg, (ncclComm_t)n->comm,
                              (cudaStream_t)n->stream));
  PS_TRY(frozen_sums(n, grads, layout, 1, err));
  cudaError_t crc = cudaStreamSynchronize((cudaStream_t)n->stream);
  if (crc != cudaSuccess) {
    return ps_error_set(err, PS_ERR_BACKEND, "waiting for ncclAllReduce: %s",
                        cudaGetErrorString(crc));
  }
  return PS_ERR_OK;
}

void cuda_nccl_finalize(cuda_nccl *n) {
  if (n->frozen_sums != NULL && cudaFree(n->frozen_sums) != cudaSuccess) {
    LOG_WARN("freeing the NCCL sums failed");
  }
  n->frozen_sums = NULL;
  n->frozen_len = 0;
  if (n->comm != NULL) {
    ncclResult_t rc = ncclCommDestroy((ncclComm_t)n->comm);
    if (rc != ncclSuccess) LOG_WARN("ncclCommDestroy: %s", ncclGetErrorString(rc));
    n->comm = NULL;
  }
}
