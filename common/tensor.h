/* Tensor layouts and tensor groups. A layout names a list of row-major
 * tensors packed one after another in a single float array; a group is one
 * allocation holding a whole layout, so a shard is an {offset, count} range
 * and copies move contiguous bytes. Device-memory groups are the backends'. */
#ifndef PSTRAIN_COMMON_TENSOR_H
#define PSTRAIN_COMMON_TENSOR_H

#include <stddef.h>

#include "common/error.h"

#define TENSOR_NAME_MAX 48
#define TENSOR_MAX_RANK 4

/* How a tensor's initial values are made (model_init_params applies it).
 * ZEROS is 0 so that a tensor added without a rule starts as a zeroed group
 * does. A normal rule would take scale as its standard deviation. */
typedef enum { TENSOR_INIT_ZEROS, TENSOR_INIT_ONES, TENSOR_INIT_UNIFORM } tensor_init_kind;

typedef struct tensor_init {
  tensor_init_kind kind;
  float scale; /* UNIFORM: values in +-scale; unused otherwise */
} tensor_init;

typedef struct tensor_info {
  char name[TENSOR_NAME_MAX]; /* e.g. "fc1.weight" */
  int rank;
  long shape[TENSOR_MAX_RANK]; /* row-major */
  size_t offset;               /* in floats from the start of the group */
  size_t count;                /* product of the shape */
  tensor_init init;            /* zeros unless set */
  /* 1 unless set. A non-trainable tensor (batch norm's running statistics)
   * is kept, checkpointed and exported like any other but gets no gradient
   * and no optimizer step. */
  int trainable;
} tensor_info;

typedef struct tensor_layout {
  int count;
  tensor_info *tensors; /* owned */
  size_t total;         /* floats in the whole group */
} tensor_layout;

void tensor_layout_init(tensor_layout *layout);
/* Appends a tensor of the given shape after the last one: initialized to
 * zeros and trainable until the setters below say otherwise. */
ps_err tensor_layout_add(tensor_layout *layout, const char *name, int rank, const long *shape,
                         ps_error *err);
/* Set tensor `index`'s initialization rule and whether it is trainable. */
void tensor_layout_set_init(tensor_layout *layout, int index, tensor_init init);
void tensor_layout_set_trainable(tensor_layout *layout, int index, int trainable);
void tensor_layout_free(tensor_layout *layout);
/* Index of the tensor called name, or -1. */
int tensor_layout_find(const tensor_layout *layout, const char *name);

/* A host tensor group: `copies` consecutive layouts' worth of floats in one
 * zeroed, 64-byte aligned allocation (copies > 1 serve optimizer state). */
typedef struct tensor_group {
  const tensor_layout *layout; /* borrowed; must outlive the group */
  size_t copies;
  float *data; /* owned: copies * layout->total floats */
} tensor_group;

ps_err tensor_group_init(tensor_group *group, const tensor_layout *layout, size_t copies,
                         ps_error *err);
void tensor_group_free(tensor_group *group);
/* Tensor `index` of copy `copy` in the group. */
float *tensor_group_tensor(const tensor_group *group, size_t copy, int index);

#endif
