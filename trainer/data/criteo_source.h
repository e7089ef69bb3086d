/* Criteo TSV (plain or gzip'd) as a data source (data_source.h): the
 * reader thread streams the file (ctr_reader.h); trainer r of N takes blocks
 * r, r+N, ... of `batch` examples, so a step of N trainers is a local step
 * with the global batch. After handing out a step's batch the source reads
 * and deduplicates the next step's on a thread of its own while the step
 * trains (crossing an epoch's end by rewinding the reader), touching no
 * table: the result is what reading in line would give. Only the steps the
 * job will take are read, so the reader's count of skipped lines is the
 * run's. */
#ifndef PSTRAIN_TRAINER_DATA_CRITEO_SOURCE_H
#define PSTRAIN_TRAINER_DATA_CRITEO_SOURCE_H

#include "trainer/data/ctr_reader.h"
#include "trainer/data/data_source.h"

/* Opens path (a missing file fails here, a bad line at the batch that
 * reaches it). examples_per_epoch: the file's lines (at most --train-samples,
 * ctr_reader_count_lines), over `trainers` trainers of `batch` each. */
ps_err criteo_source_create(data_source **out, const char *path, const ctr_reader_options *opt,
                            long examples_per_epoch, int trainers, long batch, long epochs,
                            long max_steps, ps_error *err);

/* Deduplicates count examples' keys into keys (count, 26), slot and d. */
ps_err criteo_dedup(const ctr_example *examples, int count, uint64_t *keys, uint32_t *slot,
                    sparse_dedup *d, ps_error *err);

#endif
