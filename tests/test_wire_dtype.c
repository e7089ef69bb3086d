/* The wire dtype conversions, bit for bit: round to nearest even (ties both
 * ways), NaN and Inf, denormals, binary16 overflow and gradual underflow,
 * the round trip of every representable value, the array (vectorized) loops
 * equal to the one-element functions and to GCC's own _Float16 conversion,
 * and a block split across segments at odd byte offsets. */
#include <stdint.h>
#include <string.h>

#include "common/wire.h"
#include "common/wire_dtype.h"
#include "tests/check.h"

static float f_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint32_t u_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static int is_nan32(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

#define CHECK_BITS(got, want)                                                                      \
  do {                                                                                             \
    unsigned long check_g = (unsigned long)(got), check_w = (unsigned long)(want);                 \
    if (check_g != check_w) {                                                                      \
      fprintf(stderr, "%s:%d: %s is %#lx, want %#lx\n", __FILE__, __LINE__, #got, check_g,         \
              check_w);                                                                            \
      check_failures++;                                                                            \
    }                                                                                              \
  } while (0)

/* Encodes through the one-element function and the array loop, which must agree. */
static uint16_t enc(wire_dtype d, uint32_t u) {
  float src[1] = {f_of(u)};
  uint16_t arr;
  wire_dtype_encode(d, src, &arr, 1);
  uint16_t one = d == WIRE_DTYPE_BF16 ? wire_f32_to_bf16(src[0]) : wire_f32_to_fp16(src[0]);
  CHECK_BITS(arr, one);
  return one;
}

static uint32_t dec(wire_dtype d, uint16_t h) {
  float arr;
  wire_dtype_decode(d, &h, &arr, 1);
  float one = d == WIRE_DTYPE_BF16 ? wire_bf16_to_f32(h) : wire_fp16_to_f32(h);
  CHECK_BITS(u_of(arr), u_of(one));
  return u_of(one);
}

static void check_bf16(void) {
  const wire_dtype B = WIRE_DTYPE_BF16;
  CHECK_BITS(enc(B, 0x3f800000u), 0x3f80);  /* 1.0 */
  CHECK_BITS(enc(B, 0x3f807fffu), 0x3f80);  /* below the tie */
  CHECK_BITS(enc(B, 0x3f808000u), 0x3f80);  /* tie, even stays */
  CHECK_BITS(enc(B, 0x3f818000u), 0x3f82);  /* tie, odd rounds up */
  CHECK_BITS(enc(B, 0x3f808001u), 0x3f81);  /* above the tie */
  CHECK_BITS(enc(B, 0xbf818000u), 0xbf82);  /* negative: by magnitude */
  CHECK_BITS(enc(B, 0x80000000u), 0x8000);  /* -0 */
  CHECK_BITS(enc(B, 0x7f7fffffu), 0x7f80);  /* FLT_MAX rounds to Inf */
  CHECK_BITS(enc(B, 0x7f7f7fffu), 0x7f7f);  /* the largest that does not */
  CHECK_BITS(enc(B, 0x7f800000u), 0x7f80);  /* Inf */
  CHECK_BITS(enc(B, 0xff800000u), 0xff80);  /* -Inf */
  CHECK_BITS(enc(B, 0x7fc00000u), 0x7fc0);  /* quiet NaN */
  CHECK_BITS(enc(B, 0x7f800001u), 0x7fc0);  /* NaN with a low payload: not Inf */
  CHECK_BITS(enc(B, 0xffffffffu), 0xffff);  /* NaN, all ones, sign kept */
  CHECK_BITS(enc(B, 0x00000001u), 0x0000);  /* denormals round like the rest */
  CHECK_BITS(enc(B, 0x00008000u), 0x0000);  /* tie to even */
  CHECK_BITS(enc(B, 0x00018000u), 0x0002);
  CHECK_BITS(enc(B, 0x807fffffu), 0x8080);  /* largest denormal to the smallest normal */
  CHECK_BITS(dec(B, 0x3f80), 0x3f800000u);
  CHECK_BITS(dec(B, 0x0001), 0x00010000u);  /* a denormal, exactly */
  CHECK_BITS(dec(B, 0xff80), 0xff800000u);
  CHECK(is_nan32(dec(B, 0x7fc1)));
  /* Every value comes back as itself; NaNs stay NaN (quieted). */
  for (uint32_t h = 0; h <= 0xffff; h++) {
    uint32_t f = dec(B, (uint16_t)h);
    CHECK_BITS(f, h << 16);
    if (is_nan32(f)) {
      CHECK(is_nan32((uint32_t)enc(B, f) << 16));
    } else if (enc(B, f) != h) {
      fprintf(stderr, "bf16 %#x does not round-trip\n", h);
      check_failures++;
    }
  }
}

static void check_fp16(void) {
  const wire_dtype H = WIRE_DTYPE_FP16;
  CHECK_BITS(enc(H, 0x3f800000u), 0x3c00);  /* 1.0 */
  CHECK_BITS(enc(H, 0xc0000000u), 0xc000);  /* -2.0 */
  CHECK_BITS(enc(H, 0x3f801000u), 0x3c00);  /* 1 + 2^-11: tie, even stays */
  CHECK_BITS(enc(H, 0x3f803000u), 0x3c02);  /* 1 + 3 * 2^-11: tie, odd rounds up */
  CHECK_BITS(enc(H, 0x3f801001u), 0x3c01);  /* above the tie */
  CHECK_BITS(enc(H, 0x477fe000u), 0x7bff);  /* 65504, the largest */
  CHECK_BITS(enc(H, 0x477fefffu), 0x7bff);  /* just below 65520 */
  CHECK_BITS(enc(H, 0x477ff000u), 0x7c00);  /* 65520: tie, overflows to Inf */
  CHECK_BITS(enc(H, 0xc77ff000u), 0xfc00);
  CHECK_BITS(enc(H, 0x501502f9u), 0x7c00);  /* 1e10 */
  CHECK_BITS(enc(H, 0x7f7fffffu), 0x7c00);  /* FLT_MAX */
  CHECK_BITS(enc(H, 0x7f800000u), 0x7c00);  /* Inf */
  CHECK_BITS(enc(H, 0xff800000u), 0xfc00);
  CHECK_BITS(enc(H, 0x7fc00000u), 0x7e00);  /* NaN */
  CHECK_BITS(enc(H, 0x7f800001u), 0x7e00);  /* NaN with a low payload: not Inf */
  CHECK_BITS(enc(H, 0xffc00001u), 0xfe00);  /* sign kept */
  CHECK_BITS(enc(H, 0x38800000u), 0x0400);  /* 2^-14, the smallest normal */
  CHECK_BITS(enc(H, 0x387fc000u), 0x03ff);  /* 1023 * 2^-24, the largest subnormal */
  CHECK_BITS(enc(H, 0x387ff000u), 0x0400);  /* 1023.5 * 2^-24: tie up to the normal */
  CHECK_BITS(enc(H, 0x33800000u), 0x0001);  /* 2^-24, the smallest subnormal */
  CHECK_BITS(enc(H, 0x33000000u), 0x0000);  /* 2^-25: tie, to even zero */
  CHECK_BITS(enc(H, 0x33000001u), 0x0001);  /* above it */
  CHECK_BITS(enc(H, 0x33c00000u), 0x0002);  /* 3 * 2^-25: tie, to even 2 */
  CHECK_BITS(enc(H, 0x3a400000u), 0x1200);  /* 3/4096 = 1.5 * 2^-11 */
  CHECK_BITS(enc(H, 0xb2800000u), 0x8000);  /* -2^-26 underflows to -0 */
  CHECK_BITS(enc(H, 0x00000001u), 0x0000);  /* float32 denormals */
  CHECK_BITS(enc(H, 0x807fffffu), 0x8000);
  CHECK_BITS(dec(H, 0x0001), 0x33800000u);
  CHECK_BITS(dec(H, 0x03ff), 0x387fc000u);
  CHECK_BITS(dec(H, 0x0400), 0x38800000u);
  CHECK_BITS(dec(H, 0x7bff), 0x477fe000u);
  CHECK_BITS(dec(H, 0x7c00), 0x7f800000u);
  CHECK_BITS(dec(H, 0xfc00), 0xff800000u);
  CHECK_BITS(dec(H, 0x8000), 0x80000000u);
  CHECK_BITS(dec(H, 0x3c00), 0x3f800000u);
  CHECK(is_nan32(dec(H, 0x7e00)) && is_nan32(dec(H, 0xfc01)));
  for (uint32_t h = 0; h <= 0xffff; h++) {
    uint32_t f = dec(H, (uint16_t)h);
    int nan16 = (h & 0x7fff) > 0x7c00;
    CHECK(is_nan32(f) == nan16);
    if (nan16) {
      uint16_t back = enc(H, f);
      CHECK((back & 0x7fff) > 0x7c00);
    } else if (enc(H, f) != h) {
      fprintf(stderr, "fp16 %#x does not round-trip\n", h);
      check_failures++;
    }
  }
}

/* The array loops (vectorized) against GCC's own conversion, on random bit
 * patterns and on every float32 near binary16's boundaries. */
static void check_against_gcc(void) {
#ifdef __FLT16_MAX__
  enum { N = 1 << 20 };
  static float src[N], back[N];
  static uint16_t h[N];
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < N; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t u = (uint32_t)(s >> 32);
    /* Half of them near binary16's range, where its rounding happens. */
    if (i % 2) u = (u & 0x80000000u) | (0x33000000u + (u & 0x14ffffffu));
    src[i] = f_of(u);
  }
  wire_dtype_encode(WIRE_DTYPE_FP16, src, h, N);
  wire_dtype_decode(WIRE_DTYPE_FP16, h, back, N);
  size_t bad = 0;
  for (size_t i = 0; i < N; i++) {
    _Float16 g = (_Float16)src[i];
    uint16_t gh;
    memcpy(&gh, &g, 2);
    float gf = (float)g;
    int nan = is_nan32(u_of(src[i]));
    if ((nan && (h[i] & 0x7fff) <= 0x7c00) || (!nan && (h[i] != gh || u_of(back[i]) != u_of(gf)))) {
      if (bad++ < 5) fprintf(stderr, "%#x: %#x, gcc %#x\n", u_of(src[i]), h[i], gh);
    }
  }
  CHECK_EQ_INT(bad, 0);
#else
  fprintf(stderr, "test_wire_dtype: no _Float16 in this compiler, GCC comparison skipped\n");
#endif
}

/* A block whose elements straddle segment boundaries decodes as if whole. */
static void check_segments(void) {
  enum { COUNT = 37 };
  float src[COUNT], want[COUNT], got[COUNT + 1];
  uint8_t wire[COUNT * 2 + 3];
  for (int i = 0; i < COUNT; i++) src[i] = (float)(i - 18) * 0.37f;
  for (int d = WIRE_DTYPE_BF16; d <= WIRE_DTYPE_FP16; d++) {
    wire[0] = 0xaa; /* the block starts one byte into the first segment */
    wire_dtype_encode((wire_dtype)d, src, wire + 1, COUNT);
    wire_dtype_decode((wire_dtype)d, wire + 1, want, COUNT);
    const size_t cuts[] = {0, 4, 5, 5, 16, 31, 32, 44, 77};
    rpc_segment segs[8];
    for (int i = 0; i < 8; i++) segs[i] = (rpc_segment){wire + cuts[i], cuts[i + 1] - cuts[i]};
    rpc_message msg = {segs, 8, sizeof wire};
    wire_block_ref ref = {.id = 0, .segment = 0, .offset = 1, .len = COUNT * 2};
    got[COUNT] = 12345.0f;
    wire_decode_block(&msg, &ref, (wire_dtype)d, got);
    CHECK(memcmp(got, want, sizeof want) == 0);
    CHECK(got[COUNT] == 12345.0f); /* nothing past the block */
    for (int i = 0; i < COUNT; i++) CHECK(fabsf(got[i] - src[i]) <= fabsf(src[i]) / 128);
  }
}

static void check_names(void) {
  ps_error err;
  wire_dtype d;
  CHECK_EQ_INT(wire_dtype_parse("bf16", &d, &err), PS_ERR_OK);
  CHECK_EQ_INT(d, WIRE_DTYPE_BF16);
  CHECK_EQ_INT(wire_dtype_parse("fp16", &d, &err), PS_ERR_OK);
  CHECK_EQ_INT(d, WIRE_DTYPE_FP16);
  CHECK_EQ_INT(wire_dtype_parse("float16", &d, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "'float16' is not f32, bf16 or fp16");
  CHECK_EQ_INT(wire_dtype_size(WIRE_DTYPE_F32), 4);
  CHECK_EQ_INT(wire_dtype_size(WIRE_DTYPE_BF16), 2);
  CHECK_EQ_STR(wire_dtype_name((wire_dtype)9), "unknown");
}

int main(void) {
  check_bf16();
  check_fp16();
  check_against_gcc();
  check_segments();
  check_names();
  return check_report("test_wire_dtype");
}
