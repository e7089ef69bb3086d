/* The model interface: what the training loop, the replicas (local,
 * pserver, GEO, collective) and checkpoints know of a model, so that a new
 * model is one file here and one line of registry.c, never a branch
 * elsewhere.
 *
 * A model has dense parameters (a tensor layout on the compute backend,
 * with gradients and the dense optimizer's state) and 0..MODEL_TABLES_MAX
 * sparse tables, which it does not own: the caller gathers the rows of a
 * batch's distinct keys (from a local table or from pservers), the model's
 * step computes from them the dense gradients (kept in the model), each
 * distinct key's row gradient per table, and the loss. The tables, their
 * row widths and optimizer are the job's (common/ctr_tables.h).
 *
 * The implementations: the MLP over images (a classifier, no tables), the
 * convolutional networks (net_model.c) and the models over Criteo examples
 * (Wide&Deep, LR, DeepFM). One thread at a time. */
#ifndef PSTRAIN_TRAINER_MODEL_MODEL_H
#define PSTRAIN_TRAINER_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/criteo.h"
#include "common/ctr_tables.h"
#include "common/error.h"
#include "common/model.h"
#include "common/optimizer.h"
#include "common/tensor.h"
#include "trainer/backend/backend.h"

#define MODEL_TABLES_MAX CTR_TABLES_MAX

/* One batch as a model sees it: images and their classes for a classifier
 * (inputs, labels), or Criteo examples with their rows: slot[i * 26 + f] is
 * the index, among the batch's distinct keys, of example i's key in field
 * f; rows[t] holds the table t's row (dim[t] floats) of each distinct key. */
typedef struct model_batch {
  int size;
  const float *inputs;         /* (size, input width) classifiers: the model's
                                  input_buffer, or copied there */
  const int32_t *labels;       /* (size) classifiers */
  const ctr_example *examples; /* CTR models: labels and dense features */
  const uint32_t *slot;        /* (size, 26) */
  size_t unique;
  const float *rows[MODEL_TABLES_MAX]; /* (unique, dim[t]) */
} model_batch;

typedef struct model model;

/* What a forward pass reports, added to across batches. */
typedef struct model_outputs {
  double loss_sum; /* the examples' summed loss */
  long correct;    /* classifiers: examples whose highest logit is the label */
  float *probs;    /* binary models: each example's predicted probability
                      (size floats), or NULL */
} model_outputs;

typedef struct model_ops {
  const char *name; /* as in --model */
  /* Builds the model for batches of up to max_batch and initializes the
   * dense parameters from seed (model_init_params). Nothing held on error. */
  ps_err (*create)(model **out, const model_desc *desc, backend *be, int max_batch,
                   uint64_t seed, ps_error *err);
  void (*destroy)(model *m);
  /* Forward pass, reported in *out. With want_grad, keeps what backward needs. */
  ps_err (*forward)(model *m, const model_batch *b, int want_grad, model_outputs *out,
                    ps_error *err);
  /* Backward pass of the last forward with want_grad: the gradient of the
   * batch's mean loss w.r.t. the dense parameters (kept in the model) and,
   * per table, w.r.t. each distinct key's row summed over the examples and
   * fields where it occurs: row_grads[t] (unique, dim[t]), overwritten. */
  ps_err (*backward)(model *m, const model_batch *b, float *const *row_grads, ps_error *err);
  /* The dense optimizer step with the dense gradients of the last backward. */
  ps_err (*apply_optimizer)(model *m, const optimizer_config *cfg, long step, ps_error *err);
  /* Dense parameters, gradients (layout.total floats) and optimizer state
   * (2 * layout.total) to and from host memory, in the layout's order. */
  ps_err (*get_params)(model *m, float *host, ps_error *err);
  ps_err (*set_params)(model *m, const float *host, ps_error *err);
  ps_err (*get_grads)(model *m, float *host, ps_error *err);
  ps_err (*set_grads)(model *m, const float *host, ps_error *err);
  ps_err (*get_state)(model *m, float *host, ps_error *err);
  ps_err (*set_state)(model *m, const float *host, ps_error *err);
} model_ops;

/* Implementations put this first in their own struct. */
struct model {
  const model_ops *ops;
  model_desc desc;
  tensor_layout layout;   /* the dense parameters */
  backend *be;            /* borrowed */
  int max_batch;
  /* What evaluation measures: classifiers' number of classes (accuracy of
   * the highest logit); 0: one probability per example (AUC, logloss). */
  int classes;
  int tables;             /* sparse tables (ctr_table_count) */
  int dim[MODEL_TABLES_MAX]; /* floats per row of each */
  /* Classifiers: host buffers of max_batch rows that a batch's inputs and
   * labels are gathered into (no copy in forward); NULL for the others. */
  float *inputs;
  int32_t *labels;
  /* Where the backend's memory is the host's: the dense parameters and
   * gradients themselves (layout.total floats), read and written in place
   * by replicas; NULL otherwise (then get/set copy them). */
  float *params_host, *grads_host;
  /* Device backends: the dense gradients in device memory, for an
   * all-reduce on the devices; NULL otherwise. */
  float *grads_device;
  /* Set by a replica, NULL by default: backward calls it as soon as the
   * gradients of tensors first..last (layout indices) are final, last
   * tensors first, so they can be sent while backward goes on (host-memory
   * backends; models that can tell). An error stops the backward pass. */
  ps_err (*grads_ready)(void *ctx, int first, int last, ps_error *err);
  void *grads_ready_ctx;
  /* Batch norm (networks), set by the trainer after create: statistics per
   * group of bn_group examples (0: the batch; groups are the batch's
   * examples r, r + G, r + 2G, ... of G groups, as trainer r of a sync job
   * of G trainers reads them), and whether this replica's running
   * statistics are the model's (trainer 0; 1 by default). Non-trainable
   * tensors' "gradients" are then changes to add: the owner's, zeros from
   * the others. */
  int bn_group;
  int stats_owner;
};

/* The implementation registry.c names for desc->name, or NULL. */
const model_ops *model_find(const char *name);

/* Builds the model desc names (model_find); PS_ERR_INVALID_ARGUMENT naming
 * it when no implementation trains it. */
ps_err model_create(model **out, const model_desc *desc, backend *be, int max_batch,
                    uint64_t seed, ps_error *err);

static inline void model_destroy(model *m) {
  if (m != NULL) m->ops->destroy(m);
}
static inline ps_err model_forward(model *m, const model_batch *b, int want_grad,
                                   model_outputs *out, ps_error *err) {
  return m->ops->forward(m, b, want_grad, out, err);
}
static inline ps_err model_backward(model *m, const model_batch *b, float *const *row_grads,
                                    ps_error *err) {
  return m->ops->backward(m, b, row_grads, err);
}
static inline ps_err model_apply_optimizer(model *m, const optimizer_config *cfg, long step,
                                           ps_error *err) {
  return m->ops->apply_optimizer(m, cfg, step, err);
}
static inline ps_err model_get_params(model *m, float *host, ps_error *err) {
  return m->ops->get_params(m, host, err);
}
static inline ps_err model_set_params(model *m, const float *host, ps_error *err) {
  return m->ops->set_params(m, host, err);
}
static inline ps_err model_get_grads(model *m, float *host, ps_error *err) {
  return m->ops->get_grads(m, host, err);
}
static inline ps_err model_set_grads(model *m, const float *host, ps_error *err) {
  return m->ops->set_grads(m, host, err);
}
static inline ps_err model_get_state(model *m, float *host, ps_error *err) {
  return m->ops->get_state(m, host, err);
}
static inline ps_err model_set_state(model *m, const float *host, ps_error *err) {
  return m->ops->set_state(m, host, err);
}

#endif
