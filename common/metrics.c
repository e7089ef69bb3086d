/* The metric registry and its text exposition format. */
#define _POSIX_C_SOURCE 200809L
#include "common/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define METRICS_NAME_MAX 96

typedef struct metric_series {
  char *values[METRICS_MAX_LABELS];
  double value;                        /* counter, gauge */
  uint64_t buckets[METRICS_MAX_BUCKETS + 1]; /* histogram: per bucket, the last +Inf */
  double sum;
  uint64_t count;
  struct metric_series *next;
} metric_series;

struct metric_family {
  metrics_registry *reg;
  metric_kind kind;
  char name[METRICS_NAME_MAX];
  char *help;
  int label_count;
  char labels[METRICS_MAX_LABELS][METRICS_NAME_MAX];
  double bounds[METRICS_MAX_BUCKETS];
  int bound_count;
  metric_series *series, **tail;
};

struct metrics_registry {
  pthread_mutex_t lock;
  metric_family **families;
  int count, cap;
};

ps_err metrics_create(metrics_registry **out, ps_error *err) {
  metrics_registry *reg = calloc(1, sizeof *reg);
  if (reg == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "metrics: out of memory");
  int rc = pthread_mutex_init(&reg->lock, NULL);
  if (rc != 0) {
    free(reg);
    return ps_error_set(err, PS_ERR_INTERNAL, "metrics: initializing a mutex: %s", strerror(rc));
  }
  *out = reg;
  return PS_ERR_OK;
}

static void free_series(metric_series *s, int label_count) {
  for (int i = 0; i < label_count; i++) free(s->values[i]);
  free(s);
}

void metrics_destroy(metrics_registry *reg) {
  if (reg == NULL) return;
  for (int i = 0; i < reg->count; i++) {
    metric_family *f = reg->families[i];
    for (metric_series *s = f->series, *next; s != NULL; s = next) {
      next = s->next;
      free_series(s, f->label_count);
    }
    free(f->help);
    free(f);
  }
  free(reg->families);
  pthread_mutex_destroy(&reg->lock);
  free(reg);
}

/* Prometheus names: [a-zA-Z_:][a-zA-Z0-9_:]*, labels without ':'. */
static int valid_name(const char *s, size_t len, int colon) {
  if (len == 0 || len >= METRICS_NAME_MAX) return 0;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
             (colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return 0;
  }
  return 1;
}

static ps_err parse_labels(metric_family *f, const char *labels, ps_error *err) {
  const char *p = labels;
  while (p != NULL && *p != '\0') {
    const char *comma = strchr(p, ',');
    size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
    if (f->label_count == METRICS_MAX_LABELS || !valid_name(p, len, 0) ||
        (f->kind == METRIC_HISTOGRAM && len == 2 && strncmp(p, "le", 2) == 0)) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "metrics: %s: bad label list '%s'",
                          f->name, labels);
    }
    memcpy(f->labels[f->label_count], p, len);
    f->labels[f->label_count++][len] = '\0';
    p = comma != NULL ? comma + 1 : NULL;
  }
  return PS_ERR_OK;
}

static metric_series *new_series(metric_family *f, const char *const *values) {
  metric_series *s = calloc(1, sizeof *s);
  if (s == NULL) return NULL;
  for (int i = 0; i < f->label_count; i++) {
    if ((s->values[i] = strdup(values != NULL && values[i] != NULL ? values[i] : "")) == NULL) {
      free_series(s, i);
      return NULL;
    }
  }
  *f->tail = s;
  f->tail = &s->next;
  return s;
}

metric_family *metrics_add(metrics_registry *reg, metric_kind kind, const char *name,
                           const char *help, const char *labels, const double *bounds,
                           int bound_count, ps_error *err) {
  if (!valid_name(name, strlen(name), 1) || bound_count < 0 ||
      bound_count > METRICS_MAX_BUCKETS || (kind == METRIC_HISTOGRAM) != (bound_count > 0)) {
    ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "metrics: bad name or buckets for '%s'", name);
    return NULL;
  }
  for (int i = 1; i < bound_count; i++) {
    if (!(bounds[i] > bounds[i - 1])) {
      ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "metrics: %s: buckets must ascend", name);
      return NULL;
    }
  }
  metric_family *f = calloc(1, sizeof *f);
  if (f == NULL || (f->help = strdup(help)) == NULL) {
    free(f);
    ps_error_set(err, PS_ERR_NO_MEMORY, "metrics: out of memory registering %s", name);
    return NULL;
  }
  f->reg = reg;
  f->kind = kind;
  snprintf(f->name, sizeof f->name, "%s", name);
  f->tail = &f->series;
  f->bound_count = bound_count;
  if (bound_count > 0) memcpy(f->bounds, bounds, (size_t)bound_count * sizeof *bounds);
  if (parse_labels(f, labels, err) != PS_ERR_OK ||
      (f->label_count == 0 && new_series(f, NULL) == NULL)) {
    if (f->series != NULL) free_series(f->series, 0);
    free(f->help);
    free(f);
    if (err != NULL && err->code == PS_ERR_OK) {
      ps_error_set(err, PS_ERR_NO_MEMORY, "metrics: out of memory registering %s", name);
    }
    return NULL;
  }
  pthread_mutex_lock(&reg->lock);
  if (reg->count == reg->cap) {
    int cap = reg->cap > 0 ? 2 * reg->cap : 16;
    metric_family **grown = realloc(reg->families, (size_t)cap * sizeof *grown);
    if (grown == NULL) {
      pthread_mutex_unlock(&reg->lock);
      if (f->series != NULL) free_series(f->series, 0);
      free(f->help);
      free(f);
      ps_error_set(err, PS_ERR_NO_MEMORY, "metrics: out of memory registering %s", name);
      return NULL;
    }
    reg->families = grown;
    reg->cap = cap;
  }
  reg->families[reg->count++] = f;
  pthread_mutex_unlock(&reg->lock);
  return f;
}

/* The series of these values, created on first use; lock held. */
static metric_series *find_series(metric_family *f, const char *const *values) {
  for (metric_series *s = f->series; s != NULL; s = s->next) {
    int same = 1;
    for (int i = 0; i < f->label_count && same; i++) {
      const char *v = values != NULL && values[i] != NULL ? values[i] : "";
      same = strcmp(s->values[i], v) == 0;
    }
    if (same) return s;
  }
  return new_series(f, values);
}

void metric_inc(metric_family *f, const char *const *values, double v) {
  if (f == NULL || f->kind == METRIC_HISTOGRAM || !(v >= 0)) return;
  pthread_mutex_lock(&f->reg->lock);
  metric_series *s = find_series(f, values);
  if (s != NULL) s->value += v;
  pthread_mutex_unlock(&f->reg->lock);
}

void metric_set(metric_family *f, const char *const *values, double v) {
  if (f == NULL || f->kind != METRIC_GAUGE) return;
  pthread_mutex_lock(&f->reg->lock);
  metric_series *s = find_series(f, values);
  if (s != NULL) s->value = v;
  pthread_mutex_unlock(&f->reg->lock);
}

void metric_observe(metric_family *f, const char *const *values, double v) {
  if (f == NULL || f->kind != METRIC_HISTOGRAM || isnan(v)) return;
  pthread_mutex_lock(&f->reg->lock);
  metric_series *s = find_series(f, values);
  if (s != NULL) {
    int b = 0;
    while (b < f->bound_count && v > f->bounds[b]) b++;
    s->buckets[b]++;
    s->sum += v;
    s->count++;
  }
  pthread_mutex_unlock(&f->reg->lock);
}

/* --- rendering ---------------------------------------------------------------- */

typedef struct text_buf {
  char *data;
  size_t len, cap;
  int failed;
} text_buf;

static void put(text_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text_buf *b, const char *fmt, ...) {
  if (b->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->failed = 1;
      return;
    }
    if ((size_t)n < b->cap - b->len) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = 2 * b->cap + (size_t)n;
    char *grown = realloc(b->data, cap);
    if (grown == NULL) {
      b->failed = 1;
      return;
    }
    b->data = grown;
    b->cap = cap;
  }
}

/* Shortest of %.15g and %.17g that reads back the same; Prometheus's
 * spellings of the infinities and NaN. */
static void format_value(double v, char *out, size_t len) {
  if (isnan(v)) snprintf(out, len, "NaN");
  else if (isinf(v)) snprintf(out, len, v > 0 ? "+Inf" : "-Inf");
  else {
    snprintf(out, len, "%.15g", v);
    if (strtod(out, NULL) != v) snprintf(out, len, "%.17g", v);
  }
}

/* A label value with \, " and newline escaped; a HELP text with \ and newline. */
static void put_escaped(text_buf *b, const char *s, int quote) {
  for (; *s != '\0'; s++) {
    if (*s == '\\') put(b, "\\\\");
    else if (*s == '\n') put(b, "\\n");
    else if (quote && *s == '"') put(b, "\\\"");
    else put(b, "%c", *s);
  }
}

/* name{labels,extra} value */
static void put_sample(text_buf *b, const metric_family *f, const char *suffix,
                       const metric_series *s, const char *le, double v) {
  char value[40];
  format_value(v, value, sizeof value);
  put(b, "%s%s", f->name, suffix);
  if (f->label_count > 0 || le != NULL) {
    put(b, "{");
    for (int i = 0; i < f->label_count; i++) {
      put(b, "%s%s=\"", i > 0 ? "," : "", f->labels[i]);
      put_escaped(b, s->values[i], 1);
      put(b, "\"");
    }
    if (le != NULL) put(b, "%sle=\"%s\"", f->label_count > 0 ? "," : "", le);
    put(b, "}");
  }
  put(b, " %s\n", value);
}

static void render_family(text_buf *b, const metric_family *f) {
  static const char *const type_names[] = {"counter", "gauge", "histogram"};
  if (f->series == NULL) return;
  put(b, "# HELP %s ", f->name);
  put_escaped(b, f->help, 0);
  put(b, "\n# TYPE %s %s\n", f->name, type_names[f->kind]);
  for (const metric_series *s = f->series; s != NULL; s = s->next) {
    if (f->kind != METRIC_HISTOGRAM) {
      put_sample(b, f, "", s, NULL, s->value);
      continue;
    }
    uint64_t cumulative = 0;
    for (int i = 0; i <= f->bound_count; i++) {
      char le[40];
      format_value(i < f->bound_count ? f->bounds[i] : INFINITY, le, sizeof le);
      cumulative += s->buckets[i];
      put_sample(b, f, "_bucket", s, le, (double)cumulative);
    }
    put_sample(b, f, "_sum", s, NULL, s->sum);
    put_sample(b, f, "_count", s, NULL, (double)s->count);
  }
}

ps_err metrics_render(metrics_registry *reg, char **out, size_t *len, ps_error *err) {
  text_buf b = {malloc(4096), 0, 4096, 0};
  if (b.data == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "metrics: out of memory");
  b.data[0] = '\0';
  pthread_mutex_lock(&reg->lock);
  for (int i = 0; i < reg->count; i++) render_family(&b, reg->families[i]);
  pthread_mutex_unlock(&reg->lock);
  if (b.failed) {
    free(b.data);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "metrics: out of memory rendering the text");
  }
  *out = b.data;
  *len = b.len;
  return PS_ERR_OK;
}
