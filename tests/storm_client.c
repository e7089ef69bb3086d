/* A malformed-message storm against a running job's pservers, for
 * test_storm.sh: builds the real valid requests of the job the trainers run
 * (RegisterTrainer, PushPull, Pull, Done, Rollback; the job from the same
 * trainer flags) under its own random incarnation, mutates them (bit flips,
 * truncation, wrong trainer ids, steps and hashes, huge lengths, duplicated
 * fields, concatenation, another method's body, random bytes, empty and
 * oversized bodies) and sends them, many calls in flight, round robin to
 * every pserver, until --storm-seconds or --storm-max requests, or until a
 * pserver goes away (the job ended). A CTR job's (--model ctr:... or lr)
 * PushPull and Pull carry sparse rows as a trainer's do (keys the target
 * pserver owns, per table), and get sparse mutations too: too many keys,
 * duplicate keys, a key of another pserver, wrong values or counts widths,
 * counts of 0, a table out of range or twice, rows in the wrong field.
 * Prints the counts per status, per method and per mutation. Exit 0 when
 * every answer was an error status and none timed out.
 *   storm_client [--storm-seconds S] [--storm-max N] [--storm-seed N]
 *                [--storm-inflight N] [--storm-register 1] TRAINER FLAGS...
 * --storm-register 1 checks the storm itself, on pservers no trainer uses:
 * it registers its own incarnation and sends CTR pushes and pulls, plain or
 * with one sparse mutation; exit 0 when every plain one was accepted and
 * every mutated one refused INVALID_ARGUMENT (the checks it must reach). It
 * prints a refusal message of each mutation.
 * TRAINER FLAGS are the trainers' own (--pservers, --trainers, --model,
 * --train-samples or --data, ...): the job's step count depends on the
 * data, so an MLP job needs --train-samples, a CTR job reads --data. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/criteo.h"
#include "common/ctr_tables.h"
#include "common/log.h"
#include "common/process.h"
#include "common/rng.h"
#include "common/rpc.h"
#include "common/shard_map.h"
#include "common/wire.h"
#include "trainer/data/ctr_reader.h"
#include "tests/storm.h"
#include "trainer/trainer_config.h"

static const char *const method_path[M_COUNT] = {WIRE_METHOD_REGISTER, WIRE_METHOD_PUSH_PULL,
                                                 WIRE_METHOD_PULL, WIRE_METHOD_DONE,
                                                 WIRE_METHOD_ROLLBACK};
static const char *const method_name[M_COUNT] = {"RegisterTrainer", "PushPull", "Pull", "Done",
                                                 "Rollback"};

static const char *const mutation_name[MUT_COUNT] = {
    "none", "bit flips", "truncation", "wrong trainer id", "wrong step", "wrong hash",
    "huge length", "duplicated field", "concatenation", "another method's body", "random bytes",
    "empty", "oversized", "too many keys", "duplicate key", "key of another pserver",
    "wrong values width", "wrong counts width", "count of 0", "table out of range",
    "table twice", "rows in the wrong field"};

void buf_reserve(buf *b, size_t cap) {
  if (cap <= b->cap) return;
  uint8_t *grown = realloc(b->data, cap);
  if (grown == NULL) {
    fprintf(stderr, "storm_client: out of memory\n");
    exit(1);
  }
  b->data = grown;
  b->cap = cap;
}

static void buf_set(buf *b, const uint8_t *data, size_t len) {
  buf_reserve(b, len + 1);
  if (len > 0) memcpy(b->data, data, len);
  b->len = len;
}

static void pack_into(const ProtobufCMessage *m, buf *b) {
  size_t len = protobuf_c_message_get_packed_size(m);
  buf_reserve(b, len + 1);
  b->len = protobuf_c_message_pack(m, b->data);
}

static void die(const char *what, const ps_error *err) {
  fprintf(stderr, "storm_client: %s: %s\n", what, err->msg);
  exit(1);
}

/* --- the valid requests ---------------------------------------------------- */

/* A push's (dense blocks) or a CTR pull's body, with the SparseRows in
 * s->rows and, for a pull, its kind (kind < 0: none, a push). */
static void write_blocks(storm *s, int p, const wire_key *k, uint64_t hash, int with_blocks,
                         int kind, buf *out) {
  wire_writer w = {0};
  ps_error err;
  if (wire_writer_begin(&w, with_blocks ? s->map.block_count : 0, &err) != PS_ERR_OK) {
    die("sizing a request", &err);
  }
  wire_writer_push_header(&w, k, hash);
  size_t size = wire_dtype_size(s->job.wire_dtype);
  if (with_blocks) wire_writer_dtype(&w, s->job.wire_dtype);
  for (size_t i = 0; i < s->map.block_count && with_blocks; i++) {
    const shard_block *b = &s->map.blocks[i];
    if (b->pserver == p) {
      wire_writer_block_bytes(&w, b->id, s->wire + b->offset * size, b->count * size, NULL);
    }
  }
  for (int i = 0; i < s->row_count; i++) {
    const storm_rows *r = &s->rows[i];
    if (r->has_counts && r->count_n != r->n) continue; /* appended below */
    wire_writer_sparse(&w, r->field, r->table, r->keys, r->n, r->has_values ? s->values : NULL,
                       r->value_count, r->has_counts ? r->counts : NULL, NULL);
  }
  if (kind >= 0) wire_writer_pull_kind(&w, (uint32_t)kind);
  if (wire_writer_check(&w, &err) != PS_ERR_OK) die("writing a request", &err);
  size_t total = 0;
  for (int i = 0; i < w.part_count; i++) total += w.parts[i].len;
  buf_reserve(out, total + 1);
  out->len = 0;
  for (int i = 0; i < w.part_count; i++) {
    memcpy(out->data + out->len, w.parts[i].data, w.parts[i].len);
    out->len += w.parts[i].len;
  }
  wire_writer_free(&w);
  for (int i = 0; i < s->row_count; i++) {
    const storm_rows *r = &s->rows[i];
    if (r->has_counts && r->count_n != r->n) append_rows(out, r, s->values);
  }
}

/* Keys a trainer's batch might send pserver p: up to its share of a batch. */
static size_t some_keys(storm *s) {
  return (size_t)rng_below(&s->r, s->max_keys / (size_t)s->job.pservers + 1);
}

/* The valid request of method m to pserver p, with key fields as given; a
 * PushPull or Pull of a CTR job then mutated by smut (SMUT_*, else none). */
static void build(storm *s, int m, int p, uint32_t trainer, uint64_t step, uint64_t hash,
                  int smut, buf *out) {
  Pstrain__RequestKey key = PSTRAIN__REQUEST_KEY__INIT;
  key.trainer_id = trainer;
  key.incarnation = s->incarnation;
  key.step = step;
  wire_key k = {trainer, s->incarnation, step};
  s->row_count = 0;
  if (m == M_REGISTER) {
    Pstrain__JobConfig jc;
    wire_job_parts oc;
    char text[256];
    wire_job_to_proto(&s->job, &jc, &oc, text, sizeof text);
    Pstrain__RegisterRequest req = PSTRAIN__REGISTER_REQUEST__INIT;
    req.key = &key;
    req.config_hash = hash;
    req.job = &jc;
    req.pserver_id = (uint32_t)p;
    pack_into(&req.base, out);
  } else if (m == M_PULL && s->tables > 0) {
    /* A step's pull, a lookup, every row (tables present, no keys), or a
     * prefetch of a step's keys (a pserver with a disk tier reads them). */
    int kind = (int)rng_below(&s->r, 4);
    if (smut == SMUT_COUNT_ZERO && kind == PSTRAIN__PULL_KIND__PULL_LOOKUP) {
      kind = PSTRAIN__PULL_KIND__PULL_STEP; /* a lookup's counts are not used */
    }
    size_t n = kind == PSTRAIN__PULL_KIND__PULL_ALL ? 0 : some_keys(s);
    const uint64_t *keys = pick_keys(s, p, n);
    for (int t = 0; t < s->tables; t++) rows_add(s, WIRE_SPARSE_KEYS, (uint32_t)t, keys, n);
    if (smut >= MUT_GENERIC) sparse_mutate(s, p, smut);
    write_blocks(s, p, &k, hash, 0, kind, out);
  } else if (m == M_PULL) {
    Pstrain__PullRequest req = PSTRAIN__PULL_REQUEST__INIT;
    req.key = &key;
    req.config_hash = hash;
    pack_into(&req.base, out);
  } else if (m == M_ROLLBACK) {
    Pstrain__RollbackRequest req = PSTRAIN__ROLLBACK_REQUEST__INIT;
    req.key = &key;
    req.config_hash = hash;
    req.step = step > 0 ? step - 1 : 0;
    req.restarted_pserver = (uint32_t)p;
    pack_into(&req.base, out);
  } else if (m == M_DONE) {
    Pstrain__DoneRequest req = PSTRAIN__DONE_REQUEST__INIT;
    req.key = &key;
    req.config_hash = hash;
    pack_into(&req.base, out);
  } else {
    if (s->tables > 0) {
      /* The gradients of the keys pulled for this step, the next step's keys. */
      size_t n = some_keys(s), next = some_keys(s);
      const uint64_t *grad_keys = pick_keys(s, p, n), *next_keys = pick_keys(s, p, next);
      for (int t = 0; t < s->tables; t++) {
        rows_add(s, WIRE_SPARSE_GRADS, (uint32_t)t, grad_keys, n);
      }
      for (int t = 0; t < s->tables; t++) {
        rows_add(s, WIRE_SPARSE_KEYS, (uint32_t)t, next_keys, next);
      }
      if (smut >= MUT_GENERIC) sparse_mutate(s, p, smut);
    }
    write_blocks(s, p, &k, hash, 1, -1, out);
  }
}

/* A request of method m for pserver p, mutated by kind. */
static void make_request(storm *s, int m, int p, int kind, buf *out, buf *scratch) {
  rng *r = &s->r;
  uint32_t trainer = (uint32_t)rng_below(r, (uint64_t)s->job.trainers);
  uint64_t step = rng_below(r, (uint64_t)s->job.steps + 2);
  uint64_t hash = s->hash;
  if (kind == MUT_TRAINER) {
    trainer = (uint32_t)(s->job.trainers + rng_below(r, 4)) ^ (rng_below(r, 2) ? 0 : 0x80000000u);
  }
  if (kind == MUT_STEP) step = rng_next(r) >> rng_below(r, 64);
  if (kind == MUT_HASH) hash ^= 1ull << rng_below(r, 64);
  build(s, m, p, trainer, step, hash, kind, out);
  switch (kind) {
  case MUT_BITS: {
    int flips = 1 + (int)rng_below(r, 8);
    for (int i = 0; i < flips && out->len > 0; i++) {
      out->data[rng_below(r, out->len)] ^= (uint8_t)(1u << rng_below(r, 8));
    }
    break;
  }
  case MUT_TRUNCATE:
    out->len = out->len > 0 ? (size_t)rng_below(r, out->len) : 0;
    break;
  case MUT_HUGE_LENGTH: {
    /* A length-delimited field claiming up to 2^64 bytes, at a random place. */
    size_t at = out->len > 0 ? (size_t)rng_below(r, out->len + 1) : 0;
    uint8_t field[12];
    size_t n = 0;
    field[n++] = (uint8_t)((1 + rng_below(r, 3)) << 3 | 2);
    uint64_t len = rng_below(r, 2) ? UINT64_MAX : (rng_next(r) | (1ull << 31));
    while (len >= 0x80) {
      field[n++] = (uint8_t)(len | 0x80);
      len >>= 7;
    }
    field[n++] = (uint8_t)len;
    buf_reserve(out, out->len + n + 1);
    memmove(out->data + at + n, out->data + at, out->len - at);
    memcpy(out->data + at, field, n);
    out->len += n;
    break;
  }
  case MUT_DUPLICATE: {
    /* A slice repeated in place (a whole field when it happens to align). */
    if (out->len == 0) break;
    size_t from = (size_t)rng_below(r, out->len);
    size_t len = 1 + (size_t)rng_below(r, out->len - from < 64 ? out->len - from : 64);
    buf_reserve(out, out->len + len + 1);
    memmove(out->data + from + len, out->data + from, out->len - from);
    out->len += len;
    break;
  }
  case MUT_CONCAT: /* protobuf merges the two: every field duplicated */
    buf_reserve(out, 2 * out->len + 1);
    memcpy(out->data + out->len, out->data, out->len);
    out->len *= 2;
    break;
  case MUT_OTHER_METHOD:
    build(s, (m + 1 + (int)rng_below(r, M_COUNT - 1)) % M_COUNT, p, trainer, step, hash,
          MUT_NONE, scratch);
    buf_set(out, scratch->data, scratch->len);
    break;
  case MUT_RANDOM:
    out->len = (size_t)rng_below(r, 300);
    buf_reserve(out, out->len + 1);
    for (size_t i = 0; i < out->len; i++) out->data[i] = (uint8_t)rng_next(r);
    break;
  case MUT_EMPTY:
    out->len = 0;
    break;
  case MUT_OVERSIZE: /* past the small methods' 64 KiB; a push of junk */
    out->len = 65 * 1024 + (size_t)rng_below(r, 64 * 1024);
    buf_reserve(out, out->len + 1);
    for (size_t i = 0; i < out->len; i++) out->data[i] = (uint8_t)(i * 131 + 7);
    break;
  default:
    break;
  }
}

/* The job the trainers' settings give, as a trainer computes it: the step
 * count from --train-samples (MLP) or from --data's lines (CTR models, as
 * ctr_train.c and ctr_pserver.c do). */
static ps_err job_of(storm *s, trainer_settings *ts, ps_error *err) {
  const trainer_options *o = &ts->opt;
  long per_epoch;
  job_sparse sparse = {0};
  s->tables = ctr_table_count(&ts->model);
  if (s->tables > 0) {
    long examples;
    if (ctr_reader_count_lines(o->data, &examples, err) != PS_ERR_OK) return err->code;
    if (o->train_samples > 0 && o->train_samples < examples) examples = o->train_samples;
    long global = o->batch * o->trainers;
    per_epoch = (examples + global - 1) / global;
    sparse = job_sparse_of(&ts->sparse_opt, (int)o->admit_after, o->evict_after);
  } else if (o->train_samples > 0) {
    long samples = o->train_samples / o->trainers;
    per_epoch = (samples + o->batch - 1) / o->batch;
  } else {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "an MLP job needs --train-samples N: its step count depends on it");
  }
  long steps = per_epoch * o->epochs;
  if (o->max_steps > 0 && o->max_steps < steps) steps = o->max_steps;
  ts->optimizer.total_steps = per_epoch * o->epochs;
  s->job = (job_config){.model = ts->model, .optimizer = ts->optimizer, .update = ts->update,
                        .trainers = (int)o->trainers, .pservers = ts->pservers.count,
                        .block_size = (size_t)o->block_size, .seed = (uint64_t)o->seed,
                        .batch = o->batch, .steps = steps, .wire_dtype = ts->wire_dtype,
                        .sparse = sparse};
  return PS_ERR_OK;
}

/* Key pools and buffers for a CTR job's SparseRows. Each pserver's pool
 * holds distinct real-looking keys (Criteo field, value) it owns, more than
 * a batch can send. */
static ps_err sparse_setup(storm *s, long batch) {
  const int pservers = s->job.pservers;
  s->dim[CTR_TABLE_WIDE] = 1;
  s->dim[CTR_TABLE_EMBEDDING] = s->job.model.embed_dim;
  int dim = s->dim[s->tables - 1] > 1 ? s->dim[s->tables - 1] : 1;
  s->max_keys = (size_t)batch * CRITEO_CAT_FIELDS;
  s->pool_n = 2 * s->max_keys + 2;
  s->pool = malloc((size_t)pservers * s->pool_n * sizeof *s->pool);
  /* the most sent: max_keys + 1 rows, or a width mutation's up to 4 rows more */
  size_t values = STORM_ROWS_CAP(s->max_keys) * (size_t)dim;
  s->values = malloc(values * sizeof *s->values);
  int ok = s->pool != NULL && s->values != NULL;
  for (int i = 0; i < WIRE_MAX_SPARSE && ok; i++) {
    s->rows[i].keys = malloc(STORM_ROWS_CAP(s->max_keys) * sizeof *s->rows[i].keys);
    s->rows[i].counts = malloc(STORM_ROWS_CAP(s->max_keys) * sizeof *s->rows[i].counts);
    ok = s->rows[i].keys != NULL && s->rows[i].counts != NULL;
  }
  if (!ok) {
    fprintf(stderr, "storm_client: out of memory for %zu keys a batch\n", s->max_keys);
    return PS_ERR_NO_MEMORY;
  }
  for (size_t i = 0; i < values; i++) {
    s->values[i] = (float)rng_below(&s->r, 2000) * 1e-4f - 0.1f;
  }
  size_t *filled = calloc((size_t)pservers, sizeof *filled);
  if (filled == NULL) return PS_ERR_NO_MEMORY;
  uint32_t base = (uint32_t)rng_next(&s->r);
  /* distinct (field, value) give distinct keys: the key is a bijective mix */
  for (uint64_t j = 0, full = 0; full < (uint64_t)pservers; j++) {
    uint64_t key = criteo_feature_key((int)(j % CRITEO_CAT_FIELDS),
                                      base + (uint32_t)(j / CRITEO_CAT_FIELDS), 0);
    int p = shard_of_key(key, pservers);
    if (filled[p] == s->pool_n) continue;
    s->pool[(size_t)p * s->pool_n + filled[p]++] = key;
    if (filled[p] == s->pool_n) full++;
  }
  free(filled);
  return PS_ERR_OK;
}

int main(int argc, char **argv) {
  double seconds = 30;
  long max_requests = 30000, seed = 1, inflight = 32, registered = 0;
  int rest = 1;
  while (rest + 1 < argc && strncmp(argv[rest], "--storm-", 8) == 0) {
    const char *name = argv[rest] + 8, *value = argv[rest + 1];
    if (strcmp(name, "seconds") == 0) seconds = atof(value);
    else if (strcmp(name, "max") == 0) max_requests = atol(value);
    else if (strcmp(name, "seed") == 0) seed = atol(value);
    else if (strcmp(name, "inflight") == 0) inflight = atol(value);
    else if (strcmp(name, "register") == 0) registered = atol(value);
    else {
      fprintf(stderr, "storm_client: unknown flag %s\n", argv[rest]);
      return 2;
    }
    rest += 2;
  }
  if (seconds <= 0 || seconds > 600 || max_requests < 1 || inflight < 1 || inflight > 256) {
    fprintf(stderr, "storm_client: --storm-seconds 0..600, --storm-max >= 1, --storm-inflight 1..256\n");
    return 2;
  }
  /* The trainers' flags give the job, exactly as a trainer computes it. */
  trainer_settings ts;
  ps_error err;
  char **targv = malloc((size_t)(argc - rest + 2) * sizeof *targv);
  if (targv == NULL) return 1;
  targv[0] = argv[0];
  for (int i = rest; i < argc; i++) targv[1 + i - rest] = argv[i];
  targv[argc - rest + 1] = NULL;
  if (trainer_settings_load(&ts, argc - rest + 1, targv, &err) != OPTIONS_OK) {
    fprintf(stderr, "storm_client: %s\n", err.msg);
    return 2;
  }
  if (!ts.pserver_mode) {
    fprintf(stderr, "storm_client: the trainers' flags need --mode pserver\n");
    return 2;
  }
  log_set_level(LOG_LEVEL_ERROR);
  storm s;
  memset(&s, 0, sizeof s);
  if (job_of(&s, &ts, &err) != PS_ERR_OK) {
    fprintf(stderr, "storm_client: %s\n", err.msg);
    return 2;
  }
  if (s.job.trainers * s.job.pservers > inflight) { /* the first round registers each */
    fprintf(stderr, "storm_client: --storm-inflight %ld: at least trainers x pservers (%d)\n",
            inflight, s.job.trainers * s.job.pservers);
    return 2;
  }
  if (registered && s.tables == 0) {
    fprintf(stderr, "storm_client: --storm-register checks the sparse mutations: it needs a CTR "
            "job (--model ctr:... or lr)\n");
    return 2;
  }
  s.hash = job_config_hash(&s.job);
  s.incarnation = process_random_u64();
  rng_seed(&s.r, (uint64_t)seed, 0);
  tensor_layout_init(&s.layout);
  if (model_build_layout(&s.job.model, &s.layout, &err) != PS_ERR_OK ||
      shard_map_build(&s.map, &s.layout, s.job.block_size, s.job.pservers, &err) != PS_ERR_OK) {
    fprintf(stderr, "storm_client: %s\n", err.msg);
    return 1;
  }
  s.grads = malloc(s.layout.total * sizeof *s.grads);
  if (s.grads == NULL) return 1;
  for (size_t i = 0; i < s.layout.total; i++) s.grads[i] = (float)rng_below(&s.r, 1000) * 1e-3f;
  s.wire = malloc(s.layout.total * sizeof *s.grads);
  if (s.wire == NULL) return 1;
  wire_dtype_encode(s.job.wire_dtype, s.grads, s.wire, s.layout.total);
  if (s.tables > 0 && sparse_setup(&s, ts.opt.batch) != PS_ERR_OK) return 1;

  rpc_global_init();
  rpc_client *client;
  rpc_channel *channels[ENDPOINTS_MAX];
  if (rpc_client_create(&client, ts.token, &ts.tls, &err) != PS_ERR_OK) {
    fprintf(stderr, "storm_client: %s\n", err.msg);
    return 1;
  }
  for (int p = 0; p < s.job.pservers; p++) {
    if (rpc_channel_open(client, ts.pservers.items[p], 64 << 20, 500, &channels[p], &err) !=
        PS_ERR_OK) {
      fprintf(stderr, "storm_client: %s\n", err.msg);
      return 1;
    }
  }
  rpc_op *ops = calloc((size_t)inflight, sizeof *ops);
  buf *bodies = calloc((size_t)inflight, sizeof *bodies);
  rpc_part *parts = calloc((size_t)inflight, sizeof *parts);
  int *op_method = calloc((size_t)inflight, sizeof *op_method);
  if (ops == NULL || bodies == NULL || parts == NULL || op_method == NULL) return 1;
  buf scratch = {0};

  /* First the exact registration of each trainer id: its refusal shows the
   * storm's job is the trainers' (a different job would be named as such).
   * With --storm-register it is accepted, and the storm's own requests pass
   * the sender checks, so the sparse checks must refuse each mutation. */
  long by_status[PS_ERR_COUNT] = {0}, by_method[M_COUNT][PS_ERR_COUNT] = {{0}};
  long by_mutation[MUT_COUNT][PS_ERR_COUNT] = {{0}}, sent = 0, unexpected = 0;
  static char sample[MUT_COUNT][200]; /* --storm-register: a refusal of each mutation */
  int ended = 0; /* a pserver went away: the job ended, or it crashed */
  char end_note[512] = "";
  double start = now_s();
  for (long round = 0; !ended && sent < max_requests && now_s() - start < seconds; round++) {
    int n = (int)(max_requests - sent < inflight ? max_requests - sent : inflight);
    if (registered && round == 0) n = s.job.trainers * s.job.pservers; /* registered first */
    int kinds[256];
    for (int i = 0; i < n; i++) {
      int p = (int)((sent + i) % s.job.pservers);
      int m = (int)rng_below(&s.r, M_COUNT);
      int kind = (int)rng_below(&s.r, s.tables > 0 ? MUT_COUNT : MUT_GENERIC);
      if (kind == MUT_OVERSIZE && rng_below(&s.r, 8) != 0) kind = MUT_BITS; /* keep big ones rare */
      if (registered) { /* unmutated or sparse-mutated pushes and pulls only */
        kind = (int)rng_below(&s.r, MUT_COUNT - MUT_GENERIC + 1);
        kind = kind == 0 ? MUT_NONE : MUT_GENERIC + kind - 1;
        m = rng_below(&s.r, 2) ? M_PUSH : M_PULL;
      }
      if (kind >= MUT_GENERIC) { /* sparse rows ride on pushes and pulls; values on pushes */
        m = kind == SMUT_VALUES_WIDTH || rng_below(&s.r, 2) ? M_PUSH : M_PULL;
      }
      if (round == 0 && i < s.job.trainers * s.job.pservers) { /* the exact registrations */
        m = M_REGISTER;
        kind = MUT_NONE;
        p = i % s.job.pservers;
        build(&s, M_REGISTER, p, (uint32_t)(i / s.job.pservers), 0, s.hash, MUT_NONE, &bodies[i]);
      } else {
        make_request(&s, m, p, kind, &bodies[i], &scratch);
      }
      kinds[i] = kind;
      op_method[i] = m;
      parts[i] = (rpc_part){bodies[i].data, bodies[i].len, NULL};
      ops[i] = (rpc_op){.channel = channels[p], .method = method_path[m], .parts = &parts[i],
                        .part_count = 1, .timeout_s = 30};
    }
    rpc_client_call_all(client, ops, n, &err); /* each op has its own result */
    for (int i = 0; i < n; i++) {
      ps_err code = ops[i].code;
      if (round == 0 && i < s.job.trainers * s.job.pservers && registered && code != PS_ERR_OK) {
        fprintf(stderr, "storm_client: registering as trainer %d got %s: %s (--storm-register "
                "needs pservers no trainer uses)\n", i / s.job.pservers, ps_err_name(code),
                ops[i].message);
        return 1;
      }
      if (round == 0 && i < s.job.trainers * s.job.pservers && !registered &&
          (code != PS_ERR_RESOURCE_EXHAUSTED || strstr(ops[i].message, "--max-registrations") == NULL)) {
        fprintf(stderr, "storm_client: the exact registration of trainer %d got %s: %s "
                "(expected RESOURCE_EXHAUSTED: run the pservers with --max-registrations 1 and "
                "start the storm after the trainers registered)\n",
                i / s.job.pservers, ps_err_name(code), ops[i].message);
        return 1;
      }
      by_status[code]++;
      by_method[op_method[i]][code]++;
      by_mutation[kinds[i]][code]++;
      if (registered && !(round == 0 && i < s.job.trainers * s.job.pservers)) {
        ps_err want = kinds[i] == MUT_NONE ? PS_ERR_OK : PS_ERR_INVALID_ARGUMENT;
        if (code != want && unexpected++ < 8) {
          printf("storm: UNEXPECTED: %s with %s got %s: %.300s\n", method_name[op_method[i]],
                 mutation_name[kinds[i]], ps_err_name(code), ops[i].message);
        }
        if (code != PS_ERR_OK && sample[kinds[i]][0] == '\0') {
          snprintf(sample[kinds[i]], sizeof sample[0], "%.199s", ops[i].message);
        }
      }
      if ((code == PS_ERR_UNAVAILABLE || code == PS_ERR_CANCELLED) && !ended) {
        ended = 1;
        snprintf(end_note, sizeof end_note, "%s %s: %.300s", rpc_channel_target(ops[i].channel),
                 ps_err_name(code), ops[i].message);
      }
      rpc_reply_free(&ops[i].reply);
    }
    sent += n;
  }
  double elapsed = now_s() - start;

  printf("storm: %ld requests in %.1f s (%.0f/s) to %d pservers, %ld in flight\n", sent, elapsed,
         (double)sent / elapsed, s.job.pservers, inflight);
  printf("storm: by status:");
  for (int c = 0; c < PS_ERR_COUNT; c++) {
    if (by_status[c] > 0) printf(" %s %ld", ps_err_name((ps_err)c), by_status[c]);
  }
  printf("\n");
  for (int m = 0; m < M_COUNT; m++) {
    printf("storm:   %s:", method_name[m]);
    for (int c = 0; c < PS_ERR_COUNT; c++) {
      if (by_method[m][c] > 0) printf(" %s %ld", ps_err_name((ps_err)c), by_method[m][c]);
    }
    printf("\n");
  }
  for (int k = 0; k < MUT_COUNT; k++) {
    long total = 0;
    for (int c = 0; c < PS_ERR_COUNT; c++) total += by_mutation[k][c];
    if (total == 0) continue;
    printf("storm:   mutation %s:", mutation_name[k]);
    for (int c = 0; c < PS_ERR_COUNT; c++) {
      if (by_mutation[k][c] > 0) printf(" %s %ld", ps_err_name((ps_err)c), by_mutation[k][c]);
    }
    if (sample[k][0] != '\0') printf(" (\"%s\")", sample[k]);
    printf("\n");
  }
  printf("storm: accepted (valid by chance): %ld", by_status[PS_ERR_OK]);
  for (int k = 0; k < MUT_COUNT; k++) {
    long ok = by_mutation[k][PS_ERR_OK];
    if (ok > 0) printf(" [%s: %ld]", mutation_name[k], ok);
  }
  printf("\n");
  if (ended) printf("storm: stopped: a pserver went away (%s)\n", end_note);
  long answered_error = 0;
  for (int c = 1; c < PS_ERR_COUNT; c++) {
    if (c != PS_ERR_UNAVAILABLE && c != PS_ERR_CANCELLED && c != PS_ERR_TIMEOUT) {
      answered_error += by_status[c];
    }
  }
  printf("storm-result sent=%ld errors=%ld ok=%ld timeout=%ld unavailable=%ld cancelled=%ld "
         "seconds=%.1f\n", sent, answered_error, by_status[PS_ERR_OK], by_status[PS_ERR_TIMEOUT],
         by_status[PS_ERR_UNAVAILABLE], by_status[PS_ERR_CANCELLED], elapsed);
  fflush(stdout);

  for (int i = 0; i < inflight; i++) free(bodies[i].data);
  free(scratch.data);
  free(bodies);
  free(parts);
  free(ops);
  free(op_method);
  free(targv);
  free(s.grads);
  free(s.wire);
  free(s.pool);
  free(s.values);
  for (int i = 0; i < WIRE_MAX_SPARSE; i++) {
    free(s.rows[i].keys);
    free(s.rows[i].counts);
  }
  shard_map_free(&s.map);
  tensor_layout_free(&s.layout);
  rpc_client_destroy(client);
  rpc_global_shutdown();
  if (registered) {
    printf("storm-check sent=%ld unexpected=%ld timeout=%ld\n", sent, unexpected,
           by_status[PS_ERR_TIMEOUT]);
    return unexpected == 0 && by_status[PS_ERR_TIMEOUT] == 0 ? 0 : 1;
  }
  return by_status[PS_ERR_OK] == 0 && by_status[PS_ERR_TIMEOUT] == 0 ? 0 : 1;
}
