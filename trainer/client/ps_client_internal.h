/* What ps_client.c shares with the client's other files (recovery). */
#ifndef PSTRAIN_TRAINER_CLIENT_PS_CLIENT_INTERNAL_H
#define PSTRAIN_TRAINER_CLIENT_PS_CLIENT_INTERNAL_H

#include "trainer/client/ps_client.h"

void ps_client_fill_key(const ps_client *c, long step, Pstrain__RequestKey *key);
void ps_client_free_replies(ps_client *c);
/* Registers with every pserver at once, each call waiting up to timeout
 * seconds for its pserver to come up. Records each pserver's incarnation and
 * puts its step (async: pushes / trainers) in steps[p]. */
ps_err ps_client_register_all(ps_client *c, double timeout, long *steps, ps_error *err);
/* Sends one small message to every pserver at once; on success the replies
 * wait in c->ops for the caller (who frees them with ps_client_free_replies). */
ps_err ps_client_send_to_all(ps_client *c, const char *method, const ProtobufCMessage *m,
                             const char *what, ps_error *err);

#endif
