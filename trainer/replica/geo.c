/* GEO-SGD in pserver mode (--update geo): every step trains here as
 * --mode local does (the job's optimizer, this trainer's tables); every
 * --geo-steps steps, and at the job's last step (so the evaluation after it
 * sees the merged model), the change since the last exchange goes to the
 * pservers through the push path: the dense parameters' and, for the
 * tables, only the rows touched since then (geo_rows.c). The pservers add
 * change / N and answer with the fresh parameters and rows, which this
 * trainer takes and remembers as the base of its next change. Evaluation
 * and export read the pservers' rows as in the other updates (pserver.c).
 * With handed-out data (--shard-steps) the change also goes out at the end
 * of each shard, before pserver 0 hears the shard is finished, and carries
 * where the first of its batches begins: a batch counts once its change is
 * applied everywhere. */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "trainer/replica/pserver_replica.h"

/* Registers, takes the pservers' parameters (a restarted trainer goes on
 * from the merged model) and makes them the first base. */
static ps_err geo_start(replica *r, ps_error *err) {
  pserver_replica *g = (pserver_replica *)r;
  trainer *t = r->t;
  PS_TRY(pserver_replica_connect(g, err));
  if (t->model->tables > 0) {
    PS_TRY(pserver_replica_start_sparse(g, err));
    PS_TRY(geo_rows_create(&g->rows, t, &g->c, err));
  }
  size_t n = t->model->layout.total;
  g->at_exchange = malloc((n > 0 ? n : 1) * sizeof(float));
  g->change = malloc((n > 0 ? n : 1) * sizeof(float));
  if (g->at_exchange == NULL || g->change == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "--update geo: out of memory for %zu floats", n);
  }
  PS_TRY(ps_client_pull(&g->c, t->host_params, err));
  memcpy(g->at_exchange, t->host_params, n * sizeof(float));
  (void)ps_client_bytes_since(&g->c, &g->bytes_counted); /* steps count from here */
  pserver_replica_log_start(t);
  if (t->staged) return model_set_params(t->model, t->host_params, err);
  return PS_ERR_OK;
}

static ps_err geo_pull(replica *r, long step, const data_batch *b, ps_error *err) {
  if (b->size == 0) return PS_ERR_OK;
  return replica_pull_local(r->t, step, b, err);
}

/* Sends the change since the last exchange (key step `done`: the steps this
 * trainer has taken) and takes the fresh parameters; a lost or restarted
 * pserver is waited for and the same change resent (applied once). */
static ps_err exchange(pserver_replica *g, long done, ps_error *err) {
  trainer *t = g->base.t;
  size_t n = t->model->layout.total;
  if (g->rows != NULL) geo_rows_begin(g->rows);
  if (t->staged && model_get_params(t->model, t->host_params, err) != PS_ERR_OK) return err->code;
  for (size_t i = 0; i < n; i++) g->change[i] = t->host_params[i] - g->at_exchange[i];
  double start = now_s();
  ps_err rc = ps_client_push_pull(&g->c, done, g->change, t->host_params, err);
  double timeout = t->settings.opt.recover_timeout;
  if (rc != PS_ERR_OK && ps_client_recoverable(rc) && timeout > 0) {
    LOG_WARN("%s: recovering (--recover-timeout %.0f s)", err->msg, timeout);
    long resume_at;
    rc = ps_client_recover(&g->c, done, g->change, t->host_params, timeout, &resume_at, err);
  }
  if (g->rows != NULL) rc = geo_rows_end(g->rows, rc, done, err);
  PS_TRY(rc);
  timeline_span(t->tl, "push", done - 1, start);
  g->base.comm_seconds += now_s() - start;
  g->base.comm_bytes += ps_client_bytes_since(&g->c, &g->bytes_counted);
  memcpy(g->at_exchange, t->host_params, n * sizeof(float));
  g->local = 0;
  g->exchanges++;
  if (t->staged) return model_set_params(t->model, t->host_params, err);
  return PS_ERR_OK;
}

static ps_err geo_push(replica *r, long step, const data_batch *b, long *next, ps_error *err) {
  pserver_replica *g = (pserver_replica *)r;
  trainer *t = r->t;
  int handed = t->settings.opt.shard_steps > 0;
  if (handed && g->local == 0) {
    /* The exchange's batches begin here: the ones before were in earlier exchanges. */
    data_position at = data_source_position(t->data, step);
    g->c.position = (wire_position){(uint64_t)at.epoch, (uint64_t)at.shard, (uint64_t)at.offset};
  }
  if (b->size > 0) {
    PS_TRY(replica_apply_local(t, step, b, err));
    if (g->rows != NULL) PS_TRY(geo_rows_note(g->rows, b, t->rows, err));
  }
  *next = step + 1;
  g->steps++;
  g->version = step + 1;
  /* Handed-out data: the shard's end decides, not the fixed split's last step. */
  if (++g->local < t->settings.geo_steps && (handed || step + 1 < t->data->total_steps)) {
    return PS_ERR_OK;
  }
  return exchange(g, step + 1, err);
}

/* Handed-out data: what this trainer changed since its last exchange goes
 * out before it tells pserver 0 its shard is finished. */
static ps_err geo_next_shard(replica *r, long epoch, long finished, data_shard *out,
                             ps_error *err) {
  pserver_replica *g = (pserver_replica *)r;
  if (g->local > 0) PS_TRY(exchange(g, g->version, err));
  double start = now_s();
  ps_err rc = ps_client_next_shard(&g->c, epoch, finished, out, err);
  r->comm_seconds += now_s() - start;
  return rc;
}

/* Before evaluating handed-out data: the pservers' parameters now (others
 * exchanged since), which become the base of the next change. */
static ps_err geo_refresh(replica *r, ps_error *err) {
  pserver_replica *g = (pserver_replica *)r;
  trainer *t = r->t;
  if (g->local > 0) PS_TRY(exchange(g, g->version, err));
  double start = now_s();
  ps_err rc = ps_client_pull(&g->c, t->host_params, err);
  r->comm_seconds += now_s() - start;
  if (rc != PS_ERR_OK) return ps_error_set(err, rc, "before evaluating: %s", err->msg);
  memcpy(g->at_exchange, t->host_params, t->model->layout.total * sizeof(float));
  return t->staged ? model_set_params(t->model, t->host_params, err)
                   : PS_ERR_OK;
}

static ps_err geo_finish(replica *r, long steps, ps_error *err) {
  pserver_replica *g = (pserver_replica *)r;
  double bytes = (double)(g->c.bytes_sent + g->c.bytes_received);
  LOG_INFO("communication: %ld GEO exchanges (--geo-steps %d), %.1f MB sent, %.1f MB received, "
           "%.1f s in push-pull; %.0f bytes sent + received per step (%ld steps)",
           g->exchanges, r->t->settings.geo_steps, (double)g->c.bytes_sent / 1e6,
           (double)g->c.bytes_received / 1e6, g->c.comm_seconds,
           g->steps > 0 ? bytes / (double)g->steps : 0.0, g->steps);
  /* Stopped: the steps since the last exchange go with the shard, given back. */
  if (r->t->stopped) return ps_client_stop(&g->c, steps, err);
  return ps_client_done(&g->c, steps, err);
}

static const replica_ops geo_ops = {
    .name = "geo",
    .holds_state = 0,
    .start = geo_start,
    .pull = geo_pull,
    .push = geo_push,
    .lookup = pserver_lookup,
    .gather = pserver_gather,
    .broadcast = pserver_broadcast,
    .metrics = pserver_metrics,
    .refresh = geo_refresh,
    .next_shard = geo_next_shard,
    .finish = geo_finish,
    .destroy = pserver_destroy,
};

ps_err replica_geo_create(trainer *t, replica **out, ps_error *err) {
  pserver_replica *g = calloc(1, sizeof *g);
  if (g == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory");
  g->base.ops = &geo_ops;
  g->base.t = t;
  t->mode_label = "pserver-geo";
  if (pserver_replica_take_id(g, err) != PS_ERR_OK) {
    free(g);
    return err->code;
  }
  *out = &g->base;
  return PS_ERR_OK;
}
