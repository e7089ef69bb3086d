/* The memory limit from cgroup files, on fixture trees made here (a folder
 * holding proc/self/cgroup, proc/self/mountinfo and the cgroup files): v2's
 * memory.max ("max" and numbers) and v1's memory.limit_in_bytes (its
 * "unlimited" number), the process's own cgroup or one above it, the
 * smallest winning; hybrid mounts (v1 memory beside v2 at .../unified); a
 * container's mount of its part of the hierarchy; mount paths with escaped
 * spaces; nothing mounted, unreadable values. Then this machine's own. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "server/memory_limit.h"
#include "tests/check.h"

static char root[PATH_MAX];

/* Writes text to root/path, making the folders on the way. */
static void put(const char *path, const char *text) {
  char full[PATH_MAX * 2];
  snprintf(full, sizeof full, "%s/%s", root, path);
  for (char *p = full + strlen(root) + 1; *p != '\0'; p++) {
    if (*p != '/') continue;
    *p = '\0';
    REQUIRE(mkdir(full, 0755) == 0 || errno == EEXIST);
    *p = '/';
  }
  FILE *f = fopen(full, "w");
  REQUIRE(f != NULL);
  fputs(text, f);
  REQUIRE(fclose(f) == 0);
}

/* A fresh fixture folder. */
static void fresh(const char *name) {
  snprintf(root, sizeof root, "/tmp/pstrain-memlimit-%s-XXXXXX", name);
  REQUIRE(mkdtemp(root) != NULL);
}

static void clean(void) {
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  REQUIRE(system(cmd) == 0);
}

static const char *const V2_MOUNT =
    "25 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";
static const char *const V1_MOUNTS =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

/* v2: "max" on the leaf, a number on its parent: the parent's binds. */
static void case_v2_parent_binds(void) {
  fresh("v2");
  put("proc/self/mountinfo", V2_MOUNT);
  put("proc/self/cgroup", "0::/job.slice/pserver.scope\n");
  put("sys/fs/cgroup/job.slice/pserver.scope/memory.max", "max\n");
  put("sys/fs/cgroup/job.slice/memory.max", "157286400\n");
  memory_limit m;
  memory_limit_cgroup(root, &m);
  CHECK_EQ_INT(m.kib, 150 * 1024);
  CHECK_EQ_STR(m.source, "cgroup v2 memory.max of /sys/fs/cgroup/job.slice");
  /* A smaller limit on the leaf wins. */
  put("sys/fs/cgroup/job.slice/pserver.scope/memory.max", "104857600\n");
  memory_limit_cgroup(root, &m);
  CHECK_EQ_INT(m.kib, 100 * 1024);
  CHECK_EQ_STR(m.source, "cgroup v2 memory.max of /sys/fs/cgroup/job.slice/pserver.scope");
  clean();
}

/* v1 (hybrid: v2 at .../unified without limits): the memory controller's
 * hierarchy, its unlimited leaf and a limited parent. */
static void case_v1_hierarchy(void) {
  fresh("v1");
  put("proc/self/mountinfo", V1_MOUNTS);
  put("proc/self/cgroup", "9:name=systemd:/\n4:memory:/jobs/pserver-0\n2:cpu,cpuacct:/\n0::/\n");
  put("sys/fs/cgroup/memory/jobs/pserver-0/memory.limit_in_bytes", "9223372036854771712\n");
  put("sys/fs/cgroup/memory/jobs/memory.limit_in_bytes", "157286400\n");
  put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  memory_limit m;
  memory_limit_cgroup(root, &m);
  CHECK_EQ_INT(m.kib, 150 * 1024);
  CHECK_EQ_STR(m.source, "cgroup v1 memory.limit_in_bytes of /sys/fs/cgroup/memory/jobs");
  /* The v2 hierarchy's own limit, when smaller, wins over v1's. */
  put("sys/fs/cgroup/unified/memory.max", "52428800\n");
  memory_limit_cgroup(root, &m);
  CHECK_EQ_INT(m.kib, 50 * 1024);
  CHECK_EQ_STR(m.source, "cgroup v2 memory.max of /sys/fs/cgroup/unified");
  clean();
}

/* A container: the mount shows the host's /docker/abc as its top, where
 * the limit is; /proc/self/cgroup names the host's path. */
static void case_container_mount(void) {
  fresh("container");
  put("proc/self/mountinfo",
      "700 650 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n");
  put("proc/self/cgroup", "5:memory:/docker/abc\n");
  put("sys/fs/cgroup/memory/memory.limit_in_bytes", "268435456\n");
  memory_limit m;
  memory_limit_cgroup(root, &m);
  CHECK_EQ_INT(m.kib, 256 * 1024);
  CHECK_EQ_STR(m.source, "cgroup v1 memory.limit_in_bytes of /sys/fs/cgroup/memory");
  /* A process outside the mounted part sees no limit from it. */
  put("proc/self/cgroup", "5:memory:/other\n");
  memory_limit_cgroup(root, &m);
  CHECK_EQ_INT(m.kib, -1);
  clean();
}

/* Mount points with a space (mountinfo's \040). */
static void case_escaped_mount_point(void) {
  fresh("escaped");
  put("proc/self/mountinfo",
      "25 30 0:22 / /sys/fs/my\\040cgroup rw,relatime shared:4 - cgroup2 cgroup2 rw\n");
  put("proc/self/cgroup", "0::/a\n");
  put("sys/fs/my cgroup/a/memory.max", "1073741824\n");
  memory_limit m;
  memory_limit_cgroup(root, &m);
  CHECK_EQ_INT(m.kib, 1024 * 1024);
  CHECK_EQ_STR(m.source, "cgroup v2 memory.max of /sys/fs/my cgroup/a");
  clean();
}

/* No limit anywhere, garbage values, no cgroup mounted, no files. */
static void case_none(void) {
  fresh("none");
  memory_limit m;
  memory_limit_cgroup(root, &m); /* no proc files at all */
  CHECK_EQ_INT(m.kib, -1);
  CHECK_EQ_STR(m.source, "no cgroup limit");
  put("proc/self/mountinfo", V2_MOUNT);
  put("proc/self/cgroup", "0::/a/b\n");
  put("sys/fs/cgroup/a/b/memory.max", "max\n");
  put("sys/fs/cgroup/a/memory.max", "12abc\n");
  put("sys/fs/cgroup/memory.max", "-5\n");
  memory_limit_cgroup(root, &m);
  CHECK_EQ_INT(m.kib, -1);
  /* The v1 controller not mounted: its line in /proc/self/cgroup is not enough. */
  put("proc/self/mountinfo", "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n");
  put("proc/self/cgroup", "4:memory:/x\n");
  put("sys/fs/cgroup/memory/x/memory.limit_in_bytes", "1048576\n");
  memory_limit_cgroup(root, &m);
  CHECK_EQ_INT(m.kib, -1);
  clean();
}

/* This machine: some limit (RAM at least), with its source named. */
static void case_this_machine(void) {
  memory_limit m;
  memory_limit_get(&m);
  printf("this machine: %ld MiB from %s\n", m.kib / 1024, m.source);
  CHECK(m.kib > 0);
  CHECK(m.source[0] != '\0');
  memory_limit cg;
  memory_limit_cgroup("", &cg);
  printf("cgroups: %s\n", cg.kib >= 0 ? cg.source : "no limit");
  CHECK(cg.kib < 0 || m.kib <= cg.kib);
}

int main(void) {
  RUN_CASE(case_v2_parent_binds);
  RUN_CASE(case_v1_hierarchy);
  RUN_CASE(case_container_mount);
  RUN_CASE(case_escaped_mount_point);
  RUN_CASE(case_none);
  RUN_CASE(case_this_machine);
  return check_report("test_memory_limit");
}
