/* Pserver mode (--update sync, async, ssp): the pservers hold the model,
 * its optimizer and state; each step pushes the gradients to every pserver
 * and takes the new parameters back. A model's dense tensors are blocks
 * spread over the pservers; its tables' rows are sharded by key
 * (shard_of_key), and a step's push carries its row gradients and the keys
 * of the next step's batch (the data source read it ahead), whose rows come
 * back in the reply: one round trip per pserver per step. A model without
 * tables pushes in parts while backward goes on (--overlap, sync, host
 * memory: ps_client_parts.h). When a pserver goes away or rolls back, the
 * trainer waits for it, registers again and, where the job went back,
 * takes the lost steps again. Trainer 0 evaluates with read-only lookups
 * and exports what the pservers hold. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/process.h"
#include "trainer/client/ps_client.h"
#include "trainer/client/ps_client_parts.h"
#include "trainer/client/ps_client_sparse.h"
#include "trainer/data/handed_source.h"
#include "trainer/replica/pserver_replica.h"
#include "trainer/train.h"

/* Sync jobs with handed-out data: the trainer joins the steps late and
 * leaves them while it has no data, so the job's step it pushes is its
 * own (job_step), not the loop's count. */
static int joins_steps(const pserver_replica *p) { return p->c.members != NULL; }
static long key_step(const pserver_replica *p, long step) {
  return joins_steps(p) ? p->job_step : step;
}

/* Recovery re-registers and may roll the job back (pushes, evaluation's
 * lookups, the export's pull): a trainer that joins the steps recovers its
 * own way (rejoined). */
static double recover_timeout(const pserver_replica *p) {
  return joins_steps(p) ? 0.0 : p->base.t->settings.opt.recover_timeout;
}

/* A trainer that joins the steps, after a recoverable failure: recovers
 * (ps_client_recover_member: a pserver that restarted resets the steps),
 * gives its shard up and joins again with its next one. 1 when it did. */
static int rejoined(pserver_replica *p, ps_err rc, ps_error *err) {
  double timeout = p->base.t->settings.opt.recover_timeout;
  if (!joins_steps(p) || !ps_client_recoverable(rc) || timeout <= 0) return 0;
  LOG_WARN("%s: recovering (--recover-timeout %.0f s)", err->msg, timeout);
  if (ps_client_recover_member(&p->c, timeout, err) != PS_ERR_OK) return 0;
  p->member = 0;
  p->need_pull = p->sparse;
  handed_source_give_up(p->base.t->data);
  return 1;
}

/* Backward's report: tensors first..last have final gradients; their blocks go out now. */
static ps_err tensors_ready(void *ctx, int first, int last, ps_error *err) {
  pserver_replica *p = ctx;
  if (!ps_client_parts_open(&p->c) && ps_client_parts_begin(&p->c, p->step, err) != PS_ERR_OK) {
    return err->code;
  }
  const tensor_layout *layout = &p->c.layout;
  const tensor_info *w = &layout->tensors[first], *b = &layout->tensors[last];
  double start = now_s();
  ps_err rc = ps_client_parts_push(&p->c, p->base.t->host_grads, w->offset,
                                   b->offset + b->count, err);
  p->base.comm_seconds += now_s() - start; /* starting the sends is communication */
  return rc;
}

/* A model without tables: the pservers' parameters now, pushes in parts
 * with --overlap. */
static ps_err start_dense(pserver_replica *p, ps_error *err) {
  trainer *t = p->base.t;
  const trainer_settings *s = &t->settings;
  if (ps_client_pull(&p->c, t->host_params, err) != PS_ERR_OK) return err->code;
  if (s->opt.overlap && t->staged) {
    LOG_WARN("--overlap: not with a device backend (its gradients reach the host at the end of "
             "backward); one push per pserver per step");
  }
  if (p->parts && !t->staged && s->opt.overlap) {
    /* Async pushes stay whole (one apply per push); a device backend's
     * gradients reach the host only at the end of backward. */
    t->model->grads_ready = tensors_ready;
    t->model->grads_ready_ctx = p;
  }
  if (t->staged) return model_set_params(t->model, t->host_params, err);
  return PS_ERR_OK;
}

/* A model with tables: the rows' buffers; the first step pulls. */
ps_err pserver_replica_start_sparse(pserver_replica *p, ps_error *err) {
  trainer *t = p->base.t;
  if (ps_sparse_init(&p->sp, &p->c, (int)t->settings.opt.batch, err) != PS_ERR_OK) {
    return err->code;
  }
  p->sparse = 1;
  size_t n = t->model->layout.total > 0 ? t->model->layout.total : 1;
  p->params = malloc(n * sizeof(float));
  p->grads = calloc(n, sizeof(float));
  int ok = p->params != NULL && p->grads != NULL;
  for (int i = 0; i < p->sp.tables && ok; i++) {
    p->next_rows[i] = malloc(p->sp.max_keys * (size_t)p->sp.dim[i] * sizeof(float) + 1);
    ok = p->next_rows[i] != NULL;
  }
  if (!ok) return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver mode: out of memory");
  p->need_pull = 1;
  p->ahead_split = -1;
  p->version = t->start_step;
  return PS_ERR_OK;
}

ps_err pserver_replica_connect(pserver_replica *p, ps_error *err) {
  trainer *t = p->base.t;
  const trainer_settings *s = &t->settings;
  job_config job;
  trainer_job(t, &job);
  if (ps_client_connect(&p->c, &s->pservers, &job, t->id, p->incarnation, s->opt.connect_timeout,
                        s->opt.rpc_timeout, s->token, &s->tls, err) != PS_ERR_OK) {
    return err->code;
  }
  p->connected = 1;
  if (p->c.map.total != t->model->layout.total) {
    return ps_error_set(err, PS_ERR_INTERNAL, "pserver mode: %zu dense floats on the pservers, "
                        "%zu in the model", p->c.map.total, t->model->layout.total);
  }
  t->start_step = p->step = p->c.start_step;
  return PS_ERR_OK;
}

void pserver_replica_log_start(const trainer *t) {
  if (t->start_step > 0) trainer_log_resume(t, ", where the pservers are");
}

/* Registers with the pservers and takes their step and parameters. */
static ps_err pserver_start(replica *r, ps_error *err) {
  pserver_replica *p = (pserver_replica *)r;
  PS_TRY(pserver_replica_connect(p, err));
  p->member = !joins_steps(p); /* ssp holds others back until it leaves; sync joins first */
  PS_TRY(r->t->model->tables > 0 ? pserver_replica_start_sparse(p, err) : start_dense(p, err));
  (void)ps_client_bytes_since(&p->c, &p->bytes_counted); /* steps count from here */
  pserver_replica_log_start(r->t);
  return PS_ERR_OK;
}

/* The next batch's keys split into sp.next (none after the job's last step). */
static ps_err split_next(pserver_replica *p, long step, ps_error *err) {
  const sparse_dedup *ahead = NULL;
  PS_TRY(data_source_keys_ahead(p->base.t->data, step + 1, &ahead, err));
  return ps_sparse_split(&p->sp, &p->sp.next, ahead != NULL ? ahead->unique : NULL,
                         ahead != NULL ? ahead->counts : NULL, ahead != NULL ? ahead->n_unique : 0,
                         err);
}

/* Pservers with a disk tier: the next batch's keys go out now, so their
 * rows on disk are read while this step computes rather than while its
 * push waits. A failure is the push's to find and recover from (a pserver
 * gone, rolled back, stopping): the prefetch only saves time. */
static ps_err prefetch_next(pserver_replica *p, long step, ps_error *err) {
  trainer *t = p->base.t;
  PS_TRY(split_next(p, step, err));
  p->ahead_split = step + 1;
  if (p->sp.next.n == 0) return PS_ERR_OK;
  double start = now_s();
  ps_err rc = ps_sparse_prefetch(&p->sp, step + 1, err);
  timeline_span(t->tl, "prefetch", step, start);
  p->base.comm_seconds += now_s() - start;
  if (rc != PS_ERR_OK) {
    if (!p->prefetch_failed) LOG_WARN("%s (the push sends the keys again; said once)", err->msg);
    else LOG_DEBUG("%s (left to the push)", err->msg);
    p->prefetch_failed = 1;
  }
  return PS_ERR_OK;
}

/* The rows of the batch's keys: pulled (the first step, or after the job
 * went back) or arrived with the last push's reply. */
static ps_err pserver_pull(replica *r, long step, const data_batch *b, ps_error *err) {
  pserver_replica *p = (pserver_replica *)r;
  trainer *t = r->t;
  if (!p->sparse) return PS_ERR_OK; /* the parameters came with the last push's reply */
  const size_t n = b->size > 0 ? b->dedup->n_unique : 0;
  double t0 = now_s();
  if (!p->need_pull) {
    for (int i = 0; i < p->sp.tables; i++) {
      memcpy(t->rows[i], p->next_rows[i], n * (size_t)p->sp.dim[i] * sizeof(float));
    }
  } else {
    const sparse_dedup *d = b->dedup;
    p->ahead_split = -1;
    PS_TRY(ps_sparse_split(&p->sp, &p->sp.next, d->unique, d->counts, n, err));
    ps_err rc = ps_sparse_pull_step(&p->sp, key_step(p, step), p->params, err);
    if (rc != PS_ERR_OK && rejoined(p, rc, err)) {
      /* The batch goes with the shard given up: computed on zero rows, not pushed. */
      for (int i = 0; i < p->sp.tables; i++) {
        memset(t->rows[i], 0, n * (size_t)p->sp.dim[i] * sizeof(float));
      }
      p->skip_push = 1;
      return PS_ERR_OK;
    }
    PS_TRY(rc);
    ps_sparse_scatter(&p->sp, &p->sp.next, t->rows);
    p->need_pull = 0;
    p->version = key_step(p, step);
    PS_TRY(model_set_params(t->model, p->params, err));
  }
  timeline_span(t->tl, "pull", step, t0); /* a PULL_STEP, or the rows the last reply brought */
  /* sp.next holds this batch's keys split by pserver (the last push or the
   * pull split them): they become the keys pulled for this step. */
  ps_sparse_keys split = p->sp.cur;
  p->sp.cur = p->sp.next;
  p->sp.next = split;
  return p->c.tier_pservers > 0 && t->settings.opt.prefetch ? prefetch_next(p, step, err)
                                                            : PS_ERR_OK;
}

/* This trainer's share of the global batch's mean loss, relative to the 1/N
 * the pservers scale by: 1 but where the data ran short (the epoch's last
 * step), so a sync step still equals a local one on the global batch. */
static float grad_scale(const trainer *t, int count, long step) {
  long global = t->settings.opt.batch * t->trainers;
  long total = t->files.examples - (step % t->steps_per_epoch) * global;
  if (total > global) total = global;
  if (count <= 0 || total <= 0) return 1.0f;
  return (float)((double)count * (double)t->trainers / (double)total);
}

/* The dense gradients and the row gradients as sent: scaled by the
 * trainer's share, zeros where it had no examples. */
static void sparse_grads(pserver_replica *p, const data_batch *b, long step, size_t n) {
  trainer *t = p->base.t;
  const size_t total = t->model->layout.total;
  if (b->size == 0) {
    memset(p->grads, 0, total * sizeof(float));
    return;
  }
  const float scale = grad_scale(t, b->size, step);
  if (scale == 1.0f) return;
  for (size_t j = 0; j < total; j++) p->grads[j] *= scale;
  for (int i = 0; i < p->sp.tables; i++) {
    float *g = t->row_grads[i];
    for (size_t j = 0; j < n * (size_t)p->sp.dim[i]; j++) g[j] *= scale;
  }
}

/* One push-pull with the rows: the gradients, this batch's row gradients
 * and the next batch's keys out; the parameters and those rows back. */
static ps_err push_sparse(pserver_replica *p, long step, const data_batch *b, long *next,
                          ps_error *err) {
  trainer *t = p->base.t;
  const size_t n = b->size > 0 ? b->dedup->n_unique : 0;
  if (b->size > 0) PS_TRY(model_get_grads(t->model, p->grads, err));
  sparse_grads(p, b, step, n);
  /* The next batch's keys ride on this push (split already when prefetched). */
  if (p->ahead_split != step + 1) PS_TRY(split_next(p, step, err));
  p->ahead_split = -1;
  double start = now_s();
  long resume_at, at = key_step(p, step);
  ps_err rc = ps_sparse_push_pull(&p->sp, at, p->grads, t->row_grads, p->params,
                                  recover_timeout(p), &resume_at, err);
  if (rc != PS_ERR_OK && rejoined(p, rc, err)) {
    *next = step + 1; /* the batch went with the shard given up */
    return PS_ERR_OK;
  }
  PS_TRY(rc);
  timeline_span(t->tl, "push", step, start); /* push-pull, the pservers' wait included */
  p->base.comm_seconds += now_s() - start;
  p->base.comm_bytes += ps_client_bytes_since(&p->c, &p->bytes_counted);
  p->steps++;
  *next = step + (resume_at - at);
  if (joins_steps(p)) p->job_step = resume_at;
  if (resume_at <= at) {
    p->need_pull = 1; /* the job went back: the data source seeks when asked for that step */
    return PS_ERR_OK;
  }
  p->version = resume_at;
  /* No next keys went out (handed-out data: the shard ended): the next step pulls. */
  if (p->sp.next.n == 0) p->need_pull = 1;
  ps_sparse_scatter(&p->sp, &p->sp.next, p->next_rows);
  return model_set_params(t->model, p->params, err);
}

/* One push-pull of the dense gradients; on a recoverable failure, the
 * recovery, which may send the job back to an earlier step. */
static ps_err push_dense(pserver_replica *p, long step, long *next, ps_error *err) {
  trainer *t = p->base.t;
  if (t->staged && model_get_grads(t->model, t->host_grads, err) != PS_ERR_OK) return err->code;
  double start = now_s();
  if (ps_client_parts_open(&p->c) && p->step != step) {
    return ps_error_set(err, PS_ERR_INTERNAL, "step %ld: backward pushed parts of step %ld",
                        step, p->step);
  }
  ps_err rc = ps_client_parts_open(&p->c)
                  ? ps_client_parts_finish(&p->c, t->host_grads, t->host_params, err)
                  : ps_client_push_pull(&p->c, key_step(p, step), t->host_grads, t->host_params,
                                        err);
  if (rc == PS_ERR_OK && joins_steps(p)) p->job_step++;
  if (rc != PS_ERR_OK && rejoined(p, rc, err)) {
    *next = p->step = step + 1; /* the batch went with the shard given up */
    return PS_ERR_OK;
  }
  if (rc != PS_ERR_OK) {
    double timeout = recover_timeout(p);
    if (!ps_client_recoverable(err->code) || timeout <= 0) return err->code;
    LOG_WARN("%s: recovering (--recover-timeout %.0f s)", err->msg, timeout);
    long resume_at;
    if (ps_client_recover(&p->c, step, t->host_grads, t->host_params, timeout, &resume_at,
                          err) != PS_ERR_OK) {
      return err->code;
    }
    if (resume_at <= step) {
      /* The job went back: the loop takes the steps from resume_at again. */
      *next = p->step = resume_at;
      if (t->staged) return model_set_params(t->model, t->host_params, err);
      return PS_ERR_OK;
    }
  }
  timeline_span(t->tl, "push", step, start); /* push-pull, the pserver's wait included */
  p->base.comm_seconds += now_s() - start;
  p->base.comm_bytes += ps_client_bytes_since(&p->c, &p->bytes_counted);
  p->steps++;
  *next = p->step = step + 1;
  if (t->staged) return model_set_params(t->model, t->host_params, err);
  return PS_ERR_OK;
}

static ps_err pserver_push(replica *r, long step, const data_batch *b, long *next,
                           ps_error *err) {
  pserver_replica *p = (pserver_replica *)r;
  if (p->skip_push) { /* its pull failed and the trainer joined again */
    p->skip_push = 0;
    *next = step + 1;
    return PS_ERR_OK;
  }
  /* Handed-out data: the push tells pserver 0 where its batch begins. */
  data_position at = data_source_position(r->t->data, step);
  p->c.position = (wire_position){(uint64_t)at.epoch, (uint64_t)at.shard, (uint64_t)at.offset};
  return p->sparse ? push_sparse(p, step, b, next, err) : push_dense(p, step, next, err);
}

/* A read that failed (an async job's NextShard or refresh): when a pserver
 * may be back (restarted, or not reached), registers again within
 * --recover-timeout, nothing resent; 1 when the read may be tried again. */
static int recovered(pserver_replica *p, ps_err rc, ps_error *err) {
  if (joins_steps(p)) return rejoined(p, rc, err);
  double timeout = recover_timeout(p);
  if (!ps_client_recoverable(rc) || timeout <= 0) return 0;
  LOG_WARN("%s: recovering (--recover-timeout %.0f s)", err->msg, timeout);
  long resume_at;
  long step = p->sparse ? p->version : p->step;
  return ps_client_recover(&p->c, step, NULL, NULL, timeout, &resume_at, err) == PS_ERR_OK;
}

static ps_err refresh_once(pserver_replica *p, ps_error *err) {
  trainer *t = p->base.t;
  return p->sparse ? ps_sparse_pull_dense(&p->sp, p->version, p->params, err)
                   : ps_client_pull(&p->c, t->host_params, err);
}

static ps_err pserver_refresh(replica *r, ps_error *err) {
  pserver_replica *p = (pserver_replica *)r;
  trainer *t = r->t;
  double start = now_s();
  ps_err rc = refresh_once(p, err);
  if (rc != PS_ERR_OK && recovered(p, rc, err)) rc = refresh_once(p, err);
  r->comm_seconds += now_s() - start;
  if (rc != PS_ERR_OK) return ps_error_set(err, rc, "before evaluating: %s", err->msg);
  if (p->sparse) return model_set_params(t->model, p->params, err);
  return t->staged ? model_set_params(t->model, t->host_params, err) : PS_ERR_OK;
}

/* Sync: joins the steps (pserver 0 names the step it is a member of) and
 * takes that step's parameters: the dense ones now, a model with tables
 * with its first batch's rows (pserver_pull). */
static ps_err join_steps(pserver_replica *p, ps_error *err) {
  trainer *t = p->base.t;
  double start = now_s();
  long step;
  PS_TRY(ps_client_sync_join(&p->c, &step, err));
  p->job_step = step;
  if (p->sparse) {
    p->need_pull = 1;
  } else {
    PS_TRY(ps_client_pull_kind(&p->c, step, PSTRAIN__PULL_KIND__PULL_STEP, t->host_params, err));
    if (t->staged) PS_TRY(model_set_params(t->model, t->host_params, err));
  }
  LOG_INFO("joined the steps at step %ld in %.3f s", step, now_s() - start);
  return PS_ERR_OK;
}

/* Handed-out data, sync and ssp: a trainer with a shard trains in the
 * steps; one without leaves them, so nobody waits for it. */
static ps_err follow_data(pserver_replica *p, const data_shard *a, ps_error *err) {
  if (!joins_steps(p) && !p->leaves) return PS_ERR_OK;
  int has_data = a->answer == DATA_SHARD_GRANT;
  if (has_data && !p->member) {
    if (joins_steps(p)) PS_TRY(join_steps(p, err));
    p->member = 1;
  } else if (!has_data && p->member) {
    ps_err rc = ps_client_leave(&p->c, err);
    if (rc != PS_ERR_OK && !rejoined(p, rc, err)) return rc; /* rejoined: no member either */
    p->member = 0;
  }
  return PS_ERR_OK;
}

static ps_err pserver_next_shard(replica *r, long epoch, long finished, data_shard *out,
                                 ps_error *err) {
  pserver_replica *p = (pserver_replica *)r;
  double start = now_s();
  ps_err rc = ps_client_next_shard(&p->c, epoch, finished, out, err);
  if (rc == PS_ERR_OK) rc = follow_data(p, out, err);
  if (rc != PS_ERR_OK && recovered(p, rc, err)) {
    /* A reset may have taken the finished shard's last batches back. */
    if (joins_steps(p)) finished = -1;
    rc = ps_client_next_shard(&p->c, epoch, finished, out, err);
    if (rc == PS_ERR_OK) rc = follow_data(p, out, err);
  }
  r->comm_seconds += now_s() - start;
  return rc;
}

ps_err pserver_lookup(replica *r, const sparse_dedup *d, ps_error *err) {
  pserver_replica *p = (pserver_replica *)r;
  trainer *t = r->t;
  /* The dense parameters that come along are not used: the model has its own. */
  long resume_at;
  ps_err rc = ps_sparse_lookup(&p->sp, p->version, d->unique, d->counts, d->n_unique, t->rows,
                               p->params, recover_timeout(p), &resume_at, err);
  if (rc != PS_ERR_OK && rejoined(p, rc, err)) {
    rc = ps_sparse_lookup(&p->sp, p->version, d->unique, d->counts, d->n_unique, t->rows,
                          p->params, 0, &resume_at, err);
  }
  PS_TRY(rc);
  if (resume_at < p->version) {
    /* A pserver came back from an older checkpoint: the job goes back there. */
    t->rewind_to = resume_at;
    p->need_pull = 1;
  }
  return PS_ERR_OK;
}

/* Every row the pservers hold into t's (empty) tables, the dense
 * parameters into the model. */
ps_err pserver_gather(replica *r, ps_error *err) {
  pserver_replica *p = (pserver_replica *)r;
  trainer *t = r->t;
  if (!p->sparse) return PS_ERR_OK; /* the last reply's parameters are the model's */
  ps_err rc = ps_sparse_pull_all(&p->sp, p->version, p->params, recover_timeout(p), err);
  if (rc != PS_ERR_OK && rejoined(p, rc, err)) {
    rc = ps_sparse_pull_all(&p->sp, p->version, p->params, 0, err);
  }
  if (rc != PS_ERR_OK || model_set_params(t->model, p->params, err) != PS_ERR_OK) {
    return ps_error_set(err, err->code, "--export: %s", err->msg);
  }
  for (int i = 0; i < p->sp.tables; i++) {
    const ps_sparse_dump *a = &p->sp.all[i];
    if (sparse_table_load(t->tables[i], a->n, a->keys, a->rows, NULL, NULL, err) != PS_ERR_OK) {
      return ps_error_set(err, err->code, "--export: the pservers' rows: %s", err->msg);
    }
  }
  return PS_ERR_OK;
}

/* Trainers of a pserver job share nothing among themselves. */
ps_err pserver_broadcast(replica *r, void *data, size_t bytes, ps_error *err) {
  (void)r;
  (void)data;
  (void)bytes;
  return ps_error_set(err, PS_ERR_UNSUPPORTED,
                      "pserver mode: trainers take their parameters from the pservers");
}

void pserver_metrics(const replica *r, char *buf, size_t len) {
  const pserver_replica *p = (const pserver_replica *)r;
  double bytes = (double)(p->c.bytes_sent + p->c.bytes_received);
  int n = snprintf(buf, len, ",\"update\":\"%s\",\"pservers\":%d,\"bytes_per_step\":%.0f",
                   update_mode_name(p->c.job.update), p->c.job.pservers,
                   p->steps > 0 ? bytes / (double)p->steps : 0.0);
  if (p->c.tier_pservers == 0 || n < 0 || (size_t)n >= len) return;
  /* The disk tiers' figures since their pservers started (their last answers). */
  ps_tier_stats sum = {0};
  for (int i = 0; i < p->c.job.pservers; i++) {
    const ps_tier_stats *s = &p->c.tier_stats[i];
    sum.lookups += s->lookups;
    sum.hits += s->hits;
    sum.ahead += s->ahead;
    sum.rows_memory += s->rows_memory;
    sum.disk_bytes_read += s->disk_bytes_read;
    sum.disk_bytes_written += s->disk_bytes_written;
  }
  double pct = sum.lookups > 0 ? 100.0 / (double)sum.lookups : 0.0;
  snprintf(buf + n, len - (size_t)n,
           ",\"tier_hit_pct\":%.2f,\"tier_ahead_pct\":%.2f,\"tier_rows_in_memory\":%llu,"
           "\"tier_disk_read_mb\":%.1f,\"tier_disk_written_mb\":%.1f",
           pct * (double)sum.hits, pct * (double)sum.ahead, (unsigned long long)sum.rows_memory,
           (double)sum.disk_bytes_read / 1e6, (double)sum.disk_bytes_written / 1e6);
}

static ps_err pserver_finish(replica *r, long steps, ps_error *err) {
  pserver_replica *p = (pserver_replica *)r;
  double bytes = (double)(p->c.bytes_sent + p->c.bytes_received);
  LOG_INFO("communication: %.1f MB sent, %.1f MB received, %.1f s in push-pull; %.0f bytes sent "
           "+ received per step (%ld steps)",
           (double)p->c.bytes_sent / 1e6, (double)p->c.bytes_received / 1e6, p->c.comm_seconds,
           p->steps > 0 ? bytes / (double)p->steps : 0.0, p->steps);
  if (r->t->stopped) return ps_client_stop(&p->c, steps, err);
  return ps_client_done(&p->c, steps, err);
}

void pserver_destroy(replica *r) {
  pserver_replica *p = (pserver_replica *)r;
  geo_rows_destroy(p->rows); /* before the client its ops point into */
  free(p->at_exchange);
  free(p->change);
  if (p->sparse) ps_sparse_free(&p->sp);
  if (p->connected) ps_client_close(&p->c);
  free(p->params);
  free(p->grads);
  for (int i = 0; i < MODEL_TABLES_MAX; i++) free(p->next_rows[i]);
  free(p);
}

static const replica_ops pserver_ops = {
    .name = "pserver",
    .holds_state = 0,
    .start = pserver_start,
    .pull = pserver_pull,
    .push = pserver_push,
    .lookup = pserver_lookup,
    .gather = pserver_gather,
    .broadcast = pserver_broadcast,
    .metrics = pserver_metrics,
    .refresh = pserver_refresh,
    .next_shard = pserver_next_shard,
    .finish = pserver_finish,
    .destroy = pserver_destroy,
};

ps_err pserver_replica_take_id(pserver_replica *p, ps_error *err) {
  trainer *t = p->base.t;
  const trainer_settings *s = &t->settings;
  t->id = (int)s->opt.id;
  t->trainers = (int)s->opt.trainers;
  if (s->elastic_min == 0) return PS_ERR_OK;
  /* Elastic: the id comes from pserver 0, before the data is opened
   * (trainer 0 evaluates); registering later keeps it by this incarnation. */
  p->incarnation = process_random_u64();
  return ps_client_join(&s->pservers, s->token, &s->tls, s->opt.connect_timeout, p->incarnation,
                        &t->id, err);
}

ps_err replica_pserver_create(trainer *t, const char *label, int parts, int leaves,
                              replica **out, ps_error *err) {
  pserver_replica *p = calloc(1, sizeof *p);
  if (p == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory");
  p->base.ops = &pserver_ops;
  p->base.t = t;
  p->parts = parts;
  p->leaves = leaves;
  t->mode_label = label;
  if (pserver_replica_take_id(p, err) != PS_ERR_OK) {
    free(p);
    return err->code;
  }
  *out = &p->base;
  return PS_ERR_OK;
}
