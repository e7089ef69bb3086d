/* --slowdown: the sleep that stretches a step. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/slowdown.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <time.h>

ps_err slowdown_sleep(double factor, double compute_s, ps_error *err) {
  if (!(factor > 1.0) || !(compute_s > 0.0)) return PS_ERR_OK;
  double s = (factor - 1.0) * compute_s;
  struct timespec left = {(time_t)s, (long)((s - floor(s)) * 1e9)};
  /* A signal cuts the sleep short: sleep the rest. */
  while (nanosleep(&left, &left) != 0) {
    if (errno != EINTR) {
      return ps_error_set(err, PS_ERR_INTERNAL, "--slowdown: sleeping %.3f s: %s", s,
                          strerror(errno));
    }
  }
  return PS_ERR_OK;
}
