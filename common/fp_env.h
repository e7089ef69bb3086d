/* The floating-point environment every pstrain process runs in. */
#ifndef PSTRAIN_COMMON_FP_ENV_H
#define PSTRAIN_COMMON_FP_ENV_H

/* Flushes denormal results to zero and reads denormal inputs as zero, on the
 * calling thread (x86-64: MXCSR FTZ and DAZ; aarch64: FPCR.FZ). Adam's
 * moments of parameters whose gradients stay near zero decay into denormals,
 * which x86 cores handle in microcode many times slower; GPUs flush them too.
 * Threads inherit the setting from the thread that creates them, so call it
 * first thing in main(), before any thread starts (gRPC's, MPI's, ours).
 * Returns 1 when set, 0 where this CPU family has no such mode (a no-op). */
int fp_env_flush_denormals(void);

/* 1 when the calling thread flushes denormals (as fp_env_flush_denormals sets). */
int fp_env_flushes_denormals(void);

#endif
