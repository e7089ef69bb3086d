/* The CPU backend's worker threads: --threads - 1 of them, started on the
 * first run that needs them and kept, so a layer op splits its work over
 * the cores without starting threads (a ResNet step runs some 200 ops). */
#ifndef PSTRAIN_TRAINER_BACKEND_CPU_POOL_H
#define PSTRAIN_TRAINER_BACKEND_CPU_POOL_H

#include <stddef.h>

typedef struct cpu_pool cpu_pool;

/* A pool for runs of up to `threads` parts (1 or less: every run is
 * inline); NULL when out of memory. */
cpu_pool *cpu_pool_create(int threads);
void cpu_pool_destroy(cpu_pool *p);

/* The most parts a run splits into. */
int cpu_pool_threads(const cpu_pool *p);

/* Runs fn(ctx, part, parts) for part in [0, parts) and returns when all have
 * returned: part 0 on the calling thread, the others on the workers (on the
 * caller in turn where a worker cannot start: the same results). parts is
 * clamped to [1, cpu_pool_threads]. A run while another thread's holds the
 * workers runs all its parts on its own thread. */
void cpu_pool_run(cpu_pool *p, int parts, void (*fn)(void *ctx, int part, int parts), void *ctx);

/* [begin, end) of part `part` of n items split into `parts` near-equal
 * ranges, the first n % parts one longer. */
void cpu_pool_range(size_t n, int part, int parts, size_t *begin, size_t *end);

#endif
