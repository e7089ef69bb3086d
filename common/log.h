/* Logging for both daemons: one line per event on stderr with a millisecond
 * timestamp, the process role, its pid and the level. Not for progress bars
 * or results meant for other programs. */
#ifndef PSTRAIN_COMMON_LOG_H
#define PSTRAIN_COMMON_LOG_H

typedef enum {
  LOG_LEVEL_ERROR = 0,
  LOG_LEVEL_WARN,
  LOG_LEVEL_INFO,
  LOG_LEVEL_DEBUG,
} log_level;

/* Sets the role printed on every line (e.g. "trainer", "pserver"). The string
 * must outlive all logging. Not thread-safe; call once at start-up. */
void log_set_role(const char *role);
void log_set_level(log_level level);
log_level log_get_level(void);

/* Parses "error", "warn", "info" or "debug". Returns 0, or -1 if unknown. */
int log_level_parse(const char *text, log_level *out);

/* Writes one line. Thread-safe: a line is written with a single call. */
void log_write(log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The level test comes first so arguments are not evaluated when filtered. */
#define LOG(level, ...)                                         \
  do {                                                          \
    if ((level) <= log_get_level()) log_write((level), __VA_ARGS__); \
  } while (0)

#define LOG_ERROR(...) LOG(LOG_LEVEL_ERROR, __VA_ARGS__)
#define LOG_WARN(...) LOG(LOG_LEVEL_WARN, __VA_ARGS__)
#define LOG_INFO(...) LOG(LOG_LEVEL_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) LOG(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
