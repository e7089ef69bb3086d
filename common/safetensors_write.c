/* safetensors writing: the header, the tensors' data (from memory or
 * produced by callbacks in chunks) and its CRC-32C into a temporary file,
 * then an atomic replace (the previous file kept as .prev when asked) and
 * the folder synced. */
#define _POSIX_C_SOURCE 200809L
#include "common/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/safetensors_internal.h"

/* Appends printf output to a growing string; returns 0 when out of memory. */
static int appendf(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int appendf(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
    va_end(ap);
    if (n < 0) return 0;
    if ((size_t)n < *cap - *len) {
      *len += (size_t)n;
      return 1;
    }
    char *grown = realloc(*buf, *cap * 2 + (size_t)n);
    if (grown == NULL) return 0;
    *buf = grown;
    *cap = *cap * 2 + (size_t)n;
  }
}

static ps_err write_all(int fd, const void *data, size_t len, const char *path, ps_error *err) {
  const char *p = data;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ps_error_set(err, PS_ERR_IO, "writing %s: %s", path, strerror(errno));
    }
    p += n;
    len -= (size_t)n;
  }
  return PS_ERR_OK;
}

static ps_err sync_folder(const char *path, ps_error *err) {
  char dir_buf[4096];
  snprintf(dir_buf, sizeof dir_buf, "%s", path);
  const char *dir = dirname(dir_buf);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY);
  if (dfd < 0) return ps_error_set(err, PS_ERR_IO, "opening folder %s: %s", dir, strerror(errno));
  if (fsync(dfd) != 0) {
    int e = errno;
    close(dfd);
    return ps_error_set(err, PS_ERR_IO, "fsync of folder %s: %s", dir, strerror(e));
  }
  close(dfd);
  return PS_ERR_OK;
}

ps_err safetensors_write(const char *path, const tensor_layout *layout, const float *data,
                         const char *const *metadata, int keep_previous, ps_error *err) {
  safetensors_tensor *tensors = safetensors_tensors_of(layout, data, err);
  if (tensors == NULL) return err->code;
  ps_err rc = safetensors_write_tensors(path, tensors, layout->count, metadata, keep_previous, err);
  free(tensors);
  return rc;
}

/* The header starts with the CRC's 8 hex digits (fixed width), so a streamed
 * file can patch them in place once the data is written. */
#define HEADER_START "{\"__metadata__\":{\"crc32c\":\""
enum { CRC_DIGITS_AT = 8 + sizeof HEADER_START - 1 }; /* after the length */

/* The buffer each fill produces into. */
enum { FILL_CHUNK = 1 << 20 };

/* Whether tensor t's bytes come from its fill. */
static int filled(const safetensors_tensor *t) { return t->data == NULL && t->fill != NULL; }

/* Each tensor's place in the data (offset, bytes); *streamed when some come
 * from fills, else the data's CRC-32C in *crc. */
static ps_err place_tensors(const char *path, safetensors_tensor *tensors, int count,
                            uint32_t *crc, int *streamed, ps_error *err) {
  size_t total = 0;
  *crc = 0;
  *streamed = 0;
  for (int t = 0; t < count; t++) {
    int ok;
    size_t n = safetensors_shape_elements(tensors[t].shape, tensors[t].rank, &ok);
    if (!ok || tensors[t].rank < 0 || tensors[t].rank > TENSOR_MAX_RANK) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "writing %s: tensor %s has a bad shape",
                          path, tensors[t].name);
    }
    tensors[t].offset = total;
    tensors[t].bytes = n * safetensors_dtype_size(tensors[t].dtype);
    total += tensors[t].bytes;
    if (tensors[t].data == NULL && tensors[t].fill == NULL && tensors[t].bytes > 0) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                          "writing %s: tensor %s has neither data nor a fill", path,
                          tensors[t].name);
    }
    if (filled(&tensors[t])) *streamed = 1;
  }
  for (int t = 0; t < count && !*streamed; t++) {
    *crc = crc32c_update(*crc, tensors[t].data, tensors[t].bytes);
  }
  return PS_ERR_OK;
}

/* The JSON header (malloc'd, *len bytes, padded so the data starts 8-byte
 * aligned); NULL when out of memory. */
static char *header_json(const safetensors_tensor *tensors, int count,
                         const char *const *metadata, uint32_t crc, size_t *len) {
  size_t cap = 256;
  *len = 0;
  char *json = malloc(cap);
  if (json == NULL) return NULL;
  json[0] = '\0';
  int ok = appendf(&json, len, &cap, HEADER_START "%08x\"", crc);
  for (int i = 0; ok && metadata != NULL && metadata[i] != NULL && metadata[i + 1] != NULL;
       i += 2) {
    ok = appendf(&json, len, &cap, ",\"%s\":\"%s\"", metadata[i], metadata[i + 1]);
  }
  ok = ok && appendf(&json, len, &cap, "}");
  for (int t = 0; ok && t < count; t++) {
    const safetensors_tensor *info = &tensors[t];
    ok = appendf(&json, len, &cap, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", info->name,
                 safetensors_dtype_names[info->dtype]);
    for (int d = 0; ok && d < info->rank; d++) {
      ok = appendf(&json, len, &cap, "%s%ld", d > 0 ? "," : "", info->shape[d]);
    }
    ok = ok && appendf(&json, len, &cap, "],\"data_offsets\":[%zu,%zu]}", info->offset,
                       info->offset + info->bytes);
  }
  ok = ok && appendf(&json, len, &cap, "}");
  /* Pad with spaces so the data starts 8-byte aligned, as the format suggests. */
  while (ok && (8 + *len) % 8 != 0) ok = appendf(&json, len, &cap, " ");
  if (!ok) {
    free(json);
    return NULL;
  }
  return json;
}

/* Tensor t's bytes from its fill, a chunk at a time, into fd (tmp, for
 * path); *crc follows them. The fill must end (return 0) exactly at the
 * tensor's bytes: the call after the last byte tells a table that grew since
 * its shape was taken from one that did not. */
static ps_err write_filled(int fd, const char *tmp, const char *path,
                           const safetensors_tensor *t, void *buf, uint32_t *crc,
                           ps_error *err) {
  size_t done = 0;
  for (;;) {
    ps_error fill_err;
    ps_error_clear(&fill_err);
    long n = t->fill(t->fill_ctx, buf, FILL_CHUNK, &fill_err);
    if (n < 0) {
      return ps_error_set(err, fill_err.code != PS_ERR_OK ? fill_err.code : PS_ERR_INTERNAL,
                          "writing %s: producing tensor %s: %s", path, t->name,
                          fill_err.msg[0] != '\0' ? fill_err.msg : "its fill failed");
    }
    if (n == 0) {
      if (done == t->bytes) return PS_ERR_OK;
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                          "writing %s: tensor %s ended after %zu of its %zu bytes", path,
                          t->name, done, t->bytes);
    }
    if ((size_t)n > FILL_CHUNK || (size_t)n > t->bytes - done) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                          "writing %s: tensor %s produced more than its %zu bytes", path,
                          t->name, t->bytes);
    }
    *crc = crc32c_update(*crc, buf, (size_t)n);
    PS_TRY(write_all(fd, buf, (size_t)n, tmp, err));
    done += (size_t)n;
  }
}

/* Writes len bytes at offset of fd (tmp). */
static ps_err pwrite_all(int fd, const void *data, size_t len, off_t offset, const char *tmp,
                         ps_error *err) {
  const char *p = data;
  while (len > 0) {
    ssize_t n = pwrite(fd, p, len, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ps_error_set(err, PS_ERR_IO, "writing the CRC-32C into %s: %s", tmp,
                          strerror(errno));
    }
    p += n;
    offset += n;
    len -= (size_t)n;
  }
  return PS_ERR_OK;
}

/* The tensors' data into fd (tmp, for path), each from its data or its
 * fill, and then the data's CRC-32C over the header's placeholder. */
static ps_err write_streamed(int fd, const char *tmp, const char *path,
                             const safetensors_tensor *tensors, int count, ps_error *err) {
  void *buf = malloc(FILL_CHUNK);
  if (buf == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "writing %s: out of memory for a %d-byte buffer",
                        path, (int)FILL_CHUNK);
  }
  uint32_t crc = 0;
  ps_err rc = PS_ERR_OK;
  for (int t = 0; t < count && rc == PS_ERR_OK; t++) {
    if (filled(&tensors[t])) {
      rc = write_filled(fd, tmp, path, &tensors[t], buf, &crc, err);
    } else {
      crc = crc32c_update(crc, tensors[t].data, tensors[t].bytes);
      rc = write_all(fd, tensors[t].data, tensors[t].bytes, tmp, err);
    }
  }
  free(buf);
  if (rc != PS_ERR_OK) return rc;
  char digits[9];
  snprintf(digits, sizeof digits, "%08x", crc);
  return pwrite_all(fd, digits, 8, CRC_DIGITS_AT, tmp, err);
}

/* The header's length, the header and the tensors' data into tmp, synced. */
static ps_err write_file(const char *tmp, const char *path, const char *json, size_t len,
                         const safetensors_tensor *tensors, int count, int streamed,
                         ps_error *err) {
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return ps_error_set(err, PS_ERR_IO, "creating %s: %s", tmp, strerror(errno));
  uint8_t header_len[8];
  for (int i = 0; i < 8; i++) header_len[i] = (uint8_t)((uint64_t)len >> (8 * i));
  ps_err rc = write_all(fd, header_len, 8, tmp, err);
  if (rc == PS_ERR_OK) rc = write_all(fd, json, len, tmp, err);
  if (rc == PS_ERR_OK && streamed) rc = write_streamed(fd, tmp, path, tensors, count, err);
  for (int t = 0; t < count && rc == PS_ERR_OK && !streamed; t++) {
    rc = write_all(fd, tensors[t].data, tensors[t].bytes, tmp, err);
  }
  if (rc == PS_ERR_OK && fsync(fd) != 0) {
    rc = ps_error_set(err, PS_ERR_IO, "fsync of %s: %s", tmp, strerror(errno));
  }
  if (close(fd) != 0 && rc == PS_ERR_OK) {
    rc = ps_error_set(err, PS_ERR_IO, "closing %s: %s", tmp, strerror(errno));
  }
  return rc;
}

ps_err safetensors_write_tensors(const char *path, safetensors_tensor *tensors, int count,
                                 const char *const *metadata, int keep_previous, ps_error *err) {
  uint32_t crc;
  int streamed;
  PS_TRY(place_tensors(path, tensors, count, &crc, &streamed, err));
  /* Streamed: "00000000" holds the CRC's place until the data is written. */
  size_t len;
  char *json = header_json(tensors, count, metadata, crc, &len);
  if (json == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "safetensors: out of memory for the header");
  }
  char tmp[4096], prev[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  snprintf(prev, sizeof prev, "%s.prev", path);
  ps_err rc = write_file(tmp, path, json, len, tensors, count, streamed, err);
  free(json);
  /* The old generation gets a second name (.prev) while it still has its
   * own, so path names a complete file at every moment. */
  struct stat st;
  if (rc == PS_ERR_OK && keep_previous && stat(path, &st) == 0) {
    if (unlink(prev) != 0 && errno != ENOENT) {
      rc = ps_error_set(err, PS_ERR_IO, "removing %s: %s", prev, strerror(errno));
    } else if (link(path, prev) != 0) {
      rc = ps_error_set(err, PS_ERR_IO, "keeping %s as %s: %s", path, prev, strerror(errno));
    }
  }
  if (rc == PS_ERR_OK && rename(tmp, path) != 0) {
    rc = ps_error_set(err, PS_ERR_IO, "renaming %s to %s: %s", tmp, path, strerror(errno));
  }
  if (rc != PS_ERR_OK) {
    unlink(tmp);
    return rc;
  }
  return sync_folder(path, err);
}
