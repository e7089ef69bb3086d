/* Marks inline math that both C and CUDA code compile, so the CPU tests
 * check the functions GPU kernels call. */
#ifndef PSTRAIN_COMMON_HOST_DEVICE_H
#define PSTRAIN_COMMON_HOST_DEVICE_H

#ifdef __CUDACC__
#define PS_HOST_DEVICE __host__ __device__
#else
#define PS_HOST_DEVICE
#endif

#endif
