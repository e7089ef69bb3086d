/* The memory this process may use, and where that limit comes from: RAM,
 * RLIMIT_AS, or a memory cgroup, v2 (memory.max) or v1
 * (memory.limit_in_bytes), the process's own or any cgroup above it (a
 * limit set on a parent binds its children). The mounts come from
 * /proc/self/mountinfo, so hybrid systems (v1 controllers with v2 at
 * /sys/fs/cgroup/unified) and containers (a cgroup namespace, the mount's
 * root a path of the host's hierarchy) are read where they are. */
#ifndef PSTRAIN_SERVER_MEMORY_LIMIT_H
#define PSTRAIN_SERVER_MEMORY_LIMIT_H

#define MEMORY_LIMIT_SOURCE_MAX 256

typedef struct memory_limit {
  long kib;                              /* -1: none found */
  char source[MEMORY_LIMIT_SOURCE_MAX];  /* "cgroup v1 memory.limit_in_bytes of /sys/...", "RAM" */
} memory_limit;

/* The smallest cgroup memory limit over this process's cgroups and their
 * parents, v1 and v2. root prefixes every path read ("" for this system; a
 * test's fixture folder holds proc/self/cgroup, proc/self/mountinfo and the
 * cgroup files below it). kib -1 when no cgroup sets one ("max", v1's
 * "unlimited", none mounted). */
void memory_limit_cgroup(const char *root, memory_limit *out);

/* The smallest of RAM, the cgroup limit and RLIMIT_AS; kib -1 when none
 * can be read. */
void memory_limit_get(memory_limit *out);

#endif
