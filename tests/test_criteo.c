/* The Criteo parser and the streaming reader on 100 real Criteo rows
 * (tests/data/criteo-sample.tsv): exact counts against figures derived with
 * awk, every example against a slow reference parser written here, the gzip
 * and CRLF copies, malformed copies refused with their line number or
 * skipped, sharding, limit, rewind, close mid-file, long lines, truncated
 * gzip, and the sniffing that picks --data-format. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "common/criteo.h"
#include "tests/check.h"
#include "trainer/data/criteo_source.h"
#include "trainer/data/ctr_reader.h"

#define SAMPLE PSTRAIN_SOURCE_DIR "/tests/data/criteo-sample.tsv"
#define N 100
#define MAXLINES 200

static char dir[] = "/tmp/pstrain-test-criteo-XXXXXX";

/* Figures derived from the file alone, I1..I13 then C1..C26 (awk fields 2..40):
 *   awk -F'\t' '{for(i=2;i<=40;i++) if($i=="") e[i]++}
 *               END{for(i=2;i<=40;i++) printf "%d,", e[i]+0}' tests/data/criteo-sample.tsv */
static const int expect_empty[39] = {53, 0,  30, 25, 2, 23, 3, 0, 3, 53, 3, 77, 25,
                                     0,  0,  2,  2,  0, 10, 0, 0, 0, 0,  0, 2,  0,
                                     0,  0,  2,  0,  0, 53, 53, 2, 69, 0, 2, 53, 53};
/*   awk -F'\t' '{for(i=2;i<=14;i++) if($i ~ /^-/) e[i]++}
 *               END{for(i=2;i<=14;i++) printf "%d,", e[i]+0}' tests/data/criteo-sample.tsv */
static const int expect_negative[13] = {0, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
/*   awk -F'\t' '{for(i=2;i<=14;i++) if($i ~ /^[0-9]+$/ && $i>0) e[i]++}
 *               END{for(i=2;i<=14;i++) printf "%d,", e[i]+0}' tests/data/criteo-sample.tsv */
static const int expect_positive[13] = {28, 77, 70, 75, 96, 73, 75, 84, 96, 28, 75, 5, 72};

static char *lines[MAXLINES]; /* the sample's lines, without newlines */
static int nlines;
static ctr_example ref[N];    /* the reference parser's examples */
static int ref_empty[39], ref_negative[13]; /* its counts of empty and negative fields */
static ctr_example got[2 * N]; /* what a case read */

static void load_sample(void) {
  FILE *f = fopen(SAMPLE, "r");
  REQUIRE(f != NULL);
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  while ((len = getline(&line, &cap, f)) > 0) {
    if (line[len - 1] == '\n') line[--len] = '\0';
    REQUIRE(nlines < MAXLINES);
    lines[nlines++] = strdup(line);
  }
  free(line);
  fclose(f);
}

/* Slow and obvious: split on tabs, strtoll, strtoul. Counts empties and negatives. */
static void ref_parse(const char *line, ctr_example *ex, int *empty, int *negative) {
  char *copy = strdup(line), *p = copy;
  char *field[CRITEO_FIELDS];
  int n = 0;
  for (;;) {
    REQUIRE(n < CRITEO_FIELDS);
    field[n++] = p;
    char *tab = strchr(p, '\t');
    if (tab == NULL) break;
    *tab = '\0';
    p = tab + 1;
  }
  REQUIRE(n == CRITEO_FIELDS);
  ex->label = (float)strtol(field[0], NULL, 10);
  for (int i = 0; i < CRITEO_INT_FIELDS; i++) {
    const char *s = field[1 + i];
    long long x = strtoll(s, NULL, 10);
    if (*s == '\0') empty[i]++;
    if (x < 0) negative[i]++;
    ex->dense[i] = x > 0 ? (float)log1p((double)x) : 0.0f;
  }
  for (int i = 0; i < CRITEO_CAT_FIELDS; i++) {
    const char *s = field[14 + i];
    if (*s == '\0') {
      empty[13 + i]++;
      ex->keys[i] = criteo_feature_key(i, 0, 1);
    } else {
      REQUIRE(strlen(s) == 8);
      ex->keys[i] = criteo_feature_key(i, (uint32_t)strtoul(s, NULL, 16), 0);
    }
  }
  free(copy);
}

/* The fixture of every case that reads: the sample's lines and their
 * reference parse, made once. */
static void sample_setup(void) {
  static int ready = 0;
  if (ready) return;
  load_sample();
  for (int e = 0; e < nlines && e < N; e++) ref_parse(lines[e], &ref[e], ref_empty, ref_negative);
  ready = 1;
}

static int same(const ctr_example *a, const ctr_example *b) {
  return memcmp(a, b, sizeof *a) == 0;
}

/* Writes lines[0..n) with line `bad` (1-based, 0: none) replaced by `repl`;
 * gz: through gzwrite; crlf: "\r\n" endings. The last line gets no newline,
 * like the sample's. */
static void write_copy(const char *path, int bad, const char *repl, int gz, int crlf) {
  gzFile g = NULL;
  FILE *f = NULL;
  if (gz) {
    g = gzopen(path, "wb");
    REQUIRE(g != NULL);
  } else {
    f = fopen(path, "w");
    REQUIRE(f != NULL);
  }
  for (int i = 0; i < nlines; i++) {
    const char *text = i + 1 == bad ? repl : lines[i];
    const char *end = i + 1 == nlines ? "" : crlf ? "\r\n" : "\n";
    if (gz) {
      REQUIRE(gzputs(g, text) >= 0 && gzputs(g, end) >= 0);
    } else {
      REQUIRE(fputs(text, f) >= 0 && fputs(end, f) >= 0);
    }
  }
  if (gz) {
    REQUIRE(gzclose(g) == Z_OK);
  } else {
    REQUIRE(fclose(f) == 0);
  }
}

/* Reads everything (up to max) in chunks of `chunk`; returns the status of
 * the call that ended it. */
static ps_err read_all(const char *path, const ctr_reader_options *opt, int chunk,
                       ctr_example *out, int max, int *n, long *bad, ps_error *err) {
  ctr_reader *r;
  *n = 0;
  ps_err rc = ctr_reader_open(&r, path, opt, err);
  if (rc != PS_ERR_OK) return rc;
  for (;;) {
    int count = 0, want = chunk < max - *n ? chunk : max - *n;
    if (want == 0) want = 1; /* must then report the end */
    ctr_example scratch;
    rc = ctr_reader_next(r, *n < max ? out + *n : &scratch, want, &count, err);
    if (rc != PS_ERR_OK || count == 0) break;
    REQUIRE(*n + count <= max);
    *n += count;
  }
  if (bad != NULL) *bad = ctr_reader_bad_lines(r);
  ctr_reader_close(r);
  return rc;
}

static void path_of(const char *name, char *out, size_t len) {
  snprintf(out, len, "%s/%s", dir, name);
}

static void case_parse_line(void) {
  ctr_example ex;
  char why[160];
  char line[1024];
  /* One well-formed line to vary. */
  const char *base_ints = "5\t-1\t\t0\t1\t1023\t1024\t5000\t9223372036854775807\t"
                          "-9223372036854775808\t2\t3\t4";
  snprintf(line, sizeof line, "1\t%s\t0123abcd\tABCDEF01%s", base_ints,
           "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t");
  CHECK_EQ_INT(criteo_parse_line(line, strlen(line), &ex, why, sizeof why), 0);
  CHECK(ex.label == 1.0f);
  CHECK(ex.dense[0] == (float)log1p(5.0));
  CHECK(ex.dense[1] == 0.0f && ex.dense[2] == 0.0f && ex.dense[3] == 0.0f);
  CHECK(ex.dense[4] == (float)log1p(1.0));
  CHECK(ex.dense[5] == (float)log1p(1023.0));
  CHECK(ex.dense[6] == (float)log1p(1024.0));
  CHECK(ex.dense[7] == (float)log1p(5000.0));
  CHECK(ex.dense[8] == (float)log1p(9223372036854775807.0));
  CHECK(ex.dense[9] == 0.0f);
  CHECK(ex.keys[0] == criteo_feature_key(0, 0x0123abcd, 0));
  CHECK(ex.keys[1] == criteo_feature_key(1, 0xabcdef01, 0)); /* either case */
  for (int i = 2; i < CRITEO_CAT_FIELDS; i++) CHECK(ex.keys[i] == criteo_feature_key(i, 0, 1));
  /* A trailing '\r' is accepted. */
  size_t len = strlen(line);
  line[len] = '\r';
  CHECK_EQ_INT(criteo_parse_line(line, len + 1, &ex, why, sizeof why), 0);
  line[len] = '\0';

  /* Each kind of bad field, named with its text. */
  static const struct {
    const char *label, *i3, *c7, *tail, *why;
  } bad[] = {
      {"2", "7", "", "", "label '2' is not 0 or 1"},
      {"", "7", "", "", "label '' is not 0 or 1"},
      {"01", "7", "", "", "label '01' is not 0 or 1"},
      {"0", "12x", "", "", "field I3: '12x' is not an integer"},
      {"0", "-", "", "", "field I3: '-' is not an integer"},
      {"0", "+5", "", "", "field I3: '+5' is not an integer"},
      {"0", " 5", "", "", "field I3: ' 5' is not an integer"},
      {"0", "9223372036854775808", "", "", "field I3: '9223372036854775808' is out of range"},
      {"0", "99999999999999999999999999999999", "", "",
       "field I3: '999999999999999999999999...' is out of range"},
      {"0", "7", "zz12ab34", "", "field C7: 'zz12ab34' is not 8 hex digits"},
      {"0", "7", "0123abc", "", "field C7: '0123abc' is not 8 hex digits"},
      {"0", "7", "0123abcde", "", "field C7: '0123abcde' is not 8 hex digits"},
      {"0", "7", "", "\t", "41 fields, not 40"},
      {"0", "7", "", "\tx\ty", "42 fields, not 40"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    /* label, I1, I2, I3, I4..I13 (10), C1..C6 (6), C7, C8..C26 (19) */
    snprintf(line, sizeof line,
             "%s\t1\t2\t%s\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t%s\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t%s",
             bad[k].label, bad[k].i3, bad[k].c7, bad[k].tail);
    why[0] = '\0';
    CHECK_EQ_INT(criteo_parse_line(line, strlen(line), &ex, why, sizeof why), -1);
    CHECK_EQ_STR(why, bad[k].why);
  }
  /* The good version of that template parses. */
  snprintf(line, sizeof line, "0\t1\t2\t3%s", "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t");
  CHECK_EQ_INT(criteo_parse_line(line, strlen(line), &ex, why, sizeof why), 0);
  /* Too few fields, wherever they stop. */
  CHECK_EQ_INT(criteo_parse_line("1", 1, &ex, why, sizeof why), -1);
  CHECK_EQ_STR(why, "1 fields, not 40");
  CHECK_EQ_INT(criteo_parse_line("", 0, &ex, why, sizeof why), -1);
  CHECK_EQ_STR(why, "empty line");
  CHECK_EQ_INT(criteo_parse_line(line, strlen(line) - 1, &ex, why, sizeof why), -1);
  CHECK_EQ_STR(why, "39 fields, not 40");
  /* Every byte at every position of a categorical value: accepted exactly
   * when it is a hex digit, with the value strtoul gives. */
  for (int pos = 0; pos < 8; pos++) {
    for (int c = 1; c < 256; c++) {
      if (c == '\t' || c == '\r') continue;
      char value[9] = "09afAF5e";
      value[pos] = (char)c;
      snprintf(line, sizeof line, "0%s\t%s%s", "\t\t\t\t\t\t\t\t\t\t\t\t\t", value,
               "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t");
      int hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
      int rc = criteo_parse_line(line, strlen(line), &ex, why, sizeof why);
      CHECK_EQ_INT(rc, hex ? 0 : -1);
      if (hex && rc == 0) {
        CHECK(ex.keys[0] == criteo_feature_key(0, (uint32_t)strtoul(value, NULL, 16), 0));
      }
    }
  }
  /* Values across the 32-bit range, in either case. */
  for (uint64_t v = 0; v <= 0xffffffffULL; v += 0x01234567ULL) {
    for (int upper = 0; upper < 2; upper++) {
      snprintf(line, sizeof line, "1%s\t%08" PRIx32 "%s", "\t\t\t\t\t\t\t\t\t\t\t\t\t", (uint32_t)v,
               "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t");
      if (upper) {
        for (char *c = line; *c; c++) *c = (char)toupper((unsigned char)*c);
      }
      CHECK_EQ_INT(criteo_parse_line(line, strlen(line), &ex, why, sizeof why), 0);
      CHECK(ex.keys[0] == criteo_feature_key(0, (uint32_t)v, 0));
    }
  }
  /* why_len 0 is allowed. */
  CHECK_EQ_INT(criteo_parse_line("1", 1, &ex, NULL, 0), -1);
}

static void case_feature_keys(void) {
  sample_setup();
  /* Same (field, value): same key; another field or value: another key. */
  CHECK(criteo_feature_key(3, 0x1234, 0) == criteo_feature_key(3, 0x1234, 0));
  CHECK(criteo_feature_key(3, 0x1234, 0) != criteo_feature_key(4, 0x1234, 0));
  CHECK(criteo_feature_key(3, 0x1234, 0) != criteo_feature_key(3, 0x1235, 0));
  /* The missing key ignores value and is its field's own. */
  CHECK(criteo_feature_key(3, 7, 1) == criteo_feature_key(3, 0, 1));
  for (int a = 0; a < CRITEO_CAT_FIELDS; a++) {
    CHECK(criteo_feature_key(a, 0, 1) != criteo_feature_key(a, 0, 0));
    for (int b = a + 1; b < CRITEO_CAT_FIELDS; b++) {
      CHECK(criteo_feature_key(a, 0, 1) != criteo_feature_key(b, 0, 1));
    }
  }
  /* Missing keys differ from every present key of the sample; no key is 0. */
  for (int e = 0; e < N; e++) {
    for (int i = 0; i < CRITEO_CAT_FIELDS; i++) {
      CHECK(ref[e].keys[i] != 0);
      for (int m = 0; m < CRITEO_CAT_FIELDS; m++) {
        if (ref[e].keys[i] == criteo_feature_key(m, 0, 1)) {
          CHECK(m == i && strstr(lines[e], "\t\t") != NULL); /* only an empty field */
        }
      }
    }
  }
  /* The formula is frozen (pservers and exports depend on it); these values
   * were computed from the formula in common/criteo.c with Python. */
  CHECK(criteo_feature_key(0, 0, 0) == 0x9c5f2be1f2312688ULL);
  CHECK(criteo_feature_key(5, 0x05db9164, 0) == 0xb885803053f74de2ULL);
  CHECK(criteo_feature_key(25, 0, 1) == 0x4b6e2dbcea71d4e3ULL);
}

/* A Criteo source's data position (issue 25 item 9): trainer 1 of 2 with
 * batches of 10 reads blocks 1, 3, 5, ... of the file; step s's position
 * names the block, and the batch is exactly that block's lines. */
static void case_data_positions(void) {
  ps_error err;
  sample_setup();
  ctr_reader_options opt = {.shard_block = 10, .shard_index = 1, .shard_count = 2};
  data_source *d = NULL;
  REQUIRE(criteo_source_create(&d, SAMPLE, &opt, N, 2, 10, 3, 0, &err) == PS_ERR_OK);
  CHECK_EQ_INT(d->steps_per_epoch, 5);
  long steps[] = {0, 1, 4, 7, 3, 12};
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    long step = steps[i];
    data_position p = data_source_position(d, step);
    CHECK_EQ_INT(p.epoch, step / 5);
    CHECK_EQ_INT(p.shard, (step % 5) * 2 + 1);
    CHECK_EQ_INT(p.offset, 0);
    data_batch b;
    REQUIRE(data_source_batch(d, step, &b, &err) == PS_ERR_OK);
    CHECK_EQ_INT(b.size, 10);
    for (int e = 0; e < b.size; e++) CHECK(same(&b.examples[e], &ref[p.shard * 10 + e]));
  }
  data_source_destroy(d);
}

/* The reference parse and its counts against awk's. */
static void case_reference_counts_match_awk(void) {
  sample_setup();
  CHECK_EQ_INT(nlines, N);
  int positives = 0;
  for (int e = 0; e < N; e++) positives += ref[e].label == 1.0f;
  CHECK_EQ_INT(positives, 29);
  for (int i = 0; i < 39; i++) CHECK_EQ_INT(ref_empty[i], expect_empty[i]);
  for (int i = 0; i < 13; i++) CHECK_EQ_INT(ref_negative[i], expect_negative[i]);
}

/* The reader gives exactly the reference examples, whatever the chunk. */
static void case_reader_matches_reference(void) {
  ps_error err;
  int n = 0;
  long bad;
  ctr_reader_options opt = {0};
  sample_setup();
  int chunks[] = {1, 7, 64, 1000};
  for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
    CHECK_EQ_INT(read_all(SAMPLE, &opt, chunks[c], got, 2 * N, &n, &bad, &err), PS_ERR_OK);
    CHECK_EQ_INT(n, N);
    CHECK_EQ_INT(bad, 0);
    for (int e = 0; e < n && e < N; e++) CHECK(same(&got[e], &ref[e]));
  }
  /* Counts seen through the examples: labels, present integers, missing keys. */
  int pos = 0, present[13] = {0}, missing[26] = {0};
  for (int e = 0; e < n; e++) {
    pos += got[e].label == 1.0f;
    for (int i = 0; i < 13; i++) present[i] += got[e].dense[i] > 0.0f;
    for (int i = 0; i < 26; i++) missing[i] += got[e].keys[i] == criteo_feature_key(i, 0, 1);
  }
  CHECK_EQ_INT(pos, 29);
  for (int i = 0; i < 13; i++) CHECK_EQ_INT(present[i], expect_positive[i]);
  for (int i = 0; i < 26; i++) CHECK_EQ_INT(missing[i], expect_empty[13 + i]);
}

/* Writes the gzip'd copy of the sample (in path) and the CRLF one (in crlf_path). */
static void write_gz_and_crlf_copies(char *path, char *crlf_path, size_t len) {
  path_of("sample.tsv.gz", path, len);
  write_copy(path, 0, NULL, 1, 0);
  path_of("crlf.tsv", crlf_path, len);
  write_copy(crlf_path, 0, NULL, 0, 1);
}

/* gzip'd and CRLF copies read alike. */
static void case_gzip_and_crlf_copies_read_alike(void) {
  ps_error err;
  int n;
  long bad;
  ctr_reader_options opt = {0};
  char path[512], path2[512];
  sample_setup();
  write_gz_and_crlf_copies(path, path2, sizeof path);
  CHECK_EQ_INT(read_all(path, &opt, 64, got, 2 * N, &n, &bad, &err), PS_ERR_OK);
  CHECK_EQ_INT(n, N);
  for (int e = 0; e < n && e < N; e++) CHECK(same(&got[e], &ref[e]));
  CHECK_EQ_INT(read_all(path2, &opt, 64, got, 2 * N, &n, &bad, &err), PS_ERR_OK);
  CHECK_EQ_INT(n, N);
  for (int e = 0; e < n && e < N; e++) CHECK(same(&got[e], &ref[e]));
}

/* Sniffing: the TSV plain and gzip'd yes; a folder, an IDX file, nothing: no. */
static void case_sniff_tells_tsv_from_others(void) {
  char path[512], path2[512];
  sample_setup();
  write_gz_and_crlf_copies(path, path2, sizeof path);
  CHECK_EQ_INT(ctr_reader_sniff(SAMPLE), 1);
  CHECK_EQ_INT(ctr_reader_sniff(path), 1);
  CHECK_EQ_INT(ctr_reader_sniff(path2), 1);
  CHECK_EQ_INT(ctr_reader_sniff(dir), 0);
  path_of("missing.tsv", path2, sizeof path2);
  CHECK_EQ_INT(ctr_reader_sniff(path2), 0);
  path_of("train-images-idx3-ubyte.gz", path2, sizeof path2);
  {
    gzFile g = gzopen(path2, "wb");
    REQUIRE(g != NULL);
    unsigned char idx[16 + 4 * 784] = {0, 0, 8, 3, 0, 0, 0, 4, 0, 0, 0, 28, 0, 0, 0, 28};
    for (size_t i = 16; i < sizeof idx; i++) idx[i] = (unsigned char)(i % 11 == 0 ? '\t' : i);
    REQUIRE(gzwrite(g, idx, sizeof idx) == (int)sizeof idx);
    REQUIRE(gzclose(g) == Z_OK);
  }
  CHECK_EQ_INT(ctr_reader_sniff(path2), 0);
}

/* Missing file and folder fail at open, naming the path. */
static void case_missing_file_and_folder_fail_at_open(void) {
  ps_error err;
  ctr_reader_options opt = {0};
  char path2[512];
  sample_setup();
  path_of("missing.tsv", path2, sizeof path2);
  ctr_reader *r = NULL;
  CHECK_EQ_INT(ctr_reader_open(&r, path2, &opt, &err), PS_ERR_IO);
  CHECK(r == NULL);
  CHECK_CONTAINS(err.msg, path2);
  CHECK_EQ_INT(ctr_reader_open(&r, dir, &opt, &err), PS_ERR_IO);
  CHECK_CONTAINS(err.msg, "directory");
}

/* Line 57 made malformed four ways: refused naming file and line at the
 * call that reaches it, or with skip_bad_lines the other 99 and a count of 1. */
static void case_malformed_line_refused_or_skipped(void) {
  ps_error err;
  int n;
  long bad;
  ctr_reader_options opt = {0};
  char path[512];
  sample_setup();
  char *fields = strdup(lines[56]);
  const char *why[4] = {"39 fields, not 40", "field C7:", "label '2'", "field I3: '12x'"};
  for (int k = 0; k < 4; k++) {
    char bad_line[1024];
    if (k == 0) {
      snprintf(bad_line, sizeof bad_line, "%.*s", (int)(strrchr(fields, '\t') - fields), fields);
    } else {
      /* Rebuild the line with one field replaced. */
      int target = k == 1 ? 20 : k == 2 ? 0 : 3; /* C7, label, I3 */
      const char *repl = k == 1 ? "zz12ab34" : k == 2 ? "2" : "12x";
      char *copy = strdup(fields), *p = copy;
      bad_line[0] = '\0';
      for (int f = 0; f < CRITEO_FIELDS; f++) {
        char *tab = strchr(p, '\t');
        if (tab != NULL) *tab = '\0';
        strcat(bad_line, f == target ? repl : p);
        if (f + 1 < CRITEO_FIELDS) strcat(bad_line, "\t");
        p = tab != NULL ? tab + 1 : p + strlen(p);
      }
      free(copy);
    }
    for (int gz = 0; gz < 2; gz++) {
      snprintf(path, sizeof path, "%s/bad%d.tsv%s", dir, k, gz ? ".gz" : "");
      write_copy(path, 57, bad_line, gz, 0);
      opt.skip_bad_lines = 0;
      CHECK_EQ_INT(read_all(path, &opt, 10, got, 2 * N, &n, &bad, &err), PS_ERR_CORRUPT_DATA);
      CHECK_EQ_INT(n, 50); /* five whole calls; the sixth, short of its 10, fails */
      for (int e = 0; e < n && e < 56; e++) CHECK(same(&got[e], &ref[e]));
      char where[600];
      snprintf(where, sizeof where, "%s:57: ", path);
      CHECK_CONTAINS(err.msg, where);
      CHECK_CONTAINS(err.msg, why[k]);
      opt.skip_bad_lines = 1;
      CHECK_EQ_INT(read_all(path, &opt, 10, got, 2 * N, &n, &bad, &err), PS_ERR_OK);
      CHECK_EQ_INT(n, 99);
      CHECK_EQ_INT(bad, 1);
      for (int e = 0; e < n && e < 99; e++) CHECK(same(&got[e], &ref[e < 56 ? e : e + 1]));
    }
  }
  free(fields);
}

/* Sharding two ways in blocks of 8 partitions the examples in order. */
static void case_sharding_partitions_in_order(void) {
  ps_error err;
  sample_setup();
  ctr_reader *r;
  static ctr_example s0[N], s1[N];
  int n0, n1;
  ctr_reader_options so = {.shard_block = 8, .shard_count = 2, .shard_index = 0};
  CHECK_EQ_INT(read_all(SAMPLE, &so, 5, s0, N, &n0, NULL, &err), PS_ERR_OK);
  so.shard_index = 1;
  CHECK_EQ_INT(read_all(SAMPLE, &so, 5, s1, N, &n1, NULL, &err), PS_ERR_OK);
  CHECK_EQ_INT(n0, 52); /* blocks 0,2,...,12: 6 * 8 + 4 */
  CHECK_EQ_INT(n1, 48);
  int i0 = 0, i1 = 0;
  for (int e = 0; e < N; e++) {
    if ((e / 8) % 2 == 0) {
      CHECK(i0 < n0 && same(&s0[i0++], &ref[e]));
    } else {
      CHECK(i1 < n1 && same(&s1[i1++], &ref[e]));
    }
  }
  CHECK_EQ_INT(i0 + i1, N);
  so.shard_index = 2;
  CHECK_EQ_INT(ctr_reader_open(&r, SAMPLE, &so, &err), PS_ERR_INVALID_ARGUMENT);
}

/* Limit: the first examples of the file. */
static void case_limit_reads_first_examples(void) {
  ps_error err;
  int n;
  ctr_reader_options opt = {.limit = 10};
  sample_setup();
  CHECK_EQ_INT(read_all(SAMPLE, &opt, 3, got, 2 * N, &n, NULL, &err), PS_ERR_OK);
  CHECK_EQ_INT(n, 10);
  for (int e = 0; e < n && e < 10; e++) CHECK(same(&got[e], &ref[e]));
}

/* Rewind mid-file and at the end: the same sequence again. */
static void case_rewind_repeats_sequence(void) {
  ps_error err;
  ctr_reader *r;
  sample_setup();
  ctr_reader_options tiny = {.buffer_examples = 4};
  REQUIRE(ctr_reader_open(&r, SAMPLE, &tiny, &err) == PS_ERR_OK);
  for (int pass = 0; pass < 3; pass++) {
    int total = 0, want = pass == 1 ? 30 : N + 1, cnt;
    while (total < want) {
      int ask = want - total < 9 ? want - total : 9;
      CHECK_EQ_INT(ctr_reader_next(r, got + total, ask, &cnt, &err), PS_ERR_OK);
      if (cnt == 0) break;
      total += cnt;
    }
    CHECK_EQ_INT(total, pass == 1 ? 30 : N);
    for (int e = 0; e < total; e++) CHECK(same(&got[e], &ref[e]));
    if (pass != 1) CHECK_EQ_INT(ctr_reader_lines(r), N);
    CHECK_EQ_INT(ctr_reader_rewind(r, &err), PS_ERR_OK);
  }
  ctr_reader_close(r);
}

/* Close at any time: at once, mid-file with the producer blocked on a full
 * one-example buffer, and at the end. Must neither hang nor leak. */
static void case_close_at_any_time(void) {
  ps_error err;
  ctr_reader *r;
  sample_setup();
  for (int k = 0; k < 3; k++) {
    ctr_reader_options tiny = {.buffer_examples = 1};
    REQUIRE(ctr_reader_open(&r, SAMPLE, &tiny, &err) == PS_ERR_OK);
    int cnt;
    if (k >= 1) CHECK_EQ_INT(ctr_reader_next(r, got, 3, &cnt, &err), PS_ERR_OK);
    if (k == 2) {
      while (ctr_reader_next(r, got, 50, &cnt, &err) == PS_ERR_OK && cnt > 0) {
      }
    }
    nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL); /* the producer fills up and blocks */
    ctr_reader_close(r);
  }
}

/* A line over 65536 bytes is a bad line, as is one at the very end with no newline. */
static void case_long_line_is_bad_line(void) {
  ps_error err;
  int n;
  long bad;
  ctr_reader_options opt = {0};
  char path[512];
  sample_setup();
  size_t big = 70000;
  char *longline = malloc(big + 1);
  REQUIRE(longline != NULL);
  memset(longline, '7', big);
  longline[big] = '\0';
  for (int at = 0; at < 2; at++) {
    path_of("long.tsv", path, sizeof path);
    FILE *f = fopen(path, "w");
    REQUIRE(f != NULL);
    for (int e = 0; e < 10; e++) fprintf(f, "%s\n", lines[e]);
    fprintf(f, "%s%s", longline, at == 0 ? "\n" : "");
    if (at == 0) fprintf(f, "%s\n", lines[10]);
    REQUIRE(fclose(f) == 0);
    /* The lines before it in whole calls, then the call it leaves short fails. */
    CHECK_EQ_INT(read_all(path, &opt, 5, got, 2 * N, &n, &bad, &err), PS_ERR_CORRUPT_DATA);
    CHECK_EQ_INT(n, 10);
    CHECK_CONTAINS(err.msg, ":11: longer than 65536 bytes");
    CHECK_EQ_INT(read_all(path, &opt, 64, got, 2 * N, &n, &bad, &err), PS_ERR_CORRUPT_DATA);
    CHECK_EQ_INT(n, 0);
    CHECK_CONTAINS(err.msg, ":11: longer than 65536 bytes");
    opt.skip_bad_lines = 1;
    CHECK_EQ_INT(read_all(path, &opt, 64, got, 2 * N, &n, &bad, &err), PS_ERR_OK);
    CHECK_EQ_INT(n, at == 0 ? 11 : 10);
    CHECK_EQ_INT(bad, 1);
    if (at == 0 && n == 11) CHECK(same(&got[10], &ref[10]));
    opt.skip_bad_lines = 0;
  }
  free(longline);
}

/* A truncated gzip file is an error naming the file, after the lines before the cut. */
static void case_truncated_gzip_names_file(void) {
  ps_error err;
  int n;
  long bad;
  ctr_reader_options opt = {0};
  char path[512], path2[512];
  sample_setup();
  write_gz_and_crlf_copies(path, path2, sizeof path);
  FILE *f = fopen(path, "rb");
  REQUIRE(f != NULL);
  static unsigned char gzbytes[1 << 16];
  size_t len = fread(gzbytes, 1, sizeof gzbytes, f);
  fclose(f);
  REQUIRE(len > 100 && len < sizeof gzbytes);
  path_of("cut.tsv.gz", path2, sizeof path2);
  f = fopen(path2, "wb");
  REQUIRE(f != NULL && fwrite(gzbytes, 1, len / 2, f) == len / 2 && fclose(f) == 0);
  ps_err rc = read_all(path2, &opt, 64, got, 2 * N, &n, &bad, &err);
  CHECK(rc == PS_ERR_CORRUPT_DATA || rc == PS_ERR_IO);
  CHECK_CONTAINS(err.msg, path2);
  CHECK(n < N);
  for (int e = 0; e < n && e < N; e++) CHECK(same(&got[e], &ref[e]));
}

/* An empty file is no examples and no error. */
static void case_empty_file_no_examples(void) {
  ps_error err;
  int n;
  long bad;
  ctr_reader_options opt = {0};
  char path[512];
  sample_setup();
  path_of("empty.tsv", path, sizeof path);
  FILE *f = fopen(path, "w");
  REQUIRE(f != NULL && fclose(f) == 0);
  CHECK_EQ_INT(read_all(path, &opt, 64, got, 2 * N, &n, &bad, &err), PS_ERR_OK);
  CHECK_EQ_INT(n, 0);
}

int main(void) {
  REQUIRE(mkdtemp(dir) != NULL);
  RUN_CASE(case_reference_counts_match_awk);
  RUN_CASE(case_parse_line);
  RUN_CASE(case_feature_keys);
  RUN_CASE(case_data_positions);
  RUN_CASE(case_reader_matches_reference);
  RUN_CASE(case_gzip_and_crlf_copies_read_alike);
  RUN_CASE(case_sniff_tells_tsv_from_others);
  RUN_CASE(case_missing_file_and_folder_fail_at_open);
  RUN_CASE(case_malformed_line_refused_or_skipped);
  RUN_CASE(case_sharding_partitions_in_order);
  RUN_CASE(case_limit_reads_first_examples);
  RUN_CASE(case_rewind_repeats_sequence);
  RUN_CASE(case_close_at_any_time);
  RUN_CASE(case_long_line_is_bad_line);
  RUN_CASE(case_truncated_gzip_names_file);
  RUN_CASE(case_empty_file_no_examples);

  for (int i = 0; i < nlines; i++) free(lines[i]);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
  return check_report("test_criteo");
}
