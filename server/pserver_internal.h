/* What the pserver's files share (not for other modules). Every function
 * here runs with pserver.lock held unless it says otherwise. */
#ifndef PSTRAIN_SERVER_PSERVER_INTERNAL_H
#define PSTRAIN_SERVER_PSERVER_INTERNAL_H

#include "server/mode/mode.h"
#include "server/pserver.h"
#include "server/pserver_metrics.h"
#include "server/store/store.h"

/* --- pserver.c --------------------------------------------------------------- */

/* Answers with an error status, logging it: a bad request changes nothing. */
void pserver_refuse(rpc_call *call, const char *method, ps_err code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Answers call with the packed message m. */
void pserver_reply_message(rpc_call *call, const ProtobufCMessage *m);

/* Answers every waiting push and pull with code; they are not applied. */
void pserver_abort_waiting_locked(pserver *ps, ps_err code, const char *why);

/* Checks a request's key (has_key: present), its trainer's registration
 * and the config hash; returns PS_ERR_OK or answers. */
ps_err pserver_check_sender(pserver *ps, rpc_call *call, const char *method, int has_key,
                            const wire_key *key, uint64_t hash);

/* Mutual TLS: a trainer acts only as the id its certificate names; answers if not. */
ps_err pserver_check_identity(pserver *ps, rpc_call *call, const char *method,
                              uint32_t trainer_id);

/* What the job's mode has waiting of trainer (-1: every one) is answered with code. */
void pserver_drop_waiting(pserver *ps, int trainer, ps_err code, const char *why);

/* --- pserver_register.c ------------------------------------------------------- */

/* A RegisterTrainer request: answered, accepted or refused. */
void pserver_handle_register(pserver *ps, rpc_call *call, const rpc_message *msg);

/* --- pserver_shards.c: the data handed out (pserver 0, jobs with shard steps) --- */

/* Pserver 0 of a job with shard steps: the queue, at the job's start
 * (trainer -1, a checkpoint's job: pserver_shards_resume follows). */
ps_err pserver_shards_configure(pserver *ps, const job_config *job, int trainer, ps_error *err);
void pserver_shards_deconfigure(pserver *ps);
/* The metadata key of pserver 0's checkpoints that holds the queue. */
#define PSERVER_SHARD_QUEUE_KEY "shard_queue"
/* The queue as a checkpoint saves it, into *text (malloc'd, replacing it). */
ps_err pserver_shards_save(pserver *ps, char **text, ps_error *err);
/* The metadata key of a sync job's checkpoints (handed-out data) that
 * holds the members' counters. */
#define PSERVER_MEMBERS_KEY "sync_members"
/* What a checkpoint keeps of the handed-out data, copied out of its
 * metadata: pserver 0's queue, a sync job's members' counters (NULL: not
 * there). */
typedef struct pserver_handed_state {
  char *queue, *members;
} pserver_handed_state;
/* Reads them from path (want_queue: it must hold a queue). */
ps_err pserver_handed_read(const char *path, int want_queue, pserver_handed_state *out,
                           ps_error *err);
void pserver_handed_free(pserver_handed_state *h);
/* Puts them in place (lock held, or not serving yet): the queue as it was,
 * holders keeping their shards; no sync step has members. */
ps_err pserver_handed_apply(pserver *ps, const pserver_handed_state *h, ps_error *err);
/* After --resume loaded step's checkpoint written by `count` pservers
 * (before serving: the lock is not needed): pserver 0's queue as pserver
 * 0's file of it holds it, the members' counters as this pserver's does
 * (not when re-sharded: they start again). */
ps_err pserver_shards_resume(pserver *ps, int count, long step, ps_error *err);
/* Elastic jobs: seconds pserver 0 keeps an id for a joining trainer that
 * has not registered yet (it opens its data first). */
#define PSERVER_JOIN_SECONDS 600.0
/* Whether trainer id i is held (now): by a member (registered, not done,
 * heard from within --trainer-lease) or by a joiner not yet registered. */
int pserver_id_held(const pserver *ps, int i, double now);
/* Elastic jobs: whether trainer i is a member now (registered, not done,
 * heard from within --trainer-lease). */
int pserver_is_member(const pserver *ps, int i, double now);
/* Elastic jobs: the members now (at least 1 when a request just came). */
int pserver_live_trainers(const pserver *ps, double now);
/* Elastic jobs (pserver_poll): finished when some trainer is done and none
 * is present any more; pserver 0 fails the job when fewer than MIN were
 * members for --step-timeout. */
void pserver_elastic_poll(pserver *ps, double now);
/* Pserver 0 (pserver_poll): shards whose holder's lease passed go back;
 * a process silent three leases holding none is counted as gone. */
void pserver_shards_poll(pserver *ps, double now);
/* A NextShard request: answered from the queue, or refused. */
void pserver_handle_next_shard(pserver *ps, rpc_call *call, const rpc_message *msg);
/* A push's data position against the job: present exactly when its data is
 * handed out; answers and returns the code if not. */
ps_err pserver_check_position(pserver *ps, rpc_call *call, const wire_blocks_msg *m);
/* An applied push's position recorded in the queue (pserver 0; else nothing). */
void pserver_shards_progress(pserver *ps, const wire_blocks_msg *m);

/* --- pserver_job.c: the job, replies and the statistics line ------------------------ */

/* Allocates the store, the mode's state and per-job scratch for job,
 * refusing a job this pserver should not hold; trainer -1: a checkpoint's job. */
ps_err pserver_configure(pserver *ps, const job_config *job, int trainer, ps_error *err);
/* Frees what pserver_configure allocated; the pserver is unconfigured again. */
void pserver_deconfigure(pserver *ps);

/* Where a reply without a snapshot sends from, gRPC copying: the dense
 * shard, or for a 16-bit wire dtype its conversion in ps->reply_scratch
 * (NULL: out of memory). */
const void *pserver_reply_source_unleased(pserver *ps);
/* Answers each call with the current parameters, all from one snapshot. */
void pserver_reply_params(pserver *ps, rpc_call *const *calls, int count);

/* Appends call `index`'s sparse rows to its reply (after the blocks). */
typedef void (*pserver_rows_fn)(pserver *ps, int index, wire_writer *w, void *ctx);
/* pserver_reply_params with rows(ps, i, writer, ctx) added to reply i. */
void pserver_reply_params_rows(pserver *ps, rpc_call *const *calls, int count,
                               pserver_rows_fn rows, void *ctx);

/* Logs each sparse table's rows, bytes and admission counts at `step`. */
void pserver_log_table_stats(const pserver *ps, long step);

/* Async-like steps (geo: by a push's steps) moved the job's step from
 * `from` to `to`: a checkpoint and statistics line when a multiple of their
 * --checkpoint-every / --log-every was passed; timeline flush. */
void pserver_after_steps(pserver *ps, long from, long to);
/* After a sync step's updates++ (slots: the trainers summed): checkpoint,
 * statistics line, timeline flush, metrics. */
void pserver_after_step(pserver *ps, const int *slots, int count);
/* After an async push took the job to step `step` (every N pushes):
 * checkpoint and statistics line when due, timeline flush. */
void pserver_after_async_step(pserver *ps, long step);

/* --- pserver_checkpoint.c: checkpoints and rollback ---------------------------- */

ps_err pserver_checkpoint_start(pserver *ps, ps_error *err);
/* Writes what is queued, refuses queued rollbacks, joins the thread (lock not held). */
void pserver_checkpoint_stop(pserver *ps);

/* Copies the state of step ps->updates and hands it to the disk thread.
 * Returns its ticket (0: nothing to write). */
uint64_t pserver_checkpoint_due(pserver *ps);

/* Hands a checked rollback to ps->updates from `from` to the disk thread,
 * which reads the file and answers call. */
void pserver_rollback_queue(pserver *ps, rpc_call *call, long step, uint32_t trainer,
                            uint32_t restarted_pserver, uint64_t generation);

#endif
