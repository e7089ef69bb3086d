/* float32 <-> bfloat16 / binary16, element by element and over a received
 * block's segments. Written as straight-line integer code on bit patterns
 * (memcpy in and out, no branches) so the loops vectorize with SSE2. */
#include "common/wire_dtype.h"

#include <string.h>

#include "common/wire.h"

static const char *const names[WIRE_DTYPE_COUNT] = {"f32", "bf16", "fp16"};

const char *wire_dtype_name(wire_dtype dtype) {
  return (unsigned)dtype < WIRE_DTYPE_COUNT ? names[dtype] : "unknown";
}

ps_err wire_dtype_parse(const char *name, wire_dtype *out, ps_error *err) {
  for (int i = 0; i < WIRE_DTYPE_COUNT; i++) {
    if (strcmp(name, names[i]) == 0) {
      *out = (wire_dtype)i;
      return PS_ERR_OK;
    }
  }
  return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "wire dtype '%s' is not f32, bf16 or fp16",
                      name);
}

size_t wire_dtype_size(wire_dtype dtype) { return dtype == WIRE_DTYPE_F32 ? 4 : 2; }

static inline uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* --- bfloat16: the top half of a float32 --------------------------------------- */

static inline uint16_t to_bf16(uint32_t u) {
  /* Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even;
   * a carry into the exponent is right (up to Inf for the largest). */
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  /* NaN keeps its sign and top payload, quieted so rounding cannot make it Inf. */
  uint32_t nan = (u >> 16) | 0x40u;
  uint32_t is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return (uint16_t)(is_nan ? nan : rounded);
}

uint16_t wire_f32_to_bf16(float f) { return to_bf16(bits_of(f)); }
float wire_bf16_to_f32(uint16_t h) { return float_of((uint32_t)h << 16); }

/* --- binary16 ------------------------------------------------------------------ */

/* F. Giesen's float_to_half_fast3_rtne, branch-free. */
static inline uint16_t to_fp16(uint32_t u) {
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  /* Normal results: rebias the exponent (127 -> 15) and round the 13
   * dropped bits to nearest even; 65520 and above carry into Inf. */
  uint32_t normal = (a - ((uint32_t)(127 - 15) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  /* Below 2^-14 (subnormal or zero): adding 0.5, whose ulp is 2^-24 (the
   * binary16 subnormal step), rounds to nearest even in the FPU; the sum's
   * low bits are the result. Exact inputs and a normal sum: FTZ/DAZ cannot
   * change it (a float32 denormal is 0 in binary16 either way). */
  uint32_t sub = bits_of(float_of(a) + 0.5f) - 0x3f000000u;
  uint32_t big = a >= 0x47800000u ? (a > 0x7f800000u ? 0x7e00u : 0x7c00u) : normal;
  uint32_t r = a < 0x38800000u ? sub : big;
  return (uint16_t)(r | sign);
}

/* F. Giesen's half_to_float_fast5: subnormals renormalized by one float
 * subtraction, exact. */
static inline uint32_t from_fp16(uint16_t h) {
  uint32_t o = ((uint32_t)h & 0x7fffu) << 13;
  uint32_t exp = o & 0x0f800000u;
  o += (uint32_t)(127 - 15) << 23;
  uint32_t inf_nan = o + ((uint32_t)(128 - 16) << 23);
  uint32_t sub = bits_of(float_of(o + (1u << 23)) - float_of(113u << 23));
  o = exp == 0x0f800000u ? inf_nan : exp == 0 ? sub : o;
  return o | ((uint32_t)h & 0x8000u) << 16;
}

uint16_t wire_f32_to_fp16(float f) { return to_fp16(bits_of(f)); }
float wire_fp16_to_f32(uint16_t h) { return float_of(from_fp16(h)); }

/* --- arrays ---------------------------------------------------------------------- */

void wire_dtype_encode(wire_dtype dtype, const float *src, void *dst, size_t n) {
  uint8_t *out = dst;
  if (dtype == WIRE_DTYPE_BF16) {
    for (size_t i = 0; i < n; i++) {
      uint16_t h = to_bf16(bits_of(src[i]));
      memcpy(out + 2 * i, &h, 2);
    }
  } else if (dtype == WIRE_DTYPE_FP16) {
    for (size_t i = 0; i < n; i++) {
      uint16_t h = to_fp16(bits_of(src[i]));
      memcpy(out + 2 * i, &h, 2);
    }
  } else {
    memcpy(dst, src, n * sizeof(float));
  }
}

void wire_dtype_decode(wire_dtype dtype, const void *src, float *dst, size_t n) {
  const uint8_t *in = src;
  if (dtype == WIRE_DTYPE_BF16) {
    for (size_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, in + 2 * i, 2);
      dst[i] = float_of((uint32_t)h << 16);
    }
  } else if (dtype == WIRE_DTYPE_FP16) {
    for (size_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, in + 2 * i, 2);
      dst[i] = float_of(from_fp16(h));
    }
  } else {
    memcpy(dst, src, n * sizeof(float));
  }
}

/* --- a received block ---------------------------------------------------------- */

void wire_decode_block(const rpc_message *msg, const wire_block_ref *ref, wire_dtype dtype,
                       float *dst) {
  if (dtype == WIRE_DTYPE_F32) {
    wire_copy_block(msg, ref, dst);
    return;
  }
  /* Segments may end inside an element: its first byte waits in pair0. */
  uint8_t pair0 = 0;
  int half = 0;
  size_t left = ref->len, segment = ref->segment, offset = ref->offset;
  while (left > 0) {
    const rpc_segment *s = &msg->segments[segment];
    size_t n = s->len - offset < left ? s->len - offset : left;
    const uint8_t *p = s->data + offset;
    left -= n;
    if (half && n > 0) {
      uint16_t h = (uint16_t)(pair0 | *p++ << 8);
      n--;
      *dst++ = dtype == WIRE_DTYPE_BF16 ? wire_bf16_to_f32(h) : wire_fp16_to_f32(h);
      half = 0;
    }
    wire_dtype_decode(dtype, p, dst, n / 2);
    dst += n / 2;
    if (n % 2 != 0) {
      pair0 = p[n - 1];
      half = 1;
    }
    segment++;
    offset = 0;
  }
}
