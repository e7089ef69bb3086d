/* The CPU backend's convolutions through oneDNN (its v2 C API), built when
 * asked for (-DPSTRAIN_WITH_DNNL=ON or AUTO). scripts/bench_conv measured
 * its JIT kernels 1.3x to 4.5x faster than im2col + OpenBLAS on ResNet's and
 * LeNet's second convolution, reorders to and from NCHW included, on an
 * idle machine; on oversubscribed cores its OpenMP barriers stall, which is
 * why the build does not take it by default.
 *
 * Creating a primitive JIT-compiles it (milliseconds), so each shape's
 * three primitives and their reorders are built once and cached; the
 * callers' NCHW buffers are bound to plain memory objects per call and
 * reordered into the layouts the primitives chose. */
#include "trainer/backend/conv_dnnl.h"

#ifdef PSTRAIN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <stdlib.h>
#include <string.h>

/* libgomp's (oneDNN's threading runtime here); linked explicitly. */
void omp_set_num_threads(int n);

#define CACHE_SIZE 32

#define DNNL_TRY(call)                                                                  \
  do {                                                                                  \
    dnnl_status_t dnnl_st = (call);                                                     \
    if (dnnl_st != dnnl_success)                                                        \
      return ps_error_set(err, PS_ERR_BACKEND, "oneDNN: %s: %s", #call,                 \
                          dnnl_status2str(dnnl_st));                                    \
  } while (0)

/* A caller's buffer (user: plain layout, bound per call) and the layout a
 * primitive wants (inner, the same object when they agree). */
typedef struct port {
  dnnl_memory_t user, inner;
  dnnl_primitive_t reorder; /* user -> inner for inputs, inner -> user for outputs */
} port;

typedef struct entry {
  conv_shape s;
  dnnl_primitive_t fwd, bwd_data, bwd_weights;
  port fwd_x, fwd_w, fwd_y, bd_dy, bd_w, bd_dx, bw_x, bw_dy, bw_dw;
  dnnl_memory_t bias, dbias, zero_bias, spare_dbias; /* plain (k) */
} entry;

struct conv_dnnl {
  dnnl_engine_t engine;
  dnnl_stream_t stream;
  int threads;
  int count, next; /* entries in use; the next to evict when full */
  entry entries[CACHE_SIZE];
};

static void port_free(port *p) {
  if (p->reorder != NULL) dnnl_primitive_destroy(p->reorder);
  if (p->inner != NULL && p->inner != p->user) dnnl_memory_destroy(p->inner);
  if (p->user != NULL) dnnl_memory_destroy(p->user);
  memset(p, 0, sizeof *p);
}

static void entry_free(entry *e) {
  dnnl_primitive_t prims[] = {e->fwd, e->bwd_data, e->bwd_weights};
  for (size_t i = 0; i < 3; i++)
    if (prims[i] != NULL) dnnl_primitive_destroy(prims[i]);
  port *ports[] = {&e->fwd_x, &e->fwd_w, &e->fwd_y, &e->bd_dy, &e->bd_w,
                   &e->bd_dx, &e->bw_x, &e->bw_dy, &e->bw_dw};
  for (size_t i = 0; i < sizeof ports / sizeof *ports; i++) port_free(ports[i]);
  dnnl_memory_t mems[] = {e->bias, e->dbias, e->zero_bias, e->spare_dbias};
  for (size_t i = 0; i < 4; i++)
    if (mems[i] != NULL) dnnl_memory_destroy(mems[i]);
  memset(e, 0, sizeof *e);
}

void conv_dnnl_destroy(conv_dnnl *d) {
  if (d == NULL) return;
  for (int i = 0; i < d->count; i++) entry_free(&d->entries[i]);
  if (d->stream != NULL) dnnl_stream_destroy(d->stream);
  if (d->engine != NULL) dnnl_engine_destroy(d->engine);
  free(d);
}

ps_err conv_dnnl_create(conv_dnnl **out, int threads, ps_error *err) {
  conv_dnnl *d = calloc(1, sizeof *d);
  if (d == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "oneDNN: out of memory");
  d->threads = threads;
  dnnl_status_t st = dnnl_engine_create(&d->engine, dnnl_cpu, 0);
  if (st == dnnl_success) st = dnnl_stream_create(&d->stream, d->engine, dnnl_stream_default_flags);
  if (st != dnnl_success) {
    conv_dnnl_destroy(d);
    return ps_error_set(err, PS_ERR_BACKEND, "oneDNN: creating the CPU engine: %s",
                        dnnl_status2str(st));
  }
  *out = d;
  return PS_ERR_OK;
}

/* A port between a plain tensor of `dims` and the primitive's `want`. */
static ps_err port_init(conv_dnnl *d, port *p, int ndims, const dnnl_dims_t dims,
                        dnnl_format_tag_t tag, const dnnl_memory_desc_t *want, int output,
                        ps_error *err) {
  dnnl_memory_desc_t plain;
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&plain, ndims, dims, dnnl_f32, tag));
  DNNL_TRY(dnnl_memory_create(&p->user, &plain, d->engine, DNNL_MEMORY_NONE));
  if (dnnl_memory_desc_equal(&plain, want)) {
    p->inner = p->user;
    return PS_ERR_OK;
  }
  DNNL_TRY(dnnl_memory_create(&p->inner, want, d->engine, DNNL_MEMORY_ALLOCATE));
  dnnl_primitive_desc_t pd;
  DNNL_TRY(dnnl_reorder_primitive_desc_create(&pd, output ? want : &plain, d->engine,
                                              output ? &plain : want, d->engine, NULL));
  dnnl_status_t st = dnnl_primitive_create(&p->reorder, pd);
  dnnl_primitive_desc_destroy(pd);
  DNNL_TRY(st);
  return PS_ERR_OK;
}

/* Binds the caller's buffer (before the primitive runs, for outputs too:
 * without a reorder the primitive writes it directly). */
static ps_err port_bind(port *p, const float *ptr, ps_error *err) {
  DNNL_TRY(dnnl_memory_set_data_handle(p->user, (void *)ptr));
  return PS_ERR_OK;
}

/* Binds an input and reorders it into the inner layout. */
static ps_err port_in(conv_dnnl *d, port *p, const float *ptr, ps_error *err) {
  PS_TRY(port_bind(p, ptr, err));
  if (p->reorder == NULL) return PS_ERR_OK;
  dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, p->user}, {DNNL_ARG_TO, p->inner}};
  DNNL_TRY(dnnl_primitive_execute(p->reorder, d->stream, 2, args));
  return PS_ERR_OK;
}

/* Writes a bound output's inner layout back to the caller's buffer. */
static ps_err port_out(conv_dnnl *d, port *p, ps_error *err) {
  if (p->reorder == NULL) return PS_ERR_OK;
  dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, p->inner}, {DNNL_ARG_TO, p->user}};
  DNNL_TRY(dnnl_primitive_execute(p->reorder, d->stream, 2, args));
  return PS_ERR_OK;
}

/* The three primitive descriptors of a shape, layouts left to oneDNN. */
static ps_err make_pds(conv_dnnl *d, const conv_shape *s, dnnl_primitive_desc_t pds[3],
                       ps_error *err) {
  dnnl_dims_t xd = {s->n, s->c, s->h, s->w}, wd = {s->k, s->c, s->kh, s->kw};
  dnnl_dims_t yd = {s->n, s->k, s->oh, s->ow}, bd = {s->k};
  /* Symmetric padding: oneDNN's output size is the same floor as oh's. */
  dnnl_dims_t strides = {s->stride, s->stride}, pad = {s->pad, s->pad};
  dnnl_memory_desc_t x, w, y, b;
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&x, 4, xd, dnnl_f32, dnnl_format_tag_any));
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&w, 4, wd, dnnl_f32, dnnl_format_tag_any));
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&y, 4, yd, dnnl_f32, dnnl_format_tag_any));
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_x));
  dnnl_convolution_desc_t fwd, bwd_data, bwd_weights;
  DNNL_TRY(dnnl_convolution_forward_desc_init(&fwd, dnnl_forward_training, dnnl_convolution_direct,
                                              &x, &w, &b, &y, strides, pad, pad));
  DNNL_TRY(dnnl_convolution_backward_data_desc_init(&bwd_data, dnnl_convolution_direct, &x, &w,
                                                    &y, strides, pad, pad));
  DNNL_TRY(dnnl_convolution_backward_weights_desc_init(&bwd_weights, dnnl_convolution_direct, &x,
                                                       &w, &b, &y, strides, pad, pad));
  DNNL_TRY(dnnl_primitive_desc_create(&pds[0], &fwd, NULL, d->engine, NULL));
  DNNL_TRY(dnnl_primitive_desc_create(&pds[1], &bwd_data, NULL, d->engine, pds[0]));
  DNNL_TRY(dnnl_primitive_desc_create(&pds[2], &bwd_weights, NULL, d->engine, pds[0]));
  return PS_ERR_OK;
}

static const dnnl_memory_desc_t *md(dnnl_primitive_desc_t pd, dnnl_query_t what) {
  return dnnl_primitive_desc_query_md(pd, what, 0);
}

/* The primitives, the ports between NCHW and their layouts, the biases. */
static ps_err entry_build(conv_dnnl *d, entry *e, const conv_shape *s,
                          dnnl_primitive_desc_t pds[3], ps_error *err) {
  dnnl_dims_t xd = {s->n, s->c, s->h, s->w}, wd = {s->k, s->c, s->kh, s->kw};
  dnnl_dims_t yd = {s->n, s->k, s->oh, s->ow}, bd = {s->k};
  dnnl_format_tag_t act = dnnl_nchw, filt = dnnl_oihw;
  PS_TRY(port_init(d, &e->fwd_x, 4, xd, act, md(pds[0], dnnl_query_src_md), 0, err));
  PS_TRY(port_init(d, &e->fwd_w, 4, wd, filt, md(pds[0], dnnl_query_weights_md), 0, err));
  PS_TRY(port_init(d, &e->fwd_y, 4, yd, act, md(pds[0], dnnl_query_dst_md), 1, err));
  PS_TRY(port_init(d, &e->bd_dy, 4, yd, act, md(pds[1], dnnl_query_diff_dst_md), 0, err));
  PS_TRY(port_init(d, &e->bd_w, 4, wd, filt, md(pds[1], dnnl_query_weights_md), 0, err));
  PS_TRY(port_init(d, &e->bd_dx, 4, xd, act, md(pds[1], dnnl_query_diff_src_md), 1, err));
  PS_TRY(port_init(d, &e->bw_x, 4, xd, act, md(pds[2], dnnl_query_src_md), 0, err));
  PS_TRY(port_init(d, &e->bw_dy, 4, yd, act, md(pds[2], dnnl_query_diff_dst_md), 0, err));
  PS_TRY(port_init(d, &e->bw_dw, 4, wd, filt, md(pds[2], dnnl_query_diff_weights_md), 1, err));
  DNNL_TRY(dnnl_primitive_create(&e->fwd, pds[0]));
  DNNL_TRY(dnnl_primitive_create(&e->bwd_data, pds[1]));
  DNNL_TRY(dnnl_primitive_create(&e->bwd_weights, pds[2]));
  dnnl_memory_desc_t b;
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_x));
  DNNL_TRY(dnnl_memory_create(&e->bias, &b, d->engine, DNNL_MEMORY_NONE));
  DNNL_TRY(dnnl_memory_create(&e->dbias, &b, d->engine, DNNL_MEMORY_NONE));
  DNNL_TRY(dnnl_memory_create(&e->zero_bias, &b, d->engine, DNNL_MEMORY_ALLOCATE));
  DNNL_TRY(dnnl_memory_create(&e->spare_dbias, &b, d->engine, DNNL_MEMORY_ALLOCATE));
  void *zeros;
  DNNL_TRY(dnnl_memory_get_data_handle(e->zero_bias, &zeros));
  memset(zeros, 0, (size_t)s->k * sizeof(float));
  e->s = *s;
  return PS_ERR_OK;
}

/* The shape's cached entry, built on first use (evicting round-robin). */
static ps_err lookup(conv_dnnl *d, const conv_shape *s, entry **out, ps_error *err) {
  for (int i = 0; i < d->count; i++) {
    if (memcmp(&d->entries[i].s, s, sizeof *s) == 0) {
      *out = &d->entries[i];
      return PS_ERR_OK;
    }
  }
  int slot = d->count < CACHE_SIZE ? d->count++ : d->next;
  if (slot == d->next && d->count == CACHE_SIZE) d->next = (d->next + 1) % CACHE_SIZE;
  entry *e = &d->entries[slot];
  entry_free(e); /* an evicted shape, or zeroes: no shape matches a zeroed entry */
  dnnl_primitive_desc_t pds[3] = {NULL, NULL, NULL};
  ps_err rc = make_pds(d, s, pds, err);
  if (rc == PS_ERR_OK) rc = entry_build(d, e, s, pds, err);
  for (int i = 0; i < 3; i++)
    if (pds[i] != NULL) dnnl_primitive_desc_destroy(pds[i]);
  if (rc != PS_ERR_OK) {
    entry_free(e);
    return rc;
  }
  *out = e;
  return PS_ERR_OK;
}

ps_err conv_dnnl_forward(conv_dnnl *d, const conv_shape *s, const float *x, const float *w,
                         const float *bias, float *y, ps_error *err) {
  entry *e;
  PS_TRY(lookup(d, s, &e, err));
  if (d->threads > 0) omp_set_num_threads(d->threads); /* this thread's parallel regions */
  PS_TRY(port_in(d, &e->fwd_x, x, err));
  PS_TRY(port_in(d, &e->fwd_w, w, err));
  PS_TRY(port_bind(&e->fwd_y, y, err));
  dnnl_memory_t b = e->zero_bias;
  if (bias != NULL) {
    DNNL_TRY(dnnl_memory_set_data_handle(e->bias, (void *)bias));
    b = e->bias;
  }
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, e->fwd_x.inner},
                            {DNNL_ARG_WEIGHTS, e->fwd_w.inner},
                            {DNNL_ARG_BIAS, b},
                            {DNNL_ARG_DST, e->fwd_y.inner}};
  DNNL_TRY(dnnl_primitive_execute(e->fwd, d->stream, 4, args));
  PS_TRY(port_out(d, &e->fwd_y, err));
  DNNL_TRY(dnnl_stream_wait(d->stream));
  return PS_ERR_OK;
}

static ps_err backward_data(conv_dnnl *d, entry *e, const float *w, const float *dy, float *dx,
                            ps_error *err) {
  PS_TRY(port_in(d, &e->bd_dy, dy, err));
  PS_TRY(port_in(d, &e->bd_w, w, err));
  PS_TRY(port_bind(&e->bd_dx, dx, err));
  dnnl_exec_arg_t args[] = {{DNNL_ARG_DIFF_DST, e->bd_dy.inner},
                            {DNNL_ARG_WEIGHTS, e->bd_w.inner},
                            {DNNL_ARG_DIFF_SRC, e->bd_dx.inner}};
  DNNL_TRY(dnnl_primitive_execute(e->bwd_data, d->stream, 3, args));
  return port_out(d, &e->bd_dx, err);
}

ps_err conv_dnnl_backward(conv_dnnl *d, const conv_shape *s, const float *x, const float *w,
                          const float *dy, float *dx, float *dw, float *dbias, ps_error *err) {
  entry *e;
  PS_TRY(lookup(d, s, &e, err));
  if (d->threads > 0) omp_set_num_threads(d->threads);
  PS_TRY(port_in(d, &e->bw_x, x, err));
  PS_TRY(port_in(d, &e->bw_dy, dy, err));
  PS_TRY(port_bind(&e->bw_dw, dw, err));
  dnnl_memory_t db = e->spare_dbias;
  if (dbias != NULL) {
    DNNL_TRY(dnnl_memory_set_data_handle(e->dbias, dbias));
    db = e->dbias;
  }
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, e->bw_x.inner},
                            {DNNL_ARG_DIFF_DST, e->bw_dy.inner},
                            {DNNL_ARG_DIFF_WEIGHTS, e->bw_dw.inner},
                            {DNNL_ARG_DIFF_BIAS, db}};
  DNNL_TRY(dnnl_primitive_execute(e->bwd_weights, d->stream, 4, args));
  PS_TRY(port_out(d, &e->bw_dw, err));
  if (dx != NULL) PS_TRY(backward_data(d, e, w, dy, dx, err));
  DNNL_TRY(dnnl_stream_wait(d->stream));
  return PS_ERR_OK;
}

#else /* no oneDNN: the CPU backend keeps im2col + SGEMM */

ps_err conv_dnnl_create(conv_dnnl **out, int threads, ps_error *err) {
  (void)threads;
  (void)err;
  *out = NULL;
  return PS_ERR_OK;
}

void conv_dnnl_destroy(conv_dnnl *d) { (void)d; }

ps_err conv_dnnl_forward(conv_dnnl *d, const conv_shape *s, const float *x, const float *w,
                         const float *bias, float *y, ps_error *err) {
  (void)d, (void)s, (void)x, (void)w, (void)bias, (void)y;
  return ps_error_set(err, PS_ERR_UNSUPPORTED, "this build has no oneDNN");
}

ps_err conv_dnnl_backward(conv_dnnl *d, const conv_shape *s, const float *x, const float *w,
                          const float *dy, float *dx, float *dw, float *dbias, ps_error *err) {
  (void)d, (void)s, (void)x, (void)w, (void)dy, (void)dx, (void)dw, (void)dbias;
  return ps_error_set(err, PS_ERR_UNSUPPORTED, "this build has no oneDNN");
}

#endif
