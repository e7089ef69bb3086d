/* The multilayer perceptron over images (--model mlp:IN,H1,...,CLASSES) as a
 * model: trainer/model/mlp.h's network (ReLU hidden layers, softmax cross-entropy)
 * on the compute backend, no sparse tables. */
#include <stdlib.h>
#include <string.h>

#include "trainer/model/mlp.h"
#include "trainer/model/model.h"

typedef struct mlp_model {
  model base;
  mlp *net;
} mlp_model;

/* The network reports a layer (fcK.weight, fcK.bias); the model's hook
 * takes tensors. */
static ps_err layer_ready(void *ctx, int layer, ps_error *err) {
  model *m = ctx;
  return m->grads_ready(m->grads_ready_ctx, 2 * (layer - 1), 2 * layer - 1, err);
}

static ps_err mlp_model_forward(model *m, const model_batch *b, int want_grad,
                                model_outputs *out, ps_error *err) {
  mlp *net = ((mlp_model *)m)->net;
  if (b->size < 1 || b->size > m->max_batch) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model mlp: batch %d is outside 1..%d",
                        b->size, m->max_batch);
  }
  if (b->inputs == NULL || b->labels == NULL) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model mlp: batch without %s",
                        b->inputs == NULL ? "inputs" : "labels");
  }
  if (b->inputs != m->inputs) {
    memcpy(m->inputs, b->inputs, (size_t)b->size * (size_t)m->desc.sizes[0] * sizeof(float));
  }
  if (b->labels != m->labels) memcpy(m->labels, b->labels, (size_t)b->size * sizeof(int32_t));
  if (mlp_load_batch(net, b->size, err) != PS_ERR_OK) return err->code;
  return mlp_forward(net, b->size, want_grad, &out->loss_sum, &out->correct, err);
}

static ps_err mlp_model_backward(model *m, const model_batch *b, float *const *row_grads,
                                 ps_error *err) {
  (void)row_grads; /* no tables */
  mlp *net = ((mlp_model *)m)->net;
  net->grads_ready = m->grads_ready != NULL ? layer_ready : NULL;
  net->grads_ready_ctx = m;
  return mlp_backward(net, b->size, err);
}

static ps_err mlp_model_apply_optimizer(model *m, const optimizer_config *cfg, long step,
                                        ps_error *err) {
  return mlp_apply_optimizer(((mlp_model *)m)->net, cfg, step, err);
}

static ps_err mlp_model_get_params(model *m, float *host, ps_error *err) {
  return mlp_get_params(((mlp_model *)m)->net, host, err);
}

static ps_err mlp_model_set_params(model *m, const float *host, ps_error *err) {
  return mlp_set_params(((mlp_model *)m)->net, host, err);
}

static ps_err mlp_model_get_grads(model *m, float *host, ps_error *err) {
  return mlp_get_grads(((mlp_model *)m)->net, host, err);
}

static ps_err mlp_model_set_grads(model *m, const float *host, ps_error *err) {
  return mlp_set_grads(((mlp_model *)m)->net, host, err);
}

static ps_err mlp_model_get_state(model *m, float *host, ps_error *err) {
  return mlp_get_state(((mlp_model *)m)->net, host, err);
}

static ps_err mlp_model_set_state(model *m, const float *host, ps_error *err) {
  return mlp_set_state(((mlp_model *)m)->net, host, err);
}

static void mlp_model_destroy(model *m) {
  mlp_model *mm = (mlp_model *)m;
  mlp_destroy(mm->net);
  tensor_layout_free(&m->layout);
  free(mm);
}

static ps_err mlp_model_create(model **out, const model_desc *desc, backend *be, int max_batch,
                               uint64_t seed, ps_error *err);

const model_ops model_mlp = {
    .name = "mlp",
    .create = mlp_model_create,
    .destroy = mlp_model_destroy,
    .forward = mlp_model_forward,
    .backward = mlp_model_backward,
    .apply_optimizer = mlp_model_apply_optimizer,
    .get_params = mlp_model_get_params,
    .set_params = mlp_model_set_params,
    .get_grads = mlp_model_get_grads,
    .set_grads = mlp_model_set_grads,
    .get_state = mlp_model_get_state,
    .set_state = mlp_model_set_state,
};

static ps_err mlp_model_create(model **out, const model_desc *desc, backend *be, int max_batch,
                               uint64_t seed, ps_error *err) {
  mlp_model *mm = calloc(1, sizeof *mm);
  if (mm == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "model mlp: out of memory");
  model *m = &mm->base;
  m->ops = &model_mlp;
  m->desc = *desc;
  m->be = be;
  m->max_batch = max_batch;
  m->classes = desc->sizes[desc->num_layers];
  tensor_layout_init(&m->layout);
  if (model_build_layout(desc, &m->layout, err) != PS_ERR_OK ||
      mlp_create(&mm->net, desc, be, max_batch, seed, err) != PS_ERR_OK) {
    mlp_model_destroy(m);
    return err->code;
  }
  m->inputs = mlp_host_inputs(mm->net);
  m->labels = mlp_host_labels(mm->net);
  if (be->host_memory) {
    m->params_host = mm->net->params;
    m->grads_host = mm->net->grads;
  } else {
    m->grads_device = mm->net->grads;
  }
  *out = m;
  return PS_ERR_OK;
}
