/* Endpoint list parsing, name resolution and the launcher's role variable. */
#define _POSIX_C_SOURCE 200809L
#include "common/endpoints.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static ps_err check_endpoint(const char *e, const char *what, ps_error *err) {
  const char *colon = strrchr(e, ':');
  if (colon == NULL || colon == e) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' is not HOST:PORT", what, e);
  }
  if (e[0] == '[' && colon[-1] != ']') {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' is not [IPV6]:PORT", what, e);
  }
  if (e[0] != '[') {
    /* Host names and IPv4: letters, digits, '-', '.', '_' only. */
    for (const char *c = e; c < colon; c++) {
      if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
            *c == '-' || *c == '.' || *c == '_')) {
        return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                            "%s: '%s' is not HOST:PORT (the host has a '%c')", what, e, *c);
      }
    }
  }
  char *end;
  errno = 0;
  long port = strtol(colon + 1, &end, 10);
  if (errno != 0 || end == colon + 1 || *end != '\0' || port < 1 || port > 65535) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' has no port 1..65535", what, e);
  }
  return PS_ERR_OK;
}

ps_err endpoints_parse(const char *text, const char *what, endpoint_list *out, ps_error *err) {
  out->count = 0;
  if (text == NULL || text[0] == '\0') {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s is empty: give HOST:PORT,HOST:PORT,...",
                        what);
  }
  const char *p = text;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
    if (out->count == ENDPOINTS_MAX) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: more than %d entries", what,
                          ENDPOINTS_MAX);
    }
    if (len == 0 || len >= ENDPOINT_LEN) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: entry %d is %s", what, out->count + 1,
                          len == 0 ? "empty" : "too long");
    }
    memcpy(out->items[out->count], p, len);
    out->items[out->count][len] = '\0';
    if (check_endpoint(out->items[out->count], what, err) != PS_ERR_OK) return err->code;
    for (int i = 0; i < out->count; i++) {
      if (strcasecmp(out->items[i], out->items[out->count]) == 0) {
        return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                            "%s: entry %d '%s' repeats entry %d: every pserver needs its own "
                            "HOST:PORT", what, out->count + 1, out->items[out->count], i + 1);
      }
    }
    out->count++;
    if (comma == NULL) break;
    p = comma + 1;
  }
  return PS_ERR_OK;
}

ps_err endpoints_check_role(const char *role, ps_error *err) {
  const char *env = getenv("TRAINING_ROLE");
  if (env == NULL || env[0] == '\0' || strcmp(env, role) == 0) return PS_ERR_OK;
  return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                      "TRAINING_ROLE=%s, but this program is the %s (PSERVER or TRAINER)", env,
                      role);
}

ps_err endpoint_host(const char *endpoint, char *host, size_t len, ps_error *err) {
  const char *colon = strrchr(endpoint, ':');
  const char *start = endpoint;
  size_t n = colon != NULL ? (size_t)(colon - endpoint) : strlen(endpoint);
  if (n >= 2 && start[0] == '[' && start[n - 1] == ']') {
    start++;
    n -= 2;
  }
  if (n == 0 || n >= len) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "'%s' has no usable host", endpoint);
  }
  memcpy(host, start, n);
  host[n] = '\0';
  return PS_ERR_OK;
}

ps_err endpoint_resolve(const char *endpoint, const char *what, double wait_s, ps_error *err) {
  char host[ENDPOINT_LEN];
  if (endpoint_host(endpoint, host, sizeof host, err) != PS_ERR_OK) return err->code;
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc == 0) {
      freeaddrinfo(res);
      return PS_ERR_OK;
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    double waited = (double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) * 1e-9;
    /* Cluster DNS names (Kubernetes, Slurm) can appear after the process starts. */
    if (waited >= wait_s || (rc != EAI_NONAME && rc != EAI_AGAIN && rc != EAI_FAIL)) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                          "%s: host '%s' of '%s' does not resolve: %s%s", what, host, endpoint,
                          rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc),
                          wait_s > 0 ? " (kept trying for the connect timeout)" : "");
    }
    const struct timespec pause = {0, 250 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
}

/* A whole number from the environment, or -1 when unset. */
static ps_err env_count(const char *name, long min, long *out, ps_error *err) {
  const char *v = getenv(name);
  *out = -1;
  if (v == NULL || v[0] == '\0') return PS_ERR_OK;
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (errno != 0 || *end != '\0' || n < min || n > 1000000) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s='%s' is not a number >= %ld", name, v,
                        min);
  }
  *out = n;
  return PS_ERR_OK;
}

ps_err endpoints_slurm_task(long *procid, long *ntasks, ps_error *err) {
  *procid = -1;
  *ntasks = -1;
  /* Only a task srun started: the batch script itself also has SLURM_ vars. */
  if (getenv("SLURM_STEP_ID") == NULL) return PS_ERR_OK;
  long id, n;
  if (env_count("SLURM_PROCID", 0, &id, err) != PS_ERR_OK ||
      env_count("SLURM_NTASKS", 1, &n, err) != PS_ERR_OK) {
    return err->code;
  }
  if (id < 0 || n < 1) return PS_ERR_OK;
  if (id >= n) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "SLURM_PROCID=%ld is not below SLURM_NTASKS=%ld",
                        id, n);
  }
  *procid = id;
  *ntasks = n;
  return PS_ERR_OK;
}
