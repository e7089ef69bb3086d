/* One table of options drives long flags, environment variables and --help
 * for each daemon. Values are stored into the caller's config struct at the
 * offsets the table gives. Not for positional arguments: there are none. */
#ifndef PSTRAIN_COMMON_OPTIONS_H
#define PSTRAIN_COMMON_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/error.h"

typedef enum {
  OPT_INT,    /* long; bounds in min/max */
  OPT_DOUBLE, /* double; bounds in min/max */
  OPT_STRING, /* const char *, pointing into argv, the environment or the table */
  OPT_CHOICE, /* const char *, one of the '|'-separated choices */
  OPT_BOOL,   /* bool; a flag without a value, or --name=true|false */
} option_type;

typedef struct option_def {
  const char *name;    /* long flag without the leading "--" */
  const char *env;     /* environment variable; NULL means PSTRAIN_<NAME> */
  option_type type;
  size_t offset;       /* of the field in the config struct */
  const char *def;     /* default, as text; parsed like user input */
  const char *help;
  const char *choices; /* OPT_CHOICE only: "a|b|c" */
  double min, max;     /* inclusive bounds for numbers; unchecked when min > max */
} option_def;

/* The environment variable an option reads, written to buf. Returns buf. */
const char *options_env_name(const option_def *def, char *buf, size_t len);

typedef enum {
  OPTIONS_OK = 0,
  OPTIONS_HELP, /* --help was given: print help and exit 0 */
  OPTIONS_ERROR,
} options_result;

/* Fills cfg from the defaults, then the environment, then argv[1..argc-1]
 * (flags win over the environment). Flags are --name value or --name=value.
 * On OPTIONS_ERROR, err holds one line naming the flag or variable and why it
 * was refused; cfg may be partly filled. Strings in cfg point into argv, the
 * environment or the table, so they live as long as those. */
options_result options_parse(const option_def *defs, size_t count, void *cfg, int argc,
                             char **argv, ps_error *err);

/* The environment variable that turns --help into markdown (below). */
#define OPTIONS_HELP_FORMAT_ENV "PSTRAIN_HELP_FORMAT"

/* Prints usage: every flag, its environment variable, default and help.
 * With OPTIONS_HELP_FORMAT_ENV=markdown in the environment it prints the
 * same usage and rows as a markdown table instead, which
 * scripts/gen-flags-doc turns into docs/flags.md: the docs and --help come
 * from this one function and table, and tests/test_docs.sh compares them. */
void options_print_help(FILE *out, const char *usage, const option_def *defs, size_t count);

/* Writes "name=value name=value ..." of the effective configuration. */
void options_format(const option_def *defs, size_t count, const void *cfg, char *buf,
                    size_t len);

#endif
