/* The network model on the CPU backend (trainer/model/net_model.c): the
 * gradient of a small network with every layer kind (conv, bn, relu,
 * residual block with a 1x1 shortcut and one without, max pool, global
 * average pool, flatten, fc) against central differences of its loss;
 * --bn-group's groups against separate replicas of the strided examples
 * (as a sync job's trainers read them); the running statistics as a
 * change that the owner writes, the others zero, and the optimizer adds. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "tests/check.h"
#include "trainer/model/model.h"

static const char *const tiny =
    "name tiny\ninput 2x6x6\n"
    "conv 4 3x3 pad 1\nbn\nrelu\n"
    "block\n  conv 4 3x3 pad 1 nobias\n  bn\n  relu\n  conv 4 3x3 pad 1 nobias\n  bn\nend\nrelu\n"
    "block\n  conv 6 3x3 stride 2 pad 1 nobias\n  bn\nshortcut\n  conv 6 1x1 stride 2\n  bn\nend\n"
    "relu\nmaxpool 2x2 stride 1\nblock\n  conv 6 1x1\nend\navgpool\nflatten\nfc 5\nfc 3\n";

static model *make(backend *be, int max_batch) {
  model_desc d;
  ps_error err;
  memset(&d, 0, sizeof d);
  snprintf(d.name, sizeof d.name, "net");
  d.kind = MODEL_NET;
  REQUIRE(net_parse_text(tiny, '\n', "tiny", &d.net, &err) == PS_ERR_OK);
  model *m;
  if (model_create(&m, &d, be, max_batch, 7, &err) != PS_ERR_OK) {
    fprintf(stderr, "%s\n", err.msg);
    exit(1);
  }
  return m;
}

static void fill(float *x, size_t n, uint64_t seed) {
  rng r;
  rng_seed(&r, seed, 0);
  for (size_t i = 0; i < n; i++) x[i] = (float)(rng_next(&r) >> 40) / 16777216.0f * 2.0f - 1.0f;
}

/* The batch's mean loss in training mode (batch statistics). */
static double loss(model *m, const float *x, const int32_t *y, int n) {
  model_batch b = {.size = n, .inputs = x, .labels = y};
  model_outputs out = {0};
  ps_error err;
  REQUIRE(model_forward(m, &b, 1, &out, &err) == PS_ERR_OK);
  return out.loss_sum / n;
}

static void test_gradients(backend *be) {
  const int n = 4;
  model *m = make(be, n);
  size_t in = 2 * 6 * 6, total = m->layout.total;
  float *x = malloc(n * in * sizeof *x), *p = malloc(total * sizeof *p), *g = malloc(total * sizeof *g);
  int32_t y[4] = {0, 2, 1, 2};
  REQUIRE(x && p && g);
  fill(x, n * in, 3);
  ps_error err;
  REQUIRE(model_get_params(m, p, &err) == PS_ERR_OK);
  loss(m, x, y, n);
  model_batch b = {.size = n, .inputs = x, .labels = y};
  REQUIRE(model_backward(m, &b, NULL, &err) == PS_ERR_OK);
  REQUIRE(model_get_grads(m, g, &err) == PS_ERR_OK);
  /* every tensor, a few floats each */
  int checked = 0, bad = 0;
  for (int t = 0; t < m->layout.count; t++) {
    const tensor_info *info = &m->layout.tensors[t];
    if (!info->trainable) continue;
    for (size_t k = 0; k < info->count; k += 1 + info->count / 4) {
      size_t i = info->offset + k;
      const float eps = 5e-4f, keep = p[i]; /* larger steps cross ReLU and max-pool kinks */
      p[i] = keep + eps;
      REQUIRE(model_set_params(m, p, &err) == PS_ERR_OK);
      double up = loss(m, x, y, n);
      p[i] = keep - eps;
      REQUIRE(model_set_params(m, p, &err) == PS_ERR_OK);
      double down = loss(m, x, y, n);
      p[i] = keep;
      double numeric = (up - down) / (2.0 * eps);
      double diff = fabs(numeric - g[i]), scale = fmax(fabs(numeric), fabs(g[i]));
      checked++;
      if (diff > 2e-3 && diff > 3e-2 * scale) {
        fprintf(stderr, "%s[%zu]: backward %.6g, central difference %.6g\n", info->name, k, g[i],
                numeric);
        bad++;
      }
    }
  }
  REQUIRE(model_set_params(m, p, &err) == PS_ERR_OK);
  printf("gradient check: %d floats of %d tensors, %d off\n", checked, m->layout.count, bad);
  CHECK(checked > 40);
  CHECK_EQ_INT(bad, 0);
  free(x);
  free(p);
  free(g);
  model_destroy(m);
}

/* The change of every non-trainable float, from the gradients. */
static void running_changes(model *m, const float *g, float *out, size_t *count) {
  *count = 0;
  for (int t = 0; t < m->layout.count; t++) {
    const tensor_info *info = &m->layout.tensors[t];
    if (info->trainable) continue;
    memcpy(out + *count, g + info->offset, info->count * sizeof *out);
    *count += info->count;
  }
}

/* Batch 8 in groups of 4 against two replicas of batch 4 on examples
 * 0,2,4,6 and 1,3,5,7: the same gradients (mean of the replicas') and the
 * first replica's running-statistics change. */
static void test_groups(backend *be) {
  const int n = 8, half = 4;
  model *whole = make(be, n), *r0 = make(be, half), *r1 = make(be, half);
  whole->bn_group = half;
  r1->stats_owner = 0;
  size_t in = 2 * 6 * 6, total = whole->layout.total;
  float *x = malloc(n * in * sizeof *x), *x0 = malloc(half * in * sizeof *x),
        *x1 = malloc(half * in * sizeof *x);
  float *g = malloc(total * sizeof *g), *g0 = malloc(total * sizeof *g), *g1 = malloc(total * sizeof *g);
  float *c = malloc(total * sizeof *c), *c0 = malloc(total * sizeof *c);
  int32_t y[8] = {0, 1, 2, 0, 1, 2, 2, 1}, y0[4], y1[4];
  REQUIRE(x && x0 && x1 && g && g0 && g1 && c && c0);
  fill(x, n * in, 11);
  for (int j = 0; j < half; j++) {
    memcpy(x0 + j * in, x + (size_t)(2 * j) * in, in * sizeof *x);
    memcpy(x1 + j * in, x + (size_t)(2 * j + 1) * in, in * sizeof *x);
    y0[j] = y[2 * j];
    y1[j] = y[2 * j + 1];
  }
  ps_error err;
  model_batch b = {.size = n, .inputs = x, .labels = y}, b0 = {.size = half, .inputs = x0, .labels = y0},
              b1 = {.size = half, .inputs = x1, .labels = y1};
  double l = loss(whole, x, y, n), l0 = loss(r0, x0, y0, half), l1 = loss(r1, x1, y1, half);
  CHECK_NEAR(l, (l0 + l1) / 2, 1e-5);
  REQUIRE(model_backward(whole, &b, NULL, &err) == PS_ERR_OK);
  REQUIRE(model_backward(r0, &b0, NULL, &err) == PS_ERR_OK);
  REQUIRE(model_backward(r1, &b1, NULL, &err) == PS_ERR_OK);
  REQUIRE(model_get_grads(whole, g, &err) == PS_ERR_OK);
  REQUIRE(model_get_grads(r0, g0, &err) == PS_ERR_OK);
  REQUIRE(model_get_grads(r1, g1, &err) == PS_ERR_OK);
  double worst = 0;
  for (int t = 0; t < whole->layout.count; t++) {
    const tensor_info *info = &whole->layout.tensors[t];
    if (!info->trainable) continue;
    for (size_t i = info->offset; i < info->offset + info->count; i++) {
      worst = fmax(worst, fabs(g[i] - (g0[i] + g1[i]) / 2));
    }
  }
  printf("groups: largest gradient difference %.3g\n", worst);
  CHECK(worst < 1e-5);
  size_t count, count0, count1;
  running_changes(whole, g, c, &count);
  running_changes(r0, g0, c0, &count0);
  CHECK_EQ_INT(count, count0);
  CHECK(count > 0 && memcmp(c, c0, count * sizeof *c) == 0); /* bitwise: the same sums */
  running_changes(r1, g1, c, &count1);
  for (size_t i = 0; i < count1; i++) CHECK(c[i] == 0.0f);  /* not the owner */
  int moved = 0;
  for (size_t i = 0; i < count0; i++) moved += c0[i] != 0.0f;
  CHECK(moved > 0);
  /* the optimizer adds the change: running = old + change */
  float *before = malloc(total * sizeof *before), *after = malloc(total * sizeof *after);
  REQUIRE(before && after);
  REQUIRE(model_get_params(r0, before, &err) == PS_ERR_OK);
  optimizer_config sgd = {.kind = OPTIMIZER_SGD, .lr = 0.1, .schedule = LR_CONSTANT, .total_steps = 1};
  REQUIRE(model_apply_optimizer(r0, &sgd, 0, &err) == PS_ERR_OK);
  REQUIRE(model_get_params(r0, after, &err) == PS_ERR_OK);
  for (int t = 0; t < r0->layout.count; t++) {
    const tensor_info *info = &r0->layout.tensors[t];
    for (size_t i = info->offset; i < info->offset + info->count; i++) {
      float want = info->trainable ? before[i] - 0.1f * g0[i] : before[i] + g0[i];
      if (after[i] != want) {
        CHECK(after[i] == want);
        break;
      }
    }
  }
  free(before);
  free(after);
  free(x);
  free(x0);
  free(x1);
  free(g);
  free(g0);
  free(g1);
  free(c);
  free(c0);
  model_destroy(whole);
  model_destroy(r0);
  model_destroy(r1);
}

int main(void) {
  backend *be;
  ps_error err;
  REQUIRE(backend_cpu_create(&be, 1, &err) == PS_ERR_OK);
  test_gradients(be);
  test_groups(be);
  backend_destroy(be);
  return check_failures == 0 ? 0 : 1;
}
