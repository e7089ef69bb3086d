/* The sparse table's layout, shared by its two files (sparse_table.c: map,
 * rows, pull, push, eviction; sparse_table_io.c: dump and load). Not a
 * public interface: everything else goes through sparse_table.h. */
#ifndef PSTRAIN_COMMON_SPARSE_TABLE_INTERNAL_H
#define PSTRAIN_COMMON_SPARSE_TABLE_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "common/rng.h"
#include "common/sparse_table.h"

/* Rows live in slabs of 64Ki rows, one allocation each; slab 0 starts at
 * 1024 rows and doubles (realloc) up to 64Ki, so small tables stay small. A
 * row index r is slab r >> 16, row r & 0xffff. A row is dim values, then
 * its optimizer state, then 8 bytes of meta, interleaved so that one row is
 * one or two cache lines when pulled and pushed (keys are random). */
#define ST_SLAB_SHIFT 16
#define ST_SLAB_ROWS ((size_t)1 << ST_SLAB_SHIFT)
#define ST_SLAB0_MIN_ROWS ((size_t)1024)

/* Map slots: key and row index in two arrays (12 bytes a slot), linear
 * probing, load factor at most 7/10, backward-shift deletion. */
#define ST_EMPTY UINT32_MAX
#define ST_MAP_MIN_CAP ((size_t)16)
#define ST_MAX_ROWS ((size_t)UINT32_MAX - 1) /* row indices are 32-bit; ST_EMPTY is reserved */

/* Meta: last step seen in the high 40 bits, update count in the low 24
 * (saturating: Adam's bias corrections are 1.0f long before 2^24 updates).
 * A free row's meta is ST_META_FREE, its first value float holds the next
 * free row. */
#define ST_COUNT_BITS 24
#define ST_COUNT_MAX (((uint64_t)1 << ST_COUNT_BITS) - 1)
#define ST_STEP_MAX ((long)(((int64_t)1 << 40) - 2))
#define ST_META_FREE UINT64_MAX

/* The admission filter: count-min sketch of ST_FILTER_HASHES rows of
 * 2^ST_FILTER_LOG2 saturating 8-bit counters (4 MB), only with admit_after > 1. */
#define ST_FILTER_HASHES 4
#define ST_FILTER_LOG2 20
#define ST_FILTER_BYTES ((size_t)ST_FILTER_HASHES << ST_FILTER_LOG2)
#define ST_ADMIT_MAX 255

struct sparse_table {
  sparse_table_config cfg;
  size_t dim, state_floats, row_floats; /* row_floats = dim + state + 2 (meta) */
  /* map */
  uint64_t *map_keys; /* [map_cap] */
  uint32_t *map_rows; /* [map_cap], ST_EMPTY where free */
  size_t map_cap;
  int map_shift; /* 64 - log2(map_cap): the slot is the hash's top bits */
  /* rows */
  float **slabs;      /* [slab_dir_cap] */
  size_t n_slabs, slab_dir_cap;
  size_t row_cap;     /* rows the slabs hold: slab 0 1024..64Ki, the others 64Ki */
  size_t high_water;  /* rows ever handed out: indices below it are live or free */
  size_t live;
  size_t charged;     /* bytes charged to cfg.budget */
  uint32_t free_head; /* ST_EMPTY: none */
  size_t n_free;
  long last_step;     /* highest step seen: a loaded row without meta starts there */
  uint8_t *filter;    /* [ST_FILTER_BYTES] or NULL */
  uint64_t admitted, refused, evicted;
  uint64_t moved_out, moved_in; /* to and from cfg.spill */
  long forgot_before; /* eviction dropped the rows last seen before this step */
  uint32_t *scratch;  /* per-key row of the last pull (or push) */
  size_t scratch_cap;
  /* Bumped by whatever moves a key's row or empties its slot (map growth,
   * a new row, eviction, load): a push may reuse the last pull's rows only
   * while it is unchanged. */
  uint64_t generation;
  struct {
    const uint64_t *keys; /* NULL: no pull to reuse */
    size_t n;
    long step;
    uint64_t generation, fingerprint;
  } pulled;
};

/* The map's hash: mixed with a constant of its own, so the keys a pserver
 * owns (chosen by rng_mix64(key) mod P) still spread over its slots. */
static inline uint64_t st_hash(uint64_t key) { return rng_mix64(key ^ 0x6a09e667f3bcc909ULL); }

static inline float *st_row(const sparse_table *t, uint32_t r) {
  return t->slabs[r >> ST_SLAB_SHIFT] + (size_t)(r & (ST_SLAB_ROWS - 1)) * t->row_floats;
}

/* Meta sits after values and state; rows are only 4-byte aligned, hence memcpy. */
static inline uint64_t st_meta_get(const sparse_table *t, const float *row) {
  uint64_t m;
  memcpy(&m, row + t->dim + t->state_floats, sizeof m);
  return m;
}

static inline void st_meta_set(const sparse_table *t, float *row, uint64_t m) {
  memcpy(row + t->dim + t->state_floats, &m, sizeof m);
}

static inline uint64_t st_meta_make(long last_seen, uint64_t count) {
  return ((uint64_t)last_seen << ST_COUNT_BITS) | (count > ST_COUNT_MAX ? ST_COUNT_MAX : count);
}

static inline long st_meta_step(uint64_t m) { return (long)(m >> ST_COUNT_BITS); }
static inline uint64_t st_meta_count(uint64_t m) { return m & ST_COUNT_MAX; }

/* Pull's per-key marks besides a row index. */
#define ST_NEW (UINT32_MAX - 1)
#define ST_REFUSED UINT32_MAX

/* Keys are random, so every lookup misses the cache: ask for the map slot
 * of a key a few places ahead while working on this one. */
#define ST_AHEAD 8
static inline void prefetch_slot(const sparse_table *t, uint64_t key) {
  size_t i = (size_t)(st_hash(key) >> t->map_shift);
  __builtin_prefetch(&t->map_keys[i]);
  __builtin_prefetch(&t->map_rows[i]);
}

/* The slot holding key, or the empty slot where it would go (*found 0). */
static inline size_t st_map_find(const sparse_table *t, uint64_t key, int *found) {
  size_t mask = t->map_cap - 1, i = (size_t)(st_hash(key) >> t->map_shift);
  for (;;) {
    if (t->map_rows[i] == ST_EMPTY) {
      *found = 0;
      return i;
    }
    if (t->map_keys[i] == key) {
      *found = 1;
      return i;
    }
    i = (i + 1) & mask;
  }
}

/* Bytes the table would hold with `high_water` rows handed out and `live`
 * of them in the map (what it holds now where that is more). */
size_t st_bytes_for(const sparse_table *t, size_t high_water, size_t live);
/* Grows the map and the slabs for those; NO_MEMORY leaves the rows as they were. */
ps_err st_reserve(sparse_table *t, size_t high_water, size_t live, ps_error *err);
/* A row for a new key (from the free list or past the high-water mark; reserved before). */
uint32_t st_take_row(sparse_table *t);
/* Adds key with row r to the map, which has room; 0 (and nothing added) when key is there. */
int st_map_insert(sparse_table *t, uint64_t key, uint32_t r);
/* Writes a fresh row's state (initial accumulator, zero moments). */
void st_init_state(const sparse_table *t, float *row);
/* RESOURCE_EXHAUSTED: the table would pass max_bytes at `rows` rows. */
ps_err st_limit_error(const sparse_table *t, size_t rows, ps_error *err);
/* Makes room under max_bytes for `missing` new rows of a pull whose found
 * keys' rows are rows[0..n) (ST_NEW, ST_REFUSED for the others), evicting
 * least recently seen rows; fails, changing nothing, when it cannot. */
ps_err st_evict_for_limit(sparse_table *t, const uint32_t *rows, size_t n, size_t missing, long step,
                          ps_error *err);
/* Puts row r on the free list (no longer live); the map slot is the caller's. */
void st_release_row(sparse_table *t, uint32_t r);
/* Empties map slot `hole` by backward shift (no tombstones). */
void st_map_delete_at(sparse_table *t, size_t hole);
/* With cfg.spill: room for `missing` new rows, growing where the memory
 * allows, else moving the rows with the lowest keep scores (recency plus
 * use; last seen before `step`, not pinned) out to the spill, at least enough and about 1/16 of the table.
 * RESOURCE_EXHAUSTED, changing nothing but the moves, when too few can go. */
ps_err st_spill_room(sparse_table *t, size_t missing, long step, ps_error *err);
/* The shared budget (cfg.budget, not NULL): takes `bytes` more, 0 (nothing
 * taken) past its limit; charges what the table holds now in place of
 * t->charged; the error naming the table at `live` rows needing `need` bytes. */
int st_budget_take(sparse_budget *b, size_t bytes);
void st_budget_settle(sparse_table *t);
ps_err st_budget_error(const sparse_table *t, size_t live, size_t need, ps_error *err);
/* Frees the map and the slabs (not the filter or scratch); the budget keeps
 * its charge (sparse_table_destroy gives it back). */
void st_storage_free(sparse_table *t);

#endif
