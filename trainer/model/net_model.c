/* A convolutional network (--model lenet|resnet18|resnet20, --model-file)
 * as a model: net_graph.h's nodes run on the compute backend's layer ops,
 * softmax cross-entropy on the logits, no sparse tables.
 *
 * Memory, all in the backend's: the parameters and gradients (layout
 * order), the optimizer state, each activation and its gradient for a
 * training batch (evaluation goes through in chunks of it), batch norm's
 * saved statistics, a scratch buffer.
 *
 * Batch norm's running statistics are non-trainable parameters. A training
 * forward pass of the statistics' owner writes their change into the
 * gradients (new - old); others write zeros; the optimizer step (and every
 * pserver mode) adds the change instead of stepping, so every replica ends
 * with the owner's statistics (model.h). */
#include <stdlib.h>
#include <string.h>

#include "trainer/model/model.h"
#include "trainer/model/net_graph.h"

#define BN_MOMENTUM 0.1f /* PyTorch's defaults */
#define BN_EPS 1e-5f

typedef struct net_model {
  model base;
  net_graph g;
  float *params, *grads, *opt_state;
  float *acts[NET_MAX_LAYERS + 1], *dacts[NET_MAX_LAYERS + 1];
  int written[NET_MAX_LAYERS + 1]; /* backward: dacts[i] holds a value */
  float **save;                     /* per bn node: mean then invstd, (max_batch, c) each */
  float *scratch;                   /* the largest activation */
  float *zeros;                     /* the widest bn's 2 c zeros */
  int32_t *labels_dev;
  float *grouped;                   /* host: a batch reordered into its bn groups */
  int32_t *grouped_labels;
  int batch;    /* of the last forward */
  int capacity; /* examples the activations hold (0: none yet) */
} net_model;

/* An evaluation batch larger than the activations goes through in chunks of
 * them; the activations grow to a training batch. */
#define NET_EVAL_CHUNK 256

#define OPS(nm) ((nm)->base.be->ops)
#define BE(nm) ((nm)->base.be)

static float *param(net_model *nm, int tensor) {
  return nm->params + nm->base.layout.tensors[tensor].offset;
}
static float *grad(net_model *nm, int tensor) {
  return nm->grads + nm->base.layout.tensors[tensor].offset;
}

/* --- forward ---------------------------------------------------------------- */

/* The batch's bn groups: G groups of bn_group examples when that divides the
 * batch into more than one, else 1. */
static int bn_groups(const net_model *nm, int n) {
  int b = nm->base.bn_group;
  return b > 0 && n % b == 0 && n / b > 1 ? n / b : 1;
}

/* Example i = j G + r of the batch goes to place r B + j: group r is then
 * contiguous, in the order trainer r of a sync job reads it. */
static void group_batch(net_model *nm, const float *in, const int32_t *labels, int n, int groups) {
  size_t width = nm->g.act_size[0];
  int per = n / groups;
  for (int i = 0; i < n; i++) {
    int r = i % groups, j = i / groups, to = r * per + j;
    memcpy(nm->grouped + (size_t)to * width, in + (size_t)i * width, width * sizeof(float));
    nm->grouped_labels[to] = labels[i];
  }
}

/* Training batch norm, group by group; the owner's first group moves the
 * running statistics (kept as their change in the gradients). */
static ps_err bn_train(net_model *nm, const net_node *node, int n, int groups, ps_error *err) {
  const size_t per = (size_t)(n / groups) * node->c * node->hw;
  float *gamma = param(nm, node->tensor), *beta = param(nm, node->tensor + 1);
  float *running = grad(nm, node->tensor + 2); /* mean then var, adjacent */
  const float *old = param(nm, node->tensor + 2);
  float *save = nm->save[node->bn_slot];
  const size_t c = (size_t)node->c;
  if (nm->base.stats_owner) {
    PS_TRY(OPS(nm)->copy(BE(nm), running, old, 2 * c, err));
  }
  for (int k = 0; k < groups; k++) {
    bn_shape s = {n / groups, node->c, node->hw, BN_EPS};
    int moves = k == 0 && nm->base.stats_owner;
    PS_TRY(OPS(nm)->bn_forward_train(
        BE(nm), &s, nm->acts[node->in] + k * per, gamma, beta, nm->acts[node->out] + k * per,
        save + 2 * c * k, save + 2 * c * k + c, moves ? running : NULL, moves ? running + c : NULL,
        BN_MOMENTUM, err));
  }
  if (nm->base.stats_owner) return OPS(nm)->add(BE(nm), running, running, old, -1.0f, 2 * c, err);
  return OPS(nm)->copy(BE(nm), running, nm->zeros, 2 * c, err);
}

static ps_err fc_forward(net_model *nm, const net_node *node, int n, ps_error *err) {
  const float *x = nm->acts[node->in], *w = param(nm, node->tensor);
  float *y = nm->acts[node->out];
  gemm_call call =
      gemm_row_major(false, true, n, node->fc_out, node->fc_in, 1.0f, x, node->fc_in, w,
                     node->fc_in, 0.0f, y, node->fc_out);
  PS_TRY(OPS(nm)->gemm(BE(nm), &call, err));
  return OPS(nm)->bias_act(BE(nm), y, param(nm, node->tensor + 1), n, node->fc_out, 0, err);
}

static ps_err node_forward(net_model *nm, const net_node *node, int n, int train, int groups,
                           ps_error *err) {
  const float *x = nm->acts[node->in];
  float *y = nm->acts[node->out];
  switch (node->kind) {
    case NODE_CONV: {
      conv_shape s = node->conv;
      s.n = n;
      return OPS(nm)->conv_forward(BE(nm), &s, x, param(nm, node->tensor),
                                   node->has_bias ? param(nm, node->tensor + 1) : NULL, y, err);
    }
    case NODE_BN: {
      if (train) return bn_train(nm, node, n, groups, err);
      bn_shape s = {n, node->c, node->hw, BN_EPS};
      return OPS(nm)->bn_forward_infer(BE(nm), &s, x, param(nm, node->tensor),
                                       param(nm, node->tensor + 1), param(nm, node->tensor + 2),
                                       param(nm, node->tensor + 3), y, err);
    }
    case NODE_RELU:
      return OPS(nm)->relu_forward(BE(nm), y, x, (size_t)n * nm->g.act_size[node->out], err);
    case NODE_MAXPOOL: {
      pool_shape s = node->pool;
      s.n = n;
      return OPS(nm)->maxpool_forward(BE(nm), &s, x, y, err);
    }
    case NODE_AVGPOOL:
      return OPS(nm)->avgpool_forward(BE(nm), n, node->c, node->hw, x, y, err);
    case NODE_FC:
      return fc_forward(nm, node, n, err);
    case NODE_ADD:
      return OPS(nm)->add(BE(nm), y, x, nm->acts[node->in2], 1.0f,
                          (size_t)n * nm->g.act_size[node->out], err);
  }
  return PS_ERR_OK;
}

static ps_err ensure_capacity(net_model *nm, int n, ps_error *err);

/* Examples [first, first + n) of the batch into the backend: the input
 * activation is the host buffer itself on host-memory backends. */
static ps_err load_chunk(net_model *nm, const float *inputs, const int32_t *labels, int first,
                         int n, ps_error *err) {
  const size_t width = nm->g.act_size[0];
  inputs += (size_t)first * width;
  labels += first;
  if (BE(nm)->host_memory) {
    nm->acts[0] = (float *)inputs;
    nm->labels_dev = (int32_t *)labels;
    return PS_ERR_OK;
  }
  PS_TRY(OPS(nm)->upload(BE(nm), nm->acts[0], inputs, (size_t)n * width * sizeof(float), err));
  return OPS(nm)->upload(BE(nm), nm->labels_dev, labels, (size_t)n * sizeof(int32_t), err);
}

static ps_err run_chunk(net_model *nm, int n, int train, int groups, model_outputs *out,
                        ps_error *err) {
  for (int i = 0; i < nm->g.node_count; i++) {
    PS_TRY(node_forward(nm, &nm->g.nodes[i], n, train, groups, err));
  }
  int logits = nm->g.nodes[nm->g.node_count - 1].out;
  return OPS(nm)->softmax_xent(BE(nm), nm->acts[logits], nm->labels_dev, n, nm->g.classes,
                               1.0f / (float)n, train ? nm->dacts[logits] : NULL,
                               &out->loss_sum, &out->correct, err);
}

static ps_err net_forward(model *m, const model_batch *b, int want_grad, model_outputs *out,
                          ps_error *err) {
  net_model *nm = (net_model *)m;
  if (b->size < 1 || b->size > m->max_batch) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "network %s: batch %d is outside 1..%d",
                        m->desc.net.name, b->size, m->max_batch);
  }
  if (b->inputs == NULL || b->labels == NULL) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "network %s: batch without %s",
                        m->desc.net.name, b->inputs == NULL ? "inputs" : "labels");
  }
  int n = b->size;
  nm->batch = 0;
  if (!want_grad) {
    int chunk = nm->capacity > 0 ? nm->capacity : n < NET_EVAL_CHUNK ? n : NET_EVAL_CHUNK;
    PS_TRY(ensure_capacity(nm, chunk, err));
    for (int first = 0; first < n; first += nm->capacity) {
      int len = n - first < nm->capacity ? n - first : nm->capacity;
      PS_TRY(load_chunk(nm, b->inputs, b->labels, first, len, err));
      PS_TRY(run_chunk(nm, len, 0, 1, out, err));
    }
    return PS_ERR_OK;
  }
  PS_TRY(ensure_capacity(nm, n, err));
  int groups = bn_groups(nm, n);
  const float *inputs = b->inputs;
  const int32_t *labels = b->labels;
  if (groups > 1) {
    group_batch(nm, inputs, labels, n, groups);
    inputs = nm->grouped;
    labels = nm->grouped_labels;
  }
  PS_TRY(load_chunk(nm, inputs, labels, 0, n, err));
  PS_TRY(run_chunk(nm, n, 1, groups, out, err));
  nm->batch = n;
  return PS_ERR_OK;
}

/* --- backward --------------------------------------------------------------- */

/* Where a node writes its input's gradient: the gradient itself the first
 * time, the scratch buffer (added after) when another path wrote it. */
static float *dx_target(net_model *nm, int act) {
  if (act == 0) return NULL; /* nothing wants the images' gradient */
  return nm->written[act] ? nm->scratch : nm->dacts[act];
}

static ps_err dx_done(net_model *nm, int act, int n, ps_error *err) {
  if (act == 0) return PS_ERR_OK;
  if (nm->written[act]) {
    PS_TRY(OPS(nm)->add(BE(nm), nm->dacts[act], nm->dacts[act], nm->scratch, 1.0f,
                        (size_t)n * nm->g.act_size[act], err));
  }
  nm->written[act] = 1;
  return PS_ERR_OK;
}

static ps_err bn_backward(net_model *nm, const net_node *node, int n, float *dx, ps_error *err) {
  int groups = bn_groups(nm, n);
  const size_t per = (size_t)(n / groups) * node->c * node->hw, c = (size_t)node->c;
  const float *save = nm->save[node->bn_slot];
  for (int k = 0; k < groups; k++) {
    bn_shape s = {n / groups, node->c, node->hw, BN_EPS};
    PS_TRY(OPS(nm)->bn_backward(BE(nm), &s, nm->acts[node->in] + k * per,
                                nm->dacts[node->out] + k * per, param(nm, node->tensor),
                                save + 2 * c * k, save + 2 * c * k + c, dx + k * per,
                                grad(nm, node->tensor), grad(nm, node->tensor + 1), k > 0, err));
  }
  return PS_ERR_OK;
}

static ps_err fc_backward(net_model *nm, const net_node *node, int n, float *dx, ps_error *err) {
  const float *dy = nm->dacts[node->out], *x = nm->acts[node->in];
  gemm_call dw = gemm_row_major(true, false, node->fc_out, node->fc_in, n, 1.0f, dy, node->fc_out,
                                x, node->fc_in, 0.0f, grad(nm, node->tensor), node->fc_in);
  PS_TRY(OPS(nm)->gemm(BE(nm), &dw, err));
  PS_TRY(OPS(nm)->act_bias_backward(BE(nm), (float *)dy, dy, grad(nm, node->tensor + 1), n,
                                    node->fc_out, 0, err));
  if (dx == NULL) return PS_ERR_OK;
  gemm_call dxc = gemm_row_major(false, false, n, node->fc_in, node->fc_out, 1.0f, dy,
                                 node->fc_out, param(nm, node->tensor), node->fc_in, 0.0f, dx,
                                 node->fc_in);
  return OPS(nm)->gemm(BE(nm), &dxc, err);
}

/* The add's gradient goes to both inputs as it is. */
static ps_err add_backward(net_model *nm, const net_node *node, int n, ps_error *err) {
  const int inputs[2] = {node->in, node->in2};
  size_t count = (size_t)n * nm->g.act_size[node->out];
  for (int k = 0; k < 2; k++) {
    float *target = dx_target(nm, inputs[k]);
    if (target == NULL) continue;
    PS_TRY(OPS(nm)->copy(BE(nm), target, nm->dacts[node->out], count, err));
    PS_TRY(dx_done(nm, inputs[k], n, err));
  }
  return PS_ERR_OK;
}

static ps_err node_backward(net_model *nm, const net_node *node, int n, ps_error *err) {
  if (node->kind == NODE_ADD) return add_backward(nm, node, n, err);
  const float *x = nm->acts[node->in], *y = nm->acts[node->out], *dy = nm->dacts[node->out];
  float *dx = dx_target(nm, node->in);
  switch (node->kind) {
    case NODE_CONV: {
      conv_shape s = node->conv;
      s.n = n;
      PS_TRY(OPS(nm)->conv_backward(BE(nm), &s, x, param(nm, node->tensor), dy, dx,
                                    grad(nm, node->tensor),
                                    node->has_bias ? grad(nm, node->tensor + 1) : NULL, err));
      break;
    }
    case NODE_BN:
      if (dx == NULL) dx = nm->scratch; /* bn always computes dx */
      PS_TRY(bn_backward(nm, node, n, dx, err));
      break;
    case NODE_RELU:
      if (dx != NULL) {
        PS_TRY(OPS(nm)->relu_backward(BE(nm), dx, dy, y, (size_t)n * nm->g.act_size[node->out],
                                      err));
      }
      break;
    case NODE_MAXPOOL: {
      pool_shape s = node->pool;
      s.n = n;
      if (dx != NULL) PS_TRY(OPS(nm)->maxpool_backward(BE(nm), &s, x, y, dy, dx, err));
      break;
    }
    case NODE_AVGPOOL:
      if (dx != NULL) PS_TRY(OPS(nm)->avgpool_backward(BE(nm), n, node->c, node->hw, dy, dx, err));
      break;
    case NODE_FC:
      PS_TRY(fc_backward(nm, node, n, dx, err));
      break;
    case NODE_ADD:
      break;
  }
  return dx_done(nm, node->in, n, err);
}

static ps_err net_backward(model *m, const model_batch *b, float *const *row_grads,
                           ps_error *err) {
  (void)row_grads; /* no tables */
  net_model *nm = (net_model *)m;
  if (b->size != nm->batch) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "network %s: backward of a batch of %d after a forward of %d",
                        m->desc.net.name, b->size, nm->batch);
  }
  memset(nm->written, 0, sizeof nm->written);
  nm->written[nm->g.nodes[nm->g.node_count - 1].out] = 1; /* the loss's gradient */
  for (int i = nm->g.node_count - 1; i >= 0; i--) {
    PS_TRY(node_backward(nm, &nm->g.nodes[i], b->size, err));
  }
  return PS_ERR_OK;
}

/* --- optimizer, host copies ------------------------------------------------- */

static ps_err ensure_state(net_model *nm, ps_error *err) {
  if (nm->opt_state == NULL) {
    nm->opt_state = OPS(nm)->alloc(BE(nm), 2 * nm->base.layout.total * sizeof(float), err);
    if (nm->opt_state == NULL) return err->code;
  }
  return PS_ERR_OK;
}

/* The optimizer over each run of trainable tensors; a non-trainable run
 * takes its change as it is. */
static ps_err net_apply_optimizer(model *m, const optimizer_config *cfg, long step,
                                  ps_error *err) {
  net_model *nm = (net_model *)m;
  const tensor_layout *lay = &m->layout;
  size_t n = lay->total;
  int states = optimizer_state_per_param(cfg->kind);
  if (states > 0) PS_TRY(ensure_state(nm, err));
  float *s1 = states >= 1 ? nm->opt_state : NULL, *s2 = states >= 2 ? nm->opt_state + n : NULL;
  for (int t = 0; t < lay->count;) {
    int trains = lay->tensors[t].trainable;
    size_t at = lay->tensors[t].offset, len = 0;
    while (t < lay->count && lay->tensors[t].trainable == trains) len += lay->tensors[t++].count;
    if (!trains) {
      PS_TRY(OPS(nm)->add(BE(nm), nm->params + at, nm->params + at, nm->grads + at, 1.0f, len,
                          err));
      continue;
    }
    PS_TRY(OPS(nm)->optimizer_step(BE(nm), cfg, step, nm->params + at, nm->grads + at,
                                   s1 != NULL ? s1 + at : NULL, s2 != NULL ? s2 + at : NULL, len,
                                   err));
  }
  return PS_ERR_OK;
}

static ps_err copy_out(net_model *nm, float *host, const float *src, size_t n, ps_error *err) {
  return OPS(nm)->download(BE(nm), host, src, n * sizeof(float), err);
}
static ps_err copy_in(net_model *nm, float *dst, const float *host, size_t n, ps_error *err) {
  return OPS(nm)->upload(BE(nm), dst, host, n * sizeof(float), err);
}

static ps_err net_get_params(model *m, float *host, ps_error *err) {
  net_model *nm = (net_model *)m;
  return copy_out(nm, host, nm->params, m->layout.total, err);
}
static ps_err net_set_params(model *m, const float *host, ps_error *err) {
  net_model *nm = (net_model *)m;
  return copy_in(nm, nm->params, host, m->layout.total, err);
}
static ps_err net_get_grads(model *m, float *host, ps_error *err) {
  net_model *nm = (net_model *)m;
  return copy_out(nm, host, nm->grads, m->layout.total, err);
}
static ps_err net_set_grads(model *m, const float *host, ps_error *err) {
  net_model *nm = (net_model *)m;
  return copy_in(nm, nm->grads, host, m->layout.total, err);
}
static ps_err net_get_state(model *m, float *host, ps_error *err) {
  net_model *nm = (net_model *)m;
  PS_TRY(ensure_state(nm, err));
  return copy_out(nm, host, nm->opt_state, 2 * m->layout.total, err);
}
static ps_err net_set_state(model *m, const float *host, ps_error *err) {
  net_model *nm = (net_model *)m;
  PS_TRY(ensure_state(nm, err));
  return copy_in(nm, nm->opt_state, host, 2 * m->layout.total, err);
}

/* --- create, destroy -------------------------------------------------------- */

/* The buffers whose size follows the capacity. */
static void free_activations(net_model *nm) {
  model *m = &nm->base;
  const backend_ops *ops = m->be->ops;
  for (int i = 0; i < nm->g.act_count; i++) {
    if (i > 0 || !m->be->host_memory) ops->free(m->be, nm->acts[i]);
    ops->free(m->be, nm->dacts[i]);
    nm->acts[i] = nm->dacts[i] = NULL;
  }
  for (int i = 0; nm->save != NULL && i < nm->g.bn_count; i++) {
    ops->free(m->be, nm->save[i]);
    nm->save[i] = NULL;
  }
  ops->free(m->be, nm->scratch);
  nm->scratch = NULL;
  if (!m->be->host_memory) ops->free(m->be, nm->labels_dev);
  nm->labels_dev = NULL;
  nm->capacity = 0;
}

static void net_destroy(model *m) {
  net_model *nm = (net_model *)m;
  free_activations(nm);
  free(nm->save);
  float *owned[] = {nm->params, nm->grads, nm->opt_state, nm->zeros};
  for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) m->be->ops->free(m->be, owned[i]);
  free(m->inputs);
  free(m->labels);
  free(nm->grouped);
  free(nm->grouped_labels);
  tensor_layout_free(&m->layout);
  free(nm);
}

static float *alloc_floats(net_model *nm, size_t n, ps_error *err) {
  return OPS(nm)->alloc(BE(nm), (n > 0 ? n : 1) * sizeof(float), err);
}

/* Activations, their gradients, batch norm's saved statistics and the
 * scratch buffer for n examples (grown, never shrunk). */
static ps_err ensure_capacity(net_model *nm, int n, ps_error *err) {
  if (n <= nm->capacity) return PS_ERR_OK;
  model *m = &nm->base;
  free_activations(nm);
  const size_t batch = (size_t)n;
  size_t largest = 0;
  for (int i = 0; i < nm->g.act_count; i++) {
    size_t count = batch * nm->g.act_size[i];
    if (count > largest) largest = count;
    if (i > 0 || !m->be->host_memory) {
      if ((nm->acts[i] = alloc_floats(nm, count, err)) == NULL) return err->code;
    }
    if ((nm->dacts[i] = alloc_floats(nm, count, err)) == NULL) return err->code;
  }
  for (int i = 0; i < nm->g.node_count; i++) {
    const net_node *node = &nm->g.nodes[i];
    if (node->kind != NODE_BN) continue;
    nm->save[node->bn_slot] = alloc_floats(nm, 2 * batch * (size_t)node->c, err);
    if (nm->save[node->bn_slot] == NULL) return err->code;
  }
  if (!m->be->host_memory &&
      (nm->labels_dev = OPS(nm)->alloc(BE(nm), batch * sizeof(int32_t), err)) == NULL) {
    return err->code;
  }
  if ((nm->scratch = alloc_floats(nm, largest, err)) == NULL) return err->code;
  nm->capacity = n;
  return PS_ERR_OK;
}

/* What does not depend on the batch: host buffers, parameters, gradients. */
static ps_err alloc_buffers(net_model *nm, ps_error *err) {
  model *m = &nm->base;
  const size_t batch = (size_t)m->max_batch;
  size_t widest_bn = 1;
  m->inputs = calloc(batch * nm->g.act_size[0], sizeof(float));
  m->labels = calloc(batch, sizeof(int32_t));
  nm->grouped = calloc(batch * nm->g.act_size[0], sizeof(float));
  nm->grouped_labels = calloc(batch, sizeof(int32_t));
  nm->save = calloc((size_t)nm->g.bn_count + 1, sizeof *nm->save);
  if (m->inputs == NULL || m->labels == NULL || nm->grouped == NULL ||
      nm->grouped_labels == NULL || nm->save == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "network %s: out of memory", m->desc.net.name);
  }
  for (int i = 0; i < nm->g.node_count; i++) {
    if (nm->g.nodes[i].kind == NODE_BN && (size_t)nm->g.nodes[i].c > widest_bn) {
      widest_bn = (size_t)nm->g.nodes[i].c;
    }
  }
  if ((nm->zeros = alloc_floats(nm, 2 * widest_bn, err)) == NULL ||
      (nm->params = alloc_floats(nm, m->layout.total, err)) == NULL ||
      (nm->grads = alloc_floats(nm, m->layout.total, err)) == NULL) {
    return err->code;
  }
  return PS_ERR_OK;
}

static ps_err net_create(model **out, const model_desc *desc, backend *be, int max_batch,
                         uint64_t seed, ps_error *err);

const model_ops model_net = {
    .name = "net",
    .create = net_create,
    .destroy = net_destroy,
    .forward = net_forward,
    .backward = net_backward,
    .apply_optimizer = net_apply_optimizer,
    .get_params = net_get_params,
    .set_params = net_set_params,
    .get_grads = net_get_grads,
    .set_grads = net_set_grads,
    .get_state = net_get_state,
    .set_state = net_set_state,
};

static ps_err net_create(model **out, const model_desc *desc, backend *be, int max_batch,
                         uint64_t seed, ps_error *err) {
  if (be->ops->conv_forward == NULL) {
    return ps_error_set(err, PS_ERR_UNSUPPORTED, "network %s: the %s backend has no convolutions",
                        desc->net.name, be->name);
  }
  net_model *nm = calloc(1, sizeof *nm);
  if (nm == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "network: out of memory");
  model *m = &nm->base;
  m->ops = &model_net;
  m->desc = *desc;
  m->be = be;
  m->max_batch = max_batch;
  m->stats_owner = 1;
  tensor_layout_init(&m->layout);
  if (model_build_layout(desc, &m->layout, err) != PS_ERR_OK ||
      net_graph_build(&nm->g, &desc->net, &m->layout, err) != PS_ERR_OK ||
      alloc_buffers(nm, err) != PS_ERR_OK) {
    net_destroy(m);
    return err->code;
  }
  m->classes = nm->g.classes;
  float *init = malloc((m->layout.total > 0 ? m->layout.total : 1) * sizeof *init);
  if (init == NULL) {
    net_destroy(m);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "network %s: out of memory", desc->net.name);
  }
  model_init_params(&m->layout, seed, 0, m->layout.total, init);
  ps_err rc = net_set_params(m, init, err);
  free(init);
  if (rc != PS_ERR_OK) {
    net_destroy(m);
    return rc;
  }
  if (be->host_memory) {
    m->params_host = nm->params;
    m->grads_host = nm->grads;
  } else {
    m->grads_device = nm->grads;
  }
  *out = m;
  return PS_ERR_OK;
}
