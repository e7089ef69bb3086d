/* A trainer's sparse rows in pserver mode, on top of ps_client: a batch's
 * distinct keys split by owner (shard_of_key), each pserver's in their
 * first-occurrence order with their counts; the pulls (PULL_STEP at the
 * start and after a rollback, PULL_LOOKUP for evaluation, PULL_ALL for
 * export) and the step's push-pull (dense gradients, the summed gradients
 * of the rows step t pulled, the keys of step t + 1), with the returned
 * rows put back in the batch's order. Every message holds one SparseRows
 * per table per field, empty ones included. One thread at a time. */
#ifndef PSTRAIN_TRAINER_PS_CLIENT_SPARSE_H
#define PSTRAIN_TRAINER_PS_CLIENT_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "common/ctr_tables.h"
#include "trainer/client/ps_client.h"

/* A batch's distinct keys grouped by pserver: pserver p's are
 * keys[first[p] .. first[p + 1]), in first-occurrence order. */
typedef struct ps_sparse_keys {
  size_t n, cap;
  uint64_t *keys;   /* (n) grouped */
  uint32_t *counts; /* (n) occurrences in the batch */
  uint32_t *at;     /* (n) where the batch's j-th distinct key lies in keys */
  size_t *first;    /* (pservers + 1) */
} ps_sparse_keys;

/* One table's rows as PULL_ALL returns them (every pserver's, appended). */
typedef struct ps_sparse_dump {
  size_t n, cap;
  uint64_t *keys;   /* (n) */
  float *rows;      /* (n, dim) */
} ps_sparse_dump;

typedef struct ps_sparse {
  ps_client *c;     /* borrowed; its sparse ops point here */
  int tables;       /* 1 (lr) or 2 (ctr) */
  int dim[CTR_TABLES_MAX];
  size_t max_keys;  /* distinct keys of one message per table: batch * 26 */
  ps_sparse_keys cur, next; /* keys pulled for this step; keys of the next */
  ps_sparse_keys look;      /* an evaluation chunk's, or none (PULL_ALL) */
  size_t *fill;             /* (pservers) scratch of ps_sparse_split */
  float *grads[CTR_TABLES_MAX]; /* (max_keys, dim) this step's gradients, grouped */
  float *rows[CTR_TABLES_MAX];  /* (max_keys, dim) rows received, grouped */
  /* what the next message carries (set by the calls below) */
  const ps_sparse_keys *send_grads, *send_keys;
  int want_all;     /* PULL_ALL: rows come with their keys */
  ps_sparse_dump all[CTR_TABLES_MAX];
  ps_client_sparse_ops ops;
} ps_sparse;

/* Attaches to a connected client of a CTR job whose batches have at most
 * batch examples. Nothing held on error. */
ps_err ps_sparse_init(ps_sparse *s, ps_client *c, int batch, ps_error *err);
void ps_sparse_free(ps_sparse *s);

/* Splits n distinct keys (with their counts) by owner into k. */
ps_err ps_sparse_split(ps_sparse *s, ps_sparse_keys *k, const uint64_t *keys,
                       const uint32_t *counts, size_t n, ps_error *err);

/* Copies the rows received for k into out[table] ((k->n, dim) in the
 * batch's order; NULL: skipped). */
void ps_sparse_scatter(const ps_sparse *s, const ps_sparse_keys *k, float *const *out);

/* The calls' step is key.step of their messages. PULL_STEP of step's keys s->next (every pserver; sync: all trainers' at
 * once): rows into s->rows, dense parameters into params. */
ps_err ps_sparse_pull_step(ps_sparse *s, long step, float *params, ps_error *err);

/* PULL_PREFETCH of s->next's keys, step's, to the pservers with a disk
 * tier (ps_client_prefetch). */
ps_err ps_sparse_prefetch(ps_sparse *s, long step, ps_error *err);

/* The push-pull of step: dense grads, the gradients (batch order, (cur.n,
 * dim) per table) of the keys in s->cur, and s->next's keys, whose rows come
 * back in s->rows (dense parameters into params). On a recoverable failure,
 * ps_client_recover with timeout: *resume_at step + 1, or the step the job
 * went back to (whose keys the caller then pulls with ps_sparse_pull_step). */
ps_err ps_sparse_push_pull(ps_sparse *s, long step, const float *dense_grads,
                           float *const *grads, float *params, double recover_timeout,
                           long *resume_at, ps_error *err);

/* The dense parameters alone into params (a PULL_LOOKUP of no keys). */
ps_err ps_sparse_pull_dense(ps_sparse *s, long step, float *params, ps_error *err);

/* PULL_LOOKUP: read-only rows of n distinct keys into out[table] ((n, dim),
 * batch order; zeros where none); params receives the dense parameters. A
 * pserver lost meanwhile (killed, restarted): ps_client_recover within
 * recover_timeout (0: fail), then the rows are read again when every pserver
 * is at step; *resume_at is step, or the earlier step the job went back to
 * (out is then not filled: the caller goes back there). */
ps_err ps_sparse_lookup(ps_sparse *s, long step, const uint64_t *keys, const uint32_t *counts,
                        size_t n, float *const *out, float *params, double recover_timeout,
                        long *resume_at, ps_error *err);

/* PULL_ALL: every row of every pserver into s->all, dense into params; read
 * again once after a recovery that left every pserver at step. */
ps_err ps_sparse_pull_all(ps_sparse *s, long step, float *params, double recover_timeout,
                          ps_error *err);

#endif
