/* Writes the fuzz targets' seed corpus from valid messages and checkpoints:
 *   fuzz_corpus OUT   ->  OUT/pserver/, OUT/wire/, OUT/checkpoint/, OUT/ctr/
 * Seeds are made fresh each time (never committed): request sequences for
 * a pserver (registrations, sync and async steps, pulls, resends, done; CTR
 * jobs with sparse rows, the pull barrier, lookups and every row),
 * single messages, checkpoints a real pserver wrote after 7 steps, and for
 * the CTR inputs the 100 real Criteo rows (whole, in parts, single, broken)
 * and sparse-table checkpoints written as trainer/ctr_checkpoint.c does. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/criteo.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/safetensors.h"
#include "common/sparse_table.h"
#include "tests/fuzz/fuzz_corpus.h"
#include "tests/fuzz/fuzz_job.h"

static const char *out_dir;
static int written;

void write_seed(const char *target, const char *name, const uint8_t *data, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", out_dir, target);
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "fuzz_corpus: creating %s: %s\n", path, strerror(errno));
    exit(1);
  }
  snprintf(path, sizeof path, "%s/%s/%s", out_dir, target, name);
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
    fprintf(stderr, "fuzz_corpus: writing %s: %s\n", path, strerror(errno));
    exit(1);
  }
  written++;
}

/* --- pserver request sequences ------------------------------------------------ */

typedef struct seq {
  uint8_t bytes[16384];
  size_t len;
  job_config job;
  tensor_layout layout;
  shard_map map;
} seq;

static void seq_begin(seq *s, uint8_t mode) {
  fuzz_job(&s->job, fuzz_update(mode));
  fuzz_map(&s->job, &s->layout, &s->map);
  s->bytes[0] = mode;
  s->len = 1;
}

static void seq_end(seq *s, const char *name) {
  write_seed("pserver", name, s->bytes, s->len);
  shard_map_free(&s->map);
  tensor_layout_free(&s->layout);
}

static void add_register(seq *s, uint32_t trainer, uint64_t incarnation, const job_config *job) {
  uint8_t body[1024];
  size_t len = fuzz_register_bytes(job, trainer, incarnation, 0, body, sizeof body);
  s->len = fuzz_frame(s->bytes, s->len, sizeof s->bytes, FUZZ_OP(0, 1), body, len);
}

/* A push as the job's trainers send it (geo: parameter changes). */
static void add_push_as(seq *s, uint32_t trainer, uint64_t step, int segments, int deltas) {
  uint8_t body[4096];
  wire_key key = {trainer, FUZZ_INCARNATION(trainer), step};
  size_t len = fuzz_push_bytes(&s->map, 0, &key, job_config_hash(&s->job), deltas, body,
                               sizeof body);
  s->len = fuzz_frame(s->bytes, s->len, sizeof s->bytes, FUZZ_OP(1, segments), body, len);
}

static void add_push(seq *s, uint32_t trainer, uint64_t step, int segments) {
  add_push_as(s, trainer, step, segments, s->job.update == UPDATE_GEO);
}

static void add_small(seq *s, int done, uint32_t trainer, uint64_t step) {
  uint8_t body[256];
  wire_key key = {trainer, FUZZ_INCARNATION(trainer), step};
  size_t len = fuzz_small_bytes(done, &key, job_config_hash(&s->job), body, sizeof body);
  s->len = fuzz_frame(s->bytes, s->len, sizeof s->bytes, FUZZ_OP(done ? 3 : 2, 1), body, len);
}

static void pserver_seeds(void) {
  seq s;
  /* A whole sync job from registration: two steps, pulls, done. */
  seq_begin(&s, 0);
  add_register(&s, 0, FUZZ_INCARNATION(0), &s.job);
  add_register(&s, 1, FUZZ_INCARNATION(1), &s.job);
  add_small(&s, 0, 0, 0);
  add_push(&s, 0, 0, 1);
  add_push(&s, 1, 0, 2);
  add_push(&s, 0, 1, 3);
  add_push(&s, 1, 1, 8);
  add_small(&s, 1, 0, 2);
  add_small(&s, 1, 1, 2);
  seq_end(&s, "sync-job");
  /* The same in async mode. */
  seq_begin(&s, FUZZ_MODE_ASYNC);
  add_register(&s, 0, FUZZ_INCARNATION(0), &s.job);
  add_register(&s, 1, FUZZ_INCARNATION(1), &s.job);
  add_push(&s, 0, 0, 1);
  add_push(&s, 1, 0, 1);
  add_push(&s, 0, 0, 1); /* stale: answered, not applied */
  add_small(&s, 0, 1, 1);
  add_small(&s, 1, 0, 1);
  seq_end(&s, "async-job");
  /* Registered sync: a step, a resend of the finished step, a wrong step. */
  seq_begin(&s, FUZZ_MODE_REGISTERED);
  add_push(&s, 0, 0, 1);
  add_push(&s, 0, 0, 2); /* resend while the step waits */
  add_push(&s, 1, 0, 1);
  add_push(&s, 1, 0, 1); /* resend of an applied step */
  add_push(&s, 1, 5, 1);
  add_small(&s, 0, 1, 1);
  seq_end(&s, "sync-resends");
  /* A trainer with another job (behind a token: values in the reply), a
   * restarted trainer, registrations beyond --max-registrations. */
  seq_begin(&s, FUZZ_MODE_REGISTERED | FUZZ_MODE_TOKEN);
  job_config other = s.job;
  other.batch = 8;
  add_register(&s, 1, 999, &other);
  for (uint64_t inc = 1; inc <= 5; inc++) add_register(&s, 1, 1000 + inc, &s.job);
  add_push(&s, 1, 0, 1);
  seq_end(&s, "registrations");
  /* One message of each kind, registered. */
  seq_begin(&s, FUZZ_MODE_REGISTERED);
  add_push(&s, 0, 0, 1);
  seq_end(&s, "one-push");
  seq_begin(&s, FUZZ_MODE_REGISTERED | FUZZ_MODE_ASYNC);
  add_small(&s, 0, 0, 0);
  seq_end(&s, "one-pull");
  seq_begin(&s, FUZZ_MODE_REGISTERED);
  add_small(&s, 1, 1, 0);
  seq_end(&s, "one-done");
  seq_begin(&s, 0);
  add_register(&s, 0, FUZZ_INCARNATION(0), &s.job);
  seq_end(&s, "one-register");
  /* A rollback after a step (refused here: the pserver has no checkpoints). */
  seq_begin(&s, FUZZ_MODE_REGISTERED);
  add_push(&s, 0, 0, 1);
  add_push(&s, 1, 0, 1);
  {
    Pstrain__RequestKey key = PSTRAIN__REQUEST_KEY__INIT;
    key.trainer_id = 0;
    key.incarnation = FUZZ_INCARNATION(0);
    key.step = 1;
    Pstrain__RollbackRequest req = PSTRAIN__ROLLBACK_REQUEST__INIT;
    req.key = &key;
    req.config_hash = job_config_hash(&s.job);
    req.step = 0;
    uint8_t body[256];
    size_t len = protobuf_c_message_pack(&req.base, body);
    s.len = fuzz_frame(s.bytes, s.len, sizeof s.bytes, FUZZ_OP(4, 1), body, len);
  }
  seq_end(&s, "rollback");
  /* geo: both trainers' changes at step 3, a resend, a last partial
   * exchange, a gradient push (refused), a trainer registering again. */
  seq_begin(&s, FUZZ_MODE_GEO);
  add_register(&s, 0, FUZZ_INCARNATION(0), &s.job);
  add_register(&s, 1, FUZZ_INCARNATION(1), &s.job);
  add_small(&s, 0, 0, 0);
  add_push(&s, 0, 3, 1);
  add_push(&s, 1, 3, 2);
  add_push(&s, 0, 3, 1); /* resend: answered, not applied */
  add_push(&s, 0, 5, 3);
  add_push_as(&s, 1, 6, 1, 0);
  add_register(&s, 1, 1000, &s.job);
  add_small(&s, 1, 0, 5);
  seq_end(&s, "geo-job");
}

/* --- CTR request sequences (FUZZ_MODE_CTR) ------------------------------------- */

/* keys[i] = fuzz_owned_key(from + i), counts 1 + i % 3 (2 hits admission). */
static void owned_keys(int from, int n, uint64_t *keys, uint32_t *counts) {
  for (int i = 0; i < n; i++) {
    keys[i] = fuzz_owned_key(from + i);
    counts[i] = 1 + (uint32_t)(i % 3);
  }
}

/* Appends a written message to the sequence as one request of method. */
static void add_written(seq *s, int method, int segments, const wire_writer *w) {
  uint8_t body[8192];
  size_t len = 0;
  for (int i = 0; i < w->part_count; i++) {
    if (len + w->parts[i].len > sizeof body) fuzz_die("a CTR request does not fit", NULL);
    memcpy(body + len, w->parts[i].data, w->parts[i].len);
    len += w->parts[i].len;
  }
  s->len = fuzz_frame(s->bytes, s->len, sizeof s->bytes, FUZZ_OP(method, segments), body, len);
}

/* A CTR push of `step`: pserver 0's dense blocks, gradients of n keys from
 * `from` in both tables and the next step's keys from `next`, n_next (< 0:
 * none, as geo pushes carry; theirs are changes, flagged as such). */
static void add_ctr_push(seq *s, uint32_t trainer, uint64_t step, int from, int n, int next,
                         int n_next, int segments) {
  uint64_t keys[16], next_keys[16];
  uint32_t counts[16], next_counts[16];
  float values[16 * 2];
  owned_keys(from, n, keys, counts);
  owned_keys(next, n_next, next_keys, next_counts);
  for (int i = 0; i < 32; i++) values[i] = 0.01f * (float)(i % 7) - 0.03f;
  float *grads = calloc(s->map.total, sizeof *grads);
  if (grads == NULL) fuzz_die("out of memory", NULL);
  wire_writer w = {0};
  ps_error err;
  if (wire_writer_begin(&w, s->map.block_count, &err) != PS_ERR_OK) fuzz_die("writer", &err);
  wire_key key = {trainer, FUZZ_INCARNATION(trainer), step};
  wire_writer_push_header(&w, &key, job_config_hash(&s->job));
  if (s->job.update == UPDATE_GEO) wire_writer_deltas(&w);
  for (size_t i = 0; i < s->map.block_count; i++) {
    const shard_block *b = &s->map.blocks[i];
    if (b->pserver == 0) wire_writer_block(&w, b->id, grads + b->offset, b->count, NULL);
  }
  for (uint32_t t = 0; t < 2; t++) {
    wire_writer_sparse(&w, WIRE_SPARSE_GRADS, t, keys, (size_t)n, values,
                       (size_t)n * (t == 0 ? 1 : 2), NULL, NULL);
  }
  for (uint32_t t = 0; t < 2 && n_next >= 0; t++) {
    wire_writer_sparse(&w, WIRE_SPARSE_KEYS, t, next_keys, (size_t)n_next, NULL, 0, next_counts,
                       NULL);
  }
  if (wire_writer_check(&w, &err) != PS_ERR_OK) fuzz_die("a CTR push", &err);
  add_written(s, 1, segments, &w);
  wire_writer_free(&w);
  free(grads);
}

/* A CTR Pull of kind with n keys from `from` in both tables (n < 0: none). */
static void add_ctr_pull(seq *s, uint32_t trainer, uint64_t step, uint32_t kind, int from, int n) {
  uint64_t keys[16];
  uint32_t counts[16];
  if (n > 0) owned_keys(from, n, keys, counts);
  wire_writer w = {0};
  ps_error err;
  if (wire_writer_begin(&w, 0, &err) != PS_ERR_OK) fuzz_die("writer", &err);
  wire_key key = {trainer, FUZZ_INCARNATION(trainer), step};
  wire_writer_push_header(&w, &key, job_config_hash(&s->job));
  for (uint32_t t = 0; t < 2 && n >= 0; t++) {
    wire_writer_sparse(&w, WIRE_SPARSE_KEYS, t, keys, (size_t)n, NULL, 0, counts, NULL);
  }
  wire_writer_pull_kind(&w, kind);
  if (wire_writer_check(&w, &err) != PS_ERR_OK) fuzz_die("a CTR pull", &err);
  add_written(s, 2, 1, &w);
  wire_writer_free(&w);
}

static void ctr_seq_begin(seq *s, uint8_t mode) {
  fuzz_ctr_job(&s->job, fuzz_update(mode));
  fuzz_map(&s->job, &s->layout, &s->map);
  s->bytes[0] = mode | FUZZ_MODE_CTR;
  s->len = 1;
}

static void ctr_pserver_seeds(void) {
  seq s;
  /* A sync CTR job: the pull barrier, two steps with shared and own keys,
   * a lookup, every row, done. */
  ctr_seq_begin(&s, 0);
  add_register(&s, 0, FUZZ_INCARNATION(0), &s.job);
  add_register(&s, 1, FUZZ_INCARNATION(1), &s.job);
  add_ctr_pull(&s, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, 0, 6);
  add_ctr_pull(&s, 1, 0, PSTRAIN__PULL_KIND__PULL_STEP, 3, 6);
  add_ctr_push(&s, 0, 0, 0, 6, 2, 5, 1);
  add_ctr_push(&s, 1, 0, 3, 6, 4, 5, 3);
  add_ctr_push(&s, 1, 0, 3, 6, 4, 5, 2); /* resend of an applied step */
  add_ctr_push(&s, 0, 1, 2, 5, 0, 0, 1);
  add_ctr_push(&s, 1, 1, 4, 5, 0, 0, 8);
  add_ctr_pull(&s, 0, 2, PSTRAIN__PULL_KIND__PULL_LOOKUP, 0, 9);
  add_ctr_pull(&s, 0, 2, PSTRAIN__PULL_KIND__PULL_ALL, 0, -1);
  add_small(&s, 1, 0, 2);
  add_small(&s, 1, 1, 2);
  seq_end(&s, "ctr-sync-job");
  /* Async: pulls answered at once, pushes applied on arrival. */
  ctr_seq_begin(&s, FUZZ_MODE_ASYNC);
  add_register(&s, 0, FUZZ_INCARNATION(0), &s.job);
  add_register(&s, 1, FUZZ_INCARNATION(1), &s.job);
  add_ctr_pull(&s, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, 0, 4);
  add_ctr_push(&s, 0, 0, 0, 4, 1, 4, 1);
  add_ctr_push(&s, 1, 0, 1, 4, 2, 4, 2);
  add_ctr_push(&s, 0, 0, 0, 4, 1, 4, 1); /* stale: answered with rows read-only */
  add_ctr_pull(&s, 1, 1, PSTRAIN__PULL_KIND__PULL_ALL, 0, -1);
  seq_end(&s, "ctr-async-job");
  /* Registered sync: a pull of another step, a barrier left waiting, a
   * push with the keys of the whole batch. */
  ctr_seq_begin(&s, FUZZ_MODE_REGISTERED);
  add_ctr_pull(&s, 1, 3, PSTRAIN__PULL_KIND__PULL_STEP, 0, 2);
  add_ctr_pull(&s, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, 0, 16);
  add_ctr_pull(&s, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, 0, 16); /* resend at the barrier */
  add_ctr_push(&s, 1, 0, 0, 16, 0, 16, 1);
  seq_end(&s, "ctr-barrier");
  /* A plain Pull and a lookup without keys on a CTR job. */
  ctr_seq_begin(&s, FUZZ_MODE_REGISTERED | FUZZ_MODE_ASYNC);
  add_small(&s, 0, 0, 0);
  add_ctr_pull(&s, 0, 0, PSTRAIN__PULL_KIND__PULL_LOOKUP, 0, 0);
  seq_end(&s, "ctr-plain-pull");
  /* geo: rows' changes added on arrival, fresh rows back; a resend, a push
   * with next keys (refused), a lookup, done. */
  ctr_seq_begin(&s, FUZZ_MODE_GEO);
  add_register(&s, 0, FUZZ_INCARNATION(0), &s.job);
  add_register(&s, 1, FUZZ_INCARNATION(1), &s.job);
  add_small(&s, 0, 0, 0);
  add_ctr_push(&s, 0, 3, 0, 6, 0, -1, 1);
  add_ctr_push(&s, 1, 3, 3, 6, 0, -1, 2);
  add_ctr_push(&s, 1, 3, 3, 6, 0, -1, 1); /* resend */
  add_ctr_push(&s, 0, 6, 0, 16, 0, 2, 1);
  add_ctr_pull(&s, 0, 6, PSTRAIN__PULL_KIND__PULL_LOOKUP, 0, 9);
  add_small(&s, 1, 0, 6);
  seq_end(&s, "ctr-geo-job");
}

/* --- single messages for fuzz_wire ------------------------------------------- */

static void wire_seed(const char *name, uint8_t control, const uint8_t *body, size_t len) {
  uint8_t buf[8192];
  if (len + 1 > sizeof buf) abort();
  buf[0] = control;
  memcpy(buf + 1, body, len);
  write_seed("wire", name, buf, len + 1);
}

static void wire_seeds(void) {
  job_config job;
  tensor_layout layout;
  shard_map map;
  fuzz_job(&job, UPDATE_SYNC);
  fuzz_map(&job, &layout, &map);
  uint8_t body[4096];
  /* control byte: segments - 1 in bits 0-2, block capacity (bits 3-7) * 2 + 1 */
  wire_key key = {1, FUZZ_INCARNATION(1), 3};
  size_t len = fuzz_push_bytes(&map, 0, &key, job_config_hash(&job), 0, body, sizeof body);
  wire_seed("push", 0x20, body, len);
  wire_seed("push-segments", 0x27, body, len);
  len = fuzz_push_bytes(&map, 1, &key, job_config_hash(&job), 0, body, sizeof body);
  wire_seed("push-other-pserver", 0x22, body, len);
  /* A ParamsReply: incarnation, step, the blocks. */
  wire_writer w = {0};
  ps_error err;
  float values[64] = {0};
  if (wire_writer_begin(&w, map.block_count, &err) != PS_ERR_OK) fuzz_die("writer", &err);
  wire_writer_params_header(&w, 0x1234567890ull, 42);
  for (size_t i = 0; i < map.block_count; i++) {
    if (map.blocks[i].pserver == 0) wire_writer_block(&w, map.blocks[i].id, values, map.blocks[i].count, NULL);
  }
  len = 0;
  for (int i = 0; i < w.part_count; i++) {
    memcpy(body + len, w.parts[i].data, w.parts[i].len);
    len += w.parts[i].len;
  }
  wire_seed("params-reply", 0x21, body, len);
  /* The same in bf16 (field 7, 2 bytes a float), cut into segments. */
  if (wire_writer_begin(&w, map.block_count, &err) != PS_ERR_OK) fuzz_die("writer", &err);
  wire_writer_params_header(&w, 0x1234567890ull, 42);
  wire_writer_dtype(&w, WIRE_DTYPE_BF16);
  for (size_t i = 0; i < map.block_count; i++) {
    if (map.blocks[i].pserver == 0) {
      wire_writer_block_bytes(&w, map.blocks[i].id, values, map.blocks[i].count * 2, NULL);
    }
  }
  len = 0;
  for (int i = 0; i < w.part_count; i++) {
    memcpy(body + len, w.parts[i].data, w.parts[i].len);
    len += w.parts[i].len;
  }
  wire_writer_free(&w);
  wire_seed("params-reply-bf16", 0x27, body, len);
  len = fuzz_register_bytes(&job, 0, 77, 1, body, sizeof body);
  wire_seed("register", 0x00, body, len);
  wire_seed("register-segments", 0x03, body, len);
  len = fuzz_small_bytes(0, &key, job_config_hash(&job), body, sizeof body);
  wire_seed("pull", 0x00, body, len);
  len = fuzz_small_bytes(1, &key, job_config_hash(&job), body, sizeof body);
  wire_seed("done", 0x01, body, len);
  Pstrain__JobConfig jc;
  wire_job_parts oc;
  char text[256];
  wire_job_to_proto(&job, &jc, &oc, text, sizeof text);
  len = protobuf_c_message_pack(&jc.base, body);
  wire_seed("job", 0x00, body, len);
  const char *model = "mlp:784,256,128,10";
  wire_seed("model", 0x00, (const uint8_t *)model, strlen(model));
  shard_map_free(&map);
  tensor_layout_free(&layout);
}

/* --- checkpoints ------------------------------------------------------------- */

/* Removes the temporary folder and the checkpoints the pserver left in it. */
void remove_folder(const char *folder) {
  DIR *d = opendir(folder);
  if (d == NULL) {
    fprintf(stderr, "fuzz_corpus: reading %s: %s\n", folder, strerror(errno));
    exit(1);
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", folder, e->d_name);
    if (unlink(path) != 0) {
      fprintf(stderr, "fuzz_corpus: removing %s: %s\n", path, strerror(errno));
      exit(1);
    }
  }
  closedir(d);
  if (rmdir(folder) != 0) {
    fprintf(stderr, "fuzz_corpus: removing %s: %s\n", folder, strerror(errno));
    exit(1);
  }
}

/* A pserver of the fuzz job, 7 steps (sync) or pushes (async) in, saved. */
static void checkpoint_seed(const char *name, update_mode update) {
  char folder[] = "/tmp/pstrain-fuzz-corpus.XXXXXX";
  if (mkdtemp(folder) == NULL) {
    fprintf(stderr, "fuzz_corpus: mkdtemp: %s\n", strerror(errno));
    exit(1);
  }
  seq *s = malloc(sizeof *s);
  if (s == NULL) abort();
  seq_begin(s, FUZZ_MODE_REGISTERED | (update == UPDATE_ASYNC ? FUZZ_MODE_ASYNC : 0));
  for (uint64_t step = 0; step < 7; step++) {
    add_push(s, 0, step, 1);
    if (update == UPDATE_SYNC) add_push(s, 1, step, 1);
  }
  /* Replay the sequence into a pserver that checkpoints. */
  pserver ps;
  pserver_config cfg = fuzz_pserver_config(folder);
  ps_error err;
  if (pserver_init(&ps, &cfg, &err) != PS_ERR_OK) fuzz_die("pserver_init", &err);
  uint8_t body[1024];
  for (uint32_t t = 0; t < 2; t++) {
    size_t len = fuzz_register_bytes(&s->job, t, FUZZ_INCARNATION(t), 0, body, sizeof body);
    rpc_segment seg = {body, len};
    rpc_message msg = {&seg, 1, len};
    rpc_call *c = rpc_call_local_create("corpus");
    if (c == NULL) abort();
    pserver_handle(&ps, c, 0, &msg);
    rpc_call_local_free(c);
  }
  rpc_call *pending[16];
  int npending = 0;
  for (size_t at = 1; at < s->len;) {
    size_t len = (size_t)s->bytes[at + 1] | (size_t)s->bytes[at + 2] << 8;
    rpc_segment seg = {s->bytes + at + 3, len};
    rpc_message msg = {&seg, 1, len};
    rpc_call *c = rpc_call_local_create("corpus");
    if (c == NULL || npending == 16) abort();
    pserver_handle(&ps, c, 1, &msg);
    pending[npending++] = c;
    at += 3 + len;
  }
  if (ps.updates != 7) {
    fprintf(stderr, "fuzz_corpus: the %s pserver reached step %ld, not 7\n", name, ps.updates);
    exit(1);
  }
  if (pserver_checkpoint(&ps, &err) != PS_ERR_OK) fuzz_die("checkpoint", &err);
  for (int i = 0; i < npending; i++) rpc_call_local_free(pending[i]);
  char path[4096];
  pserver_checkpoint_path(&ps, 7, path, sizeof path);
  pserver_destroy(&ps);
  FILE *f = fopen(path, "rb");
  static uint8_t file[1 << 16];
  size_t len = f != NULL ? fread(file, 1, sizeof file, f) : 0;
  if (f == NULL || ferror(f) || len == sizeof file) {
    fprintf(stderr, "fuzz_corpus: reading %s failed\n", path);
    exit(1);
  }
  fclose(f);
  write_seed("checkpoint", name, file, len);
  remove_folder(folder);
  shard_map_free(&s->map);
  tensor_layout_free(&s->layout);
  free(s);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_corpus OUT_DIR\n");
    return 2;
  }
  out_dir = argv[1];
  if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "fuzz_corpus: creating %s: %s\n", out_dir, strerror(errno));
    return 1;
  }
  log_set_level(LOG_LEVEL_ERROR);
  pserver_seeds();
  ctr_pserver_seeds();
  wire_seeds();
  checkpoint_seed("sync-step-7", UPDATE_SYNC);
  checkpoint_seed("async-step-7", UPDATE_ASYNC);
  ctr_line_seeds();
  ctr_checkpoint_seed("sparse-adagrad", SPARSE_OPT_ADAGRAD, 5, 3);
  ctr_checkpoint_seed("sparse-adam", SPARSE_OPT_ADAM, 4, 3);
  ctr_checkpoint_seed("sparse-sgd", SPARSE_OPT_SGD, 3, 2);
  printf("fuzz_corpus: %d seeds in %s\n", written, out_dir);
  return 0;
}
