/* safetensors reading: a strict parser of the header pstrain writes, the
 * data's CRC-32C checked, into a layout or a whole file of tensors. */
#define _POSIX_C_SOURCE 200809L
#include "common/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/safetensors_internal.h"

/* A header longer than this is not one of ours. */
#define HEADER_MAX (1u << 20)

const char *safetensors_meta_get(const safetensors_meta *meta, const char *key) {
  for (int i = 0; i < meta->count; i++) {
    if (strcmp(meta->keys[i], key) == 0) return meta->values[i];
  }
  return NULL;
}

/* --- a strict reader of the header pstrain writes --------------------------- */

typedef struct json_cursor {
  const char *p, *end;
} json_cursor;

static void skip_ws(json_cursor *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\t' || *c->p == '\r')) c->p++;
}

static int expect(json_cursor *c, char ch) {
  skip_ws(c);
  if (c->p >= c->end || *c->p != ch) return 0;
  c->p++;
  return 1;
}

/* A string without escapes (all pstrain writes), copied into out. */
static int read_string(json_cursor *c, char *out, size_t len) {
  if (!expect(c, '"')) return 0;
  size_t n = 0;
  while (c->p < c->end && *c->p != '"') {
    if (*c->p == '\\' || (unsigned char)*c->p < 0x20 || n + 1 >= len) return 0;
    out[n++] = *c->p++;
  }
  if (c->p >= c->end) return 0;
  c->p++;
  out[n] = '\0';
  return 1;
}

static int read_int_array(json_cursor *c, long long *out, int max, int *count) {
  if (!expect(c, '[')) return 0;
  *count = 0;
  skip_ws(c);
  if (c->p < c->end && *c->p == ']') {
    c->p++;
    return 1;
  }
  for (;;) {
    skip_ws(c);
    if (*count == max) return 0;
    long long v = 0;
    int digits = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9' && digits < 18) {
      v = v * 10 + (*c->p++ - '0');
      digits++;
    }
    if (digits == 0) return 0;
    out[(*count)++] = v;
    skip_ws(c);
    if (c->p < c->end && *c->p == ',') {
      c->p++;
      continue;
    }
    return expect(c, ']');
  }
}

static ps_err bad_header(const char *path, const char *why, ps_error *err) {
  return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: %s", path, why);
}

/* Parses the header: the metadata, and each tensor entry into entries (at
 * most max; entries NULL: entries are checked for form only). */
/* The "__metadata__" object's string pairs, after its '{'. */
static ps_err parse_metadata(json_cursor *c, const char *path, safetensors_meta *meta,
                             ps_error *err) {
  for (int first = 1;; first = 0) {
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
      c->p++;
      return PS_ERR_OK;
    }
    if (!first && !expect(c, ',')) return bad_header(path, "malformed metadata", err);
    if (meta->count == SAFETENSORS_MAX_META ||
        !read_string(c, meta->keys[meta->count], sizeof meta->keys[0]) || !expect(c, ':') ||
        !read_string(c, meta->values[meta->count], sizeof meta->values[0])) {
      return bad_header(path, "malformed metadata", err);
    }
    meta->count++;
  }
}

/* A tensor entry's fields, after its '{': dtype, shape, data_offsets. */
static ps_err parse_fields(json_cursor *c, const char *path, safetensors_tensor *e,
                           long long *shape, int *shape_n, long long *offsets, int *offsets_n,
                           int *dtype_ok, ps_error *err) {
  char value[256];
  for (int first = 1;; first = 0) {
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
      c->p++;
      return PS_ERR_OK;
    }
    if (!first && !expect(c, ',')) return bad_header(path, "malformed tensor entry", err);
    if (!read_string(c, value, sizeof value) || !expect(c, ':')) {
      return bad_header(path, "malformed tensor entry", err);
    }
    if (strcmp(value, "dtype") == 0) {
      char dtype[16];
      if (!read_string(c, dtype, sizeof dtype)) return bad_header(path, "malformed dtype", err);
      *dtype_ok = safetensors_dtype_parse(dtype, &e->dtype);
    } else if (strcmp(value, "shape") == 0) {
      if (!read_int_array(c, shape, 8, shape_n)) return bad_header(path, "malformed shape", err);
    } else if (strcmp(value, "data_offsets") == 0) {
      if (!read_int_array(c, offsets, 2, offsets_n) || *offsets_n != 2) {
        return bad_header(path, "malformed data_offsets", err);
      }
    } else {
      return bad_header(path, "unknown field in a tensor entry", err);
    }
  }
}

/* Tensor `key`'s entry, after its '{', into e, checked against itself. */
static ps_err parse_tensor(json_cursor *c, const char *path, const char *key,
                           safetensors_tensor *e, ps_error *err) {
  memset(e, 0, sizeof *e);
  if (strlen(key) >= sizeof e->name) return bad_header(path, "a tensor name is too long", err);
  memcpy(e->name, key, strlen(key) + 1);
  long long shape[8] = {0}, offsets[2] = {0};
  int shape_n = -1, offsets_n = -1, dtype_ok = 0;
  PS_TRY(parse_fields(c, path, e, shape, &shape_n, offsets, &offsets_n, &dtype_ok, err));
  if (!dtype_ok || shape_n < 0 || shape_n > TENSOR_MAX_RANK || offsets_n != 2 ||
      offsets[1] < offsets[0]) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                        "%s: tensor %s has an unknown dtype, a bad shape or bad data_offsets",
                        path, key);
  }
  e->rank = shape_n;
  for (int d = 0; d < shape_n; d++) e->shape[d] = (long)shape[d];
  e->offset = (size_t)offsets[0];
  e->bytes = (size_t)(offsets[1] - offsets[0]);
  int ok;
  size_t n = safetensors_shape_elements(e->shape, e->rank, &ok);
  if (!ok || n * safetensors_dtype_size(e->dtype) != e->bytes) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                        "%s: tensor %s: its shape does not match its %zu bytes", path, key,
                        e->bytes);
  }
  return PS_ERR_OK;
}

static ps_err parse_header(const char *path, const char *json, size_t len,
                           safetensors_tensor *entries, int max, int *count,
                           safetensors_meta *meta, ps_error *err) {
  json_cursor c = {json, json + len};
  char key[128];
  *count = 0;
  meta->count = 0;
  if (!expect(&c, '{')) return bad_header(path, "the header is not a JSON object", err);
  for (int first = 1;; first = 0) {
    skip_ws(&c);
    if (c.p < c.end && *c.p == '}') {
      c.p++;
      break;
    }
    if (!first && !expect(&c, ',')) return bad_header(path, "malformed header", err);
    if (!read_string(&c, key, sizeof key) || !expect(&c, ':') || !expect(&c, '{')) {
      return bad_header(path, "malformed header", err);
    }
    if (strcmp(key, "__metadata__") == 0) {
      PS_TRY(parse_metadata(&c, path, meta, err));
      continue;
    }
    if (entries != NULL && *count == max) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: more than %d tensors", path, max);
    }
    safetensors_tensor scratch;
    PS_TRY(parse_tensor(&c, path, key, entries != NULL ? &entries[*count] : &scratch, err));
    (*count)++;
  }
  skip_ws(&c);
  if (c.p != c.end) return bad_header(path, "bytes after the header object", err);
  return PS_ERR_OK;
}

/* Checks the entries describe exactly layout (F32 tensors in its order). */
static ps_err check_layout(const char *path, const safetensors_tensor *entries, int count,
                           const tensor_layout *layout, ps_error *err) {
  for (int t = 0; t < count; t++) {
    if (t >= layout->count || strcmp(entries[t].name, layout->tensors[t].name) != 0) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: tensor '%s' where '%s' was expected", path,
                          entries[t].name, t < layout->count ? layout->tensors[t].name : "(none)");
    }
    const tensor_info *info = &layout->tensors[t];
    int shape_ok = entries[t].rank == info->rank;
    for (int d = 0; shape_ok && d < info->rank; d++) shape_ok = entries[t].shape[d] == info->shape[d];
    if (entries[t].dtype != SAFETENSORS_F32 || !shape_ok ||
        entries[t].offset != info->offset * sizeof(float) ||
        entries[t].bytes != info->count * sizeof(float)) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                          "%s: tensor %s has another dtype, shape or place than expected", path,
                          info->name);
    }
  }
  if (count != layout->count) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: holds %d tensors, expected %d", path, count,
                        layout->count);
  }
  return PS_ERR_OK;
}

static ps_err check_crc(const char *path, const safetensors_meta *meta, uint32_t crc,
                        ps_error *err) {
  const char *want_crc = safetensors_meta_get(meta, "crc32c");
  char got_crc[16];
  snprintf(got_crc, sizeof got_crc, "%08x", crc);
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  want_crc = got_crc; /* fuzzed data must get past the checksum to reach its users */
#endif
  if (want_crc == NULL || strcmp(want_crc, got_crc) != 0) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                        "%s: CRC-32C of the data is %s but the header records %s (corrupt file)",
                        path, got_crc, want_crc != NULL ? want_crc : "none");
  }
  return PS_ERR_OK;
}

ps_err safetensors_read(const char *path, const tensor_layout *layout, float *data,
                        safetensors_meta *meta, ps_error *err) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return ps_error_set(err, PS_ERR_IO, "opening %s: %s", path, strerror(errno));
  ps_err rc = PS_ERR_OK;
  char *json = NULL;
  struct stat st;
  uint8_t head[8];
  uint64_t header_len = 0;
  size_t bytes = layout != NULL ? layout->total * sizeof(float) : 0;
  if (fstat(fd, &st) != 0) {
    rc = ps_error_set(err, PS_ERR_IO, "reading %s: %s", path, strerror(errno));
  } else if (read(fd, head, 8) != 8) {
    rc = ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: shorter than a safetensors header", path);
  } else {
    for (int i = 0; i < 8; i++) header_len |= (uint64_t)head[i] << (8 * i);
    if (header_len < 2 || header_len > HEADER_MAX ||
        (layout != NULL && (uint64_t)st.st_size != 8 + header_len + bytes) ||
        (uint64_t)st.st_size < 8 + header_len) {
      rc = ps_error_set(err, PS_ERR_CORRUPT_DATA,
                        "%s: %lld bytes with a %llu-byte header do not hold the expected %zu "
                        "bytes of tensors (truncated or another model?)",
                        path, (long long)st.st_size, (unsigned long long)header_len, bytes);
    }
  }
  if (rc == PS_ERR_OK && (json = malloc(header_len)) == NULL) {
    rc = ps_error_set(err, PS_ERR_NO_MEMORY, "reading %s: out of memory", path);
  }
  if (rc == PS_ERR_OK) {
    size_t want[2] = {header_len, layout != NULL ? bytes : 0};
    char *dst[2] = {json, (char *)data};
    for (int part = 0; part < 2 && rc == PS_ERR_OK; part++) {
      for (size_t got = 0; got < want[part];) {
        ssize_t n = read(fd, dst[part] + got, want[part] - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          rc = ps_error_set(err, PS_ERR_IO, "reading %s: %s", path,
                            n < 0 ? strerror(errno) : "unexpected end of file");
          break;
        }
        got += (size_t)n;
      }
    }
  }
  close(fd);
  safetensors_tensor *entries = NULL;
  int count = 0;
  if (rc == PS_ERR_OK && layout != NULL &&
      (entries = calloc((size_t)layout->count + 1, sizeof *entries)) == NULL) {
    rc = ps_error_set(err, PS_ERR_NO_MEMORY, "reading %s: out of memory", path);
  }
  if (rc == PS_ERR_OK) {
    rc = parse_header(path, json, header_len, entries, layout != NULL ? layout->count + 1 : 0,
                      &count, meta, err);
  }
  if (rc == PS_ERR_OK && layout != NULL) rc = check_layout(path, entries, count, layout, err);
  free(entries);
  free(json);
  if (rc != PS_ERR_OK || layout == NULL) return rc;
  return check_crc(path, meta, crc32c_update(0, data, bytes), err);
}

/* Reads exactly len bytes at the file's current position. */
static ps_err read_exact(int fd, void *dst, size_t len, const char *path, ps_error *err) {
  for (size_t got = 0; got < len;) {
    ssize_t n = read(fd, (char *)dst + got, len - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return ps_error_set(err, PS_ERR_IO, "reading %s: %s", path,
                          n < 0 ? strerror(errno) : "unexpected end of file");
    }
    got += (size_t)n;
  }
  return PS_ERR_OK;
}

/* Tensors start at multiples of 8 in memory, whatever their offsets in the
 * file: the format packs them, so a U64 tensor after an odd count of F32s
 * sits at an offset of 4 mod 8 there, and its users load it as uint64_t. */
#define TENSOR_ALIGN 8
static size_t align_up(size_t n) { return (n + TENSOR_ALIGN - 1) & ~(size_t)(TENSOR_ALIGN - 1); }

ps_err safetensors_file_read(const char *path, safetensors_file *file, ps_error *err) {
  memset(file, 0, sizeof *file);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return ps_error_set(err, PS_ERR_IO, "opening %s: %s", path, strerror(errno));
  struct stat st;
  uint8_t head[8];
  uint64_t header_len = 0;
  char *json = NULL;
  size_t data_bytes = 0;
  ps_err rc = PS_ERR_OK;
  if (fstat(fd, &st) != 0) {
    rc = ps_error_set(err, PS_ERR_IO, "reading %s: %s", path, strerror(errno));
  } else if (read_exact(fd, head, 8, path, err) != PS_ERR_OK) {
    rc = ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: shorter than a safetensors header", path);
  } else {
    for (int i = 0; i < 8; i++) header_len |= (uint64_t)head[i] << (8 * i);
    if (header_len < 2 || header_len > HEADER_MAX || (uint64_t)st.st_size < 8 + header_len) {
      rc = ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: a %llu-byte header in a %lld-byte file",
                        path, (unsigned long long)header_len, (long long)st.st_size);
    } else {
      data_bytes = (size_t)((uint64_t)st.st_size - 8 - header_len);
    }
  }
  if (rc == PS_ERR_OK && (json = malloc(header_len)) == NULL) {
    rc = ps_error_set(err, PS_ERR_NO_MEMORY, "reading %s: out of memory for its header", path);
  }
  if (rc == PS_ERR_OK) rc = read_exact(fd, json, header_len, path, err);
  if (rc == PS_ERR_OK) {
    rc = parse_header(path, json, header_len, file->tensors, SAFETENSORS_MAX_TENSORS, &file->count,
                      &file->meta, err);
  }
  free(json);
  /* The ranges must tile the data section, in order, without holes. */
  size_t at = 0, placed = 0;
  for (int t = 0; rc == PS_ERR_OK && t < file->count; t++) {
    const safetensors_tensor *e = &file->tensors[t];
    if (e->offset != at || e->bytes > data_bytes - at) {
      rc = ps_error_set(err, PS_ERR_CORRUPT_DATA,
                        "%s: tensor %s's bytes are not where the previous tensor ends", path,
                        e->name);
    }
    at += e->bytes;
    placed = align_up(placed) + e->bytes;
  }
  if (rc == PS_ERR_OK && at != data_bytes) {
    rc = ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: %zu bytes of tensors but %zu bytes of data",
                      path, at, data_bytes);
  }
  if (rc == PS_ERR_OK && (file->bytes = malloc(placed > 0 ? placed : 1)) == NULL) {
    rc = ps_error_set(err, PS_ERR_NO_MEMORY, "reading %s: out of memory for %zu bytes", path,
                      placed);
  }
  /* The checksum covers the data as the file holds it, tensor after tensor. */
  uint32_t crc = 0;
  placed = 0;
  for (int t = 0; rc == PS_ERR_OK && t < file->count; t++) {
    safetensors_tensor *e = &file->tensors[t];
    placed = align_up(placed);
    e->data = (char *)file->bytes + placed;
    rc = read_exact(fd, e->data, e->bytes, path, err);
    crc = crc32c_update(crc, e->data, e->bytes);
    placed += e->bytes;
  }
  close(fd);
  if (rc == PS_ERR_OK) rc = check_crc(path, &file->meta, crc, err);
  if (rc != PS_ERR_OK) safetensors_file_free(file);
  return rc;
}

const safetensors_tensor *safetensors_file_find(const safetensors_file *file, const char *name) {
  for (int t = 0; t < file->count; t++) {
    if (strcmp(file->tensors[t].name, name) == 0) return &file->tensors[t];
  }
  return NULL;
}

void safetensors_file_free(safetensors_file *file) {
  free(file->bytes);
  memset(file, 0, sizeof *file);
}
