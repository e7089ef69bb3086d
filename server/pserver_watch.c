/* The pserver's watch on its limits (server/pserver_watch.h). */
#define _POSIX_C_SOURCE 200809L
#include "server/pserver_watch.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "server/memory_limit.h"

#define WATCH_EVERY_S 1.0
#define WATCH_LOG_EVERY_S 10.0
#define WATCH_REPEAT_S 60.0

/* Open descriptors of this process; -1 with errno when /proc cannot be read
 * (EMFILE: not one descriptor left to read it with). */
static long open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (d == NULL) return -1;
  long n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] != '.') n++;
  }
  closedir(d);
  return n - 1; /* the directory's own descriptor */
}

/* The process's resident size in KiB, from /proc/self/statm. */
static int resident_kib(long *rss) {
  FILE *f = fopen("/proc/self/statm", "r");
  if (f == NULL) return -1;
  long pages_virt, pages_rss;
  int got = fscanf(f, "%ld %ld", &pages_virt, &pages_rss);
  fclose(f);
  if (got != 2) return -1;
  *rss = pages_rss * (sysconf(_SC_PAGESIZE) / 1024);
  return 0;
}

void pserver_watch_init(pserver_watch *w, rpc_server *rpc, pserver_metrics *pm,
                        long max_pending, long fd_limit) {
  memset(w, 0, sizeof *w);
  w->rpc = rpc;
  w->pm = pm;
  w->max_pending = max_pending;
  w->fd_limit = fd_limit;
  struct rlimit rl;
  w->as_limit_kib = -1;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    w->as_limit_kib = (long)(rl.rlim_cur / 1024);
  }
  memory_limit_cgroup("", &w->cgroup);
  memory_limit limit;
  memory_limit_get(&limit);
  char as[32] = "none", cg[32] = "none", all[32] = "unknown";
  if (w->as_limit_kib >= 0) snprintf(as, sizeof as, "%ld MiB", w->as_limit_kib / 1024);
  if (w->cgroup.kib >= 0) snprintf(cg, sizeof cg, "%ld MiB", w->cgroup.kib / 1024);
  if (limit.kib >= 0) snprintf(all, sizeof all, "%ld MiB", limit.kib / 1024);
  LOG_INFO("limits: memory %s from %s (RLIMIT_AS %s, cgroup %s: %s); watched once a second",
           all, limit.source, as, cg, w->cgroup.source);
}

static void check_fds(pserver_watch *w, double now, long fds) {
  if (fds < 0) {
    if (errno == EMFILE && now - w->fd_warned >= WATCH_REPEAT_S) {
      LOG_ERROR("open files: at the limit of %ld (RLIMIT_NOFILE): not even /proc/self/fd can be "
                "opened. New connections fail (gRPC 1.51 stops accepting after one failed "
                "accept); raise the hard limit (ulimit -Hn, systemd LimitNOFILE=, the container's "
                "nofile) or lower --max-connection-idle", w->fd_limit);
      w->fd_warned = now;
    }
    return;
  }
  if (w->fd_limit <= 0) return;
  if (fds * 10 >= w->fd_limit * 9) {
    if (now - w->fd_warned >= WATCH_REPEAT_S) {
      LOG_ERROR("open files: %ld of the %ld allowed (RLIMIT_NOFILE): at the limit new "
                "connections fail (gRPC 1.51 stops accepting after one failed accept); raise the "
                "hard limit (ulimit -Hn, systemd LimitNOFILE=, the container's nofile) or lower "
                "--max-connection-idle", fds, w->fd_limit);
      w->fd_warned = now;
    }
  } else if (w->fd_warned > 0 && fds * 10 < w->fd_limit * 8) {
    LOG_INFO("open files: back to %ld of the %ld allowed (RLIMIT_NOFILE)", fds, w->fd_limit);
    w->fd_warned = 0;
  }
}

static void check_memory(pserver_watch *w, double now, long rss) {
  const char *which = NULL;
  long used = 0, limit = 0;
  /* Against RLIMIT_AS the resident size, not the address space: gRPC's
   * threads and malloc's arenas reserve address space up to any limit, so
   * that reads "full" from the start while allocations still succeed. */
  if (w->as_limit_kib > 0 && rss * 10 >= w->as_limit_kib * 9) {
    which = "RLIMIT_AS (ulimit -v), against resident memory";
    used = rss;
    limit = w->as_limit_kib;
  } else if (w->cgroup.kib > 0 && rss * 10 >= w->cgroup.kib * 9) {
    which = w->cgroup.source; /* the container's memory limit, against resident memory */
    used = rss;
    limit = w->cgroup.kib;
  }
  if (which == NULL) {
    w->mem_warned = 0;
    return;
  }
  if (now - w->mem_warned < WATCH_REPEAT_S) return;
  LOG_ERROR("memory: %ld of the %ld MiB allowed by %s: allocations will fail (requests are then "
            "refused RESOURCE_EXHAUSTED, gRPC itself aborts); give the pserver more memory or "
            "lower --max-pending-calls and --max-message-mb", used / 1024, limit / 1024, which);
  w->mem_warned = now;
}

/* Refusals since the last line, as one line. */
static void log_refusals(pserver_watch *w, const rpc_server_stats *s) {
  uint64_t busy = s->refused_busy - w->logged.refused_busy;
  uint64_t unknown = s->unimplemented - w->logged.unimplemented;
  if (busy > 0) {
    LOG_WARN("rpc: %llu call(s) refused RESOURCE_EXHAUSTED in the last %.0f s: %ld calls open, "
             "the limit (--max-pending-calls)", (unsigned long long)busy, WATCH_LOG_EVERY_S,
             w->max_pending);
  }
  if (unknown > 0) {
    LOG_WARN("rpc: %llu call(s) of methods this pserver does not serve answered UNIMPLEMENTED in "
             "the last %.0f s (the latest: %s)", (unsigned long long)unknown, WATCH_LOG_EVERY_S,
             s->last_unknown);
  }
  w->logged = *s;
}

void pserver_watch_tick(pserver_watch *w) {
  double now = now_s();
  if (now < w->next_check) return;
  w->next_check = now + WATCH_EVERY_S;
  long fds = open_fds();
  check_fds(w, now, fds);
  long rss = 0;
  int have_memory = resident_kib(&rss) == 0;
  if (have_memory) check_memory(w, now, rss);
  rpc_server_stats s = {0};
  if (w->rpc != NULL) rpc_server_stats_get(w->rpc, &s);
  pserver_metrics_watch(w->pm, s.open_calls, s.refused_busy - w->metered.refused_busy,
                        s.unimplemented - w->metered.unimplemented, fds,
                        have_memory ? rss * 1024.0 : -1);
  w->metered = s;
  if (now >= w->next_log) {
    w->next_log = now + WATCH_LOG_EVERY_S;
    log_refusals(w, &s);
  }
}

void pserver_watch_finish(pserver_watch *w) {
  if (w->rpc == NULL) return;
  rpc_server_stats s;
  rpc_server_stats_get(w->rpc, &s);
  LOG_INFO("rpc: over this run %llu call(s) refused for too many open calls, %llu of unknown "
           "methods answered UNIMPLEMENTED", (unsigned long long)s.refused_busy,
           (unsigned long long)s.unimplemented);
}
