/* What fuzz_ctr's two files share: a finding (an abort saying what broke),
 * its allocation and file writing, and the checkpoint part of an input's
 * checks (fuzz_ctr_checkpoint.c). */
#ifndef PSTRAIN_TESTS_FUZZ_FUZZ_CTR_H
#define PSTRAIN_TESTS_FUZZ_FUZZ_CTR_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void finding(const char *what, const char *detail) {
  fprintf(stderr, "fuzz_ctr: %s%s%s\n", what, detail != NULL ? ": " : "",
          detail != NULL ? detail : "");
  abort();
}

static inline void *xmalloc(size_t n) {
  void *p = malloc(n > 0 ? n : 1);
  if (p == NULL) finding("out of memory", NULL);
  return p;
}

static inline void write_file(const char *path, const uint8_t *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
    fprintf(stderr, "fuzz_ctr: writing %s: %s\n", path, strerror(errno));
    exit(1);
  }
}

/* 3. The input as a checkpoint, written to path, loaded into each table kind. */
void check_checkpoint(const char *path, const uint8_t *data, size_t size);

#endif
