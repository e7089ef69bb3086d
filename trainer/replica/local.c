/* Local mode: one trainer applies its optimizer and updates its tables
 * in-process; nothing is sent. */
#include <stdlib.h>

#include "trainer/replica/replica.h"
#include "trainer/train.h"

static ps_err local_pull(replica *r, long step, const data_batch *b, ps_error *err) {
  if (b->size == 0) return PS_ERR_OK;
  return replica_pull_local(r->t, step, b, err);
}

/* A step without examples (bad lines skipped) changes nothing. */
static ps_err local_push(replica *r, long step, const data_batch *b, long *next, ps_error *err) {
  if (b->size > 0) PS_TRY(replica_apply_local(r->t, step, b, err));
  replica_evict_local(r->t, step);
  *next = step + 1;
  return PS_ERR_OK;
}

static void local_destroy(replica *r) { free(r); }

static const replica_ops local_ops = {.name = "local",
                                      .holds_state = 1,
                                      .pull = local_pull,
                                      .push = local_push,
                                      .lookup = replica_lookup_local,
                                      .destroy = local_destroy};

ps_err replica_local_create(trainer *t, replica **out, ps_error *err) {
  replica *r = calloc(1, sizeof *r);
  if (r == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory");
  r->ops = &local_ops;
  r->t = t;
  t->mode_label = "local";
  t->id = 0;
  t->trainers = 1;
  *out = r;
  return PS_ERR_OK;
}
