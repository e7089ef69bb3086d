/* Training a click-through-rate model (--model ctr:... or lr) on Criteo TSV
 * data in one process: the sparse tables in memory, the examples streamed
 * from the file, evaluation (AUC, logloss) on --test-data after each epoch
 * and every --eval-every steps, checkpoints and --resume of the dense model
 * and the tables with their optimizer state, and --export. */
#ifndef PSTRAIN_TRAINER_CTR_TRAIN_H
#define PSTRAIN_TRAINER_CTR_TRAIN_H

#include <stdio.h>

#include "common/error.h"
#include "common/job.h"
#include "common/sparse_table.h"
#include "common/timeline.h"
#include "trainer/backend.h"
#include "trainer/ctr_reader.h"
#include "trainer/data/data_source.h"
#include "trainer/model/model.h"
#include "trainer/trainer_config.h"

typedef struct ctr_trainer {
  trainer_settings settings;
  backend *be;
  model *model;
  sparse_table *tables[MODEL_TABLES_MAX]; /* model->tables of them: wide, embedding */
  data_source *data;         /* --data's batches (criteo_source.c) */
  long examples_per_epoch;   /* lines of --data (at most --train-samples) */
  long steps_per_epoch;
  long start_step;           /* where a --resume starts */
  FILE *metrics;             /* NULL without --metrics */
  int rank, ranks;           /* collective ranks or pserver trainers; 0 and 1 in local mode */
  struct ctr_exchange *exchange; /* collective mode's step (ctr_collective.c); NULL: local */
  int agreed;                /* collective: init reached the ranks' agreement check */
  struct ctr_pserver *ps;    /* pserver mode's step (ctr_pserver.c); NULL: not */
  long rewind_to;            /* pserver mode: the step the job went back to; -1: none */
  timeline *tl;              /* --timeline; NULL without */
  long replay_until;         /* highest step taken before the job went back (metrics_repeat.h) */
  struct trainer_metrics *prom; /* --metrics-listen's step hook; NULL without */
  double comm_seconds;       /* in push-pulls, GEO exchanges and all-gathers, since the start */
  data_batch batch;          /* the step's, from data */
  /* an evaluation batch's (the test data's) */
  sparse_dedup eval_dedup;
  ctr_example *eval_examples; /* (TRAINER_EVAL_BATCH) */
  uint64_t *eval_keys;        /* (TRAINER_EVAL_BATCH, 26) */
  uint32_t *eval_slot;        /* (TRAINER_EVAL_BATCH, 26) */
  /* the rows of a step's or an evaluation batch's distinct keys */
  float *rows[MODEL_TABLES_MAX];      /* (batch * 26, dim[t]): the distinct keys' rows */
  float *row_grads[MODEL_TABLES_MAX]; /* (batch * 26, dim[t]) */
} ctr_trainer;

typedef struct ctr_summary {
  long epochs, steps;
  double auc, logloss;       /* on --test-data after the last epoch (NaN without) */
  double train_logloss;      /* mean over the last epoch */
  double examples_per_s;     /* of the last epoch's training */
} ctr_summary;

/* Counts the data, opens the backend, builds the model, the tables and the
 * reader, opens the metrics file and loads a --resume checkpoint. Nothing
 * is left allocated on error. */
ps_err ctr_trainer_init(ctr_trainer *t, const trainer_settings *settings, ps_error *err);
ps_err ctr_trainer_run(ctr_trainer *t, ctr_summary *summary, ps_error *err);
/* One step as --mode local takes it on t->batch: rows pulled from t's tables at `step` (left in
 * t->rows), forward, backward, the dense optimizer and the rows' updates,
 * each a timeline span (pull, forward, backward, apply). Adds the batch's
 * summed logloss to *loss_sum. */
ps_err ctr_local_step(ctr_trainer *t, long step, double *loss_sum, ps_error *err);

/* The model's view of `count` examples, their slots and distinct keys, with
 * the rows in t->rows. */
model_batch ctr_batch_of(const ctr_trainer *t, const ctr_example *examples, const uint32_t *slot,
                         const sparse_dedup *dedup, int count);

/* AUC and mean logloss on path; rows of keys never trained read zeros. */
ps_err ctr_trainer_evaluate(ctr_trainer *t, const char *path, double *auc, double *logloss,
                            long *examples, ps_error *err);
void ctr_trainer_free(ctr_trainer *t);

/* The job the trainer takes part in (one process: the equivalent sync job
 * with one pserver; in collective mode the local job with the global batch,
 * which its checkpoints resume in). */
void ctr_trainer_job(const ctr_trainer *t, job_config *job);

#endif
