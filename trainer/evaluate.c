/* Evaluation over the evaluation batches (see evaluate.h). */
#define _POSIX_C_SOURCE 200809L
#include "trainer/evaluate.h"

#include <math.h>
#include <stdlib.h>

#include "common/grow.h"
#include "trainer/auc.h"

/* Every example's probability and label, for the AUC. */
typedef struct scores {
  size_t n, cap;
  float *probs, *labels;
} scores;

static ps_err scores_room(scores *s, size_t more, ps_error *err) {
  if (s->n + more <= s->cap) return PS_ERR_OK;
  size_t cap = s->cap > 0 ? s->cap : 1 << 16;
  while (cap < s->n + more) cap *= 2;
  if (!grow_array(&s->probs, cap, sizeof *s->probs) ||
      !grow_array(&s->labels, cap, sizeof *s->labels)) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "evaluating: out of memory for %zu examples", cap);
  }
  s->cap = cap;
  return PS_ERR_OK;
}

/* One batch: its rows, the forward pass, its loss, correct answers and
 * probabilities. */
static ps_err evaluate_batch(trainer *t, const data_batch *db, scores *s, double *loss,
                             long *correct, ps_error *err) {
  const int binary = t->model->classes == 0;
  if (t->model->tables > 0) {
    PS_TRY(replica_lookup(t->rep, db->dedup, err));
    if (t->rewind_to >= 0) return PS_ERR_OK; /* the job went back: no evaluation now */
  }
  if (binary) PS_TRY(scores_room(s, (size_t)db->size, err));
  model_batch b = trainer_model_batch(t, db);
  model_outputs out = {.probs = binary ? s->probs + s->n : NULL};
  PS_TRY(model_forward(t->model, &b, 0, &out, err));
  *loss += out.loss_sum;
  *correct += out.correct;
  if (binary) {
    for (int i = 0; i < db->size; i++) s->labels[s->n + (size_t)i] = (float)db->labels[i];
    s->n += (size_t)db->size;
  }
  return PS_ERR_OK;
}

static ps_err evaluate_all(trainer *t, scores *s, evaluation *ev, ps_error *err) {
  double loss = 0.0;
  long correct = 0, n = 0;
  for (long k = 0;; k++) {
    data_batch db;
    PS_TRY(data_source_batch(t->eval, k, &db, err));
    if (db.size == 0) break;
    PS_TRY(evaluate_batch(t, &db, s, &loss, &correct, err));
    if (t->rewind_to >= 0) return PS_ERR_OK;
    n += db.size;
  }
  if (n == 0) {
    const trainer_options *o = &t->settings.opt;
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "--test-data %s holds no examples",
                        o->test_data[0] != '\0' ? o->test_data : o->data);
  }
  ev->examples = n;
  ev->loss = loss / (double)n;
  ev->accuracy = (double)correct / (double)n;
  ev->auc = NAN;
  if (t->model->classes == 0) PS_TRY(auc_exact(s->probs, s->labels, s->n, &ev->auc, err));
  return PS_ERR_OK;
}

ps_err trainer_evaluate(trainer *t, evaluation *ev, ps_error *err) {
  *ev = (evaluation){.examples = 0, .loss = NAN, .accuracy = NAN, .auc = NAN};
  if (t->eval == NULL) return PS_ERR_OK;
  /* Handed-out data: the others trained since this trainer's last push. */
  if (t->settings.opt.shard_steps > 0) PS_TRY(replica_refresh(t->rep, err));
  scores s = {0, 0, NULL, NULL};
  ps_err rc = evaluate_all(t, &s, ev, err);
  free(s.probs);
  free(s.labels);
  return rc;
}
