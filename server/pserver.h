/* The pserver's service: registration, push-pull in sync and async mode,
 * pull and done, each request validated before it touches the table; the
 * sync step's barrier and its deadline; statistics; checkpoints and
 * rollback. Handlers run on the RPC worker threads under one lock and never
 * touch the disk: checkpoints are copied under the lock and written, and
 * rollbacks read, by the pserver's disk thread. main polls pserver_poll.
 *
 * Files: pserver.c (dispatch, validation, registration, pull, done, poll),
 * pserver_job.c (the job's store and mode, replies, statistics),
 * mode/ (the update modes, one table of operations each: sync.c with
 * sync_dense.c, the dense sync step in parts; async.c; ssp.c, bounded
 * staleness; geo.c, GEO-SGD), store/ (what the modes update: store.c over
 * dense_shard.c and rows.c, the sparse tables' requests),
 * pserver_checkpoint.c (checkpoints, resume, rollback, the disk threads),
 * pserver_shard_file.c (a checkpoint's tensors: dense shard and table rows),
 * pserver_reshard.c (--resume onto another number of pservers). */
#ifndef PSTRAIN_SERVER_PSERVER_H
#define PSTRAIN_SERVER_PSERVER_H

#include <pthread.h>
#include <stdint.h>

#include "common/error.h"
#include "common/job.h"
#include "common/ctr_tables.h"
#include "common/rpc.h"
#include "common/timeline.h"
#include "common/sparse_table.h"
#include "common/wire.h"
#include "server/store/store.h"

typedef struct pserver_config {
  int id;
  int pservers;        /* entries in the pserver list */
  int trainers;
  double step_timeout; /* seconds a sync step may wait for the last trainer */
  long log_every;      /* steps between statistics lines */
  long max_shard_mb;   /* largest shard (parameters, state, gradient slots) to accept */
  size_t max_table_bytes; /* CTR models: each sparse table's limit here (0: none) */
  const char *table_dir; /* --table-dir: rows past the budget go to disk there ("" or NULL: none) */
  sparse_budget *table_budget; /* CTR models: all tables here together (NULL: none) */
  int continue_on_trainer_loss; /* sync: drop a trainer that misses --step-timeout */
  const char *checkpoint_dir; /* "" for none */
  long checkpoint_every;      /* steps between checkpoints (0: only at the end) */
  int check_trainer_identity; /* mutual TLS: a trainer's certificate must name trainer-<id> */
  long max_blocks_per_request; /* refuse a job whose push to this pserver has more (0: no limit) */
  long max_registrations;     /* incarnations each trainer id may register (0: no limit) */
  double trainer_lease;       /* jobs with handed-out shards: seconds a trainer may hold one
                                 without a push before it goes back to the queue */
  int authenticated;          /* every caller proved itself (token or client certificate):
                                 refusals may name values */
  timeline *timeline;         /* --timeline (NULL: none); main closes it after pserver_destroy */
  struct pserver_metrics *metrics; /* --metrics-listen's hooks; NULL without */
  struct tb_writer *tensorboard; /* --tensorboard's run (NULL: none); main closes it after
                                    pserver_destroy */
  size_t max_receive_bytes;   /* the RPC server's memory for bodies being received (0: none);
                                 a job whose step of pushes would not fit is warned about */
} pserver_config;

typedef struct trainer_state {
  int registered;
  uint64_t incarnation;
  int done;
  int pushed;          /* sync: pushed the current step (all of its blocks); the
                        * calls wait in the sync mode's state */
  long last_step;      /* async, ssp, geo: last step applied, -1 before any */
  int lost;            /* dropped after missing a step (--on-trainer-loss continue) */
  int away;            /* ssp with handed-out data: it said it has no data for now; it
                        * holds no one back until it pushes again */
  long registrations;  /* incarnations accepted so far (--max-registrations) */
  long stats_last;     /* sync: steps since the statistics line it pushed last in */
  double last_seen;    /* when its last request arrived (elastic jobs: a member while recent) */
  /* Elastic jobs, pserver 0: the id is kept for this incarnation until then
   * (assigned to a joining trainer that has not registered yet). */
  uint64_t reserved_for;
  double reserved_until;
} trainer_state;

typedef enum { PSERVER_RUNNING, PSERVER_FINISHED, PSERVER_FAILED } pserver_status;

/* A copy of the parameters that replies send from; reused once gRPC has let
 * go of it (its lease drops to zero), so no handler ever waits for gRPC. */
typedef struct params_snapshot {
  float *data; /* n floats of room; holds the job's wire dtype */
  rpc_lease lease;
} params_snapshot;

#define PSERVER_SNAPSHOTS 16

/* A rollback asked for, answered by the disk thread once the file is read. */
typedef struct pserver_rollback {
  rpc_call *call;
  long step;
  uint32_t trainer, restarted_pserver;
  uint64_t generation; /* nonzero: a reset of handed-out sync (RollbackRequest.generation) */
  uint64_t after; /* the checkpoints queued before it, written first */
  struct pserver_rollback *next;
} pserver_rollback;

/* One sparse table's rows as a checkpoint holds them, ascending keys:
 * keys (rows), values (rows x dim), state (rows x state_floats, NULL
 * without), meta (rows x 2); the arrays have room for cap rows. */
typedef struct pserver_rows {
  char name[SPARSE_TABLE_NAME_MAX];
  int dim, state_floats;
  size_t rows, cap;
  uint64_t *keys;
  float *values, *state;
  int64_t *meta;
  /* With a disk tier the rows are not in the arrays but here, counted and
   * streamed into the file by the writer (server/store/tier.h). */
  struct store_tier_snapshot *snap;
} pserver_rows;

/* The disk threads' work: a writer of checkpoints, a reader of rollbacks.
 * Lock order: pserver.lock, then this lock. */
typedef struct pserver_checkpointer {
  pthread_t writer, reader;
  int initialized; /* lock and conditions */
  int started;     /* threads running */
  pthread_mutex_t lock;
  pthread_cond_t wake; /* work queued, or quit */
  pthread_cond_t done; /* a write finished or the queue emptied */
  int quit;
  /* A checkpoint due: its state copied under the pserver's lock. At most one
   * waits while another is written; a third due waits for the write. */
  float *pending, *writing; /* (3, shard floats): params, state1, state2 */
  pserver_rows pending_rows[CTR_TABLES_MAX], writing_rows[CTR_TABLES_MAX]; /* CTR jobs;
                               freed once written */
  int tables;               /* of pending_rows and writing_rows in use */
  long pending_step;
  char *pending_queue, *writing_queue; /* pserver 0's shard queue as text (NULL: none) */
  char pending_members[64], writing_members[64]; /* sync members' counters ("": none) */
  int has_pending, busy, reading;
  uint64_t queued, written; /* checkpoints handed over / finished */
  ps_err last_rc;           /* of the newest finished write */
  char last_msg[512];
  pserver_rollback *rollbacks, **rollbacks_tail;
} pserver_checkpointer;

typedef struct pserver {
  pserver_config cfg;
  uint64_t incarnation;
  pthread_mutex_t lock;
  int configured;
  job_config job;
  uint64_t job_hash;
  int configured_by;   /* the trainer whose registration set the job; -1: a checkpoint */
  tensor_layout checkpoint_layout; /* params, optimizer state 1 and 2 of the shard */
  pserver_store store; /* the dense shard and the sparse tables */
  const struct pserver_mode_ops *mode; /* the job's update mode (server/mode/) */
  void *mode_state;    /* ... its state, private to its file */
  trainer_state *trainers;
  int *step_slots;         /* (trainers) scratch of a sync step's completion */
  rpc_call **step_calls;   /* (trainers) scratch of a sync step's completion */
  /* Updates applied: sync, steps; async and ssp, pushes (the job's step is
   * updates / trainers); geo, trainer steps merged (the same division). */
  long updates;
  double made_steps;   /* elastic async: the steps the pushes made, each 1/(members) of one */
  int pushed_count;    /* sync: trainers that pushed the current step */
  int step_torn;       /* a step in parts was cut off half applied: no checkpoint of it */
  int active;          /* trainers not lost */
  double below_min_since; /* elastic jobs, pserver 0: when live trainers fell below MIN (0: not) */
  double step_started; /* sync: when the first push of the step arrived */
  params_snapshot snapshots[PSERVER_SNAPSHOTS];
  wire_writer reply;   /* reused under the lock */
  void *reply_scratch; /* wire dtype not f32, every snapshot busy: gRPC copies from here */
  wire_block_ref *refs;
  size_t refs_cap;
  unsigned char *seen; /* per-block flags while validating a push */
  pserver_status status;
  int stopping;        /* set by pserver_abort_waiting: pushes are refused */
  ps_err stop_code;    /* ... with this code */
  char stop_reason[512];
  char failure[512];
  /* statistics since the last line */
  double stats_since;
  long stats_logged;   /* the step of the last line (-1: none yet) */
  long stats_pushes;
  uint64_t stats_in, stats_out;
  long stats_steps;       /* sync steps completed by a last push (pserver_straggler.c) */
  double stats_wait_s;    /* their summed wait from first push to last */
  int tensorboard_failed; /* a --tensorboard write failed (logged once; no more written) */
  pserver_checkpointer ckpt; /* the disk threads: checkpoints written, rollbacks read */
  struct shard_queue *shards; /* pserver 0 of a job with handed-out shards; else NULL */
  uint64_t reset_generation; /* the last reset of handed-out sync applied here (0: none) */
} pserver;

ps_err pserver_init(pserver *ps, const pserver_config *cfg, ps_error *err);
void pserver_destroy(pserver *ps);

/* The RPC handler (rpc_server_config.handler) for the methods in
 * pserver_methods, with ps as its context. */
void pserver_handle(void *ctx, rpc_call *call, int method, const rpc_message *request);
extern const char *const pserver_methods[];
extern const int pserver_method_count;

/* Checks deadlines; returns the status (finished when every trainer is done,
 * failed with ps->failure when a step waited too long). Call periodically. */
pserver_status pserver_poll(pserver *ps);

/* Answers every waiting push with code and why, and refuses pushes the same
 * way from then on: call before stopping the RPC server. UNAVAILABLE tells
 * trainers to wait for the pserver to come back (a shutdown); another code
 * that the job is over for them (a failure). */
void pserver_abort_waiting(pserver *ps, ps_err code, const char *why);

/* The job's summary at exit (thread-safe): each sparse table's rows, bytes
 * and admission counts (CTR jobs), what the staleness bound saw (ssp), the
 * pushes and rows merged (geo). */
void pserver_log_summary(pserver *ps);

/* Steps applied so far (thread-safe). */
long pserver_version(pserver *ps);

/* The checkpoint file of this pserver at `step` in cfg.checkpoint_dir. */
void pserver_checkpoint_path(const pserver *ps, long step, char *buf, size_t len);

/* Writes this pserver's shard, optimizer state, step and job to a checkpoint
 * file named by the step (atomically; the newest 3 are kept) and returns
 * once it is on disk. Nothing to do before the job is known. Thread-safe;
 * not for handlers (it waits for the disk). */
ps_err pserver_checkpoint(pserver *ps, ps_error *err);

/* Waits until every checkpoint due so far is written and every rollback
 * asked for is answered (tests, and before stopping the RPC server). */
void pserver_checkpoint_wait(pserver *ps);

/* Loads a checkpoint before serving (the newest when resume_step < 0): job,
 * shard, optimizer state, the sparse tables' rows and step. A missing,
 * corrupt or mismatched file (pserver id, trainers, CRC, hash, a row of
 * another pserver) is refused with a message naming the file and the
 * reason. When the folder holds no checkpoint of this pserver count (at
 * resume_step) but one of another count P_old, the job is re-sharded: every
 * old shard's file of the step is read (all must be there), this pserver
 * keeps the rows it now owns and its blocks of the dense model, the job's
 * pservers becomes cfg.pservers, and a checkpoint of the new count is
 * written at once. */
ps_err pserver_resume(pserver *ps, long resume_step, ps_error *err);

/* Whether cfg.checkpoint_dir holds a checkpoint of this pserver. */
int pserver_has_checkpoint(const pserver *ps);

#endif
