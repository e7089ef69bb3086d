/* What fuzz_corpus's files share: writing a seed, removing a scratch
 * folder, and the CTR seeds (fuzz_corpus_ctr.c). Failures exit(1). */
#ifndef PSTRAIN_TESTS_FUZZ_CORPUS_H
#define PSTRAIN_TESTS_FUZZ_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#include "common/sparse_table.h"

/* Writes data as OUT/target/name. */
void write_seed(const char *target, const char *name, const uint8_t *data, size_t len);
/* Removes folder and the files in it. */
void remove_folder(const char *folder);
/* Criteo lines for fuzz_ctr's reader inputs. */
void ctr_line_seeds(void);
/* A sparse-table checkpoint of two tables with the given rows. */
void ctr_checkpoint_seed(const char *name, sparse_optimizer_kind opt, int wide_rows,
                         int deep_rows);

#endif
