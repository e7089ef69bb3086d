/* gen_ctr's output folder and files; see gen_ctr_out.h. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "scripts/gen_ctr_out.h"

/* Temp files to remove when we fail, so a failed run leaves nothing behind. */
static char temps[3][4096];

void die(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("gen-ctr: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  for (int i = 0; i < 3; i++)
    if (temps[i][0] != '\0') unlink(temps[i]);
  exit(status);
}

void *xmalloc(size_t n) {
  void *p = calloc(1, n ? n : 1);
  if (p == NULL) die(1, "out of memory allocating %zu bytes (try a smaller --scale)", n);
  return p;
}

/* Creates the output folder when missing; refuses one we cannot write to
 * before any work. */
void prepare_out(const char *dir) {
  struct stat st;
  if (stat(dir, &st) != 0) {
    if (errno != ENOENT || mkdir(dir, 0755) != 0) die(1, "cannot create output folder %s: %s", dir, strerror(errno));
  } else if (!S_ISDIR(st.st_mode)) {
    die(1, "--out %s is not a folder", dir);
  }
  if (access(dir, W_OK | X_OK) != 0) die(1, "cannot write to output folder %s: %s", dir, strerror(errno));
}

void out_open(out_file *o, const char *dir, const char *name, int gzip, int slot) {
  snprintf(o->path, sizeof o->path, "%s/%s", dir, name);
  snprintf(temps[slot], sizeof temps[slot], "%s/.%s.tmp.%ld", dir, name, (long)getpid());
  int fd = open(temps[slot], O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    int e = errno;
    temps[slot][0] = '\0';
    die(1, "cannot create %s/%s: %s", dir, name, strerror(e));
  }
  o->fp = NULL;
  o->gz = NULL;
  if (gzip) o->gz = gzdopen(fd, "wb1");
  else o->fp = fdopen(fd, "wb");
  if (o->fp == NULL && o->gz == NULL) die(1, "cannot open %s for writing: %s", temps[slot], strerror(errno));
  o->buf = xmalloc(OUT_BUF_SIZE);
  o->len = 0;
}

void out_flush(out_file *o, int slot) {
  if (o->len == 0) return;
  if (o->gz != NULL) {
    if (gzwrite(o->gz, o->buf, (unsigned)o->len) != (int)o->len) {
      int zerr;
      const char *msg = gzerror(o->gz, &zerr);
      die(1, "writing %s: %s", temps[slot], zerr == Z_ERRNO ? strerror(errno) : msg);
    }
  } else if (fwrite(o->buf, 1, o->len, o->fp) != o->len) {
    die(1, "writing %s: %s", temps[slot], strerror(errno));
  }
  o->len = 0;
}

/* Flushes, closes and fsyncs the temp file; the rename comes later, once
 * every file is complete. */
void out_close(out_file *o, int slot) {
  out_flush(o, slot);
  if (o->gz != NULL) {
    int rc = gzclose(o->gz);
    if (rc != Z_OK) die(1, "closing %s: zlib error %d%s%s", temps[slot], rc, rc == Z_ERRNO ? ": " : "",
                        rc == Z_ERRNO ? strerror(errno) : "");
  } else if (fclose(o->fp) != 0) {
    die(1, "closing %s: %s", temps[slot], strerror(errno));
  }
  int fd = open(temps[slot], O_RDONLY);
  if (fd < 0 || fsync(fd) != 0) die(1, "syncing %s: %s", temps[slot], strerror(errno));
  close(fd);
  free(o->buf);
}

void out_commit(out_file *o, int slot) {
  if (rename(temps[slot], o->path) != 0) die(1, "renaming %s to %s: %s", temps[slot], o->path, strerror(errno));
  temps[slot][0] = '\0';
}

void out_sync_folder(const char *dir) {
  int dfd = open(dir, O_RDONLY);
  if (dfd < 0 || fsync(dfd) != 0) die(1, "syncing folder %s: %s", dir, strerror(errno));
  close(dfd);
}
