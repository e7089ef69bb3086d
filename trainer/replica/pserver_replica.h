/* What the pserver and GEO replicas share (pserver.c, geo.c): the
 * connection, the rows' lookups for evaluation, the export's gathering of
 * every row, the metrics, goodbye and freeing. Internal to trainer/replica. */
#ifndef PSTRAIN_TRAINER_REPLICA_PSERVER_REPLICA_H
#define PSTRAIN_TRAINER_REPLICA_PSERVER_REPLICA_H

#include "trainer/client/ps_client.h"
#include "trainer/client/ps_client_sparse.h"
#include "trainer/replica/replica.h"
#include "trainer/train.h"

struct geo_rows;

typedef struct pserver_replica {
  replica base;
  ps_client c;
  int connected;          /* c holds channels: ps_client_close frees them */
  uint64_t incarnation;   /* elastic: the one pserver 0 keeps this trainer's id for; 0: any */
  int parts;              /* the update may take a step's push in parts (sync) */
  int leaves;             /* handed-out data: without data it leaves (ssp) */
  long step;              /* the step the next backward pass belongs to */
  uint64_t bytes_counted; /* of c's sent + received, already in comm_bytes */
  long steps;             /* pushed */
  /* Models with tables: */
  ps_sparse sp;
  int sparse;             /* sp is set up */
  float *params, *grads;  /* (layout.total) dense, as sent and received */
  float *next_rows[MODEL_TABLES_MAX]; /* (batch * 26, dim) the next step's rows, batch order */
  int need_pull;          /* the next step's rows are not here yet: PULL_STEP first */
  long ahead_split;       /* sp.next holds this step's keys, prefetched (-1: none) */
  int prefetch_failed;    /* a prefetch failed once: later failures are not warned of */
  long version;           /* the parameters' step after the last reply */
  /* Handed-out data, sync and ssp: whether it trains in the steps now (it
   * leaves while it has no data); sync: the job's step it pushes next
   * (its own steps, which the loop counts, differ once it joined late). */
  int member;
  long job_step;
  int skip_push;          /* sync: the step's pull failed and it joined again: no push */
  /* --update geo: */
  float *at_exchange;     /* (total) the parameters the last exchange gave */
  float *change;          /* (total) what the next exchange sends */
  long local;             /* steps since the last exchange */
  long exchanges;
  struct geo_rows *rows;  /* models with tables: the rows touched since it */
} pserver_replica;

/* Sets t->id and t->trainers from the flags; elastic jobs take the id
 * from pserver 0 (p->incarnation keeps it). */
ps_err pserver_replica_take_id(pserver_replica *p, ps_error *err);
/* Registers with the pservers (trainer_job) and sets t->start_step to
 * their step. */
ps_err pserver_replica_connect(pserver_replica *p, ps_error *err);
/* Models with tables: the rows' client and buffers (evaluation lookups,
 * export, the sparse step). */
ps_err pserver_replica_start_sparse(pserver_replica *p, ps_error *err);
/* "resuming at step ..., where the pservers are" when not at 0. */
void pserver_replica_log_start(const trainer *t);

ps_err pserver_lookup(replica *r, const sparse_dedup *d, ps_error *err);
ps_err pserver_gather(replica *r, ps_error *err);
ps_err pserver_broadcast(replica *r, void *data, size_t bytes, ps_error *err);
void pserver_metrics(const replica *r, char *buf, size_t len);
void pserver_destroy(replica *r);

/* geo_rows.c: the rows a GEO trainer touched since the last exchange. */
ps_err geo_rows_create(struct geo_rows **out, trainer *t, ps_client *c, ps_error *err);
/* After a local step on b: its keys not touched before join, with the rows
 * the step pulled (t->rows, before its update) as their base. */
ps_err geo_rows_note(struct geo_rows *g, const data_batch *b, float *const *rows, ps_error *err);
/* Before an exchange: the changes grouped by pserver, the client's sparse
 * ops sending them; after it (rc: the exchange's), the fresh rows into the
 * local tables at step done - 1 and the client's evaluation ops back. */
void geo_rows_begin(struct geo_rows *g);
ps_err geo_rows_end(struct geo_rows *g, ps_err rc, long done, ps_error *err);
void geo_rows_destroy(struct geo_rows *g);

#endif
