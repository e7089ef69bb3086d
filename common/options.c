/* Option table parsing: defaults, environment, then flags. */
#include "common/options.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *options_env_name(const option_def *def, char *buf, size_t len) {
  if (def->env != NULL) {
    snprintf(buf, len, "%s", def->env);
    return buf;
  }
  size_t used = (size_t)snprintf(buf, len, "PSTRAIN_");
  for (const char *p = def->name; *p != '\0' && used + 1 < len; p++) {
    buf[used++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
  }
  buf[used < len ? used : len - 1] = '\0';
  return buf;
}

static bool choice_allowed(const char *choices, const char *value) {
  size_t vlen = strlen(value);
  const char *p = choices;
  while (*p != '\0') {
    const char *bar = strchr(p, '|');
    size_t n = bar != NULL ? (size_t)(bar - p) : strlen(p);
    if (n == vlen && strncmp(p, value, n) == 0) return true;
    if (bar == NULL) break;
    p = bar + 1;
  }
  return false;
}

/* Parses text as the option's type and stores it; `source` names where the
 * value came from, for the error message. */
static ps_err store_value(const option_def *def, void *cfg, const char *text, const char *source,
                          ps_error *err) {
  char *field = (char *)cfg + def->offset;
  bool bounded = def->min <= def->max;
  switch (def->type) {
  case OPT_INT: {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0') {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' is not an integer", source, text);
    }
    if (bounded && (v < def->min || v > def->max)) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: %ld is outside %.0f..%.0f", source, v,
                          def->min, def->max);
    }
    *(long *)field = v;
    return PS_ERR_OK;
  }
  case OPT_DOUBLE: {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(v)) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' is not a finite number", source,
                          text);
    }
    if (bounded && (v < def->min || v > def->max)) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: %g is outside %g..%g", source, v,
                          def->min, def->max);
    }
    *(double *)field = v;
    return PS_ERR_OK;
  }
  case OPT_STRING:
    *(const char **)field = text;
    return PS_ERR_OK;
  case OPT_CHOICE:
    if (!choice_allowed(def->choices, text)) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' is not one of %s", source, text,
                          def->choices);
    }
    *(const char **)field = text;
    return PS_ERR_OK;
  case OPT_BOOL:
    if (strcmp(text, "1") == 0 || strcmp(text, "true") == 0 || strcmp(text, "yes") == 0) {
      *(bool *)field = true;
    } else if (strcmp(text, "0") == 0 || strcmp(text, "false") == 0 || strcmp(text, "no") == 0) {
      *(bool *)field = false;
    } else {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' is not true or false", source,
                          text);
    }
    return PS_ERR_OK;
  }
  return ps_error_set(err, PS_ERR_INTERNAL, "%s: option has an unknown type", source);
}

static const option_def *find_option(const option_def *defs, size_t count, const char *name,
                                     size_t name_len) {
  for (size_t i = 0; i < count; i++) {
    if (strlen(defs[i].name) == name_len && strncmp(defs[i].name, name, name_len) == 0) {
      return &defs[i];
    }
  }
  return NULL;
}

options_result options_parse(const option_def *defs, size_t count, void *cfg, int argc,
                             char **argv, ps_error *err) {
  char source[160];
  char env[96];

  for (size_t i = 0; i < count; i++) {
    snprintf(source, sizeof source, "default of --%s", defs[i].name);
    if (store_value(&defs[i], cfg, defs[i].def, source, err) != PS_ERR_OK) return OPTIONS_ERROR;
  }
  for (size_t i = 0; i < count; i++) {
    const char *value = getenv(options_env_name(&defs[i], env, sizeof env));
    if (value == NULL) continue;
    snprintf(source, sizeof source, "environment variable %s", env);
    if (store_value(&defs[i], cfg, value, source, err) != PS_ERR_OK) return OPTIONS_ERROR;
  }
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return OPTIONS_HELP;
    if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
      ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "unexpected argument '%s' (options are --name value)",
                   arg);
      return OPTIONS_ERROR;
    }
    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t name_len = eq != NULL ? (size_t)(eq - name) : strlen(name);
    const option_def *def = find_option(defs, count, name, name_len);
    if (def == NULL) {
      ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "unknown option '--%.*s' (see --help)",
                   (int)name_len, name);
      return OPTIONS_ERROR;
    }
    const char *value;
    if (eq != NULL) {
      value = eq + 1;
    } else if (def->type == OPT_BOOL) {
      value = "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "option --%s needs a value", def->name);
      return OPTIONS_ERROR;
    }
    snprintf(source, sizeof source, "--%s", def->name);
    if (store_value(def, cfg, value, source, err) != PS_ERR_OK) return OPTIONS_ERROR;
  }
  return OPTIONS_OK;
}

/* The argument a flag's help line shows after --name. */
static const char *help_arg(const option_def *d) {
  return d->type == OPT_BOOL ? "" : d->type == OPT_CHOICE ? d->choices : "VALUE";
}

/* Text as one markdown table cell: characters that would end the cell or
 * start markup are escaped. In code (inside backticks) only '|' is. */
static void print_md_cell(FILE *out, const char *text, int code) {
  for (const char *p = text; *p != '\0'; p++) {
    if (*p == '|' || (!code && strchr("\\*_`<>[]", *p) != NULL)) fputc('\\', out);
    fputc(*p, out);
  }
}

/* The help as markdown: the usage as a text block, then a table of the
 * same rows, in the same order, as the plain help. */
static void print_help_markdown(FILE *out, const char *usage, const option_def *defs,
                                size_t count) {
  char env[96];
  fprintf(out, "```text\n%s\n```\n\n", usage);
  fprintf(out, "| flag | environment variable | default | description |\n"
               "| --- | --- | --- | --- |\n");
  for (size_t i = 0; i < count; i++) {
    const option_def *d = &defs[i];
    const char *arg = help_arg(d);
    fprintf(out, "| `--%s%s", d->name, arg[0] != '\0' ? " " : "");
    print_md_cell(out, arg, 1);
    fprintf(out, "` | `%s` | ", options_env_name(d, env, sizeof env));
    if (d->def[0] != '\0') {
      fputc('`', out);
      print_md_cell(out, d->def, 1);
      fputc('`', out);
    } else {
      fputs("(none)", out);
    }
    fputs(" | ", out);
    print_md_cell(out, d->help, 0);
    fputs(" |\n", out);
  }
  fprintf(out, "| `--help` | | | print this help and exit |\n");
}

void options_print_help(FILE *out, const char *usage, const option_def *defs, size_t count) {
  const char *format = getenv(OPTIONS_HELP_FORMAT_ENV);
  if (format != NULL && strcmp(format, "markdown") == 0) {
    print_help_markdown(out, usage, defs, count);
    return;
  }
  char env[96];
  fprintf(out, "%s\n\nOptions (a flag wins over its environment variable):\n", usage);
  for (size_t i = 0; i < count; i++) {
    const option_def *d = &defs[i];
    fprintf(out, "  --%s %s\n      %s\n      default: %s   env: %s\n", d->name, help_arg(d),
            d->help, d->def[0] != '\0' ? d->def : "(none)", options_env_name(d, env, sizeof env));
  }
  fprintf(out, "  --help\n      print this help and exit\n");
}

void options_format(const option_def *defs, size_t count, const void *cfg, char *buf,
                    size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < count && used < len; i++) {
    const char *field = (const char *)cfg + defs[i].offset;
    const char *sep = i == 0 ? "" : " ";
    int n = 0;
    switch (defs[i].type) {
    case OPT_INT:
      n = snprintf(buf + used, len - used, "%s%s=%ld", sep, defs[i].name, *(const long *)field);
      break;
    case OPT_DOUBLE:
      n = snprintf(buf + used, len - used, "%s%s=%g", sep, defs[i].name, *(const double *)field);
      break;
    case OPT_STRING:
    case OPT_CHOICE:
      n = snprintf(buf + used, len - used, "%s%s=%s", sep, defs[i].name,
                   *(const char *const *)field);
      break;
    case OPT_BOOL:
      n = snprintf(buf + used, len - used, "%s%s=%s", sep, defs[i].name,
                   *(const bool *)field ? "true" : "false");
      break;
    }
    if (n < 0) break;
    used += (size_t)n;
  }
}
