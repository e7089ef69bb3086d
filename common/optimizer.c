/* Optimizer configuration, learning-rate schedules and the CPU update loop. */
#include "common/optimizer.h"

#include <math.h>
#include <string.h>

static const char *const kind_names[OPTIMIZER_KIND_COUNT] = {"sgd", "momentum", "adam"};
static const char *const schedule_names[LR_SCHEDULE_COUNT] = {"constant", "step", "cosine"};

ps_err optimizer_kind_parse(const char *name, optimizer_kind *out, ps_error *err) {
  for (int i = 0; i < OPTIMIZER_KIND_COUNT; i++) {
    if (strcmp(name, kind_names[i]) == 0) {
      *out = (optimizer_kind)i;
      return PS_ERR_OK;
    }
  }
  return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "unknown optimizer '%s' (one of %s)", name,
                      OPTIMIZER_CHOICES);
}

ps_err lr_schedule_parse(const char *name, lr_schedule *out, ps_error *err) {
  for (int i = 0; i < LR_SCHEDULE_COUNT; i++) {
    if (strcmp(name, schedule_names[i]) == 0) {
      *out = (lr_schedule)i;
      return PS_ERR_OK;
    }
  }
  return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "unknown learning-rate schedule '%s' (one of %s)",
                      name, LR_SCHEDULE_CHOICES);
}

/* Out-of-range values (a corrupted enum) get a name rather than a wild read. */
const char *optimizer_kind_name(optimizer_kind kind) {
  return (unsigned)kind < OPTIMIZER_KIND_COUNT ? kind_names[kind] : "unknown";
}

const char *lr_schedule_name(lr_schedule schedule) {
  return (unsigned)schedule < LR_SCHEDULE_COUNT ? schedule_names[schedule] : "unknown";
}

ps_err optimizer_config_check(const optimizer_config *cfg, ps_error *err) {
  const double values[] = {cfg->lr, cfg->weight_decay, cfg->momentum, cfg->beta1,
                           cfg->beta2, cfg->epsilon, cfg->gamma, cfg->min_lr};
  for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
    if (!isfinite(values[i])) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "optimizer setting %g is not finite",
                          values[i]);
    }
  }
  if (!(cfg->lr > 0)) return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "lr %g must be > 0", cfg->lr);
  if (!(cfg->weight_decay >= 0)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "weight decay %g must be >= 0",
                        cfg->weight_decay);
  }
  if (!(cfg->momentum >= 0 && cfg->momentum < 1)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "momentum %g must be in [0, 1)", cfg->momentum);
  }
  if (!(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "Adam betas %g, %g must be in [0, 1)",
                        cfg->beta1, cfg->beta2);
  }
  if (!(cfg->epsilon > 0)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "Adam epsilon %g must be > 0", cfg->epsilon);
  }
  if (cfg->schedule == LR_STEP && (cfg->step_size < 1 || !(cfg->gamma > 0))) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "step schedule needs a step size >= 1 and gamma > 0 (got %ld, %g)",
                        cfg->step_size, cfg->gamma);
  }
  if (cfg->schedule == LR_COSINE && (cfg->total_steps < 1 || !(cfg->min_lr >= 0))) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "cosine schedule needs total steps >= 1 and min lr >= 0 (got %ld, %g)",
                        cfg->total_steps, cfg->min_lr);
  }
  return PS_ERR_OK;
}

int optimizer_state_per_param(optimizer_kind kind) {
  switch (kind) {
  case OPTIMIZER_SGD: return 0;
  case OPTIMIZER_MOMENTUM: return 1;
  case OPTIMIZER_ADAM: return 2;
  }
  return 0;
}

double optimizer_lr_at(const optimizer_config *cfg, long step) {
  switch (cfg->schedule) {
  case LR_CONSTANT:
    return cfg->lr;
  case LR_STEP:
    return cfg->lr * pow(cfg->gamma, (double)(step / cfg->step_size));
  case LR_COSINE: {
    double progress = step >= cfg->total_steps ? 1.0 : (double)step / (double)cfg->total_steps;
    return cfg->min_lr + 0.5 * (cfg->lr - cfg->min_lr) * (1.0 + cos(3.14159265358979323846 * progress));
  }
  }
  return cfg->lr;
}

optimizer_scalars optimizer_scalars_at(const optimizer_config *cfg, long step) {
  optimizer_scalars s;
  double t = (double)step + 1.0;
  s.lr = (float)optimizer_lr_at(cfg, step);
  s.weight_decay = (float)cfg->weight_decay;
  s.momentum = (float)cfg->momentum;
  s.beta1 = (float)cfg->beta1;
  s.beta2 = (float)cfg->beta2;
  s.one_minus_beta1 = (float)(1.0 - cfg->beta1);
  s.one_minus_beta2 = (float)(1.0 - cfg->beta2);
  s.epsilon = (float)cfg->epsilon;
  s.bias_correction1 = (float)(1.0 - pow(cfg->beta1, t));
  s.bias_correction2 = (float)(1.0 - pow(cfg->beta2, t));
  return s;
}

void optimizer_apply(const optimizer_config *cfg, long step, float *restrict params,
                     const float *restrict grads, float *restrict state1, float *restrict state2,
                     size_t n) {
  optimizer_scalars s = optimizer_scalars_at(cfg, step);
  optimizer_apply_scalars(cfg->kind, &s, params, grads, state1, state2, n);
}

/* The loops vectorize (SSE2 packed: mulps, divps, sqrtps) because the build
 * passes -fno-math-errno (CMakeLists.txt): sqrtf need not set errno. */
void optimizer_apply_scalars(optimizer_kind kind, const optimizer_scalars *scalars,
                             float *restrict params, const float *restrict grads,
                             float *restrict state1, float *restrict state2, size_t n) {
  /* A local copy: the compiler then knows the arrays' stores do not change it. */
  const optimizer_scalars s = *scalars;
  switch (kind) {
  case OPTIMIZER_SGD:
    for (size_t i = 0; i < n; i++) optimizer_sgd_elem(&params[i], grads[i], &s);
    break;
  case OPTIMIZER_MOMENTUM:
    for (size_t i = 0; i < n; i++) optimizer_momentum_elem(&params[i], &state1[i], grads[i], &s);
    break;
  case OPTIMIZER_ADAM:
    for (size_t i = 0; i < n; i++) {
      optimizer_adam_elem(&params[i], &state1[i], &state2[i], grads[i], &s);
    }
    break;
  }
}
