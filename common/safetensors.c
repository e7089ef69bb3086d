/* safetensors writing with an atomic replace. */
#define _POSIX_C_SOURCE 200809L
#include "common/safetensors.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

ps_err safetensors_write(const char *path, const tensor_layout *layout, const float *data,
                         const char *const *metadata, ps_error *err) {
  size_t cap = 256, len = 0;
  char *json = malloc(cap);
  if (json == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "safetensors: out of memory");
  json[0] = '\0';
  int ok = appendf(&json, &len, &cap, "{");
  if (metadata != NULL && metadata[0] != NULL) {
    ok = ok && appendf(&json, &len, &cap, "\"__metadata__\":{");
    for (int i = 0; ok && metadata[i] != NULL && metadata[i + 1] != NULL; i += 2) {
      ok = appendf(&json, &len, &cap, "%s\"%s\":\"%s\"", i > 0 ? "," : "", metadata[i],
                   metadata[i + 1]);
    }
    ok = ok && appendf(&json, &len, &cap, "},");
  }
  for (int t = 0; ok && t < layout->count; t++) {
    const tensor_info *info = &layout->tensors[t];
    ok = appendf(&json, &len, &cap, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[", t > 0 ? "," : "",
                 info->name);
    for (int d = 0; ok && d < info->rank; d++) {
      ok = appendf(&json, &len, &cap, "%s%ld", d > 0 ? "," : "", info->shape[d]);
    }
    ok = ok && appendf(&json, &len, &cap, "],\"data_offsets\":[%zu,%zu]}",
                       info->offset * sizeof(float), (info->offset + info->count) * sizeof(float));
  }
  ok = ok && appendf(&json, &len, &cap, "}");
  /* Pad with spaces so the data starts 8-byte aligned, as the format suggests. */
  while (ok && (8 + len) % 8 != 0) ok = appendf(&json, &len, &cap, " ");
  if (!ok) {
    free(json);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "safetensors: out of memory for the header");
  }

  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    free(json);
    return ps_error_set(err, PS_ERR_IO, "creating %s: %s", tmp, strerror(errno));
  }
  uint8_t header_len[8];
  for (int i = 0; i < 8; i++) header_len[i] = (uint8_t)((uint64_t)len >> (8 * i));
  ps_err rc = write_all(fd, header_len, 8, tmp, err);
  if (rc == PS_ERR_OK) rc = write_all(fd, json, len, tmp, err);
  if (rc == PS_ERR_OK) rc = write_all(fd, data, layout->total * sizeof(float), tmp, err);
  free(json);
  if (rc == PS_ERR_OK && fsync(fd) != 0) {
    rc = ps_error_set(err, PS_ERR_IO, "fsync of %s: %s", tmp, strerror(errno));
  }
  if (close(fd) != 0 && rc == PS_ERR_OK) {
    rc = ps_error_set(err, PS_ERR_IO, "closing %s: %s", tmp, strerror(errno));
  }
  if (rc == PS_ERR_OK && rename(tmp, path) != 0) {
    rc = ps_error_set(err, PS_ERR_IO, "renaming %s to %s: %s", tmp, path, strerror(errno));
  }
  if (rc != PS_ERR_OK) {
    unlink(tmp);
    return rc;
  }
  /* The rename is durable once the folder's entry is. */
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
