/* The pserver's Prometheus metrics: the families it registers and one hook
 * per place the service updates them. Every hook takes a NULL pserver_metrics
 * (no --metrics-listen) and does nothing. No parameter ever becomes a metric. */
#ifndef PSTRAIN_SERVER_PSERVER_METRICS_H
#define PSTRAIN_SERVER_PSERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/metrics.h"

struct pserver;
typedef struct pserver_metrics pserver_metrics;

/* Registers the pserver's families in reg (which must outlive the result). */
ps_err pserver_metrics_create(pserver_metrics **out, metrics_registry *reg, ps_error *err);
void pserver_metrics_destroy(pserver_metrics *pm);

/* A push accepted from trainer, of bytes. */
void pserver_metrics_push(pserver_metrics *pm, uint32_t trainer, size_t bytes);
/* After a step: parameters sent to the trainers in slots (count of them),
 * the pserver's step, the sparse tables' rows and bytes (lock held). */
void pserver_metrics_after_step(pserver_metrics *pm, const struct pserver *ps, const int *slots,
                                int count, long step);
/* A handled call of method (pserver_methods) and its time on the handler. */
void pserver_metrics_rpc(pserver_metrics *pm, int method, double seconds);
/* Sync: the step waited seconds from its first push to trainer's, the last. */
void pserver_metrics_sync_wait(pserver_metrics *pm, double seconds, uint32_t trainer);
/* ssp: a push's reply let go after `held` seconds (0: at once); the largest
 * lead so far. */
void pserver_metrics_ssp(pserver_metrics *pm, double held, long max_lead);
/* A checkpoint written (ok) or failed, and its seconds on the disk thread. */
void pserver_metrics_checkpoint(pserver_metrics *pm, double seconds, int ok);

/* The watch, once a second: calls open now, refusals since the last call
 * (too many open; unknown methods), open files and resident bytes (< 0:
 * unknown, left as they were). */
void pserver_metrics_watch(pserver_metrics *pm, int open_calls, uint64_t refused_busy,
                           uint64_t unimplemented, long open_fds, double rss_bytes);

#endif
