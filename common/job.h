/* The job description every trainer and pserver of a job must share: model,
 * optimizer, update mode, counts, block size and seed. Its hash travels in
 * every request; a difference is named field by field. */
#ifndef PSTRAIN_COMMON_JOB_H
#define PSTRAIN_COMMON_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "common/model.h"
#include "common/optimizer.h"

typedef enum { UPDATE_SYNC, UPDATE_ASYNC } update_mode;

typedef struct job_config {
  model_desc model;
  optimizer_config optimizer;
  update_mode update;
  int trainers;
  int pservers;
  size_t block_size;
  uint64_t seed;
  long batch; /* per trainer per step */
  long steps; /* every trainer takes in all */
} job_config;

const char *update_mode_name(update_mode mode);

/* Canonical one-line text of the job (what the hash covers). */
void job_config_format(const job_config *job, char *buf, size_t len);
uint64_t job_config_hash(const job_config *job);

/* Writes "model mlp:... vs mlp:...; trainers 2 vs 3" for the fields that
 * differ, or "" when none do. */
void job_config_diff(const job_config *a, const job_config *b, char *buf, size_t len);
/* The same with the field names only ("model, batch"): what may be told to
 * a peer that has not shown the job's token. */
void job_config_diff_fields(const job_config *a, const job_config *b, char *buf, size_t len);

#endif
