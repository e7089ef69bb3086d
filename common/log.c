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

/* Length of the valid UTF-8 sequence at p (of at most n bytes), 0 if none.
 * Overlong forms and surrogates count as invalid, as RFC 3629 says. */
static size_t utf8_length(const unsigned char *p, size_t n) {
  size_t len = p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
  if (len == 0 || len > n || p[0] >= 0xf8) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
  }
  if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) ||
      (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90)) {
    return 0;
  }
  return len;
}

/* Messages quote what peers sent (a model string, a method name): control
 * characters could forge log lines and stray bytes break readers of the
 * log, so both become '?'. */
static void make_printable(char *text, size_t n) {
  unsigned char *p = (unsigned char *)text;
  for (size_t i = 0; i < n;) {
    if (p[i] < 0x80) {
      if ((p[i] < 0x20 && p[i] != '\t') || p[i] == 0x7f) p[i] = '?';
      i++;
      continue;
    }
    size_t len = utf8_length(p + i, n - i);
    if (len == 0) {
      p[i++] = '?';
    } else {
      i += len;
    }
  }
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
    size_t start = used;
    if (n > 0) used += (size_t)n;
    if (used >= sizeof line - 1) used = sizeof line - 2; /* truncated: keep the newline */
    make_printable(line + start, used - start);
  }
  if (used >= sizeof line - 1) used = sizeof line - 2;
  line[used++] = '\n';
  /* One write per line keeps lines from several threads whole; a failed log
   * write has nowhere better to be reported, so it is ignored on purpose. */
  ssize_t written = write(STDERR_FILENO, line, used);
  (void)written;
}
