/* A hostile client of pservers, for test_hostile.sh and scripts/soak: what
 * a trainer never does. Modes:
 *   unknown --target H:P [--count N]
 *       N calls (default 200) of methods the pserver does not serve (a
 *       wrong case, another service, a trailing slash, garbage), 8 at a
 *       time; exit 0 when every one got UNIMPLEMENTED.
 *   pending --target H:P --calls N
 *       opens N calls that send their body a few bytes at a time and never
 *       finish; then a real call must get RESOURCE_EXHAUSTED naming
 *       --max-pending-calls (the pserver run with --max-pending-calls N),
 *       and once the N are closed, an answer of its own again.
 *   big --target H:P --calls N --mb M
 *       N PushPull calls of M MiB each (zeros: no trainer sends that) at
 *       once; prints how many were answered by the pserver's handler and how
 *       many gRPC reset for its memory quota (RESOURCE_EXHAUSTED); exit 0
 *       when every call ended one of those two ways.
 *   idle --target H:P --conns N --kind tcp|h2 [--within S] [--hold S]
 *       opens N connections that say nothing (tcp) or speak HTTP/2 but open
 *       no call (h2); with --within, exit 0 when the pserver closed all of
 *       them within S seconds; with --hold, keeps them S seconds.
 *   hostile --targets H:P[,H:P...] --seconds S [--idle N] [--slow N]
 *           [--unknown-per-s R]
 *       the soak's load until S seconds pass or SIGTERM/SIGINT: per target
 *       N idle connections (half tcp, half h2; each one the pserver closes
 *       is opened again within a second), N slow senders (1-4 bytes every
 *       0.5 s; one that is answered, reset or closed starts again) and R
 *       unknown-method calls a second. Prints counts; exit 0 when no unknown-method call got
 *       anything but UNIMPLEMENTED (or UNAVAILABLE or CANCELLED: a pserver
 *       stopping).
 * Each mode prints one "MODE-result k=v ..." line. Malformed requests of real
 * methods are storm_client's part of the soak. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/rng.h"
#include "common/rpc.h"
#include "common/wire.h"
#include "tests/h2_raw.h"

#define MAX_TARGETS 8
#define MAX_CONNS 4096

typedef struct target {
  char host[64];
  int port;
  char name[80];
  rpc_channel *channel;
} target;

typedef struct options {
  const char *mode;
  target targets[MAX_TARGETS];
  int target_count;
  long count, calls, conns, idle, slow, mb;
  double within, hold, seconds, unknown_per_s;
  h2_kind kind;
} options;

static volatile sig_atomic_t stop_requested = 0;
static void on_signal(int sig) {
  (void)sig;
  stop_requested = 1;
}

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "soak_client: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(2);
}

static void parse_targets(options *o, const char *list) {
  char copy[512];
  snprintf(copy, sizeof copy, "%s", list);
  for (char *save = NULL, *t = strtok_r(copy, ",", &save); t != NULL;
       t = strtok_r(NULL, ",", &save)) {
    if (o->target_count == MAX_TARGETS) die("more than 8 targets in %s", list);
    target *g = &o->targets[o->target_count++];
    char *colon = strrchr(t, ':');
    size_t host_len = colon != NULL ? (size_t)(colon - t) : 0;
    if (colon == NULL || host_len >= sizeof g->host || (g->port = atoi(colon + 1)) <= 0) {
      die("target %s is not HOST:PORT (numeric IPv4)", t);
    }
    memcpy(g->host, t, host_len);
    g->host[host_len] = '\0';
    char port[16];
    snprintf(port, sizeof port, ":%d", g->port);
    memcpy(g->name, t, host_len); /* host_len < 64, the name has room for 80 */
    memcpy(g->name + host_len, port, strlen(port) + 1);
  }
}

static void parse(options *o, int argc, char **argv) {
  memset(o, 0, sizeof *o);
  o->count = 200;
  o->kind = H2_IDLE;
  if (argc < 2) die("usage: soak_client unknown|pending|big|idle|hostile ... (see the source)");
  o->mode = argv[1];
  for (int i = 2; i < argc; i++) {
    const char *flag = argv[i];
    if (i + 1 >= argc) die("%s needs a value", flag);
    const char *v = argv[++i];
    if (strcmp(flag, "--target") == 0 || strcmp(flag, "--targets") == 0) parse_targets(o, v);
    else if (strcmp(flag, "--count") == 0) o->count = atol(v);
    else if (strcmp(flag, "--calls") == 0) o->calls = atol(v);
    else if (strcmp(flag, "--mb") == 0) o->mb = atol(v);
    else if (strcmp(flag, "--conns") == 0) o->conns = atol(v);
    else if (strcmp(flag, "--idle") == 0) o->idle = atol(v);
    else if (strcmp(flag, "--slow") == 0) o->slow = atol(v);
    else if (strcmp(flag, "--within") == 0) o->within = atof(v);
    else if (strcmp(flag, "--hold") == 0) o->hold = atof(v);
    else if (strcmp(flag, "--seconds") == 0) o->seconds = atof(v);
    else if (strcmp(flag, "--unknown-per-s") == 0) o->unknown_per_s = atof(v);
    else if (strcmp(flag, "--kind") == 0) {
      if (strcmp(v, "tcp") == 0) o->kind = H2_TCP;
      else if (strcmp(v, "h2") == 0) o->kind = H2_IDLE;
      else die("--kind %s: tcp or h2", v);
    } else {
      die("unknown flag %s", flag);
    }
  }
  if (o->target_count == 0) die("%s needs --target HOST:PORT", o->mode);
  if (o->calls + o->conns + (o->idle + o->slow) * o->target_count > MAX_CONNS) {
    die("more than %d connections asked for (%s)", MAX_CONNS, o->mode);
  }
}

static void sleep_s(double s) {
  struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&t, NULL);
}

/* --- unknown methods ------------------------------------------------------- */

static const char *const unknown_paths[] = {
    "/pstrain.Pserver/PushPull",       /* wrong case */
    "/pstrain.PServer/pushpull",       /* wrong case */
    "/pstrain.PServer/PushPull/",      /* trailing slash */
    "/pstrain.PServer/Push",           /* no such method */
    "/grpc.health.v1.Health/Check",    /* another service */
    "/pstrain.PServer/\x01\xff\x7f",   /* garbage */
};
#define UNKNOWN_PATHS (sizeof unknown_paths / sizeof unknown_paths[0])

typedef struct unknown_counts {
  long sent, unimplemented, ended, other; /* ended: UNAVAILABLE or CANCELLED, a pserver going */
  double max_s;
} unknown_counts;

/* A batch of up to 8 unknown-method calls to t, each with a random body. */
static void unknown_batch(rpc_client *client, target *t, int n, rng *r, unknown_counts *u) {
  static uint8_t body[8][2048];
  rpc_part parts[8];
  rpc_op ops[8];
  ps_error err;
  for (int k = 0; k < n; k++) {
    size_t len = rng_below(r, sizeof body[k]);
    for (size_t i = 0; i < len; i++) body[k][i] = (uint8_t)rng_next(r);
    parts[k] = (rpc_part){body[k], len, NULL};
    ops[k] = (rpc_op){.channel = t->channel, .method = unknown_paths[rng_below(r, UNKNOWN_PATHS)],
                      .parts = &parts[k], .part_count = 1, .timeout_s = 5};
  }
  double t0 = now_s();
  rpc_client_call_all(client, ops, n, &err);
  double took = now_s() - t0; /* each call of the batch took at most this */
  if (took > u->max_s) u->max_s = took;
  for (int k = 0; k < n; k++) {
    u->sent++;
    if (ops[k].code == PS_ERR_UNSUPPORTED) u->unimplemented++;
    else if (ops[k].code == PS_ERR_UNAVAILABLE || ops[k].code == PS_ERR_CANCELLED) u->ended++;
    else {
      u->other++;
      if (u->other <= 5) {
        char path[64];
        size_t len = 0;
        for (const char *c = ops[k].method; *c != '\0' && len < sizeof path - 1; c++) {
          path[len++] = *c >= 0x20 && *c < 0x7f ? *c : '?';
        }
        path[len] = '\0';
        fprintf(stderr, "soak_client: %s on %s got %s: %s\n", path, t->name,
                ps_err_name(ops[k].code), ops[k].message);
      }
    }
    rpc_reply_free(&ops[k].reply);
  }
}

static int open_channels(options *o, rpc_client **client) {
  ps_error err;
  if (rpc_client_create(client, NULL, NULL, &err) != PS_ERR_OK) die("%s", err.msg);
  for (int i = 0; i < o->target_count; i++) {
    if (rpc_channel_open(*client, o->targets[i].name, 1 << 20, 200, &o->targets[i].channel,
                         &err) != PS_ERR_OK) {
      die("%s", err.msg);
    }
  }
  return 0;
}

static int run_unknown(options *o) {
  rpc_client *client;
  open_channels(o, &client);
  rng r;
  rng_seed(&r, 17, 0);
  unknown_counts u = {0};
  for (long done = 0; done < o->count;) {
    int n = o->count - done < 8 ? (int)(o->count - done) : 8;
    unknown_batch(client, &o->targets[done / 8 % o->target_count], n, &r, &u);
    done += n;
  }
  rpc_client_destroy(client);
  printf("unknown-result sent=%ld unimplemented=%ld other=%ld max_ms=%.1f\n", u.sent,
         u.unimplemented, u.other + u.ended, u.max_s * 1e3);
  return u.unimplemented == u.sent ? 0 : 1;
}

/* --- held calls and the pending cap ---------------------------------------- */

static void pump_for(h2_conn *conns, long n, double seconds) {
  for (double end = now_s() + seconds; now_s() < end;) {
    for (long i = 0; i < n; i++) h2_pump(&conns[i]);
    sleep_s(0.01);
  }
}

/* One real call (a Pull with a body no pserver accepts): its code and message. */
static ps_err one_real_call(rpc_client *client, target *t, char *message, size_t len) {
  rpc_part part = {"\x08\x01", 2, NULL};
  rpc_op op = {.channel = t->channel, .method = WIRE_METHOD_PULL, .parts = &part,
               .part_count = 1, .timeout_s = 5};
  ps_error err;
  rpc_client_call_all(client, &op, 1, &err);
  snprintf(message, len, "%s", op.message);
  rpc_reply_free(&op.reply);
  return op.code;
}

static int run_pending(options *o) {
  static h2_conn conns[MAX_CONNS];
  target *t = &o->targets[0];
  for (long i = 0; i < o->calls; i++) {
    if (h2_open(&conns[i], t->host, t->port, H2_SLOW, WIRE_METHOD_PUSH_PULL, 60000) != 0) {
      die("connecting: %s", strerror(errno));
    }
    h2_send_body(&conns[i], 7);
  }
  pump_for(conns, o->calls, 1.0);
  long early = 0;
  for (long i = 0; i < o->calls; i++) early += conns[i].answered || conns[i].fd < 0;
  rpc_client *client;
  open_channels(o, &client);
  char busy[384], after[384];
  double t0 = now_s();
  ps_err first = one_real_call(client, t, busy, sizeof busy);
  double took = now_s() - t0;
  for (long i = 0; i < o->calls; i++) h2_close(&conns[i]);
  sleep_s(0.5);
  ps_err second = one_real_call(client, t, after, sizeof after);
  rpc_client_destroy(client);
  printf("pending-result held=%ld ended_early=%ld first=%s (%.1f ms: %s) after=%s (%s)\n",
         o->calls, early, ps_err_name(first), took * 1e3, busy, ps_err_name(second), after);
  return early == 0 && first == PS_ERR_RESOURCE_EXHAUSTED &&
                 strstr(busy, "--max-pending-calls") != NULL &&
                 second != PS_ERR_RESOURCE_EXHAUSTED && second != PS_ERR_UNAVAILABLE
             ? 0
             : 1;
}

/* --- idle connections ------------------------------------------------------ */

static int run_idle(options *o) {
  static h2_conn conns[MAX_CONNS];
  target *t = &o->targets[0];
  long opened = 0;
  for (long i = 0; i < o->conns; i++) {
    if (h2_open(&conns[i], t->host, t->port, o->kind, NULL, 0) != 0) {
      fprintf(stderr, "soak_client: connection %ld: %s\n", i, strerror(errno));
      break;
    }
    opened++;
  }
  double start = now_s(), limit = o->within > 0 ? o->within : o->hold;
  long closed = 0;
  double first = 0, last = 0;
  while (now_s() - start < limit && (o->within <= 0 || closed < opened)) {
    for (long i = 0; i < opened; i++) {
      if (conns[i].fd >= 0 && !h2_pump(&conns[i])) {
        double s = conns[i].closed - conns[i].opened;
        if (closed == 0 || s < first) first = s;
        if (s > last) last = s;
        closed++;
      }
    }
    sleep_s(0.02);
  }
  for (long i = 0; i < opened; i++) h2_close(&conns[i]);
  printf("idle-result kind=%s opened=%ld closed=%ld first_s=%.2f last_s=%.2f\n",
         o->kind == H2_TCP ? "tcp" : "h2", opened, closed, first, last);
  if (o->within > 0) return opened == o->conns && closed == opened ? 0 : 1;
  return 0;
}

/* --- the soak's mix ------------------------------------------------------------ */

typedef struct hostile_counts {
  long tcp_opened, h2_opened, idle_closed, slow_opened, slow_answered, slow_reset,
      slow_closed, connect_failed;
  long long slow_bytes;
  double idle_life_max;
} hostile_counts;

typedef struct slot {
  h2_conn c;
  int target;
  h2_kind kind;
  double next_send; /* slow senders */
} slot;

static void slot_open(slot *s, options *o, hostile_counts *h) {
  target *t = &o->targets[s->target];
  if (h2_open(&s->c, t->host, t->port, s->kind, WIRE_METHOD_PUSH_PULL, 60000) != 0) {
    h->connect_failed++;
    s->next_send = now_s() + 0.5; /* the pserver may be restarting: try again soon */
    return;
  }
  if (s->kind == H2_TCP) h->tcp_opened++;
  else if (s->kind == H2_IDLE) h->h2_opened++;
  else h->slow_opened++;
  s->next_send = now_s() + 0.5;
}

/* Services one slot: reads, notices an end, sends the slow body, reopens. */
static void slot_tick(slot *s, options *o, hostile_counts *h, rng *r, double now) {
  if (s->c.fd < 0) {
    if (now >= s->next_send) slot_open(s, o, h);
    return;
  }
  int open = h2_pump(&s->c);
  if (s->kind != H2_SLOW) {
    if (!open) {
      h->idle_closed++;
      double life = s->c.closed - s->c.opened;
      if (life > h->idle_life_max) h->idle_life_max = life;
      /* Again within a second: a flood's connections drift apart over
       * time rather than all closing on the same tick. */
      s->next_send = now + (double)rng_below(r, 1000) / 1000.0;
    }
    return;
  }
  if (open && !s->c.answered && !s->c.reset && !s->c.goaway && now >= s->next_send) {
    long sent = h2_send_body(&s->c, 1 + rng_below(r, 4));
    if (sent > 0) h->slow_bytes += sent;
    open = sent >= 0 && s->c.fd >= 0;
    s->next_send = now + 0.5;
  }
  if (!open || s->c.answered || s->c.reset || (s->c.goaway && now >= s->next_send)) {
    if (s->c.answered) h->slow_answered++;
    else if (s->c.reset) h->slow_reset++;
    else h->slow_closed++;
    h2_close(&s->c);
    slot_open(s, o, h);
  }
}

static int run_hostile(options *o) {
  static slot slots[MAX_CONNS];
  long n = 0;
  hostile_counts h = {0};
  for (int t = 0; t < o->target_count; t++) {
    for (long i = 0; i < o->idle; i++) {
      slots[n++] = (slot){.target = t, .kind = i % 2 ? H2_IDLE : H2_TCP};
    }
    for (long i = 0; i < o->slow; i++) slots[n++] = (slot){.target = t, .kind = H2_SLOW};
  }
  for (long i = 0; i < n; i++) {
    slots[i].c.fd = -1;
    slot_open(&slots[i], o, &h);
  }
  rpc_client *client;
  open_channels(o, &client);
  rng r;
  rng_seed(&r, 23, 0);
  unknown_counts u = {0};
  double start = now_s(), next_unknown = start, next_status = start + 30;
  static struct pollfd fds[MAX_CONNS];
  while (!stop_requested && now_s() - start < o->seconds) {
    long nf = 0;
    for (long i = 0; i < n; i++) {
      if (slots[i].c.fd >= 0) fds[nf++] = (struct pollfd){.fd = slots[i].c.fd, .events = POLLIN};
    }
    if (poll(fds, (nfds_t)nf, 20) < 0 && errno != EINTR) die("poll: %s", strerror(errno));
    double now = now_s();
    for (long i = 0; i < n; i++) slot_tick(&slots[i], o, &h, &r, now);
    if (o->unknown_per_s > 0 && now >= next_unknown) {
      unknown_batch(client, &o->targets[u.sent / 2 % o->target_count], 2, &r, &u);
      next_unknown = now + 2.0 / o->unknown_per_s;
    }
    if (now >= next_status) {
      fprintf(stderr, "soak_client: %.0f s: %ld unknown-method calls, %ld+%ld idle connections "
              "opened, %lld bytes sent slowly\n", now - start, u.sent, h.tcp_opened, h.h2_opened,
              h.slow_bytes);
      next_status = now + 30;
    }
  }
  for (long i = 0; i < n; i++) h2_close(&slots[i].c);
  rpc_client_destroy(client);
  printf("hostile-result seconds=%.1f unknown=%ld unimplemented=%ld unknown_ended=%ld "
         "unknown_other=%ld unknown_max_ms=%.1f idle_tcp=%ld idle_h2=%ld idle_closed=%ld "
         "idle_life_max_s=%.1f slow_calls=%ld slow_bytes=%lld slow_answered=%ld slow_reset=%ld "
         "slow_closed=%ld connect_failed=%ld\n",
         now_s() - start, u.sent, u.unimplemented, u.ended, u.other, u.max_s * 1e3,
         h.tcp_opened, h.h2_opened, h.idle_closed, h.idle_life_max, h.slow_opened, h.slow_bytes,
         h.slow_answered, h.slow_reset, h.slow_closed, h.connect_failed);
  return u.other == 0 ? 0 : 1;
}

/* --- large bodies ------------------------------------------------------------ */

static int run_big(options *o) {
  if (o->calls < 1 || o->calls > 64 || o->mb < 1 || o->mb > 1024) {
    die("big needs --calls 1..64 and --mb 1..1024");
  }
  size_t len = (size_t)o->mb << 20;
  ps_error err;
  rpc_client *client;
  rpc_channel *channel;
  if (rpc_client_create(&client, NULL, NULL, &err) != PS_ERR_OK ||
      rpc_channel_open(client, o->targets[0].name, len + 1024, 200, &channel, &err) != PS_ERR_OK) {
    die("%s", err.msg);
  }
  uint8_t *body = calloc(len, 1);
  rpc_op *ops = calloc((size_t)o->calls, sizeof *ops);
  if (body == NULL || ops == NULL) die("out of memory for %ld MiB bodies", o->mb);
  rpc_part part = {body, len, NULL};
  for (long i = 0; i < o->calls; i++) {
    ops[i] = (rpc_op){.channel = channel, .method = WIRE_METHOD_PUSH_PULL, .parts = &part,
                      .part_count = 1, .timeout_s = 120, .wait_for_ready = 1};
  }
  rpc_client_call_all(client, ops, (int)o->calls, &err);
  long answered = 0, reset = 0, other = 0;
  for (long i = 0; i < o->calls; i++) {
    /* Zeros from no registered trainer: the handler answers ABORTED. */
    if (ops[i].code == PS_ERR_ABORTED) answered++;
    else if (ops[i].code == PS_ERR_RESOURCE_EXHAUSTED) reset++;
    else {
      other++;
      fprintf(stderr, "big: call %ld: %s (%s)\n", i, ps_err_name(ops[i].code), ops[i].message);
    }
    rpc_reply_free(&ops[i].reply);
  }
  free(ops);
  free(body);
  rpc_client_destroy(client);
  printf("big-result calls=%ld mb=%ld answered=%ld reset=%ld other=%ld\n", o->calls, o->mb,
         answered, reset, other);
  return other == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  options o;
  parse(&o, argc, argv);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0) {
    die("installing signal handlers: %s", strerror(errno));
  }
  rpc_global_init();
  int status;
  if (strcmp(o.mode, "unknown") == 0) status = run_unknown(&o);
  else if (strcmp(o.mode, "pending") == 0) status = run_pending(&o);
  else if (strcmp(o.mode, "big") == 0) status = run_big(&o);
  else if (strcmp(o.mode, "idle") == 0) status = run_idle(&o);
  else if (strcmp(o.mode, "hostile") == 0) status = run_hostile(&o);
  else die("unknown mode %s", o.mode);
  fflush(stdout);
  rpc_global_shutdown();
  return status;
}
