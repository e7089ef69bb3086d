/* The local training loop, evaluation and metrics. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/process.h"
#include "common/safetensors.h"
#include "trainer/job_progress.h"
#include "trainer/metrics_repeat.h"
#include "trainer/data/idx_source.h"
#include "trainer/trainer_metrics.h"
#include "trainer/model_checkpoint.h"
#include "trainer/slowdown.h"


static ps_err check_model_fits_data(const model_desc *m, const dataset *ds, const char *model_text,
                                    ps_error *err) {
  int pixels = ds->rows * ds->cols;
  if (m->sizes[0] != pixels) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--model %s: first layer takes %d inputs but the images have %d x %d = %d "
                        "pixels",
                        model_text, m->sizes[0], ds->rows, ds->cols, pixels);
  }
  if (m->sizes[m->num_layers] != DATASET_CLASSES) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--model %s: last layer has %d outputs but the data has %d classes",
                        model_text, m->sizes[m->num_layers], DATASET_CLASSES);
  }
  return PS_ERR_OK;
}

void trainer_job(const trainer *t, int pservers, job_config *job) {
  const trainer_settings *s = &t->settings;
  long steps = t->steps_per_epoch * s->opt.epochs;
  if (s->opt.max_steps > 0 && s->opt.max_steps < steps) steps = s->opt.max_steps;
  *job = (job_config){.model = s->model, .optimizer = s->optimizer,
                      .update = s->pserver_mode ? s->update : UPDATE_SYNC,
                      .trainers = t->trainers, .pservers = pservers,
                      .block_size = (size_t)s->opt.block_size, .seed = (uint64_t)s->opt.seed,
                      .batch = s->opt.batch, .steps = steps, .wire_dtype = s->wire_dtype};
  if (job->update == UPDATE_SSP) job->staleness = s->staleness;
  if (job->update == UPDATE_GEO) job->geo_steps = s->geo_steps;
}

ps_err trainer_init(trainer *t, const trainer_settings *settings, ps_error *err) {
  memset(t, 0, sizeof *t);
  t->rewind_to = -1;
  t->settings = *settings;
  const trainer_options *o = &settings->opt;

  if (dataset_load(o->data, "train", o->train_samples, &t->train, err) != PS_ERR_OK ||
      dataset_load(o->data, "t10k", o->test_samples, &t->test, err) != PS_ERR_OK) {
    goto fail;
  }
  if (t->train.rows != t->test.rows || t->train.cols != t->test.cols) {
    ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: training images are %dx%d but test images %dx%d",
                 o->data, t->train.rows, t->train.cols, t->test.rows, t->test.cols);
    goto fail;
  }
  if (check_model_fits_data(&settings->model, &t->train, o->model, err) != PS_ERR_OK) goto fail;

  /* The way replicas stay in step decides this trainer's share of the data. */
  if (updater_create(t, &t->up, err) != PS_ERR_OK) goto fail;
  t->evaluates = t->id == 0;
  char timeline_path[4096];
  timeline_rank_path(o->timeline, settings->collective_mode, t->id, timeline_path,
                     sizeof timeline_path);
  if (timeline_open(&t->tl, timeline_path, "trainer", t->id, settings->timeline_first,
                    settings->timeline_last, settings->timeline_every, err) != PS_ERR_OK) {
    goto fail;
  }
  if (t->train.count < t->trainers) {
    ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%ld training samples cannot be shared by %d trainers",
                 t->train.count, t->trainers);
    goto fail;
  }
  t->samples_per_epoch = t->train.count / t->trainers;
  t->steps_per_epoch = (t->samples_per_epoch + o->batch - 1) / o->batch;
  t->settings.optimizer.total_steps = t->steps_per_epoch * o->epochs;

  if (o->metrics[0] != '\0' && t->evaluates) {
    t->metrics = fopen(o->metrics, "a");
    if (t->metrics == NULL) {
      ps_error_set(err, PS_ERR_IO, "--metrics %s: cannot open for appending: %s", o->metrics,
                   strerror(errno));
      goto fail;
    }
  }
  if (backend_open(&t->be, o->device, (int)o->threads, (int)o->gpu, err) != PS_ERR_OK) goto fail;
  int max_batch = o->batch > TRAINER_EVAL_BATCH ? (int)o->batch : TRAINER_EVAL_BATCH;
  if (model_create(&t->model, &settings->model, t->be, max_batch, (uint64_t)o->seed, err) !=
      PS_ERR_OK) {
    goto fail;
  }
  if (idx_source_create(&t->data, &t->train, (uint64_t)o->seed, t->id, t->trainers, o->batch,
                        o->epochs, o->max_steps, t->model->inputs, t->model->labels, err) !=
      PS_ERR_OK) {
    goto fail;
  }
  size_t n = t->model->layout.total;
  t->staged = t->model->params_host == NULL;
  if (t->staged) {
    /* Pinned on a GPU: push and pull copy through these. */
    if ((t->host_params = t->be->ops->host_alloc(t->be, n * sizeof(float), err)) == NULL ||
        (t->host_grads = t->be->ops->host_alloc(t->be, n * sizeof(float), err)) == NULL) {
      goto fail;
    }
  } else {
    t->host_params = t->model->params_host;
    t->host_grads = t->model->grads_host;
  }
  if (o->checkpoint_dir[0] != '\0' && t->id == 0 && !o->resume &&
      process_prepare_dir(o->checkpoint_dir, "--checkpoint-dir", err) != PS_ERR_OK) {
    goto fail;
  }
  if (o->resume && model_checkpoint_resume(t, err) != PS_ERR_OK) goto fail;
  if (o->resume && t->start_step > 0) {
    LOG_INFO("resuming at step %ld (epoch %ld, step %ld of it)", t->start_step,
             t->start_step / t->steps_per_epoch + 1, t->start_step % t->steps_per_epoch + 1);
  }
  /* Connect, pull, agree on the device: after any --resume has loaded the model. */
  if (updater_start(t->up, err) != PS_ERR_OK) goto fail;
  return PS_ERR_OK;
fail:
  trainer_free(t);
  return err->code;
}

void trainer_free(trainer *t) {
  updater_destroy(t->up);
  timeline_close(t->tl);
  if (t->staged) {
    if (t->host_params != NULL) t->be->ops->host_free(t->be, t->host_params);
    if (t->host_grads != NULL) t->be->ops->host_free(t->be, t->host_grads);
  }
  model_destroy(t->model);
  backend_destroy(t->be);
  if (t->metrics != NULL && fclose(t->metrics) != 0) {
    LOG_ERROR("closing the metrics file: %s", strerror(errno));
  }
  data_source_destroy(t->data);
  dataset_free(&t->train);
  dataset_free(&t->test);
  memset(t, 0, sizeof *t);
}

ps_err trainer_evaluate(trainer *t, double *accuracy, double *mean_loss, ps_error *err) {
  double loss = 0.0;
  long correct = 0;
  long total = t->test.count;
  long indices[TRAINER_EVAL_BATCH];
  for (long start = 0; start < total; start += TRAINER_EVAL_BATCH) {
    int count = (int)(total - start < TRAINER_EVAL_BATCH ? total - start : TRAINER_EVAL_BATCH);
    for (int i = 0; i < count; i++) indices[i] = start + i;
    sampler_gather(&t->test, indices, count, t->model->inputs, t->model->labels);
    model_batch b = {.size = count, .inputs = t->model->inputs, .labels = t->model->labels};
    model_outputs out = {0};
    if (model_forward(t->model, &b, 0, &out, err) != PS_ERR_OK) return err->code;
    loss += out.loss_sum;
    correct += out.correct;
  }
  *accuracy = (double)correct / (double)total;
  *mean_loss = loss / (double)total;
  return PS_ERR_OK;
}

typedef struct epoch_comm {
  double share;          /* of the epoch's training time */
  double bytes_per_step; /* sent + received by this trainer */
} epoch_comm;

static ps_err write_metrics(trainer *t, long epoch, long step, double train_loss,
                            double accuracy, double samples_per_s, double wall_s,
                            const epoch_comm *comm, ps_error *err) {
  if (t->metrics == NULL) return PS_ERR_OK;
  if (fprintf(t->metrics,
              "{\"epoch\":%ld,\"train_loss\":%.6f,\"test_accuracy\":%.6f,\"samples_per_s\":%.1f,"
              "\"wall_s\":%.3f,\"mode\":\"%s\",\"trainers\":%d,\"comm_share\":%.4f,"
              "\"bytes_per_step\":%.0f%s}\n",
              epoch, train_loss, accuracy, samples_per_s, wall_s, t->mode_label, t->trainers,
              comm->share, comm->bytes_per_step, metrics_repeat_field(t->replay_until, step)) < 0 ||
      fflush(t->metrics) != 0) {
    return ps_error_set(err, PS_ERR_IO, "writing --metrics %s: %s", t->settings.opt.metrics,
                        strerror(errno));
  }
  return PS_ERR_OK;
}

/* One epoch of training, or its first part when --max-steps ends it;
 * returns the mean loss, the training throughput and the communication. */
static ps_err train_epoch(trainer *t, long epoch, long *global_step, double *mean_loss,
                          double *samples_per_s, epoch_comm *comm, ps_error *err) {
  double comm_s0 = t->up->comm_seconds, comm_b0 = t->up->comm_bytes;
  long step0 = *global_step;
  const trainer_options *o = &t->settings.opt;
  double loss_sum = 0.0;
  long seen = 0;
  double start = now_s(), next_progress = start + o->progress_interval;

  /* A resumed run starts mid-epoch: the data source finds the step. */
  long first_step = *global_step - epoch * t->steps_per_epoch;
  for (long step = first_step > 0 ? first_step : 0; step < t->steps_per_epoch; step++) {
    if (o->max_steps > 0 && *global_step >= o->max_steps) break;
    double step_started = now_s(), comm_before = t->up->comm_seconds;
    data_batch db;
    if (data_source_batch(t->data, *global_step, &db, err) != PS_ERR_OK) return err->code;
    int count = db.size;
    model_batch b = {.size = count, .inputs = db.inputs, .labels = db.labels};
    model_outputs out = {0};
    long next = 0;
    double t0 = now_s();
    if (model_forward(t->model, &b, 1, &out, err) != PS_ERR_OK) return err->code;
    double batch_loss = out.loss_sum;
    t0 = timeline_span(t->tl, "forward", *global_step, t0);
    if (model_backward(t->model, &b, NULL, err) != PS_ERR_OK) return err->code;
    timeline_span(t->tl, "backward", *global_step, t0);
    /* The whole compute (gather, forward, backward), not backward alone. */
    if (slowdown_sleep(o->slowdown, now_s() - step_started, err) != PS_ERR_OK) return err->code;
    if (updater_apply(t->up, *global_step, &next, err) != PS_ERR_OK) return err->code;
    if (next <= *global_step) {
      t->rewind_to = next; /* the job went back: trainer_run takes the steps again */
      return PS_ERR_OK;
    }
    if (!isfinite(batch_loss)) {
      return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                          "training diverged: the loss is %g at epoch %ld step %ld; try a smaller "
                          "--lr (now %g)",
                          batch_loss, epoch + 1, step + 1, o->lr);
    }
    loss_sum += batch_loss;
    seen += count;
    (*global_step)++;
    trainer_metrics_step(t->prom, *global_step, count, batch_loss, now_s() - step_started,
                         t->up->comm_seconds - comm_before);
    if (model_checkpoint_due(t, *global_step, 0) &&
        model_checkpoint_write(t, *global_step, err) != PS_ERR_OK) {
      return err->code;
    }
    timeline_flush(t->tl); /* the step's events, checkpoint included */

    if (o->progress_interval > 0) {
      double now = now_s();
      if (now >= next_progress) {
        double rate = (double)seen / (now - start);
        long total = job_total_steps(t->steps_per_epoch, o->epochs, o->max_steps);
        double eta = job_eta_s(*global_step, total, (double)(*global_step - step0) / (now - start));
        LOG_INFO("epoch %ld/%ld step %ld/%ld job step %ld/%ld loss %.4f %.0f samples/s ETA %.0fs "
                 "(job)", epoch + 1, o->epochs, step + 1, t->steps_per_epoch, *global_step, total,
                 loss_sum / (double)seen, rate, eta);
        next_progress = now + o->progress_interval;
      }
    }
  }
  double elapsed = now_s() - start;
  *mean_loss = seen > 0 ? loss_sum / (double)seen : 0.0;
  *samples_per_s = seen > 0 ? (double)seen / elapsed : 0.0;
  long steps = *global_step - step0;
  comm->share = elapsed > 0 ? (t->up->comm_seconds - comm_s0) / elapsed : 0.0;
  comm->bytes_per_step = steps > 0 ? (t->up->comm_bytes - comm_b0) / (double)steps : 0.0;
  return PS_ERR_OK;
}

static ps_err export_model(trainer *t, ps_error *err) {
  const char *path = t->settings.opt.export_path;
  if (t->staged && model_get_params(t->model, t->host_params, err) != PS_ERR_OK) return err->code;
  char model_text[256];
  model_format(&t->settings.model, model_text, sizeof model_text);
  const char *metadata[] = {"format", "pt", "model", model_text, "producer", "pstrain", NULL};
  if (safetensors_write(path, &t->model->layout, t->host_params, metadata, 0, err) != PS_ERR_OK) {
    return err->code;
  }
  LOG_INFO("exported the model to %s", path);
  return PS_ERR_OK;
}

ps_err trainer_run(trainer *t, train_summary *summary, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  double run_start = now_s();
  long global_step = t->start_step;
  memset(summary, 0, sizeof *summary);
  LOG_INFO("training %s on %ld of %ld samples per epoch (trainer %d of %d; %ld steps of %ld), "
           "testing on %ld; backend %s: %s",
           o->model, t->samples_per_epoch, t->train.count, t->id, t->trainers, t->steps_per_epoch,
           o->batch, t->test.count, t->be->name, t->be->description);
  for (long epoch = global_step / t->steps_per_epoch; epoch < o->epochs; epoch++) {
    if (o->max_steps > 0 && global_step >= o->max_steps) break;
    double mean_loss = 0.0, rate = 0.0, accuracy = 0.0, test_loss = 0.0;
    epoch_comm comm = {0, 0};
    if (train_epoch(t, epoch, &global_step, &mean_loss, &rate, &comm, err) != PS_ERR_OK) {
      return err->code;
    }
    if (t->rewind_to >= 0) {
      /* The data position follows from the step, as when resuming. */
      metrics_repeat_note(&t->replay_until, global_step);
      global_step = t->rewind_to;
      t->rewind_to = -1;
      epoch = global_step / t->steps_per_epoch - 1;
      continue;
    }
    double wall = now_s() - run_start;
    if (t->evaluates) {
      double t0 = now_s();
      if (trainer_evaluate(t, &accuracy, &test_loss, err) != PS_ERR_OK) return err->code;
      timeline_span(t->tl, "evaluation", global_step - 1, t0);
      timeline_flush(t->tl);
      wall = now_s() - run_start;
      LOG_INFO("epoch %ld/%ld done: train loss %.4f, test loss %.4f, test accuracy %.4f, %.0f "
               "samples/s, %.1fs elapsed",
               epoch + 1, o->epochs, mean_loss, test_loss, accuracy, rate, wall);
      if (write_metrics(t, epoch + 1, global_step, mean_loss, accuracy, rate, wall, &comm,
                        err) != PS_ERR_OK) {
        return err->code;
      }
    } else {
      LOG_INFO("epoch %ld/%ld done: train loss %.4f, %.0f samples/s, %.1fs elapsed (trainer 0 "
               "evaluates)",
               epoch + 1, o->epochs, mean_loss, rate, wall);
    }
    summary->epochs = epoch + 1;
    summary->test_accuracy = accuracy;
    summary->train_loss = mean_loss;
    summary->samples_per_s = rate;
  }
  summary->steps = global_step;
  if (model_checkpoint_due(t, global_step, 1) && !model_checkpoint_due(t, global_step, 0) &&
      model_checkpoint_write(t, global_step, err) != PS_ERR_OK) {
    return err->code;
  }
  if (updater_finish(t->up, global_step, err) != PS_ERR_OK) return err->code;
  if (o->export_path[0] != '\0' && export_model(t, err) != PS_ERR_OK) return err->code;
  return PS_ERR_OK;
}
