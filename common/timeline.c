/* Chrome trace events, buffered and written per step, the file a complete
 * JSON array after every write (see timeline.h for why no signal handler is
 * needed). */
#define _GNU_SOURCE
#include "common/timeline.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"

/* A buffer this full is written before the step ends (async pservers, long steps). */
#define TIMELINE_FLUSH_BYTES (256 * 1024)
#define TIMELINE_CLOSING "\n]\n"
#define TIMELINE_CLOSING_LEN 3

struct timeline {
  pthread_mutex_t lock;
  int fd; /* -1 once a write failed: recording stopped */
  char *path;
  int pid;
  long first_step, last_step, every;
  double offset_us; /* wall clock minus now_s(), in microseconds */
  off_t end;        /* where the closing bracket starts in the file */
  char *buf;        /* events not yet written, each ",\n{...}" */
  size_t len, cap;
};

ps_err timeline_parse_steps(const char *text, long *first, long *last, long *every,
                            ps_error *err) {
  *first = 0;
  *last = LONG_MAX;
  *every = 1;
  if (text[0] == '\0') return PS_ERR_OK;
  const char *colon = strchr(text, ':');
  char *end = NULL;
  if (colon == NULL) goto bad;
  const char *slash = strchr(colon, '/');
  if (slash != NULL) {
    errno = 0;
    *every = strtol(slash + 1, &end, 10);
    if (errno != 0 || end == slash + 1 || *end != '\0' || *every < 1) goto bad;
  }
  if (colon != text) {
    errno = 0;
    *first = strtol(text, &end, 10);
    if (errno != 0 || end != colon || *first < 0) goto bad;
  }
  if (colon[1] != '\0' && colon + 1 != slash) {
    errno = 0;
    *last = strtol(colon + 1, &end, 10);
    if (errno != 0 || *end != (slash != NULL ? '/' : '\0') || *last < 0) goto bad;
  }
  if (*first > *last) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--timeline-steps %s: the first step %ld is after the last %ld", text,
                        *first, *last);
  }
  return PS_ERR_OK;
bad:
  return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                      "--timeline-steps %s: expected A:B (zero-based steps, both included; A: "
                      "or :B leave one end open), or A:B/K for every K-th of them", text);
}

ps_err timeline_parse_flags(const char *path, const char *steps, long *first, long *last,
                            long *every, ps_error *err) {
  if (steps[0] != '\0' && path[0] == '\0') {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--timeline-steps needs --timeline FILE");
  }
  return timeline_parse_steps(steps, first, last, every, err);
}

/* Writes all of data at offset, through short writes and EINTR. */
static int write_all_at(int fd, const char *data, size_t len, off_t offset) {
  while (len > 0) {
    ssize_t n = pwrite(fd, data, len, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    data += n;
    len -= (size_t)n;
    offset += n;
  }
  return 0;
}

/* Appends printf output to the buffer; 0 when out of memory. Lock held. */
__attribute__((format(printf, 2, 3))) static int buf_printf(timeline *tl, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tl->buf + tl->len, tl->cap - tl->len, fmt, ap);
    va_end(ap);
    if (n < 0) return 0;
    if ((size_t)n < tl->cap - tl->len) {
      tl->len += (size_t)n;
      return 1;
    }
    size_t cap = tl->cap * 2 + (size_t)n + 1;
    char *grown = realloc(tl->buf, cap);
    if (grown == NULL) return 0;
    tl->buf = grown;
    tl->cap = cap;
  }
}

void timeline_rank_path(const char *path, int collective, int rank, char *out, size_t len) {
  if (collective && rank > 0 && path[0] != '\0') snprintf(out, len, "%s.rank%d", path, rank);
  else snprintf(out, len, "%s", path);
}

/* Writes the buffer and a new closing bracket over the old one. Lock held. */
static void flush_locked(timeline *tl) {
  if (tl->fd < 0 || tl->len == 0) return;
  if (!buf_printf(tl, TIMELINE_CLOSING)) {
    LOG_ERROR("--timeline %s: out of memory buffering events; recording stops", tl->path);
    tl->len = 0;
    close(tl->fd);
    tl->fd = -1;
    return;
  }
  if (write_all_at(tl->fd, tl->buf, tl->len, tl->end) != 0) {
    LOG_ERROR("--timeline %s: writing events: %s; recording stops", tl->path, strerror(errno));
    close(tl->fd);
    tl->fd = -1;
  } else {
    tl->end += (off_t)(tl->len - TIMELINE_CLOSING_LEN);
  }
  tl->len = 0;
}

ps_err timeline_open(timeline **out, const char *path, const char *role, int id, long first_step,
                     long last_step, long every, ps_error *err) {
  *out = NULL;
  if (path[0] == '\0') return PS_ERR_OK;
  timeline *tl = calloc(1, sizeof *tl);
  if (tl == NULL || (tl->path = strdup(path)) == NULL ||
      (tl->buf = malloc(tl->cap = 4096)) == NULL) {
    if (tl != NULL) free(tl->path);
    free(tl);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "--timeline %s: out of memory", path);
  }
  tl->fd = -1;
  int rc = pthread_mutex_init(&tl->lock, NULL);
  if (rc != 0) {
    free(tl->buf);
    free(tl->path);
    free(tl);
    return ps_error_set(err, PS_ERR_INTERNAL, "--timeline: creating its lock: %s", strerror(rc));
  }
  tl->first_step = first_step;
  tl->last_step = last_step;
  tl->every = every > 1 ? every : 1;
  tl->pid = (strcmp(role, "pserver") == 0 ? 1000 : 2000) + id;
  struct timespec wall;
  if (clock_gettime(CLOCK_REALTIME, &wall) != 0) {
    ps_error_set(err, PS_ERR_INTERNAL, "--timeline: reading the clock: %s", strerror(errno));
    goto fail;
  }
  tl->offset_us = ((double)wall.tv_sec * 1e6 + (double)wall.tv_nsec * 1e-3) - now_s() * 1e6;
  tl->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (tl->fd < 0) {
    ps_error_set(err, PS_ERR_IO, "--timeline %s: cannot create: %s", path, strerror(errno));
    goto fail;
  }
  /* The array's first elements name the process; every event after them
   * starts with ",\n", so a flush never needs to know what came before. */
  tl->len = 0;
  if (!buf_printf(tl,
                  "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                  "\"args\":{\"name\":\"%s %d\"}},\n"
                  "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                  "\"args\":{\"sort_index\":%d}}" TIMELINE_CLOSING,
                  tl->pid, role, id, tl->pid, tl->pid)) {
    ps_error_set(err, PS_ERR_NO_MEMORY, "--timeline %s: out of memory", path);
    goto fail;
  }
  if (write_all_at(tl->fd, tl->buf, tl->len, 0) != 0) {
    ps_error_set(err, PS_ERR_IO, "--timeline %s: writing: %s", path, strerror(errno));
    goto fail;
  }
  tl->end = (off_t)(tl->len - TIMELINE_CLOSING_LEN);
  tl->len = 0;
  *out = tl;
  return PS_ERR_OK;
fail:
  if (tl->fd >= 0) close(tl->fd);
  pthread_mutex_destroy(&tl->lock);
  free(tl->buf);
  free(tl->path);
  free(tl);
  return err->code;
}

int timeline_wants(const timeline *tl, long step) {
  return tl != NULL && step >= tl->first_step && step <= tl->last_step &&
         (step - tl->first_step) % tl->every == 0;
}

/* The kernel's id of the calling thread: what top -H and perf show. */
static long thread_id(void) {
  static _Thread_local long tid = 0;
  if (tid == 0) tid = syscall(SYS_gettid);
  return tid;
}

double timeline_span_arg(timeline *tl, const char *name, long step, double start_s,
                         const char *arg_name, long arg) {
  double now = now_s();
  if (!timeline_wants(tl, step)) return now;
  long long ts = (long long)(start_s * 1e6 + tl->offset_us);
  double dur = (now - start_s) * 1e6;
  if (dur < 0) dur = 0;
  pthread_mutex_lock(&tl->lock);
  if (tl->fd >= 0) {
    int ok = buf_printf(tl,
                        ",\n{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%ld,\"ts\":%lld,"
                        "\"dur\":%.3f,\"args\":{\"step\":%ld",
                        name, tl->pid, thread_id(), ts, dur, step) &&
             (arg_name == NULL || buf_printf(tl, ",\"%s\":%ld", arg_name, arg)) &&
             buf_printf(tl, "}}");
    if (!ok) {
      LOG_ERROR("--timeline %s: out of memory buffering events; recording stops", tl->path);
      close(tl->fd);
      tl->fd = -1;
    } else if (tl->len >= TIMELINE_FLUSH_BYTES) {
      flush_locked(tl);
    }
  }
  pthread_mutex_unlock(&tl->lock);
  return now;
}

void timeline_flush(timeline *tl) {
  if (tl == NULL) return;
  pthread_mutex_lock(&tl->lock);
  flush_locked(tl);
  pthread_mutex_unlock(&tl->lock);
}

void timeline_close(timeline *tl) {
  if (tl == NULL) return;
  timeline_flush(tl);
  if (tl->fd >= 0 && close(tl->fd) != 0) {
    LOG_ERROR("--timeline %s: closing: %s", tl->path, strerror(errno));
  }
  pthread_mutex_destroy(&tl->lock);
  free(tl->buf);
  free(tl->path);
  free(tl);
}
