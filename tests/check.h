/* Assertions for pstrain's tests: each failing check prints file:line, the
 * expression and the values, and the test exits non-zero at the end (or at
 * once with REQUIRE). ctest reads only the exit status.
 *
 * A long test is a list of named cases, each a static void function run by
 * RUN_CASE(case_name): it prints "case name: ok" or how many checks failed.
 * A REQUIRE that fails inside a case ends only that case (longjmp back to
 * RUN_CASE; whatever the case allocated leaks) and the next case runs. A
 * REQUIRE on another thread or in a forked child exits that process, as
 * outside a case. */
#ifndef PSTRAIN_TESTS_CHECK_H
#define PSTRAIN_TESTS_CHECK_H

#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int check_failures = 0;
static int check_cases_run = 0, check_cases_failed = 0;
static jmp_buf *check_case_exit = NULL; /* set while a case runs */
static pthread_t check_case_thread;
static pid_t check_case_pid;

/* Whether a failed REQUIRE here may end just the running case. */
static inline int check_can_end_case(void) {
  return check_case_exit != NULL && pthread_equal(pthread_self(), check_case_thread) &&
         getpid() == check_case_pid;
}

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
      check_failures++;                                                          \
    }                                                                            \
  } while (0)

#define REQUIRE(cond)                                                            \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
      check_failures++;                                                          \
      if (check_can_end_case()) longjmp(*check_case_exit, 1);                    \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

#define CHECK_EQ_INT(a, b)                                                             \
  do {                                                                                 \
    long long check_a = (long long)(a), check_b = (long long)(b);                      \
    if (check_a != check_b) {                                                          \
      fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n", __FILE__,   \
              __LINE__, #a, #b, check_a, check_b);                                     \
      check_failures++;                                                                \
    }                                                                                  \
  } while (0)

#define CHECK_EQ_STR(a, b)                                                             \
  do {                                                                                 \
    const char *check_a = (a), *check_b = (b);                                         \
    if (check_a == NULL || check_b == NULL || strcmp(check_a, check_b) != 0) {         \
      fprintf(stderr, "%s:%d: CHECK_EQ_STR failed: %s == %s (\"%s\" vs \"%s\")\n",     \
              __FILE__, __LINE__, #a, #b, check_a ? check_a : "(null)",                \
              check_b ? check_b : "(null)");                                           \
      check_failures++;                                                                \
    }                                                                                  \
  } while (0)

/* |a - b| <= tol */
#define CHECK_NEAR(a, b, tol)                                                           \
  do {                                                                                  \
    double check_a = (double)(a), check_b = (double)(b), check_t = (double)(tol);       \
    if (!(fabs(check_a - check_b) <= check_t)) {                                        \
      fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s ~ %s (%.9g vs %.9g, tol %.3g)\n",   \
              __FILE__, __LINE__, #a, #b, check_a, check_b, check_t);                   \
      check_failures++;                                                                 \
    }                                                                                   \
  } while (0)

/* Substring test, for error messages. */
#define CHECK_CONTAINS(haystack, needle)                                                   \
  do {                                                                                     \
    const char *check_h = (haystack), *check_n = (needle);                                 \
    if (check_h == NULL || strstr(check_h, check_n) == NULL) {                             \
      fprintf(stderr, "%s:%d: CHECK_CONTAINS failed: \"%s\" does not contain \"%s\"\n",    \
              __FILE__, __LINE__, check_h ? check_h : "(null)", check_n);                  \
      check_failures++;                                                                    \
    }                                                                                      \
  } while (0)

/* Runs case_fn, a static void function, as the case named by its name less
 * the "case_" prefix. */
#define RUN_CASE(case_fn) check_run_case(#case_fn, case_fn)

/* Runs fn; 0 when a failed REQUIRE ended it early. */
static inline int check_case_completes(void (*fn)(void)) {
  jmp_buf exit_case;
  if (setjmp(exit_case) != 0) return 0;
  check_case_exit = &exit_case;
  check_case_thread = pthread_self();
  check_case_pid = getpid();
  fn();
  return 1;
}

static inline void check_run_case(const char *name, void (*fn)(void)) {
  int failures_before = check_failures;
  check_cases_run++;
  check_case_completes(fn);
  check_case_exit = NULL;
  if (strncmp(name, "case_", 5) == 0) name += 5;
  int failed = check_failures - failures_before;
  if (failed > 0) {
    check_cases_failed++;
    fprintf(stderr, "case %s: %d check(s) failed\n", name, failed);
  } else {
    fprintf(stderr, "case %s: ok\n", name);
  }
}

/* Ends a test: 0 when every check passed. */
static inline int check_report(const char *name) {
  if (check_cases_run > 0) {
    fprintf(stderr, "%s: %d case(s) run, %d failed\n", name, check_cases_run,
            check_cases_failed);
  }
  if (check_failures > 0) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, check_failures);
    return 1;
  }
  fprintf(stderr, "%s: all checks passed\n", name);
  return 0;
}

#endif
