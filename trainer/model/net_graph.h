/* A network's layers (common/net.h) compiled into the nodes the trainer
 * runs: each node reads one or two activations and writes one, with its
 * shapes and its parameters' place in the layout. Activation 0 is the
 * input; the last node's output is the logits. Flatten and the block
 * markers become no nodes: flatten only renames a shape, a block's end
 * becomes the add of its two paths. */
#ifndef PSTRAIN_TRAINER_MODEL_NET_GRAPH_H
#define PSTRAIN_TRAINER_MODEL_NET_GRAPH_H

#include <stddef.h>

#include "common/error.h"
#include "common/net.h"
#include "common/tensor.h"
#include "trainer/backend/layer_shapes.h"

typedef enum { NODE_CONV, NODE_BN, NODE_RELU, NODE_MAXPOOL, NODE_AVGPOOL, NODE_FC, NODE_ADD } node_kind;

typedef struct net_node {
  node_kind kind;
  int in, in2, out;   /* activation indices; in2: the add's second input, else -1 */
  int tensor;         /* first layout tensor (conv/fc weight, bn weight); -1: none */
  int has_bias;       /* conv: a bias tensor follows the weight */
  conv_shape conv;    /* n set per batch */
  pool_shape pool;    /* n set per batch */
  int c, hw;          /* bn, avgpool: channels and pixels per channel */
  int fc_in, fc_out;  /* fc */
  int bn_slot;        /* bn: which of the graph's batch-norm layers (0..) */
} net_node;

typedef struct net_graph {
  int node_count;
  net_node nodes[NET_MAX_LAYERS];
  int act_count;
  size_t act_size[NET_MAX_LAYERS + 1]; /* floats per example of each activation */
  int bn_count;
  int classes;
} net_graph;

/* Compiles net (its input shape known) over layout (net_build_layout's). */
ps_err net_graph_build(net_graph *g, const net_desc *net, const tensor_layout *layout,
                       ps_error *err);

#endif
