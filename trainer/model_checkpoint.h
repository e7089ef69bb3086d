/* Checkpoints of the whole model in local and collective mode: trainer 0
 * writes the parameters and both optimizer state vectors in the pservers'
 * checkpoint format (common/checkpoint.h, format "pstrain-model-1"), and a
 * resumed job starts from one at its step and data position. In collective
 * mode rank 0 reads the file and MPI sends it to the other ranks, so only
 * rank 0's host needs the folder. */
#ifndef PSTRAIN_TRAINER_MODEL_CHECKPOINT_H
#define PSTRAIN_TRAINER_MODEL_CHECKPOINT_H

#include "common/error.h"
#include "trainer/train.h"

/* Whether this trainer writes a checkpoint after `step` steps (final: the
 * last step of the run). */
int model_checkpoint_due(const trainer *t, long step, int final);

/* Writes the model's checkpoint after `step` steps. */
ps_err model_checkpoint_write(trainer *t, long step, ps_error *err);

/* Loads the checkpoint --resume names (the newest, or --resume-step's) into
 * the model and sets t->start_step. A missing, corrupt or other job's file
 * is refused by name, on every rank. */
ps_err model_checkpoint_resume(trainer *t, ps_error *err);

#endif
