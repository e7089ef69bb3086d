/* Checkpoints of a model without tables (format "pstrain-model-1",
 * model-step-N): the parameters and both optimizer state vectors in the
 * pservers' checkpoint format (common/checkpoint.h). In collective mode
 * rank 0 reads the file and MPI sends it to the other ranks, so only rank
 * 0's host needs the folder. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/checkpoint/formats.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/log.h"

#define MODEL_FORMAT "pstrain-model-1"
#define MODEL_PREFIX "model-step-"

/* params, optimizer.state1, optimizer.state2: n floats each, as a pserver's. */
static ps_err build_layout(const trainer *t, tensor_layout *layout, ps_error *err) {
  const char *names[3] = {"params", "optimizer.state1", "optimizer.state2"};
  long shape[1] = {(long)t->model->layout.total};
  tensor_layout_init(layout);
  for (int i = 0; i < 3; i++) {
    if (tensor_layout_add(layout, names[i], 1, shape, err) != PS_ERR_OK) {
      tensor_layout_free(layout);
      return err->code;
    }
  }
  return PS_ERR_OK;
}

ps_err dense_checkpoint_write(trainer *t, long step, ps_error *err) {
  size_t n = t->model->layout.total;
  tensor_layout layout;
  if (build_layout(t, &layout, err) != PS_ERR_OK) return err->code;
  float *data = malloc(3 * n * sizeof *data);
  if (data == NULL) {
    tensor_layout_free(&layout);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "checkpoint: out of memory");
  }
  job_config job;
  trainer_job(t, &job);
  char trainers[16];
  snprintf(trainers, sizeof trainers, "%d", t->trainers);
  const char *extra[] = {"trainers", trainers, "mode", t->mode_label, NULL};
  ps_err rc = model_get_params(t->model, data, err);
  if (rc == PS_ERR_OK) rc = model_get_state(t->model, data + n, err);
  if (rc == PS_ERR_OK) {
    rc = checkpoint_write(t->settings.opt.checkpoint_dir, MODEL_PREFIX, MODEL_FORMAT, step, &job,
                          extra, &layout, data, err);
  }
  free(data);
  tensor_layout_free(&layout);
  return rc;
}

/* What rank 0 tells the others about the file it read. */
typedef struct resume_status {
  int32_t code;
  int64_t step;
  char message[512];
} resume_status;

/* Rank 0 (or local mode): reads the checkpoint into data (3n floats). */
static ps_err read_checkpoint(trainer *t, float *data, long *step, ps_error *err) {
  const trainer_options *o = &t->settings.opt;
  char path[4096];
  job_config job;
  safetensors_meta meta;
  trainer_job(t, &job);
  if (checkpoint_resume_open(o->checkpoint_dir, MODEL_PREFIX, MODEL_FORMAT, "model",
                             o->resume_step, &job, path, sizeof path, step, &meta, err) !=
      PS_ERR_OK) {
    return err->code;
  }
  tensor_layout layout;
  if (build_layout(t, &layout, err) != PS_ERR_OK) return err->code;
  ps_err rc = safetensors_read(path, &layout, data, &meta, err);
  tensor_layout_free(&layout);
  if (rc != PS_ERR_OK) return ps_error_set(err, rc, "--resume: %s", err->msg);
  LOG_INFO("resuming from %s at step %ld", path, *step);
  return PS_ERR_OK;
}

ps_err dense_checkpoint_resume(trainer *t, ps_error *err) {
  size_t n = t->model->layout.total;
  float *data = malloc(3 * n * sizeof *data);
  if (data == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "--resume: out of memory");
  resume_status status = {0, 0, ""};
  long step = 0;
  if (t->id == 0) {
    status.code = read_checkpoint(t, data, &step, err);
    status.step = step;
    if (status.code != PS_ERR_OK) snprintf(status.message, sizeof status.message, "%s", err->msg);
  }
  /* Collective mode: rank 0's verdict and file go to every rank. */
  ps_err rc = replica_broadcast(t->rep, &status, sizeof status, err);
  if (rc == PS_ERR_OK && status.code == PS_ERR_OK) {
    rc = replica_broadcast(t->rep, data, 3 * n * sizeof *data, err);
  }
  if (rc == PS_ERR_OK && status.code != PS_ERR_OK) {
    rc = ps_error_set(err, (ps_err)status.code, "%s%s", t->id == 0 ? "" : "rank 0: ",
                      status.message);
  }
  if (rc == PS_ERR_OK) rc = model_set_params(t->model, data, err);
  if (rc == PS_ERR_OK) rc = model_set_state(t->model, data + n, err);
  if (rc == PS_ERR_OK && t->staged) memcpy(t->host_params, data, n * sizeof *data);
  if (rc == PS_ERR_OK) t->start_step = (long)status.step;
  free(data);
  return rc;
}
