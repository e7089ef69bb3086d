/* The CTR inputs' seeds of fuzz_corpus: the 100 real Criteo rows (whole,
 * in parts, single, broken, gzip'd) and sparse-table checkpoints written as
 * trainer/ctr_checkpoint.c does. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

#include "common/criteo.h"
#include "common/safetensors.h"
#include "common/sparse_table.h"
#include "tests/fuzz/fuzz_corpus.h"
#include "tests/fuzz/fuzz_job.h"

/* --- CTR: Criteo lines and sparse-table checkpoints ------------------------------ */

#define CRITEO_SAMPLE PSTRAIN_SOURCE_DIR "/tests/data/criteo-sample.tsv"

static uint8_t *read_whole(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  uint8_t *buf = malloc(1 << 20);
  *len = f != NULL && buf != NULL ? fread(buf, 1, 1 << 20, f) : 0;
  if (f == NULL || buf == NULL || ferror(f) || *len == 1 << 20) {
    fprintf(stderr, "fuzz_corpus: reading %s failed\n", path);
    exit(1);
  }
  fclose(f);
  return buf;
}

void ctr_line_seeds(void) {
  size_t len;
  uint8_t *all = read_whole(CRITEO_SAMPLE, &len);
  write_seed("ctr", "criteo-all", all, len); /* libFuzzer keeps its first -max_len bytes */
  size_t start[128], end[128];
  int n = 0;
  for (size_t at = 0; at < len && n < 128; n++) {
    const uint8_t *nl = memchr(all + at, '\n', len - at);
    start[n] = at;
    end[n] = nl != NULL ? (size_t)(nl - all) : len;
    at = end[n] + 1;
  }
  if (n != 100) {
    fprintf(stderr, "fuzz_corpus: %s holds %d lines, not 100\n", CRITEO_SAMPLE, n);
    exit(1);
  }
  char name[64];
  for (int i = 0; i < n; i += 25) { /* four files of 25 rows, the last without a newline */
    snprintf(name, sizeof name, "criteo-rows-%02d", i);
    size_t stop = i + 25 < n ? start[i + 25] : len;
    write_seed("ctr", name, all + start[i], stop - start[i]);
  }
  int first_click = 0;
  while (first_click < n && all[start[first_click]] != '1') first_click++;
  const int singles[] = {0, first_click % n, n - 1};
  for (int k = 0; k < 3; k++) {
    snprintf(name, sizeof name, "criteo-line-%02d", singles[k]);
    write_seed("ctr", name, all + start[singles[k]], end[singles[k]] - start[singles[k]] + 1);
  }
  /* A broken line (its last categorical cut to 7 digits) between good ones. */
  uint8_t buf[4096];
  size_t b = 0;
  for (int i = 0; i < 3; i++) {
    size_t l = end[i] - start[i];
    memcpy(buf + b, all + start[i], l);
    b += l - (i == 1);
    buf[b++] = '\n';
  }
  write_seed("ctr", "criteo-broken", buf, b);
  /* CRLF line ends. */
  b = 0;
  for (int i = 0; i < 3; i++) {
    memcpy(buf + b, all + start[i], end[i] - start[i]);
    b += end[i] - start[i];
    buf[b++] = '\r';
    buf[b++] = '\n';
  }
  write_seed("ctr", "criteo-crlf", buf, b);
  /* A gzip'd file's bytes (the reader finds the format from the content). */
  uLongf zlen = sizeof buf;
  z_stream z;
  memset(&z, 0, sizeof z);
  if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    fprintf(stderr, "fuzz_corpus: deflateInit2 failed\n");
    exit(1);
  }
  z.next_in = all;
  z.avail_in = (uInt)start[5];
  z.next_out = buf;
  z.avail_out = (uInt)zlen;
  int zrc = deflate(&z, Z_FINISH);
  zlen = z.total_out;
  deflateEnd(&z);
  if (zrc != Z_STREAM_END) {
    fprintf(stderr, "fuzz_corpus: deflate of 5 rows failed (%d)\n", zrc);
    exit(1);
  }
  write_seed("ctr", "criteo-gzip", buf, zlen);
  free(all);
}

/* A sparse-table checkpoint as ctr_checkpoint_write lays one out: per
 * table TABLE.keys, .values, .state (with optimizer state) and .meta, from
 * sparse_table_dump, after a few pulls and pushes of Criteo keys. */
void ctr_checkpoint_seed(const char *name, sparse_optimizer_kind opt, int wide_rows,
                                int deep_rows) {
  const char *names[2] = {"wide", "embedding"};
  const int dims[2] = {1, 4}, rows[2] = {wide_rows, deep_rows};
  safetensors_tensor parts[8];
  memset(parts, 0, sizeof parts);
  void *owned[8] = {0};
  int count = 0;
  ps_error err;
  for (int i = 0; i < 2; i++) {
    sparse_table_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "%s", names[i]);
    c.id = (uint32_t)i;
    c.dim = dims[i];
    c.seed = 7;
    c.init_scale = i == 0 ? 0.0f : 0.01f;
    c.opt = (sparse_optimizer_config){opt, 0.05, 1e-8, 0.1, 0.9, 0.999};
    sparse_table *t;
    if (sparse_table_create(&t, &c, &err) != PS_ERR_OK) fuzz_die("sparse_table_create", &err);
    uint64_t keys[8];
    float values[8 * 4], grads[8 * 4];
    for (int k = 0; k < rows[i]; k++) keys[k] = criteo_feature_key(k, 0x05db9164u + (uint32_t)k, k == 2);
    for (int k = 0; k < 8 * 4; k++) grads[k] = 0.25f * (float)(k % 5) - 0.5f;
    for (long step = 0; step < 3; step++) {
      size_t m = (size_t)rows[i] - (step == 2); /* the last key is seen once less */
      if (sparse_table_pull(t, keys, m, NULL, step, values, &err) != PS_ERR_OK ||
          sparse_table_push(t, keys, m, grads, step, &err) != PS_ERR_OK) {
        fuzz_die("a table step", &err);
      }
    }
    int sf = sparse_table_state_floats(&c);
    uint64_t *k = calloc((size_t)rows[i], sizeof *k);
    float *v = calloc((size_t)rows[i] * (size_t)c.dim, sizeof *v);
    float *st = calloc((size_t)rows[i] * (size_t)(sf > 0 ? sf : 1), sizeof *st);
    int64_t *meta = calloc((size_t)rows[i] * 2, sizeof *meta);
    if (k == NULL || v == NULL || st == NULL || meta == NULL) abort();
    if (sparse_table_dump(t, k, v, sf > 0 ? st : NULL, meta, &err) != PS_ERR_OK) {
      fuzz_die("sparse_table_dump", &err);
    }
    sparse_table_destroy(t);
    const struct {
      const char *what;
      safetensors_dtype dtype;
      long cols;
      void *data;
    } tensors[4] = {{"keys", SAFETENSORS_U64, 0, k},
                    {"values", SAFETENSORS_F32, c.dim, v},
                    {"state", SAFETENSORS_F32, sf, st},
                    {"meta", SAFETENSORS_I64, 2, meta}};
    for (int p = 0; p < 4; p++) {
      if (p == 2 && sf == 0) continue;
      safetensors_tensor *x = &parts[count++];
      snprintf(x->name, sizeof x->name, "%s.%s", names[i], tensors[p].what);
      x->dtype = tensors[p].dtype;
      x->rank = tensors[p].cols > 0 ? 2 : 1;
      x->shape[0] = rows[i];
      x->shape[1] = tensors[p].cols;
      x->data = tensors[p].data;
    }
    owned[4 * i] = k;
    owned[4 * i + 1] = v;
    owned[4 * i + 2] = st;
    owned[4 * i + 3] = meta;
  }
  char folder[] = "/tmp/pstrain-fuzz-corpus.XXXXXX";
  if (mkdtemp(folder) == NULL) {
    fprintf(stderr, "fuzz_corpus: mkdtemp: %s\n", strerror(errno));
    exit(1);
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/ctr.safetensors", folder);
  const char *metadata[] = {"format", "pstrain-ctr-1", NULL};
  if (safetensors_write_tensors(path, parts, count, metadata, 0, &err) != PS_ERR_OK) {
    fuzz_die("safetensors_write_tensors", &err);
  }
  size_t len;
  uint8_t *file = read_whole(path, &len);
  write_seed("ctr", name, file, len);
  free(file);
  remove_folder(folder);
  for (int i = 0; i < 8; i++) free(owned[i]);
}
