/* The table of job fields (common/job_fields.h) reaches everything that
 * walks the job. For every row: its value is in the canonical text, a change
 * to it changes the hash, shows in the difference under its name and in the
 * agreement text, and survives the protobuf round trip. A new row is checked
 * without touching this file; a job_config member left out of the table
 * shows as bytes no row covers. Also: the canonical text of a fixed job is
 * what checkpoints written by earlier builds hashed, the name tables agree
 * with the option choices, and the wire, the endpoint lists and the limits
 * header agree on how many processes a job may have. */
#include <stdlib.h>
#include <string.h>

#include "common/endpoints.h"
#include "common/hash.h"
#include "common/job.h"
#include "common/wire.h"
#include "tests/check.h"

/* A valid job whose every field changes under mutate() and stays valid. */
static job_config base_job(void) {
  ps_error err;
  /* ssp, a 16-bit wire dtype and a CTR model: its job has every row but
   * geo's, the staleness's, the wire dtype's and the sparse tables' too. */
  job_config job = {.update = UPDATE_SSP, .staleness = 0, .trainers = 2, .pservers = 2,
                    .block_size = 32768, .seed = 7, .batch = 64, .steps = 100,
                    .wire_dtype = WIRE_DTYPE_BF16};
  REQUIRE(model_parse("ctr:4:16", &job.model, &err) == PS_ERR_OK);
  snprintf(job.input_norm, sizeof job.input_norm, "0.125,0.5/0.25,2");
  job.optimizer = (optimizer_config){.kind = OPTIMIZER_ADAM, .lr = 0.001, .weight_decay = 0.01,
                                     .momentum = 0.9, .beta1 = 0.9, .beta2 = 0.999,
                                     .epsilon = 1e-8, .schedule = LR_COSINE, .step_size = 1000,
                                     .gamma = 0.5, .total_steps = 5000, .min_lr = 1e-5};
  job.sparse = (job_sparse){.sparse_kind = SPARSE_OPT_ADAGRAD, .sparse_lr = 0.05,
                            .sparse_epsilon = 1e-8, .sparse_initial_accumulator = 0.1,
                            .sparse_beta1 = 0.9, .sparse_beta2 = 0.999, .admit_after = 2,
                            .evict_after = 100};
  return job;
}

/* The geo job: base_job's with geo's row (no admission or eviction of
 * rows, which geo refuses). */
static job_config base_geo_job(void) {
  job_config job = base_job();
  job.update = UPDATE_GEO;
  job.geo_steps = 10;
  job.sparse.admit_after = 0;
  job.sparse.evict_after = 0;
  return job;
}

/* The async job with its data handed out: base_job's with the shards' rows. */
static job_config base_shards_job(void) {
  job_config job = base_job();
  job.update = UPDATE_ASYNC;
  job.shard_steps = 16;
  job.epoch_examples = 6000;
  job.epochs = 2;
  return job;
}

/* Another valid value per type; a new type needs its line here. */
#define MUTATE_MODEL(v) REQUIRE(model_parse("ctr:4:7", &(v), &err) == PS_ERR_OK)
#define MUTATE_SPARSE_KIND(v) (v) = (v) == SPARSE_OPT_ADAGRAD ? SPARSE_OPT_ADAM : SPARSE_OPT_ADAGRAD
#define MUTATE_KIND(v) (v) = (v) == OPTIMIZER_ADAM ? OPTIMIZER_MOMENTUM : OPTIMIZER_ADAM
#define MUTATE_SCHEDULE(v) (v) = (v) == LR_COSINE ? LR_STEP : LR_COSINE
#define MUTATE_UPDATE(v) (v) = (v) == UPDATE_SYNC ? UPDATE_ASYNC : UPDATE_SYNC
#define MUTATE_WIRE_DTYPE(v) (v) = (v) == WIRE_DTYPE_BF16 ? WIRE_DTYPE_FP16 : WIRE_DTYPE_BF16
#define MUTATE_NORM(v)                                                                             \
  snprintf(v, sizeof(v), "%s", strcmp(v, "0.5/0.25") == 0 ? "0.25,1/0.5,2" : "0.5/0.25")
#define MUTATE_DOUBLE(v) (v) = (v) / 2 + 0.125 /* stays in (0, 1) when it was */
#define MUTATE_INT(v) (v) += 1
#define MUTATE_LONG(v) (v) += 1
#define MUTATE_SLONG(v) (v) += 1
#define MUTATE_SIZE(v) (v) += 1
#define MUTATE_U64(v) (v) += 1

static void mutate(job_config *job, job_field field) {
  ps_error err;
  switch (field) {
#define MUTATE_CASE(id, group, type, text, name, lo, hi)                                           \
  case JOB_FIELD_##id:                                                                             \
    MUTATE_##type(JOB_MEMBER_##group(job, id));                                                    \
    break;
    JOB_FIELDS(MUTATE_CASE)
#undef MUTATE_CASE
  case JOB_FIELD_COUNT:
    break;
  }
}

/* What a difference calls the field: bracketed groups are one entry. */
static const char *diff_name_of(job_field field) {
  static const char *const group_name[JOB_FIELD_COUNT] = {
#define GROUP_ROW(id, group, ...) [JOB_FIELD_##id] = GROUP_NAME_##group,
#define GROUP_NAME_JOB NULL
#define GROUP_NAME_SSP NULL
#define GROUP_NAME_GEO NULL
#define GROUP_NAME_SHARDS NULL
#define GROUP_NAME_ELASTIC NULL
#define GROUP_NAME_OPT "optimizer"
#define GROUP_NAME_SPARSE "sparse tables"
      JOB_FIELDS(GROUP_ROW)
#undef GROUP_ROW
  };
  return group_name[field] != NULL ? group_name[field] : job_field_name(field);
}

/* Through the protobuf message, packed and unpacked, and back. */
static void round_trip(const job_config *job, job_config *back) {
  ps_error err;
  Pstrain__JobConfig jc;
  wire_job_parts oc;
  char model[256];
  wire_job_to_proto(job, &jc, &oc, model, sizeof model);
  uint8_t *packed;
  size_t len;
  REQUIRE(wire_pack(&jc.base, &packed, &len, &err) == PS_ERR_OK);
  Pstrain__JobConfig *again = pstrain__job_config__unpack(NULL, len, packed);
  REQUIRE(again != NULL);
  if (wire_job_from_proto(again, back, &err) != PS_ERR_OK) {
    fprintf(stderr, "round trip refused: %s\n", err.msg);
    exit(1);
  }
  pstrain__job_config__free_unpacked(again, NULL);
  free(packed);
}

/* Each row's group, as job_fields.h names it ("JOB", "GEO", ...). */
static const char *group_of(job_field field) {
  static const char *const group[JOB_FIELD_COUNT] = {
#define GROUP_ID_ROW(id, grp, ...) [JOB_FIELD_##id] = #grp,
      JOB_FIELDS(GROUP_ID_ROW)
#undef GROUP_ID_ROW
  };
  return group[field];
}

/* The rows of group `only` (NULL: every row but geo's and the shards') against base. */
static void check_every_field(const job_config *base_in, const char *only) {
  const job_config base = *base_in;
  char base_text[1024], text[1024], diff[1024], names[256], agree_base[2048], agree[2048];
  char value[256], want[300];
  ps_error err;
  job_config_format(&base, base_text, sizeof base_text);
  REQUIRE(job_config_agreement(&base, NULL, 0, agree_base, sizeof agree_base, &err) == PS_ERR_OK);
  job_config back;
  round_trip(&base, &back);
  CHECK(job_config_hash(&back) == job_config_hash(&base));
  for (int f = 0; f < JOB_FIELD_COUNT; f++) {
    const char *name = job_field_name((job_field)f), *group = group_of((job_field)f);
    if (only != NULL ? strcmp(group, only) != 0
                     : strcmp(group, "GEO") == 0 || strcmp(group, "SHARDS") == 0 ||
                           strcmp(group, "ELASTIC") == 0) {
      continue;
    }
    /* The field's value is in the canonical text and the agreement text. */
    job_field_format(&base, (job_field)f, value, sizeof value);
    CHECK(value[0] != '\0');
    CHECK(strstr(base_text, value) != NULL);
    snprintf(want, sizeof want, "%s=%s", name, value);
    CHECK(strstr(agree_base, want) != NULL);

    job_config other = base;
    mutate(&other, (job_field)f);
    job_field_format(&other, (job_field)f, value, sizeof value);
    job_config_format(&other, text, sizeof text);
    if (strcmp(text, base_text) == 0 || job_config_hash(&other) == job_config_hash(&base)) {
      fprintf(stderr, "field %s: a change does not reach the job hash\n", name);
      check_failures++;
    }
    /* The difference names it: the optimizer's settings as "optimizer". */
    const char *diff_name = diff_name_of((job_field)f);
    job_config_diff(&other, &base, diff, sizeof diff);
    snprintf(want, sizeof want, "%s ", diff_name);
    if (strncmp(diff, want, strlen(want)) != 0 || strstr(diff, " vs ") == NULL ||
        strstr(diff, value) == NULL) {
      fprintf(stderr, "field %s: difference \"%s\"\n", name, diff);
      check_failures++;
    }
    job_config_diff_fields(&other, &base, names, sizeof names);
    CHECK_EQ_STR(names, diff_name);
    /* Ranks that differ in it disagree, by its name. */
    REQUIRE(job_config_agreement(&other, NULL, 0, agree, sizeof agree, &err) == PS_ERR_OK);
    snprintf(want, sizeof want, "%s=%s", name, value);
    if (strcmp(agree, agree_base) == 0 || strstr(agree, want) == NULL) {
      fprintf(stderr, "field %s: agreement text \"%s\"\n", name, agree);
      check_failures++;
    }
    /* It survives the wire, and the wire does not invent others. */
    round_trip(&other, &back);
    char got[256];
    job_field_format(&back, (job_field)f, got, sizeof got);
    if (strcmp(got, value) != 0 || job_config_hash(&back) != job_config_hash(&other)) {
      fprintf(stderr, "field %s: sent %s, received %s\n", name, value, got);
      check_failures++;
    }
  }
}

/* Bytes of job_config that no row's member covers. */
static size_t uncovered_bytes(void) {
  job_config job;
  unsigned char covered[sizeof job];
  memset(covered, 0, sizeof covered);
  const char *start = (const char *)&job;
#define COVER_ROW(id, group, type, text, name, lo, hi)                                             \
  memset(covered + ((const char *)&JOB_MEMBER_##group(&job, id) - start), 1,                       \
         sizeof JOB_MEMBER_##group(&job, id));
  JOB_FIELDS(COVER_ROW)
#undef COVER_ROW
  size_t n = 0;
  for (size_t i = 0; i < sizeof covered; i++) n += !covered[i];
  return n;
}

static void check_golden_text(void) {
  /* Checkpoints store this hash: the text must not change by accident. */
  ps_error err;
  job_config job = {.update = UPDATE_ASYNC, .trainers = 2, .pservers = 3, .block_size = 32768,
                    .seed = 18446744073709551615ULL, .batch = 64, .steps = 100};
  REQUIRE(model_parse("mlp:784,256,128,10", &job.model, &err) == PS_ERR_OK);
  job.optimizer = (optimizer_config){.kind = OPTIMIZER_ADAM, .lr = 0.001, .weight_decay = 0.1,
                                     .momentum = 0.5, .beta1 = 0.9, .beta2 = 0.999,
                                     .epsilon = 1e-8, .schedule = LR_COSINE, .step_size = 1000,
                                     .gamma = 0.5, .total_steps = 5000, .min_lr = 1e-5};
  char text[1024];
  job_config_format(&job, text, sizeof text);
  CHECK_EQ_STR(text,
               "model=mlp:784,256,128,10 optimizer=[adam lr=0.001 wd=0.10000000000000001 "
               "momentum=0.5 betas=0.90000000000000002,0.999 eps=1e-08 cosine step_size=1000 "
               "gamma=0.5 total_steps=5000 min_lr=1.0000000000000001e-05] update=async "
               "trainers=2 pservers=3 block_size=32768 seed=18446744073709551615 batch=64 "
               "steps=100");
  CHECK(job_config_hash(&job) == 0x5eb1ef5e337d33ccULL);
  CHECK(job_config_hash(&job) == hash_text_continue(HASH_TEXT_START, text));
  /* A short buffer cuts the text, never the hash. */
  char small[16];
  job_config_format(&job, small, sizeof small);
  CHECK_EQ_STR(small, "model=mlp:784,2");
  /* A cut agreement text is refused rather than compared in part. */
  job_extra extra = {"epochs", 3};
  CHECK_EQ_INT(job_config_agreement(&job, &extra, 1, small, sizeof small, &err),
               PS_ERR_OUT_OF_RANGE);
  char agree[2048];
  REQUIRE(job_config_agreement(&job, &extra, 1, agree, sizeof agree, &err) == PS_ERR_OK);
  CHECK(strstr(agree, "model=mlp:784,256,128,10;optimizer=adam;lr=0.001;") == agree);
  size_t n = strlen(agree);
  CHECK(n > 9 && strcmp(agree + n - 9, ";epochs=3") == 0);
}

/* OPTIMIZER_CHOICES and the like are the tables' names joined by '|'. */
static void check_name_tables(void) {
  ps_error err;
  char joined[128] = "";
  for (int k = 0; k < OPTIMIZER_KIND_COUNT; k++) {
    const char *name = optimizer_kind_name((optimizer_kind)k);
    snprintf(joined + strlen(joined), sizeof joined - strlen(joined), "%s%s", k ? "|" : "", name);
    optimizer_kind kind;
    CHECK(optimizer_kind_parse(name, &kind, &err) == PS_ERR_OK && kind == (optimizer_kind)k);
  }
  CHECK_EQ_STR(joined, OPTIMIZER_CHOICES);
  joined[0] = '\0';
  for (int s = 0; s < LR_SCHEDULE_COUNT; s++) {
    const char *name = lr_schedule_name((lr_schedule)s);
    snprintf(joined + strlen(joined), sizeof joined - strlen(joined), "%s%s", s ? "|" : "", name);
    lr_schedule schedule;
    CHECK(lr_schedule_parse(name, &schedule, &err) == PS_ERR_OK && schedule == (lr_schedule)s);
  }
  CHECK_EQ_STR(joined, LR_SCHEDULE_CHOICES);
  joined[0] = '\0';
  for (int u = 0; u < UPDATE_MODE_COUNT; u++) {
    const char *name = update_mode_name((update_mode)u);
    snprintf(joined + strlen(joined), sizeof joined - strlen(joined), "%s%s", u ? "|" : "", name);
    update_mode mode;
    CHECK(update_mode_parse(name, &mode, &err) == PS_ERR_OK && mode == (update_mode)u);
  }
  CHECK_EQ_STR(joined, UPDATE_MODE_CHOICES);
  CHECK_EQ_INT(update_mode_parse("eventually", &(update_mode){0}, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_STR(lr_schedule_name((lr_schedule)7), "unknown");
}

/* Sends `job` with one protobuf field set to v after the conversion. */
static ps_err send_with(const char *field, unsigned long long v, ps_error *err) {
  job_config job = base_job(), back;
  Pstrain__JobConfig jc;
  wire_job_parts oc;
  char model[256];
  wire_job_to_proto(&job, &jc, &oc, model, sizeof model);
  if (strcmp(field, "trainers") == 0) jc.trainers = (uint32_t)v;
  if (strcmp(field, "pservers") == 0) jc.pservers = (uint32_t)v;
  if (strcmp(field, "block_size") == 0) jc.block_size = v;
  if (strcmp(field, "batch") == 0) jc.batch = (uint32_t)v;
  if (strcmp(field, "steps") == 0) jc.steps = v;
  return wire_job_from_proto(&jc, &back, err);
}

static void check_limits(void) {
  ps_error err;
  CHECK_EQ_INT(send_with("trainers", PSTRAIN_MAX_TRAINERS, &err), PS_ERR_OK);
  CHECK_EQ_INT(send_with("trainers", PSTRAIN_MAX_TRAINERS + 1, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "trainers 4097 is not 1..4096");
  CHECK_EQ_INT(send_with("trainers", 0, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(send_with("pservers", PSTRAIN_MAX_PSERVERS, &err), PS_ERR_OK);
  CHECK_EQ_INT(send_with("pservers", PSTRAIN_MAX_PSERVERS + 1, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(send_with("pservers", 0, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(send_with("block_size", 1u << 26, &err), PS_ERR_OK);
  CHECK_EQ_INT(send_with("block_size", (1u << 26) + 1, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(send_with("block_size", 0, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "block size 0 is not 1..67108864");
  CHECK_EQ_INT(send_with("batch", 0, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(send_with("batch", UINT32_MAX, &err), PS_ERR_OK);
  CHECK_EQ_INT(send_with("steps", 1ULL << 50, &err), PS_ERR_OK);
  CHECK_EQ_INT(send_with("steps", (1ULL << 50) + 1, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(send_with("steps", 0, &err), PS_ERR_INVALID_ARGUMENT);

  /* --pservers holds as many pservers as the wire accepts, and no more. */
  CHECK_EQ_INT(ENDPOINTS_MAX, PSTRAIN_MAX_PSERVERS);
  size_t cap = (PSTRAIN_MAX_PSERVERS + 1) * 16;
  char *list = malloc(cap);
  REQUIRE(list != NULL);
  list[0] = '\0';
  for (int i = 0; i < PSTRAIN_MAX_PSERVERS; i++) {
    snprintf(list + strlen(list), cap - strlen(list), "%sh%d:7000", i ? "," : "", i);
  }
  endpoint_list *eps = malloc(sizeof *eps);
  REQUIRE(eps != NULL);
  CHECK_EQ_INT(endpoints_parse(list, "--pservers", eps, &err), PS_ERR_OK);
  CHECK_EQ_INT(eps->count, PSTRAIN_MAX_PSERVERS);
  snprintf(list + strlen(list), cap - strlen(list), ",h%d:7000", PSTRAIN_MAX_PSERVERS);
  CHECK_EQ_INT(endpoints_parse(list, "--pservers", eps, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "more than 256 entries");
  free(eps);
  free(list);
}

/* The sparse tables' rows are the CTR models' only: an MLP job's text has
 * none of them (so its hash is what older checkpoints hold), and a CTR job
 * sent without them is refused. */
static void check_sparse_rows(void) {
  ps_error err;
  job_config ctr = base_job(), mlp = base_job(), back;
  REQUIRE(model_parse("mlp:20,16,4", &mlp.model, &err) == PS_ERR_OK);
  char text[1024];
  job_config_format(&mlp, text, sizeof text);
  CHECK(strstr(text, "sparse") == NULL);
  job_config_format(&ctr, text, sizeof text);
  CHECK(strstr(text, " sparse=[adagrad lr=0.050000000000000003 eps=1e-08 acc0=0.10000000000000001 "
                     "betas=0.90000000000000002,0.999 admit=2 evict=100]") != NULL);
  job_config other = mlp;
  other.sparse.sparse_lr = 0.5;
  CHECK(job_config_hash(&other) == job_config_hash(&mlp));
  Pstrain__JobConfig jc;
  wire_job_parts parts;
  char model[256];
  wire_job_to_proto(&ctr, &jc, &parts, model, sizeof model);
  jc.sparse = NULL;
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(err.msg, "without its sparse table settings") != NULL);
  wire_job_to_proto(&mlp, &jc, &parts, model, sizeof model);
  jc.sparse = NULL; /* an older peer's MLP job */
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_OK);
  CHECK(job_config_hash(&back) == job_config_hash(&mlp));
}

/* The wire dtype's row is written only when not f32 (an f32 job hashes as
 * before it existed); a peer that does not send it means f32; an unknown
 * name is refused. */
static void check_wire_dtype_row(void) {
  ps_error err;
  job_config job = base_job(), back;
  char text[1024];
  job.input_norm[0] = '\0';
  job.wire_dtype = WIRE_DTYPE_F32;
  job_config_format(&job, text, sizeof text);
  CHECK(strstr(text, "wire_dtype") == NULL);
  CHECK(strstr(text, " steps=100 sparse=[") != NULL);
  job.wire_dtype = WIRE_DTYPE_FP16;
  job_config_format(&job, text, sizeof text);
  CHECK(strstr(text, " steps=100 wire_dtype=fp16 sparse=[") != NULL);
  Pstrain__JobConfig jc;
  wire_job_parts parts;
  char model[256];
  wire_job_to_proto(&job, &jc, &parts, model, sizeof model);
  CHECK_EQ_STR(jc.wire_dtype, "fp16");
  jc.wire_dtype = (char *)""; /* an older peer's job */
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_OK);
  CHECK_EQ_INT(back.wire_dtype, WIRE_DTYPE_F32);
  jc.wire_dtype = (char *)"int8";
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "wire dtype 'int8' is not f32, bf16 or fp16");
  char joined[64] = "";
  for (int d = 0; d < WIRE_DTYPE_COUNT; d++) {
    snprintf(joined + strlen(joined), sizeof joined - strlen(joined), "%s%s", d ? "|" : "",
             wire_dtype_name((wire_dtype)d));
  }
  CHECK_EQ_STR(joined, WIRE_DTYPE_CHOICES);
}

/* The input normalization: written only when there is one; a received
 * one checked and rewritten canonically. */
static void check_input_norm_row(void) {
  ps_error err;
  job_config job = base_job(), back;
  char text[1024], out[PSTRAIN_INPUT_NORM_MAX];
  job.input_norm[0] = '\0';
  job_config_format(&job, text, sizeof text);
  CHECK(strstr(text, "input_norm") == NULL);
  float mean[3] = {0.4914f, 0.4822f, 0.4465f}, std[3] = {0.247f, 0.2435f, 0.2616f};
  input_norm_format(3, mean, std, job.input_norm, sizeof job.input_norm);
  CHECK_EQ_STR(job.input_norm, "0.491400003,0.482199997,0.446500003/0.246999994,0.243499994,"
                               "0.261599988");
  job_config_format(&job, text, sizeof text);
  CHECK(strstr(text, " wire_dtype=bf16 input_norm=0.491400003,") != NULL);
  Pstrain__JobConfig jc;
  wire_job_parts parts;
  char model[256];
  wire_job_to_proto(&job, &jc, &parts, model, sizeof model);
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_OK);
  CHECK_EQ_STR(back.input_norm, job.input_norm);
  CHECK(job_config_hash(&back) == job_config_hash(&job));
  jc.input_norm = (char *)""; /* an older peer's job, or data without one */
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_OK);
  CHECK_EQ_STR(back.input_norm, "");
  CHECK_EQ_INT(input_norm_parse("0.50/2.0e-1", out, &err), PS_ERR_OK);
  CHECK_EQ_STR(out, "0.5/0.200000003");
  const char *bad[] = {"0.5", "0.5/", "/0.5", "0.5/0", "0.5/-1", "0.5,0.5/1", "nan/1", "1/inf",
                       "1,2,3,4,5/1,1,1,1,1", "0.5/1x", "0.5 /1"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    jc.input_norm = (char *)bad[i];
    if (wire_job_from_proto(&jc, &back, &err) != PS_ERR_INVALID_ARGUMENT ||
        strstr(err.msg, "input normalization") == NULL) {
      fprintf(stderr, "input normalization '%s' was not refused\n", bad[i]);
      check_failures++;
    }
  }
}

/* The staleness is written only for ssp jobs (sync and async jobs hash as
 * before it existed), right after the update; a staleness sent with another
 * update is refused, as is one past the limit. */
static void check_ssp_rows(void) {
  ps_error err;
  job_config ssp = base_job(), sync = base_job(), back;
  ssp.staleness = 4;
  sync.update = UPDATE_SYNC;
  char text[1024];
  job_config_format(&sync, text, sizeof text);
  CHECK(strstr(text, "staleness") == NULL);
  CHECK(strstr(text, " update=sync trainers=2 ") != NULL);
  job_config_format(&ssp, text, sizeof text);
  CHECK(strstr(text, " update=ssp staleness=4 trainers=2 ") != NULL);
  char diff[512];
  job_config_diff(&ssp, &sync, diff, sizeof diff);
  CHECK_EQ_STR(diff, "update ssp vs sync; staleness 4 vs 0");
  Pstrain__JobConfig jc;
  wire_job_parts parts;
  char model[256];
  wire_job_to_proto(&ssp, &jc, &parts, model, sizeof model);
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_OK);
  CHECK_EQ_INT(back.staleness, 4);
  jc.update = "sync";
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "staleness 4 with update sync");
  jc.update = "ssp";
  jc.staleness = PSTRAIN_MAX_STALENESS + 1;
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "staleness 1000001 is not 0..1000000");
}

/* async_whole is written only when 1 (async and ssp jobs that scale their
 * pushes 1/trainers hash as before it existed), after the update's rows; it
 * is refused with sync and geo, which have no push scale to choose. */
static void check_async_whole_row(void) {
  ps_error err;
  job_config whole = base_job(), mean = base_job(), back;
  whole.update = mean.update = UPDATE_ASYNC;
  whole.async_whole = 1;
  char text[1024];
  job_config_format(&mean, text, sizeof text);
  CHECK(strstr(text, "async_whole") == NULL);
  CHECK(strstr(text, " update=async trainers=2 ") != NULL);
  job_config_format(&whole, text, sizeof text);
  CHECK(strstr(text, " update=async async_whole=1 trainers=2 ") != NULL);
  CHECK(job_config_hash(&whole) != job_config_hash(&mean));
  char diff[512];
  job_config_diff(&whole, &mean, diff, sizeof diff);
  CHECK_EQ_STR(diff, "async push scale 1 vs 0");
  Pstrain__JobConfig jc;
  wire_job_parts parts;
  char model[256];
  wire_job_to_proto(&whole, &jc, &parts, model, sizeof model);
  CHECK_EQ_INT(jc.async_whole, 1);
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_OK);
  CHECK_EQ_INT(back.async_whole, 1);
  CHECK(job_config_hash(&back) == job_config_hash(&whole));
  jc.update = "sync";
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "pushes applied whole with update sync");
  jc.update = "async";
  jc.async_whole = 2;
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "async push scale 2 is not 0..1");
}

/* geo_steps is written only for geo jobs, right after the update; it is
 * refused with another update, below 1 with geo, past the limit, and geo
 * refuses the tables' admission and eviction. */
static void check_geo_rows(void) {
  ps_error err;
  job_config geo = base_geo_job(), sync = base_geo_job(), back;
  sync.update = UPDATE_SYNC;
  sync.geo_steps = 0;
  char text[1024];
  job_config_format(&sync, text, sizeof text);
  CHECK(strstr(text, "geo_steps") == NULL);
  job_config_format(&geo, text, sizeof text);
  CHECK(strstr(text, " update=geo geo_steps=10 trainers=2 ") != NULL);
  char diff[512];
  job_config_diff(&geo, &sync, diff, sizeof diff);
  CHECK_EQ_STR(diff, "update geo vs sync; geo steps 10 vs 0");
  Pstrain__JobConfig jc;
  wire_job_parts parts;
  char model[256];
  wire_job_to_proto(&geo, &jc, &parts, model, sizeof model);
  CHECK_EQ_INT(jc.geo_steps, 10);
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_OK);
  CHECK_EQ_INT(back.geo_steps, 10);
  CHECK(job_config_hash(&back) == job_config_hash(&geo));
  jc.update = "async";
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "geo steps 10 with update async");
  jc.update = "geo";
  jc.geo_steps = 0;
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "update geo with geo steps 0 (at least 1)");
  jc.geo_steps = PSTRAIN_MAX_GEO_STEPS + 1;
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "geo steps 1000001 is not 0..1000000");
  jc.geo_steps = 10;
  parts.sparse.evict_after = 5;
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "update geo with admission or eviction of rows");
}

/* The shards' rows are written only when the data is handed out, after
 * the steps; every update mode takes them; they are refused without the
 * queue's size, and the size without shard steps. */
static void check_shards_rows(void) {
  ps_error err;
  job_config handed = base_shards_job(), fixed = base_shards_job(), back;
  fixed.shard_steps = 0;
  fixed.epoch_examples = 0;
  fixed.epochs = 0;
  char text[1024];
  job_config_format(&fixed, text, sizeof text);
  CHECK(strstr(text, "shard_steps") == NULL && strstr(text, "epochs") == NULL);
  job_config_format(&handed, text, sizeof text);
  CHECK(strstr(text, " steps=100 shard_steps=16 epoch_examples=6000 epochs=2 ") != NULL);
  Pstrain__JobConfig jc;
  wire_job_parts parts;
  char model[256];
  wire_job_to_proto(&handed, &jc, &parts, model, sizeof model);
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_OK);
  CHECK(job_config_hash(&back) == job_config_hash(&handed));
  jc.update = "sync";
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_OK);
  CHECK(back.update == UPDATE_SYNC && back.shard_steps == 16);
  jc.update = "async";
  jc.epochs = 0;
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "shard steps 16 with 6000 examples per epoch and 0 epochs");
  jc.shard_steps = 0;
  jc.epochs = 2;
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "examples per epoch or epochs without shard steps");
  /* Elastic: written only when set; needs the data handed out, MIN <= MAX. */
  job_config elastic = base_shards_job();
  elastic.elastic_min = 2;
  job_config_format(&elastic, text, sizeof text);
  CHECK(strstr(text, " epochs=2 elastic_min=2 ") != NULL);
  wire_job_to_proto(&elastic, &jc, &parts, model, sizeof model);
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_OK);
  CHECK_EQ_INT(back.elastic_min, 2);
  jc.elastic_min = 3;
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "elastic from 3 trainers with 2 at most");
  jc.elastic_min = 1;
  jc.shard_steps = 0;
  jc.epoch_examples = 0;
  jc.epochs = 0;
  CHECK_EQ_INT(wire_job_from_proto(&jc, &back, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "and shard steps 0");
}

/* A setting of -0 is 0: protobuf drops a zero of either sign, so a job with
 * -0 must hash and read as the one that arrives (a fuzz_wire finding). */
static void check_negative_zero(void) {
  job_config job = base_job(), zero = base_job(), back;
  job.optimizer.gamma = -0.0;
  job.optimizer.weight_decay = -0.0;
  zero.optimizer.gamma = 0.0;
  zero.optimizer.weight_decay = 0.0;
  CHECK(job_config_hash(&job) == job_config_hash(&zero));
  round_trip(&job, &back);
  CHECK(job_config_hash(&back) == job_config_hash(&job));
  char a[1024], b[1024];
  job_config_format(&job, a, sizeof a);
  job_config_format(&zero, b, sizeof b);
  CHECK(strcmp(a, b) == 0);
  CHECK(strstr(a, " gamma=0 ") != NULL && strstr(a, " wd=0 ") != NULL);
}

int main(void) {
  const job_config ssp = base_job(), geo = base_geo_job();
  check_negative_zero();
  check_every_field(&ssp, NULL);
  check_every_field(&geo, "GEO");
  const job_config shards = base_shards_job();
  check_every_field(&shards, "SHARDS");
  job_config elastic = base_shards_job();
  elastic.elastic_min = 1; /* of trainers=2; a mutation's 2 stays valid */
  check_every_field(&elastic, "ELASTIC");
  check_wire_dtype_row();
  check_input_norm_row();
  /* Every member of job_config is a row: what no row covers is padding
   * (after optimizer.kind, optimizer.schedule, sparse.sparse_kind and
   * sparse.admit_after on LP64). */
  CHECK_EQ_INT(uncovered_bytes(), 16);
  check_ssp_rows();
  check_async_whole_row();
  check_geo_rows();
  check_shards_rows();
  check_sparse_rows();
  check_golden_text();
  check_name_tables();
  check_limits();
  return check_report("test_job");
}
