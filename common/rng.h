/* Deterministic random numbers that every process computes alike from a seed:
 * a sequential generator for permutations and a counter-based one so any
 * element of a tensor can be initialized without generating the ones before
 * it (a pserver initializes only its own blocks). Not for cryptography. */
#ifndef PSTRAIN_COMMON_RNG_H
#define PSTRAIN_COMMON_RNG_H

#include <stdint.h>

/* SplitMix64's finalizer: a bijective, well-mixed hash of a 64-bit value. */
static inline uint64_t rng_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

typedef struct rng {
  uint64_t state;
} rng;

static inline void rng_seed(rng *r, uint64_t seed, uint64_t stream) {
  r->state = rng_mix64(seed ^ rng_mix64(stream));
}

static inline uint64_t rng_next(rng *r) {
  r->state += 0x9e3779b97f4a7c15ULL;
  return rng_mix64(r->state);
}

/* Uniform integer in [0, bound), bound > 0, without modulo bias (Lemire). */
static inline uint64_t rng_below(rng *r, uint64_t bound) {
  uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    uint64_t x = rng_next(r);
    __uint128_t product = (__uint128_t)x * bound;
    if ((uint64_t)product >= threshold) return (uint64_t)(product >> 64);
  }
}

/* Uniform float in [0, 1) for element `index` of stream `stream`. */
static inline float rng_uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t x = rng_mix64(rng_mix64(seed ^ rng_mix64(stream)) + index);
  return (float)(x >> 40) * (1.0f / 16777216.0f);
}

#endif
