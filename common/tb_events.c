/* TensorBoard event files (common/tb_events.h): TFRecord framing around
 * Events that protobuf-c packs. */
#define _POSIX_C_SOURCE 200809L
#include "common/tb_events.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/log.h"
#include "common/process.h"
#include "tb_event.pb-c.h"

/* What TensorBoard's readers expect first, and TensorFlow writes. */
#define TB_FILE_VERSION "brain.Event:2"
/* Names tried after the plain one exists (a pid reused within the second). */
#define TB_NAME_TRIES 100

struct tb_writer {
  int fd;
  char *path;
  ps_err failed;        /* PS_ERR_OK until a write fails */
  char why[256];        /* that failure's reason */
  unsigned char *buf;   /* a framed record, reused */
  size_t cap;
};

uint32_t tb_masked_crc32c(const void *data, size_t len) {
  uint32_t crc = crc32c_update(0, data, len);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

void tb_record_frame(unsigned char *out, const void *data, size_t len) {
  uint64_t n = len;
  for (int i = 0; i < 8; i++) out[i] = (unsigned char)(n >> (8 * i));
  put_le32(out + 8, tb_masked_crc32c(out, 8));
  if (data != out + 12) memmove(out + 12, data, len);
  put_le32(out + 12 + len, tb_masked_crc32c(out + 12, len));
}

const char *tb_writer_path(const tb_writer *w) { return w == NULL ? "" : w->path; }

static double wall_time_s(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return 0.0; /* cannot fail for this clock */
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Writes all len bytes, going on after a partial write or a signal. */
static int write_all(int fd, const unsigned char *p, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static ps_err failed(tb_writer *w, ps_error *err) {
  return ps_error_set(err, w->failed, "--tensorboard: writing %s: %s", w->path, w->why);
}

/* Packs ev into w->buf, frames it and writes it. */
static ps_err write_event(tb_writer *w, const Tensorboard__Event *ev, ps_error *err) {
  if (w->failed != PS_ERR_OK) return failed(w, err);
  size_t len = tensorboard__event__get_packed_size(ev);
  if (len + TB_RECORD_OVERHEAD > w->cap) {
    unsigned char *grown = realloc(w->buf, len + TB_RECORD_OVERHEAD);
    if (grown == NULL) {
      w->failed = PS_ERR_NO_MEMORY;
      snprintf(w->why, sizeof w->why, "out of memory for a record of %zu bytes", len);
      return failed(w, err);
    }
    w->buf = grown;
    w->cap = len + TB_RECORD_OVERHEAD;
  }
  size_t packed = tensorboard__event__pack(ev, w->buf + 12);
  if (packed != len) {
    w->failed = PS_ERR_INTERNAL;
    snprintf(w->why, sizeof w->why, "protobuf-c packed %zu bytes of an event of %zu", packed, len);
    return failed(w, err);
  }
  tb_record_frame(w->buf, w->buf + 12, len);
  if (write_all(w->fd, w->buf, len + TB_RECORD_OVERHEAD) != 0) {
    w->failed = PS_ERR_IO;
    snprintf(w->why, sizeof w->why, "%s", strerror(errno));
    return failed(w, err);
  }
  return PS_ERR_OK;
}

ps_err tb_writer_write(tb_writer *w, long step, const tb_scalar *values, int count,
                       ps_error *err) {
  if (w == NULL || count <= 0) return PS_ERR_OK;
  Tensorboard__Summary__Value *v = calloc((size_t)count, sizeof *v);
  Tensorboard__Summary__Value **vp = calloc((size_t)count, sizeof *vp);
  if (v == NULL || vp == NULL) {
    free(v);
    free(vp);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "--tensorboard: out of memory for %d values",
                        count);
  }
  for (int i = 0; i < count; i++) {
    tensorboard__summary__value__init(&v[i]);
    v[i].tag = (char *)values[i].tag; /* protobuf-c's field is not const; only read */
    v[i].value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    v[i].simple_value = (float)values[i].value;
    vp[i] = &v[i];
  }
  Tensorboard__Summary summary = TENSORBOARD__SUMMARY__INIT;
  summary.n_value = (size_t)count;
  summary.value = vp;
  Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
  ev.wall_time = wall_time_s();
  ev.step = step;
  ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
  ev.summary = &summary;
  ps_err rc = write_event(w, &ev, err);
  free(v);
  free(vp);
  return rc;
}

/* Creates dir/events.out.tfevents.<s>.<host>.<pid>[.N], never an existing file. */
static ps_err create_file(tb_writer *w, const char *dir, ps_error *err) {
  char host[256];
  if (gethostname(host, sizeof host) != 0) {
    return ps_error_set(err, PS_ERR_IO, "--tensorboard: reading this host's name: %s",
                        strerror(errno));
  }
  host[sizeof host - 1] = '\0';
  long long seconds = (long long)time(NULL);
  char path[4096];
  for (int i = 0; i < TB_NAME_TRIES; i++) {
    int n = i == 0 ? snprintf(path, sizeof path, "%s/events.out.tfevents.%lld.%s.%ld", dir,
                              seconds, host, (long)getpid())
                   : snprintf(path, sizeof path, "%s/events.out.tfevents.%lld.%s.%ld.%d", dir,
                              seconds, host, (long)getpid(), i);
    if (n < 0 || (size_t)n >= sizeof path) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--tensorboard %s: path too long", dir);
    }
    w->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (w->fd >= 0) break;
    if (errno != EEXIST) {
      return ps_error_set(err, PS_ERR_IO, "--tensorboard: creating %s: %s", path,
                          strerror(errno));
    }
  }
  if (w->fd < 0) {
    return ps_error_set(err, PS_ERR_IO, "--tensorboard: %s and %d more names like it exist",
                        path, TB_NAME_TRIES - 1);
  }
  if ((w->path = strdup(path)) == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "--tensorboard: out of memory");
  }
  return PS_ERR_OK;
}

static void destroy(tb_writer *w) {
  if (w->fd >= 0 && close(w->fd) != 0) {
    LOG_ERROR("--tensorboard: closing %s: %s", w->path ? w->path : "the events file",
              strerror(errno));
  }
  free(w->buf);
  free(w->path);
  free(w);
}

ps_err tb_writer_open(tb_writer **out, const char *dir, const char *run, ps_error *err) {
  *out = NULL;
  if (dir[0] == '\0') return PS_ERR_OK;
  char run_dir[4096];
  int n = snprintf(run_dir, sizeof run_dir, "%s/%s", dir, run);
  if (n < 0 || (size_t)n >= sizeof run_dir) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--tensorboard %s: path too long", dir);
  }
  PS_TRY(process_prepare_dir(dir, "--tensorboard", err));
  PS_TRY(process_prepare_dir(run_dir, "--tensorboard", err));
  tb_writer *w = calloc(1, sizeof *w);
  if (w == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "--tensorboard: out of memory");
  w->fd = -1;
  if (create_file(w, run_dir, err) != PS_ERR_OK) {
    destroy(w);
    return err->code;
  }
  Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
  ev.wall_time = wall_time_s();
  ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
  ev.file_version = (char *)TB_FILE_VERSION; /* only read */
  if (write_event(w, &ev, err) != PS_ERR_OK) {
    destroy(w);
    return err->code;
  }
  *out = w;
  return PS_ERR_OK;
}

void tb_writer_close(tb_writer *w) {
  if (w != NULL) destroy(w);
}
