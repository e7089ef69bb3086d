/* gRPC credentials from the TLS flags: plaintext, TLS, or mutual TLS. The
 * PEM files are read once per server or client start, handed to gRPC (which
 * copies them), and the private key's text is wiped before it is freed. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "common/rpc_internal.h"

static int given(const char *s) { return s != NULL && s[0] != '\0'; }

/* The texts of the PEM files a side gives: cert and key together or
 * neither, ca where given. */
typedef struct pem_trio {
  char *cert, *key, *ca;
} pem_trio;

static void pem_trio_free(pem_trio *p) {
  if (p->key != NULL) memset(p->key, 0, strlen(p->key));
  free(p->cert);
  free(p->key);
  free(p->ca);
  memset(p, 0, sizeof *p);
}

/* Reads the files tls names; on failure nothing is left to free. */
static ps_err pem_trio_read(const tls_config *tls, pem_trio *p, ps_error *err) {
  memset(p, 0, sizeof *p);
  if ((given(tls->cert) &&
       tls_read_pem(tls->cert, "--tls-cert", "CERTIFICATE", &p->cert, err) != PS_ERR_OK) ||
      (given(tls->key) &&
       tls_read_pem(tls->key, "--tls-key", "PRIVATE KEY", &p->key, err) != PS_ERR_OK) ||
      (given(tls->ca) && tls_read_pem(tls->ca, "--tls-ca", "CERTIFICATE", &p->ca, err) != PS_ERR_OK)) {
    pem_trio_free(p);
    return err->code;
  }
  return PS_ERR_OK;
}

ps_err rpc_server_credentials(const tls_config *tls, grpc_server_credentials **out,
                              ps_error *err) {
  *out = NULL;
  if (!tls_enabled(tls)) {
    *out = grpc_insecure_server_credentials_create();
    if (*out == NULL) return ps_error_set(err, PS_ERR_INTERNAL, "gRPC refused plaintext credentials");
    return PS_ERR_OK;
  }
  pem_trio pem;
  if (tls_check_server(tls, err) != PS_ERR_OK || pem_trio_read(tls, &pem, err) != PS_ERR_OK) {
    return err->code;
  }
  /* With a CA, every client must present a certificate it signed. */
  grpc_ssl_pem_key_cert_pair pair = {pem.key, pem.cert};
  *out = grpc_ssl_server_credentials_create_ex(
      pem.ca, &pair, 1,
      pem.ca != NULL ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                     : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
      NULL);
  pem_trio_free(&pem);
  if (*out == NULL) return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "gRPC refused the TLS settings");
  return PS_ERR_OK;
}

ps_err rpc_client_credentials(const tls_config *tls, grpc_channel_credentials **out,
                              ps_error *err) {
  *out = NULL;
  if (!tls_enabled(tls)) {
    *out = grpc_insecure_credentials_create();
    if (*out == NULL) return ps_error_set(err, PS_ERR_INTERNAL, "gRPC refused plaintext credentials");
    return PS_ERR_OK;
  }
  pem_trio pem;
  if (tls_check_client(tls, err) != PS_ERR_OK || pem_trio_read(tls, &pem, err) != PS_ERR_OK) {
    return err->code;
  }
  /* A key pair only where the client presents a certificate (mutual TLS). */
  grpc_ssl_pem_key_cert_pair pair = {pem.key, pem.cert};
  *out = grpc_ssl_credentials_create_ex(pem.ca, pem.cert != NULL ? &pair : NULL, NULL, NULL);
  pem_trio_free(&pem);
  if (*out == NULL) return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "gRPC refused the TLS settings");
  return PS_ERR_OK;
}
