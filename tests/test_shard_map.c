/* The shard map: blocks cover every tensor exactly once, none is larger
 * than the block size, the bytes per pserver are balanced, and building it
 * twice gives the same map. Gather and scatter are inverses. */
#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "common/shard_map.h"
#include "tests/check.h"

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

int main(void) {
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
