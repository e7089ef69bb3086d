/* --slowdown FACTOR: a reproducible straggler. After a step's compute the
 * trainer sleeps (FACTOR - 1) times what the compute took, so the step takes
 * about FACTOR times as long whatever the machine. */
#ifndef PSTRAIN_TRAINER_SLOWDOWN_H
#define PSTRAIN_TRAINER_SLOWDOWN_H

#include "common/error.h"

/* Sleeps (factor - 1) * compute_s seconds (nothing when factor <= 1). */
ps_err slowdown_sleep(double factor, double compute_s, ps_error *err);

#endif
