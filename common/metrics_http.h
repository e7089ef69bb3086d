/* The /metrics endpoint: libmicrohttpd serves a registry's text format on
 * its own thread (MHD_USE_INTERNAL_POLLING_THREAD). GET or HEAD /metrics
 * answers 200, other paths 404, other methods 405. */
#ifndef PSTRAIN_COMMON_METRICS_HTTP_H
#define PSTRAIN_COMMON_METRICS_HTTP_H

#include <stddef.h>

#include "common/error.h"
#include "common/metrics.h"

typedef struct metrics_http metrics_http;

/* Checks a --metrics-listen value and writes HOST:PORT to addr: a bare PORT
 * means 127.0.0.1:PORT. A wildcard host (empty, 0.0.0.0, ::, *) would serve
 * every interface without naming one: refused unless allow_wildcard, the
 * message ending with hint (how to allow it). A named address beyond
 * loopback is allowed: it was asked for, and the endpoint shows no
 * parameters. */
ps_err metrics_listen_check(const char *spec, int allow_wildcard, const char *hint, char *addr,
                            size_t len, ps_error *err);

/* Serves reg at addr (from metrics_listen_check); *port is the bound port
 * (addr may give 0). reg must outlive the server. */
ps_err metrics_http_start(metrics_http **out, metrics_registry *reg, const char *addr, int *port,
                          ps_error *err);

/* Stops serving (waits for the server's thread) and frees it; NULL is fine. */
void metrics_http_stop(metrics_http *h);

#endif
