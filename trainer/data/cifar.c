/* CIFAR-10 binary batches into a dataset (see cifar.h). */
#define _POSIX_C_SOURCE 200809L
#include "trainer/data/cifar.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CIFAR_PATH_MAX 4096

static ps_err file_path(const char *dir, const char *name, char *buf, ps_error *err) {
  int n = snprintf(buf, CIFAR_PATH_MAX, "%s/%s", dir, name);
  if (n < 0 || n >= CIFAR_PATH_MAX) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--data %s: path too long for %s", dir,
                        name);
  }
  return PS_ERR_OK;
}

int cifar_detect(const char *dir) {
  char path[CIFAR_PATH_MAX];
  ps_error ignored;
  struct stat st;
  return file_path(dir, "data_batch_1.bin", path, &ignored) == PS_ERR_OK &&
         stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The records in path, from its size: every file is checked before any is
 * read, so a bad one refuses the set without a partial load. */
static ps_err count_records(const char *path, long *records, ps_error *err) {
  struct stat st;
  if (stat(path, &st) != 0) {
    return ps_error_set(err, PS_ERR_IO, "opening %s: %s", path, strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return ps_error_set(err, PS_ERR_IO, "opening %s: not a regular file", path);
  }
  if (st.st_size == 0) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: empty file (no CIFAR-10 records)", path);
  }
  if (st.st_size % CIFAR_RECORD_BYTES != 0) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                        "%s: %lld bytes is not a whole number of %d-byte CIFAR-10 records "
                        "(1 label byte, %d pixel bytes)",
                        path, (long long)st.st_size, CIFAR_RECORD_BYTES, CIFAR_IMAGE_BYTES);
  }
  *records = (long)(st.st_size / CIFAR_RECORD_BYTES);
  return PS_ERR_OK;
}

/* Reads the first n records of path into pixels (n, 3072) and labels (n). */
static ps_err read_records(const char *path, long n, uint8_t *pixels, uint8_t *labels,
                           ps_error *err) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return ps_error_set(err, PS_ERR_IO, "opening %s: %s", path, strerror(errno));
  uint8_t record[CIFAR_RECORD_BYTES];
  ps_err status = PS_ERR_OK;
  for (long i = 0; i < n && status == PS_ERR_OK; i++) {
    if (fread(record, 1, sizeof record, f) != sizeof record) {
      status = ps_error_set(err, PS_ERR_CORRUPT_DATA, "reading %s: %s at record %ld", path,
                            ferror(f) ? strerror(errno) : "file is truncated", i);
    } else if (record[0] >= DATASET_CLASSES) {
      status = ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: record %ld has label %u, not 0..%d",
                            path, i, record[0], DATASET_CLASSES - 1);
    } else {
      labels[i] = record[0];
      memcpy(pixels + (size_t)i * CIFAR_IMAGE_BYTES, record + 1, CIFAR_IMAGE_BYTES);
    }
  }
  if (fclose(f) != 0 && status == PS_ERR_OK) {
    status = ps_error_set(err, PS_ERR_IO, "closing %s: %s", path, strerror(errno));
  }
  return status;
}

/* The set's file paths and each one's record count; *total their sum. */
static ps_err find_files(const char *dir, int train, char (*paths)[CIFAR_PATH_MAX],
                         long *records, int *files, long *total, ps_error *err) {
  *files = train ? CIFAR_TRAIN_FILES : 1;
  *total = 0;
  for (int i = 0; i < *files; i++) {
    char name[32];
    if (train) {
      snprintf(name, sizeof name, "data_batch_%d.bin", i + 1);
    } else {
      snprintf(name, sizeof name, "test_batch.bin");
    }
    PS_TRY(file_path(dir, name, paths[i], err));
    PS_TRY(count_records(paths[i], &records[i], err));
    *total += records[i];
  }
  return PS_ERR_OK;
}

ps_err cifar_load(const char *dir, int train, long limit, dataset *ds, ps_error *err) {
  memset(ds, 0, sizeof *ds);
  char paths[CIFAR_TRAIN_FILES][CIFAR_PATH_MAX];
  long records[CIFAR_TRAIN_FILES], total;
  int files;
  PS_TRY(find_files(dir, train, paths, records, &files, &total, err));
  long count = limit > 0 && limit < total ? limit : total;
  uint8_t *pixels = malloc((size_t)count * CIFAR_IMAGE_BYTES);
  uint8_t *labels = malloc((size_t)count);
  if (pixels == NULL || labels == NULL) {
    free(pixels);
    free(labels);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "--data %s: cannot allocate %ld CIFAR-10 images",
                        dir, count);
  }
  long done = 0;
  for (int i = 0; i < files && done < count; i++) {
    long n = count - done < records[i] ? count - done : records[i];
    if (read_records(paths[i], n, pixels + (size_t)done * CIFAR_IMAGE_BYTES, labels + done,
                     err) != PS_ERR_OK) {
      free(pixels);
      free(labels);
      return err->code;
    }
    done += n;
  }
  *ds = (dataset){.count = count, .channels = CIFAR_CHANNELS, .rows = CIFAR_SIDE,
                  .cols = CIFAR_SIDE, .pixels = pixels, .labels = labels};
  if (train) cifar_channel_stats(ds);
  return PS_ERR_OK;
}

void cifar_channel_stats(dataset *ds) {
  const size_t plane = (size_t)ds->rows * (size_t)ds->cols, image = dataset_image_size(ds);
  for (int c = 0; c < ds->channels; c++) {
    /* Integer sums are exact and order-free: the same statistics on every
     * trainer and every run (squares overflow only past 2^64 / 255^2,
     * about 2.8e14 pixels). */
    uint64_t sum = 0, squares = 0;
    uint8_t lo = 255, hi = 0;
    for (long i = 0; i < ds->count; i++) {
      const uint8_t *p = ds->pixels + (size_t)i * image + (size_t)c * plane;
      for (size_t k = 0; k < plane; k++) {
        sum += p[k];
        squares += (uint64_t)p[k] * p[k];
        lo = p[k] < lo ? p[k] : lo;
        hi = p[k] > hi ? p[k] : hi;
      }
    }
    double n = (double)ds->count * (double)plane;
    double mean = (double)sum / n / 255.0;
    double var = (double)squares / n / (255.0 * 255.0) - mean * mean;
    ds->mean[c] = (float)mean;
    /* A channel that never varies has no scale to divide by. */
    ds->std[c] = lo == hi ? 1.0f : (float)sqrt(var > 0 ? var : 0.0);
  }
  ds->normalized = 1;
}
