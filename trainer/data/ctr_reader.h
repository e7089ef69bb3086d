/* Streams a Criteo TSV file (plain or gzip'd, the format found from its
 * content) as examples: a reader thread parses ahead into a bounded buffer,
 * so memory does not grow with the file and parsing overlaps training.
 * Malformed lines stop the reader with file, line number and why, or with
 * skip_bad_lines are counted and skipped. One consumer thread. */
#ifndef PSTRAIN_TRAINER_CTR_READER_H
#define PSTRAIN_TRAINER_CTR_READER_H

#include "common/criteo.h"
#include "common/error.h"

typedef struct ctr_reader_options {
  int skip_bad_lines;
  long limit;          /* stop after this many examples of the file, counted
                        * before sharding (0: the whole file) */
  /* A trainer's share: examples are taken in blocks of shard_block; block b
   * goes to shard b % shard_count (so every shard sees the same steps). 0/1:
   * everything. */
  long shard_block;
  int shard_index, shard_count;
  size_t buffer_examples; /* examples buffered ahead (0: a default) */
} ctr_reader_options;

typedef struct ctr_reader ctr_reader;

/* Opens path and starts the reader thread. A missing or unreadable file
 * fails here; bad lines fail at the ctr_reader_next that reaches them. */
ps_err ctr_reader_open(ctr_reader **out, const char *path, const ctr_reader_options *opt,
                       ps_error *err);

/* Up to max next examples of this shard into out; *count below max only at
 * the end of the pass (0 after it). A pass stopped by a bad line fails the
 * first call it cannot fill, *count 0. */
ps_err ctr_reader_next(ctr_reader *r, ctr_example *out, int max, int *count, ps_error *err);

/* Starts again from the file's first line (the next epoch). */
ps_err ctr_reader_rewind(ctr_reader *r, ps_error *err);

/* Lines read and bad lines skipped so far in this pass (the whole file,
 * every shard; a rewind starts them at 0 again). */
long ctr_reader_lines(const ctr_reader *r);
long ctr_reader_bad_lines(const ctr_reader *r);

void ctr_reader_close(ctr_reader *r);

/* Whether path looks like a Criteo TSV file (plain or gzip'd): its first line
 * has 40 tab-separated fields. 0 for IDX or anything else. */
int ctr_reader_sniff(const char *path);

/* Lines of a (gzip'd) text file, the last one counted without its newline. */
ps_err ctr_reader_count_lines(const char *path, long *lines, ps_error *err);

#endif
