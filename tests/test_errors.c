/* The error enum's names and texts, and the message-carrying error value. */
#include "common/error.h"
#include "tests/check.h"

int main(void) {
  CHECK_EQ_STR(ps_err_name(PS_ERR_OK), "OK");
  CHECK_EQ_STR(ps_err_name(PS_ERR_CORRUPT_DATA), "CORRUPT_DATA");
  CHECK_EQ_STR(ps_err_text(PS_ERR_INVALID_ARGUMENT), "invalid argument");
  CHECK_EQ_STR(ps_err_name((ps_err)999), "UNKNOWN");
  CHECK_EQ_STR(ps_err_text((ps_err)-1), "unknown error");
  for (int i = 0; i < PS_ERR_COUNT; i++) {
    CHECK(ps_err_name((ps_err)i)[0] != '\0');
    CHECK(ps_err_text((ps_err)i)[0] != '\0');
  }

  ps_error err;
  ps_error_clear(&err);
  CHECK_EQ_INT(err.code, PS_ERR_OK);
  CHECK_EQ_STR(err.msg, "");
  CHECK_EQ_INT(ps_error_set(&err, PS_ERR_IO, "opening %s: %s", "x.idx", "gone"), PS_ERR_IO);
  CHECK_EQ_INT(err.code, PS_ERR_IO);
  CHECK_EQ_STR(err.msg, "opening x.idx: gone");
  CHECK_EQ_INT(ps_error_set(NULL, PS_ERR_TIMEOUT, "ignored"), PS_ERR_TIMEOUT);
  return check_report("test_errors");
}
