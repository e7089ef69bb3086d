/* Metrics rows after the job went back (a pserver restart rolled it back to
 * a checkpoint): the file is append-only, so a row of steps taken again is
 * written again, marked "repeat":true; the last row of an epoch is the one
 * the job continued from. */
#ifndef PSTRAIN_TRAINER_METRICS_REPEAT_H
#define PSTRAIN_TRAINER_METRICS_REPEAT_H

/* The job goes back from step `reached`: rows up to it are repeats. */
static inline void metrics_repeat_note(long *replay_until, long reached) {
  if (reached > *replay_until) *replay_until = reached;
}

/* The field a row at global step `step` carries: ",\"repeat\":true" or "". */
static inline const char *metrics_repeat_field(long replay_until, long step) {
  return step <= replay_until ? ",\"repeat\":true" : "";
}

#endif
