/* The CTR models' gradients and loss (Wide&Deep, LR, DeepFM): central differences of the batch's
 * mean logloss against model_backward for every dense parameter
 * (fc*, wide.bias), every wide row and every deep row, on a batch whose keys
 * repeat across examples and fields (so the summing of a key's gradients is
 * checked); the loss and probabilities against a double-precision reference
 * written here independently; LR's gradient against its closed form; the
 * optimizer step and the state layout; refusals.
 * Bound as test_gradcheck: |analytic - numeric| <= 1e-3 + 1e-2 |numeric|
 * (float32 forward, h = 1e-3); a difference whose two sides flip a hidden
 * ReLU measures the kink, not the slope: skipped, at most 5% of them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "tests/check.h"
#include "trainer/model/ctr_core.h"

#define BATCH 5
#define KEYS 7 /* distinct keys: 130 (example, field) pairs share them */
#define DIM 4
#define H 1e-3f
#define FIELDS CRITEO_CAT_FIELDS

typedef struct fixture {
  model *m;
  ctr_example ex[BATCH];
  uint32_t slot[BATCH * FIELDS];
  float wide[KEYS], deep[KEYS * DIM];
  float *params; /* (layout.total) host copy */
  model_batch b;
  unsigned char mask[BATCH * 64];
} fixture;

/* model_forward adding the batch's loss to *sum and probabilities to probs. */
static ps_err forward(fixture *fx, int want_grad, double *sum, float *probs, ps_error *err) {
  model_outputs out = {.loss_sum = *sum, .probs = probs};
  ps_err rc = model_forward(fx->m, &fx->b, want_grad, &out, err);
  *sum = out.loss_sum;
  return rc;
}

static float uniform(rng *r, float lo, float hi) {
  return lo + (hi - lo) * (float)(rng_next(r) >> 40) / 16777216.0f;
}

static void fixture_init(fixture *fx, const char *model_text, uint64_t seed) {
  ps_error err;
  model_desc d;
  REQUIRE(model_parse(model_text, &d, &err) == PS_ERR_OK);
  backend *be;
  REQUIRE(backend_cpu_create(&be, 1, &err) == PS_ERR_OK);
  REQUIRE(model_create(&fx->m, &d, be, BATCH, 3, &err) == PS_ERR_OK);
  rng r;
  rng_seed(&r, seed, 0);
  for (int i = 0; i < BATCH; i++) {
    fx->ex[i].label = (float)(i % 2); /* both classes */
    for (int j = 0; j < CRITEO_INT_FIELDS; j++) fx->ex[i].dense[j] = uniform(&r, 0, 2);
  }
  for (int i = 0; i < BATCH * FIELDS; i++) fx->slot[i] = (uint32_t)(rng_next(&r) % KEYS);
  for (int k = 0; k < KEYS; k++) fx->wide[k] = uniform(&r, -0.2f, 0.2f);
  for (int k = 0; k < KEYS * DIM; k++) fx->deep[k] = uniform(&r, -0.5f, 0.5f);
  fx->b = (model_batch){.size = BATCH, .examples = fx->ex, .slot = fx->slot, .unique = KEYS,
                        .rows = {fx->wide, fx->m->tables > 1 ? fx->deep : NULL}};
  /* Non-zero biases so their gradients flow through ReLUs on both sides. */
  const tensor_layout *lay = &fx->m->layout;
  fx->params = malloc(lay->total * sizeof(float));
  REQUIRE(fx->params != NULL);
  REQUIRE(model_get_params(fx->m, fx->params, &err) == PS_ERR_OK);
  for (int t = 0; t < lay->count; t++) {
    if (lay->tensors[t].rank != 1) continue;
    for (size_t i = 0; i < lay->tensors[t].count; i++) {
      fx->params[lay->tensors[t].offset + i] = uniform(&r, -0.05f, 0.05f);
    }
  }
  REQUIRE(model_set_params(fx->m, fx->params, &err) == PS_ERR_OK);
}

static void fixture_free(fixture *fx) {
  backend *be = fx->m->be;
  model_destroy(fx->m);
  backend_destroy(be);
  free(fx->params);
}

/* Mean loss; sets *flipped when a hidden ReLU's on/off pattern differs from
 * the mask (recorded instead when record != 0). */
static double batch_loss(fixture *fx, int record, int *flipped) {
  ps_error err;
  double sum = 0;
  REQUIRE(forward(fx, 0, &sum, NULL, &err) == PS_ERR_OK);
  mlp *deep = ((ctr_core *)fx->m)->deep;
  if (deep != NULL) {
    /* Each hidden layer's first BATCH rows (CPU backend: host memory). */
    size_t at = 0;
    for (int l = 1; l < deep->desc.num_layers; l++) {
      const float *acts = deep->acts + deep->act_offsets[l];
      for (size_t i = 0; i < (size_t)BATCH * (size_t)deep->desc.sizes[l]; i++, at++) {
        REQUIRE(at < sizeof fx->mask);
        unsigned char on = acts[i] > 0.0f;
        if (record) fx->mask[at] = on;
        else if (fx->mask[at] != on) *flipped = 1;
      }
    }
  }
  return sum / BATCH;
}

/* Central difference of the loss in *p; is_param: p is in fx->params. */
static double numeric(fixture *fx, float *p, int is_param, int *flipped) {
  ps_error err;
  float saved = *p;
  *p = saved + H;
  if (is_param) REQUIRE(model_set_params(fx->m, fx->params, &err) == PS_ERR_OK);
  double plus = batch_loss(fx, 0, flipped);
  *p = saved - H;
  if (is_param) REQUIRE(model_set_params(fx->m, fx->params, &err) == PS_ERR_OK);
  double minus = batch_loss(fx, 0, flipped);
  *p = saved;
  if (is_param) REQUIRE(model_set_params(fx->m, fx->params, &err) == PS_ERR_OK);
  return (plus - minus) / (2.0 * H);
}

/* Checks n values against their analytic gradients; returns the skipped count. */
static int check_values(fixture *fx, const char *name, float *vals, const float *grads, size_t n,
                        int is_param) {
  int bad = 0, skipped = 0;
  double max_grad = 0;
  for (size_t i = 0; i < n; i++) {
    int flipped = 0;
    double num = numeric(fx, &vals[i], is_param, &flipped);
    if (flipped) {
      skipped++;
    } else if (fabs(grads[i] - num) > 1e-3 + 1e-2 * fabs(num)) {
      fprintf(stderr, "%s[%zu]: analytic %.6g numeric %.6g\n", name, i, grads[i], num);
      bad++;
    }
    if (fabs(grads[i]) > max_grad) max_grad = fabs(grads[i]);
  }
  CHECK_EQ_INT(bad, 0);
  if (!(max_grad > 1e-3)) fprintf(stderr, "%s: gradient vanishes\n", name);
  CHECK(max_grad > 1e-3); /* a vanishing gradient would pass trivially */
  return skipped;
}

static void gradcheck(const char *model_text) {
  fixture fx;
  fixture_init(&fx, model_text, 5);
  ps_error err;
  const tensor_layout *lay = &fx.m->layout;
  size_t n = lay->total;
  float *grads = malloc(n * sizeof *grads);
  float wide_grads[KEYS], deep_grads[KEYS * DIM];
  REQUIRE(grads != NULL);
  double loss_sum = 0;
  REQUIRE(forward(&fx, 1, &loss_sum, NULL, &err) == PS_ERR_OK);
  REQUIRE(model_backward(fx.m, &fx.b, (float *[]){wide_grads, deep_grads}, &err) == PS_ERR_OK);
  REQUIRE(model_get_grads(fx.m, grads, &err) == PS_ERR_OK);

  int flipped = 0, skipped = 0;
  CHECK_NEAR(batch_loss(&fx, 1, &flipped), loss_sum / BATCH, 1e-12);
  for (int t = 0; t < lay->count; t++) {
    const tensor_info *info = &lay->tensors[t];
    skipped += check_values(&fx, info->name, fx.params + info->offset, grads + info->offset,
                            info->count, 1);
  }
  skipped += check_values(&fx, "wide_rows", fx.wide, wide_grads, KEYS, 0);
  size_t checked = n + KEYS;
  if (fx.m->tables > 1) {
    skipped += check_values(&fx, "deep_rows", fx.deep, deep_grads, KEYS * DIM, 0);
    checked += KEYS * DIM;
  }
  CHECK(skipped * 100 <= 5 * (int)checked);
  fprintf(stderr, "%s: checked %zu values, %d skipped at a ReLU kink\n", model_text, checked, skipped);
  free(grads);
  fixture_free(&fx);
}

/* The model written out in double precision, with the textbook logloss:
 * mean loss, and each example's probability in probs. */
static double reference_loss(const fixture *fx, double *probs) {
  const model_desc *d = &fx->m->desc;
  const tensor_layout *lay = &fx->m->layout;
  double loss = 0;
  for (int i = 0; i < BATCH; i++) {
    double act[2][512];
    int width = d->sizes[0];
    if (d->kind == MODEL_CTR) {
      for (int f = 0; f < FIELDS; f++) {
        for (int k = 0; k < DIM; k++) act[0][f * DIM + k] = fx->deep[fx->slot[i * FIELDS + f] * DIM + k];
      }
      for (int j = 0; j < CRITEO_INT_FIELDS; j++) act[0][FIELDS * DIM + j] = fx->ex[i].dense[j];
    }
    int cur = 0;
    for (int l = 1; l <= d->num_layers; l++, cur ^= 1) {
      const float *w = fx->params + lay->tensors[2 * (l - 1)].offset;
      const float *bias = fx->params + lay->tensors[2 * (l - 1) + 1].offset;
      for (int o = 0; o < d->sizes[l]; o++) {
        double s = bias[o];
        for (int j = 0; j < width; j++) s += (double)w[o * width + j] * act[cur][j];
        act[cur ^ 1][o] = l < d->num_layers && s < 0 ? 0 : s;
      }
      width = d->sizes[l];
    }
    double z = d->kind == MODEL_CTR ? act[cur][0] : 0;
    z += fx->params[lay->total - 1];
    if (strcmp(d->name, "deepfm") == 0) { /* the FM term pair by pair, not by its identity */
      for (int f = 0; f < FIELDS; f++) {
        for (int g = f + 1; g < FIELDS; g++) {
          const float *vf = fx->deep + fx->slot[i * FIELDS + f] * DIM;
          const float *vg = fx->deep + fx->slot[i * FIELDS + g] * DIM;
          for (int k = 0; k < DIM; k++) z += (double)vf[k] * vg[k];
        }
      }
    }
    for (int f = 0; f < FIELDS; f++) z += fx->wide[fx->slot[i * FIELDS + f]];
    double p = 1.0 / (1.0 + exp(-z)), y = fx->ex[i].label;
    probs[i] = p;
    loss -= y * log(p) + (1 - y) * log(1 - p);
  }
  return loss / BATCH;
}

static void check_loss(const char *model_text) {
  fixture fx;
  fixture_init(&fx, model_text, 9);
  ps_error err;
  double sum = 0, ref_probs[BATCH];
  float probs[BATCH];
  /* DeepFM's 325 field pairs would saturate sigmoid at the fixture's scale. */
  if (strcmp(fx.m->desc.name, "deepfm") == 0) {
    for (int k = 0; k < KEYS * DIM; k++) fx.deep[k] *= 0.2f;
  }
  REQUIRE(forward(&fx, 0, &sum, probs, &err) == PS_ERR_OK);
  double ref = reference_loss(&fx, ref_probs);
  CHECK_NEAR(sum / BATCH, ref, 1e-5 * fabs(ref));
  for (int i = 0; i < BATCH; i++) {
    CHECK(probs[i] > 0.0f && probs[i] < 1.0f);
    CHECK_NEAR(probs[i], ref_probs[i], 1e-5);
  }
  fixture_free(&fx);
}

/* LR by hand: z_i = bias + sum of its fields' weights; dL/dw_k = sum over
 * the (i, f) holding k of (p_i - y_i) / B; dL/dbias = sum_i (p_i - y_i) / B. */
static void check_lr_closed_form(void) {
  fixture fx;
  fixture_init(&fx, "lr", 11);
  ps_error err;
  /* A hand-made case: one key everywhere but example 0's first two fields. */
  for (int i = 0; i < BATCH * FIELDS; i++) fx.slot[i] = 0;
  fx.slot[0] = 1;
  fx.slot[1] = 2;
  fx.wide[0] = 0.01f;
  fx.wide[1] = 0.5f;
  fx.wide[2] = -0.25f;
  fx.params[0] = 0.1f;
  REQUIRE(model_set_params(fx.m, fx.params, &err) == PS_ERR_OK);
  double loss = 0, dw[KEYS] = {0}, dbias = 0;
  for (int i = 0; i < BATCH; i++) {
    double z = i == 0 ? 0.1 + 0.5 - 0.25 + 24 * (double)0.01f : 0.1 + 26 * (double)0.01f;
    double p = 1.0 / (1.0 + exp(-z)), y = fx.ex[i].label;
    loss -= y * log(p) + (1 - y) * log(1 - p);
    dbias += (p - y) / BATCH;
    for (int f = 0; f < FIELDS; f++) dw[fx.slot[i * FIELDS + f]] += (p - y) / BATCH;
  }
  double sum = 0;
  float wide_grads[KEYS], grad_bias;
  REQUIRE(forward(&fx, 1, &sum, NULL, &err) == PS_ERR_OK);
  REQUIRE(model_backward(fx.m, &fx.b, (float *[]){wide_grads, NULL}, &err) == PS_ERR_OK);
  REQUIRE(model_get_grads(fx.m, &grad_bias, &err) == PS_ERR_OK);
  CHECK_NEAR(sum, loss, 1e-6 * loss);
  /* Float32 sums of up to 130 terms against double: a few ulps. */
  CHECK_NEAR(grad_bias, dbias, 1e-6);
  for (int k = 0; k < KEYS; k++) CHECK_NEAR(wide_grads[k], dw[k], 1e-6 * (1 + fabs(dw[k])));
  CHECK(wide_grads[3] == 0.0f); /* untouched keys get exactly zero */
  fixture_free(&fx);
}

/* SGD moves every dense parameter by -lr * grad, wide.bias included; Adam's
 * state comes back in layout order and round-trips. */
static void check_optimizer_and_state(void) {
  fixture fx;
  fixture_init(&fx, "ctr:4:6,5", 13);
  ps_error err;
  size_t n = fx.m->layout.total;
  float *before = malloc(n * sizeof(float)), *after = malloc(n * sizeof(float));
  float *grads = malloc(n * sizeof(float)), *state = malloc(2 * n * sizeof(float));
  float *state2 = malloc(2 * n * sizeof(float));
  float wide_grads[KEYS], deep_grads[KEYS * DIM];
  REQUIRE(before && after && grads && state && state2);
  double sum = 0;
  REQUIRE(forward(&fx, 1, &sum, NULL, &err) == PS_ERR_OK);
  REQUIRE(model_backward(fx.m, &fx.b, (float *[]){wide_grads, deep_grads}, &err) == PS_ERR_OK);
  REQUIRE(model_get_grads(fx.m, grads, &err) == PS_ERR_OK);
  REQUIRE(model_get_params(fx.m, before, &err) == PS_ERR_OK);
  optimizer_config sgd = {.kind = OPTIMIZER_SGD, .lr = 0.5, .schedule = LR_CONSTANT};
  REQUIRE(model_apply_optimizer(fx.m, &sgd, 0, &err) == PS_ERR_OK);
  REQUIRE(model_get_params(fx.m, after, &err) == PS_ERR_OK);
  int moved_wrong = 0;
  for (size_t i = 0; i < n; i++) moved_wrong += fabsf(after[i] - (before[i] - 0.5f * grads[i])) > 1e-6f;
  CHECK_EQ_INT(moved_wrong, 0);
  CHECK(grads[n - 1] != 0.0f && after[n - 1] != before[n - 1]);

  optimizer_config adam = {.kind = OPTIMIZER_ADAM, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999,
                           .epsilon = 1e-8, .schedule = LR_CONSTANT};
  REQUIRE(model_apply_optimizer(fx.m, &adam, 0, &err) == PS_ERR_OK);
  REQUIRE(model_get_state(fx.m, state, &err) == PS_ERR_OK);
  /* m = (1 - beta1) g and v = (1 - beta2) g^2 after one step from zero. */
  CHECK_NEAR(state[n - 1], 0.1 * grads[n - 1], 1e-6);
  CHECK_NEAR(state[2 * n - 1], 0.001 * grads[n - 1] * grads[n - 1], 1e-9);
  CHECK_NEAR(state[0], 0.1 * grads[0], 1e-6);
  CHECK_NEAR(state[n], 0.001 * grads[0] * grads[0], 1e-9);
  for (size_t i = 0; i < 2 * n; i++) state[i] += 1.0f;
  REQUIRE(model_set_state(fx.m, state, &err) == PS_ERR_OK);
  REQUIRE(model_get_state(fx.m, state2, &err) == PS_ERR_OK);
  CHECK(memcmp(state, state2, 2 * n * sizeof(float)) == 0);
  free(before);
  free(after);
  free(grads);
  free(state);
  free(state2);
  fixture_free(&fx);
}

static void check_refusals(void) {
  fixture fx;
  fixture_init(&fx, "ctr:4:6,5", 17);
  ps_error err;
  float wide_grads[KEYS], deep_grads[KEYS * DIM];
  double sum = 0;
  CHECK_EQ_INT(model_backward(fx.m, &fx.b, (float *[]){wide_grads, deep_grads}, &err),
               PS_ERR_FAILED_PRECONDITION);
  REQUIRE(forward(&fx, 0, &sum, NULL, &err) == PS_ERR_OK);
  CHECK_EQ_INT(model_backward(fx.m, &fx.b, (float *[]){wide_grads, deep_grads}, &err),
               PS_ERR_FAILED_PRECONDITION);
  fx.slot[7] = KEYS;
  CHECK_EQ_INT(forward(&fx, 1, &sum, NULL, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "is outside the batch's 7 distinct keys");
  fx.slot[7] = 0;
  fx.b.size = BATCH + 1;
  CHECK_EQ_INT(forward(&fx, 1, &sum, NULL, &err), PS_ERR_INVALID_ARGUMENT);
  fx.b.size = BATCH;
  fx.b.rows[CTR_TABLE_EMBEDDING] = NULL;
  CHECK_EQ_INT(forward(&fx, 1, &sum, NULL, &err), PS_ERR_INVALID_ARGUMENT);
  model_desc unknown;
  model *m;
  REQUIRE(model_parse("ctr:4:6", &unknown, &err) == PS_ERR_OK);
  snprintf(unknown.name, sizeof unknown.name, "nosuch"); /* parsed elsewhere, not trained here */
  CHECK_EQ_INT(model_create(&m, &unknown, fx.m->be, 4, 1, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "--model nosuch: this trainer has no implementation of it");
  model_desc deepfm_desc;
  REQUIRE(model_parse("deepfm:4:6", &deepfm_desc, &err) == PS_ERR_OK);
  deepfm_desc.num_layers = 0; /* no deep part: refused, not a crash */
  CHECK_EQ_INT(model_create(&m, &deepfm_desc, fx.m->be, 4, 1, &err), PS_ERR_INVALID_ARGUMENT);
  fixture_free(&fx);
}

int main(void) {
  gradcheck("ctr:4:6,5");
  gradcheck("lr");
  gradcheck("deepfm:4:6,5");
  check_loss("ctr:4:6,5");
  check_loss("deepfm:4:6,5");
  check_loss("lr");
  check_lr_closed_form();
  check_optimizer_and_state();
  check_refusals();
  return check_report("test_ctr_gradcheck");
}
