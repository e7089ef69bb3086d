/* The safetensors format as pstrain uses it: dtypes, shapes, and the tensor
 * descriptions both the writer (safetensors_write.c) and the strict reader
 * (safetensors_read.c) work on. */
#include "common/safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/safetensors_internal.h"

const char *const safetensors_dtype_names[3] = {"F32", "U64", "I64"};

size_t safetensors_dtype_size(safetensors_dtype dtype) { return dtype == SAFETENSORS_F32 ? 4 : 8; }

int safetensors_dtype_parse(const char *name, safetensors_dtype *out) {
  enum { DTYPES = sizeof safetensors_dtype_names / sizeof safetensors_dtype_names[0] };
  for (int d = 0; d < DTYPES; d++) {
    if (strcmp(name, safetensors_dtype_names[d]) == 0) {
      *out = (safetensors_dtype)d;
      return 1;
    }
  }
  return 0;
}

/* Elements of a shape; 0 when it overflows or a dimension is negative. */
size_t safetensors_shape_elements(const long *shape, int rank, int *ok) {
  size_t n = 1;
  *ok = 1;
  for (int d = 0; d < rank; d++) {
    if (shape[d] < 0 || (shape[d] > 0 && n > SIZE_MAX / 8 / (size_t)shape[d])) {
      *ok = 0;
      return 0;
    }
    n *= (size_t)shape[d];
  }
  return n;
}

safetensors_tensor *safetensors_tensors_of(const tensor_layout *layout, const float *data,
                                           ps_error *err) {
  safetensors_tensor *tensors = calloc((size_t)(layout->count > 0 ? layout->count : 1),
                                       sizeof *tensors);
  if (tensors == NULL) {
    ps_error_set(err, PS_ERR_NO_MEMORY, "safetensors: out of memory for %d tensors", layout->count);
    return NULL;
  }
  for (int t = 0; t < layout->count; t++) {
    const tensor_info *info = &layout->tensors[t];
    snprintf(tensors[t].name, sizeof tensors[t].name, "%s", info->name);
    tensors[t].dtype = SAFETENSORS_F32;
    tensors[t].rank = info->rank;
    memcpy(tensors[t].shape, info->shape, sizeof info->shape);
    tensors[t].data = (void *)(data + info->offset);
  }
  return tensors;
}

safetensors_tensor safetensors_tensor_of(const char *prefix, const char *what,
                                         safetensors_dtype dtype, size_t rows, long cols,
                                         void *data) {
  safetensors_tensor p;
  memset(&p, 0, sizeof p);
  snprintf(p.name, sizeof p.name, "%s%s%s", prefix, prefix[0] != '\0' ? "." : "", what);
  p.dtype = dtype;
  p.rank = cols > 0 ? 2 : 1;
  p.shape[0] = (long)rows;
  p.shape[1] = cols > 0 ? cols : 0;
  p.data = data;
  return p;
}
