/* What the tests that drive a pserver share: a registration request packed,
 * a message handed to pserver_handle on an in-memory call, a push's header
 * and dense blocks, and copies of the shard's parameters to compare. The
 * fuzz targets use the registration too, so nothing here needs check.h. */
#ifndef PSTRAIN_TESTS_PSERVER_TESTLIB_H
#define PSTRAIN_TESTS_PSERVER_TESTLIB_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/job.h"
#include "common/shard_map.h"
#include "common/wire.h"
#include "server/pserver.h"

/* Bytes a registration of any test job fits in. */
#define TESTLIB_REGISTER_MAX 4096

/* Packs a RegisterRequest of trainer (incarnation) for pserver_id into out;
 * hash is the config hash sent (job_config_hash(job) unless a test forges
 * one). Returns its length, 0 when it does not fit in cap. */
static inline size_t testlib_register_bytes(const job_config *job, uint32_t trainer,
                                            uint64_t incarnation, uint64_t hash,
                                            uint32_t pserver_id, uint8_t *out, size_t cap) {
  Pstrain__RequestKey key = PSTRAIN__REQUEST_KEY__INIT;
  key.trainer_id = trainer;
  key.incarnation = incarnation;
  Pstrain__JobConfig jc;
  wire_job_parts oc;
  char text[256];
  wire_job_to_proto(job, &jc, &oc, text, sizeof text);
  Pstrain__RegisterRequest req = PSTRAIN__REGISTER_REQUEST__INIT;
  req.key = &key;
  req.config_hash = hash;
  req.job = &jc;
  req.pserver_id = pserver_id;
  if (protobuf_c_message_get_packed_size(&req.base) > cap) return 0;
  return protobuf_c_message_pack(&req.base, out);
}

/* Hands the parts, joined, to pserver_handle as one message in `segments`
 * slices (1 or 2: gRPC may hand a message over in slices) on an in-memory
 * call; returns the call, answered or held, or NULL when out of memory. The
 * bytes are freed on return, as the RPC server frees a body once the
 * handler returns. */
static inline rpc_call *testlib_handle(pserver *ps, int method, const rpc_part *parts, int count,
                                       int segments) {
  size_t total = 0;
  for (int i = 0; i < count; i++) total += parts[i].len;
  uint8_t *buf = malloc(total > 0 ? total : 1);
  rpc_call *call = rpc_call_local_create("test");
  if (buf == NULL || call == NULL) {
    free(buf);
    if (call != NULL) rpc_call_local_free(call);
    return NULL;
  }
  for (size_t at = 0, i = 0; i < (size_t)count; at += parts[i].len, i++) {
    memcpy(buf + at, parts[i].data, parts[i].len);
  }
  size_t half = segments > 1 ? total / 2 : total;
  rpc_segment segs[2] = {{buf, half}, {buf + half, total - half}};
  rpc_message msg = {segs, segments > 1 ? 2 : 1, total};
  pserver_handle(ps, call, method, &msg);
  free(buf);
  return call;
}

/* A push's header, then the blocks of grads (offsets into the whole model)
 * that pserver `owner` holds (-1: every block). */
static inline void testlib_push_blocks(wire_writer *w, const shard_map *map, const wire_key *key,
                                       uint64_t hash, const float *grads, int owner) {
  wire_writer_push_header(w, key, hash);
  for (size_t i = 0; i < map->block_count; i++) {
    const shard_block *b = &map->blocks[i];
    if (owner >= 0 && b->pserver != owner) continue;
    wire_writer_block(w, b->id, grads + b->offset, b->count, NULL);
  }
}

/* A copy of the shard's dense parameters, taken under the pserver's lock
 * (NULL when out of memory), and whether they still equal one. */
static inline float *testlib_params_copy(pserver *ps) {
  pthread_mutex_lock(&ps->lock);
  float *copy = malloc(ps->store.dense.n * sizeof *copy + 1);
  if (copy != NULL) memcpy(copy, ps->store.dense.params, ps->store.dense.n * sizeof *copy);
  pthread_mutex_unlock(&ps->lock);
  return copy;
}

static inline int testlib_params_equal(pserver *ps, const float *want) {
  pthread_mutex_lock(&ps->lock);
  int same = memcmp(want, ps->store.dense.params, ps->store.dense.n * sizeof *want) == 0;
  pthread_mutex_unlock(&ps->lock);
  return same;
}

#endif
