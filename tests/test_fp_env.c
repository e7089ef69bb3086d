/* fp_env_flush_denormals: denormal results become zero, denormal inputs read
 * as zero, and threads started afterwards inherit the mode. */
#include <float.h>
#include <pthread.h>

#include "common/fp_env.h"
#include "tests/check.h"

static volatile float tiny_in = FLT_MIN / 4; /* a denormal */
static volatile float half = 0.5f;

static void *thread_mode(void *out) {
  *(int *)out = fp_env_flushes_denormals();
  return NULL;
}

int main(void) {
  CHECK(tiny_in > 0.0f); /* denormals exist before the call */
  CHECK(FLT_MIN * half > 0.0f);
  CHECK_EQ_INT(fp_env_flushes_denormals(), 0);
  if (!fp_env_flush_denormals()) {
    fprintf(stderr, "SKIP: no flush-to-zero mode on this CPU family\n");
    return 77;
  }
  CHECK_EQ_INT(fp_env_flushes_denormals(), 1);
  CHECK(FLT_MIN * half == 0.0f);   /* FTZ: a denormal result is flushed */
  CHECK(tiny_in * 1.0f == 0.0f);   /* DAZ (aarch64 FZ): a denormal input reads as 0 */
  int inherited = -1;
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, thread_mode, &inherited) == 0);
  REQUIRE(pthread_join(th, NULL) == 0);
  CHECK_EQ_INT(inherited, 1);
  return check_report("test_fp_env");
}
