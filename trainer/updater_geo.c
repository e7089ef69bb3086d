/* GEO-SGD in pserver mode (--update geo): every step applies the job's
 * optimizer here, as --mode local does; every --geo-steps steps, and at the
 * job's last step (so the evaluation after it sees the merged model), the
 * change of the parameters since the last exchange goes to the pservers
 * through the push path (PushRequest.deltas). They add it / N and answer
 * with the fresh parameters, which this trainer takes and remembers as the
 * base of its next change. */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "trainer/ps_client.h"
#include "trainer/train.h"
#include "trainer/updater.h"

typedef struct geo_updater {
  updater base;
  ps_client ps;
  int connected;          /* ps holds channels: ps_client_close frees them */
  float *at_exchange;     /* (total) the parameters the last exchange gave */
  float *change;          /* (total) what the next exchange sends */
  long steps;             /* the job's; its last step exchanges too */
  long local;             /* steps since the last exchange */
  long exchanges;
  uint64_t bytes_counted; /* of ps's sent + received, already in comm_bytes */
} geo_updater;

/* Registers, takes the pservers' parameters (a restarted trainer goes on
 * from the merged model) and makes them the first base. */
static ps_err geo_start(updater *u, ps_error *err) {
  geo_updater *g = (geo_updater *)u;
  trainer *t = u->t;
  const trainer_settings *s = &t->settings;
  job_config job;
  trainer_job(t, s->pservers.count, &job);
  if (ps_client_connect(&g->ps, &s->pservers, &job, t->id, s->opt.connect_timeout,
                        s->opt.rpc_timeout, s->token, &s->tls, err) != PS_ERR_OK) {
    return err->code;
  }
  g->connected = 1;
  size_t n = t->model->layout.total;
  g->at_exchange = malloc((n > 0 ? n : 1) * sizeof(float));
  g->change = malloc((n > 0 ? n : 1) * sizeof(float));
  if (g->at_exchange == NULL || g->change == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "--update geo: out of memory for %zu floats", n);
  }
  if (ps_client_pull(&g->ps, t->host_params, err) != PS_ERR_OK) return err->code;
  memcpy(g->at_exchange, t->host_params, n * sizeof(float));
  (void)ps_client_bytes_since(&g->ps, &g->bytes_counted); /* steps count from here */
  g->steps = job.steps;
  t->start_step = g->ps.start_step;
  if (t->start_step > 0) {
    LOG_INFO("resuming at step %ld (epoch %ld, step %ld of it), where the pservers are",
             t->start_step, t->start_step / t->steps_per_epoch + 1,
             t->start_step % t->steps_per_epoch + 1);
  }
  if (t->staged) return model_set_params(t->model, t->host_params, err);
  return PS_ERR_OK;
}

/* Sends the change since the last exchange (key step `done`: the steps this
 * trainer has taken) and takes the fresh parameters; a lost or restarted
 * pserver is waited for and the same change resent (applied once). */
static ps_err exchange(geo_updater *g, long done, ps_error *err) {
  trainer *t = g->base.t;
  size_t n = t->model->layout.total;
  if (t->staged && model_get_params(t->model, t->host_params, err) != PS_ERR_OK) return err->code;
  for (size_t i = 0; i < n; i++) g->change[i] = t->host_params[i] - g->at_exchange[i];
  double start = now_s();
  if (ps_client_push_pull(&g->ps, done, g->change, t->host_params, err) != PS_ERR_OK) {
    double timeout = t->settings.opt.recover_timeout;
    if (!ps_client_recoverable(err->code) || timeout <= 0) return err->code;
    LOG_WARN("%s: recovering (--recover-timeout %.0f s)", err->msg, timeout);
    long resume_at;
    if (ps_client_recover(&g->ps, done, g->change, t->host_params, timeout, &resume_at, err) !=
        PS_ERR_OK) {
      return err->code;
    }
  }
  timeline_span(t->tl, "push", done - 1, start);
  g->base.comm_seconds += now_s() - start;
  g->base.comm_bytes += ps_client_bytes_since(&g->ps, &g->bytes_counted);
  memcpy(g->at_exchange, t->host_params, n * sizeof(float));
  g->local = 0;
  g->exchanges++;
  if (t->staged) return model_set_params(t->model, t->host_params, err);
  return PS_ERR_OK;
}

static ps_err geo_apply(updater *u, long step, long *next, ps_error *err) {
  geo_updater *g = (geo_updater *)u;
  trainer *t = u->t;
  double t0 = now_s();
  if (model_apply_optimizer(t->model, &t->settings.optimizer, step, err) != PS_ERR_OK) {
    return err->code;
  }
  timeline_span(t->tl, "apply", step, t0);
  *next = step + 1;
  if (++g->local < t->settings.geo_steps && step + 1 < g->steps) return PS_ERR_OK;
  return exchange(g, step + 1, err);
}

/* Trainers of a pserver job share nothing among themselves. */
static ps_err geo_broadcast(updater *u, void *data, size_t bytes, ps_error *err) {
  (void)u;
  (void)data;
  (void)bytes;
  return ps_error_set(err, PS_ERR_UNSUPPORTED,
                      "pserver mode: trainers take their parameters from the pservers");
}

static ps_err geo_finish(updater *u, long steps, ps_error *err) {
  geo_updater *g = (geo_updater *)u;
  LOG_INFO("communication: %ld GEO exchanges (--geo-steps %d), %.1f MB sent, %.1f MB received, "
           "%.1f s in push-pull", g->exchanges, u->t->settings.geo_steps,
           (double)g->ps.bytes_sent / 1e6, (double)g->ps.bytes_received / 1e6,
           g->ps.comm_seconds);
  return ps_client_done(&g->ps, steps, err);
}

static void geo_destroy(updater *u) {
  geo_updater *g = (geo_updater *)u;
  if (g->connected) ps_client_close(&g->ps);
  free(g->at_exchange);
  free(g->change);
  free(g);
}

static const updater_ops geo_ops = {
    .name = "geo",
    .holds_state = 0,
    .start = geo_start,
    .apply = geo_apply,
    .broadcast = geo_broadcast,
    .finish = geo_finish,
    .destroy = geo_destroy,
};

ps_err updater_geo_create(trainer *t, updater **out, ps_error *err) {
  const trainer_settings *s = &t->settings;
  geo_updater *g = calloc(1, sizeof *g);
  if (g == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory");
  g->base.ops = &geo_ops;
  g->base.t = t;
  t->mode_label = "pserver-geo";
  t->id = (int)s->opt.id;
  t->trainers = (int)s->opt.trainers;
  *out = &g->base;
  return PS_ERR_OK;
}
