/* Collective mode on GPUs with NCCL: the gradients are averaged in device
 * memory and never leave the GPUs. The job is MPI's (updater_mpi.c), which
 * hands its steps over here. Built only with NCCL (PSTRAIN_HAVE_NCCL). */
#include "common/clock.h"
#include "common/log.h"
#include "trainer/train.h"
#include "trainer/updater_collective.h"

static ps_err nccl_apply(updater *u, long step, long *next, ps_error *err) {
  collective_updater *c = (collective_updater *)u;
  trainer *t = u->t;
  size_t n = t->model->layout.total;
  double start = now_s();
  if (collective_allreduce_mean_device(&c->coll, t->model->grads_device, n, err) != PS_ERR_OK) {
    return err->code;
  }
  u->comm_seconds += now_s() - start;
  u->comm_bytes += updater_ring_bytes(t->trainers, n);
  if (model_apply_optimizer(t->model, &t->settings.optimizer, step, err) != PS_ERR_OK) {
    return err->code;
  }
  *next = step + 1;
  return PS_ERR_OK;
}

/* Start-up is over when NCCL takes the steps: no start op. */
static const updater_ops nccl_ops = {
    .name = "nccl",
    .holds_state = 1,
    .apply = nccl_apply,
    .broadcast = updater_mpi_broadcast,
    .destroy = updater_mpi_destroy,
};

ps_err updater_nccl_start(collective_updater *c, ps_error *err) {
  trainer *t = c->base.t;
  if (collective_use_nccl(&c->coll, t->be->device, t->be->stream, err) != PS_ERR_OK) {
    return err->code;
  }
  LOG_INFO("collective: gradients are all-reduced by NCCL on GPU %d", t->be->device);
  c->base.ops = &nccl_ops;
  return PS_ERR_OK;
}
