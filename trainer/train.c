/* The one training loop (see train.h): every model, every replica, every
 * data source. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/train.h"

#include <math.h>
#include <signal.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "trainer/checkpoint.h"
#include "trainer/data/handed_source.h"
#include "trainer/evaluate.h"
#include "trainer/job_progress.h"
#include "trainer/metrics_repeat.h"
#include "trainer/report.h"
#include "trainer/slowdown.h"
#include "trainer/trainer_metrics.h"

/* One step: the batch, its rows, forward and backward where this trainer
 * has examples, the update; *next is the step the job goes on from. */
static ps_err train_step(trainer *t, long step, double *loss, long *next, ps_error *err) {
  double started = now_s();
  PS_TRY(data_source_batch(t->data, step, &t->batch, err));
  const data_batch *b = &t->batch;
  if (b->over != DATA_MORE) return PS_ERR_OK; /* handed-out data: this epoch's is trained */
  /* Handed-out data: waiting for a shard others hold is not compute. */
  if (t->settings.opt.shard_steps > 0) started = now_s();
  PS_TRY(replica_pull(t->rep, step, b, err));
  if (b->size > 0) {
    model_batch mb = trainer_model_batch(t, b);
    model_outputs out = {0};
    double t0 = now_s();
    PS_TRY(model_forward(t->model, &mb, 1, &out, err));
    *loss = out.loss_sum;
    t0 = timeline_span(t->tl, "forward", step, t0);
    PS_TRY(model_backward(t->model, &mb, t->row_grads, err));
    timeline_span(t->tl, "backward", step, t0);
  }
  /* The whole compute (data, rows, forward, backward), as a slower machine's. */
  PS_TRY(slowdown_sleep(t->settings.opt.slowdown, now_s() - started, err));
  return replica_push(t->rep, step, b, next, err);
}

static volatile sig_atomic_t stop_asked;

void trainer_ask_stop(int signum) {
  (void)signum;
  stop_asked = 1;
}

/* Whether pserver 0 hands the data out (--shard-steps): epochs end when
 * it says so, not after a number of steps. */
static int handed(const trainer *t) { return t->settings.opt.shard_steps > 0; }

/* An epoch's counts since it began and since the last report. */
typedef struct epoch_state {
  long epoch, first;      /* zero-based; its first step in this pass */
  double start, eval_s;   /* evaluation time is not training time */
  double loss_sum, loss_since;
  long seen, seen_since;
  double comm_s0, comm_b0;
  long step0;             /* the job's step when the epoch (pass) began */
} epoch_state;

static report_point point_of(const trainer *t, const epoch_state *e, long step, long global,
                             int since_report) {
  double now = now_s(), train_s = now - e->start - e->eval_s;
  long steps = global - e->step0;
  report_point p = {.epoch = e->epoch, .step = step, .global_step = global,
                    .examples_applied = handed(t) ? e->seen : -1};
  double loss = since_report ? e->loss_since : e->loss_sum;
  long seen = since_report ? e->seen_since : e->seen;
  p.train_loss = seen > 0 ? loss / (double)seen : 0.0;
  p.examples_per_s = e->seen > 0 && train_s > 0 ? (double)e->seen / train_s : 0.0;
  p.comm_share = train_s > 0 ? (t->rep->comm_seconds - e->comm_s0) / train_s : 0.0;
  p.bytes_per_step = steps > 0 ? (t->rep->comm_bytes - e->comm_b0) / (double)steps : 0.0;
  p.eta_s = job_eta_s(global, t->data->total_steps,
                      train_s > 0 ? (double)(step + 1 - e->first) / train_s : 0.0);
  return p;
}

/* Evaluates (trainer 0), logs and writes the metrics row. */
static ps_err evaluate_and_report(trainer *t, epoch_state *e, long step, long global,
                                  double run_start, int end, evaluation *ev, ps_error *err) {
  /* Mid-epoch rows hold the loss since the last; the epoch's, its mean. */
  report_point p = point_of(t, e, step, global, !end);
  double t0 = now_s();
  PS_TRY(trainer_evaluate(t, ev, err));
  if (t->rewind_to >= 0) return PS_ERR_OK; /* the job went back: this report comes again */
  if (t->eval != NULL) timeline_span(t->tl, "evaluation", global - 1, t0);
  timeline_flush(t->tl);
  p.wall_s = now_s() - run_start;
  PS_TRY(report_evaluation(t, &p, ev, end, err));
  e->eval_s += now_s() - t0;
  e->loss_since = 0.0;
  e->seen_since = 0;
  return PS_ERR_OK;
}

/* After step `step` of the epoch (the job's global - 1): checkpoint,
 * --eval-every, progress. */
static ps_err after_step(trainer *t, epoch_state *e, long step, long global, double run_start,
                         double *next_progress, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  if (trainer_checkpoint_due(t, global, 0)) PS_TRY(trainer_checkpoint_write(t, global, err));
  timeline_flush(t->tl); /* the step's events, checkpoint included */
  if (o->eval_every > 0 && global % o->eval_every == 0 && global < t->data->total_steps) {
    evaluation ev;
    PS_TRY(evaluate_and_report(t, e, step, global, run_start, 0, &ev, err));
    if (t->rewind_to >= 0) return PS_ERR_OK; /* a pserver came back from an older step */
  }
  double now = now_s();
  if (o->progress_interval > 0 && now >= *next_progress) {
    report_progress(t, (report_point[]){point_of(t, e, step, global, 0)});
    *next_progress = now + o->progress_interval;
  }
  return PS_ERR_OK;
}

/* One epoch of training, or the rest of it (a resumed run, a job gone
 * back), or its first part when --max-steps ends it; then the evaluation. */
static ps_err train_epoch(trainer *t, long epoch, long *global_step, double run_start,
                          train_summary *summary, ps_error *err) {
  epoch_state e = {.epoch = epoch,
                   .first = handed(t) ? 0 : *global_step - epoch * t->steps_per_epoch,
                   .start = now_s(), .comm_s0 = t->rep->comm_seconds,
                   .comm_b0 = t->rep->comm_bytes, .step0 = *global_step};
  double next_progress = e.start + t->settings.opt.progress_interval;
  for (long step = e.first;
       handed(t) || (step < t->steps_per_epoch && *global_step < t->data->total_steps); step++) {
    double loss = 0.0, step_started = now_s(), comm_before = t->rep->comm_seconds;
    long next = 0;
    PS_TRY(train_step(t, *global_step, &loss, &next, err));
    if (t->batch.over != DATA_MORE) break;
    if (next <= *global_step) {
      t->rewind_to = next; /* the job went back: trainer_run takes the steps again */
      return PS_ERR_OK;
    }
    if (!isfinite(loss)) {
      return report_diverged(t, loss, (report_point[]){{.epoch = epoch, .step = step}}, err);
    }
    const int count = t->batch.size;
    e.loss_sum += loss;
    e.loss_since += loss;
    e.seen += count;
    e.seen_since += count;
    (*global_step)++;
    trainer_metrics_step(t->prom, *global_step, count, loss, now_s() - step_started,
                         t->rep->comm_seconds - comm_before);
    PS_TRY(after_step(t, &e, step, *global_step, run_start, &next_progress, err));
    if (t->rewind_to >= 0) return PS_ERR_OK;
    if (stop_asked) {
      /* Pserver 0 counts what its pushes applied for its process (no row). */
      LOG_WARN("asked to stop (SIGTERM): leaving the job after step %ld (%ld examples of epoch "
               "%ld trained here; pserver 0 counts those applied)", *global_step, e.seen,
               epoch + 1);
      t->stopped = 1;
      return PS_ERR_OK;
    }
  }
  if (handed(t)) {
    LOG_INFO("epoch %ld: this trainer's pushes applied %ld examples of the handed-out data",
             epoch + 1, e.seen);
    /* It trained nothing of an epoch the others finished: nothing to say. */
    if (e.seen == 0 && t->batch.over == DATA_EPOCH_OVER) return PS_ERR_OK;
  }
  report_point p = point_of(t, &e, t->steps_per_epoch - 1, *global_step, 0);
  summary->train_loss = p.train_loss;
  summary->examples_per_s = p.examples_per_s;
  evaluation ev;
  PS_TRY(evaluate_and_report(t, &e, t->steps_per_epoch - 1, *global_step, run_start, 1, &ev,
                             err));
  summary->evaluated = ev.examples > 0;
  summary->accuracy = ev.accuracy;
  summary->auc = ev.auc;
  summary->test_loss = ev.loss;
  return PS_ERR_OK;
}

/* After the last step: the final checkpoint, the export(s), goodbye. */
static ps_err finish_run(trainer *t, long global_step, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  data_source_log_end(t->data);
  if (trainer_checkpoint_due(t, global_step, 1) && !trainer_checkpoint_due(t, global_step, 0)) {
    PS_TRY(trainer_checkpoint_write(t, global_step, err));
  }
  if (o->export_path[0] != '\0' && t->id == 0) {
    PS_TRY(replica_gather(t->rep, err));
    PS_TRY(trainer_checkpoint_export(t, o->export_path, err));
  }
  PS_TRY(replica_finish(t->rep, global_step, err));
  /* --export-replicas: the other replicas too, as PATH.rankN. */
  if (o->export_path[0] != '\0' && t->id != 0 && o->export_replicas) {
    char path[4096];
    snprintf(path, sizeof path, "%s.rank%d", o->export_path, t->id);
    PS_TRY(trainer_checkpoint_export(t, path, err));
  }
  return PS_ERR_OK;
}

/* Handed-out data: epochs as pserver 0 ends them, until it says the job's
 * data is trained. */
static ps_err run_handed(trainer *t, long *global_step, double run_start, train_summary *summary,
                         ps_error *err) {
  for (long epoch = 0;; epoch = handed_source_epoch(t->data)) {
    PS_TRY(train_epoch(t, epoch, global_step, run_start, summary, err));
    if (t->stopped) return PS_ERR_OK;
    summary->epochs = epoch + 1;
    if (t->batch.over == DATA_JOB_OVER) return PS_ERR_OK;
  }
}

ps_err trainer_run(trainer *t, train_summary *summary, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  double run_start = now_s();
  long global_step = t->start_step;
  memset(summary, 0, sizeof *summary);
  if (handed(t)) {
    LOG_INFO("training %s on %ld examples per epoch handed out by pserver 0 in shards of %ld "
             "steps of %ld (trainer %d of %d), backend %s: %s", o->model, t->files.examples,
             o->shard_steps, o->batch, t->id, t->trainers, t->be->name, t->be->description);
    PS_TRY(run_handed(t, &global_step, run_start, summary, err));
    summary->steps = global_step;
    /* Stopped: no checkpoint or export of a job others go on with. */
    if (t->stopped) return replica_finish(t->rep, global_step, err);
    return finish_run(t, global_step, err);
  }
  LOG_INFO("training %s on %ld examples per epoch (trainer %d of %d; %ld steps of %ld), "
           "backend %s: %s",
           o->model, t->files.examples, t->id, t->trainers, t->steps_per_epoch, o->batch,
           t->be->name, t->be->description);
  for (long epoch = global_step / t->steps_per_epoch;
       epoch < o->epochs && global_step < t->data->total_steps; epoch++) {
    PS_TRY(train_epoch(t, epoch, &global_step, run_start, summary, err));
    if (t->rewind_to >= 0) {
      /* The data position follows from the step, as when resuming. */
      metrics_repeat_note(&t->replay_until, global_step);
      global_step = t->rewind_to;
      t->rewind_to = -1;
      epoch = global_step / t->steps_per_epoch - 1;
      continue;
    }
    summary->epochs = epoch + 1;
  }
  summary->steps = global_step;
  return finish_run(t, global_step, err);
}
