/* dense_shard_apply_sum's single pass against the three passes it replaced (sum the
 * slots, scale, optimizer_apply over the whole shard), bit for bit: every
 * optimizer, 1-4 slots in a shuffled order, shard sizes around DENSE_SHARD_CHUNK,
 * scale 1 and not 1, several steps so the optimizer state matters; and
 * dense_shard_apply_range over pieces at offsets off the chunk grid equal to
 * the whole, touching nothing outside its range. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/optimizer.h"
#include "common/rng.h"
#include "server/store/dense_shard.h"
#include "tests/check.h"

#define MAX_SLOTS 4
#define STEPS 3

/* Values over several magnitudes, so that a change in the order of the sum
 * changes the rounding. */
static float gradient(rng *r) {
  float u = (float)(rng_next(r) >> 40) / (float)(1 << 24) - 0.5f;
  static const float scales[] = {1e-6f, 1e-3f, 1.0f, 37.0f};
  return u * scales[rng_below(r, 4)];
}

typedef struct shard {
  size_t n;
  float *params, *state1, *state2, *grads;
} shard;

static void shard_make(shard *s, size_t n, rng *r) {
  s->n = n;
  s->params = malloc(n * sizeof(float));
  s->state1 = calloc(n, sizeof(float));
  s->state2 = calloc(n, sizeof(float));
  s->grads = malloc(MAX_SLOTS * n * sizeof(float));
  REQUIRE(s->params && s->state1 && s->state2 && s->grads);
  for (size_t i = 0; i < n; i++) s->params[i] = gradient(r);
}

static void shard_free(shard *s) {
  free(s->params);
  free(s->state1);
  free(s->state2);
  free(s->grads);
}

/* The three passes, as dense_shard_apply_sum did them: summed into the first slot. */
static void reference(shard *s, const optimizer_config *opt, const int *slots, int count,
                      float scale, long step) {
  float *sum = s->grads + (size_t)slots[0] * s->n;
  for (int k = 1; k < count; k++) {
    const float *g = s->grads + (size_t)slots[k] * s->n;
    for (size_t i = 0; i < s->n; i++) sum[i] += g[i];
  }
  if (scale != 1.0f) {
    for (size_t i = 0; i < s->n; i++) sum[i] *= scale;
  }
  optimizer_apply(opt, step, s->params, sum, s->state1, s->state2, s->n);
}

static int same_bits(const float *a, const float *b, size_t n) {
  return memcmp(a, b, n * sizeof(float)) == 0;
}

/* Runs STEPS steps both ways; returns 1 when every array ends bitwise equal.
 * `order` is the slots' order for the fused path, `ref_order` the reference's. */
static int compare(optimizer_kind kind, size_t n, int count, float scale, const int *order,
                   const int *ref_order) {
  optimizer_config opt = {.kind = kind, .lr = 0.01, .weight_decay = 1e-4, .momentum = 0.9,
                          .beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-8,
                          .schedule = LR_COSINE, .total_steps = 10, .min_lr = 0.001,
                          .step_size = 1, .gamma = 1};
  rng r;
  rng_seed(&r, 7, n * 16 + (size_t)count);
  shard fused, ref;
  shard_make(&fused, n, &r);
  shard_make(&ref, n, &r);
  memcpy(ref.params, fused.params, n * sizeof(float));
  dense_shard t = {.n = n, .params = fused.params, .state1 = fused.state1, .state2 = fused.state2,
             .grads = fused.grads, .slots = MAX_SLOTS};
  int equal = 1;
  for (long step = 0; step < STEPS; step++) {
    for (size_t i = 0; i < MAX_SLOTS * n; i++) fused.grads[i] = gradient(&r);
    memcpy(ref.grads, fused.grads, MAX_SLOTS * n * sizeof(float));
    dense_shard_apply_sum(&t, &opt, order, count, scale, step);
    reference(&ref, &opt, ref_order, count, scale, step);
    /* The fused pass only reads the slots. */
    for (int k = 1; k < count; k++) {
      size_t at = (size_t)ref_order[k] * n;
      CHECK(same_bits(fused.grads + at, ref.grads + at, n));
    }
  }
  equal = same_bits(fused.params, ref.params, n) && same_bits(fused.state1, ref.state1, n) &&
          same_bits(fused.state2, ref.state2, n);
  shard_free(&fused);
  shard_free(&ref);
  return equal;
}

/* A shard applied in three ranges (cut at `a` and `b`) against the whole,
 * STEPS steps; and one middle range leaves the floats outside it alone. */
static int compare_ranges(optimizer_kind kind, size_t n, size_t a, size_t b) {
  optimizer_config opt = {.kind = kind, .lr = 0.01, .momentum = 0.9, .beta1 = 0.9,
                          .beta2 = 0.999, .epsilon = 1e-8, .schedule = LR_CONSTANT};
  const int order[2] = {1, 0};
  rng r;
  rng_seed(&r, 11, n + a + b);
  shard whole, parts;
  shard_make(&whole, n, &r);
  shard_make(&parts, n, &r);
  memcpy(parts.params, whole.params, n * sizeof(float));
  dense_shard tw = {.n = n, .params = whole.params, .state1 = whole.state1, .state2 = whole.state2,
              .grads = whole.grads, .slots = MAX_SLOTS};
  dense_shard tp = {.n = n, .params = parts.params, .state1 = parts.state1, .state2 = parts.state2,
              .grads = parts.grads, .slots = MAX_SLOTS};
  for (long step = 0; step < STEPS; step++) {
    for (size_t i = 0; i < MAX_SLOTS * n; i++) whole.grads[i] = gradient(&r);
    memcpy(parts.grads, whole.grads, MAX_SLOTS * n * sizeof(float));
    dense_shard_apply_sum(&tw, &opt, order, 2, 0.5f, step);
    dense_shard_apply_range(&tp, &opt, order, 2, 0.5f, step, b, n - b); /* any order */
    dense_shard_apply_range(&tp, &opt, order, 2, 0.5f, step, 0, a);
    dense_shard_apply_range(&tp, &opt, order, 2, 0.5f, step, a, b - a);
  }
  int equal = same_bits(whole.params, parts.params, n) &&
              same_bits(whole.state1, parts.state1, n) && same_bits(whole.state2, parts.state2, n);
  float *before = malloc(n * sizeof(float));
  REQUIRE(before != NULL);
  memcpy(before, parts.params, n * sizeof(float));
  dense_shard_apply_range(&tp, &opt, order, 2, 0.5f, STEPS, a, b - a);
  equal = equal && same_bits(before, parts.params, a) &&
          same_bits(before + b, parts.params + b, n - b) &&
          !same_bits(before + a, parts.params + a, b - a);
  free(before);
  shard_free(&whole);
  shard_free(&parts);
  return equal;
}

int main(void) {
  const size_t sizes[] = {1, 5, DENSE_SHARD_CHUNK - 1, DENSE_SHARD_CHUNK, DENSE_SHARD_CHUNK + 3,
                          3 * DENSE_SHARD_CHUNK + 17};
  const int order[MAX_SLOTS] = {2, 0, 3, 1}; /* a trainer-id order that is not the slots' */
  int cases = 0;
  for (int kind = 0; kind < OPTIMIZER_KIND_COUNT; kind++) {
    for (int count = 1; count <= MAX_SLOTS; count++) {
      const float scales[] = {1.0f, 1.0f / (float)count, 0.37f};
      for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        for (int sc = 0; sc < 3; sc++) {
          if (!compare((optimizer_kind)kind, sizes[si], count, scales[sc], order, order)) {
            fprintf(stderr, "differs: %s, %d slot(s), n %zu, scale %g\n",
                    optimizer_kind_name((optimizer_kind)kind), count, sizes[si], scales[sc]);
            check_failures++;
          }
          cases++;
        }
      }
    }
  }
  CHECK_EQ_INT(cases, 3 * 4 * 6 * 3);
  /* The comparison can fail: summing the same slots in another order rounds
   * differently somewhere in 3K floats. */
  const size_t n = 3 * DENSE_SHARD_CHUNK + 17;
  for (int kind = 0; kind < OPTIMIZER_KIND_COUNT; kind++) {
    CHECK(compare_ranges((optimizer_kind)kind, n, 5, DENSE_SHARD_CHUNK + 9));
    CHECK(compare_ranges((optimizer_kind)kind, n, DENSE_SHARD_CHUNK - 1, 2 * DENSE_SHARD_CHUNK + 1));
  }
  const int reversed[MAX_SLOTS] = {1, 3, 0, 2};
  CHECK(!compare(OPTIMIZER_SGD, 3 * DENSE_SHARD_CHUNK + 17, 4, 1.0f, order, reversed));
  return check_report("test_table_fused");
}
