/* libFuzzer target: the checkpoint loader. Each input is written as pserver
 * 0's checkpoint of step 7 in a temporary folder, then read three ways:
 * safetensors_read for the metadata only, safetensors_read against the
 * fuzz job's shard layout, and pserver_resume (hex job decoding, job checks,
 * configure, data). The fuzz build does not enforce the CRC-32C and the
 * config hash, or mutations would stop there. Invariants, each an abort (a
 * finding): a resumed pserver is at step 7 with its job's hash, answers a
 * registration of that job and a pull with its blocks; a refused resume
 * leaves it unconfigured; an accepted layout read round-trips through
 * safetensors_write to the same bytes of data. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/rpc.h"
#include "common/safetensors.h"
#include "tests/fuzz/fuzz_job.h"

static char folder[256], path[512], copy_path[512];
static tensor_layout shard_layout; /* params, state1, state2 of the fuzz job's shard 0 */

static void finding(const char *what, const char *detail) {
  fprintf(stderr, "fuzz_checkpoint: %s%s%s\n", what, detail != NULL ? ": " : "",
          detail != NULL ? detail : "");
  abort();
}

/* At exit: the folder and what the pservers wrote in it (best effort). */
static void remove_folder(void) {
  DIR *d = opendir(folder);
  if (d != NULL) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      char file[600];
      snprintf(file, sizeof file, "%s/%s", folder, e->d_name);
      unlink(file);
    }
    closedir(d);
  }
  rmdir(folder);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  log_set_level(LOG_LEVEL_ERROR);
  const char *tmp = getenv("TMPDIR");
  snprintf(folder, sizeof folder, "%s/pstrain-fuzz-ck.XXXXXX", tmp != NULL ? tmp : "/tmp");
  if (mkdtemp(folder) == NULL) {
    fprintf(stderr, "fuzz_checkpoint: creating %s: %s\n", folder, strerror(errno));
    exit(1);
  }
  atexit(remove_folder);
  snprintf(path, sizeof path, "%s/pserver-0-of-2-step-000000007.safetensors", folder);
  snprintf(copy_path, sizeof copy_path, "%s/copy.safetensors", folder);
  /* The shard layout, as the pserver names it. */
  job_config job;
  fuzz_job(&job, UPDATE_SYNC);
  pserver ps;
  pserver_config cfg = fuzz_pserver_config(folder);
  ps_error err;
  if (pserver_init(&ps, &cfg, &err) != PS_ERR_OK) fuzz_die("pserver_init", &err);
  uint8_t body[1024];
  size_t len = fuzz_register_bytes(&job, 0, FUZZ_INCARNATION(0), 0, body, sizeof body);
  rpc_segment seg = {body, len};
  rpc_message msg = {&seg, 1, len};
  rpc_call *c = rpc_call_local_create("setup");
  if (c == NULL) abort();
  pserver_handle(&ps, c, 0, &msg);
  if (rpc_call_local_result(c)->code != PS_ERR_OK) fuzz_die("registering", NULL);
  rpc_call_local_free(c);
  tensor_layout_init(&shard_layout);
  for (int i = 0; i < ps.checkpoint_layout.count; i++) {
    const tensor_info *t = &ps.checkpoint_layout.tensors[i];
    if (tensor_layout_add(&shard_layout, t->name, t->rank, t->shape, &err) != PS_ERR_OK) {
      fuzz_die("the shard layout", &err);
    }
  }
  pserver_destroy(&ps);
  return 0;
}

static int write_file(const char *to, const uint8_t *data, size_t size) {
  FILE *f = fopen(to, "wb");
  if (f == NULL) return 0;
  int ok = fwrite(data, 1, size, f) == size;
  return fclose(f) == 0 && ok;
}

/* A resumed pserver serves: registration of its job, then a pull. */
static void check_serves(pserver *ps) {
  uint8_t body[1024];
  size_t len = fuzz_register_bytes(&ps->job, 0, FUZZ_INCARNATION(0), 0, body, sizeof body);
  rpc_segment seg = {body, len};
  rpc_message msg = {&seg, 1, len};
  rpc_call *c = rpc_call_local_create("fuzz");
  if (c == NULL) abort();
  pserver_handle(ps, c, 0, &msg);
  const rpc_local_result *r = rpc_call_local_result(c);
  if (r->replies != 1 || r->code != PS_ERR_OK) finding("a resumed pserver refused its job", r->message);
  rpc_call_local_free(c);
  wire_key key = {0, FUZZ_INCARNATION(0), 7};
  len = fuzz_small_bytes(0, &key, ps->job_hash, body, sizeof body);
  seg = (rpc_segment){body, len};
  msg = (rpc_message){&seg, 1, len};
  c = rpc_call_local_create("fuzz");
  if (c == NULL) abort();
  pserver_handle(ps, c, 2, &msg);
  r = rpc_call_local_result(c);
  if (r->replies != 1 || r->code != PS_ERR_OK) finding("a resumed pserver refused a pull", r->message);
  static wire_block_ref refs[4096];
  rpc_segment rseg = {r->bytes, r->len};
  rpc_message reply = {&rseg, 1, r->len};
  wire_blocks_msg m = {.blocks = refs, .block_cap = 4096};
  ps_error err;
  if (wire_parse_blocks(&reply, &m, &err) != PS_ERR_OK || m.step != 7 ||
      m.block_count != ps->store.dense.map.shard_blocks[0]) {
    finding("a resumed pserver's pull reply is wrong", NULL);
  }
  rpc_call_local_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!write_file(path, data, size)) {
    fprintf(stderr, "fuzz_checkpoint: writing %s: %s\n", path, strerror(errno));
    exit(1);
  }
  ps_error err;
  safetensors_meta meta;
  safetensors_read(path, NULL, NULL, &meta, &err);

  float values[4096];
  if (shard_layout.total > sizeof values / sizeof values[0]) abort();
  if (safetensors_read(path, &shard_layout, values, &meta, &err) == PS_ERR_OK) {
    /* Written back with its metadata (crc32c is recomputed), read the same. */
    const char *pairs[2 * SAFETENSORS_MAX_META + 1];
    int n = 0;
    for (int i = 0; i < meta.count; i++) {
      if (strcmp(meta.keys[i], "crc32c") == 0) continue;
      pairs[n++] = meta.keys[i];
      pairs[n++] = meta.values[i];
    }
    pairs[n] = NULL;
    float again[4096];
    safetensors_meta meta2;
    if (safetensors_write(copy_path, &shard_layout, values, pairs, 0, &err) != PS_ERR_OK) {
      finding("writing an accepted checkpoint back", err.msg);
    }
    if (safetensors_read(copy_path, &shard_layout, again, &meta2, &err) != PS_ERR_OK) {
      finding("an accepted checkpoint written back is refused", err.msg);
    }
    if (memcmp(again, values, shard_layout.total * sizeof(float)) != 0 || meta2.count != n / 2 + 1) {
      finding("an accepted checkpoint written back reads differently", NULL);
    }
  }

  static pserver ps;
  pserver_config cfg = fuzz_pserver_config(folder);
  if (pserver_init(&ps, &cfg, &err) != PS_ERR_OK) fuzz_die("pserver_init", &err);
  if (pserver_resume(&ps, 7, &err) == PS_ERR_OK) {
    /* The build does not enforce the file's config hash (see CMakeLists.txt);
     * the job must still be consistent with the pserver's own. */
    if (!ps.configured || ps.updates != 7 || ps.configured_by != -1) {
      finding("a resumed pserver is not at the checkpoint's step", NULL);
    }
    if (ps.job_hash != job_config_hash(&ps.job)) finding("a resumed pserver's hash is not its job's", NULL);
    check_serves(&ps);
  } else if (ps.configured) {
    finding("a refused resume left the pserver configured", err.msg);
  }
  pserver_destroy(&ps);
  return 0;
}
