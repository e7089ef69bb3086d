/* The pserver's update modes as tables of operations: sync.c, async.c,
 * ssp.c and geo.c each fill one, with their state private to the file
 * (ps->mode_state). An operation a mode has no use for is NULL (nothing to
 * do), except register_step, push and pull_step. The job's mode is chosen
 * once, when the job is configured; pserver.c calls it and never asks
 * which it is. The modes
 * reach the dense shard and the tables only through the store (store.h).
 * Every operation runs with the pserver's lock held, on a configured
 * pserver. */
#ifndef PSTRAIN_SERVER_MODE_MODE_H
#define PSTRAIN_SERVER_MODE_MODE_H

#include <stdint.h>

#include "common/error.h"
#include "common/job.h"
#include "common/rpc.h"
#include "common/wire.h"

struct pserver;

typedef struct pserver_mode_ops {
  int deltas;            /* pushes carry parameter changes (geo), not gradients */
  int slots_per_trainer; /* a gradient slot each (sync sums them in id order); else one */
  /* Allocates the mode's state for the configured job; frees it (NULL state too). */
  ps_err (*configure)(struct pserver *ps, ps_error *err);
  void (*deconfigure)(struct pserver *ps);
  /* Whether a push may carry some of this pserver's blocks, not all (NULL: no). */
  int (*takes_parts)(const struct pserver *ps);
  /* The step a registration's reply names; called before the trainer's
   * state starts over for a new incarnation. */
  uint64_t (*register_step)(struct pserver *ps, int trainer);
  /* A checked push (sender, blocks, rows): applied, held or answered. */
  void (*push)(struct pserver *ps, rpc_call *call, const rpc_message *msg,
               const wire_blocks_msg *m);
  /* A checked PULL_STEP carrying keys (jobs with tables). */
  void (*pull_step)(struct pserver *ps, rpc_call *call, const wire_blocks_msg *m);
  /* Trainer said Done: it holds no one back any more. */
  void (*done)(struct pserver *ps, int trainer);
  /* Handed-out data: trainer has no data for now (its membership `number`
   * of a sync job ends); it holds no one back until it is back. */
  void (*leave)(struct pserver *ps, int trainer, uint64_t number);
  /* Answers with code what trainer has waiting (-1: every trainer, and a
   * step under way starts over); what it delivered and is not applied is
   * forgotten. For a trainer registering again, one dropped, a stop. */
  void (*drop)(struct pserver *ps, int trainer, ps_err code, const char *why);
  /* Deadlines (--step-timeout): drops or names the trainers waited for. */
  void (*poll)(struct pserver *ps, double now);
  /* Logs what the mode saw since the job started, after `when` ("step N",
   * "job"); NULL: nothing to say. */
  void (*log)(const struct pserver *ps, const char *when);
  /* The store was reloaded from a checkpoint (a rollback); NULL: the mode
   * does not roll back. */
  void (*rolled_back)(struct pserver *ps);
} pserver_mode_ops;

extern const pserver_mode_ops pserver_mode_sync, pserver_mode_async, pserver_mode_ssp,
    pserver_mode_geo;

/* The table of update mode `update`. */
const pserver_mode_ops *pserver_mode_of(update_mode update);

/* --- sync.c: what the pserver's replies and pulls need of it -------------------------- */

/* Pserver 0 of a sync job with handed-out data: the members of the step a
 * reply begins (ParamsReply.members); nothing otherwise. */
void pserver_sync_write_members(const struct pserver *ps, wire_writer *w);
/* A PULL_JOIN or PULL_STEP of a sync job with handed-out data: answered or
 * held, returning 1; 0 for any other pull or job. */
int pserver_sync_members_pull(struct pserver *ps, rpc_call *call, const wire_blocks_msg *m);
/* A sync job with handed-out data: its members' counters as a checkpoint
 * keeps them, into buf (returns 1), or 0 for any other job. */
int pserver_sync_members_save(const struct pserver *ps, char *buf, size_t len);
/* ... and back at a checkpoint holding text (NULL: none): see
 * sync_members_restore; nothing for any other job. */
ps_err pserver_sync_members_restore(struct pserver *ps, const char *text, ps_error *err);
/* The optimizer's step of a sync job: the step, or with handed-out data the
 * members' pushes applied / trainers (a step's size follows its members). */
long sync_schedule_step(const struct pserver *ps);

/* --- async.c: what ssp and geo share with async -------------------------------------------- */

/* Applies a checked push at once, scaled by 1/N, at schedule step
 * updates / N. Returns 1 applied, 0 a step of the trainer applied before
 * (nothing done), -1 refused (answered). */
int pserver_async_apply(struct pserver *ps, rpc_call *call, const rpc_message *msg,
                        const wire_blocks_msg *m);
/* What a registration names: the updates so far (pushes, for async). */
uint64_t pserver_async_register_step(struct pserver *ps, int trainer);
/* A PULL_STEP at once: the rows of its keys at the job's step. */
void pserver_async_pull_step(struct pserver *ps, rpc_call *call, const wire_blocks_msg *m);

#endif
