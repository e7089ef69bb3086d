/* One trainer: its model, the replica that keeps it in step with the
 * others, the data and the one training loop over them: steps, progress and
 * ETA, evaluation (after each epoch and every --eval-every steps),
 * checkpoints, the rewind after a pserver recovery, metrics rows, timeline
 * spans and the Prometheus hook. Which model (trainer/model/), which way
 * of staying in step (trainer/replica/) and which data (trainer/data/) are
 * chosen once at start; the loop never asks. */
#ifndef PSTRAIN_TRAINER_TRAIN_H
#define PSTRAIN_TRAINER_TRAIN_H

#include <stdio.h>

#include "common/error.h"
#include "common/job.h"
#include "common/sparse_table.h"
#include "common/timeline.h"
#include "trainer/backend/backend.h"
#include "trainer/data/data_files.h"
#include "trainer/data/data_source.h"
#include "trainer/model/model.h"
#include "trainer/replica/replica.h"
#include "trainer/trainer_config.h"

typedef struct trainer {
  trainer_settings settings;
  const char *mode_label; /* "local", "pserver-sync", "collective", ... */
  int id, trainers;
  data_files files;       /* what --data and the test data hold */
  backend *be;
  model *model;
  /* This process's tables (local, collective, geo: the model's rows; pserver
   * mode: filled only to export what the pservers hold). */
  sparse_table *tables[MODEL_TABLES_MAX];
  replica *rep;           /* the step's update: local, pserver, geo, MPI or NCCL */
  data_source *data;      /* this trainer's training batches */
  data_source *eval;      /* the evaluation batches (trainer 0); NULL: none */
  long steps_per_epoch;   /* equal on every trainer, so sync steps line up */
  long start_step;        /* where training resumes (a checkpoint's or the pservers' step) */
  long rewind_to;         /* >= 0: the pservers went back to this step; take it again */
  long replay_until;      /* the highest step taken before the job went back (metrics_repeat.h) */
  int stopped;            /* an elastic trainer asked to stop (SIGTERM) left the job */
  FILE *metrics;          /* NULL without --metrics (trainer 0 writes it) */
  timeline *tl;           /* --timeline; NULL without */
  struct tb_writer *tb;   /* --tensorboard's run of this trainer; NULL without */
  struct trainer_metrics *prom; /* --metrics-listen's step hook; NULL without */
  /* The model's dense parameters and gradients as host memory: the
   * backend's own, or staging copies (staged: a device backend). */
  float *host_params, *host_grads;
  int staged;
  data_batch batch;       /* the step's, from data */
  /* The rows of a step's or an evaluation batch's distinct keys, and the
   * step's row gradients: (max batch * 26, dim[t]) each. */
  float *rows[MODEL_TABLES_MAX];
  float *row_grads[MODEL_TABLES_MAX];
} trainer;

typedef struct train_summary {
  long epochs, steps;
  double train_loss;      /* mean over the last epoch */
  double examples_per_s;  /* of the last epoch's training */
  int evaluated;          /* the fields below hold the last evaluation's */
  double accuracy;        /* classifiers */
  double auc, test_loss;  /* binary models: AUC and logloss; classifiers: test loss */
} train_summary;

/* The job as pservers know it (this trainer's --batch, the job's update). */
void trainer_job(const trainer *t, job_config *job);

/* Joins the job, loads and checks the data, opens the backend, builds the
 * model, its tables and the data sources, opens the metrics file, loads a
 * --resume checkpoint and starts the replica. Every failure here happens
 * before training starts; nothing is left allocated on error. */
ps_err trainer_init(trainer *t, const trainer_settings *settings, ps_error *err);

/* Trains for the configured epochs; the summary is filled on success. */
ps_err trainer_run(trainer *t, train_summary *summary, ps_error *err);

/* A signal handler (async-signal-safe): an elastic trainer stops at the end
 * of its step and leaves the job (trainer_run returns with t->stopped). */
void trainer_ask_stop(int signum);

void trainer_free(trainer *t);

/* "resuming at step S (epoch E, step K of it), data shard X offset Y",
 * and `where` ("", ", where the pservers are"). */
void trainer_log_resume(const trainer *t, const char *where);

/* The model's view of data batch b, with the rows in t->rows. */
model_batch trainer_model_batch(const trainer *t, const data_batch *b);

#endif
