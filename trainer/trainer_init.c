/* A trainer's start and end: joining the job, the data, the backend, the
 * model and its tables, the buffers of a step's rows, --resume, and the
 * replica's start (see train.h). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/ctr_tables.h"
#include "common/log.h"
#include "common/process.h"
#include "common/tb_events.h"
#include "trainer/checkpoint.h"
#include "trainer/data/handed_source.h"
#include "trainer/train.h"

void trainer_job(const trainer *t, job_config *job) {
  const trainer_settings *s = &t->settings;
  long steps = t->steps_per_epoch * s->opt.epochs;
  if (s->opt.max_steps > 0 && s->opt.max_steps < steps) steps = s->opt.max_steps;
  *job = (job_config){.model = s->model, .optimizer = s->optimizer,
                      .update = s->pserver_mode ? s->update : UPDATE_SYNC,
                      .trainers = t->trainers, .pservers = s->pserver_mode ? s->pservers.count : 1,
                      .block_size = (size_t)s->opt.block_size, .seed = (uint64_t)s->opt.seed,
                      .batch = s->opt.batch, .steps = steps, .wire_dtype = s->wire_dtype};
  snprintf(job->input_norm, sizeof job->input_norm, "%s", s->input_norm);
  if (job->update == UPDATE_SSP) job->staleness = s->staleness;
  if (job->update == UPDATE_GEO) job->geo_steps = s->geo_steps;
  if (job->update == UPDATE_ASYNC || job->update == UPDATE_SSP) job->async_whole = s->async_whole;
  if (s->opt.shard_steps > 0) {
    job->shard_steps = (int)s->opt.shard_steps;
    job->epoch_examples = t->files.examples;
    job->epochs = (int)s->opt.epochs;
    job->elastic_min = s->elastic_min;
  }
  if (ctr_table_count(&s->model) > 0) {
    job->sparse = job_sparse_of(&s->sparse_opt, (int)s->opt.admit_after, s->opt.evict_after);
  }
}

/* The model's tables in this process, as the job describes them. */
static ps_err tables_create(trainer *t, ps_error *err) {
  job_config job;
  trainer_job(t, &job);
  size_t max_bytes = (size_t)(t->settings.opt.max_table_mb * 1024.0 * 1024.0);
  for (int i = 0; i < t->model->tables; i++) {
    sparse_table_config c;
    ctr_table_config(&job, i, max_bytes, &c);
    PS_TRY(sparse_table_create(&t->tables[i], &c, err));
  }
  return PS_ERR_OK;
}

/* The backend, the model, its tables, the rows' buffers and the host
 * copies of a device model's parameters. */
static ps_err build_model(trainer *t, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  PS_TRY(backend_open(&t->be, o->device, (int)o->threads, (int)o->gpu, err));
  int max_batch = o->batch > TRAINER_EVAL_BATCH ? (int)o->batch : TRAINER_EVAL_BATCH;
  PS_TRY(model_create(&t->model, &t->settings.model, t->be, max_batch, (uint64_t)o->seed, err));
  t->model->bn_group = (int)o->bn_group;
  t->model->stats_owner = t->id == 0;
  PS_TRY(tables_create(t, err));
  size_t keys = (size_t)max_batch * CRITEO_CAT_FIELDS;
  for (int i = 0; i < t->model->tables; i++) {
    t->rows[i] = calloc(keys * (size_t)t->model->dim[i], sizeof(float));
    t->row_grads[i] = calloc(keys * (size_t)t->model->dim[i], sizeof(float));
    if (t->rows[i] == NULL || t->row_grads[i] == NULL) {
      return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory for batches of %d", max_batch);
    }
  }
  size_t n = t->model->layout.total;
  t->staged = t->model->params_host == NULL;
  if (!t->staged) {
    t->host_params = t->model->params_host;
    t->host_grads = t->model->grads_host;
    return PS_ERR_OK;
  }
  /* Pinned on a GPU: pushes, pulls and all-reduces copy through these. */
  if ((t->host_params = t->be->ops->host_alloc(t->be, n * sizeof(float), err)) == NULL ||
      (t->host_grads = t->be->ops->host_alloc(t->be, n * sizeof(float), err)) == NULL) {
    return err->code;
  }
  return PS_ERR_OK;
}

/* The timeline, the TensorBoard run and, on trainer 0, the metrics file. */
static ps_err open_outputs(trainer *t, ps_error *err) {
  const trainer_settings *s = &t->settings;
  const trainer_options *o = &s->opt;
  char timeline_path[4096];
  timeline_rank_path(o->timeline, s->collective_mode, t->id, timeline_path, sizeof timeline_path);
  PS_TRY(timeline_open(&t->tl, timeline_path, "trainer", t->id, s->timeline_first,
                       s->timeline_last, s->timeline_every, err));
  char run[32];
  snprintf(run, sizeof run, "trainer-%d", t->id);
  PS_TRY(tb_writer_open(&t->tb, o->tensorboard, run, err));
  if (t->tb != NULL) LOG_INFO("tensorboard: writing %s", tb_writer_path(t->tb));
  /* Trainer 0 writes the job's rows; with handed-out data the others
   * theirs (the examples each applied) beside them, as PATH.rankN. */
  char path[4096];
  snprintf(path, sizeof path, "%s", o->metrics);
  if (t->id != 0) snprintf(path, sizeof path, "%s.rank%d", o->metrics, t->id);
  int writes = o->metrics[0] != '\0' && (t->id == 0 || o->shard_steps > 0);
  if (writes && (t->metrics = fopen(path, "a")) == NULL) {
    return ps_error_set(err, PS_ERR_IO, "--metrics %s: cannot open for appending: %s", path,
                        strerror(errno));
  }
  return PS_ERR_OK;
}

static ps_err next_shard(void *ctx, long epoch, long finished, data_shard *out, ps_error *err) {
  trainer *t = ctx;
  return replica_next_shard(t->rep, epoch, finished, out, err);
}

/* Handed-out data: the whole data set in one order (trainer 0 of 1's),
 * handed out by pserver 0; the job's length as the fixed split's. A
 * Criteo reader parses ahead what a new shard skips (the others' shards
 * between: about trainers - 1 of them), up to 64k examples (17 MiB). */
static ps_err open_handed(trainer *t, ps_error *err) {
  const trainer_settings *s = &t->settings;
  data_source *inner;
  long global = s->opt.batch * t->trainers;
  long ahead = global * s->opt.shard_steps;
  if (ahead > 65536) ahead = 65536;
  if (ahead < 4096) ahead = 0; /* the reader's default is more */
  PS_TRY(data_files_train(&t->files, s, 0, 1, ahead, t->model, &inner, err));
  return handed_source_create(&t->data, inner, next_shard, t,
                              (t->files.examples + global - 1) / global, s->opt.epochs, err);
}

/* This trainer's batches, the evaluation's (trainer 0) and the job's length. */
static ps_err open_data(trainer *t, ps_error *err) {
  const trainer_settings *s = &t->settings;
  if (s->opt.shard_steps > 0) PS_TRY(open_handed(t, err));
  else PS_TRY(data_files_train(&t->files, s, t->id, t->trainers, 0, t->model, &t->data, err));
  if (t->id == 0) PS_TRY(data_files_eval(&t->files, s, t->model, &t->eval, err));
  t->steps_per_epoch = t->data->steps_per_epoch;
  t->settings.optimizer.total_steps = t->steps_per_epoch * s->opt.epochs;
  return PS_ERR_OK;
}

static ps_err init_steps(trainer *t, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  /* The way replicas stay in step decides this trainer's share of the data. */
  PS_TRY(replica_create(t, &t->rep, err));
  PS_TRY(data_files_load(&t->files, &t->settings, err));
  if (t->settings.model.kind == MODEL_NET && !t->settings.criteo) {
    /* A built-in network takes the images' shape (a file's was checked). */
    const dataset *d = &t->files.train;
    PS_TRY(model_set_input(&t->settings.model, d->channels, d->rows, d->cols, err));
  }
  /* The training set's normalization is part of the job: trainers whose
   * data differ (another CIFAR-10 folder) do not train one model. */
  const dataset *train = &t->files.train;
  if (!t->settings.criteo && train->normalized) {
    input_norm_format(train->channels, train->mean, train->std, t->settings.input_norm,
                      sizeof t->settings.input_norm);
  }
  PS_TRY(open_outputs(t, err));
  PS_TRY(build_model(t, err));
  PS_TRY(open_data(t, err));
  if (o->checkpoint_dir[0] != '\0' && t->id == 0 && !o->resume) {
    PS_TRY(process_prepare_dir(o->checkpoint_dir, "--checkpoint-dir", err));
  }
  if (o->resume) PS_TRY(trainer_checkpoint_resume(t, err));
  /* Connect, pull, agree: after any --resume has loaded the model. */
  return replica_start(t->rep, err);
}

ps_err trainer_init(trainer *t, const trainer_settings *settings, ps_error *err) {
  memset(t, 0, sizeof *t);
  t->rewind_to = -1;
  t->settings = *settings;
  if (init_steps(t, err) == PS_ERR_OK) return PS_ERR_OK;
  if (t->rep != NULL && !t->rep->agreed && t->trainers > 1 && t->rep->ops->abort != NULL) {
    /* The other ranks may wait for this one in the agreement check (a
     * failure only here: a file, a port, memory): end them all. */
    LOG_ERROR("%s", err->msg);
    replica_abort(t->rep, 2);
  }
  trainer_free(t);
  return err->code;
}

void trainer_free(trainer *t) {
  replica_destroy(t->rep);
  timeline_close(t->tl);
  tb_writer_close(t->tb);
  data_source_destroy(t->data);
  data_source_destroy(t->eval);
  if (t->staged) {
    if (t->host_params != NULL) t->be->ops->host_free(t->be, t->host_params);
    if (t->host_grads != NULL) t->be->ops->host_free(t->be, t->host_grads);
  }
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
  data_files_free(&t->files);
  memset(t, 0, sizeof *t);
}

void trainer_log_resume(const trainer *t, const char *where) {
  long s = t->start_step;
  if (t->settings.opt.shard_steps > 0) {
    LOG_INFO("joining at step %ld%s; pserver 0 hands out the data", s, where);
    return;
  }
  data_position p = data_source_position(t->data, s);
  LOG_INFO("resuming at step %ld (epoch %ld, step %ld of it)%s; data shard %ld offset %ld", s,
           s / t->steps_per_epoch + 1, s % t->steps_per_epoch + 1, where, p.shard, p.offset);
}

model_batch trainer_model_batch(const trainer *t, const data_batch *b) {
  model_batch mb = {.size = b->size, .inputs = b->inputs, .labels = b->labels,
                    .examples = b->examples, .slot = b->slot,
                    .unique = b->dedup != NULL ? b->dedup->n_unique : 0};
  for (int i = 0; i < t->model->tables; i++) mb.rows[i] = t->rows[i];
  return mb;
}
