/* safetensors files: CRC-32C's check value, a write and read round trip with
 * metadata, the replaced generation kept as .prev, and refusals: a flipped
 * data byte (CRC), a truncated file, another layout, a damaged header. */
#define _POSIX_C_SOURCE 200809L
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

int main(void) {
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
  REQUIRE(mkdtemp(dir) != NULL);
  ps_error err;
  tensor_layout layout, other;
  tensor_layout_init(&layout);
  tensor_layout_init(&other);
  long w[2] = {3, 4}, b[1] = {3}, w2[2] = {4, 3};
  REQUIRE(tensor_layout_add(&layout, "fc1.weight", 2, w, &err) == PS_ERR_OK);
  REQUIRE(tensor_layout_add(&layout, "fc1.bias", 1, b, &err) == PS_ERR_OK);
  REQUIRE(tensor_layout_add(&other, "fc1.weight", 2, w2, &err) == PS_ERR_OK);
  REQUIRE(tensor_layout_add(&other, "fc1.bias", 1, b, &err) == PS_ERR_OK);
  float data[15], back[15];
  for (int i = 0; i < 15; i++) data[i] = (float)i * 0.5f - 2.0f;
  char path[256], prev[300];
  snprintf(path, sizeof path, "%s/m.safetensors", dir);
  snprintf(prev, sizeof prev, "%s.prev", path);
  const char *meta[] = {"step", "42", "model", "mlp:4,3", NULL};
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

  /* Another layout is refused by name. */
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

  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
  tensor_layout_free(&layout);
  tensor_layout_free(&other);
  return check_report("test_safetensors");
}
