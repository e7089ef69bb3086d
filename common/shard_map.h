/* The shard map: which pserver holds which part of the flat parameter array.
 * Every tensor is cut into near-equal blocks of at most block_size floats;
 * blocks go, largest first, to the pserver holding the fewest floats so far
 * (ties to the lowest id). Every process computes the same map from the
 * layout, the block size and the number of pservers. A pserver stores its
 * blocks packed in ascending offset order (its "shard"). */
#ifndef PSTRAIN_COMMON_SHARD_MAP_H
#define PSTRAIN_COMMON_SHARD_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/rng.h"
#include "common/tensor.h"

/* The pserver (0..pservers-1) that holds a sparse table row: a mixed hash of
 * the key, with a salt of its own so the keys one pserver owns still spread
 * over its table's map (which hashes with another), scaled into the range
 * by a multiply-shift instead of a modulo. A function of key and count
 * alone: every trainer agrees, and a checkpoint's rows re-shard onto any
 * other count by recomputing it. Never change it: checkpoints depend on it. */
static inline int shard_of_key(uint64_t key, int pservers) {
  uint64_t h = rng_mix64(key ^ 0x243f6a8885a308d3ULL);
  return (int)(((__uint128_t)h * (uint64_t)pservers) >> 64);
}

typedef struct shard_block {
  uint32_t id;          /* index in shard_map.blocks, ascending by offset */
  int tensor;           /* index in the layout */
  size_t offset;        /* first float in the flat parameter array */
  size_t count;         /* floats */
  int pserver;
  size_t shard_offset;  /* first float in its pserver's packed shard */
} shard_block;

typedef struct shard_map {
  size_t block_size;
  int pservers;
  size_t block_count;
  shard_block *blocks;      /* owned */
  size_t *shard_floats;     /* (pservers) floats each pserver holds, owned */
  size_t *shard_blocks;     /* (pservers) blocks each pserver holds, owned */
  size_t total;             /* floats in the whole layout */
} shard_map;

ps_err shard_map_build(shard_map *map, const tensor_layout *layout, size_t block_size,
                       int pservers, ps_error *err);
void shard_map_free(shard_map *map);

/* Copies pserver p's blocks between the flat array and its packed shard. */
void shard_map_gather(const shard_map *map, int p, const float *flat, float *shard);
void shard_map_scatter(const shard_map *map, int p, const float *shard, float *flat);

#endif
