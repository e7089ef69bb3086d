/* The shard map: blocks cover every tensor exactly once, none is larger
 * than the block size, the bytes per pserver are balanced, and building it
 * twice gives the same map. Gather and scatter are inverses. Two golden maps
 * written out block by block: every process of a job must compute the same
 * map, so a change to the rule (even a "better" balance) breaks jobs that
 * mix builds and checkpoints written before it, and must be seen here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "common/shard_map.h"
#include "common/criteo.h"
#include "tests/check.h"

/* shard_of_key(1, 2), (2, 3), (3, 5) as digits. */
#define GOLDEN_KEY_SHARDS 124

static void check_map(const char *model, size_t block_size, int pservers) {
  ps_error err;
  model_desc d;
  tensor_layout layout;
  tensor_layout_init(&layout);
  REQUIRE(model_parse(model, &d, &err) == PS_ERR_OK);
  REQUIRE(model_build_layout(&d, &layout, &err) == PS_ERR_OK);
  shard_map map, again;
  REQUIRE(shard_map_build(&map, &layout, block_size, pservers, &err) == PS_ERR_OK);
  REQUIRE(shard_map_build(&again, &layout, block_size, pservers, &err) == PS_ERR_OK);

  /* Coverage: every float belongs to exactly one block, inside one tensor. */
  unsigned char *covered = calloc(layout.total, 1);
  REQUIRE(covered != NULL);
  size_t floats = 0, max_load = 0, min_load = (size_t)-1, biggest = 0;
  for (size_t i = 0; i < map.block_count; i++) {
    const shard_block *b = &map.blocks[i];
    CHECK(b->count >= 1 && b->count <= block_size);
    const tensor_info *t = &layout.tensors[b->tensor];
    CHECK(b->offset >= t->offset && b->offset + b->count <= t->offset + t->count);
    for (size_t k = 0; k < b->count; k++) covered[b->offset + k]++;
    floats += b->count;
    if (b->count > biggest) biggest = b->count;
    CHECK(b->pserver >= 0 && b->pserver < pservers);
    CHECK(i == 0 || b->offset > map.blocks[i - 1].offset); /* ids ascend with offsets */
    CHECK(memcmp(b, &again.blocks[i], sizeof *b) == 0);    /* deterministic */
  }
  int twice = 0;
  for (size_t i = 0; i < layout.total; i++) twice += covered[i] != 1;
  CHECK_EQ_INT(twice, 0);
  CHECK_EQ_INT(floats, layout.total);
  /* Balance: loads differ by at most one block. */
  size_t packed = 0;
  for (int p = 0; p < pservers; p++) {
    if (map.shard_floats[p] > max_load) max_load = map.shard_floats[p];
    if (map.shard_floats[p] < min_load) min_load = map.shard_floats[p];
    packed += map.shard_floats[p];
  }
  CHECK_EQ_INT(packed, layout.total);
  CHECK(max_load - min_load <= biggest);

  /* Gather then scatter gives the flat array back. */
  float *flat = malloc(layout.total * sizeof *flat), *back = calloc(layout.total, sizeof *back);
  REQUIRE(flat && back);
  for (size_t i = 0; i < layout.total; i++) flat[i] = (float)i;
  for (int p = 0; p < pservers; p++) {
    float *shard = malloc((map.shard_floats[p] + 1) * sizeof *shard);
    REQUIRE(shard != NULL);
    shard_map_gather(&map, p, flat, shard);
    shard_map_scatter(&map, p, shard, back);
    free(shard);
  }
  CHECK(memcmp(flat, back, layout.total * sizeof *flat) == 0);
  free(flat);
  free(back);
  free(covered);
  shard_map_free(&map);
  shard_map_free(&again);
  tensor_layout_free(&layout);
}

typedef struct golden_block {
  uint32_t id;
  int tensor;
  size_t offset, count;
  int pserver;
  size_t shard_offset;
} golden_block;

static void check_golden(const char *model, size_t block_size, int pservers,
                         const golden_block *want, size_t count, const size_t *shard_floats) {
  ps_error err;
  model_desc d;
  tensor_layout layout;
  tensor_layout_init(&layout);
  REQUIRE(model_parse(model, &d, &err) == PS_ERR_OK);
  REQUIRE(model_build_layout(&d, &layout, &err) == PS_ERR_OK);
  shard_map map;
  REQUIRE(shard_map_build(&map, &layout, block_size, pservers, &err) == PS_ERR_OK);
  CHECK_EQ_INT(map.block_count, count);
  for (size_t i = 0; i < count && i < map.block_count; i++) {
    const shard_block *b = &map.blocks[i];
    const golden_block *g = &want[i];
    if (b->id != g->id || b->tensor != g->tensor || b->offset != g->offset ||
        b->count != g->count || b->pserver != g->pserver || b->shard_offset != g->shard_offset) {
      fprintf(stderr,
              "%s, block size %zu, %d pservers: block %zu is {%u, %d, %zu, %zu, %d, %zu}, "
              "expected {%u, %d, %zu, %zu, %d, %zu}\n",
              model, block_size, pservers, i, b->id, b->tensor, b->offset, b->count, b->pserver,
              b->shard_offset, g->id, g->tensor, g->offset, g->count, g->pserver, g->shard_offset);
      check_failures++;
    }
  }
  for (int p = 0; p < pservers; p++) CHECK_EQ_INT(map.shard_floats[p], shard_floats[p]);
  shard_map_free(&map);
  tensor_layout_free(&layout);
}

static void check_golden_maps(void) {
  /* mlp:5,3,2: fc1.weight 15, fc1.bias 3, fc2.weight 6, fc2.bias 2 floats.
   * {id, tensor, offset, count, pserver, shard_offset} */
  static const golden_block small[] = {
      {0, 0, 0, 4, 0, 0},  {1, 0, 4, 4, 1, 0},  {2, 0, 8, 4, 2, 0},  {3, 0, 12, 3, 0, 4},
      {4, 1, 15, 3, 1, 4}, {5, 2, 18, 3, 2, 4}, {6, 2, 21, 3, 0, 7}, {7, 3, 24, 2, 1, 7},
  };
  static const size_t small_floats[] = {10, 9, 7};
  check_golden("mlp:5,3,2", 4, 3, small, sizeof small / sizeof small[0], small_floats);
  /* The reference MLP with the default block size on 3 pservers. */
  static const golden_block mlp[] = {
      {0, 0, 0, 28672, 1, 0},          {1, 0, 28672, 28672, 2, 0},
      {2, 0, 57344, 28672, 1, 28672},  {3, 0, 86016, 28672, 2, 28672},
      {4, 0, 114688, 28672, 0, 0},     {5, 0, 143360, 28672, 1, 57344},
      {6, 0, 172032, 28672, 2, 57344}, {7, 1, 200704, 256, 0, 28672},
      {8, 2, 200960, 32768, 0, 28928}, {9, 3, 233728, 128, 0, 61696},
      {10, 4, 233856, 1280, 0, 61824}, {11, 5, 235136, 10, 0, 63104},
  };
  static const size_t mlp_floats[] = {63114, 86016, 86016};
  check_golden("mlp:784,256,128,10", 32768, 3, mlp, sizeof mlp / sizeof mlp[0], mlp_floats);
}

/* Sparse rows: balanced over pservers for Criteo's keys (even when the raw
 * values are sequential, which key % P would not spread), always in range,
 * and pinned: checkpoints re-shard by recomputing it. */
static void check_key_shards(void) {
  for (int pservers = 1; pservers <= 7; pservers++) {
    long counts[7] = {0};
    for (uint32_t v = 0; v < 70000; v++) {
      int p = shard_of_key(criteo_feature_key((int)(v % 26), v, 0), pservers);
      REQUIRE(p >= 0 && p < pservers);
      counts[p]++;
    }
    for (int p = 0; p < pservers; p++) {
      double share = (double)counts[p] / (70000.0 / pservers);
      if (share < 0.97 || share > 1.03) {
        fprintf(stderr, "pserver %d of %d holds %ld of 70000 keys\n", p, pservers, counts[p]);
        check_failures++;
      }
    }
  }
  CHECK_EQ_INT(shard_of_key(0, 1), 0);
  /* Written out once from this build: a change to the rule shows here. */
  CHECK_EQ_INT(shard_of_key(1, 2) * 100 + shard_of_key(2, 3) * 10 + shard_of_key(3, 5),
               GOLDEN_KEY_SHARDS);
}

int main(void) {
  check_key_shards();
  check_golden_maps();
  check_map("mlp:784,256,128,10", 32768, 1);
  check_map("mlp:784,256,128,10", 32768, 2);
  check_map("mlp:784,256,128,10", 32768, 3);
  check_map("mlp:784,256,128,10", 1000, 4);
  check_map("mlp:5,3,2", 4, 3);
  check_map("mlp:5,3,2", 100, 8); /* more pservers than blocks: some hold none */

  /* The reference MLP on 2 pservers: near-equal halves. */
  ps_error err;
  model_desc d;
  tensor_layout layout;
  tensor_layout_init(&layout);
  REQUIRE(model_parse("mlp:784,256,128,10", &d, &err) == PS_ERR_OK);
  REQUIRE(model_build_layout(&d, &layout, &err) == PS_ERR_OK);
  shard_map map;
  REQUIRE(shard_map_build(&map, &layout, 32768, 2, &err) == PS_ERR_OK);
  double share = (double)map.shard_floats[0] / (double)layout.total;
  CHECK(share > 0.45 && share < 0.55);
  shard_map_free(&map);
  CHECK_EQ_INT(shard_map_build(&map, &layout, 0, 2, &err), PS_ERR_INVALID_ARGUMENT);
  tensor_layout_free(&layout);
  return check_report("test_shard_map");
}
