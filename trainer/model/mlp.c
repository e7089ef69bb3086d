/* MLP forward and backward as backend GEMMs and kernels.
 *
 * Shapes, with B the batch and layer l mapping in = sizes[l-1] to out = sizes[l]:
 *   X_{l-1} (B, in), W_l (out, in), b_l (out), Y_l (B, out), all row-major.
 *   forward:  Y_l = act(X_{l-1} W_l^T + b_l), act = ReLU except for the last layer
 *   backward: dY_l (B, out) given; through ReLU; db_l = sum over rows of dY_l;
 *             dW_l = dY_l^T X_{l-1}; dX_{l-1} = dY_l W_l (for l = 1 only when the
 *             caller wants the input gradient, as the CTR model's embeddings do). */
#include "trainer/model/mlp.h"

#include <stdlib.h>
#include <string.h>

static float *param(const mlp *m, float *base, int layer, int bias) {
  return base + m->layout.tensors[2 * (layer - 1) + bias].offset;
}

static float *activation(const mlp *m, int layer) { return m->acts + m->act_offsets[layer]; }

static void *alloc_or_fail(mlp *m, size_t bytes, ps_error *err) {
  return m->be->ops->alloc(m->be, bytes, err);
}

ps_err mlp_create(mlp **out, const model_desc *desc, backend *be, int max_batch, uint64_t seed,
                  ps_error *err) {
  if (max_batch < 1) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "mlp: batch %d must be >= 1", max_batch);
  }
  mlp *m = calloc(1, sizeof *m);
  if (m == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "mlp: out of memory");
  m->desc = *desc;
  m->be = be;
  m->max_batch = max_batch;
  tensor_layout_init(&m->layout);
  if (model_build_layout(desc, &m->layout, err) != PS_ERR_OK) goto fail;

  size_t acts_total = 0;
  m->max_width = 0;
  for (int l = 0; l <= desc->num_layers; l++) {
    m->act_offsets[l] = acts_total;
    acts_total += (size_t)max_batch * (size_t)desc->sizes[l];
    if (l > 0 && desc->sizes[l] > m->max_width) m->max_width = desc->sizes[l];
  }
  size_t n = m->layout.total;
  size_t grad_buf = (size_t)max_batch * (size_t)m->max_width;
  if ((m->params = alloc_or_fail(m, n * sizeof(float), err)) == NULL ||
      (m->grads = alloc_or_fail(m, n * sizeof(float), err)) == NULL ||
      (m->acts = alloc_or_fail(m, acts_total * sizeof(float), err)) == NULL ||
      (m->grad_bufs = alloc_or_fail(m, 2 * grad_buf * sizeof(float), err)) == NULL ||
      (m->labels = alloc_or_fail(m, (size_t)max_batch * sizeof(int32_t), err)) == NULL) {
    goto fail;
  }
  if ((m->host_inputs = be->ops->host_alloc(
           be, (size_t)max_batch * (size_t)desc->sizes[0] * sizeof(float), err)) == NULL ||
      (m->host_labels = be->ops->host_alloc(be, (size_t)max_batch * sizeof(int32_t), err)) ==
          NULL) {
    goto fail;
  }
  float *init = malloc(n * sizeof(float));
  if (init == NULL) {
    ps_error_set(err, PS_ERR_NO_MEMORY, "mlp: out of host memory for %zu initial values", n);
    goto fail;
  }
  model_init_params(&m->layout, seed, 0, n, init);
  ps_err rc = mlp_set_params(m, init, err);
  free(init);
  if (rc != PS_ERR_OK) goto fail;
  *out = m;
  return PS_ERR_OK;
fail:
  mlp_destroy(m);
  return err->code;
}

void mlp_destroy(mlp *m) {
  if (m == NULL) return;
  backend *be = m->be;
  be->ops->free(be, m->params);
  be->ops->free(be, m->grads);
  be->ops->free(be, m->opt_state);
  be->ops->free(be, m->acts);
  be->ops->free(be, m->grad_bufs);
  be->ops->free(be, m->dinput);
  be->ops->free(be, m->labels);
  if (m->host_inputs != NULL) be->ops->host_free(be, m->host_inputs);
  if (m->host_labels != NULL) be->ops->host_free(be, m->host_labels);
  tensor_layout_free(&m->layout);
  free(m);
}

static ps_err check_batch(const mlp *m, int batch, ps_error *err) {
  if (batch < 1 || batch > m->max_batch) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "mlp: batch %d is outside 1..%d", batch,
                        m->max_batch);
  }
  return PS_ERR_OK;
}

ps_err mlp_load_inputs(mlp *m, int batch, ps_error *err) {
  PS_TRY(check_batch(m, batch, err));
  return m->be->ops->upload(m->be, activation(m, 0), m->host_inputs,
                            (size_t)batch * (size_t)m->desc.sizes[0] * sizeof(float), err);
}

ps_err mlp_load_batch(mlp *m, int batch, ps_error *err) {
  PS_TRY(mlp_load_inputs(m, batch, err));
  return m->be->ops->upload(m->be, m->labels, m->host_labels, (size_t)batch * sizeof(int32_t),
                            err);
}

ps_err mlp_forward_logits(mlp *m, int batch, ps_error *err) {
  const backend_ops *ops = m->be->ops;
  const int layers = m->desc.num_layers;
  for (int l = 1; l <= layers; l++) {
    int in = m->desc.sizes[l - 1], out = m->desc.sizes[l];
    /* Y (B, out) = X (B, in) * W^T, W stored (out, in). */
    gemm_call call = gemm_row_major(false, true, batch, out, in, 1.0f, activation(m, l - 1), in,
                                    param(m, m->params, l, 0), in, 0.0f, activation(m, l), out);
    PS_TRY(ops->gemm(m->be, &call, err));
    PS_TRY(ops->bias_act(m->be, activation(m, l), param(m, m->params, l, 1), batch, out, l < layers,
                      err));
  }
  return PS_ERR_OK;
}

ps_err mlp_get_logits(mlp *m, int batch, float *host, ps_error *err) {
  PS_TRY(check_batch(m, batch, err));
  const int layers = m->desc.num_layers;
  return m->be->ops->download(m->be, host, activation(m, layers),
                              (size_t)batch * (size_t)m->desc.sizes[layers] * sizeof(float), err);
}

ps_err mlp_forward(mlp *m, int batch, int want_grad, double *loss_sum, long *correct,
                   ps_error *err) {
  PS_TRY(mlp_forward_logits(m, batch, err));
  const int layers = m->desc.num_layers;
  /* The loss is the batch mean, so each row's gradient is scaled by 1/B. */
  float *dlogits = want_grad ? m->grad_bufs : NULL;
  return m->be->ops->softmax_xent(m->be, activation(m, layers), m->labels, batch,
                                  m->desc.sizes[layers], 1.0f / (float)batch, dlogits, loss_sum,
                                  correct, err);
}

/* Backward from the output gradient in grad_bufs; with dinput (backend
 * memory, (B, sizes[0])) also the first layer's input gradient. */
static ps_err backward_layers(mlp *m, int batch, float *dinput, ps_error *err) {
  const backend_ops *ops = m->be->ops;
  const int layers = m->desc.num_layers;
  size_t buf_floats = (size_t)m->max_batch * (size_t)m->max_width;
  float *dy = m->grad_bufs; /* holds dlogits */
  float *dx = m->grad_bufs + buf_floats;
  for (int l = layers; l >= 1; l--) {
    int in = m->desc.sizes[l - 1], out = m->desc.sizes[l];
    PS_TRY(ops->act_bias_backward(m->be, dy, activation(m, l), param(m, m->grads, l, 1), batch, out,
                               l < layers, err));
    /* dW (out, in) = dY^T (out, B) * X (B, in). */
    gemm_call dw = gemm_row_major(true, false, out, in, batch, 1.0f, dy, out, activation(m, l - 1),
                                  in, 0.0f, param(m, m->grads, l, 0), in);
    PS_TRY(ops->gemm(m->be, &dw, err));
    /* The layer's gradients are final: its push may start (dX only reads W). */
    if (m->grads_ready != NULL && m->be->host_memory) {
      PS_TRY(m->grads_ready(m->grads_ready_ctx, l, err));
    }
    float *target = l > 1 ? dx : dinput;
    if (target != NULL) {
      /* dX (B, in) = dY (B, out) * W (out, in). */
      gemm_call dxc = gemm_row_major(false, false, batch, in, out, 1.0f, dy, out,
                                     param(m, m->params, l, 0), in, 0.0f, target, in);
      PS_TRY(ops->gemm(m->be, &dxc, err));
      float *t = dy;
      dy = dx;
      dx = t;
    }
  }
  return PS_ERR_OK;
}

ps_err mlp_backward(mlp *m, int batch, ps_error *err) { return backward_layers(m, batch, NULL, err); }

/* Backward from the caller's output gradient; with want_dinput also the
 * input gradient, into m->dinput (backend memory). */
static ps_err backward_from(mlp *m, int batch, const float *host_dlogits, int want_dinput,
                            ps_error *err) {
  PS_TRY(check_batch(m, batch, err));
  const backend_ops *ops = m->be->ops;
  const size_t outs = (size_t)batch * (size_t)m->desc.sizes[m->desc.num_layers];
  PS_TRY(ops->upload(m->be, m->grad_bufs, host_dlogits, outs * sizeof(float), err));
  if (want_dinput && m->dinput == NULL) {
    m->dinput = ops->alloc(m->be, (size_t)m->max_batch * (size_t)m->desc.sizes[0] * sizeof(float),
                           err);
    if (m->dinput == NULL) return err->code;
  }
  return backward_layers(m, batch, want_dinput ? m->dinput : NULL, err);
}

ps_err mlp_backward_from(mlp *m, int batch, const float *host_dlogits, float *host_dinputs,
                         ps_error *err) {
  PS_TRY(backward_from(m, batch, host_dlogits, host_dinputs != NULL, err));
  if (host_dinputs == NULL) return PS_ERR_OK;
  const size_t ins = (size_t)batch * (size_t)m->desc.sizes[0];
  return m->be->ops->download(m->be, host_dinputs, m->dinput, ins * sizeof(float), err);
}

float *mlp_direct_inputs(mlp *m) { return m->be->host_memory ? activation(m, 0) : NULL; }

ps_err mlp_backward_from_direct(mlp *m, int batch, const float *host_dlogits,
                                const float **dinputs, ps_error *err) {
  *dinputs = NULL;
  if (!m->be->host_memory) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "mlp: backend %s keeps the input gradient in device memory", m->be->name);
  }
  PS_TRY(backward_from(m, batch, host_dlogits, 1, err));
  *dinputs = m->dinput;
  return PS_ERR_OK;
}

static ps_err ensure_state(mlp *m, ps_error *err);

/* One optimizer call per run of consecutive trainable tensors (a single
 * call over everything when all train); a non-trainable run takes its
 * gradient as a change (model.h). */
ps_err mlp_apply_optimizer(mlp *m, const optimizer_config *cfg, long step, ps_error *err) {
  const tensor_layout *lay = &m->layout;
  size_t n = lay->total;
  int states = optimizer_state_per_param(cfg->kind);
  if (states > 0 && ensure_state(m, err) != PS_ERR_OK) return err->code;
  float *s1 = states >= 1 ? m->opt_state : NULL;
  float *s2 = states >= 2 ? m->opt_state + n : NULL;
  for (int t = 0; t < lay->count;) {
    if (!lay->tensors[t].trainable) {
      const tensor_info *info = &lay->tensors[t++];
      PS_TRY(m->be->ops->add(m->be, m->params + info->offset, m->params + info->offset,
                             m->grads + info->offset, 1.0f, info->count, err));
      continue;
    }
    size_t at = lay->tensors[t].offset, len = 0;
    while (t < lay->count && lay->tensors[t].trainable) len += lay->tensors[t++].count;
    PS_TRY(m->be->ops->optimizer_step(m->be, cfg, step, m->params + at, m->grads + at,
                                      s1 != NULL ? s1 + at : NULL, s2 != NULL ? s2 + at : NULL,
                                      len, err));
  }
  return PS_ERR_OK;
}

ps_err mlp_get_params(mlp *m, float *host, ps_error *err) {
  return m->be->ops->download(m->be, host, m->params, m->layout.total * sizeof(float), err);
}

ps_err mlp_set_params(mlp *m, const float *host, ps_error *err) {
  return m->be->ops->upload(m->be, m->params, host, m->layout.total * sizeof(float), err);
}

ps_err mlp_get_grads(mlp *m, float *host, ps_error *err) {
  return m->be->ops->download(m->be, host, m->grads, m->layout.total * sizeof(float), err);
}

ps_err mlp_set_grads(mlp *m, const float *host, ps_error *err) {
  return m->be->ops->upload(m->be, m->grads, host, m->layout.total * sizeof(float), err);
}

/* Allocates the optimizer state (zeroed), once. */
static ps_err ensure_state(mlp *m, ps_error *err) {
  if (m->opt_state == NULL) {
    m->opt_state = m->be->ops->alloc(m->be, 2 * m->layout.total * sizeof(float), err);
    if (m->opt_state == NULL) return err->code;
  }
  return PS_ERR_OK;
}

ps_err mlp_get_state(mlp *m, float *host, ps_error *err) {
  if (ensure_state(m, err) != PS_ERR_OK) return err->code;
  return m->be->ops->download(m->be, host, m->opt_state, 2 * m->layout.total * sizeof(float), err);
}

ps_err mlp_set_state(mlp *m, const float *host, ps_error *err) {
  if (ensure_state(m, err) != PS_ERR_OK) return err->code;
  return m->be->ops->upload(m->be, m->opt_state, host, 2 * m->layout.total * sizeof(float), err);
}
