/* Straggler report: per statistics interval, the trainer whose push came
 * last most often and the mean time a step waited for its last push. */
#include "server/pserver_straggler.h"

#include "common/log.h"

void pserver_straggler_note(pserver *ps, int last, double now) {
  if (last < 0 || last >= ps->cfg.trainers) return;
  ps->trainers[last].stats_last++;
  ps->stats_steps++;
  double wait = now - ps->step_started;
  if (wait > 0) ps->stats_wait_s += wait;
}

void pserver_straggler_log(pserver *ps, long step) {
  if (ps->stats_steps > 0) {
    int worst = 0; /* ties: the lowest id, so the line is deterministic */
    for (int i = 1; i < ps->cfg.trainers; i++) {
      if (ps->trainers[i].stats_last > ps->trainers[worst].stats_last) worst = i;
    }
    LOG_INFO("step %ld: straggler trainer %d, last in %ld of %ld steps; mean wait for the last "
             "push %.1f ms", step, worst, ps->trainers[worst].stats_last, ps->stats_steps,
             ps->stats_wait_s / (double)ps->stats_steps * 1e3);
  }
  for (int i = 0; i < ps->cfg.trainers; i++) ps->trainers[i].stats_last = 0;
  ps->stats_steps = 0;
  ps->stats_wait_s = 0.0;
}
