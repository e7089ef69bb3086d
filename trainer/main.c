/* The trainer daemon's start-up sequence: options, checks, data and model,
 * training, exit status (0 done, 1 failed while training, 2 bad input). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/fp_env.h"
#include "common/process.h"
#include "common/rpc.h"
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

/* The "done" line: what the run came to. */
static void log_done(const trainer *t, const train_summary *sum) {
  if (t->model->classes == 0) {
    LOG_INFO("done: %ld epochs (%ld steps), test AUC %.4f, test logloss %.4f, train logloss %.4f, "
             "%.0f examples/s; peak RSS %ld KiB",
             sum->epochs, sum->steps, sum->evaluated ? sum->auc : NAN,
             sum->evaluated ? sum->test_loss : NAN, sum->train_loss, sum->examples_per_s,
             process_peak_rss_kib());
  } else if (sum->evaluated) {
    LOG_INFO("done: %ld epochs (%ld steps), test accuracy %.4f, train loss %.4f, %.0f samples/s; "
             "peak RSS %ld KiB", sum->epochs, sum->steps, sum->accuracy, sum->train_loss,
             sum->examples_per_s, process_peak_rss_kib());
  } else {
    LOG_INFO("done: %ld epochs (%ld steps), train loss %.4f, %.0f samples/s; peak RSS %ld KiB",
             sum->epochs, sum->steps, sum->train_loss, sum->examples_per_s,
             process_peak_rss_kib());
  }
}

/* Builds the trainer, trains, and says how it went: the exit status. */
static int train(const trainer_settings *settings, trainer_metrics *tm) {
  ps_error err;
  ps_error_clear(&err);
  trainer t;
  if (trainer_init(&t, settings, &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    return exit_status(err.code);
  }
  t.prom = tm;
  train_summary summary;
  ps_err rc = trainer_run(&t, &summary, &err);
  if (rc != PS_ERR_OK) {
    LOG_ERROR("training failed: %s", err.msg);
    /* The other ranks may wait for this one's next step: end them all. */
    replica_abort(t.rep, 1);
  } else if (t.stopped) {
    LOG_INFO("stopped: left the job after %ld steps; peak RSS %ld KiB", summary.steps,
             process_peak_rss_kib());
  } else {
    log_done(&t, &summary);
  }
  trainer_free(&t);
  return rc == PS_ERR_OK ? 0 : 1;
}

/* OpenBLAS's idle threads spin (sched_yield) for 2^28 cycles, ~0.1 s,
 * after every GEMM before they sleep: the whole of a step's wait for the
 * pservers, on the cores a pserver on the same machine needs (perf: half
 * the trainer's CPU in sched_yield during a disk-tier run; in memory,
 * 78k examples/s instead of 70k with them asleep at once). The timeout is
 * read when the library loads, before main, so the trainer sets it and
 * runs itself again; a value the user set is kept. */
static void blas_threads_sleep_when_idle(char **argv) {
  if (getenv("OPENBLAS_THREAD_TIMEOUT") != NULL) return;
  if (setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1) != 0) return;
  execv("/proc/self/exe", argv);
  fprintf(stderr, "trainer: running again with OPENBLAS_THREAD_TIMEOUT=4: %s (going on with "
          "OpenBLAS's idle threads spinning)\n", strerror(errno));
}

int main(int argc, char **argv) {
  blas_threads_sleep_when_idle(argv);
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
    if (settings.elastic_min > 0) {
      printf("trainer (id from pserver 0) of %ld elastic=%s", settings.opt.trainers,
             settings.opt.elastic);
    } else {
      printf("trainer %ld of %ld", settings.opt.id, settings.opt.trainers);
    }
    printf(" mode=%s pservers=%s token=%s\n", settings.opt.mode, settings.opt.pservers,
           settings.token[0] ? "yes" : "no");
    printf("%s\n", effective);
    return 0;
  }
  LOG_INFO("starting: %s", effective);

  /* The trainer keeps the default signal actions (Ctrl-C stops it at once,
   * and its pservers notice the missing trainer), but an elastic one leaves
   * on SIGTERM at the end of its step: nobody waits its lease for it. */
  if (settings.elastic_min > 0) {
    struct sigaction stop = {.sa_handler = trainer_ask_stop, .sa_flags = SA_RESTART};
    if (sigemptyset(&stop.sa_mask) != 0 || sigaction(SIGTERM, &stop, NULL) != 0) {
      LOG_ERROR("--elastic: handling SIGTERM: %s", strerror(errno));
      return 1;
    }
  }
  process_tune_malloc();
  trainer_metrics *tm = NULL;
  if (trainer_metrics_start(&tm, &settings, &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    return 2;
  }
  rpc_global_init();
  int status = train(&settings, tm);
  rpc_global_shutdown();
  trainer_metrics_stop(tm);
  return status;
}
