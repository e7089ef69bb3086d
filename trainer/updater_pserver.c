/* Pserver mode: each step pushes the gradients to every pserver and pulls
 * the new parameters back; when a pserver goes away or rolls back, the
 * trainer waits for it, registers again and, where the job went back, takes
 * the lost steps again. The pservers hold the optimizer and its state.
 * Sync jobs on a host-memory backend overlap: each layer's gradients are
 * pushed as soon as backward has them (ps_client_parts.h). */
#include <stdlib.h>

#include "common/clock.h"
#include "common/log.h"
#include "trainer/ps_client.h"
#include "trainer/ps_client_parts.h"
#include "trainer/train.h"
#include "trainer/updater.h"

typedef struct pserver_updater {
  updater base;
  ps_client ps;
  int connected; /* ps holds channels: ps_client_close frees them */
  long step;     /* the step the next backward pass belongs to */
  uint64_t bytes_counted; /* of ps's sent + received, already in comm_bytes */
} pserver_updater;

/* Backward's report: tensors first..last have final gradients; their blocks go out now. */
static ps_err tensors_ready(void *ctx, int first, int last, ps_error *err) {
  pserver_updater *p = ctx;
  if (!ps_client_parts_open(&p->ps) && ps_client_parts_begin(&p->ps, p->step, err) != PS_ERR_OK) {
    return err->code;
  }
  const tensor_layout *layout = &p->ps.layout;
  const tensor_info *w = &layout->tensors[first], *b = &layout->tensors[last];
  double start = now_s();
  ps_err rc = ps_client_parts_push(&p->ps, p->base.t->host_grads, w->offset,
                                   b->offset + b->count, err);
  p->base.comm_seconds += now_s() - start; /* starting the sends is communication */
  return rc;
}

/* Registers with the pservers and takes their initial parameters. */
static ps_err pserver_start(updater *u, ps_error *err) {
  pserver_updater *p = (pserver_updater *)u;
  trainer *t = u->t;
  const trainer_settings *s = &t->settings;
  job_config job;
  trainer_job(t, s->pservers.count, &job);
  if (ps_client_connect(&p->ps, &s->pservers, &job, t->id, s->opt.connect_timeout,
                        s->opt.rpc_timeout, s->token, &s->tls, err) != PS_ERR_OK) {
    return err->code;
  }
  p->connected = 1;
  if (ps_client_pull(&p->ps, t->host_params, err) != PS_ERR_OK) return err->code;
  (void)ps_client_bytes_since(&p->ps, &p->bytes_counted); /* steps count from here */
  t->start_step = p->ps.start_step;
  p->step = t->start_step;
  if (s->opt.overlap && t->staged) {
    LOG_WARN("--overlap: not with a device backend (its gradients reach the host at the end of "
             "backward); one push per pserver per step");
  }
  if (s->update == UPDATE_SYNC && !t->staged && s->opt.overlap) {
    /* Async pushes stay whole (one apply per push); a device backend's
     * gradients reach the host only at the end of backward. */
    t->model->grads_ready = tensors_ready;
    t->model->grads_ready_ctx = p;
  }
  if (t->start_step > 0) {
    LOG_INFO("resuming at step %ld (epoch %ld, step %ld of it), where the pservers are",
             t->start_step, t->start_step / t->steps_per_epoch + 1,
             t->start_step % t->steps_per_epoch + 1);
  }
  if (t->staged) return model_set_params(t->model, t->host_params, err);
  return PS_ERR_OK;
}

/* One push-pull; on a recoverable failure, the recovery, which may send the
 * job back to an earlier step. */
static ps_err pserver_apply(updater *u, long step, long *next, ps_error *err) {
  pserver_updater *p = (pserver_updater *)u;
  trainer *t = u->t;
  if (t->staged && model_get_grads(t->model, t->host_grads, err) != PS_ERR_OK) return err->code;
  double start = now_s();
  if (ps_client_parts_open(&p->ps) && p->step != step) {
    return ps_error_set(err, PS_ERR_INTERNAL, "step %ld: backward pushed parts of step %ld",
                        step, p->step);
  }
  ps_err rc = ps_client_parts_open(&p->ps)
                  ? ps_client_parts_finish(&p->ps, t->host_grads, t->host_params, err)
                  : ps_client_push_pull(&p->ps, step, t->host_grads, t->host_params, err);
  if (rc != PS_ERR_OK) {
    double timeout = t->settings.opt.recover_timeout;
    if (!ps_client_recoverable(err->code) || timeout <= 0) return err->code;
    LOG_WARN("%s: recovering (--recover-timeout %.0f s)", err->msg, timeout);
    long resume_at;
    if (ps_client_recover(&p->ps, step, t->host_grads, t->host_params, timeout, &resume_at,
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
  u->comm_seconds += now_s() - start;
  u->comm_bytes += ps_client_bytes_since(&p->ps, &p->bytes_counted);
  *next = p->step = step + 1;
  if (t->staged) return model_set_params(t->model, t->host_params, err);
  return PS_ERR_OK;
}

/* Trainers of a pserver job share nothing among themselves. */
static ps_err pserver_broadcast(updater *u, void *data, size_t bytes, ps_error *err) {
  (void)u;
  (void)data;
  (void)bytes;
  return ps_error_set(err, PS_ERR_UNSUPPORTED,
                      "pserver mode: trainers take their parameters from the pservers");
}

static ps_err pserver_finish(updater *u, long steps, ps_error *err) {
  pserver_updater *p = (pserver_updater *)u;
  LOG_INFO("communication: %.1f MB sent, %.1f MB received, %.1f s in push-pull",
           (double)p->ps.bytes_sent / 1e6, (double)p->ps.bytes_received / 1e6,
           p->ps.comm_seconds);
  return ps_client_done(&p->ps, steps, err);
}

static void pserver_destroy(updater *u) {
  pserver_updater *p = (pserver_updater *)u;
  if (p->connected) ps_client_close(&p->ps);
  free(p);
}

static const updater_ops pserver_ops = {
    .name = "pserver",
    .holds_state = 0,
    .start = pserver_start,
    .apply = pserver_apply,
    .broadcast = pserver_broadcast,
    .finish = pserver_finish,
    .destroy = pserver_destroy,
};

ps_err updater_pserver_create(trainer *t, updater **out, ps_error *err) {
  const trainer_settings *s = &t->settings;
  pserver_updater *p = calloc(1, sizeof *p);
  if (p == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory");
  p->base.ops = &pserver_ops;
  p->base.t = t;
  t->mode_label = s->update == UPDATE_ASYNC ? "pserver-async"
                  : s->update == UPDATE_SSP ? "pserver-ssp" : "pserver-sync";
  t->id = (int)s->opt.id;
  t->trainers = (int)s->opt.trainers;
  *out = &p->base;
  return PS_ERR_OK;
}
