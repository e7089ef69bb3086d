/* Checkpoint files: one safetensors file per step named PREFIX%09ld
 * .safetensors in a folder, holding flat tensors (parameters, optimizer
 * state) and metadata: a format name, the step, the job (packed JobConfig
 * in hex) and its hash, plus what the writer adds. The newest
 * CHECKPOINTS_KEPT are kept. Pservers write their shard this way, trainer 0
 * the whole model in local and collective mode. */
#ifndef PSTRAIN_COMMON_CHECKPOINT_H
#define PSTRAIN_COMMON_CHECKPOINT_H

#include <stddef.h>

#include "common/error.h"
#include "common/job.h"
#include "common/safetensors.h"
#include "common/tensor.h"

#define CHECKPOINTS_KEPT 3

void checkpoint_path(const char *dir, const char *prefix, long step, char *buf, size_t len);

/* Steps of the checkpoints with prefix in dir, newest first; returns how
 * many (at most max), or -1 with errno set when dir cannot be read. */
int checkpoint_list(const char *dir, const char *prefix, long *steps, int max);

/* Writes step's checkpoint atomically (safetensors_write), then removes all
 * but the newest CHECKPOINTS_KEPT and temporary files left by killed
 * writers. extra: NULL-terminated key/value pairs (may be NULL). */
ps_err checkpoint_write(const char *dir, const char *prefix, const char *format, long step,
                        const job_config *job, const char *const *extra,
                        const tensor_layout *layout, const float *data, ps_error *err);

/* The same for tensors of any dtype and shape (safetensors_write_tensors):
 * sparse tables' keys, rows and state beside dense tensors. */
ps_err checkpoint_write_tensors(const char *dir, const char *prefix, const char *format, long step,
                                const job_config *job, const char *const *extra,
                                safetensors_tensor *tensors, int count, ps_error *err);

/* Reads path's metadata and checks that it is a `format` checkpoint of a
 * well-formed job whose hash matches; *job and *step receive what it holds,
 * *meta all metadata. Errors name path. */
ps_err checkpoint_read_job(const char *path, const char *format, job_config *job, long *step,
                           safetensors_meta *meta, ps_error *err);

/* What --resume opens: the checkpoint of step `want` (want < 0: the newest)
 * with prefix in dir, which must be a `format` checkpoint of `job` (same
 * hash). path receives its name, *step its step, *meta its metadata. Errors
 * begin "--resume: " and name the file; another job's names the fields that
 * differ; `what` names the kind in "no <what> checkpoint". */
ps_err checkpoint_resume_open(const char *dir, const char *prefix, const char *format,
                              const char *what, long want, const job_config *job, char *path,
                              size_t path_len, long *step, safetensors_meta *meta, ps_error *err);

#endif
