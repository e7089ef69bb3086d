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

/* Whether trainer i is waited for in the current step: not lost and, with
 * handed-out data, a member of the step still present. */
int sync_in_step(const pserver *ps, int i);
/* The step is about to be answered, count pushes in it (handed-out data:
 * pserver 0 decides the next step's members, which the replies carry). */
void sync_step_replying(pserver *ps, int count);
/* After updates++: held joins and pulls of the new step answered. */
void sync_step_begun(pserver *ps);

/* --- sync_members.c: the members of each step, with handed-out data ---------------- */

typedef struct sync_members sync_members;
ps_err sync_members_create(pserver *ps, sync_members **out, ps_error *err);
void sync_members_free(pserver *ps, sync_members *sm);
int sync_members_expected(const pserver *ps, const sync_members *sm, int i);
int sync_members_count(const pserver *ps, const sync_members *sm);
/* A push of the current step: its members are this pserver's (learned from
 * it on pservers other than 0) and name its trainer; else answered. */
ps_err sync_members_check_push(pserver *ps, sync_members *sm, rpc_call *call,
                               const rpc_message *msg, const wire_blocks_msg *m);
void sync_members_decide(pserver *ps, sync_members *sm, int count);
void sync_members_begin_step(pserver *ps, sync_members *sm);
/* A PULL_JOIN (pserver 0) or PULL_STEP: answered now or held
 * (step_started: some push of the current step is in). */
void sync_members_pull(pserver *ps, sync_members *sm, rpc_call *call, const wire_blocks_msg *m,
                       int step_started);
/* Pserver 0: when nobody trains the current step any more (its members
 * left or went silent before any push of it), the joiners waiting for the
 * next step are its members now, answered. */
void sync_members_admit_waiting(pserver *ps, sync_members *sm, int step_started);
/* Answers trainer's held join and pull (-1: all) with code. */
void sync_members_drop(pserver *ps, sync_members *sm, int trainer, ps_err code, const char *why);
/* Trainer's membership `number` (and any before it) ended here: it is not
 * waited for under it any more; returns whether the step named it so. */
int sync_members_leave(pserver *ps, sync_members *sm, int trainer, uint32_t number,
                       const char *why);
/* Whether trainer has a join or a pull held here. */
int sync_members_waiting(const sync_members *sm, int trainer);
/* Trainer's latest membership number (0: none). */
uint32_t sync_members_number(const sync_members *sm, int trainer);
/* Members that did not push within --trainer-lease of the step's first
 * push here (step_started: there was one), or within two of its start
 * (none), leave; returns how many. */
int sync_members_poll(pserver *ps, sync_members *sm, double now, int step_started);
/* Pserver 0: the members of the step a reply begins (ParamsReply.members). */
ps_err sync_members_write(const pserver *ps, const sync_members *sm, wire_writer *w);
long sync_members_schedule_step(const sync_members *sm, int trainers);
/* The counters a checkpoint keeps ("pushes=N number=M"): the schedule's
 * pushes and the membership numbers given. */
void sync_members_save(const sync_members *sm, char *buf, size_t len);
/* Back at a checkpoint (text: its counters; NULL: none kept): no step has
 * members, held joins and pulls are answered ABORTED, every trainer joins
 * again; numbers given from here are above any given before. */
ps_err sync_members_restore(pserver *ps, sync_members *sm, const char *text, ps_error *err);

#endif
