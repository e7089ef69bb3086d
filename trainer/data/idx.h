/* Reads MNIST-style IDX files (gzip'd or plain) into a dataset of 8-bit
 * images and labels. Checks magic numbers, dimensions, truncation, that the
 * image and label counts agree and that labels are class ids. */
#ifndef PSTRAIN_TRAINER_IDX_H
#define PSTRAIN_TRAINER_IDX_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#define IDX_IMAGES_MAGIC 0x00000803u /* unsigned byte, 3 dimensions */
#define IDX_LABELS_MAGIC 0x00000801u /* unsigned byte, 1 dimension */
#define DATASET_CLASSES 10
#define DATASET_MAX_CHANNELS 3

typedef struct dataset {
  long count;
  int channels; /* 1 (IDX, grey) or 3 (CIFAR-10, RGB) */
  int rows, cols;
  uint8_t *pixels; /* (count, channels * rows * cols) in CHW order, owned */
  uint8_t *labels; /* (count), each < DATASET_CLASSES, owned */
  /* normalized: a pixel p of channel c enters the model as
   * (p / 255 - mean[c]) / std[c]; else as p / 255. */
  int normalized;
  float mean[DATASET_MAX_CHANNELS], std[DATASET_MAX_CHANNELS];
} dataset;

/* Values per image: channels * rows * cols. */
static inline size_t dataset_image_size(const dataset *ds) {
  return (size_t)ds->channels * (size_t)ds->rows * (size_t)ds->cols;
}

/* Reads an image file: its first `limit` images when 0 < limit < the file's
 * count (the rest is neither decompressed nor checked: most of a trainer's
 * start-up on Fashion-MNIST was inflating images it did not use), else all
 * of them and checks that the file ends there. *count is the file's count.
 * On success *pixels is owned by the caller. */
ps_err idx_read_images(const char *path, long limit, long *count, int *rows, int *cols,
                       uint8_t **pixels, ps_error *err);

/* Reads a label file's first `limit` labels (all when limit <= 0), as
 * idx_read_images. On success *labels is owned by the caller. */
ps_err idx_read_labels(const char *path, long limit, long *count, uint8_t **labels,
                       ps_error *err);

/* Loads DIR/PREFIX-images-idx3-ubyte[.gz] and DIR/PREFIX-labels-idx1-ubyte[.gz]
 * (PREFIX is "train" or "t10k"), keeping the first `limit` samples when
 * limit > 0. On error nothing is left allocated. */
ps_err dataset_load(const char *dir, const char *prefix, long limit, dataset *ds, ps_error *err);
void dataset_free(dataset *ds);

#endif
