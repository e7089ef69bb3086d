/* What the models over Criteo examples share (Wide&Deep, LR, DeepFM), each
 * model file composing its step from these parts. With B the batch, F = 26
 * fields, D = DIM and IN = F * D + 13:
 *   the wide part: wide_i = wide.bias + sum_f wide_rows[slot[i, f]]
 *     (table 0, one weight per key; wide.bias is the layout's last tensor);
 *   the deep part: input X (B, IN), row i = the fields' embedding rows
 *     (table 1) then the 13 dense features; deep_i = MLP(X)_i, on the
 *     compute backend (trainer/model/mlp.h: the layout's fc tensors);
 *   the loss: p_i = sigmoid(z_i), loss = mean_i logloss, dz_i = (p_i - y_i) / B.
 * The gathers, the scatters and everything per example but the MLP run on
 * the host: a few floats per example beside the MLP's GEMMs. */
#ifndef PSTRAIN_TRAINER_MODEL_CTR_CORE_H
#define PSTRAIN_TRAINER_MODEL_CTR_CORE_H

#include "trainer/model/mlp.h"
#include "trainer/model/model.h"

typedef struct ctr_core {
  model base;
  mlp *deep;            /* the deep MLP (NULL without a deep part) */
  float wide_bias, wide_bias_grad, wide_bias_state[2];
  float *inputs;        /* (max_batch, IN) host: the MLP's staging, or its input
                           activations where the backend's memory is host memory */
  float *logits;        /* (max_batch) host: the deep part's output (zeros without) */
  float *dlogits;       /* (max_batch) host: the loss's gradient w.r.t. z */
  float *dinputs;       /* (max_batch, IN) host; NULL where the MLP's input gradient
                           is read in place (backend memory is host memory) */
  int grad_batch;       /* size of the last forward with want_grad; 0 when none */
} ctr_core;

/* Builds the shared parts on c (zeroed, c->base.ops set by the caller): the
 * layout, the tables' widths, the deep MLP when the model has layers, the
 * host buffers and wide.bias's initial value. On error call ctr_core_free. */
ps_err ctr_core_init(ctr_core *c, const model_desc *desc, backend *be, int max_batch,
                     uint64_t seed, ps_error *err);
void ctr_core_free(ctr_core *c);

/* A batch that would read outside its rows is refused before any work; the
 * last forward's gradients are forgotten. */
ps_err ctr_core_check_batch(ctr_core *c, const model_batch *b, ps_error *err);

/* The deep part's outputs into c->logits (zeros without a deep part). */
ps_err ctr_core_deep_forward(ctr_core *c, const model_batch *b, ps_error *err);

/* z_i = logits_i + wide_i (+ extra_i when extra is not NULL): the logloss
 * added to out->loss_sum, out->probs (when not NULL) and c->dlogits. */
void ctr_core_loss(ctr_core *c, const model_batch *b, const float *extra, model_outputs *out);

/* Whether backward may go through batch b (the last forward had gradients). */
ps_err ctr_core_check_backward(const ctr_core *c, const model_batch *b,
                               float *const *row_grads, ps_error *err);

/* wide_grads (unique), overwritten, and wide.bias's gradient from c->dlogits. */
void ctr_core_wide_backward(ctr_core *c, const model_batch *b, float *wide_grads);

/* The deep MLP's gradients (kept in it) and deep_grads (unique, DIM),
 * overwritten with the embedding columns of dX, from c->dlogits. */
ps_err ctr_core_deep_backward(ctr_core *c, const model_batch *b, float *deep_grads,
                              ps_error *err);

/* The step of wide + deep (the deep part where the model has layers): the
 * forward and backward of Wide&Deep and LR. */
ps_err ctr_core_forward(model *m, const model_batch *b, int want_grad, model_outputs *out,
                        ps_error *err);
ps_err ctr_core_backward(model *m, const model_batch *b, float *const *row_grads, ps_error *err);

/* model_ops entries every CTR model shares: the dense part is the MLP's
 * tensors then wide.bias, whatever the model adds without parameters.
 * ctr_core_destroy frees a model ctr_core_create made. */
void ctr_core_destroy(model *m);
ps_err ctr_core_apply_optimizer(model *m, const optimizer_config *cfg, long step, ps_error *err);
ps_err ctr_core_get_params(model *m, float *host, ps_error *err);
ps_err ctr_core_set_params(model *m, const float *host, ps_error *err);
ps_err ctr_core_get_grads(model *m, float *host, ps_error *err);
ps_err ctr_core_set_grads(model *m, const float *host, ps_error *err);
ps_err ctr_core_get_state(model *m, float *host, ps_error *err);
ps_err ctr_core_set_state(model *m, const float *host, ps_error *err);

/* The dense entries of a CTR model's ops table. */
#define CTR_CORE_DENSE_OPS                                                                    \
  .apply_optimizer = ctr_core_apply_optimizer,                                                \
  .get_params = ctr_core_get_params, .set_params = ctr_core_set_params,                       \
  .get_grads = ctr_core_get_grads, .set_grads = ctr_core_set_grads,                           \
  .get_state = ctr_core_get_state, .set_state = ctr_core_set_state

/* Creates a ctr_core model with ops (the create of a model needing no more). */
ps_err ctr_core_create(model **out, const model_ops *ops, const model_desc *desc, backend *be,
                       int max_batch, uint64_t seed, ps_error *err);

#endif
