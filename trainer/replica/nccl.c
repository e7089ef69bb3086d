/* Collective mode's dense half on GPUs with NCCL: the gradients are
 * averaged in device memory and never leave the GPUs. The job is MPI's
 * (mpi.c), which carries the start-up messages and the tables' rows. Built
 * with the CUDA toolkit (PSTRAIN_HAVE_CUDA); NCCL itself is the CUDA
 * module's, which says when it was built without (PS_ERR_UNSUPPORTED). */
#include "common/log.h"
#include "trainer/replica/mpi_replica.h"

ps_err replica_nccl_start(collective *coll, trainer *t, ps_error *err) {
  if (collective_use_nccl(coll, t->be->device, t->be->stream, err) != PS_ERR_OK) return err->code;
  LOG_INFO("collective: gradients are all-reduced by NCCL on GPU %d", t->be->device);
  return PS_ERR_OK;
}

ps_err replica_nccl_mean(collective *coll, trainer *t, ps_error *err) {
  return collective_allreduce_mean_device(coll, t->model->grads_device, t->model->layout.total,
                                          &t->model->layout, err);
}
