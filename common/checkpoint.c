/* Checkpoint naming, listing, pruning, and the job stored in the metadata. */
#define _POSIX_C_SOURCE 200809L
#include "common/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/wire.h"

void checkpoint_path(const char *dir, const char *prefix, long step, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s%09ld.safetensors", dir, prefix, step);
}

int checkpoint_list(const char *dir, const char *prefix, long *steps, int max) {
  DIR *d = opendir(dir);
  if (d == NULL) return -1;
  size_t plen = strlen(prefix);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, prefix, plen) != 0) continue;
    char *end;
    long step = strtol(e->d_name + plen, &end, 10);
    if (end == e->d_name + plen || strcmp(end, ".safetensors") != 0 || step < 0) continue;
    /* Insert keeping the newest max, newest first. */
    if (n == max && step <= steps[max - 1]) continue;
    int at = n < max ? n : max - 1;
    while (at > 0 && steps[at - 1] < step) {
      steps[at] = steps[at - 1];
      at--;
    }
    steps[at] = step;
    if (n < max) n++;
  }
  closedir(d);
  return n;
}

/* Removes all but the newest CHECKPOINTS_KEPT, and temporary files of this
 * prefix that no live writer of this process owns. */
static void prune(const char *dir, const char *prefix) {
  long steps[64];
  int n = checkpoint_list(dir, prefix, steps, 64);
  for (int i = CHECKPOINTS_KEPT; i < n; i++) {
    char path[4096];
    checkpoint_path(dir, prefix, steps[i], path, sizeof path);
    if (unlink(path) != 0) LOG_WARN("removing old checkpoint %s: %s", path, strerror(errno));
  }
  DIR *d = opendir(dir);
  if (d == NULL) return;
  size_t plen = strlen(prefix);
  char own[32];
  snprintf(own, sizeof own, ".tmp.%ld", (long)getpid());
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    const char *tmp = strstr(e->d_name, ".safetensors.tmp.");
    if (strncmp(e->d_name, prefix, plen) != 0 || tmp == NULL) continue;
    if (strcmp(tmp + strlen(".safetensors"), own) == 0) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (unlink(path) != 0) LOG_WARN("removing %s: %s", path, strerror(errno));
  }
  closedir(d);
}

static void to_hex(const uint8_t *data, size_t len, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < len; i++) {
    out[2 * i] = digits[data[i] >> 4];
    out[2 * i + 1] = digits[data[i] & 15];
  }
  out[2 * len] = '\0';
}

static int from_hex(const char *text, uint8_t *out, size_t cap, size_t *len) {
  size_t n = strlen(text);
  if (n % 2 != 0 || n / 2 > cap) return 0;
  for (size_t i = 0; i < n / 2; i++) {
    unsigned v = 0;
    for (int k = 0; k < 2; k++) {
      char ch = text[2 * i + k];
      int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
      if (d < 0) return 0;
      v = v * 16 + (unsigned)d;
    }
    out[i] = (uint8_t)v;
  }
  *len = n / 2;
  return 1;
}

/* The packed job (a network's text the most of it), in hex, fits one
 * metadata value. */
#define PACKED_JOB_MAX (MODEL_TEXT_MAX + 1024)
_Static_assert(2 * PACKED_JOB_MAX < SAFETENSORS_META_VALUE_MAX, "a job fits a metadata value");

ps_err checkpoint_write(const char *dir, const char *prefix, const char *format, long step,
                        const job_config *job, const char *const *extra,
                        const tensor_layout *layout, const float *data, ps_error *err) {
  safetensors_tensor *tensors = safetensors_tensors_of(layout, data, err);
  if (tensors == NULL) return err->code;
  ps_err rc = checkpoint_write_tensors(dir, prefix, format, step, job, extra, tensors,
                                       layout->count, err);
  free(tensors);
  return rc;
}

ps_err checkpoint_write_tensors(const char *dir, const char *prefix, const char *format, long step,
                                const job_config *job, const char *const *extra,
                                safetensors_tensor *tensors, int count, ps_error *err) {
  Pstrain__JobConfig jc;
  wire_job_parts oc;
  char model[MODEL_TEXT_MAX], path[4096], step_text[32], hash[32], job_hex[2 * PACKED_JOB_MAX + 1];
  wire_job_to_proto(job, &jc, &oc, model, sizeof model);
  uint8_t packed[PACKED_JOB_MAX];
  size_t packed_len = protobuf_c_message_get_packed_size(&jc.base);
  if (packed_len > sizeof packed) {
    return ps_error_set(err, PS_ERR_INTERNAL, "checkpoint: the job description is too long");
  }
  protobuf_c_message_pack(&jc.base, packed);
  to_hex(packed, packed_len, job_hex);
  snprintf(step_text, sizeof step_text, "%ld", step);
  snprintf(hash, sizeof hash, "%016llx", (unsigned long long)job_config_hash(job));
  const char *meta[2 * SAFETENSORS_MAX_META + 1] = {"format", format, "step", step_text,
                                                    "config_hash", hash, "model", model,
                                                    "job", job_hex};
  int used = 10;
  for (int i = 0; extra != NULL && extra[i] != NULL && used + 2 < 2 * SAFETENSORS_MAX_META - 2;
       i += 2) {
    meta[used++] = extra[i];
    meta[used++] = extra[i + 1];
  }
  meta[used] = NULL;
  checkpoint_path(dir, prefix, step, path, sizeof path);
  if (safetensors_write_tensors(path, tensors, count, meta, 0, err) != PS_ERR_OK) return err->code;
  LOG_INFO("checkpoint at step %ld: %s", step, path);
  prune(dir, prefix);
  return PS_ERR_OK;
}

ps_err checkpoint_resume_open(const char *dir, const char *prefix, const char *format,
                              const char *what, long want, const job_config *job, char *path,
                              size_t path_len, long *step, safetensors_meta *meta, ps_error *err) {
  if (want < 0) {
    int found = checkpoint_list(dir, prefix, &want, 1);
    if (found < 0) {
      return ps_error_set(err, PS_ERR_IO, "--resume: cannot read %s: %s", dir, strerror(errno));
    }
    if (found == 0) {
      return ps_error_set(err, PS_ERR_IO, "--resume: no %s checkpoint (%s*) in %s", what, prefix,
                          dir);
    }
  }
  checkpoint_path(dir, prefix, want, path, path_len);
  job_config file_job;
  if (checkpoint_read_job(path, format, &file_job, step, meta, err) != PS_ERR_OK) {
    return ps_error_set(err, err->code, "--resume: %s", err->msg);
  }
  if (job_config_hash(&file_job) != job_config_hash(job)) {
    char diff[512];
    job_config_diff(job, &file_job, diff, sizeof diff);
    return ps_error_set(err, PS_ERR_FAILED_PRECONDITION,
                        "--resume: %s is another job's (this job vs the file's: %s)", path, diff);
  }
  return PS_ERR_OK;
}

ps_err checkpoint_read_job(const char *path, const char *format, job_config *job, long *step,
                           safetensors_meta *meta, ps_error *err) {
  if (safetensors_read(path, NULL, NULL, meta, err) != PS_ERR_OK) return err->code;
  const char *got_format = safetensors_meta_get(meta, "format");
  const char *step_text = safetensors_meta_get(meta, "step");
  const char *hash = safetensors_meta_get(meta, "config_hash");
  const char *job_hex = safetensors_meta_get(meta, "job");
  if (got_format == NULL || strcmp(got_format, format) != 0 || step_text == NULL ||
      hash == NULL || job_hex == NULL) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s is not a %s checkpoint", path, format);
  }
  uint8_t packed[PACKED_JOB_MAX];
  size_t len;
  Pstrain__JobConfig *jc = NULL;
  if (!from_hex(job_hex, packed, sizeof packed, &len) ||
      (jc = pstrain__job_config__unpack(NULL, len, packed)) == NULL) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: malformed job description", path);
  }
  ps_err rc = wire_job_from_proto(jc, job, err);
  pstrain__job_config__free_unpacked(jc, NULL);
  if (rc != PS_ERR_OK) return ps_error_set(err, rc, "%s: %s", path, err->msg);
  char want_hash[32];
  snprintf(want_hash, sizeof want_hash, "%016llx", (unsigned long long)job_config_hash(job));
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION /* lets fuzzed jobs reach what follows */
  if (strcmp(want_hash, hash) != 0) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA,
                        "%s: config hash %s does not match its job description (%s)", path, hash,
                        want_hash);
  }
#endif
  char *end;
  errno = 0;
  *step = strtol(step_text, &end, 10);
  if (errno != 0 || end == step_text || *end != '\0' || *step < 0) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "%s: bad step '%s'", path, step_text);
  }
  return PS_ERR_OK;
}
