/* Collective mode for the CTR models over MPI: every rank keeps a full
 * replica of every table (memory per process: the whole model) and reads
 * its own blocks of --batch examples. Each step the ranks all-gather their
 * batches' distinct keys and counts, pull the union of the keys (in rank
 * order, with the summed counts) on every replica, compute the gradients of
 * their own examples, all-gather them and sum them in rank order, so every
 * replica applies the same update and stays bitwise equal to the others;
 * the dense gradients are summed with an all-reduce. A step of N ranks
 * with --batch b is a local step with --batch N*b. Built only with MPI
 * (PSTRAIN_HAVE_MPI). */
#ifndef PSTRAIN_TRAINER_CTR_COLLECTIVE_H
#define PSTRAIN_TRAINER_CTR_COLLECTIVE_H

#include "common/error.h"
#include "trainer/ctr_train.h"

/* Joins the MPI job: sets t->rank, t->ranks and t->exchange. */
ps_err ctr_collective_start(ctr_trainer *t, ps_error *err);

/* Once the trainer is built: every rank checks that all train the same job
 * (model, optimizers, batch, tables' settings, data sizes) and allocates
 * the step's buffers. */
ps_err ctr_collective_ready(ctr_trainer *t, ps_error *err);

/* One global step: this rank's `count` examples (0 allowed) are in
 * t->batch. Adds this rank's summed logloss to *loss_sum. */
ps_err ctr_collective_step(ctr_trainer *t, int count, long step, double *loss_sum, ps_error *err);

/* The metrics row's collective fields (",\"bytes_per_step\":..."): bytes this
 * rank sent + received per step so far. */
void ctr_collective_metrics(const ctr_trainer *t, char *buf, size_t len);

/* Ends every rank of the job with status `code` (a rank that failed: the
 * others would wait for it forever). */
void ctr_collective_abort(int code);

/* Logs the bytes exchanged, frees the buffers and leaves MPI. */
void ctr_collective_stop(ctr_trainer *t);

#endif
