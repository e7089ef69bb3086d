/* The memory a pserver's tables share (sparse_budget, --table-memory-mb):
 * what a table's growth takes from it, what it holds settled, and the
 * refusal that names the table and the budget. st_reserve charges before it
 * grows the storage; a load counts in place of the rows it replaces. */
#include <stdatomic.h>

#include "common/sparse_table_internal.h"

int st_budget_take(sparse_budget *b, size_t bytes) {
  size_t used = atomic_load(&b->used);
  do {
    if (used + bytes > b->limit) return 0;
  } while (!atomic_compare_exchange_weak(&b->used, &used, used + bytes));
  return 1;
}

void st_budget_settle(sparse_table *t) {
  size_t now = st_bytes_for(t, 0, 0);
  if (now >= t->charged) atomic_fetch_add(&t->cfg.budget->used, now - t->charged);
  else atomic_fetch_sub(&t->cfg.budget->used, t->charged - now);
  t->charged = now;
}

ps_err st_budget_error(const sparse_table *t, size_t live, size_t need, ps_error *err) {
  const sparse_budget *b = t->cfg.budget;
  size_t others = atomic_load(&b->used) - t->charged;
  return ps_error_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                      "table '%s' would hold %zu rows in %.1f MiB, and this pserver's tables "
                      "together %.1f MiB: past their budget of %.1f MiB (%s)",
                      t->cfg.name, live, (double)need / 1048576.0,
                      (double)(others + need) / 1048576.0, (double)b->limit / 1048576.0,
                      b->source);
}
