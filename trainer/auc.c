/* AUC by sorting: O(n log n), ties grouped so each gets half credit. */
#include "trainer/auc.h"

#include <math.h>
#include <stdlib.h>

typedef struct scored {
  float prob;
  float label;
} scored;

static int by_prob(const void *a, const void *b) {
  float x = ((const scored *)a)->prob, y = ((const scored *)b)->prob;
  return (x > y) - (x < y);
}

ps_err auc_exact(const float *probs, const float *labels, size_t n, double *auc, ps_error *err) {
  scored *s = malloc((n > 0 ? n : 1) * sizeof *s);
  if (s == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "AUC of %zu predictions: out of memory", n);
  for (size_t i = 0; i < n; i++) s[i] = (scored){probs[i], labels[i]};
  qsort(s, n, sizeof *s, by_prob);
  /* Sum of the positives' ranks (1-based, ties at their mean rank). */
  double rank_sum = 0.0, positives = 0.0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double group_pos = 0.0;
    while (j < n && s[j].prob == s[i].prob) group_pos += s[j++].label > 0.5f;
    rank_sum += group_pos * ((double)(i + 1) + (double)j) / 2.0;
    positives += group_pos;
    i = j;
  }
  free(s);
  double negatives = (double)n - positives;
  if (positives == 0.0 || negatives == 0.0) {
    *auc = NAN;
  } else {
    *auc = (rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives);
  }
  return PS_ERR_OK;
}
