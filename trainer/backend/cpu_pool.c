/* Worker threads for the CPU backend's layer ops (cpu_pool.h). A run bumps
 * a generation number under the lock and broadcasts; each worker runs its
 * part of the generation it woke for and counts itself done. Both sides
 * spin a little before sleeping: a step's ops follow each other within
 * microseconds, and a sleeping thread's wake-up costs tens of them (more
 * on a VM's idle vCPU). */
#define _POSIX_C_SOURCE 200809L
#include "trainer/backend/cpu_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "common/log.h"

#define POOL_MAX_THREADS 64
/* Polls before sleeping: some 50 to 100 us. */
#define POOL_SPINS 2000

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

struct cpu_pool {
  int threads;  /* parts a run may have */
  int started;  /* workers started (1 .. started - 1 are parts) */
  int tried;    /* whether the workers were started (or failed to) */
  pthread_mutex_t lock;
  pthread_mutex_t running; /* held by the run using the workers */
  pthread_cond_t wake, done;
  atomic_ulong generation;           /* written under lock, polled without */
  atomic_int finished, stop;         /* likewise */
  int parts, active;                 /* active: parts 0 .. active - 1 run now */
  void (*fn)(void *ctx, int part, int parts);
  void *ctx;
  pthread_t tid[POOL_MAX_THREADS];
  struct worker {
    cpu_pool *pool;
    int part;
  } workers[POOL_MAX_THREADS];
};

static void *worker_main(void *arg) {
  struct worker *w = arg;
  cpu_pool *p = w->pool;
  unsigned long seen = 0;
  for (;;) {
    for (int i = 0; i < POOL_SPINS && atomic_load(&p->generation) == seen && !atomic_load(&p->stop);
         i++)
      cpu_relax();
    pthread_mutex_lock(&p->lock);
    while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
      pthread_cond_wait(&p->wake, &p->lock);
    if (atomic_load(&p->stop)) {
      pthread_mutex_unlock(&p->lock);
      break;
    }
    seen = atomic_load(&p->generation);
    void (*fn)(void *, int, int) = p->fn;
    void *ctx = p->ctx;
    int parts = p->parts, active = p->active;
    pthread_mutex_unlock(&p->lock);
    if (w->part >= active) continue;
    fn(ctx, w->part, parts);
    pthread_mutex_lock(&p->lock);
    if (atomic_fetch_add(&p->finished, 1) + 1 == active - 1) pthread_cond_signal(&p->done);
    pthread_mutex_unlock(&p->lock);
  }
  return NULL;
}

cpu_pool *cpu_pool_create(int threads) {
  cpu_pool *p = calloc(1, sizeof *p);
  if (p == NULL) return NULL;
  if (threads < 1) threads = 1;
  p->threads = threads < POOL_MAX_THREADS ? threads : POOL_MAX_THREADS;
  p->started = 1;
  if (pthread_mutex_init(&p->lock, NULL) != 0) {
    free(p);
    return NULL;
  }
  if (pthread_mutex_init(&p->running, NULL) != 0) {
    pthread_mutex_destroy(&p->lock);
    free(p);
    return NULL;
  }
  if (pthread_cond_init(&p->wake, NULL) != 0 || pthread_cond_init(&p->done, NULL) != 0) {
    pthread_mutex_destroy(&p->running);
    pthread_mutex_destroy(&p->lock);
    free(p);
    return NULL;
  }
  return p;
}

/* Starts the workers on first use: threads inherit the caller's floating-point
 * environment (denormals flushed by main). Fewer workers where a start fails:
 * their parts then run on the caller. */
static void start_workers(cpu_pool *p) {
  p->tried = 1;
  for (int t = 1; t < p->threads; t++) {
    p->workers[t] = (struct worker){.pool = p, .part = t};
    int rc = pthread_create(&p->tid[t], NULL, worker_main, &p->workers[t]);
    if (rc != 0) {
      LOG_WARN("cpu backend: starting worker thread %d of %d failed (error %d): its share runs on "
               "the calling thread",
               t, p->threads - 1, rc);
      break;
    }
    p->started = t + 1;
  }
}

void cpu_pool_destroy(cpu_pool *p) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->lock);
  atomic_store(&p->stop, 1);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock);
  for (int t = 1; t < p->started; t++) pthread_join(p->tid[t], NULL);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->done);
  pthread_mutex_destroy(&p->lock);
  pthread_mutex_destroy(&p->running);
  free(p);
}

int cpu_pool_threads(const cpu_pool *p) { return p->threads; }

void cpu_pool_run(cpu_pool *p, int parts, void (*fn)(void *ctx, int part, int parts), void *ctx) {
  if (parts > p->threads) parts = p->threads;
  if (parts <= 1) {
    fn(ctx, 0, 1);
    return;
  }
  /* A run already using the workers (another thread's): this one's parts
   * run here in turn, with the same results. */
  if (pthread_mutex_trylock(&p->running) != 0) {
    for (int part = 0; part < parts; part++) fn(ctx, part, parts);
    return;
  }
  if (!p->tried) start_workers(p);
  int on_workers = parts < p->started ? parts : p->started; /* parts 1 .. on_workers - 1 */
  if (on_workers > 1) {
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->ctx = ctx;
    p->parts = parts;
    p->active = on_workers;
    atomic_store(&p->finished, 0);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
  }
  fn(ctx, 0, parts);
  for (int part = on_workers; part < parts; part++) fn(ctx, part, parts);
  if (on_workers > 1) {
    for (int i = 0; i < POOL_SPINS && atomic_load(&p->finished) < on_workers - 1; i++) cpu_relax();
    pthread_mutex_lock(&p->lock);
    while (atomic_load(&p->finished) < on_workers - 1) pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
  }
  pthread_mutex_unlock(&p->running);
}

void cpu_pool_range(size_t n, int part, int parts, size_t *begin, size_t *end) {
  size_t base = n / (size_t)parts, extra = n % (size_t)parts, p = (size_t)part;
  *begin = p * base + (p < extra ? p : extra);
  *end = *begin + base + (p < extra ? 1 : 0);
}
