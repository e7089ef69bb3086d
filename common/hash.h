/* FNV-1a over text: the hash every process computes alike for a model, a
 * job description or a rank's configuration. Not for security. */
#ifndef PSTRAIN_COMMON_HASH_H
#define PSTRAIN_COMMON_HASH_H

#include <stdint.h>

static inline uint64_t hash_text(const char *text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char *p = text; *p != '\0'; p++) {
    h ^= (unsigned char)*p;
    h *= 0x100000001b3ULL;
  }
  return h;
}

#endif
