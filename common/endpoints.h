/* Lists of HOST:PORT endpoints as users give them ("h1:7000,h2:7000") and the
 * roles launchers set in the environment (TRAINING_ROLE). */
#ifndef PSTRAIN_COMMON_ENDPOINTS_H
#define PSTRAIN_COMMON_ENDPOINTS_H

#include "common/error.h"

#define ENDPOINTS_MAX 256
#define ENDPOINT_LEN 256

typedef struct endpoint_list {
  int count;
  char items[ENDPOINTS_MAX][ENDPOINT_LEN];
} endpoint_list;

/* Splits a comma-separated list; each entry must be HOST:PORT with a port
 * 1..65535 (IPv6 hosts in brackets). `what` names the option in errors. */
ps_err endpoints_parse(const char *text, const char *what, endpoint_list *out, ps_error *err);

/* Refuses to start when TRAINING_ROLE is set to another role than `role`. */
ps_err endpoints_check_role(const char *role, ps_error *err);

#endif
