/* Compiling a network's layers into nodes over activations. */
#include "trainer/model/net_graph.h"

#include <string.h>

/* The walk's state: the current activation and its shape, the open block. */
typedef struct walk {
  net_graph *g;
  int cur;
  net_shape shape;
  int block_in, body_out;
  net_shape block_shape, body_shape;
  int had_shortcut;
  int tensor; /* the next layout tensor */
} walk;

static size_t shape_floats(net_shape s) {
  return (size_t)s.c * (size_t)(s.h ? s.h : 1) * (size_t)(s.w ? s.w : 1);
}

static net_node *add_node(walk *w, node_kind kind, net_shape out, ps_error *err) {
  net_graph *g = w->g;
  if (g->node_count == NET_MAX_LAYERS || g->act_count == NET_MAX_LAYERS + 1) {
    ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "network: more than %d nodes", NET_MAX_LAYERS);
    return NULL;
  }
  net_node *n = &g->nodes[g->node_count++];
  memset(n, 0, sizeof *n);
  n->kind = kind;
  n->in = w->cur;
  n->in2 = -1;
  n->tensor = -1;
  n->out = g->act_count;
  g->act_size[g->act_count++] = shape_floats(out);
  w->cur = n->out;
  w->shape = out;
  return n;
}

static ps_err add_layer(walk *w, const net_layer *l, net_shape out, ps_error *err) {
  net_shape in = w->shape;
  net_node *n;
  switch (l->op) {
    case NET_CONV:
      if ((n = add_node(w, NODE_CONV, out, err)) == NULL) return err->code;
      n->conv = (conv_shape){0, in.c, in.h, in.w, l->out, l->kh, l->kw, l->stride, l->pad,
                             out.h, out.w};
      n->tensor = w->tensor;
      n->has_bias = l->bias;
      w->tensor += l->bias ? 2 : 1;
      return PS_ERR_OK;
    case NET_BN:
      if ((n = add_node(w, NODE_BN, out, err)) == NULL) return err->code;
      n->c = in.c;
      n->hw = (in.h ? in.h : 1) * (in.w ? in.w : 1);
      n->tensor = w->tensor;
      n->bn_slot = w->g->bn_count++;
      w->tensor += 4; /* weight, bias, running_mean, running_var */
      return PS_ERR_OK;
    case NET_RELU:
      return add_node(w, NODE_RELU, out, err) != NULL ? PS_ERR_OK : err->code;
    case NET_MAXPOOL:
      if ((n = add_node(w, NODE_MAXPOOL, out, err)) == NULL) return err->code;
      n->pool = (pool_shape){0, in.c, in.h, in.w, l->kh, l->kw, l->stride, l->pad, out.h, out.w};
      return PS_ERR_OK;
    case NET_AVGPOOL:
      if ((n = add_node(w, NODE_AVGPOOL, out, err)) == NULL) return err->code;
      n->c = in.c;
      n->hw = in.h * in.w;
      return PS_ERR_OK;
    case NET_FC:
      if ((n = add_node(w, NODE_FC, out, err)) == NULL) return err->code;
      n->fc_in = (int)shape_floats(in);
      n->fc_out = l->out;
      n->tensor = w->tensor;
      w->tensor += 2;
      return PS_ERR_OK;
    case NET_FLATTEN:
      w->shape = out; /* NCHW is already flat per example */
      return PS_ERR_OK;
    case NET_BLOCK:
      w->block_in = w->cur;
      w->block_shape = w->shape;
      w->had_shortcut = 0;
      return PS_ERR_OK;
    case NET_SHORTCUT:
      w->body_out = w->cur;
      w->body_shape = w->shape;
      w->cur = w->block_in;
      w->shape = w->block_shape;
      w->had_shortcut = 1;
      return PS_ERR_OK;
    case NET_END: {
      int body = w->had_shortcut ? w->body_out : w->cur;
      int shortcut = w->had_shortcut ? w->cur : w->block_in;
      if ((n = add_node(w, NODE_ADD, out, err)) == NULL) return err->code;
      n->in = body;
      n->in2 = shortcut;
      return PS_ERR_OK;
    }
  }
  return PS_ERR_OK;
}

ps_err net_graph_build(net_graph *g, const net_desc *net, const tensor_layout *layout,
                       ps_error *err) {
  net_shape shapes[NET_MAX_LAYERS];
  memset(g, 0, sizeof *g);
  if (net_check(net, shapes, err) != PS_ERR_OK) return err->code;
  walk w = {.g = g, .cur = 0, .shape = {net->c, net->h, net->w}};
  g->act_count = 1;
  g->act_size[0] = shape_floats(w.shape);
  for (int i = 0; i < net->count; i++) {
    if (add_layer(&w, &net->layers[i], shapes[i], err) != PS_ERR_OK) return err->code;
  }
  if (w.tensor != layout->count) {
    return ps_error_set(err, PS_ERR_INTERNAL, "network %s: %d tensors in the graph, %d in the layout",
                        net->name, w.tensor, layout->count);
  }
  g->classes = net_classes(net);
  return PS_ERR_OK;
}
