/* Loads the CUDA module and asks the CUDA driver for GPUs (cuda_load.h). */
#define _POSIX_C_SOURCE 200809L
#include "trainer/backend/cuda_load.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

/* A dlopen'd library is mapped once per process whoever asks, so its one
 * load is kept here for the process (never closed: backends point into it). */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const cuda_module *loaded;
static ps_error load_err;

static const char *dl_text(void) {
  const char *text = dlerror();
  return text != NULL ? text : "no reason given";
}

/* The module at path, or NULL with load_err set; *missing: no file there
 * (the next place may have it), rather than one that failed to load. */
static void *open_at(const char *path, int *missing) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h != NULL) return h;
  /* dlerror first: access may not touch it, but nothing else may run between. */
  ps_error_set(&load_err, PS_ERR_UNSUPPORTED, "the CUDA module failed to load: %s", dl_text());
  *missing = access(path, F_OK) != 0;
  return NULL;
}

/* The table behind h's entry, checked against this build's. */
static const cuda_module *table_of(void *h, const char *path) {
  dlerror();
  void *sym = dlsym(h, CUDA_MODULE_ENTRY);
  if (sym == NULL) {
    ps_error_set(&load_err, PS_ERR_UNSUPPORTED, "%s is no pstrain CUDA module: %s", path,
                 dl_text());
    return NULL;
  }
  /* POSIX lets an object pointer from dlsym become a function pointer. */
  const cuda_module *m = ((cuda_module_entry_fn)sym)();
  if (m == NULL || m->abi != CUDA_MODULE_ABI || m->backend_size != sizeof(backend) ||
      m->ops_size != sizeof(backend_ops) || m->error_size != sizeof(ps_error) ||
      m->layout_size != sizeof(tensor_layout)) {
    ps_error_set(&load_err, PS_ERR_UNSUPPORTED,
                 "%s is another build's CUDA module (ABI %d, this trainer's %d, or its structs "
                 "differ): build the trainer and the module together",
                 path, m != NULL ? m->abi : -1, CUDA_MODULE_ABI);
    return NULL;
  }
  return m;
}

static void load(void) {
  char path[PATH_MAX + 64];
  void *h = NULL;
  int missing = 0;
  const char *env = getenv(CUDA_MODULE_ENV);
  if (env != NULL && env[0] != '\0') {
    if (snprintf(path, sizeof path, "%s", env) >= (int)sizeof path) {
      ps_error_set(&load_err, PS_ERR_UNSUPPORTED, CUDA_MODULE_ENV " is too long a path");
      return;
    }
    if ((h = open_at(path, &missing)) == NULL) return;
  } else {
    /* Beside the executable (the build folder, or an install's bin), then
     * an install's lib/pstrain: never the library path, so a trainer never
     * picks up another build's module. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n < 0) {
      ps_error_set(&load_err, PS_ERR_UNSUPPORTED,
                   "finding the CUDA module beside the executable: /proc/self/exe: %s",
                   strerror(errno));
      return;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash != NULL) *slash = '\0';
    static const char *const places[] = {"/" CUDA_MODULE_FILE, "/../lib/pstrain/" CUDA_MODULE_FILE};
    for (size_t i = 0; i < sizeof places / sizeof places[0] && h == NULL; i++) {
      snprintf(path, sizeof path, "%s%s", exe, places[i]);
      h = open_at(path, &missing);
      if (h == NULL && !missing) return; /* there, but it failed: that is the reason */
    }
    if (h == NULL) {
      ps_error_set(&load_err, PS_ERR_UNSUPPORTED,
                   "the CUDA module " CUDA_MODULE_FILE " is neither in %s nor in %s/../lib/pstrain "
                   "(" CUDA_MODULE_ENV " may name it)", exe, exe);
      return;
    }
  }
  const cuda_module *m = table_of(h, path);
  if (m == NULL) {
    if (dlclose(h) != 0) LOG_WARN("closing %s: %s", path, dl_text());
    return;
  }
  LOG_DEBUG("CUDA module %s loaded (%s)", path, m->built_with);
  loaded = m;
}

const cuda_module *cuda_module_load(ps_error *err) {
  pthread_once(&load_once, load);
  if (loaded == NULL) *err = load_err;
  return loaded;
}

/* The driver API's signatures (cuda.h), with CUresult as int. */
typedef int (*cu_init_fn)(unsigned int flags);
typedef int (*cu_count_fn)(int *count);
typedef int (*cu_text_fn)(int result, const char **text);

static const char *cu_name(void *h, int rc) {
  void *sym = dlsym(h, "cuGetErrorName");
  const char *name = NULL;
  if (sym == NULL || ((cu_text_fn)sym)(rc, &name) != 0 || name == NULL) return "CUDA driver error";
  return name;
}

int cuda_driver_device_count(char *why, size_t why_len) {
  /* Not closed: cudart opens this same library when a GPU is there, and a
   * driver that ran cuInit is not one to unload. */
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    snprintf(why, why_len, "no CUDA driver: %s", dl_text());
    return 0;
  }
  dlerror();
  void *init = dlsym(h, "cuInit"), *count_sym = dlsym(h, "cuDeviceGetCount");
  if (init == NULL || count_sym == NULL) {
    snprintf(why, why_len, "libcuda.so.1 has no cuInit or cuDeviceGetCount: %s", dl_text());
    return -1;
  }
  const char *call = "cuInit";
  int rc = ((cu_init_fn)init)(0), count = 0;
  if (rc == 0) {
    call = "cuDeviceGetCount";
    rc = ((cu_count_fn)count_sym)(&count);
  }
  if (rc != 0) {
    snprintf(why, why_len, "%s: %s (%d)", call, cu_name(h, rc), rc);
    return 0;
  }
  if (count == 0) snprintf(why, why_len, "the CUDA driver found no device");
  return count;
}
