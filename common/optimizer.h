/* Optimizers (SGD, momentum SGD, Adam), weight decay and learning-rate
 * schedules, written once: pservers apply them to their shards, trainers in
 * local and collective mode to the whole model. The caller owns parameters,
 * gradients and state; nothing here allocates. Thread-safe (no state). */
#ifndef PSTRAIN_COMMON_OPTIMIZER_H
#define PSTRAIN_COMMON_OPTIMIZER_H

#include <stddef.h>

#include "common/error.h"
#include "common/optimizer_math.h"

typedef enum { OPTIMIZER_SGD, OPTIMIZER_MOMENTUM, OPTIMIZER_ADAM } optimizer_kind;
typedef enum { LR_CONSTANT, LR_STEP, LR_COSINE } lr_schedule;
/* Not enumerators, so that switches over the kinds stay exhaustive. */
#define OPTIMIZER_KIND_COUNT (OPTIMIZER_ADAM + 1)
#define LR_SCHEDULE_COUNT (LR_COSINE + 1)

/* The names of optimizer.c's tables, for option tables' choices (test_job
 * checks they agree). */
#define OPTIMIZER_CHOICES "sgd|momentum|adam"
#define LR_SCHEDULE_CHOICES "constant|step|cosine"

typedef struct optimizer_config {
  optimizer_kind kind;
  double lr;
  double weight_decay;
  double momentum;       /* momentum SGD */
  double beta1, beta2;   /* Adam */
  double epsilon;        /* Adam */
  lr_schedule schedule;
  long step_size;        /* step schedule: multiply by gamma every step_size steps */
  double gamma;
  long total_steps;      /* cosine schedule: steps from lr down to min_lr */
  double min_lr;         /* cosine schedule */
} optimizer_config;

/* Parse the names in OPTIMIZER_CHOICES / LR_SCHEDULE_CHOICES. */
ps_err optimizer_kind_parse(const char *name, optimizer_kind *out, ps_error *err);
ps_err lr_schedule_parse(const char *name, lr_schedule *out, ps_error *err);
/* The names themselves; the only place they are written. */
const char *optimizer_kind_name(optimizer_kind kind);
const char *lr_schedule_name(lr_schedule schedule);

/* Checks ranges (lr > 0, 0 <= momentum < 1, ...). */
ps_err optimizer_config_check(const optimizer_config *cfg, ps_error *err);

/* State vectors per parameter: 0 for SGD, 1 (velocity) for momentum, 2 (m, v) for Adam. */
int optimizer_state_per_param(optimizer_kind kind);

/* Learning rate at zero-based step `step` after the schedule. */
double optimizer_lr_at(const optimizer_config *cfg, long step);

/* The per-step scalars for zero-based step `step`. */
optimizer_scalars optimizer_scalars_at(const optimizer_config *cfg, long step);

/* Applies one update to n parameters from their gradients. state1 and state2
 * hold the optimizer's state vectors (NULL where the kind needs fewer); they
 * must start zeroed. The four arrays must not overlap. */
void optimizer_apply(const optimizer_config *cfg, long step, float *restrict params,
                     const float *restrict grads, float *restrict state1, float *restrict state2,
                     size_t n);

/* The same with the step's scalars worked out already (optimizer_scalars_at),
 * for callers that update one array in several pieces. */
void optimizer_apply_scalars(optimizer_kind kind, const optimizer_scalars *s,
                             float *restrict params, const float *restrict grads,
                             float *restrict state1, float *restrict state2, size_t n);

#endif
