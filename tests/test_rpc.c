/* The RPC layer over real gRPC on 127.0.0.1: messages of every size from
 * 1 byte to 3 MB, sent as many small and large parts (borrowed and copied),
 * arrive byte-exact however gRPC slices them (small slices keep their bytes
 * inside the slice struct: a past bug); several calls run at once; a reply
 * deferred past the deadline gives TIMEOUT; status codes and messages map
 * both ways; an unreachable peer fails fast with UNAVAILABLE, and a
 * wait-for-ready call to it says why it could not connect. TLS (certificates
 * from scripts/make-certs): the handler sees the verified client
 * certificate's names; a client without a certificate, or in plaintext,
 * never reaches the handler. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc.h"
#include "common/rng.h"
#include "tests/check.h"

enum { METHOD_ECHO, METHOD_FAIL, METHOD_HOLD, METHOD_WHO };
static const char *const methods[] = {"/test.Svc/Echo", "/test.Svc/Fail", "/test.Svc/Hold",
                                      "/test.Svc/Who"};

static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int handled;
static rpc_call *held;

static void handler(void *ctx, rpc_call *call, int method, const rpc_message *req) {
  (void)ctx;
  atomic_fetch_add(&handled, 1);
  if (method == METHOD_ECHO) {
    /* Echo the segments back as copied parts: the reply is what arrived. */
    rpc_part *parts = malloc((req->count + 1) * sizeof *parts);
    for (size_t i = 0; i < req->count; i++) parts[i] = (rpc_part){req->segments[i].data, req->segments[i].len, NULL};
    rpc_call_reply(call, PS_ERR_OK, NULL, parts, (int)req->count);
    free(parts);
  } else if (method == METHOD_WHO) {
    char who[256];
    snprintf(who, sizeof who, "%s|%d|%d", rpc_call_peer_identity(call),
             rpc_call_peer_has_name(call, "trainer-0"), rpc_call_peer_has_name(call, "trainer-1"));
    rpc_part part = {who, strlen(who), NULL};
    rpc_call_reply(call, PS_ERR_OK, NULL, &part, 1);
  } else if (method == METHOD_FAIL) {
    rpc_call_reply(call, PS_ERR_OUT_OF_RANGE, "step 9 is beyond the end", NULL, 0);
  } else {
    pthread_mutex_lock(&held_lock);
    held = call; /* answered later, after the client's deadline */
    pthread_mutex_unlock(&held_lock);
  }
}

static uint8_t *flatten(const rpc_message *m) {
  uint8_t *buf = malloc(m->total + 1);
  size_t at = 0;
  for (size_t i = 0; i < m->count; i++) {
    memcpy(buf + at, m->segments[i].data, m->segments[i].len);
    at += m->segments[i].len;
  }
  return buf;
}

/* One Who call with a fresh client; returns its code, the reply text in who. */
static ps_err call_who(const char *target, const tls_config *tls, const rpc_part *one,
                       int wait_for_ready, char *who, size_t len, char *message, size_t mlen) {
  ps_error err;
  rpc_client *c;
  rpc_channel *ch;
  REQUIRE(rpc_client_create(&c, NULL, tls, &err) == PS_ERR_OK);
  REQUIRE(rpc_channel_open(c, target, 1 << 20, 100, &ch, &err) == PS_ERR_OK);
  rpc_op op = {.channel = ch, .method = methods[METHOD_WHO], .parts = one, .part_count = 1,
               .timeout_s = wait_for_ready ? 1 : 10, .wait_for_ready = wait_for_ready};
  rpc_client_call_all(c, &op, 1, &err);
  who[0] = '\0';
  if (op.code == PS_ERR_OK) {
    const rpc_message *m = &op.reply.message;
    uint8_t *flat = flatten(m);
    snprintf(who, len, "%.*s", (int)m->total, (const char *)flat);
    free(flat);
  }
  snprintf(message, mlen, "%s", op.message);
  rpc_reply_free(&op.reply);
  rpc_client_destroy(c);
  return op.code;
}

/* The test service's server: plaintext, on a free port of 127.0.0.1. */
static const rpc_server_config server_cfg = {.listen = "127.0.0.1:0", .methods = methods,
                                             .method_count = 4, .handler = handler,
                                             .threads = 2, .max_message_bytes = 8 << 20};
static const rpc_part one_byte = {"x", 1, NULL}; /* the body of a small call */

/* TLS (certificates from scripts/make-certs): mutual TLS shows the handler
 * the client's names, a server-only TLS none, and a key that is not the
 * certificate's is refused at start. */
static void case_tls(void) {
  const rpc_server_config *base = &server_cfg;
  const rpc_part *one = &one_byte;
  char dir[] = "/tmp/pstrain-test-rpc-XXXXXX";
  REQUIRE(mkdtemp(dir) != NULL);
  char cmd[512], cert[300], key[300], ca[300], t1cert[300], t1key[300];
  snprintf(cmd, sizeof cmd, "%s/scripts/make-certs %s --trainers 2 2>/dev/null", PSTRAIN_SOURCE_DIR,
           dir);
  REQUIRE(system(cmd) == 0);
  snprintf(cert, sizeof cert, "%s/server.pem", dir);
  snprintf(key, sizeof key, "%s/server.key", dir);
  snprintf(ca, sizeof ca, "%s/ca.pem", dir);
  snprintf(t1cert, sizeof t1cert, "%s/trainer-1.pem", dir);
  snprintf(t1key, sizeof t1key, "%s/trainer-1.key", dir);
  ps_error err;
  char target[64], who[256], message[384];

  /* Mutual TLS: the handler sees trainer-1's names; no certificate or
   * plaintext never reaches it. */
  tls_config mtls = {cert, key, ca, NULL};
  rpc_server_config scfg = *base;
  scfg.listen = "127.0.0.1:0";
  scfg.tls = &mtls;
  rpc_server *srv;
  int port;
  REQUIRE(rpc_server_start(&srv, &scfg, &port, &err) == PS_ERR_OK);
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  tls_config as_trainer1 = {t1cert, t1key, ca, NULL};
  CHECK_EQ_INT(call_who(target, &as_trainer1, one, 0, who, sizeof who, message, sizeof message),
               PS_ERR_OK);
  CHECK_EQ_STR(who, "trainer-1|0|1");
  int before = atomic_load(&handled);
  tls_config no_cert = {NULL, NULL, ca, NULL};
  CHECK_EQ_INT(call_who(target, &no_cert, one, 1, who, sizeof who, message, sizeof message),
               PS_ERR_TIMEOUT);
  CHECK_CONTAINS(message, "requires this trainer's --tls-cert");
  CHECK_EQ_INT(call_who(target, NULL, one, 0, who, sizeof who, message, sizeof message),
               PS_ERR_UNAVAILABLE);
  CHECK_EQ_INT(atomic_load(&handled), before);
  rpc_server_stop(srv);

  /* TLS without client certificates: no identity; a server name override
   * that the certificate carries. */
  tls_config server_only = {cert, key, NULL, NULL};
  scfg.tls = &server_only;
  REQUIRE(rpc_server_start(&srv, &scfg, &port, &err) == PS_ERR_OK);
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  tls_config by_name = {NULL, NULL, ca, "localhost"};
  CHECK_EQ_INT(call_who(target, &by_name, one, 0, who, sizeof who, message, sizeof message),
               PS_ERR_OK);
  CHECK_EQ_STR(who, "|0|0");
  rpc_server_stop(srv);

  /* A key that is not the certificate's: refused at start, naming both. */
  tls_config mismatched = {cert, t1key, NULL, NULL};
  scfg.tls = &mismatched;
  CHECK_EQ_INT(rpc_server_start(&srv, &scfg, &port, &err), PS_ERR_UNAVAILABLE);
  CHECK_CONTAINS(err.msg, t1key);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK_EQ_INT(system(cmd), 0);
}

static rpc_server *srv;
static int port;
static char target[64];
static rpc_client *client;
static rpc_channel *ch;

/* The fixture of the cases that call the test service over the network. */
static void server_start(void) {
  ps_error err;
  REQUIRE(rpc_server_start(&srv, &server_cfg, &port, &err) == PS_ERR_OK);
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  REQUIRE(rpc_client_create(&client, NULL, NULL, &err) == PS_ERR_OK);
  REQUIRE(rpc_channel_open(client, target, 8 << 20, 100, &ch, &err) == PS_ERR_OK);
}

static void server_stop(void) {
  rpc_client_destroy(client);
  rpc_server_stop(srv);
}

/* 3 MB of random bytes, the rng left where the bytes end. */
static uint8_t *payload_fixture(rng *r, size_t max) {
  rng_seed(r, 11, 0);
  uint8_t *payload = malloc(max);
  REQUIRE(payload != NULL);
  for (size_t i = 0; i < max; i++) payload[i] = (uint8_t)rng_next(r);
  return payload;
}

/* Messages of every size from 1 byte to 3 MB as many small and large parts,
 * borrowed and copied, two calls at once: echoed byte-exact, every lease
 * given back. */
static void case_echo_any_size_any_parts(void) {
  ps_error err;
  server_start();
  rng r;
  size_t max = 3 << 20;
  uint8_t *payload = payload_fixture(&r, max);
  rpc_lease lease = {0};
  int mismatches = 0;
  for (int round = 0; round < 300; round++) {
    /* Sizes spread over 1 B .. 3 MB; parts of 1..7 bytes mixed with large ones. */
    size_t size = 1 + (size_t)(rng_below(&r, 1 << (1 + round % 22)) % max);
    rpc_part parts[64];
    int n = 0;
    size_t at = 0;
    while (at < size && n < 63) {
      size_t len = (n % 3 == 0) ? 1 + rng_below(&r, 7) : 1 + rng_below(&r, size / 8 + 1);
      if (len > size - at) len = size - at;
      parts[n++] = (rpc_part){payload + at, len, n % 2 ? &lease : NULL};
      at += len;
    }
    if (at < size) parts[n++] = (rpc_part){payload + at, size - at, &lease};
    /* Two calls at once on the same channel. */
    rpc_op ops[2];
    for (int k = 0; k < 2; k++) {
      ops[k] = (rpc_op){.channel = ch, .method = methods[METHOD_ECHO], .parts = parts,
                        .part_count = n, .timeout_s = 20};
    }
    REQUIRE(rpc_client_call_all(client, ops, 2, &err) == PS_ERR_OK);
    for (int k = 0; k < 2; k++) {
      uint8_t *back = flatten(&ops[k].reply.message);
      if (ops[k].reply.message.total != size || memcmp(back, payload, size) != 0) mismatches++;
      free(back);
      rpc_reply_free(&ops[k].reply);
    }
  }
  CHECK_EQ_INT(mismatches, 0);
  rpc_lease_wait(&lease);
  CHECK_EQ_INT(atomic_load(&lease.refs), 0);
  free(payload);
  server_stop();
}

/* The reader over slices of 1..30 bytes (gRPC keeps up to 23 inside the
 * slice struct) mixed with large ones: every byte where it belongs. */
static void case_reader_over_small_slices(void) {
  ps_error err;
  rng r;
  uint8_t *payload = payload_fixture(&r, 3 << 20);
  rpc_part small[40];
  size_t at = 0;
  for (int i = 0; i < 40; i++) {
    size_t len = i % 4 == 3 ? 5000 : 1 + (size_t)i % 30;
    small[i] = (rpc_part){payload + at, len, NULL};
    at += len;
  }
  rpc_reply built;
  REQUIRE(rpc_reply_from_parts(small, 40, &built, &err) == PS_ERR_OK);
  CHECK_EQ_INT(built.message.total, at);
  uint8_t *flat = flatten(&built.message);
  CHECK(memcmp(flat, payload, at) == 0);
  free(flat);
  rpc_reply_free(&built);
  free(payload);
}

/* An error status with its message. */
static void case_error_status_and_message(void) {
  ps_error err;
  server_start();
  rpc_op op = {.channel = ch, .method = methods[METHOD_FAIL], .parts = &one_byte, .part_count = 1,
               .timeout_s = 5};
  CHECK_EQ_INT(rpc_client_call_all(client, &op, 1, &err), PS_ERR_OUT_OF_RANGE);
  CHECK_EQ_INT(op.code, PS_ERR_OUT_OF_RANGE);
  CHECK_EQ_STR(op.message, "step 9 is beyond the end");
  CHECK_CONTAINS(err.msg, target);
  server_stop();
}

/* A reply held past the deadline. */
static void case_held_reply_times_out(void) {
  ps_error err;
  server_start();
  rpc_op op = {.channel = ch, .method = methods[METHOD_HOLD], .parts = &one_byte, .part_count = 1,
               .timeout_s = 0.3};
  CHECK_EQ_INT(rpc_client_call_all(client, &op, 1, &err), PS_ERR_TIMEOUT);
  pthread_mutex_lock(&held_lock);
  if (held != NULL) rpc_call_reply(held, PS_ERR_UNAVAILABLE, "too late", NULL, 0);
  pthread_mutex_unlock(&held_lock);
  server_stop();
}

/* Nobody listening: UNAVAILABLE at once without wait-for-ready... */
static void case_unreachable_peer(void) {
  ps_error err;
  server_start();
  int dead = port == 65535 ? 65534 : port + 1;
  char dead_target[64];
  snprintf(dead_target, sizeof dead_target, "127.0.0.1:%d", dead);
  rpc_channel *dead_ch;
  REQUIRE(rpc_channel_open(client, dead_target, 1 << 20, 100, &dead_ch, &err) == PS_ERR_OK);
  rpc_op op = {.channel = dead_ch, .method = methods[METHOD_ECHO], .parts = &one_byte,
               .part_count = 1, .timeout_s = 5};
  CHECK_EQ_INT(rpc_client_call_all(client, &op, 1, &err), PS_ERR_UNAVAILABLE);
  /* ... and TIMEOUT at the deadline with it. */
  op.wait_for_ready = 1;
  op.timeout_s = 0.5;
  CHECK_EQ_INT(rpc_client_call_all(client, &op, 1, &err), PS_ERR_TIMEOUT);
  CHECK_CONTAINS(op.message, "Connection refused");
  server_stop();
}

/* A server that requires a token: calls without it, or with another, are
 * refused before the handler; the right one goes through. */
static void case_token_required(void) {
  ps_error err;
  rpc_op op;
  rpc_server *locked;
  rpc_server_config lcfg = server_cfg;
  lcfg.listen = "127.0.0.1:0";
  lcfg.token = "the-right-token-0123";
  int lport;
  REQUIRE(rpc_server_start(&locked, &lcfg, &lport, &err) == PS_ERR_OK);
  char ltarget[64];
  snprintf(ltarget, sizeof ltarget, "127.0.0.1:%d", lport);
  const char *tokens[3] = {NULL, "the-wrong-token-0123", "the-right-token-0123"};
  const ps_err want[3] = {PS_ERR_UNAUTHENTICATED, PS_ERR_UNAUTHENTICATED, PS_ERR_OK};
  for (int i = 0; i < 3; i++) {
    rpc_client *tc;
    rpc_channel *tch;
    REQUIRE(rpc_client_create(&tc, tokens[i], NULL, &err) == PS_ERR_OK);
    REQUIRE(rpc_channel_open(tc, ltarget, 1 << 20, 100, &tch, &err) == PS_ERR_OK);
    int before = atomic_load(&handled);
    op = (rpc_op){.channel = tch, .method = methods[METHOD_ECHO], .parts = &one_byte, .part_count = 1,
                  .timeout_s = 5};
    CHECK_EQ_INT(rpc_client_call_all(tc, &op, 1, &err), want[i]);
    rpc_reply_free(&op.reply);
    CHECK_EQ_INT(atomic_load(&handled) - before, want[i] == PS_ERR_OK ? 1 : 0);
    rpc_client_destroy(tc);
  }
  rpc_server_stop(locked);
}

/* In-memory calls: the handler's reply is recorded (parts joined, status
 * and message kept); a second reply is counted, not recorded. */
static void case_in_memory_calls(void) {
  rpc_call *local = rpc_call_local_create("fuzz");
  REQUIRE(local != NULL);
  CHECK_EQ_STR(rpc_call_peer(local), "fuzz");
  CHECK_EQ_INT(rpc_call_local_result(local)->replies, 0);
  rpc_segment seg[2] = {{(const uint8_t *)"ab", 2}, {(const uint8_t *)"cde", 3}};
  rpc_message two = {seg, 2, 5};
  handler(NULL, local, METHOD_ECHO, &two);
  const rpc_local_result *res = rpc_call_local_result(local);
  CHECK_EQ_INT(res->replies, 1);
  CHECK_EQ_INT(res->code, PS_ERR_OK);
  CHECK(res->len == 5 && memcmp(res->bytes, "abcde", 5) == 0);
  rpc_call_reply(local, PS_ERR_ABORTED, "again", NULL, 0);
  CHECK_EQ_INT(res->replies, 2);
  CHECK_EQ_INT(res->code, PS_ERR_OK);
  rpc_call_local_free(local);
  local = rpc_call_local_create(NULL);
  REQUIRE(local != NULL);
  handler(NULL, local, METHOD_FAIL, &two);
  CHECK_EQ_INT(rpc_call_local_result(local)->code, PS_ERR_OUT_OF_RANGE);
  CHECK_EQ_STR(rpc_call_local_result(local)->message, "step 9 is beyond the end");
  CHECK(rpc_call_local_result(local)->bytes == NULL);
  rpc_call_local_free(local);
}

int main(void) {
  rpc_global_init();
  RUN_CASE(case_echo_any_size_any_parts);
  RUN_CASE(case_reader_over_small_slices);
  RUN_CASE(case_error_status_and_message);
  RUN_CASE(case_held_reply_times_out);
  RUN_CASE(case_unreachable_peer);
  RUN_CASE(case_token_required);
  RUN_CASE(case_tls);
  RUN_CASE(case_in_memory_calls);
  rpc_global_shutdown();
  return check_report("test_rpc");
}
