/* TLS settings as the daemons' flags give them (file paths), the checks
 * that run before any work, and reading the PEM files for the RPC layer. */
#ifndef PSTRAIN_COMMON_TLS_H
#define PSTRAIN_COMMON_TLS_H

#include "common/error.h"

/* Paths of PEM files; NULL or "" where not given. */
typedef struct tls_config {
  const char *cert;        /* own certificate (chain) */
  const char *key;         /* its private key */
  const char *ca;          /* CA certificate(s) that sign the peers' certificates */
  const char *server_name; /* client: the name the server's certificate must carry, instead
                              of the host of the address dialled */
} tls_config;

/* Whether any TLS setting is given: TLS is on. NULL is off. */
int tls_enabled(const tls_config *t);

/* Checks a pserver's settings: --tls-cert and --tls-key together, --tls-ca
 * only with them, and that every file given reads as PEM of the right kind.
 * Errors name the flag and the file. */
ps_err tls_check_server(const tls_config *t, ps_error *err);

/* Checks a trainer's settings: --tls-ca whenever TLS is on (the pservers'
 * certificates are verified against it), --tls-cert and --tls-key together,
 * and the files as above. */
ps_err tls_check_client(const tls_config *t, ps_error *err);

/* Reads a whole PEM file into a NUL-terminated string (free it), refusing a
 * file that lacks "-----BEGIN <kind>" (kind "CERTIFICATE" or "PRIVATE KEY",
 * which also matches "EC PRIVATE KEY" and "RSA PRIVATE KEY"). flag names the
 * option in errors. */
ps_err tls_read_pem(const char *path, const char *flag, const char *kind, char **out,
                    ps_error *err);

/* One line for logs: "off", or what is on, e.g. "TLS, client certificates required". */
const char *tls_describe_server(const tls_config *t);

#endif
