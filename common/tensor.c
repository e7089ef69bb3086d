/* Tensor layouts and single-allocation host tensor groups. */
#define _POSIX_C_SOURCE 200809L
#include "common/tensor.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tensor_layout_init(tensor_layout *layout) { memset(layout, 0, sizeof *layout); }

ps_err tensor_layout_add(tensor_layout *layout, const char *name, int rank, const long *shape,
                         ps_error *err) {
  if (rank < 1 || rank > TENSOR_MAX_RANK) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "tensor %s: rank %d is not 1..%d", name, rank,
                        TENSOR_MAX_RANK);
  }
  if (strlen(name) >= TENSOR_NAME_MAX) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "tensor name '%s' is too long", name);
  }
  size_t count = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] <= 0 || (size_t)shape[i] > SIZE_MAX / 4 / count) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "tensor %s: dimension %ld is not usable",
                          name, shape[i]);
    }
    count *= (size_t)shape[i];
  }
  tensor_info *grown = realloc(layout->tensors, (size_t)(layout->count + 1) * sizeof *grown);
  if (grown == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "adding tensor %s to a layout: out of memory", name);
  }
  layout->tensors = grown;
  tensor_info *t = &layout->tensors[layout->count++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->rank = rank;
  for (int i = 0; i < rank; i++) t->shape[i] = shape[i];
  t->offset = layout->total;
  t->count = count;
  t->init.kind = TENSOR_INIT_ZEROS;
  t->trainable = 1;
  layout->total += count;
  return PS_ERR_OK;
}

void tensor_layout_set_init(tensor_layout *layout, int index, tensor_init init) {
  layout->tensors[index].init = init;
}

void tensor_layout_set_trainable(tensor_layout *layout, int index, int trainable) {
  layout->tensors[index].trainable = trainable != 0;
}

void tensor_layout_free(tensor_layout *layout) {
  free(layout->tensors);
  memset(layout, 0, sizeof *layout);
}

int tensor_layout_find(const tensor_layout *layout, const char *name) {
  for (int i = 0; i < layout->count; i++) {
    if (strcmp(layout->tensors[i].name, name) == 0) return i;
  }
  return -1;
}

ps_err tensor_group_init(tensor_group *group, const tensor_layout *layout, size_t copies,
                         ps_error *err) {
  memset(group, 0, sizeof *group);
  size_t floats = layout->total * copies;
  size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
  void *data = NULL;
  if (bytes == 0) bytes = 64;
  int rc = posix_memalign(&data, 64, bytes);
  if (rc != 0) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "allocating a tensor group of %zu bytes: %s", bytes,
                        strerror(rc));
  }
  memset(data, 0, bytes);
  group->layout = layout;
  group->copies = copies;
  group->data = data;
  return PS_ERR_OK;
}

void tensor_group_free(tensor_group *group) {
  free(group->data);
  memset(group, 0, sizeof *group);
}

float *tensor_group_tensor(const tensor_group *group, size_t copy, int index) {
  return group->data + copy * group->layout->total + group->layout->tensors[index].offset;
}
