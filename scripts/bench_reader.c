/* The Criteo reader alone: reads a file through ctr_reader (one reader
 * thread, this thread copying examples out in batches as a trainer would)
 * and prints lines/s, MB/s of the file as stored, and peak RSS, which must
 * not grow with the file. Usage: bench_reader FILE [--skip-bad-lines]
 * [--passes N] [--batch N]. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "common/clock.h"
#include "trainer/data/ctr_reader.h"

/* User + system CPU seconds of the whole process (both threads): on a
 * loaded machine wall time says little, CPU time still does. */
static double cpu_s(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static long peak_rss_kib(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
  return ru.ru_maxrss; /* KiB on Linux */
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE [--skip-bad-lines] [--passes N] [--batch N]\n", argv[0]);
    return 2;
  }
  const char *path = argv[1];
  ctr_reader_options opt = {0};
  int passes = 1, batch = 512;
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "--skip-bad-lines") == 0) {
      opt.skip_bad_lines = 1;
    } else if (strcmp(argv[i], "--passes") == 0 && i + 1 < argc) {
      passes = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
      batch = atoi(argv[++i]);
    } else {
      fprintf(stderr, "bench_reader: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (passes < 1 || batch < 1) {
    fprintf(stderr, "bench_reader: --passes and --batch must be positive\n");
    return 2;
  }
  struct stat st;
  if (stat(path, &st) != 0) {
    perror(path);
    return 1;
  }
  ctr_example *ex = malloc((size_t)batch * sizeof *ex);
  if (ex == NULL) {
    fprintf(stderr, "bench_reader: out of memory\n");
    return 1;
  }
  ps_error err;
  ctr_reader *r;
  long rss0 = peak_rss_kib();
  if (ctr_reader_open(&r, path, &opt, &err) != PS_ERR_OK) {
    fprintf(stderr, "bench_reader: %s\n", err.msg);
    return 1;
  }
  double sum = 0; /* touch what was read so nothing is optimized away */
  for (int p = 0; p < passes; p++) {
    if (p > 0 && ctr_reader_rewind(r, &err) != PS_ERR_OK) {
      fprintf(stderr, "bench_reader: %s\n", err.msg);
      return 1;
    }
    long examples = 0;
    double t0 = now_s(), c0 = cpu_s();
    for (;;) {
      int got;
      if (ctr_reader_next(r, ex, batch, &got, &err) != PS_ERR_OK) {
        fprintf(stderr, "bench_reader: %s\n", err.msg);
        return 1;
      }
      if (got == 0) break;
      for (int i = 0; i < got; i++) sum += ex[i].label + ex[i].dense[0] + (double)(ex[i].keys[0] & 1);
      examples += got;
    }
    double dt = now_s() - t0, dc = cpu_s() - c0;
    long lines = ctr_reader_lines(r);
    printf("bench_reader: %s pass %d: %ld lines (%ld examples, %ld bad) in %.3f s: "
           "%.0f lines/s, %.1f MB/s of the file; %.3f CPU s (both threads): %.0f lines/CPU-s\n",
           path, p + 1, lines, examples, ctr_reader_bad_lines(r), dt, (double)lines / dt,
           (double)st.st_size / dt / 1e6, dc, dc > 0 ? (double)lines / dc : 0.0);
  }
  ctr_reader_close(r);
  free(ex);
  printf("bench_reader: peak RSS %ld KiB (%ld KiB before opening the reader); checksum %.3f\n",
         peak_rss_kib(), rss0, sum);
  return 0;
}
