/* The IDX reader on small files this test writes: plain and gzip'd, and every
 * kind of broken file (wrong magic, truncated, trailing bytes, bad label,
 * counts that disagree, missing, corrupt gzip). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "tests/check.h"
#include "trainer/data/idx.h"

static char dir[] = "/tmp/pstrain-test-idx-XXXXXX";

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

static void write_file(const char *name, const void *data, size_t len, int gzip) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (gzip) {
    gzFile f = gzopen(path, "wb");
    REQUIRE(f != NULL);
    REQUIRE(gzwrite(f, data, (unsigned)len) == (int)len);
    REQUIRE(gzclose(f) == Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    REQUIRE(f != NULL);
    REQUIRE(fwrite(data, 1, len, f) == len);
    REQUIRE(fclose(f) == 0);
  }
}

/* An image file of n images of 2x3 with pixel (i, k) = 10 i + k. */
static size_t make_images(uint8_t *buf, uint32_t magic, uint32_t n) {
  put_be32(buf, magic);
  put_be32(buf + 4, n);
  put_be32(buf + 8, 2);
  put_be32(buf + 12, 3);
  for (uint32_t i = 0; i < n; i++) {
    for (int k = 0; k < 6; k++) buf[16 + 6 * i + k] = (uint8_t)(10 * i + k);
  }
  return 16 + 6 * (size_t)n;
}

static size_t make_labels(uint8_t *buf, uint32_t n, const uint8_t *labels) {
  put_be32(buf, IDX_LABELS_MAGIC);
  put_be32(buf + 4, n);
  memcpy(buf + 8, labels, n);
  return 8 + (size_t)n;
}

static void path_of(const char *name, char *out, size_t len) {
  snprintf(out, len, "%s/%s", dir, name);
}

static const uint8_t labels4[4] = {3, 0, 9, 7};

/* Four 2 x 3 images and their labels, as train (plain) and t10k (gzip'd). */
static void good_files_fixture(void) {
  uint8_t img[256], lab[64];
  size_t img_len = make_images(img, IDX_IMAGES_MAGIC, 4);
  size_t lab_len = make_labels(lab, 4, labels4);
  write_file("train-images-idx3-ubyte", img, img_len, 0);
  write_file("train-labels-idx1-ubyte", lab, lab_len, 0);
  write_file("t10k-images-idx3-ubyte.gz", img, img_len, 1);
  write_file("t10k-labels-idx1-ubyte.gz", lab, lab_len, 1);
}

/* Plain and gzip'd files read alike. */
static void case_plain_and_gzip_read_alike(void) {
  ps_error err;
  good_files_fixture();
  dataset plain, gz;
  REQUIRE(dataset_load(dir, "train", 0, &plain, &err) == PS_ERR_OK);
  REQUIRE(dataset_load(dir, "t10k", 0, &gz, &err) == PS_ERR_OK);
  CHECK_EQ_INT(plain.count, 4);
  CHECK_EQ_INT(plain.channels, 1);
  CHECK_EQ_INT(plain.normalized, 0); /* IDX keeps the plain p / 255 */
  CHECK_EQ_INT(plain.rows, 2);
  CHECK_EQ_INT(plain.cols, 3);
  CHECK_EQ_INT(plain.pixels[6 * 3 + 5], 35);
  CHECK_EQ_INT(plain.labels[2], 9);
  CHECK(memcmp(plain.pixels, gz.pixels, 24) == 0);
  CHECK(memcmp(plain.labels, gz.labels, 4) == 0);
  dataset_free(&plain);
  dataset_free(&gz);
}

/* A limit keeps the first samples. */
static void case_limit_keeps_first_samples(void) {
  ps_error err;
  dataset plain;
  good_files_fixture();
  REQUIRE(dataset_load(dir, "train", 2, &plain, &err) == PS_ERR_OK);
  CHECK_EQ_INT(plain.count, 2);
  CHECK_EQ_INT(plain.labels[1], 0);
  dataset_free(&plain);
}

/* With a limit only the first records are read: a file damaged after them
 * loads (what is read is still checked), and the count is the file's. */
static void case_limit_reads_only_the_prefix(void) {
  char path[256];
  ps_error err;
  long count;
  int rows, cols;
  uint8_t *pixels, *labels, img[256], lab[64];
  size_t img_len = make_images(img, IDX_IMAGES_MAGIC, 4);
  write_file("prefix-images.gz", img, img_len - 5, 1);
  path_of("prefix-images.gz", path, sizeof path);
  REQUIRE(idx_read_images(path, 3, &count, &rows, &cols, &pixels, &err) == PS_ERR_OK);
  CHECK_EQ_INT(count, 4);
  CHECK_EQ_INT(pixels[2 * 6 + 4], 24);
  free(pixels);
  CHECK_EQ_INT(idx_read_images(path, 4, &count, &rows, &cols, &pixels, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "truncated");
  const uint8_t bad_last[4] = {3, 0, 9, 10};
  size_t lab_len = make_labels(lab, 4, bad_last);
  write_file("prefix-labels", lab, lab_len, 0);
  path_of("prefix-labels", path, sizeof path);
  REQUIRE(idx_read_labels(path, 3, &count, &labels, &err) == PS_ERR_OK);
  CHECK_EQ_INT(labels[2], 9);
  free(labels);
  CHECK_EQ_INT(idx_read_labels(path, 0, &count, &labels, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "label 10 at index 3");
}

/* Wrong magic: a label file where images are expected. */
static void case_wrong_magic(void) {
  char path[256];
  ps_error err;
  long count;
  int rows, cols;
  uint8_t *pixels;
  good_files_fixture();
  path_of("train-labels-idx1-ubyte", path, sizeof path);
  CHECK_EQ_INT(idx_read_images(path, 0, &count, &rows, &cols, &pixels, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "wrong magic number 0x00000801");
  CHECK_CONTAINS(err.msg, "train-labels-idx1-ubyte");
}

/* Truncated images, plain and gzip'd; truncated header. */
static void case_truncated_files(void) {
  char path[256];
  ps_error err;
  long count;
  int rows, cols;
  uint8_t *pixels;
  uint8_t img[256];
  size_t img_len = make_images(img, IDX_IMAGES_MAGIC, 4);
  write_file("short-images", img, img_len - 5, 0);
  path_of("short-images", path, sizeof path);
  CHECK_EQ_INT(idx_read_images(path, 0, &count, &rows, &cols, &pixels, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "truncated (19 of 24 bytes)");
  write_file("short-images.gz", img, img_len - 5, 1);
  path_of("short-images.gz", path, sizeof path);
  CHECK_EQ_INT(idx_read_images(path, 0, &count, &rows, &cols, &pixels, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "truncated");
  write_file("short-header", img, 10, 0);
  path_of("short-header", path, sizeof path);
  CHECK_EQ_INT(idx_read_images(path, 0, &count, &rows, &cols, &pixels, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "reading the header");
}

/* Trailing bytes: the header's count is wrong. */
static void case_trailing_bytes(void) {
  char path[256];
  ps_error err;
  long count;
  int rows, cols;
  uint8_t *pixels;
  uint8_t img[256];
  size_t img_len = make_images(img, IDX_IMAGES_MAGIC, 4);
  write_file("long-images", img, img_len + 6, 0);
  path_of("long-images", path, sizeof path);
  CHECK_EQ_INT(idx_read_images(path, 0, &count, &rows, &cols, &pixels, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "data continues after");
}

/* Zero dimensions. */
static void case_zero_dimensions(void) {
  char path[256];
  ps_error err;
  long count;
  int rows, cols;
  uint8_t *pixels;
  uint8_t img[256];
  make_images(img, IDX_IMAGES_MAGIC, 0);
  write_file("empty-images", img, 16, 0);
  path_of("empty-images", path, sizeof path);
  CHECK_EQ_INT(idx_read_images(path, 0, &count, &rows, &cols, &pixels, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "implausible dimensions 0 x 2 x 3");
}

/* A label that is no class. */
static void case_label_out_of_range(void) {
  char path[256];
  ps_error err;
  long count;
  uint8_t lab[64], *labels;
  size_t lab_len = make_labels(lab, 4, labels4);
  const uint8_t bad_labels[4] = {3, 0, 10, 7};
  make_labels(lab, 4, bad_labels);
  write_file("bad-labels", lab, lab_len, 0);
  path_of("bad-labels", path, sizeof path);
  CHECK_EQ_INT(idx_read_labels(path, 0, &count, &labels, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "label 10 at index 2 is not 0..9");
}

/* Counts that disagree. */
static void case_counts_disagree(void) {
  ps_error err;
  uint8_t img[256], lab[64];
  size_t img_len, lab_len;
  dataset plain;
  img_len = make_images(img, IDX_IMAGES_MAGIC, 4);
  lab_len = make_labels(lab, 3, labels4);
  write_file("odd-images-idx3-ubyte", img, img_len, 0);
  write_file("odd-labels-idx1-ubyte", lab, lab_len, 0);
  CHECK_EQ_INT(dataset_load(dir, "odd", 0, &plain, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "holds 4 images but");
  CHECK_CONTAINS(err.msg, "holds 3 labels");
  CHECK(plain.pixels == NULL && plain.labels == NULL);
}

/* Missing files. */
static void case_missing_files(void) {
  ps_error err;
  dataset plain;
  CHECK_EQ_INT(dataset_load(dir, "nothing", 0, &plain, &err), PS_ERR_IO);
  CHECK_CONTAINS(err.msg, "nothing-images-idx3-ubyte");
  CHECK_CONTAINS(err.msg, "No such file");
  CHECK_EQ_INT(dataset_load(dir, "..", 0, &plain, &err), PS_ERR_IO);
}

/* A gzip stream with a damaged body. */
static void case_damaged_gzip(void) {
  char path[256];
  ps_error err;
  long count;
  int rows, cols;
  uint8_t *pixels;
  uint8_t img[256];
  size_t img_len;
  img_len = make_images(img, IDX_IMAGES_MAGIC, 4);
  write_file("damaged.gz", img, img_len, 1);
  path_of("damaged.gz", path, sizeof path);
  FILE *f = fopen(path, "r+b");
  REQUIRE(f != NULL);
  REQUIRE(fseek(f, 12, SEEK_SET) == 0);
  REQUIRE(fwrite("\xff\xff\xff\xff\xff\xff", 1, 6, f) == 6);
  REQUIRE(fclose(f) == 0);
  CHECK_EQ_INT(idx_read_images(path, 0, &count, &rows, &cols, &pixels, &err), PS_ERR_CORRUPT_DATA);
}

/* A folder is not a data file. */
static void case_folder_not_data_file(void) {
  ps_error err;
  long count;
  int rows, cols;
  uint8_t *pixels;
  CHECK_EQ_INT(idx_read_images(dir, 0, &count, &rows, &cols, &pixels, &err), PS_ERR_IO);
  CHECK_CONTAINS(err.msg, "not a regular file");
}

int main(void) {
  REQUIRE(mkdtemp(dir) != NULL);
  RUN_CASE(case_plain_and_gzip_read_alike);
  RUN_CASE(case_limit_keeps_first_samples);
  RUN_CASE(case_limit_reads_only_the_prefix);
  RUN_CASE(case_wrong_magic);
  RUN_CASE(case_truncated_files);
  RUN_CASE(case_trailing_bytes);
  RUN_CASE(case_zero_dimensions);
  RUN_CASE(case_label_out_of_range);
  RUN_CASE(case_counts_disagree);
  RUN_CASE(case_missing_files);
  RUN_CASE(case_damaged_gzip);
  RUN_CASE(case_folder_not_data_file);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
  return check_report("test_idx");
}
