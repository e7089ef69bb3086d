/* The job description every trainer and pserver of a job must share: model,
 * optimizer, update mode, counts, block size and seed. Its hash travels in
 * every request; a difference is named field by field. The fields are listed
 * once, in common/job_fields.h. */
#ifndef PSTRAIN_COMMON_JOB_H
#define PSTRAIN_COMMON_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/job_fields.h"
#include "common/model.h"
#include "common/optimizer.h"
#include "common/sparse_table.h"
#include "common/wire_dtype.h"

/* UPDATE_SSP: applied on arrival as async, a push's reply held while its
 * trainer is more than `staleness` steps ahead of the slowest. UPDATE_GEO:
 * trainers step their own optimizer and every `geo_steps` steps push the
 * change since their last exchange, which pservers add scaled by 1/N. */
typedef enum { UPDATE_SYNC, UPDATE_ASYNC, UPDATE_SSP, UPDATE_GEO } update_mode;
#define UPDATE_MODE_COUNT (UPDATE_GEO + 1)
/* The names of update_mode_name, for option tables' choices. */
#define UPDATE_MODE_CHOICES "sync|async|ssp|geo"

/* The CTR models' table settings (all zero for the MLP, and then outside the
 * job's text and hash, so MLP jobs hash as before). */
typedef struct job_sparse {
  sparse_optimizer_kind sparse_kind;
  double sparse_lr;
  double sparse_epsilon;
  double sparse_initial_accumulator;
  double sparse_beta1, sparse_beta2; /* lazy Adam */
  int admit_after;
  long evict_after;
} job_sparse;

typedef struct job_config {
  model_desc model;
  optimizer_config optimizer;
  update_mode update;
  int staleness; /* ssp: steps a trainer may lead the slowest (0 otherwise) */
  int geo_steps; /* geo: local steps between a trainer's exchanges (0 otherwise) */
  /* async, ssp: 1 applies each push whole (PaddlePaddle's and TensorFlow's
   * convention); 0 scales it 1/trainers, so trainers pushes make one step
   * the size of sync's */
  int async_whole;
  int trainers;
  int pservers;
  size_t block_size;
  uint64_t seed;
  long batch; /* per trainer per step */
  long steps; /* every trainer takes in all */
  /* Data handed out in shards of shard_steps batches by pserver 0 (0: each
   * trainer a fixed 1/trainers share); the queue is built from the data
   * set's size and the epochs (both 0 without) */
  int shard_steps;
  /* Elastic jobs: trainers join and leave between elastic_min and
   * `trainers` (the most); 0: a fixed count of `trainers` */
  int elastic_min;
  long epoch_examples;
  int epochs;
  wire_dtype wire_dtype; /* dense blocks on the wire (pserver mode) */
  /* The images' per-channel normalization the trainers computed from the
   * training set (CIFAR-10): "mean,.../std,..." as input_norm_format
   * writes it; empty where inputs are p / 255 (IDX, Criteo). */
  char input_norm[PSTRAIN_INPUT_NORM_MAX];
  job_sparse sparse;
} job_config;

/* The table settings as sparse_table_config wants them, and back. */
sparse_optimizer_config job_sparse_optimizer(const job_sparse *s);
job_sparse job_sparse_of(const sparse_optimizer_config *opt, int admit_after, long evict_after);

/* One enumerator per row of JOB_FIELDS, in its order. */
typedef enum {
#define JOB_FIELD_ENUM(id, ...) JOB_FIELD_##id,
  JOB_FIELDS(JOB_FIELD_ENUM)
#undef JOB_FIELD_ENUM
  JOB_FIELD_COUNT
} job_field;

const char *update_mode_name(update_mode mode);

/* input_norm's canonical text for `channels` means and standard
 * deviations; and a received text checked (1 to PSTRAIN_INPUT_NORM_CHANNELS
 * channels, finite means, positive standard deviations) and rewritten
 * canonically into out (PSTRAIN_INPUT_NORM_MAX bytes). */
void input_norm_format(int channels, const float *mean, const float *std, char *buf, size_t len);
ps_err input_norm_parse(const char *text, char *out, ps_error *err);
ps_err update_mode_parse(const char *name, update_mode *out, ps_error *err);

/* The field's name in differences and the agreement text ("block size"). */
const char *job_field_name(job_field field);
/* Its value as the canonical text writes it ("0.001", "adam"). */
void job_field_format(const job_config *job, job_field field, char *buf, size_t len);

/* Canonical one-line text of the job (what the hash covers). */
void job_config_format(const job_config *job, char *buf, size_t len);
/* The hash of that text, never truncated whatever its length. */
uint64_t job_config_hash(const job_config *job);

/* Writes "model mlp:... vs mlp:...; trainers 2 vs 3" for the fields that
 * differ, or "" when none do. The optimizer's settings are one entry,
 * "optimizer adam lr=... vs adam lr=...". */
void job_config_diff(const job_config *a, const job_config *b, char *buf, size_t len);
/* The same with the field names only ("model, batch"): what may be told to
 * a peer that has not shown the job's token. */
void job_config_diff_fields(const job_config *a, const job_config *b, char *buf, size_t len);

/* A setting outside the job that processes must still agree on. */
typedef struct job_extra {
  const char *name;
  long value;
} job_extra;

/* "model=...;optimizer=adam;lr=...;batch=64;epochs=3": every field, then
 * the extras, as ';'-separated name=value pairs: what collective mode's
 * ranks compare (collective_check_agreement names the pairs that differ).
 * PS_ERR_OUT_OF_RANGE when it does not fit in buf. */
ps_err job_config_agreement(const job_config *job, const job_extra *extras, size_t extra_count,
                            char *buf, size_t len, ps_error *err);

#endif
