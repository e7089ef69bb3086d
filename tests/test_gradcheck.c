/* Gradient check: the analytic gradient of every layer's weights and biases
 * (which also exercises ReLU backward and every dX between layers) and of the
 * softmax cross-entropy loss, against central finite differences of the loss.
 * Bound: |analytic - numeric| <= 1e-3 + 1e-2 |numeric| (float32 loss, h = 1e-3).
 * A difference whose two sides flip a ReLU measures the kink, not the slope:
  * such parameters are skipped, and at most 5% may be. */
#include <math.h>
#include <stdlib.h>

#include "common/rng.h"
#include "tests/check.h"
#include "trainer/backend/kernel_math.h"
#include "trainer/model/mlp.h"

#define BATCH 4
#define H 1e-3f

/* Loss of the loaded batch; sets *flipped when a hidden ReLU's on/off
 * pattern differs from `mask` (recorded instead when record != 0). */
static double batch_loss(mlp *m, unsigned char *mask, int record, int *flipped) {
  ps_error err;
  double sum = 0;
  long correct = 0;
  REQUIRE(mlp_forward(m, BATCH, 0, &sum, &correct, &err) == PS_ERR_OK);
  size_t hidden = m->act_offsets[m->desc.num_layers] - m->act_offsets[1];
  const float *acts = m->acts + m->act_offsets[1]; /* CPU backend: host memory */
  for (size_t i = 0; i < hidden; i++) {
    unsigned char on = acts[i] > 0.0f;
    if (record) mask[i] = on;
    else if (mask[i] != on) *flipped = 1;
  }
  return sum / BATCH;
}

/* mlp:6,7,5,4 on a CPU backend with a random batch of BATCH, non-zero
 * biases (so their gradients flow through ReLUs on both sides); *params
 * holds its parameters and *grads their analytic gradients (malloc'd). */
static mlp *mlp_fixture(backend **be, float **params, float **grads) {
  ps_error err;
  REQUIRE(backend_cpu_create(be, 1, &err) == PS_ERR_OK);
  model_desc d;
  REQUIRE(model_parse("mlp:6,7,5,4", &d, &err) == PS_ERR_OK);
  mlp *m;
  REQUIRE(mlp_create(&m, &d, *be, BATCH, 3, &err) == PS_ERR_OK);

  rng r;
  rng_seed(&r, 5, 0);
  for (int i = 0; i < BATCH * 6; i++) mlp_host_inputs(m)[i] = (float)(rng_next(&r) >> 40) / 16777216.0f;
  for (int i = 0; i < BATCH; i++) mlp_host_labels(m)[i] = (int32_t)(rng_next(&r) % 4);
  REQUIRE(mlp_load_batch(m, BATCH, &err) == PS_ERR_OK);
  size_t n = m->layout.total;
  *params = malloc(n * sizeof **params);
  *grads = malloc(n * sizeof **grads);
  REQUIRE(*params && *grads);
  REQUIRE(mlp_get_params(m, *params, &err) == PS_ERR_OK);
  for (int t = 1; t < m->layout.count; t += 2) {
    for (size_t i = 0; i < m->layout.tensors[t].count; i++) {
      (*params)[m->layout.tensors[t].offset + i] =
          0.1f * ((float)(rng_next(&r) >> 40) / 16777216.0f - 0.5f);
    }
  }
  REQUIRE(mlp_set_params(m, *params, &err) == PS_ERR_OK);

  double loss_sum = 0;
  long correct = 0;
  REQUIRE(mlp_forward(m, BATCH, 1, &loss_sum, &correct, &err) == PS_ERR_OK);
  REQUIRE(mlp_backward(m, BATCH, &err) == PS_ERR_OK);
  REQUIRE(mlp_get_grads(m, *grads, &err) == PS_ERR_OK);
  return m;
}

/* Every layer's weights and biases against central differences of the loss. */
static void case_layer_gradients(void) {
  ps_error err;
  backend *be;
  float *params, *grads;
  mlp *m = mlp_fixture(&be, &params, &grads);
  size_t n = m->layout.total;

  unsigned char mask[BATCH * 16];
  int flipped = 0, skipped = 0;
  batch_loss(m, mask, 1, &flipped);
  for (int t = 0; t < m->layout.count; t++) {
    const tensor_info *info = &m->layout.tensors[t];
    int bad = 0;
    double max_grad = 0;
    for (size_t i = 0; i < info->count; i++) {
      size_t p = info->offset + i;
      float saved = params[p];
      params[p] = saved + H;
      REQUIRE(mlp_set_params(m, params, &err) == PS_ERR_OK);
      flipped = 0;
      double plus = batch_loss(m, mask, 0, &flipped);
      params[p] = saved - H;
      REQUIRE(mlp_set_params(m, params, &err) == PS_ERR_OK);
      double minus = batch_loss(m, mask, 0, &flipped);
      params[p] = saved;
      double numeric = (plus - minus) / (2.0 * H);
      if (flipped) {
        skipped++;
      } else if (fabs(grads[p] - numeric) > 1e-3 + 1e-2 * fabs(numeric)) {
        fprintf(stderr, "%s[%zu]: analytic %.6g numeric %.6g\n", info->name, i, grads[p], numeric);
        bad++;
      }
      if (fabs(grads[p]) > max_grad) max_grad = fabs(grads[p]);
    }
    REQUIRE(mlp_set_params(m, params, &err) == PS_ERR_OK);
    CHECK_EQ_INT(bad, 0);
    CHECK(max_grad > 1e-3); /* a vanishing gradient would pass trivially */
  }

  CHECK(skipped * 100 <= 5 * (int)n);
  fprintf(stderr, "checked %zu parameters, %d skipped at a ReLU kink\n", n, skipped);
  free(params);
  free(grads);
  mlp_destroy(m);
  backend_destroy(be);
}

/* The loss's own gradient w.r.t. the logits. */
static void case_loss_gradient_wrt_logits(void) {
  float logits[5] = {0.3f, -1.2f, 2.0f, 0.0f, 0.7f}, dlogits[5];
  int hit;
  kernel_softmax_xent_row(logits, 5, 1, 1.0f, dlogits, &hit);
  for (int j = 0; j < 5; j++) {
    float saved = logits[j];
    logits[j] = saved + H;
    double plus = kernel_softmax_xent_row(logits, 5, 1, 1.0f, NULL, &hit);
    logits[j] = saved - H;
    double minus = kernel_softmax_xent_row(logits, 5, 1, 1.0f, NULL, &hit);
    logits[j] = saved;
    double numeric = (plus - minus) / (2.0 * H);
    CHECK_NEAR(dlogits[j], numeric, 1e-3 + 1e-2 * fabs(numeric));
  }
}

int main(void) {
  RUN_CASE(case_layer_gradients);
  RUN_CASE(case_loss_gradient_wrt_logits);
  return check_report("test_gradcheck");
}
