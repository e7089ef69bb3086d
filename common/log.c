/* Line-oriented logging to stderr. */
#define _POSIX_C_SOURCE 200809L
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *log_role = "pstrain";
static log_level log_current = LOG_LEVEL_INFO;
static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

void log_set_role(const char *role) { log_role = role; }
void log_set_level(log_level level) { log_current = level; }
log_level log_get_level(void) { return log_current; }

int log_level_parse(const char *text, log_level *out) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++) {
    if (strcmp(text, names[i]) == 0) {
      *out = (log_level)i;
      return 0;
    }
  }
  return -1;
}

void log_write(log_level level, const char *fmt, ...) {
  char line[2048];
  struct timespec now;
  struct tm tm;
  size_t used = 0;

  if (clock_gettime(CLOCK_REALTIME, &now) == 0 && localtime_r(&now.tv_sec, &tm) != NULL) {
    used = strftime(line, sizeof line, "%Y-%m-%d %H:%M:%S", &tm);
    used += (size_t)snprintf(line + used, sizeof line - used, ".%03ld", now.tv_nsec / 1000000L);
  }
  int n = snprintf(line + used, sizeof line - used, " %s[%ld] %s ", log_role, (long)getpid(),
                   level_names[level]);
  if (n > 0) used += (size_t)n;
  if (used < sizeof line) {
    va_list ap;
    va_start(ap, fmt);
    n = vsnprintf(line + used, sizeof line - used, fmt, ap);
    va_end(ap);
    if (n > 0) used += (size_t)n;
  }
  if (used >= sizeof line - 1) used = sizeof line - 2; /* truncated: keep the newline */
  line[used++] = '\n';
  /* One write per line keeps lines from several threads whole; a failed log
   * write has nowhere better to be reported, so it is ignored on purpose. */
  ssize_t written = write(STDERR_FILENO, line, used);
  (void)written;
}
