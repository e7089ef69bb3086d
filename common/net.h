/* Convolutional networks as text: one layer a line, residual blocks between
 * `block` and `end`. What every process of a job agrees on for a network,
 * like model.h's "mlp:..." for an MLP: parsed from a model file, from a
 * built-in name (lenet, resnet18, resnet20: the same text, written in
 * net.c) or from the canonical one-line form the job carries
 * ("net:name NAME|input 1x28x28|conv 20 5x5 stride 1 pad 2|..."), turned into
 * the parameter layout, checked shape by shape. The compute is the
 * trainer's (trainer/model/net_model.c).
 *
 * The lines (docs/models-and-data.md "Convolutional networks"):
 *   name NAME                      the network's name (letters, digits, - _)
 *   input CxHxW                    the images' shape (built-ins: the data's)
 *   conv OUT KxK [stride S] [pad P] [nobias]
 *   bn                             batch norm over the channels
 *   relu
 *   maxpool KxK [stride S] [pad P] stride defaults to K
 *   avgpool                        global average pooling: (C, H, W) to C
 *   flatten                        (C, H, W) to C*H*W
 *   fc OUT                         fully connected (flattens what it gets)
 *   block / shortcut / end         y = body(x) + shortcut(x); the lines
 *                                  between block and shortcut (or end) are
 *                                  the body, between shortcut and end the
 *                                  shortcut path (none: the identity)
 * A network ends with fc: its outputs are the classes' logits, trained
 * with softmax cross-entropy. '#' starts a comment. */
#ifndef PSTRAIN_COMMON_NET_H
#define PSTRAIN_COMMON_NET_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/tensor.h"

#define NET_MAX_LAYERS 160
#define NET_NAME_MAX 32
/* The canonical text of the largest network (one '|' per line). */
#define NET_TEXT_MAX 8192

typedef enum {
  NET_CONV,
  NET_BN,
  NET_RELU,
  NET_MAXPOOL,
  NET_AVGPOOL,
  NET_FLATTEN,
  NET_FC,
  NET_BLOCK,
  NET_SHORTCUT,
  NET_END,
} net_op;

typedef struct net_layer {
  net_op op;
  int out;          /* conv: output channels; fc: outputs */
  int kh, kw;       /* conv, maxpool */
  int stride, pad;  /* conv, maxpool */
  int bias;         /* conv: with a per-channel bias (no `nobias`) */
} net_layer;

typedef struct net_desc {
  char name[NET_NAME_MAX];
  int c, h, w; /* the input; 0 while a built-in waits for the data's shape */
  int count;
  net_layer layers[NET_MAX_LAYERS];
} net_desc;

/* The shape of a layer's output: (c, h, w), or flat (c outputs, h = w = 0). */
typedef struct net_shape {
  int c, h, w;
} net_shape;

/* Parses the text of a model file (lines separated by '\n') or the
 * canonical form's lines (separated by '|'); `source` names it in errors
 * ("model file F line 7: ..."). Checks every shape when the input is known
 * (net_check). */
ps_err net_parse_text(const char *text, char separator, const char *source, net_desc *net,
                      ps_error *err);

/* Reads and parses a model file. */
ps_err net_read_file(const char *path, net_desc *net, ps_error *err);

/* The built-in network `name` (lenet, resnet18, resnet20) over CxHxW
 * images; PS_ERR_INVALID_ARGUMENT when there is none. */
ps_err net_builtin(const char *name, int c, int h, int w, net_desc *net, ps_error *err);
/* The built-in names, for messages: "lenet, resnet18, resnet20". */
const char *net_builtin_names(void);
/* Whether `name` is a built-in network. */
int net_is_builtin(const char *name);
/* The text of built-in `name` over CxHxW images as a model file: what the
 * documentation shows. -1 when there is no such built-in or buf is short. */
int net_builtin_text(const char *name, int c, int h, int w, char *buf, size_t len);

/* Sets the input shape (a built-in's, or a model file's checked against
 * the data by the caller) and checks the network over it. */
ps_err net_set_input(net_desc *net, int c, int h, int w, ps_error *err);

/* Walks the layers over the input shape: every window fits, every block's
 * two paths end in the same shape, the network ends with fc. Fills
 * shapes[i] with layer i's output when shapes is not NULL. */
ps_err net_check(const net_desc *net, net_shape *shapes, ps_error *err);

/* The canonical one-line text: "name NAME|input CxHxW|conv 20 5x5 stride 1 pad 2|...". */
void net_format(const net_desc *net, char *buf, size_t len);

/* The classes (the last fc's outputs). */
int net_classes(const net_desc *net);

/* Appends the parameters in layer order: convN.weight (out, in, kh, kw)
 * uniform +-sqrt(6/fan_in), convN.bias (out) zeros; bnN.weight ones,
 * bnN.bias zeros, bnN.running_mean zeros and bnN.running_var ones (both
 * non-trainable); fcN.weight (out, in) +-sqrt(6/in), +-sqrt(3/in) for the
 * last, fcN.bias zeros. N counts each kind from 1. */
ps_err net_build_layout(const net_desc *net, tensor_layout *layout, ps_error *err);

#endif
