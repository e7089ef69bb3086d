/* Job-level progress: the ETA covers every remaining step of every epoch,
 * not only the current epoch's. */
#include "trainer/job_progress.h"

long job_total_steps(long steps_per_epoch, long epochs, long max_steps) {
  long total = steps_per_epoch * epochs;
  if (max_steps > 0 && max_steps < total) total = max_steps;
  return total;
}

double job_eta_s(long done, long total, double steps_per_s) {
  if (done >= total || !(steps_per_s > 0)) return 0.0;
  return (double)(total - done) / steps_per_s;
}
