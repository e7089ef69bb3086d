/* Sparse tables read from outside training: read-only lookups (evaluation),
 * snapshots dumped in ascending key order (equal tables give equal bytes)
 * and load, which builds the new rows aside and swaps them in, so a refused
 * load leaves the table as it was. */
#include <stdlib.h>

#include "common/sparse_table_internal.h"

typedef struct key_row {
  uint64_t key;
  uint32_t row;
} key_row;

static int key_row_cmp(const void *a, const void *b) {
  uint64_t x = ((const key_row *)a)->key, y = ((const key_row *)b)->key;
  return (x > y) - (x < y);
}

/* Sorts by key: an LSD radix sort in 6 passes of 11 bits (keys are mixed
 * hashes, so every digit spreads). A pserver dumps under its lock at every
 * checkpoint: with it a dump of 620k rows takes 84 ms instead of 160 with
 * qsort (bench_sparse 0.62). A pass whose digit is the same for all keys is
 * skipped. Falls back to qsort when the scratch array cannot be had. */
#define RADIX_BITS 11
#define RADIX_BUCKETS (1u << RADIX_BITS)
static void sort_by_key(key_row *a, size_t n) {
  key_row *tmp = n > 1 ? malloc(n * sizeof *tmp) : NULL;
  if (tmp == NULL) {
    qsort(a, n, sizeof *a, key_row_cmp);
    return;
  }
  size_t count[RADIX_BUCKETS];
  key_row *src = a, *dst = tmp;
  for (unsigned shift = 0; shift < 64; shift += RADIX_BITS) {
    memset(count, 0, sizeof count);
    for (size_t i = 0; i < n; i++) count[(src[i].key >> shift) & (RADIX_BUCKETS - 1)]++;
    if (count[(src[0].key >> shift) & (RADIX_BUCKETS - 1)] == n) continue;
    size_t at = 0;
    for (unsigned b = 0; b < RADIX_BUCKETS; b++) {
      size_t c = count[b];
      count[b] = at;
      at += c;
    }
    for (size_t i = 0; i < n; i++) dst[count[(src[i].key >> shift) & (RADIX_BUCKETS - 1)]++] = src[i];
    key_row *swap = src;
    src = dst;
    dst = swap;
  }
  if (src != a) memcpy(a, src, n * sizeof *a);
  free(tmp);
}

void sparse_table_lookup(const sparse_table *t, const uint64_t *keys, size_t n, float *out) {
  for (size_t i = 0; i < n; i++) {
    int found;
    size_t slot = st_map_find(t, keys[i], &found);
    float *dst = out + i * t->dim;
    if (found) {
      memcpy(dst, st_row(t, t->map_rows[slot]), t->dim * sizeof *dst);
    } else {
      memset(dst, 0, t->dim * sizeof *dst);
    }
  }
}

ps_err sparse_table_dump(const sparse_table *t, uint64_t *keys, float *values, float *state,
                         int64_t *meta, ps_error *err) {
  if (t->live == 0) return PS_ERR_OK;
  key_row *order = malloc(t->live * sizeof *order);
  if (order == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "table '%s': no memory to sort %zu rows for a dump",
                        t->cfg.name, t->live);
  }
  size_t n = 0;
  for (size_t i = 0; i < t->map_cap; i++) {
    if (t->map_rows[i] != ST_EMPTY) order[n++] = (key_row){t->map_keys[i], t->map_rows[i]};
  }
  sort_by_key(order, n);
  size_t dim = t->dim, sf = t->state_floats;
  for (size_t i = 0; i < n; i++) {
    const float *row = st_row(t, order[i].row);
    keys[i] = order[i].key;
    memcpy(values + i * dim, row, dim * sizeof(float));
    if (state != NULL) memcpy(state + i * sf, row + dim, sf * sizeof(float));
    if (meta != NULL) {
      uint64_t m = st_meta_get(t, row);
      meta[2 * i] = (int64_t)st_meta_step(m);
      meta[2 * i + 1] = (int64_t)st_meta_count(m);
    }
  }
  free(order);
  return PS_ERR_OK;
}

ps_err sparse_table_load(sparse_table *t, size_t n, const uint64_t *keys, const float *values,
                         const float *state, const int64_t *meta, ps_error *err) {
  const char *name = t->cfg.name;
  if (n > ST_MAX_ROWS) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "table '%s': %zu rows are more than a table holds (%zu)",
                        name, n, ST_MAX_ROWS);
  }
  long last_step = t->last_step;
  for (size_t i = 0; meta != NULL && i < n; i++) {
    if (meta[2 * i] < 0 || meta[2 * i] > ST_STEP_MAX || meta[2 * i + 1] < 0) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                          "table '%s': row %zu (key %llu) has last step %lld and count %lld, "
                          "not in 0..%ld and >= 0",
                          name, i, (unsigned long long)keys[i], (long long)meta[2 * i],
                          (long long)meta[2 * i + 1], ST_STEP_MAX);
    }
    if (meta[2 * i] > last_step) last_step = (long)meta[2 * i];
  }
  /* The new rows go into a table of their own, swapped in when all is well. */
  sparse_table fresh = *t;
  fresh.map_keys = NULL;
  fresh.map_rows = NULL;
  fresh.slabs = NULL;
  fresh.map_cap = fresh.n_slabs = fresh.slab_dir_cap = fresh.row_cap = 0;
  fresh.high_water = fresh.live = fresh.n_free = 0;
  fresh.free_head = ST_EMPTY;
  if (t->cfg.max_bytes > 0 && st_bytes_for(&fresh, n, n) > t->cfg.max_bytes) {
    return ps_error_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                        "table '%s' would pass its limit of %.6g MB (--max-table-mb) at %zu rows",
                        name, (double)t->cfg.max_bytes / (1024.0 * 1024.0), n);
  }
  /* Against a shared budget the new rows count in place of the old ones
   * (both are held for the swap's moment, not counted twice). */
  sparse_budget *budget = t->cfg.budget;
  size_t need = st_bytes_for(&fresh, n, n), taken = 0;
  fresh.cfg.budget = NULL;
  fresh.charged = 0;
  if (budget != NULL && need > t->charged) {
    taken = need - t->charged;
    if (!st_budget_take(budget, taken)) return st_budget_error(t, n, need, err);
  }
  ps_err rc = st_reserve(&fresh, n, n, err);
  if (rc != PS_ERR_OK) {
    st_storage_free(&fresh);
    if (taken > 0) atomic_fetch_sub(&budget->used, taken);
    return rc;
  }
  size_t dim = t->dim, sf = t->state_floats;
  for (size_t i = 0; i < n; i++) {
    uint32_t r = st_take_row(&fresh);
    if (!st_map_insert(&fresh, keys[i], r)) {
      st_storage_free(&fresh);
      if (taken > 0) atomic_fetch_sub(&budget->used, taken);
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "table '%s': key %llu appears twice (row %zu)",
                          name, (unsigned long long)keys[i], i);
    }
    float *row = st_row(&fresh, r);
    memcpy(row, values + i * dim, dim * sizeof(float));
    if (state != NULL) memcpy(row + dim, state + i * sf, sf * sizeof(float));
    else st_init_state(&fresh, row);
    uint64_t m = meta != NULL ? st_meta_make((long)meta[2 * i], (uint64_t)meta[2 * i + 1])
                              : st_meta_make(t->last_step, 0);
    st_meta_set(&fresh, row, m);
  }
  st_storage_free(t);
  fresh.last_step = last_step;
  fresh.generation++; /* every row moved (and with no rows, every row went) */
  fresh.cfg.budget = budget;
  fresh.charged = t->charged + taken;
  *t = fresh;
  if (budget != NULL) st_budget_settle(t);
  return PS_ERR_OK;
}
