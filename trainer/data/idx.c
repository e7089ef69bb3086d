/* IDX file reading through zlib, which reads plain files transparently. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/data/idx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* Headers can claim any size; refuse the absurd before allocating. */
#define IDX_MAX_COUNT 100000000L
#define IDX_MAX_SIDE 4096
#define IDX_CHUNK (1u << 20)

static ps_err open_gz(const char *path, gzFile *out, ps_error *err) {
  struct stat st;
  if (stat(path, &st) != 0) {
    return ps_error_set(err, PS_ERR_IO, "opening %s: %s", path, strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return ps_error_set(err, PS_ERR_IO, "opening %s: not a regular file", path);
  }
  errno = 0;
  gzFile f = gzopen(path, "rb");
  if (f == NULL) {
    return ps_error_set(err, PS_ERR_IO, "opening %s: %s", path,
                        errno != 0 ? strerror(errno) : "zlib could not allocate its state");
  }
  *out = f;
  return PS_ERR_OK;
}

/* Reads exactly len bytes; a short read is truncation, a zlib error corruption. */
static ps_err read_exact(gzFile f, const char *path, void *buf, size_t len, const char *what,
                         ps_error *err) {
  size_t done = 0;
  while (done < len) {
    unsigned want = len - done > IDX_CHUNK ? IDX_CHUNK : (unsigned)(len - done);
    int got = gzread(f, (char *)buf + done, want);
    if (got < 0) {
      int zerr;
      const char *msg = gzerror(f, &zerr);
      return ps_error_set(err, PS_ERR_CORRUPT_DATA, "reading %s of %s: %s", what, path, msg);
    }
    if (got == 0) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                          "reading %s of %s: file is truncated (%zu of %zu bytes)", what, path,
                          done, len);
    }
    done += (size_t)got;
  }
  return PS_ERR_OK;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Reads and checks the magic, then `ndims` dimensions. */
static ps_err read_header(gzFile f, const char *path, uint32_t magic, int ndims, long *dims,
                          ps_error *err) {
  uint8_t header[12];
  if (read_exact(f, path, header, 4, "the header", err) != PS_ERR_OK) return err->code;
  uint32_t got = be32(header);
  if (got != magic) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                        "%s: wrong magic number 0x%08x (expected 0x%08x, an IDX %s file)", path, got,
                        magic, magic == IDX_IMAGES_MAGIC ? "image" : "label");
  }
  if (read_exact(f, path, header, 4 * (size_t)ndims, "the header", err) != PS_ERR_OK) {
    return err->code;
  }
  for (int i = 0; i < ndims; i++) dims[i] = (long)be32(header + 4 * i);
  return PS_ERR_OK;
}

/* Checks that nothing follows the data: trailing bytes mean a wrong header. */
static ps_err expect_end(gzFile f, const char *path, ps_error *err) {
  char extra;
  int got = gzread(f, &extra, 1);
  if (got < 0) {
    int zerr;
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "reading %s: %s", path, gzerror(f, &zerr));
  }
  if (got > 0) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                        "%s: data continues after the size its header gives", path);
  }
  return PS_ERR_OK;
}

static ps_err close_gz(gzFile f, const char *path, ps_err status, ps_error *err) {
  int rc = gzclose(f);
  if (status == PS_ERR_OK && rc != Z_OK) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "closing %s: zlib error %d (bad gzip trailer?)",
                        path, rc);
  }
  return status;
}

ps_err idx_read_images(const char *path, long limit, long *count, int *rows, int *cols,
                       uint8_t **pixels, ps_error *err) {
  gzFile f;
  if (open_gz(path, &f, err) != PS_ERR_OK) return err->code;
  long dims[3];
  uint8_t *data = NULL;
  ps_err status = read_header(f, path, IDX_IMAGES_MAGIC, 3, dims, err);
  if (status == PS_ERR_OK &&
      (dims[0] < 1 || dims[0] > IDX_MAX_COUNT || dims[1] < 1 || dims[1] > IDX_MAX_SIDE ||
       dims[2] < 1 || dims[2] > IDX_MAX_SIDE)) {
    status = ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: implausible dimensions %ld x %ld x %ld",
                          path, dims[0], dims[1], dims[2]);
  }
  long keep = limit > 0 && limit < dims[0] ? limit : dims[0];
  if (status == PS_ERR_OK) {
    size_t len = (size_t)keep * (size_t)dims[1] * (size_t)dims[2];
    data = malloc(len);
    if (data == NULL) {
      status = ps_error_set(err, PS_ERR_NO_MEMORY, "%s: cannot allocate %zu bytes of images", path,
                            len);
    } else if ((status = read_exact(f, path, data, len, "the images", err)) == PS_ERR_OK &&
               keep == dims[0]) {
      status = expect_end(f, path, err);
    }
  }
  status = close_gz(f, path, status, err);
  if (status != PS_ERR_OK) {
    free(data);
    return status;
  }
  *count = dims[0];
  *rows = (int)dims[1];
  *cols = (int)dims[2];
  *pixels = data;
  return PS_ERR_OK;
}

ps_err idx_read_labels(const char *path, long limit, long *count, uint8_t **labels,
                       ps_error *err) {
  gzFile f;
  if (open_gz(path, &f, err) != PS_ERR_OK) return err->code;
  long n = 0;
  uint8_t *data = NULL;
  ps_err status = read_header(f, path, IDX_LABELS_MAGIC, 1, &n, err);
  if (status == PS_ERR_OK && (n < 1 || n > IDX_MAX_COUNT)) {
    status = ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: implausible label count %ld", path, n);
  }
  long keep = limit > 0 && limit < n ? limit : n;
  if (status == PS_ERR_OK) {
    data = malloc((size_t)keep);
    if (data == NULL) {
      status = ps_error_set(err, PS_ERR_NO_MEMORY, "%s: cannot allocate %ld labels", path, keep);
    } else if ((status = read_exact(f, path, data, (size_t)keep, "the labels", err)) ==
                   PS_ERR_OK &&
               keep == n) {
      status = expect_end(f, path, err);
    }
  }
  for (long i = 0; status == PS_ERR_OK && i < keep; i++) {
    if (data[i] >= DATASET_CLASSES) {
      status = ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: label %u at index %ld is not 0..%d",
                            path, data[i], i, DATASET_CLASSES - 1);
    }
  }
  status = close_gz(f, path, status, err);
  if (status != PS_ERR_OK) {
    free(data);
    return status;
  }
  *count = n;
  *labels = data;
  return PS_ERR_OK;
}

/* DIR/NAME.gz if it exists, else DIR/NAME. */
static void data_path(const char *dir, const char *name, char *buf, size_t len) {
  struct stat st;
  snprintf(buf, len, "%s/%s.gz", dir, name);
  if (stat(buf, &st) != 0) snprintf(buf, len, "%s/%s", dir, name);
}

ps_err dataset_load(const char *dir, const char *prefix, long limit, dataset *ds, ps_error *err) {
  char images_path[4096], labels_path[4096], name[64];
  memset(ds, 0, sizeof *ds);
  snprintf(name, sizeof name, "%s-images-idx3-ubyte", prefix);
  data_path(dir, name, images_path, sizeof images_path);
  snprintf(name, sizeof name, "%s-labels-idx1-ubyte", prefix);
  data_path(dir, name, labels_path, sizeof labels_path);

  long image_count, label_count;
  if (idx_read_images(images_path, limit, &image_count, &ds->rows, &ds->cols, &ds->pixels,
                      err) != PS_ERR_OK) {
    return err->code;
  }
  if (idx_read_labels(labels_path, limit, &label_count, &ds->labels, err) != PS_ERR_OK) {
    dataset_free(ds);
    return err->code;
  }
  if (image_count != label_count) {
    ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s holds %ld images but %s holds %ld labels",
                 images_path, image_count, labels_path, label_count);
    dataset_free(ds);
    return err->code;
  }
  ds->channels = 1;
  ds->count = limit > 0 && limit < image_count ? limit : image_count;
  return PS_ERR_OK;
}

void dataset_free(dataset *ds) {
  free(ds->pixels);
  free(ds->labels);
  memset(ds, 0, sizeof *ds);
}
