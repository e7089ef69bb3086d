/* What a trainer tells its user: progress lines with the ETA, the lines
 * and --metrics rows after each evaluation, the error of a diverged step.
 * A classifier's rows hold its accuracy ("train_loss", "test_accuracy",
 * "samples_per_s", the communication's share), a binary model's its AUC
 * and logloss ("step", "train_logloss", "auc", "logloss", "examples_per_s",
 * the tables' statistics); both hold "repeat" for steps taken again after
 * the job went back (metrics_repeat.h). */
#ifndef PSTRAIN_TRAINER_REPORT_H
#define PSTRAIN_TRAINER_REPORT_H

#include "common/error.h"
#include "trainer/evaluate.h"
#include "trainer/train.h"

/* Where training stands at a report. */
typedef struct report_point {
  long epoch;            /* zero-based */
  long step;             /* of the epoch, zero-based, just taken */
  long global_step;      /* steps of the job done */
  double train_loss;     /* mean since the last report */
  double examples_per_s; /* of training since the epoch began */
  double wall_s;         /* since the run began */
  double comm_share;     /* of the epoch's training time */
  double bytes_per_step; /* sent + received by this trainer in the epoch */
  double eta_s;          /* of the job */
  long examples_applied; /* handed-out data: the epoch's examples this trainer's pushes applied */
} report_point;

void report_progress(const trainer *t, const report_point *p);

/* After an evaluation (ev->examples 0: none) at p: the log line, the
 * --tensorboard event (every trainer) and, on trainer 0, the metrics row
 * (end: the epoch's end, where a classifier writes its row and event). */
ps_err report_evaluation(trainer *t, const report_point *p, const evaluation *ev, int end,
                         ps_error *err);

/* The error of a step whose loss is not finite. */
ps_err report_diverged(const trainer *t, double loss, const report_point *p, ps_error *err);

#endif
