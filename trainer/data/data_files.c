/* The job's data files and the sources over them (see data_files.h). */
#include "trainer/data/data_files.h"

#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "trainer/data/ctr_reader.h"
#include "trainer/data/criteo_eval.h"
#include "trainer/data/criteo_source.h"
#include "trainer/data/idx_source.h"
#include "trainer/model/model.h"

static ps_err check_model_fits_images(const model_desc *m, const dataset *ds,
                                      const char *model_text, ps_error *err) {
  int pixels = ds->rows * ds->cols;
  if (m->sizes[0] != pixels) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--model %s: first layer takes %d inputs but the images have %d x %d = %d "
                        "pixels",
                        model_text, m->sizes[0], ds->rows, ds->cols, pixels);
  }
  if (m->sizes[m->num_layers] != DATASET_CLASSES) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--model %s: last layer has %d outputs but the data has %d classes",
                        model_text, m->sizes[m->num_layers], DATASET_CLASSES);
  }
  return PS_ERR_OK;
}

static ps_err load_images(data_files *f, const trainer_settings *s, ps_error *err) {
  const trainer_options *o = &s->opt;
  if (dataset_load(o->data, "train", o->train_samples, &f->train, err) != PS_ERR_OK ||
      dataset_load(o->data, "t10k", o->test_samples, &f->test, err) != PS_ERR_OK) {
    return err->code;
  }
  if (f->train.rows != f->test.rows || f->train.cols != f->test.cols) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                        "%s: training images are %dx%d but test images %dx%d", o->data,
                        f->train.rows, f->train.cols, f->test.rows, f->test.cols);
  }
  f->examples = f->train.count;
  return check_model_fits_images(&s->model, &f->train, o->model, err);
}

static ps_err count_criteo(data_files *f, const trainer_settings *s, ps_error *err) {
  const trainer_options *o = &s->opt;
  double start = now_s();
  if (ctr_reader_count_lines(o->data, &f->examples, err) != PS_ERR_OK) return err->code;
  if (o->train_samples > 0 && o->train_samples < f->examples) f->examples = o->train_samples;
  if (f->examples < 1) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "--data %s holds no examples", o->data);
  }
  LOG_INFO("%s: %ld examples (counted in %.1fs)", o->data, f->examples, now_s() - start);
  if (o->test_data[0] != '\0' && !ctr_reader_sniff(o->test_data)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--test-data %s is not a Criteo TSV file (40 tab-separated fields per "
                        "line)",
                        o->test_data);
  }
  return PS_ERR_OK;
}

ps_err data_files_load(data_files *f, const trainer_settings *s, ps_error *err) {
  memset(f, 0, sizeof *f);
  f->criteo = s->criteo;
  ps_err rc = f->criteo ? count_criteo(f, s, err) : load_images(f, s, err);
  if (rc != PS_ERR_OK) data_files_free(f);
  return rc;
}

ps_err data_files_train(data_files *f, const trainer_settings *s, int id, int trainers,
                        struct model *m, data_source **out, ps_error *err) {
  const trainer_options *o = &s->opt;
  if (!f->criteo) {
    return idx_source_create(out, &f->train, (uint64_t)o->seed, id, trainers, o->batch, o->epochs,
                             o->max_steps, m->inputs, m->labels, err);
  }
  /* Trainer r of N takes blocks r, r+N, ...: a job step is N blocks. */
  ctr_reader_options ro = {.skip_bad_lines = o->skip_bad_lines, .limit = o->train_samples,
                           .shard_block = o->batch, .shard_index = id, .shard_count = trainers};
  return criteo_source_create(out, o->data, &ro, f->examples, trainers, o->batch, o->epochs,
                              o->max_steps, err);
}

ps_err data_files_eval(data_files *f, const trainer_settings *s, struct model *m,
                       data_source **out, ps_error *err) {
  const trainer_options *o = &s->opt;
  *out = NULL;
  if (!f->criteo) return idx_eval_create(out, &f->test, m->inputs, m->labels, err);
  if (o->test_data[0] == '\0') return PS_ERR_OK;
  ctr_reader_options ro = {.skip_bad_lines = o->skip_bad_lines, .limit = o->test_samples};
  return criteo_eval_create(out, o->test_data, &ro, err);
}

void data_files_free(data_files *f) {
  dataset_free(&f->train);
  dataset_free(&f->test);
  memset(f, 0, sizeof *f);
}
