/* A small thread-safe registry of Prometheus metrics: counters, gauges and
 * histograms with fixed buckets, each optionally labelled, rendered in the
 * text exposition format (version 0.0.4) for the /metrics endpoint
 * (common/metrics_http.h).
 *
 * A family is registered once with its label names; each distinct tuple of
 * label values is a series, created on first use. Updates and rendering take
 * the registry's lock, so hooks may run on any thread. Every update takes a
 * NULL family and does nothing: hooks need no "metrics on?" test. */
#ifndef PSTRAIN_COMMON_METRICS_H
#define PSTRAIN_COMMON_METRICS_H

#include <stddef.h>

#include "common/error.h"

#define METRICS_MAX_LABELS 4
#define METRICS_MAX_BUCKETS 32

typedef struct metrics_registry metrics_registry;
typedef struct metric_family metric_family;

typedef enum { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM } metric_kind;

ps_err metrics_create(metrics_registry **out, ps_error *err);
/* Frees the registry and its families (none may be used afterwards). */
void metrics_destroy(metrics_registry *reg);

/* Registers a family. labels: comma-separated label names ("trainer,direction"),
 * or NULL for none. bounds: a histogram's ascending upper bounds (+Inf is
 * implied), count at most METRICS_MAX_BUCKETS; NULL and 0 for the others.
 * Names are the caller's constants; a bad one is a programming error and
 * returns NULL with err set. An unlabelled family renders from the start
 * (at 0); a labelled one once a series exists. */
metric_family *metrics_add(metrics_registry *reg, metric_kind kind, const char *name,
                           const char *help, const char *labels, const double *bounds,
                           int bound_count, ps_error *err);

/* Updates; values holds one string per label name (NULL when unlabelled).
 * metric_inc adds v (>= 0) to a counter or gauge, metric_set sets a gauge,
 * metric_observe puts v in a histogram. Out of memory for a new series drops
 * the update (metrics must not stop the job). */
void metric_inc(metric_family *f, const char *const *values, double v);
void metric_set(metric_family *f, const char *const *values, double v);
void metric_observe(metric_family *f, const char *const *values, double v);

/* The whole registry in the text format, NUL-terminated, into a malloc'd
 * buffer the caller frees; *len excludes the NUL. */
ps_err metrics_render(metrics_registry *reg, char **out, size_t *len, ps_error *err);

#endif
