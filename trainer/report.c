/* Progress lines, evaluation lines and metrics rows (see report.h). */
#define _POSIX_C_SOURCE 200809L
#include "trainer/report.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/tb_events.h"
#include "trainer/metrics_repeat.h"

static int binary(const trainer *t) { return t->model->classes == 0; }

/* Handed-out data: the rows say how many examples each trainer applied. */
static void applied_field(const trainer *t, const report_point *p, char *buf, size_t len) {
  buf[0] = '\0';
  if (t->settings.opt.shard_steps > 0) {
    snprintf(buf, len, ",\"examples_applied\":%ld", p->examples_applied);
  }
}

void report_progress(const trainer *t, const report_point *p) {
  const trainer_options *o = &t->settings.opt;
  LOG_INFO("epoch %ld/%ld step %ld/%ld job step %ld/%ld %s %.4f %.0f %s/s ETA %.0fs (job)",
           p->epoch + 1, o->epochs, p->step + 1, t->steps_per_epoch, p->global_step,
           t->data->total_steps, binary(t) ? "logloss" : "loss", p->train_loss,
           p->examples_per_s, binary(t) ? "examples" : "samples", p->eta_s);
}

ps_err report_diverged(const trainer *t, double loss, const report_point *p, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  char sparse[64] = "";
  if (t->model->tables > 0) snprintf(sparse, sizeof sparse, " or --sparse-lr (now %g)", o->sparse_lr);
  return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                      "training diverged: the %s is %g at epoch %ld step %ld; try a smaller --lr "
                      "(now %g)%s",
                      binary(t) ? "logloss" : "loss", loss, p->epoch + 1, p->step + 1, o->lr,
                      sparse);
}

static ps_err metrics_written(const trainer *t, int rc, ps_error *err) {
  if (rc < 0 || fflush(t->metrics) != 0) {
    return ps_error_set(err, PS_ERR_IO, "writing --metrics %s: %s", t->settings.opt.metrics,
                        strerror(errno));
  }
  return PS_ERR_OK;
}

/* A classifier: after each epoch, its accuracy. */
static ps_err report_classifier(trainer *t, const report_point *p, const evaluation *ev,
                                ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  if (ev->examples == 0) {
    LOG_INFO("epoch %ld/%ld done: train loss %.4f, %.0f samples/s, %.1fs elapsed (trainer 0 "
             "evaluates)",
             p->epoch + 1, o->epochs, p->train_loss, p->examples_per_s, p->wall_s);
    return PS_ERR_OK;
  }
  LOG_INFO("epoch %ld/%ld done: train loss %.4f, test loss %.4f, test accuracy %.4f, %.0f "
           "samples/s, %.1fs elapsed",
           p->epoch + 1, o->epochs, p->train_loss, ev->loss, ev->accuracy, p->examples_per_s,
           p->wall_s);
  if (t->metrics == NULL) return PS_ERR_OK;
  char applied[48];
  applied_field(t, p, applied, sizeof applied);
  int rc = fprintf(t->metrics,
                   "{\"epoch\":%ld,\"train_loss\":%.6f,\"test_accuracy\":%.6f,"
                   "\"samples_per_s\":%.1f,\"wall_s\":%.3f,\"mode\":\"%s\",\"trainers\":%d,"
                   "\"comm_share\":%.4f,\"bytes_per_step\":%.0f%s%s}\n",
                   p->epoch + 1, p->train_loss, ev->accuracy, p->examples_per_s, p->wall_s,
                   t->mode_label, t->trainers, p->comm_share, p->bytes_per_step, applied,
                   metrics_repeat_field(t->replay_until, p->global_step));
  return metrics_written(t, rc, err);
}

/* Each table's statistics: logged, and as metrics fields. */
static void log_tables(const trainer *t, char *json, size_t len) {
  size_t used = 0;
  json[0] = '\0';
  for (int i = 0; i < t->model->tables; i++) {
    sparse_table_stats st;
    sparse_table_stats_get(t->tables[i], &st);
    const char *name = sparse_table_config_of(t->tables[i])->name;
    LOG_INFO("table %s: %zu rows, %.1f MiB (%.1f bytes per row), %llu admitted, %llu refused, "
             "%llu evicted",
             name, st.rows, (double)st.bytes / 1048576.0, st.bytes_per_row,
             (unsigned long long)st.admitted, (unsigned long long)st.refused,
             (unsigned long long)st.evicted);
    if (used < len) {
      used += (size_t)snprintf(json + used, len - used,
                               ",\"%s_rows\":%zu,\"%s_bytes\":%zu,\"%s_bytes_per_row\":%.1f,"
                               "\"%s_admitted\":%llu,\"%s_refused\":%llu,\"%s_evicted\":%llu",
                               name, st.rows, name, st.bytes, name, st.bytes_per_row, name,
                               (unsigned long long)st.admitted, name,
                               (unsigned long long)st.refused, name,
                               (unsigned long long)st.evicted);
    }
  }
}

/* A binary model: after each epoch and every --eval-every steps, its AUC
 * and logloss (when there is test data) and its tables. */
static ps_err report_binary(trainer *t, const report_point *p, const evaluation *ev,
                            ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  if (t->id != 0) return PS_ERR_OK; /* trainer 0 evaluates and writes the metrics */
  char fields[512] = ""; /* a pserver job's tables are on the pservers, which log them */
  if (t->rep->ops->holds_state) log_tables(t, fields, sizeof fields);
  size_t used = strlen(fields);
  replica_metrics(t->rep, fields + used, sizeof fields - used);
  if (ev->examples > 0) {
    LOG_INFO("epoch %ld step %ld: test AUC %.4f, test logloss %.4f on %ld examples; train "
             "logloss %.4f, %.0f examples/s",
             p->epoch + 1, p->global_step, ev->auc, ev->loss, ev->examples, p->train_loss,
             p->examples_per_s);
  }
  if (t->metrics == NULL) return PS_ERR_OK;
  char eval[128] = "";
  if (ev->examples > 0) {
    snprintf(eval, sizeof eval, ",\"auc\":%.6f,\"logloss\":%.6f", ev->auc, ev->loss);
  }
  const char *mode = strncmp(t->mode_label, "pserver", 7) == 0 ? "pserver" : t->mode_label;
  char applied[48];
  applied_field(t, p, applied, sizeof applied);
  int rc = fprintf(t->metrics,
                   "{\"epoch\":%ld,\"step\":%ld,\"train_logloss\":%.6f%s,\"examples_per_s\":%.1f,"
                   "\"wall_s\":%.3f,\"mode\":\"%s\",\"model\":\"%s\",\"trainers\":%d%s%s%s}\n",
                   p->epoch + 1, p->global_step, p->train_loss, eval, p->examples_per_s,
                   p->wall_s, mode, o->model, t->trainers, fields, applied,
                   metrics_repeat_field(t->replay_until, p->global_step));
  return metrics_written(t, rc, err);
}

/* --tensorboard: the values of the metrics row (trainer 0's; the others
 * their own training), every trainer in its own run, at the job's step. */
static ps_err report_tensorboard(trainer *t, const report_point *p, const evaluation *ev,
                                 ps_error *err) {
  if (t->tb == NULL) return PS_ERR_OK;
  tb_scalar v[8];
  int n = 0;
  if (binary(t)) {
    v[n++] = (tb_scalar){"train/logloss", p->train_loss};
    if (ev->examples > 0) {
      v[n++] = (tb_scalar){"eval/auc", ev->auc};
      v[n++] = (tb_scalar){"eval/logloss", ev->loss};
    }
    v[n++] = (tb_scalar){"perf/examples_per_s", p->examples_per_s};
  } else {
    v[n++] = (tb_scalar){"train/loss", p->train_loss};
    if (ev->examples > 0) v[n++] = (tb_scalar){"eval/accuracy", ev->accuracy};
    v[n++] = (tb_scalar){"perf/samples_per_s", p->examples_per_s};
    v[n++] = (tb_scalar){"perf/bytes_per_step", p->bytes_per_step};
  }
  v[n++] = (tb_scalar){"perf/comm_share", p->comm_share};
  return tb_writer_write(t->tb, p->global_step, v, n, err);
}

/* Handed-out data, a trainer other than 0 (it does not evaluate): its
 * epoch's row in its own metrics file. */
static ps_err report_trainer_row(trainer *t, const report_point *p, ps_error *err) {
  int rc = fprintf(t->metrics,
                   "{\"epoch\":%ld,\"trainer\":%d,\"examples_applied\":%ld,\"train_loss\":%.6f,"
                   "\"examples_per_s\":%.1f,\"wall_s\":%.3f}\n",
                   p->epoch + 1, t->id, p->examples_applied, p->train_loss, p->examples_per_s,
                   p->wall_s);
  return metrics_written(t, rc, err);
}

ps_err report_evaluation(trainer *t, const report_point *p, const evaluation *ev, int end,
                         ps_error *err) {
  if (binary(t) || end) PS_TRY(report_tensorboard(t, p, ev, err));
  if (t->id != 0 && t->metrics != NULL) return end ? report_trainer_row(t, p, err) : PS_ERR_OK;
  if (binary(t)) return report_binary(t, p, ev, err);
  return end ? report_classifier(t, p, ev, err) : PS_ERR_OK;
}
