/* Inside the sync mode (sync.c, sync_dense.c): its step comes in two
 * kinds, chosen once when the job is configured. Whole pushes (sync.c):
 * each trainer's push is held whole and the step applied once every active
 * trainer's is in, rows merged (tables need it). Parts (sync_dense.c):
 * a dense store applies each block as soon as every trainer has delivered
 * it. Lock held throughout. */
#ifndef PSTRAIN_SERVER_MODE_SYNC_H
#define PSTRAIN_SERVER_MODE_SYNC_H

#include "server/pserver.h"

typedef struct sync_step_ops {
  int parts; /* a push may carry some of this pserver's blocks */
  ps_err (*configure)(pserver *ps, ps_error *err);
  void (*free)(pserver *ps);
  /* A checked push of the current step, from a trainer not lost. */
  void (*push)(pserver *ps, rpc_call *call, const rpc_message *msg, const wire_blocks_msg *m);
  /* A push of a step already applied: answered with what it asked for. */
  void (*reply_behind)(pserver *ps, rpc_call *call, const wire_blocks_msg *m);
  /* Answers trainer's held pushes (-1: all, and the step starts over)
   * with code; one trainer's unapplied blocks are forgotten. */
  void (*drop)(pserver *ps, int trainer, ps_err code, const char *why);
  /* Applies and answers what every active trainer has delivered (after drops). */
  void (*try_complete)(pserver *ps);
  /* Whether the step's clock runs (something of it arrived). */
  int (*started)(const pserver *ps);
} sync_step_ops;

extern const sync_step_ops sync_step_dense;

/* The step kind's own state (sync_dense.c's), kept with the mode's. */
void *sync_step_state(const pserver *ps);
void sync_step_set_state(pserver *ps, void *state);

#endif
