/* MPI collective mode: start-up checks and the gradient all-reduce. Built
 * only with MPI; the NCCL calls are the CUDA module's (cuda_nccl.c). */
#include "trainer/replica/collective.h"

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/log.h"

#ifdef PSTRAIN_HAVE_CUDA
#include "trainer/backend/cuda_load.h"
#endif

const char *collective_mpi_text(int rc, char *buf) {
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) snprintf(buf, MPI_MAX_ERROR_STRING, "MPI error %d", rc);
  return buf;
}

#define MPI_TRY(err, expr)                                                                      \
  do {                                                                                          \
    int mpi_rc_ = (expr);                                                                       \
    if (mpi_rc_ != MPI_SUCCESS) {                                                               \
      char mpi_buf_[MPI_MAX_ERROR_STRING];                                                      \
      return ps_error_set((err), PS_ERR_UNAVAILABLE, "%s:%d: %s failed: %s", __FILE__, __LINE__, \
                          #expr, collective_mpi_text(mpi_rc_, mpi_buf_));                                  \
    }                                                                                           \
  } while (0)

static ps_err env_matches(const char *name, int value, const char *what, ps_error *err) {
  const char *env = getenv(name);
  if (env == NULL || env[0] == '\0') return PS_ERR_OK;
  char *end;
  long v = strtol(env, &end, 10);
  if (*end != '\0' || v != value) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "%s=%s but the MPI launcher made this %s %d: they must agree", name, env,
                        what, value);
  }
  return PS_ERR_OK;
}

ps_err collective_init(collective *c, ps_error *err) {
  memset(c, 0, sizeof *c);
  int already = 0;
  MPI_TRY(err, MPI_Initialized(&already));
  if (!already) {
    MPI_TRY(err, MPI_Init(NULL, NULL));
    c->initialized = 1;
  }
  /* Errors come back as codes, so each is reported with its context. */
  MPI_TRY(err, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_TRY(err, MPI_Comm_rank(MPI_COMM_WORLD, &c->rank));
  MPI_TRY(err, MPI_Comm_size(MPI_COMM_WORLD, &c->size));
  if (env_matches("PADDLE_TRAINER_ID", c->rank, "rank", err) != PS_ERR_OK ||
      env_matches("PADDLE_TRAINERS_NUM", c->size, "job's rank count", err) != PS_ERR_OK) {
    return err->code;
  }
  return PS_ERR_OK;
}

/* "a vs b" for each ';'-separated key=value field that differs. */
static void describe(const char *mine, const char *theirs, char *out, size_t len) {
  size_t used = 0;
  out[0] = '\0';
  const char *p = mine;
  while (*p != '\0' && used < len) {
    const char *end = strchr(p, ';');
    size_t flen = end != NULL ? (size_t)(end - p) : strlen(p);
    const char *eq = memchr(p, '=', flen);
    if (eq != NULL) {
      size_t klen = (size_t)(eq - p) + 1;
      const char *q = theirs;
      while (*q != '\0') {
        const char *qend = strchr(q, ';');
        size_t qlen = qend != NULL ? (size_t)(qend - q) : strlen(q);
        if (qlen >= klen && strncmp(q, p, klen) == 0) {
          if (qlen != flen || strncmp(q, p, flen) != 0) {
            int n = snprintf(out + used, len - used, "%s%.*s %.*s vs %.*s", used > 0 ? "; " : "",
                             (int)(klen - 1), p, (int)(flen - klen), eq + 1, (int)(qlen - klen),
                             q + klen);
            if (n > 0) used += (size_t)n;
          }
          break;
        }
        q = qend != NULL ? qend + 1 : q + qlen;
      }
    }
    p = end != NULL ? end + 1 : p + flen;
  }
}

ps_err collective_check_agreement(collective *c, const char *config, ps_error *err) {
  uint64_t mine = hash_text(config), root = mine;
  MPI_TRY(err, MPI_Bcast(&root, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD));
  int differs = mine != root, any = 0;
  MPI_TRY(err, MPI_Allreduce(&differs, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (!any) return PS_ERR_OK;
  /* Rank 0's text, so each differing rank can say how it differs. */
  int len = (int)strlen(config) + 1;
  MPI_TRY(err, MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD));
  char *text = malloc((size_t)len);
  if (text == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "out of memory");
  if (c->rank == 0) memcpy(text, config, (size_t)len);
  int rc = MPI_Bcast(text, len, MPI_CHAR, 0, MPI_COMM_WORLD);
  char diff[512] = "";
  if (rc == MPI_SUCCESS && differs) describe(config, text, diff, sizeof diff);
  free(text);
  /* A differing rank says how before any rank ends (mpirun stops the job
   * when the first rank exits, which could cut that line off). */
  if (differs) LOG_ERROR("rank %d's configuration differs from rank 0's: %s", c->rank, diff);
  MPI_TRY(err, MPI_Barrier(MPI_COMM_WORLD));
  if (differs) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "this rank's configuration differs from rank 0's (the line above names "
                        "the fields)");
  }
  return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                      "another rank's configuration differs from this one's (its log names the "
                      "fields)");
}

ps_err collective_allreduce_mean(collective *c, float *grads, size_t n,
                                 const tensor_layout *layout, ps_error *err) {
  /* MPI counts are ints: large models go in pieces. */
  const size_t chunk = (size_t)1 << 30;
  for (size_t at = 0; at < n; at += chunk) {
    int count = (int)(n - at < chunk ? n - at : chunk);
    MPI_TRY(err, MPI_Allreduce(MPI_IN_PLACE, grads + at, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
  }
  float scale = 1.0f / (float)c->size;
  if (layout == NULL) {
    for (size_t i = 0; i < n; i++) grads[i] *= scale;
    return PS_ERR_OK;
  }
  for (int t = 0; t < layout->count; t++) {
    const tensor_info *info = &layout->tensors[t];
    if (!info->trainable) continue; /* one rank's change, the rest zeros: the sum is it */
    for (size_t i = info->offset; i < info->offset + info->count; i++) grads[i] *= scale;
  }
  return PS_ERR_OK;
}

ps_err collective_broadcast(collective *c, void *data, size_t bytes, ps_error *err) {
  (void)c;
  const size_t chunk = (size_t)1 << 30;
  for (size_t at = 0; at < bytes; at += chunk) {
    int count = (int)(bytes - at < chunk ? bytes - at : chunk);
    MPI_TRY(err, MPI_Bcast((char *)data + at, count, MPI_BYTE, 0, MPI_COMM_WORLD));
  }
  return PS_ERR_OK;
}

#ifdef PSTRAIN_HAVE_CUDA
/* The NCCL calls are the CUDA module's; the id travels over MPI here. */
ps_err collective_use_nccl(collective *c, int device, void *stream, ps_error *err) {
  const cuda_module *m = cuda_module_load(err);
  if (m == NULL) return err->code;
  if (m->nccl_init == NULL) {
    return ps_error_set(err, PS_ERR_UNSUPPORTED, "the CUDA module was built without NCCL (%s)",
                        m->built_with);
  }
  unsigned char id[CUDA_MODULE_NCCL_ID_BYTES];
  if (c->rank == 0) PS_TRY(m->nccl_unique_id(id, err));
  MPI_TRY(err, MPI_Bcast(id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
  PS_TRY(m->nccl_init(&c->nccl, device, c->size, c->rank, id, stream, err));
  c->cuda = m;
  return PS_ERR_OK;
}

ps_err collective_allreduce_mean_device(collective *c, float *grads, size_t n,
                                        const tensor_layout *layout, ps_error *err) {
  return c->cuda->nccl_allreduce_mean(&c->nccl, grads, n, layout, err);
}
#endif

void collective_finalize(collective *c) {
  if (c->cuda != NULL) c->cuda->nccl_finalize(&c->nccl);
  c->cuda = NULL;
  if (c->initialized) {
    int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS) LOG_WARN("MPI_Finalize failed (error %d)", rc);
  }
  c->initialized = 0;
}
