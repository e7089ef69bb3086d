/* Hand-made HTTP/2 client connections for the hostile tests: what a gRPC
 * library would never send. A connection is a bare TCP connection that
 * says nothing, an HTTP/2 connection that opens no call (idle), or one
 * that opens a gRPC call and sends its body a few bytes at a time (slow).
 * Frames from the server are read and answered as a peer must (SETTINGS
 * and PING acknowledged) but never decoded beyond their type: GOAWAY,
 * RST_STREAM and the reply's HEADERS are noted, EOF closes. One thread. */
#ifndef PSTRAIN_TESTS_H2_RAW_H
#define PSTRAIN_TESTS_H2_RAW_H

#include <stddef.h>
#include <stdint.h>

typedef enum { H2_TCP, H2_IDLE, H2_SLOW } h2_kind;

typedef struct h2_conn {
  int fd;           /* -1 once closed */
  h2_kind kind;
  double opened;    /* now_s() at connect */
  double closed;    /* when the server closed it (0: open) */
  int goaway;       /* the server sent GOAWAY */
  int reset;        /* the server reset the call (RST_STREAM) */
  int answered;     /* the server sent the call's reply headers */
  size_t body_len;  /* H2_SLOW: the message length announced */
  size_t body_sent; /* its bytes sent so far */
  uint8_t in[4096]; /* a frame in the making */
  size_t in_len;
  size_t skip;      /* bytes of a large frame still to discard */
} h2_conn;

/* Connects to host:port (numeric IPv4) and sends what kind says: nothing,
 * the preface and SETTINGS, or those and a call's HEADERS for path (which
 * announce a message of body_len bytes, at most 65530: one window).
 * Returns 0, or -1 with errno (c->fd is then -1). */
int h2_open(h2_conn *c, const char *host, int port, h2_kind kind, const char *path,
            size_t body_len);

/* Reads what the server sent and answers it. Returns 1 while open, 0 once
 * the server closed the connection (c->closed set, the fd closed). */
int h2_pump(h2_conn *c);

/* H2_SLOW: sends the body's next n bytes (the 5-byte message prefix first)
 * as one DATA frame. Returns the bytes sent, 0 when the body is complete,
 * -1 when the connection failed. */
long h2_send_body(h2_conn *c, size_t n);

/* Closes it from this side (nothing when already closed). */
void h2_close(h2_conn *c);

#endif
