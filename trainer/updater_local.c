/* Local mode: one trainer applies its optimizer in-process; nothing is sent. */
#include <stdlib.h>

#include "common/clock.h"

#include "trainer/train.h"
#include "trainer/updater.h"

static ps_err local_apply(updater *u, long step, long *next, ps_error *err) {
  trainer *t = u->t;
  double t0 = now_s();
  if (model_apply_optimizer(t->model, &t->settings.optimizer, step, err) != PS_ERR_OK) {
    return err->code;
  }
  timeline_span(t->tl, "apply", step, t0);
  *next = step + 1;
  return PS_ERR_OK;
}

static void local_destroy(updater *u) { free(u); }

static const updater_ops local_ops = {
    .name = "local", .holds_state = 1, .apply = local_apply, .destroy = local_destroy};

ps_err updater_local_create(trainer *t, updater **out, ps_error *err) {
  updater *u = calloc(1, sizeof *u);
  if (u == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory");
  u->ops = &local_ops;
  u->t = t;
  t->mode_label = "local";
  t->id = 0;
  t->trainers = 1;
  *out = u;
  return PS_ERR_OK;
}
