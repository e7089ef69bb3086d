/* common/tb_events: the TFRecord framing against known CRC-32C values, an
 * events file read back record by record (lengths, both CRCs, the Events
 * protobuf-c unpacks), and the errors: a folder that cannot be made, a
 * write that fails (the file swapped for /dev/full) and stays failed. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/tb_events.h"
#include "tb_event.pb-c.h"
#include "tests/check.h"

static uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void test_crc(void) {
  /* The CRC-32C check value, and its mask worked out by hand:
   * ror(0xe3069283, 15) = 0x25071c0d, + 0xa282ead8 = 0xc78ab0e5 (mod 2^32). */
  CHECK_EQ_INT(crc32c_update(0, "123456789", 9), 0xe3069283u);
  CHECK_EQ_INT(tb_masked_crc32c("123456789", 9), 0xc78ab0e5u);
  CHECK_EQ_INT(tb_masked_crc32c("", 0), 0xa282ead8u); /* crc 0: the mask's constant alone */
  unsigned char zeros[8] = {0};
  CHECK_EQ_INT(tb_masked_crc32c(zeros, 8), 0x07980329u);
}

static void test_frame(void) {
  unsigned char out[9 + TB_RECORD_OVERHEAD];
  tb_record_frame(out, "123456789", 9);
  for (int i = 0; i < 8; i++) CHECK_EQ_INT(out[i], i == 0 ? 9 : 0); /* uint64 LE length */
  CHECK_EQ_INT(le32(out + 8), tb_masked_crc32c(out, 8));
  CHECK(memcmp(out + 12, "123456789", 9) == 0);
  CHECK_EQ_INT(le32(out + 21), 0xc78ab0e5u);
  /* Data already in place is framed where it lies. */
  unsigned char in_place[9 + TB_RECORD_OVERHEAD];
  memcpy(in_place + 12, "123456789", 9);
  tb_record_frame(in_place, in_place + 12, 9);
  CHECK(memcmp(in_place, out, sizeof out) == 0);
}

/* The one events file in dir/run, read whole; NULL when not exactly one. */
static unsigned char *read_events(const char *dir, const char *run, size_t *len, char *name,
                                  size_t name_len) {
  char run_dir[1024];
  snprintf(run_dir, sizeof run_dir, "%s/%s", dir, run);
  DIR *d = opendir(run_dir);
  if (d == NULL) return NULL;
  int files = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0) {
      snprintf(name, name_len, "%s/%s", run_dir, e->d_name);
      files++;
    }
  }
  closedir(d);
  if (files != 1) return NULL;
  FILE *f = fopen(name, "rb");
  if (f == NULL) return NULL;
  unsigned char *buf = malloc(1 << 16);
  *len = buf == NULL ? 0 : fread(buf, 1, 1 << 16, f);
  fclose(f);
  return buf;
}

/* The next record at *at of buf[0, len), its CRCs checked, unpacked. */
static Tensorboard__Event *next_event(const unsigned char *buf, size_t len, size_t *at) {
  REQUIRE(*at + 12 <= len);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | buf[*at + i];
  CHECK_EQ_INT(le32(buf + *at + 8), tb_masked_crc32c(buf + *at, 8));
  REQUIRE(*at + 12 + n + 4 <= len);
  CHECK_EQ_INT(le32(buf + *at + 12 + n), tb_masked_crc32c(buf + *at + 12, (size_t)n));
  Tensorboard__Event *ev = tensorboard__event__unpack(NULL, (size_t)n, buf + *at + 12);
  REQUIRE(ev != NULL);
  *at += 12 + n + 4;
  return ev;
}

static void test_write_read(const char *dir) {
  ps_error err;
  tb_writer *w = NULL;
  CHECK_EQ_INT(tb_writer_open(&w, dir, "trainer-0", &err), PS_ERR_OK);
  REQUIRE(w != NULL);
  CHECK_CONTAINS(tb_writer_path(w), "/trainer-0/events.out.tfevents.");
  tb_scalar first[] = {{"train/loss", 0.5}, {"perf/comm_share", 0.0}};
  tb_scalar second[] = {{"train/loss", 0.25}, {"eval/accuracy", 0.8125}, {"x", 1e10}};
  CHECK_EQ_INT(tb_writer_write(w, 10, first, 2, &err), PS_ERR_OK);
  CHECK_EQ_INT(tb_writer_write(w, 20, second, 3, &err), PS_ERR_OK);
  tb_writer_close(w);

  size_t len = 0, at = 0;
  char name[2048];
  unsigned char *buf = read_events(dir, "trainer-0", &len, name, sizeof name);
  REQUIRE(buf != NULL);
  Tensorboard__Event *ev = next_event(buf, len, &at);
  CHECK_EQ_INT(ev->what_case, TENSORBOARD__EVENT__WHAT_FILE_VERSION);
  CHECK_EQ_STR(ev->file_version, "brain.Event:2");
  CHECK(ev->wall_time > 1.6e9);
  tensorboard__event__free_unpacked(ev, NULL);
  const tb_scalar *want[] = {first, second};
  const int counts[] = {2, 3};
  for (int e = 0; e < 2; e++) {
    ev = next_event(buf, len, &at);
    CHECK_EQ_INT(ev->step, (e + 1) * 10);
    REQUIRE(ev->what_case == TENSORBOARD__EVENT__WHAT_SUMMARY);
    REQUIRE(ev->summary->n_value == (size_t)counts[e]);
    for (int i = 0; i < counts[e]; i++) {
      const Tensorboard__Summary__Value *v = ev->summary->value[i];
      CHECK_EQ_STR(v->tag, want[e][i].tag);
      /* Zero too: simple_value is in a oneof, so it is on the wire. */
      CHECK_EQ_INT(v->value_case, TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
      CHECK(v->simple_value == (float)want[e][i].value);
    }
    tensorboard__event__free_unpacked(ev, NULL);
  }
  CHECK_EQ_INT(at, len); /* nothing after the last record */
  free(buf);
  unlink(name);
}

/* The descriptor open on path (same device and inode), or -1. */
static int fd_of(const char *path) {
  struct stat want, st;
  if (stat(path, &want) != 0) return -1;
  for (int fd = 3; fd < 1024; fd++) {
    if (fstat(fd, &st) == 0 && st.st_dev == want.st_dev && st.st_ino == want.st_ino) return fd;
  }
  return -1;
}

static void test_errors(const char *dir) {
  ps_error err;
  tb_writer *w = (tb_writer *)&err; /* any non-NULL value: open must reset it */
  CHECK_EQ_INT(tb_writer_open(&w, "", "trainer-0", &err), PS_ERR_OK);
  CHECK(w == NULL);
  tb_scalar one = {"a", 1.0};
  CHECK_EQ_INT(tb_writer_write(NULL, 1, &one, 1, &err), PS_ERR_OK);
  CHECK_EQ_STR(tb_writer_path(NULL), "");
  tb_writer_close(NULL);

  char missing[1024];
  snprintf(missing, sizeof missing, "%s/no/such", dir);
  CHECK_EQ_INT(tb_writer_open(&w, missing, "pserver-0", &err), PS_ERR_IO);
  CHECK(w == NULL);
  CHECK_CONTAINS(err.msg, "--tensorboard");
  CHECK_CONTAINS(err.msg, missing);

  /* A write that fails (disk full) says so, and so does every later one. */
  CHECK_EQ_INT(tb_writer_open(&w, dir, "pserver-1", &err), PS_ERR_OK);
  REQUIRE(w != NULL);
  int fd = fd_of(tb_writer_path(w)), full = open("/dev/full", O_WRONLY);
  REQUIRE(fd >= 0 && full >= 0);
  REQUIRE(dup2(full, fd) == fd);
  close(full);
  CHECK_EQ_INT(tb_writer_write(w, 1, &one, 1, &err), PS_ERR_IO);
  CHECK_CONTAINS(err.msg, "No space left");
  CHECK_CONTAINS(err.msg, "pserver-1");
  ps_error again;
  CHECK_EQ_INT(tb_writer_write(w, 2, &one, 1, &again), PS_ERR_IO);
  CHECK_EQ_STR(again.msg, err.msg);
  char path[2048];
  snprintf(path, sizeof path, "%s", tb_writer_path(w));
  tb_writer_close(w);
  unlink(path);
}

int main(void) {
  char dir[] = "/tmp/pstrain-tb-XXXXXX";
  REQUIRE(mkdtemp(dir) != NULL);
  test_crc();
  test_frame();
  test_write_read(dir);
  test_errors(dir);
  char sub[1024];
  snprintf(sub, sizeof sub, "%s/trainer-0", dir);
  rmdir(sub);
  snprintf(sub, sizeof sub, "%s/pserver-1", dir);
  rmdir(sub);
  CHECK_EQ_INT(rmdir(dir), 0);
  return check_report("test_tb_events");
}
