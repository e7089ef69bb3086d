/* Allocator tuning and incarnation ids. */
#define _GNU_SOURCE
#include "common/process.h"

#include <errno.h>
#include <malloc.h>
#include <string.h>
#include <sys/stat.h>
#include <stdio.h>
#include <sys/resource.h>
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

ps_err process_prepare_dir(const char *path, const char *flag, ps_error *err) {
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    return ps_error_set(err, PS_ERR_IO, "%s %s: cannot make the folder: %s", flag, path,
                        strerror(errno));
  }
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return ps_error_set(err, PS_ERR_IO, "%s %s: not a folder", flag, path);
  }
  if (access(path, W_OK | X_OK) != 0) {
    return ps_error_set(err, PS_ERR_IO, "%s %s: cannot write there: %s", flag, path,
                        strerror(errno));
  }
  return PS_ERR_OK;
}

long process_peak_rss_kib(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
  return ru.ru_maxrss; /* KiB on Linux */
}

ps_err process_raise_fd_limit(long *before, long *soft, long *hard, ps_error *err) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    return ps_error_set(err, PS_ERR_IO, "reading the open-files limit (RLIMIT_NOFILE): %s",
                        strerror(errno));
  }
  *before = rl.rlim_cur == RLIM_INFINITY ? -1 : (long)rl.rlim_cur;
  if (rl.rlim_cur < rl.rlim_max) {
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      return ps_error_set(err, PS_ERR_IO,
                          "raising the open-files limit (RLIMIT_NOFILE) from %llu to its hard "
                          "limit %llu: %s", (unsigned long long)was,
                          (unsigned long long)rl.rlim_max, strerror(errno));
    }
  }
  *soft = rl.rlim_cur == RLIM_INFINITY ? -1 : (long)rl.rlim_cur;
  *hard = rl.rlim_max == RLIM_INFINITY ? -1 : (long)rl.rlim_max;
  return PS_ERR_OK;
}
