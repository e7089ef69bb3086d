/* A multilayer perceptron on a compute backend: ReLU hidden layers, a
 * softmax cross-entropy loss, forward, backward and the optimizer step.
 * Parameters, gradients, optimizer state and activations are each one
 * allocation in the backend's memory; parameters and gradients follow the
 * layout of model_build_layout (fcK.weight (out, in), fcK.bias (out)), so a
 * flat range of them is a shard. One thread at a time. */
#ifndef PSTRAIN_TRAINER_MLP_H
#define PSTRAIN_TRAINER_MLP_H

#include <stdint.h>

#include "common/error.h"
#include "common/model.h"
#include "common/optimizer.h"
#include "common/tensor.h"
#include "trainer/backend/backend.h"

typedef struct mlp {
  model_desc desc;
  tensor_layout layout; /* parameter (and gradient) layout */
  backend *be;          /* borrowed */
  int max_batch;
  float *params;        /* (layout.total) backend memory */
  float *grads;         /* (layout.total) backend memory */
  float *opt_state;     /* (2 * layout.total) backend memory, NULL until first needed */
  float *acts;          /* input (max_batch, sizes[0]) then each layer's output (max_batch, sizes[l]) */
  float *grad_bufs;     /* two (max_batch, max hidden width) buffers for backward */
  float *dinput;        /* (max_batch, sizes[0]) backend memory, NULL until mlp_backward_from
                         * is first asked for the input gradient */
  int32_t *labels;      /* (max_batch) backend memory */
  float *host_inputs;   /* (max_batch, sizes[0]) host staging for a batch */
  int32_t *host_labels; /* (max_batch) host staging */
  size_t act_offsets[MODEL_MAX_LAYERS + 1];
  int max_width;
  /* Called by backward once layer l's gradients (weight and bias) are final,
   * last layer first; host-memory backends only (NULL: none). An error stops
   * the backward pass. */
  ps_err (*grads_ready)(void *ctx, int layer, ps_error *err);
  void *grads_ready_ctx;
} mlp;

/* Builds the model on backend be for batches of up to max_batch samples and
 * initializes its parameters from seed (model_init_params). */
ps_err mlp_create(mlp **out, const model_desc *desc, backend *be, int max_batch, uint64_t seed,
                  ps_error *err);
void mlp_destroy(mlp *m);

/* Host staging buffers the caller fills before mlp_load_batch:
 * inputs (max_batch, sizes[0]) and labels (max_batch). */
static inline float *mlp_host_inputs(mlp *m) { return m->host_inputs; }
static inline int32_t *mlp_host_labels(mlp *m) { return m->host_labels; }

/* Copies the first `batch` staged samples to the backend. */
ps_err mlp_load_batch(mlp *m, int batch, ps_error *err);
/* The same for the inputs alone, for models whose loss is not the MLP's
 * softmax (mlp_forward_logits): the labels are not uploaded. */
ps_err mlp_load_inputs(mlp *m, int batch, ps_error *err);

/* Forward pass over the loaded batch. Adds the summed loss and the number of
 * correct predictions to *loss_sum and *correct. With want_grad, also leaves
 * the gradient of the mean loss w.r.t. the logits ready for mlp_backward. */
ps_err mlp_forward(mlp *m, int batch, int want_grad, double *loss_sum, long *correct,
                   ps_error *err);

/* Backward pass: overwrites m->grads with the gradient of the batch's mean loss. */
ps_err mlp_backward(mlp *m, int batch, ps_error *err);

/* For a model that puts its own loss on the MLP's output: the forward pass
 * over the loaded inputs stopping at the last layer's output (no loss), that
 * output copied to host (batch * sizes[num_layers] floats), and the backward
 * pass from the caller's gradient w.r.t. that output (host, same shape),
 * overwriting m->grads; when host_dinputs is not NULL it also receives the
 * gradient w.r.t. the inputs (batch * sizes[0] floats, host). */
ps_err mlp_forward_logits(mlp *m, int batch, ps_error *err);
ps_err mlp_get_logits(mlp *m, int batch, float *host, ps_error *err);
ps_err mlp_backward_from(mlp *m, int batch, const float *host_dlogits, float *host_dinputs,
                         ps_error *err);

/* Without copies where the backend's memory is host memory (be->host_memory;
 * NULL or FAILED_PRECONDITION on others): the input activations themselves,
 * which a caller fills (batch * sizes[0] floats) instead of the staging
 * buffer and mlp_load_inputs, and mlp_backward_from leaving the gradient
 * w.r.t. the inputs where the model computed it, *dinputs (batch * sizes[0]
 * floats, valid until the next backward). */
float *mlp_direct_inputs(mlp *m);
ps_err mlp_backward_from_direct(mlp *m, int batch, const float *host_dlogits,
                                const float **dinputs, ps_error *err);

/* Applies the optimizer to the parameters with the current gradients. */
ps_err mlp_apply_optimizer(mlp *m, const optimizer_config *cfg, long step, ps_error *err);

/* Copies all parameters or gradients to or from host memory (layout.total floats). */
ps_err mlp_get_params(mlp *m, float *host, ps_error *err);
ps_err mlp_set_params(mlp *m, const float *host, ps_error *err);
ps_err mlp_get_grads(mlp *m, float *host, ps_error *err);
/* The optimizer's two state vectors (2 * layout.total floats; zeros before
 * the first step), for checkpoints. */
ps_err mlp_get_state(mlp *m, float *host, ps_error *err);
ps_err mlp_set_state(mlp *m, const float *host, ps_error *err);
ps_err mlp_set_grads(mlp *m, const float *host, ps_error *err);

#endif
