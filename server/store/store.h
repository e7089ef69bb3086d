/* What a pserver stores of the job: the dense shard (every job) and the
 * sparse tables (CTR jobs), with the operations the update modes call on
 * them. The modes call the same operations for every model; only store.c
 * asks whether there are tables. Not locked: every function runs with the
 * pserver's lock held. */
#ifndef PSTRAIN_SERVER_STORE_STORE_H
#define PSTRAIN_SERVER_STORE_STORE_H

#include "common/ctr_tables.h"
#include "common/rpc.h"
#include "common/sparse_table.h"
#include "common/wire.h"
#include "server/store/dense_shard.h"

struct pserver;

typedef struct pserver_store {
  dense_shard dense; /* this pserver's blocks of the dense model */
  /* The rows of each sparse table this pserver owns (shard_of_key),
   * CTR_TABLE_* order; table_count 0 for the MLP. */
  sparse_table *tables[CTR_TABLES_MAX];
  int table_count;
  /* CTR jobs: the rows requests bring, kept per trainer for a step, and
   * the merges' scratch (store/rows.c); NULL without tables. */
  struct store_rows *rows;
  /* --table-dir: the disk below the tables (store/tier.c); NULL without. */
  struct store_tier *tier;
} pserver_store;

/* --- store.c: the operations of the modes ---------------------------------------- */

/* Builds the dense shard (slots: gradient slots) and the job's tables. */
ps_err store_init(struct pserver *ps, const job_config *job, int slots, ps_error *err);
/* The rows' state, once ps->job is set (nothing for a job without tables). */
ps_err store_configure_rows(struct pserver *ps, ps_error *err);
/* Frees everything; answers nothing (the modes answered what waited). */
void store_free(struct pserver *ps);

/* Checks a request's sparse rows (pull: a Pull) and keeps them for the
 * request's handling; answers and returns the code if refused (rows sent
 * to a job without tables too). */
ps_err store_check_rows(struct pserver *ps, rpc_call *call, const char *method,
                        const rpc_message *msg, const wire_blocks_msg *m, int pull);
/* A request's checked rows kept across its handling's passes: a disk
 * tier's second pass takes them back instead of checking the message
 * again (the message is the same; the store's request buffers are not,
 * other requests ran between). */
typedef struct store_rows_stash store_rows_stash;
void store_stash_rows(struct pserver *ps, store_rows_stash **stash);
/* 1 when the stashed rows are the request's again (0: none, check). */
int store_unstash_rows(struct pserver *ps, store_rows_stash *stash);
void store_rows_stash_free(store_rows_stash *stash);
/* The largest Pull this pserver accepts (bytes): a batch's keys per table. */
size_t store_pull_limit(const struct pserver *ps);
/* A checked Pull, by kind: the parameters, rows read or pulled (a step's
 * pull with keys goes to the job's mode, pull_step). */
void store_pull(struct pserver *ps, rpc_call *call, const wire_blocks_msg *m);

/* Whether a sync step may be applied in parts as blocks arrive: a step's
 * row merge needs every trainer's whole push, so only without tables. */
int store_applies_parts(const pserver_store *s);

/* The dense optimizer of one apply at schedule step `schedule` (examples
 * applied: the learning rate) into *opt, returning the step to apply it at.
 * An elastic job's Adam counts the steps its members made instead (sync:
 * the steps applied; async: each push 1/(members) of one, ps->made_steps):
 * what a fixed job of that many trainers counts, so a job running below
 * MAX trains as one of its size. Other jobs: the job's optimizer at
 * `schedule`. */
long store_optimizer_at(const struct pserver *ps, long schedule, optimizer_config *opt);

/* Sync: keeps trainer's checked push for the step: its dense blocks in its
 * gradient slot, its rows (gradients, next keys) swapped in. */
void store_keep_push(struct pserver *ps, int trainer, const rpc_message *msg,
                     const wire_blocks_msg *m);
/* Sync: applies the kept pushes of slots (id order) at step ps->updates,
 * each scaled 1/count: the rows merged and pushed, then the dense sum. An
 * error (out of memory merging) leaves the dense shard untouched, but a
 * table may hold the step already. */
ps_err store_apply_step(struct pserver *ps, const int *slots, int count, ps_error *err);
/* What follows a step's replies: runs under the lock once every call is
 * answered (rc: the pull's error, every call answered with it), maybe
 * after the function that started them returned (store_lookup_submit). */
typedef void (*store_replied)(struct pserver *ps, ps_err rc, void *ctx);

/* Sync, after updates++: answers calls (of slots) with the parameters and
 * each its next keys' rows, pulled merged at the new step; then `done`. */
void store_reply_step(struct pserver *ps, const int *slots, rpc_call *const *calls, int count,
                      store_replied done, void *ctx);

/* Async and ssp: applies the checked push scaled 1/n (n 1: whole) at
 * schedule step `step`: rows first (an error leaves the dense shard untouched), then the
 * dense blocks. */
ps_err store_apply_push(struct pserver *ps, const rpc_message *msg, const wire_blocks_msg *m,
                        int n, long step, ps_error *err);
/* Async and ssp: answers call with the parameters and the rows of the
 * push's next keys, pulled (created) when the push was applied, read only
 * when it was a resend. */
void store_reply_push(struct pserver *ps, rpc_call *call, int applied);
/* A PULL_STEP outside a barrier: the rows of its checked keys, pulled at
 * the job's step (updates / N). CTR jobs. */
void store_pull_now(struct pserver *ps, rpc_call *call);
/* The parameters and read-only rows of the checked keys (a resend, a
 * lookup). */
void store_reply_lookup(struct pserver *ps, rpc_call *call);

/* Geo: adds the checked push's changes * scale (rows created as needed at
 * `step`); *rows counts the rows added. An error leaves the dense shard
 * untouched. */
ps_err store_add_changes(struct pserver *ps, const rpc_message *msg, const wire_blocks_msg *m,
                         float scale, long step, uint64_t *rows, ps_error *err);
/* Geo: answers call with the parameters and the fresh rows of its keys. */
void store_reply_fresh(struct pserver *ps, rpc_call *call);

/* The sync pull barrier (CTR jobs): keeps trainer's checked keys until the
 * barrier completes; then the union of the kept keys of trainers (id
 * order) is pulled at `step`, each call answered with its rows, and
 * `done` told how the pull went. */
void store_keep_pull(struct pserver *ps, int trainer);
void store_reply_pulls(struct pserver *ps, const int *trainers, rpc_call *const *calls,
                       int count, long step, store_replied done, void *ctx);

/* Whether the checked push carried next keys (sparse_keys). */
int store_push_has_keys(const struct pserver *ps);
/* A reply held past the request (ssp): the checked push's next keys are
 * parked with trainer; returns whether there were any. Unparked into the
 * request's place for the reply, then forgotten. */
int store_park_keys(struct pserver *ps, int trainer);
void store_unpark_keys(struct pserver *ps, int trainer, int present);
void store_forget_keys(struct pserver *ps);

/* --- row lookups, batched ------------------------------------------------------ */

/* One step's batch of rows: the keys of each table in, their rows out.
 * Every row a step reads or creates goes through here: the merged pulls
 * (create: missing rows made, keys counted for admission, rows marked
 * seen at step, as sparse_table_pull) and the read-only lookups.
 * store_lookup_submit may complete it before it returns (every row is in
 * memory today) or later: a disk tier reads cold rows off the pserver's
 * lock and completes the lookup under it. Either way `done` runs under the
 * lock, once; the caller answers its calls there, never after submit
 * returns, and keeps keys, counts and rows alive until then. */
typedef struct store_lookup store_lookup;
typedef void (*store_lookup_done)(struct pserver *ps, store_lookup *l, ps_err rc, void *ctx);
struct store_lookup {
  int tables;                              /* of the job's, in CTR_TABLE_* order */
  const uint64_t *keys[CTR_TABLES_MAX];    /* (n[t]) distinct */
  const uint32_t *counts[CTR_TABLES_MAX];  /* create: (n[t]) occurrences, for admission */
  size_t n[CTR_TABLES_MAX];
  int create; /* a pull (rows created, at step) rather than a read */
  long step;
  float *rows[CTR_TABLES_MAX]; /* (n[t], dim): filled before done runs */
  ps_error err;                /* why, when done's rc is not PS_ERR_OK */
  store_lookup_done done;
  void *ctx;
};
/* Starts l; l->done reports its end (PS_ERR_OK, or l->err: why rows are
 * missing). A pull stops at the first table that fails, which is left
 * unchanged; the tables before it hold the pull. */
void store_lookup_submit(struct pserver *ps, store_lookup *l);

#endif
