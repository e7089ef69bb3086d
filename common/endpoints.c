/* Endpoint list parsing and the launcher's role variable. */
#include "common/endpoints.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ps_err check_endpoint(const char *e, const char *what, ps_error *err) {
  const char *colon = strrchr(e, ':');
  if (colon == NULL || colon == e) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' is not HOST:PORT", what, e);
  }
  if (e[0] == '[' && colon[-1] != ']') {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' is not [IPV6]:PORT", what, e);
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
