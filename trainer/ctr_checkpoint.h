/* Checkpoints, --resume and --export of a CTR model in local mode: the
 * dense parameters and their optimizer state, and each sparse table's keys,
 * rows, row optimizer state and row meta, in one safetensors file. */
#ifndef PSTRAIN_TRAINER_CTR_CHECKPOINT_H
#define PSTRAIN_TRAINER_CTR_CHECKPOINT_H

#include "common/error.h"
#include "trainer/ctr_train.h"

/* Whether a checkpoint is due after global step `step` (final: the run's end). */
int ctr_checkpoint_due(const ctr_trainer *t, long step, int final);
ps_err ctr_checkpoint_write(ctr_trainer *t, long step, ps_error *err);
/* Loads the newest (or --resume-step) checkpoint of --checkpoint-dir, refusing
 * another job's; sets t->start_step. */
ps_err ctr_checkpoint_resume(ctr_trainer *t, ps_error *err);
/* The dense tensors by name (fc1.weight, ..., wide.bias) and per table its
 * keys (U64 [rows]) and rows (F32 [rows, DIM]): "wide.keys", "wide.rows",
 * "embedding.keys", "embedding.rows". */
ps_err ctr_export(ctr_trainer *t, const char *path, ps_error *err);

#endif
