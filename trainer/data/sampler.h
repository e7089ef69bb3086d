/* Which samples a trainer reads, and in what order: each epoch every trainer
 * computes the same permutation of the data from the seed and takes a
 * disjoint strided share of it (trainer id, id + n, id + 2n, ...). Also
 * gathers a mini-batch of those samples into float inputs: in [0, 1], or
 * normalized per channel where the dataset says so. */
#ifndef PSTRAIN_TRAINER_SAMPLER_H
#define PSTRAIN_TRAINER_SAMPLER_H

#include <stdint.h>

#include "common/error.h"
#include "trainer/data/idx.h"

typedef struct sampler {
  uint64_t seed;
  long total;  /* samples in the data set */
  int id, trainers;
  long share;  /* samples this trainer reads per epoch */
  long *perm;  /* (total) scratch, owned */
  long *order; /* (share) this epoch's sample indices, owned */
} sampler;

ps_err sampler_init(sampler *s, uint64_t seed, long total, int id, int trainers, ps_error *err);
void sampler_free(sampler *s);

/* Fills s->order with this trainer's share of epoch `epoch`'s permutation. */
void sampler_start_epoch(sampler *s, long epoch);

/* Copies samples indices[0..count-1] of ds into images (count,
 * channels*rows*cols), scaled to [0, 1] or, when ds->normalized, to
 * (p/255 - mean[c]) / std[c], and labels (count). */
void sampler_gather(const dataset *ds, const long *indices, int count, float *images,
                    int32_t *labels);

#endif
