/* DeepFM (--model deepfm:DIM:H1,H2,...): Wide&Deep's two parts (ctr_core.h)
 * plus a factorization machine's pairwise term over the 26 fields'
 * embeddings, summed into one logit (Guo et al., 2017):
 *   fm_i = sum_{f < g} <v_f, v_g> = 1/2 sum_k [(sum_f v_fk)^2 - sum_f v_fk^2]
 *   z_i = wide_i + deep_i + fm_i, the logloss of sigmoid(z_i)
 *   d fm_i / d v_fk = s_k - v_fk, with s_k = sum_f v_fk
 * where v_f is example i's embedding row in field f. The FM term has no
 * parameters of its own: the dense part and the tables are Wide&Deep's. */
#include <stdlib.h>
#include <string.h>

#include "trainer/model/ctr_core.h"

#define FIELDS CRITEO_CAT_FIELDS

typedef struct deepfm {
  ctr_core core;
  float *fm;   /* (max_batch) each example's pairwise term */
  float *sums; /* (max_batch, DIM) each example's s = sum_f v_f, for backward */
} deepfm;

static ps_err deepfm_forward(model *m, const model_batch *b, int want_grad, model_outputs *out,
                             ps_error *err) {
  deepfm *d = (deepfm *)m;
  ctr_core *c = &d->core;
  if (ctr_core_check_batch(c, b, err) != PS_ERR_OK ||
      ctr_core_deep_forward(c, b, err) != PS_ERR_OK) {
    return err->code;
  }
  const size_t dim = (size_t)m->desc.embed_dim;
  const float *rows = b->rows[CTR_TABLE_EMBEDDING];
  for (int i = 0; i < b->size; i++) {
    const uint32_t *slot = b->slot + (size_t)i * FIELDS;
    float *s = d->sums + (size_t)i * dim;
    memset(s, 0, dim * sizeof(float));
    float squares = 0;
    for (int f = 0; f < FIELDS; f++) {
      const float *v = rows + (size_t)slot[f] * dim;
      for (size_t k = 0; k < dim; k++) {
        s[k] += v[k];
        squares += v[k] * v[k];
      }
    }
    float pairs = 0;
    for (size_t k = 0; k < dim; k++) pairs += s[k] * s[k];
    d->fm[i] = 0.5f * (pairs - squares);
  }
  ctr_core_loss(c, b, d->fm, out);
  if (want_grad) c->grad_batch = b->size;
  return PS_ERR_OK;
}

static ps_err deepfm_backward(model *m, const model_batch *b, float *const *row_grads,
                              ps_error *err) {
  deepfm *d = (deepfm *)m;
  ctr_core *c = &d->core;
  if (ctr_core_check_backward(c, b, row_grads, err) != PS_ERR_OK) return err->code;
  ctr_core_wide_backward(c, b, row_grads[CTR_TABLE_WIDE]);
  float *grads = row_grads[CTR_TABLE_EMBEDDING];
  if (ctr_core_deep_backward(c, b, grads, err) != PS_ERR_OK) return err->code;
  const size_t dim = (size_t)m->desc.embed_dim;
  const float *rows = b->rows[CTR_TABLE_EMBEDDING];
  for (int i = 0; i < b->size; i++) {
    const uint32_t *slot = b->slot + (size_t)i * FIELDS;
    const float *s = d->sums + (size_t)i * dim, dz = c->dlogits[i];
    for (int f = 0; f < FIELDS; f++) {
      const float *v = rows + (size_t)slot[f] * dim;
      float *g = grads + (size_t)slot[f] * dim;
      for (size_t k = 0; k < dim; k++) g[k] += dz * (s[k] - v[k]);
    }
  }
  return PS_ERR_OK;
}

static void deepfm_destroy(model *m) {
  deepfm *d = (deepfm *)m;
  free(d->fm);
  free(d->sums);
  ctr_core_free(&d->core);
  free(d);
}

static ps_err deepfm_create(model **out, const model_desc *desc, backend *be, int max_batch,
                            uint64_t seed, ps_error *err);

const model_ops model_deepfm = {
    .name = "deepfm",
    .create = deepfm_create,
    .forward = deepfm_forward,
    .backward = deepfm_backward,
    .destroy = deepfm_destroy,
    CTR_CORE_DENSE_OPS,
};

static ps_err deepfm_create(model **out, const model_desc *desc, backend *be, int max_batch,
                            uint64_t seed, ps_error *err) {
  deepfm *d = calloc(1, sizeof *d);
  if (d == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "model deepfm: out of memory");
  d->core.base.ops = &model_deepfm;
  if (ctr_core_init(&d->core, desc, be, max_batch, seed, err) != PS_ERR_OK) {
    deepfm_destroy(&d->core.base);
    return err->code;
  }
  if (desc->num_layers < 1) {
    deepfm_destroy(&d->core.base);
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model deepfm: needs a deep part");
  }
  d->fm = malloc((size_t)max_batch * sizeof(float));
  d->sums = malloc((size_t)max_batch * (size_t)desc->embed_dim * sizeof(float));
  if (d->fm == NULL || d->sums == NULL) {
    deepfm_destroy(&d->core.base);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "model deepfm: out of memory for batches of %d",
                        max_batch);
  }
  *out = &d->core.base;
  return PS_ERR_OK;
}
