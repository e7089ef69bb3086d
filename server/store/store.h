/* What a pserver stores of the job: the dense shard (every job) and the
 * sparse tables (CTR jobs), behind one struct so the update modes never ask
 * which model they serve. Not locked: the pserver's lock serializes it. */
#ifndef PSTRAIN_SERVER_STORE_STORE_H
#define PSTRAIN_SERVER_STORE_STORE_H

#include "common/ctr_tables.h"
#include "common/sparse_table.h"
#include "server/store/dense_shard.h"

typedef struct pserver_store {
  dense_shard dense; /* this pserver's blocks of the dense model */
  /* The rows of each sparse table this pserver owns (shard_of_key),
   * CTR_TABLE_* order; table_count 0 for the MLP. */
  sparse_table *tables[CTR_TABLES_MAX];
  int table_count;
  /* CTR jobs: the rows requests bring, kept per trainer for a step, and
   * the merges' scratch (store/rows.c); NULL without tables. */
  struct store_rows *rows;
} pserver_store;

#endif
