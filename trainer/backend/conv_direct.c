/* Direct convolution of stride-1 "same" layers (conv_direct.h). The input
 * is copied once into zero-padded planes of row length wp = w + 2 pad; the
 * output is first computed at every linear position q = oy wp + ox of such
 * a plane (positions ox >= w are discarded), so a tap (ki, kj) reads the
 * padded plane at q + ki wp + kj: contiguous vectors, no im2col. A tile is
 * 4 output channels by 24 positions, 12 AVX2 accumulators; its weights are
 * packed as [channel block][ci][tap][4] for broadcasts in stream order. */
#include "trainer/backend/conv_direct.h"

#include <assert.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CONV_DIRECT_X86 1
#include <immintrin.h>
#endif

enum { DIRECT_MR = 4, DIRECT_NV = 3, DIRECT_NR = 8 * DIRECT_NV };

/* Layers beyond these stay im2col + SGEMM. The direct path reads all the
 * weights once per image, where a GEMM over a group of images (small
 * outputs) or a big GEMM (wide layers) reads them from cache; and its
 * padded input and output of one image should stay in a core's L2 cache:
 * ResNet-18's 64-channel 32x32 layers (1.1 MiB) ran 8% slower direct
 * (scripts/bench-net-torch). */
#define DIRECT_MAX_WEIGHT_BYTES (192 * 1024)
#define DIRECT_MAX_IMAGE_BYTES (256 * 1024)

typedef struct geometry {
  int wp;              /* padded row length */
  size_t plane;        /* floats of a padded input plane */
  size_t q, qpad;      /* linear outputs, rounded up to whole tiles */
  size_t input_floats; /* the padded input, slack for the last tile's reads, rounded to 8 */
} geometry;

static geometry geometry_of(const conv_shape *s) {
  geometry g;
  g.wp = s->w + 2 * s->pad;
  g.plane = (size_t)(s->h + 2 * s->pad) * (size_t)g.wp;
  g.q = (size_t)s->h * (size_t)g.wp;
  g.qpad = (g.q + DIRECT_NR - 1) / DIRECT_NR * DIRECT_NR;
  /* The last tile reads up to qpad - 1 + (kh - 1) wp + kw - 1 of the last
   * plane, which is plane + (qpad - q) + kw - 2. */
  size_t need = (size_t)s->c * g.plane + (g.qpad - g.q) + (size_t)s->kw;
  g.input_floats = (need + 7) / 8 * 8;
  return g;
}

int conv_direct_fits(const conv_shape *s) {
#ifdef CONV_DIRECT_X86
  int same = s->stride == 1 && s->kh == s->kw && s->kh % 2 == 1 && s->kh <= 7 &&
             s->pad == s->kh / 2 && s->oh == s->h && s->ow == s->w;
  size_t weight_bytes = (size_t)s->k * s->c * s->kh * s->kw * sizeof(float);
  return same && s->k % DIRECT_MR == 0 && weight_bytes <= DIRECT_MAX_WEIGHT_BYTES &&
         conv_direct_scratch_size(s) * sizeof(float) <= DIRECT_MAX_IMAGE_BYTES &&
         __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  (void)s;
  return 0;
#endif
}

size_t conv_direct_packed_size(const conv_shape *s) {
  return (size_t)s->k * s->c * s->kh * s->kw;
}

size_t conv_direct_scratch_size(const conv_shape *s) {
  geometry g = geometry_of(s);
  return g.input_floats + (size_t)s->k * g.qpad;
}

int conv_direct_dw_fits(const conv_shape *s) {
  return conv_direct_fits(s) && (s->kw == 3 || s->kw == 5);
}

void conv_direct_pack(const conv_shape *s, const float *w, int flip, float *packed) {
  size_t taps = (size_t)s->kh * s->kw;
  for (int cb = 0; cb < s->k / DIRECT_MR; cb++)
    for (int ci = 0; ci < s->c; ci++)
      for (size_t t = 0; t < taps; t++)
        for (int m = 0; m < DIRECT_MR; m++) {
          size_t o = (size_t)cb * DIRECT_MR + m;
          size_t from = flip ? ((size_t)ci * s->k + o) * taps + taps - 1 - t
                             : (o * s->c + ci) * taps + t;
          *packed++ = w[from];
        }
}

#ifdef CONV_DIRECT_X86
/* Copies and zeroes of a few dozen floats: inline loops (the build keeps
 * GCC from turning them into memcpy and memset calls, which cost more). */
static inline void copy_span(float *restrict dst, const float *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

static inline void zero_span(float *restrict p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = 0.0f;
}

/* The kernels' loads are outside AddressSanitizer (their tiles need the
 * optimizer, see CMakeLists.txt): the largest index of the padded input
 * they read, tile or dw row, is checked here instead, once per image. */
static void check_reads(const conv_shape *s, const geometry *g) {
  size_t last = (size_t)(s->c - 1) * g->plane + g->qpad - 1 + (size_t)(s->kh - 1) * g->wp +
                (size_t)(s->kw - 1);
  assert(last < g->input_floats);
  (void)last;
}

/* x (c, h, w) into zeroed, padded planes, and the slack after them zeroed. */
static void pad_input(const conv_shape *s, const geometry *g, const float *x, float *xp) {
  int p = s->pad;
  for (int ci = 0; ci < s->c; ci++) {
    float *dst = xp + (size_t)ci * g->plane;
    const float *src = x + (size_t)ci * s->h * s->w;
    zero_span(dst, (size_t)p * g->wp + p); /* the top rows and the first row's left */
    for (int r = 0; r < s->h; r++) {
      float *row = dst + (size_t)(p + r) * g->wp + p;
      copy_span(row, src + (size_t)r * s->w, (size_t)s->w);
      zero_span(row + s->w, (size_t)2 * p); /* this row's right, the next one's left */
    }
    zero_span(dst + (size_t)(p + s->h) * g->wp + p, (size_t)p * g->wp - p);
  }
  size_t used = (size_t)s->c * g->plane;
  zero_span(xp + used, g->input_floats - used);
}

/* One tile: out[m ld + v] for 4 channels m and 24 positions v from xp (the
 * tile's first position in plane 0) and its channel block's packed weights.
 * `k` is a constant in each caller, so the tap loops unroll. */
__attribute__((target("avx2,fma"), always_inline, no_sanitize_address, no_sanitize("undefined"))) static inline void
tile(const float *xp, const float *wk, int c, size_t plane, int wp, int k, float *out, size_t ld) {
  __m256 acc[DIRECT_MR][DIRECT_NV];
  for (int m = 0; m < DIRECT_MR; m++)
    for (int v = 0; v < DIRECT_NV; v++) acc[m][v] = _mm256_setzero_ps();
  for (int ci = 0; ci < c; ci++) {
    const float *xc = xp + (size_t)ci * plane;
    for (int ki = 0; ki < k; ki++)
      for (int kj = 0; kj < k; kj++) {
        const float *xs = xc + ki * wp + kj;
        __m256 xv[DIRECT_NV];
        for (int v = 0; v < DIRECT_NV; v++) xv[v] = _mm256_loadu_ps(xs + 8 * v);
        for (int m = 0; m < DIRECT_MR; m++) {
          __m256 wm = _mm256_broadcast_ss(wk + m);
          for (int v = 0; v < DIRECT_NV; v++) acc[m][v] = _mm256_fmadd_ps(wm, xv[v], acc[m][v]);
        }
        wk += DIRECT_MR;
      }
  }
  for (int m = 0; m < DIRECT_MR; m++)
    for (int v = 0; v < DIRECT_NV; v++) _mm256_storeu_ps(out + m * ld + 8 * v, acc[m][v]);
}

/* Every tile of the image: channel blocks outer, so a block's weights stay
 * in cache while its tiles stream the padded input. */
__attribute__((target("avx2,fma"), always_inline, no_sanitize_address, no_sanitize("undefined"))) static inline void
all_tiles(const conv_shape *s, const geometry *g, const float *packed, const float *xp,
          float *ylin, int k) {
  size_t block = (size_t)s->c * k * k * DIRECT_MR;
  for (int cb = 0; cb < s->k / DIRECT_MR; cb++)
    for (size_t q0 = 0; q0 < g->qpad; q0 += DIRECT_NR)
      tile(xp + q0, packed + cb * block, s->c, g->plane, g->wp, k,
           ylin + (size_t)cb * DIRECT_MR * g->qpad + q0, g->qpad);
}

__attribute__((target("avx2,fma"), no_sanitize_address, no_sanitize("undefined"))) static void tiles_3(const conv_shape *s, const geometry *g,
                                                         const float *packed, const float *xp,
                                                         float *ylin) {
  all_tiles(s, g, packed, xp, ylin, 3);
}

__attribute__((target("avx2,fma"), no_sanitize_address, no_sanitize("undefined"))) static void tiles_5(const conv_shape *s, const geometry *g,
                                                         const float *packed, const float *xp,
                                                         float *ylin) {
  all_tiles(s, g, packed, xp, ylin, 5);
}

__attribute__((target("avx2,fma"), no_sanitize_address, no_sanitize("undefined"))) static void tiles_any(const conv_shape *s, const geometry *g,
                                                           const float *packed, const float *xp,
                                                           float *ylin) {
  all_tiles(s, g, packed, xp, ylin, s->kh);
}

/* dw of one image: dw[o][ci][ki][kj] (+)= sum over q of dylin[o][q]
 * xp[ci][q + ki wp + kj], dylin being dy at the padded positions with 0 at
 * the discarded ones. A block is `mr` output channels by the kw taps of one
 * kernel row: mr kw accumulators of 8 positions each, summed across lanes
 * at the end. */
__attribute__((target("avx2,fma"), always_inline, no_sanitize_address, no_sanitize("undefined"))) static inline void
dw_rows(const conv_shape *s, const geometry *g, const float *xp, const float *dylin, float *dw,
        int accumulate, int mr, int kw) {
  size_t taps = (size_t)kw * kw;
  for (int o0 = 0; o0 < s->k; o0 += mr)
    for (int ci = 0; ci < s->c; ci++)
      for (int ki = 0; ki < kw; ki++) {
        __m256 acc[4][5];
        for (int m = 0; m < mr; m++)
          for (int t = 0; t < kw; t++) acc[m][t] = _mm256_setzero_ps();
        const float *xs = xp + (size_t)ci * g->plane + (size_t)ki * g->wp;
        const float *dys = dylin + (size_t)o0 * g->qpad;
        for (size_t q = 0; q < g->qpad; q += 8) {
          __m256 xv[5], dv[4];
          for (int t = 0; t < kw; t++) xv[t] = _mm256_loadu_ps(xs + q + t);
          for (int m = 0; m < mr; m++) dv[m] = _mm256_loadu_ps(dys + m * g->qpad + q);
          for (int m = 0; m < mr; m++)
            for (int t = 0; t < kw; t++) acc[m][t] = _mm256_fmadd_ps(dv[m], xv[t], acc[m][t]);
        }
        for (int m = 0; m < mr; m++)
          for (int t = 0; t < kw; t++) {
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[m][t]),
                                  _mm256_extractf128_ps(acc[m][t], 1));
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
            float *out = dw + ((size_t)(o0 + m) * s->c + ci) * taps + (size_t)ki * kw + t;
            *out = _mm_cvtss_f32(h) + (accumulate ? *out : 0.0f);
          }
      }
}

__attribute__((target("avx2,fma"), no_sanitize_address, no_sanitize("undefined"))) static void dw_rows_3(const conv_shape *s, const geometry *g,
                                                           const float *xp, const float *dylin,
                                                           float *dw, int accumulate) {
  dw_rows(s, g, xp, dylin, dw, accumulate, 4, 3);
}

__attribute__((target("avx2,fma"), no_sanitize_address, no_sanitize("undefined"))) static void dw_rows_5(const conv_shape *s, const geometry *g,
                                                           const float *xp, const float *dylin,
                                                           float *dw, int accumulate) {
  dw_rows(s, g, xp, dylin, dw, accumulate, 2, 5);
}
#endif

void conv_direct_image(const conv_shape *s, const float *packed, const float *bias,
                       const float *x, float *y, float *scratch) {
#ifdef CONV_DIRECT_X86
  geometry g = geometry_of(s);
  float *xp = scratch, *ylin = scratch + g.input_floats;
  check_reads(s, &g);
  pad_input(s, &g, x, xp);
  if (s->kh == 3) {
    tiles_3(s, &g, packed, xp, ylin);
  } else if (s->kh == 5) {
    tiles_5(s, &g, packed, xp, ylin);
  } else {
    tiles_any(s, &g, packed, xp, ylin);
  }
  /* The positions inside the image, plus the bias. */
  for (int o = 0; o < s->k; o++) {
    float add = bias != NULL ? bias[o] : 0.0f;
    float *dst = y + (size_t)o * s->h * s->w;
    const float *src = ylin + (size_t)o * g.qpad;
    for (int r = 0; r < s->h; r++)
      for (int c = 0; c < s->w; c++) dst[r * s->w + c] = src[(size_t)r * g.wp + c] + add;
  }
#else
  (void)s, (void)packed, (void)bias, (void)x, (void)y, (void)scratch;
#endif
}

void conv_direct_dw_image(const conv_shape *s, const float *x, const float *dy, float *dw,
                          int accumulate, float *scratch) {
#ifdef CONV_DIRECT_X86
  geometry g = geometry_of(s);
  float *xp = scratch, *dylin = scratch + g.input_floats;
  check_reads(s, &g);
  pad_input(s, &g, x, xp);
  for (int o = 0; o < s->k; o++) {
    float *dst = dylin + (size_t)o * g.qpad;
    const float *src = dy + (size_t)o * s->h * s->w;
    for (int r = 0; r < s->h; r++) {
      copy_span(dst + (size_t)r * g.wp, src + (size_t)r * s->w, (size_t)s->w);
      zero_span(dst + (size_t)r * g.wp + s->w, (size_t)(g.wp - s->w));
    }
    zero_span(dst + g.q, g.qpad - g.q);
  }
  if (s->kw == 3) {
    dw_rows_3(s, &g, xp, dylin, dw, accumulate);
  } else {
    dw_rows_5(s, &g, xp, dylin, dw, accumulate);
  }
#else
  (void)s, (void)x, (void)dy, (void)dw, (void)accumulate, (void)scratch;
#endif
}
