/* Job description text, hash, differences and agreement text, each walking
 * the one table of fields (job_fields.h). */
#include "common/job.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"

static const char *const update_names[UPDATE_MODE_COUNT] = {"sync", "async", "ssp", "geo"};

const char *update_mode_name(update_mode mode) {
  return (unsigned)mode < UPDATE_MODE_COUNT ? update_names[mode] : "unknown";
}

ps_err update_mode_parse(const char *name, update_mode *out, ps_error *err) {
  for (int i = 0; i < UPDATE_MODE_COUNT; i++) {
    if (strcmp(name, update_names[i]) == 0) {
      *out = (update_mode)i;
      return PS_ERR_OK;
    }
  }
  return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                      "update mode '%s' is not sync, async, ssp or geo", name);
}

/* --- the table --------------------------------------------------------------- */

enum {
  GROUP_JOB = 0,
  GROUP_OPT = 1,
  GROUP_SPARSE = 2,
  GROUP_SSP = 3,
  GROUP_GEO = 4,
  GROUP_SHARDS = 5,
  GROUP_ELASTIC = 6
};

/* --- input normalization ------------------------------------------------- */

void input_norm_format(int channels, const float *mean, const float *std, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (int part = 0; part < 2; part++) {
    const float *v = part == 0 ? mean : std;
    for (int c = 0; c < channels && used < len; c++) {
      int n = snprintf(buf + used, len - used, "%s%.9g", c > 0 ? "," : part > 0 ? "/" : "", v[c]);
      if (n < 0) return;
      used += (size_t)n;
    }
  }
}

/* Up to PSTRAIN_INPUT_NORM_CHANNELS comma-separated floats ending at `end`. */
static int parse_floats(const char *p, char end, float *out, const char **next) {
  int count = 0;
  for (;;) {
    char *stop = NULL;
    double v = strtod(p, &stop);
    if (stop == p || count == PSTRAIN_INPUT_NORM_CHANNELS || !isfinite(v)) return -1;
    out[count++] = (float)v;
    if (*stop == ',') {
      p = stop + 1;
      continue;
    }
    if (*stop != end) return -1;
    *next = stop;
    return count;
  }
}

ps_err input_norm_parse(const char *text, char *out, ps_error *err) {
  float mean[PSTRAIN_INPUT_NORM_CHANNELS], std[PSTRAIN_INPUT_NORM_CHANNELS];
  out[0] = '\0';
  if (text[0] == '\0') return PS_ERR_OK;
  const char *p = text;
  int means = strlen(text) < PSTRAIN_INPUT_NORM_MAX ? parse_floats(p, '/', mean, &p) : -1;
  int stds = means > 0 ? parse_floats(p + 1, '\0', std, &p) : -1;
  int ok = means > 0 && stds == means;
  for (int c = 0; ok && c < means; c++) ok = std[c] > 0.0f;
  if (!ok) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "job description: input normalization '%.60s' is not 'MEAN,.../STD,...' "
                        "with 1 to %d channels and positive standard deviations",
                        text, PSTRAIN_INPUT_NORM_CHANNELS);
  }
  input_norm_format(means, mean, std, out, PSTRAIN_INPUT_NORM_MAX);
  return PS_ERR_OK;
}

/* Groups written in brackets as one entry; SSP, GEO, SHARDS and ELASTIC rows read as JOB rows. */
static int bracketed(int group) { return group == GROUP_OPT || group == GROUP_SPARSE; }

static const struct {
  const char *name, *text;
  int group;
} fields[JOB_FIELD_COUNT] = {
#define FIELD_ROW(id, group, type, text, name, lo, hi) {name, text, GROUP_##group},
    JOB_FIELDS(FIELD_ROW)
#undef FIELD_ROW
};

/* How each type is written; the hash covers these, so keep them stable. */
#define FORMAT_MODEL(v, buf, len) model_format(&(v), buf, len)
#define FORMAT_KIND(v, buf, len) snprintf(buf, len, "%s", optimizer_kind_name(v))
#define FORMAT_SPARSE_KIND(v, buf, len) snprintf(buf, len, "%s", sparse_optimizer_name(v))
#define FORMAT_SCHEDULE(v, buf, len) snprintf(buf, len, "%s", lr_schedule_name(v))
#define FORMAT_UPDATE(v, buf, len) snprintf(buf, len, "%s", update_mode_name(v))
#define FORMAT_WIRE_DTYPE(v, buf, len) snprintf(buf, len, "%s", wire_dtype_name(v))
#define FORMAT_NORM(v, buf, len) snprintf(buf, len, "%s", v)
/* -0 is written 0: the same setting, and protobuf (proto3) drops a zero of
 * either sign, so a job sent with -0 arrives with 0 and must hash alike. */
#define FORMAT_DOUBLE(v, buf, len) snprintf(buf, len, "%.17g", (v) == 0 ? 0.0 : (v))
#define FORMAT_INT(v, buf, len) snprintf(buf, len, "%d", v)
#define FORMAT_LONG(v, buf, len) snprintf(buf, len, "%ld", v)
#define FORMAT_SLONG(v, buf, len) snprintf(buf, len, "%ld", v)
#define FORMAT_SIZE(v, buf, len) snprintf(buf, len, "%zu", v)
#define FORMAT_U64(v, buf, len) snprintf(buf, len, "%llu", (unsigned long long)(v))

const char *job_field_name(job_field field) {
  return (unsigned)field < JOB_FIELD_COUNT ? fields[field].name : "unknown";
}

void job_field_format(const job_config *job, job_field field, char *buf, size_t len) {
  if (len == 0) return;
  buf[0] = '\0';
  switch (field) {
#define FORMAT_CASE(id, group, type, text, name, lo, hi)                                           \
  case JOB_FIELD_##id:                                                                             \
    FORMAT_##type(JOB_MEMBER_##group(job, id), buf, len);                                          \
    break;
    JOB_FIELDS(FORMAT_CASE)
#undef FORMAT_CASE
  case JOB_FIELD_COUNT:
    break;
  }
}

/* --- text and hash -------------------------------------------------------- */

/* Where text goes: a buffer (truncated at its end) and a running FNV-1a
 * hash of all of it, equal to hash_text() of the whole text. */
typedef struct sink {
  char *buf;
  size_t len, used;
  size_t total; /* the whole text's length, written or not */
  uint64_t hash;
} sink;

static void sink_init(sink *s, char *buf, size_t len) {
  *s = (sink){buf, len, 0, 0, HASH_TEXT_START};
  if (len > 0) buf[0] = '\0';
}

static void emit(sink *s, const char *text) {
  s->hash = hash_text_continue(s->hash, text);
  for (const char *p = text; *p != '\0'; p++) {
    s->total++;
    if (s->used + 1 < s->len) s->buf[s->used++] = *p;
  }
  if (s->len > 0) s->buf[s->used] = '\0';
}

/* Longest value text: a network's canonical text. */
#define VALUE_MAX MODEL_TEXT_MAX

static void emit_field(sink *s, const job_config *job, int f) {
  char value[VALUE_MAX];
  job_field_format(job, (job_field)f, value, sizeof value);
  emit(s, fields[f].text);
  emit(s, value);
}

/* Whether group's rows belong in the job's text: the sparse tables' only for
 * the CTR models, so an MLP job's text (and the hash old checkpoints hold)
 * is unchanged. */
static int group_written(const job_config *job, int group) {
  if (group == GROUP_SSP) return job->update == UPDATE_SSP;
  if (group == GROUP_GEO) return job->update == UPDATE_GEO;
  if (group == GROUP_SHARDS) return job->shard_steps > 0;
  if (group == GROUP_ELASTIC) return job->elastic_min > 0;
  return group != GROUP_SPARSE || model_is_ctr(&job->model);
}

/* Whether field f is in the job's text: its group's rule, and the wire
 * dtype only when it is not f32, the input normalization only when there
 * is one and the async push scale only when whole (jobs from before them
 * hash as they did). */
static int field_written(const job_config *job, int f) {
  if (f == JOB_FIELD_wire_dtype && job->wire_dtype == WIRE_DTYPE_F32) return 0;
  if (f == JOB_FIELD_input_norm && job->input_norm[0] == '\0') return 0;
  if (f == JOB_FIELD_async_whole && job->async_whole == 0) return 0;
  return group_written(job, fields[f].group);
}

static const char *const group_open[] = {"", " optimizer=[", " sparse=["};

/* "model=... optimizer=[adam lr=...] update=... sparse=[adagrad lr=...]":
 * the optimizer's and the sparse tables' rows in brackets. */
static void job_text(const job_config *job, sink *s) {
  int group = GROUP_JOB;
  for (int f = 0; f < JOB_FIELD_COUNT; f++) {
    if (!field_written(job, f)) continue;
    int g = bracketed(fields[f].group) ? fields[f].group : GROUP_JOB;
    if (g != group) {
      if (group != GROUP_JOB) emit(s, "]");
      group = g;
      emit(s, group_open[group]);
    }
    emit_field(s, job, f);
  }
  if (group != GROUP_JOB) emit(s, "]");
}

/* "adam lr=... min_lr=...": what a difference shows of a bracketed group. */
static void group_text(const job_config *job, int group, char *buf, size_t len) {
  sink s;
  sink_init(&s, buf, len);
  for (int f = 0; f < JOB_FIELD_COUNT; f++) {
    if (fields[f].group == group) emit_field(&s, job, f);
  }
}

job_sparse job_sparse_of(const sparse_optimizer_config *opt, int admit_after, long evict_after) {
  return (job_sparse){.sparse_kind = opt->kind, .sparse_lr = opt->lr,
                      .sparse_epsilon = opt->epsilon,
                      .sparse_initial_accumulator = opt->initial_accumulator,
                      .sparse_beta1 = opt->beta1, .sparse_beta2 = opt->beta2,
                      .admit_after = admit_after, .evict_after = evict_after};
}

sparse_optimizer_config job_sparse_optimizer(const job_sparse *s) {
  return (sparse_optimizer_config){.kind = s->sparse_kind, .lr = s->sparse_lr,
                                   .epsilon = s->sparse_epsilon,
                                   .initial_accumulator = s->sparse_initial_accumulator,
                                   .beta1 = s->sparse_beta1, .beta2 = s->sparse_beta2};
}

void job_config_format(const job_config *job, char *buf, size_t len) {
  sink s;
  sink_init(&s, buf, len);
  job_text(job, &s);
}

uint64_t job_config_hash(const job_config *job) {
  sink s;
  sink_init(&s, NULL, 0);
  job_text(job, &s);
  return s.hash;
}

/* --- differences ------------------------------------------------------------ */

/* Where one diff is written; names_only: field names without their values. */
typedef struct diff_out {
  char *buf;
  size_t len, used;
  int names_only;
} diff_out;

static void append(diff_out *o, const char *field, const char *a, const char *b) {
  if (strcmp(a, b) == 0 || o->used >= o->len) return;
  int n = o->names_only
              ? snprintf(o->buf + o->used, o->len - o->used, "%s%s", o->used > 0 ? ", " : "", field)
              : snprintf(o->buf + o->used, o->len - o->used, "%s%s %s vs %s",
                         o->used > 0 ? "; " : "", field, a, b);
  if (n > 0) o->used += (size_t)n;
}

/* Two networks' texts are long: say their names when those differ, else
 * the first line (layer) that does. Each buffer holds VALUE_MAX bytes. */
static void shorten_networks(char *x, char *y) {
  if (strncmp(x, "net:", 4) != 0 || strncmp(y, "net:", 4) != 0 || strcmp(x, y) == 0) return;
  const char *px = x + 4, *py = y + 4;
  int line = 1;
  while (*px != '\0' && *px == *py) {
    if (*px == '|') line++;
    px++, py++;
  }
  while (px > x + 4 && px[-1] != '|') px--, py--; /* back to the line's start */
  size_t lx = strcspn(px, "|"), ly = strcspn(py, "|");
  char fx[160], fy[160];
  snprintf(fx, sizeof fx, "%.*s", (int)(lx < 100 ? lx : 100), px);
  snprintf(fy, sizeof fy, "%.*s", (int)(ly < 100 ? ly : 100), py);
  if (line == 1) { /* "name A" vs "name B" */
    snprintf(x, VALUE_MAX, "network %s", fx + 5);
    snprintf(y, VALUE_MAX, "network %s", fy + 5);
    return;
  }
  char name[64];
  snprintf(name, sizeof name, "%.*s", (int)strcspn(x + 9, "|"), x + 9);
  snprintf(x, VALUE_MAX, "network %s line %d '%s'", name, line, fx);
  snprintf(y, VALUE_MAX, "'%s'", fy);
}

static void diff(const job_config *a, const job_config *b, diff_out *o) {
  char x[VALUE_MAX], y[VALUE_MAX];
  if (o->len == 0) return;
  o->buf[0] = '\0';
  int group = GROUP_JOB;
  for (int f = 0; f < JOB_FIELD_COUNT; f++) {
    if (bracketed(fields[f].group)) {
      /* A bracketed group is one entry, at its first row. */
      if (group != fields[f].group) {
        group_text(a, fields[f].group, x, sizeof x);
        group_text(b, fields[f].group, y, sizeof y);
        append(o, fields[f].group == GROUP_OPT ? "optimizer" : "sparse tables", x, y);
      }
    } else {
      job_field_format(a, (job_field)f, x, sizeof x);
      job_field_format(b, (job_field)f, y, sizeof y);
      if (f == JOB_FIELD_model) shorten_networks(x, y);
      append(o, fields[f].name, x, y);
    }
    group = fields[f].group;
  }
}

void job_config_diff(const job_config *a, const job_config *b, char *buf, size_t len) {
  diff_out o = {buf, len, 0, 0};
  diff(a, b, &o);
}

void job_config_diff_fields(const job_config *a, const job_config *b, char *buf, size_t len) {
  diff_out o = {buf, len, 0, 1};
  diff(a, b, &o);
}

/* --- collective mode's agreement text ------------------------------------ */

ps_err job_config_agreement(const job_config *job, const job_extra *extras, size_t extra_count,
                            char *buf, size_t len, ps_error *err) {
  sink s;
  sink_init(&s, buf, len);
  char value[VALUE_MAX];
  for (int f = 0; f < JOB_FIELD_COUNT; f++) {
    job_field_format(job, (job_field)f, value, sizeof value);
    emit(&s, f > 0 ? ";" : "");
    emit(&s, fields[f].name);
    emit(&s, "=");
    emit(&s, value);
  }
  for (size_t i = 0; i < extra_count; i++) {
    snprintf(value, sizeof value, ";%s=%ld", extras[i].name, extras[i].value);
    emit(&s, value);
  }
  /* A cut text would compare only its beginning: refuse it. */
  if (s.total >= len) {
    return ps_error_set(err, PS_ERR_OUT_OF_RANGE,
                        "the job's agreement text does not fit in %zu bytes", len);
  }
  return PS_ERR_OK;
}
