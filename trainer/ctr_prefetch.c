/* The CTR batch prefetch thread (see ctr_prefetch.h). */
#define _POSIX_C_SOURCE 200809L
#include "trainer/ctr_prefetch.h"

#include <stdlib.h>
#include <string.h>

#define FIELDS CRITEO_CAT_FIELDS

ps_err ctr_dedup_into(const ctr_example *examples, int count, uint64_t *keys, uint32_t *slot,
                      sparse_dedup *d, ps_error *err) {
  for (int i = 0; i < count; i++) {
    memcpy(keys + (size_t)i * FIELDS, examples[i].keys, sizeof examples[i].keys);
  }
  return sparse_dedup_run(d, keys, (size_t)count * FIELDS, slot, err);
}

static void *prefetch_main(void *arg) {
  ctr_prefetch *p = arg;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (p->state == CTR_PF_IDLE || p->state == CTR_PF_DONE) pthread_cond_wait(&p->cv, &p->mu);
    if (p->state == CTR_PF_QUIT) break;
    pthread_mutex_unlock(&p->mu);
    int count = 0;
    ps_err rc = p->rewind ? ctr_reader_rewind(p->t->train, &p->err) : PS_ERR_OK;
    if (rc == PS_ERR_OK) rc = ctr_reader_next(p->t->train, p->examples, p->want, &count, &p->err);
    if (rc == PS_ERR_OK && count > 0) {
      rc = ctr_dedup_into(p->examples, count, p->keys, p->slot, &p->dedup, &p->err);
    }
    pthread_mutex_lock(&p->mu);
    p->count = count;
    p->rc = rc;
    p->state = CTR_PF_DONE;
    pthread_cond_broadcast(&p->cv);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

ps_err ctr_prefetch_start(ctr_prefetch *p, ctr_trainer *t, int max_batch, ps_error *err) {
  memset(p, 0, sizeof *p);
  p->t = t;
  sparse_dedup_init(&p->dedup);
  size_t keys = (size_t)max_batch * FIELDS;
  p->examples = calloc((size_t)max_batch, sizeof *p->examples);
  p->keys = calloc(keys, sizeof *p->keys);
  p->slot = calloc(keys, sizeof *p->slot);
  if (p->examples == NULL || p->keys == NULL || p->slot == NULL) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory for batches of %d", max_batch);
  }
  int e = pthread_mutex_init(&p->mu, NULL);
  if (e == 0 && (e = pthread_cond_init(&p->cv, NULL)) != 0) pthread_mutex_destroy(&p->mu);
  if (e == 0 && (e = pthread_create(&p->thread, NULL, prefetch_main, p)) != 0) {
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
  }
  if (e != 0) {
    return ps_error_set(err, PS_ERR_INTERNAL, "starting the batch prefetch thread: %s", strerror(e));
  }
  p->started = 1;
  return PS_ERR_OK;
}

void ctr_prefetch_ask(ctr_prefetch *p, int want, int rewind) {
  pthread_mutex_lock(&p->mu);
  p->want = want;
  p->rewind = rewind;
  p->state = CTR_PF_WORK;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

int ctr_prefetch_pending(ctr_prefetch *p) {
  if (!p->started) return 0;
  pthread_mutex_lock(&p->mu);
  int pending = p->state != CTR_PF_IDLE;
  pthread_mutex_unlock(&p->mu);
  return pending;
}

ps_err ctr_prefetch_wait(ctr_prefetch *p, ps_error *err) {
  pthread_mutex_lock(&p->mu);
  while (p->state == CTR_PF_WORK) pthread_cond_wait(&p->cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
  if (p->rc != PS_ERR_OK) {
    *err = p->err;
    return p->rc;
  }
  return PS_ERR_OK;
}

ps_err ctr_prefetch_take(ctr_prefetch *p, int *count, ps_error *err) {
  ps_err rc = ctr_prefetch_wait(p, err);
  pthread_mutex_lock(&p->mu);
  p->state = CTR_PF_IDLE;
  pthread_mutex_unlock(&p->mu);
  if (rc != PS_ERR_OK) return rc;
  ctr_trainer *t = p->t;
  ctr_example *examples = t->examples;
  uint64_t *keys = t->keys;
  uint32_t *slot = t->slot;
  sparse_dedup dedup = t->dedup;
  t->examples = p->examples;
  t->keys = p->keys;
  t->slot = p->slot;
  t->dedup = p->dedup;
  p->examples = examples;
  p->keys = keys;
  p->slot = slot;
  p->dedup = dedup;
  *count = p->count;
  return PS_ERR_OK;
}

void ctr_prefetch_discard(ctr_prefetch *p) {
  if (!p->started) return;
  pthread_mutex_lock(&p->mu);
  while (p->state == CTR_PF_WORK) pthread_cond_wait(&p->cv, &p->mu);
  p->state = CTR_PF_IDLE;
  pthread_mutex_unlock(&p->mu);
}

void ctr_prefetch_stop(ctr_prefetch *p) {
  if (p->started) {
    pthread_mutex_lock(&p->mu);
    while (p->state == CTR_PF_WORK) pthread_cond_wait(&p->cv, &p->mu);
    p->state = CTR_PF_QUIT;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
  }
  sparse_dedup_free(&p->dedup);
  free(p->examples);
  free(p->keys);
  free(p->slot);
  memset(p, 0, sizeof *p);
}
