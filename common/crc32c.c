/* CRC-32C: the SSE4.2 crc32 instruction where the CPU has it (about 20x the
 * table: checksums were 18% of a pserver's time with --checkpoint-every
 * 20), else a table, a byte at a time. */
#include "common/crc32c.h"

#include <pthread.h>
#include <string.h>

static uint32_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_table(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    table[i] = c;
  }
}

uint32_t crc32c_update_portable(uint32_t crc, const void *data, size_t len) {
  pthread_once(&table_once, build_table);
  const uint8_t *p = data;
  crc = ~crc;
  for (size_t i = 0; i < len; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* Binaries are built for any x86-64 (no -march), so the instruction is
 * enabled for this function alone and chosen at run time. */
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *data,
                                                              size_t len) {
  const uint8_t *p = data;
  uint64_t c = ~crc;
  for (; len > 0 && ((uintptr_t)p & 7) != 0; len--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
  for (; len >= 8; len -= 8, p += 8) {
    uint64_t word;
    memcpy(&word, p, sizeof word);
    c = __builtin_ia32_crc32di(c, word);
  }
  for (; len > 0; len--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
  return ~(uint32_t)c;
}

uint32_t crc32c_update(uint32_t crc, const void *data, size_t len) {
  if (__builtin_cpu_supports("sse4.2")) return crc32c_sse42(crc, data, len);
  return crc32c_update_portable(crc, data, len);
}
#else
uint32_t crc32c_update(uint32_t crc, const void *data, size_t len) {
  return crc32c_update_portable(crc, data, len);
}
#endif
