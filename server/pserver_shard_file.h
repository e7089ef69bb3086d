/* What a pserver's checkpoint file holds, written and read: the dense shard
 * ("params", "optimizer.state1", "optimizer.state2", F32, shard floats
 * each) and, for CTR jobs, each sparse table's rows this pserver owns under
 * the names local mode uses ("<table>.keys" U64 [rows], "<table>.values"
 * F32 [rows, dim], "<table>.state" F32 [rows, state floats] when the row
 * optimizer has state, "<table>.meta" I64 [rows, 2]), keys ascending.
 * Used by pserver_checkpoint.c and pserver_reshard.c only. */
#ifndef PSTRAIN_SERVER_PSERVER_SHARD_FILE_H
#define PSTRAIN_SERVER_PSERVER_SHARD_FILE_H

#include "common/safetensors.h"
#include "server/pserver.h"

#define PSERVER_SHARD_FORMAT "pstrain-pserver-shard-1"
/* Dense tensors, then at most four per table. */
#define PSERVER_SHARD_TENSORS_MAX (3 + 4 * CTR_TABLES_MAX)

/* Copies table t into r (ascending keys), growing r's arrays as needed. */
ps_err pserver_rows_take(pserver_rows *r, const sparse_table *t, ps_error *err);
/* Makes r a list of t's rows (name, dim, state floats) with room for
 * `rows` in all, keeping the rows it has. */
ps_err pserver_rows_reserve(pserver_rows *r, const sparse_table *t, size_t rows, ps_error *err);
/* Appends row i of src to dst (reserved to hold it). */
void pserver_rows_append(pserver_rows *dst, const pserver_rows *src, size_t i);
void pserver_rows_free(pserver_rows *r);

/* Replaces t's rows with r's (sparse_table_load: all or nothing). */
ps_err pserver_rows_load(sparse_table *t, const pserver_rows *r, ps_error *err);

/* Where a tensor of a table whose rows are a snapshot (rows->snap) comes
 * from, in order: one pass over the rows per tensor. */
typedef struct pserver_shard_fill {
  struct store_tier_snapshot *snap;
  int what; /* keys, values, state, meta */
  size_t dim, state_floats;
  int started;
} pserver_shard_fill;

/* The tensors of a checkpoint (out and fills hold PSERVER_SHARD_TENSORS_MAX):
 * the layout's three over data, then the tables' rows (a snapshot's counted:
 * rows->rows set). Returns how many. */
int pserver_shard_tensors(const tensor_layout *layout, const float *data,
                          const pserver_rows *rows, int tables, safetensors_tensor *out,
                          pserver_shard_fill *fills);
/* A checkpoint's copy of table t's rows: the rows themselves, or with a
 * disk tier a snapshot (lock held). */
ps_err pserver_rows_checkpoint(pserver *ps, int t, pserver_rows *r, ps_error *err);

/* Reads path's metadata: a pserver checkpoint of a well-formed job; *job,
 * *step, and *id of *count (the shard it holds) receive what it says. */
ps_err pserver_shard_file_job(const char *path, job_config *job, long *step, int *id, int *count,
                              ps_error *err);

/* A checkpoint read whole and checked; dense and rows point into file. */
typedef struct pserver_shard_file {
  safetensors_file file;
  const float *dense[3];               /* params, state1, state2 */
  pserver_rows rows[CTR_TABLES_MAX];   /* views: cap 0, not to be freed */
  int tables;
} pserver_shard_file;

/* Reads path, which must hold exactly the dense tensors of `floats` floats
 * each and the rows of `count` tables like `tables` (name, dim, state),
 * keys strictly ascending and each owned by pserver `owner` of `owners`
 * (shard_of_key). Errors name path and the reason; out needs no free then. */
ps_err pserver_shard_file_read(const char *path, size_t floats, sparse_table *const *tables,
                               int count, int owner, int owners, pserver_shard_file *out,
                               ps_error *err);
void pserver_shard_file_free(pserver_shard_file *f);

#endif
