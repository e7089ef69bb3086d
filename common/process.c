/* Allocator tuning and incarnation ids. */
#define _GNU_SOURCE
#include "common/process.h"

#include <malloc.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

void process_tune_malloc(void) {
  /* 32 MiB is glibc's largest mmap threshold; trimming waits for 512 MiB free. */
  if (mallopt(M_MMAP_THRESHOLD, 32 << 20) != 1 || mallopt(M_TRIM_THRESHOLD, 512 << 20) != 1) {
    LOG_WARN("mallopt refused the large-buffer settings: messages will page-fault more");
  }
}

uint64_t process_random_u64(void) {
  uint64_t v = 0;
  FILE *f = fopen("/dev/urandom", "rb");
  if (f == NULL || fread(&v, sizeof v, 1, f) != 1) {
    /* Only distinctness matters: time and pid will do. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    v = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 44);
  }
  if (f != NULL) fclose(f);
  return v;
}
