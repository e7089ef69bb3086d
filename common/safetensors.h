/* Tensors in the safetensors format (an 8-byte little-endian header length,
 * a JSON header naming each tensor's dtype, shape and byte range, then the
 * raw little-endian data), so numpy and PyTorch users can read them. pstrain
 * adds a CRC-32C of the data to the header's "__metadata__" and checks it on
 * load. Files are replaced atomically: a temporary file, fsync, rename, fsync
 * of the folder; optionally the replaced file is kept as PATH.prev. */
#ifndef PSTRAIN_COMMON_SAFETENSORS_H
#define PSTRAIN_COMMON_SAFETENSORS_H

#include "common/error.h"
#include "common/tensor.h"

#define SAFETENSORS_MAX_META 16
/* A value's longest text: a checkpoint's job, a network's text in hex. */
#define SAFETENSORS_META_VALUE_MAX 20480
#define SAFETENSORS_MAX_TENSORS 256

/* Element types pstrain writes: parameters, and sparse tables' keys and row
 * meta. */
typedef enum { SAFETENSORS_F32, SAFETENSORS_U64, SAFETENSORS_I64 } safetensors_dtype;

/* Produces a tensor's bytes in order, for a tensor written without a data
 * block (a table mostly on disk): called again and again with where to put
 * the next up to `max` bytes, it returns how many it put there, like read():
 * any count from 1 to max while bytes remain, 0 once the tensor's bytes are
 * all produced (the call after the last byte), or -1 on error with err set.
 * Ending short of the tensor's bytes or going past them fails the write. */
typedef long (*safetensors_fill_fn)(void *ctx, void *buf, size_t max, ps_error *err);

/* One tensor of a file: its name, type, shape and bytes (data: the values to
 * write, or where safetensors_file_read puts them). A tensor to write with
 * data NULL takes its bytes from fill(fill_ctx, ...) instead; zeroed or
 * designated-initializer entries have no fill. */
typedef struct safetensors_tensor {
  char name[TENSOR_NAME_MAX];
  safetensors_dtype dtype;
  int rank;
  long shape[TENSOR_MAX_RANK];
  size_t offset, bytes; /* within the data section */
  void *data;
  safetensors_fill_fn fill; /* used only when data is NULL */
  void *fill_ctx;
} safetensors_tensor;

/* A tensor named "PREFIX.WHAT" (just WHAT when prefix is ""), of `rows`
 * elements or, with cols > 0, rows x cols, over data. */
safetensors_tensor safetensors_tensor_of(const char *prefix, const char *what,
                                         safetensors_dtype dtype, size_t rows, long cols,
                                         void *data);

/* Bytes of one element of dtype. */
size_t safetensors_dtype_size(safetensors_dtype dtype);

/* Writes every tensor of layout, taking values from data (layout->total
 * floats), to path. metadata is a NULL-terminated list of key/value string
 * pairs for "__metadata__" (may be NULL); "crc32c" is added. With
 * keep_previous, an existing path becomes path.prev only once the new file
 * is complete, so one good generation exists at every moment. */
ps_err safetensors_write(const char *path, const tensor_layout *layout, const float *data,
                         const char *const *metadata, int keep_previous, ps_error *err);

typedef struct safetensors_meta {
  int count;
  char keys[SAFETENSORS_MAX_META][64];
  char values[SAFETENSORS_MAX_META][SAFETENSORS_META_VALUE_MAX];
} safetensors_meta;

/* The layout's tensors as F32 safetensors_tensor entries over data (malloc'd
 * array, the caller frees it); NULL with err set when out of memory. */
safetensors_tensor *safetensors_tensors_of(const tensor_layout *layout, const float *data,
                                           ps_error *err);

/* Writes count tensors, each from its data or its fill (offset and bytes are
 * computed from the shapes), as safetensors_write does. With fills the data
 * is streamed in 1 MiB chunks and its CRC-32C patched into the header at the
 * end; the file is byte for byte what the same tensors from memory give. A
 * fill's error or wrong length fails the write and leaves path as it was. */
ps_err safetensors_write_tensors(const char *path, safetensors_tensor *tensors, int count,
                                 const char *const *metadata, int keep_previous, ps_error *err);

/* A file read whole, for tensors whose shapes are known only from the file
 * (sparse tables): the header is checked (dtypes, shapes against byte
 * ranges, ranges covering the data exactly) and the data's CRC-32C; each
 * tensor's data points into the file's bytes. */
typedef struct safetensors_file {
  int count;
  safetensors_tensor tensors[SAFETENSORS_MAX_TENSORS];
  safetensors_meta meta;
  void *bytes; /* the tensors' data, each 8-byte aligned; owned */
} safetensors_file;

ps_err safetensors_file_read(const char *path, safetensors_file *file, ps_error *err);
/* The tensor named name, or NULL. */
const safetensors_tensor *safetensors_file_find(const safetensors_file *file, const char *name);
void safetensors_file_free(safetensors_file *file);

/* The value of key, or NULL. */
const char *safetensors_meta_get(const safetensors_meta *meta, const char *key);

/* Reads path into data (layout->total floats), refusing a file whose
 * tensors are not exactly layout's (names, shapes, order, ranges), whose
 * header is malformed, whose size is wrong or whose CRC-32C does not match.
 * The message names the file and the reason; data may be partly written on
 * error. With layout and data NULL, only the header's metadata is read. */
ps_err safetensors_read(const char *path, const tensor_layout *layout, float *data,
                        safetensors_meta *meta, ps_error *err);

#endif
