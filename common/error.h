/* pstrain's error codes and the error value that carries a message.
 * Library and system failures are mapped to these codes where they happen;
 * the message says what was being done and why it failed. */
#ifndef PSTRAIN_COMMON_ERROR_H
#define PSTRAIN_COMMON_ERROR_H

#include <stddef.h>

/* One list drives the enum and its string table. */
#define PS_ERR_MAP(X)                                                  \
  X(OK, "success")                                                     \
  X(INVALID_ARGUMENT, "invalid argument")                              \
  X(IO, "input/output error")                                          \
  X(CORRUPT_DATA, "corrupt or malformed data")                         \
  X(NO_MEMORY, "out of memory")                                        \
  X(UNSUPPORTED, "not supported by this build")                        \
  X(BACKEND, "compute backend failure")                                \
  X(FAILED_PRECONDITION, "failed precondition")                        \
  X(OUT_OF_RANGE, "out of range")                                      \
  X(UNAVAILABLE, "peer unavailable")                                   \
  X(TIMEOUT, "deadline exceeded")                                      \
  X(CANCELLED, "cancelled")                                            \
  X(ABORTED, "aborted")                                                \
  X(UNAUTHENTICATED, "unauthenticated")                                \
  X(PERMISSION_DENIED, "permission denied")                            \
  X(RESOURCE_EXHAUSTED, "resource exhausted (a limit was reached)")    \
  X(INTERNAL, "internal error")

typedef enum {
#define PS_ERR_ENUM(name, text) PS_ERR_##name,
  PS_ERR_MAP(PS_ERR_ENUM)
#undef PS_ERR_ENUM
  PS_ERR_COUNT
} ps_err;

/* Returns err->code from the calling function when expr (a ps_err) fails;
 * err is the caller's ps_error *, which expr filled. */
#define PS_TRY(expr)                             \
  do {                                           \
    if ((expr) != PS_ERR_OK) return err->code;   \
  } while (0)

/* The short name of a code, e.g. "CORRUPT_DATA"; never NULL. */
const char *ps_err_name(ps_err code);
/* A human description of a code, e.g. "corrupt or malformed data"; never NULL. */
const char *ps_err_text(ps_err code);

/* An error with its message. Callers own it (usually on the stack). */
typedef struct ps_error {
  ps_err code;
  char msg[512];
} ps_error;

/* Records code and a printf-style message in err (which may be NULL) and
 * returns code, so callers can write `return ps_error_set(err, ...)`. The
 * arguments may include err->msg (to say what was being done). */
ps_err ps_error_set(ps_error *err, ps_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Resets err to PS_ERR_OK with an empty message. */
void ps_error_clear(ps_error *err);

#endif
