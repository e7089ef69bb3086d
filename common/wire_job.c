/* The job description to and from its JobConfig message, row by row of
 * JOB_FIELDS, each field checked as strictly as the command line would. */
#include <string.h>

#include "common/ctr_tables.h"
#include "common/wire.h"

/* --- the job description, row by row of JOB_FIELDS ------------------------- */

/* The protobuf member of a row: in the JobConfig or its OptimizerConfig. */
#define PROTO_OUT_JOB(id) out->id
#define PROTO_OUT_OPT(id) parts->optimizer.id
#define PROTO_OUT_SPARSE(id) parts->sparse.id
#define PROTO_OUT_SSP(id) out->id
#define PROTO_OUT_GEO(id) out->id
#define PROTO_OUT_SHARDS(id) out->id
#define PROTO_OUT_ELASTIC(id) out->id
#define PROTO_IN_JOB(id) in->id
#define PROTO_IN_OPT(id) in->optimizer->id
#define PROTO_IN_SPARSE(id) sparse->id
#define PROTO_IN_SSP(id) in->id
#define PROTO_IN_GEO(id) in->id
#define PROTO_IN_SHARDS(id) in->id
#define PROTO_IN_ELASTIC(id) in->id

#define TO_PROTO_MODEL(p, v) (model_format(&(v), text, text_len), (p) = text)
#define TO_PROTO_KIND(p, v) ((p) = (char *)optimizer_kind_name(v))
#define TO_PROTO_SPARSE_KIND(p, v) ((p) = (char *)sparse_optimizer_name(v))
#define TO_PROTO_SCHEDULE(p, v) ((p) = (char *)lr_schedule_name(v))
#define TO_PROTO_UPDATE(p, v) ((p) = (char *)update_mode_name(v))
#define TO_PROTO_WIRE_DTYPE(p, v) ((p) = (char *)wire_dtype_name(v))
#define TO_PROTO_NORM(p, v) ((p) = (char *)(v))
#define TO_PROTO_DOUBLE(p, v) ((p) = (v))
#define TO_PROTO_INT(p, v) ((p) = (uint32_t)(v))
#define TO_PROTO_LONG(p, v) ((p) = (v))
#define TO_PROTO_SLONG(p, v) ((p) = (int64_t)(v))
#define TO_PROTO_SIZE(p, v) ((p) = (v))
#define TO_PROTO_U64(p, v) ((p) = (v))

void wire_job_to_proto(const job_config *job, Pstrain__JobConfig *out, wire_job_parts *parts,
                       char *text, size_t text_len) {
  pstrain__job_config__init(out);
  pstrain__optimizer_config__init(&parts->optimizer);
  pstrain__sparse_config__init(&parts->sparse);
  out->optimizer = &parts->optimizer;
  out->sparse = &parts->sparse;
#define TO_PROTO_ROW(id, group, type, txt, name, lo, hi)                                           \
  TO_PROTO_##type(PROTO_OUT_##group(id), JOB_MEMBER_##group(job, id));
  JOB_FIELDS(TO_PROTO_ROW)
#undef TO_PROTO_ROW
}

static ps_err check_unsigned(const char *name, unsigned long long v, unsigned long long lo,
                             unsigned long long hi, ps_error *err) {
  if (v < lo || v > hi) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "job description: %s %llu is not %llu..%llu",
                        name, v, lo, hi);
  }
  return PS_ERR_OK;
}

static ps_err check_signed(const char *name, long long v, long long lo, long long hi,
                           ps_error *err) {
  if (v < lo || v > hi) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "job description: %s %lld is not %lld..%lld",
                        name, v, lo, hi);
  }
  return PS_ERR_OK;
}

/* Each reads protobuf value p into *out, within lo..hi for integers. */
#define FROM_PROTO_MODEL(name, p, out, lo, hi) model_parse(p, out, err)
#define FROM_PROTO_KIND(name, p, out, lo, hi) optimizer_kind_parse(p, out, err)
#define FROM_PROTO_SPARSE_KIND(name, p, out, lo, hi) sparse_optimizer_parse(p, out, err)
#define FROM_PROTO_SCHEDULE(name, p, out, lo, hi) lr_schedule_parse(p, out, err)
#define FROM_PROTO_UPDATE(name, p, out, lo, hi) update_mode_parse(p, out, err)
/* Absent (peers and checkpoints from before the field): f32. */
#define FROM_PROTO_WIRE_DTYPE(name, p, out, lo, hi)                                                \
  ((p)[0] == '\0' ? (*(out) = WIRE_DTYPE_F32, PS_ERR_OK) : wire_dtype_parse(p, out, err))
/* Absent: none (images as p / 255). */
#define FROM_PROTO_NORM(name, p, out, lo, hi) input_norm_parse(p, *(out), err)
#define FROM_PROTO_DOUBLE(name, p, out, lo, hi) (*(out) = (p), PS_ERR_OK)
#define FROM_PROTO_UNSIGNED(type, name, p, out, lo, hi)                                            \
  (check_unsigned(name, p, lo, hi, err) != PS_ERR_OK ? err->code : (*(out) = (type)(p), PS_ERR_OK))
#define FROM_PROTO_INT(...) FROM_PROTO_UNSIGNED(int, __VA_ARGS__)
#define FROM_PROTO_LONG(...) FROM_PROTO_UNSIGNED(long, __VA_ARGS__)
#define FROM_PROTO_SIZE(...) FROM_PROTO_UNSIGNED(size_t, __VA_ARGS__)
#define FROM_PROTO_U64(...) FROM_PROTO_UNSIGNED(uint64_t, __VA_ARGS__)
#define FROM_PROTO_SLONG(name, p, out, lo, hi)                                                     \
  (check_signed(name, p, lo, hi, err) != PS_ERR_OK ? err->code : (*(out) = (long)(p), PS_ERR_OK))

ps_err wire_job_from_proto(const Pstrain__JobConfig *in, job_config *job, ps_error *err) {
  memset(job, 0, sizeof *job);
  if (in->optimizer == NULL) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "job description without an optimizer");
  }
  /* Jobs of the image MLP may come without table settings (older peers and
   * checkpoints): they read as zeros, as the MLP's job holds them. */
  Pstrain__SparseConfig none;
  pstrain__sparse_config__init(&none);
  none.sparse_kind = (char *)sparse_optimizer_name(SPARSE_OPT_ADAGRAD);
  const Pstrain__SparseConfig *sparse = in->sparse != NULL ? in->sparse : &none;
#define FROM_PROTO_ROW(id, group, type, txt, name, lo, hi)                                         \
  if (FROM_PROTO_##type(name, PROTO_IN_##group(id), &JOB_MEMBER_##group(job, id), lo, hi) !=      \
      PS_ERR_OK) {                                                                                 \
    return err->code;                                                                              \
  }
  JOB_FIELDS(FROM_PROTO_ROW)
#undef FROM_PROTO_ROW
  /* Outside ssp the staleness is not in the hash: a value there would be
   * a job two peers could disagree on unseen. */
  if (job->update != UPDATE_SSP && job->staleness != 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "job description: staleness %d with update %s (only ssp has one)",
                        job->staleness, update_mode_name(job->update));
  }
  /* Sync averages a step's pushes and geo its exchanges: no scale to choose. */
  if (job->async_whole != 0 && job->update != UPDATE_ASYNC && job->update != UPDATE_SSP) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "job description: pushes applied whole with update %s (only async and "
                        "ssp scale pushes)", update_mode_name(job->update));
  }
  /* Handed-out shards need the queue's size; without them the fields are unused. */
  if (job->shard_steps > 0 && (job->epoch_examples < 1 || job->epochs < 1)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "job description: shard steps %d with %ld examples per epoch and %d "
                        "epochs (at least 1 each)", job->shard_steps, job->epoch_examples,
                        job->epochs);
  }
  if (job->shard_steps == 0 && (job->epoch_examples != 0 || job->epochs != 0)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "job description: examples per epoch or epochs without shard steps");
  }
  /* Joining and leaving needs the data handed out: a fixed split has no
   * share for a newcomer and loses a leaver's. */
  if (job->elastic_min > 0 && (job->shard_steps == 0 || job->elastic_min > job->trainers)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "job description: elastic from %d trainers with %d at most and shard "
                        "steps %d (elastic jobs hand the data out, and MIN <= MAX)",
                        job->elastic_min, job->trainers, job->shard_steps);
  }
  /* Outside geo, geo_steps likewise; geo itself needs at least one step per exchange. */
  if (job->update != UPDATE_GEO && job->geo_steps != 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "job description: geo steps %d with update %s (only geo has them)",
                        job->geo_steps, update_mode_name(job->update));
  }
  if (job->update == UPDATE_GEO && job->geo_steps < 1) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "job description: update geo with geo steps %d (at least 1)",
                        job->geo_steps);
  }
  /* GEO trainers keep every row they touch: a row admitted or evicted on
   * one side only would turn into a wrong change. */
  if (job->update == UPDATE_GEO && (job->sparse.admit_after > 1 || job->sparse.evict_after > 0)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "job description: update geo with admission or eviction of rows "
                        "(admit after %d, evict after %ld)",
                        job->sparse.admit_after, job->sparse.evict_after);
  }
  if (model_is_ctr(&job->model) && in->sparse == NULL) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "job description of a CTR model without its sparse table settings");
  }
  /* The tables' settings as strictly as creating the tables checks them. */
  for (int t = 0; t < ctr_table_count(&job->model); t++) {
    sparse_table_config c;
    ctr_table_config(job, t, 0, &c);
    if (sparse_table_config_check(&c, err) != PS_ERR_OK) {
      return ps_error_set(err, err->code, "job description: %s", err->msg);
    }
  }
  /* As strictly as the command line: lr > 0, momentum < 1, ... */
  return optimizer_config_check(&job->optimizer, err);
}
