/* A step's members as PushRequest.members and ParamsReply.members carry
 * them (wire.h): varint pairs (trainer id, membership number). */
#include <string.h>

#include "common/wire.h"

size_t wire_members_encode(const uint32_t *seq, int n, uint8_t *out) {
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    if (seq[i] == 0) continue;
    len += wire_put_varint(out + len, (uint64_t)i);
    len += wire_put_varint(out + len, seq[i]);
  }
  return len;
}

/* One varint of data[*at..len) that fits in 32 bits; 0 when malformed. */
static int take_u32(const uint8_t *data, size_t len, size_t *at, uint32_t *v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 35 && *at < len; shift += 7) {
    uint8_t b = data[(*at)++];
    x |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      if (x > UINT32_MAX) return 0;
      *v = (uint32_t)x;
      return 1;
    }
  }
  return 0;
}

ps_err wire_members_decode(const uint8_t *data, size_t len, uint32_t *seq, int n, ps_error *err) {
  size_t at = 0;
  long last = -1;
  while (at < len) {
    uint32_t id, number;
    if (!take_u32(data, len, &at, &id) || !take_u32(data, len, &at, &number)) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "members: malformed at byte %zu of %zu",
                          at, len);
    }
    if ((long)id <= last || id >= (uint32_t)n || number == 0) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                          "members: trainer %u (number %u) after trainer %ld, in a job of %d",
                          id, number, last, n);
    }
    last = id;
  }
  memset(seq, 0, (size_t)n * sizeof *seq);
  for (at = 0; at < len;) {
    uint32_t id = 0, number = 0; /* checked above */
    (void)take_u32(data, len, &at, &id);
    (void)take_u32(data, len, &at, &number);
    seq[id] = number;
  }
  return PS_ERR_OK;
}
