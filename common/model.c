/* Model description parsing, parameter layout, hash and initialization. */
#include "common/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/rng.h"

ps_err model_parse(const char *text, model_desc *desc, ps_error *err) {
  memset(desc, 0, sizeof *desc);
  if (strncmp(text, "mlp:", 4) != 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "model '%s': expected mlp:IN,HIDDEN...,OUT (e.g. mlp:784,256,128,10)", text);
  }
  const char *p = text + 4;
  int n = 0;
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
    if (n > MODEL_MAX_LAYERS) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': more than %d layers", text,
                          MODEL_MAX_LAYERS);
    }
    desc->sizes[n++] = (int)v;
    if (*end == '\0') break;
    if (*end != ',') {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': unexpected '%c'", text, *end);
    }
    p = end + 1;
  }
  if (n < 2) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "model '%s': needs at least an input and an output size", text);
  }
  desc->num_layers = n - 1;
  return PS_ERR_OK;
}

void model_format(const model_desc *desc, char *buf, size_t len) {
  size_t used = (size_t)snprintf(buf, len, "mlp:");
  for (int i = 0; i <= desc->num_layers && used < len; i++) {
    used += (size_t)snprintf(buf + used, len - used, i == 0 ? "%d" : ",%d", desc->sizes[i]);
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
