/* GEO-SGD for the CTR models (--update geo): each step trains here as
 * --mode local does, on this trainer's local tables and dense model; every
 * --geo-steps steps, and at the job's last step, the change since the last
 * exchange goes to the pservers: the dense blocks' and, for the sparse
 * tables, only the rows touched since then (each row's change against its
 * value when first touched in the interval). The pservers add change / N
 * and answer with the fresh blocks and rows, which replace the local ones.
 * Evaluation and export read the pservers' rows as in the other updates. */
#ifndef PSTRAIN_TRAINER_CTR_GEO_H
#define PSTRAIN_TRAINER_CTR_GEO_H

#include "common/error.h"
#include "trainer/ctr_train.h"
#include "trainer/ps_client.h"

typedef struct ctr_geo ctr_geo;

/* On a connected client of a geo job (c->sparse: the evaluation's ops,
 * restored after each exchange): takes the pservers' dense parameters into
 * t's model and makes them the first base. Nothing held on error. */
ps_err ctr_geo_create(ctr_geo **out, ctr_trainer *t, ps_client *c, ps_error *err);

/* One local step on t's current batch of `count` examples (0: none, the
 * step only counted), then the exchange when due. Adds the exchanges'
 * seconds to *comm_seconds. */
ps_err ctr_geo_step(ctr_geo *g, ctr_trainer *t, int count, long step, double *loss_sum,
                    double *comm_seconds, ps_error *err);

/* Exchanges made so far. */
long ctr_geo_exchanges(const ctr_geo *g);

void ctr_geo_destroy(ctr_geo *g);

#endif
