/* A sparse table's side of a spill (a pserver's disk tier): whole rows
 * installed back, taken out, scanned, and read apart. The moves out are
 * eviction's (sparse_table_evict.c). */
#include "common/sparse_table_internal.h"

ps_err sparse_table_reserve(sparse_table *t, size_t rows, ps_error *err) {
  return st_reserve(t, rows > t->high_water ? rows : t->high_water, rows > t->live ? rows : t->live,
                    err);
}

void sparse_table_set_spill(sparse_table *t, const sparse_spill *spill) { t->cfg.spill = spill; }

size_t sparse_table_row_floats(const sparse_table_config *cfg) {
  return (size_t)cfg->dim + (size_t)sparse_table_state_floats(cfg) + 2;
}

long sparse_table_row_step(const sparse_table *t, const float *row) {
  return st_meta_step(st_meta_get(t, row));
}

void sparse_table_row_meta(const sparse_table *t, const float *row, int64_t meta[2]) {
  uint64_t m = st_meta_get(t, row);
  meta[0] = st_meta_step(m);
  meta[1] = (int64_t)st_meta_count(m);
}

void sparse_table_row_pack(const sparse_table *t, const float *values, const float *state,
                           const int64_t *meta, float *row) {
  memcpy(row, values, t->dim * sizeof(float));
  if (state != NULL) memcpy(row + t->dim, state, t->state_floats * sizeof(float));
  else st_init_state(t, row);
  long step = meta != NULL ? (long)meta[0] : t->last_step;
  uint64_t count = meta != NULL ? (uint64_t)meta[1] : 0;
  st_meta_set(t, row, st_meta_make(step, count));
}

int sparse_table_has(const sparse_table *t, uint64_t key) {
  int found;
  st_map_find(t, key, &found);
  return found;
}

size_t sparse_table_missing(const sparse_table *t, const uint64_t *keys, size_t n,
                            uint32_t *missing) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (i + ST_AHEAD < n) prefetch_slot(t, keys[i + ST_AHEAD]);
    int found;
    st_map_find(t, keys[i], &found);
    if (!found) missing[m++] = (uint32_t)i;
  }
  return m;
}

ps_err sparse_table_install(sparse_table *t, const uint64_t *keys, size_t n, const float *rows,
                            ps_error *err) {
  size_t missing = 0;
  for (size_t i = 0; i < n; i++) missing += !sparse_table_has(t, keys[i]);
  if (missing == 0) return PS_ERR_OK;
  if (t->live + missing > ST_MAX_ROWS) return st_limit_error(t, t->live + missing, err);
  ps_err rc;
  if (t->cfg.spill != NULL) {
    /* Any row not pinned may make room: these rows were wanted more lately. */
    rc = st_spill_room(t, missing, t->last_step + 1, err);
  } else {
    size_t hw = t->high_water + (missing > t->n_free ? missing - t->n_free : 0);
    if (t->cfg.max_bytes > 0 && st_bytes_for(t, hw, t->live + missing) > t->cfg.max_bytes) {
      return st_limit_error(t, t->live + missing, err);
    }
    rc = st_reserve(t, hw, t->live + missing, err);
  }
  if (rc != PS_ERR_OK) return rc;
  t->pulled.keys = NULL;
  for (size_t i = 0; i < n; i++) {
    int found;
    size_t slot = st_map_find(t, keys[i], &found);
    if (found) continue;
    uint32_t r = st_take_row(t);
    t->map_keys[slot] = keys[i];
    t->map_rows[slot] = r;
    memcpy(st_row(t, r), rows + i * t->row_floats, t->row_floats * sizeof(float));
    t->moved_in++;
  }
  return PS_ERR_OK;
}

const float *sparse_table_peek(const sparse_table *t, uint64_t key) {
  int found;
  size_t slot = st_map_find(t, key, &found);
  return found ? st_row(t, t->map_rows[slot]) : NULL;
}

int sparse_table_take(sparse_table *t, uint64_t key, float *row) {
  int found;
  size_t slot = st_map_find(t, key, &found);
  if (!found) return 0;
  uint32_t r = t->map_rows[slot];
  float *src = st_row(t, r);
  memcpy(row, src, t->row_floats * sizeof(float));
  t->pulled.keys = NULL;
  st_release_row(t, r);
  st_map_delete_at(t, slot);
  return 1;
}

size_t sparse_table_scan(const sparse_table *t, size_t *cursor, size_t max, uint64_t *keys,
                         float *rows) {
  size_t got = 0, i = *cursor;
  for (; i < t->map_cap && got < max; i++) {
    if (t->map_rows[i] == ST_EMPTY) continue;
    keys[got] = t->map_keys[i];
    memcpy(rows + got * t->row_floats, st_row(t, t->map_rows[i]), t->row_floats * sizeof(float));
    got++;
  }
  *cursor = i;
  return got;
}
