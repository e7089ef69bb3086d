/* --resume onto another number of pservers. A sparse row's owner is a
 * function of its key and the count (shard_of_key) and a dense block's of
 * the job's layout and the count (the shard map), so the rows and blocks a
 * pserver of the new count holds can be rebuilt from all the old shards'
 * files of one step. */
#ifndef PSTRAIN_SERVER_PSERVER_RESHARD_H
#define PSTRAIN_SERVER_PSERVER_RESHARD_H

#include "server/pserver.h"

/* Whether --resume re-shards: cfg.checkpoint_dir holds no checkpoint of this
 * pserver's count (at *step; at any step when *step < 0) but one of another
 * count. *old_count receives that count (0: resume as usual), *step its step
 * (the newest when *step < 0). Refuses a step with files of two other counts. */
ps_err pserver_reshard_find(const pserver *ps, long *step, int *old_count, ps_error *err);

/* Before serving: reads every shard file of `step` written by old_count
 * pservers (a missing one is refused by name), configures this pserver with
 * their job, whose pservers becomes cfg.pservers, and keeps the sparse rows
 * and dense blocks it owns under the new count. */
ps_err pserver_reshard_resume(pserver *ps, int old_count, long step, ps_error *err);

#endif
