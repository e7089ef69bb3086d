/* Optimizer updates against values worked out by hand, and the learning-rate
 * schedules at their boundaries. */
#include "common/optimizer.h"
#include "tests/check.h"

static optimizer_config base_config(optimizer_kind kind, double lr) {
  optimizer_config c = {.kind = kind, .lr = lr, .momentum = 0.9, .beta1 = 0.9, .beta2 = 0.999,
                        .epsilon = 1e-8, .schedule = LR_CONSTANT, .step_size = 1, .gamma = 1,
                        .total_steps = 1};
  return c;
}

/* SGD, lr 0.1, g = 0.5: w = 1 - 0.05 = 0.95, then 0.9. */
static void case_sgd(void) {
  optimizer_config c = base_config(OPTIMIZER_SGD, 0.1);
  float w = 1.0f, g = 0.5f;
  optimizer_apply(&c, 0, &w, &g, NULL, NULL, 1);
  CHECK_NEAR(w, 0.95, 1e-7);
  optimizer_apply(&c, 1, &w, &g, NULL, NULL, 1);
  CHECK_NEAR(w, 0.90, 1e-7);
}

/* SGD with weight decay 0.1: g' = 0.5 + 0.1 * 1 = 0.6, w = 1 - 0.06 = 0.94. */
static void case_sgd_weight_decay(void) {
  optimizer_config c = base_config(OPTIMIZER_SGD, 0.1);
  float w, g = 0.5f;
  c.weight_decay = 0.1;
  w = 1.0f;
  optimizer_apply(&c, 0, &w, &g, NULL, NULL, 1);
  CHECK_NEAR(w, 0.94, 1e-7);
}

/* Momentum 0.9, lr 0.1, g = 1: v = 1, 1.9, 2.71; w = 0.9, 0.71, 0.439. */
static void case_momentum(void) {
  optimizer_config c = base_config(OPTIMIZER_MOMENTUM, 0.1);
  float w, g;
  float v = 0.0f;
  g = 1.0f;
  w = 1.0f;
  const double momentum_w[] = {0.9, 0.71, 0.439};
  for (int t = 0; t < 3; t++) {
    optimizer_apply(&c, t, &w, &g, &v, NULL, 1);
    CHECK_NEAR(w, momentum_w[t], 1e-6);
  }
  CHECK_NEAR(v, 2.71, 1e-6);
}

/* Adam, lr 0.1, g = 0.5, -1, 0.25:
 * t=1: m = 0.05, v = 0.00025, m^ = 0.5, v^ = 0.25, w = 1 - 0.1 * 0.5/0.5 = 0.9
 * t=2: m = -0.055, v = 0.00124975, m^ = -0.055/0.19, v^ = 0.00124975/0.001999,
 *      w = 0.9 + 0.1 * 0.289474/0.790688 = 0.936610
 * t=3: m = -0.0245, v = 0.00131100025, m^ = -0.0245/0.271, v^ = 0.001311/0.002997001,
 *      w = 0.936610 + 0.1 * 0.0904059/0.661390 = 0.950279 */
static void case_adam(void) {
  optimizer_config c = base_config(OPTIMIZER_ADAM, 0.1);
  float m = 0.0f, v = 0.0f, w = 1.0f;
  const float adam_g[] = {0.5f, -1.0f, 0.25f};
  const double adam_w[] = {0.9, 0.9366104, 0.9502794};
  for (int t = 0; t < 3; t++) {
    optimizer_apply(&c, t, &w, &adam_g[t], &m, &v, 1);
    CHECK_NEAR(w, adam_w[t], 2e-6);
  }
  CHECK_NEAR(m, -0.0245, 1e-7);
  CHECK_NEAR(v, 0.00131100025, 1e-9);
}

/* Adam's decoupled decay: g = 0, wd 0.1, lr 0.1: w = 1 - 0.1 * 0.1 * 1 = 0.99. */
static void case_adam_decoupled_decay(void) {
  optimizer_config c = base_config(OPTIMIZER_ADAM, 0.1);
  float m, v, w, g;
  c.weight_decay = 0.1;
  m = v = 0.0f;
  w = 1.0f;
  g = 0.0f;
  optimizer_apply(&c, 0, &w, &g, &m, &v, 1);
  CHECK_NEAR(w, 0.99, 1e-7);
}

/* Many elements at once behave as one at a time. */
static void case_many_elements_as_one(void) {
  optimizer_config c = base_config(OPTIMIZER_ADAM, 0.01);
  float ws[37], gs[37], ms[37] = {0}, vs[37] = {0};
  for (int i = 0; i < 37; i++) {
    ws[i] = (float)i * 0.1f;
    gs[i] = (float)(i % 5) - 2.0f;
  }
  optimizer_apply(&c, 0, ws, gs, ms, vs, 37);
  for (int i = 0; i < 37; i++) {
    float w1 = (float)i * 0.1f, m1 = 0, v1 = 0;
    optimizer_apply(&c, 0, &w1, &gs[i], &m1, &v1, 1);
    CHECK_NEAR(ws[i], w1, 0);
  }
}

/* The learning-rate schedules at their boundaries, and in the update. */
static void case_schedules(void) {
  optimizer_config c = base_config(OPTIMIZER_SGD, 1.0);
  float w, g;
  CHECK_NEAR(optimizer_lr_at(&c, 12345), 1.0, 0);
  c.schedule = LR_STEP;
  c.step_size = 10;
  c.gamma = 0.5;
  CHECK_NEAR(optimizer_lr_at(&c, 0), 1.0, 0);
  CHECK_NEAR(optimizer_lr_at(&c, 9), 1.0, 0);
  CHECK_NEAR(optimizer_lr_at(&c, 10), 0.5, 1e-12);
  CHECK_NEAR(optimizer_lr_at(&c, 25), 0.25, 1e-12);
  c.schedule = LR_COSINE;
  c.total_steps = 100;
  c.min_lr = 0.1;
  CHECK_NEAR(optimizer_lr_at(&c, 0), 1.0, 1e-12);
  CHECK_NEAR(optimizer_lr_at(&c, 50), 0.55, 1e-12);
  CHECK_NEAR(optimizer_lr_at(&c, 100), 0.1, 1e-12);
  CHECK_NEAR(optimizer_lr_at(&c, 150), 0.1, 1e-12);
  /* The schedule reaches the update: SGD at step 50 moves by 0.55 * g. */
  w = 1.0f;
  g = 1.0f;
  optimizer_apply(&c, 50, &w, &g, NULL, NULL, 1);
  CHECK_NEAR(w, 0.45, 1e-6);
}

/* State sizes and configuration checks. */
static void case_state_sizes_and_config_checks(void) {
  optimizer_config c;
  CHECK_EQ_INT(optimizer_state_per_param(OPTIMIZER_SGD), 0);
  CHECK_EQ_INT(optimizer_state_per_param(OPTIMIZER_MOMENTUM), 1);
  CHECK_EQ_INT(optimizer_state_per_param(OPTIMIZER_ADAM), 2);
  ps_error err;
  c = base_config(OPTIMIZER_ADAM, 0.001);
  CHECK_EQ_INT(optimizer_config_check(&c, &err), PS_ERR_OK);
  c.lr = 0;
  CHECK_EQ_INT(optimizer_config_check(&c, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "lr 0 must be > 0");
  c = base_config(OPTIMIZER_MOMENTUM, 0.1);
  c.momentum = 1.0;
  CHECK_EQ_INT(optimizer_config_check(&c, &err), PS_ERR_INVALID_ARGUMENT);
  c = base_config(OPTIMIZER_SGD, 0.1);
  c.schedule = LR_STEP;
  c.step_size = 0;
  CHECK_EQ_INT(optimizer_config_check(&c, &err), PS_ERR_INVALID_ARGUMENT);
  optimizer_kind k;
  CHECK_EQ_INT(optimizer_kind_parse("adam", &k, &err), PS_ERR_OK);
  CHECK_EQ_INT(k, OPTIMIZER_ADAM);
  CHECK_EQ_INT(optimizer_kind_parse("lbfgs", &k, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "unknown optimizer 'lbfgs'");
}

int main(void) {
  RUN_CASE(case_sgd);
  RUN_CASE(case_sgd_weight_decay);
  RUN_CASE(case_momentum);
  RUN_CASE(case_adam);
  RUN_CASE(case_adam_decoupled_decay);
  RUN_CASE(case_many_elements_as_one);
  RUN_CASE(case_schedules);
  RUN_CASE(case_state_sizes_and_config_checks);
  return check_report("test_optimizer");
}
