/* A Criteo TSV test file as evaluation batches (data_source.h): batch(0)
 * opens the file from its start, batch(k) reads the next TRAINER_EVAL_BATCH
 * examples, deduplicated, with their labels; size 0 at the end. */
#ifndef PSTRAIN_TRAINER_DATA_CRITEO_EVAL_H
#define PSTRAIN_TRAINER_DATA_CRITEO_EVAL_H

#include "trainer/data/ctr_reader.h"
#include "trainer/data/data_source.h"

/* path is checked when read (batch 0), not here. */
ps_err criteo_eval_create(data_source **out, const char *path, const ctr_reader_options *opt,
                          ps_error *err);

#endif
