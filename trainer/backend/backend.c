/* Chooses the compute backend for --device. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "trainer/backend/backend.h"
#ifdef PSTRAIN_HAVE_CUDA
#include "trainer/backend/cuda_load.h"
#endif

#ifdef PSTRAIN_HAVE_CUDA
/* The CUDA backend through the CUDA module, or a reason to use the CPU:
 * *out stays NULL and PS_ERR_OK comes back when auto should fall back. */
static ps_err open_cuda(backend **out, const char *device, int want_cuda, int gpu, ps_error *err) {
  char why[384] = "";
  /* auto asks the driver alone first: loading the module starts cuBLAS
   * (~150 ms of CPU), wasted on every start of a machine without a GPU. */
  if (!want_cuda && cuda_driver_device_count(why, sizeof why) == 0) {
    LOG_INFO("device auto: no GPU is visible (%s): using the CPU", why);
    return PS_ERR_OK;
  }
  const cuda_module *m = cuda_module_load(err);
  if (m == NULL) {
    if (want_cuda) {
      return ps_error_set(err, PS_ERR_UNSUPPORTED, "--device cuda: %s", err->msg);
    }
    LOG_WARN("device auto: %s: using the CPU", err->msg);
    return PS_ERR_OK;
  }
  int count = m->device_count(why, sizeof why);
  if (count > 0 && gpu < 0) {
    /* One GPU per rank on a node: the launcher's local rank picks it. */
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (local == NULL) local = getenv("SLURM_LOCALID");
    gpu = local != NULL ? atoi(local) % count : 0;
  }
  if (count > 0 && gpu >= count) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--gpu %d: only %d GPU(s) are visible", gpu,
                        count);
  }
  if (count > 0) {
    if (m->backend_create(out, gpu, err) == PS_ERR_OK) {
      LOG_INFO("device %s: using %s", device, (*out)->description);
      return PS_ERR_OK;
    }
    *out = NULL;
    if (want_cuda) return err->code;
    LOG_WARN("device auto: the GPU failed to open (%s): using the CPU", err->msg);
  } else if (want_cuda) {
    return ps_error_set(err, PS_ERR_UNSUPPORTED, "--device cuda: no GPU is visible (%s)", why);
  } else {
    LOG_INFO("device auto: no GPU is visible (%s): using the CPU", why);
  }
  return PS_ERR_OK;
}
#endif

ps_err backend_open(backend **out, const char *device, int threads, int gpu, ps_error *err) {
  int want_cuda = strcmp(device, "cuda") == 0, want_auto = strcmp(device, "auto") == 0;
  if (!want_cuda && !want_auto && strcmp(device, "cpu") != 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--device '%s' is not auto, cpu or cuda",
                        device);
  }
#ifdef PSTRAIN_HAVE_CUDA
  if (want_cuda || want_auto) {
    *out = NULL;
    PS_TRY(open_cuda(out, device, want_cuda, gpu, err));
    if (*out != NULL) return PS_ERR_OK;
  }
#else
  (void)gpu;
  if (want_cuda) {
    return ps_error_set(err, PS_ERR_UNSUPPORTED,
                        "--device cuda: this build has no CUDA backend (no CUDA toolkit was found "
                        "at build time); use --device cpu or auto");
  }
  if (want_auto) LOG_INFO("device auto: this build has no CUDA backend: using the CPU");
#endif
  return backend_cpu_create(out, threads, err);
}
