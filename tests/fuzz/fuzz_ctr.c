/* libFuzzer target: the untrusted inputs of the CTR path (issue 13). Each
 * input is used three ways; every broken invariant is an abort (a finding).
 *  1. Lines: criteo_parse_line on the whole input as one line and on each
 *     '\n'-separated line must agree with a small reference parser written
 *     here (accepts exactly the same lines; the same label, dense values and
 *     keys); a refusal says why in a NUL-terminated, non-empty string.
 *  2. Files: the input as a plain and as a gzip'd file (an input starting
 *     0xff: the rest repeated past 300 KiB, for long lines and buffer
 *     edges) through ctr_reader, with skip_bad_lines 1 and 0, a default and
 *     a one-example buffer, unsharded and (the plain file) 2-way sharded. The reader's lines
 *     are the content cut at every '\n', plus the bytes after the last '\n'
 *     when there are any; a line over MAX_LINE bytes is bad whatever it
 *     holds. With skip 1 the examples are exactly those of the good lines,
 *     in order (examples + bad lines == lines); with skip 0 the same up to
 *     the first bad line, whose error names the file and its line number;
 *     the shards' examples are the unsharded ones dealt out by block. Every
 *     reader thread is joined by ctr_reader_close.
 *  3. A checkpoint: the input as a safetensors file (safetensors_file_read)
 *     whose TABLE.keys/values/state/meta tensors (as trainer/ctr_checkpoint.c
 *     writes them) go to sparse_table_load of six table kinds. An accepted
 *     load dumps back the loaded rows in ascending key order, bit for bit;
 *     a refused one leaves the table's dump as it was (fuzz_ctr_checkpoint.c). */
#define _GNU_SOURCE /* pthread_setattr_default_np */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "common/criteo.h"
#include "common/log.h"
#include "tests/fuzz/fuzz_ctr.h"
#include "trainer/data/ctr_reader.h"

#define MAX_LINE 65536          /* trainer/data/ctr_reader.c's: longer lines are bad */
#define REPEAT_BYTES (300 << 10) /* past the reader's 256 KiB read buffer */

static char folder[256], plain_path[512], gz_path[512], ck_path[512];

/* --- 1. lines ----------------------------------------------------------------- */

typedef struct ref_line {
  int label;
  float dense[CRITEO_INT_FIELDS];
  uint32_t value[CRITEO_CAT_FIELDS];
  int missing[CRITEO_CAT_FIELDS];
} ref_line;

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* The format read literally: one '\r' may end the line; 40 tab-separated
 * fields; label "0" or "1"; integers empty or [-]digits within long long
 * (strtoll decides), as log1p(x) for x > 0; categoricals empty or 8 hex. */
static int ref_parse(const char *line, size_t len, ref_line *out) {
  if (len > 0 && line[len - 1] == '\r') len--;
  const char *field[CRITEO_FIELDS];
  size_t flen[CRITEO_FIELDS];
  int n = 0;
  for (size_t i = 0, start = 0; i <= len; i++) {
    if (i < len && line[i] != '\t') continue;
    if (n == CRITEO_FIELDS) return 0;
    field[n] = line + start;
    flen[n++] = i - start;
    start = i + 1;
  }
  if (n != CRITEO_FIELDS || flen[0] != 1 || (field[0][0] != '0' && field[0][0] != '1')) return 0;
  out->label = field[0][0] - '0';
  for (int i = 0; i < CRITEO_INT_FIELDS; i++) {
    const char *f = field[1 + i];
    size_t fl = flen[1 + i], k = fl > 0 && f[0] == '-';
    out->dense[i] = 0.0f;
    if (fl == 0) continue;
    if (k == fl) return 0;
    for (; k < fl; k++) {
      if (!is_digit(f[k])) return 0;
    }
    char *text = strndup(f, fl);
    if (text == NULL) finding("out of memory", NULL);
    errno = 0;
    long long v = strtoll(text, NULL, 10);
    int range = errno == ERANGE;
    free(text);
    if (range) return 0;
    out->dense[i] = v > 0 ? (float)log1p((double)v) : 0.0f;
  }
  for (int i = 0; i < CRITEO_CAT_FIELDS; i++) {
    const char *f = field[1 + CRITEO_INT_FIELDS + i];
    size_t fl = flen[1 + CRITEO_INT_FIELDS + i];
    out->missing[i] = fl == 0;
    out->value[i] = 0;
    if (fl == 0) continue;
    if (fl != 8) return 0;
    char text[9] = {0};
    for (int k = 0; k < 8; k++) {
      if (!is_hex(f[k])) return 0;
      text[k] = f[k];
    }
    out->value[i] = (uint32_t)strtoul(text, NULL, 16);
  }
  return 1;
}

static void check_line(const char *line, size_t len) {
  ctr_example ex;
  char why[160];
  memset(why, 0xa5, sizeof why);
  int rc = criteo_parse_line(line, len, &ex, why, sizeof why);
  ref_line ref;
  int ok = ref_parse(line, len, &ref);
  int why_ok = memchr(why, '\0', sizeof why) != NULL && why[0] != '\0';
  if (rc == 0 && !ok) finding("the parser accepted a line the reference refuses", NULL);
  if (rc != 0 && !why_ok) finding("a refused line's reason is empty or not NUL-terminated", NULL);
  if (rc != 0 && ok) finding("the parser refused a line the reference accepts", why);
  if (rc != 0) {
    /* A short buffer still gets a terminated reason (ASan sees overruns). */
    char *small = xmalloc(6);
    memset(small, 0xa5, 6);
    if (criteo_parse_line(line, len, &ex, small, 6) == 0 || memchr(small, '\0', 6) == NULL) {
      finding("a refusal into a 6-byte reason buffer", NULL);
    }
    free(small);
    return;
  }
  if ((ex.label != 0.0f && ex.label != 1.0f) || ex.label != (float)ref.label) {
    finding("the label is not the line's 0 or 1", NULL);
  }
  for (int i = 0; i < CRITEO_INT_FIELDS; i++) {
    if (!isfinite(ex.dense[i]) || ex.dense[i] < 0.0f || ex.dense[i] != ref.dense[i]) {
      finding("a dense value is not log1p of the field (or 0)", NULL);
    }
  }
  for (int i = 0; i < CRITEO_CAT_FIELDS; i++) {
    if (ex.keys[i] != criteo_feature_key(i, ref.value[i], ref.missing[i])) {
      finding("a key is not criteo_feature_key of the field", NULL);
    }
  }
}

static void check_lines(const uint8_t *data, size_t size) {
  check_line((const char *)data, size);
  for (size_t start = 0; start < size;) {
    const uint8_t *nl = memchr(data + start, '\n', size - start);
    size_t end = nl != NULL ? (size_t)(nl - data) : size;
    check_line((const char *)data + start, end - start);
    start = end + 1;
  }
}

/* --- 2. files through ctr_reader ------------------------------------------------ */

/* What the reader must give for a content, from criteo_parse_line itself. */
typedef struct expect {
  ctr_example *ex;
  long n, lines;
  long first_bad;   /* line number of the first bad line; 0: none */
  long good_before; /* examples before it */
} expect;

static void expect_line(expect *e, const char *line, size_t len) {
  char why[160];
  e->lines++;
  if (len <= MAX_LINE && criteo_parse_line(line, len, &e->ex[e->n], why, sizeof why) == 0) {
    e->n++;
  } else if (e->first_bad == 0) {
    e->first_bad = e->lines;
    e->good_before = e->n;
  }
}

static void expect_of(const uint8_t *content, size_t size, expect *e) {
  memset(e, 0, sizeof *e);
  e->ex = xmalloc((size / 40 + 1) * sizeof *e->ex); /* a good line holds 39 tabs */
  size_t start = 0;
  for (;;) {
    const uint8_t *nl = memchr(content + start, '\n', size - start);
    if (nl == NULL) break;
    expect_line(e, (const char *)content + start, (size_t)(nl - content) - start);
    start = (size_t)(nl - content) + 1;
  }
  if (start < size) expect_line(e, (const char *)content + start, size - start);
  if (e->first_bad == 0) e->good_before = e->n;
}

typedef struct pass {
  ps_error err; /* code OK: read to the end */
  ctr_example *ex;
  long n, cap, lines, bad;
  int grow;     /* the count is unknown: grow ex instead of a finding */
} pass;

/* Reads path to its end or first error, `max` examples per call; with
 * rewind, reads one batch first and starts again. */
/* Examples a pass asks of each ctr_reader_next. A pass stopped by a bad line
 * fails the first call it cannot fill: it returns the calls it filled. */
#define READ_CHUNK 7
static long filled_calls(long examples) { return examples - examples % READ_CHUNK; }

static void run_pass(const char *path, const ctr_reader_options *o, long cap, int rewind, pass *p) {
  memset(p, 0, sizeof *p);
  p->grow = cap < 0;
  p->cap = cap < 0 ? 64 : cap;
  p->ex = xmalloc((size_t)p->cap * sizeof *p->ex);
  ctr_reader *r;
  if (ctr_reader_open(&r, path, o, &p->err) != PS_ERR_OK) finding("opening a reader", p->err.msg);
  ctr_example got[READ_CHUNK];
  int count;
  if (rewind) {
    if (ctr_reader_next(r, got, READ_CHUNK, &count, &p->err) == PS_ERR_OK &&
        ctr_reader_rewind(r, &p->err) != PS_ERR_OK) {
      finding("a rewind failed", p->err.msg);
    }
    ps_error_clear(&p->err);
  }
  for (;;) {
    if (ctr_reader_next(r, got, READ_CHUNK, &count, &p->err) != PS_ERR_OK || count == 0) break;
    if (p->n + count > p->cap && p->grow) {
      p->cap *= 2;
      p->ex = realloc(p->ex, (size_t)p->cap * sizeof *p->ex);
      if (p->ex == NULL) finding("out of memory", NULL);
    }
    if (p->n + count > p->cap) finding("the reader gave more examples than there are good lines", path);
    memcpy(p->ex + p->n, got, (size_t)count * sizeof *got);
    p->n += count;
  }
  p->lines = ctr_reader_lines(r);
  p->bad = ctr_reader_bad_lines(r);
  ctr_reader_close(r);
}

/* Shard s's share of the first n expected examples, dealt by blocks; of a
 * pass that stopped at a bad line, the calls it filled. */
static void check_shard(const pass *p, const expect *e, long n, long block, int s, int stopped) {
  long want = 0;
  for (long i = 0; i < n; i++) want += (i / block) % 2 == s;
  if (stopped) want = filled_calls(want);
  if (p->n != want) finding("a shard's examples are not its blocks of the file's", NULL);
  long at = 0;
  for (long i = 0; i < n && at < want; i++) {
    if ((i / block) % 2 != s) continue;
    if (memcmp(&p->ex[at], &e->ex[i], sizeof e->ex[i]) != 0) {
      finding("a shard's examples are not its blocks of the file's", NULL);
    }
    at++;
  }
  if (at != p->n) finding("a shard got more examples than its blocks", NULL);
}

static void check_bad_line_error(const pass *p, const expect *e, const char *path) {
  char want[600];
  snprintf(want, sizeof want, "%s:%ld: ", path, e->first_bad);
  if (p->err.code != PS_ERR_CORRUPT_DATA || strncmp(p->err.msg, want, strlen(want)) != 0) {
    finding("a bad line's error does not name the file and the line", p->err.msg);
  }
}

/* Every thread a reader starts must be joined by ctr_reader_close. The
 * calls are wrapped (-Wl,--wrap in CMakeLists.txt) and counted: exact,
 * where /proc/self/task still lists a thread for a moment after its join. */
int __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg);
int __real_pthread_join(pthread_t t, void **ret);
int __wrap_pthread_join(pthread_t t, void **ret);
static atomic_long threads_started, threads_joined;

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg) {
  int rc = __real_pthread_create(t, a, f, arg);
  if (rc == 0) atomic_fetch_add(&threads_started, 1);
  return rc;
}

int __wrap_pthread_join(pthread_t t, void **ret) {
  int rc = __real_pthread_join(t, ret);
  if (rc == 0) atomic_fetch_add(&threads_joined, 1);
  return rc;
}

/* strict: the content is the file's (not a plain file that zlib decodes).
 * Sharding is the same for every format: only with `sharded` (each pass
 * costs a thread and ~1 MB of buffers, most of the time per input). */
static void check_file(const char *path, const expect *e, long block, int strict, int sharded) {
  ctr_reader_options o = {.skip_bad_lines = 1};
  pass p;
  long cap = strict ? e->n + 1 : -1;
  /* skip 1, whole file, default buffer, after a rewind */
  run_pass(path, &o, cap, 1, &p);
  if (strict && (p.err.code != PS_ERR_OK || p.n != e->n ||
                 (e->n > 0 && memcmp(p.ex, e->ex, (size_t)e->n * sizeof *e->ex) != 0))) {
    finding("skipping bad lines, the examples are not the good lines'", p.err.msg);
  }
  if (strict && (p.lines != e->lines || p.bad != e->lines - e->n)) {
    finding("skipping bad lines, examples + bad lines != lines", NULL);
  }
  if (!strict && p.err.code != PS_ERR_OK && strstr(p.err.msg, path) == NULL) {
    finding("a read error does not name the file", p.err.msg);
  }
  free(p.ex);
  long total = 0;
  for (int skip = 1; skip >= 0; skip--) {
    o = (ctr_reader_options){.skip_bad_lines = skip, .buffer_examples = 1};
    if (skip == 0) {
      /* skip 0, whole file, one-example buffer */
      run_pass(path, &o, cap, 0, &p);
      if (strict && e->first_bad == 0 && (p.err.code != PS_ERR_OK || p.n != e->n)) {
        finding("a file of good lines is refused or short", p.err.msg);
      }
      if (strict && e->first_bad != 0) {
        check_bad_line_error(&p, e, path);
        if (p.lines != e->first_bad || p.bad != 0) finding("the lines read before the error", NULL);
      }
      long want = e->first_bad != 0 ? filled_calls(e->good_before) : e->good_before;
      if (strict && (p.n != want ||
                     (p.n > 0 && memcmp(p.ex, e->ex, (size_t)p.n * sizeof *e->ex) != 0))) {
        finding("the examples before a bad line are not those of the good lines", NULL);
      }
      free(p.ex);
    }
    /* Without a bad line, skip 0 shards read as skip 1 ones did. */
    int shards = sharded && (skip == 1 || !strict || e->first_bad != 0) ? 2 : 0;
    for (int s = 0; s < shards; s++) {
      o.shard_count = 2;
      o.shard_index = s;
      o.shard_block = block;
      run_pass(path, &o, cap, 0, &p);
      if (strict && skip == 1) {
        if (p.err.code != PS_ERR_OK) finding("a shard skipping bad lines failed", p.err.msg);
        check_shard(&p, e, e->n, block, s, 0);
        total += p.n;
      } else if (strict) {
        if (e->first_bad != 0) check_bad_line_error(&p, e, path);
        if (e->first_bad == 0 && p.err.code != PS_ERR_OK) finding("a shard of good lines failed", p.err.msg);
        check_shard(&p, e, e->good_before, block, s, e->first_bad != 0);
      }
      free(p.ex);
    }
  }
  if (strict && sharded && total != e->n) finding("the shards' examples do not add up to the file's", NULL);
}

static void write_gzip(const char *path, const uint8_t *data, size_t size) {
  gzFile g = gzopen(path, "wb");
  int ok = g != NULL && (size == 0 || gzwrite(g, data, (unsigned)size) == (int)size);
  if (g == NULL || gzclose(g) != Z_OK || !ok) {
    fprintf(stderr, "fuzz_ctr: writing %s failed\n", path);
    exit(1);
  }
}

static void check_reader(const uint8_t *data, size_t size) {
  const uint8_t *content = data;
  uint8_t *repeated = NULL;
  if (size > 0 && data[0] == 0xff) {
    size_t unit = size - 1, n = 0;
    repeated = xmalloc(REPEAT_BYTES + unit);
    while (unit > 0 && n < REPEAT_BYTES) {
      memcpy(repeated + n, data + 1, unit);
      n += unit;
    }
    content = repeated;
    size = n;
  }
  expect e;
  expect_of(content, size, &e);
  long block = 1 + (long)(size % 3);
  long started = atomic_load(&threads_started), joined = atomic_load(&threads_joined);
  write_file(plain_path, content, size);
  /* zlib decodes a plain file that starts as gzip does: no exact figures then. */
  check_file(plain_path, &e, block, !(size >= 2 && content[0] == 0x1f && content[1] == 0x8b), 1);
  write_gzip(gz_path, content, size);
  check_file(gz_path, &e, block, 1, 0);
  started = atomic_load(&threads_started) - started;
  if (started == 0 || atomic_load(&threads_joined) - joined != started) {
    finding("a reader thread was not joined by ctr_reader_close", NULL);
  }
  free(e.ex);
  free(repeated);
}

/* --- libFuzzer ------------------------------------------------------------------ */

static void remove_folder(void) {
  unlink(plain_path);
  unlink(gz_path);
  unlink(ck_path);
  rmdir(folder);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  log_set_level(LOG_LEVEL_ERROR); /* skipped bad lines are warnings */
  /* Reader threads with 512 KiB stacks, not 8 MiB: ASan clears a thread's
   * stack shadow when it ends, which was most of the time per input. */
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0 || pthread_attr_setstacksize(&attr, 512 << 10) != 0 ||
      pthread_setattr_default_np(&attr) != 0) {
    fprintf(stderr, "fuzz_ctr: setting the default thread stack size failed\n");
    exit(1);
  }
  pthread_attr_destroy(&attr);
  const char *tmp = getenv("TMPDIR");
  snprintf(folder, sizeof folder, "%s/pstrain-fuzz-ctr.XXXXXX", tmp != NULL ? tmp : "/tmp");
  if (mkdtemp(folder) == NULL) {
    fprintf(stderr, "fuzz_ctr: creating %s: %s\n", folder, strerror(errno));
    exit(1);
  }
  atexit(remove_folder);
  snprintf(plain_path, sizeof plain_path, "%s/data.tsv", folder);
  snprintf(gz_path, sizeof gz_path, "%s/data.tsv.gz", folder);
  snprintf(ck_path, sizeof ck_path, "%s/ctr-step-000000007.safetensors", folder);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  check_lines(data, size);
  check_reader(data, size);
  check_checkpoint(ck_path, data, size);
  return 0;
}
