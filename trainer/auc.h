/* Exact ROC AUC of predicted probabilities against 0/1 labels: the share of
 * (positive, negative) pairs the predictions order correctly, ties counted
 * half (the Mann-Whitney statistic), as scikit-learn's roc_auc_score. */
#ifndef PSTRAIN_TRAINER_AUC_H
#define PSTRAIN_TRAINER_AUC_H

#include <stddef.h>

#include "common/error.h"

/* *auc is NaN when all labels are equal (no pair to order). */
ps_err auc_exact(const float *probs, const float *labels, size_t n, double *auc, ps_error *err);

#endif
