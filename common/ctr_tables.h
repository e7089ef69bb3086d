/* The sparse tables of a CTR model as every process builds them from the
 * job: a local trainer, a collective rank, and each pserver for the rows it
 * owns. Row initialization depends only on these settings and the key, so
 * all of them create the same row. */
#ifndef PSTRAIN_COMMON_CTR_TABLES_H
#define PSTRAIN_COMMON_CTR_TABLES_H

#include <stddef.h>

#include "common/job.h"
#include "common/sparse_table.h"

enum { CTR_TABLE_WIDE = 0, CTR_TABLE_EMBEDDING = 1, CTR_TABLES_MAX = 2 };

/* New embedding rows start uniform in +-CTR_EMBED_INIT; wide weights at zero. */
#define CTR_EMBED_INIT 0.01f

/* Tables of the model: 2 for ctr (wide, embedding), 1 for lr, 0 for mlp. */
int ctr_table_count(const model_desc *model);

/* Table `table` (CTR_TABLE_*) of job, holding at most max_bytes (0: no limit). */
void ctr_table_config(const job_config *job, int table, size_t max_bytes,
                      sparse_table_config *out);

#endif
