/* The CTR training loop: read a batch, gather the rows of its distinct
 * keys, forward and backward, update the rows it touched and the dense
 * model; evaluation, progress, metrics and table statistics. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/ctr_train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/ctr_tables.h"
#include "common/log.h"
#include "common/process.h"
#include "trainer/auc.h"
#include "trainer/trainer_metrics.h"
#include "trainer/ctr_checkpoint.h"
#include "trainer/job_progress.h"
#include "trainer/metrics_repeat.h"
#include "trainer/ctr_pserver.h"
#include "trainer/data/criteo_source.h"
#include "trainer/slowdown.h"
#ifdef PSTRAIN_HAVE_MPI
#include "trainer/ctr_collective.h"
#endif

#define FIELDS CRITEO_CAT_FIELDS

void ctr_trainer_job(const ctr_trainer *t, job_config *job) {
  const trainer_settings *s = &t->settings;
  long steps = t->steps_per_epoch * s->opt.epochs;
  if (s->opt.max_steps > 0 && s->opt.max_steps < steps) steps = s->opt.max_steps;
  *job = (job_config){.model = s->model, .optimizer = s->optimizer, .update = UPDATE_SYNC,
                      .trainers = 1, .pservers = 1, .block_size = (size_t)s->opt.block_size,
                      .seed = (uint64_t)s->opt.seed, .batch = s->opt.batch * t->ranks,
                      .steps = steps, .wire_dtype = s->wire_dtype};
  job->sparse = job_sparse_of(&s->sparse_opt, (int)s->opt.admit_after, s->opt.evict_after);
}

/* The model's tables as the job describes them (common/ctr_tables.c). */
static ps_err tables_create(ctr_trainer *t, ps_error *err) {
  job_config job;
  ctr_trainer_job(t, &job);
  size_t max_bytes = (size_t)(t->settings.opt.max_table_mb * 1024.0 * 1024.0);
  for (int i = 0; i < t->model->tables; i++) {
    sparse_table_config c;
    ctr_table_config(&job, i, max_bytes, &c);
    if (sparse_table_create(&t->tables[i], &c, err) != PS_ERR_OK) return err->code;
  }
  return PS_ERR_OK;
}

static void *alloc_array(size_t count, size_t size, int *ok) {
  void *p = calloc(count > 0 ? count : 1, size);
  if (p == NULL) *ok = 0;
  return p;
}

static ps_err open_data(ctr_trainer *t, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  /* Rank r of N takes blocks r, r+N, ...: a global step is N blocks. */
  ctr_reader_options ro = {.skip_bad_lines = o->skip_bad_lines, .limit = o->train_samples,
                           .shard_block = o->batch, .shard_index = t->rank,
                           .shard_count = t->ranks};
  return criteo_source_create(&t->data, o->data, &ro, t->examples_per_epoch, t->ranks, o->batch,
                              o->epochs, o->max_steps, err);
}

ps_err ctr_trainer_init(ctr_trainer *t, const trainer_settings *settings, ps_error *err) {
  memset(t, 0, sizeof *t);
  t->settings = *settings;
  sparse_dedup_init(&t->eval_dedup);
  const trainer_options *o = &settings->opt;
  const model_desc *m = &settings->model;
  double start = now_s();
  t->ranks = 1;
  t->rewind_to = -1;
  if (settings->pserver_mode) { /* trainer r of N: blocks r, r+N, ... */
    t->rank = (int)o->id;
    t->ranks = (int)o->trainers;
  }
  if (settings->collective_mode) {
#ifdef PSTRAIN_HAVE_MPI
    if (ctr_collective_start(t, err) != PS_ERR_OK) goto fail;
#else
    ps_error_set(err, PS_ERR_INTERNAL, "--mode collective without MPI passed the flags' check");
    goto fail;
#endif
  }
  if (ctr_reader_count_lines(o->data, &t->examples_per_epoch, err) != PS_ERR_OK) goto fail;
  if (o->train_samples > 0 && o->train_samples < t->examples_per_epoch) {
    t->examples_per_epoch = o->train_samples;
  }
  if (t->examples_per_epoch < 1) {
    ps_error_set(err, PS_ERR_CORRUPT_DATA, "--data %s holds no examples", o->data);
    goto fail;
  }
  LOG_INFO("%s: %ld examples (counted in %.1fs)", o->data, t->examples_per_epoch, now_s() - start);
  long global_batch = o->batch * t->ranks;
  t->steps_per_epoch = (t->examples_per_epoch + global_batch - 1) / global_batch;
  t->settings.optimizer.total_steps = t->steps_per_epoch * o->epochs;
  if (o->test_data[0] != '\0' && !ctr_reader_sniff(o->test_data)) {
    ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                 "--test-data %s is not a Criteo TSV file (40 tab-separated fields per line)",
                 o->test_data);
    goto fail;
  }
  if (o->metrics[0] != '\0' && (t->metrics = fopen(o->metrics, "a")) == NULL) {
    ps_error_set(err, PS_ERR_IO, "--metrics %s: cannot open for appending: %s", o->metrics,
                 strerror(errno));
    goto fail;
  }
  char timeline_path[4096];
  timeline_rank_path(o->timeline, settings->collective_mode, t->rank, timeline_path,
                     sizeof timeline_path);
  if (timeline_open(&t->tl, timeline_path, "trainer", t->rank, settings->timeline_first,
                    settings->timeline_last, settings->timeline_every, err) != PS_ERR_OK) {
    goto fail;
  }
  if (backend_open(&t->be, o->device, (int)o->threads, (int)o->gpu, err) != PS_ERR_OK) goto fail;
  int max_batch = o->batch > TRAINER_EVAL_BATCH ? (int)o->batch : TRAINER_EVAL_BATCH;
  if (model_create(&t->model, m, t->be, max_batch, (uint64_t)o->seed, err) != PS_ERR_OK ||
      tables_create(t, err) != PS_ERR_OK) {
    goto fail;
  }
  size_t keys = (size_t)max_batch * FIELDS;
  int ok = 1;
  size_t eval_keys = (size_t)TRAINER_EVAL_BATCH * FIELDS;
  t->eval_examples = alloc_array(TRAINER_EVAL_BATCH, sizeof *t->eval_examples, &ok);
  t->eval_keys = alloc_array(eval_keys, sizeof *t->eval_keys, &ok);
  t->eval_slot = alloc_array(eval_keys, sizeof *t->eval_slot, &ok);
  for (int i = 0; i < t->model->tables; i++) {
    t->rows[i] = alloc_array(keys * (size_t)t->model->dim[i], sizeof(float), &ok);
    t->row_grads[i] = alloc_array(keys * (size_t)t->model->dim[i], sizeof(float), &ok);
  }
  if (!ok) {
    ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory for batches of %d", max_batch);
    goto fail;
  }
  if (o->checkpoint_dir[0] != '\0' && !o->resume &&
      process_prepare_dir(o->checkpoint_dir, "--checkpoint-dir", err) != PS_ERR_OK) {
    goto fail;
  }
  if (o->resume && ctr_checkpoint_resume(t, err) != PS_ERR_OK) goto fail;
  if (settings->pserver_mode && ctr_pserver_start(t, err) != PS_ERR_OK) goto fail;
  if (open_data(t, err) != PS_ERR_OK) goto fail;
#ifdef PSTRAIN_HAVE_MPI
  t->agreed = 1; /* from here every rank fails alike */
  if (t->exchange != NULL && ctr_collective_ready(t, err) != PS_ERR_OK) goto fail;
#endif
  return PS_ERR_OK;
fail:
#ifdef PSTRAIN_HAVE_MPI
  if (t->exchange != NULL && t->ranks > 1 && !t->agreed) {
    /* The other ranks may wait for this one in the agreement check (a
     * failure only here: a file, a port, memory): end them all. */
    LOG_ERROR("%s", err->msg);
    ctr_collective_abort(2);
  }
#endif
  ctr_trainer_free(t);
  return err->code;
}

void ctr_trainer_free(ctr_trainer *t) {
#ifdef PSTRAIN_HAVE_MPI
  ctr_collective_stop(t);
#endif
  ctr_pserver_stop(t);
  timeline_close(t->tl);
  data_source_destroy(t->data);
  for (int i = 0; i < MODEL_TABLES_MAX; i++) {
    sparse_table_destroy(t->tables[i]);
    free(t->rows[i]);
    free(t->row_grads[i]);
  }
  model_destroy(t->model);
  backend_destroy(t->be);
  if (t->metrics != NULL && fclose(t->metrics) != 0) {
    LOG_ERROR("closing the metrics file: %s", strerror(errno));
  }
  sparse_dedup_free(&t->eval_dedup);
  free(t->eval_examples);
  free(t->eval_keys);
  free(t->eval_slot);
  memset(t, 0, sizeof *t);
}

model_batch ctr_batch_of(const ctr_trainer *t, const ctr_example *examples, const uint32_t *slot,
                         const sparse_dedup *dedup, int count) {
  model_batch b = {.size = count, .examples = examples, .slot = slot, .unique = dedup->n_unique};
  for (int i = 0; i < t->model->tables; i++) b.rows[i] = t->rows[i];
  return b;
}

ps_err ctr_local_step(ctr_trainer *t, long step, double *loss_sum, ps_error *err) {
  const data_batch *db = &t->batch;
  const sparse_dedup *d = db->dedup;
  const int tables = t->model->tables;
  double t0 = now_s();
  for (int i = 0; i < tables; i++) {
    PS_TRY(sparse_table_pull(t->tables[i], d->unique, d->n_unique, d->counts, step, t->rows[i],
                             err));
  }
  t0 = timeline_span(t->tl, "pull", step, t0);
  model_batch b = ctr_batch_of(t, db->examples, db->slot, d, db->size);
  model_outputs out = {0};
  PS_TRY(model_forward(t->model, &b, 1, &out, err));
  *loss_sum += out.loss_sum;
  t0 = timeline_span(t->tl, "forward", step, t0);
  PS_TRY(model_backward(t->model, &b, t->row_grads, err));
  t0 = timeline_span(t->tl, "backward", step, t0);
  PS_TRY(model_apply_optimizer(t->model, &t->settings.optimizer, step, err));
  for (int i = 0; i < tables; i++) {
    PS_TRY(sparse_table_push(t->tables[i], d->unique, d->n_unique, t->row_grads[i], step, err));
  }
  timeline_span(t->tl, "apply", step, t0);
  return PS_ERR_OK;
}

/* One step: here, or with every rank in collective mode (the exchange), or
 * with the pservers. Every mode takes every step, with no examples if the
 * data ran short (bad lines skipped), so steps and data positions agree. */
static ps_err train_step(ctr_trainer *t, int count, long step, double *loss_sum, ps_error *err) {
  if (t->ps != NULL) return ctr_pserver_step(t, count, step, loss_sum, err); /* evicts there */
  double started = now_s();
#ifdef PSTRAIN_HAVE_MPI
  if (t->exchange != NULL) {
    if (ctr_collective_step(t, count, step, loss_sum, err) != PS_ERR_OK) return err->code;
  } else
#endif
  if (count > 0 && ctr_local_step(t, step, loss_sum, err) != PS_ERR_OK) {
    return err->code;
  }
  long every = t->settings.opt.evict_after / 4 > 0 ? t->settings.opt.evict_after / 4 : 1;
  if (t->settings.opt.evict_after > 0 && (step + 1) % every == 0) {
    for (int i = 0; i < t->model->tables; i++) sparse_table_evict(t->tables[i], step + 1);
  }
  return slowdown_sleep(t->settings.opt.slowdown, now_s() - started, err);
}

ps_err ctr_trainer_evaluate(ctr_trainer *t, const char *path, double *auc, double *logloss,
                            long *examples, ps_error *err) {
  ctr_reader_options ro = {.skip_bad_lines = t->settings.opt.skip_bad_lines,
                           .limit = t->settings.opt.test_samples};
  ctr_reader *r;
  if (ctr_reader_open(&r, path, &ro, err) != PS_ERR_OK) return err->code;
  size_t cap = 1 << 16, n = 0;
  float *probs = malloc(cap * sizeof *probs), *labels = malloc(cap * sizeof *labels);
  double loss = 0.0;
  ps_err rc = probs != NULL && labels != NULL
                  ? PS_ERR_OK
                  : ps_error_set(err, PS_ERR_NO_MEMORY, "evaluating: out of memory");
  while (rc == PS_ERR_OK) {
    int count = 0;
    rc = ctr_reader_next(r, t->eval_examples, TRAINER_EVAL_BATCH, &count, err);
    if (rc != PS_ERR_OK) break;
    if (count == 0) break;
    if (n + (size_t)count > cap) {
      cap *= 2;
      float *p2 = realloc(probs, cap * sizeof *probs);
      if (p2 != NULL) probs = p2;
      float *l2 = realloc(labels, cap * sizeof *labels);
      if (l2 != NULL) labels = l2;
      if (p2 == NULL || l2 == NULL) {
        rc = ps_error_set(err, PS_ERR_NO_MEMORY, "evaluating %s: out of memory", path);
        break;
      }
    }
    const sparse_dedup *d = &t->eval_dedup;
    rc = criteo_dedup(t->eval_examples, count, t->eval_keys, t->eval_slot, &t->eval_dedup, err);
    if (rc != PS_ERR_OK) break;
    if (t->ps != NULL) {
      if ((rc = ctr_pserver_lookup(t, d, err)) != PS_ERR_OK) break;
      if (t->rewind_to >= 0) break; /* the job went back: no evaluation now */
    } else {
      for (int i = 0; i < t->model->tables; i++) {
        sparse_table_lookup(t->tables[i], d->unique, d->n_unique, t->rows[i]);
      }
    }
    model_batch b = ctr_batch_of(t, t->eval_examples, t->eval_slot, d, count);
    model_outputs out = {.probs = probs + n};
    if ((rc = model_forward(t->model, &b, 0, &out, err)) != PS_ERR_OK) break;
    loss += out.loss_sum;
    for (int i = 0; i < count; i++) labels[n + (size_t)i] = t->eval_examples[i].label;
    n += (size_t)count;
  }
  ctr_reader_close(r);
  if (rc == PS_ERR_OK && t->rewind_to >= 0) {
    free(probs);
    free(labels);
    *examples = 0;
    return PS_ERR_OK;
  }
  if (rc == PS_ERR_OK && n == 0) {
    rc = ps_error_set(err, PS_ERR_CORRUPT_DATA, "--test-data %s holds no examples", path);
  }
  if (rc == PS_ERR_OK) rc = auc_exact(probs, labels, n, auc, err);
  free(probs);
  free(labels);
  if (rc != PS_ERR_OK) return rc;
  *logloss = loss / (double)n;
  *examples = (long)n;
  return PS_ERR_OK;
}

static void log_tables(const ctr_trainer *t, char *json, size_t len) {
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

typedef struct progress {
  long epoch, step;         /* one-based epoch; global step done */
  double train_logloss;     /* mean since the epoch began */
  double examples_per_s;
  double wall_s;
} progress;

/* Evaluates on --test-data (when given), logs and appends a metrics row. */
static ps_err report(ctr_trainer *t, const progress *p, double *auc, double *logloss,
                     ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  long n = 0;
  *auc = NAN;
  *logloss = NAN;
  if (t->rank != 0) return PS_ERR_OK; /* rank 0 evaluates and writes the metrics */
  if (o->test_data[0] != '\0' &&
      ctr_trainer_evaluate(t, o->test_data, auc, logloss, &n, err) != PS_ERR_OK) {
    return err->code;
  }
  if (t->rewind_to >= 0) return PS_ERR_OK; /* the job went back: this report comes again */
  char tables[512]; /* a pserver job's tables are on the pservers, which log them */
  if (t->ps != NULL) {
    ctr_pserver_metrics(t, tables, sizeof tables);
  } else {
    log_tables(t, tables, sizeof tables);
#ifdef PSTRAIN_HAVE_MPI
    size_t used = strlen(tables);
    if (t->exchange != NULL) ctr_collective_metrics(t, tables + used, sizeof tables - used);
#endif
  }
  if (n > 0) {
    LOG_INFO("epoch %ld step %ld: test AUC %.4f, test logloss %.4f on %ld examples; train "
             "logloss %.4f, %.0f examples/s",
             p->epoch, p->step, *auc, *logloss, n, p->train_logloss, p->examples_per_s);
  }
  if (t->metrics == NULL) return PS_ERR_OK;
  char eval[128] = "";
  if (n > 0) snprintf(eval, sizeof eval, ",\"auc\":%.6f,\"logloss\":%.6f", *auc, *logloss);
  if (fprintf(t->metrics,
              "{\"epoch\":%ld,\"step\":%ld,\"train_logloss\":%.6f%s,\"examples_per_s\":%.1f,"
              "\"wall_s\":%.3f,\"mode\":\"%s\",\"model\":\"%s\",\"trainers\":%d%s%s}\n",
              p->epoch, p->step, p->train_logloss, eval, p->examples_per_s, p->wall_s,
              t->ps != NULL ? "pserver" : t->exchange != NULL ? "collective" : "local", o->model,
              t->ranks, tables, metrics_repeat_field(t->replay_until, p->step)) < 0 ||
      fflush(t->metrics) != 0) {
    return ps_error_set(err, PS_ERR_IO, "writing --metrics %s: %s", o->metrics, strerror(errno));
  }
  return PS_ERR_OK;
}

static ps_err train_epoch(ctr_trainer *t, long epoch, long *global_step, double run_start,
                          ctr_summary *summary, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  long total_steps = t->data->total_steps;
  long first = *global_step - epoch * t->steps_per_epoch;
  double loss_sum = 0.0, start = now_s(), next_progress = start + o->progress_interval;
  double eval_s = 0.0; /* evaluation time is not training time */
  long seen = 0, seen_since_report = 0;
  double loss_since_report = 0.0;
  for (long step = first; step < t->steps_per_epoch && *global_step < total_steps; step++) {
    PS_TRY(data_source_batch(t->data, *global_step, &t->batch, err));
    const int count = t->batch.size; /* 0: the data ran short (bad lines skipped) */
    double batch_loss = 0.0, step_started = now_s(), comm_before = t->comm_seconds;
    PS_TRY(train_step(t, count, *global_step, &batch_loss, err));
    if (t->rewind_to >= 0) return PS_ERR_OK; /* the job went back: ctr_trainer_run goes there */
    if (!isfinite(batch_loss)) {
      PS_TRY(ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "training diverged: the logloss is %g at epoch %ld step %ld; try a "
                        "smaller --lr (now %g) or --sparse-lr (now %g)",
                        batch_loss, epoch + 1, step + 1, o->lr, o->sparse_lr));
    }
    loss_sum += batch_loss;
    loss_since_report += batch_loss;
    seen += count;
    seen_since_report += count;
    (*global_step)++;
    trainer_metrics_step(t->prom, *global_step, count, batch_loss, now_s() - step_started,
                         t->comm_seconds - comm_before);
    if (ctr_checkpoint_due(t, *global_step, 0)) {
      double t0 = now_s();
      PS_TRY(ctr_checkpoint_write(t, *global_step, err));
      timeline_span(t->tl, "checkpoint", *global_step - 1, t0);
    }
    timeline_flush(t->tl);
    double now = now_s();
    if (o->eval_every > 0 && *global_step % o->eval_every == 0 && *global_step < total_steps) {
      progress p = {epoch + 1, *global_step, loss_since_report / (double)seen_since_report,
                    (double)seen / (now - start - eval_s), now - run_start};
      double auc, logloss;
      PS_TRY(report(t, &p, &auc, &logloss, err));
      if (t->rewind_to >= 0) return PS_ERR_OK; /* a pserver came back from an older step */
      timeline_span(t->tl, "evaluation", *global_step - 1, now);
      eval_s += now_s() - now;
      loss_since_report = 0.0;
      seen_since_report = 0;
      now = now_s();
    }
    if (o->progress_interval > 0 && now >= next_progress) {
      double rate = (double)seen / (now - start - eval_s);
      double eta = job_eta_s(*global_step, total_steps, (double)(step + 1 - first) /
                                                         (now - start - eval_s));
      LOG_INFO("epoch %ld/%ld step %ld/%ld job step %ld/%ld logloss %.4f %.0f examples/s ETA %.0fs "
               "(job)",
               epoch + 1, o->epochs, step + 1, t->steps_per_epoch, *global_step, total_steps,
               loss_sum / (double)seen, rate, eta);
      next_progress = now + o->progress_interval;
    }
  }
  double elapsed = now_s() - start - eval_s;
  summary->train_logloss = seen > 0 ? loss_sum / (double)seen : 0.0;
  summary->examples_per_s = seen > 0 ? (double)seen / elapsed : 0.0;
  progress p = {epoch + 1, *global_step, summary->train_logloss, summary->examples_per_s,
                now_s() - run_start};
  return report(t, &p, &summary->auc, &summary->logloss, err);
}

ps_err ctr_trainer_run(ctr_trainer *t, ctr_summary *summary, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  double run_start = now_s();
  long global_step = t->start_step;
  memset(summary, 0, sizeof *summary);
  summary->auc = summary->logloss = NAN;
  LOG_INFO("training %s on %ld examples per epoch (%ld steps of %ld), backend %s: %s", o->model,
           t->examples_per_epoch, t->steps_per_epoch, o->batch, t->be->name, t->be->description);
  ps_err rc = PS_ERR_OK;
  for (long epoch = global_step / t->steps_per_epoch; epoch < o->epochs && rc == PS_ERR_OK;
       epoch++) {
    if (o->max_steps > 0 && global_step >= o->max_steps) break;
    rc = train_epoch(t, epoch, &global_step, run_start, summary, err);
    if (rc == PS_ERR_OK && t->rewind_to >= 0) {
      /* The data position follows from the step, as when resuming. */
      metrics_repeat_note(&t->replay_until, global_step);
      global_step = t->rewind_to;
      t->rewind_to = -1;
      epoch = global_step / t->steps_per_epoch - 1;
      continue;
    }
    summary->epochs = epoch + 1;
  }
  if (rc != PS_ERR_OK) return rc;
  summary->steps = global_step;
  data_source_log_end(t->data);
  if (ctr_checkpoint_due(t, global_step, 1) && !ctr_checkpoint_due(t, global_step, 0) &&
      ctr_checkpoint_write(t, global_step, err) != PS_ERR_OK) {
    return err->code;
  }
  if (o->export_path[0] != '\0' && t->rank == 0 &&
      ((t->ps != NULL && ctr_pserver_fetch_all(t, err) != PS_ERR_OK) ||
       ctr_export(t, o->export_path, err) != PS_ERR_OK)) {
    return err->code;
  }
  if (t->ps != NULL && ctr_pserver_finish(t, global_step, err) != PS_ERR_OK) return err->code;
  /* --export-replicas: the other replicas too, as PATH.rankN. */
  if (o->export_path[0] != '\0' && t->rank != 0 && t->exchange != NULL && o->export_replicas) {
    char path[4096];
    snprintf(path, sizeof path, "%s.rank%d", o->export_path, t->rank);
    if (ctr_export(t, path, err) != PS_ERR_OK) return err->code;
  }
  return PS_ERR_OK;
}
