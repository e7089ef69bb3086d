/* The models the trainer trains, one line each: --model's name (common/model.c
 * parses the text) to the implementation. */
#include <string.h>

#include "trainer/model/model.h"

#define MODELS(X)  \
  X(model_mlp)       \
  X(model_wide_deep) \
  X(model_lr)        \
  X(model_deepfm)    \
  X(model_net)       \
  /* one line per model above */

#define DECLARE(ops) extern const model_ops ops;
#define ENTRY(ops) &ops,
MODELS(DECLARE)
static const model_ops *const registry[] = {MODELS(ENTRY)};

const model_ops *model_find(const char *name) {
  for (size_t i = 0; i < sizeof registry / sizeof registry[0]; i++) {
    if (strcmp(registry[i]->name, name) == 0) return registry[i];
  }
  return NULL;
}

ps_err model_create(model **out, const model_desc *desc, backend *be, int max_batch,
                    uint64_t seed, ps_error *err) {
  const model_ops *ops = model_find(desc->name);
  if (ops == NULL) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--model %s: this trainer has no implementation of it", desc->name);
  }
  return ops->create(out, desc, be, max_batch, seed, err);
}
