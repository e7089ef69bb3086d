/* safetensors files: CRC-32C's check value, a write and read round trip with
 * metadata, the replaced generation kept as .prev, and refusals: a flipped
 * data byte (CRC), a truncated file, another layout, a damaged header.
 * Also files of tensors of several dtypes that only the file describes, and
 * tensors produced by callbacks in chunks (byte for byte the same file; bad
 * fills leave the previous file). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/safetensors.h"
#include "tests/check.h"

static char dir[] = "/tmp/pstrain-test-st-XXXXXX";

static void flip_byte(const char *path, long from_end) {
  FILE *f = fopen(path, "r+b");
  REQUIRE(f != NULL);
  REQUIRE(fseek(f, -from_end, SEEK_END) == 0);
  int c = fgetc(f);
  REQUIRE(fseek(f, -from_end, SEEK_END) == 0);
  REQUIRE(fputc(c ^ 0x40, f) != EOF);
  REQUIRE(fclose(f) == 0);
}

static const char *const meta[] = {"step", "42", "model", "mlp:4,3", NULL};

/* CRC-32C's check value, split or whole, through both implementations. */
static void case_crc32c(void) {
  CHECK_EQ_INT(crc32c_update(0, "123456789", 9), 0xe3069283u);
  CHECK_EQ_INT(crc32c_update(crc32c_update(0, "1234", 4), "56789", 5), 0xe3069283u);
  CHECK_EQ_INT(crc32c_update_portable(0, "123456789", 9), 0xe3069283u);
  /* The instruction path equals the table at every length and alignment,
   * continued from any split point. */
  static uint8_t noise[4096 + 16];
  uint32_t state = 12345;
  for (size_t i = 0; i < sizeof noise; i++) {
    state = state * 1103515245u + 12345u;
    noise[i] = (uint8_t)(state >> 16);
  }
  for (size_t offset = 0; offset < 9; offset++) {
    for (size_t len = 0; len <= 4096; len += len < 64 ? 1 : 61) {
      uint32_t want = crc32c_update_portable(0, noise + offset, len);
      CHECK_EQ_INT(crc32c_update(0, noise + offset, len), want);
      size_t cut = len / 3;
      CHECK_EQ_INT(crc32c_update(crc32c_update(0, noise + offset, cut), noise + offset + cut,
                                 len - cut),
                   want);
    }
  }
}

/* fc1 of mlp:4,3 (layout) and the same tensors transposed (other). */
static void layouts_fixture(tensor_layout *layout, tensor_layout *other) {
  ps_error err;
  tensor_layout_init(layout);
  tensor_layout_init(other);
  long w[2] = {3, 4}, b[1] = {3}, w2[2] = {4, 3};
  REQUIRE(tensor_layout_add(layout, "fc1.weight", 2, w, &err) == PS_ERR_OK);
  REQUIRE(tensor_layout_add(layout, "fc1.bias", 1, b, &err) == PS_ERR_OK);
  REQUIRE(tensor_layout_add(other, "fc1.weight", 2, w2, &err) == PS_ERR_OK);
  REQUIRE(tensor_layout_add(other, "fc1.bias", 1, b, &err) == PS_ERR_OK);
}

/* data[i] = i / 2 - 2; path is dir/m.safetensors (where no file is yet),
 * prev its .prev. */
static void generation_fixture(float data[15], char path[256], char prev[300]) {
  for (int i = 0; i < 15; i++) data[i] = (float)i * 0.5f - 2.0f;
  snprintf(path, 256, "%s/m.safetensors", dir);
  snprintf(prev, 300, "%s.prev", path);
  unlink(path);
  unlink(prev);
}

/* Writes data, then data with data[0] = 99: path holds the second, prev the first. */
static void write_two_generations(const tensor_layout *layout, float data[15], const char *path) {
  ps_error err;
  REQUIRE(safetensors_write(path, layout, data, meta, 1, &err) == PS_ERR_OK);
  data[0] = 99.0f;
  REQUIRE(safetensors_write(path, layout, data, meta, 1, &err) == PS_ERR_OK);
}

/* A write and read round trip with metadata; a second write keeps the first as .prev. */
static void case_round_trip_keeps_prev(void) {
  ps_error err;
  tensor_layout layout, other;
  layouts_fixture(&layout, &other);
  float data[15], back[15];
  char path[256], prev[300];
  generation_fixture(data, path, prev);
  REQUIRE(safetensors_write(path, &layout, data, meta, 1, &err) == PS_ERR_OK);
  CHECK(access(prev, F_OK) != 0); /* nothing to keep the first time */
  safetensors_meta got;
  REQUIRE(safetensors_read(path, &layout, back, &got, &err) == PS_ERR_OK);
  CHECK(memcmp(back, data, sizeof data) == 0);
  CHECK_EQ_STR(safetensors_meta_get(&got, "step"), "42");
  CHECK(safetensors_meta_get(&got, "crc32c") != NULL);
  /* Metadata alone. */
  REQUIRE(safetensors_read(path, NULL, NULL, &got, &err) == PS_ERR_OK);
  CHECK_EQ_STR(safetensors_meta_get(&got, "model"), "mlp:4,3");
  /* A second write keeps the first as .prev. */
  data[0] = 99.0f;
  REQUIRE(safetensors_write(path, &layout, data, meta, 1, &err) == PS_ERR_OK);
  REQUIRE(safetensors_read(prev, &layout, back, &got, &err) == PS_ERR_OK);
  CHECK_NEAR(back[0], -2.0, 0);
  REQUIRE(safetensors_read(path, &layout, back, &got, &err) == PS_ERR_OK);
  CHECK_NEAR(back[0], 99.0, 0);
  tensor_layout_free(&layout);
  tensor_layout_free(&other);
}

/* Another layout is refused by name; a flipped data byte, a truncated file,
 * a damaged header and a missing file are refused. */
static void case_other_layout_and_damaged_files_refused(void) {
  ps_error err;
  tensor_layout layout, other;
  layouts_fixture(&layout, &other);
  float data[15], back[15];
  char path[256], prev[300];
  generation_fixture(data, path, prev);
  write_two_generations(&layout, data, path);
  safetensors_meta got;
  CHECK_EQ_INT(safetensors_read(path, &other, back, &got, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "tensor fc1.weight has another dtype, shape or place");
  /* A flipped data byte. */
  flip_byte(prev, 3);
  CHECK_EQ_INT(safetensors_read(prev, &layout, back, &got, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "CRC-32C");
  CHECK_CONTAINS(err.msg, prev);
  /* A truncated file. */
  REQUIRE(truncate(path, 100) == 0);
  CHECK_EQ_INT(safetensors_read(path, &layout, back, &got, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "truncated or another model");
  /* A damaged header: write again, then break its first brace. */
  REQUIRE(safetensors_write(path, &layout, data, meta, 0, &err) == PS_ERR_OK);
  FILE *f = fopen(path, "r+b");
  REQUIRE(f != NULL && fseek(f, 8, SEEK_SET) == 0 && fputc('[', f) != EOF && fclose(f) == 0);
  CHECK_EQ_INT(safetensors_read(path, &layout, back, &got, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "not a JSON object");
  /* Missing. */
  CHECK_EQ_INT(safetensors_read("/nonexistent/x.safetensors", &layout, back, &got, &err), PS_ERR_IO);
  tensor_layout_free(&layout);
  tensor_layout_free(&other);
}

/* Tensors of several dtypes whose shapes only the file knows (sparse tables). */
static uint64_t keys[3] = {7, UINT64_MAX, 1ULL << 40};
static int64_t meta_rows[6] = {-1, 2, 3, -4, 5, INT64_MIN};
static float rows[6] = {1, 2, 3, 4, 5, 6};

static void case_tensors_of_several_dtypes(void) {
  ps_error err;
  safetensors_tensor parts[3] = {
      {.name = "t.keys", .dtype = SAFETENSORS_U64, .rank = 1, .shape = {3}, .data = keys},
      {.name = "t.rows", .dtype = SAFETENSORS_F32, .rank = 2, .shape = {3, 2}, .data = rows},
      {.name = "t.meta", .dtype = SAFETENSORS_I64, .rank = 2, .shape = {3, 2}, .data = meta_rows}};
  char mixed[300];
  snprintf(mixed, sizeof mixed, "%s/mixed.safetensors", dir);
  REQUIRE(safetensors_write_tensors(mixed, parts, 3, meta, 0, &err) == PS_ERR_OK);
  safetensors_file file;
  REQUIRE(safetensors_file_read(mixed, &file, &err) == PS_ERR_OK);
  CHECK_EQ_INT(file.count, 3);
  const safetensors_tensor *k = safetensors_file_find(&file, "t.keys");
  const safetensors_tensor *m = safetensors_file_find(&file, "t.meta");
  const safetensors_tensor *r = safetensors_file_find(&file, "t.rows");
  REQUIRE(k != NULL && m != NULL && r != NULL && safetensors_file_find(&file, "t.x") == NULL);
  CHECK(k->dtype == SAFETENSORS_U64 && k->bytes == sizeof keys && memcmp(k->data, keys, sizeof keys) == 0);
  CHECK(m->dtype == SAFETENSORS_I64 && m->shape[1] == 2 &&
        memcmp(m->data, meta_rows, sizeof meta_rows) == 0);
  CHECK(r->rank == 2 && r->shape[0] == 3 && memcmp(r->data, rows, sizeof rows) == 0);
  CHECK_EQ_STR(safetensors_meta_get(&file.meta, "step"), "42");
  safetensors_file_free(&file);
  flip_byte(mixed, 3);
  CHECK_EQ_INT(safetensors_file_read(mixed, &file, &err), PS_ERR_CORRUPT_DATA);
  CHECK_CONTAINS(err.msg, "CRC-32C");
}

/* An I64 tensor after 3 floats sits at 12 in the file; in memory it is
 * 8-byte aligned (its users load int64_t; found by fuzz_ctr). */
static void case_i64_after_floats_aligned_in_memory(void) {
  ps_error err;
  char mixed[300];
  snprintf(mixed, sizeof mixed, "%s/mixed.safetensors", dir);
  safetensors_file file;
  safetensors_tensor packed[2] = {
      {.name = "p.odd", .dtype = SAFETENSORS_F32, .rank = 1, .shape = {3}, .data = rows},
      {.name = "p.meta", .dtype = SAFETENSORS_I64, .rank = 2, .shape = {3, 2}, .data = meta_rows}};
  REQUIRE(safetensors_write_tensors(mixed, packed, 2, meta, 0, &err) == PS_ERR_OK);
  REQUIRE(safetensors_file_read(mixed, &file, &err) == PS_ERR_OK);
  const safetensors_tensor *m = safetensors_file_find(&file, "p.meta");
  REQUIRE(m != NULL && m->offset == 3 * sizeof(float));
  CHECK((uintptr_t)m->data % 8 == 0 && memcmp(m->data, meta_rows, sizeof meta_rows) == 0);
  CHECK(memcmp(safetensors_file_find(&file, "p.odd")->data, rows, 3 * sizeof(float)) == 0);
  safetensors_file_free(&file);
}

/* The strict reader refuses a file with other dtypes than F32. */
static void case_strict_reader_refuses_other_dtypes(void) {
  ps_error err;
  safetensors_tensor parts[1] = {
      {.name = "t.keys", .dtype = SAFETENSORS_U64, .rank = 1, .shape = {3}, .data = keys}};
  char mixed[300];
  snprintf(mixed, sizeof mixed, "%s/mixed.safetensors", dir);
  safetensors_meta got;
  REQUIRE(safetensors_write_tensors(mixed, parts, 1, meta, 0, &err) == PS_ERR_OK);
  tensor_layout one;
  tensor_layout_init(&one);
  long three[1] = {3};
  REQUIRE(tensor_layout_add(&one, "t.keys", 1, three, &err) == PS_ERR_OK);
  float six[6];
  CHECK_EQ_INT(safetensors_read(mixed, &one, six, &got, &err), PS_ERR_CORRUPT_DATA);
  tensor_layout_free(&one);
}

/* --- tensors produced by a callback in chunks -------------------------------------- */

/* What a fill produces: len bytes from bytes (the first calls give at most
 * chunks[0], chunks[1], ... of them, then as much as fits), or -1 on the
 * call after fail_after calls (when > 0). */
typedef struct chunk_source {
  const void *bytes;
  size_t len, at;
  size_t chunks[4]; /* 0 ends the list */
  int fail_after, calls;
} chunk_source;

static long produce(void *ctx, void *buf, size_t max, ps_error *err) {
  chunk_source *s = ctx;
  s->calls++;
  if (s->fail_after > 0 && s->calls > s->fail_after) {
    ps_error_set(err, PS_ERR_IO, "reading rows back from the disk tier: injected failure");
    return -1;
  }
  size_t n = s->len - s->at;
  if (s->calls <= 4 && s->chunks[s->calls - 1] > 0 && s->chunks[s->calls - 1] < n) {
    n = s->chunks[s->calls - 1];
  }
  if (n > max) n = max;
  memcpy(buf, (const char *)s->bytes + s->at, n);
  s->at += n;
  return (long)n;
}

/* path's bytes (malloc'd), *len of them. */
static char *read_whole(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  REQUIRE(f != NULL);
  REQUIRE(fseek(f, 0, SEEK_END) == 0);
  long size = ftell(f);
  REQUIRE(size >= 0 && fseek(f, 0, SEEK_SET) == 0);
  char *bytes = malloc((size_t)size + 1);
  REQUIRE(bytes != NULL && fread(bytes, 1, (size_t)size, f) == (size_t)size);
  REQUIRE(fclose(f) == 0);
  *len = (size_t)size;
  return bytes;
}

/* Whether dir holds a name with ".tmp." in it (a writer's leftover). */
static int stray_temp_file(void) {
  DIR *d = opendir(dir);
  REQUIRE(d != NULL);
  int found = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) found |= strstr(e->d_name, ".tmp.") != NULL;
  closedir(d);
  return found;
}

/* Whether the files at a and b have the same bytes. */
static int same_bytes(const char *a, const char *b) {
  size_t a_len, b_len;
  char *a_bytes = read_whole(a, &a_len), *b_bytes = read_whole(b, &b_len);
  int same = a_len == b_len && memcmp(a_bytes, b_bytes, a_len) == 0;
  free(a_bytes);
  free(b_bytes);
  return same;
}

/* A table larger than a fill's 1 MiB buffer, to cross chunks. */
enum { BIG_FLOATS = 300000 };

/* Fills of odd chunk sizes (7 bytes, 1, the rest), one larger than the
 * writer's buffer, mixed with tensors from memory: the file is byte for
 * byte the one written from memory, and reads back with its CRC-32C. */
static void case_filled_tensors_match_memory(void) {
  ps_error err;
  float *big = malloc(BIG_FLOATS * sizeof *big);
  REQUIRE(big != NULL);
  for (int i = 0; i < BIG_FLOATS; i++) big[i] = (float)i * 0.25f - 7.0f;
  safetensors_tensor parts[4] = {
      {.name = "t.keys", .dtype = SAFETENSORS_U64, .rank = 1, .shape = {3}, .data = keys},
      {.name = "t.rows", .dtype = SAFETENSORS_F32, .rank = 2, .shape = {3, 2}, .data = rows},
      {.name = "t.big", .dtype = SAFETENSORS_F32, .rank = 2, .shape = {BIG_FLOATS / 4, 4},
       .data = big},
      {.name = "t.meta", .dtype = SAFETENSORS_I64, .rank = 2, .shape = {3, 2}, .data = meta_rows}};
  char from_memory[300], from_fills[300];
  snprintf(from_memory, sizeof from_memory, "%s/memory.safetensors", dir);
  snprintf(from_fills, sizeof from_fills, "%s/fills.safetensors", dir);
  REQUIRE(safetensors_write_tensors(from_memory, parts, 4, meta, 0, &err) == PS_ERR_OK);
  chunk_source rows_src = {.bytes = rows, .len = sizeof rows, .chunks = {7, 1}};
  chunk_source big_src = {.bytes = big, .len = BIG_FLOATS * sizeof *big, .chunks = {3}};
  chunk_source meta_src = {.bytes = meta_rows, .len = sizeof meta_rows, .chunks = {5, 5, 5}};
  parts[1].data = NULL;
  parts[1].fill = produce;
  parts[1].fill_ctx = &rows_src;
  parts[2].data = NULL;
  parts[2].fill = produce;
  parts[2].fill_ctx = &big_src;
  parts[3].data = NULL;
  parts[3].fill = produce;
  parts[3].fill_ctx = &meta_src;
  REQUIRE(safetensors_write_tensors(from_fills, parts, 4, meta, 0, &err) == PS_ERR_OK);
  CHECK_EQ_INT(rows_src.calls, 4); /* 7, 1, 16, then the end */
  CHECK(big_src.calls >= 4);       /* 3 bytes, then chunks of at most 1 MiB, then the end */
  CHECK(same_bytes(from_memory, from_fills));
  safetensors_file file;
  REQUIRE(safetensors_file_read(from_fills, &file, &err) == PS_ERR_OK);
  const safetensors_tensor *r = safetensors_file_find(&file, "t.rows");
  const safetensors_tensor *b = safetensors_file_find(&file, "t.big");
  REQUIRE(r != NULL && b != NULL);
  CHECK(memcmp(r->data, rows, sizeof rows) == 0);
  CHECK(b->bytes == BIG_FLOATS * sizeof *big && memcmp(b->data, big, b->bytes) == 0);
  uint32_t crc = crc32c_update(0, keys, sizeof keys);
  crc = crc32c_update(crc, rows, sizeof rows);
  crc = crc32c_update(crc, big, BIG_FLOATS * sizeof *big);
  crc = crc32c_update(crc, meta_rows, sizeof meta_rows);
  char want[9];
  snprintf(want, sizeof want, "%08x", crc);
  CHECK_EQ_STR(safetensors_meta_get(&file.meta, "crc32c"), want);
  safetensors_file_free(&file);
  free(big);
}

/* A fill that ends short, one that goes past its tensor's bytes (within a
 * chunk, and exactly after them) and one that fails: each write fails
 * naming the tensor and the file, the previous file stays, no temp file. */
static void case_bad_fills_keep_previous_file(void) {
  ps_error err;
  char path[300], prev[310];
  snprintf(path, sizeof path, "%s/keep.safetensors", dir);
  snprintf(prev, sizeof prev, "%s.prev", path);
  safetensors_tensor parts[2] = {
      {.name = "t.keys", .dtype = SAFETENSORS_U64, .rank = 1, .shape = {3}, .data = keys},
      {.name = "t.rows", .dtype = SAFETENSORS_F32, .rank = 2, .shape = {3, 2}, .data = rows}};
  REQUIRE(safetensors_write_tensors(path, parts, 2, meta, 1, &err) == PS_ERR_OK);
  size_t good_len;
  char *good = read_whole(path, &good_len);
  float more[8] = {1, 2, 3, 4, 5, 6, 7, 8}; /* rows and then two more floats */
  struct {
    chunk_source src;
    ps_err code;
    const char *says;
  } bad[] = {
      {{.bytes = rows, .len = sizeof rows - 4, .chunks = {7}}, PS_ERR_INVALID_ARGUMENT,
       "tensor t.rows ended after 20 of its 24 bytes"},
      {{.bytes = more, .len = sizeof more, .chunks = {7}}, PS_ERR_INVALID_ARGUMENT,
       "tensor t.rows produced more than its 24 bytes"},
      {{.bytes = more, .len = sizeof more, .chunks = {24}}, PS_ERR_INVALID_ARGUMENT,
       "tensor t.rows produced more than its 24 bytes"},
      {{.bytes = rows, .len = sizeof rows, .chunks = {7, 1}, .fail_after = 2}, PS_ERR_IO,
       "producing tensor t.rows: reading rows back from the disk tier: injected failure"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    parts[1].data = NULL;
    parts[1].fill = produce;
    parts[1].fill_ctx = &bad[i].src;
    ps_error_clear(&err);
    CHECK_EQ_INT(safetensors_write_tensors(path, parts, 2, meta, 1, &err), bad[i].code);
    CHECK_EQ_INT(err.code, bad[i].code);
    CHECK_CONTAINS(err.msg, bad[i].says);
    CHECK_CONTAINS(err.msg, path);
    size_t now_len;
    char *now = read_whole(path, &now_len);
    CHECK(now_len == good_len && memcmp(now, good, good_len) == 0);
    free(now);
    CHECK(access(prev, F_OK) != 0); /* nothing was replaced, so nothing kept */
    CHECK(!stray_temp_file());
  }
  free(good);
}

/* A tensor of 0 bytes from a fill: asked once, it ends at once; the file is
 * the one written from memory. A 0-byte fill that produces is refused. */
static void case_empty_filled_tensor(void) {
  ps_error err;
  char from_memory[300], from_fills[300];
  snprintf(from_memory, sizeof from_memory, "%s/empty-memory.safetensors", dir);
  snprintf(from_fills, sizeof from_fills, "%s/empty-fills.safetensors", dir);
  safetensors_tensor parts[3] = {
      {.name = "t.keys", .dtype = SAFETENSORS_U64, .rank = 1, .shape = {0}, .data = keys},
      {.name = "t.rows", .dtype = SAFETENSORS_F32, .rank = 2, .shape = {0, 2}, .data = rows},
      {.name = "t.meta", .dtype = SAFETENSORS_I64, .rank = 2, .shape = {3, 2}, .data = meta_rows}};
  REQUIRE(safetensors_write_tensors(from_memory, parts, 3, meta, 0, &err) == PS_ERR_OK);
  chunk_source none = {.bytes = rows, .len = 0};
  parts[1].data = NULL;
  parts[1].fill = produce;
  parts[1].fill_ctx = &none;
  REQUIRE(safetensors_write_tensors(from_fills, parts, 3, meta, 0, &err) == PS_ERR_OK);
  CHECK_EQ_INT(none.calls, 1);
  CHECK(same_bytes(from_memory, from_fills));
  safetensors_file file;
  REQUIRE(safetensors_file_read(from_fills, &file, &err) == PS_ERR_OK);
  const safetensors_tensor *r = safetensors_file_find(&file, "t.rows");
  CHECK(r != NULL && r->bytes == 0 && r->shape[0] == 0);
  safetensors_file_free(&file);
  chunk_source some = {.bytes = rows, .len = 4};
  parts[1].fill_ctx = &some;
  CHECK_EQ_INT(safetensors_write_tensors(from_fills, parts, 3, meta, 0, &err),
               PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "tensor t.rows produced more than its 0 bytes");
  CHECK(same_bytes(from_memory, from_fills));
  CHECK(!stray_temp_file());
  /* Neither data nor a fill, for bytes to write, is refused up front. */
  parts[2].data = NULL;
  CHECK_EQ_INT(safetensors_write_tensors(from_fills, parts, 3, meta, 0, &err),
               PS_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err.msg, "tensor t.meta has neither data nor a fill");
}

int main(void) {
  REQUIRE(mkdtemp(dir) != NULL);
  RUN_CASE(case_crc32c);
  RUN_CASE(case_round_trip_keeps_prev);
  RUN_CASE(case_other_layout_and_damaged_files_refused);
  RUN_CASE(case_tensors_of_several_dtypes);
  RUN_CASE(case_i64_after_floats_aligned_in_memory);
  RUN_CASE(case_strict_reader_refuses_other_dtypes);
  RUN_CASE(case_filled_tensors_match_memory);
  RUN_CASE(case_bad_fills_keep_previous_file);
  RUN_CASE(case_empty_filled_tensor);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
  return check_report("test_safetensors");
}
