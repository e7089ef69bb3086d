/* The training loop of one trainer: data share, mini-batches, the model's
 * forward and backward, the update, progress lines, evaluation on the test
 * set after each epoch and the metrics file. The update, and with it the
 * way replicas stay in step, is the updater's (trainer/updater.h). */
#ifndef PSTRAIN_TRAINER_TRAIN_H
#define PSTRAIN_TRAINER_TRAIN_H

#include <stdio.h>

#include "common/error.h"
#include "common/timeline.h"
#include "trainer/backend.h"
#include "trainer/idx.h"
#include "trainer/model/model.h"
#include "trainer/data/data_source.h"
#include "trainer/sampler.h"
#include "trainer/trainer_config.h"
#include "trainer/updater.h"

typedef struct trainer {
  trainer_settings settings;
  const char *mode_label; /* "local", "pserver-sync", ... for metrics */
  dataset train, test;
  backend *be;
  model *model;
  data_source *data;   /* the training set's batches (idx_source.c) */
  long samples_per_epoch; /* equal on every trainer, so sync steps line up */
  long steps_per_epoch;
  long start_step;     /* where training resumes (a checkpoint's or the pservers' step), else 0 */
  long rewind_to;      /* >= 0: the pservers went back to this step; take it again */
  long replay_until;   /* the highest step taken before the job went back (metrics_repeat.h) */
  int id, trainers;
  int evaluates;       /* trainer 0 evaluates and writes metrics */
  FILE *metrics;       /* NULL without --metrics */
  updater *up;         /* the step's update: local, pserver, MPI or NCCL */
  float *host_params;  /* the model's parameters and gradients as host memory: */
  float *host_grads;   /* the backend's own, or staging copies */
  int staged;
  timeline *tl;        /* --timeline; NULL without */
  struct trainer_metrics *prom; /* --metrics-listen's step hook; NULL without */
} trainer;

typedef struct train_summary {
  long epochs;
  long steps;
  double test_accuracy;   /* after the last epoch */
  double train_loss;      /* mean over the last epoch */
  double samples_per_s;   /* of the last epoch's training */
} train_summary;

/* The job this trainer takes part in, as pservers and checkpoints know it
 * (local and collective mode: the equivalent sync job with one pserver). */
void trainer_job(const trainer *t, int pservers, job_config *job);

/* Loads and checks the data, checks the model against it, opens the backend
 * and the metrics file, and builds the model. Every failure here happens
 * before training starts; nothing is left allocated on error. */
ps_err trainer_init(trainer *t, const trainer_settings *settings, ps_error *err);

/* Trains for the configured epochs; the summary is filled on success. */
ps_err trainer_run(trainer *t, train_summary *summary, ps_error *err);

/* Test-set accuracy and mean loss of the current parameters. */
ps_err trainer_evaluate(trainer *t, double *accuracy, double *mean_loss, ps_error *err);

void trainer_free(trainer *t);

#endif
