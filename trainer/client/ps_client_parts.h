/* An overlapped sync step of a dense job (trainer side): backward hands
 * over each layer's gradient range as soon as it is final, which starts one
 * PushPull per pserver holding blocks of it, all in flight together on the
 * client's completion queue; at the end of the step every reply is awaited
 * and its blocks copied into the parameters as it arrives. A pserver answers
 * a part once every trainer's blocks of it are applied (server/mode/sync_dense.c).
 * One thread at a time, as ps_client. */
#ifndef PSTRAIN_TRAINER_PS_CLIENT_PARTS_H
#define PSTRAIN_TRAINER_PS_CLIENT_PARTS_H

#include <stddef.h>

#include "trainer/client/ps_client.h"

/* Starts the parts of zero-based step `step` (nothing is sent yet). */
ps_err ps_client_parts_begin(ps_client *c, long step, ps_error *err);

/* Pushes grads' blocks whose first float lies in [lo, hi) of the flat array:
 * one call per pserver holding any. grads must stay unchanged until
 * ps_client_parts_finish returns. */
ps_err ps_client_parts_push(ps_client *c, const float *grads, size_t lo, size_t hi,
                            ps_error *err);

/* Whether parts of a step were begun and not finished. */
int ps_client_parts_open(const ps_client *c);

/* Waits for every part's reply (each must be of version step + 1 and hold
 * exactly its blocks) and copies their blocks into params; pushes the blocks
 * no part carried, if any, first. On failure every call has ended, and err
 * names the pserver (a recoverable code: ps_client_recover resends). */
ps_err ps_client_parts_finish(ps_client *c, const float *grads, float *params, ps_error *err);

/* Cancels the calls of an unfinished step and collects them (a trainer
 * stopping mid-step; ps_client_close calls it). */
void ps_client_parts_abort(ps_client *c);

/* Frees the parts' buffers (ps_client_close calls it). */
void ps_client_parts_free(ps_client *c);

#endif
