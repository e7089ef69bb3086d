/* The training loop of one trainer: data share, mini-batches, the model's
 * forward and backward, the update, progress lines, evaluation on the test
 * set after each epoch and the metrics file. In local mode the update is the
 * optimizer applied in-process. */
#ifndef PSTRAIN_TRAINER_TRAIN_H
#define PSTRAIN_TRAINER_TRAIN_H

#include <stdio.h>

#include "common/error.h"
#include "trainer/backend.h"
#include "trainer/idx.h"
#include "trainer/mlp.h"
#include "trainer/sampler.h"
#include "trainer/trainer_config.h"

typedef struct trainer {
  trainer_settings settings;
  const char *mode_label; /* "local", later "pserver-sync", ... for metrics */
  dataset train, test;
  backend *be;
  mlp *model;
  sampler order;
  long steps_per_epoch;
  FILE *metrics; /* NULL without --metrics */
} trainer;

typedef struct train_summary {
  long epochs;
  double test_accuracy;   /* after the last epoch */
  double train_loss;      /* mean over the last epoch */
  double samples_per_s;   /* of the last epoch's training */
} train_summary;

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
