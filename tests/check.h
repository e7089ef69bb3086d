/* Assertions for pstrain's tests: each failing check prints file:line, the
 * expression and the values, and the test exits non-zero at the end (or at
 * once with REQUIRE). ctest reads only the exit status. */
#ifndef PSTRAIN_TESTS_CHECK_H
#define PSTRAIN_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures = 0;

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

/* Ends a test: 0 when every check passed. */
static inline int check_report(const char *name) {
  if (check_failures > 0) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, check_failures);
    return 1;
  }
  fprintf(stderr, "%s: all checks passed\n", name);
  return 0;
}

#endif
