/* Messages between pstrain and gRPC: parts into byte buffers (borrowed
 * memory under a lease, the rest copied), received buffers into segments
 * read in place, gRPC status codes to ps_err and back, channel arguments. */
#define _POSIX_C_SOURCE 200809L
#include <grpc/byte_buffer_reader.h>
#include <grpc/support/time.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/rpc_internal.h"

void rpc_global_init(void) { grpc_init(); }
void rpc_global_shutdown(void) { grpc_shutdown(); }

/* --- status mapping ----------------------------------------------------------
 * One table for both directions; the first row that matches wins. A few codes
 * map one way only: pstrain's CORRUPT_DATA and NO_MEMORY have no gRPC twin,
 * and gRPC's DATA_LOSS arrives as CORRUPT_DATA. Anything else is INTERNAL. */

enum { BOTH, SENT_ONLY, RECEIVED_ONLY };

static const struct {
  ps_err err;
  grpc_status_code status;
  int direction;
} status_map[] = {
    {PS_ERR_OK, GRPC_STATUS_OK, BOTH},
    {PS_ERR_CANCELLED, GRPC_STATUS_CANCELLED, BOTH},
    {PS_ERR_INVALID_ARGUMENT, GRPC_STATUS_INVALID_ARGUMENT, BOTH},
    {PS_ERR_TIMEOUT, GRPC_STATUS_DEADLINE_EXCEEDED, BOTH},
    {PS_ERR_PERMISSION_DENIED, GRPC_STATUS_PERMISSION_DENIED, BOTH},
    {PS_ERR_RESOURCE_EXHAUSTED, GRPC_STATUS_RESOURCE_EXHAUSTED, BOTH},
    {PS_ERR_FAILED_PRECONDITION, GRPC_STATUS_FAILED_PRECONDITION, BOTH},
    {PS_ERR_ABORTED, GRPC_STATUS_ABORTED, BOTH},
    {PS_ERR_OUT_OF_RANGE, GRPC_STATUS_OUT_OF_RANGE, BOTH},
    {PS_ERR_UNSUPPORTED, GRPC_STATUS_UNIMPLEMENTED, BOTH},
    {PS_ERR_UNAVAILABLE, GRPC_STATUS_UNAVAILABLE, BOTH},
    {PS_ERR_UNAUTHENTICATED, GRPC_STATUS_UNAUTHENTICATED, BOTH},
    {PS_ERR_CORRUPT_DATA, GRPC_STATUS_INVALID_ARGUMENT, SENT_ONLY},
    {PS_ERR_NO_MEMORY, GRPC_STATUS_RESOURCE_EXHAUSTED, SENT_ONLY},
    {PS_ERR_CORRUPT_DATA, GRPC_STATUS_DATA_LOSS, RECEIVED_ONLY},
};

ps_err rpc_err_from_status(grpc_status_code status) {
  for (size_t i = 0; i < sizeof status_map / sizeof status_map[0]; i++) {
    if (status_map[i].status == status && status_map[i].direction != SENT_ONLY) {
      return status_map[i].err;
    }
  }
  return PS_ERR_INTERNAL;
}

grpc_status_code rpc_status_from_err(ps_err code) {
  for (size_t i = 0; i < sizeof status_map / sizeof status_map[0]; i++) {
    if (status_map[i].err == code && status_map[i].direction != RECEIVED_ONLY) {
      return status_map[i].status;
    }
  }
  return GRPC_STATUS_INTERNAL;
}

/* --- parts into buffers ------------------------------------------------------ */

static void lease_release(void *lease) { atomic_fetch_sub(&((rpc_lease *)lease)->refs, 1); }

ps_err rpc_lease_wait(rpc_lease *lease) {
  const struct timespec pause = {0, 50 * 1000};
  for (long waited_us = 0; atomic_load(&lease->refs) > 0; waited_us += 50) {
    if (waited_us > 30L * 1000 * 1000) {
      LOG_WARN("rpc: gRPC still holds %d reference(s) to a buffer after 30 s",
               atomic_load(&lease->refs));
      return PS_ERR_TIMEOUT;
    }
    nanosleep(&pause, NULL);
  }
  return PS_ERR_OK;
}

grpc_byte_buffer *rpc_buffer_from_parts(const rpc_part *parts, int count) {
  grpc_slice stack_slices[32];
  grpc_slice *slices = count <= 32 ? stack_slices : malloc((size_t)count * sizeof *slices);
  if (slices == NULL) return NULL;
  for (int i = 0; i < count; i++) {
    if (parts[i].lease != NULL) {
      atomic_fetch_add(&parts[i].lease->refs, 1);
      slices[i] = grpc_slice_new_with_user_data((void *)parts[i].data, parts[i].len, lease_release,
                                                parts[i].lease);
    } else {
      slices[i] = grpc_slice_from_copied_buffer(parts[i].data, parts[i].len);
    }
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(slices, (size_t)count);
  for (int i = 0; i < count; i++) grpc_slice_unref(slices[i]);
  if (slices != stack_slices) free(slices);
  return bb;
}

/* --- received buffers into segments ---------------------------------------- */

void rpc_received_free(rpc_received *r) {
  for (size_t i = 0; i < r->count; i++) grpc_slice_unref(r->slices[i]);
  free(r->slices);
  free(r->segments);
  if (r->bb != NULL) grpc_byte_buffer_destroy(r->bb);
  memset(r, 0, sizeof *r);
}

ps_err rpc_received_init(rpc_received *r, grpc_byte_buffer *bb, rpc_message *msg, ps_error *err) {
  memset(r, 0, sizeof *r);
  r->bb = bb;
  grpc_byte_buffer_reader reader;
  if (!grpc_byte_buffer_reader_init(&reader, bb)) {
    rpc_received_free(r);
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "rpc: cannot read a received message");
  }
  size_t cap = 0, total = 0;
  grpc_slice slice;
  ps_err rc = PS_ERR_OK;
  while (grpc_byte_buffer_reader_next(&reader, &slice)) {
    if (r->count == cap) {
      cap = cap == 0 ? 8 : 2 * cap;
      grpc_slice *s = realloc(r->slices, cap * sizeof *s);
      rpc_segment *g = s == NULL ? NULL : realloc(r->segments, cap * sizeof *g);
      if (s != NULL) r->slices = s;
      if (g == NULL) {
        grpc_slice_unref(slice);
        rc = ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory reading a message");
        break;
      }
      r->segments = g;
    }
    r->slices[r->count++] = slice;
    total += GRPC_SLICE_LENGTH(slice);
  }
  grpc_byte_buffer_reader_destroy(&reader);
  if (rc != PS_ERR_OK) {
    rpc_received_free(r);
    return rc;
  }
  /* Small slices keep their bytes inside the grpc_slice struct itself, so
   * pointers are taken only now, from the array's final place. */
  for (size_t i = 0; i < r->count; i++) {
    r->segments[i].data = GRPC_SLICE_START_PTR(r->slices[i]);
    r->segments[i].len = GRPC_SLICE_LENGTH(r->slices[i]);
  }
  msg->segments = r->segments;
  msg->count = r->count;
  msg->total = total;
  return PS_ERR_OK;
}

/* --- replies ------------------------------------------------------------------ */

ps_err rpc_reply_take(grpc_byte_buffer *bb, rpc_reply *out, ps_error *err) {
  memset(out, 0, sizeof *out);
  rpc_received *r = malloc(sizeof *r);
  if (r == NULL) {
    grpc_byte_buffer_destroy(bb);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory reading the reply");
  }
  if (rpc_received_init(r, bb, &out->message, err) != PS_ERR_OK) {
    free(r);
    return err->code;
  }
  out->internal = r;
  return PS_ERR_OK;
}

void rpc_reply_free(rpc_reply *reply) {
  rpc_received *r = reply->internal;
  if (r != NULL) {
    rpc_received_free(r);
    free(r);
  }
  memset(reply, 0, sizeof *reply);
}

ps_err rpc_reply_from_parts(const rpc_part *parts, int count, rpc_reply *out, ps_error *err) {
  memset(out, 0, sizeof *out);
  grpc_byte_buffer *bb = rpc_buffer_from_parts(parts, count);
  if (bb == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "rpc: out of memory building a message");
  return rpc_reply_take(bb, out, err);
}

/* --- channel arguments --------------------------------------------------------- */

grpc_channel_args rpc_channel_args(grpc_arg *args, size_t max_message_bytes, int max_reconnect_ms) {
  int limit = max_message_bytes > (size_t)INT32_MAX ? INT32_MAX : (int)max_message_bytes;
  int n = 0;
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[n++].value.integer = limit;
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[n++].value.integer = limit;
  if (max_reconnect_ms > 0) {
    /* The default backoff grows to 120 s; a restarted peer should be found at once. */
    int first = max_reconnect_ms < 100 ? max_reconnect_ms : 100;
    args[n].type = GRPC_ARG_INTEGER;
    args[n].key = (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
    args[n++].value.integer = max_reconnect_ms;
    args[n].type = GRPC_ARG_INTEGER;
    args[n].key = (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS;
    args[n++].value.integer = first;
    args[n].type = GRPC_ARG_INTEGER;
    args[n].key = (char *)GRPC_ARG_MIN_RECONNECT_BACKOFF_MS;
    args[n++].value.integer = first;
  }
  grpc_channel_args ca = {(size_t)n, args};
  return ca;
}

gpr_timespec rpc_deadline_in(double seconds) {
  if (seconds <= 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_micros((int64_t)(seconds * 1e6), GPR_TIMESPAN));
}
