/* The data handed out in shards (jobs with --shard-steps), held by pserver
 * 0: each epoch's examples cut into shards of shard_steps batches, each
 * shard held by at most one trainer at a time, with how far into it the
 * pservers have applied pushes. A trainer asks for a shard (NextShard) and
 * reports with each push where its batch begins: every batch before that
 * was answered by every pserver, so it is trained. A shard whose trainer is
 * gone (registered again, or its lease passed without a word) goes back to
 * the queue from there: each example of an epoch is counted once. The next
 * epoch's shards are handed out once every shard of this one is trained.
 * No lock of its own: the pserver's lock is held. */
#ifndef PSTRAIN_SERVER_SHARD_QUEUE_H
#define PSTRAIN_SERVER_SHARD_QUEUE_H

#include "common/error.h"
#include "common/job.h"
#include "common/wire.h"

typedef struct shard_queue {
  int epochs, trainers;
  long epoch_examples, shard_examples, shards; /* shards: per epoch */
  double lease_s;
  long epoch;         /* the epoch handed out; epochs: the job's data is trained */
  long *offset;       /* (shards) examples of each trained */
  double *returned_at; /* (shards) when it went back to the queue (its trainer gone); 0: not */
  int *owner;         /* (shards) the trainer holding it; -1: none */
  long *held;         /* (trainers) the shard each holds; -1: none */
  double *deadline;   /* (trainers) when its lease ends */
  long *trained_by;   /* (trainers) examples recorded this epoch */
  long *by_process;   /* (trainers) ... of them from the trainer's current process */
  /* (trainers) what the current process applied of an epoch that ended
   * before the trainer heard so (its metrics row will not say it if the
   * process is gone), and that epoch */
  long *unreported, *unreported_epoch;
  long trained;       /* examples recorded this epoch */
  long done;          /* shards trained to their end this epoch */
  long returned;      /* shards returned to the queue this epoch (their trainer gone) */
} shard_queue;

typedef enum {
  SHARD_ANSWER_GRANT = 0,      /* proto ShardAnswer's values */
  SHARD_ANSWER_WAIT = 1,
  SHARD_ANSWER_EPOCH_DONE = 2,
  SHARD_ANSWER_JOB_DONE = 3,
} shard_answer;

/* A NextShard's answer: a grant of examples [first + offset, first + end)
 * of the epoch's order (offset already trained), or the epoch to go on in. */
typedef struct shard_grant {
  shard_answer answer;
  long epoch, shard, offset, end, first;
} shard_grant;

/* The queue of a job with shard_steps > 0, at the start of epoch 0. */
ps_err shard_queue_init(shard_queue *q, const job_config *job, double lease_s, ps_error *err);
void shard_queue_free(shard_queue *q);

/* A trainer in epoch trainer_epoch asks for data; finished: it trained
 * shard finished_shard to its end; may_grant 0: it waits whatever is free
 * (an elastic job below its minimum). Returns PS_ERR_OK with the answer,
 * or PS_ERR_FAILED_PRECONDITION with why (an epoch the queue has not
 * reached). */
ps_err shard_queue_next(shard_queue *q, int trainer, long trainer_epoch, int finished,
                        long finished_shard, int may_grant, double now, shard_grant *out,
                        ps_error *err);

/* A push of trainer's batch at position p: the shard's examples before
 * p->offset are trained. 0 when the trainer does not hold that shard (its
 * lease passed: another trains it now), logged. */
int shard_queue_progress(shard_queue *q, int trainer, const wire_position *p, double now);

/* The trainer gave its shard up (why): it goes back to the queue from
 * where it was trained. */
void shard_queue_release(shard_queue *q, int trainer, const char *why);
/* The trainer's process is gone (it registered again: a new process): its
 * shard goes back; the log says how many examples the gone process had
 * applied this epoch (what its metrics rows could not say). */
void shard_queue_gone(shard_queue *q, int trainer, const char *why);

/* The trainer is known to be there (a member of a sync step, perhaps
 * waiting for another pserver): its lease starts again. */
void shard_queue_renew(shard_queue *q, int trainer, double now);
/* Leases passed: those trainers' shards go back to the queue. */
void shard_queue_expire(shard_queue *q, double now);

/* The queue as text for a checkpoint's metadata: the epoch, the shards
 * trained to their end (a bitmap) and those part-trained (where, by whom).
 * PS_ERR_OUT_OF_RANGE when it needs more than len bytes. */
ps_err shard_queue_save(const shard_queue *q, char *buf, size_t len, ps_error *err);
/* The queue (initialized for the same job) as text saved it; the shards
 * held then are held by the same trainers, their leases starting now. */
ps_err shard_queue_load(shard_queue *q, const char *text, double now, ps_error *err);

#endif
