/* Model description parsing, parameter layout, hash and initialization. */
#include "common/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/rng.h"

/* Parses "A,B,C" from p into sizes[*n...]; text is the whole model for messages. */
static ps_err parse_sizes(const char *text, const char *p, model_desc *desc, int *n,
                          ps_error *err) {
  for (;;) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno != 0) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': '%s' is not a layer size",
                          text, p);
    }
    if (v < 1 || v > MODEL_MAX_WIDTH) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': layer size %ld is outside 1..%d",
                          text, v, MODEL_MAX_WIDTH);
    }
    if (*n > MODEL_MAX_LAYERS) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': more than %d layers", text,
                          MODEL_MAX_LAYERS);
    }
    desc->sizes[(*n)++] = (int)v;
    if (*end == '\0') return PS_ERR_OK;
    if (*end != ',') {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': unexpected '%c'", text, *end);
    }
    p = end + 1;
  }
}

/* The models --model names, one line each: the name and the shape its
 * text describes (mlp: IN,H1,...,OUT; ctr: DIM:H1,H2,...; lr: nothing). */
static const struct {
  const char *name;
  model_kind kind;
  const char *example; /* for the message of a text that is none of them */
} registry[] = {
    {"mlp", MODEL_MLP, "mlp:784,256,128,10"},
    {"ctr", MODEL_CTR, "ctr:16:256,128"},
    {"deepfm", MODEL_CTR, "deepfm:16:256,128"},
    {"lr", MODEL_LR, "lr"},
};
#define REGISTRY_SIZE (sizeof registry / sizeof registry[0])

/* "NAME:DIM:H1,H2,...": the MLP maps 26 * DIM + 13 inputs through H1, H2, ... to one logit. */
static ps_err parse_ctr(const char *text, const char *p, model_desc *desc, ps_error *err) {
  char *end;
  errno = 0;
  long dim = strtol(p, &end, 10);
  if (end == p || errno != 0 || *end != ':') {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "model '%s': expected %s:DIM:H1,H2,... (e.g. %s:16:256,128)", text,
                        desc->name, desc->name);
  }
  if (dim < 1 || dim > MODEL_MAX_EMBED_DIM) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "model '%s': embedding dimension %ld is outside 1..%d", text, dim,
                        MODEL_MAX_EMBED_DIM);
  }
  desc->embed_dim = (int)dim;
  desc->sizes[0] = CRITEO_CAT_FIELDS * (int)dim + CRITEO_INT_FIELDS;
  int n = 1;
  if (parse_sizes(text, end + 1, desc, &n, err) != PS_ERR_OK) return err->code;
  if (n > MODEL_MAX_LAYERS) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': more than %d layers", text,
                        MODEL_MAX_LAYERS);
  }
  desc->sizes[n] = 1;
  desc->num_layers = n;
  return PS_ERR_OK;
}

static ps_err parse_mlp(const char *text, const char *p, model_desc *desc, ps_error *err) {
  int n = 0;
  if (parse_sizes(text, p, desc, &n, err) != PS_ERR_OK) return err->code;
  if (n < 2) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "model '%s': needs at least an input and an output size", text);
  }
  desc->num_layers = n - 1;
  return PS_ERR_OK;
}

/* "net:..." (the canonical text) or a built-in network's name. */
static int parse_net(const char *text, model_desc *desc, ps_error *err, ps_err *rc) {
  int canonical = strncmp(text, "net:", 4) == 0;
  if (!canonical && !net_is_builtin(text)) return 0;
  snprintf(desc->name, sizeof desc->name, "net");
  desc->kind = MODEL_NET;
  if (!canonical) {
    snprintf(desc->net.name, sizeof desc->net.name, "%s", text);
    *rc = PS_ERR_OK;
    return 1;
  }
  *rc = net_parse_text(text + 4, '|', "model net:", &desc->net, err);
  if (*rc == PS_ERR_OK && desc->net.c == 0) {
    *rc = ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model net:%s: no input line",
                       desc->net.name);
  }
  return 1;
}

ps_err model_parse(const char *text, model_desc *desc, ps_error *err) {
  memset(desc, 0, sizeof *desc);
  ps_err net_rc;
  if (parse_net(text, desc, err, &net_rc)) return net_rc;
  for (size_t i = 0; i < REGISTRY_SIZE; i++) {
    size_t len = strlen(registry[i].name);
    if (strncmp(text, registry[i].name, len) != 0) continue;
    const char *rest = text + len;
    int sized = registry[i].kind != MODEL_LR; /* lr takes no sizes */
    if (sized ? *rest != ':' : *rest != '\0') continue;
    snprintf(desc->name, sizeof desc->name, "%s", registry[i].name);
    desc->kind = registry[i].kind;
    if (desc->kind == MODEL_CTR) return parse_ctr(text, rest + 1, desc, err);
    if (desc->kind == MODEL_MLP) return parse_mlp(text, rest + 1, desc, err);
    return PS_ERR_OK;
  }
  char expected[256];
  size_t used = 0;
  for (size_t i = 0; i < REGISTRY_SIZE && used < sizeof expected; i++) {
    used += (size_t)snprintf(expected + used, sizeof expected - used, "%s%s",
                             i == 0 ? "" : i + 1 == REGISTRY_SIZE ? " or " : ", ",
                             registry[i].example);
  }
  return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': expected %s, or a network: %s",
                      text, expected, net_builtin_names());
}

ps_err model_read_file(const char *path, model_desc *desc, ps_error *err) {
  memset(desc, 0, sizeof *desc);
  snprintf(desc->name, sizeof desc->name, "net");
  desc->kind = MODEL_NET;
  return net_read_file(path, &desc->net, err);
}

ps_err model_set_input(model_desc *desc, int c, int h, int w, ps_error *err) {
  net_desc *net = &desc->net;
  if (net->c == 0) {
    return net_builtin(net->name, c, h, w, net, err);
  }
  if (net->c != c || net->h != h || net->w != w) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "network %s takes %dx%dx%d inputs but the images are %dx%dx%d", net->name,
                        net->c, net->h, net->w, c, h, w);
  }
  return PS_ERR_OK;
}

int model_input_width(const model_desc *desc) {
  if (desc->kind == MODEL_NET) return desc->net.c * desc->net.h * desc->net.w;
  return desc->sizes[0];
}

int model_classes(const model_desc *desc) {
  if (desc->kind == MODEL_NET) return net_classes(&desc->net);
  return desc->sizes[desc->num_layers];
}

void model_format(const model_desc *desc, char *buf, size_t len) {
  if (desc->kind == MODEL_NET) {
    if (desc->net.c == 0) {
      snprintf(buf, len, "%s", desc->net.name);
      return;
    }
    size_t used = (size_t)snprintf(buf, len, "net:");
    if (used < len) net_format(&desc->net, buf + used, len - used);
    return;
  }
  if (desc->kind == MODEL_LR) {
    snprintf(buf, len, "%s", desc->name);
    return;
  }
  int first = 0, last = desc->num_layers;
  size_t used;
  if (desc->kind == MODEL_CTR) {
    used = (size_t)snprintf(buf, len, "%s:%d:", desc->name, desc->embed_dim);
    first = 1; /* the input width and the one output follow from the kind */
    last = desc->num_layers - 1;
  } else {
    used = (size_t)snprintf(buf, len, "%s:", desc->name);
  }
  for (int i = first; i <= last && used < len; i++) {
    used += (size_t)snprintf(buf + used, len - used, i == first ? "%d" : ",%d", desc->sizes[i]);
  }
}

/* Weights uniform in +-sqrt(6/in) (He) before a ReLU, +-sqrt(3/in) for the
 * output layer; the expression is the one every checkpoint's initial values
 * came from, so keep it bit for bit. */
static tensor_init weight_init(const model_desc *desc, int layer) {
  double fan_in = (double)desc->sizes[layer - 1];
  float bound = (float)sqrt((layer < desc->num_layers ? 6.0 : 3.0) / fan_in);
  return (tensor_init){TENSOR_INIT_UNIFORM, bound};
}

ps_err model_build_layout(const model_desc *desc, tensor_layout *layout, ps_error *err) {
  if (desc->kind == MODEL_NET) return net_build_layout(&desc->net, layout, err);
  char name[TENSOR_NAME_MAX];
  for (int l = 1; l <= desc->num_layers; l++) {
    long weight_shape[2] = {desc->sizes[l], desc->sizes[l - 1]};
    long bias_shape[1] = {desc->sizes[l]};
    snprintf(name, sizeof name, "fc%d.weight", l);
    if (tensor_layout_add(layout, name, 2, weight_shape, err) != PS_ERR_OK) return err->code;
    tensor_layout_set_init(layout, layout->count - 1, weight_init(desc, l));
    snprintf(name, sizeof name, "fc%d.bias", l); /* biases keep the zeros rule */
    if (tensor_layout_add(layout, name, 1, bias_shape, err) != PS_ERR_OK) return err->code;
  }
  if (model_is_ctr(desc)) {
    long bias_shape[1] = {1};
    if (tensor_layout_add(layout, "wide.bias", 1, bias_shape, err) != PS_ERR_OK) return err->code;
  }
  return PS_ERR_OK;
}

uint64_t model_hash(const model_desc *desc) {
  char text[MODEL_TEXT_MAX];
  model_format(desc, text, sizeof text);
  return hash_text(text);
}

void model_init_params(const tensor_layout *layout, uint64_t seed, size_t begin, size_t count,
                       float *out) {
  size_t end = begin + count;
  for (int t = 0; t < layout->count; t++) {
    const tensor_info *info = &layout->tensors[t];
    size_t lo = info->offset > begin ? info->offset : begin;
    size_t hi = info->offset + info->count < end ? info->offset + info->count : end;
    if (lo >= hi) continue;
    float *dst = out + (lo - begin);
    switch (info->init.kind) {
      case TENSOR_INIT_ZEROS:
        memset(dst, 0, (hi - lo) * sizeof *dst);
        break;
      case TENSOR_INIT_ONES:
        for (size_t i = lo; i < hi; i++) dst[i - lo] = 1.0f;
        break;
      case TENSOR_INIT_UNIFORM: {
        /* One stream per tensor index, element i at position i: any range
         * draws what the whole does. */
        const float bound = info->init.scale;
        for (size_t i = lo; i < hi; i++) {
          float u = rng_uniform_at(seed, (uint64_t)t, i - info->offset);
          dst[i - lo] = (2.0f * u - 1.0f) * bound;
        }
        break;
      }
    }
  }
}
