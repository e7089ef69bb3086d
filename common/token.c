/* Token files and the loopback test. */
#define _POSIX_C_SOURCE 200809L
#include "common/token.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"

ps_err token_read_file(const char *path, char *out, size_t len, ps_error *err) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return ps_error_set(err, PS_ERR_IO, "token file %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && (st.st_mode & 0077) != 0) {
    LOG_WARN("token file %s can be read by other users (chmod 600 it)", path);
  }
  char line[TOKEN_MAX + 2];
  char *got = fgets(line, sizeof line, f);
  int read_error = ferror(f);
  fclose(f);
  if (got == NULL || read_error) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "token file %s is empty or unreadable", path);
  }
  size_t n = strcspn(line, "\r\n");
  line[n] = '\0';
  if (n < 16 || n >= TOKEN_MAX || n >= len) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "token file %s: the token must be 16 to %d characters on the first line",
                        path, TOKEN_MAX - 1);
  }
  for (size_t i = 0; i < n; i++) {
    if (line[i] < 0x21 || line[i] > 0x7e) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                          "token file %s: the token must be printable ASCII without spaces", path);
    }
  }
  memcpy(out, line, n + 1);
  return PS_ERR_OK;
}

int token_is_loopback(const char *endpoint) {
  const char *colon = strrchr(endpoint, ':');
  size_t host_len = colon != NULL ? (size_t)(colon - endpoint) : strlen(endpoint);
  if (host_len >= 4 && strncmp(endpoint, "127.", 4) == 0) return 1;
  if (host_len == 5 && strncmp(endpoint, "[::1]", 5) == 0) return 1;
  if (host_len == 9 && strncmp(endpoint, "localhost", 9) == 0) return 1;
  return 0;
}
