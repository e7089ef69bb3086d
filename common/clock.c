/* Monotonic seconds for timeouts, rates and progress. */
#define _POSIX_C_SOURCE 200809L
#include "common/clock.h"

#include <time.h>

double now_s(void) {
  struct timespec ts;
  /* CLOCK_MONOTONIC cannot fail with a valid pointer on Linux. */
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
