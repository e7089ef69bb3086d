/* Which checkpoint, when (see checkpoint.h). */
#include "trainer/checkpoint.h"

#include "common/clock.h"
#include "trainer/checkpoint/formats.h"

int trainer_checkpoint_due(const trainer *t, long step, int final) {
  const trainer_options *o = &t->settings.opt;
  if (!t->rep->ops->holds_state || t->id != 0 || o->checkpoint_dir[0] == '\0') return 0;
  return final || (o->checkpoint_every > 0 && step % o->checkpoint_every == 0);
}

ps_err trainer_checkpoint_write(trainer *t, long step, ps_error *err) {
  double t0 = now_s();
  ps_err rc = t->model->tables > 0 ? table_checkpoint_write(t, step, err)
                                   : dense_checkpoint_write(t, step, err);
  timeline_span(t->tl, "checkpoint", step - 1, t0); /* after the step it saves */
  return rc;
}

ps_err trainer_checkpoint_resume(trainer *t, ps_error *err) {
  PS_TRY(t->model->tables > 0 ? table_checkpoint_resume(t, err) : dense_checkpoint_resume(t, err));
  if (t->start_step > 0) trainer_log_resume(t, "");
  return PS_ERR_OK;
}
