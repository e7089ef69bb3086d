/* What the pserver's files share (not for other modules). Every function
 * here runs with pserver.lock held unless it says otherwise. */
#ifndef PSTRAIN_SERVER_PSERVER_INTERNAL_H
#define PSTRAIN_SERVER_PSERVER_INTERNAL_H

#include "server/pserver.h"
#include "server/pserver_metrics.h"

/* --- pserver.c --------------------------------------------------------------- */

/* Answers with an error status, logging it: a bad request changes nothing. */
void pserver_refuse(rpc_call *call, const char *method, ps_err code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Answers call with the packed message m. */
void pserver_reply_message(rpc_call *call, const ProtobufCMessage *m);

/* Answers every waiting sync push with code; they are not applied. */
void pserver_abort_waiting_locked(pserver *ps, ps_err code, const char *why);

/* --- pserver_step.c: the table, the step and replies --------------------------- */

/* Allocates the table and per-job scratch for job, refusing a job this
 * pserver should not hold; trainer -1: a checkpoint's job. */
ps_err pserver_configure(pserver *ps, const job_config *job, int trainer, ps_error *err);
/* Frees what pserver_configure allocated; the pserver is unconfigured again. */
void pserver_deconfigure(pserver *ps);

/* Answers each call with the current parameters, all from one snapshot. */
/* Where a reply without a snapshot sends from, gRPC copying: the table, or
 * for a 16-bit wire dtype its conversion in ps->reply_scratch (NULL: out of
 * memory). */
const void *pserver_reply_source_unleased(pserver *ps);
void pserver_reply_params(pserver *ps, rpc_call *const *calls, int count);

/* Appends call `index`'s sparse rows to its reply (after the blocks). */
typedef void (*pserver_rows_fn)(pserver *ps, int index, wire_writer *w, void *ctx);
/* pserver_reply_params with rows(ps, i, writer, ctx) added to reply i. */
void pserver_reply_params_rows(pserver *ps, rpc_call *const *calls, int count,
                               pserver_rows_fn rows, void *ctx);

/* A validated push (trainer registered, blocks checked) of the job's mode. */
void pserver_push_sync(pserver *ps, rpc_call *call, const rpc_message *msg,
                       const wire_blocks_msg *m);
void pserver_push_async(pserver *ps, rpc_call *call, const rpc_message *msg,
                        const wire_blocks_msg *m);

/* Logs each sparse table's rows, bytes and admission counts at `step`. */
void pserver_log_table_stats(const pserver *ps, long step);

/* Async's apply of a validated push: 1 applied, 0 a step applied before
 * (nothing done), -1 refused (answered). */
int pserver_apply_async(pserver *ps, rpc_call *call, const rpc_message *msg,
                        const wire_blocks_msg *m);
/* Async's reply to a push: `applied` as pserver_apply_async returned. */
void pserver_reply_async(pserver *ps, rpc_call *call, int applied);

/* Async-like steps (geo: by a push's steps) moved the job's step from
 * `from` to `to`: a checkpoint and statistics line when a multiple of their
 * --checkpoint-every / --log-every was passed; timeline flush. */
void pserver_after_steps(pserver *ps, long from, long to);

/* Sync: every active trainer has pushed: apply and answer them. */
void pserver_complete_step(pserver *ps);
/* After a sync step's version++ (slots: the trainers summed): checkpoint,
 * statistics line, timeline flush, metrics. */
void pserver_after_step(pserver *ps, const int *slots, int count);

/* --- pserver_parts.c: the sync step of dense jobs in parts ------------------------ */

typedef struct pserver_parts pserver_parts;
/* For sync jobs without sparse tables (ps->parts stays NULL otherwise). */
ps_err pserver_parts_configure(pserver *ps, ps_error *err);
void pserver_parts_free(pserver *ps);
/* A checked push of the current step carrying any of the trainer's blocks
 * (each once): stored, held, and whatever it completes applied and answered. */
void pserver_parts_push(pserver *ps, rpc_call *call, const rpc_message *msg,
                        const wire_blocks_msg *m);
/* A push of a step already applied: answered with its blocks' parameters. */
void pserver_parts_reply_behind(pserver *ps, rpc_call *call, const wire_blocks_msg *m);
/* Answers the held pushes of trainer (-1: all, and the step starts over)
 * with code; one trainer's unapplied blocks are forgotten. */
void pserver_parts_drop(pserver *ps, int trainer, ps_err code, const char *why);
/* Applies and answers what every active trainer has delivered (after drops). */
void pserver_parts_try_apply(pserver *ps);
/* Whether some block of the step has arrived (the step's clock runs). */
int pserver_parts_started(const pserver *ps);

/* --- pserver_ssp.c: bounded staleness ----------------------------------------- */

/* A validated push of an ssp job: applied as async; its reply waits while
 * the trainer is more than job.staleness steps ahead of the slowest. */
void pserver_push_ssp(pserver *ps, rpc_call *call, const rpc_message *msg,
                      const wire_blocks_msg *m);
/* What a registration's reply says the pserver's step is (in pushes, as
 * async counts): the slowest trainer's next step, the registering one's
 * last push included (call before it is reset), so a trainer joining late
 * starts at step 0, rather than at the average async would give. A
 * restarted trainer that was the slowest goes on where it was; one that led
 * goes back to the slowest's step and takes up to S steps again, whose
 * earlier pushes stay applied (as a restarted async trainer's do). */
uint64_t pserver_ssp_register_step(pserver *ps);
/* Answers the held pushes the slowest trainer now allows (after a push,
 * a Done, a trainer dropped). */
void pserver_ssp_release(pserver *ps);
/* Answers trainer's held push (every one: trainer -1) with code; not released. */
void pserver_ssp_drop(pserver *ps, int trainer, ps_err code, const char *why);
/* A push held past --step-timeout: drops (continue) or names (stop) the
 * trainers it waits for. */
void pserver_ssp_poll(pserver *ps, double now);
/* ssp jobs: logs what the bound saw (max lead, pushes held, time held)
 * after `when` ("step N", "job"); nothing for other jobs. */
void pserver_ssp_log(const pserver *ps, const char *when);

/* --- pserver_geo.c: GEO-SGD ------------------------------------------------------ */

/* A push's deltas flag against the job's update: geo pushes in geo jobs
 * only, and only geo pushes there; answers and returns the code if not. */
ps_err pserver_geo_check(pserver *ps, rpc_call *call, const wire_blocks_msg *m);
/* A validated geo push: changes / N added to the weights (and rows), the
 * fresh values answered; a resend (step applied before) only answered. */
void pserver_push_geo(pserver *ps, rpc_call *call, const rpc_message *msg,
                      const wire_blocks_msg *m);
/* What a registration's reply says the step is (merged trainer steps, as
 * async counts): N times the trainer's last exchange when it pushed here
 * before (call before its state is reset), else times the job's step
 * before any trainer pushed here. */
uint64_t pserver_geo_register_step(pserver *ps, int trainer);
/* geo jobs: logs the pushes and rows merged after `when`; nothing for
 * other jobs. */
void pserver_geo_log(const pserver *ps, const char *when);

/* --- store/rows.c: the sparse tables' side of requests (CTR jobs) ------------ */

/* Rows of one table as a request brought them: keys with values (n * dim)
 * or counts (n); grown on demand, owned. */
typedef struct sparse_rows {
  uint64_t *keys;
  float *values;
  uint32_t *counts;
  size_t n, keys_cap, values_cap;
} sparse_rows;

enum { SPARSE_FIELD_GRADS, SPARSE_FIELD_KEYS, SPARSE_FIELDS };

typedef struct sparse_trainer {
  sparse_rows grads[CTR_TABLES_MAX]; /* sync: its push of the current step */
  sparse_rows next[CTR_TABLES_MAX];  /* sync: the keys of its next step */
  sparse_rows pull[CTR_TABLES_MAX];  /* sync: its keys at the pull barrier */
  rpc_call *pull_call;               /* its pull at the barrier (NULL: none) */
} sparse_trainer;

typedef struct store_rows {
  sparse_trainer *trainers; /* (trainers) */
  size_t max_keys;          /* per table per request: batch * CTR_CAT_FIELDS */
  int pulled_count;         /* sync: trainers at the pull barrier */
  long pulled_step;         /* sync: the step of the last merged pull (-1: none since the
                             * tables were loaded): every active trainer's keys of it are in */
  double pull_started;      /* when the first of them arrived */
  /* The request being handled, copied out of its message by the check. */
  sparse_rows req[SPARSE_FIELDS][CTR_TABLES_MAX];
  int req_present[SPARSE_FIELDS];
  /* Merges: all keys, each one's slot in the union, summed counts or
   * gradients, the union's rows per table, one reply's rows per table. */
  sparse_dedup dedup;
  uint64_t *all;
  uint32_t *slot, *counts;
  size_t all_cap;
  float *sums, *rows[CTR_TABLES_MAX], *out[CTR_TABLES_MAX];
  size_t sums_cap, rows_cap[CTR_TABLES_MAX], out_cap[CTR_TABLES_MAX];
  size_t merged[CTR_TABLES_MAX];       /* keys in the union of the last merge */
  sparse_rows *(*which)[CTR_TABLES_MAX]; /* (trainers) each reply's rows per dense_shard */
  sparse_rows **rowp;                    /* (trainers) the rows one merge takes */
  rpc_call **pull_calls;                 /* (trainers) a completed barrier's calls */
} store_rows;

ps_err pserver_sparse_configure(pserver *ps, ps_error *err);
/* Answers what still waits (ABORTED) and frees the state. */
void pserver_sparse_deconfigure(pserver *ps);

/* Checks a request's SparseRows (pull: a Pull; lookup: counts optional)
 * and copies them to ps->store.rows->req; answers and returns the code if refused. */
ps_err pserver_sparse_check(pserver *ps, rpc_call *call, const char *method,
                            const rpc_message *msg, const wire_blocks_msg *m, int pull);
/* The largest Pull this pserver accepts (bytes). */
size_t pserver_sparse_pull_limit(const pserver *ps);

/* Sync push of trainer id accepted: keeps its checked rows for the step
 * (swapped in, no copy). */
void pserver_sparse_store_push(pserver *ps, int id);
/* Sync completion: the pushed rows of slots (id order) summed, scaled
 * 1/count, applied at ps->updates. */
ps_err pserver_sparse_apply_step(pserver *ps, const int *slots, int count, ps_error *err);
/* After version++: eviction, the merged pull of the next keys, replies. */
void pserver_sparse_reply_step(pserver *ps, const int *slots, rpc_call *const *calls, int count);
/* Async: applies the checked push scaled 1/N at schedule step `step`. */
ps_err pserver_sparse_apply_async(pserver *ps, long step, ps_error *err);
/* Async, after version++: eviction, the pull of its next keys, the reply. */
void pserver_sparse_reply_async(pserver *ps, rpc_call *call);
/* A resend: the parameters and read-only rows of the checked keys. */
void pserver_sparse_reply_lookup(pserver *ps, rpc_call *call);

/* A checked Pull (sender and SparseRows): by kind, at once or at the barrier
 * (a restarted trainer's PULL_STEP of a step already pulled: read-only rows). */
void pserver_sparse_pull(pserver *ps, rpc_call *call, const wire_blocks_msg *m);
/* Sync pull barrier: whether trainer waits there; whether the barrier has
 * waited past --step-timeout; complete it when every active trainer waits. */
int pserver_sparse_pull_waits(const pserver *ps, int trainer);
int pserver_sparse_pull_late(const pserver *ps, double now);
void pserver_sparse_pull_try_complete(pserver *ps);
/* Answers trainer's waiting pull (or every one: trainer -1) with code. */
void pserver_sparse_drop_pull(pserver *ps, int trainer, ps_err code, const char *why);

/* --- pserver_checkpoint.c: checkpoints and rollback ---------------------------------- */

ps_err pserver_checkpoint_start(pserver *ps, ps_error *err);
/* Writes what is queued, refuses queued rollbacks, joins the thread (lock not held). */
void pserver_checkpoint_stop(pserver *ps);

/* Copies the state of step ps->updates and hands it to the disk thread.
 * Returns its ticket (0: nothing to write). */
uint64_t pserver_checkpoint_due(pserver *ps);

/* Hands a checked rollback to ps->updates from `from` to the disk thread,
 * which reads the file and answers call. */
void pserver_rollback_queue(pserver *ps, rpc_call *call, long step, uint32_t trainer,
                            uint32_t restarted_pserver);

#endif
