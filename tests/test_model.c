/* Model descriptions: parsing (MLP, CTR and LR models, bad texts refused),
 * the parameter layout, the hash, deterministic initialization of any
 * range, and single-allocation tensor groups. */
#include <stdint.h>
#include <stdlib.h>

#include "common/model.h"
#include "common/tensor.h"
#include "tests/check.h"

/* The reference MLP, mlp:784,256,128,10, and its layout. */
static void mlp_fixture(model_desc *d, tensor_layout *layout) {
  ps_error err;
  REQUIRE(model_parse("mlp:784,256,128,10", d, &err) == PS_ERR_OK);
  tensor_layout_init(layout);
  REQUIRE(model_build_layout(d, layout, &err) == PS_ERR_OK);
}

static void case_mlp_parse_and_format(void) {
  ps_error err;
  model_desc d;
  REQUIRE(model_parse("mlp:784,256,128,10", &d, &err) == PS_ERR_OK);
  CHECK_EQ_INT(d.num_layers, 3);
  CHECK_EQ_INT(d.sizes[0], 784);
  CHECK_EQ_INT(d.sizes[3], 10);
  char text[128];
  model_format(&d, text, sizeof text);
  CHECK_EQ_STR(text, "mlp:784,256,128,10");
}

static void case_mlp_layout(void) {
  model_desc d;
  tensor_layout layout;
  mlp_fixture(&d, &layout);
  CHECK_EQ_INT(layout.count, 6);
  CHECK_EQ_STR(layout.tensors[0].name, "fc1.weight");
  CHECK_EQ_INT(layout.tensors[0].shape[0], 256);
  CHECK_EQ_INT(layout.tensors[0].shape[1], 784);
  CHECK_EQ_STR(layout.tensors[1].name, "fc1.bias");
  CHECK_EQ_INT(layout.tensors[1].offset, 200704);
  CHECK_EQ_INT(layout.tensors[5].offset + layout.tensors[5].count, 235146);
  CHECK_EQ_INT(layout.total, 235146); /* the reference MLP's parameter count */
  CHECK_EQ_INT(tensor_layout_find(&layout, "fc3.weight"), 4);
  CHECK_EQ_INT(tensor_layout_find(&layout, "fc4.weight"), -1);
  tensor_layout_free(&layout);
}

/* Equal models hash alike; different ones do not. */
static void case_hash_tells_models_apart(void) {
  ps_error err;
  model_desc d, same, other;
  REQUIRE(model_parse("mlp:784,256,128,10", &d, &err) == PS_ERR_OK);
  REQUIRE(model_parse("mlp:784,256,128,10", &same, &err) == PS_ERR_OK);
  REQUIRE(model_parse("mlp:784,256,64,10", &other, &err) == PS_ERR_OK);
  CHECK(model_hash(&d) == model_hash(&same));
  CHECK(model_hash(&d) != model_hash(&other));
}

/* Any range initializes to the same values as the whole; biases are zero,
 * weights within the He bound and not all alike; another seed, other weights. */
static void case_init_any_range(void) {
  model_desc d;
  tensor_layout layout;
  mlp_fixture(&d, &layout);
  size_t n = layout.total;
  float *all = malloc(n * sizeof *all), *part = malloc(5000 * sizeof *part);
  REQUIRE(all != NULL && part != NULL);
  model_init_params(&layout, 42, 0, n, all);
  model_init_params(&layout, 42, 200000, 5000, part); /* spans fc1.weight, fc1.bias, fc2.weight */
  int range_mismatch = 0;
  for (size_t i = 0; i < 5000; i++) range_mismatch += part[i] != all[200000 + i];
  CHECK_EQ_INT(range_mismatch, 0);
  /* Biases are zero, weights within the He bound and not all alike. */
  double bound1 = 0.0874817; /* sqrt(6/784) */
  double sum = 0.0, max_abs = 0.0;
  for (size_t i = 0; i < layout.tensors[0].count; i++) {
    sum += all[i];
    if (all[i] < 0 ? -all[i] > max_abs : all[i] > max_abs) max_abs = all[i] < 0 ? -all[i] : all[i];
  }
  CHECK(max_abs <= bound1);
  CHECK(max_abs > 0.9 * bound1);
  CHECK_NEAR(sum / (double)layout.tensors[0].count, 0.0, 0.002);
  int nonzero_bias = 0;
  for (size_t i = 0; i < layout.tensors[1].count; i++) nonzero_bias += all[layout.tensors[1].offset + i] != 0;
  CHECK_EQ_INT(nonzero_bias, 0);
  /* Another seed gives other weights. */
  model_init_params(&layout, 43, 0, 100, part);
  int same_count = 0;
  for (int i = 0; i < 100; i++) same_count += part[i] == all[i];
  CHECK(same_count < 5);
  free(all);
  free(part);
  tensor_layout_free(&layout);
}

/* A tensor group is one aligned, zeroed block with tensors at their offsets. */
static void case_tensor_group_one_block(void) {
  ps_error err;
  model_desc d;
  tensor_layout layout;
  mlp_fixture(&d, &layout);
  tensor_group group;
  REQUIRE(tensor_group_init(&group, &layout, 2, &err) == PS_ERR_OK);
  CHECK_EQ_INT((uintptr_t)group.data % 64, 0);
  CHECK(tensor_group_tensor(&group, 0, 1) == group.data + 200704);
  CHECK(tensor_group_tensor(&group, 1, 0) == group.data + layout.total);
  CHECK(group.data[2 * layout.total - 1] == 0.0f);
  tensor_group_free(&group);
  tensor_layout_free(&layout);
}

static void case_bad_mlp_descriptions(void) {
  ps_error err;
  model_desc d;
  CHECK_EQ_INT(model_parse("cnn:784,10", &d, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(model_parse("mlp:784", &d, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(model_parse("mlp:784,10,", &d, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(model_parse("mlp:784;10", &d, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "unexpected ';'");
  CHECK_EQ_INT(model_parse("mlp:784,99999999999999999999,10", &d, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(model_parse("mlp:1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18", &d, &err),
               PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "more than 16 layers");
}

/* The CTR models: canonical text round trips, the MLP's shape, the layout. */
static void case_ctr_model(void) {
  ps_error err;
  model_desc d, same;
  char text[128];
  tensor_layout layout;
  REQUIRE(model_parse("ctr:16:256,128", &d, &err) == PS_ERR_OK);
  CHECK_EQ_INT(d.kind, MODEL_CTR);
  CHECK(model_is_ctr(&d));
  CHECK_EQ_INT(d.embed_dim, 16);
  CHECK_EQ_INT(d.num_layers, 3);
  CHECK_EQ_INT(d.sizes[0], 26 * 16 + 13);
  CHECK_EQ_INT(d.sizes[1], 256);
  CHECK_EQ_INT(d.sizes[2], 128);
  CHECK_EQ_INT(d.sizes[3], 1);
  model_format(&d, text, sizeof text);
  CHECK_EQ_STR(text, "ctr:16:256,128");
  REQUIRE(model_parse(text, &same, &err) == PS_ERR_OK);
  CHECK(model_hash(&same) == model_hash(&d));
  tensor_layout_init(&layout);
  REQUIRE(model_build_layout(&d, &layout, &err) == PS_ERR_OK);
  CHECK_EQ_INT(layout.count, 7);
  CHECK_EQ_STR(layout.tensors[0].name, "fc1.weight");
  CHECK_EQ_INT(layout.tensors[0].shape[0], 256);
  CHECK_EQ_INT(layout.tensors[0].shape[1], 429);
  CHECK_EQ_STR(layout.tensors[5].name, "fc3.bias");
  CHECK_EQ_INT(layout.tensors[5].count, 1);
  CHECK_EQ_STR(layout.tensors[6].name, "wide.bias");
  CHECK_EQ_INT(layout.tensors[6].rank, 1);
  CHECK_EQ_INT(layout.tensors[6].count, 1);
  CHECK_EQ_INT(layout.tensors[6].offset, 429 * 256 + 256 + 256 * 128 + 128 + 128 + 1);
  CHECK_EQ_INT(layout.total, layout.tensors[6].offset + 1);
  tensor_layout_free(&layout);
}

static void case_lr_model(void) {
  ps_error err;
  model_desc d, ctr;
  char text[128];
  tensor_layout layout;
  REQUIRE(model_parse("ctr:16:256,128", &ctr, &err) == PS_ERR_OK);
  REQUIRE(model_parse("lr", &d, &err) == PS_ERR_OK);
  CHECK_EQ_INT(d.kind, MODEL_LR);
  CHECK(model_is_ctr(&d));
  CHECK_EQ_INT(d.num_layers, 0);
  model_format(&d, text, sizeof text);
  CHECK_EQ_STR(text, "lr");
  CHECK(model_hash(&d) != model_hash(&ctr));
  tensor_layout_init(&layout);
  REQUIRE(model_build_layout(&d, &layout, &err) == PS_ERR_OK);
  CHECK_EQ_INT(layout.count, 1);
  CHECK_EQ_STR(layout.tensors[0].name, "wide.bias");
  CHECK_EQ_INT(layout.total, 1);
  tensor_layout_free(&layout);
}

static void case_bad_ctr_descriptions(void) {
  ps_error err;
  model_desc d;
  CHECK_EQ_INT(model_parse("ctr:0:8", &d, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "embedding dimension 0");
  CHECK_EQ_INT(model_parse("ctr:16:", &d, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(model_parse("ctr:16", &d, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "expected ctr:DIM:H1,H2");
  CHECK_EQ_INT(model_parse("ctr:x:8", &d, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(model_parse("lr:3", &d, &err), PS_ERR_INVALID_ARGUMENT);
}

int main(void) {
  RUN_CASE(case_mlp_parse_and_format);
  RUN_CASE(case_mlp_layout);
  RUN_CASE(case_hash_tells_models_apart);
  RUN_CASE(case_init_any_range);
  RUN_CASE(case_tensor_group_one_block);
  RUN_CASE(case_bad_mlp_descriptions);
  RUN_CASE(case_ctr_model);
  RUN_CASE(case_lr_model);
  RUN_CASE(case_bad_ctr_descriptions);
  return check_report("test_model");
}
