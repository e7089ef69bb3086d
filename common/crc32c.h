/* CRC-32C (Castagnoli), the checksum checkpoints record and verify. */
#ifndef PSTRAIN_COMMON_CRC32C_H
#define PSTRAIN_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continues crc over len bytes; start with 0. crc32c("123456789") is 0xe3069283. */
uint32_t crc32c_update(uint32_t crc, const void *data, size_t len);

/* The same with a table, whatever the CPU (what crc32c_update falls back to;
 * tests compare the two). */
uint32_t crc32c_update_portable(uint32_t crc, const void *data, size_t len);

#endif
