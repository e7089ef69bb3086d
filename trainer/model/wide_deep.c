/* Wide&Deep (--model ctr:DIM:H1,H2,...): z = wide + deep (ctr_core.h), the
 * logloss of sigmoid(z): ctr_core's step as it is. */
#include "trainer/model/ctr_core.h"

static ps_err wide_deep_create(model **out, const model_desc *desc, backend *be, int max_batch,
                               uint64_t seed, ps_error *err);

const model_ops model_wide_deep = {
    .name = "ctr",
    .create = wide_deep_create,
    .forward = ctr_core_forward,
    .backward = ctr_core_backward,
    .destroy = ctr_core_destroy,
    CTR_CORE_DENSE_OPS,
};

static ps_err wide_deep_create(model **out, const model_desc *desc, backend *be, int max_batch,
                               uint64_t seed, ps_error *err) {
  return ctr_core_create(out, &model_wide_deep, desc, be, max_batch, seed, err);
}
