/* A sparse embedding table: an open-addressing hash map from 64-bit feature
 * key to a row of `dim` floats (plus its optimizer state), the rows kept in
 * contiguous slabs. A row is created the first time its key is pulled, with
 * values that depend only on (seed, table id, key), so any process creating
 * it (a local trainer, whichever pserver owns the key) gets the same row.
 * Row optimizers (AdaGrad, lazy Adam, SGD) update only the rows a batch
 * touched. Optional admission (a key gets a row after N occurrences, counted
 * in a small counting filter; before that it reads as zeros and its gradient
 * is dropped), eviction (rows unseen for N steps are dropped) and a memory
 * limit. Used by local trainers now and by pservers next; one thread at a
 * time (callers lock). */
#ifndef PSTRAIN_COMMON_SPARSE_TABLE_H
#define PSTRAIN_COMMON_SPARSE_TABLE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#define SPARSE_TABLE_NAME_MAX 32
#define SPARSE_TABLE_MAX_DIM 1024

/* AdaGrad is row-wise (one sum of squares per row, acc += mean(g^2)): the
 * CTR default of Paddle's accessor and TorchRec, 4 bytes of state per row
 * instead of 4*dim. Adam is lazy: only pushed rows move, bias-corrected by
 * the row's own update count. */
typedef enum { SPARSE_OPT_ADAGRAD, SPARSE_OPT_ADAM, SPARSE_OPT_SGD } sparse_optimizer_kind;
#define SPARSE_OPT_KIND_COUNT (SPARSE_OPT_SGD + 1)
#define SPARSE_OPTIMIZER_CHOICES "adagrad|adam|sgd"

typedef struct sparse_optimizer_config {
  sparse_optimizer_kind kind;
  double lr;
  double epsilon;      /* AdaGrad and Adam */
  double initial_accumulator; /* AdaGrad's starting sum of squares */
  double beta1, beta2; /* Adam */
} sparse_optimizer_config;

/* Memory several tables share (a pserver's --table-memory-mb): every
 * table's growth is charged to it before it happens and refused,
 * RESOURCE_EXHAUSTED naming the table, where the tables together would pass
 * the limit. Shrinking (a table destroyed, its storage replaced) gives back. */
typedef struct sparse_budget {
  size_t limit;       /* bytes */
  atomic_size_t used; /* bytes the tables charged to it hold */
  char source[256];   /* the limit and where it came from, for errors */
} sparse_budget;

typedef struct sparse_table sparse_table;

/* Where a table's rows go when it would pass its memory, instead of the
 * pull being refused (a pserver's disk tier, server/store/tier.c): the
 * rows least recently seen and least used (sparse_table_evict.c's keep
 * score) that are not pinned move out whole through put
 * (values, state and meta: sparse_table_row_floats floats) and come back by
 * sparse_table_install. The table forgets a moved row; the spill must not. */
typedef struct sparse_spill {
  void (*begin)(void *ctx); /* before a pass picks rows: pins may be gathered then */
  int (*pinned)(void *ctx, const sparse_table *t, uint64_t key); /* must stay in memory now */
  int (*put)(void *ctx, const sparse_table *t, uint64_t key, const float *row); /* 0: full */
  void *ctx;
} sparse_spill;

typedef struct sparse_table_config {
  char name[SPARSE_TABLE_NAME_MAX]; /* "wide", "embedding": named in errors and logs */
  uint32_t id;         /* part of every row's initialization stream */
  int dim;             /* floats per row, 1..SPARSE_TABLE_MAX_DIM */
  uint64_t seed;
  float init_scale;    /* rows start uniform in +-init_scale; 0: zeros */
  sparse_optimizer_config opt;
  size_t max_bytes;    /* 0: no limit. Reaching it fails (RESOURCE_EXHAUSTED) unless evicting */
  int admit_after;     /* a key gets a row at its N-th occurrence; 0 or 1: at once; at most 255 */
  long evict_after;    /* rows unseen for this many steps are dropped; 0: never */
  sparse_budget *budget; /* shared with other tables (NULL: none); not part of the job */
  const sparse_spill *spill; /* rows move there past the memory (NULL: refused); not part of the job */
} sparse_table_config;

typedef struct sparse_table_stats {
  size_t rows;             /* live rows */
  size_t bytes;            /* all memory the table holds: slabs, map, filter (not the
                              small struct and slab directory) */
  double bytes_per_row;    /* bytes / rows (0 without rows) */
  uint64_t admitted;       /* keys that got a row */
  uint64_t refused;        /* pulls of keys not (yet) admitted */
  uint64_t evicted;        /* rows dropped by eviction */
  uint64_t moved_out;      /* rows moved to the spill */
  uint64_t moved_in;       /* rows installed (back) */
} sparse_table_stats;

/* Checks cfg: dim range, lr > 0, epsilon, betas, ... (what create checks). */
ps_err sparse_table_config_check(const sparse_table_config *cfg, ps_error *err);

/* Checks cfg (sparse_table_config_check) and makes an empty table. */
ps_err sparse_table_create(sparse_table **out, const sparse_table_config *cfg, ps_error *err);
void sparse_table_destroy(sparse_table *t);
const sparse_table_config *sparse_table_config_of(const sparse_table *t);

/* The initial row of key (dim floats): what a new row holds. */
void sparse_table_init_row(const sparse_table_config *cfg, uint64_t key, float *out);

/* Writes the rows of n keys (distinct; see sparse_dedup) to out (n * dim
 * floats), creating missing rows; counts[i] occurrences of keys[i] in the
 * batch feed admission (NULL: one each). Keys not admitted read zeros. Marks
 * the rows seen at `step` (0 .. 2^40 - 2). Fails with RESOURCE_EXHAUSTED naming the table
 * when a new row would pass max_bytes and no row can be evicted; nothing is
 * changed then. With evict_after set, rows not in this pull make room, least
 * recently seen first (1/16 of the table where that many can go, so a full
 * table does not sweep on every pull). */
ps_err sparse_table_pull(sparse_table *t, const uint64_t *keys, size_t n, const uint32_t *counts,
                         long step, float *out, ps_error *err);

/* Read-only: the rows of n keys into out (n * dim floats), zeros for keys
 * without a row. Creates nothing, counts nothing: for evaluation. */
void sparse_table_lookup(const sparse_table *t, const uint64_t *keys, size_t n, float *out);

/* Applies one optimizer step at zero-based `step` to the rows of n distinct
 * keys with their summed gradients (n * dim floats). Keys without a row
 * (not admitted, or evicted since the pull) are skipped. */
ps_err sparse_table_push(sparse_table *t, const uint64_t *keys, size_t n, const float *grads,
                         long step, ps_error *err);

/* GEO's merge: adds values[i] * scale (n * dim floats) to the row of each
 * of n distinct keys, creating missing rows (their initial values, whatever
 * the admission filter says) and marking them seen at `step`; optimizer
 * state is untouched. RESOURCE_EXHAUSTED, changing nothing, when the new
 * rows would pass max_bytes (nothing is evicted for them). */
ps_err sparse_table_add_rows(sparse_table *t, const uint64_t *keys, size_t n, const float *values,
                             float scale, long step, ps_error *err);
/* The same, the rows set to values (a GEO trainer takes the fresh rows). */
ps_err sparse_table_set_rows(sparse_table *t, const uint64_t *keys, size_t n, const float *values,
                             long step, ps_error *err);

/* Drops the rows unseen for evict_after steps before `step`; returns how
 * many. A no-op without evict_after. A sweep over the map (O(rows)): call it
 * every max(1, evict_after / 4) steps, so rows live at most 1.25x evict_after. */
size_t sparse_table_evict(sparse_table *t, long step);

void sparse_table_stats_get(const sparse_table *t, sparse_table_stats *out);

/* Floats of optimizer state per row (0 SGD, 1 row-wise AdaGrad, 2*dim Adam). */
int sparse_table_state_floats(const sparse_table_config *cfg);

/* Snapshot for export and checkpoints, in ascending key order so equal
 * tables give equal bytes: keys (rows), values (rows * dim), state (rows *
 * state_floats, may be NULL), meta (rows * 2: last step seen and the row's
 * own update count (saturating at 2^24 - 1), for eviction and Adam's bias
 * correction; may be NULL).
 * The arrays must hold sparse_table_stats.rows entries. */
ps_err sparse_table_dump(const sparse_table *t, uint64_t *keys, float *values, float *state,
                         int64_t *meta, ps_error *err);

/* Replaces the table's rows with n rows as sparse_table_dump wrote them
 * (keys distinct; state/meta NULL: fresh). Fails, changing nothing, on a
 * duplicate key or when max_bytes cannot hold them. */
ps_err sparse_table_load(sparse_table *t, size_t n, const uint64_t *keys, const float *values,
                         const float *state, const int64_t *meta, ps_error *err);

/* --- a spill's side (sparse_spill) ------------------------------------------ */

/* Grows the table's storage (charged to its budget) to hold `rows` rows,
 * so it allocates nothing more up to that many: RESOURCE_EXHAUSTED past
 * the budget. */
ps_err sparse_table_reserve(sparse_table *t, size_t rows, ps_error *err);
/* Sets (NULL: clears) where the table's rows move past its memory. */
void sparse_table_set_spill(sparse_table *t, const sparse_spill *spill);
/* Floats of a whole row: dim values, the state, 2 floats of meta. */
size_t sparse_table_row_floats(const sparse_table_config *cfg);
/* The step a whole row was last seen at (its meta). */
long sparse_table_row_step(const sparse_table *t, const float *row);
/* Rows last seen before this step were dropped by eviction (evict_after;
 * 0: none): a moved row older than that is forgotten as well. */
long sparse_table_forgotten_before(const sparse_table *t);
/* Whether key has a row in memory. */
int sparse_table_has(const sparse_table *t, uint64_t key);
/* The indices (into keys) of the n keys without a row in memory, into
 * missing (n entries); returns how many. */
size_t sparse_table_missing(const sparse_table *t, const uint64_t *keys, size_t n,
                            uint32_t *missing);
/* Puts whole rows (row_floats each) back for n distinct keys; keys with a
 * row in memory keep theirs (it is newer). Makes room as a pull does
 * (growing, else moving other rows out); changes nothing when it fails.
 * Counts nothing for admission and marks nothing seen. */
ps_err sparse_table_install(sparse_table *t, const uint64_t *keys, size_t n, const float *rows,
                            ps_error *err);
/* Key's whole row (row_floats), or NULL without one; valid until the table changes. */
const float *sparse_table_peek(const sparse_table *t, uint64_t key);
/* Takes key's whole row out of the table into row: 1, or 0 when it has none. */
int sparse_table_take(sparse_table *t, uint64_t key, float *row);
/* Copies up to max whole rows with their keys, in map order from *cursor
 * (0 to start); returns how many, 0 at the end. No row may be added or
 * taken between calls. */
size_t sparse_table_scan(const sparse_table *t, size_t *cursor, size_t max, uint64_t *keys,
                         float *rows);
/* A whole row's meta as sparse_table_dump writes it (last step, count). */
void sparse_table_row_meta(const sparse_table *t, const float *row, int64_t meta[2]);
/* A whole row from its parts as sparse_table_dump writes them (state NULL:
 * fresh; meta NULL: seen at the table's last step, never updated). */
void sparse_table_row_pack(const sparse_table *t, const float *values, const float *state,
                           const int64_t *meta, float *row);

/* Per-batch deduplication: n keys become the distinct ones in order of
 * first occurrence (unique), with slot[i] the index in unique of keys[i] and
 * counts[j] the occurrences of unique[j]. Reuses its memory across batches. */
typedef struct sparse_dedup {
  uint64_t *unique;
  uint32_t *counts;
  size_t n_unique;
  /* private: the map and capacities */
  uint64_t *map_keys;
  uint32_t *map_index;
  size_t map_cap, cap;
} sparse_dedup;

void sparse_dedup_init(sparse_dedup *d);
ps_err sparse_dedup_run(sparse_dedup *d, const uint64_t *keys, size_t n, uint32_t *slot,
                        ps_error *err);
void sparse_dedup_free(sparse_dedup *d);

/* Parses SPARSE_OPTIMIZER_CHOICES; the names are written only in the .c. */
ps_err sparse_optimizer_parse(const char *name, sparse_optimizer_kind *out, ps_error *err);
const char *sparse_optimizer_name(sparse_optimizer_kind kind);

#endif
