/* Shared-secret tokens: read from a file (never from a flag's value, so it
 * stays out of process lists and logs), and the rule that a pserver listening
 * beyond loopback needs one. */
#ifndef PSTRAIN_COMMON_TOKEN_H
#define PSTRAIN_COMMON_TOKEN_H

#include <stddef.h>

#include "common/error.h"

#define TOKEN_MAX 256

/* Reads the token: the file's first line, without its newline; 16..255
 * printable characters. Warns when others may read the file. */
ps_err token_read_file(const char *path, char *out, size_t len, ps_error *err);

/* Whether HOST:PORT's host is a loopback address (127.0.0.0/8, ::1, localhost). */
int token_is_loopback(const char *endpoint);

#endif
