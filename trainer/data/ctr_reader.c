/* The streaming Criteo reader: a thread reads through zlib (gzip or plain),
 * splits lines itself and parses them straight into a ring of example
 * blocks; the consumer copies examples out. Memory is the ring plus the read
 * buffers, whatever the file's size. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/data/ctr_reader.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "common/log.h"

#define READ_BUF (256u << 10)    /* bytes per gzread, and zlib's own buffer */
#define MAX_LINE 65536           /* longer lines are bad lines */
#define BLOCK_EXAMPLES 1024      /* examples handed over at once */
#define DEFAULT_BUFFER (4 * BLOCK_EXAMPLES)
#define WARN_BAD_LINES 5         /* bad lines logged one by one; the rest counted */

typedef struct block {
  ctr_example *ex; /* (block_cap) */
  int n;           /* filled; written by the producer before it publishes */
} block;

struct ctr_reader {
  char *path;
  ctr_reader_options opt;
  gzFile f;          /* NULL after a failed reopen */
  char *buf;         /* (READ_BUF) the producer's line buffer */
  ctr_example *examples; /* (nblocks * block_cap) backing the ring */
  block *ring;
  int nblocks, block_cap;

  pthread_mutex_t mu;
  pthread_cond_t filled, freed;
  int count;         /* published blocks not yet released by the consumer */
  int done;          /* the producer has published its last block */
  ps_error status;   /* why it stopped: OK at the end of the file or limit */
  atomic_int stop;   /* the consumer wants the producer gone */

  /* The consumer's side (one thread). */
  pthread_t thread;
  int running;       /* a thread to join */
  int head, pos;     /* ring[head] is being read from example pos... */
  int holding;       /* ...while holding is set */

  atomic_long lines, bad;
};

/* The producer's own state for one pass over the file. */
typedef struct producer {
  ctr_reader *r;
  int tail;          /* the block being filled (free: not counted in count) */
  long line;         /* line number of the last line taken */
  long examples;     /* good examples so far, every shard */
} producer;

static int is_mine(const ctr_reader *r, long example) {
  if (r->opt.shard_count <= 1) return 1;
  long per = r->opt.shard_block > 0 ? r->opt.shard_block : 1;
  return (example / per) % r->opt.shard_count == r->opt.shard_index;
}

/* Hands the full block to the consumer and waits for a free one. 0 to go
 * on, 1 when the consumer asked the producer to stop. */
static int publish(producer *pr) {
  ctr_reader *r = pr->r;
  pthread_mutex_lock(&r->mu);
  r->count++;
  pthread_cond_signal(&r->filled);
  while (r->count == r->nblocks && !atomic_load(&r->stop)) pthread_cond_wait(&r->freed, &r->mu);
  int stop = atomic_load(&r->stop);
  pthread_mutex_unlock(&r->mu);
  if (stop) return 1; /* the next block may be the consumer's: leave the ring alone */
  pr->tail = (pr->tail + 1) % r->nblocks;
  r->ring[pr->tail].n = 0;
  return 0;
}

/* A malformed line: the end of the pass, or counted and skipped. */
static int bad_line(producer *pr, const char *why, ps_error *err) {
  ctr_reader *r = pr->r;
  if (!r->opt.skip_bad_lines) {
    ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s:%ld: %s", r->path, pr->line, why);
    return -1;
  }
  long n = atomic_fetch_add_explicit(&r->bad, 1, memory_order_relaxed) + 1;
  if (n <= WARN_BAD_LINES) {
    LOG_WARN("%s:%ld: %s (skipped%s)", r->path, pr->line, why,
             n == WARN_BAD_LINES ? "; further bad lines are only counted" : "");
  }
  return 0;
}

/* One line (without its newline). 0: go on; 1: stop (limit reached or
 * asked to); -1: a bad line ends the pass (err set). */
static int take_line(producer *pr, const char *line, size_t len, ps_error *err) {
  ctr_reader *r = pr->r;
  pr->line++;
  atomic_store_explicit(&r->lines, pr->line, memory_order_relaxed);
  block *b = &r->ring[pr->tail];
  char why[160];
  if (len > MAX_LINE) {
    snprintf(why, sizeof why, "longer than %d bytes", MAX_LINE);
    return bad_line(pr, why, err);
  }
  if (criteo_parse_line(line, len, &b->ex[b->n], why, sizeof why) != 0) {
    return bad_line(pr, why, err);
  }
  if (is_mine(r, pr->examples++) && ++b->n == r->block_cap && publish(pr) != 0) return 1;
  if (r->opt.limit > 0 && pr->examples >= r->opt.limit) return 1;
  return 0;
}

/* zlib's reason for a failed or short read. */
static ps_err read_error(ctr_reader *r, ps_error *err) {
  int zerr = Z_OK;
  const char *msg = gzerror(r->f, &zerr);
  size_t plen = strlen(r->path); /* zlib's message starts "PATH: " */
  if (strncmp(msg, r->path, plen) == 0 && strncmp(msg + plen, ": ", 2) == 0) msg += plen + 2;
  if (zerr == Z_ERRNO) {
    return ps_error_set(err, PS_ERR_IO, "reading %s: %s", r->path, strerror(errno));
  }
  return ps_error_set(err, PS_ERR_CORRUPT_DATA, "reading %s: %s%s", r->path, msg,
                      zerr == Z_BUF_ERROR ? " (truncated gzip file?)" : "");
}

/* Reads and splits the file into lines until its end, a stop, the limit or
 * an error. A line longer than MAX_LINE is found without ever holding it:
 * its bytes are dropped up to the next newline. */
static void read_lines(producer *pr, ps_error *err) {
  ctr_reader *r = pr->r;
  char *buf = r->buf;
  size_t have = 0;     /* bytes of an unfinished line at buf[0] */
  int discarding = 0;  /* inside a long bad line */
  for (;;) {
    if (atomic_load_explicit(&r->stop, memory_order_relaxed)) return;
    int got = gzread(r->f, buf + have, (unsigned)(READ_BUF - have));
    if (got < 0) {
      read_error(r, err);
      return;
    }
    if (got == 0) {
      int zerr = Z_OK;
      (void)gzerror(r->f, &zerr);
      if (zerr != Z_OK) {
        read_error(r, err);
      } else if (have > 0 && !discarding) {
        (void)take_line(pr, buf, have, err); /* a last line without a newline */
      }
      return;
    }
    size_t end = have + (size_t)got, start = 0;
    if (discarding) {
      char *nl = memchr(buf, '\n', end);
      if (nl == NULL) continue; /* have stays 0: the whole chunk is dropped */
      start = (size_t)(nl - buf) + 1;
      discarding = 0;
    }
    for (;;) {
      char *nl = memchr(buf + start, '\n', end - start);
      if (nl == NULL) break;
      int rc = take_line(pr, buf + start, (size_t)(nl - buf) - start, err);
      if (rc != 0) return;
      start = (size_t)(nl - buf) + 1;
    }
    have = end - start;
    if (have > MAX_LINE) {
      if (take_line(pr, buf + start, have, err) != 0) return; /* counted as too long */
      discarding = 1;
      have = 0;
    } else {
      memmove(buf, buf + start, have);
    }
  }
}

static void *reader_main(void *arg) {
  producer pr = {.r = arg, .tail = 0, .line = 0, .examples = 0};
  ctr_reader *r = pr.r;
  ps_error err;
  ps_error_clear(&err);
  r->ring[0].n = 0;
  read_lines(&pr, &err);
  long bad = atomic_load(&r->bad);
  if (bad > 0 && err.code == PS_ERR_OK) {
    LOG_WARN("%s: skipped %ld bad line(s) of %ld", r->path, bad, pr.line);
  }
  pthread_mutex_lock(&r->mu);
  /* The partial last block (tail is free unless the pass was stopped). */
  if (!atomic_load(&r->stop) && r->ring[pr.tail].n > 0) r->count++;
  r->status = err;
  r->done = 1;
  pthread_cond_signal(&r->filled);
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

/* Opens the file for a pass; the consumer's thread, no producer running. */
static ps_err open_file(ctr_reader *r, ps_error *err) {
  struct stat st;
  if (stat(r->path, &st) != 0) {
    return ps_error_set(err, PS_ERR_IO, "opening %s: %s", r->path, strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    return ps_error_set(err, PS_ERR_IO, "opening %s: is a directory, not a Criteo TSV file",
                        r->path);
  }
  errno = 0;
  r->f = gzopen(r->path, "rb");
  if (r->f == NULL) {
    return ps_error_set(err, PS_ERR_IO, "opening %s: %s", r->path,
                        errno != 0 ? strerror(errno) : "zlib could not allocate its state");
  }
  if (gzbuffer(r->f, READ_BUF) != 0) {
    return ps_error_set(err, PS_ERR_INTERNAL, "reading %s: zlib refused a %u-byte buffer",
                        r->path, READ_BUF);
  }
  return PS_ERR_OK;
}

/* A fresh pass: empty ring, counters at zero, the producer started. */
static ps_err start_pass(ctr_reader *r, ps_error *err) {
  r->count = 0;
  r->done = 0;
  ps_error_clear(&r->status);
  atomic_store(&r->stop, 0);
  r->head = r->pos = r->holding = 0;
  atomic_store(&r->lines, 0);
  atomic_store(&r->bad, 0);
  ps_err rc = open_file(r, err);
  if (rc == PS_ERR_OK) {
    int e = pthread_create(&r->thread, NULL, reader_main, r);
    if (e == 0) {
      r->running = 1;
      return PS_ERR_OK;
    }
    rc = ps_error_set(err, PS_ERR_INTERNAL, "starting the reader thread for %s: %s", r->path,
                      strerror(e));
  }
  r->done = 1; /* later calls report why instead of waiting forever */
  r->status = *err;
  return rc;
}

static void stop_pass(ctr_reader *r) {
  if (r->running) {
    pthread_mutex_lock(&r->mu);
    atomic_store(&r->stop, 1);
    pthread_cond_broadcast(&r->freed);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    r->running = 0;
  }
  if (r->f != NULL) {
    (void)gzclose(r->f); /* read errors were reported by the pass */
    r->f = NULL;
  }
}

ps_err ctr_reader_open(ctr_reader **out, const char *path, const ctr_reader_options *opt,
                       ps_error *err) {
  *out = NULL;
  ctr_reader_options o = {0};
  if (opt != NULL) o = *opt;
  if (o.limit < 0 || o.shard_block < 0 || o.shard_count < 0 ||
      (o.shard_count > 1 && (o.shard_index < 0 || o.shard_index >= o.shard_count))) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "reading %s: bad options (limit %ld, shard %d of %d, block %ld)", path,
                        o.limit, o.shard_index, o.shard_count, o.shard_block);
  }
  size_t want = o.buffer_examples > 0 ? o.buffer_examples : DEFAULT_BUFFER;
  int cap = want >= 2 * BLOCK_EXAMPLES ? BLOCK_EXAMPLES : (int)(want / 2 > 0 ? want / 2 : 1);
  size_t nblocks = want / (size_t)cap < 2 ? 2 : want / (size_t)cap;
  if (nblocks > 4096) nblocks = 4096; /* 1 GiB of examples is more than enough */

  ctr_reader *r = calloc(1, sizeof *r);
  if (r == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "reading %s: out of memory", path);
  r->opt = o;
  r->nblocks = (int)nblocks;
  r->block_cap = cap;
  r->path = strdup(path);
  r->buf = malloc(READ_BUF);
  r->examples = malloc(nblocks * (size_t)cap * sizeof(ctr_example));
  r->ring = calloc(nblocks, sizeof(block));
  if (r->path == NULL || r->buf == NULL || r->examples == NULL || r->ring == NULL) {
    free(r->path);
    free(r->buf);
    free(r->examples);
    free(r->ring);
    free(r);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "reading %s: out of memory for %zu examples",
                        path, nblocks * (size_t)cap);
  }
  for (size_t i = 0; i < nblocks; i++) r->ring[i].ex = r->examples + i * (size_t)cap;
  int e = pthread_mutex_init(&r->mu, NULL);
  if (e == 0 && (e = pthread_cond_init(&r->filled, NULL)) != 0) pthread_mutex_destroy(&r->mu);
  if (e == 0 && (e = pthread_cond_init(&r->freed, NULL)) != 0) {
    pthread_cond_destroy(&r->filled);
    pthread_mutex_destroy(&r->mu);
  }
  if (e != 0) {
    free(r->path);
    free(r->buf);
    free(r->examples);
    free(r->ring);
    free(r);
    return ps_error_set(err, PS_ERR_INTERNAL, "reading %s: creating the reader's lock: %s",
                        path, strerror(e));
  }
  if (start_pass(r, err) != PS_ERR_OK) {
    ctr_reader_close(r);
    return err->code;
  }
  *out = r;
  return PS_ERR_OK;
}

ps_err ctr_reader_next(ctr_reader *r, ctr_example *out, int max, int *count, ps_error *err) {
  *count = 0;
  if (max <= 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "reading %s: asked for %d examples",
                        r->path, max);
  }
  int got = 0;
  while (got < max) {
    if (!r->holding) {
      pthread_mutex_lock(&r->mu);
      while (r->count == 0 && !r->done) pthread_cond_wait(&r->filled, &r->mu);
      int empty = r->count == 0;
      ps_error status = r->status;
      pthread_mutex_unlock(&r->mu);
      if (empty) {
        /* A short count means the end of the pass, so a pass stopped by a
         * bad line fails the call it leaves short, not the next one: a
         * caller taking its epoch's last (partial) batch never asks again. */
        if (status.code != PS_ERR_OK) {
          if (err != NULL) *err = status;
          return status.code;
        }
        break;
      }
      r->holding = 1;
      r->pos = 0;
    }
    const block *b = &r->ring[r->head];
    int n = b->n - r->pos < max - got ? b->n - r->pos : max - got;
    memcpy(out + got, b->ex + r->pos, (size_t)n * sizeof *out);
    got += n;
    r->pos += n;
    if (r->pos == b->n) {
      pthread_mutex_lock(&r->mu);
      r->count--;
      pthread_cond_signal(&r->freed);
      pthread_mutex_unlock(&r->mu);
      r->head = (r->head + 1) % r->nblocks;
      r->holding = 0;
    }
  }
  *count = got;
  return PS_ERR_OK;
}

ps_err ctr_reader_rewind(ctr_reader *r, ps_error *err) {
  stop_pass(r);
  return start_pass(r, err);
}

long ctr_reader_lines(const ctr_reader *r) {
  return atomic_load_explicit(&((ctr_reader *)r)->lines, memory_order_relaxed);
}

long ctr_reader_bad_lines(const ctr_reader *r) {
  return atomic_load_explicit(&((ctr_reader *)r)->bad, memory_order_relaxed);
}

void ctr_reader_close(ctr_reader *r) {
  if (r == NULL) return;
  stop_pass(r);
  pthread_cond_destroy(&r->freed);
  pthread_cond_destroy(&r->filled);
  pthread_mutex_destroy(&r->mu);
  free(r->ring);
  free(r->examples);
  free(r->buf);
  free(r->path);
  free(r);
}

int ctr_reader_sniff(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0; /* an IDX folder, a pipe */
  gzFile f = gzopen(path, "rb");
  if (f == NULL) return 0;
  char *buf = malloc(MAX_LINE + 1);
  int got = buf != NULL ? gzread(f, buf, MAX_LINE + 1) : -1;
  (void)gzclose(f);
  int fields = 0;
  if (got > 0) {
    fields = 1;
    for (int i = 0; i < got && buf[i] != '\n'; i++) {
      unsigned char c = (unsigned char)buf[i];
      if (c == '\t') {
        fields++;
      } else if (c < 0x20 && !(c == '\r' && (i + 1 == got || buf[i + 1] == '\n'))) {
        fields = 0; /* binary: an IDX file's header holds NULs */
        break;
      }
    }
  }
  free(buf);
  return fields == CRITEO_FIELDS;
}

/* Lines of a (gzip'd) text file, the last one counted without its newline. */
ps_err ctr_reader_count_lines(const char *path, long *lines, ps_error *err) {
  gzFile f = gzopen(path, "rb");
  if (f == NULL) {
    return ps_error_set(err, PS_ERR_IO, "--data %s: cannot open: %s", path,
                        errno ? strerror(errno) : "out of memory");
  }
  gzbuffer(f, 1 << 18);
  static char buf[1 << 18];
  long n = 0;
  int last = '\n';
  for (;;) {
    int got = gzread(f, buf, sizeof buf);
    if (got < 0) {
      int code;
      const char *why = gzerror(f, &code);
      ps_error_set(err, PS_ERR_IO, "--data %s: reading: %s", path, why);
      gzclose(f);
      return err->code;
    }
    if (got == 0) break;
    for (const char *p = buf, *end = buf + got; (p = memchr(p, '\n', (size_t)(end - p))) != NULL;
         p++) {
      n++;
    }
    last = (unsigned char)buf[got - 1];
  }
  if (last != '\n') n++;
  gzclose(f);
  *lines = n;
  return PS_ERR_OK;
}
