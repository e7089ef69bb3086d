/* A trainer's side of pserver mode: registration with every pserver
 * (waiting for them to come up), the initial pull, one push-pull per step
 * to all pservers at once, and done. Gradients are sent from the caller's
 * flat array as they lie; returned blocks are copied straight into the
 * caller's flat parameter array. One thread at a time. */
#ifndef PSTRAIN_TRAINER_PS_CLIENT_H
#define PSTRAIN_TRAINER_PS_CLIENT_H

#include <stdint.h>

#include "common/endpoints.h"
#include "common/error.h"
#include "common/job.h"
#include "common/rpc.h"
#include "common/shard_map.h"
#include "common/wire.h"
#include "trainer/data/data_source.h"

/* What a CTR job's messages carry besides the dense blocks (see
 * trainer/client/ps_client_sparse.h): appended to pserver p's message after its
 * blocks, and read from its reply once the reply's blocks checked out. */
typedef struct ps_client_sparse_ops {
  void *ctx;
  /* Appends pserver p's SparseRows; data may be borrowed under lease. */
  ps_err (*append)(void *ctx, int p, wire_writer *w, rpc_lease *lease, ps_error *err);
  /* Checks and copies pserver p's sparse_rows (m: its parsed reply). */
  ps_err (*take)(void *ctx, int p, const rpc_message *msg, const wire_blocks_msg *m,
                 ps_error *err);
} ps_client_sparse_ops;

/* A pserver's disk tier since it started, as its last PULL_PREFETCH
 * answer said (proto TierStats). */
typedef struct ps_tier_stats {
  uint64_t lookups, hits, ahead, rows_memory, disk_bytes_read, disk_bytes_written;
} ps_tier_stats;

typedef struct ps_client {
  int trainer_id;
  uint64_t incarnation;
  job_config job;
  uint64_t hash;
  tensor_layout layout;
  shard_map map;
  endpoint_list targets;
  rpc_client *rpc;
  rpc_channel **channels;   /* (pservers) */
  uint64_t *pserver_incarnation;
  uint8_t *pserver_tier;    /* (pservers) its rows may be on disk: it takes PULL_PREFETCH */
  int tier_pservers;        /* how many */
  ps_tier_stats *tier_stats; /* (pservers) */
  long start_step;          /* the pservers' step at registration (sync: all equal) */
  wire_writer *writers;     /* (pservers) */
  rpc_op *ops;              /* (pservers) */
  /* PULL_PREFETCH calls (ps_client_prefetch.c), collected a step later. */
  rpc_client *prefetch_rpc;
  wire_writer *prefetch_writers; /* (pservers) */
  rpc_op *prefetch_ops;          /* (pservers) */
  int *prefetch_target;          /* (pservers) prefetch_ops[k]'s pserver */
  int prefetch_started, prefetch_in_flight;
  long prefetch_step;
  wire_block_ref *refs;
  size_t refs_cap;
  unsigned char *seen;      /* per-block flags while checking a reply */
  rpc_lease lease;          /* the gradient array while it is being sent */
  uint8_t *wire_grads;      /* the gradients in the job's 16-bit wire dtype (NULL: f32) */
  double rpc_timeout;
  /* Jobs with handed-out data: where the next push's batch begins. */
  wire_position position;
  /* Sync jobs with handed-out data: the members of the step pushed next as
   * pserver 0 answered (a members list, wire.h), and this trainer's
   * membership number; members is NULL in other jobs. */
  uint8_t *members;
  size_t members_len, members_cap;
  uint32_t member_number;
  /* A reset took the job back to a checkpoint: the next NextShard takes the
   * queue's epoch, even an earlier one. */
  int went_back;
  /* Fault injection for tests (PSTRAIN_TEST_KILL_MID_PUSH=N): the N-th push
   * of this process goes to pserver 0 alone, is answered, and the process
   * kills itself (a trainer dying in the middle of a push); -1: never. */
  long kill_at_push, pushes;
  const ps_client_sparse_ops *sparse; /* NULL: an MLP job */
  struct ps_client_parts *parts;      /* an overlapped step's calls (ps_client_parts.c) */
  /* statistics */
  uint64_t bytes_sent, bytes_received;
  double comm_seconds;
} ps_client;

/* Bytes sent + received since *counted (a total this returned before, or
 * taken at start), which becomes the current total: what a step moved,
 * pushes made during backward included. */
static inline double ps_client_bytes_since(const ps_client *c, uint64_t *counted) {
  uint64_t total = c->bytes_sent + c->bytes_received;
  double moved = (double)(total - *counted);
  *counted = total;
  return moved;
}

/* Opens channels to every pserver and registers with each, waiting up to
 * connect_timeout seconds for each to come up. Fails naming the pserver it
 * could not reach, or the pserver's reason for refusing. token: the shared
 * secret every call carries (NULL for none); tls: NULL for plaintext;
 * incarnation: this process's (0: a random one). */
ps_err ps_client_connect(ps_client *c, const endpoint_list *pservers, const job_config *job,
                         int trainer_id, uint64_t incarnation, double connect_timeout,
                         double rpc_timeout, const char *token, const tls_config *tls,
                         ps_error *err);
void ps_client_close(ps_client *c);

/* Fetches every block into params (the model's flat array). */
ps_err ps_client_pull(ps_client *c, float *params, ps_error *err);

/* A pull built like a push-pull (key.step = step, the sparse ops' fields,
 * then PullRequest.kind): dense blocks into params, rows to the sparse ops.
 * In sync mode a PULL_STEP's reply must be of version step. */
ps_err ps_client_pull_kind(ps_client *c, long step, uint32_t kind, float *params, ps_error *err);

/* PULL_PREFETCH of the sparse ops' keys (the next step's) to the pservers
 * with a disk tier (nothing without one): started, not waited for; each
 * pserver answers at once and reads the rows on disk while this trainer
 * computes. The answers of the last prefetch are collected first (their
 * failure is returned then). The caller may ignore a failure: the push
 * sends the keys again. */
ps_err ps_client_prefetch(ps_client *c, long step, ps_error *err);
/* Waits for the prefetch calls in flight; the first failure, if any. */
ps_err ps_client_prefetch_collect(ps_client *c, ps_error *err);
/* Cancels and collects them (closing). */
void ps_client_prefetch_abort(ps_client *c);

/* Pushes the gradients of zero-based step `step` from grads to every pserver
 * at once and writes the returned blocks into params. In sync mode the
 * returned version must be step + 1. */
ps_err ps_client_push_pull(ps_client *c, long step, const float *grads, float *params,
                           ps_error *err);

/* Whether a failed call may succeed once the pservers are back: a pserver
 * unreachable or restarted (UNAVAILABLE), or rolled back (ABORTED). */
int ps_client_recoverable(ps_err code);

/* After the push-pull of `step` failed recoverably: registers again with
 * every pserver (waiting for those that are down), and if one restarted
 * from an older checkpoint, rolls every pserver back to its step (sync
 * mode); retries until timeout seconds have passed. On success *resume_at
 * is step + 1 when the push was resent and params hold the next step's
 * parameters, or an earlier step the job went back to, whose parameters
 * params then hold (with sparse ops: which the caller then pulls, with the
 * keys of that step). With grads NULL (a read failed: an evaluation's lookup,
 * an export) nothing is resent: *resume_at is step when every pserver is at
 * step (the caller reads again), else the step the job went back to. */
ps_err ps_client_recover(ps_client *c, long step, const float *grads, float *params,
                         double timeout, long *resume_at, ps_error *err);

/* A sync job with handed-out data, after a recoverable failure: registers
 * again within timeout seconds; where a pserver restarted, every pserver
 * goes back to the oldest step among them, reloading its checkpoint (a
 * reset named by the pservers' incarnations, done once whichever trainer
 * asks: the step's members and pushes go, pserver 0's queue is as the
 * checkpoint kept it); else the trainer leaves its membership. Either way
 * it is no member now: it joins the steps again with its next shard. */
ps_err ps_client_recover_member(ps_client *c, double timeout, ps_error *err);

/* Jobs whose data is handed out (--shard-steps): asks pserver 0 for the
 * next shard (ps_client_shards.c); see data_shard_fn. */
ps_err ps_client_next_shard(ps_client *c, long epoch, long finished, data_shard *out,
                            ps_error *err);

/* Elastic jobs: asks pserver 0 (waiting up to connect_timeout seconds for
 * it) for a trainer id, which it keeps for `incarnation` (the process's
 * ps_client_connect then registers with it). */
ps_err ps_client_join(const endpoint_list *pservers, const char *token, const tls_config *tls,
                      double connect_timeout, uint64_t incarnation, int *trainer_id,
                      ps_error *err);

/* The fault injection's push from the environment (-1: none), and the
 * death itself: called with the push's messages built. */
long ps_client_kill_at_push(void);
void ps_client_die_mid_push(ps_client *c);

/* Tells every pserver this trainer is finished. */
ps_err ps_client_done(ps_client *c, long step, ps_error *err);
/* An elastic trainer asked to stop: tells every pserver it is gone before
 * the job's data is trained (its shard goes back, nobody waits for it). */
ps_err ps_client_stop(ps_client *c, long step, ps_error *err);
/* Handed-out data, sync and ssp: tells every pserver this trainer has no
 * data for now (not done): nobody waits for it until it joins (sync) or
 * pushes (ssp) again. */
ps_err ps_client_leave(ps_client *c, ps_error *err);
/* Sync jobs with handed-out data: joins the steps (pserver 0 answers when
 * the step the trainer is a member of begins); *step is that step,
 * c->members its members, c->member_number this trainer's number. */
ps_err ps_client_sync_join(ps_client *c, long *step, ps_error *err);

#endif
