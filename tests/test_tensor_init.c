/* Per-tensor initialization rules and the trainable flag: every model's
 * layout carries the rules its weights and biases always had, and
 * model_init_params applying them gives the same bits as the desc-driven
 * code it replaced, for the whole and for any split into blocks; a
 * non-trainable tensor takes its pushes' sum as a change (batch norm's
 * running statistics), with zero optimizer state, through the pserver's
 * dense apply and the trainer's MLP apply, while the trainable
 * floats get exactly what they would with every tensor trainable. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "common/optimizer.h"
#include "common/rng.h"
#include "common/shard_map.h"
#include "server/store/dense_shard.h"
#include "trainer/backend/backend.h"
#include "trainer/model/mlp.h"
#include "tests/check.h"

/* model_init_params as it was before the rules, read from the desc. */
static void legacy_init(const model_desc *desc, const tensor_layout *layout, uint64_t seed,
                        float *out) {
  for (int t = 0; t < layout->count; t++) {
    const tensor_info *info = &layout->tensors[t];
    float *dst = out + info->offset;
    if (info->rank == 1) {
      memset(dst, 0, info->count * sizeof *dst);
      continue;
    }
    int layer = t / 2 + 1;
    double fan_in = (double)desc->sizes[layer - 1];
    float bound = (float)sqrt((layer < desc->num_layers ? 6.0 : 3.0) / fan_in);
    for (size_t i = 0; i < info->count; i++) {
      float u = rng_uniform_at(seed, (uint64_t)t, i);
      dst[i] = (2.0f * u - 1.0f) * bound;
    }
  }
}

static int same_bits(const float *a, const float *b, size_t n) {
  return memcmp(a, b, n * sizeof(float)) == 0;
}

/* Weights uniform with their bound, everything else zeros; all trainable. */
static void check_rules(const model_desc *d, const tensor_layout *layout) {
  for (int t = 0; t < layout->count; t++) {
    const tensor_info *info = &layout->tensors[t];
    CHECK_EQ_INT(info->trainable, 1);
    if (strstr(info->name, ".weight") == NULL) {
      CHECK_EQ_INT(info->init.kind, TENSOR_INIT_ZEROS);
      continue;
    }
    int layer = t / 2 + 1;
    float bound = (float)sqrt((layer < d->num_layers ? 6.0 : 3.0) / (double)d->sizes[layer - 1]);
    CHECK_EQ_INT(info->init.kind, TENSOR_INIT_UNIFORM);
    CHECK(info->init.scale == bound);
  }
}

/* The whole against the legacy code, then block by block as pservers do,
 * then in odd pieces that cut tensors anywhere. */
static void check_model(const char *text, int want_tensors) {
  ps_error err;
  model_desc d;
  REQUIRE(model_parse(text, &d, &err) == PS_ERR_OK);
  tensor_layout layout;
  tensor_layout_init(&layout);
  REQUIRE(model_build_layout(&d, &layout, &err) == PS_ERR_OK);
  CHECK_EQ_INT(layout.count, want_tensors);
  check_rules(&d, &layout);
  size_t n = layout.total;
  float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
  REQUIRE(want != NULL && got != NULL);
  legacy_init(&d, &layout, 1234, want);
  model_init_params(&layout, 1234, 0, n, got);
  CHECK(same_bits(want, got, n));

  shard_map map;
  REQUIRE(shard_map_build(&map, &layout, 1000, 3, &err) == PS_ERR_OK);
  memset(got, 0xff, n * sizeof *got);
  for (size_t i = 0; i < map.block_count; i++) {
    const shard_block *b = &map.blocks[i];
    model_init_params(&layout, 1234, b->offset, b->count, got + b->offset);
  }
  CHECK(same_bits(want, got, n));
  shard_map_free(&map);

  memset(got, 0xff, n * sizeof *got);
  for (size_t at = 0; at < n; at += 997) {
    model_init_params(&layout, 1234, at, n - at < 997 ? n - at : 997, got + at);
  }
  CHECK(same_bits(want, got, n));
  free(want);
  free(got);
  tensor_layout_free(&layout);
}

/* fc.weight (4, 5) uniform, bn.mean (4) zeros and bn.var (4) ones, both
 * frozen when `frozen`, then fc.bias (4) zeros. */
static void test_layout(tensor_layout *layout, int frozen) {
  ps_error err;
  const long w[2] = {4, 5}, v[1] = {4};
  tensor_layout_init(layout);
  REQUIRE(tensor_layout_add(layout, "fc.weight", 2, w, &err) == PS_ERR_OK);
  tensor_layout_set_init(layout, 0, (tensor_init){TENSOR_INIT_UNIFORM, 0.5f});
  REQUIRE(tensor_layout_add(layout, "bn.mean", 1, v, &err) == PS_ERR_OK);
  REQUIRE(tensor_layout_add(layout, "bn.var", 1, v, &err) == PS_ERR_OK);
  tensor_layout_set_init(layout, 2, (tensor_init){TENSOR_INIT_ONES, 0.0f});
  REQUIRE(tensor_layout_add(layout, "fc.bias", 1, v, &err) == PS_ERR_OK);
  tensor_layout_set_trainable(layout, 1, !frozen);
  tensor_layout_set_trainable(layout, 2, !frozen);
}

static void check_rule_values(void) {
  tensor_layout layout;
  test_layout(&layout, 1);
  float v[36];
  model_init_params(&layout, 9, 0, layout.total, v);
  CHECK_EQ_INT(layout.total, 32);
  int bad = 0;
  for (int i = 0; i < 20; i++) bad += !(v[i] >= -0.5f && v[i] <= 0.5f && v[i] != 0.0f);
  for (int i = 20; i < 24; i++) bad += v[i] != 0.0f;
  for (int i = 24; i < 28; i++) bad += v[i] != 1.0f;
  for (int i = 28; i < 32; i++) bad += v[i] != 0.0f;
  CHECK_EQ_INT(bad, 0);
  CHECK_EQ_INT(layout.tensors[0].trainable, 1);
  CHECK_EQ_INT(layout.tensors[1].trainable, 0);
  tensor_layout_free(&layout);
}

static const optimizer_config adam = {.kind = OPTIMIZER_ADAM, .lr = 0.01, .weight_decay = 1e-3,
                                      .beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-8,
                                      .schedule = LR_CONSTANT};

/* Fills both slots of a shard with the same gradients in both shards. */
static void fill_grads(dense_shard *a, dense_shard *b, long step) {
  rng r;
  rng_seed(&r, 5, (uint64_t)step);
  for (size_t i = 0; i < 2 * a->n; i++) {
    a->grads[i] = b->grads[i] = (float)(rng_next(&r) >> 40) / (float)(1 << 24) - 0.5f;
  }
}

/* Pserver p of 2 (block size 3): the frozen shard in apply_sum and in ranges
 * cut off the block grid against an all-trainable one. */
static void check_shard(int p) {
  ps_error err;
  tensor_layout lf, lt;
  test_layout(&lf, 1);
  test_layout(&lt, 0);
  dense_shard frozen, free_;
  REQUIRE(dense_shard_init_layout(&frozen, &lf, 3, 2, p, 2, 9, &err) == PS_ERR_OK);
  REQUIRE(dense_shard_init_layout(&free_, &lt, 3, 2, p, 2, 9, &err) == PS_ERR_OK);
  CHECK_EQ_INT(lf.count, 0); /* taken over */
  CHECK(frozen.frozen_count > 0);
  CHECK_EQ_INT(free_.frozen_count, 0);
  size_t n = frozen.n;
  REQUIRE(n > 6);
  float *init = malloc(n * sizeof *init);
  REQUIRE(init != NULL);
  memcpy(init, frozen.params, n * sizeof *init);
  CHECK(same_bits(init, free_.params, n));
  const int order[2] = {1, 0};
  float *want = malloc(n * sizeof *want); /* the frozen floats: init plus each step's sum */
  REQUIRE(want != NULL);
  memcpy(want, init, n * sizeof *want);
  for (long step = 0; step < 3; step++) {
    fill_grads(&frozen, &free_, step);
    for (size_t i = 0; i < n; i++) {
      float sum = dense_shard_slot(&frozen, order[0])[i];
      sum += dense_shard_slot(&frozen, order[1])[i];
      want[i] += sum;
    }
    dense_shard_apply_sum(&free_, &adam, order, 2, 0.5f, step);
    if (step == 1) { /* pieces cut at 1, 5 and 6, last first, cut blocks and ranges */
      const size_t cuts[5] = {0, 1, 5, 6, n};
      for (int k = 3; k >= 0; k--) {
        dense_shard_apply_range(&frozen, &adam, order, 2, 0.5f, step, cuts[k],
                                cuts[k + 1] - cuts[k]);
      }
    } else {
      dense_shard_apply_sum(&frozen, &adam, order, 2, 0.5f, step);
    }
  }
  size_t frozen_floats = 0, changed = 0;
  for (size_t i = 0; i < frozen.map.block_count; i++) {
    const shard_block *b = &frozen.map.blocks[i];
    if (b->pserver != p) continue;
    size_t at = b->shard_offset;
    if (frozen.layout.tensors[b->tensor].trainable) {
      CHECK(same_bits(frozen.params + at, free_.params + at, b->count));
      CHECK(same_bits(frozen.state1 + at, free_.state1 + at, b->count));
      CHECK(same_bits(frozen.state2 + at, free_.state2 + at, b->count));
      changed += !same_bits(frozen.params + at, init + at, b->count);
      continue;
    }
    frozen_floats += b->count;
    CHECK(same_bits(frozen.params + at, want + at, b->count));
    for (size_t k = 0; k < b->count; k++) CHECK(frozen.state1[at + k] == 0.0f);
    for (size_t k = 0; k < b->count; k++) CHECK(frozen.state2[at + k] == 0.0f);
  }
  CHECK(frozen_floats > 0);
  CHECK(changed > 0);
  free(init);
  free(want);
  dense_shard_free(&frozen);
  dense_shard_free(&free_);
}

/* The trainer's MLP adds a frozen fc1.bias's gradient as a change; the rest
 * steps as with all trainable. */
static void check_mlp(void) {
  ps_error err;
  backend *be;
  model_desc d;
  REQUIRE(backend_cpu_create(&be, 1, &err) == PS_ERR_OK);
  REQUIRE(model_parse("mlp:5,4,3", &d, &err) == PS_ERR_OK);
  mlp *frozen, *all;
  REQUIRE(mlp_create(&frozen, &d, be, 2, 3, &err) == PS_ERR_OK);
  REQUIRE(mlp_create(&all, &d, be, 2, 3, &err) == PS_ERR_OK);
  tensor_layout_set_trainable(&frozen->layout, 1, 0);
  const tensor_info *bias = &frozen->layout.tensors[1];
  size_t n = frozen->layout.total;
  float *g = malloc(n * sizeof *g), *before = malloc(n * sizeof *g), *a = malloc(n * sizeof *g),
        *b = malloc(n * sizeof *g), *sa = malloc(2 * n * sizeof *g), *sb = malloc(2 * n * sizeof *g);
  REQUIRE(g && before && a && b && sa && sb);
  for (size_t i = 0; i < n; i++) g[i] = 0.25f - (float)(i % 7) * 0.1f;
  REQUIRE(mlp_get_params(frozen, before, &err) == PS_ERR_OK);
  REQUIRE(mlp_set_grads(frozen, g, &err) == PS_ERR_OK && mlp_set_grads(all, g, &err) == PS_ERR_OK);
  for (long step = 0; step < 2; step++) {
    REQUIRE(mlp_apply_optimizer(frozen, &adam, step, &err) == PS_ERR_OK);
    REQUIRE(mlp_apply_optimizer(all, &adam, step, &err) == PS_ERR_OK);
  }
  REQUIRE(mlp_get_params(frozen, a, &err) == PS_ERR_OK && mlp_get_params(all, b, &err) == PS_ERR_OK);
  REQUIRE(mlp_get_state(frozen, sa, &err) == PS_ERR_OK && mlp_get_state(all, sb, &err) == PS_ERR_OK);
  size_t lo = bias->offset, hi = bias->offset + bias->count;
  for (size_t i = lo; i < hi; i++) CHECK(a[i] == (before[i] + g[i]) + g[i]); /* changes added */
  for (size_t i = lo; i < hi; i++) CHECK(sa[i] == 0.0f && sa[n + i] == 0.0f);
  CHECK(same_bits(a, b, lo) && same_bits(a + hi, b + hi, n - hi));
  CHECK(same_bits(sa, sb, lo) && same_bits(sa + n + hi, sb + n + hi, n - hi));
  CHECK(!same_bits(a, before, lo));
  free(g);
  free(before);
  free(a);
  free(b);
  free(sa);
  free(sb);
  mlp_destroy(frozen);
  mlp_destroy(all);
  backend_destroy(be);
}

int main(void) {
  check_model("mlp:784,256,128,10", 6);
  check_model("mlp:5,3", 2);
  check_model("ctr:16:256,128", 7);
  check_model("ctr:4:7", 5);
  check_model("deepfm:8:32,16", 7);
  check_model("lr", 1);
  check_rule_values();
  check_shard(0);
  check_shard(1);
  check_mlp();
  return check_report("test_tensor_init");
}
