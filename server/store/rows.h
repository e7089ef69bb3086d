/* The sparse tables' side of the pserver's requests (CTR jobs): the rows a
 * request brings, kept per trainer for a step, merged, pulled and answered.
 * Behind store.c (the modes and pserver.c call store.h); lock held throughout.
 * Nothing here is called for a job without tables (ps->store.rows NULL)
 * unless it says so. */
#ifndef PSTRAIN_SERVER_STORE_ROWS_H
#define PSTRAIN_SERVER_STORE_ROWS_H

#include "server/pserver.h"
#include "server/store/store.h"

/* Rows of one table as a request brought them: keys with values (n * dim)
 * or counts (n); grown on demand, owned. */
typedef struct sparse_rows {
  uint64_t *keys;
  float *values;
  uint32_t *counts;
  size_t n, keys_cap, values_cap;
} sparse_rows;

void sparse_rows_free(sparse_rows *r);

enum { SPARSE_FIELD_GRADS, SPARSE_FIELD_KEYS, SPARSE_FIELDS };

typedef struct sparse_trainer {
  sparse_rows grads[CTR_TABLES_MAX]; /* sync: its push of the current step */
  sparse_rows next[CTR_TABLES_MAX];  /* sync: the keys of its next step; ssp: a held push's */
  sparse_rows pull[CTR_TABLES_MAX];  /* sync: its keys at the pull barrier */
} sparse_trainer;

/* Where each reply's rows come from: reply i's keys of table t. */
typedef sparse_rows *store_rows_which[CTR_TABLES_MAX];

typedef struct store_rows {
  sparse_trainer *trainers; /* (trainers) */
  size_t max_keys;          /* per table per request: batch * CRITEO_CAT_FIELDS */
  /* The request being handled, copied out of its message by the check. */
  sparse_rows req[SPARSE_FIELDS][CTR_TABLES_MAX];
  int req_present[SPARSE_FIELDS];
  /* Merges: all keys, each one's slot in the union, summed counts or
   * gradients; one reply's rows per table. */
  sparse_dedup dedup;
  uint64_t *all;
  uint32_t *slot, *counts;
  size_t all_cap;
  float *sums, *out[CTR_TABLES_MAX];
  size_t sums_cap, out_cap[CTR_TABLES_MAX];
  store_rows_which *which;       /* (trainers) each reply's rows per table */
  sparse_rows **rowp;            /* (trainers) the rows one merge takes */
  struct rows_pull *spare;       /* a finished batch's memory, for the next (rows.c) */
} store_rows;

/* For a job with tables (nothing otherwise); frees what it allocated. */
ps_err store_rows_configure(pserver *ps, ps_error *err);
void store_rows_deconfigure(pserver *ps);

/* Checks a request's SparseRows (pull: a Pull; lookup: counts optional)
 * and copies them to ps->store.rows->req; answers and returns the code if
 * refused. Any job: rows sent to a job without tables are refused. */
ps_err store_rows_check(pserver *ps, rpc_call *call, const char *method, const rpc_message *msg,
                        const wire_blocks_msg *m, int pull);
/* The largest Pull this pserver accepts (bytes). Any job. */
size_t store_rows_pull_limit(const pserver *ps);
/* A checked Pull (sender and SparseRows), by kind: a PULL_STEP with keys
 * goes to the job's mode (pull_step); the others are answered at once. Any job. */
void store_rows_pull(pserver *ps, rpc_call *call, const wire_blocks_msg *m);

/* Sync: keeps trainer id's checked rows for the step (swapped in, no copy). */
void store_rows_keep_push(pserver *ps, int id);
/* Sync: the kept rows of slots (id order) summed, scaled 1/count, applied at ps->updates. */
ps_err store_rows_apply_step(pserver *ps, const int *slots, int count, ps_error *err);
/* Sync, after updates++: eviction, the merged pull of the next keys,
 * replies, then done (store_reply_step). */
void store_rows_reply_step(pserver *ps, const int *slots, rpc_call *const *calls, int count,
                           store_replied done, void *ctx);
/* Async: applies the checked push scaled 1/scale_n at schedule step `step`. */
ps_err store_rows_apply_async(pserver *ps, int scale_n, long step, ps_error *err);
/* Async, after updates++: eviction, the pull of its next keys, the reply. */
void store_rows_reply_async(pserver *ps, rpc_call *call);
/* The parameters and read-only rows of the checked keys. Any job. */
void store_rows_reply_lookup(pserver *ps, rpc_call *call);
/* Geo: the checked push's row changes * scale added; *added counts them. */
ps_err store_rows_add(pserver *ps, float scale, long step, uint64_t *added, ps_error *err);
/* A table at its limit (--max-table-mb, --table-memory-mb): the job stops
 * now, naming why, not at a step timeout; its last checkpoint stays as it
 * was, to resume with more memory. */
void store_rows_stop_at_limit(pserver *ps, const char *why);
/* Geo: the parameters and the fresh rows of the pushed keys. */
void store_rows_reply_fresh(pserver *ps, rpc_call *call);

/* A PULL_STEP outside the sync barrier: the rows of its keys at once. */
void store_rows_pull_now(pserver *ps, rpc_call *call);

/* Ssp: store_park_keys and its kin (store.h). */
int store_rows_park_keys(pserver *ps, int id);
void store_rows_unpark_keys(pserver *ps, int id, int present);
void store_rows_forget_keys(pserver *ps);

/* The sync pull barrier: keeps trainer id's checked keys until it
 * completes; then the union of the kept keys of ids pulled at step,
 * each call answered and done told (store_reply_pulls). */
void store_rows_keep_pull(pserver *ps, int id);
void store_rows_reply_pulls(pserver *ps, const int *ids, rpc_call *const *calls, int count,
                            long step, store_replied done, void *ctx);

#endif
