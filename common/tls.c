/* TLS flags: which combinations make sense, and reading PEM files. */
#define _POSIX_C_SOURCE 200809L
#include "common/tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"

/* Certificate bundles are a few hundred KiB at most; anything larger is a mistake. */
#define PEM_MAX_BYTES (4 << 20)

static int given(const char *s) { return s != NULL && s[0] != '\0'; }

int tls_enabled(const tls_config *t) {
  return t != NULL && (given(t->cert) || given(t->key) || given(t->ca) || given(t->server_name));
}

ps_err tls_read_pem(const char *path, const char *flag, const char *kind, char **out,
                    ps_error *err) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (f == NULL) return ps_error_set(err, PS_ERR_IO, "%s %s: %s", flag, path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    int e = errno;
    fclose(f);
    return ps_error_set(err, PS_ERR_IO, "%s %s: %s", flag, path, strerror(e));
  }
  if (!S_ISREG(st.st_mode) || st.st_size > PEM_MAX_BYTES) {
    fclose(f);
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s %s: not a PEM file (%s)", flag, path,
                        S_ISREG(st.st_mode) ? "larger than 4 MiB" : "not a regular file");
  }
  if (strcmp(kind, "PRIVATE KEY") == 0 && (st.st_mode & 0077) != 0) {
    LOG_WARN("%s %s can be read by other users (chmod 600 it)", flag, path);
  }
  char *text = malloc((size_t)st.st_size + 1);
  if (text == NULL) {
    fclose(f);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "%s %s: out of memory", flag, path);
  }
  size_t n = fread(text, 1, (size_t)st.st_size, f);
  int read_error = ferror(f);
  fclose(f);
  if (read_error) {
    free(text);
    return ps_error_set(err, PS_ERR_IO, "%s %s: read error", flag, path);
  }
  text[n] = '\0';
  /* "-----BEGIN CERTIFICATE-----", "-----BEGIN PRIVATE KEY-----", "-----BEGIN EC PRIVATE KEY-----" */
  const char *begin = strstr(text, "-----BEGIN ");
  int found = 0;
  while (begin != NULL && !found) {
    const char *end = strstr(begin + 11, "-----");
    if (end == NULL) break;
    size_t label = (size_t)(end - begin - 11), klen = strlen(kind);
    found = label >= klen && memcmp(end - klen, kind, klen) == 0;
    begin = strstr(end + 5, "-----BEGIN ");
  }
  if (!found || strlen(text) != n) {
    free(text);
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s %s: no PEM %s in it (\"-----BEGIN %s-----\")",
                        flag, path, strcmp(kind, "CERTIFICATE") == 0 ? "certificate" : "private key",
                        kind);
  }
  *out = text;
  return PS_ERR_OK;
}

static ps_err check_file(const char *path, const char *flag, const char *kind, ps_error *err) {
  if (!given(path)) return PS_ERR_OK;
  char *text;
  if (tls_read_pem(path, flag, kind, &text, err) != PS_ERR_OK) return err->code;
  free(text);
  return PS_ERR_OK;
}

static ps_err check_files(const tls_config *t, ps_error *err) {
  if (check_file(t->cert, "--tls-cert", "CERTIFICATE", err) != PS_ERR_OK ||
      check_file(t->key, "--tls-key", "PRIVATE KEY", err) != PS_ERR_OK ||
      check_file(t->ca, "--tls-ca", "CERTIFICATE", err) != PS_ERR_OK) {
    return err->code;
  }
  return PS_ERR_OK;
}

static ps_err check_pair(const tls_config *t, ps_error *err) {
  if (given(t->cert) != given(t->key)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--tls-cert and --tls-key go together (the certificate and its key)");
  }
  return PS_ERR_OK;
}

ps_err tls_check_server(const tls_config *t, ps_error *err) {
  if (!tls_enabled(t)) return PS_ERR_OK;
  if (given(t->server_name)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--tls-server-name is a trainer option");
  }
  if (check_pair(t, err) != PS_ERR_OK) return err->code;
  if (!given(t->cert)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--tls-ca needs --tls-cert and --tls-key: the pserver's own certificate "
                        "and key (scripts/make-certs makes them)");
  }
  return check_files(t, err);
}

ps_err tls_check_client(const tls_config *t, ps_error *err) {
  if (!tls_enabled(t)) return PS_ERR_OK;
  if (check_pair(t, err) != PS_ERR_OK) return err->code;
  if (!given(t->ca)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "TLS needs --tls-ca: the CA certificate that signed the pservers' "
                        "certificates");
  }
  return check_files(t, err);
}

const char *tls_describe_server(const tls_config *t) {
  if (!tls_enabled(t)) return "plaintext";
  return given(t->ca) ? "TLS, client certificates required" : "TLS";
}
