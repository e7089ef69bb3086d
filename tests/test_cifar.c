/* The CIFAR-10 reader on small folders this test writes (3 records per
 * training batch, 4 in test_batch.bin): counts, labels, the CHW pixel
 * order, the limit across files, the per-channel statistics against a
 * two-pass computation here, the gathered float inputs; and the refusals
 * (a size not a whole number of records, a label of 10, a missing batch,
 * an empty file), each naming the file and leaving nothing loaded. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/check.h"
#include "trainer/data/cifar.h"
#include "trainer/data/sampler.h"

#define PER_BATCH 3
#define TEST_RECORDS 4
#define TRAIN_RECORDS (CIFAR_TRAIN_FILES * PER_BATCH)
#define PLANE (CIFAR_SIDE * CIFAR_SIDE)

static char root[] = "/tmp/pstrain-test-cifar-XXXXXX";

/* Pixel k of channel c of record g (g: the record's place in the set, the
 * test set's from 100): distinct per channel, so a wrong order shows. */
static uint8_t pixel(int g, int c, int k) { return (uint8_t)((g * 7 + c * 85 + k * 3) & 255); }
static uint8_t label(int g) { return (uint8_t)(g % DATASET_CLASSES); }

static void write_batch(const char *dir, const char *name, int first, int n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  REQUIRE(f != NULL);
  uint8_t rec[CIFAR_RECORD_BYTES];
  for (int g = first; g < first + n; g++) {
    rec[0] = label(g);
    for (int c = 0; c < CIFAR_CHANNELS; c++) {
      for (int k = 0; k < PLANE; k++) rec[1 + c * PLANE + k] = pixel(g, c, k);
    }
    REQUIRE(fwrite(rec, 1, sizeof rec, f) == sizeof rec);
  }
  REQUIRE(fclose(f) == 0);
}

/* A whole folder named `name` under root; its path in dir. */
static void make_set(const char *name, char *dir, size_t len) {
  snprintf(dir, len, "%s/%s", root, name);
  REQUIRE(mkdir(dir, 0700) == 0);
  for (int i = 0; i < CIFAR_TRAIN_FILES; i++) {
    char file[32];
    snprintf(file, sizeof file, "data_batch_%d.bin", i + 1);
    write_batch(dir, file, i * PER_BATCH, PER_BATCH);
  }
  write_batch(dir, "test_batch.bin", 100, TEST_RECORDS);
}

static void check_contents(const dataset *ds, int first, long count) {
  CHECK_EQ_INT(ds->count, count);
  CHECK_EQ_INT(ds->channels, 3);
  CHECK_EQ_INT(ds->rows, 32);
  CHECK_EQ_INT(ds->cols, 32);
  int wrong_labels = 0, wrong_pixels = 0;
  for (long i = 0; i < ds->count; i++) {
    int g = first + (int)i;
    wrong_labels += ds->labels[i] != label(g);
    for (int c = 0; c < CIFAR_CHANNELS; c++) {
      for (int k = 0; k < PLANE; k++) {
        wrong_pixels += ds->pixels[i * CIFAR_IMAGE_BYTES + c * PLANE + k] != pixel(g, c, k);
      }
    }
  }
  CHECK_EQ_INT(wrong_labels, 0);
  CHECK_EQ_INT(wrong_pixels, 0);
}

/* Each channel's mean and std over records 0..n-1, two-pass, in double. */
static void expected_stats(int n, double *mean, double *std) {
  for (int c = 0; c < CIFAR_CHANNELS; c++) {
    double sum = 0, dev = 0;
    for (int g = 0; g < n; g++) {
      for (int k = 0; k < PLANE; k++) sum += pixel(g, c, k) / 255.0;
    }
    mean[c] = sum / ((double)n * PLANE);
    for (int g = 0; g < n; g++) {
      for (int k = 0; k < PLANE; k++) {
        double d = pixel(g, c, k) / 255.0 - mean[c];
        dev += d * d;
      }
    }
    std[c] = sqrt(dev / ((double)n * PLANE));
  }
}

static void check_stats(const dataset *ds, int n) {
  double mean[3], std[3];
  expected_stats(n, mean, std);
  CHECK_EQ_INT(ds->normalized, 1);
  for (int c = 0; c < CIFAR_CHANNELS; c++) {
    CHECK_NEAR(ds->mean[c], mean[c], 1e-6);
    CHECK_NEAR(ds->std[c], std[c], 1e-6);
  }
}

/* Gathered test records 2 and 0 on the training set's statistics. */
static void check_gather(dataset *test, const dataset *train) {
  memcpy(test->mean, train->mean, sizeof test->mean);
  memcpy(test->std, train->std, sizeof test->std);
  test->normalized = 1;
  long idx[2] = {2, 0};
  static float images[2 * CIFAR_IMAGE_BYTES];
  int32_t labels[2];
  sampler_gather(test, idx, 2, images, labels);
  CHECK_EQ_INT(labels[0], label(102));
  CHECK_EQ_INT(labels[1], label(100));
  double worst = 0;
  for (int b = 0; b < 2; b++) {
    for (int c = 0; c < CIFAR_CHANNELS; c++) {
      for (int k = 0; k < PLANE; k++) {
        double p = pixel(100 + (int)idx[b], c, k) / 255.0;
        double want = (p - train->mean[c]) / train->std[c];
        double d = fabs(images[b * CIFAR_IMAGE_BYTES + c * PLANE + k] - want);
        worst = d > worst ? d : worst;
      }
    }
  }
  CHECK_NEAR(worst, 0.0, 1e-5);
}

static void overwrite(const char *dir, const char *name, const void *data, size_t len) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  REQUIRE(f != NULL);
  REQUIRE(fwrite(data, 1, len, f) == len);
  REQUIRE(fclose(f) == 0);
}

/* cifar_load refuses the training (train 1) or test set with code and a
 * message holding want, and leaves nothing in ds. */
static void expect_refusal(const char *dir, int train, long limit, ps_err code,
                           const char *want) {
  dataset ds;
  ps_error err;
  CHECK_EQ_INT(cifar_load(dir, train, limit, &ds, &err), code);
  CHECK_CONTAINS(err.msg, want);
  CHECK(ds.pixels == NULL && ds.labels == NULL && ds.count == 0);
}

static void check_refusals(void) {
  char dir[256];
  static uint8_t buf[PER_BATCH * CIFAR_RECORD_BYTES + 5];

  make_set("ragged", dir, sizeof dir);
  overwrite(dir, "data_batch_2.bin", buf, PER_BATCH * CIFAR_RECORD_BYTES + 5);
  expect_refusal(dir, 1, 0, PS_ERR_CORRUPT_DATA,
                 "data_batch_2.bin: 9224 bytes is not a whole number of 3073-byte");
  /* Past the limit too: the set is refused whole. */
  expect_refusal(dir, 1, 1, PS_ERR_CORRUPT_DATA, "data_batch_2.bin");

  make_set("label10", dir, sizeof dir);
  memset(buf, 0, sizeof buf);
  buf[CIFAR_RECORD_BYTES] = 10; /* record 1's label */
  overwrite(dir, "data_batch_4.bin", buf, PER_BATCH * CIFAR_RECORD_BYTES);
  expect_refusal(dir, 1, 0, PS_ERR_CORRUPT_DATA, "data_batch_4.bin: record 1 has label 10");

  make_set("missing", dir, sizeof dir);
  char path[512];
  snprintf(path, sizeof path, "%s/data_batch_3.bin", dir);
  REQUIRE(unlink(path) == 0);
  expect_refusal(dir, 1, 0, PS_ERR_IO, "data_batch_3.bin: No such file");
  dataset ds;
  ps_error err;
  REQUIRE(cifar_load(dir, 0, 0, &ds, &err) == PS_ERR_OK); /* the test set is whole */
  dataset_free(&ds);

  make_set("empty", dir, sizeof dir);
  overwrite(dir, "test_batch.bin", buf, 0);
  expect_refusal(dir, 0, 0, PS_ERR_CORRUPT_DATA, "test_batch.bin: empty file");
  REQUIRE(cifar_load(dir, 1, 0, &ds, &err) == PS_ERR_OK);
  dataset_free(&ds);

  /* A folder without data_batch_1.bin is no CIFAR-10 folder. */
  snprintf(dir, sizeof dir, "%s/none", root);
  REQUIRE(mkdir(dir, 0700) == 0);
  CHECK(!cifar_detect(dir));
  expect_refusal(dir, 1, 0, PS_ERR_IO, "data_batch_1.bin");
}

int main(void) {
  REQUIRE(mkdtemp(root) != NULL);
  char dir[256];
  make_set("good", dir, sizeof dir);
  CHECK(cifar_detect(dir));
  ps_error err;
  dataset train, test, part;

  REQUIRE(cifar_load(dir, 1, 0, &train, &err) == PS_ERR_OK);
  check_contents(&train, 0, TRAIN_RECORDS);
  check_stats(&train, TRAIN_RECORDS);
  REQUIRE(cifar_load(dir, 0, 0, &test, &err) == PS_ERR_OK);
  check_contents(&test, 100, TEST_RECORDS);
  CHECK_EQ_INT(test.normalized, 0); /* the caller gives it the training set's statistics */
  check_gather(&test, &train);

  /* The limit runs across files: 7 records are batches 1 and 2 and the
   * first of batch 3; the statistics are theirs. */
  REQUIRE(cifar_load(dir, 1, 7, &part, &err) == PS_ERR_OK);
  check_contents(&part, 0, 7);
  check_stats(&part, 7);
  dataset_free(&part);
  REQUIRE(cifar_load(dir, 0, 2, &part, &err) == PS_ERR_OK);
  check_contents(&part, 100, 2);
  dataset_free(&part);
  REQUIRE(cifar_load(dir, 1, 1000, &part, &err) == PS_ERR_OK);
  CHECK_EQ_INT(part.count, TRAIN_RECORDS);
  dataset_free(&part);

  /* A channel that never varies is centred, not divided by zero. */
  uint8_t flat_pixels[CIFAR_IMAGE_BYTES] = {0}, flat_labels[1] = {0};
  memset(flat_pixels, 51, PLANE); /* red: all 0.2 */
  dataset flat = {.count = 1, .channels = 3, .rows = 32, .cols = 32, .pixels = flat_pixels,
                  .labels = flat_labels};
  cifar_channel_stats(&flat);
  CHECK_NEAR(flat.mean[0], 0.2, 1e-7);
  CHECK_NEAR(flat.std[0], 1.0, 0);
  CHECK_NEAR(flat.std[1], 1.0, 0);

  check_refusals();
  dataset_free(&train);
  dataset_free(&test);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  CHECK(system(cmd) == 0);
  return check_report("test_cifar");
}
