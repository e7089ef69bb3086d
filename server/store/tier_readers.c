/* The disk tier's readers (tier_readers.h): one read of many rows split
 * into key ranges, each a MultiGet on a thread of its own, the caller's
 * included. */
#include "server/store/tier_readers.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tier_readers {
  row_disk *disk;
  pthread_mutex_t one; /* a read at a time: held by its caller throughout */
  pthread_mutex_t mu;  /* the read in progress, below */
  pthread_cond_t work, done;
  pthread_t *threads;
  int count, stop;
  /* The read in progress: n keys of table t in chunks of `chunk`. */
  int t;
  const uint64_t *keys;
  char *rows;
  uint8_t *found;
  size_t n, row_bytes, chunk, chunks, next, finished;
  ps_err code;
  ps_error err;
};

/* mu held: reads chunks until none is left to take. */
static void read_chunks(tier_readers *r) {
  while (r->next < r->chunks) {
    size_t at = r->next++ * r->chunk;
    size_t n = r->n - at < r->chunk ? r->n - at : r->chunk;
    int t = r->t;
    const uint64_t *keys = r->keys + at;
    char *rows = r->rows + at * r->row_bytes;
    uint8_t *found = r->found + at;
    pthread_mutex_unlock(&r->mu);
    ps_error err;
    ps_err rc = row_disk_read(r->disk, t, keys, n, rows, found, &err);
    pthread_mutex_lock(&r->mu);
    if (rc != PS_ERR_OK && r->code == PS_ERR_OK) {
      r->code = rc;
      r->err = err;
    }
    if (++r->finished == r->chunks) pthread_cond_broadcast(&r->done);
  }
}

static void *reader_main(void *arg) {
  tier_readers *r = arg;
  pthread_mutex_lock(&r->mu);
  while (!r->stop) {
    if (r->next < r->chunks) read_chunks(r);
    else pthread_cond_wait(&r->work, &r->mu);
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

ps_err tier_readers_start(tier_readers **out, row_disk *disk, int threads, ps_error *err) {
  *out = NULL;
  tier_readers *r = calloc(1, sizeof *r);
  pthread_t *ids = calloc((size_t)(threads > 0 ? threads : 1), sizeof *ids);
  if (r == NULL || ids == NULL) {
    free(r);
    free(ids);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "disk tier: out of memory for its readers");
  }
  r->disk = disk;
  r->threads = ids;
  pthread_mutex_init(&r->one, NULL);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->work, NULL);
  pthread_cond_init(&r->done, NULL);
  for (int i = 0; i < threads; i++) {
    int e = pthread_create(&r->threads[i], NULL, reader_main, r);
    if (e != 0) {
      tier_readers_stop(r);
      return ps_error_set(err, PS_ERR_INTERNAL, "disk tier: starting reader thread %d: %s", i,
                          strerror(e));
    }
    r->count++;
  }
  *out = r;
  return PS_ERR_OK;
}

void tier_readers_stop(tier_readers *r) {
  if (r == NULL) return;
  pthread_mutex_lock(&r->mu);
  r->stop = 1;
  pthread_cond_broadcast(&r->work);
  pthread_mutex_unlock(&r->mu);
  for (int i = 0; i < r->count; i++) pthread_join(r->threads[i], NULL);
  pthread_mutex_destroy(&r->one);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->work);
  pthread_cond_destroy(&r->done);
  free(r->threads);
  free(r);
}

ps_err tier_readers_read(tier_readers *r, int t, const uint64_t *keys, size_t n, void *rows,
                         size_t row_bytes, uint8_t *found, ps_error *err) {
  size_t chunks = n / TIER_READ_CHUNK_MIN;
  if (chunks > (size_t)r->count + 1) chunks = (size_t)r->count + 1;
  if (chunks <= 1) return row_disk_read(r->disk, t, keys, n, rows, found, err);
  pthread_mutex_lock(&r->one);
  pthread_mutex_lock(&r->mu);
  r->t = t;
  r->keys = keys;
  r->rows = rows;
  r->found = found;
  r->n = n;
  r->row_bytes = row_bytes;
  r->chunk = (n + chunks - 1) / chunks;
  r->chunks = (n + r->chunk - 1) / r->chunk;
  r->next = r->finished = 0;
  r->code = PS_ERR_OK;
  pthread_cond_broadcast(&r->work);
  read_chunks(r); /* the caller's share */
  while (r->finished < r->chunks) pthread_cond_wait(&r->done, &r->mu);
  ps_err code = r->code;
  if (code != PS_ERR_OK) *err = r->err;
  r->chunks = r->next = r->finished = 0;
  pthread_mutex_unlock(&r->mu);
  pthread_mutex_unlock(&r->one);
  if (code == PS_ERR_OK) ps_error_clear(err);
  return code;
}
