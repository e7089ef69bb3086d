/* Hand-made HTTP/2 client connections (tests/h2_raw.h). Frame layout (RFC
 * 9113 4.1): 24-bit length, type, flags, 31-bit stream id. Headers are
 * HPACK literals without indexing (RFC 7541 6.2.2), which any decoder
 * takes. */
#define _POSIX_C_SOURCE 200809L
#include "tests/h2_raw.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"

enum { F_DATA = 0, F_HEADERS = 1, F_RST_STREAM = 3, F_SETTINGS = 4, F_PING = 6, F_GOAWAY = 7 };
enum { FLAG_ACK = 0x1, FLAG_END_HEADERS = 0x4 };
#define STREAM 1u

static int send_all(h2_conn *c, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -1; /* EAGAIN too: these writes are tiny, a full buffer is a dead peer */
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int send_frame(h2_conn *c, int type, int flags, uint32_t stream, const uint8_t *payload,
                      size_t len) {
  uint8_t frame[9 + 512];
  if (len > sizeof frame - 9) return -1;
  frame[0] = (uint8_t)(len >> 16);
  frame[1] = (uint8_t)(len >> 8);
  frame[2] = (uint8_t)len;
  frame[3] = (uint8_t)type;
  frame[4] = (uint8_t)flags;
  frame[5] = (uint8_t)(stream >> 24 & 0x7f);
  frame[6] = (uint8_t)(stream >> 16);
  frame[7] = (uint8_t)(stream >> 8);
  frame[8] = (uint8_t)stream;
  if (len > 0) memcpy(frame + 9, payload, len);
  return send_all(c, frame, 9 + len);
}

/* One HPACK literal header without indexing; names and values < 127 bytes. */
static size_t literal(uint8_t *out, const char *name, const char *value) {
  size_t n = strlen(name), v = strlen(value), at = 0;
  out[at++] = 0x00;
  out[at++] = (uint8_t)n;
  memcpy(out + at, name, n);
  at += n;
  out[at++] = (uint8_t)v;
  memcpy(out + at, value, v);
  return at + v;
}

int h2_open(h2_conn *c, const char *host, int port, h2_kind kind, const char *path,
            size_t body_len) {
  memset(c, 0, sizeof *c);
  c->kind = kind;
  c->body_len = body_len > 65530 ? 65530 : body_len;
  c->fd = socket(AF_INET, SOCK_STREAM, 0);
  if (c->fd < 0) return -1;
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  int one = 1;
  if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
    errno = EINVAL;
    goto fail;
  }
  if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
      setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    goto fail;
  }
  c->opened = now_s();
  if (kind != H2_TCP) {
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    if (send_all(c, (const uint8_t *)preface, sizeof preface - 1) != 0 ||
        send_frame(c, F_SETTINGS, 0, 0, NULL, 0) != 0) {
      goto fail;
    }
  }
  if (kind == H2_SLOW) {
    uint8_t block[512];
    size_t n = 0;
    n += literal(block + n, ":method", "POST");
    n += literal(block + n, ":scheme", "http");
    n += literal(block + n, ":path", path);
    n += literal(block + n, ":authority", host);
    n += literal(block + n, "content-type", "application/grpc");
    n += literal(block + n, "te", "trailers");
    if (send_frame(c, F_HEADERS, FLAG_END_HEADERS, STREAM, block, n) != 0) goto fail;
  }
  /* Reads from now on must not wait: the loop polls. */
  int flags = fcntl(c->fd, F_GETFL);
  if (flags < 0 || fcntl(c->fd, F_SETFL, flags | O_NONBLOCK) != 0) goto fail;
  return 0;
fail:;
  int saved = errno;
  close(c->fd);
  c->fd = -1;
  errno = saved;
  return -1;
}

/* One whole frame in c->in: acknowledge or note it. */
static int handle_frame(h2_conn *c, int type, int flags, const uint8_t *payload, size_t len) {
  if (type == F_SETTINGS && !(flags & FLAG_ACK)) {
    return send_frame(c, F_SETTINGS, FLAG_ACK, 0, NULL, 0);
  }
  if (type == F_PING && !(flags & FLAG_ACK) && len == 8) {
    return send_frame(c, F_PING, FLAG_ACK, 0, payload, 8);
  }
  if (type == F_GOAWAY) c->goaway = 1;
  if (type == F_RST_STREAM) c->reset = 1;
  if (type == F_HEADERS) c->answered = 1;
  return 0;
}

static void mark_closed(h2_conn *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  c->closed = now_s();
}

int h2_pump(h2_conn *c) {
  if (c->fd < 0) return 0;
  for (;;) {
    uint8_t buf[8192];
    ssize_t r = recv(c->fd, buf, sizeof buf, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 1;
    if (r <= 0) {
      mark_closed(c);
      return 0;
    }
    if (c->kind == H2_TCP) continue; /* it never spoke HTTP/2: nothing to answer */
    for (size_t at = 0; at < (size_t)r;) {
      if (c->skip > 0) { /* the rest of a frame too large to keep (DATA we ignore) */
        size_t n = (size_t)r - at < c->skip ? (size_t)r - at : c->skip;
        c->skip -= n;
        at += n;
        continue;
      }
      c->in[c->in_len++] = buf[at++];
      if (c->in_len < 9) continue;
      size_t len = (size_t)c->in[0] << 16 | (size_t)c->in[1] << 8 | c->in[2];
      if (len > sizeof c->in - 9) { /* only DATA and large HEADERS get this big */
        if (handle_frame(c, c->in[3], c->in[4], NULL, 0) != 0) {
          mark_closed(c);
          return 0;
        }
        c->skip = len;
        c->in_len = 0;
        continue;
      }
      if (c->in_len < 9 + len) continue;
      if (handle_frame(c, c->in[3], c->in[4], c->in + 9, len) != 0) {
        mark_closed(c);
        return 0;
      }
      c->in_len = 0;
    }
  }
}

long h2_send_body(h2_conn *c, size_t n) {
  if (c->fd < 0) return -1;
  size_t total = c->body_len + 5;
  if (c->body_sent >= total) return 0;
  if (n > total - c->body_sent) n = total - c->body_sent;
  if (n > 512) n = 512;
  uint8_t chunk[512];
  for (size_t i = 0; i < n; i++) {
    size_t at = c->body_sent + i;
    /* The prefix: not compressed, the length big-endian; then 0xA5 bytes. */
    chunk[i] = at == 0 ? 0 : at < 5 ? (uint8_t)(c->body_len >> (8 * (4 - at))) : 0xA5;
  }
  if (send_frame(c, F_DATA, 0, STREAM, chunk, n) != 0) {
    mark_closed(c);
    return -1;
  }
  c->body_sent += n;
  return (long)n;
}

void h2_close(h2_conn *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
}
