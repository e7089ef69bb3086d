/* gen_ctr's output: the folder, and files written atomically (a temp file
 * flushed from a big buffer, plain or gzip, fsync'd, then renamed), with
 * die() removing the temp files so a failed run leaves nothing behind. */
#ifndef PSTRAIN_SCRIPTS_GEN_CTR_OUT_H
#define PSTRAIN_SCRIPTS_GEN_CTR_OUT_H

#include <stddef.h>
#include <stdio.h>
#include <zlib.h>

/* One output file; `slot` (0..2) names its temp file in every call. The
 * caller formats into buf[len..] and calls out_flush before it would pass
 * OUT_BUF_SIZE. */
typedef struct {
  char path[4096], *buf;
  size_t len;
  FILE *fp;
  gzFile gz;
} out_file;

enum { OUT_BUF_SIZE = 1 << 22 };

/* Prints "gen-ctr: " and the message, removes the temp files, exits. */
void die(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
/* calloc that dies when out of memory. */
void *xmalloc(size_t n);

/* Creates the output folder when missing; refuses one we cannot write to. */
void prepare_out(const char *dir);
void out_open(out_file *o, const char *dir, const char *name, int gzip, int slot);
void out_flush(out_file *o, int slot);
void out_close(out_file *o, int slot);
void out_commit(out_file *o, int slot);
/* fsyncs the folder once every file is renamed into it. */
void out_sync_folder(const char *dir);

#endif
