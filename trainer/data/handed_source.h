/* Handed-out data (--shard-steps) as a data source: pserver 0 hands the
 * trainer shards of the epoch's examples, each read through an inner
 * source over the whole data set in one order (the same on every trainer:
 * trainer 0 of 1). The trainer's steps follow each other; a step's batch
 * is the next --batch examples of the shard held, and when the shard is
 * done the source asks for another (saying the last one is trained). A
 * batch with `over` set ends the trainer's epoch or job. Shards begin at
 * multiples of --batch, so each batch is one of the inner source's steps. */
#ifndef PSTRAIN_TRAINER_DATA_HANDED_SOURCE_H
#define PSTRAIN_TRAINER_DATA_HANDED_SOURCE_H

#include "trainer/data/data_source.h"

/* Takes inner (destroyed with the source, or here on failure). next_shard
 * asks pserver 0 (ctx: its argument); steps_per_epoch: the fixed split's,
 * which the job's length and its learning-rate schedule count in (the
 * trainer's own steps are as many as its batches). */
ps_err handed_source_create(data_source **out, data_source *inner, data_shard_fn next_shard,
                            void *ctx, long steps_per_epoch, long epochs, ps_error *err);

/* The epoch the trainer is in (where the last answer put it). */
long handed_source_epoch(const data_source *d);

/* The trainer gave its shard up (its sync membership ended with a pserver
 * restart): the next batch comes from a shard asked for anew. */
void handed_source_give_up(data_source *d);

#endif
