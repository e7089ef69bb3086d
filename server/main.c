/* The pserver daemon's start-up sequence: options and environment, checks,
 * listen, "ready", serve until every trainer is done (exit 0), a step waits
 * too long (exit 1) or a signal arrives (exit 0 after answering waiters). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/endpoints.h"
#include "common/fp_env.h"
#include "common/log.h"
#include "common/metrics_http.h"
#include "common/options.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/tb_events.h"
#include "common/tls.h"
#include "common/token.h"
#include "server/pserver.h"
#include "server/pserver_flags.h"
#include "server/pserver_reshard.h"
#include "server/pserver_metrics.h"
#include "server/memory_limit.h"
#include "server/pserver_watch.h"


static volatile sig_atomic_t stop_signal = 0;
static void on_signal(int sig) { stop_signal = sig; }

/* Whether list entry `e` is HOST:PORT with HOST this machine's name (or its
 * first label, as in a StatefulSet's pserver-1.pserver.ns.svc) and, when
 * port > 0, that port. */
static int entry_is_this_host(const char *e, const char *hostname, long port) {
  const char *colon = strrchr(e, ':');
  size_t host_len = (size_t)(colon - e), name_len = strlen(hostname);
  if (port > 0 && strtol(colon + 1, NULL, 10) != port) return 0;
  if (name_len == 0 || host_len < name_len || strncmp(e, hostname, name_len) != 0) return 0;
  return host_len == name_len || e[name_len] == '.';
}

/* This pserver's index when --id is not given: SLURM_PROCID under srun (a
 * step of pservers only), else the entry POD_IP:PADDLE_PORT (as Paddle
 * does), else the one entry naming this host. -1 with err set when none. */
static int find_own_index(const endpoint_list *list, long port, const char **how, ps_error *err) {
  long procid, ntasks;
  if (endpoints_slurm_task(&procid, &ntasks, err) != PS_ERR_OK) return -1;
  if (procid >= 0 && ntasks == list->count) {
    *how = "SLURM_PROCID";
    return (int)procid;
  }
  const char *ip = getenv("POD_IP");
  if (ip != NULL && port > 0) {
    char want[ENDPOINT_LEN];
    snprintf(want, sizeof want, "%s:%ld", ip, port);
    for (int i = 0; i < list->count; i++) {
      if (strcmp(list->items[i], want) == 0) {
        *how = "POD_IP and PADDLE_PORT";
        return i;
      }
    }
  }
  char hostname[256];
  if (gethostname(hostname, sizeof hostname) != 0) hostname[0] = '\0';
  hostname[sizeof hostname - 1] = '\0';
  char *dot = strchr(hostname, '.');
  if (dot != NULL) *dot = '\0';
  int found = -1;
  for (int i = 0; i < list->count; i++) {
    if (!entry_is_this_host(list->items[i], hostname, port)) continue;
    if (found >= 0) {
      ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                   "this host (%s) has entries %d and %d of --pservers: give --id (PADDLE_PSERVER_ID)"
                   " or PADDLE_PORT", hostname, found, i);
      return -1;
    }
    found = i;
  }
  if (found < 0) {
    ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                 "no --id (PADDLE_PSERVER_ID) given, and no entry of --pservers is this pserver's:"
                 " not POD_IP:PADDLE_PORT, nor this host's name '%s'%s: give --id 0..%d",
                 hostname, port > 0 ? " with PADDLE_PORT" : "", list->count - 1);
    return -1;
  }
  *how = "this host's name";
  return found;
}

/* Everything start-up decides, stage by stage. */
typedef struct pserver_start {
  pserver_options opt;
  endpoint_list list;
  int id;
  const char *id_from;
  char listen[ENDPOINT_LEN + 16];
  char token[TOKEN_MAX];
  tls_config tls;
  char effective[2048];
  long timeline_first, timeline_last, timeline_every; /* --timeline-steps */
  timeline *timeline;
  tb_writer *tensorboard;     /* --tensorboard's run, NULL when off */
  char metrics_addr[300];     /* --metrics-listen as HOST:PORT; "" when off */
  metrics_registry *metrics;  /* with its families and endpoint, NULL when off */
  pserver_metrics *pm;
  metrics_http *http;
  long fd_limit;              /* RLIMIT_NOFILE in force (-1: none) */
  size_t receive_limit;       /* --max-receive-mb in bytes, the default worked out (0: none) */
  sparse_budget table_budget; /* --table-memory-mb, the default worked out */
} pserver_start;

/* Options and log level; returns -1 to go on, else the exit status. */
static int parse_options(pserver_start *st, int argc, char **argv) {
  ps_error err;
  switch (options_parse(pserver_option_table, pserver_option_count, &st->opt, argc, argv, &err)) {
  case OPTIONS_HELP:
    options_print_help(stdout,
                       "Usage: pserver --pservers HOST:PORT,... --id K --trainers N [--OPTION VALUE]...\n"
                       "Holds shard K of a pstrain job's parameters and applies the trainers' updates.",
                       pserver_option_table, pserver_option_count);
    return 0;
  case OPTIONS_ERROR:
    LOG_ERROR("%s", err.msg);
    return 2;
  case OPTIONS_OK:
    break;
  }
  log_level level;
  log_level_parse(st->opt.log_level, &level);
  log_set_level(level);
  return -1;
}

/* The pserver list and this pserver's index in it. */
static ps_err resolve_id(pserver_start *st, ps_error *err) {
  if (endpoints_check_role("PSERVER", err) != PS_ERR_OK ||
      endpoints_parse(st->opt.pservers, "--pservers", &st->list, err) != PS_ERR_OK) {
    return err->code;
  }
  st->id_from = "--id";
  st->id = (int)st->opt.id;
  if (st->opt.id < 0 && (st->id = find_own_index(&st->list, st->opt.port, &st->id_from, err)) < 0) {
    return err->code;
  }
  if (st->id >= st->list.count) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "%s %d is outside --pservers, which has %d entr%s (0..%d)", st->id_from,
                        st->id, st->list.count, st->list.count == 1 ? "y" : "ies",
                        st->list.count - 1);
  }
  return PS_ERR_OK;
}

/* --listen, else the list entry (with --port's port when given). */
static void listen_address(pserver_start *st) {
  const char *entry = st->list.items[st->id];
  if (st->opt.listen[0] != '\0') {
    snprintf(st->listen, sizeof st->listen, "%s", st->opt.listen);
  } else if (st->opt.port > 0) {
    const char *colon = strrchr(entry, ':');
    snprintf(st->listen, sizeof st->listen, "%.*s:%ld", (int)(colon - entry), entry,
             st->opt.port);
  } else {
    snprintf(st->listen, sizeof st->listen, "%s", entry);
  }
}

/* Token, TLS, and the refusal to listen beyond loopback unprotected. */
static ps_err check_security(pserver_start *st, ps_error *err) {
  const pserver_options *o = &st->opt;
  st->token[0] = '\0';
  if (o->token_file[0] != '\0' &&
      token_read_file(o->token_file, st->token, sizeof st->token, err) != PS_ERR_OK) {
    return err->code;
  }
  st->tls = (tls_config){o->tls_cert, o->tls_key, o->tls_ca, NULL};
  if (tls_check_server(&st->tls, err) != PS_ERR_OK) return err->code;
  if (!token_is_loopback(st->listen) && st->token[0] == '\0' && !tls_enabled(&st->tls)) {
    if (!o->insecure) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                          "refusing to listen on %s, beyond loopback, with neither --token-file "
                          "nor TLS (--tls-cert): anyone who reaches it could change the model "
                          "(--insecure to do it anyway)", st->listen);
    }
    LOG_WARN("listening on %s with neither a token nor TLS (--insecure): anyone who reaches it "
             "can change the model", st->listen);
  }
  st->metrics_addr[0] = '\0';
  if (o->metrics_listen[0] != '\0' &&
      metrics_listen_check(o->metrics_listen, o->insecure, " (--insecure to do it anyway)",
                           st->metrics_addr, sizeof st->metrics_addr, err) != PS_ERR_OK) {
    return err->code;
  }
  if ((o->resume || o->resume_if_present) && o->checkpoint_dir[0] == '\0') {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--resume%s needs --checkpoint-dir",
                        o->resume ? "" : "-if-present");
  }
  return PS_ERR_OK;
}

static pserver_config service_config(pserver_start *st) {
  const pserver_options *o = &st->opt;
  return (pserver_config){.id = st->id, .pservers = st->list.count, .trainers = (int)o->trainers,
                          .step_timeout = o->step_timeout, .log_every = o->log_every,
                          .max_shard_mb = o->max_shard_mb,
                          .max_table_bytes = (size_t)(o->max_table_mb * 1048576.0),
                          .table_budget = &st->table_budget,
                          .checkpoint_dir = o->checkpoint_dir,
                          .table_dir = o->table_dir,
                          .continue_on_trainer_loss = strcmp(o->on_trainer_loss, "continue") == 0,
                          .checkpoint_every = o->checkpoint_every,
                          .check_trainer_identity = o->tls_ca[0] != '\0' && o->tls_check_trainer_id,
                          .max_blocks_per_request = o->max_blocks,
                          .max_registrations = o->max_registrations,
                          .trainer_lease = o->trainer_lease,
                          .authenticated = st->token[0] != '\0' || o->tls_ca[0] != '\0',
                          .max_receive_bytes = st->receive_limit,
                          .metrics = st->pm};
}

/* The service, from a checkpoint when asked; returns the exit status on failure, else -1. */
static int start_service(pserver_start *st, pserver *ps) {
  ps_error err;
  pserver_options *o = &st->opt;
  pserver_config cfg = service_config(st);
  if (!o->resume && o->checkpoint_dir[0] != '\0' &&
      process_prepare_dir(o->checkpoint_dir, "--checkpoint-dir", &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    return 2;
  }
  if (o->table_dir[0] != '\0' &&
      process_prepare_dir(o->table_dir, "--table-dir", &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    return 2;
  }
  if (timeline_open(&st->timeline, o->timeline, "pserver", st->id, st->timeline_first,
                    st->timeline_last, st->timeline_every, &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    return 2;
  }
  cfg.timeline = st->timeline;
  char run[32];
  snprintf(run, sizeof run, "pserver-%d", st->id);
  if (tb_writer_open(&st->tensorboard, o->tensorboard, run, &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    return 2;
  }
  if (st->tensorboard != NULL) LOG_INFO("tensorboard: writing %s", tb_writer_path(st->tensorboard));
  cfg.tensorboard = st->tensorboard;
  if (pserver_init(ps, &cfg, &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    return 1;
  }
  if (o->resume_if_present && !o->resume) {
    o->resume = pserver_has_checkpoint(ps);
    long step = -1;
    int other = 0;
    if (!o->resume && pserver_reshard_find(ps, &step, &other, &err) != PS_ERR_OK) {
      LOG_ERROR("%s", err.msg);
      pserver_destroy(ps);
      return 2;
    }
    if (other > 0) {
      /* Starting fresh would leave that job's training behind without a word;
       * re-sharding it silently could pick up another job's files. */
      LOG_ERROR("--resume-if-present: %s holds checkpoints of %d pservers (newest step %ld), "
                "none of %d: re-shard them with --resume, or give another --checkpoint-dir",
                o->checkpoint_dir, other, step, ps->cfg.pservers);
      pserver_destroy(ps);
      return 2;
    }
    if (!o->resume) LOG_INFO("no checkpoint in %s yet: starting fresh", o->checkpoint_dir);
  }
  if (o->resume && pserver_resume(ps, o->resume_step, &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    pserver_destroy(ps);
    return 2;
  }
  return -1;
}

/* Serves until the job ends or a signal arrives; returns the exit status.
 * The final checkpoint is on disk before this returns. */
static int serve(pserver *ps, pserver_watch *watch) {
  ps_error err;
  const struct timespec tick = {0, 50 * 1000 * 1000};
  for (;;) {
    pserver_watch_tick(watch);
    pserver_status s = pserver_poll(ps);
    if (s == PSERVER_FINISHED) {
      LOG_INFO("every trainer is done at step %ld: exiting", pserver_version(ps));
      pserver_log_summary(ps);
      pserver_abort_waiting(ps, PS_ERR_FAILED_PRECONDITION, "the job is finished");
      if (pserver_checkpoint(ps, &err) != PS_ERR_OK) {
        LOG_ERROR("final checkpoint: %s", err.msg);
        return 1;
      }
      return 0;
    }
    if (s == PSERVER_FAILED) {
      LOG_ERROR("stopping the job: %s", ps->failure);
      pserver_log_summary(ps);
      pserver_abort_waiting(ps, PS_ERR_FAILED_PRECONDITION, ps->failure);
      return 1;
    }
    if (stop_signal != 0) {
      /* No step completes once waiting calls are refused: the step logged is
       * the one the shutdown checkpoint holds (a push could complete one
       * between a log line read first and the refusal). */
      pserver_abort_waiting(ps, PS_ERR_UNAVAILABLE, "the pserver is shutting down");
      LOG_INFO("stopping on %s at step %ld", stop_signal == SIGINT ? "SIGINT" : "SIGTERM",
               pserver_version(ps));
      pserver_log_summary(ps);
      double t0 = now_s();
      if (pserver_checkpoint(ps, &err) != PS_ERR_OK) {
        LOG_ERROR("checkpoint on shutdown: %s", err.msg);
        return 1;
      }
      LOG_INFO("final checkpoint on disk after %.2f s", now_s() - t0);
      return 0;
    }
    nanosleep(&tick, NULL);
  }
}

/* --metrics-listen: the registry and the pserver's families (before the
 * service, which holds them), then the endpoint. */
static ps_err metrics_prepare(pserver_start *st, ps_error *err) {
  if (st->metrics_addr[0] == '\0') return PS_ERR_OK;
  if (metrics_create(&st->metrics, err) != PS_ERR_OK) return err->code;
  return pserver_metrics_create(&st->pm, st->metrics, err);
}

static ps_err metrics_serve(pserver_start *st, ps_error *err) {
  if (st->metrics == NULL) return PS_ERR_OK;
  int port;
  if (metrics_http_start(&st->http, st->metrics, st->metrics_addr, &port, err) != PS_ERR_OK) {
    return err->code;
  }
  LOG_INFO("metrics: http://%s/metrics (port %d)%s", st->metrics_addr, port,
           token_is_loopback(st->metrics_addr) ? ""
                                               : ", beyond loopback: anyone who reaches it can "
                                                 "read the job's metrics (never its parameters)");
  return PS_ERR_OK;
}

/* --max-receive-mb in bytes: as given, or half the memory limit (logged). */
static size_t receive_limit(const pserver_options *o) {
  long mib = o->max_receive_mb;
  char why[MEMORY_LIMIT_SOURCE_MAX + 64] = "--max-receive-mb";
  if (mib == 0) {
    memory_limit m;
    memory_limit_get(&m);
    if (m.kib <= 0) {
      LOG_WARN("receive memory: no memory limit could be read: gRPC may hold any amount for "
               "bodies being received (set --max-receive-mb)");
      return 0;
    }
    mib = m.kib / 2048 > 0 ? m.kib / 2048 : 1;
    snprintf(why, sizeof why, "--max-receive-mb; half of %ld MiB, %s", m.kib / 1024, m.source);
  }
  LOG_INFO("receive memory: gRPC may hold %ld MiB for connections and bodies being received "
           "(%s)", mib, why);
  if (mib < o->max_message_mb) {
    LOG_WARN("receive memory: %ld MiB is less than --max-message-mb %ld: a request that large "
             "would be reset", mib, o->max_message_mb);
  }
  return (size_t)mib << 20;
}

/* The sparse tables' share of the memory limit by default: beside them a
 * checkpoint's copy of their rows, bodies being received and the dense
 * shard must fit. */
#define TABLE_MEMORY_DEFAULT_PERCENT 40

/* --table-memory-mb as a budget: as given, or a share of the memory limit (logged). */
static void table_budget_init(sparse_budget *b, const pserver_options *o) {
  atomic_init(&b->used, 0);
  if (o->table_memory_mb > 0) {
    b->limit = (size_t)(o->table_memory_mb * 1048576.0);
    snprintf(b->source, sizeof b->source, "--table-memory-mb %g", o->table_memory_mb);
  } else {
    memory_limit m;
    memory_limit_get(&m);
    if (m.kib <= 0) {
      LOG_WARN("table memory: no memory limit could be read: the sparse tables may grow until "
               "allocations fail (set --table-memory-mb)");
      b->limit = SIZE_MAX;
      snprintf(b->source, sizeof b->source, "no memory limit could be read");
      return;
    }
    b->limit = (size_t)m.kib * 1024 / 100 * TABLE_MEMORY_DEFAULT_PERCENT;
    snprintf(b->source, sizeof b->source, "--table-memory-mb 0: %d%% of %ld MiB, %.180s",
             TABLE_MEMORY_DEFAULT_PERCENT, m.kib / 1024, m.source);
  }
  LOG_INFO("table memory: a CTR job's sparse tables may hold %.1f MiB here together (%s)",
           (double)b->limit / 1048576.0, b->source);
}

/* What the pserver allows its peers (docs/security.md "Hostile input"). */
static rpc_server_limits rpc_limits(const pserver_start *st) {
  const pserver_options *o = &st->opt;
  return (rpc_server_limits){.max_open_calls = (int)o->max_pending_calls,
                             .max_streams = (int)o->max_streams,
                             .max_idle_s = o->max_connection_idle,
                             .max_age_s = o->max_connection_age,
                             /* a held sync push finishes on its old connection */
                             .age_grace_s = o->step_timeout + 30,
                             .keepalive_s = o->keepalive,
                             .open_calls_flag = "--max-pending-calls",
                             .max_receive_bytes = st->receive_limit};
}

/* Listens, takes the signals on this thread only, says "ready" and serves.
 * *abandoned: the RPC server did not stop within --shutdown-timeout and was
 * left running (the process must exit without freeing what it uses). */
static int listen_and_serve(pserver_start *st, pserver *ps, const sigset_t *signals,
                            int *abandoned) {
  ps_error err;
  rpc_server *server = NULL;
  int port = 0;
  rpc_server_config rcfg = {.listen = st->listen, .methods = pserver_methods,
                            .method_count = pserver_method_count, .handler = pserver_handle,
                            .handler_ctx = ps, .threads = (int)st->opt.threads,
                            .max_message_bytes = (size_t)st->opt.max_message_mb << 20,
                            .token = st->token, .tls = &st->tls, .limits = rpc_limits(st)};
  if (rpc_server_start(&server, &rcfg, &port, &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    return 2;
  }
  if (metrics_serve(st, &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    rpc_server_stop(server);
    return 2;
  }
  /* Only this thread takes the signals, and only as a flag. */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0) {
    LOG_ERROR("installing the signal handlers: %s", strerror(errno));
    rpc_server_stop(server);
    return 1;
  }
  pthread_sigmask(SIG_UNBLOCK, signals, NULL);
  pserver_watch watch;
  pserver_watch_init(&watch, server, st->pm, st->opt.max_pending_calls, st->fd_limit);
  LOG_INFO("ready: pserver %d of %d listening on %s (port %d, %s%s%s), expecting %ld "
           "trainer(s)", st->id, st->list.count, st->listen, port, tls_describe_server(&st->tls),
           ps->cfg.check_trainer_identity ? " naming the trainer id" : "",
           st->token[0] != '\0' ? ", token" : "", st->opt.trainers);
  int status = serve(ps, &watch);
  pserver_watch_finish(&watch); /* before the stop frees the RPC server */
  double t0 = now_s();
  metrics_http_stop(st->http);
  *abandoned = rpc_server_stop_within(server, st->opt.shutdown_timeout) != PS_ERR_OK;
  LOG_INFO("connections closed in %.2f s%s", now_s() - t0,
           *abandoned ? " (not all: --shutdown-timeout passed)" : "");
  return status;
}

/* The flags' checks that span several flags. */
static ps_err check_flags(pserver_start *st, ps_error *err) {
  if (st->opt.trainers >= st->opt.max_pending_calls) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--max-pending-calls %ld is too few for %ld trainers: a sync step holds "
                        "a push from each (more with --overlap); give at least 4 per trainer",
                        st->opt.max_pending_calls, st->opt.trainers);
  }
  if (st->opt.trainers * 4 > st->opt.max_pending_calls) {
    LOG_WARN("--max-pending-calls %ld leaves fewer than 4 open calls per trainer (%ld): a sync "
             "step with --overlap may be refused RESOURCE_EXHAUSTED", st->opt.max_pending_calls,
             st->opt.trainers);
  }
  return timeline_parse_flags(st->opt.timeline, st->opt.timeline_steps, &st->timeline_first,
                              &st->timeline_last, &st->timeline_every, err);
}

/* Open files up to the hard limit: each connection is one. */
static void raise_fd_limit(pserver_start *st) {
  long fd_before, fd_hard;
  ps_error err;
  if (process_raise_fd_limit(&fd_before, &st->fd_limit, &fd_hard, &err) != PS_ERR_OK) {
    LOG_WARN("%s: connections are limited to the current soft limit", err.msg);
    st->fd_limit = fd_before;
  } else if (fd_before != st->fd_limit) {
    LOG_INFO("open files: RLIMIT_NOFILE soft limit raised from %ld to the hard limit %ld",
             fd_before, st->fd_limit);
  } else {
    LOG_INFO("open files: RLIMIT_NOFILE %ld (the hard limit)", st->fd_limit);
  }
}

int main(int argc, char **argv) {
  /* Before any thread starts: threads inherit the FP mode (common/fp_env.h). */
  fp_env_flush_denormals();
  /* glibc gives each thread that allocates a malloc arena of its own (up to
   * 8 per core), and what it frees stays resident there: with the disk
   * tier's readers, writer and RocksDB's threads that was 145 MiB at peak
   * instead of 132 in a 150 MiB memory cgroup, at the same speed. Two
   * arenas serve them all; the tables' large blocks are mmap'ed anyway. A
   * MALLOC_ARENA_MAX in the environment is kept. */
  if (getenv("MALLOC_ARENA_MAX") == NULL && mallopt(M_ARENA_MAX, 2) != 1) {
    fprintf(stderr, "pserver: mallopt(M_ARENA_MAX, 2) failed; going on with glibc's arenas\n");
  }
  static pserver_start st; /* large (the pserver list): not on the stack */
  ps_error err;
  log_set_role("pserver");
  int status = parse_options(&st, argc, argv);
  if (status >= 0) return status;
  if (resolve_id(&st, &err) != PS_ERR_OK) goto refused;
  listen_address(&st);
  if (check_security(&st, &err) != PS_ERR_OK || check_flags(&st, &err) != PS_ERR_OK) {
    goto refused;
  }
  options_format(pserver_option_table, pserver_option_count, &st.opt, st.effective,
                 sizeof st.effective);
  if (st.opt.check_config) {
    /* Names need not resolve here: the check may run away from the cluster. */
    printf("pserver %d of %d (id from %s) listen=%s pservers=%s trainers=%ld token=%s\n", st.id,
           st.list.count, st.id_from, st.listen, st.opt.pservers, st.opt.trainers,
           st.token[0] ? "yes" : "no");
    printf("%s\n", st.effective);
    return 0;
  }
  if (endpoint_resolve(st.listen, "--listen", 0, &err) != PS_ERR_OK) goto refused;
  LOG_INFO("starting pserver %d of %d (id from %s): %s", st.id, st.list.count, st.id_from,
           st.effective);

  /* gRPC's threads must not take our signals: block them before grpc_init. */
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, NULL);
  rpc_global_init();
  process_tune_malloc();
  raise_fd_limit(&st);
  st.receive_limit = receive_limit(&st.opt);
  table_budget_init(&st.table_budget, &st.opt);
  static pserver ps;
  if (metrics_prepare(&st, &err) != PS_ERR_OK) {
    LOG_ERROR("%s", err.msg);
    rpc_global_shutdown();
    return 1;
  }
  status = start_service(&st, &ps);
  if (status < 0) {
    int abandoned = 0;
    status = listen_and_serve(&st, &ps, &signals, &abandoned);
    if (abandoned) {
      /* gRPC still holds calls (and may hold the shard's reply buffers):
       * nothing can be freed safely, and the checkpoint is on disk. */
      timeline_close(st.timeline);
      tb_writer_close(st.tensorboard);
      LOG_INFO("exiting with status %d without freeing: peak RSS %ld KiB", status,
               process_peak_rss_kib());
      fflush(NULL);
      _exit(status);
    }
    pserver_destroy(&ps);
    LOG_INFO("exiting with status %d: peak RSS %ld KiB", status, process_peak_rss_kib());
  }
  timeline_close(st.timeline); /* after the disk thread's last checkpoint */
  tb_writer_close(st.tensorboard);
  pserver_metrics_destroy(st.pm);
  metrics_destroy(st.metrics);
  rpc_global_shutdown();
  return status;

refused:
  LOG_ERROR("%s", err.msg);
  return 2;
}
