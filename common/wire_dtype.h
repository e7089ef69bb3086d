/* The element type of dense blocks on the wire (--wire-dtype): float32, or
 * 16-bit bfloat16 / IEEE binary16 to halve the bytes. Tables, optimizer state
 * and models stay float32: only what travels is converted, and always by
 * these functions, so every process rounds the same values the same way.
 * Rounding is to nearest, ties to even; NaN stays NaN (quieted), Inf stays
 * Inf; binary16 overflows to Inf and underflows gradually. The loops use
 * integer operations (and one float add that is exact or correctly rounded
 * under the default rounding mode, unaffected by FTZ/DAZ) so GCC vectorizes
 * them without -march. */
#ifndef PSTRAIN_COMMON_WIRE_DTYPE_H
#define PSTRAIN_COMMON_WIRE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

/* Values as WireDtype in proto/pstrain.proto. */
typedef enum { WIRE_DTYPE_F32 = 0, WIRE_DTYPE_BF16 = 1, WIRE_DTYPE_FP16 = 2 } wire_dtype;
#define WIRE_DTYPE_COUNT (WIRE_DTYPE_FP16 + 1)
/* The names of wire_dtype_name, for option tables' choices. */
#define WIRE_DTYPE_CHOICES "f32|bf16|fp16"

const char *wire_dtype_name(wire_dtype dtype);
ps_err wire_dtype_parse(const char *name, wire_dtype *out, ps_error *err);
/* Bytes per element: 4 or 2. */
size_t wire_dtype_size(wire_dtype dtype);

/* One element each way (bit patterns of the 16-bit types). */
uint16_t wire_f32_to_bf16(float f);
float wire_bf16_to_f32(uint16_t h);
uint16_t wire_f32_to_fp16(float f);
float wire_fp16_to_f32(uint16_t h);

/* n elements: src float32 to dst in dtype (dst: n * wire_dtype_size bytes,
 * any alignment), and back. f32 is a copy. */
void wire_dtype_encode(wire_dtype dtype, const float *src, void *dst, size_t n);
void wire_dtype_decode(wire_dtype dtype, const void *src, float *dst, size_t n);

#endif
