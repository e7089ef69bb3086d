/* The choice of replica, made once at start from --mode and --update, and
 * the parts several of them share: reading and updating this process's
 * tables, the dense optimizer step and the tables' eviction. */
#include "trainer/replica/replica.h"

#include "common/clock.h"
#include "trainer/train.h"

ps_err replica_create(trainer *t, replica **out, ps_error *err) {
  *out = NULL;
  if (t->settings.pserver_mode && t->settings.update == UPDATE_GEO) {
    return replica_geo_create(t, out, err);
  }
  if (t->settings.pserver_mode) {
    update_mode u = t->settings.update;
    const char *label = u == UPDATE_ASYNC ? "pserver-async"
                        : u == UPDATE_SSP ? "pserver-ssp" : "pserver-sync";
    return replica_pserver_create(t, label, u == UPDATE_SYNC, u == UPDATE_SSP, out, err);
  }
  if (t->settings.collective_mode) {
#ifdef PSTRAIN_HAVE_MPI
    /* On GPUs with NCCL the dense sum moves to NCCL once the backend is known. */
    return replica_mpi_create(t, out, err);
#else
    return ps_error_set(err, PS_ERR_INTERNAL,
                        "--mode collective without MPI passed the flags' check");
#endif
  }
  return replica_local_create(t, out, err);
}

ps_err replica_pull_local(trainer *t, long step, const data_batch *b, ps_error *err) {
  if (t->model->tables == 0) return PS_ERR_OK;
  const sparse_dedup *d = b->dedup;
  double t0 = now_s();
  for (int i = 0; i < t->model->tables; i++) {
    PS_TRY(sparse_table_pull(t->tables[i], d->unique, d->n_unique, d->counts, step, t->rows[i],
                             err));
  }
  timeline_span(t->tl, "pull", step, t0);
  return PS_ERR_OK;
}

ps_err replica_apply_local(trainer *t, long step, const data_batch *b, ps_error *err) {
  double t0 = now_s();
  PS_TRY(model_apply_optimizer(t->model, &t->settings.optimizer, step, err));
  for (int i = 0; i < t->model->tables; i++) {
    const sparse_dedup *d = b->dedup;
    PS_TRY(sparse_table_push(t->tables[i], d->unique, d->n_unique, t->row_grads[i], step, err));
  }
  timeline_span(t->tl, "apply", step, t0);
  return PS_ERR_OK;
}

void replica_evict_local(trainer *t, long step) {
  long after = t->settings.opt.evict_after;
  long every = after / 4 > 0 ? after / 4 : 1;
  if (after > 0 && (step + 1) % every == 0) {
    for (int i = 0; i < t->model->tables; i++) sparse_table_evict(t->tables[i], step + 1);
  }
}

ps_err replica_lookup_local(replica *r, const sparse_dedup *d, ps_error *err) {
  (void)err;
  trainer *t = r->t;
  for (int i = 0; i < t->model->tables; i++) {
    sparse_table_lookup(t->tables[i], d->unique, d->n_unique, t->rows[i]);
  }
  return PS_ERR_OK;
}
