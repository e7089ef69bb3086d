/* The pserver's watch on its own limits, run from main's loop: open files
 * against RLIMIT_NOFILE, memory against RLIMIT_AS and the cgroup memory
 * limit (server/memory_limit.h), and the calls the RPC server turned away (too many open,
 * unknown methods). A limit nearly reached (90%) is an error that names it,
 * repeated at most once a minute while it lasts; refusals are logged as sums
 * every 10 s. Everything it reads is a metric too. Main-thread only. */
#ifndef PSTRAIN_SERVER_PSERVER_WATCH_H
#define PSTRAIN_SERVER_PSERVER_WATCH_H

#include "common/rpc.h"
#include "server/memory_limit.h"
#include "server/pserver_metrics.h"

typedef struct pserver_watch {
  rpc_server *rpc;
  pserver_metrics *pm;
  long max_pending;        /* --max-pending-calls, named in logs */
  long fd_limit;           /* RLIMIT_NOFILE's soft limit (-1: none) */
  long as_limit_kib;       /* RLIMIT_AS (-1: none) */
  memory_limit cgroup;     /* the cgroups' limit, v1 or v2, this one's or a parent's */
  double next_check, next_log;
  double fd_warned, mem_warned; /* when the last error about each was logged (0: never) */
  rpc_server_stats logged, metered; /* counts at the last log line and metrics update */
} pserver_watch;

/* Reads the limits and logs them; rpc may be NULL (nothing to count). */
void pserver_watch_init(pserver_watch *w, rpc_server *rpc, pserver_metrics *pm,
                        long max_pending, long fd_limit);

/* Checks, at most once a second; call often. */
void pserver_watch_tick(pserver_watch *w);

/* Logs what the RPC server refused over the pserver's life. */
void pserver_watch_finish(pserver_watch *w);

#endif
