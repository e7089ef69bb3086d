/* The job's data files and the sources over them (see data_files.h). */
#include "trainer/data/data_files.h"

#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "trainer/data/cifar.h"
#include "trainer/data/ctr_reader.h"
#include "trainer/data/criteo_eval.h"
#include "trainer/data/criteo_source.h"
#include "trainer/data/idx_source.h"
#include "trainer/model/model.h"

/* A network names its input shape (a built-in takes the data's later). */
static ps_err check_net_fits_images(const model_desc *m, const dataset *ds, ps_error *err) {
  const net_desc *net = &m->net;
  if (net->c != 0 && (net->c != ds->channels || net->h != ds->rows || net->w != ds->cols)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "network %s takes %dx%dx%d inputs but the images are %dx%dx%d", net->name,
                        net->c, net->h, net->w, ds->channels, ds->rows, ds->cols);
  }
  if (net->c != 0 && net_classes(net) != DATASET_CLASSES) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "network %s: its last layer has %d outputs but the data has %d classes",
                        net->name, net_classes(net), DATASET_CLASSES);
  }
  return PS_ERR_OK;
}

static ps_err check_model_fits_images(const model_desc *m, const dataset *ds,
                                      const char *model_text, ps_error *err) {
  int values = (int)dataset_image_size(ds);
  if (m->kind == MODEL_NET) return check_net_fits_images(m, ds, err);
  if (m->sizes[0] != values && ds->channels == 1) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--model %s: first layer takes %d inputs but the images have %d x %d = %d "
                        "pixels",
                        model_text, m->sizes[0], ds->rows, ds->cols, values);
  }
  if (m->sizes[0] != values) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--model %s: first layer takes %d inputs but the images are %dx%dx%d "
                        "(channels x rows x cols) = %d values",
                        model_text, m->sizes[0], ds->channels, ds->rows, ds->cols, values);
  }
  if (m->sizes[m->num_layers] != DATASET_CLASSES) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--model %s: last layer has %d outputs but the data has %d classes",
                        model_text, m->sizes[m->num_layers], DATASET_CLASSES);
  }
  return PS_ERR_OK;
}

/* CIFAR-10: the test set takes the training set's statistics, so both
 * enter the model on the same scale. */
static ps_err load_cifar(data_files *f, const trainer_options *o, ps_error *err) {
  PS_TRY(cifar_load(o->data, 1, o->train_samples, &f->train, err));
  PS_TRY(cifar_load(o->data, 0, o->test_samples, &f->test, err));
  memcpy(f->test.mean, f->train.mean, sizeof f->test.mean);
  memcpy(f->test.std, f->train.std, sizeof f->test.std);
  f->test.normalized = 1;
  const dataset *t = &f->train;
  LOG_INFO("cifar %s: %ld training images %dx%dx%d, %ld test; channel mean %.4f %.4f %.4f, "
           "std %.4f %.4f %.4f (of the training images, applied to both)",
           o->data, t->count, t->channels, t->rows, t->cols, f->test.count, t->mean[0],
           t->mean[1], t->mean[2], t->std[0], t->std[1], t->std[2]);
  return PS_ERR_OK;
}

static ps_err load_images(data_files *f, const trainer_settings *s, ps_error *err) {
  const trainer_options *o = &s->opt;
  if (s->cifar) {
    PS_TRY(load_cifar(f, o, err));
  } else if (dataset_load(o->data, "train", o->train_samples, &f->train, err) != PS_ERR_OK ||
             dataset_load(o->data, "t10k", o->test_samples, &f->test, err) != PS_ERR_OK) {
    return err->code;
  }
  if (f->train.channels != f->test.channels || f->train.rows != f->test.rows ||
      f->train.cols != f->test.cols) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                        "%s: training images are %dx%dx%d but test images %dx%dx%d", o->data,
                        f->train.channels, f->train.rows, f->train.cols, f->test.channels,
                        f->test.rows, f->test.cols);
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
                        long read_ahead, struct model *m, data_source **out, ps_error *err) {
  const trainer_options *o = &s->opt;
  if (!f->criteo) {
    return idx_source_create(out, &f->train, (uint64_t)o->seed, id, trainers, o->batch, o->epochs,
                             o->max_steps, m->inputs, m->labels, err);
  }
  /* Trainer r of N takes blocks r, r+N, ...: a job step is N blocks. */
  ctr_reader_options ro = {.skip_bad_lines = o->skip_bad_lines, .limit = o->train_samples,
                           .shard_block = o->batch, .shard_index = id, .shard_count = trainers,
                           .buffer_examples = (size_t)read_ahead};
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
