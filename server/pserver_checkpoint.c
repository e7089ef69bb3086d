/* The pserver's disk: checkpoints, resume and rollback. Handlers never wait
 * for the disk: a checkpoint's state (parameters, optimizer state, the
 * sparse tables' rows, step) is copied under the pserver's lock and written
 * by the disk thread; a rollback is checked under the lock, its file read
 * (and its tables built) by a reader thread, and applied under the lock
 * again, its call answered from there. A rollback waits for
 * the writes asked for before it, so it never reads a checkpoint that is
 * still being written. The writer never takes the pserver's lock. */
#define _GNU_SOURCE /* SCHED_IDLE */
#include "server/pserver_internal.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "server/pserver_reshard.h"
#include "server/pserver_shard_file.h"
#include "server/store/rows.h"
#include "server/store/tier.h"

static void shard_prefix(const pserver *ps, char *buf, size_t len) {
  snprintf(buf, len, "pserver-%d-of-%d-step-", ps->cfg.id, ps->cfg.pservers);
}

void pserver_checkpoint_path(const pserver *ps, long step, char *buf, size_t len) {
  char prefix[64];
  shard_prefix(ps, prefix, sizeof prefix);
  checkpoint_path(ps->cfg.checkpoint_dir, prefix, step, buf, len);
}

int pserver_has_checkpoint(const pserver *ps) {
  char prefix[64];
  long newest;
  shard_prefix(ps, prefix, sizeof prefix);
  return checkpoint_list(ps->cfg.checkpoint_dir, prefix, &newest, 1) > 0;
}

/* Writes the state `data` and the tables' rows of `step` (disk thread; the
 * job and layout do not change while the pserver serves). */
static ps_err write_checkpoint(pserver *ps, long step, const float *data,
                               const pserver_rows *rows, int tables, const char *queue,
                               const char *members, ps_error *err) {
  char prefix[64], id[16], count[16];
  shard_prefix(ps, prefix, sizeof prefix);
  snprintf(id, sizeof id, "%d", ps->cfg.id);
  snprintf(count, sizeof count, "%d", ps->cfg.pservers);
  const char *extra[9] = {"pserver", id, "pservers", count};
  int n_extra = 4;
  if (queue != NULL) {
    extra[n_extra++] = PSERVER_SHARD_QUEUE_KEY;
    extra[n_extra++] = queue;
  }
  if (members[0] != '\0') {
    extra[n_extra++] = PSERVER_MEMBERS_KEY;
    extra[n_extra++] = members;
  }
  extra[n_extra] = NULL;
  safetensors_tensor tensors[PSERVER_SHARD_TENSORS_MAX];
  pserver_shard_fill fills[PSERVER_SHARD_TENSORS_MAX];
  int n = pserver_shard_tensors(&ps->checkpoint_layout, data, rows, tables, tensors, fills);
  return checkpoint_write_tensors(ps->cfg.checkpoint_dir, prefix, PSERVER_SHARD_FORMAT, step,
                                  &ps->job, extra, tensors, n, err);
}

/* --- the disk thread --------------------------------------------------------------- */

static void run_rollback(pserver *ps, pserver_rollback *r);

/* Writes the pending checkpoint (disk lock held on entry and exit). */
static void write_pending(pserver *ps) {
  pserver_checkpointer *d = &ps->ckpt;
  float *swap = d->writing;
  d->writing = d->pending;
  d->pending = swap;
  for (int i = 0; i < d->tables; i++) {
    pserver_rows rows = d->writing_rows[i];
    d->writing_rows[i] = d->pending_rows[i];
    d->pending_rows[i] = rows;
  }
  char *queue = d->writing_queue;
  d->writing_queue = d->pending_queue;
  d->pending_queue = queue;
  memcpy(d->writing_members, d->pending_members, sizeof d->writing_members);
  long step = d->pending_step;
  int tables = d->tables;
  d->has_pending = 0;
  d->busy = 1;
  pthread_cond_broadcast(&d->done); /* the pending slot is free */
  pthread_mutex_unlock(&d->lock);
  ps_error err;
  double started = now_s();
  ps_err rc = PS_ERR_OK;
  /* A disk tier's rows: counted (a pass over them), then streamed into the file. */
  for (int i = 0; i < tables && rc == PS_ERR_OK; i++) {
    pserver_rows *r = &d->writing_rows[i];
    if (r->snap != NULL) rc = store_tier_snapshot_count(r->snap, &r->rows, &err);
  }
  if (rc == PS_ERR_OK) {
    rc = write_checkpoint(ps, step, d->writing, d->writing_rows, tables, d->writing_queue,
                          d->writing_members, &err);
  }
  pserver_metrics_checkpoint(ps->cfg.metrics, now_s() - started, rc == PS_ERR_OK);
  if (rc != PS_ERR_OK) LOG_ERROR("checkpoint at step %ld: %s", step, err.msg);
  timeline_span(ps->cfg.timeline, "checkpoint-write", step - 1, started); /* after the step it saves */
  /* The tables' copy goes at once (the dense one is kept for the next):
   * between checkpoints a pserver holds its rows once. */
  for (int i = 0; i < tables; i++) pserver_rows_free(&d->writing_rows[i]);
  pthread_mutex_lock(&d->lock);
  d->last_rc = rc;
  snprintf(d->last_msg, sizeof d->last_msg, "%s", rc == PS_ERR_OK ? "" : err.msg);
  d->written++;
  d->busy = 0;
  pthread_cond_broadcast(&d->done);
}

/* The writer: it never takes the pserver's lock, so a handler may wait for it. */
static void *writer_thread(void *arg) {
  pserver *ps = arg;
  pserver_checkpointer *d = &ps->ckpt;
  pthread_mutex_lock(&d->lock);
  for (;;) {
    if (d->has_pending) write_pending(ps);
    else if (d->quit) break;
    else pthread_cond_wait(&d->wake, &d->lock);
  }
  pthread_mutex_unlock(&d->lock);
  return NULL;
}

/* The reader of rollbacks: each after the writes asked for before it. */
static void *rollback_thread(void *arg) {
  pserver *ps = arg;
  pserver_checkpointer *d = &ps->ckpt;
  pthread_mutex_lock(&d->lock);
  for (;;) {
    if (d->rollbacks != NULL && d->written >= d->rollbacks->after) {
      pserver_rollback *r = d->rollbacks;
      d->rollbacks = r->next;
      if (d->rollbacks == NULL) d->rollbacks_tail = &d->rollbacks;
      d->reading = 1;
      pthread_mutex_unlock(&d->lock);
      run_rollback(ps, r);
      pthread_mutex_lock(&d->lock);
      d->reading = 0;
      pthread_cond_broadcast(&d->done);
    } else if (d->rollbacks == NULL && d->quit) {
      break;
    } else if (d->rollbacks != NULL) {
      pthread_cond_wait(&d->done, &d->lock); /* for the writes before it */
    } else {
      pthread_cond_wait(&d->wake, &d->lock);
    }
  }
  pthread_mutex_unlock(&d->lock);
  return NULL;
}

/* The writer runs only when a core is otherwise idle (SCHED_IDLE): a sync
 * step is latency-bound, and a write taking a core from a handler delayed
 * the trainers. A sync job idles between steps, so the writes still get
 * done; should they fall a checkpoint behind, the next checkpoint waits. */
static void writer_yields_to_steps(pthread_t writer) {
#ifdef SCHED_IDLE
  struct sched_param param;
  memset(&param, 0, sizeof param);
  int rc = pthread_setschedparam(writer, SCHED_IDLE, &param);
  if (rc != 0) {
    LOG_WARN("checkpoint writer thread: SCHED_IDLE refused (%s): it competes with the steps",
             strerror(rc));
  }
#else
  (void)writer;
#endif
}

ps_err pserver_checkpoint_start(pserver *ps, ps_error *err) {
  pserver_checkpointer *d = &ps->ckpt;
  d->rollbacks_tail = &d->rollbacks;
  int rc = pthread_mutex_init(&d->lock, NULL);
  if (rc == 0 && (rc = pthread_cond_init(&d->wake, NULL)) != 0) pthread_mutex_destroy(&d->lock);
  if (rc == 0 && (rc = pthread_cond_init(&d->done, NULL)) != 0) {
    pthread_cond_destroy(&d->wake);
    pthread_mutex_destroy(&d->lock);
  }
  if (rc != 0) return ps_error_set(err, PS_ERR_INTERNAL, "pserver: disk thread: %s", strerror(rc));
  d->initialized = 1;
  if ((rc = pthread_create(&d->writer, NULL, writer_thread, ps)) == 0) {
    d->started = 1;
    writer_yields_to_steps(d->writer);
    if ((rc = pthread_create(&d->reader, NULL, rollback_thread, ps)) == 0) d->started = 2;
  }
  if (rc != 0) {
    pserver_checkpoint_stop(ps);
    return ps_error_set(err, PS_ERR_INTERNAL, "pserver: disk thread: %s", strerror(rc));
  }
  return PS_ERR_OK;
}

void pserver_checkpoint_stop(pserver *ps) {
  pserver_checkpointer *d = &ps->ckpt;
  if (!d->initialized) return;
  pthread_mutex_lock(&d->lock);
  d->quit = 1;
  pthread_cond_broadcast(&d->wake);
  pthread_mutex_unlock(&d->lock);
  pthread_t threads[2] = {d->writer, d->reader};
  for (int i = 0; i < d->started; i++) {
    int rc = pthread_join(threads[i], NULL);
    if (rc != 0) LOG_ERROR("joining a pserver disk thread: %s", strerror(rc));
  }
  pthread_cond_destroy(&d->done);
  pthread_cond_destroy(&d->wake);
  pthread_mutex_destroy(&d->lock);
  free(d->pending);
  free(d->writing);
  d->pending = d->writing = NULL;
  free(d->pending_queue);
  free(d->writing_queue);
  d->pending_queue = d->writing_queue = NULL;
  for (int i = 0; i < CTR_TABLES_MAX; i++) {
    pserver_rows_free(&d->pending_rows[i]);
    pserver_rows_free(&d->writing_rows[i]);
  }
  d->tables = 0;
  d->started = d->initialized = 0;
}

void pserver_checkpoint_wait(pserver *ps) {
  pserver_checkpointer *d = &ps->ckpt;
  pthread_mutex_lock(&d->lock);
  while (d->has_pending || d->busy || d->reading || d->rollbacks != NULL) {
    pthread_cond_wait(&d->done, &d->lock);
  }
  pthread_mutex_unlock(&d->lock);
}

/* --- checkpoints ------------------------------------------------------------------- */

/* The two buffers of a checkpoint's state, allocated at the first one. */
static int disk_buffers(pserver_checkpointer *d, size_t floats) {
  size_t bytes = (floats > 0 ? floats : 1) * sizeof(float);
  if (d->pending == NULL) d->pending = malloc(bytes);
  if (d->writing == NULL) d->writing = malloc(bytes);
  return d->pending != NULL && d->writing != NULL;
}

uint64_t pserver_checkpoint_due(pserver *ps) {
  pserver_checkpointer *d = &ps->ckpt;
  if (!ps->configured || ps->cfg.checkpoint_dir[0] == '\0') return 0;
  size_t floats = ps->checkpoint_layout.total;
  pthread_mutex_lock(&d->lock);
  if (d->has_pending) {
    /* Two checkpoints behind: the disk is slower than --checkpoint-every.
     * Wait rather than skip: sync pservers must checkpoint the same steps. */
    LOG_WARN("checkpoint at step %ld waits for the write of step %ld: the disk is slower than "
             "one checkpoint per --checkpoint-every steps", ps->updates, d->pending_step);
    while (d->has_pending) pthread_cond_wait(&d->done, &d->lock);
  }
  uint64_t ticket = 0;
  ps_error err;
  ps_err rc = PS_ERR_OK;
  d->tables = ps->store.table_count;
  /* The rows in ascending key order: sizes vary from one checkpoint to the next. */
  for (int i = 0; i < ps->store.table_count && rc == PS_ERR_OK; i++) {
    rc = pserver_rows_checkpoint(ps, i, &d->pending_rows[i], &err);
  }
  if (rc == PS_ERR_OK && ps->shards != NULL) rc = pserver_shards_save(ps, &d->pending_queue, &err);
  if (!pserver_sync_members_save(ps, d->pending_members, sizeof d->pending_members)) {
    d->pending_members[0] = '\0';
  }
  int buffered = rc == PS_ERR_OK && disk_buffers(d, floats);
  if (rc != PS_ERR_OK) {
    LOG_ERROR("checkpoint at step %ld: %s", ps->updates, err.msg);
  } else if (!buffered) {
    LOG_ERROR("checkpoint at step %ld: out of memory for a copy of %zu floats", ps->updates,
              floats);
  }
  if (!buffered) {
    /* Not written: the rows copied so far are not held until the next checkpoint. */
    for (int i = 0; i < ps->store.table_count; i++) pserver_rows_free(&d->pending_rows[i]);
  } else {
    /* params, state1 and state2 lie one after the other in the table. */
    memcpy(d->pending, ps->store.dense.params, floats * sizeof(float));
    d->pending_step = ps->updates;
    d->has_pending = 1;
    ticket = ++d->queued;
    pthread_cond_broadcast(&d->wake);
  }
  pthread_mutex_unlock(&d->lock);
  return ticket;
}

ps_err pserver_checkpoint(pserver *ps, ps_error *err) {
  pthread_mutex_lock(&ps->lock);
  int wanted = ps->configured && ps->cfg.checkpoint_dir[0] != '\0';
  if (wanted && ps->step_torn) {
    /* --overlap: stopped with some blocks of the step applied. Writing them
     * as step N would apply them twice after --resume. */
    LOG_WARN("no checkpoint at step %ld: the step was stopped half applied; the last periodic "
             "checkpoint stands", ps->updates);
    pthread_mutex_unlock(&ps->lock);
    return PS_ERR_OK;
  }
  uint64_t ticket = pserver_checkpoint_due(ps);
  long step = ps->updates;
  pthread_mutex_unlock(&ps->lock);
  if (!wanted) return PS_ERR_OK;
  if (ticket == 0) {
    return ps_error_set(err, PS_ERR_NO_MEMORY, "checkpoint at step %ld: out of memory", step);
  }
  pserver_checkpointer *d = &ps->ckpt;
  pthread_mutex_lock(&d->lock);
  while (d->written < ticket) pthread_cond_wait(&d->done, &d->lock);
  /* Later writes are of later steps: none comes while main asks for this one. */
  ps_err rc = d->last_rc;
  if (rc != PS_ERR_OK) ps_error_set(err, rc, "%s", d->last_msg);
  pthread_mutex_unlock(&d->lock);
  return rc;
}

/* Reads a checkpoint's metadata and checks it is this pserver's shard of a
 * well-formed job; *job and *step receive what it holds. err names path. */
static ps_err read_checkpoint_job(const pserver *ps, const char *path, job_config *job,
                                  long *step, ps_error *err) {
  int id, count;
  if (pserver_shard_file_job(path, job, step, &id, &count, err) != PS_ERR_OK) return err->code;
  if (id != ps->cfg.id || count != ps->cfg.pservers) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "%s holds shard %d of %d pservers, but this is pserver %d of %d", path, id,
                        count, ps->cfg.id, ps->cfg.pservers);
  }
  return PS_ERR_OK;
}

/* Floats in each dense tensor of this pserver's checkpoints. */
static size_t shard_floats(const pserver *ps) {
  return (size_t)ps->checkpoint_layout.tensors[0].shape[0];
}

/* Copies a read file's dense shard into the table. */
static void set_dense(pserver *ps, const pserver_shard_file *f) {
  size_t n = shard_floats(ps);
  float *dst[3] = {ps->store.dense.params, ps->store.dense.state1, ps->store.dense.state2};
  for (int i = 0; i < 3; i++) memcpy(dst[i], f->dense[i], n * sizeof(float));
}

/* --- resume -------------------------------------------------------------------------- */

/* The checkpoint --resume names: resume_step's, or the newest (-1). */
static ps_err resume_path(pserver *ps, long *resume_step, char *path, size_t len, ps_error *err) {
  if (*resume_step < 0) {
    long newest;
    char prefix[64];
    shard_prefix(ps, prefix, sizeof prefix);
    int n = checkpoint_list(ps->cfg.checkpoint_dir, prefix, &newest, 1);
    if (n < 0) {
      return ps_error_set(err, PS_ERR_IO, "--resume: cannot read %s: %s", ps->cfg.checkpoint_dir,
                          strerror(errno));
    }
    if (n == 0) {
      return ps_error_set(err, PS_ERR_IO, "--resume: no checkpoint of pserver %d of %d in %s",
                          ps->cfg.id, ps->cfg.pservers, ps->cfg.checkpoint_dir);
    }
    *resume_step = newest;
  }
  pserver_checkpoint_path(ps, *resume_step, path, len);
  return PS_ERR_OK;
}

/* Loads path's shard and rows into the configured pserver (not serving yet). */
static ps_err load_file(pserver *ps, const char *path, ps_error *err) {
  pserver_shard_file *f = malloc(sizeof *f);
  if (f == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory reading %s", path);
  ps_err rc = pserver_shard_file_read(path, shard_floats(ps), ps->store.tables,
                                      ps->store.table_count, ps->cfg.id, ps->cfg.pservers, f, err);
  if (rc == PS_ERR_OK) {
    set_dense(ps, f);
    for (int i = 0; i < ps->store.table_count && rc == PS_ERR_OK; i++) {
      if ((rc = store_tier_load_rows(ps, i, &f->rows[i], err)) != PS_ERR_OK) {
        ps_error_set(err, rc, "%s: %s", path, err->msg);
      }
    }
    pserver_shard_file_free(f);
  }
  free(f);
  return rc;
}

/* --resume onto another pserver count: re-shard, then write this count's
 * file of the step, so rollbacks and restarts of the new job find it. */
static ps_err resume_resharded(pserver *ps, int old_count, long step, ps_error *err) {
  if (pserver_reshard_resume(ps, old_count, step, err) != PS_ERR_OK) return err->code;
  if (pserver_shards_resume(ps, old_count, step, err) != PS_ERR_OK) {
    pthread_mutex_lock(&ps->lock);
    pserver_deconfigure(ps);
    pthread_mutex_unlock(&ps->lock);
    return err->code;
  }
  if (ps->cfg.checkpoint_dir[0] == '\0' || pserver_checkpoint(ps, err) == PS_ERR_OK) {
    return PS_ERR_OK;
  }
  pthread_mutex_lock(&ps->lock);
  pserver_deconfigure(ps);
  pthread_mutex_unlock(&ps->lock);
  return ps_error_set(err, err->code, "--resume: writing the re-sharded checkpoint: %s", err->msg);
}

ps_err pserver_resume(pserver *ps, long resume_step, ps_error *err) {
  int old_count = 0;
  long old_step = resume_step;
  if (pserver_reshard_find(ps, &old_step, &old_count, err) != PS_ERR_OK) return err->code;
  if (old_count > 0) return resume_resharded(ps, old_count, old_step, err);
  char path[4096];
  if (resume_path(ps, &resume_step, path, sizeof path, err) != PS_ERR_OK) return err->code;
  job_config job;
  long step;
  if (read_checkpoint_job(ps, path, &job, &step, err) != PS_ERR_OK) {
    return ps_error_set(err, err->code, "--resume: %s", err->msg);
  }
  if (job.trainers != ps->cfg.trainers) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "--resume: %s was written for %d trainers; --trainers is %d", path,
                        job.trainers, ps->cfg.trainers);
  }
  if (step != resume_step || job.pservers != ps->cfg.pservers) { /* header vs name and job */
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "--resume: %s records step %ld and a job of %d "
                        "pservers; its name says step %ld of %d", path, step, job.pservers,
                        resume_step, ps->cfg.pservers);
  }
  /* Before serving: reading under the lock blocks no handler. */
  pthread_mutex_lock(&ps->lock);
  ps_err rc = pserver_configure(ps, &job, -1, err);
  if (rc == PS_ERR_OK) {
    rc = load_file(ps, path, err);
    if (rc == PS_ERR_OK) {
      ps->updates = step;
      /* Elastic async: the steps made are not kept; a full job's as many. */
      ps->made_steps = (double)step / ps->cfg.trainers;
      rc = pserver_shards_resume(ps, ps->cfg.pservers, step, err);
    }
    if (rc != PS_ERR_OK) {
      ps_error_set(err, rc, "--resume: %s", err->msg);
      pserver_deconfigure(ps);
    }
  }
  pthread_mutex_unlock(&ps->lock);
  if (rc == PS_ERR_OK) LOG_INFO("resumed from %s at step %ld", path, ps->updates);
  return rc;
}

/* --- rollback ------------------------------------------------------------------------ */

void pserver_rollback_queue(pserver *ps, rpc_call *call, long step, uint32_t trainer,
                            uint32_t restarted_pserver, uint64_t generation) {
  pserver_rollback *r = malloc(sizeof *r);
  if (r == NULL) {
    pserver_refuse(call, "Rollback", PS_ERR_NO_MEMORY, "pserver %d: out of memory", ps->cfg.id);
    return;
  }
  pserver_checkpointer *d = &ps->ckpt;
  pthread_mutex_lock(&d->lock);
  *r = (pserver_rollback){call, step, trainer, restarted_pserver, generation, d->queued, NULL};
  *d->rollbacks_tail = r;
  d->rollbacks_tail = &r->next;
  pthread_cond_broadcast(&d->wake);
  pthread_mutex_unlock(&d->lock);
}

/* A rollback's file and the tables built from it, off the lock. */
typedef struct rollback_read {
  pserver_shard_file file;
  sparse_table *tables[CTR_TABLES_MAX];
  pserver_handed_state handed; /* handed-out data: the queue, the members' counters */
} rollback_read;

static void rollback_read_free(rollback_read *rr) {
  for (int i = 0; i < CTR_TABLES_MAX; i++) sparse_table_destroy(rr->tables[i]);
  pserver_shard_file_free(&rr->file);
  pserver_handed_free(&rr->handed);
}

/* Reads this pserver's checkpoint of `step` whole, checks it and builds its
 * tables aside (no lock: the job, its hash, the layout and the tables'
 * settings do not change while serving, and only this thread replaces
 * ps->store.tables[i]). */
static ps_err read_rollback(pserver *ps, long step, rollback_read *rr, ps_error *err) {
  char path[4096];
  pserver_checkpoint_path(ps, step, path, sizeof path);
  job_config job;
  long file_step;
  if (read_checkpoint_job(ps, path, &job, &file_step, err) != PS_ERR_OK) return err->code;
  if (job_config_hash(&job) != ps->job_hash || file_step != step) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "%s holds step %ld of another job", path, file_step);
  }
  if (pserver_shard_file_read(path, shard_floats(ps), ps->store.tables, ps->store.table_count,
                              ps->cfg.id, ps->cfg.pservers, &rr->file, err) != PS_ERR_OK) {
    return err->code;
  }
  if (ps->job.shard_steps > 0 &&
      pserver_handed_read(path, ps->shards != NULL, &rr->handed, err) != PS_ERR_OK) {
    return err->code;
  }
  /* With a disk tier the rows are spread over memory and disk under the lock. */
  for (int i = 0; i < ps->store.table_count && ps->store.tier == NULL; i++) {
    if (sparse_table_create(&rr->tables[i], sparse_table_config_of(ps->store.tables[i]), err) !=
            PS_ERR_OK ||
        pserver_rows_load(rr->tables[i], &rr->file.rows[i], err) != PS_ERR_OK) {
      return ps_error_set(err, err->code, "%s: %s", path, err->msg);
    }
  }
  return PS_ERR_OK;
}

/* Applies a rollback whose file is read (lock held). The pserver moved on
 * while the file was read: what it did since is undone like the rest. The
 * tables built from the file take the place of the pserver's, whose rows
 * rr then holds, to be freed off the lock. */
static void apply_rollback(pserver *ps, const pserver_rollback *r, rollback_read *rr) {
  long from = ps->updates;
  set_dense(ps, &rr->file);
  for (int i = 0; i < ps->store.table_count && ps->store.tier != NULL; i++) {
    ps_error err;
    if (store_tier_load_rows(ps, i, &rr->file.rows[i], &err) != PS_ERR_OK) {
      LOG_ERROR("rolling back to step %ld: %s", r->step, err.msg);
      store_rows_stop_at_limit(ps, err.msg);
    }
  }
  for (int i = 0; i < ps->store.table_count && ps->store.tier == NULL; i++) {
    sparse_table *old = ps->store.tables[i];
    ps->store.tables[i] = rr->tables[i];
    rr->tables[i] = old;
  }
  ps->mode->rolled_back(ps); /* new tables: what the mode kept of steps goes */
  ps->updates = r->step;
  ps_error err;
  if (pserver_handed_apply(ps, &rr->handed, &err) != PS_ERR_OK) {
    snprintf(ps->failure, sizeof ps->failure, "rolling back to step %ld: %.400s", r->step,
             err.msg);
    ps->status = PSERVER_FAILED; /* main logs it */
  }
  if (r->generation != 0) ps->reset_generation = r->generation;
  char why[128];
  snprintf(why, sizeof why, "pserver %d rolled back to step %ld", ps->cfg.id, r->step);
  pserver_abort_waiting_locked(ps, PS_ERR_ABORTED, why);
  ps->step_torn = 0; /* the checkpoint just loaded is whole */
  LOG_WARN("rolled back from step %ld to %ld, loading its checkpoint: pserver %u restarted "
           "from there (asked by trainer %u)%s", from, r->step, r->restarted_pserver, r->trainer,
           r->generation != 0 ? "; every trainer joins the steps again" : "");
}

/* Disk thread: reads the file, then answers under the pserver's lock. */
static void run_rollback(pserver *ps, pserver_rollback *r) {
  ps_error err;
  rollback_read *rr = calloc(1, sizeof *rr);
  ps_err rc = rr != NULL ? read_rollback(ps, r->step, rr, &err)
                         : ps_error_set(&err, PS_ERR_NO_MEMORY, "out of memory");
  pthread_mutex_lock(&ps->lock);
  /* A reset of handed-out sync (generation) reloads even at the step, once
   * per generation: another trainer's ask of the same one changes nothing. */
  int seen = r->generation != 0 && r->generation == ps->reset_generation;
  int reload = !seen && (r->step != ps->updates || r->generation != 0);
  if (ps->stopping) {
    pserver_refuse(r->call, "Rollback", ps->stop_code, "%s", ps->stop_reason);
  } else if (!seen && r->step > ps->updates) {
    pserver_refuse(r->call, "Rollback", PS_ERR_FAILED_PRECONDITION,
                   "cannot roll forward from step %ld to %ld", ps->updates, r->step);
  } else if (reload && rc != PS_ERR_OK) {
    pserver_refuse(r->call, "Rollback", PS_ERR_FAILED_PRECONDITION,
                   "pserver %d cannot roll back from step %ld to %ld: %s", ps->cfg.id,
                   ps->updates, r->step, err.msg);
  } else {
    /* At the step already (another trainer asked first): the step's pushes stay. */
    if (reload) apply_rollback(ps, r, rr);
    Pstrain__RollbackReply reply = PSTRAIN__ROLLBACK_REPLY__INIT;
    reply.pserver_incarnation = ps->incarnation;
    reply.step = (uint64_t)ps->updates;
    pserver_reply_message(r->call, &reply.base);
  }
  pthread_mutex_unlock(&ps->lock);
  if (rr != NULL) rollback_read_free(rr);
  free(rr);
  free(r);
}
