/* Per-epoch permutations, data shares and batch gathering. */
#include "trainer/data/sampler.h"

#include <stdlib.h>
#include <string.h>

#include "common/rng.h"

ps_err sampler_init(sampler *s, uint64_t seed, long total, int id, int trainers, ps_error *err) {
  memset(s, 0, sizeof *s);
  if (trainers < 1 || id < 0 || id >= trainers || total < 1) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "sampler: trainer %d of %d over %ld samples is not a valid share", id,
                        trainers, total);
  }
  s->seed = seed;
  s->total = total;
  s->id = id;
  s->trainers = trainers;
  s->share = (total - id + trainers - 1) / trainers;
  s->perm = malloc((size_t)total * sizeof *s->perm);
  s->order = malloc((size_t)(s->share > 0 ? s->share : 1) * sizeof *s->order);
  if (s->perm == NULL || s->order == NULL) {
    sampler_free(s);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "sampler: cannot allocate indices for %ld samples",
                        total);
  }
  return PS_ERR_OK;
}

void sampler_free(sampler *s) {
  free(s->perm);
  free(s->order);
  memset(s, 0, sizeof *s);
}

void sampler_start_epoch(sampler *s, long epoch) {
  /* Every trainer runs the same Fisher-Yates shuffle, so shares are disjoint. */
  rng r;
  rng_seed(&r, s->seed, 0x5eed0000ULL + (uint64_t)epoch);
  for (long i = 0; i < s->total; i++) s->perm[i] = i;
  for (long i = s->total - 1; i > 0; i--) {
    long j = (long)rng_below(&r, (uint64_t)i + 1);
    long t = s->perm[i];
    s->perm[i] = s->perm[j];
    s->perm[j] = t;
  }
  long k = 0;
  for (long i = s->id; i < s->total; i += s->trainers) s->order[k++] = s->perm[i];
}

/* The one place a stored pixel becomes a model input. Unnormalized images
 * keep the plain p * (1/255) so IDX runs stay bitwise what they were. */
static void gather_image(const dataset *ds, const uint8_t *src, float *dst) {
  const size_t plane = (size_t)ds->rows * (size_t)ds->cols;
  const float scale = 1.0f / 255.0f;
  if (!ds->normalized) {
    for (size_t i = 0; i < plane * (size_t)ds->channels; i++) dst[i] = (float)src[i] * scale;
    return;
  }
  for (int c = 0; c < ds->channels; c++) {
    const float mean = ds->mean[c], std = ds->std[c];
    const uint8_t *s = src + (size_t)c * plane;
    float *d = dst + (size_t)c * plane;
    for (size_t i = 0; i < plane; i++) d[i] = ((float)s[i] * scale - mean) / std;
  }
}

void sampler_gather(const dataset *ds, const long *indices, int count, float *images,
                    int32_t *labels) {
  const size_t size = dataset_image_size(ds);
  for (int b = 0; b < count; b++) {
    gather_image(ds, ds->pixels + (size_t)indices[b] * size, images + (size_t)b * size);
    labels[b] = ds->labels[indices[b]];
  }
}
