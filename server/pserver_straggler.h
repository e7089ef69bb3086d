/* The straggler report: which trainer a sync step waited for last, and how
 * long, summed between statistics lines. Lock held by the callers. */
#ifndef PSTRAIN_SERVER_PSERVER_STRAGGLER_H
#define PSTRAIN_SERVER_PSERVER_STRAGGLER_H

#include "server/pserver.h"

/* Sync: trainer `last`'s push completed the step; the step waited from its
 * first push (ps->step_started) to now. */
void pserver_straggler_note(pserver *ps, int last, double now);

/* Logs the interval's straggler line at `step` (sync steps only, none when
 * no step completed on a push) and starts the next interval. */
void pserver_straggler_log(pserver *ps, long step);

#endif
