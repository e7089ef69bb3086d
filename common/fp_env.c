/* FTZ/DAZ: one place that sets the floating-point mode for the optimizer. */
#include "common/fp_env.h"

#if defined(__x86_64__) || defined(__SSE2__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#define FP_ENV_X86 1
#elif defined(__aarch64__)
#include <stdint.h>
#define FP_ENV_ARM64 1
#define FPCR_FZ (UINT64_C(1) << 24) /* flush-to-zero, inputs and results */
#endif

int fp_env_flush_denormals(void) {
#if defined(FP_ENV_X86)
  _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
  _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
  return 1;
#elif defined(FP_ENV_ARM64)
  uint64_t fpcr;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
  __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr | FPCR_FZ));
  return 1;
#else
  /* Other CPU families: left as they are (denormals kept, only slower). */
  return 0;
#endif
}

int fp_env_flushes_denormals(void) {
#if defined(FP_ENV_X86)
  return _MM_GET_FLUSH_ZERO_MODE() == _MM_FLUSH_ZERO_ON &&
         _MM_GET_DENORMALS_ZERO_MODE() == _MM_DENORMALS_ZERO_ON;
#elif defined(FP_ENV_ARM64)
  uint64_t fpcr;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
  return (fpcr & FPCR_FZ) != 0;
#else
  return 0;
#endif
}
