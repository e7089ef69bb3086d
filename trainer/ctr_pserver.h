/* Pserver mode for the CTR models: the pservers hold the dense model and
 * the sparse tables, sharded by key (shard_of_key); trainer r of N reads
 * blocks r, r+N, ... of --batch examples, so a sync step of N trainers is
 * a local step with --batch N*b. Each step a trainer computes the gradients
 * of its batch with the rows it pulled and pushes them to every pserver
 * together with the keys of its next batch (the prefetch thread has read
 * it), whose rows come back in the reply: one round trip per pserver per
 * step. Trainer 0 evaluates with read-only lookups and exports what the
 * pservers hold. A pserver that went away is waited for and the job goes
 * on, or back to a step its pservers share. With --update geo the step is
 * trainer/ctr_geo.c's: local, with an exchange every K steps. */
#ifndef PSTRAIN_TRAINER_CTR_PSERVER_H
#define PSTRAIN_TRAINER_CTR_PSERVER_H

#include <stddef.h>

#include "common/error.h"
#include "trainer/ctr_train.h"

/* Registers with the pservers (the job: update, trainers, pservers, batch,
 * steps, the tables' settings) and sets t->start_step to their step. t's
 * model and data sizes must be known; t->rank and t->ranks set. */
ps_err ctr_pserver_start(ctr_trainer *t, ps_error *err);

/* One global step on this trainer's `count` examples of t->batch (0
 * allowed: it pushes zero gradients and no keys). Adds the batch's
 * summed logloss to *loss_sum. When the job went back to an earlier step,
 * sets t->rewind_to to it (the loop then reads from there again). */
ps_err ctr_pserver_step(ctr_trainer *t, int count, long step, double *loss_sum, ps_error *err);

/* Evaluation: the rows of d's keys, read-only, into t->rows (zeros for
 * keys without a row). */
ps_err ctr_pserver_lookup(ctr_trainer *t, const sparse_dedup *d, ps_error *err);

/* Export: every row the pservers hold into t's (empty) local tables, the
 * dense parameters into the model, for ctr_export. */
ps_err ctr_pserver_fetch_all(ctr_trainer *t, ps_error *err);

/* The metrics row's pserver fields (",\"update\":...,\"bytes_per_step\":..."). */
void ctr_pserver_metrics(const ctr_trainer *t, char *buf, size_t len);

/* Logs the traffic and tells every pserver this trainer is done. */
ps_err ctr_pserver_finish(ctr_trainer *t, long steps, ps_error *err);

/* Leaves the job and frees what start allocated (t->ps may be NULL). */
void ctr_pserver_stop(ctr_trainer *t);

#endif
