/* Evaluation of the model as it stands on the evaluation batches (the test
 * set): the mean loss and, for classifiers, the accuracy; for models of one
 * probability per example, the AUC (exact, over every example) and the mean
 * logloss. The rows of a model's tables are read through the replica
 * (read only: a pserver job's trainer 0 looks them up). */
#ifndef PSTRAIN_TRAINER_EVALUATE_H
#define PSTRAIN_TRAINER_EVALUATE_H

#include "common/error.h"
#include "trainer/train.h"

typedef struct evaluation {
  long examples;   /* 0: none (no test data, or the job went back meanwhile) */
  double loss;     /* mean */
  double accuracy; /* classifiers */
  double auc;      /* binary models */
} evaluation;

/* Over t->eval; an evaluation the job's going back interrupted (t->rewind_to
 * set) reports no examples. */
ps_err trainer_evaluate(trainer *t, evaluation *ev, ps_error *err);

#endif
