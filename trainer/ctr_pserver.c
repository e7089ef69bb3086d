/* The CTR step in pserver mode (see ctr_pserver.h). */
#define _POSIX_C_SOURCE 200809L
#include "trainer/ctr_pserver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "trainer/ctr_geo.h"
#include "trainer/ps_client_sparse.h"
#include "trainer/slowdown.h"

struct ctr_pserver {
  ps_client c;
  int connected;                 /* c holds channels */
  ps_sparse sp;
  float *params, *grads;         /* (layout.total) dense, as sent and received */
  float *next_rows[CTR_TABLES_MAX]; /* (batch * 26, dim) the next step's rows, batch order */
  int need_pull;                 /* the next step's rows are not here yet: PULL_STEP first */
  long version;                  /* the parameters' step after the last reply */
  long steps;                    /* pushed (geo: taken) */
  ctr_geo *geo;                  /* --update geo: local steps, exchanges (ctr_geo.c) */
};

ps_err ctr_pserver_start(ctr_trainer *t, ps_error *err) {
  const trainer_settings *s = &t->settings;
  const trainer_options *o = &s->opt;
  struct ctr_pserver *x = calloc(1, sizeof *x);
  if (x == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver mode: out of memory");
  t->ps = x;
  job_config job;
  ctr_trainer_job(t, &job); /* the model, optimizers, tables' settings and total steps */
  job.update = s->update;
  job.staleness = s->update == UPDATE_SSP ? s->staleness : 0;
  job.geo_steps = s->update == UPDATE_GEO ? s->geo_steps : 0;
  job.trainers = t->ranks;
  job.pservers = s->pservers.count;
  job.batch = o->batch;
  if (ps_client_connect(&x->c, &s->pservers, &job, t->rank, o->connect_timeout, o->rpc_timeout,
                        s->token, &s->tls, err) != PS_ERR_OK) {
    return err->code;
  }
  x->connected = 1;
  if (x->c.map.total != t->model->layout.total) {
    return ps_error_set(err, PS_ERR_INTERNAL, "pserver mode: %zu dense floats on the pservers, "
                        "%zu in the model", x->c.map.total, t->model->layout.total);
  }
  if (ps_sparse_init(&x->sp, &x->c, (int)o->batch, err) != PS_ERR_OK) return err->code;
  size_t n = t->model->layout.total > 0 ? t->model->layout.total : 1;
  x->params = malloc(n * sizeof(float));
  x->grads = calloc(n, sizeof(float));
  int ok = x->params != NULL && x->grads != NULL;
  for (int i = 0; i < x->sp.tables && ok; i++) {
    x->next_rows[i] = malloc(x->sp.max_keys * (size_t)x->sp.dim[i] * sizeof(float) + 1);
    ok = x->next_rows[i] != NULL;
  }
  if (!ok) return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver mode: out of memory");
  x->need_pull = 1;
  x->version = t->start_step = x->c.start_step;
  if (s->update == UPDATE_GEO && ctr_geo_create(&x->geo, t, &x->c, err) != PS_ERR_OK) {
    return err->code;
  }
  if (t->start_step > 0) {
    LOG_INFO("resuming at step %ld (epoch %ld, step %ld of it), where the pservers are",
             t->start_step, t->start_step / t->steps_per_epoch + 1,
             t->start_step % t->steps_per_epoch + 1);
  }
  return PS_ERR_OK;
}

/* The rows of the batch's keys: pulled (the first step, or after the job
 * went back) or arrived with the last push's reply. */
static ps_err rows_of_step(ctr_trainer *t, size_t n, long step, ps_error *err) {
  struct ctr_pserver *x = t->ps;
  float **rows = t->rows;
  if (!x->need_pull) {
    for (int i = 0; i < x->sp.tables; i++) {
      memcpy(rows[i], x->next_rows[i], n * (size_t)x->sp.dim[i] * sizeof(float));
    }
    return PS_ERR_OK;
  }
  const sparse_dedup *d = t->batch.dedup;
  if (ps_sparse_split(&x->sp, &x->sp.next, d->unique, d->counts, n, err) != PS_ERR_OK ||
      ps_sparse_pull_step(&x->sp, step, x->params, err) != PS_ERR_OK) {
    return err->code;
  }
  ps_sparse_scatter(&x->sp, &x->sp.next, rows);
  x->need_pull = 0;
  x->version = step;
  return model_set_params(t->model, x->params, err);
}

/* This trainer's share of the global batch's mean loss, relative to the 1/N
 * the pservers scale by: 1 but where the data ran short (the epoch's last
 * step), so a sync step still equals a local one on the global batch. */
static float grad_scale(const ctr_trainer *t, int count, long step) {
  long global = t->settings.opt.batch * t->ranks;
  long total = t->examples_per_epoch - (step % t->steps_per_epoch) * global;
  if (total > global) total = global;
  if (count <= 0 || total <= 0) return 1.0f;
  return (float)((double)count * (double)t->ranks / (double)total);
}

ps_err ctr_pserver_step(ctr_trainer *t, int count, long step, double *loss_sum, ps_error *err) {
  struct ctr_pserver *x = t->ps;
  if (x->geo != NULL) {
    x->steps++;
    x->version = step + 1;
    return ctr_geo_step(x->geo, t, count, step, loss_sum, &t->comm_seconds, err);
  }
  const size_t n = count > 0 ? t->batch.dedup->n_unique : 0;
  const size_t total = t->model->layout.total;
  double t0 = now_s();
  if (rows_of_step(t, n, step, err) != PS_ERR_OK) return err->code;
  timeline_span(t->tl, "pull", step, t0); /* a PULL_STEP, or the rows the last reply brought */
  /* sp.next holds this batch's keys split by pserver (the last push or the
   * pull split them): they become the keys pulled for this step. */
  ps_sparse_keys split = x->sp.cur;
  x->sp.cur = x->sp.next;
  x->sp.next = split;
  double computing = now_s();
  if (count > 0) {
    model_batch b = ctr_batch_of(t, t->batch.examples, t->batch.slot, t->batch.dedup, count);
    t0 = now_s();
    model_outputs out = {0};
    PS_TRY(model_forward(t->model, &b, 1, &out, err));
    *loss_sum += out.loss_sum;
    t0 = timeline_span(t->tl, "forward", step, t0);
    PS_TRY(model_backward(t->model, &b, t->row_grads, err));
    PS_TRY(model_get_grads(t->model, x->grads, err));
    timeline_span(t->tl, "backward", step, t0);
    const float scale = grad_scale(t, count, step);
    if (scale != 1.0f) {
      for (size_t j = 0; j < total; j++) x->grads[j] *= scale;
      for (int i = 0; i < x->sp.tables; i++) {
        float *g = t->row_grads[i];
        for (size_t j = 0; j < n * (size_t)x->sp.dim[i]; j++) g[j] *= scale;
      }
    }
  } else {
    memset(x->grads, 0, total * sizeof(float));
  }
  if (slowdown_sleep(t->settings.opt.slowdown, now_s() - computing, err) != PS_ERR_OK) {
    return err->code;
  }
  /* The next batch's keys ride on this push: the data source read it ahead
   * (none after the job's last step). */
  const sparse_dedup *next = NULL;
  if (data_source_keys_ahead(t->data, step + 1, &next, err) != PS_ERR_OK) return err->code;
  if (ps_sparse_split(&x->sp, &x->sp.next, next != NULL ? next->unique : NULL,
                      next != NULL ? next->counts : NULL, next != NULL ? next->n_unique : 0,
                      err) != PS_ERR_OK) {
    return err->code;
  }
  double start = now_s();
  long resume_at;
  if (ps_sparse_push_pull(&x->sp, step, x->grads, t->row_grads, x->params,
                          t->settings.opt.recover_timeout, &resume_at, err) != PS_ERR_OK) {
    return err->code;
  }
  timeline_span(t->tl, "push", step, start); /* push-pull, the pservers' wait included */
  t->comm_seconds += now_s() - start;
  x->steps++;
  if (resume_at <= step) {
    /* The job went back: the data source seeks when asked for that step. */
    t->rewind_to = resume_at;
    x->need_pull = 1;
    return PS_ERR_OK;
  }
  x->version = resume_at;
  ps_sparse_scatter(&x->sp, &x->sp.next, x->next_rows);
  return model_set_params(t->model, x->params, err);
}

ps_err ctr_pserver_lookup(ctr_trainer *t, const sparse_dedup *d, ps_error *err) {
  struct ctr_pserver *x = t->ps;
  /* The dense parameters that come along are not used: the model has its own. */
  long resume_at;
  if (ps_sparse_lookup(&x->sp, x->version, d->unique, d->counts, d->n_unique, t->rows, x->params, t->settings.opt.recover_timeout, &resume_at,
                       err) != PS_ERR_OK) {
    return err->code;
  }
  if (resume_at < x->version) {
    /* A pserver came back from an older checkpoint: the job goes back there. */
    t->rewind_to = resume_at;
    x->need_pull = 1;
  }
  return PS_ERR_OK;
}

ps_err ctr_pserver_fetch_all(ctr_trainer *t, ps_error *err) {
  struct ctr_pserver *x = t->ps;
  if (ps_sparse_pull_all(&x->sp, x->version, x->params, t->settings.opt.recover_timeout, err) !=
          PS_ERR_OK ||
      model_set_params(t->model, x->params, err) != PS_ERR_OK) {
    return ps_error_set(err, err->code, "--export: %s", err->msg);
  }
  for (int i = 0; i < x->sp.tables; i++) {
    const ps_sparse_dump *a = &x->sp.all[i];
    if (sparse_table_load(t->tables[i], a->n, a->keys, a->rows, NULL, NULL, err) != PS_ERR_OK) {
      return ps_error_set(err, err->code, "--export: the pservers' rows: %s", err->msg);
    }
  }
  return PS_ERR_OK;
}

void ctr_pserver_metrics(const ctr_trainer *t, char *buf, size_t len) {
  const struct ctr_pserver *x = t->ps;
  double bytes = (double)(x->c.bytes_sent + x->c.bytes_received);
  snprintf(buf, len, ",\"update\":\"%s\",\"pservers\":%d,\"bytes_per_step\":%.0f",
           update_mode_name(x->c.job.update), x->c.job.pservers,
           x->steps > 0 ? bytes / (double)x->steps : 0.0);
}

ps_err ctr_pserver_finish(ctr_trainer *t, long steps, ps_error *err) {
  struct ctr_pserver *x = t->ps;
  double bytes = (double)(x->c.bytes_sent + x->c.bytes_received);
  LOG_INFO("pserver CTR mode, trainer %d: %ld steps, %.0f bytes sent + received per step (%.1f "
           "MB sent, %.1f MB received), %.2fs in push-pulls",
           t->rank, x->steps, x->steps > 0 ? bytes / (double)x->steps : 0.0,
           (double)x->c.bytes_sent / 1e6, (double)x->c.bytes_received / 1e6, t->comm_seconds);
  if (x->geo != NULL) {
    LOG_INFO("communication: %ld GEO exchanges (--geo-steps %d)", ctr_geo_exchanges(x->geo),
             x->c.job.geo_steps);
  }
  return ps_client_done(&x->c, steps, err);
}

void ctr_pserver_stop(ctr_trainer *t) {
  struct ctr_pserver *x = t->ps;
  if (x == NULL) return;
  ctr_geo_destroy(x->geo);
  ps_sparse_free(&x->sp);
  if (x->connected) ps_client_close(&x->c);
  free(x->params);
  free(x->grads);
  for (int i = 0; i < CTR_TABLES_MAX; i++) free(x->next_rows[i]);
  free(x);
  t->ps = NULL;
}
