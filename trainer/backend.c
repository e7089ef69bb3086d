/* Chooses the compute backend for --device. */
#include <string.h>

#include "common/log.h"
#include "trainer/backend.h"

ps_err backend_open(backend **out, const char *device, int threads, ps_error *err) {
  if (strcmp(device, "cuda") == 0) {
    return ps_error_set(err, PS_ERR_UNSUPPORTED,
                        "--device cuda: this build has no CUDA backend; use --device cpu or auto");
  }
  if (strcmp(device, "cpu") != 0 && strcmp(device, "auto") != 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--device '%s' is not auto, cpu or cuda",
                        device);
  }
  if (backend_cpu_create(out, threads, err) != PS_ERR_OK) return err->code;
  if (strcmp(device, "auto") == 0) LOG_INFO("device auto: using the CPU (no CUDA backend in this build)");
  return PS_ERR_OK;
}
