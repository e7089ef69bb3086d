/* The pserver's sparse tables (CTR jobs) refusing, driven through
 * pserver_handle on in-memory calls, pserver 0 of 2 with 2 trainers:
 * - every refusal of a bad request leaves the tables and the shard unchanged;
 * - sparse rows sent to an MLP job are refused;
 * - --max-table-mb fails every waiting pull naming the table. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/pserver_sparse_testlib.h"

/* --- refusals, the table limit --------------------------------------------------------- */

/* One bad request: its name, method (1 push, 2 pull) and the code it gets. */
typedef struct bad {
  const char *what;
  int method;
  ps_err code;
} bad;

/* What case `which` breaks in a good push's rows (the rest is in the writer). */
static void spoil(int which, rows *grads, rows *next) {
  switch (which) {
  case 2: next[0].n = 4 * 26 + 1;
    for (size_t k = 0; k < next[0].n; k++) { next[0].keys[k] = owned_key(20000, (int)k); next[0].counts[k] = 1; }
    break;
  case 3: grads[1].keys[1] = grads[1].keys[0]; break;
  case 4: for (uint64_t k = 1;; k++) if (shard_of_key(k, PSERVERS) != 0) { next[1].keys[0] = k; break; } break;
  case 7: next[0].counts[2] = 0; break;
  default: break;
  }
}

static void test_refusals(void) {
  make_job(UPDATE_SYNC, 0);
  pserver ps;
  pserver_config cfg = make_config();
  start_pulled(&ps, &cfg);
  float *g = calloc(layout.total, sizeof *g);
  REQUIRE(g != NULL);
  static const bad cases[] = {
      {"a table index the job does not have", 1, PS_ERR_INVALID_ARGUMENT},
      {"a table twice in one field", 1, PS_ERR_INVALID_ARGUMENT},
      {"more keys than a batch holds", 1, PS_ERR_INVALID_ARGUMENT},
      {"duplicate keys", 1, PS_ERR_INVALID_ARGUMENT},
      {"a key of another pserver", 1, PS_ERR_INVALID_ARGUMENT},
      {"gradients of the wrong width", 1, PS_ERR_INVALID_ARGUMENT},
      {"counts of the wrong length", 1, PS_ERR_INVALID_ARGUMENT},
      {"a count of 0", 1, PS_ERR_INVALID_ARGUMENT},
      {"a push with keys but a table missing", 1, PS_ERR_INVALID_ARGUMENT},
      {"a pull of another step", 2, PS_ERR_ABORTED},
      {"a pull with gradients", 2, PS_ERR_INVALID_ARGUMENT},
      {"an unknown pull kind", 2, PS_ERR_INVALID_ARGUMENT},
  };
  for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
    static rows grads[2], next[2];
    batch_grads(0, 0, grads);
    batch_keys(0, 1, next);
    spoil(c, grads, next);
    snapshot before;
    snap_take(&ps, &before);
    wire_writer w = {0};
    ps_error err;
    REQUIRE(wire_writer_begin(&w, map.block_count, &err) == PS_ERR_OK);
    wire_key key = {0, 100, c == 9 ? 1 : 0};
    wire_writer_push_header(&w, &key, job_config_hash(&job));
    for (size_t i = 0; i < map.block_count && cases[c].method == 1; i++) {
      const shard_block *b = &map.blocks[i];
      if (b->pserver == 0) wire_writer_block(&w, b->id, g + b->offset, b->count, NULL);
    }
    int tables = c == 8 ? 1 : 2;
    for (int t = 0; t < tables && (cases[c].method == 1 || c == 10); t++) {
      size_t values = grads[t].n * (size_t)dim_of(t) - (c == 5 && t == 1 ? 1 : 0);
      wire_writer_sparse(&w, WIRE_SPARSE_GRADS, c == 0 && t == 1 ? 5u : (uint32_t)t,
                         grads[t].keys, grads[t].n, grads[t].values, values, NULL, NULL);
    }
    for (int t = 0; t < 2; t++) {
      /* case 6: keys without their counts */
      wire_writer_sparse(&w, WIRE_SPARSE_KEYS, c == 1 ? 0u : (uint32_t)t, next[t].keys,
                         next[t].n, NULL, 0, c == 6 && t == 0 ? NULL : next[t].counts, NULL);
    }
    if (cases[c].method == 2) wire_writer_pull_kind(&w, c == 11 ? 9u : 0u);
    REQUIRE(wire_writer_check(&w, &err) == PS_ERR_OK);
    reply got;
    result(send(&ps, cases[c].method, &w), &got);
    if (got.code != cases[c].code) fprintf(stderr, "case %d (%s): %s\n", c, cases[c].what, got.msg);
    CHECK_EQ_INT(got.code, cases[c].code);
    CHECK(snap_same(&ps, &before));
    CHECK(!ps.trainers[0].pushed);
    reply_free(&got);
    snap_free(&before);
    wire_writer_free(&w);
  }
  stop(&ps);
  free(g);
  /* Sparse rows sent to an MLP job. */
  job_config ctr = job;
  REQUIRE(model_parse("mlp:6,5,3", &job.model, &(ps_error){0}) == PS_ERR_OK);
  job.sparse = (job_sparse){0};
  tensor_layout mlp_layout;
  shard_map mlp_map;
  ps_error err;
  tensor_layout_init(&mlp_layout);
  REQUIRE(model_build_layout(&job.model, &mlp_layout, &err) == PS_ERR_OK);
  REQUIRE(shard_map_build(&mlp_map, &mlp_layout, job.block_size, PSERVERS, &err) == PS_ERR_OK);
  start(&ps, &cfg);
  static rows keys[2];
  batch_keys(0, 0, keys);
  reply got;
  result(pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys), &got);
  CHECK_EQ_INT(got.code, PS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(got.msg, "without sparse tables") != NULL);
  /* Without keys it is answered as before. */
  rpc_call *plain = pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, NULL);
  CHECK(answered(plain));
  CHECK_EQ_INT(rpc_call_local_result(plain)->code, PS_ERR_OK);
  rpc_call_local_free(plain);
  stop(&ps);
  shard_map_free(&mlp_map);
  tensor_layout_free(&mlp_layout);
  job = ctr;
}

/* --max-table-mb: the merged pull passes a table's limit; both waiting
 * trainers are told, naming the table. */
static void test_max_table(void) {
  make_job(UPDATE_SYNC, 0);
  /* The smallest limit that holds both empty tables: no row fits then. */
  size_t limit = 0;
  for (int t = 0; t < 2; t++) {
    for (size_t lo = 1;; lo *= 2) {
      sparse_table_config c;
      ctr_table_config(&job, t, lo, &c);
      sparse_table *st;
      ps_error err;
      if (sparse_table_create(&st, &c, &err) == PS_ERR_OK) {
        sparse_table_destroy(st);
        if (lo > limit) limit = lo;
        break;
      }
    }
  }
  reference ref;
  ref_init(&ref, limit);
  static rows keys[TRAINERS][2];
  for (int r = 0; r < TRAINERS; r++) batch_keys(r, 0, keys[r]);
  /* Which table fails first, as the pserver pulls them (wide, embedding). */
  ps_error err;
  static float out[2 * MAXK * DIM];
  static rows u[2];
  char name[32] = "";
  for (int t = 0; t < 2 && name[0] == '\0'; t++) {
    union_of(&keys[0][t], &keys[1][t], dim_of(t), &u[t]);
    if (sparse_table_pull(ref.t[t], u[t].keys, u[t].n, u[t].counts, 0, out, &err) != PS_ERR_OK) {
      snprintf(name, sizeof name, "'%s'", t == 0 ? "wide" : "embedding");
    }
  }
  REQUIRE(name[0] != '\0');
  pserver ps;
  pserver_config cfg = make_config();
  cfg.max_table_bytes = limit;
  start(&ps, &cfg);
  rpc_call *first = pull(&ps, 0, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[0]);
  rpc_call *second = pull(&ps, 1, 0, PSTRAIN__PULL_KIND__PULL_STEP, keys[1]);
  reply got[2];
  result(first, &got[0]);
  result(second, &got[1]);
  for (int r = 0; r < TRAINERS; r++) {
    CHECK_EQ_INT(got[r].code, PS_ERR_RESOURCE_EXHAUSTED);
    if (strstr(got[r].msg, name) == NULL) fprintf(stderr, "no %s in: %s\n", name, got[r].msg);
    CHECK(strstr(got[r].msg, name) != NULL);
    reply_free(&got[r]);
  }
  stop(&ps);
  ref_free(&ref);
}

int main(void) {
  fixture_init();
  test_refusals();
  test_max_table();
  fixture_free();
  return check_report("test_pserver_sparse_refusals");
}
