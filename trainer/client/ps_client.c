/* Registration, pull, push-pull and done against every pserver of a job. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/client/ps_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/process.h"
#include "trainer/client/ps_client_internal.h"
#include "trainer/client/ps_client_parts.h"

/* Replies carry the whole shard: allow a generous multiple of it. */
#define MESSAGE_LIMIT ((size_t)2047 << 20)
#define RECONNECT_MS 500

void ps_client_fill_key(const ps_client *c, long step, Pstrain__RequestKey *key) {
  pstrain__request_key__init(key);
  key->trainer_id = (uint32_t)c->trainer_id;
  key->incarnation = c->incarnation;
  key->step = (uint64_t)step;
}

/* Says which pserver failed and how, from a batch's results. */
static ps_err batch_error(ps_client *c, const char *what, ps_err code, ps_error *err) {
  int count = c->job.pservers;
  for (int p = 0; p < count; p++) {
    rpc_op *op = &c->ops[p];
    if (op->code == PS_ERR_OK) continue;
    if (op->code == PS_ERR_TIMEOUT && op->wait_for_ready) {
      return ps_error_set(err, PS_ERR_UNAVAILABLE,
                          "could not reach pserver %d at %s within %.0f s (--connect-timeout)%s%s",
                          p, c->targets.items[p], op->timeout_s, op->message[0] ? ": " : "",
                          op->message);
    }
    if (op->code == PS_ERR_TIMEOUT) {
      return ps_error_set(err, PS_ERR_TIMEOUT,
                          "%s: pserver %d at %s did not answer within %.0f s (--rpc-timeout)",
                          what, p, c->targets.items[p], op->timeout_s);
    }
    return ps_error_set(err, op->code, "%s: pserver %d at %s: %s (%s)", what, p,
                        c->targets.items[p], op->message, ps_err_name(op->code));
  }
  return ps_error_set(err, code, "%s failed", what);
}

void ps_client_free_replies(ps_client *c) {
  for (int p = 0; p < c->job.pservers; p++) rpc_reply_free(&c->ops[p].reply);
}

ps_err ps_client_register_all(ps_client *c, double timeout, long *steps, ps_error *err) {
  int n = c->job.pservers;
  Pstrain__RequestKey key;
  Pstrain__JobConfig job_msg;
  wire_job_parts opt_msg;
  char model_text[MODEL_TEXT_MAX];
  ps_client_fill_key(c, 0, &key);
  wire_job_to_proto(&c->job, &job_msg, &opt_msg, model_text, sizeof model_text);
  uint8_t **bufs = calloc((size_t)n, sizeof *bufs);
  rpc_part *parts = calloc((size_t)n, sizeof *parts);
  if (bufs == NULL || parts == NULL) {
    free(bufs);
    free(parts);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "ps client: out of memory");
  }
  ps_err rc = PS_ERR_OK;
  for (int p = 0; p < n && rc == PS_ERR_OK; p++) {
    Pstrain__RegisterRequest req = PSTRAIN__REGISTER_REQUEST__INIT;
    req.key = &key;
    req.config_hash = c->hash;
    req.job = &job_msg;
    req.pserver_id = (uint32_t)p;
    size_t len;
    rc = wire_pack(&req.base, &bufs[p], &len, err);
    parts[p] = (rpc_part){bufs[p], len, NULL};
    c->ops[p] = (rpc_op){.channel = c->channels[p], .method = WIRE_METHOD_REGISTER,
                         .parts = &parts[p], .part_count = 1, .timeout_s = timeout,
                         .wait_for_ready = 1};
  }
  if (rc == PS_ERR_OK && rpc_client_call_all(c->rpc, c->ops, n, err) != PS_ERR_OK) {
    rc = batch_error(c, "registering", err->code, err);
  }
  for (int p = 0; p < n && rc == PS_ERR_OK; p++) {
    Pstrain__RegisterReply *reply = (Pstrain__RegisterReply *)wire_unpack(
        &pstrain__register_reply__descriptor, &c->ops[p].reply.message, err);
    if (reply == NULL) {
      char why[sizeof err->msg];
      snprintf(why, sizeof why, "%s", err->msg);
      rc = ps_error_set(err, PS_ERR_CORRUPT_DATA, "registering: pserver %d at %s: %s", p,
                        c->targets.items[p], why);
      break;
    }
    c->pserver_incarnation[p] = reply->pserver_incarnation;
    c->tier_pservers += reply->disk_tier - c->pserver_tier[p]; /* registered again: anew */
    c->pserver_tier[p] = reply->disk_tier;
    steps[p] = (long)reply->step;
    protobuf_c_message_free_unpacked(&reply->base, NULL);
    /* async and ssp count pushes, geo merged steps */
    if (c->job.update != UPDATE_SYNC) steps[p] /= c->job.trainers;
  }
  for (int p = 0; p < n; p++) c->ops[p].wait_for_ready = 0;
  ps_client_free_replies(c);
  for (int p = 0; p < n; p++) free(bufs[p]);
  free(bufs);
  free(parts);
  return rc;
}

ps_err ps_client_connect(ps_client *c, const endpoint_list *pservers, const job_config *job,
                         int trainer_id, uint64_t incarnation, double connect_timeout,
                         double rpc_timeout, const char *token, const tls_config *tls,
                         ps_error *err) {
  memset(c, 0, sizeof *c);
  c->trainer_id = trainer_id;
  c->incarnation = incarnation != 0 ? incarnation : process_random_u64();
  c->job = *job;
  c->hash = job_config_hash(job);
  c->targets = *pservers;
  c->rpc_timeout = rpc_timeout;
  c->kill_at_push = ps_client_kill_at_push();
  int n = job->pservers;
  tensor_layout_init(&c->layout);
  if (model_build_layout(&job->model, &c->layout, err) != PS_ERR_OK ||
      shard_map_build(&c->map, &c->layout, job->block_size, n, err) != PS_ERR_OK) {
    ps_client_close(c);
    return err->code;
  }
  c->channels = calloc((size_t)n, sizeof *c->channels);
  c->pserver_incarnation = calloc((size_t)n, sizeof *c->pserver_incarnation);
  c->pserver_tier = calloc((size_t)n, sizeof *c->pserver_tier);
  c->tier_stats = calloc((size_t)n, sizeof *c->tier_stats);
  c->writers = calloc((size_t)n, sizeof *c->writers);
  c->ops = calloc((size_t)n, sizeof *c->ops);
  c->prefetch_writers = calloc((size_t)n, sizeof *c->prefetch_writers);
  c->prefetch_ops = calloc((size_t)n, sizeof *c->prefetch_ops);
  c->prefetch_target = calloc((size_t)n, sizeof *c->prefetch_target);
  c->refs_cap = c->map.block_count + 1;
  if (job->update == UPDATE_SYNC && job->shard_steps > 0) {
    c->members_cap = WIRE_MEMBERS_MAX(job->trainers);
    if ((c->members = calloc(c->members_cap, 1)) == NULL) {
      ps_client_close(c);
      return ps_error_set(err, PS_ERR_NO_MEMORY, "ps client: out of memory");
    }
  }
  c->refs = malloc(c->refs_cap * sizeof *c->refs);
  c->seen = malloc(c->map.block_count > 0 ? c->map.block_count : 1);
  int converted = job->wire_dtype != WIRE_DTYPE_F32;
  size_t total = c->map.total > 0 ? c->map.total : 1;
  if (converted) c->wire_grads = malloc(total * wire_dtype_size(job->wire_dtype));
  if ((converted && c->wire_grads == NULL) || c->seen == NULL || c->channels == NULL ||
      c->pserver_incarnation == NULL || c->pserver_tier == NULL || c->tier_stats == NULL ||
      c->writers == NULL || c->ops == NULL || c->refs == NULL || c->prefetch_writers == NULL ||
      c->prefetch_ops == NULL || c->prefetch_target == NULL) {
    ps_client_close(c);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "ps client: out of memory");
  }
  /* Prefetches have a completion queue of their own: they are collected
   * a step later, whatever calls ran on c->rpc meanwhile. */
  if (rpc_client_create(&c->rpc, token, tls, err) != PS_ERR_OK ||
      rpc_client_create(&c->prefetch_rpc, token, tls, err) != PS_ERR_OK) {
    ps_client_close(c);
    return err->code;
  }
  for (int p = 0; p < n; p++) {
    if (rpc_channel_open(c->rpc, pservers->items[p], MESSAGE_LIMIT, RECONNECT_MS, &c->channels[p],
                         err) != PS_ERR_OK) {
      ps_client_close(c);
      return err->code;
    }
  }

  long *steps = malloc((size_t)n * sizeof *steps);
  if (steps == NULL) {
    ps_client_close(c);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "ps client: out of memory");
  }
  ps_err rc = ps_client_register_all(c, connect_timeout, steps, err);
  /* With handed-out data a sync trainer joins a step later (the pservers may be a step apart). */
  int joins = job->update == UPDATE_SYNC && job->shard_steps > 0;
  for (int p = 1; p < n && rc == PS_ERR_OK && !joins; p++) {
    if (steps[p] != steps[0] && job->update == UPDATE_SYNC) {
      rc = ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "pserver 0 is at step %ld but pserver %d at %ld: restart them with "
                        "--resume --resume-step of a step both have",
                        steps[0], p, steps[p]);
    }
  }
  c->start_step = steps[0];
  free(steps);
  if (rc != PS_ERR_OK) {
    ps_client_close(c);
    return rc;
  }
  LOG_INFO("registered with %d pserver(s) as trainer %d of %d (%s update, %zu blocks)", n,
           trainer_id, job->trainers, update_mode_name(job->update), c->map.block_count);
  return PS_ERR_OK;
}

void ps_client_close(ps_client *c) {
  ps_client_parts_abort(c);
  int leased = rpc_lease_wait(&c->lease) != PS_ERR_OK;
  if (leased) {
    /* Freeing what gRPC may still read is worse than a leak at exit. */
    LOG_WARN("closing the pserver client while gRPC still holds the gradient buffer: "
             "the buffer is left allocated");
    c->wire_grads = NULL;
  }
  if (c->ops != NULL) ps_client_free_replies(c);
  ps_client_parts_free(c);
  if (c->prefetch_rpc != NULL) ps_client_prefetch_abort(c);
  rpc_client_destroy(c->prefetch_rpc); /* before c->rpc: its calls use c->rpc's channels */
  rpc_client_destroy(c->rpc);
  for (int p = 0; p < c->job.pservers; p++) {
    if (c->writers != NULL) wire_writer_free(&c->writers[p]);
    if (c->prefetch_writers != NULL) wire_writer_free(&c->prefetch_writers[p]);
  }
  free(c->writers);
  free(c->ops);
  free(c->prefetch_writers);
  free(c->prefetch_ops);
  free(c->prefetch_target);
  free(c->refs);
  free(c->seen);
  free(c->wire_grads);
  free(c->channels);
  free(c->pserver_incarnation);
  free(c->pserver_tier);
  free(c->tier_stats);
  shard_map_free(&c->map);
  tensor_layout_free(&c->layout);
  free(c->members);
  memset(c, 0, sizeof *c);
}

/* Checks each ParamsReply and copies its blocks into params (converted
 * from the job's wire dtype). */
static ps_err apply_replies(ps_client *c, const char *what, long want_version, float *params,
                            ps_error *err) {
  wire_dtype dtype = c->job.wire_dtype;
  size_t size = wire_dtype_size(dtype);
  for (int p = 0; p < c->job.pservers; p++) {
    const rpc_message *msg = &c->ops[p].reply.message;
    wire_blocks_msg m = {.blocks = c->refs, .block_cap = c->refs_cap};
    if (wire_parse_blocks(msg, &m, err) != PS_ERR_OK) {
      char why[sizeof err->msg];
      snprintf(why, sizeof why, "%s", err->msg);
      return ps_error_set(err, err->code, "%s: pserver %d at %s sent a bad reply: %s", what, p,
                          c->targets.items[p], why);
    }
    if (m.pserver_incarnation != c->pserver_incarnation[p]) {
      return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                          "%s: pserver %d at %s restarted (new incarnation); its state is not the "
                          "job's any more",
                          what, p, c->targets.items[p]);
    }
    if (want_version >= 0 && m.step != (uint64_t)want_version) {
      return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                          "%s: pserver %d at %s answered with step %llu, expected %ld", what, p,
                          c->targets.items[p], (unsigned long long)m.step, want_version);
    }
    if (m.dtype != (uint32_t)dtype) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: pserver %d sent %s blocks, the job's "
                          "--wire-dtype is %s", what, p, wire_dtype_name((wire_dtype)m.dtype),
                          wire_dtype_name(dtype));
    }
    if (p == 0 && c->members != NULL && m.members.len > 0) {
      if (m.members.len > c->members_cap) {
        return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: pserver 0 named %zu bytes of members, "
                            "at most %zu", what, m.members.len, c->members_cap);
      }
      wire_copy_block(msg, &m.members, c->members);
      c->members_len = m.members.len;
    }
    if (m.block_count != c->map.shard_blocks[p]) {
      return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: pserver %d sent %zu blocks, expected %zu",
                          what, p, m.block_count, c->map.shard_blocks[p]);
    }
    /* Check every block before copying any: a bad reply changes nothing. */
    memset(c->seen, 0, c->map.block_count);
    for (size_t i = 0; i < m.block_count; i++) {
      const wire_block_ref *r = &m.blocks[i];
      if (r->id >= c->map.block_count || c->map.blocks[r->id].pserver != p) {
        return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: pserver %d sent block %u, which it "
                            "does not hold", what, p, r->id);
      }
      if (c->seen[r->id]++) {
        return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: pserver %d sent block %u twice", what,
                            p, r->id);
      }
      if (r->len != c->map.blocks[r->id].count * size) {
        return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                            "%s: pserver %d sent block %u with %zu bytes, expected %zu", what, p,
                            r->id, r->len, c->map.blocks[r->id].count * size);
      }
    }
    if (c->sparse != NULL && c->sparse->take(c->sparse->ctx, p, msg, &m, err) != PS_ERR_OK) {
      char why[sizeof err->msg];
      snprintf(why, sizeof why, "%s", err->msg);
      return ps_error_set(err, err->code, "%s: pserver %d at %s: %s", what, p, c->targets.items[p],
                          why);
    }
    for (size_t i = 0; i < m.block_count; i++) {
      wire_decode_block(msg, &m.blocks[i], dtype, params + c->map.blocks[m.blocks[i].id].offset);
    }
    c->bytes_received += msg->total;
  }
  return PS_ERR_OK;
}

ps_err ps_client_send_to_all(ps_client *c, const char *method, const ProtobufCMessage *m,
                          const char *what, ps_error *err) {
  uint8_t *buf;
  size_t len;
  if (wire_pack(m, &buf, &len, err) != PS_ERR_OK) return err->code;
  rpc_part part = {buf, len, NULL};
  for (int p = 0; p < c->job.pservers; p++) {
    c->ops[p] = (rpc_op){.channel = c->channels[p], .method = method, .parts = &part,
                         .part_count = 1, .timeout_s = c->rpc_timeout};
  }
  ps_err rc = rpc_client_call_all(c->rpc, c->ops, c->job.pservers, err);
  free(buf);
  if (rc != PS_ERR_OK) rc = batch_error(c, what, rc, err);
  return rc;
}

ps_err ps_client_pull(ps_client *c, float *params, ps_error *err) {
  Pstrain__RequestKey key;
  ps_client_fill_key(c, 0, &key);
  Pstrain__PullRequest req = PSTRAIN__PULL_REQUEST__INIT;
  req.key = &key;
  req.config_hash = c->hash;
  const char *what = "pulling the parameters";
  ps_err rc = ps_client_send_to_all(c, WIRE_METHOD_PULL, &req.base, what, err);
  if (rc == PS_ERR_OK) rc = apply_replies(c, what, -1, params, err);
  ps_client_free_replies(c);
  return rc;
}

ps_err ps_client_pull_kind(ps_client *c, long step, uint32_t kind, float *params, ps_error *err) {
  int n = c->job.pservers;
  double start = now_s();
  wire_key key = {(uint32_t)c->trainer_id, c->incarnation, (uint64_t)step};
  for (int p = 0; p < n; p++) {
    wire_writer *w = &c->writers[p];
    if (wire_writer_begin(w, 0, err) != PS_ERR_OK) return err->code;
    wire_writer_push_header(w, &key, c->hash);
    if (c->sparse != NULL && c->sparse->append(c->sparse->ctx, p, w, NULL, err) != PS_ERR_OK) {
      return err->code;
    }
    wire_writer_pull_kind(w, kind);
    if (wire_writer_check(w, err) != PS_ERR_OK) return err->code;
    c->ops[p] = (rpc_op){.channel = c->channels[p], .method = WIRE_METHOD_PULL,
                         .parts = w->parts, .part_count = w->part_count,
                         .timeout_s = c->rpc_timeout};
  }
  char what[64];
  snprintf(what, sizeof what, "pulling (kind %u) at step %ld", kind, step);
  ps_err rc = rpc_client_call_all(c->rpc, c->ops, n, err);
  if (rc != PS_ERR_OK) rc = batch_error(c, what, rc, err);
  long want = c->job.update == UPDATE_SYNC && kind == PSTRAIN__PULL_KIND__PULL_STEP ? step : -1;
  if (rc == PS_ERR_OK) rc = apply_replies(c, what, want, params, err);
  ps_client_free_replies(c);
  c->comm_seconds += now_s() - start;
  return rc;
}

ps_err ps_client_push_pull(ps_client *c, long step, const float *grads, float *params,
                           ps_error *err) {
  int n = c->job.pservers;
  double start = now_s();
  wire_key key = {(uint32_t)c->trainer_id, c->incarnation, (uint64_t)step};
  /* Sent from grads as they lie, or from their conversion (one pass). */
  wire_dtype dtype = c->job.wire_dtype;
  size_t size = wire_dtype_size(dtype);
  const uint8_t *source = (const uint8_t *)grads;
  if (dtype != WIRE_DTYPE_F32) {
    wire_dtype_encode(dtype, grads, c->wire_grads, c->map.total);
    source = c->wire_grads;
  }
  for (int p = 0; p < n; p++) {
    wire_writer *w = &c->writers[p];
    if (wire_writer_begin(w, c->map.shard_blocks[p], err) != PS_ERR_OK) return err->code;
    wire_writer_push_header(w, &key, c->hash);
    wire_writer_dtype(w, dtype);
    if (c->job.update == UPDATE_GEO) wire_writer_deltas(w); /* grads hold parameter changes */
    if (c->job.shard_steps > 0) wire_writer_position(w, &c->position);
    if (c->members != NULL) wire_writer_members(w, c->members, c->members_len);
    for (size_t i = 0; i < c->map.block_count; i++) {
      const shard_block *b = &c->map.blocks[i];
      if (b->pserver == p) {
        wire_writer_block_bytes(w, b->id, source + b->offset * size, b->count * size, &c->lease);
      }
    }
    if (c->sparse != NULL && c->sparse->append(c->sparse->ctx, p, w, &c->lease, err) != PS_ERR_OK) {
      return err->code;
    }
    if (wire_writer_check(w, err) != PS_ERR_OK) return err->code;
    c->ops[p] = (rpc_op){.channel = c->channels[p], .method = WIRE_METHOD_PUSH_PULL,
                         .parts = w->parts, .part_count = w->part_count,
                         .timeout_s = c->rpc_timeout};
  }
  char what[64];
  snprintf(what, sizeof what, "step %ld", step);
  if (++c->pushes == c->kill_at_push) ps_client_die_mid_push(c);
  ps_err rc = rpc_client_call_all(c->rpc, c->ops, n, err);
  if (rc != PS_ERR_OK) rc = batch_error(c, what, rc, err);
  long want = c->job.update == UPDATE_SYNC ? step + 1 : -1;
  if (rc == PS_ERR_OK) rc = apply_replies(c, what, want, params, err);
  ps_client_free_replies(c);
  /* The gradients are overwritten next step: gRPC must be done with them. */
  if (rpc_lease_wait(&c->lease) != PS_ERR_OK && rc == PS_ERR_OK) {
    rc = ps_error_set(err, PS_ERR_INTERNAL, "%s: gRPC kept the gradient buffer for 30 s", what);
  }
  c->bytes_sent += c->map.total * size;
  c->comm_seconds += now_s() - start;
  return rc;
}

static ps_err say_done(ps_client *c, long step, int leave, int stopped, const char *what,
                       ps_error *err) {
  Pstrain__RequestKey key;
  ps_client_fill_key(c, step, &key);
  Pstrain__DoneRequest req = PSTRAIN__DONE_REQUEST__INIT;
  req.key = &key;
  req.config_hash = c->hash;
  req.leave = leave;
  req.stopped = stopped;
  ps_err rc = ps_client_send_to_all(c, WIRE_METHOD_DONE, &req.base, what, err);
  ps_client_free_replies(c);
  return rc;
}

ps_err ps_client_done(ps_client *c, long step, ps_error *err) {
  return say_done(c, step, 0, 0, "saying done", err);
}

ps_err ps_client_stop(ps_client *c, long step, ps_error *err) {
  return say_done(c, step, 0, 1, "saying it stops", err);
}

ps_err ps_client_leave(ps_client *c, ps_error *err) {
  return say_done(c, (long)c->member_number, 1, 0, "leaving", err); /* the membership that ends */
}
