/* safetensors writing with an atomic replace, and strict reading. */
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

/* A header longer than this is not one of ours. */
#define HEADER_MAX (1u << 20)

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
  size_t bytes = layout->total * sizeof(float);
  uint32_t crc = crc32c_update(0, data, bytes);
  size_t cap = 256, len = 0;
  char *json = malloc(cap);
  if (json == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "safetensors: out of memory");
  json[0] = '\0';
  int ok = appendf(&json, &len, &cap, "{\"__metadata__\":{\"crc32c\":\"%08x\"", crc);
  for (int i = 0; ok && metadata != NULL && metadata[i] != NULL && metadata[i + 1] != NULL;
       i += 2) {
    ok = appendf(&json, &len, &cap, ",\"%s\":\"%s\"", metadata[i], metadata[i + 1]);
  }
  ok = ok && appendf(&json, &len, &cap, "}");
  for (int t = 0; ok && t < layout->count; t++) {
    const tensor_info *info = &layout->tensors[t];
    ok = appendf(&json, &len, &cap, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", info->name);
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

  char tmp[4096], prev[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  snprintf(prev, sizeof prev, "%s.prev", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    free(json);
    return ps_error_set(err, PS_ERR_IO, "creating %s: %s", tmp, strerror(errno));
  }
  uint8_t header_len[8];
  for (int i = 0; i < 8; i++) header_len[i] = (uint8_t)((uint64_t)len >> (8 * i));
  ps_err rc = write_all(fd, header_len, 8, tmp, err);
  if (rc == PS_ERR_OK) rc = write_all(fd, json, len, tmp, err);
  if (rc == PS_ERR_OK) rc = write_all(fd, data, bytes, tmp, err);
  free(json);
  if (rc == PS_ERR_OK && fsync(fd) != 0) {
    rc = ps_error_set(err, PS_ERR_IO, "fsync of %s: %s", tmp, strerror(errno));
  }
  if (close(fd) != 0 && rc == PS_ERR_OK) {
    rc = ps_error_set(err, PS_ERR_IO, "closing %s: %s", tmp, strerror(errno));
  }
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

/* Parses the header and checks it describes exactly layout. */
static ps_err parse_header(const char *path, const char *json, size_t len,
                           const tensor_layout *layout, safetensors_meta *meta, ps_error *err) {
  json_cursor c = {json, json + len};
  char key[128], value[256];
  int tensor = 0;
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
      for (int mfirst = 1;; mfirst = 0) {
        skip_ws(&c);
        if (c.p < c.end && *c.p == '}') {
          c.p++;
          break;
        }
        if (!mfirst && !expect(&c, ',')) return bad_header(path, "malformed metadata", err);
        if (meta->count == SAFETENSORS_MAX_META ||
            !read_string(&c, meta->keys[meta->count], sizeof meta->keys[0]) || !expect(&c, ':') ||
            !read_string(&c, meta->values[meta->count], sizeof meta->values[0])) {
          return bad_header(path, "malformed metadata", err);
        }
        meta->count++;
      }
      continue;
    }
    if (layout == NULL) { /* metadata only: skip the entry */
      int depth = 1;
      while (c.p < c.end && depth > 0) {
        if (*c.p == '{') depth++;
        if (*c.p == '}') depth--;
        c.p++;
      }
      if (depth != 0) return bad_header(path, "malformed tensor entry", err);
      continue;
    }
    if (tensor >= layout->count || strcmp(key, layout->tensors[tensor].name) != 0) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: tensor '%s' where '%s' was expected", path,
                          key, tensor < layout->count ? layout->tensors[tensor].name : "(none)");
    }
    const tensor_info *info = &layout->tensors[tensor];
    long long shape[8] = {0}, offsets[2] = {0};
    int shape_n = -1, offsets_n = -1, dtype_ok = 0;
    for (int ffirst = 1;; ffirst = 0) {
      skip_ws(&c);
      if (c.p < c.end && *c.p == '}') {
        c.p++;
        break;
      }
      if (!ffirst && !expect(&c, ',')) return bad_header(path, "malformed tensor entry", err);
      if (!read_string(&c, value, sizeof value) || !expect(&c, ':')) {
        return bad_header(path, "malformed tensor entry", err);
      }
      if (strcmp(value, "dtype") == 0) {
        char dtype[16];
        if (!read_string(&c, dtype, sizeof dtype)) return bad_header(path, "malformed dtype", err);
        dtype_ok = strcmp(dtype, "F32") == 0;
      } else if (strcmp(value, "shape") == 0) {
        if (!read_int_array(&c, shape, 8, &shape_n)) return bad_header(path, "malformed shape", err);
      } else if (strcmp(value, "data_offsets") == 0) {
        if (!read_int_array(&c, offsets, 2, &offsets_n) || offsets_n != 2) {
          return bad_header(path, "malformed data_offsets", err);
        }
      } else {
        return bad_header(path, "unknown field in a tensor entry", err);
      }
    }
    int shape_ok = shape_n == info->rank;
    for (int d = 0; shape_ok && d < info->rank; d++) shape_ok = shape[d] == info->shape[d];
    if (!dtype_ok || !shape_ok || offsets_n != 2 ||
        offsets[0] != (long long)(info->offset * sizeof(float)) ||
        offsets[1] != (long long)((info->offset + info->count) * sizeof(float))) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                          "%s: tensor %s has another dtype, shape or place than expected", path,
                          info->name);
    }
    tensor++;
  }
  skip_ws(&c);
  if (c.p != c.end) return bad_header(path, "bytes after the header object", err);
  if (layout != NULL && tensor != layout->count) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: holds %d tensors, expected %d", path, tensor,
                        layout->count);
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
  if (rc == PS_ERR_OK) rc = parse_header(path, json, header_len, layout, meta, err);
  free(json);
  if (rc != PS_ERR_OK || layout == NULL) return rc;
  const char *want_crc = safetensors_meta_get(meta, "crc32c");
  char got_crc[16];
  snprintf(got_crc, sizeof got_crc, "%08x", crc32c_update(0, data, bytes));
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
