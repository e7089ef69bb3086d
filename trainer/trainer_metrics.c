/* The trainer's Prometheus metrics and its step hook. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/trainer_metrics.h"

#include <math.h>
#include <stdlib.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/token.h"

struct trainer_metrics {
  metrics_registry *reg;
  metrics_http *http;
  metric_family *examples, *loss, *compute, *comm, *step;
};

ps_err trainer_metrics_start(trainer_metrics **out, const trainer_settings *s, ps_error *err) {
  *out = NULL;
  if (s->metrics_addr[0] == '\0') return PS_ERR_OK;
  trainer_metrics *tm = calloc(1, sizeof *tm);
  if (tm == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "trainer metrics: out of memory");
  if (metrics_create(&tm->reg, err) != PS_ERR_OK) {
    free(tm);
    return err->code;
  }
  const struct {
    metric_family **slot;
    metric_kind kind;
    const char *name, *help;
  } defs[] = {
      {&tm->examples, METRIC_COUNTER, "pstrain_trainer_examples_total",
       "Training examples this trainer has taken steps on."},
      {&tm->loss, METRIC_GAUGE, "pstrain_trainer_loss",
       "Mean training loss (logloss for ctr and lr) of the latest batch."},
      {&tm->compute, METRIC_COUNTER, "pstrain_trainer_compute_seconds_total",
       "Step time outside communication: data, forward, backward, local updates."},
      {&tm->comm, METRIC_COUNTER, "pstrain_trainer_communication_seconds_total",
       "Step time spent communicating (push-pull with pservers, or all-reduce)."},
      {&tm->step, METRIC_GAUGE, "pstrain_trainer_step", "Steps of the job this trainer has taken."},
  };
  for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++) {
    *defs[i].slot = metrics_add(tm->reg, defs[i].kind, defs[i].name, defs[i].help, NULL, NULL, 0,
                                err);
    if (*defs[i].slot == NULL) {
      trainer_metrics_stop(tm);
      return err->code;
    }
  }
  int port;
  if (metrics_http_start(&tm->http, tm->reg, s->metrics_addr, &port, err) != PS_ERR_OK) {
    trainer_metrics_stop(tm);
    return err->code;
  }
  LOG_INFO("metrics: http://%s/metrics (port %d)%s", s->metrics_addr, port,
           token_is_loopback(s->metrics_addr) ? ""
                                              : ", beyond loopback: anyone who reaches it can "
                                                "read the trainer's metrics (never its parameters)");
  *out = tm;
  return PS_ERR_OK;
}

void trainer_metrics_stop(trainer_metrics *tm) {
  if (tm == NULL) return;
  metrics_http_stop(tm->http);
  metrics_destroy(tm->reg);
  free(tm);
}

void trainer_metrics_step(trainer_metrics *tm, long step, long examples, double loss_sum,
                          double seconds, double comm_seconds) {
  if (tm == NULL) return;
  metric_inc(tm->examples, NULL, (double)examples);
  if (examples > 0) metric_set(tm->loss, NULL, loss_sum / (double)examples);
  metric_set(tm->step, NULL, (double)step);
  if (isnan(comm_seconds)) return;
  metric_inc(tm->comm, NULL, comm_seconds);
  metric_inc(tm->compute, NULL, seconds > comm_seconds ? seconds - comm_seconds : 0.0);
}
