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

/* "ctr:DIM:H1,H2,...": the MLP maps 26 * DIM + 13 inputs through H1, H2, ... to one logit. */
static ps_err parse_ctr(const char *text, model_desc *desc, ps_error *err) {
  const char *p = text + 4;
  char *end;
  errno = 0;
  long dim = strtol(p, &end, 10);
  if (end == p || errno != 0 || *end != ':') {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "model '%s': expected ctr:DIM:H1,H2,... (e.g. ctr:16:256,128)", text);
  }
  if (dim < 1 || dim > MODEL_MAX_EMBED_DIM) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "model '%s': embedding dimension %ld is outside 1..%d", text, dim,
                        MODEL_MAX_EMBED_DIM);
  }
  desc->kind = MODEL_CTR;
  desc->embed_dim = (int)dim;
  desc->sizes[0] = CTR_CAT_FIELDS * (int)dim + CTR_DENSE_FIELDS;
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

ps_err model_parse(const char *text, model_desc *desc, ps_error *err) {
  memset(desc, 0, sizeof *desc);
  if (strcmp(text, "lr") == 0) {
    desc->kind = MODEL_LR;
    return PS_ERR_OK;
  }
  if (strncmp(text, "ctr:", 4) == 0) return parse_ctr(text, desc, err);
  if (strncmp(text, "mlp:", 4) != 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "model '%s': expected mlp:IN,HIDDEN...,OUT (e.g. mlp:784,256,128,10), "
                        "ctr:DIM:H1,H2,... (e.g. ctr:16:256,128) or lr",
                        text);
  }
  int n = 0;
  if (parse_sizes(text, text + 4, desc, &n, err) != PS_ERR_OK) return err->code;
  if (n < 2) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "model '%s': needs at least an input and an output size", text);
  }
  desc->num_layers = n - 1;
  return PS_ERR_OK;
}

void model_format(const model_desc *desc, char *buf, size_t len) {
  if (desc->kind == MODEL_LR) {
    snprintf(buf, len, "lr");
    return;
  }
  int first = 0, last = desc->num_layers;
  size_t used;
  if (desc->kind == MODEL_CTR) {
    used = (size_t)snprintf(buf, len, "ctr:%d:", desc->embed_dim);
    first = 1; /* the input width and the one output follow from the kind */
    last = desc->num_layers - 1;
  } else {
    used = (size_t)snprintf(buf, len, "mlp:");
  }
  for (int i = first; i <= last && used < len; i++) {
    used += (size_t)snprintf(buf + used, len - used, i == first ? "%d" : ",%d", desc->sizes[i]);
  }
}

ps_err model_build_layout(const model_desc *desc, tensor_layout *layout, ps_error *err) {
  char name[TENSOR_NAME_MAX];
  for (int l = 1; l <= desc->num_layers; l++) {
    long weight_shape[2] = {desc->sizes[l], desc->sizes[l - 1]};
    long bias_shape[1] = {desc->sizes[l]};
    snprintf(name, sizeof name, "fc%d.weight", l);
    if (tensor_layout_add(layout, name, 2, weight_shape, err) != PS_ERR_OK) return err->code;
    snprintf(name, sizeof name, "fc%d.bias", l);
    if (tensor_layout_add(layout, name, 1, bias_shape, err) != PS_ERR_OK) return err->code;
  }
  if (model_is_ctr(desc)) {
    long bias_shape[1] = {1};
    if (tensor_layout_add(layout, "wide.bias", 1, bias_shape, err) != PS_ERR_OK) return err->code;
  }
  return PS_ERR_OK;
}

uint64_t model_hash(const model_desc *desc) {
  char text[16 * (MODEL_MAX_LAYERS + 2)];
  model_format(desc, text, sizeof text);
  return hash_text(text);
}

void model_init_params(const model_desc *desc, const tensor_layout *layout, uint64_t seed,
                       size_t begin, size_t count, float *out) {
  size_t end = begin + count;
  for (int t = 0; t < layout->count; t++) {
    const tensor_info *info = &layout->tensors[t];
    size_t lo = info->offset > begin ? info->offset : begin;
    size_t hi = info->offset + info->count < end ? info->offset + info->count : end;
    if (lo >= hi) continue;
    float *dst = out + (lo - begin);
    if (info->rank == 1) { /* biases start at zero */
      memset(dst, 0, (hi - lo) * sizeof *dst);
      continue;
    }
    int layer = t / 2 + 1;
    double fan_in = (double)desc->sizes[layer - 1];
    float bound = (float)sqrt((layer < desc->num_layers ? 6.0 : 3.0) / fan_in);
    for (size_t i = lo; i < hi; i++) {
      float u = rng_uniform_at(seed, (uint64_t)t, i - info->offset);
      dst[i - lo] = (2.0f * u - 1.0f) * bound;
    }
  }
}
