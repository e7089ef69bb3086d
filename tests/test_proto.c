/* The wire contract compiles and round-trips: a push with a block of raw
 * float32 bytes packs and unpacks to the same values. */
#include <stdlib.h>
#include <string.h>

#include "pstrain.pb-c.h"
#include "tests/check.h"

int main(void) {
  float values[5] = {1.5f, -2.0f, 0.0f, 3.25f, 1e-7f};
  Pstrain__Block block = PSTRAIN__BLOCK__INIT;
  block.id = 3;
  block.offset = 200704;
  block.count = 5;
  block.data.data = (uint8_t *)values;
  block.data.len = sizeof values;
  Pstrain__Block *blocks[1] = {&block};
  Pstrain__RequestKey key = PSTRAIN__REQUEST_KEY__INIT;
  key.trainer_id = 1;
  key.incarnation = 0xfeedULL;
  key.step = 42;
  Pstrain__PushRequest req = PSTRAIN__PUSH_REQUEST__INIT;
  req.key = &key;
  req.config_hash = 0x1234567890abcdefULL;
  req.n_gradients = 1;
  req.gradients = blocks;

  size_t len = pstrain__push_request__get_packed_size(&req);
  uint8_t *buf = malloc(len);
  REQUIRE(buf != NULL);
  CHECK_EQ_INT(pstrain__push_request__pack(&req, buf), len);
  Pstrain__PushRequest *back = pstrain__push_request__unpack(NULL, len, buf);
  REQUIRE(back != NULL);
  REQUIRE(back->key != NULL && back->n_gradients == 1);
  CHECK_EQ_INT(back->key->step, 42);
  CHECK(back->config_hash == 0x1234567890abcdefULL);
  CHECK_EQ_INT(back->gradients[0]->offset, 200704);
  REQUIRE(back->gradients[0]->data.len == sizeof values);
  CHECK(memcmp(back->gradients[0]->data.data, values, sizeof values) == 0);
  pstrain__push_request__free_unpacked(back, NULL);

  /* Truncated bytes are refused, not read past. */
  CHECK(pstrain__push_request__unpack(NULL, len - 3, buf) == NULL);
  free(buf);
  return check_report("test_proto");
}
