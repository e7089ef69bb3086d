/* The parts the CTR models share (see ctr_core.h). */
#include "trainer/model/ctr_core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/copy_row.h"

#define FIELDS CRITEO_CAT_FIELDS

/* Parameters before wide.bias: the MLP's (none without a deep part). */
static size_t deep_count(const ctr_core *c) { return c->base.layout.total - 1; }

static int input_width(const ctr_core *c) { return c->base.desc.sizes[0]; }

ps_err ctr_core_init(ctr_core *c, const model_desc *desc, backend *be, int max_batch,
                     uint64_t seed, ps_error *err) {
  if (!model_is_ctr(desc)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model %s: not a model over Criteo examples",
                        desc->name);
  }
  if (max_batch < 1) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model %s: batch %d must be >= 1",
                        desc->name, max_batch);
  }
  model *m = &c->base;
  m->desc = *desc;
  m->be = be;
  m->max_batch = max_batch;
  m->tables = ctr_table_count(desc);
  m->dim[CTR_TABLE_WIDE] = 1;
  if (m->tables > CTR_TABLE_EMBEDDING) m->dim[CTR_TABLE_EMBEDDING] = desc->embed_dim;
  tensor_layout_init(&m->layout);
  if (model_build_layout(desc, &m->layout, err) != PS_ERR_OK) return err->code;
  if (desc->num_layers > 0) {
    /* The same fc tensors at the same indices: mlp_create initializes them
     * as model_init_params does for the whole CTR layout. */
    model_desc mlp_desc = *desc;
    mlp_desc.kind = MODEL_MLP;
    snprintf(mlp_desc.name, sizeof mlp_desc.name, "mlp");
    mlp_desc.embed_dim = 0;
    if (mlp_create(&c->deep, &mlp_desc, be, max_batch, seed, err) != PS_ERR_OK) return err->code;
    /* Borrowed: gathered straight into the MLP's input activations where
     * the backend's memory is the host's, else into its staging for upload. */
    c->inputs = mlp_direct_inputs(c->deep);
    if (c->inputs == NULL) {
      c->inputs = mlp_host_inputs(c->deep);
      if ((c->dinputs = be->ops->host_alloc(
               be, (size_t)max_batch * (size_t)input_width(c) * sizeof(float), err)) == NULL) {
        return err->code;
      }
    }
  }
  if ((c->logits = be->ops->host_alloc(be, (size_t)max_batch * sizeof(float), err)) == NULL ||
      (c->dlogits = be->ops->host_alloc(be, (size_t)max_batch * sizeof(float), err)) == NULL) {
    return err->code;
  }
  model_init_params(&m->layout, seed, deep_count(c), 1, &c->wide_bias);
  return PS_ERR_OK;
}

void ctr_core_free(ctr_core *c) {
  backend *be = c->base.be;
  if (c->dinputs != NULL) be->ops->host_free(be, c->dinputs);
  if (c->logits != NULL) be->ops->host_free(be, c->logits);
  if (c->dlogits != NULL) be->ops->host_free(be, c->dlogits);
  mlp_destroy(c->deep);
  tensor_layout_free(&c->base.layout);
}

ps_err ctr_core_create(model **out, const model_ops *ops, const model_desc *desc, backend *be,
                       int max_batch, uint64_t seed, ps_error *err) {
  ctr_core *c = calloc(1, sizeof *c);
  if (c == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "model %s: out of memory", desc->name);
  c->base.ops = ops;
  if (ctr_core_init(c, desc, be, max_batch, seed, err) != PS_ERR_OK) {
    ctr_core_free(c);
    free(c);
    return err->code;
  }
  *out = &c->base;
  return PS_ERR_OK;
}

void ctr_core_destroy(model *m) {
  ctr_core_free((ctr_core *)m);
  free(m);
}

ps_err ctr_core_check_batch(ctr_core *c, const model_batch *b, ps_error *err) {
  c->grad_batch = 0; /* a failed or gradient-free forward leaves nothing to go back through */
  const model *m = &c->base;
  if (b->size < 1 || b->size > m->max_batch) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model %s: batch %d is outside 1..%d",
                        m->desc.name, b->size, m->max_batch);
  }
  if (b->examples == NULL || b->slot == NULL) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model %s: batch without %s",
                        m->desc.name, b->examples == NULL ? "examples" : "slots");
  }
  for (int t = 0; t < m->tables; t++) {
    if (b->rows[t] == NULL) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model %s: batch without %s rows",
                          m->desc.name, t == CTR_TABLE_WIDE ? "wide" : "deep");
    }
  }
  size_t n = (size_t)b->size * FIELDS;
  uint32_t max_slot = 0;
  for (size_t i = 0; i < n; i++) max_slot = b->slot[i] > max_slot ? b->slot[i] : max_slot;
  if (max_slot >= b->unique) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "model %s: slot %u is outside the batch's %zu distinct keys",
                        m->desc.name, max_slot, b->unique);
  }
  return PS_ERR_OK;
}

/* X row i = the fields' embedding rows, then the dense features. */
static void gather_inputs(ctr_core *c, const model_batch *b) {
  const size_t dim = (size_t)c->base.desc.embed_dim, width = (size_t)input_width(c);
  const float *rows = b->rows[CTR_TABLE_EMBEDDING];
  for (int i = 0; i < b->size; i++) {
    float *row = c->inputs + (size_t)i * width;
    const uint32_t *slot = b->slot + (size_t)i * FIELDS;
    for (int f = 0; f < FIELDS; f++) {
      copy_row(row + (size_t)f * dim, rows + (size_t)slot[f] * dim, dim);
    }
    memcpy(row + FIELDS * dim, b->examples[i].dense, CRITEO_INT_FIELDS * sizeof(float));
  }
}

ps_err ctr_core_deep_forward(ctr_core *c, const model_batch *b, ps_error *err) {
  const int batch = b->size;
  if (c->deep == NULL) {
    memset(c->logits, 0, (size_t)batch * sizeof(float));
    return PS_ERR_OK;
  }
  gather_inputs(c, b);
  if ((c->dinputs != NULL && mlp_load_inputs(c->deep, batch, err) != PS_ERR_OK) || /* staged */
      mlp_forward_logits(c->deep, batch, err) != PS_ERR_OK ||
      mlp_get_logits(c->deep, batch, c->logits, err) != PS_ERR_OK) {
    return err->code;
  }
  return PS_ERR_OK;
}

void ctr_core_loss(ctr_core *c, const model_batch *b, const float *extra, model_outputs *out) {
  float *probs = out->probs;
  const int batch = b->size;
  const float *wide_rows = b->rows[CTR_TABLE_WIDE];
  double loss = 0;
  for (int i = 0; i < batch; i++) {
    const uint32_t *slot = b->slot + (size_t)i * FIELDS;
    float wide = c->wide_bias;
    for (int f = 0; f < FIELDS; f++) wide += wide_rows[slot[f]];
    float logit = c->logits[i] + wide;
    if (extra != NULL) logit += extra[i];
    double z = (double)logit, y = b->examples[i].label;
    loss += log1p(exp(-fabs(z))) + (z > 0 ? z : 0) - y * z; /* stable logloss */
    double p = z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z));
    if (probs != NULL) probs[i] = (float)p;
    c->dlogits[i] = (float)((p - y) / batch);
  }
  out->loss_sum += loss;
}

ps_err ctr_core_check_backward(const ctr_core *c, const model_batch *b,
                               float *const *row_grads, ps_error *err) {
  const model *m = &c->base;
  if (c->grad_batch == 0 || c->grad_batch != b->size) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "model %s: backward of a batch of %d without a forward with gradients "
                        "of that batch",
                        m->desc.name, b->size);
  }
  for (int t = 0; t < m->tables; t++) {
    if (row_grads == NULL || row_grads[t] == NULL) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model %s: backward without %s gradients",
                          m->desc.name, t == CTR_TABLE_WIDE ? "wide" : "deep");
    }
  }
  return PS_ERR_OK;
}

void ctr_core_wide_backward(ctr_core *c, const model_batch *b, float *wide_grads) {
  memset(wide_grads, 0, b->unique * sizeof(float));
  float bias_grad = 0;
  for (int i = 0; i < b->size; i++) {
    const float d = c->dlogits[i];
    const uint32_t *slot = b->slot + (size_t)i * FIELDS;
    bias_grad += d;
    for (int f = 0; f < FIELDS; f++) wide_grads[slot[f]] += d;
  }
  c->wide_bias_grad = bias_grad;
}

static inline void add_row(float *restrict dst, const float *restrict src, size_t n) {
  for (size_t k = 0; k < n; k++) dst[k] += src[k];
}

ps_err ctr_core_deep_backward(ctr_core *c, const model_batch *b, float *deep_grads,
                              ps_error *err) {
  const float *dinputs = c->dinputs;
  if (dinputs != NULL) {
    if (mlp_backward_from(c->deep, b->size, c->dlogits, c->dinputs, err) != PS_ERR_OK) {
      return err->code;
    }
  } else if (mlp_backward_from_direct(c->deep, b->size, c->dlogits, &dinputs, err) != PS_ERR_OK) {
    return err->code;
  }
  const size_t dim = (size_t)c->base.desc.embed_dim, width = (size_t)input_width(c);
  memset(deep_grads, 0, b->unique * dim * sizeof(float));
  for (int i = 0; i < b->size; i++) {
    const float *row = dinputs + (size_t)i * width;
    const uint32_t *slot = b->slot + (size_t)i * FIELDS;
    for (int f = 0; f < FIELDS; f++) {
      add_row(deep_grads + (size_t)slot[f] * dim, row + (size_t)f * dim, dim);
    }
  }
  return PS_ERR_OK;
}

ps_err ctr_core_forward(model *m, const model_batch *b, int want_grad, model_outputs *out,
                        ps_error *err) {
  ctr_core *c = (ctr_core *)m;
  if (ctr_core_check_batch(c, b, err) != PS_ERR_OK ||
      ctr_core_deep_forward(c, b, err) != PS_ERR_OK) {
    return err->code;
  }
  ctr_core_loss(c, b, NULL, out);
  if (want_grad) c->grad_batch = b->size;
  return PS_ERR_OK;
}

ps_err ctr_core_backward(model *m, const model_batch *b, float *const *row_grads, ps_error *err) {
  ctr_core *c = (ctr_core *)m;
  if (ctr_core_check_backward(c, b, row_grads, err) != PS_ERR_OK) return err->code;
  ctr_core_wide_backward(c, b, row_grads[CTR_TABLE_WIDE]);
  if (c->deep == NULL) return PS_ERR_OK;
  return ctr_core_deep_backward(c, b, row_grads[CTR_TABLE_EMBEDDING], err);
}

ps_err ctr_core_apply_optimizer(model *m, const optimizer_config *cfg, long step, ps_error *err) {
  ctr_core *c = (ctr_core *)m;
  if (c->deep != NULL && mlp_apply_optimizer(c->deep, cfg, step, err) != PS_ERR_OK) {
    return err->code;
  }
  int states = optimizer_state_per_param(cfg->kind);
  optimizer_apply(cfg, step, &c->wide_bias, &c->wide_bias_grad,
                  states >= 1 ? &c->wide_bias_state[0] : NULL,
                  states >= 2 ? &c->wide_bias_state[1] : NULL, 1);
  return PS_ERR_OK;
}

/* Host vectors follow the layout: the MLP's tensors, then wide.bias. */
ps_err ctr_core_get_params(model *m, float *host, ps_error *err) {
  ctr_core *c = (ctr_core *)m;
  if (c->deep != NULL && mlp_get_params(c->deep, host, err) != PS_ERR_OK) return err->code;
  host[deep_count(c)] = c->wide_bias;
  return PS_ERR_OK;
}

ps_err ctr_core_set_params(model *m, const float *host, ps_error *err) {
  ctr_core *c = (ctr_core *)m;
  if (c->deep != NULL && mlp_set_params(c->deep, host, err) != PS_ERR_OK) return err->code;
  c->wide_bias = host[deep_count(c)];
  return PS_ERR_OK;
}

ps_err ctr_core_get_grads(model *m, float *host, ps_error *err) {
  ctr_core *c = (ctr_core *)m;
  if (c->deep != NULL && mlp_get_grads(c->deep, host, err) != PS_ERR_OK) return err->code;
  host[deep_count(c)] = c->wide_bias_grad;
  return PS_ERR_OK;
}

ps_err ctr_core_set_grads(model *m, const float *host, ps_error *err) {
  ctr_core *c = (ctr_core *)m;
  if (c->deep != NULL && mlp_set_grads(c->deep, host, err) != PS_ERR_OK) return err->code;
  c->wide_bias_grad = host[deep_count(c)];
  return PS_ERR_OK;
}

/* State is two vectors of layout.total: [state1 (fc..., wide.bias), state2 (...)],
 * while the MLP's are two vectors of its own n = layout.total - 1. */
ps_err ctr_core_get_state(model *m, float *host, ps_error *err) {
  ctr_core *c = (ctr_core *)m;
  const size_t n = deep_count(c);
  if (c->deep != NULL) {
    if (mlp_get_state(c->deep, host, err) != PS_ERR_OK) return err->code;
    memmove(host + n + 1, host + n, n * sizeof(float));
  }
  host[n] = c->wide_bias_state[0];
  host[2 * n + 1] = c->wide_bias_state[1];
  return PS_ERR_OK;
}

ps_err ctr_core_set_state(model *m, const float *host, ps_error *err) {
  ctr_core *c = (ctr_core *)m;
  const size_t n = deep_count(c);
  if (c->deep != NULL) {
    float *deep = malloc(2 * n * sizeof(float));
    if (deep == NULL) {
      return ps_error_set(err, PS_ERR_NO_MEMORY,
                          "model %s: out of host memory for %zu optimizer state values",
                          m->desc.name, 2 * n);
    }
    memcpy(deep, host, n * sizeof(float));
    memcpy(deep + n, host + n + 1, n * sizeof(float));
    ps_err rc = mlp_set_state(c->deep, deep, err);
    free(deep);
    if (rc != PS_ERR_OK) return rc;
  }
  c->wide_bias_state[0] = host[n];
  c->wide_bias_state[1] = host[2 * n + 1];
  return PS_ERR_OK;
}
