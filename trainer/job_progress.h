/* The job-level part of the progress line: steps done of the job's total
 * and the time left for all of them. */
#ifndef PSTRAIN_TRAINER_JOB_PROGRESS_H
#define PSTRAIN_TRAINER_JOB_PROGRESS_H

/* The job's steps: epochs * steps_per_epoch, or --max-steps when smaller (> 0). */
long job_total_steps(long steps_per_epoch, long epochs, long max_steps);

/* Seconds left for the job's remaining steps at steps_per_s (0 when done
 * or the rate is unknown). */
double job_eta_s(long done, long total, double steps_per_s);

#endif
