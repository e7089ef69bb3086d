/* Networks as text (common/net.h): the built-ins' shapes and parameter
 * counts, the canonical text round trip, the documented model files equal
 * to the built-in names, and malformed files refused naming the line. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/job.h"
#include "common/model.h"
#include "tests/check.h"

static char scratch[64];

static size_t params_of(const model_desc *d) {
  tensor_layout layout;
  ps_error err;
  tensor_layout_init(&layout);
  REQUIRE(model_build_layout(d, &layout, &err) == PS_ERR_OK);
  size_t total = layout.total;
  tensor_layout_free(&layout);
  return total;
}

static void builtin(const char *name, int c, int h, int w, model_desc *d) {
  ps_error err;
  REQUIRE(model_parse(name, d, &err) == PS_ERR_OK);
  CHECK_EQ_INT(d->kind, MODEL_NET);
  if (model_set_input(d, c, h, w, &err) != PS_ERR_OK) {
    fprintf(stderr, "%s: %s\n", name, err.msg);
    exit(1);
  }
}

static void test_builtins(void) {
  model_desc d;
  builtin("lenet", 1, 28, 28, &d);
  /* conv 1->20 5x5, conv 20->20 5x5, fc 980->10, each with a bias */
  CHECK_EQ_INT(params_of(&d), 20 * 25 + 20 + 20 * 20 * 25 + 20 + 980 * 10 + 10);
  CHECK_EQ_INT(model_classes(&d), 10);
  CHECK_EQ_INT(model_input_width(&d), 784);
  builtin("resnet20", 3, 32, 32, &d);
  size_t r20 = params_of(&d);
  printf("resnet20 (3x32x32): %zu parameters\n", r20);
  CHECK(r20 > 265000 && r20 < 280000);
  builtin("resnet18", 3, 32, 32, &d);
  size_t r18 = params_of(&d);
  printf("resnet18 (3x32x32): %zu parameters\n", r18);
  CHECK(r18 > 11100000 && r18 < 11250000);
  /* 28x28 images: the stem pads to 32x32 (pad 3), one input channel */
  builtin("resnet18", 1, 28, 28, &d);
  CHECK_EQ_INT(d.net.layers[0].pad, 3);
  CHECK_EQ_INT(params_of(&d), r18 - 2 * 64 * 9);
  net_shape shapes[NET_MAX_LAYERS];
  ps_error err;
  REQUIRE(net_check(&d.net, shapes, &err) == PS_ERR_OK);
  CHECK_EQ_INT(shapes[0].h, 32);
  /* a built-in over a shape it does not fit */
  REQUIRE(model_parse("lenet", &d, &err) == PS_ERR_OK);
  CHECK_EQ_INT(model_set_input(&d, 1, 3, 3, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(err.msg, "does not fit") != NULL);
}

/* format -> parse -> format gives the same text; the hash follows it. */
static void test_canonical(void) {
  static const char *const names[] = {"lenet", "resnet20", "resnet18"};
  for (size_t i = 0; i < 3; i++) {
    model_desc d, back;
    ps_error err;
    builtin(names[i], 1, 28, 28, &d);
    char text[MODEL_TEXT_MAX], again[MODEL_TEXT_MAX];
    model_format(&d, text, sizeof text);
    CHECK(strncmp(text, "net:name ", 9) == 0);
    CHECK(strlen(text) < sizeof text - 1);
    REQUIRE(model_parse(text, &back, &err) == PS_ERR_OK);
    model_format(&back, again, sizeof again);
    CHECK_EQ_STR(again, text);
    CHECK(model_hash(&back) == model_hash(&d));
    CHECK_EQ_INT(params_of(&back), params_of(&d));
  }
  model_desc a, b;
  builtin("lenet", 1, 28, 28, &a);
  builtin("resnet20", 1, 28, 28, &b);
  CHECK(model_hash(&a) != model_hash(&b));
}

static int write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (f == NULL) return 0;
  int ok = fputs(text, f) >= 0;
  return fclose(f) == 0 && ok;
}

/* The documented files (docs/models) are the built-ins over 1x28x28. */
static void test_documented_files(void) {
  static const char *const names[] = {"lenet", "resnet20", "resnet18"};
  for (size_t i = 0; i < 3; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/docs/models/%s.net", PSTRAIN_SOURCE_DIR, names[i]);
    model_desc file, named;
    ps_error err;
    if (model_read_file(path, &file, &err) != PS_ERR_OK) {
      fprintf(stderr, "%s\n", err.msg);
      CHECK(0);
      continue;
    }
    builtin(names[i], file.net.c, file.net.h, file.net.w, &named);
    CHECK(model_hash(&file) == model_hash(&named));
    CHECK_EQ_INT(params_of(&file), params_of(&named));
  }
}

/* A malformed file is refused naming its line and why. */
static void expect_refused(const char *text, const char *want) {
  char path[128];
  snprintf(path, sizeof path, "%s/bad.net", scratch);
  REQUIRE(write_file(path, text));
  model_desc d;
  ps_error err;
  ps_err rc = model_read_file(path, &d, &err);
  CHECK_EQ_INT(rc, PS_ERR_INVALID_ARGUMENT);
  if (strstr(err.msg, want) == NULL) {
    fprintf(stderr, "for %s: message '%s' lacks '%s'\n", text, err.msg, want);
    CHECK(0);
  }
}

static void test_bad_files(void) {
  const char *head = "name t\ninput 1x8x8\n";
  char text[512];
#define BAD(body, want)                              \
  do {                                               \
    snprintf(text, sizeof text, "%s%s", head, body); \
    expect_refused(text, want);                      \
  } while (0)
  BAD("conv 4 3x3\nwobble\nfc 10\n", "line 4: unknown layer 'wobble'");
  BAD("conv 4 3\nfc 10\n", "line 3: expected 'conv OUT KxK");
  BAD("conv 4 3x3 stride 0\nfc 10\n", "line 3: conv: 'stride' needs a number >= 1");
  BAD("conv 4 3x3 pad\nfc 10\n", "line 3: conv: 'pad' needs a number");
  BAD("conv 4 3x3 dilation 2\nfc 10\n", "line 3: conv: unknown option 'dilation'");
  BAD("relu 3\nfc 10\n", "line 3: relu takes nothing after it");
  BAD("fc\n", "line 3: expected 'fc OUT'");
  BAD("conv 4 9x9\nfc 10\n", "layer 1 (conv) over a 1x8x8 input: the window does not fit");
  BAD("conv 4 3x3\n", "the last layer must be fc");
  BAD("block\nconv 4 3x3 pad 1\nend\nfc 10\n", "the block's body gives 4x8x8 but its shortcut 1x8x8");
  BAD("block\nblock\nend\nend\nfc 10\n", "block inside a block");
  BAD("end\nfc 10\n", "outside a block");
  BAD("block\nrelu\nfc 10\n", "block without its end");
  BAD("fc 10\nmaxpool 2x2\nfc 10\n", "needs a CxHxW input");
  BAD("maxpool 2x2 pad 2\nfc 10\n", "padding must be at most half the window");
#undef BAD
  expect_refused("input 1x8x8\nfc 10\n", "no 'name NAME' line");
  expect_refused("name t\nfc 10\n", "no 'input CxHxW' line");
  expect_refused("name a b\ninput 1x8x8\nfc 10\n", "line 1: expected 'name NAME'");
  expect_refused("name t\ninput 1x8\nfc 10\n", "line 2: expected 'input CxHxW'");
  expect_refused("name t\ninput 1x8x8\nfc 10|relu\n", "holds a NUL byte or '|'");
  model_desc d;
  ps_error err;
  CHECK_EQ_INT(model_read_file("/nonexistent/x.net", &d, &err), PS_ERR_IO);
  CHECK(strstr(err.msg, "/nonexistent/x.net") != NULL);
  /* a good file with comments, blank lines and a block with a shortcut */
  char path[128];
  snprintf(path, sizeof path, "%s/good.net", scratch);
  REQUIRE(write_file(path, "# a comment\nname tiny  # trailing\ninput 2x8x8\n\n"
                           "conv 4 3x3 pad 1 nobias\nbn\nblock\n  conv 8 3x3 stride 2 pad 1\n"
                           "shortcut\n  conv 8 1x1 stride 2\nend\nrelu\navgpool\nfc 3\n"));
  REQUIRE(model_read_file(path, &d, &err) == PS_ERR_OK);
  /* conv 2->4 (no bias), bn 4 x 4, conv 4->8 + bias, conv 4->8 1x1 + bias, fc 8->3 */
  CHECK_EQ_INT(params_of(&d), 2 * 4 * 9 + 16 + 4 * 8 * 9 + 8 + 4 * 8 + 8 + 8 * 3 + 3);
  CHECK_EQ_INT(model_classes(&d), 3);
  CHECK_EQ_INT(model_set_input(&d, 1, 8, 8, &err), PS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(err.msg, "takes 2x8x8 inputs but the images are 1x8x8") != NULL);
}

/* Batch norm's running statistics are parameters the optimizer skips. */
static void test_layout_rules(void) {
  model_desc d;
  builtin("resnet20", 1, 28, 28, &d);
  tensor_layout layout;
  ps_error err;
  tensor_layout_init(&layout);
  REQUIRE(model_build_layout(&d, &layout, &err) == PS_ERR_OK);
  int mean = tensor_layout_find(&layout, "bn1.running_mean");
  int var = tensor_layout_find(&layout, "bn1.running_var");
  int gamma = tensor_layout_find(&layout, "bn1.weight");
  int conv = tensor_layout_find(&layout, "conv1.weight");
  REQUIRE(mean >= 0 && var >= 0 && gamma >= 0 && conv >= 0);
  CHECK_EQ_INT(layout.tensors[mean].trainable, 0);
  CHECK_EQ_INT(layout.tensors[var].trainable, 0);
  CHECK_EQ_INT(layout.tensors[var].init.kind, TENSOR_INIT_ONES);
  CHECK_EQ_INT(layout.tensors[gamma].trainable, 1);
  CHECK_EQ_INT(layout.tensors[gamma].init.kind, TENSOR_INIT_ONES);
  CHECK_EQ_INT(layout.tensors[conv].rank, 4);
  CHECK_EQ_INT(layout.tensors[conv].shape[1], 1);
  CHECK_EQ_INT(layout.tensors[conv].shape[3], 3);
  CHECK(tensor_layout_find(&layout, "conv1.bias") < 0); /* nobias */
  tensor_layout_free(&layout);
}

/* Pservers and collective ranks refuse another network by its name, or by
 * the first line that differs. */
static void test_job_diff(void) {
  job_config a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  builtin("lenet", 1, 28, 28, &a.model);
  builtin("resnet20", 1, 28, 28, &b.model);
  char diff[1024];
  job_config_diff(&a, &b, diff, sizeof diff);
  CHECK_EQ_STR(diff, "model network lenet vs network resnet20");
  b = a;
  b.model.net.layers[3].out = 32; /* the second conv */
  job_config_diff(&a, &b, diff, sizeof diff);
  CHECK_EQ_STR(diff, "model network lenet line 6 'conv 20 5x5 stride 1 pad 2' vs "
                     "'conv 32 5x5 stride 1 pad 2'");
  CHECK(job_config_hash(&a) != job_config_hash(&b));
}

int main(void) {
  snprintf(scratch, sizeof scratch, "/tmp/pstrain-test-net.XXXXXX");
  REQUIRE(mkdtemp(scratch) != NULL);
  test_builtins();
  test_canonical();
  test_documented_files();
  test_bad_files();
  test_layout_rules();
  test_job_diff();
  char path[128];
  snprintf(path, sizeof path, "%s/bad.net", scratch);
  unlink(path);
  snprintf(path, sizeof path, "%s/good.net", scratch);
  unlink(path);
  rmdir(scratch);
  return check_failures == 0 ? 0 : 1;
}
