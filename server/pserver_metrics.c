/* The pserver's Prometheus metrics and their hooks. */
#define _POSIX_C_SOURCE 200809L
#include "server/pserver_metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "server/pserver.h"
#include "server/store/tier.h"

struct pserver_metrics {
  metric_family *pushes, *bytes, *step, *rpc, *wait, *last, *rows, *table_bytes, *budget, *ckpt, *ckpt_fail,
      *ssp_held, *ssp_lead, *open_calls, *refused, *fds, *rss, *tier_rows, *tier_lookups,
      *tier_bytes, *tier_file;
  store_tier_stats tier_was; /* counted into the counters so far */
  double tier_at;             /* when: the store's figures cost a system call or two */
};

/* From 100 us to a minute: a push-pull on loopback to a sync step's wait. */
static const double latency_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                        0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5,
                                        5,      10,      30,     60};
static const double checkpoint_bounds[] = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
#define COUNT(a) ((int)(sizeof(a) / sizeof(a)[0]))

ps_err pserver_metrics_create(pserver_metrics **out, metrics_registry *reg, ps_error *err) {
  pserver_metrics *pm = calloc(1, sizeof *pm);
  if (pm == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver metrics: out of memory");
  const struct {
    metric_family **slot;
    metric_kind kind;
    const char *name, *help, *labels;
    const double *bounds;
    int count;
  } defs[] = {
      {&pm->pushes, METRIC_COUNTER, "pstrain_pserver_pushes_total",
       "Pushes accepted from each trainer.", "trainer", NULL, 0},
      {&pm->bytes, METRIC_COUNTER, "pstrain_pserver_bytes_total",
       "Bytes of pushes received from each trainer (in) and of dense parameters sent back in step "
       "replies (out; sparse rows are not counted).",
       "trainer,direction", NULL, 0},
      {&pm->step, METRIC_GAUGE, "pstrain_pserver_step", "Steps this pserver has applied.", NULL,
       NULL, 0},
      {&pm->rpc, METRIC_HISTOGRAM, "pstrain_pserver_rpc_duration_seconds",
       "Time a call spent in the pserver's handler, per method (a sync push is answered later).",
       "method", latency_bounds, COUNT(latency_bounds)},
      {&pm->wait, METRIC_HISTOGRAM, "pstrain_pserver_sync_wait_seconds",
       "Sync steps: time from a step's first push to its last trainer's.", NULL, latency_bounds,
       COUNT(latency_bounds)},
      {&pm->last, METRIC_GAUGE, "pstrain_pserver_sync_last_trainer",
       "Sync steps: the trainer whose push completed the latest step.", NULL, NULL, 0},
      {&pm->rows, METRIC_GAUGE, "pstrain_pserver_table_rows",
       "CTR jobs: rows each sparse table holds on this pserver.", "table", NULL, 0},
      {&pm->table_bytes, METRIC_GAUGE, "pstrain_pserver_table_bytes",
       "CTR jobs: memory each sparse table holds on this pserver.", "table", NULL, 0},
      {&pm->budget, METRIC_GAUGE, "pstrain_pserver_table_memory_budget_bytes",
       "CTR jobs: memory all sparse tables on this pserver may hold together "
       "(--table-memory-mb); past it the job stops.", NULL, NULL, 0},
      {&pm->tier_rows, METRIC_GAUGE, "pstrain_pserver_tier_rows",
       "--table-dir: rows in memory, in the buffer on their way to disk, and on disk (entries: "
       "a row brought back leaves its older copy there until it moves out again).",
       "place", NULL, 0},
      {&pm->tier_lookups, METRIC_COUNTER, "pstrain_pserver_tier_lookups_total",
       "--table-dir: rows requests asked for, by where they were: memory (hits), buffer, disk, "
       "new (nowhere).", "place", NULL, 0},
      {&pm->tier_bytes, METRIC_COUNTER, "pstrain_pserver_tier_disk_bytes_total",
       "--table-dir: bytes of rows read from and written to disk.", "direction", NULL, 0},
      {&pm->tier_file, METRIC_GAUGE, "pstrain_pserver_tier_file_bytes",
       "--table-dir: disk space the row store's files take.", NULL, NULL, 0},
      {&pm->ckpt, METRIC_HISTOGRAM, "pstrain_pserver_checkpoint_duration_seconds",
       "Time to write a checkpoint, on the disk thread.", NULL, checkpoint_bounds,
       COUNT(checkpoint_bounds)},
      {&pm->ckpt_fail, METRIC_COUNTER, "pstrain_pserver_checkpoint_failures_total",
       "Checkpoints that could not be written.", NULL, NULL, 0},
      {&pm->ssp_held, METRIC_HISTOGRAM, "pstrain_pserver_ssp_held_seconds",
       "SSP jobs: time a push's reply was held for the slowest trainer (0: not held).", NULL,
       latency_bounds, COUNT(latency_bounds)},
      {&pm->ssp_lead, METRIC_GAUGE, "pstrain_pserver_ssp_max_lead",
       "SSP jobs: the most steps a trainer has been let go ahead of the slowest.", NULL, NULL, 0},
      {&pm->open_calls, METRIC_GAUGE, "pstrain_pserver_open_calls",
       "Calls open now: held for a step, reading their body, being answered.", NULL, NULL, 0},
      {&pm->refused, METRIC_COUNTER, "pstrain_pserver_rpc_refused_total",
       "Calls turned away before any handler: busy (over --max-pending-calls, "
       "RESOURCE_EXHAUSTED), unimplemented (a method not served).", "reason", NULL, 0},
      {&pm->fds, METRIC_GAUGE, "pstrain_pserver_open_fds",
       "Open file descriptors (connections, files) of the pserver.", NULL, NULL, 0},
      {&pm->rss, METRIC_GAUGE, "pstrain_pserver_resident_bytes",
       "Resident memory of the pserver.", NULL, NULL, 0},
  };
  for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++) {
    *defs[i].slot = metrics_add(reg, defs[i].kind, defs[i].name, defs[i].help, defs[i].labels,
                                defs[i].bounds, defs[i].count, err);
    if (*defs[i].slot == NULL) {
      free(pm);
      return err->code;
    }
  }
  *out = pm;
  return PS_ERR_OK;
}

void pserver_metrics_destroy(pserver_metrics *pm) { free(pm); }

void pserver_metrics_push(pserver_metrics *pm, uint32_t trainer, size_t bytes) {
  if (pm == NULL) return;
  char id[16];
  snprintf(id, sizeof id, "%u", trainer);
  metric_inc(pm->pushes, (const char *[]){id}, 1);
  metric_inc(pm->bytes, (const char *[]){id, "in"}, (double)bytes);
}


void pserver_metrics_rpc(pserver_metrics *pm, int method, double seconds) {
  if (pm == NULL || method < 0 || method >= pserver_method_count) return;
  const char *name = strrchr(pserver_methods[method], '/'); /* "/pstrain.PServer/PushPull" */
  metric_observe(pm->rpc, (const char *[]){name != NULL ? name + 1 : pserver_methods[method]},
                 seconds);
}

void pserver_metrics_sync_wait(pserver_metrics *pm, double seconds, uint32_t trainer) {
  if (pm == NULL) return;
  metric_observe(pm->wait, NULL, seconds);
  metric_set(pm->last, NULL, (double)trainer);
}

void pserver_metrics_after_step(pserver_metrics *pm, const pserver *ps, const int *slots,
                                int count, long step) {
  if (pm == NULL) return;
  for (int i = 0; i < count; i++) {
    char id[16];
    snprintf(id, sizeof id, "%d", slots[i]);
    metric_inc(pm->bytes, (const char *[]){id, "out"},
               (double)(ps->store.dense.n * wire_dtype_size(ps->job.wire_dtype)));
  }
  metric_set(pm->step, NULL, (double)step);
  for (int t = 0; t < ps->store.table_count; t++) {
    sparse_table_stats st;
    sparse_table_stats_get(ps->store.tables[t], &st);
    const char *name[] = {sparse_table_config_of(ps->store.tables[t])->name};
    metric_set(pm->rows, name, (double)st.rows);
    metric_set(pm->table_bytes, name, (double)st.bytes);
  }
  const sparse_budget *b = ps->cfg.table_budget;
  if (b != NULL && ps->store.table_count > 0 && b->limit != SIZE_MAX) {
    metric_set(pm->budget, NULL, (double)b->limit);
  }
  if (ps->store.tier == NULL || now_s() - pm->tier_at < 1.0) return;
  pm->tier_at = now_s();
  store_tier_stats now;
  store_tier_stats_get(ps, &now);
  store_tier_stats *was = &pm->tier_was;
  metric_set(pm->tier_rows, (const char *[]){"memory"}, (double)now.rows_memory);
  metric_set(pm->tier_rows, (const char *[]){"buffer"}, (double)now.rows_buffer);
  metric_set(pm->tier_rows, (const char *[]){"disk"}, (double)now.rows_disk);
  metric_inc(pm->tier_lookups, (const char *[]){"memory"}, (double)(now.hits - was->hits));
  metric_inc(pm->tier_lookups, (const char *[]){"ahead"}, (double)(now.ahead - was->ahead));
  metric_inc(pm->tier_lookups, (const char *[]){"buffer"},
             (double)(now.buffer_hits - was->buffer_hits));
  metric_inc(pm->tier_lookups, (const char *[]){"disk"}, (double)(now.disk_hits - was->disk_hits));
  metric_inc(pm->tier_lookups, (const char *[]){"new"},
             (double)(now.disk_misses - was->disk_misses));
  metric_inc(pm->tier_bytes, (const char *[]){"read"},
             (double)(now.disk_bytes_read - was->disk_bytes_read));
  metric_inc(pm->tier_bytes, (const char *[]){"written"},
             (double)(now.disk_bytes_written - was->disk_bytes_written));
  metric_set(pm->tier_file, NULL, (double)now.file_bytes);
  *was = now;
}

void pserver_metrics_ssp(pserver_metrics *pm, double held, long max_lead) {
  if (pm == NULL) return;
  metric_observe(pm->ssp_held, NULL, held);
  metric_set(pm->ssp_lead, NULL, (double)max_lead);
}

void pserver_metrics_checkpoint(pserver_metrics *pm, double seconds, int ok) {
  if (pm == NULL) return;
  if (ok) metric_observe(pm->ckpt, NULL, seconds);
  else metric_inc(pm->ckpt_fail, NULL, 1);
}

void pserver_metrics_watch(pserver_metrics *pm, int open_calls, uint64_t refused_busy,
                           uint64_t unimplemented, long open_fds, double rss_bytes) {
  if (pm == NULL) return;
  metric_set(pm->open_calls, NULL, open_calls);
  /* Both series from the start, so a rate over them never lacks one. */
  metric_inc(pm->refused, (const char *[]){"busy"}, (double)refused_busy);
  metric_inc(pm->refused, (const char *[]){"unimplemented"}, (double)unimplemented);
  if (open_fds >= 0) metric_set(pm->fds, NULL, (double)open_fds);
  if (rss_bytes >= 0) metric_set(pm->rss, NULL, rss_bytes);
}
