/* Sparse embedding tables: the hash map, the row slabs, pull (with
 * admission and the memory limit) and the row optimizers. Eviction is in
 * sparse_table_evict.c, dump and load in sparse_table_io.c, batch
 * deduplication in sparse_dedup.c. */
#include <math.h>
#include <stdlib.h>

#include "common/copy_row.h"
#include "common/optimizer_math.h"
#include "common/sparse_table_internal.h"


/* ---- configuration ------------------------------------------------------ */

int sparse_table_state_floats(const sparse_table_config *cfg) {
  switch (cfg->opt.kind) {
  case SPARSE_OPT_ADAGRAD: return 1; /* row-wise: one sum of squares per row */
  case SPARSE_OPT_ADAM: return 2 * cfg->dim;
  case SPARSE_OPT_SGD: return 0;
  }
  return 0;
}

ps_err sparse_table_config_check(const sparse_table_config *cfg, ps_error *err) {
  if (memchr(cfg->name, '\0', sizeof cfg->name) == NULL || cfg->name[0] == '\0') {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "a sparse table needs a name of 1 to %d characters",
                        SPARSE_TABLE_NAME_MAX - 1);
  }
  const char *name = cfg->name;
  const sparse_optimizer_config *o = &cfg->opt;
  if (cfg->dim < 1 || cfg->dim > SPARSE_TABLE_MAX_DIM) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "table '%s': dim %d is not in 1..%d", name,
                        cfg->dim, SPARSE_TABLE_MAX_DIM);
  }
  if ((unsigned)o->kind >= SPARSE_OPT_KIND_COUNT) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "table '%s': unknown optimizer %d", name,
                        (int)o->kind);
  }
  if (!(o->lr > 0) || !isfinite(o->lr)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "table '%s': lr %g must be finite and > 0",
                        name, o->lr);
  }
  if (o->kind != SPARSE_OPT_SGD && (!(o->epsilon > 0) || !isfinite(o->epsilon))) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "table '%s': epsilon %g must be finite and > 0", name, o->epsilon);
  }
  if (o->kind == SPARSE_OPT_ADAGRAD &&
      (!(o->initial_accumulator >= 0) || !isfinite(o->initial_accumulator))) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "table '%s': initial accumulator %g must be finite and >= 0", name,
                        o->initial_accumulator);
  }
  if (o->kind == SPARSE_OPT_ADAM &&
      (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "table '%s': Adam betas %g, %g must be in [0, 1)",
                        name, o->beta1, o->beta2);
  }
  if (!(cfg->init_scale >= 0) || !isfinite(cfg->init_scale)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "table '%s': init scale %g must be finite and >= 0",
                        name, (double)cfg->init_scale);
  }
  if (cfg->admit_after < 0 || cfg->admit_after > ST_ADMIT_MAX) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "table '%s': admit-after %d is not in 0..%d",
                        name, cfg->admit_after, ST_ADMIT_MAX);
  }
  if (cfg->evict_after < 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "table '%s': evict-after %ld must be >= 0",
                        name, cfg->evict_after);
  }
  return PS_ERR_OK;
}

ps_err st_limit_error(const sparse_table *t, size_t rows, ps_error *err) {
  return ps_error_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                      "table '%s' would pass its limit of %.6g MB (--max-table-mb) at %zu rows",
                      t->cfg.name, (double)t->cfg.max_bytes / (1024.0 * 1024.0), rows);
}

ps_err sparse_table_create(sparse_table **out, const sparse_table_config *cfg, ps_error *err) {
  *out = NULL;
  ps_err rc = sparse_table_config_check(cfg, err);
  if (rc != PS_ERR_OK) return rc;
  sparse_table *t = calloc(1, sizeof *t);
  if (t == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "table '%s': out of memory", cfg->name);
  t->cfg = *cfg;
  t->dim = (size_t)cfg->dim;
  t->state_floats = (size_t)sparse_table_state_floats(cfg);
  t->row_floats = t->dim + t->state_floats + 2;
  t->free_head = ST_EMPTY;
  if (cfg->admit_after > 1) {
    t->filter = calloc(ST_FILTER_BYTES, 1);
    if (t->filter == NULL) {
      free(t);
      return ps_error_set(err, PS_ERR_NO_MEMORY, "table '%s': no memory for its %zu-byte admission filter",
                          cfg->name, ST_FILTER_BYTES);
    }
  }
  if (cfg->max_bytes > 0 && st_bytes_for(t, 0, 0) > cfg->max_bytes) {
    rc = st_limit_error(t, 0, err);
    sparse_table_destroy(t);
    return rc;
  }
  rc = st_reserve(t, 0, 0, err);
  if (rc != PS_ERR_OK) {
    sparse_table_destroy(t);
    return rc;
  }
  *out = t;
  return PS_ERR_OK;
}

void st_storage_free(sparse_table *t) {
  for (size_t s = 0; s < t->n_slabs; s++) free(t->slabs[s]);
  free(t->slabs);
  free(t->map_keys);
  free(t->map_rows);
  t->slabs = NULL;
  t->map_keys = NULL;
  t->map_rows = NULL;
  t->n_slabs = t->slab_dir_cap = t->row_cap = t->map_cap = 0;
}

void sparse_table_destroy(sparse_table *t) {
  if (t == NULL) return;
  st_storage_free(t);
  if (t->cfg.budget != NULL) atomic_fetch_sub(&t->cfg.budget->used, t->charged);
  free(t->filter);
  free(t->scratch);
  free(t);
}

const sparse_table_config *sparse_table_config_of(const sparse_table *t) { return &t->cfg; }

void sparse_table_init_row(const sparse_table_config *cfg, uint64_t key, float *out) {
  uint64_t stream = rng_mix64(rng_mix64(key) + cfg->id);
  for (int i = 0; i < cfg->dim; i++) {
    float u = rng_uniform_at(cfg->seed, stream, (uint64_t)i);
    out[i] = (2.0f * u - 1.0f) * cfg->init_scale;
  }
}

void st_init_state(const sparse_table *t, float *row) {
  float *state = row + t->dim;
  if (t->cfg.opt.kind == SPARSE_OPT_ADAGRAD) state[0] = (float)t->cfg.opt.initial_accumulator;
  else memset(state, 0, t->state_floats * sizeof(float));
}

/* ---- memory --------------------------------------------------------------- */

static size_t rows_capacity(size_t high_water) {
  if (high_water == 0) return 0;
  if (high_water > ST_SLAB_ROWS) return (high_water + ST_SLAB_ROWS - 1) & ~(ST_SLAB_ROWS - 1);
  size_t cap = ST_SLAB0_MIN_ROWS;
  while (cap < high_water) cap *= 2;
  return cap;
}

static size_t map_cap_for(size_t live) {
  size_t cap = ST_MAP_MIN_CAP;
  while (live * 10 > cap * 7) cap *= 2;
  return cap;
}

size_t st_bytes_for(const sparse_table *t, size_t high_water, size_t live) {
  size_t rows = rows_capacity(high_water), slots = map_cap_for(live);
  if (rows < t->row_cap) rows = t->row_cap;
  if (slots < t->map_cap) slots = t->map_cap;
  return rows * t->row_floats * sizeof(float) + slots * (sizeof(uint64_t) + sizeof(uint32_t)) +
         (t->filter != NULL ? ST_FILTER_BYTES : 0);
}

int st_map_insert(sparse_table *t, uint64_t key, uint32_t r) {
  size_t mask = t->map_cap - 1, i = (size_t)(st_hash(key) >> t->map_shift);
  for (; t->map_rows[i] != ST_EMPTY; i = (i + 1) & mask) {
    if (t->map_keys[i] == key) return 0;
  }
  t->map_keys[i] = key;
  t->map_rows[i] = r;
  return 1;
}

static ps_err map_grow(sparse_table *t, size_t cap, ps_error *err) {
  uint64_t *keys = malloc(cap * sizeof *keys);
  uint32_t *rows = malloc(cap * sizeof *rows);
  if (keys == NULL || rows == NULL) {
    free(keys);
    free(rows);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "table '%s': no memory for a map of %zu slots",
                        t->cfg.name, cap);
  }
  memset(rows, 0xff, cap * sizeof *rows); /* ST_EMPTY */
  uint64_t *old_keys = t->map_keys;
  uint32_t *old_rows = t->map_rows;
  size_t old_cap = t->map_cap;
  t->map_keys = keys;
  t->map_rows = rows;
  t->map_cap = cap;
  t->generation++;
  t->map_shift = 64;
  for (size_t c = cap; c > 1; c >>= 1) t->map_shift--;
  for (size_t i = 0; i < old_cap; i++) {
    if (old_rows[i] != ST_EMPTY) st_map_insert(t, old_keys[i], old_rows[i]);
  }
  free(old_keys);
  free(old_rows);
  return PS_ERR_OK;
}

static ps_err slabs_grow(sparse_table *t, size_t rows, ps_error *err) {
  size_t row_bytes = t->row_floats * sizeof(float);
  while (t->row_cap < rows) {
    if (t->n_slabs == 1 && t->row_cap < ST_SLAB_ROWS) {
      /* Slab 0 doubles in place: row indices, not pointers, are what the map keeps. */
      size_t want = rows < ST_SLAB_ROWS ? rows_capacity(rows) : ST_SLAB_ROWS;
      float *p = realloc(t->slabs[0], want * row_bytes);
      if (p == NULL) goto no_memory;
      t->slabs[0] = p;
      t->row_cap = want;
      continue;
    }
    if (t->n_slabs == t->slab_dir_cap) {
      size_t cap = t->slab_dir_cap ? 2 * t->slab_dir_cap : 16;
      float **dir = realloc(t->slabs, cap * sizeof *dir);
      if (dir == NULL) goto no_memory;
      t->slabs = dir;
      t->slab_dir_cap = cap;
    }
    size_t n = t->n_slabs == 0 ? rows_capacity(rows < ST_SLAB_ROWS ? rows : ST_SLAB_ROWS) : ST_SLAB_ROWS;
    float *slab = malloc(n * row_bytes);
    if (slab == NULL) goto no_memory;
    t->slabs[t->n_slabs++] = slab;
    t->row_cap += n;
  }
  return PS_ERR_OK;
no_memory:
  return ps_error_set(err, PS_ERR_NO_MEMORY, "table '%s': no memory for %zu rows of %zu bytes",
                      t->cfg.name, rows, row_bytes);
}

ps_err st_reserve(sparse_table *t, size_t high_water, size_t live, ps_error *err) {
  sparse_budget *b = t->cfg.budget;
  size_t need = st_bytes_for(t, high_water, live), taken = 0;
  if (b != NULL && need > t->charged) {
    taken = need - t->charged;
    if (!st_budget_take(b, taken)) return st_budget_error(t, live, need, err);
  }
  ps_err rc = PS_ERR_OK;
  size_t cap = map_cap_for(live);
  if (cap > t->map_cap) rc = map_grow(t, cap, err);
  if (rc == PS_ERR_OK) rc = slabs_grow(t, high_water, err);
  if (b != NULL) {
    t->charged += taken;
    st_budget_settle(t);
  }
  return rc;
}

uint32_t st_take_row(sparse_table *t) {
  t->generation++;
  uint32_t r = t->free_head;
  if (r != ST_EMPTY) {
    memcpy(&t->free_head, st_row(t, r), sizeof t->free_head);
    t->n_free--;
  } else {
    r = (uint32_t)t->high_water++;
  }
  t->live++;
  return r;
}

static inline void prefetch_row(const sparse_table *t, uint32_t r) {
  if (r >= ST_NEW) return;
  const float *row = st_row(t, r);
  __builtin_prefetch(row);
  __builtin_prefetch(row + t->row_floats - 1); /* a row spans two lines */
}

/* Room in t->scratch for the rows of n keys. */
static ps_err scratch_reserve(sparse_table *t, size_t n, ps_error *err) {
  if (t->scratch_cap >= n) return PS_ERR_OK;
  uint32_t *s = realloc(t->scratch, n * sizeof *s);
  if (s == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "table '%s': no memory for a batch of %zu keys",
                        t->cfg.name, n);
  }
  t->scratch = s;
  t->scratch_cap = n;
  return PS_ERR_OK;
}

/* ---- admission ---------------------------------------------------------------- */

static void filter_slots(uint64_t key, size_t slot[ST_FILTER_HASHES]) {
  uint64_t a = rng_mix64(key ^ 0xbb67ae8584caa73bULL), b = rng_mix64(key ^ 0x3c6ef372fe94f82bULL);
  size_t mask = ((size_t)1 << ST_FILTER_LOG2) - 1;
  slot[0] = (size_t)a & mask;
  slot[1] = ((size_t)(a >> 32) & mask) + ((size_t)1 << ST_FILTER_LOG2);
  slot[2] = ((size_t)b & mask) + ((size_t)2 << ST_FILTER_LOG2);
  slot[3] = ((size_t)(b >> 32) & mask) + ((size_t)3 << ST_FILTER_LOG2);
}

/* Occurrences of key counted so far (an overestimate, never an underestimate). */
static unsigned filter_count(const sparse_table *t, uint64_t key) {
  size_t slot[ST_FILTER_HASHES];
  filter_slots(key, slot);
  unsigned c = t->filter[slot[0]];
  for (int h = 1; h < ST_FILTER_HASHES; h++) c = t->filter[slot[h]] < c ? t->filter[slot[h]] : c;
  return c;
}

/* Conservative update: counters rise only to the key's new estimate. */
static void filter_add(sparse_table *t, uint64_t key, uint32_t occurrences) {
  size_t slot[ST_FILTER_HASHES];
  filter_slots(key, slot);
  unsigned c = filter_count(t, key) + occurrences;
  uint8_t v = (uint8_t)(c > 255 ? 255 : c);
  for (int h = 0; h < ST_FILTER_HASHES; h++) {
    if (t->filter[slot[h]] < v) t->filter[slot[h]] = v;
  }
}

/* ---- pull and push ---------------------------------------------------------------- */

/* A checksum of the keys: a push does not reuse a pull's rows once other
 * keys were written into the array the pull read. */
static uint64_t keys_fingerprint(const uint64_t *keys, size_t n) {
  uint64_t h = n;
  for (size_t i = 0; i < n; i++) h += keys[i] * (2 * (uint64_t)i + 1);
  return h;
}

static ps_err check_step(const sparse_table *t, long step, ps_error *err) {
  if (step < 0 || step > ST_STEP_MAX) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "table '%s': step %ld is not in 0..%ld",
                        t->cfg.name, step, ST_STEP_MAX);
  }
  return PS_ERR_OK;
}

/* A pull's first pass, changing nothing: each key found (its row), new
 * (admitted) or refused; returns how many are new. */
static size_t pull_decide(sparse_table *t, const uint64_t *keys, size_t n, const uint32_t *counts,
                          uint32_t *rows) {
  size_t missing = 0;
  for (size_t i = 0; i < n; i++) {
    if (i + ST_AHEAD < n) prefetch_slot(t, keys[i + ST_AHEAD]);
    int found;
    size_t slot = st_map_find(t, keys[i], &found);
    if (found) {
      rows[i] = t->map_rows[slot];
    } else if (t->filter == NULL ||
               filter_count(t, keys[i]) + (counts ? counts[i] : 1) >= (unsigned)t->cfg.admit_after) {
      rows[i] = ST_NEW;
      missing++;
    } else {
      rows[i] = ST_REFUSED;
    }
  }
  return missing;
}

/* Room for `missing` new rows: within the row limit, evicting for the
 * memory limit first where it would be passed. */
static ps_err pull_make_room(sparse_table *t, uint32_t *rows, size_t n, size_t missing, long step,
                             ps_error *err) {
  if (t->live + missing > ST_MAX_ROWS) return st_limit_error(t, t->live + missing, err);
  if (t->cfg.spill != NULL) {
    /* The found rows are this step's: marked seen first, so none moves out. */
    for (size_t i = 0; i < n; i++) {
      if (rows[i] < ST_NEW) {
        float *row = st_row(t, rows[i]);
        uint64_t m = st_meta_get(t, row);
        if (st_meta_step(m) < step) st_meta_set(t, row, st_meta_make(step, st_meta_count(m)));
      }
    }
    return st_spill_room(t, missing, step, err);
  }
  size_t hw = t->high_water + (missing > t->n_free ? missing - t->n_free : 0);
  if (t->cfg.max_bytes > 0 && st_bytes_for(t, hw, t->live + missing) > t->cfg.max_bytes) {
    PS_TRY(st_evict_for_limit(t, rows, n, missing, step, err));
    hw = t->high_water + (missing > t->n_free ? missing - t->n_free : 0);
  }
  return st_reserve(t, hw, t->live + missing, err);
}

/* The new row of key at `slot` (st_map_find's, not found), initialized. */
static uint32_t pull_create(sparse_table *t, uint64_t key, size_t slot, long step) {
  uint32_t r = st_take_row(t);
  t->map_keys[slot] = key;
  t->map_rows[slot] = r;
  float *row = st_row(t, r);
  sparse_table_init_row(&t->cfg, key, row);
  st_init_state(t, row);
  st_meta_set(t, row, st_meta_make(step, 0));
  t->admitted++;
  return r;
}

/* The pull's second pass: new rows made, every row's last step set, the
 * rows (zeros for refused keys) copied out. */
static void pull_commit(sparse_table *t, const uint64_t *keys, size_t n, const uint32_t *counts,
                        uint32_t *rows, long step, float *out) {
  size_t dim = t->dim;
  for (size_t i = 0; i < n; i++) {
    if (i + ST_AHEAD < n) prefetch_row(t, rows[i + ST_AHEAD]);
    float *dst = out + i * dim;
    uint32_t r = rows[i];
    if (r == ST_REFUSED || (r == ST_NEW && t->filter != NULL)) {
      filter_add(t, keys[i], counts ? counts[i] : 1);
    }
    if (r == ST_REFUSED) {
      t->refused++;
      memset(dst, 0, dim * sizeof *dst);
      continue;
    }
    if (r == ST_NEW) {
      int found;
      size_t slot = st_map_find(t, keys[i], &found);
      /* a repeated key (callers should dedup) has its row already */
      r = found ? t->map_rows[slot] : pull_create(t, keys[i], slot, step);
      rows[i] = r; /* for the push of these keys */
    }
    float *row = st_row(t, r);
    uint64_t m = st_meta_get(t, row);
    if (st_meta_step(m) < step) st_meta_set(t, row, st_meta_make(step, st_meta_count(m)));
    copy_row(dst, row, dim);
  }
}

ps_err sparse_table_pull(sparse_table *t, const uint64_t *keys, size_t n, const uint32_t *counts,
                         long step, float *out, ps_error *err) {
  ps_err rc = check_step(t, step, err);
  if (rc != PS_ERR_OK || n == 0) return rc;
  t->pulled.keys = NULL;
  PS_TRY(scratch_reserve(t, n, err));
  uint32_t *rows = t->scratch;
  size_t missing = pull_decide(t, keys, n, counts, rows);
  if (missing > 0) PS_TRY(pull_make_room(t, rows, n, missing, step, err));
  pull_commit(t, keys, n, counts, rows, step, out);
  if (step > t->last_step) t->last_step = step;
  t->pulled.keys = keys;
  t->pulled.n = n;
  t->pulled.step = step;
  t->pulled.generation = t->generation;
  t->pulled.fingerprint = keys_fingerprint(keys, n);
  return PS_ERR_OK;
}

/* Row-wise AdaGrad (Paddle's CTR accessor and TorchRec's default): one sum
 * of squares per row, acc += mean(g^2), w -= lr g / (sqrt(acc) + eps). It
 * keeps 4 bytes of state per row instead of 4*dim, and loses little: rows
 * of an embedding see gradients of one scale. The squares are summed in 8
 * fixed lanes, so the loop vectorizes and the result is the same on every
 * machine. */
static void adagrad_row(float *restrict w, float *restrict acc, const float *restrict g,
                        size_t dim, float lr, float eps) {
  float lane[8] = {0};
  size_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    for (size_t j = 0; j < 8; j++) lane[j] += g[i + j] * g[i + j];
  }
  for (size_t j = 0; i + j < dim; j++) lane[j] += g[i + j] * g[i + j];
  float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  *acc += sum / (float)dim;
  float scale = lr / (sqrtf(*acc) + eps);
  for (size_t k = 0; k < dim; k++) w[k] -= scale * g[k];
}

/* Lazy Adam: only this row's moments move, bias-corrected by its own count. */
static void adam_row(float *restrict w, float *restrict m, float *restrict v, const float *restrict g,
                     size_t dim, const optimizer_scalars *s) {
  const optimizer_scalars sc = *s; /* not aliased by the rows: no runtime alias check */
  for (size_t k = 0; k < dim; k++) optimizer_adam_elem(&w[k], &m[k], &v[k], g[k], &sc);
}

static void sgd_row(float *restrict w, const float *restrict g, size_t dim, float lr) {
  for (size_t k = 0; k < dim; k++) w[k] -= lr * g[k];
}

ps_err sparse_table_push(sparse_table *t, const uint64_t *keys, size_t n, const float *grads,
                         long step, ps_error *err) {
  ps_err rc = check_step(t, step, err);
  if (rc != PS_ERR_OK) return rc;
  const sparse_optimizer_config *o = &t->cfg.opt;
  size_t dim = t->dim;
  float lr = (float)o->lr, eps = (float)o->epsilon;
  optimizer_scalars s = {0};
  s.lr = lr;
  s.epsilon = eps;
  s.beta1 = (float)o->beta1;
  s.beta2 = (float)o->beta2;
  s.one_minus_beta1 = (float)(1.0 - o->beta1);
  s.one_minus_beta2 = (float)(1.0 - o->beta2);
  /* The pull of these keys at this step left their rows in scratch (its
   * refused keys marked ST_REFUSED, as not found): unless a row moved since,
   * no need to look them up again. */
  int reuse = t->pulled.keys == keys && t->pulled.n == n && t->pulled.step == step &&
              t->pulled.generation == t->generation && n > 0 &&
              t->pulled.fingerprint == keys_fingerprint(keys, n);
  if (!reuse) {
    t->pulled.keys = NULL;
    rc = scratch_reserve(t, n, err);
    if (rc != PS_ERR_OK) return rc;
  }
  uint32_t *rows = t->scratch;
  for (size_t i = 0; !reuse && i < n; i++) {
    if (i + ST_AHEAD < n) prefetch_slot(t, keys[i + ST_AHEAD]);
    int found;
    size_t slot = st_map_find(t, keys[i], &found);
    rows[i] = found ? t->map_rows[slot] : ST_REFUSED;
  }
  for (size_t i = 0; i < n; i++) {
    if (i + ST_AHEAD < n) prefetch_row(t, rows[i + ST_AHEAD]);
    if (rows[i] == ST_REFUSED) continue;
    float *row = st_row(t, rows[i]);
    const float *g = grads + i * dim;
    uint64_t meta = st_meta_get(t, row);
    switch (o->kind) {
    case SPARSE_OPT_ADAGRAD: adagrad_row(row, row + dim, g, dim, lr, eps); break;
    case SPARSE_OPT_ADAM: {
      double tt = (double)st_meta_count(meta) + 1.0;
      s.bias_correction1 = (float)(1.0 - pow(o->beta1, tt));
      s.bias_correction2 = (float)(1.0 - pow(o->beta2, tt));
      adam_row(row, row + dim, row + 2 * dim, g, dim, &s);
      break;
    }
    case SPARSE_OPT_SGD: sgd_row(row, g, dim, lr); break;
    }
    st_meta_set(t, row, st_meta_make(st_meta_step(meta), st_meta_count(meta) + 1));
  }
  return PS_ERR_OK;
}

/* Rows of keys = values * scale (assign) or += values * scale, creating
 * missing rows first whatever the admission filter says. */
static ps_err write_rows(sparse_table *t, const uint64_t *keys, size_t n, const float *values,
                         float scale, int assign, long step, ps_error *err) {
  ps_err rc = check_step(t, step, err);
  if (rc != PS_ERR_OK || n == 0) return rc;
  t->pulled.keys = NULL;
  size_t missing = 0;
  for (size_t i = 0; i < n; i++) {
    int found;
    st_map_find(t, keys[i], &found);
    missing += !found;
  }
  if (missing > 0 && t->cfg.spill != NULL) {
    if (t->live + missing > ST_MAX_ROWS) return st_limit_error(t, t->live + missing, err);
    /* This batch's rows are seen at step (below anyway): none of them moves out. */
    for (size_t i = 0; i < n; i++) {
      int found;
      size_t slot = st_map_find(t, keys[i], &found);
      if (!found) continue;
      float *row = st_row(t, t->map_rows[slot]);
      uint64_t m = st_meta_get(t, row);
      if (st_meta_step(m) < step) st_meta_set(t, row, st_meta_make(step, st_meta_count(m)));
    }
    rc = st_spill_room(t, missing, step, err);
    if (rc != PS_ERR_OK) return rc;
  } else if (missing > 0) {
    size_t hw = t->high_water + (missing > t->n_free ? missing - t->n_free : 0);
    if (t->live + missing > ST_MAX_ROWS ||
        (t->cfg.max_bytes > 0 && st_bytes_for(t, hw, t->live + missing) > t->cfg.max_bytes)) {
      return st_limit_error(t, t->live + missing, err);
    }
    rc = st_reserve(t, hw, t->live + missing, err);
    if (rc != PS_ERR_OK) return rc;
  }
  size_t dim = t->dim;
  for (size_t i = 0; i < n; i++) {
    int found;
    size_t slot = st_map_find(t, keys[i], &found); /* after st_reserve: the map may have moved */
    uint32_t r = found ? t->map_rows[slot] : st_take_row(t);
    float *row = st_row(t, r);
    if (!found) {
      t->map_keys[slot] = keys[i];
      t->map_rows[slot] = r;
      sparse_table_init_row(&t->cfg, keys[i], row);
      st_init_state(t, row);
      st_meta_set(t, row, st_meta_make(step, 0));
      t->admitted++;
    }
    const float *v = values + i * dim;
    if (assign) {
      copy_row(row, v, dim);
    } else {
      for (size_t k = 0; k < dim; k++) row[k] += v[k] * scale;
    }
    uint64_t m = st_meta_get(t, row);
    if (st_meta_step(m) < step) st_meta_set(t, row, st_meta_make(step, st_meta_count(m)));
  }
  if (step > t->last_step) t->last_step = step;
  return PS_ERR_OK;
}

ps_err sparse_table_add_rows(sparse_table *t, const uint64_t *keys, size_t n, const float *values,
                             float scale, long step, ps_error *err) {
  return write_rows(t, keys, n, values, scale, 0, step, err);
}

ps_err sparse_table_set_rows(sparse_table *t, const uint64_t *keys, size_t n, const float *values,
                             long step, ps_error *err) {
  return write_rows(t, keys, n, values, 1.0f, 1, step, err);
}

void sparse_table_stats_get(const sparse_table *t, sparse_table_stats *out) {
  out->rows = t->live;
  out->bytes = st_bytes_for(t, 0, 0);
  out->bytes_per_row = t->live > 0 ? (double)out->bytes / (double)t->live : 0.0;
  out->admitted = t->admitted;
  out->refused = t->refused;
  out->evicted = t->evicted;
  out->moved_out = t->moved_out;
  out->moved_in = t->moved_in;
}
