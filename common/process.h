/* Process-wide set-up both daemons share: the allocator's tuning for large
 * messages, random incarnation ids, the checkpoint folder, the open-files
 * limit. */
#ifndef PSTRAIN_COMMON_PROCESS_H
#define PSTRAIN_COMMON_PROCESS_H

#include <stdint.h>

#include "common/error.h"

/* Keeps freed large buffers (gRPC's per-message slices) in the heap instead
 * of returning them to the kernel, so the next message of the same size does
 * not page-fault its way in. Logs a warning if the allocator refuses. */
void process_tune_malloc(void);

/* This process's peak resident set so far, in KiB (getrusage; -1 when it fails). */
long process_peak_rss_kib(void);

/* A random 64-bit id, distinct per process start (not secret). */
uint64_t process_random_u64(void);

/* Makes folder `path` if it is missing (its parent must exist) and checks
 * that this process can write there; `flag` names it in errors. */
ps_err process_prepare_dir(const char *path, const char *flag, ps_error *err);

/* Raises the open-files soft limit (RLIMIT_NOFILE) to the hard limit, so a
 * server's connections are bounded by what the administrator allows, not by
 * the shell's 1024; *before gets the soft limit found, *soft and *hard the
 * limits now in force (-1: unlimited). */
ps_err process_raise_fd_limit(long *before, long *soft, long *hard, ps_error *err);

#endif
