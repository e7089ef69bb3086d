/* The trainer's Prometheus metrics (--metrics-listen): its registry, its
 * /metrics endpoint and one hook per step. Every hook takes NULL (metrics
 * off) and does nothing. No parameter ever becomes a metric. */
#ifndef PSTRAIN_TRAINER_TRAINER_METRICS_H
#define PSTRAIN_TRAINER_TRAINER_METRICS_H

#include "common/error.h"
#include "trainer/trainer_config.h"

typedef struct trainer_metrics trainer_metrics;

/* Registers the families and serves them at s->metrics_addr; *out is NULL
 * when --metrics-listen is off. */
ps_err trainer_metrics_start(trainer_metrics **out, const trainer_settings *s, ps_error *err);
/* Stops serving and frees; NULL is fine. */
void trainer_metrics_stop(trainer_metrics *tm);

/* A step taken: the job's step after it, its examples and summed loss, its
 * wall seconds and the part of them spent communicating (NaN where the
 * trainer does not measure it: compute and communication are then not counted). */
void trainer_metrics_step(trainer_metrics *tm, long step, long examples, double loss_sum,
                          double seconds, double comm_seconds);

#endif
