/* Re-sharding a checkpoint onto another number of pservers: find the old
 * count's files, check they are one job's shards of one step, and rebuild
 * this pserver's rows (those shard_of_key now gives it) and dense shard
 * (each old shard scattered into the flat array, this pserver's new blocks
 * gathered from it). */
#define _POSIX_C_SOURCE 200809L
#include "server/pserver_reshard.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/checkpoint.h"
#include "common/log.h"
#include "server/pserver_internal.h"
#include "server/pserver_shard_file.h"
#include "server/store/tier.h"

static void old_path(const pserver *ps, int id, int count, long step, char *buf, size_t len) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "pserver-%d-of-%d-step-", id, count);
  checkpoint_path(ps->cfg.checkpoint_dir, prefix, step, buf, len);
}

/* Parses "pserver-ID-of-COUNT-step-STEP.safetensors" as pservers name their
 * files (nothing before or after, the step in its nine or more digits). */
static int parse_name(const char *name, int *id, int *count, long *step) {
  int end = -1;
  if (sscanf(name, "pserver-%d-of-%d-step-%ld.safetensors%n", id, count, step, &end) != 3 ||
      end < 0 || name[end] != '\0' || *count < 1 || *id < 0 || *id >= *count || *step < 0) {
    return 0;
  }
  char again[256];
  snprintf(again, sizeof again, "pserver-%d-of-%d-step-%09ld.safetensors", *id, *count, *step);
  return strcmp(again, name) == 0;
}

/* Whether this pserver count has a checkpoint at *step (any, when < 0). */
static int has_own(const pserver *ps, long step) {
  if (step < 0) return pserver_has_checkpoint(ps);
  char path[4096];
  pserver_checkpoint_path(ps, step, path, sizeof path);
  return access(path, F_OK) == 0;
}

ps_err pserver_reshard_find(const pserver *ps, long *step, int *old_count, ps_error *err) {
  *old_count = 0;
  if (has_own(ps, *step)) return PS_ERR_OK;
  DIR *d = opendir(ps->cfg.checkpoint_dir);
  if (d == NULL) return PS_ERR_OK; /* the usual path says why */
  long best = -1;
  int counts[2] = {0, 0}; /* the other counts at `best`, two to name a conflict */
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    int id, count;
    long s;
    if (!parse_name(e->d_name, &id, &count, &s) || count == ps->cfg.pservers) continue;
    if (*step >= 0 ? s != *step : s < best) continue;
    if (s > best) {
      best = s;
      counts[0] = count;
      counts[1] = 0;
    } else if (count != counts[0] && counts[1] == 0) {
      counts[1] = count;
    }
  }
  closedir(d);
  if (best < 0) return PS_ERR_OK; /* nothing to re-shard: the usual path says what is missing */
  if (counts[1] != 0) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "--resume: %s holds no checkpoint of %d pservers but checkpoints of step "
                        "%ld by %d and by %d pservers: keep one set (or give --resume-step)",
                        ps->cfg.checkpoint_dir, ps->cfg.pservers, best, counts[0], counts[1]);
  }
  *step = best;
  *old_count = counts[0];
  return PS_ERR_OK;
}

/* Checks that every old shard's file of step is there and holds that shard
 * of one job with ps's trainers; *job receives the job. */
static ps_err check_old_files(const pserver *ps, int old_count, long step, job_config *job,
                              ps_error *err) {
  char path[4096];
  for (int k = 0; k < old_count; k++) {
    old_path(ps, k, old_count, step, path, sizeof path);
    if (access(path, F_OK) != 0) {
      return ps_error_set(err, PS_ERR_IO, "--resume: re-sharding step %ld of %d pservers onto %d "
                          "needs every old shard's file: %s: %s", step, old_count,
                          ps->cfg.pservers, path, strerror(errno));
    }
  }
  for (int k = 0; k < old_count; k++) {
    old_path(ps, k, old_count, step, path, sizeof path);
    job_config file_job;
    long file_step;
    int id, count;
    if (pserver_shard_file_job(path, &file_job, &file_step, &id, &count, err) != PS_ERR_OK) {
      return ps_error_set(err, err->code, "--resume: %s", err->msg);
    }
    if (id != k || count != old_count || file_step != step || file_job.pservers != old_count) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA, "--resume: %s records shard %d of %d, step "
                          "%ld and a job of %d pservers; its name says shard %d of %d, step %ld",
                          path, id, count, file_step, file_job.pservers, k, old_count, step);
    }
    if (k == 0) {
      *job = file_job;
    } else if (job_config_hash(&file_job) != job_config_hash(job)) {
      char diff[512];
      job_config_diff(job, &file_job, diff, sizeof diff);
      return ps_error_set(err, PS_ERR_FAILED_PRECONDITION, "--resume: %s is another job's than "
                          "shard 0's (%s)", path, diff);
    }
  }
  if (job->trainers != ps->cfg.trainers) {
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "--resume: the checkpoints of step %ld were written for %d trainers; "
                        "--trainers is %d", step, job->trainers, ps->cfg.trainers);
  }
  return PS_ERR_OK;
}

/* What a re-shard gathers: the flat dense arrays and the rows kept. */
typedef struct reshard {
  shard_map old_map;
  float *flat[3]; /* params, state1, state2 of the whole model */
  pserver_rows rows[CTR_TABLES_MAX];
  size_t rows_read[CTR_TABLES_MAX];
} reshard;

static void reshard_free(reshard *rs) {
  shard_map_free(&rs->old_map);
  for (int i = 0; i < 3; i++) free(rs->flat[i]);
  for (int i = 0; i < CTR_TABLES_MAX; i++) pserver_rows_free(&rs->rows[i]);
}

/* Takes old shard k's file: its blocks into the flat arrays, its rows that
 * this pserver now owns into rs->rows. */
static ps_err take_old_file(pserver *ps, reshard *rs, int k, const char *path,
                            pserver_shard_file *f, ps_error *err) {
  size_t floats = rs->old_map.shard_floats[k];
  if (pserver_shard_file_read(path, floats > 0 ? floats : 1, ps->store.tables,
                              ps->store.table_count, k, rs->old_map.pservers, f, err) !=
      PS_ERR_OK) {
    return ps_error_set(err, err->code, "--resume: %s", err->msg);
  }
  for (int j = 0; j < 3; j++) shard_map_scatter(&rs->old_map, k, f->dense[j], rs->flat[j]);
  ps_err rc = PS_ERR_OK;
  for (int i = 0; i < ps->store.table_count && rc == PS_ERR_OK; i++) {
    const pserver_rows *src = &f->rows[i];
    size_t mine = 0;
    for (size_t r = 0; r < src->rows; r++) {
      mine += shard_of_key(src->keys[r], ps->cfg.pservers) == ps->cfg.id;
    }
    rs->rows_read[i] += src->rows;
    rc = pserver_rows_reserve(&rs->rows[i], ps->store.tables[i], rs->rows[i].rows + mine, err);
    for (size_t r = 0; r < src->rows && rc == PS_ERR_OK; r++) {
      if (shard_of_key(src->keys[r], ps->cfg.pservers) == ps->cfg.id) {
        pserver_rows_append(&rs->rows[i], src, r);
      }
    }
  }
  pserver_shard_file_free(f);
  return rc;
}

/* The configured pserver's state from the old files (lock held). */
static ps_err rebuild(pserver *ps, int old_count, long step, reshard *rs, ps_error *err) {
  dense_shard *t = &ps->store.dense;
  if (shard_map_build(&rs->old_map, &t->layout, ps->job.block_size, old_count, err) !=
      PS_ERR_OK) {
    return err->code;
  }
  for (int j = 0; j < 3; j++) {
    if ((rs->flat[j] = calloc(t->layout.total > 0 ? t->layout.total : 1, sizeof(float))) ==
        NULL) {
      return ps_error_set(err, PS_ERR_NO_MEMORY, "--resume: out of memory re-sharding %zu floats",
                          t->layout.total);
    }
  }
  pserver_shard_file *f = malloc(sizeof *f);
  if (f == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "--resume: out of memory");
  ps_err rc = PS_ERR_OK;
  char path[4096];
  for (int k = 0; k < old_count && rc == PS_ERR_OK; k++) {
    old_path(ps, k, old_count, step, path, sizeof path);
    rc = take_old_file(ps, rs, k, path, f, err);
  }
  free(f);
  if (rc != PS_ERR_OK) return rc;
  float *shard[3] = {t->params, t->state1, t->state2};
  for (int j = 0; j < 3; j++) shard_map_gather(&t->map, ps->cfg.id, rs->flat[j], shard[j]);
  for (int i = 0; i < ps->store.table_count; i++) {
    if (store_tier_load_rows(ps, i, &rs->rows[i], err) != PS_ERR_OK) {
      return ps_error_set(err, err->code, "--resume: re-sharding step %ld: %s", step, err->msg);
    }
  }
  return PS_ERR_OK;
}

ps_err pserver_reshard_resume(pserver *ps, int old_count, long step, ps_error *err) {
  job_config job;
  if (check_old_files(ps, old_count, step, &job, err) != PS_ERR_OK) return err->code;
  job.pservers = ps->cfg.pservers; /* the trainers register with the new count */
  reshard rs;
  memset(&rs, 0, sizeof rs);
  /* Before serving: reading under the lock blocks no handler. */
  pthread_mutex_lock(&ps->lock);
  ps_err rc = pserver_configure(ps, &job, -1, err);
  if (rc == PS_ERR_OK) {
    rc = rebuild(ps, old_count, step, &rs, err);
    if (rc == PS_ERR_OK) {
      ps->updates = step;
      ps->made_steps = (double)step / ps->cfg.trainers; /* as pserver_resume */
    }
    else pserver_deconfigure(ps);
  }
  pthread_mutex_unlock(&ps->lock);
  if (rc == PS_ERR_OK) {
    char tables[256] = "";
    size_t used = 0;
    for (int i = 0; i < ps->store.table_count && used < sizeof tables; i++) {
      used += (size_t)snprintf(tables + used, sizeof tables - used, "; table %s: %zu of %zu rows",
                               rs.rows[i].name, rs.rows[i].rows, rs.rows_read[i]);
    }
    LOG_INFO("re-sharded step %ld from the %d files of %d pservers onto pserver %d of %d: "
             "dense shard of %zu floats%s", step, old_count, old_count, ps->cfg.id,
             ps->cfg.pservers, ps->store.dense.n, tables);
  }
  reshard_free(&rs);
  return rc;
}
