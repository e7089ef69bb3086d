/* A trainer's checkpoints, --resume and --export. Where every trainer holds
 * the whole model (local and collective mode), trainer 0 writes the
 * model's dense tensors with their optimizer state and its tables' rows
 * with theirs; a resumed job starts from one at its step (the data source
 * finds the data position). In pserver mode the pservers checkpoint. */
#ifndef PSTRAIN_TRAINER_CHECKPOINT_H
#define PSTRAIN_TRAINER_CHECKPOINT_H

#include "common/error.h"
#include "trainer/train.h"

/* Whether this trainer writes a checkpoint after `step` steps (final: the
 * last step of the run). */
int trainer_checkpoint_due(const trainer *t, long step, int final);

/* Writes the checkpoint after `step` steps, a "checkpoint" span. */
ps_err trainer_checkpoint_write(trainer *t, long step, ps_error *err);

/* Loads the checkpoint --resume names (the newest, or --resume-step's) into
 * the model and its tables and sets t->start_step. A missing, corrupt or
 * other job's file is refused by name, on every rank. */
ps_err trainer_checkpoint_resume(trainer *t, ps_error *err);

/* The model's dense tensors by name (fc1.weight, ...) and per table its
 * keys (U64 [rows]) and rows (F32 [rows, DIM]): "wide.keys", "wide.rows",
 * ... in one safetensors file at path, from what this process holds. */
ps_err trainer_checkpoint_export(trainer *t, const char *path, ps_error *err);

#endif
