/* Logistic regression (--model lr): z = wide (ctr_core.h), the logloss of
 * sigmoid(z); one table, no dense parameters but wide.bias: ctr_core's step
 * without layers. */
#include "trainer/model/ctr_core.h"

static ps_err lr_create(model **out, const model_desc *desc, backend *be, int max_batch,
                        uint64_t seed, ps_error *err);

const model_ops model_lr = {
    .name = "lr",
    .create = lr_create,
    .forward = ctr_core_forward,
    .backward = ctr_core_backward,
    .destroy = ctr_core_destroy,
    CTR_CORE_DENSE_OPS,
};

static ps_err lr_create(model **out, const model_desc *desc, backend *be, int max_batch,
                        uint64_t seed, ps_error *err) {
  return ctr_core_create(out, &model_lr, desc, be, max_batch, seed, err);
}
