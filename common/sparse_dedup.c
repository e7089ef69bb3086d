/* Per-batch key deduplication (a hash map of its own, kept between
 * batches) and the row optimizers' names. */
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/sparse_table.h"

#define DEDUP_EMPTY UINT32_MAX

static const char *const opt_names[SPARSE_OPT_KIND_COUNT] = {"adagrad", "adam", "sgd"};

ps_err sparse_optimizer_parse(const char *name, sparse_optimizer_kind *out, ps_error *err) {
  for (int i = 0; i < SPARSE_OPT_KIND_COUNT; i++) {
    if (strcmp(name, opt_names[i]) == 0) {
      *out = (sparse_optimizer_kind)i;
      return PS_ERR_OK;
    }
  }
  return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "unknown sparse optimizer '%s' (one of %s)",
                      name, SPARSE_OPTIMIZER_CHOICES);
}

const char *sparse_optimizer_name(sparse_optimizer_kind kind) {
  return (unsigned)kind < SPARSE_OPT_KIND_COUNT ? opt_names[kind] : "unknown";
}

void sparse_dedup_init(sparse_dedup *d) { memset(d, 0, sizeof *d); }

void sparse_dedup_free(sparse_dedup *d) {
  free(d->unique);
  free(d->counts);
  free(d->map_keys);
  free(d->map_index);
  sparse_dedup_init(d);
}

/* Room for n keys: the map at most half full, so probes stay short. */
static ps_err dedup_reserve(sparse_dedup *d, size_t n, ps_error *err) {
  if (n > UINT32_MAX - 1) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "cannot deduplicate %zu keys at once (at most %u)",
                        n, UINT32_MAX - 1);
  }
  if (n > d->cap) {
    size_t cap = d->cap ? d->cap : 1024;
    while (cap < n) cap *= 2;
    uint64_t *u = realloc(d->unique, cap * sizeof *u);
    if (u != NULL) d->unique = u;
    uint32_t *c = realloc(d->counts, cap * sizeof *c);
    if (c != NULL) d->counts = c;
    if (u == NULL || c == NULL) {
      return ps_error_set(err, PS_ERR_NO_MEMORY, "no memory to deduplicate %zu keys", n);
    }
    d->cap = cap;
  }
  if (2 * n > d->map_cap) {
    size_t cap = d->map_cap ? d->map_cap : 2048;
    while (cap < 2 * n) cap *= 2;
    uint64_t *k = malloc(cap * sizeof *k);
    uint32_t *ix = malloc(cap * sizeof *ix);
    if (k == NULL || ix == NULL) {
      free(k);
      free(ix);
      return ps_error_set(err, PS_ERR_NO_MEMORY, "no memory to deduplicate %zu keys", n);
    }
    free(d->map_keys);
    free(d->map_index);
    d->map_keys = k;
    d->map_index = ix;
    d->map_cap = cap;
    memset(d->map_index, 0xff, cap * sizeof *ix); /* DEDUP_EMPTY */
  }
  return PS_ERR_OK;
}

ps_err sparse_dedup_run(sparse_dedup *d, const uint64_t *keys, size_t n, uint32_t *slot,
                        ps_error *err) {
  d->n_unique = 0;
  if (n == 0) return PS_ERR_OK;
  ps_err rc = dedup_reserve(d, n, err);
  if (rc != PS_ERR_OK) return rc;
  size_t mask = d->map_cap - 1, n_unique = 0;
  int shift = 64;
  for (size_t c = d->map_cap; c > 1; c >>= 1) shift--;
  uint64_t *map_keys = d->map_keys;
  uint32_t *map_index = d->map_index;
  for (size_t i = 0; i < n; i++) {
    uint64_t key = keys[i];
    size_t h = (size_t)(rng_mix64(key ^ 0xa54ff53a5f1d36f1ULL) >> shift);
    for (;;) {
      uint32_t j = map_index[h];
      if (j == DEDUP_EMPTY) {
        map_keys[h] = key;
        map_index[h] = (uint32_t)n_unique;
        d->unique[n_unique] = key;
        d->counts[n_unique] = 1;
        slot[i] = (uint32_t)n_unique++;
        break;
      }
      if (map_keys[h] == key) {
        d->counts[j]++;
        slot[i] = j;
        break;
      }
      h = (h + 1) & mask;
    }
  }
  d->n_unique = n_unique;
  /* Empty the map for the next batch: clear only the used slots when they are few. */
  if (n_unique * 8 < d->map_cap) {
    for (size_t j = 0; j < n_unique; j++) {
      size_t h = (size_t)(rng_mix64(d->unique[j] ^ 0xa54ff53a5f1d36f1ULL) >> shift);
      while (map_index[h] != j) h = (h + 1) & mask;
      map_index[h] = DEDUP_EMPTY;
    }
  } else {
    memset(map_index, 0xff, d->map_cap * sizeof *map_index);
  }
  return PS_ERR_OK;
}
