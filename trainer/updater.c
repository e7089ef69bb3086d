/* The choice of updater, made once at start from --mode; the implementations
 * live in updater_<way>.c. */
#include "trainer/updater.h"

#include "trainer/train.h"

ps_err updater_create(trainer *t, updater **out, ps_error *err) {
  *out = NULL;
  if (t->settings.pserver_mode && t->settings.update == UPDATE_GEO) {
    return updater_geo_create(t, out, err);
  }
  if (t->settings.pserver_mode) return updater_pserver_create(t, out, err);
  if (t->settings.collective_mode) {
#ifdef PSTRAIN_HAVE_MPI
    /* On GPUs with NCCL it hands the steps to NCCL once the backend is known. */
    return updater_mpi_create(t, out, err);
#else
    return ps_error_set(err, PS_ERR_INTERNAL, "--mode collective without MPI passed the flags' check");
#endif
  }
  return updater_local_create(t, out, err);
}
