/* The model description every process agrees on: parsed from text such as
 * "mlp:784,256,128,10", "ctr:16:256,128" or "lr", turned into the dense
 * parameter layout (fc1.weight (out,in), fc1.bias (out), ..., then wide.bias
 * for the CTR models), hashed, and initialized deterministically from a
 * seed. The CTR models' sparse tables are sparse_table.h's. The compute
 * (forward, backward) is the trainer's, not here. */
#ifndef PSTRAIN_COMMON_MODEL_H
#define PSTRAIN_COMMON_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/criteo.h" /* its fields: what a CTR model's deep input is made of */
#include "common/error.h"
#include "common/net.h"
#include "common/tensor.h"

#define MODEL_MAX_LAYERS 16
#define MODEL_MAX_WIDTH 65536

#define MODEL_MAX_EMBED_DIM 1024

/* The shape of a model's parameters, which is all a pserver needs to know.
 * MLP: an image classifier. CTR: a wide table of one weight per feature key,
 * an embedding table of embed_dim per key and an MLP over the 26 embeddings
 * and 13 dense features (Wide&Deep, DeepFM). LR: the wide table alone.
 * NET: a convolutional network (net.h), its layers in `net`. */
typedef enum { MODEL_MLP, MODEL_CTR, MODEL_LR, MODEL_NET } model_kind;

#define MODEL_NAME_MAX 16
/* The longest canonical text (a network's; "net:" and its lines). */
#define MODEL_TEXT_MAX (NET_TEXT_MAX + 8)

typedef struct model_desc {
  char name[MODEL_NAME_MAX];          /* as in --model: "mlp", "ctr", "deepfm", "lr" */
  model_kind kind;
  int embed_dim;                      /* CTR: floats per embedding row; else 0 */
  int num_layers;                     /* fully connected layers (0 for LR) */
  int sizes[MODEL_MAX_LAYERS + 1];    /* sizes[0] inputs ... sizes[num_layers] outputs */
  net_desc net;                       /* NET: the layers ("net" is then the name) */
} model_desc;

/* Parses "mlp:IN,H1,...,OUT" (at least one layer), "NAME:DIM:H1,H2,..." for
 * a model of the CTR shape (ctr, deepfm: the MLP's input is 26 * DIM + 13,
 * its output one logit), "lr", a network's canonical "net:name N|input
 * CxHxW|..." or a built-in network's name (lenet, resnet18, resnet20: its
 * input shape 0 until model_set_input). The names are model.c's registry. */
ps_err model_parse(const char *text, model_desc *desc, ps_error *err);

/* Writes the canonical text form, e.g. "mlp:784,256,128,10" (a network:
 * "net:name lenet|input 1x28x28|...", or its name while its input is not
 * known). */
void model_format(const model_desc *desc, char *buf, size_t len);

/* Fills an initialized, empty layout with fcK.weight (out, in) and fcK.bias
 * (out) for K = 1..num_layers, in that order, then wide.bias (1) for the CTR
 * models. Each tensor gets its initialization rule: weights uniform in
 * +-sqrt(6/in) (He) before a ReLU and +-sqrt(3/in) for the output layer,
 * biases zeros. All are trainable. */
ps_err model_build_layout(const model_desc *desc, tensor_layout *layout, ps_error *err);

/* FNV-1a hash of the canonical text: equal models hash alike everywhere. */
uint64_t model_hash(const model_desc *desc);

/* Writes the initial values of the flat parameter range [begin, begin+count)
 * of the layout to out, each tensor's after its rule (tensor_info.init); a
 * uniform tensor draws from the seed's stream of its index. Any range gives
 * the same values as the whole, so each pserver can initialize only its
 * blocks. */
void model_init_params(const tensor_layout *layout, uint64_t seed, size_t begin, size_t count,
                       float *out);

/* Reads a model file (net.h's lines) into a network's desc. */
ps_err model_read_file(const char *path, model_desc *desc, ps_error *err);

/* A network whose input shape waits for the data (a built-in name): gives
 * it CxHxW images; a network with a shape checks it is CxHxW. */
ps_err model_set_input(model_desc *desc, int c, int h, int w, ps_error *err);

/* Whether the model reads Criteo examples through sparse tables. */
static inline int model_is_ctr(const model_desc *desc) {
  return desc->kind == MODEL_CTR || desc->kind == MODEL_LR;
}

/* An image classifier's input floats and classes. */
int model_input_width(const model_desc *desc);
int model_classes(const model_desc *desc);

#endif
