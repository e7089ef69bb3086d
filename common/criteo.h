/* Criteo display-advertising logs: one example per line,
 * label<TAB>I1..I13<TAB>C1..C26 (40 fields). Integer fields may be empty or
 * negative; categorical fields are 8 hex digits or empty. This file turns a
 * line into an example: the label, the 13 integer features as log(1 + x)
 * (0 where x <= 0 or empty) and the 26 categorical values as 64-bit feature
 * keys from (field, value), an empty value giving its field's own "missing"
 * key. The keys are what sparse tables are indexed by, in every process. */
#ifndef PSTRAIN_COMMON_CRITEO_H
#define PSTRAIN_COMMON_CRITEO_H

#include <stddef.h>
#include <stdint.h>

#define CRITEO_INT_FIELDS 13
#define CRITEO_CAT_FIELDS 26
#define CRITEO_FIELDS (1 + CRITEO_INT_FIELDS + CRITEO_CAT_FIELDS)

typedef struct ctr_example {
  float label;                       /* 0 or 1 */
  float dense[CRITEO_INT_FIELDS];    /* log(1 + x) for x > 0, else 0 */
  uint64_t keys[CRITEO_CAT_FIELDS];  /* criteo_feature_key of each field */
} ctr_example;

/* The key of categorical field `field` (0..25) holding `value` (the 32-bit
 * number the 8 hex digits spell), or the field's missing key when missing
 * is non-zero. A mixed hash: keys of different fields never collide by
 * construction of the input, and low bits are well spread for sharding. */
uint64_t criteo_feature_key(int field, uint32_t value, int missing);

/* Parses one line (without its newline; a trailing '\r' is accepted) of
 * `len` bytes. On failure returns -1 and writes why (e.g. "39 fields, not
 * 40", "field C3: 'zz12' is not 8 hex digits", "label '2' is not 0 or 1")
 * into why; out is then undefined. Returns 0 on success. */
int criteo_parse_line(const char *line, size_t len, ctr_example *out, char *why, size_t why_len);

#endif
