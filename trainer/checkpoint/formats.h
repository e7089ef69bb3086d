/* The two checkpoint formats a trainer writes and resumes (internal to
 * trainer/checkpoint): a model without tables writes dense_format.c's
 * (model-step-N, as the pservers' checkpoints), one with tables
 * table_format.c's (ctr-step-N: dense tensors and table dumps side by
 * side). Both stay readable: checkpoints written before resume. */
#ifndef PSTRAIN_TRAINER_CHECKPOINT_FORMATS_H
#define PSTRAIN_TRAINER_CHECKPOINT_FORMATS_H

#include "common/error.h"
#include "trainer/train.h"

ps_err dense_checkpoint_write(trainer *t, long step, ps_error *err);
ps_err dense_checkpoint_resume(trainer *t, ps_error *err);
ps_err table_checkpoint_write(trainer *t, long step, ps_error *err);
ps_err table_checkpoint_resume(trainer *t, ps_error *err);

#endif
