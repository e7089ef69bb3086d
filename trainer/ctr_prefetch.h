/* The next CTR training batch, read and deduplicated on a thread of its own
 * while the current one trains: it touches no table and reads the same
 * examples in the same order, so the result is the same. The thread fills a
 * second set of batch buffers, which then trade places with the trainer's.
 * It may cross an epoch's end (rewinding the reader first), so pserver mode
 * knows the keys of the next step when it pushes this one. One caller
 * thread; the reader is the thread's while a batch is asked for. */
#ifndef PSTRAIN_TRAINER_CTR_PREFETCH_H
#define PSTRAIN_TRAINER_CTR_PREFETCH_H

#include <pthread.h>

#include "trainer/ctr_train.h"

typedef enum { CTR_PF_IDLE, CTR_PF_WORK, CTR_PF_DONE, CTR_PF_QUIT } ctr_prefetch_state;

typedef struct ctr_prefetch {
  ctr_trainer *t;
  ctr_example *examples; /* the buffers being filled: as t's */
  uint64_t *keys;
  uint32_t *slot;
  sparse_dedup dedup;
  int want, count;       /* examples asked for, read */
  int rewind;            /* rewind the reader before reading (the next epoch) */
  ps_err rc;
  ps_error err;
  ctr_prefetch_state state;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int started;
} ctr_prefetch;

/* Deduplicates count examples' keys into keys (count, 26), slot and d. */
ps_err ctr_dedup_into(const ctr_example *examples, int count, uint64_t *keys, uint32_t *slot,
                      sparse_dedup *d, ps_error *err);

/* Allocates buffers for batches of max_batch and starts the thread. On error
 * call ctr_prefetch_stop all the same. */
ps_err ctr_prefetch_start(ctr_prefetch *p, ctr_trainer *t, int max_batch, ps_error *err);
/* Asks for the next `want` examples, after a rewind of the reader if rewind. */
void ctr_prefetch_ask(ctr_prefetch *p, int want, int rewind);
/* Whether a batch was asked for and not taken yet. */
int ctr_prefetch_pending(ctr_prefetch *p);
/* Waits for the batch asked for, leaving it in p (p->dedup, p->count). */
ps_err ctr_prefetch_wait(ctr_prefetch *p, ps_error *err);
/* Waits for it and swaps it into t's buffers; *count its examples. */
ps_err ctr_prefetch_take(ctr_prefetch *p, int *count, ps_error *err);
/* Waits for any batch asked for and drops it (the job went back). */
void ctr_prefetch_discard(ctr_prefetch *p);
/* Lets the thread finish what it was asked, stops it and frees its buffers. */
void ctr_prefetch_stop(ctr_prefetch *p);

#endif
