/* The job's fields, each listed once. Everything that walks the job goes
 * through this table: the protobuf conversion (wire.c), the canonical text
 * the job hash covers, the field-by-field difference and collective mode's
 * agreement text (job.c). Adding a field is one line here plus the field in
 * proto/pstrain.proto; test_job checks each row reaches the hash, the
 * difference, the agreement text and the protobuf round trip.
 *
 * X(id, group, type, text, name, lo, hi)
 *   id     the member: of job_config (group JOB) or of its optimizer (OPT),
 *          and of Pstrain__JobConfig, Pstrain__OptimizerConfig or Pstrain__SparseConfig alike
 *   group  JOB, OPT, SPARSE, SSP, GEO, SHARDS or ELASTIC; SSP and GEO rows
 *          are JOB rows written only when update is ssp or geo, SHARDS rows
 *          only when the data is handed out (shard_steps > 0), ELASTIC
 *          rows only in elastic jobs (older jobs' text and hash unchanged); OPT rows stay together: the canonical text
 *          puts them in "optimizer=[...]" and differences name them as
 *          "optimizer"; SPARSE rows likewise in "sparse=[...]", written only
 *          for the CTR models (an MLP job's text is what it always was)
 *          and the wire dtype's row only when it is not f32 (likewise), the
 *          input normalization's only when the data has one (CIFAR-10)
 *   type   how the value is written and converted: MODEL, KIND, SCHEDULE,
 *          UPDATE, WIRE_DTYPE (names), NORM (input_norm text), DOUBLE, INT (int), LONG (long, unsigned on the
 *          wire), SLONG (long, int64 on the wire), SIZE (size_t), U64
 *   text   what precedes the value in the canonical text. Checkpoints store
 *          the hash of this text: changing it makes older checkpoints another
 *          job's.
 *   name   what differences and the agreement text call the field
 *   lo, hi the range a received integer field must lie in */
#ifndef PSTRAIN_COMMON_JOB_FIELDS_H
#define PSTRAIN_COMMON_JOB_FIELDS_H

#include <limits.h>
#include <stdint.h>

#include "common/job_limits.h"

/* clang-format off */
#define JOB_FIELDS(X)                                                                   \
  X(model,        JOB, MODEL,    "model=",        "model",          0, 0)               \
  X(kind,         OPT, KIND,     "",              "optimizer",      0, 0)               \
  X(lr,           OPT, DOUBLE,   " lr=",          "lr",             0, 0)               \
  X(weight_decay, OPT, DOUBLE,   " wd=",          "weight decay",   0, 0)               \
  X(momentum,     OPT, DOUBLE,   " momentum=",    "momentum",       0, 0)               \
  X(beta1,        OPT, DOUBLE,   " betas=",       "beta1",          0, 0)               \
  X(beta2,        OPT, DOUBLE,   ",",             "beta2",          0, 0)               \
  X(epsilon,      OPT, DOUBLE,   " eps=",         "epsilon",        0, 0)               \
  X(schedule,     OPT, SCHEDULE, " ",             "lr schedule",    0, 0)               \
  X(step_size,    OPT, SLONG,    " step_size=",   "lr step size",   LONG_MIN, LONG_MAX) \
  X(gamma,        OPT, DOUBLE,   " gamma=",       "lr gamma",       0, 0)               \
  X(total_steps,  OPT, SLONG,    " total_steps=", "lr total steps", LONG_MIN, LONG_MAX) \
  X(min_lr,       OPT, DOUBLE,   " min_lr=",      "min lr",         0, 0)               \
  X(update,       JOB, UPDATE,   " update=",      "update",         0, 0)               \
  X(staleness,    SSP, INT,      " staleness=",   "staleness",      0, PSTRAIN_MAX_STALENESS) \
  X(geo_steps,    GEO, INT,      " geo_steps=",   "geo steps",      0, PSTRAIN_MAX_GEO_STEPS) \
  X(async_whole,  JOB, INT,      " async_whole=", "async push scale", 0, 1)           \
  X(trainers,     JOB, INT,      " trainers=",    "trainers",       1, PSTRAIN_MAX_TRAINERS) \
  X(pservers,     JOB, INT,      " pservers=",    "pservers",       1, PSTRAIN_MAX_PSERVERS) \
  X(block_size,   JOB, SIZE,     " block_size=",  "block size",     1, 1u << 26)        \
  X(seed,         JOB, U64,      " seed=",        "seed",           0, UINT64_MAX)      \
  X(batch,        JOB, LONG,     " batch=",       "batch",          1, UINT32_MAX)      \
  X(steps,        JOB, LONG,     " steps=",       "steps",          1, 1ULL << 50)         \
  X(shard_steps,  SHARDS, INT,   " shard_steps=", "shard steps",    0, PSTRAIN_MAX_SHARD_STEPS) \
  X(epoch_examples, SHARDS, LONG, " epoch_examples=", "examples per epoch", 0, 1ULL << 50) \
  X(epochs,       SHARDS, INT,   " epochs=",      "epochs",         0, INT_MAX)         \
  X(elastic_min,  ELASTIC, INT,  " elastic_min=", "elastic min trainers", 0, PSTRAIN_MAX_TRAINERS) \
  X(wire_dtype,   JOB, WIRE_DTYPE, " wire_dtype=", "wire dtype",    0, 0)               \
  X(input_norm,   JOB, NORM,     " input_norm=",  "input normalization", 0, 0)          \
  X(sparse_kind,  SPARSE, SPARSE_KIND, "",        "sparse optimizer", 0, 0)             \
  X(sparse_lr,    SPARSE, DOUBLE, " lr=",         "sparse lr",      0, 0)               \
  X(sparse_epsilon, SPARSE, DOUBLE, " eps=",      "sparse epsilon", 0, 0)               \
  X(sparse_initial_accumulator, SPARSE, DOUBLE, " acc0=", "sparse initial accumulator", 0, 0) \
  X(sparse_beta1, SPARSE, DOUBLE, " betas=",      "sparse beta1",   0, 0)               \
  X(sparse_beta2, SPARSE, DOUBLE, ",",            "sparse beta2",   0, 0)               \
  X(admit_after,  SPARSE, INT,    " admit=",      "admit after",    0, 255)             \
  X(evict_after,  SPARSE, SLONG,  " evict=",      "evict after",    0, 1LL << 50)
/* clang-format on */

/* The member of a job_config `job` that row `id` of `group` describes. */
#define JOB_MEMBER_JOB(job, id) ((job)->id)
#define JOB_MEMBER_OPT(job, id) ((job)->optimizer.id)
#define JOB_MEMBER_SPARSE(job, id) ((job)->sparse.id)
#define JOB_MEMBER_SSP(job, id) ((job)->id)
#define JOB_MEMBER_GEO(job, id) ((job)->id)
#define JOB_MEMBER_SHARDS(job, id) ((job)->id)
#define JOB_MEMBER_ELASTIC(job, id) ((job)->id)

#endif
