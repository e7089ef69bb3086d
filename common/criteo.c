/* Criteo lines to examples: one pass over the bytes, no allocation, no
 * strtok/sscanf; this runs once per line of files of billions of lines. */
#define _POSIX_C_SOURCE 200809L
#include "common/criteo.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/rng.h"

_Static_assert(CRITEO_FIELDS == 40, "label, 13 integer and 26 categorical fields");

/* The feature key. Pservers, checkpoints and exports store these keys, so
 * this formula must never change:
 *
 *   x   = 0xC7E0 << 48 | (field & 31) << 33 | missing << 32 | value
 *   key = rng_mix64(x)        (SplitMix64's finalizer, common/rng.h)
 *
 * with missing 0 or 1 and value 0 when missing. x is injective in (field,
 * missing, value) and rng_mix64 is a bijection, so distinct (field, value)
 * pairs and the 26 missing keys never collide. The tag 0xC7E0 keeps x away
 * from rng_mix64's one preimage of 0 (0x61c8864680b583eb): no key is 0. */
static inline uint64_t key_input(int field, uint32_t value, int missing) {
  uint64_t x = 0xC7E0ULL << 48 | (uint64_t)(field & 31) << 33;
  return x | (missing ? 1ULL << 32 : (uint64_t)value);
}

uint64_t criteo_feature_key(int field, uint32_t value, int missing) {
  return rng_mix64(key_input(field, value, missing));
}


#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define REP(b) (0x0101010101010101ULL * (b))
/* 8 hex digits at p (8 bytes readable) to their value, all 8 at once in one
 * 64-bit word (the table loop below was a third of the parse). Returns 0 if
 * any byte is not a hex digit. */
static int hex8(const char *p, uint32_t *value) {
  uint64_t w;
  memcpy(&w, p, 8);
  const uint64_t high = REP(0x80);
  if (w & high) return 0; /* not ASCII; below, no byte carries into the next */
  uint64_t digit = (w + REP(0x80 - '0')) & ~(w + REP(0x7f - '9'));
  uint64_t lower = w | REP(0x20);
  uint64_t alpha = (lower + REP(0x80 - 'a')) & ~(lower + REP(0x7f - 'f'));
  if (((digit | alpha) & high) != high) return 0;
  /* '0'..'9' -> 0..9; 'a'..'f' and 'A'..'F' (bit 6 set) -> 1..6 + 9 */
  uint64_t nib = (w & REP(0x0f)) + 9 * ((w >> 6) & REP(0x01));
  /* The first character is the most significant nibble: pair bytes, then
   * pack the four pairs and reverse them. */
  uint64_t t = ((nib << 4) | (nib >> 8)) & 0x00ff00ff00ff00ffULL;
  t = (t | (t >> 8)) & 0x0000ffff0000ffffULL;
  *value = __builtin_bswap32((uint32_t)(t | (t >> 16)));
  return 1;
}
#else
/* Each hex digit's value plus one; 0 for every other byte. */
static const unsigned char hex_value[256] = {
    ['0'] = 1, ['1'] = 2, ['2'] = 3, ['3'] = 4, ['4'] = 5, ['5'] = 6, ['6'] = 7,
    ['7'] = 8, ['8'] = 9, ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14,
    ['e'] = 15, ['f'] = 16, ['A'] = 11, ['B'] = 12, ['C'] = 13, ['D'] = 14, ['E'] = 15,
    ['F'] = 16,
};

static int hex8(const char *p, uint32_t *value) {
  const unsigned char *u = (const unsigned char *)p;
  uint32_t v = 0;
  unsigned bad = 0;
  for (int k = 0; k < 8; k++) {
    unsigned h = hex_value[u[k]];
    bad |= h == 0;
    v = v << 4 | ((h - 1) & 15u);
  }
  *value = v;
  return !bad;
}
#endif

/* log1p of small counts, the common case in Criteo's integer fields:
 * log1p is ~20 ns, a table load ~1. Same values as (float)log1p(x). */
#define LOG1P_TABLE 1024
static float log1p_table[LOG1P_TABLE];
static pthread_once_t log1p_once = PTHREAD_ONCE_INIT;

static void log1p_table_fill(void) {
  for (int i = 0; i < LOG1P_TABLE; i++) log1p_table[i] = (float)log1p((double)i);
}

static float feature_of(long long x) {
  if (x <= 0) return 0.0f;
  if (x < LOG1P_TABLE) return log1p_table[x];
  return (float)log1p((double)x);
}

/* "label", "I1".."I13", "C1".."C26" for field index 0..39. */
static void field_name(int i, char *buf, size_t len) {
  if (i == 0) {
    snprintf(buf, len, "label");
  } else if (i <= CRITEO_INT_FIELDS) {
    snprintf(buf, len, "I%d", i);
  } else {
    snprintf(buf, len, "C%d", i - CRITEO_INT_FIELDS);
  }
}

/* The field's text for a message, cut at 24 bytes. */
static void quote_field(const char *p, const char *end, char *buf, size_t len) {
  size_t n = 0;
  while (p + n < end && p[n] != '\t') n++;
  if (n > 24) {
    snprintf(buf, len, "%.24s...", p);
  } else {
    snprintf(buf, len, "%.*s", (int)n, p);
  }
}

/* Why a line failed. The field count comes first: a line with a missing
 * or extra tab fails some field check too, and the count is the real cause. */
static int fail(const char *line, const char *end, int field, const char *p, const char *what,
                char *why, size_t why_len) {
  int fields = 1;
  for (const char *q = line; (q = memchr(q, '\t', (size_t)(end - q))) != NULL; q++) fields++;
  if (fields != CRITEO_FIELDS) {
    if (why_len > 0) snprintf(why, why_len, "%d fields, not %d", fields, CRITEO_FIELDS);
    return -1;
  }
  char name[16], text[32];
  field_name(field, name, sizeof name);
  quote_field(p, end, text, sizeof text);
  if (why_len == 0) return -1;
  if (field == 0) {
    snprintf(why, why_len, "label '%s' is not 0 or 1", text);
  } else {
    snprintf(why, why_len, "field %s: '%s' %s", name, text, what);
  }
  return -1;
}

int criteo_parse_line(const char *line, size_t len, ctr_example *out, char *why, size_t why_len) {
  (void)pthread_once(&log1p_once, log1p_table_fill); /* cannot fail with a valid once */
  if (len > 0 && line[len - 1] == '\r') len--;
  const char *p = line, *end = line + len;
  if (len == 0) {
    if (why_len > 0) snprintf(why, why_len, "empty line");
    return -1;
  }

  /* label: exactly "0" or "1" */
  if (end - p < 2 || (p[0] != '0' && p[0] != '1') || p[1] != '\t') {
    return fail(line, end, 0, p, "", why, why_len);
  }
  out->label = (float)(p[0] - '0');
  p += 2;

  /* I1..I13: empty, or an optional '-' and decimal digits within long long */
  for (int i = 0; i < CRITEO_INT_FIELDS; i++) {
    const char *start = p;
    long long v = 0;
    if (p < end && *p != '\t') {
      int neg = *p == '-';
      if (neg) p++;
      const char *digits = p;
      while (p < end && (unsigned)(*p - '0') < 10u) {
        int d = *p - '0';
        /* Accumulated as a negative number so LLONG_MIN fits too. */
        if (v < (-0x7fffffffffffffffLL - 1 + d) / 10) {
          return fail(line, end, 1 + i, start, "is out of range", why, why_len);
        }
        v = v * 10 - d;
        p++;
      }
      if (p == digits || (p < end && *p != '\t')) {
        return fail(line, end, 1 + i, start, "is not an integer", why, why_len);
      }
      if (!neg) {
        if (v == -0x7fffffffffffffffLL - 1) {
          return fail(line, end, 1 + i, start, "is out of range", why, why_len);
        }
        v = -v;
      }
    }
    out->dense[i] = feature_of(v);
    if (p == end) return fail(line, end, 1 + i, start, "", why, why_len); /* too few */
    p++;                                                                   /* the tab */
  }

  /* C1..C26: empty (the field's missing key) or exactly 8 hex digits */
  for (int i = 0; i < CRITEO_CAT_FIELDS; i++) {
    int last = i == CRITEO_CAT_FIELDS - 1;
    if (p == end || *p == '\t') {
      out->keys[i] = key_input(i, 0, 1);
    } else {
      if (end - p < 8) return fail(line, end, 14 + i, p, "is not 8 hex digits", why, why_len);
      uint32_t value;
      int ok = hex8(p, &value);
      if (!ok || (p + 8 < end && p[8] != '\t')) {
        return fail(line, end, 14 + i, p, "is not 8 hex digits", why, why_len);
      }
      out->keys[i] = key_input(i, value, 0);
      p += 8;
    }
    if (last) {
      if (p != end) return fail(line, end, 14 + i, p, "", why, why_len); /* too many */
    } else {
      if (p == end) return fail(line, end, 14 + i, p, "", why, why_len); /* too few */
      p++;
    }
  }
  /* Hashed apart from the parse: 26 independent multiply chains overlap
   * here, where interleaved with the branches above they stalled it. */
  for (int i = 0; i < CRITEO_CAT_FIELDS; i++) out->keys[i] = rng_mix64(out->keys[i]);
  return 0;
}
