/* Sparse tables' eviction: rows unseen for evict_after steps, the least
 * recently seen ones when a pull would pass max_bytes (dropped), and with a
 * spill those least recently seen and least used when it would pass the
 * memory (moved out). Rows go to the free list; their map slots are emptied
 * by backward shift, without tombstones. */
#include "common/sparse_table_internal.h"

#include <limits.h>

void st_release_row(sparse_table *t, uint32_t r) {
  float *row = st_row(t, r);
  memcpy(row, &t->free_head, sizeof t->free_head);
  st_meta_set(t, row, ST_META_FREE);
  t->generation++;
  t->free_head = r;
  t->n_free++;
  t->live--;
}

static void free_row(sparse_table *t, uint32_t r) {
  st_release_row(t, r);
  t->evicted++;
}

/* Backward-shift deletion: later members of the cluster that may live at
 * the hole move back into it, so no tombstones pile up under eviction. */
void st_map_delete_at(sparse_table *t, size_t hole) {
  size_t mask = t->map_cap - 1, j = hole;
  for (;;) {
    j = (j + 1) & mask;
    if (t->map_rows[j] == ST_EMPTY) break;
    size_t home = (size_t)(st_hash(t->map_keys[j]) >> t->map_shift);
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      t->map_keys[hole] = t->map_keys[j];
      t->map_rows[hole] = t->map_rows[j];
      hole = j;
    }
  }
  t->map_rows[hole] = ST_EMPTY;
}

/* ---- eviction --------------------------------------------------------------- */

/* Drops every row last seen before `before`. The sweep starts after an empty
 * slot, so the shifts of a deletion only move entries not yet visited into
 * the slot being visited (looked at again) or later ones. */
static size_t evict_before(sparse_table *t, long before) {
  size_t mask = t->map_cap - 1, start = 0, dropped = 0;
  while (t->map_rows[start] != ST_EMPTY) start++; /* load <= 0.7: one exists */
  for (size_t k = 1; k <= t->map_cap; k++) {
    size_t i = (start + k) & mask;
    if (k + 8 <= t->map_cap && t->map_rows[(i + 8) & mask] != ST_EMPTY) {
      __builtin_prefetch(st_row(t, t->map_rows[(i + 8) & mask]) + t->dim + t->state_floats);
    }
    while (t->map_rows[i] != ST_EMPTY &&
           st_meta_step(st_meta_get(t, st_row(t, t->map_rows[i]))) < before) {
      free_row(t, t->map_rows[i]);
      st_map_delete_at(t, i);
      dropped++;
    }
  }
  return dropped;
}

size_t sparse_table_evict(sparse_table *t, long step) {
  if (t->cfg.evict_after <= 0 || step - t->cfg.evict_after <= 0) return 0;
  if (step - t->cfg.evict_after > t->forgot_before) t->forgot_before = step - t->cfg.evict_after;
  return evict_before(t, step - t->cfg.evict_after);
}

long sparse_table_forgotten_before(const sparse_table *t) { return t->forgot_before; }

/* Rows moved out to the spill go by use, not only recency: a row's keep
 * score is its last step plus SPILL_USE_STEPS per doubling of its update
 * count, so a row used twice as often stays as long as one seen that many
 * steps later. Power-law ids (CTR) come back often, once-seen ones rarely:
 * on the disk tier's benchmark (docs/benchmarks.md) 43-47% fewer rows were
 * read back than by recency alone, and recency still lets once-hot rows go.
 * The count's log2 in eighths (exact within 1/8) keeps the score an integer
 * for the threshold's histogram. */
#define SPILL_USE_STEPS 4096
static long recency(uint64_t m) { return st_meta_step(m); }
static long keep_score(uint64_t m) {
  uint64_t x = st_meta_count(m) + 1;
  int log2 = 63 - __builtin_clzll(x);
  long eighths = 8L * log2 + (long)(log2 >= 3 ? (x >> (log2 - 3)) & 7 : (x << (3 - log2)) & 7);
  return st_meta_step(m) + eighths * (SPILL_USE_STEPS / 8);
}

/* The smallest T such that at least `target` of the rows last seen before
 * `step` have value(meta) < T (there are that many): a histogram of the
 * values over a sequential sweep of the rows, narrowed 256x per pass. */
static long eviction_threshold(const sparse_table *t, long step, size_t target,
                               long (*value)(uint64_t)) {
  long lo = 0, hi = 0;
  int any = 0;
  for (size_t r = 0; r < t->high_water; r++) {
    uint64_t m = st_meta_get(t, st_row(t, (uint32_t)r));
    if (m == ST_META_FREE || st_meta_step(m) >= step) continue;
    long v = value(m);
    if (!any || v < lo) lo = v;
    if (!any || v >= hi) hi = v + 1;
    any = 1;
  }
  size_t below = 0; /* candidates with values before lo */
  for (;;) {
    size_t hist[256] = {0};
    long width = (hi - lo + 255) / 256;
    for (size_t r = 0; r < t->high_water; r++) {
      uint64_t m = st_meta_get(t, st_row(t, (uint32_t)r));
      if (m == ST_META_FREE || st_meta_step(m) >= step) continue;
      long v = value(m);
      if (v >= lo && v < hi) hist[(v - lo) / width]++;
    }
    size_t b = 0;
    while (b < 255 && below + hist[b] < target) below += hist[b++];
    if (width <= 1) return lo + (long)b + 1;
    lo += (long)b * width;
    if (lo + width < hi) hi = lo + width;
  }
}

/* Makes room for `missing` new rows under max_bytes by evicting the least
 * recently seen rows not in this pull (rows[] of its found keys are marked
 * seen first). At least what is needed, and about 1/16 of the table, so a
 * full table does not sweep on every pull. Changes nothing when it fails. */
ps_err st_evict_for_limit(sparse_table *t, const uint32_t *rows, size_t n, size_t missing,
                              long step, ps_error *err) {
  size_t after = t->live + missing;
  if (t->cfg.evict_after <= 0) return st_limit_error(t, after, err);
  size_t candidates = 0;
  for (size_t r = 0; r < t->high_water; r++) {
    uint64_t m = st_meta_get(t, st_row(t, (uint32_t)r));
    if (m != ST_META_FREE && st_meta_step(m) < step) candidates++;
  }
  for (size_t i = 0; i < n; i++) {
    /* (a key repeated in the pull would count twice: never below zero) */
    if (rows[i] < ST_NEW && candidates > 0 &&
        st_meta_step(st_meta_get(t, st_row(t, rows[i]))) < step) {
      candidates--;
    }
  }
  /* The bytes after evicting e rows only fall as e grows: bisect for the least e. */
  size_t lo = 0, hi = candidates;
#define ST_HW_AFTER(e) (t->high_water + (missing > t->n_free + (e) ? missing - t->n_free - (e) : 0))
  if (st_bytes_for(t, ST_HW_AFTER(hi), after - hi) > t->cfg.max_bytes) return st_limit_error(t, after, err);
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (st_bytes_for(t, ST_HW_AFTER(mid), after - mid) <= t->cfg.max_bytes) hi = mid;
    else lo = mid + 1;
  }
#undef ST_HW_AFTER
  for (size_t i = 0; i < n; i++) {
    if (rows[i] < ST_NEW) {
      float *row = st_row(t, rows[i]);
      uint64_t m = st_meta_get(t, row);
      if (st_meta_step(m) < step) st_meta_set(t, row, st_meta_make(step, st_meta_count(m)));
    }
  }
  size_t target = t->live / 16;
  if (target > candidates) target = candidates;
  if (target < lo) target = lo;
  if (target > 0) evict_before(t, eviction_threshold(t, step, target, recency));
  return PS_ERR_OK;
}

/* ---- moving rows out (cfg.spill) -------------------------------------------- */

/* Moves the rows last seen before `step` with keep scores below `before`
 * that are not pinned to the spill, at most `max`; returns how many moved.
 * Swept as evict_before. */
static size_t move_before(sparse_table *t, long before, long step, size_t max) {
  const sparse_spill *sp = t->cfg.spill;
  size_t mask = t->map_cap - 1, start = 0, moved = 0;
  while (t->map_rows[start] != ST_EMPTY) start++;
  for (size_t k = 1; k <= t->map_cap && moved < max; k++) {
    size_t i = (start + k) & mask;
    while (moved < max && t->map_rows[i] != ST_EMPTY) {
      uint32_t r = t->map_rows[i];
      const float *row = st_row(t, r);
      uint64_t m = st_meta_get(t, row);
      if (st_meta_step(m) >= step || keep_score(m) >= before ||
          sp->pinned(sp->ctx, t, t->map_keys[i])) {
        break;
      }
      if (!sp->put(sp->ctx, t, t->map_keys[i], row)) return moved; /* the spill is full */
      st_release_row(t, r);
      st_map_delete_at(t, i);
      t->moved_out++;
      moved++;
    }
  }
  return moved;
}

/* Rows that must leave so `missing` new ones fit in the slabs and map the
 * table has: no growth. */
static size_t rows_to_free(const sparse_table *t, size_t missing) {
  size_t room = t->n_free + (t->row_cap - t->high_water), need = 0;
  if (missing > room) need = missing - room;
  size_t slots = t->map_cap * 7 / 10; /* map_cap_for's load */
  if (t->live + missing > slots && t->live + missing - slots > need) need = t->live + missing - slots;
  return need;
}

ps_err st_spill_room(sparse_table *t, size_t missing, long step, ps_error *err) {
  size_t hw = t->high_water + (missing > t->n_free ? missing - t->n_free : 0);
  if (t->cfg.max_bytes == 0 || st_bytes_for(t, hw, t->live + missing) <= t->cfg.max_bytes) {
    ps_error grow;
    ps_err rc = st_reserve(t, hw, t->live + missing, &grow);
    if (rc == PS_ERR_OK) return PS_ERR_OK;
    if (rc != PS_ERR_RESOURCE_EXHAUSTED) {
      *err = grow;
      return rc;
    }
  }
  /* No more memory: rows move out until the new ones fit in what the table holds. */
  size_t need = rows_to_free(t, missing);
  size_t candidates = 0, moved = 0;
  for (size_t r = 0; r < t->high_water; r++) {
    uint64_t m = st_meta_get(t, st_row(t, (uint32_t)r));
    if (m != ST_META_FREE && st_meta_step(m) < step) candidates++;
  }
  size_t target = t->live / 16 > need ? t->live / 16 : need;
  if (target > candidates) target = candidates;
  const sparse_spill *sp = t->cfg.spill;
  sp->begin(sp->ctx);
  if (target > 0) {
    moved = move_before(t, eviction_threshold(t, step, target, keep_score), step, target);
  }
  /* Pinned rows were counted above and stayed: the rest of the candidates. */
  if (moved < need) moved += move_before(t, LONG_MAX, step, need - moved);
  if (moved < need) {
    return ps_error_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                        "table '%s': %zu new rows do not fit in its memory and only %zu of the "
                        "%zu rows to move out could (the others are in use: raise "
                        "--table-memory-mb)",
                        t->cfg.name, missing, moved, need);
  }
  hw = t->high_water + (missing > t->n_free ? missing - t->n_free : 0);
  return st_reserve(t, hw, t->live + missing, err);
}
