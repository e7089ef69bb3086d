/* Data shares: disjoint, covering, reproducible from the seed, different per
 * epoch; batch gathering scales pixels to [0, 1]. */
#include <stdlib.h>

#include "tests/check.h"
#include "trainer/data/sampler.h"

enum { TOTAL = 1001, TRAINERS = 3 };

/* The 3 trainers' shares of epoch 0 (seed 7); sampler_free each. */
static void start_shares(sampler s[TRAINERS]) {
  ps_error err;
  for (int id = 0; id < TRAINERS; id++) {
    REQUIRE(sampler_init(&s[id], 7, TOTAL, id, TRAINERS, &err) == PS_ERR_OK);
    sampler_start_epoch(&s[id], 0);
  }
}

static void free_shares(sampler s[TRAINERS]) {
  for (int id = 0; id < TRAINERS; id++) sampler_free(&s[id]);
}

/* Shares of sizes 334, 334, 333 hold every sample exactly once. */
static void case_shares_disjoint_and_covering(void) {
  sampler s[TRAINERS];
  start_shares(s);
  long expected_share[TRAINERS] = {334, 334, 333};
  int seen[TOTAL] = {0};
  for (int id = 0; id < TRAINERS; id++) {
    CHECK_EQ_INT(s[id].share, expected_share[id]);
    for (long i = 0; i < s[id].share; i++) seen[s[id].order[i]]++;
  }
  int wrong = 0;
  for (int i = 0; i < TOTAL; i++) wrong += seen[i] != 1;
  CHECK_EQ_INT(wrong, 0);
  free_shares(s);
}

/* Same seed and epoch: same order; next epoch: another order; shuffled,
 * not the identity. */
static void case_order_from_seed_and_epoch(void) {
  ps_error err;
  sampler s[TRAINERS], again;
  start_shares(s);
  REQUIRE(sampler_init(&again, 7, TOTAL, 1, TRAINERS, &err) == PS_ERR_OK);
  sampler_start_epoch(&again, 0);
  int differ = 0;
  for (long i = 0; i < again.share; i++) differ += again.order[i] != s[1].order[i];
  CHECK_EQ_INT(differ, 0);
  sampler_start_epoch(&again, 1);
  differ = 0;
  for (long i = 0; i < again.share; i++) differ += again.order[i] != s[1].order[i];
  CHECK(differ > again.share / 2);
  int in_place = 0;
  for (long i = 0; i < s[0].share; i++) in_place += s[0].order[i] == i * TRAINERS;
  CHECK(in_place < 10);
  sampler_free(&again);
  free_shares(s);
}

static void case_bad_trainer_id_refused(void) {
  ps_error err;
  sampler bad;
  CHECK_EQ_INT(sampler_init(&bad, 7, 10, 3, 3, &err), PS_ERR_INVALID_ARGUMENT);
}

/* Gathering scales pixels to [0, 1] and keeps each image's label. */
static void case_gather_scales_pixels(void) {
  uint8_t pixels[3 * 4] = {0, 255, 51, 102, 1, 2, 3, 4, 255, 255, 0, 0};
  uint8_t labels[3] = {4, 9, 0};
  dataset ds = {
      .count = 3, .channels = 1, .rows = 2, .cols = 2, .pixels = pixels, .labels = labels};
  long idx[2] = {2, 0};
  float images[8];
  int32_t got_labels[2];
  sampler_gather(&ds, idx, 2, images, got_labels);
  CHECK_NEAR(images[0], 1.0, 0);
  CHECK_NEAR(images[2], 0.0, 0);
  CHECK_NEAR(images[5], 1.0, 0);
  CHECK_NEAR(images[6], 0.2, 1e-7);
  CHECK_EQ_INT(got_labels[0], 0);
  CHECK_EQ_INT(got_labels[1], 4);
}

int main(void) {
  RUN_CASE(case_shares_disjoint_and_covering);
  RUN_CASE(case_order_from_seed_and_epoch);
  RUN_CASE(case_bad_trainer_id_refused);
  RUN_CASE(case_gather_scales_pixels);
  return check_report("test_sampler");
}
