/* The CPU backend's convolution: conv_direct.c's kernels where they fit
 * (stride-1 "same" layers of modest width on AVX2 CPUs: forward, dx and
 * dw), else im2col + SGEMM. A group of g images is unrolled side by side
 * into one column matrix (c kh kw rows, g oh ow columns), so one GEMM
 * covers the group. A 1x1, stride-1, unpadded convolution of one image
 * needs no unrolling: x is its columns. The default group is one image for
 * outputs of 256 or more positions (see conv_group). */
#include <cblas.h>
#include <stddef.h>
#include <string.h>

#include "trainer/backend/conv_direct.h"
#include "trainer/backend/layers_cpu.h"

/* Outputs [lo, hi) along one axis whose tap `t` lands inside the input. */
static void tap_range(int t, int stride, int pad, int in, int out, int *lo, int *hi) {
  int first = pad - t, last = in + pad - t; /* o stride in [first, last) */
  *lo = first > 0 ? (first + stride - 1) / stride : 0;
  *hi = last > 0 ? (last + stride - 1) / stride : 0;
  if (*hi > out) *hi = out;
  if (*hi < *lo) *hi = *lo;
}

/* Zeroes n floats: an inline loop, as the spans here are a few dozen floats
 * and a memset call per span cost more than the stores. */
static inline void zero_span(float *restrict p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = 0.0f;
}

/* A stride-1 convolution whose output is the input's size ("same"
 * padding: ResNet's 3x3 pad 1, LeNet's 5x5 pad 2): a tap's row is the
 * plane shifted by one offset, so it is one long copy, then the columns the
 * shift wrapped across row ends set to 0 (rows of 4 to 28 floats cost more
 * in loop overhead than in data). */
static int conv_is_same(const conv_shape *s) {
  return s->stride == 1 && s->oh == s->h && s->ow == s->w;
}

static void im2col_tap_same(const conv_shape *s, const float *restrict plane,
                            float *restrict row, int ki, int kj, int y0, int y1, int x0, int x1) {
  ptrdiff_t shift = (ptrdiff_t)(ki - s->pad) * s->w + (kj - s->pad);
  ptrdiff_t n = (ptrdiff_t)s->h * s->w, lo = (ptrdiff_t)y0 * s->w, hi = (ptrdiff_t)y1 * s->w;
  if (lo < -shift) lo = -shift; /* the copy reads inside the plane only */
  if (hi > n - shift) hi = n - shift;
  if (hi < lo) hi = lo;
  zero_span(row, (size_t)lo);
  for (ptrdiff_t p = lo; p < hi; p++) row[p] = plane[p + shift];
  zero_span(row + hi, (size_t)(n - hi));
  for (int oy = y0; oy < y1; oy++) {
    zero_span(row + (size_t)oy * s->w, (size_t)x0);
    zero_span(row + (size_t)oy * s->w + x1, (size_t)(s->w - x1));
  }
}

/* One tap's row of columns: out[oy ow + ox] = input (oy, ox) of the tap, or
 * 0 in the padding. Stride 1 is its own loop (contiguous, vectorized). */
static void im2col_tap(const conv_shape *s, const float *restrict plane, float *restrict row,
                       int ki, int kj) {
  int y0, y1, x0, x1;
  tap_range(ki, s->stride, s->pad, s->h, s->oh, &y0, &y1);
  tap_range(kj, s->stride, s->pad, s->w, s->ow, &x0, &x1);
  if (conv_is_same(s)) {
    im2col_tap_same(s, plane, row, ki, kj, y0, y1, x0, x1);
    return;
  }
  zero_span(row, (size_t)y0 * s->ow);
  for (int oy = y0; oy < y1; oy++) {
    float *restrict out = row + (size_t)oy * s->ow;
    const float *restrict in = plane + (size_t)(oy * s->stride - s->pad + ki) * s->w;
    zero_span(out, (size_t)x0);
    if (s->stride == 1) {
      int off = kj - s->pad; /* ox + off >= 0 for ox >= x0 */
      for (int ox = x0; ox < x1; ox++) out[ox] = in[ox + off];
    } else {
      for (int ox = x0; ox < x1; ox++) out[ox] = in[ox * s->stride - s->pad + kj];
    }
    zero_span(out + x1, (size_t)(s->ow - x1));
  }
  zero_span(row + (size_t)y1 * s->ow, (size_t)(s->oh - y1) * s->ow);
}

/* One image's columns: row (ci, ki, kj), column oy ow + ox of a matrix with
 * row length ld; zero where the tap reads padding. */
static void im2col(const conv_shape *s, const float *x, float *cols, size_t ld) {
  for (int ci = 0; ci < s->c; ci++)
    for (int ki = 0; ki < s->kh; ki++)
      for (int kj = 0; kj < s->kw; kj++)
        im2col_tap(s, x + (size_t)ci * s->h * s->w,
                   cols + ((size_t)(ci * s->kh + ki) * s->kw + kj) * ld, ki, kj);
}

/* One tap's row added back onto the input plane it read. */
static void col2im_tap(const conv_shape *s, const float *restrict row, float *restrict plane,
                       int ki, int kj) {
  int y0, y1, x0, x1;
  tap_range(ki, s->stride, s->pad, s->h, s->oh, &y0, &y1);
  tap_range(kj, s->stride, s->pad, s->w, s->ow, &x0, &x1);
  for (int oy = y0; oy < y1; oy++) {
    const float *restrict in = row + (size_t)oy * s->ow;
    float *restrict out = plane + (size_t)(oy * s->stride - s->pad + ki) * s->w;
    if (s->stride == 1) {
      int off = kj - s->pad;
      for (int ox = x0; ox < x1; ox++) out[ox + off] += in[ox];
    } else {
      for (int ox = x0; ox < x1; ox++) out[ox * s->stride - s->pad + kj] += in[ox];
    }
  }
}

/* im2col's adjoint: adds each column entry back onto the input it read. */
static void col2im(const conv_shape *s, const float *cols, size_t ld, float *dx) {
  zero_span(dx, (size_t)s->c * s->h * s->w);
  for (int ci = 0; ci < s->c; ci++)
    for (int ki = 0; ki < s->kh; ki++)
      for (int kj = 0; kj < s->kw; kj++)
        col2im_tap(s, cols + ((size_t)(ci * s->kh + ki) * s->kw + kj) * ld,
                   dx + (size_t)ci * s->h * s->w, ki, kj);
}

static int conv_is_pointwise(const conv_shape *s) {
  return s->kh == 1 && s->kw == 1 && s->stride == 1 && s->pad == 0;
}

#define GROUP_COLUMNS 256

/* Images per GEMM. The default: enough images for GEMMs of GROUP_COLUMNS
 * columns (one image from 16x16 outputs up). On ResNet-18's 8x8 and 4x4
 * stages a per-image GEMM repacks the (k, c kh kw) weights for 64 or 16
 * columns of work: groups measured 10% faster steps (bench_net resnet18, 1
 * thread; 1024 columns no better), while on larger outputs packing dy and
 * scattering y cost more than bigger GEMMs save (scripts/bench_conv). */
static int conv_group(const conv_shape *s, int group) {
  int ohw = s->oh * s->ow;
  if (group <= 0) group = ohw >= GROUP_COLUMNS ? 1 : (GROUP_COLUMNS + ohw - 1) / ohw;
  return group > s->n && s->n > 0 ? s->n : group;
}

static ps_err gemm_rm(backend *b, int trans_a, int trans_b, int m, int n, int k, const float *a,
                      int lda, const float *bm, int ldb, float beta, float *c, int ldc,
                      ps_error *err) {
  gemm_call call = gemm_row_major(trans_a, trans_b, m, n, k, 1.0f, a, lda, bm, ldb, beta, c, ldc);
  return b->ops->gemm(b, &call, err);
}

/* Columns of images [i0, i0 + cnt) side by side (row length cnt oh ow), or x
 * itself when a pointwise convolution of one image needs no unrolling. */
static const float *group_columns(const conv_shape *s, const float *x, int i0, int cnt,
                                  float *cols) {
  size_t in_size = (size_t)s->c * s->h * s->w, ohw = (size_t)s->oh * s->ow;
  if (conv_is_pointwise(s) && cnt == 1) return x + i0 * in_size;
  for (int j = 0; j < cnt; j++) im2col(s, x + (i0 + j) * in_size, cols + j * ohw, cnt * ohw);
  return cols;
}

/* Scratch areas start on 64-byte lines. */
static size_t round16(size_t n) { return (n + 15) / 16 * 16; }

static size_t conv_weights(const conv_shape *s) { return (size_t)s->k * s->c * s->kh * s->kw; }

/* Floats of scratch a group of g images needs: columns, and the packed
 * output or dy of a group of more than one. */
static size_t group_scratch(const conv_shape *s, int g) {
  size_t ckk = (size_t)s->c * s->kh * s->kw, ohw = (size_t)s->oh * s->ow;
  if (conv_is_pointwise(s) && g == 1) return 0;
  size_t need = (ckk + (g > 1 ? (size_t)s->k : 0)) * g * ohw;
  size_t dy_cols = (size_t)s->k * s->kh * s->kw * s->h * s->w; /* dx_flipped's */
  return g == 1 && dy_cols > need ? dy_cols : need;
}

/* For stride 1 and a square kernel, dx is itself a stride-1 convolution:
 * of dy (k channels) with the flipped, transposed weights and padding
 * kh - 1 - pad. Its im2col and GEMM write dx directly, where Wᵀ dy into
 * columns would cost a zeroed (c kh kw, oh ow) product and col2im's
 * scatter-adds. */
static int dx_flipped(const conv_shape *s) {
  return s->stride == 1 && s->kh == s->kw && s->pad < s->kh && !conv_is_pointwise(s);
}

static conv_shape flipped_shape(const conv_shape *s) {
  conv_shape f = {.n = 1, .c = s->k, .h = s->oh, .w = s->ow, .k = s->c, .kh = s->kh,
                  .kw = s->kw, .stride = 1, .pad = s->kh - 1 - s->pad, .oh = s->h, .ow = s->w};
  return f;
}

/* The forward of s->n images: one by one by the direct convolution given
 * its packed weights, else in groups of g with columns in `scratch`. */
static ps_err forward_images(backend *b, const conv_shape *s, const float *x, const float *w,
                             const float *packed, const float *bias, float *y, int g,
                             float *scratch, ps_error *err) {
  size_t ckk = (size_t)s->c * s->kh * s->kw, ohw = (size_t)s->oh * s->ow;
  size_t out_size = (size_t)s->k * ohw, in_size = (size_t)s->c * s->h * s->w;
  if (packed != NULL) {
    for (int i = 0; i < s->n; i++)
      conv_direct_image(s, packed, bias, x + i * in_size, y + i * out_size, scratch);
    return PS_ERR_OK;
  }
  for (int i0 = 0; i0 < s->n; i0 += g) {
    int cnt = s->n - i0 < g ? s->n - i0 : g;
    size_t ld = cnt * ohw;
    const float *cols = group_columns(s, x, i0, cnt, scratch);
    /* One image: its y is the GEMM's output, preset to the bias (beta 1). */
    float *out = cnt == 1 ? y + i0 * out_size : scratch + ckk * g * ohw;
    float beta = 0.0f;
    if (cnt == 1 && bias != NULL) {
      for (int kk = 0; kk < s->k; kk++)
        for (size_t p = 0; p < ohw; p++) out[kk * ohw + p] = bias[kk];
      beta = 1.0f;
    }
    if (gemm_rm(b, 0, 0, s->k, (int)ld, (int)ckk, w, (int)ckk, cols, (int)ld, beta, out, (int)ld,
                err) != PS_ERR_OK)
      return err->code;
    if (cnt == 1) continue;
    /* The group's output is (k, cnt oh ow): back to NCHW, adding the bias. */
    for (int j = 0; j < cnt; j++)
      for (int kk = 0; kk < s->k; kk++) {
        float *dst = y + (i0 + j) * out_size + kk * ohw;
        const float *src = out + kk * ld + j * ohw;
        float add = bias != NULL ? bias[kk] : 0.0f;
        for (size_t p = 0; p < ohw; p++) dst[p] = src[p] + add;
      }
  }
  return PS_ERR_OK;
}

/* Whether the forward of groups of g takes conv_direct, and whether dx
 * does (its flipped convolution, per image whatever g). */
static int direct_forward(const conv_shape *s, int g) { return g == 1 && conv_direct_fits(s); }

static int direct_dx(const conv_shape *s, const float *dx) {
  conv_shape f = flipped_shape(s);
  return dx != NULL && s->stride == 1 && s->kh == s->kw && conv_direct_fits(&f);
}

/* Whether the whole backward (dw, and dx where asked) is conv_direct's. */
static int direct_backward(const conv_shape *s, const float *dx) {
  return conv_direct_dw_fits(s) && (dx == NULL || direct_dx(s, dx));
}

/* Floats of scratch a part (or the whole) needs per its paths. */
static size_t part_scratch(const conv_shape *s, int g, int fwd_direct, int dx_direct) {
  size_t need = group_scratch(s, g);
  if (fwd_direct && conv_direct_scratch_size(s) > need) need = conv_direct_scratch_size(s);
  conv_shape f = flipped_shape(s);
  if (dx_direct && conv_direct_scratch_size(&f) > need) need = conv_direct_scratch_size(&f);
  return round16(need);
}

ps_err cpu_conv_forward_group(backend *b, const conv_shape *s, const float *x, const float *w,
                              const float *bias, float *y, int group, ps_error *err) {
  int g = conv_group(s, group), direct = direct_forward(s, g);
  size_t cols = part_scratch(s, g, direct, 0);
  size_t packed_size = direct ? conv_direct_packed_size(s) : 0;
  float *scratch = NULL;
  if (cols + packed_size > 0) {
    scratch = backend_cpu_scratch(b, cols + packed_size, err);
    if (scratch == NULL) return err->code;
  }
  float *packed = direct ? scratch + cols : NULL;
  if (direct) conv_direct_pack(s, w, 0, packed);
  return forward_images(b, s, x, w, packed, bias, y, g, cols > 0 ? scratch : NULL, err);
}

/* dy of images [i0, i0 + cnt) as one (k, cnt oh ow) matrix, or dy itself. */
static const float *group_dy(const conv_shape *s, const float *dy, int i0, int cnt, float *packed) {
  size_t ohw = (size_t)s->oh * s->ow, out_size = (size_t)s->k * ohw;
  if (cnt == 1) return dy + i0 * out_size;
  for (int j = 0; j < cnt; j++)
    for (int kk = 0; kk < s->k; kk++)
      memcpy(packed + kk * cnt * ohw + j * ohw, dy + (i0 + j) * out_size + kk * ohw,
             ohw * sizeof *packed);
  return packed;
}

/* wt (c, k, kh, kw)[ci][kk][i][j] = w (k, c, kh, kw)[kk][ci][kh-1-i][kw-1-j]. */
static void flip_weights(const conv_shape *s, const float *w, float *wt) {
  size_t taps = (size_t)s->kh * s->kw;
  for (int ci = 0; ci < s->c; ci++)
    for (int kk = 0; kk < s->k; kk++)
      for (size_t t = 0; t < taps; t++)
        wt[((size_t)ci * s->k + kk) * taps + t] = w[((size_t)kk * s->c + ci) * taps + taps - 1 - t];
}

/* dx of one group: Wᵀ dy, straight into dx for a pointwise image, else into
 * the (now free) column buffer and folded back by col2im; or, given the
 * flipped weights wt, one image's dx as dx_flipped's convolution; or, given
 * them packed (packed_t), each image's by conv_direct. */
static ps_err group_dx(backend *b, const conv_shape *s, const float *w, const float *wt,
                       const float *packed_t, const float *dy, const float *dyp, int i0, int cnt,
                       float *cols, float *dx, ps_error *err) {
  size_t ckk = (size_t)s->c * s->kh * s->kw, ohw = (size_t)s->oh * s->ow;
  size_t in_size = (size_t)s->c * s->h * s->w, ld = cnt * ohw, out_size = (size_t)s->k * ohw;
  if (packed_t != NULL) { /* conv_direct of each image's dy, columns free */
    conv_shape f = flipped_shape(s);
    for (int j = i0; j < i0 + cnt; j++)
      conv_direct_image(&f, packed_t, NULL, dy + j * out_size, dx + j * in_size, cols);
    return PS_ERR_OK;
  }
  if (wt != NULL && cnt == 1) {
    conv_shape f = flipped_shape(s);
    int fkk = f.c * f.kh * f.kw, hw = s->h * s->w;
    im2col(&f, dyp, cols, (size_t)hw);
    return gemm_rm(b, 0, 0, s->c, hw, fkk, wt, fkk, cols, hw, 0.0f, dx + i0 * in_size, hw, err);
  }
  int direct = conv_is_pointwise(s) && cnt == 1;
  float *out = direct ? dx + i0 * in_size : cols;
  if (gemm_rm(b, 1, 0, (int)ckk, (int)ld, s->k, w, (int)ckk, dyp, (int)ld, 0.0f, out, (int)ld,
              err) != PS_ERR_OK)
    return err->code;
  if (!direct)
    for (int j = 0; j < cnt; j++) col2im(s, cols + j * ohw, ld, dx + (i0 + j) * in_size);
  return PS_ERR_OK;
}

/* dbias: dy summed over images and positions, in a fixed order. */
static void conv_dbias(const conv_shape *s, const float *dy, float *dbias) {
  size_t ohw = (size_t)s->oh * s->ow;
  for (int kk = 0; kk < s->k; kk++) {
    double acc = 0.0;
    for (int i = 0; i < s->n; i++) acc += cpu_sum(dy + ((size_t)i * s->k + kk) * ohw, ohw);
    dbias[kk] = (float)acc;
  }
}

/* dw (overwritten) and dx of s->n images in groups of g; no dbias. */
static ps_err backward_images(backend *b, const conv_shape *s, const float *x, const float *w,
                              const float *wt, const float *packed_t, const float *dy, float *dx,
                              float *dw, int g, float *scratch, ps_error *err) {
  size_t ckk = (size_t)s->c * s->kh * s->kw, ohw = (size_t)s->oh * s->ow;
  if (s->n == 0) memset(dw, 0, (size_t)s->k * ckk * sizeof *dw);
  if (direct_backward(s, dx)) { /* image by image, no columns */
    size_t in_size = (size_t)s->c * s->h * s->w, out_size = (size_t)s->k * ohw;
    conv_shape f = flipped_shape(s);
    for (int i = 0; i < s->n; i++) {
      conv_direct_dw_image(s, x + i * in_size, dy + i * out_size, dw, i > 0, scratch);
      if (dx != NULL)
        conv_direct_image(&f, packed_t, NULL, dy + i * out_size, dx + i * in_size, scratch);
    }
    return PS_ERR_OK;
  }
  for (int i0 = 0; i0 < s->n; i0 += g) {
    int cnt = s->n - i0 < g ? s->n - i0 : g;
    size_t ld = cnt * ohw;
    const float *cols = group_columns(s, x, i0, cnt, scratch);
    const float *dyp = group_dy(s, dy, i0, cnt, scratch != NULL ? scratch + ckk * g * ohw : NULL);
    /* dw (k, ckk) = dy (k, ld) colsᵀ, summed over the groups. */
    if (gemm_rm(b, 0, 1, s->k, (int)ckk, (int)ld, dyp, (int)ld, cols, (int)ld,
                i0 == 0 ? 0.0f : 1.0f, dw, (int)ckk, err) != PS_ERR_OK)
      return err->code;
    if (dx != NULL &&
        group_dx(b, s, w, wt, packed_t, dy, dyp, i0, cnt, scratch, dx, err) != PS_ERR_OK)
      return err->code;
  }
  return PS_ERR_OK;
}

ps_err cpu_conv_backward_group(backend *b, const conv_shape *s, const float *x, const float *w,
                               const float *dy, float *dx, float *dw, float *dbias, int group,
                               ps_error *err) {
  int g = conv_group(s, group), direct = direct_dx(s, dx);
  if (dbias != NULL) conv_dbias(s, dy, dbias);
  size_t cols = part_scratch(s, g, direct_backward(s, dx), direct);
  int flip = !direct && g == 1 && dx != NULL && dx_flipped(s);
  float *scratch = backend_cpu_scratch(b, cols + (flip || direct ? conv_weights(s) : 1), err);
  if (scratch == NULL) return err->code;
  float *wt = flip ? scratch + cols : NULL, *packed_t = direct ? scratch + cols : NULL;
  if (flip) flip_weights(s, w, wt);
  if (direct) {
    conv_shape f = flipped_shape(s);
    conv_direct_pack(&f, w, 1, packed_t);
  }
  return backward_images(b, s, x, w, wt, packed_t, dy, dx, dw, g, cols > 0 ? scratch : NULL,
                         err);
}

/* --- images across threads -------------------------------------------------
 * With --threads T > 1, T parts of the batch run side by side, each its own
 * images' im2col and single-threaded GEMMs (OpenBLAS set to one thread for
 * the call): per-image GEMMs are too small for OpenBLAS's threads to pay,
 * and im2col/col2im run in parallel too. Part t > 0 sums its dw privately;
 * the parts' dw are added in part order, so the bits depend on T only. */

#define CONV_MAX_PARTS 64

typedef struct conv_part {
  backend *b;
  conv_shape s; /* n: this part's images */
  const float *x, *w, *wt, *bias, *dy; /* wt: dx_flipped's weights, or NULL */
  const float *packed; /* conv_direct's weights (the forward's, or dx's), or NULL */
  float *y, *dx, *dw, *scratch;
  int backward, group; /* group: images per GEMM */
  ps_err rc;
  ps_error err;
} conv_part;

static void conv_part_run(void *ctx, int part, int parts) {
  (void)parts;
  conv_part *p = (conv_part *)ctx + part;
  p->rc = p->backward ? backward_images(p->b, &p->s, p->x, p->w, p->wt, p->packed, p->dy, p->dx,
                                        p->dw, p->group, p->scratch, &p->err)
                      : forward_images(p->b, &p->s, p->x, p->w, p->packed, p->bias, p->y,
                                       p->group, p->scratch, &p->err);
}

/* Parts to split s->n images into: the backend's threads, at most one per
 * image (0 or 1: the single-threaded path). */
static int conv_parts(backend *b, const conv_shape *s) {
  int t = cpu_pool_threads(backend_cpu_pool(b));
  if (t > CONV_MAX_PARTS) t = CONV_MAX_PARTS;
  return t < s->n ? t : s->n;
}

/* Splits the images over `count` parts with their scratch (columns, and a
 * private dw after the first part's), and flips or packs the weights for
 * dx_flipped or conv_direct once for all parts. */
static ps_err parts_init(backend *b, const conv_shape *s, conv_part *proto, conv_part *parts,
                         int count, ps_error *err) {
  int fwd_direct = !proto->backward && direct_forward(s, 1);
  int dx_direct = proto->backward && direct_dx(s, proto->dx);
  int on_s = fwd_direct || (proto->backward && direct_backward(s, proto->dx));
  size_t cols = part_scratch(s, 1, on_s, dx_direct), dwn = round16(conv_weights(s));
  size_t grouped = round16(group_scratch(s, conv_group(s, 0)));
  if (grouped > cols) cols = grouped; /* a part's group is at most the whole's */
  size_t in_size = (size_t)s->c * s->h * s->w, out_size = (size_t)s->k * s->oh * s->ow;
  int flip = !dx_direct && proto->backward && proto->dx != NULL && dx_flipped(s);
  float *scratch = backend_cpu_scratch(b, count * cols + count * dwn, err);
  if (scratch == NULL) return err->code;
  /* The last part's dw slot is free (part 0 writes dw itself). */
  float *shared = scratch + count * cols + (count - 1) * dwn;
  if (flip) {
    proto->wt = shared;
    flip_weights(s, proto->w, shared);
  }
  if (fwd_direct || dx_direct) {
    conv_shape f = flipped_shape(s);
    conv_direct_pack(fwd_direct ? s : &f, proto->w, dx_direct, shared);
    proto->packed = shared;
  }
  for (int t = 0, i0 = 0; t < count; t++) {
    int cnt = s->n / count + (t < s->n % count);
    conv_part *p = &parts[t];
    *p = *proto;
    p->s.n = cnt;
    p->group = proto->backward ? conv_group(&p->s, 0) : 1; /* see cpu_conv_forward */
    p->x = proto->x + i0 * in_size;
    p->dy = proto->dy != NULL ? proto->dy + i0 * out_size : NULL;
    p->y = proto->y != NULL ? proto->y + i0 * out_size : NULL;
    p->dx = proto->dx != NULL ? proto->dx + i0 * in_size : NULL;
    p->scratch = cols > 0 ? scratch + t * cols : NULL;
    p->dw = t == 0 ? proto->dw : scratch + count * cols + (t - 1) * dwn;
    i0 += cnt;
  }
  return PS_ERR_OK;
}

/* Runs the parts on the backend's workers, part 0 on this thread. */
static ps_err parts_run(backend *b, conv_part *parts, int count, ps_error *err) {
  openblas_set_num_threads(1);
  cpu_pool_run(backend_cpu_pool(b), count, conv_part_run, parts);
  openblas_set_num_threads(backend_cpu_threads(b));
  for (int t = 0; t < count; t++)
    if (parts[t].rc != PS_ERR_OK) {
      *err = parts[t].err;
      return parts[t].rc;
    }
  return PS_ERR_OK;
}

static ps_err conv_forward_parts(backend *b, const conv_shape *s, const float *x, const float *w,
                                 const float *bias, float *y, int count, ps_error *err) {
  conv_part parts[CONV_MAX_PARTS];
  conv_part proto = {.b = b, .s = *s, .x = x, .w = w, .bias = bias, .y = y};
  PS_TRY(parts_init(b, s, &proto, parts, count, err));
  return parts_run(b, parts, count, err);
}

static ps_err conv_backward_parts(backend *b, const conv_shape *s, const float *x, const float *w,
                                  const float *dy, float *dx, float *dw, float *dbias, int count,
                                  ps_error *err) {
  conv_part parts[CONV_MAX_PARTS];
  conv_part proto = {.b = b, .s = *s, .x = x, .w = w, .dy = dy, .dx = dx, .dw = dw,
                     .backward = 1};
  if (dbias != NULL) conv_dbias(s, dy, dbias);
  PS_TRY(parts_init(b, s, &proto, parts, count, err));
  PS_TRY(parts_run(b, parts, count, err));
  size_t dwn = (size_t)s->k * s->c * s->kh * s->kw;
  for (int t = 1; t < count; t++)
    for (size_t j = 0; j < dwn; j++) dw[j] += parts[t].dw[j];
  return PS_ERR_OK;
}

/* oneDNN where the build has it, except for a single input channel
 * (LeNet's first layer), where scripts/bench_conv measured im2col + SGEMM
 * faster. */
int conv_cpu_uses_dnnl(backend *b, const conv_shape *s) {
  return backend_cpu_dnnl(b) != NULL && s->c > 1;
}

ps_err cpu_conv_forward(backend *b, const conv_shape *s, const float *x, const float *w,
                        const float *bias, float *y, ps_error *err) {
  if (conv_cpu_uses_dnnl(b, s))
    return conv_dnnl_forward(backend_cpu_dnnl(b), s, x, w, bias, y, err);
  int parts = conv_parts(b, s);
  /* One image per GEMM, whatever the batch: an image's y (so batch norm's
   * running statistics) keeps its bits when the batch is split otherwise
   * (test_net_train: sync 2x16 vs local 32 --bn-group 16, bitwise), which
   * GEMMs of other widths do not promise. */
  if (parts > 1) return conv_forward_parts(b, s, x, w, bias, y, parts, err);
  return cpu_conv_forward_group(b, s, x, w, bias, y, 1, err);
}

ps_err cpu_conv_backward(backend *b, const conv_shape *s, const float *x, const float *w,
                         const float *dy, float *dx, float *dw, float *dbias, ps_error *err) {
  if (conv_cpu_uses_dnnl(b, s))
    return conv_dnnl_backward(backend_cpu_dnnl(b), s, x, w, dy, dx, dw, dbias, err);
  int parts = conv_parts(b, s);
  if (parts > 1) return conv_backward_parts(b, s, x, w, dy, dx, dw, dbias, parts, err);
  return cpu_conv_backward_group(b, s, x, w, dy, dx, dw, dbias, 0, err);
}
