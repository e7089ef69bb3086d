/* Finding and loading the CUDA module (cuda_module.h) on first need, and
 * asking the CUDA driver alone whether a GPU is there, so --device auto on a
 * machine without one loads neither cuBLAS nor the module. Built only with
 * the CUDA toolkit (PSTRAIN_HAVE_CUDA). */
#ifndef PSTRAIN_TRAINER_BACKEND_CUDA_LOAD_H
#define PSTRAIN_TRAINER_BACKEND_CUDA_LOAD_H

#include <stddef.h>

#include "common/error.h"
#include "trainer/backend/cuda_module.h"

/* Names the module's file, instead of the search beside the executable. */
#define CUDA_MODULE_ENV "PSTRAIN_CUDA_MODULE"

/* The module's table, loaded on the first call (dlopen RTLD_NOW |
 * RTLD_LOCAL: every symbol resolves now or the load fails) from
 * $PSTRAIN_CUDA_MODULE when set, else the executable's folder, else its
 * ../lib/pstrain. Later calls give the first one's result. NULL with err
 * set (PS_ERR_UNSUPPORTED) naming the file and why: dlerror's text, a
 * missing entry, another build's ABI. Thread-safe. */
const cuda_module *cuda_module_load(ps_error *err);

/* GPUs the CUDA driver (libcuda.so.1, loaded alone) sees: 0 with the reason
 * in why when there is no driver, cuInit fails or it sees no device (where
 * cudaGetDeviceCount would fail too); -1 with the reason when the driver
 * cannot be asked (then the module must). */
int cuda_driver_device_count(char *why, size_t why_len);

#endif
