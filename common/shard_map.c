/* Building the shard map and moving blocks between flat and packed forms. */
#include "common/shard_map.h"

#include <stdlib.h>
#include <string.h>

/* Largest first; equal sizes by offset, so the order is total and fixed. */
static int by_size_desc(const void *a, const void *b) {
  const shard_block *x = *(const shard_block *const *)a, *y = *(const shard_block *const *)b;
  if (x->count != y->count) return x->count > y->count ? -1 : 1;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

ps_err shard_map_build(shard_map *map, const tensor_layout *layout, size_t block_size,
                       int pservers, ps_error *err) {
  memset(map, 0, sizeof *map);
  if (block_size < 1 || pservers < 1) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "shard map: block size %zu and pserver count %d must be >= 1", block_size,
                        pservers);
  }
  size_t count = 0;
  for (int t = 0; t < layout->count; t++) {
    count += (layout->tensors[t].count + block_size - 1) / block_size;
  }
  map->blocks = calloc(count, sizeof *map->blocks);
  map->shard_floats = calloc((size_t)pservers, sizeof *map->shard_floats);
  map->shard_blocks = calloc((size_t)pservers, sizeof *map->shard_blocks);
  shard_block **order = calloc(count, sizeof *order);
  if (map->blocks == NULL || map->shard_floats == NULL || map->shard_blocks == NULL ||
      order == NULL) {
    free(order);
    shard_map_free(map);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "shard map: out of memory for %zu blocks", count);
  }
  map->block_size = block_size;
  map->pservers = pservers;
  map->block_count = count;
  map->total = layout->total;

  size_t b = 0;
  for (int t = 0; t < layout->count; t++) {
    const tensor_info *info = &layout->tensors[t];
    size_t pieces = (info->count + block_size - 1) / block_size;
    size_t base = info->count / pieces, extra = info->count % pieces, offset = info->offset;
    for (size_t i = 0; i < pieces; i++, b++) {
      map->blocks[b].id = (uint32_t)b;
      map->blocks[b].tensor = t;
      map->blocks[b].offset = offset;
      map->blocks[b].count = base + (i < extra ? 1 : 0);
      offset += map->blocks[b].count;
      order[b] = &map->blocks[b];
    }
  }
  qsort(order, count, sizeof *order, by_size_desc);
  for (size_t i = 0; i < count; i++) {
    int best = 0;
    for (int p = 1; p < pservers; p++) {
      if (map->shard_floats[p] < map->shard_floats[best]) best = p;
    }
    order[i]->pserver = best;
    map->shard_floats[best] += order[i]->count;
    map->shard_blocks[best]++;
  }
  free(order);
  /* Pack each pserver's blocks in ascending offset order. */
  size_t *next = calloc((size_t)pservers, sizeof *next);
  if (next == NULL) {
    shard_map_free(map);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "shard map: out of memory");
  }
  for (size_t i = 0; i < count; i++) {
    shard_block *blk = &map->blocks[i];
    blk->shard_offset = next[blk->pserver];
    next[blk->pserver] += blk->count;
  }
  free(next);
  return PS_ERR_OK;
}

void shard_map_free(shard_map *map) {
  free(map->blocks);
  free(map->shard_floats);
  free(map->shard_blocks);
  memset(map, 0, sizeof *map);
}

void shard_map_gather(const shard_map *map, int p, const float *flat, float *shard) {
  for (size_t i = 0; i < map->block_count; i++) {
    const shard_block *b = &map->blocks[i];
    if (b->pserver == p) memcpy(shard + b->shard_offset, flat + b->offset, b->count * sizeof *flat);
  }
}

void shard_map_scatter(const shard_map *map, int p, const float *shard, float *flat) {
  for (size_t i = 0; i < map->block_count; i++) {
    const shard_block *b = &map->blocks[i];
    if (b->pserver == p) memcpy(flat + b->offset, shard + b->shard_offset, b->count * sizeof *flat);
  }
}
