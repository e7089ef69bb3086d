/* The one clock for durations and rates: monotonic seconds, never set back. */
#ifndef PSTRAIN_COMMON_CLOCK_H
#define PSTRAIN_COMMON_CLOCK_H

/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC). */
double now_s(void);

#endif
