/* Writes tensors in the safetensors format (an 8-byte little-endian header
 * length, a JSON header naming each tensor's dtype, shape and byte range,
 * then the raw little-endian data) so numpy and PyTorch users can read them.
 * Written atomically: a temporary file, fsync, rename, fsync of the folder. */
#ifndef PSTRAIN_COMMON_SAFETENSORS_H
#define PSTRAIN_COMMON_SAFETENSORS_H

#include "common/error.h"
#include "common/tensor.h"

/* Writes every tensor of layout, taking values from data (layout->total
 * floats), to path. metadata is a list of key/value string pairs for the
 * header's "__metadata__" (NULL-terminated; may be NULL). */
ps_err safetensors_write(const char *path, const tensor_layout *layout, const float *data,
                         const char *const *metadata, ps_error *err);

#endif
