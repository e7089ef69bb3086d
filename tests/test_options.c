/* Option parsing through the trainer's table: defaults, environment, flags
 * winning over the environment, --help, and every kind of rejection. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "tests/check.h"
#include "trainer/trainer_config.h"

/* Parses a NULL-terminated list of arguments. */
static options_result parse(trainer_settings *s, ps_error *err, const char *const *args) {
  char *argv[32];
  int argc = 0;
  argv[argc++] = (char *)"trainer";
  for (int i = 0; args[i] != NULL; i++) argv[argc++] = (char *)args[i];
  ps_error_clear(err);
  return trainer_settings_load(s, argc, argv, err);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void expect_error(const char *const *args, const char *message) {
  trainer_settings s;
  ps_error err;
  options_result r = parse(&s, &err, args);
  CHECK_EQ_INT(r, OPTIONS_ERROR);
  CHECK_CONTAINS(err.msg, message);
}

/* Defaults: the recipe the README promises. */
static void case_defaults(void) {
  trainer_settings s;
  ps_error err;
  CHECK_EQ_INT(parse(&s, &err, ARGS("--mode", "local")), OPTIONS_OK);
  CHECK_EQ_STR(s.opt.data, "/usr/share/datasets/fashion-mnist");
  CHECK_EQ_STR(s.opt.model, "mlp:784,256,128,10");
  CHECK_EQ_INT(s.opt.epochs, 12);
  CHECK_EQ_INT(s.opt.batch, 64);
  CHECK_EQ_INT(s.optimizer.kind, OPTIMIZER_ADAM);
  CHECK_NEAR(s.optimizer.lr, 0.001, 0);
  CHECK_EQ_INT(s.optimizer.schedule, LR_COSINE);
  CHECK_EQ_INT(s.model.num_layers, 3);
  CHECK_EQ_INT(s.model.sizes[1], 256);
  CHECK_EQ_INT(s.level, LOG_LEVEL_INFO);
}

static void case_both_flag_forms(void) {
  trainer_settings s;
  ps_error err;
  CHECK_EQ_INT(parse(&s, &err, ARGS("--batch=32", "--lr", "0.05", "--optimizer", "momentum")),
               OPTIONS_OK);
  CHECK_EQ_INT(s.opt.batch, 32);
  CHECK_NEAR(s.optimizer.lr, 0.05, 0);
  CHECK_EQ_INT(s.optimizer.kind, OPTIMIZER_MOMENTUM);
}

/* The environment beats the default; a flag beats the environment; a bad
 * environment value is refused and named, even when a flag would win. */
static void case_environment_and_flags(void) {
  trainer_settings s;
  ps_error err;
  REQUIRE(setenv("PSTRAIN_EPOCHS", "3", 1) == 0);
  REQUIRE(setenv("PSTRAIN_OPTIMIZER", "sgd", 1) == 0);
  CHECK_EQ_INT(parse(&s, &err, ARGS("--batch", "16")), OPTIONS_OK);
  CHECK_EQ_INT(s.opt.epochs, 3);
  CHECK_EQ_INT(s.optimizer.kind, OPTIMIZER_SGD);
  CHECK_EQ_INT(parse(&s, &err, ARGS("--epochs", "5", "--optimizer", "adam")), OPTIONS_OK);
  CHECK_EQ_INT(s.opt.epochs, 5);
  CHECK_EQ_INT(s.optimizer.kind, OPTIMIZER_ADAM);
  REQUIRE(setenv("PSTRAIN_BATCH", "-1", 1) == 0);
  expect_error(ARGS("--epochs", "1"), "environment variable PSTRAIN_BATCH");
  REQUIRE(unsetenv("PSTRAIN_BATCH") == 0);
  REQUIRE(unsetenv("PSTRAIN_EPOCHS") == 0);
  REQUIRE(unsetenv("PSTRAIN_OPTIMIZER") == 0);
}

/* Every rejection names the flag and the reason. */
static void case_rejections_name_flag_and_reason(void) {
  expect_error(ARGS("--bogus", "1"), "unknown option '--bogus'");
  expect_error(ARGS("--optimizer", "rmsprop"), "--optimizer: 'rmsprop' is not one of sgd|momentum|adam");
  expect_error(ARGS("--batch", "65537"), "--batch: 65537 is outside 0..65536");
  expect_error(ARGS("--batch", "-5"), "--batch: -5 is outside");
  expect_error(ARGS("--batch", "12abc"), "--batch: '12abc' is not an integer");
  expect_error(ARGS("--epochs", "-1"), "--epochs: -1 is outside");
  expect_error(ARGS("--epochs"), "option --epochs needs a value");
  expect_error(ARGS("--lr", "nan"), "--lr: 'nan' is not a finite number");
  expect_error(ARGS("--lr", "0"), "--lr: 0 is outside");
  expect_error(ARGS("--device", "tpu"), "--device: 'tpu' is not one of auto|cpu|cuda");
  expect_error(ARGS("--mode", "magic"), "--mode: 'magic' is not one of");
  expect_error(ARGS("train.idx"), "unexpected argument 'train.idx'");
  expect_error(ARGS("--model", "cnn:1,2"), "expected mlp:");
  expect_error(ARGS("--model", "mlp:784"), "needs at least an input and an output size");
  expect_error(ARGS("--model", "mlp:784,,10"), "is not a layer size");
  expect_error(ARGS("--model", "mlp:784,0,10"), "layer size 0 is outside");
  expect_error(ARGS("--lr-schedule", "cosine", "--lr", "0.01", "--min-lr", "0.1"),
               "--min-lr 0.1 is above --lr 0.01");
}

/* 0 takes the model's default. */
static void case_zero_takes_model_default(void) {
  trainer_settings s;
  ps_error err;
  CHECK_EQ_INT(parse(&s, &err, ARGS("--batch", "0", "--epochs", "0")), OPTIONS_OK);
  CHECK_EQ_INT(s.opt.batch, 64);
  CHECK_EQ_INT(s.opt.epochs, 12);
}

/* The CTR models read Criteo files; IDX data is refused for them and the other way round. */
static void case_ctr_models_take_criteo_data_only(void) {
  expect_error(ARGS("--model", "ctr:8:16"), "is not a Criteo TSV file");
  expect_error(ARGS("--model", "lr", "--data-format", "idx"), "is not a Criteo TSV file");
  expect_error(ARGS("--test-data", "x.tsv"), "--test-data and --eval-every are for --model ctr");
  expect_error(ARGS("--sparse-optimizer", "ftrl"), "--sparse-optimizer: 'ftrl' is not one of");
}

/* --help stops parsing, and lists every flag with its default and variable. */
static void case_help_lists_every_flag(void) {
  trainer_settings s;
  ps_error err;
  CHECK_EQ_INT(parse(&s, &err, ARGS("--help")), OPTIONS_HELP);
  FILE *out = tmpfile();
  REQUIRE(out != NULL);
  trainer_print_help(out);
  long size = ftell(out);
  REQUIRE(size > 0);
  char *text = calloc(1, (size_t)size + 1);
  REQUIRE(text != NULL);
  rewind(out);
  REQUIRE(fread(text, 1, (size_t)size, out) == (size_t)size);
  fclose(out);
  const char *expected[] = {"--data", "--model", "--epochs", "--batch", "--optimizer", "--lr",
                            "--seed", "--threads", "--device", "--metrics", "64 for mlp, 512 for ctr",
                            "PSTRAIN_BATCH", "default: adam", "default: mlp:784,256,128,10"};
  for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) CHECK_CONTAINS(text, expected[i]);
  free(text);
}

int main(void) {
  RUN_CASE(case_defaults);
  RUN_CASE(case_both_flag_forms);
  RUN_CASE(case_environment_and_flags);
  RUN_CASE(case_rejections_name_flag_and_reason);
  RUN_CASE(case_zero_takes_model_default);
  RUN_CASE(case_ctr_models_take_criteo_data_only);
  RUN_CASE(case_help_lists_every_flag);
  return check_report("test_options");
}
