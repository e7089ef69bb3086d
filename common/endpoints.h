/* Lists of HOST:PORT endpoints as users give them ("h1:7000,h2:7000") and the
 * roles launchers set in the environment (TRAINING_ROLE). */
#ifndef PSTRAIN_COMMON_ENDPOINTS_H
#define PSTRAIN_COMMON_ENDPOINTS_H

#include "common/error.h"
#include "common/job_limits.h"

/* Endpoint lists are pserver lists. */
#define ENDPOINTS_MAX PSTRAIN_MAX_PSERVERS
#define ENDPOINT_LEN 256

typedef struct endpoint_list {
  int count;
  char items[ENDPOINTS_MAX][ENDPOINT_LEN];
} endpoint_list;

/* Splits a comma-separated list; each entry must be HOST:PORT with a port
 * 1..65535 (IPv6 hosts in brackets), and no entry may repeat another. `what`
 * names the option in errors. */
ps_err endpoints_parse(const char *text, const char *what, endpoint_list *out, ps_error *err);

/* The host part of HOST:PORT, without the brackets of an IPv6 address. */
ps_err endpoint_host(const char *endpoint, char *host, size_t len, ps_error *err);

/* Checks that HOST:PORT's host resolves (getaddrinfo), retrying for up to
 * wait_s seconds while the name is unknown; the error names the entry. */
ps_err endpoint_resolve(const char *endpoint, const char *what, double wait_s, ps_error *err);

/* Under srun (SLURM_STEP_ID set): this task's SLURM_PROCID and the step's
 * SLURM_NTASKS; -1 and -1 elsewhere. Malformed values are an error. */
ps_err endpoints_slurm_task(long *procid, long *ntasks, ps_error *err);

/* Refuses to start when TRAINING_ROLE is set to another role than `role`. */
ps_err endpoints_check_role(const char *role, ps_error *err);

#endif
