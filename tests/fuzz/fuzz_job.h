/* What the fuzz targets and their seed generator share: the job a fuzzed
 * pserver serves (tiny, so one input can hold whole pushes), its pserver
 * configuration, and how a pserver input is framed into requests. */
#ifndef PSTRAIN_TESTS_FUZZ_FUZZ_JOB_H
#define PSTRAIN_TESTS_FUZZ_FUZZ_JOB_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/job.h"
#include "common/shard_map.h"
#include "common/wire.h"
#include "server/pserver.h"
#include "tests/pserver_testlib.h"

/* mlp:6,5,3 with block size 8: 53 floats in 8 blocks over 2 pservers, so a
 * pserver sees blocks it does not hold; Adam so both state tensors move. */
static inline void fuzz_job(job_config *job, update_mode update) {
  memset(job, 0, sizeof *job);
  ps_error err;
  if (model_parse("mlp:6,5,3", &job->model, &err) != PS_ERR_OK) {
    fprintf(stderr, "fuzz_job: %s\n", err.msg);
    abort();
  }
  job->optimizer = (optimizer_config){.kind = OPTIMIZER_ADAM, .lr = 0.01, .schedule = LR_CONSTANT,
                                      .step_size = 1, .gamma = 1, .total_steps = 100,
                                      .beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-8};
  job->update = update;
  job->trainers = 2;
  job->pservers = 2;
  job->block_size = 8;
  job->seed = 3;
  job->batch = 4;
  job->steps = 100;
  job->geo_steps = update == UPDATE_GEO ? 3 : 0;
}

/* The CTR variant (FUZZ_MODE_CTR): ctr:2:3, both sparse tables, admission
 * after 2 occurrences and eviction after 3 steps so both paths run (not for
 * geo, which refuses them); a batch of 4 lets a request carry 104 keys per
 * table (geo: 3 batches'). */
static inline void fuzz_ctr_job(job_config *job, update_mode update) {
  fuzz_job(job, update);
  ps_error err;
  if (model_parse("ctr:2:3", &job->model, &err) != PS_ERR_OK) {
    fprintf(stderr, "fuzz_ctr_job: %s\n", err.msg);
    abort();
  }
  sparse_optimizer_config opt = {.kind = SPARSE_OPT_ADAGRAD, .lr = 0.1, .epsilon = 1e-8,
                                 .initial_accumulator = 0.1};
  int geo = update == UPDATE_GEO;
  job->sparse = job_sparse_of(&opt, geo ? 0 : 2, geo ? 0 : 3);
}

/* The i-th key (from 0) that pserver 0 of 2 owns. */
static inline uint64_t fuzz_owned_key(int i) {
  for (uint64_t k = 1;; k++) {
    if (shard_of_key(k, 2) == 0 && i-- == 0) return k;
  }
}

/* Pserver 0 of the job, with small limits so a fuzzed registration cannot
 * make it allocate much. */
static inline pserver_config fuzz_pserver_config(const char *checkpoint_dir) {
  return (pserver_config){.id = 0, .pservers = 2, .trainers = 2, .step_timeout = 60,
                          .log_every = 0, .max_shard_mb = 1, .checkpoint_dir = checkpoint_dir,
                          .max_blocks_per_request = 64, .max_registrations = 4,
                          .max_table_bytes = 16 << 20};
}

/* Incarnations the registered trainers 0 and 1 use. */
#define FUZZ_INCARNATION(trainer) (100u + 100u * (uint64_t)(trainer))

/* A pserver input: one mode byte, then requests, each an op byte, a 16-bit
 * little-endian length and that many bytes (the last may be cut short). */
enum {
  FUZZ_MODE_REGISTERED = 1, /* both trainers registered before the requests */
  FUZZ_MODE_ASYNC = 2,      /* the job is async (else sync) */
  FUZZ_MODE_TOKEN = 4,      /* the pserver runs behind a token */
  FUZZ_MODE_CTR = 8,        /* the job is fuzz_ctr_job's (sparse tables) */
  FUZZ_MODE_GEO = 16,       /* the job is geo, --geo-steps 3 (ASYNC then ignored) */
};

/* The job's update an input's mode byte names. */
static inline update_mode fuzz_update(uint8_t mode) {
  if (mode & FUZZ_MODE_GEO) return UPDATE_GEO;
  return (mode & FUZZ_MODE_ASYNC) ? UPDATE_ASYNC : UPDATE_SYNC;
}
/* op: bits 0-2 the method (pserver_methods order, modulo their count), bits
 * 3-5 the segments - 1 the body arrives in, as gRPC hands over a message in
 * several slices. */
#define FUZZ_OP(method, segments) ((uint8_t)((method) | (((segments) - 1) << 3)))

/* Appends one framed request to buf (capacity cap); returns the new length. */
static inline size_t fuzz_frame(uint8_t *buf, size_t used, size_t cap, uint8_t op,
                                const uint8_t *body, size_t len) {
  if (len > 0xffff || used + 3 + len > cap) {
    fprintf(stderr, "fuzz_frame: %zu bytes do not fit\n", len);
    abort();
  }
  buf[used] = op;
  buf[used + 1] = (uint8_t)(len & 0xff);
  buf[used + 2] = (uint8_t)(len >> 8);
  memcpy(buf + used + 3, body, len);
  return used + 3 + len;
}

static inline void fuzz_die(const char *what, const ps_error *err) {
  fprintf(stderr, "fuzz: %s: %s\n", what, err != NULL ? err->msg : "");
  abort();
}

/* A RegisterRequest of trainer for pserver_id, packed into out (cap bytes). */
static inline size_t fuzz_register_bytes(const job_config *job, uint32_t trainer,
                                         uint64_t incarnation, uint32_t pserver_id, uint8_t *out,
                                         size_t cap) {
  size_t len = testlib_register_bytes(job, trainer, incarnation, job_config_hash(job), pserver_id,
                                      out, cap);
  if (len == 0) fuzz_die("a registration does not fit", NULL);
  return len;
}

/* A PullRequest (done = 0) or DoneRequest (done = 1) packed into out. */
static inline size_t fuzz_small_bytes(int done, const wire_key *k, uint64_t hash, uint8_t *out,
                                      size_t cap) {
  Pstrain__RequestKey key = PSTRAIN__REQUEST_KEY__INIT;
  key.trainer_id = k->trainer_id;
  key.incarnation = k->incarnation;
  key.step = k->step;
  Pstrain__PullRequest pull = PSTRAIN__PULL_REQUEST__INIT;
  Pstrain__DoneRequest fin = PSTRAIN__DONE_REQUEST__INIT;
  pull.key = fin.key = &key;
  pull.config_hash = fin.config_hash = hash;
  const ProtobufCMessage *m = done ? &fin.base : &pull.base;
  if (protobuf_c_message_get_packed_size(m) > cap) fuzz_die("a request does not fit", NULL);
  return protobuf_c_message_pack(m, out);
}

/* The push of key to pserver p: every block p holds, filled with gradients
 * (deltas: geo's parameter changes) that depend on the trainer and step.
 * Flattened into out. */
static inline size_t fuzz_push_bytes(const shard_map *map, int p, const wire_key *key,
                                     uint64_t hash, int deltas, uint8_t *out, size_t cap) {
  float *grads = malloc(map->total * sizeof *grads);
  if (grads == NULL) fuzz_die("out of memory", NULL);
  for (size_t i = 0; i < map->total; i++) {
    grads[i] = 0.01f * (float)((i * 7 + key->trainer_id * 3 + key->step) % 11) - 0.05f;
  }
  wire_writer w = {0};
  ps_error err;
  if (wire_writer_begin(&w, map->block_count, &err) != PS_ERR_OK) fuzz_die("writer", &err);
  wire_writer_push_header(&w, key, hash);
  if (deltas) wire_writer_deltas(&w);
  for (size_t i = 0; i < map->block_count; i++) {
    const shard_block *b = &map->blocks[i];
    if (b->pserver == p) wire_writer_block(&w, b->id, grads + b->offset, b->count, NULL);
  }
  size_t len = 0;
  for (int i = 0; i < w.part_count; i++) {
    if (len + w.parts[i].len > cap) fuzz_die("a push does not fit", NULL);
    memcpy(out + len, w.parts[i].data, w.parts[i].len);
    len += w.parts[i].len;
  }
  wire_writer_free(&w);
  free(grads);
  return len;
}

/* The job's layout and shard map; free with shard_map_free, tensor_layout_free. */
static inline void fuzz_map(const job_config *job, tensor_layout *layout, shard_map *map) {
  ps_error err;
  tensor_layout_init(layout);
  if (model_build_layout(&job->model, layout, &err) != PS_ERR_OK ||
      shard_map_build(map, layout, job->block_size, job->pservers, &err) != PS_ERR_OK) {
    fuzz_die("the fuzz job's shard map", &err);
  }
}

#endif
