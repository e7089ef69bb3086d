/* The CUDA module's one exported symbol: its table of operations
 * (cuda_module.h). Everything else in the module is hidden
 * (-fvisibility=hidden), so its functions never clash with the loading
 * executable's. */
#include <cuda_runtime_api.h>

#include "trainer/backend/cuda_module.h"

#define STR_(x) #x
#define STR(x) STR_(x)

static const cuda_module table = {
    .abi = CUDA_MODULE_ABI,
    .backend_size = sizeof(backend),
    .ops_size = sizeof(backend_ops),
    .error_size = sizeof(ps_error),
    .layout_size = sizeof(tensor_layout),
    .built_with = "CUDA runtime " STR(CUDART_VERSION)
#ifdef PSTRAIN_HAVE_CUDNN
                  ", cuDNN"
#endif
#ifdef PSTRAIN_HAVE_NCCL
                  ", NCCL"
#endif
    ,
#ifdef PSTRAIN_HAVE_CUDNN
    .cudnn = 1,
#endif
    .device_count = backend_cuda_device_count,
    .backend_create = backend_cuda_create,
#ifdef PSTRAIN_HAVE_NCCL
    .nccl_unique_id = cuda_nccl_unique_id,
    .nccl_init = cuda_nccl_init,
    .nccl_allreduce_mean = cuda_nccl_allreduce_mean,
    .nccl_finalize = cuda_nccl_finalize,
#endif
};

__attribute__((visibility("default"))) const cuda_module *pstrain_cuda_module(void);

const cuda_module *pstrain_cuda_module(void) { return &table; }
