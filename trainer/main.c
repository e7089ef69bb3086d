/* The trainer daemon's start-up sequence: options, checks, data and model,
 * training, exit status (0 done, 1 failed while training, 2 bad input). */
#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"
#include "common/fp_env.h"
#include "common/process.h"
#include "common/rpc.h"
#include "trainer/ctr_train.h"
#ifdef PSTRAIN_HAVE_MPI
#include "trainer/ctr_collective.h"
#endif
#include "trainer/train.h"
#include "trainer/trainer_config.h"
#include "trainer/trainer_metrics.h"

/* Errors that a user's input caused exit 2, the others 1. */
static int exit_status(ps_err code) {
  switch (code) {
  case PS_ERR_INVALID_ARGUMENT:
  case PS_ERR_CORRUPT_DATA:
  case PS_ERR_IO:
  case PS_ERR_UNSUPPORTED:
  case PS_ERR_FAILED_PRECONDITION: /* a job that differs from the pservers' */
    return 2;
  default:
    return 1;
  }
}

/* A click-through-rate model in one process, replicated on every rank in
 * collective mode, or on pservers. */
static int run_ctr(const trainer_settings *settings, trainer_metrics *tm) {
  ps_error err;
  ps_error_clear(&err);
  if (settings->pserver_mode) rpc_global_init();
  ctr_trainer t;
  if (ctr_trainer_init(&t, settings, &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    if (settings->pserver_mode) rpc_global_shutdown();
    return exit_status(err.code);
  }
  t.prom = tm;
  ctr_summary summary;
  ps_err rc = ctr_trainer_run(&t, &summary, &err);
  if (rc != PS_ERR_OK) {
    LOG_ERROR("training failed: %s", err.msg);
#ifdef PSTRAIN_HAVE_MPI
    /* The other ranks wait for this one's next step: end them all. */
    if (t.exchange != NULL) ctr_collective_abort(1);
#endif
  }
  ctr_trainer_free(&t);
  if (settings->pserver_mode) rpc_global_shutdown();
  if (rc != PS_ERR_OK) return 1;
  LOG_INFO("done: %ld epochs (%ld steps), test AUC %.4f, test logloss %.4f, train logloss %.4f, "
           "%.0f examples/s; peak RSS %ld KiB",
           summary.epochs, summary.steps, summary.auc, summary.logloss, summary.train_logloss,
           summary.examples_per_s, process_peak_rss_kib());
  return 0;
}

int main(int argc, char **argv) {
  /* Before any thread starts: threads inherit the FP mode (common/fp_env.h). */
  fp_env_flush_denormals();
  trainer_settings settings;
  ps_error err;
  ps_error_clear(&err);
  log_set_role("trainer");

  switch (trainer_settings_load(&settings, argc, argv, &err)) {
  case OPTIONS_HELP:
    trainer_print_help(stdout);
    return 0;
  case OPTIONS_ERROR:
    LOG_ERROR("%s", err.msg);
    return 2;
  case OPTIONS_OK:
    break;
  }
  log_set_level(settings.level);
  char effective[2048];
  trainer_settings_format(&settings, effective, sizeof effective);
  if (settings.opt.check_config) {
    /* Names need not resolve here: the check may run away from the cluster. */
    printf("trainer %ld of %ld mode=%s pservers=%s token=%s\n", settings.opt.id,
           settings.opt.trainers, settings.opt.mode, settings.opt.pservers,
           settings.token[0] ? "yes" : "no");
    printf("%s\n", effective);
    return 0;
  }
  LOG_INFO("starting: %s", effective);

  /* The trainer keeps the default signal actions: Ctrl-C stops it at once,
   * and its pservers notice the missing trainer. */
  process_tune_malloc();
  trainer_metrics *tm = NULL;
  if (trainer_metrics_start(&tm, &settings, &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    return 2;
  }
  if (model_is_ctr(&settings.model)) {
    int status = run_ctr(&settings, tm);
    trainer_metrics_stop(tm);
    return status;
  }
  rpc_global_init();
  trainer t;
  if (trainer_init(&t, &settings, &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    rpc_global_shutdown();
    trainer_metrics_stop(tm);
    return exit_status(err.code);
  }
  t.prom = tm;
  train_summary summary;
  ps_err rc = trainer_run(&t, &summary, &err);
  int t_evaluated = t.evaluates;
  trainer_free(&t);
  rpc_global_shutdown();
  trainer_metrics_stop(tm);
  if (rc != PS_ERR_OK) {
    LOG_ERROR("training failed: %s", err.msg);
    return 1;
  }
  if (t_evaluated) {
    LOG_INFO("done: %ld epochs (%ld steps), test accuracy %.4f, train loss %.4f, %.0f samples/s; "
             "peak RSS %ld KiB", summary.epochs, summary.steps, summary.test_accuracy,
             summary.train_loss, summary.samples_per_s, process_peak_rss_kib());
  } else {
    LOG_INFO("done: %ld epochs (%ld steps), train loss %.4f, %.0f samples/s; peak RSS %ld KiB",
             summary.epochs, summary.steps, summary.train_loss, summary.samples_per_s,
             process_peak_rss_kib());
  }
  return 0;
}
