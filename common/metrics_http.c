/* The /metrics endpoint over libmicrohttpd. */
#define _POSIX_C_SOURCE 200809L
#include "common/metrics_http.h"

#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "common/log.h"

struct metrics_http {
  struct MHD_Daemon *daemon;
  metrics_registry *reg;
};

/* Splits HOST:PORT or [V6]:PORT; host without brackets. */
static ps_err split(const char *spec, char *host, size_t host_len, long *port, ps_error *err) {
  const char *colon = strrchr(spec, ':');
  const char *digits = colon != NULL ? colon + 1 : spec;
  char *end = NULL;
  errno = 0;
  *port = strtol(digits, &end, 10);
  if (*digits == '\0' || *end != '\0' || errno != 0 || *port < 0 || *port > 65535) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--metrics-listen '%s': not PORT or HOST:PORT (port 0..65535)", spec);
  }
  const char *h = spec;
  size_t n = colon != NULL ? (size_t)(colon - spec) : 0;
  if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
    h++;
    n -= 2;
  }
  if (n >= host_len) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--metrics-listen '%s': host too long", spec);
  }
  memcpy(host, h, n);
  host[n] = '\0';
  return PS_ERR_OK;
}

ps_err metrics_listen_check(const char *spec, int allow_wildcard, const char *hint, char *addr,
                            size_t len, ps_error *err) {
  char host[256];
  long port;
  if (split(spec, host, sizeof host, &port, err) != PS_ERR_OK) return err->code;
  if (strchr(spec, ':') == NULL) {
    snprintf(addr, len, "127.0.0.1:%ld", port);
    return PS_ERR_OK;
  }
  int wildcard = host[0] == '\0' || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0 ||
                 strcmp(host, "*") == 0;
  if (wildcard && !allow_wildcard) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "refusing to serve metrics on every interface (--metrics-listen %s): "
                        "name one address (HOST:PORT), or give a bare PORT for loopback%s",
                        spec, hint);
  }
  const char *bind_host = wildcard ? (strchr(host, ':') != NULL ? "::" : "0.0.0.0") : host;
  int v6 = strchr(bind_host, ':') != NULL;
  if ((size_t)snprintf(addr, len, v6 ? "[%s]:%ld" : "%s:%ld", bind_host, port) >= len) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--metrics-listen '%s': too long", spec);
  }
  return PS_ERR_OK;
}

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const char *text,
                              const char *allow) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
  if (r == NULL) return MHD_NO;
  if ((allow != NULL && MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow) != MHD_YES) ||
      MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8") !=
          MHD_YES) {
    MHD_destroy_response(r);
    return MHD_NO; /* out of memory: libmicrohttpd closes the connection */
  }
  enum MHD_Result rc = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **state) {
  (void)version;
  (void)upload_data;
  (void)upload_size;
  (void)state;
  metrics_http *h = cls;
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    return answer(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET /metrics is served\n", "GET, HEAD");
  }
  if (strcmp(url, "/metrics") != 0) {
    return answer(c, MHD_HTTP_NOT_FOUND, "not found: this server has only /metrics\n", NULL);
  }
  char *text;
  size_t len;
  ps_error err;
  if (metrics_render(h->reg, &text, &len, &err) != PS_ERR_OK) {
    return answer(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory rendering the metrics\n",
                  NULL);
  }
  struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
  if (r == NULL) {
    free(text);
    return MHD_NO;
  }
  if (MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                              "text/plain; version=0.0.4; charset=utf-8") != MHD_YES) {
    MHD_destroy_response(r);
    return MHD_NO; /* out of memory: libmicrohttpd closes the connection */
  }
  enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return rc;
}

/* libmicrohttpd's own complaints (a bind that failed, a bad client) go to our log. */
__attribute__((format(printf, 2, 0))) static void on_mhd_log(void *cls, const char *fmt,
                                                             va_list ap) {
  (void)cls;
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  size_t n = strlen(line);
  if (n > 0 && line[n - 1] == '\n') line[n - 1] = '\0';
  LOG_WARN("metrics endpoint: %s", line);
}

ps_err metrics_http_start(metrics_http **out, metrics_registry *reg, const char *addr, int *port,
                          ps_error *err) {
  char host[256];
  long want;
  if (split(addr, host, sizeof host, &want, err) != PS_ERR_OK) return err->code;
  char service[16];
  snprintf(service, sizeof service, "%ld", want);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  int rc = getaddrinfo(host, service, &hints, &ai);
  if (rc != 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--metrics-listen %s: resolving '%s': %s",
                        addr, host, gai_strerror(rc));
  }
  metrics_http *h = calloc(1, sizeof *h);
  if (h == NULL) {
    freeaddrinfo(ai);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "metrics endpoint: out of memory");
  }
  h->reg = reg;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  /* A few scrapers at a time; a client that stalls is dropped after 10 s. */
  errno = 0;
  h->daemon = MHD_start_daemon(flags, (uint16_t)want, NULL, NULL, on_request, h,
                               MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
                               MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                               MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
                               MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
  int saved = errno;
  freeaddrinfo(ai);
  if (h->daemon == NULL) {
    free(h);
    /* libmicrohttpd need not set errno; its own reason is in the log above. */
    return ps_error_set(err, PS_ERR_UNAVAILABLE,
                        "--metrics-listen %s: libmicrohttpd could not serve there (%s; is the "
                        "port taken?)", addr, saved != 0 ? strerror(saved) : "see the log");
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
  *port = info != NULL ? info->port : (int)want;
  *out = h;
  return PS_ERR_OK;
}

void metrics_http_stop(metrics_http *h) {
  if (h == NULL) return;
  MHD_stop_daemon(h->daemon);
  free(h);
}
