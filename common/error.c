/* Error code names and texts, and the message-carrying error value. */
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const err_names[] = {
#define PS_ERR_NAME(name, text) #name,
    PS_ERR_MAP(PS_ERR_NAME)
#undef PS_ERR_NAME
};

static const char *const err_texts[] = {
#define PS_ERR_TEXT(name, text) text,
    PS_ERR_MAP(PS_ERR_TEXT)
#undef PS_ERR_TEXT
};

const char *ps_err_name(ps_err code) {
  if ((int)code < 0 || code >= PS_ERR_COUNT) return "UNKNOWN";
  return err_names[code];
}

const char *ps_err_text(ps_err code) {
  if ((int)code < 0 || code >= PS_ERR_COUNT) return "unknown error";
  return err_texts[code];
}

ps_err ps_error_set(ps_error *err, ps_err code, const char *fmt, ...) {
  if (err == NULL) return code;
  err->code = code;
  /* Callers prefix what they were doing to err->msg itself ("...: %s",
   * err->msg): format aside, then copy, as vsnprintf's source and
   * destination must not overlap. */
  char msg[sizeof err->msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(err->msg, msg, sizeof msg);
  return code;
}

void ps_error_clear(ps_error *err) {
  if (err == NULL) return;
  err->code = PS_ERR_OK;
  err->msg[0] = '\0';
}
