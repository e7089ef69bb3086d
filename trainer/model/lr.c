/* Logistic regression (--model lr): z = wide (ctr_core.h), the logloss of
 * sigmoid(z); one table, no dense parameters but wide.bias. */
#include "trainer/model/ctr_core.h"

static ps_err lr_create(model **out, const model_desc *desc, backend *be, int max_batch,
                        uint64_t seed, ps_error *err);

static ps_err lr_forward(model *m, const model_batch *b, int want_grad, model_outputs *out,
                         ps_error *err) {
  ctr_core *c = (ctr_core *)m;
  if (ctr_core_check_batch(c, b, err) != PS_ERR_OK ||
      ctr_core_deep_forward(c, b, err) != PS_ERR_OK) { /* zeros: lr has no deep part */
    return err->code;
  }
  ctr_core_loss(c, b, NULL, out);
  if (want_grad) c->grad_batch = b->size;
  return PS_ERR_OK;
}

static ps_err lr_backward(model *m, const model_batch *b, float *const *row_grads,
                          ps_error *err) {
  ctr_core *c = (ctr_core *)m;
  if (ctr_core_check_backward(c, b, row_grads, err) != PS_ERR_OK) return err->code;
  ctr_core_wide_backward(c, b, row_grads[CTR_TABLE_WIDE]);
  return PS_ERR_OK;
}

const model_ops model_lr = {
    .name = "lr",
    .create = lr_create,
    .forward = lr_forward,
    .backward = lr_backward,
    .destroy = ctr_core_destroy,
    CTR_CORE_DENSE_OPS,
};

static ps_err lr_create(model **out, const model_desc *desc, backend *be, int max_batch,
                        uint64_t seed, ps_error *err) {
  return ctr_core_create(out, &model_lr, desc, be, max_batch, seed, err);
}
