/* What the pserver's files share (not for other modules). Every function
 * here runs with pserver.lock held unless it says otherwise. */
#ifndef PSTRAIN_SERVER_PSERVER_INTERNAL_H
#define PSTRAIN_SERVER_PSERVER_INTERNAL_H

#include "server/pserver.h"

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
void pserver_reply_params(pserver *ps, rpc_call *const *calls, int count);

/* A validated push (trainer registered, blocks checked) of the job's mode. */
void pserver_push_sync(pserver *ps, rpc_call *call, const rpc_message *msg,
                       const wire_blocks_msg *m);
void pserver_push_async(pserver *ps, rpc_call *call, const rpc_message *msg,
                        const wire_blocks_msg *m);

/* Sync: every active trainer has pushed: apply and answer them. */
void pserver_complete_step(pserver *ps);

/* --- pserver_disk.c: checkpoints and rollback ---------------------------------- */

ps_err pserver_disk_start(pserver *ps, ps_error *err);
/* Writes what is queued, refuses queued rollbacks, joins the thread (lock not held). */
void pserver_disk_stop(pserver *ps);

/* Copies the state of step ps->version and hands it to the disk thread.
 * Returns its ticket (0: nothing to write). */
uint64_t pserver_checkpoint_due(pserver *ps);

/* Hands a checked rollback to ps->version from `from` to the disk thread,
 * which reads the file and answers call. */
void pserver_rollback_queue(pserver *ps, rpc_call *call, long step, uint32_t trainer,
                            uint32_t restarted_pserver);

#endif
