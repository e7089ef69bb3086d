/* A trainer's side of handed-out data: NextShard to pserver 0, a sync
 * trainer joining the steps, and the tests' death in the middle of a push. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"
#include "trainer/client/ps_client.h"

ps_err ps_client_next_shard(ps_client *c, long epoch, long finished, data_shard *out,
                            ps_error *err) {
  Pstrain__RequestKey key = PSTRAIN__REQUEST_KEY__INIT;
  key.trainer_id = (uint32_t)c->trainer_id;
  key.incarnation = c->incarnation;
  Pstrain__NextShardRequest req = PSTRAIN__NEXT_SHARD_REQUEST__INIT;
  req.key = &key;
  req.config_hash = c->hash;
  req.epoch = (uint64_t)epoch;
  req.finished = finished >= 0;
  req.finished_shard = finished >= 0 ? (uint64_t)finished : 0;
  req.went_back = c->went_back != 0;
  uint8_t *buf;
  size_t len;
  PS_TRY(wire_pack(&req.base, &buf, &len, err));
  rpc_part part = {buf, len, NULL};
  rpc_op op = {.channel = c->channels[0], .method = WIRE_METHOD_NEXT_SHARD, .parts = &part,
               .part_count = 1, .timeout_s = c->rpc_timeout};
  ps_err rc = rpc_client_call_all(c->rpc, &op, 1, err);
  free(buf);
  if (rc != PS_ERR_OK) {
    rc = ps_error_set(err, op.code != PS_ERR_OK ? op.code : rc,
                      "asking pserver 0 at %s for data: %s (%s)", c->targets.items[0],
                      op.message[0] != '\0' ? op.message : err->msg, ps_err_name(op.code));
    rpc_reply_free(&op.reply);
    return rc;
  }
  Pstrain__NextShardReply *reply = (Pstrain__NextShardReply *)wire_unpack(
      &pstrain__next_shard_reply__descriptor, &op.reply.message, err);
  rpc_reply_free(&op.reply);
  if (reply == NULL) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "asking pserver 0 for data: %s", err->msg);
  }
  if (reply->pserver_incarnation != c->pserver_incarnation[0]) {
    protobuf_c_message_free_unpacked(&reply->base, NULL);
    return ps_error_set(err, PS_ERR_ABORTED,
                        "asking pserver 0 for data: it restarted (new incarnation): register "
                        "again");
  }
  c->went_back = 0; /* pserver 0 took it in */
  *out = (data_shard){.answer = (data_shard_answer)reply->answer, .epoch = (long)reply->epoch,
                      .shard = (long)reply->shard, .offset = (long)reply->offset,
                      .end = (long)reply->end, .first = (long)reply->first,
                      .wait_s = reply->wait_s};
  protobuf_c_message_free_unpacked(&reply->base, NULL);
  if (out->answer > DATA_SHARD_JOB_DONE || out->offset > out->end || out->wait_s < 0 ||
      out->wait_s > 60) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                        "pserver 0 answered a request for data with answer %d, examples %ld..%ld "
                        "of a shard, wait %g s", (int)out->answer, out->offset, out->end,
                        out->wait_s);
  }
  return PS_ERR_OK;
}

/* Pserver 0's answer to a join: the members of the trainer's first step,
 * this trainer among them (its membership number). */
static ps_err take_members(ps_client *c, const rpc_message *msg, const wire_blocks_msg *m,
                           ps_error *err) {
  int n = c->job.trainers;
  uint32_t *numbers = malloc((size_t)n * sizeof *numbers);
  if (numbers == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "joining: out of memory");
  ps_err rc = PS_ERR_OK;
  if (m->members.len == 0 || m->members.len > c->members_cap) {
    rc = ps_error_set(err, PS_ERR_CORRUPT_DATA, "joining the steps: pserver 0 named %zu bytes "
                      "of members", m->members.len);
  } else {
    wire_copy_block(msg, &m->members, c->members);
    c->members_len = m->members.len;
    rc = wire_members_decode(c->members, c->members_len, numbers, n, err);
  }
  if (rc == PS_ERR_OK && numbers[c->trainer_id] == 0) {
    rc = ps_error_set(err, PS_ERR_CORRUPT_DATA, "joining the steps: pserver 0's members do not "
                      "name this trainer (%d)", c->trainer_id);
  }
  if (rc == PS_ERR_OK) c->member_number = numbers[c->trainer_id];
  free(numbers);
  return rc;
}

ps_err ps_client_sync_join(ps_client *c, long *step, ps_error *err) {
  if (c->members == NULL) {
    return ps_error_set(err, PS_ERR_INTERNAL, "joining the steps: not a sync job with "
                        "handed-out data");
  }
  /* PULL_JOIN to pserver 0, which admits: its reply names the step the
   * trainer is a member of and its members. */
  wire_key key = {(uint32_t)c->trainer_id, c->incarnation, 0};
  wire_writer *w = &c->writers[0];
  PS_TRY(wire_writer_begin(w, 0, err));
  wire_writer_push_header(w, &key, c->hash);
  wire_writer_pull_kind(w, PSTRAIN__PULL_KIND__PULL_JOIN);
  PS_TRY(wire_writer_check(w, err));
  rpc_op *op = &c->ops[0];
  *op = (rpc_op){.channel = c->channels[0], .method = WIRE_METHOD_PULL, .parts = w->parts,
                 .part_count = w->part_count, .timeout_s = c->rpc_timeout};
  ps_err rc = rpc_client_call_all(c->rpc, op, 1, err);
  wire_blocks_msg m = {.blocks = c->refs, .block_cap = c->refs_cap};
  if (rc != PS_ERR_OK && op->code != PS_ERR_OK) {
    rc = ps_error_set(err, op->code, "joining the steps: pserver 0 at %s: %s (%s)",
                      c->targets.items[0], op->message, ps_err_name(op->code));
  } else if (rc == PS_ERR_OK && wire_parse_blocks(&op->reply.message, &m, err) != PS_ERR_OK) {
    rc = ps_error_set(err, PS_ERR_CORRUPT_DATA, "joining the steps: pserver 0's reply: %s",
                      err->msg);
  } else if (rc == PS_ERR_OK && m.pserver_incarnation != c->pserver_incarnation[0]) {
    rc = ps_error_set(err, PS_ERR_ABORTED, "joining the steps: pserver 0 restarted");
  } else if (rc == PS_ERR_OK) {
    rc = take_members(c, &op->reply.message, &m, err);
    *step = (long)m.step;
  }
  rpc_reply_free(&op->reply);
  return rc;
}

long ps_client_kill_at_push(void) {
  const char *v = getenv("PSTRAIN_TEST_KILL_MID_PUSH");
  if (v == NULL || v[0] == '\0') return -1;
  char *end;
  long n = strtol(v, &end, 10);
  if (*end != '\0' || n < 1) {
    LOG_WARN("PSTRAIN_TEST_KILL_MID_PUSH=%s is not a push number (1, 2, ...): ignored", v);
    return -1;
  }
  return n;
}

void ps_client_die_mid_push(ps_client *c) {
  ps_error err;
  LOG_WARN("PSTRAIN_TEST_KILL_MID_PUSH: push %ld goes to pserver 0 alone, then this trainer "
           "dies", c->pushes);
  ps_err rc = rpc_client_call_all(c->rpc, c->ops, 1, &err);
  LOG_WARN("pserver 0 answered the push (%s); killing this trainer", ps_err_name(rc));
  fflush(NULL);
  raise(SIGKILL);
}

ps_err ps_client_join(const endpoint_list *pservers, const char *token, const tls_config *tls,
                      double connect_timeout, uint64_t incarnation, int *trainer_id,
                      ps_error *err) {
  rpc_client *rpc = NULL;
  rpc_channel *channel = NULL;
  PS_TRY(rpc_client_create(&rpc, token, tls, err));
  ps_err rc = rpc_channel_open(rpc, pservers->items[0], 1 << 20, 500, &channel, err);
  Pstrain__RequestKey key = PSTRAIN__REQUEST_KEY__INIT;
  key.incarnation = incarnation;
  Pstrain__RegisterRequest req = PSTRAIN__REGISTER_REQUEST__INIT;
  req.key = &key;
  req.assign_id = 1;
  uint8_t *buf = NULL;
  size_t len = 0;
  if (rc == PS_ERR_OK) rc = wire_pack(&req.base, &buf, &len, err);
  rpc_part part = {buf, len, NULL};
  rpc_op op = {.channel = channel, .method = WIRE_METHOD_REGISTER, .parts = &part,
               .part_count = 1, .timeout_s = connect_timeout, .wait_for_ready = 1};
  if (rc == PS_ERR_OK && rpc_client_call_all(rpc, &op, 1, err) != PS_ERR_OK) {
    rc = ps_error_set(err, op.code != PS_ERR_OK ? op.code : err->code,
                      "joining: asking pserver 0 at %s for a trainer id: %s (%s)",
                      pservers->items[0], op.message[0] != '\0' ? op.message : err->msg,
                      ps_err_name(op.code));
  }
  free(buf);
  if (rc == PS_ERR_OK) {
    Pstrain__RegisterReply *reply = (Pstrain__RegisterReply *)wire_unpack(
        &pstrain__register_reply__descriptor, &op.reply.message, err);
    if (reply == NULL) {
      rc = ps_error_set(err, PS_ERR_CORRUPT_DATA, "joining: pserver 0's answer: %s", err->msg);
    } else {
      *trainer_id = (int)reply->trainer_id;
      protobuf_c_message_free_unpacked(&reply->base, NULL);
      LOG_INFO("joining: pserver 0 at %s gave this trainer id %d", pservers->items[0],
               *trainer_id);
    }
  }
  rpc_reply_free(&op.reply);
  rpc_client_destroy(rpc); /* closes the channel */
  return rc;
}
