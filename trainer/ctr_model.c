/* Wide&Deep and logistic regression over a batch of gathered sparse rows.
 *
 * With B the batch, F = 26 fields, D = DIM and IN = F * D + 13:
 *   input X (B, IN), row i = deep_rows[slot[i, 0]] ++ ... ++ deep_rows[slot[i, 25]] ++ dense_i
 *   deep_i = MLP(X)_i (the mlp module, on the compute backend)
 *   z_i = deep_i + wide.bias + sum_f wide_rows[slot[i, f]], p_i = sigmoid(z_i)
 *   loss = mean_i [log1p(exp(-|z_i|)) + max(z_i, 0) - y_i z_i]   (stable logloss)
 *   dz_i = (p_i - y_i) / B
 * The gathers, the scatters and everything per example but the MLP run on the
 * host: a few floats per example beside the MLP's GEMMs. */
#include "trainer/ctr_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(expr)                              \
  do {                                         \
    if ((expr) != PS_ERR_OK) return err->code; \
  } while (0)

#define FIELDS CTR_CAT_FIELDS

/* Parameters before wide.bias: the MLP's (none for lr). */
static size_t deep_count(const ctr_model *m) { return m->layout.total - 1; }

static int input_width(const ctr_model *m) { return m->desc.sizes[0]; }

ps_err ctr_model_create(ctr_model **out, const model_desc *desc, backend *be, int max_batch,
                        uint64_t seed, ps_error *err) {
  if (!model_is_ctr(desc)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "ctr model: the model is not ctr or lr");
  }
  if (max_batch < 1) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "ctr model: batch %d must be >= 1",
                        max_batch);
  }
  ctr_model *m = calloc(1, sizeof *m);
  if (m == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "ctr model: out of memory");
  m->desc = *desc;
  m->be = be;
  m->max_batch = max_batch;
  tensor_layout_init(&m->layout);
  if (model_build_layout(desc, &m->layout, err) != PS_ERR_OK) goto fail;
  if (desc->kind == MODEL_CTR) {
    /* The same fc tensors at the same indices: mlp_create initializes them
     * as model_init_params does for the whole CTR layout. */
    model_desc mlp_desc = *desc;
    mlp_desc.kind = MODEL_MLP;
    snprintf(mlp_desc.name, sizeof mlp_desc.name, "mlp");
    mlp_desc.embed_dim = 0;
    if (mlp_create(&m->deep, &mlp_desc, be, max_batch, seed, err) != PS_ERR_OK) goto fail;
    /* Borrowed: gathered straight into the MLP's input activations where
     * the backend's memory is the host's, else into its staging for upload. */
    m->inputs = mlp_direct_inputs(m->deep);
    if (m->inputs == NULL) {
      m->inputs = mlp_host_inputs(m->deep);
      if ((m->dinputs = be->ops->host_alloc(
               be, (size_t)max_batch * (size_t)input_width(m) * sizeof(float), err)) == NULL) {
        goto fail;
      }
    }
  }
  if ((m->logits = be->ops->host_alloc(be, (size_t)max_batch * sizeof(float), err)) == NULL ||
      (m->dlogits = be->ops->host_alloc(be, (size_t)max_batch * sizeof(float), err)) == NULL) {
    goto fail;
  }
  model_init_params(desc, &m->layout, seed, deep_count(m), 1, &m->wide_bias);
  *out = m;
  return PS_ERR_OK;
fail:
  ctr_model_destroy(m);
  return err->code;
}

void ctr_model_destroy(ctr_model *m) {
  if (m == NULL) return;
  backend *be = m->be;
  if (m->dinputs != NULL) be->ops->host_free(be, m->dinputs);
  if (m->logits != NULL) be->ops->host_free(be, m->logits);
  if (m->dlogits != NULL) be->ops->host_free(be, m->dlogits);
  mlp_destroy(m->deep);
  tensor_layout_free(&m->layout);
  free(m);
}

/* A batch that would read outside its rows is refused before any work. */
static ps_err check_batch(const ctr_model *m, const ctr_batch *b, ps_error *err) {
  if (b->size < 1 || b->size > m->max_batch) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "ctr model: batch %d is outside 1..%d",
                        b->size, m->max_batch);
  }
  if (b->examples == NULL || b->slot == NULL || b->wide_rows == NULL ||
      (m->deep != NULL && b->deep_rows == NULL)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "ctr model: batch without %s",
                        b->examples == NULL ? "examples"
                        : b->slot == NULL   ? "slots"
                        : b->wide_rows == NULL ? "wide rows"
                                               : "deep rows");
  }
  size_t n = (size_t)b->size * FIELDS;
  uint32_t max_slot = 0;
  for (size_t i = 0; i < n; i++) max_slot = b->slot[i] > max_slot ? b->slot[i] : max_slot;
  if (max_slot >= b->unique) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "ctr model: slot %u is outside the batch's %zu distinct keys", max_slot,
                        b->unique);
  }
  return PS_ERR_OK;
}

/* A libc call per row costs about what copying 64 bytes does: the usual
 * widths get a copy of constant size, which the compiler inlines. */
static inline void copy_row(float *restrict dst, const float *restrict src, size_t dim) {
  switch (dim) {
  case 8: memcpy(dst, src, 8 * sizeof(float)); break;
  case 16: memcpy(dst, src, 16 * sizeof(float)); break;
  case 32: memcpy(dst, src, 32 * sizeof(float)); break;
  default: memcpy(dst, src, dim * sizeof(float)); break;
  }
}

/* X row i = the fields' deep rows, then the dense features. */
static void gather_inputs(ctr_model *m, const ctr_batch *b) {
  const size_t dim = (size_t)m->desc.embed_dim, width = (size_t)input_width(m);
  for (int i = 0; i < b->size; i++) {
    float *row = m->inputs + (size_t)i * width;
    const uint32_t *slot = b->slot + (size_t)i * FIELDS;
    for (int f = 0; f < FIELDS; f++) {
      copy_row(row + (size_t)f * dim, b->deep_rows + (size_t)slot[f] * dim, dim);
    }
    memcpy(row + FIELDS * dim, b->examples[i].dense, CTR_DENSE_FIELDS * sizeof(float));
  }
}

ps_err ctr_model_forward(ctr_model *m, const ctr_batch *b, int want_grad, double *loss_sum,
                         float *probs, ps_error *err) {
  m->grad_batch = 0; /* a failed or gradient-free forward leaves nothing to go back through */
  TRY(check_batch(m, b, err));
  const int batch = b->size;
  if (m->deep != NULL) {
    gather_inputs(m, b);
    if (m->dinputs != NULL) TRY(mlp_load_inputs(m->deep, batch, err)); /* staged */
    TRY(mlp_forward_logits(m->deep, batch, err));
    TRY(mlp_get_logits(m->deep, batch, m->logits, err));
  } else {
    memset(m->logits, 0, (size_t)batch * sizeof(float));
  }
  double loss = 0;
  for (int i = 0; i < batch; i++) {
    const uint32_t *slot = b->slot + (size_t)i * FIELDS;
    float wide = m->wide_bias;
    for (int f = 0; f < FIELDS; f++) wide += b->wide_rows[slot[f]];
    double z = (double)(m->logits[i] + wide), y = b->examples[i].label;
    loss += log1p(exp(-fabs(z))) + (z > 0 ? z : 0) - y * z;
    double p = z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z));
    if (probs != NULL) probs[i] = (float)p;
    m->dlogits[i] = (float)((p - y) / batch);
  }
  *loss_sum += loss;
  if (want_grad) m->grad_batch = batch;
  return PS_ERR_OK;
}

static inline void add_row(float *restrict dst, const float *restrict src, size_t n) {
  for (size_t k = 0; k < n; k++) dst[k] += src[k];
}

/* deep_grads[slot] += the embedding columns of dX, over examples and fields. */
static void scatter_deep(const ctr_model *m, const ctr_batch *b, const float *dinputs,
                         float *deep_grads) {
  const size_t dim = (size_t)m->desc.embed_dim, width = (size_t)input_width(m);
  memset(deep_grads, 0, b->unique * dim * sizeof(float));
  for (int i = 0; i < b->size; i++) {
    const float *row = dinputs + (size_t)i * width;
    const uint32_t *slot = b->slot + (size_t)i * FIELDS;
    for (int f = 0; f < FIELDS; f++) {
      add_row(deep_grads + (size_t)slot[f] * dim, row + (size_t)f * dim, dim);
    }
  }
}

ps_err ctr_model_backward(ctr_model *m, const ctr_batch *b, float *wide_grads, float *deep_grads,
                          ps_error *err) {
  if (m->grad_batch == 0 || m->grad_batch != b->size) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "ctr model: backward of a batch of %d without a forward with gradients "
                        "of that batch",
                        b->size);
  }
  if (wide_grads == NULL || (m->deep != NULL && deep_grads == NULL)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "ctr model: backward without %s gradients",
                        wide_grads == NULL ? "wide" : "deep");
  }
  memset(wide_grads, 0, b->unique * sizeof(float));
  float bias_grad = 0;
  for (int i = 0; i < b->size; i++) {
    const float d = m->dlogits[i];
    const uint32_t *slot = b->slot + (size_t)i * FIELDS;
    bias_grad += d;
    for (int f = 0; f < FIELDS; f++) wide_grads[slot[f]] += d;
  }
  m->wide_bias_grad = bias_grad;
  if (m->deep == NULL) return PS_ERR_OK;
  const float *dinputs = m->dinputs;
  if (dinputs != NULL) TRY(mlp_backward_from(m->deep, b->size, m->dlogits, m->dinputs, err));
  else TRY(mlp_backward_from_direct(m->deep, b->size, m->dlogits, &dinputs, err));
  scatter_deep(m, b, dinputs, deep_grads);
  return PS_ERR_OK;
}

ps_err ctr_model_apply_optimizer(ctr_model *m, const optimizer_config *cfg, long step,
                                 ps_error *err) {
  if (m->deep != NULL) TRY(mlp_apply_optimizer(m->deep, cfg, step, err));
  int states = optimizer_state_per_param(cfg->kind);
  optimizer_apply(cfg, step, &m->wide_bias, &m->wide_bias_grad,
                  states >= 1 ? &m->wide_bias_state[0] : NULL,
                  states >= 2 ? &m->wide_bias_state[1] : NULL, 1);
  return PS_ERR_OK;
}

/* Host vectors follow the layout: the MLP's tensors, then wide.bias. */
ps_err ctr_model_get_params(ctr_model *m, float *host, ps_error *err) {
  if (m->deep != NULL) TRY(mlp_get_params(m->deep, host, err));
  host[deep_count(m)] = m->wide_bias;
  return PS_ERR_OK;
}

ps_err ctr_model_set_params(ctr_model *m, const float *host, ps_error *err) {
  if (m->deep != NULL) TRY(mlp_set_params(m->deep, host, err));
  m->wide_bias = host[deep_count(m)];
  return PS_ERR_OK;
}

ps_err ctr_model_get_grads(ctr_model *m, float *host, ps_error *err) {
  if (m->deep != NULL) TRY(mlp_get_grads(m->deep, host, err));
  host[deep_count(m)] = m->wide_bias_grad;
  return PS_ERR_OK;
}

ps_err ctr_model_set_grads(ctr_model *m, const float *host, ps_error *err) {
  if (m->deep != NULL) TRY(mlp_set_grads(m->deep, host, err));
  m->wide_bias_grad = host[deep_count(m)];
  return PS_ERR_OK;
}

/* State is two vectors of layout.total: [state1 (fc..., wide.bias), state2 (...)],
 * while the MLP's are two vectors of its own n = layout.total - 1. */
ps_err ctr_model_get_state(ctr_model *m, float *host, ps_error *err) {
  const size_t n = deep_count(m);
  if (m->deep != NULL) {
    TRY(mlp_get_state(m->deep, host, err));
    memmove(host + n + 1, host + n, n * sizeof(float));
  }
  host[n] = m->wide_bias_state[0];
  host[2 * n + 1] = m->wide_bias_state[1];
  return PS_ERR_OK;
}

ps_err ctr_model_set_state(ctr_model *m, const float *host, ps_error *err) {
  const size_t n = deep_count(m);
  if (m->deep != NULL) {
    float *deep = malloc(2 * n * sizeof(float));
    if (deep == NULL) {
      return ps_error_set(err, PS_ERR_NO_MEMORY,
                          "ctr model: out of host memory for %zu optimizer state values", 2 * n);
    }
    memcpy(deep, host, n * sizeof(float));
    memcpy(deep + n, host + n + 1, n * sizeof(float));
    ps_err rc = mlp_set_state(m->deep, deep, err);
    free(deep);
    if (rc != PS_ERR_OK) return rc;
  }
  m->wide_bias_state[0] = host[n];
  m->wide_bias_state[1] = host[2 * n + 1];
  return PS_ERR_OK;
}
