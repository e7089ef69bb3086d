/* Reads MNIST-style IDX files (gzip'd or plain) into a dataset of 8-bit
 * images and labels. Checks magic numbers, dimensions, truncation, that the
 * image and label counts agree and that labels are class ids. */
#ifndef PSTRAIN_TRAINER_IDX_H
#define PSTRAIN_TRAINER_IDX_H

#include <stdint.h>

#include "common/error.h"

#define IDX_IMAGES_MAGIC 0x00000803u /* unsigned byte, 3 dimensions */
#define IDX_LABELS_MAGIC 0x00000801u /* unsigned byte, 1 dimension */
#define DATASET_CLASSES 10

typedef struct dataset {
  long count;
  int rows, cols;
  uint8_t *pixels; /* (count, rows * cols), owned */
  uint8_t *labels; /* (count), each < DATASET_CLASSES, owned */
} dataset;

/* Reads an image file. On success *pixels is owned by the caller. */
ps_err idx_read_images(const char *path, long *count, int *rows, int *cols, uint8_t **pixels,
                       ps_error *err);

/* Reads a label file. On success *labels is owned by the caller. */
ps_err idx_read_labels(const char *path, long *count, uint8_t **labels, ps_error *err);

/* Loads DIR/PREFIX-images-idx3-ubyte[.gz] and DIR/PREFIX-labels-idx1-ubyte[.gz]
 * (PREFIX is "train" or "t10k"), keeping the first `limit` samples when
 * limit > 0. On error nothing is left allocated. */
ps_err dataset_load(const char *dir, const char *prefix, long limit, dataset *ds, ps_error *err);
void dataset_free(dataset *ds);

#endif
