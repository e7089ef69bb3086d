/* The memory this process may use (server/memory_limit.h). */
#define _POSIX_C_SOURCE 200809L
#include "server/memory_limit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define CG_PATH_MAX 4096
#define CG_MOUNTS_MAX 8
/* v1 says "unlimited" with LONG_MAX rounded down to a page: anything this
 * large is no limit. */
#define CG_UNLIMITED (1LL << 62)

typedef struct cg_mount {
  int v2;                  /* cgroup2, else a v1 hierarchy holding the memory controller */
  char root[CG_PATH_MAX];  /* the hierarchy's path mounted there ("/" but in containers) */
  char point[CG_PATH_MAX]; /* where it is mounted */
} cg_mount;

/* mountinfo writes space, tab, newline and backslash as \ooo. */
static void unescape(char *s) {
  char *out = s;
  for (const char *in = s; *in != '\0'; in++) {
    if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] >= '0' && in[2] <= '7' &&
        in[3] >= '0' && in[3] <= '7') {
      *out++ = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
      in += 3;
    } else {
      *out++ = *in;
    }
  }
  *out = '\0';
}

/* Whether the comma-separated list has item. */
static int list_has(const char *list, const char *item) {
  size_t n = strlen(item);
  for (const char *p = list; p != NULL && *p != '\0';) {
    const char *comma = strchr(p, ',');
    size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
    if (len == n && strncmp(p, item, n) == 0) return 1;
    p = comma != NULL ? comma + 1 : NULL;
  }
  return 0;
}

static FILE *open_under(const char *root, const char *path) {
  char full[CG_PATH_MAX];
  if ((size_t)snprintf(full, sizeof full, "%s%s", root, path) >= sizeof full) return NULL;
  return fopen(full, "r");
}

/* The cgroup2 mounts and the v1 mounts of the memory controller. */
static int read_mounts(const char *root, cg_mount *out, int max) {
  FILE *f = open_under(root, "/proc/self/mountinfo");
  if (f == NULL) return 0;
  int n = 0;
  char line[3 * CG_PATH_MAX];
  while (n < max && fgets(line, sizeof line, f) != NULL) {
    line[strcspn(line, "\n")] = '\0';
    char *fields[64], *save = NULL;
    int count = 0;
    for (char *tok = strtok_r(line, " ", &save); tok != NULL && count < 64;
         tok = strtok_r(NULL, " ", &save)) {
      fields[count++] = tok;
    }
    int dash = -1;
    for (int i = 6; i < count; i++) {
      if (strcmp(fields[i], "-") == 0) {
        dash = i;
        break;
      }
    }
    if (dash < 0 || dash + 1 >= count) continue;
    const char *type = fields[dash + 1];
    const char *super = dash + 3 < count ? fields[dash + 3] : "";
    int v2 = strcmp(type, "cgroup2") == 0;
    if (!v2 && !(strcmp(type, "cgroup") == 0 && list_has(super, "memory"))) continue;
    unescape(fields[3]);
    unescape(fields[4]);
    out[n].v2 = v2;
    snprintf(out[n].root, sizeof out[n].root, "%s", fields[3]);
    snprintf(out[n].point, sizeof out[n].point, "%s", fields[4]);
    n++;
  }
  fclose(f);
  return n;
}

/* This process's cgroup path in the v2 hierarchy (v2) or the v1 hierarchy
 * of the memory controller; 0 when it has none. */
static int process_cgroup(const char *root, int v2, char *path, size_t len) {
  FILE *f = open_under(root, "/proc/self/cgroup");
  if (f == NULL) return 0;
  char line[CG_PATH_MAX + 256];
  int found = 0;
  while (!found && fgets(line, sizeof line, f) != NULL) {
    line[strcspn(line, "\n")] = '\0';
    char *first = strchr(line, ':');
    char *second = first != NULL ? strchr(first + 1, ':') : NULL;
    if (second == NULL) continue;
    *first = '\0';
    *second = '\0';
    const char *controllers = first + 1;
    found = v2 ? strcmp(line, "0") == 0 && controllers[0] == '\0'
               : list_has(controllers, "memory");
    if (found) snprintf(path, len, "%s", second + 1);
  }
  fclose(f);
  return found;
}

/* The limit in one cgroup folder's file, in bytes; -1 for none, no file or
 * no number. */
static long long read_limit(const char *dir, const char *file) {
  char full[CG_PATH_MAX];
  if ((size_t)snprintf(full, sizeof full, "%s/%s", dir, file) >= sizeof full) return -1;
  FILE *f = fopen(full, "r");
  if (f == NULL) return -1;
  char text[64] = "";
  char *got = fgets(text, sizeof text, f);
  fclose(f);
  if (got == NULL) return -1;
  char *end;
  long long bytes = strtoll(text, &end, 10);
  if (end == text || (*end != '\n' && *end != '\0') || bytes < 0 || bytes >= CG_UNLIMITED) {
    return -1; /* "max", v1's unlimited, or not a number */
  }
  return bytes;
}

/* The smallest limit from the process's cgroup up to the mount's top. */
static void walk_up(const char *root, const cg_mount *m, const char *cgroup, memory_limit *best) {
  const char *rel = cgroup;
  size_t root_len = strlen(m->root);
  if (strcmp(m->root, "/") != 0) {
    /* A container's mount shows only its part of the hierarchy. */
    if (strncmp(cgroup, m->root, root_len) != 0 ||
        (cgroup[root_len] != '/' && cgroup[root_len] != '\0')) {
      return;
    }
    rel = cgroup + root_len;
  }
  char top[CG_PATH_MAX], dir[CG_PATH_MAX];
  if ((size_t)snprintf(top, sizeof top, "%s%s", root, m->point) >= sizeof top) return;
  if ((size_t)snprintf(dir, sizeof dir, "%s%s", top, strcmp(rel, "/") == 0 ? "" : rel) >=
      sizeof dir) {
    return;
  }
  size_t top_len = strlen(top);
  const char *file = m->v2 ? "memory.max" : "memory.limit_in_bytes";
  for (;;) {
    long long bytes = read_limit(dir, file);
    if (bytes >= 0 && (best->kib < 0 || bytes / 1024 < best->kib)) {
      best->kib = (long)(bytes / 1024);
      snprintf(best->source, sizeof best->source, "cgroup %s %s of %s", m->v2 ? "v2" : "v1",
               file, dir + strlen(root));
    }
    if (strlen(dir) <= top_len) break;
    char *slash = strrchr(dir + top_len, '/');
    if (slash == NULL) break;
    *slash = '\0';
  }
}

void memory_limit_cgroup(const char *root, memory_limit *out) {
  out->kib = -1;
  snprintf(out->source, sizeof out->source, "no cgroup limit");
  cg_mount mounts[CG_MOUNTS_MAX];
  int n = read_mounts(root, mounts, CG_MOUNTS_MAX);
  for (int i = 0; i < n; i++) {
    char cgroup[CG_PATH_MAX];
    if (process_cgroup(root, mounts[i].v2, cgroup, sizeof cgroup)) {
      walk_up(root, &mounts[i], cgroup, out);
    }
  }
}

void memory_limit_get(memory_limit *out) {
  out->kib = -1;
  snprintf(out->source, sizeof out->source, "none");
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) {
    out->kib = pages * (page / 1024);
    snprintf(out->source, sizeof out->source, "RAM");
  }
  memory_limit cg;
  memory_limit_cgroup("", &cg);
  if (cg.kib >= 0 && (out->kib < 0 || cg.kib < out->kib)) *out = cg;
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      (out->kib < 0 || (long)(rl.rlim_cur / 1024) < out->kib)) {
    out->kib = (long)(rl.rlim_cur / 1024);
    snprintf(out->source, sizeof out->source, "RLIMIT_AS (ulimit -v)");
  }
}
