/* The metric registry's text exposition format, byte for byte, and the
 * /metrics endpoint's answers (200, 404, 405) over a real socket. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/metrics.h"
#include "common/metrics_http.h"
#include "tests/check.h"

static void test_text(void) {
  ps_error err;
  metrics_registry *reg;
  REQUIRE(metrics_create(&reg, &err) == PS_ERR_OK);
  metric_family *pushes = metrics_add(reg, METRIC_COUNTER, "pstrain_pushes_total",
                                      "Pushes accepted.", "trainer", NULL, 0, &err);
  metric_family *step = metrics_add(reg, METRIC_GAUGE, "pstrain_step", "Steps applied.\nAll.",
                                    NULL, NULL, 0, &err);
  const double bounds[] = {0.001, 0.25, 1};
  metric_family *lat = metrics_add(reg, METRIC_HISTOGRAM, "pstrain_rpc_seconds", "RPC latency.",
                                   "method", bounds, 3, &err);
  metric_family *empty = metrics_add(reg, METRIC_COUNTER, "pstrain_unused_total", "Never set.",
                                     "x", NULL, 0, &err);
  REQUIRE(pushes != NULL && step != NULL && lat != NULL && empty != NULL);
  metric_inc(pushes, (const char *[]){"1"}, 2);
  metric_inc(pushes, (const char *[]){"0"}, 1);
  metric_inc(pushes, (const char *[]){"1"}, 1);
  metric_inc(pushes, (const char *[]){"1"}, -5); /* a counter never goes down */
  metric_set(step, NULL, 12345678);
  metric_observe(lat, (const char *[]){"Push\"Pull\\"}, 0.0005);
  metric_observe(lat, (const char *[]){"Push\"Pull\\"}, 0.5);
  metric_observe(lat, (const char *[]){"Push\"Pull\\"}, 7);
  metric_inc(NULL, NULL, 1); /* metrics off: a no-op */
  char *text;
  size_t len;
  REQUIRE(metrics_render(reg, &text, &len, &err) == PS_ERR_OK);
  const char *want =
      "# HELP pstrain_pushes_total Pushes accepted.\n"
      "# TYPE pstrain_pushes_total counter\n"
      "pstrain_pushes_total{trainer=\"1\"} 3\n"
      "pstrain_pushes_total{trainer=\"0\"} 1\n"
      "# HELP pstrain_step Steps applied.\\nAll.\n"
      "# TYPE pstrain_step gauge\n"
      "pstrain_step 12345678\n"
      "# HELP pstrain_rpc_seconds RPC latency.\n"
      "# TYPE pstrain_rpc_seconds histogram\n"
      "pstrain_rpc_seconds_bucket{method=\"Push\\\"Pull\\\\\",le=\"0.001\"} 1\n"
      "pstrain_rpc_seconds_bucket{method=\"Push\\\"Pull\\\\\",le=\"0.25\"} 1\n"
      "pstrain_rpc_seconds_bucket{method=\"Push\\\"Pull\\\\\",le=\"1\"} 2\n"
      "pstrain_rpc_seconds_bucket{method=\"Push\\\"Pull\\\\\",le=\"+Inf\"} 3\n"
      "pstrain_rpc_seconds_sum{method=\"Push\\\"Pull\\\\\"} 7.5005\n"
      "pstrain_rpc_seconds_count{method=\"Push\\\"Pull\\\\\"} 3\n";
  CHECK_EQ_STR(text, want);
  CHECK_EQ_INT(len, strlen(want));
  free(text);
  /* Bad names are refused, not rendered. */
  CHECK(metrics_add(reg, METRIC_GAUGE, "9bad", "x", NULL, NULL, 0, &err) == NULL);
  CHECK(metrics_add(reg, METRIC_HISTOGRAM, "h", "x", "le", bounds, 3, &err) == NULL);
  metrics_destroy(reg);
}

static void test_listen_check(void) {
  ps_error err;
  char addr[300];
  CHECK(metrics_listen_check("9100", 0, "", addr, sizeof addr, &err) == PS_ERR_OK);
  CHECK_EQ_STR(addr, "127.0.0.1:9100");
  CHECK(metrics_listen_check("10.1.2.3:9100", 0, "", addr, sizeof addr, &err) == PS_ERR_OK);
  CHECK_EQ_STR(addr, "10.1.2.3:9100");
  CHECK(metrics_listen_check("[::1]:9100", 0, "", addr, sizeof addr, &err) == PS_ERR_OK);
  CHECK_EQ_STR(addr, "[::1]:9100");
  CHECK(metrics_listen_check("0.0.0.0:9100", 0, " (--insecure)", addr, sizeof addr, &err) ==
        PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "--insecure");
  CHECK(metrics_listen_check(":9100", 1, "", addr, sizeof addr, &err) == PS_ERR_OK);
  CHECK_EQ_STR(addr, "0.0.0.0:9100");
  CHECK(metrics_listen_check("host:99999", 0, "", addr, sizeof addr, &err) != PS_ERR_OK);
  CHECK(metrics_listen_check("nope", 0, "", addr, sizeof addr, &err) != PS_ERR_OK);
}

/* One request on a fresh connection; the reply's status line into status. */
static void http(int port, const char *request, char *status, size_t len, char *body, size_t blen) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
  REQUIRE(write(fd, request, strlen(request)) == (ssize_t)strlen(request));
  static char reply[65536];
  size_t got = 0;
  ssize_t n;
  while (got < sizeof reply - 1 && (n = read(fd, reply + got, sizeof reply - 1 - got)) > 0) {
    got += (size_t)n;
  }
  reply[got] = '\0';
  close(fd);
  char *eol = strstr(reply, "\r\n");
  snprintf(status, len, "%.*s", eol != NULL ? (int)(eol - reply) : 0, reply);
  char *start = strstr(reply, "\r\n\r\n");
  snprintf(body, blen, "%s", start != NULL ? start + 4 : "");
}

static void test_http(void) {
  ps_error err;
  metrics_registry *reg;
  REQUIRE(metrics_create(&reg, &err) == PS_ERR_OK);
  metric_family *g = metrics_add(reg, METRIC_GAUGE, "pstrain_x", "X.", NULL, NULL, 0, &err);
  metric_set(g, NULL, 3);
  metrics_http *h;
  int port = 0;
  REQUIRE(metrics_http_start(&h, reg, "127.0.0.1:0", &port, &err) == PS_ERR_OK);
  CHECK(port > 0);
  char status[256], body[4096];
  http(port, "GET /metrics HTTP/1.0\r\n\r\n", status, sizeof status, body, sizeof body);
  CHECK_CONTAINS(status, " 200 OK");
  CHECK_EQ_STR(body, "# HELP pstrain_x X.\n# TYPE pstrain_x gauge\npstrain_x 3\n");
  http(port, "GET /other HTTP/1.0\r\n\r\n", status, sizeof status, body, sizeof body);
  CHECK_CONTAINS(status, " 404 Not Found");
  http(port, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n", status, sizeof status, body,
       sizeof body);
  CHECK_CONTAINS(status, " 405 Method Not Allowed");
  /* A taken port is an error naming the address. */
  char taken[64];
  snprintf(taken, sizeof taken, "127.0.0.1:%d", port);
  metrics_http *h2 = NULL;
  int port2;
  CHECK(metrics_http_start(&h2, reg, taken, &port2, &err) != PS_ERR_OK);
  CHECK_CONTAINS(err.msg, taken);
  metrics_http_stop(h);
  metrics_destroy(reg);
}

int main(void) {
  test_text();
  test_listen_check();
  test_http();
  return check_report("test_metrics");
}
