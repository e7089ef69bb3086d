/* Reads CIFAR-10's binary format into a dataset (idx.h): a folder holding
 * data_batch_1.bin .. data_batch_5.bin (training) and test_batch.bin, each
 * a run of 3,073-byte records: a label byte (0..9), then 32x32 red, green
 * and blue planes, which is the CHW order the dataset keeps. The training
 * set also gets its per-channel mean and standard deviation, the
 * normalization both sets use. */
#ifndef PSTRAIN_TRAINER_DATA_CIFAR_H
#define PSTRAIN_TRAINER_DATA_CIFAR_H

#include "common/error.h"
#include "trainer/data/idx.h"

#define CIFAR_CHANNELS 3
#define CIFAR_SIDE 32
#define CIFAR_IMAGE_BYTES (CIFAR_CHANNELS * CIFAR_SIDE * CIFAR_SIDE)
#define CIFAR_RECORD_BYTES (1 + CIFAR_IMAGE_BYTES)
#define CIFAR_TRAIN_FILES 5

/* Whether dir holds data_batch_1.bin, which makes it a CIFAR-10 folder. */
int cifar_detect(const char *dir);

/* Loads the training set (the five data_batch files, in order) or the test
 * set (test_batch.bin) of dir, keeping the first `limit` records when
 * limit > 0. Every file of the set must exist and hold whole records, even
 * past the limit. The training set comes back normalized with its own
 * statistics (cifar_channel_stats); the test set unnormalized, for the
 * caller to give it the training set's. On error nothing is left
 * allocated. */
ps_err cifar_load(const char *dir, int train, long limit, dataset *ds, ps_error *err);

/* Sets ds->mean and ds->std to each channel's mean and (population)
 * standard deviation of the pixels as values in [0, 1], summed exactly in
 * integers, and ds->normalized. A channel that never varies gets std 1, so
 * it is only centred. */
void cifar_channel_stats(dataset *ds);

#endif
