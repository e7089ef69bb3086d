/* FNV-1a over text: the hash every process computes alike for a model, a
 * job description or a rank's configuration. Not for security. */
#ifndef PSTRAIN_COMMON_HASH_H
#define PSTRAIN_COMMON_HASH_H

#include <stdint.h>

#define HASH_TEXT_START 0xcbf29ce484222325ULL

/* Continues hash h over text: hashing a text in pieces gives hash_text of
 * the whole. */
static inline uint64_t hash_text_continue(uint64_t h, const char *text) {
  for (const char *p = text; *p != '\0'; p++) {
    h ^= (unsigned char)*p;
    h *= 0x100000001b3ULL;
  }
  return h;
}

static inline uint64_t hash_text(const char *text) { return hash_text_continue(HASH_TEXT_START, text); }

#endif
