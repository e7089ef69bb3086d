/* The job's data files as the trainer finds them: IDX images (--data's
 * train and t10k files, loaded into memory), CIFAR-10 images (--data's
 * data_batch_1..5.bin and test_batch.bin, loaded and normalized per
 * channel) or Criteo TSV (--data counted, --test-data checked), and the
 * data sources over them: this trainer's share of the training set and the
 * evaluation batches. The format is --data's (trainer_settings.criteo,
 * .cifar); the model was checked to read it. */
#ifndef PSTRAIN_TRAINER_DATA_DATA_FILES_H
#define PSTRAIN_TRAINER_DATA_DATA_FILES_H

#include "common/error.h"
#include "trainer/data/data_source.h"
#include "trainer/data/idx.h"
#include "trainer/trainer_config.h"

struct model;

typedef struct data_files {
  int criteo;        /* Criteo TSV; else images (IDX or CIFAR-10) */
  long examples;     /* training examples in --data (at most --train-samples) */
  dataset train, test; /* images: IDX or CIFAR-10 */
} data_files;

/* Loads (IDX) or counts (Criteo) the training data and checks the test
 * data and that the model fits the data. Nothing held on error. */
ps_err data_files_load(data_files *f, const trainer_settings *s, ps_error *err);

/* Trainer id of `trainers`: its training batches, gathered into the
 * model's input buffers where it has them. read_ahead: examples a Criteo
 * reader may parse ahead (0: its default). */
ps_err data_files_train(data_files *f, const trainer_settings *s, int id, int trainers,
                        long read_ahead, struct model *m, data_source **out, ps_error *err);

/* The evaluation batches, TRAINER_EVAL_BATCH examples each, in order:
 * batch(k) is the k-th, of size 0 past the end (batch(0) starts over).
 * *out NULL where there is no test data (Criteo without --test-data). */
ps_err data_files_eval(data_files *f, const trainer_settings *s, struct model *m,
                       data_source **out, ps_error *err);

void data_files_free(data_files *f);

#endif
