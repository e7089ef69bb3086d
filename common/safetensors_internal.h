/* What the safetensors writer and reader share (common/safetensors.c). */
#ifndef PSTRAIN_COMMON_SAFETENSORS_INTERNAL_H
#define PSTRAIN_COMMON_SAFETENSORS_INTERNAL_H

#include <stddef.h>

#include "common/safetensors.h"

/* The header's dtype names, indexed by safetensors_dtype. */
extern const char *const safetensors_dtype_names[3];

/* 1 and the dtype of NAME; 0 when it is not one pstrain writes. */
int safetensors_dtype_parse(const char *name, safetensors_dtype *out);

/* Elements of a shape; 0 when it overflows or a dimension is negative. */
size_t safetensors_shape_elements(const long *shape, int rank, int *ok);

#endif
