/* CUDA_TRY(err, expr): returns from the calling function with err set
 * (file, line, the call and CUDA's reason) when a CUDA runtime call fails.
 * For the CUDA backend's C files (backend_cuda.c, cuda_layers.c). */
#ifndef PSTRAIN_TRAINER_BACKEND_CUDA_TRY_H
#define PSTRAIN_TRAINER_BACKEND_CUDA_TRY_H

#include <cuda_runtime_api.h>

#include "common/error.h"

#define CUDA_TRY(err, expr)                                                                      \
  do {                                                                                           \
    cudaError_t cuda_rc_ = (expr);                                                               \
    if (cuda_rc_ != cudaSuccess) {                                                               \
      return ps_error_set((err), PS_ERR_BACKEND, "%s:%d: %s failed: %s", __FILE__, __LINE__,     \
                          #expr, cudaGetErrorString(cuda_rc_));                                  \
    }                                                                                            \
  } while (0)

#endif
