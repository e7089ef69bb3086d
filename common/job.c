/* Job description text, hash and differences. */
#include "common/job.h"

#include <stdio.h>
#include <string.h>

#include "common/hash.h"

static const char *const schedule_names[] = {"constant", "step", "cosine"};

const char *update_mode_name(update_mode mode) { return mode == UPDATE_ASYNC ? "async" : "sync"; }

static void optimizer_text(const optimizer_config *o, char *buf, size_t len) {
  snprintf(buf, len, "%s lr=%.17g wd=%.17g momentum=%.17g betas=%.17g,%.17g eps=%.17g %s "
           "step_size=%ld gamma=%.17g total_steps=%ld min_lr=%.17g",
           optimizer_kind_name(o->kind), o->lr, o->weight_decay, o->momentum, o->beta1, o->beta2,
           o->epsilon, schedule_names[o->schedule], o->step_size, o->gamma, o->total_steps,
           o->min_lr);
}

void job_config_format(const job_config *job, char *buf, size_t len) {
  char model[256], opt[512];
  model_format(&job->model, model, sizeof model);
  optimizer_text(&job->optimizer, opt, sizeof opt);
  snprintf(buf, len, "model=%s optimizer=[%s] update=%s trainers=%d pservers=%d block_size=%zu "
           "seed=%llu batch=%ld steps=%ld",
           model, opt, update_mode_name(job->update), job->trainers, job->pservers,
           job->block_size, (unsigned long long)job->seed, job->batch, job->steps);
}

uint64_t job_config_hash(const job_config *job) {
  char text[1024];
  job_config_format(job, text, sizeof text);
  return hash_text(text);
}

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

static void append_number(diff_out *o, const char *field, long long a, long long b) {
  char x[32], y[32];
  snprintf(x, sizeof x, "%lld", a);
  snprintf(y, sizeof y, "%lld", b);
  append(o, field, x, y);
}

static void diff(const job_config *a, const job_config *b, diff_out *o) {
  char x[512], y[512];
  o->buf[0] = '\0';
  model_format(&a->model, x, sizeof x);
  model_format(&b->model, y, sizeof y);
  append(o, "model", x, y);
  optimizer_text(&a->optimizer, x, sizeof x);
  optimizer_text(&b->optimizer, y, sizeof y);
  append(o, "optimizer", x, y);
  append(o, "update", update_mode_name(a->update), update_mode_name(b->update));
  append_number(o, "trainers", a->trainers, b->trainers);
  append_number(o, "pservers", a->pservers, b->pservers);
  append_number(o, "block size", (long long)a->block_size, (long long)b->block_size);
  append_number(o, "seed", (long long)a->seed, (long long)b->seed);
  append_number(o, "batch", a->batch, b->batch);
  append_number(o, "steps", a->steps, b->steps);
}

void job_config_diff(const job_config *a, const job_config *b, char *buf, size_t len) {
  diff_out o = {buf, len, 0, 0};
  diff(a, b, &o);
}

void job_config_diff_fields(const job_config *a, const job_config *b, char *buf, size_t len) {
  diff_out o = {buf, len, 0, 1};
  diff(a, b, &o);
}
