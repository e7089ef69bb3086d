/* The click-through-rate models over Criteo-style examples.
 *
 * Wide&Deep (--model ctr:DIM:H1,H2,...): logit = wide + deep, where
 *   wide = wide.bias + sum over the 26 fields of the field key's weight
 *          (a sparse table of dimension 1), and
 *   deep = an MLP (ReLU hidden layers H1, H2, ..., one output) over the 26
 *          field keys' DIM-vectors (a sparse table) concatenated with the 13
 *          dense features: input width 26 * DIM + 13;
 *   p = sigmoid(logit), loss = logloss (mean over the batch).
 * Logistic regression (--model lr) is the wide part alone.
 *
 * The model does not own the sparse tables: the caller gathers the rows of
 * the batch's distinct keys (from a local table or from pservers) and gets
 * back their summed gradients. The dense parameters (fcK.weight, fcK.bias,
 * wide.bias, model_build_layout's order) live on the compute backend as the
 * MLP's do and use the dense --optimizer. One thread at a time. */
#ifndef PSTRAIN_TRAINER_CTR_MODEL_H
#define PSTRAIN_TRAINER_CTR_MODEL_H

#include <stdint.h>

#include "common/criteo.h"
#include "common/error.h"
#include "common/model.h"
#include "common/optimizer.h"
#include "common/tensor.h"
#include "trainer/backend.h"
#include "trainer/mlp.h"

/* One batch as the model sees it. slot[i * 26 + f] is the index, among the
 * batch's distinct keys, of example i's key in field f; wide_rows holds one
 * weight per distinct key and deep_rows DIM floats per distinct key (NULL
 * for lr). */
typedef struct ctr_batch {
  int size;
  const ctr_example *examples; /* labels and dense features */
  const uint32_t *slot;        /* (size, 26) */
  size_t unique;
  const float *wide_rows;      /* (unique) */
  const float *deep_rows;      /* (unique, DIM) or NULL */
} ctr_batch;

typedef struct ctr_model {
  model_desc desc;      /* kind MODEL_CTR or MODEL_LR */
  tensor_layout layout; /* the dense parameters */
  backend *be;          /* borrowed */
  int max_batch;
  mlp *deep;            /* the deep MLP (NULL for lr): the fc* tensors of layout */
  /* the rest is private to ctr_model.c: wide.bias and its gradient and
   * state, host scratch for inputs, logits and their gradients */
  float wide_bias, wide_bias_grad, wide_bias_state[2];
  float *inputs;        /* (max_batch, 26 * DIM + 13) host: the MLP's staging, or its
                           input activations where the backend's memory is host memory */
  float *logits;        /* (max_batch) host */
  float *dlogits;       /* (max_batch) host */
  float *dinputs;       /* (max_batch, 26 * DIM + 13) host; NULL where the MLP's input
                           gradient is read in place (backend memory is host memory) */
  int grad_batch;       /* size of the last forward with want_grad; 0 when none */
} ctr_model;

/* Builds the model for batches of up to max_batch and initializes the dense
 * parameters from seed (model_init_params). */
ps_err ctr_model_create(ctr_model **out, const model_desc *desc, backend *be, int max_batch,
                        uint64_t seed, ps_error *err);
void ctr_model_destroy(ctr_model *m);

/* Forward pass. Adds the batch's summed logloss to *loss_sum; probs (size
 * floats, may be NULL) receives each example's predicted probability. With
 * want_grad, keeps what ctr_model_backward needs. */
ps_err ctr_model_forward(ctr_model *m, const ctr_batch *b, int want_grad, double *loss_sum,
                         float *probs, ps_error *err);

/* Backward pass of the last forward (with want_grad): the gradient of the
 * batch's mean loss w.r.t. the dense parameters (kept in the model), and w.r.t.
 * each distinct key's wide weight and deep row, summed over the examples
 * and fields where it occurs (wide_grads (unique), deep_grads (unique, DIM),
 * NULL for lr), overwritten. */
ps_err ctr_model_backward(ctr_model *m, const ctr_batch *b, float *wide_grads, float *deep_grads,
                          ps_error *err);

/* The dense optimizer step with the dense gradients of the last backward. */
ps_err ctr_model_apply_optimizer(ctr_model *m, const optimizer_config *cfg, long step,
                                 ps_error *err);

/* Dense parameters and optimizer state to and from host memory (layout.total
 * and 2 * layout.total floats), for exports and checkpoints. */
ps_err ctr_model_get_params(ctr_model *m, float *host, ps_error *err);
ps_err ctr_model_set_params(ctr_model *m, const float *host, ps_error *err);
ps_err ctr_model_get_grads(ctr_model *m, float *host, ps_error *err);
/* Replaces the dense gradients the next optimizer step applies (collective
 * mode: the sum over ranks). */
ps_err ctr_model_set_grads(ctr_model *m, const float *host, ps_error *err);
ps_err ctr_model_get_state(ctr_model *m, float *host, ps_error *err);
ps_err ctr_model_set_state(ctr_model *m, const float *host, ps_error *err);

#endif
