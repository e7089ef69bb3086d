/* A Criteo test file as evaluation batches (see criteo_eval.h). */
#define _POSIX_C_SOURCE 200809L
#include "trainer/data/criteo_eval.h"

#include <stdlib.h>

#include "trainer/data/criteo_source.h"
#include "trainer/trainer_config.h"

#define FIELDS CRITEO_CAT_FIELDS

typedef struct criteo_eval {
  data_source base;
  const char *path;
  ctr_reader_options opt;
  ctr_reader *reader; /* open between batch(0) and the end */
  ctr_example *examples;
  uint64_t *keys;
  uint32_t *slot;
  int32_t *labels;
  sparse_dedup dedup;
} criteo_eval;

static ps_err eval_batch(data_source *d, long k, data_batch *out, ps_error *err) {
  criteo_eval *s = (criteo_eval *)d;
  *out = (data_batch){.size = 0};
  if (k == 0) {
    ctr_reader_close(s->reader);
    s->reader = NULL;
    if (ctr_reader_open(&s->reader, s->path, &s->opt, err) != PS_ERR_OK) return err->code;
  }
  if (s->reader == NULL) return PS_ERR_OK;
  int count = 0;
  ps_err rc = ctr_reader_next(s->reader, s->examples, (int)d->batch, &count, err);
  if (rc == PS_ERR_OK && count > 0) {
    rc = criteo_dedup(s->examples, count, s->keys, s->slot, &s->dedup, err);
  }
  if (rc != PS_ERR_OK || count == 0) {
    ctr_reader_close(s->reader);
    s->reader = NULL;
    return rc;
  }
  for (int i = 0; i < count; i++) s->labels[i] = (int32_t)s->examples[i].label;
  *out = (data_batch){.size = count, .labels = s->labels, .examples = s->examples,
                      .slot = s->slot, .dedup = &s->dedup};
  return PS_ERR_OK;
}

static void eval_destroy(data_source *d) {
  criteo_eval *s = (criteo_eval *)d;
  ctr_reader_close(s->reader);
  sparse_dedup_free(&s->dedup);
  free(s->examples);
  free(s->keys);
  free(s->slot);
  free(s->labels);
  free(s);
}

static const data_source_ops eval_ops = {
    .name = "criteo-eval", .batch = eval_batch, .destroy = eval_destroy};

ps_err criteo_eval_create(data_source **out, const char *path, const ctr_reader_options *opt,
                          ps_error *err) {
  *out = NULL;
  criteo_eval *s = calloc(1, sizeof *s);
  if (s == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "evaluation data: out of memory");
  s->base.ops = &eval_ops;
  s->base.batch = TRAINER_EVAL_BATCH;
  s->path = path;
  s->opt = *opt;
  sparse_dedup_init(&s->dedup);
  size_t keys = (size_t)TRAINER_EVAL_BATCH * FIELDS;
  s->examples = malloc(TRAINER_EVAL_BATCH * sizeof *s->examples);
  s->keys = malloc(keys * sizeof *s->keys);
  s->slot = malloc(keys * sizeof *s->slot);
  s->labels = malloc(TRAINER_EVAL_BATCH * sizeof *s->labels);
  if (s->examples == NULL || s->keys == NULL || s->slot == NULL || s->labels == NULL) {
    eval_destroy(&s->base);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "evaluation data: out of memory");
  }
  *out = &s->base;
  return PS_ERR_OK;
}
