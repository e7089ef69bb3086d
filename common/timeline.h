/* --timeline: Chrome trace events ("X" complete events, JSON array format)
 * of a pserver's or trainer's steps, for Perfetto or chrome://tracing.
 *
 * Events are buffered in memory and written once per step (timeline_flush)
 * with one pwrite that replaces the closing "]" at the end of the file by
 * the new events and a new "]". The file on disk is therefore a complete
 * JSON array after every flush, whatever ends the process afterwards
 * (SIGTERM's default action, SIGKILL, a crash): no signal handler is
 * needed, and the trainer keeps its default signal actions. Only the events
 * not yet flushed (the step in progress) are lost.
 *
 * Every function takes a NULL timeline (no --timeline) and does nothing;
 * the recording ones are safe from any thread (one mutex). Timestamps are
 * the hooks' now_s() values, written as wall-clock microseconds so the files
 * of several processes and hosts line up when loaded together. */
#ifndef PSTRAIN_COMMON_TIMELINE_H
#define PSTRAIN_COMMON_TIMELINE_H

#include "common/error.h"

typedef struct timeline timeline;

/* The steps recorded when --timeline-steps is not given: all. */
#define TIMELINE_ALL_STEPS ""

/* Parses --timeline-steps "A:B" (inclusive, zero-based job steps; "A:" to
 * the end, ":B" from 0, "" for all) into *first and *last; "A:B/K" takes
 * every K-th step from A (*every, else 1), so a long run can be sampled. */
ps_err timeline_parse_steps(const char *text, long *first, long *last, long *every,
                            ps_error *err);
/* The --timeline and --timeline-steps flags together: steps as above, refused
 * without a --timeline path to write them to. */
ps_err timeline_parse_flags(const char *path, const char *steps, long *first, long *last,
                            long *every, ps_error *err);

/* The file rank `rank` of a collective job writes for --timeline PATH: every
 * rank gets the same flags, so ranks above 0 write PATH.rankN (as exports
 * do); PATH itself otherwise ("" stays ""). */
void timeline_rank_path(const char *path, int collective, int rank, char *out, size_t len);

/* Creates (truncates) path and writes the opening "[" and the process's
 * name ("pserver 1", "trainer 0"). pid in the trace: 1000 + id for pservers,
 * 2000 + id for trainers. path "": *out is NULL and nothing is opened. */
ps_err timeline_open(timeline **out, const char *path, const char *role, int id, long first_step,
                     long last_step, long every, ps_error *err);

/* Whether events of this step are recorded. */
int timeline_wants(const timeline *tl, long step);

/* Records name over [start_s, now] for step (now_s() clock) and returns now,
 * so the next span can start there. arg_name/arg: one more integer in args
 * ("trainer" for a pserver's push), or NULL. */
double timeline_span_arg(timeline *tl, const char *name, long step, double start_s,
                         const char *arg_name, long arg);

static inline double timeline_span(timeline *tl, const char *name, long step, double start_s) {
  return timeline_span_arg(tl, name, step, start_s, NULL, 0);
}

/* Writes the buffered events (once per step). A write error is logged once
 * and ends recording; training goes on. */
void timeline_flush(timeline *tl);

/* Flushes, closes the file and frees tl. */
void timeline_close(timeline *tl);

#endif
