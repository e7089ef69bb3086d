/* A caller without the token is refused before its request body is received.
 * A 128 MB body is sent without the token, then with it. Two measures:
 * the bytes that crossed the loopback interface (the test runs in a network
 * namespace of its own, so nothing else moves there; skipped where one
 * cannot be made, e.g. not root), and the server's own count of request
 * bytes received. Refused, both stay far below the body's size (HTTP/2 flow
 * control stops the sender once the server stops reading); authorized, both
 * reach it, which shows the measures see a body when one is received.
 * An authorized body over the server's limit fails its read: the call is
 * refused without reaching the handler, and freed (ASan builds check).
 * Stopping the server while a body is being read ends that call cleanly. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/rpc.h"
#include "tests/check.h"

#define BODY_BYTES ((size_t)128 << 20)

static const char *const methods[] = {"/test.Svc/Take"};
static atomic_int handled;

static void handler(void *ctx, rpc_call *call, int method, const rpc_message *req) {
  (void)ctx;
  (void)method;
  (void)req;
  atomic_fetch_add(&handled, 1);
  rpc_call_reply(call, PS_ERR_OK, NULL, &(rpc_part){"ok", 2, NULL}, 1);
}

/* A network namespace of this process's own with its loopback up; 0 where
 * one cannot be made. Must run before gRPC starts threads (they would stay
 * in the old namespace). */
static int private_loopback(void) {
  if (unshare(CLONE_NEWNET) != 0) {
    fprintf(stderr, "test_rpc_auth: no network namespace (%s): loopback bytes not measured\n",
            strerror(errno));
    return 0;
  }
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  REQUIRE(fd >= 0);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
  REQUIRE(ioctl(fd, SIOCGIFFLAGS, &ifr) == 0);
  ifr.ifr_flags |= IFF_UP;
  REQUIRE(ioctl(fd, SIOCSIFFLAGS, &ifr) == 0);
  close(fd);
  return 1;
}

/* Bytes the loopback interface has received so far (/proc/self/net/dev). */
static unsigned long long loopback_bytes(void) {
  FILE *f = fopen("/proc/self/net/dev", "r");
  REQUIRE(f != NULL);
  char line[512];
  unsigned long long bytes = 0;
  int found = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    char *colon = strchr(line, ':');
    if (colon == NULL) continue;
    *colon = '\0';
    char *name = line + strspn(line, " ");
    if (strcmp(name, "lo") == 0) found = sscanf(colon + 1, "%llu", &bytes) == 1;
  }
  fclose(f);
  REQUIRE(found);
  return bytes;
}

/* One call carrying the body, with token (may be NULL); returns its code and
 * the loopback bytes it moved (0 without a namespace) in *moved. */
static ps_err send_body(const char *target, const char *token, const uint8_t *body, int netns,
                        unsigned long long *moved) {
  ps_error err;
  rpc_client *c;
  rpc_channel *ch;
  REQUIRE(rpc_client_create(&c, token, NULL, &err) == PS_ERR_OK);
  REQUIRE(rpc_channel_open(c, target, BODY_BYTES + (1 << 20), 100, &ch, &err) == PS_ERR_OK);
  rpc_lease lease = {0};
  rpc_part part = {body, BODY_BYTES, &lease};
  rpc_op op = {.channel = ch, .method = methods[0], .parts = &part, .part_count = 1,
               .timeout_s = 60};
  unsigned long long before = netns ? loopback_bytes() : 0;
  rpc_client_call_all(c, &op, 1, &err);
  if (op.code != PS_ERR_OK) fprintf(stderr, "test_rpc_auth: call: %s\n", op.message);
  rpc_reply_free(&op.reply);
  rpc_client_destroy(c); /* closes the connection: every byte has moved */
  REQUIRE(rpc_lease_wait(&lease) == PS_ERR_OK);
  *moved = netns ? loopback_bytes() - before : 0;
  return op.code;
}

typedef struct sender {
  const char *target;
  const uint8_t *body;
  ps_err code;
} sender;

static void *send_in_background(void *arg) {
  sender *s = arg;
  unsigned long long moved;
  s->code = send_body(s->target, "the-right-token-0123", s->body, 0, &moved);
  return NULL;
}

static int netns;     /* 1: loopback bytes are measured (a private network namespace) */
static uint8_t *body; /* BODY_BYTES of payload every case sends */

/* A server taking the token and messages up to MAX_MESSAGE_BYTES; its address in TARGET. */
static rpc_server *start_server(size_t max_message_bytes, char target[64]) {
  ps_error err;
  rpc_server_config cfg = {.listen = "127.0.0.1:0", .methods = methods, .method_count = 1,
                           .handler = handler, .threads = 2,
                           .max_message_bytes = max_message_bytes,
                           .token = "the-right-token-0123"};
  rpc_server *srv;
  int port;
  REQUIRE(rpc_server_start(&srv, &cfg, &port, &err) == PS_ERR_OK);
  snprintf(target, 64, "127.0.0.1:%d", port);
  return srv;
}

/* A call without the token is refused before its body is read; one with
 * the token is read whole and handled. */
static void case_token_checked_before_body(void) {
  char target[64];
  rpc_server *srv = start_server(BODY_BYTES + (1 << 20), target);
  int handled0 = atomic_load(&handled);
  unsigned long long refused_moved, accepted_moved;
  size_t received0 = rpc_server_received_bytes(srv);
  CHECK_EQ_INT(send_body(target, NULL, body, netns, &refused_moved), PS_ERR_UNAUTHENTICATED);
  size_t refused_received = rpc_server_received_bytes(srv) - received0;
  CHECK_EQ_INT(atomic_load(&handled), handled0);
  CHECK_EQ_INT(send_body(target, "the-right-token-0123", body, netns, &accepted_moved),
               PS_ERR_OK);
  size_t accepted_received = rpc_server_received_bytes(srv) - received0 - refused_received;
  CHECK_EQ_INT(atomic_load(&handled), handled0 + 1);
  fprintf(stderr,
          "test_rpc_auth: body %zu bytes; refused call: %llu bytes over loopback, %zu request "
          "bytes received; authorized call: %llu bytes over loopback, %zu received%s\n",
          BODY_BYTES, refused_moved, refused_received, accepted_moved, accepted_received,
          netns ? "" : " (loopback not measured)");
  /* The server's count: nothing of a refused body, all of an accepted one. */
  CHECK_EQ_INT(refused_received, 0);
  CHECK_EQ_INT(accepted_received, BODY_BYTES);
  if (netns) {
    CHECK(refused_moved < BODY_BYTES / 16);
    CHECK(accepted_moved >= BODY_BYTES);
  }
  rpc_server_stop(srv);
}

/* Over the limit: the read fails, the handler never runs. */
static void case_over_limit_never_handled(void) {
  char target[64];
  rpc_server *small = start_server(1 << 20, target);
  int handled0 = atomic_load(&handled);
  unsigned long long over_moved;
  CHECK_EQ_INT(send_body(target, "the-right-token-0123", body, netns, &over_moved),
               PS_ERR_RESOURCE_EXHAUSTED);
  CHECK_EQ_INT(atomic_load(&handled), handled0);
  CHECK_EQ_INT(rpc_server_received_bytes(small), 0);
  rpc_server_stop(small);
}

/* A stop while a body is on its way: the call ends, answered or cut off. */
static void case_stop_during_body(void) {
  char target[64];
  rpc_server *srv = start_server(BODY_BYTES + (1 << 20), target);
  sender bg = {target, body, PS_ERR_INTERNAL};
  pthread_t thread;
  REQUIRE(pthread_create(&thread, NULL, send_in_background, &bg) == 0);
  const struct timespec pause = {0, 20 * 1000 * 1000};
  nanosleep(&pause, NULL);
  rpc_server_stop(srv);
  REQUIRE(pthread_join(thread, NULL) == 0);
  fprintf(stderr, "test_rpc_auth: a call under way at the stop ended with %s\n", ps_err_name(bg.code));
  CHECK(bg.code == PS_ERR_OK || bg.code == PS_ERR_UNAVAILABLE || bg.code == PS_ERR_CANCELLED);
}

int main(void) {
  netns = private_loopback();
  rpc_global_init();
  body = malloc(BODY_BYTES);
  REQUIRE(body != NULL);
  memset(body, 0x5a, BODY_BYTES);
  RUN_CASE(case_token_checked_before_body);
  RUN_CASE(case_over_limit_never_handled);
  RUN_CASE(case_stop_during_body);
  free(body);
  rpc_global_shutdown();
  return check_report("test_rpc_auth");
}
