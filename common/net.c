/* Network text: parsing (model files and the canonical line), shape
 * checks, the canonical form and the parameter layout. */
#define _POSIX_C_SOURCE 200809L
#include "common/net.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define NET_DIM_MAX 65536

static const char *const op_names[] = {"conv",    "bn",      "relu", "maxpool", "avgpool",
                                       "flatten", "fc",      "block", "shortcut", "end"};
#define OP_COUNT (int)(sizeof op_names / sizeof op_names[0])

/* Where a line came from, for messages. */
typedef struct line_ctx {
  const char *source;
  int line;
} line_ctx;

static ps_err line_error(const line_ctx *at, ps_error *err, const char *what) {
  return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s line %d: %s", at->source, at->line, what);
}

/* A positive integer word in 1..NET_DIM_MAX (0 allowed when zero_ok). */
static int parse_int(const char *word, int zero_ok, int *out) {
  char *end;
  errno = 0;
  long v = strtol(word, &end, 10);
  if (end == word || *end != '\0' || errno != 0 || v < (zero_ok ? 0 : 1) || v > NET_DIM_MAX) {
    return 0;
  }
  *out = (int)v;
  return 1;
}

/* "AxB" (or "A" alone, meaning AxA when square_ok). */
static int parse_pair(const char *word, int *a, int *b) {
  char first[32];
  const char *x = strchr(word, 'x');
  if (x == NULL) return 0;
  size_t len = (size_t)(x - word);
  if (len == 0 || len >= sizeof first) return 0;
  memcpy(first, word, len);
  first[len] = '\0';
  return parse_int(first, 0, a) && parse_int(x + 1, 0, b);
}

/* The options after a conv or maxpool's kernel: stride S, pad P, nobias. */
static ps_err parse_options(char **words, int n, net_layer *l, const line_ctx *at,
                            ps_error *err) {
  char msg[160];
  for (int i = 0; i < n; i++) {
    if (strcmp(words[i], "nobias") == 0 && l->op == NET_CONV) {
      l->bias = 0;
      continue;
    }
    int is_stride = strcmp(words[i], "stride") == 0, is_pad = strcmp(words[i], "pad") == 0;
    if (!is_stride && !is_pad) {
      snprintf(msg, sizeof msg, "%s: unknown option '%s' (stride S, pad P%s)", op_names[l->op],
               words[i], l->op == NET_CONV ? ", nobias" : "");
      return line_error(at, err, msg);
    }
    int v;
    if (i + 1 >= n || !parse_int(words[i + 1], is_pad, &v)) {
      snprintf(msg, sizeof msg, "%s: '%s' needs a number%s", op_names[l->op], words[i],
               is_pad ? " >= 0" : " >= 1");
      return line_error(at, err, msg);
    }
    if (is_stride) l->stride = v;
    else l->pad = v;
    i++;
  }
  return PS_ERR_OK;
}

/* A layer line's words (after the op) into l. */
static ps_err parse_layer(char **words, int n, net_layer *l, const line_ctx *at, ps_error *err) {
  char msg[160];
  int takes_args = l->op == NET_CONV || l->op == NET_MAXPOOL || l->op == NET_FC;
  if (!takes_args && n > 0) {
    snprintf(msg, sizeof msg, "%s takes nothing after it, found '%s'", op_names[l->op], words[0]);
    return line_error(at, err, msg);
  }
  switch (l->op) {
    case NET_FC:
      if (n != 1 || !parse_int(words[0], 0, &l->out)) {
        return line_error(at, err, "expected 'fc OUT' with OUT >= 1");
      }
      return PS_ERR_OK;
    case NET_CONV:
      if (n < 2 || !parse_int(words[0], 0, &l->out) || !parse_pair(words[1], &l->kh, &l->kw)) {
        return line_error(at, err, "expected 'conv OUT KxK [stride S] [pad P] [nobias]'");
      }
      l->stride = 1;
      l->bias = 1;
      return parse_options(words + 2, n - 2, l, at, err);
    case NET_MAXPOOL:
      if (n < 1 || !parse_pair(words[0], &l->kh, &l->kw)) {
        return line_error(at, err, "expected 'maxpool KxK [stride S] [pad P]'");
      }
      l->stride = l->kh;
      return parse_options(words + 1, n - 1, l, at, err);
    default:
      return PS_ERR_OK;
  }
}

static ps_err parse_header(char **words, int n, net_desc *net, const line_ctx *at, ps_error *err) {
  if (strcmp(words[0], "name") == 0) {
    size_t len = n == 2 ? strlen(words[1]) : 0;
    int ok = len > 0 && len < NET_NAME_MAX;
    for (size_t i = 0; ok && i < len; i++) {
      ok = isalnum((unsigned char)words[1][i]) || words[1][i] == '-' || words[1][i] == '_';
    }
    if (!ok) {
      return line_error(at, err,
                        "expected 'name NAME': letters, digits, '-' and '_', at most 31 of them");
    }
    memcpy(net->name, words[1], len + 1);
    return PS_ERR_OK;
  }
  int c, hw[2];
  char first[32];
  const char *x = n == 2 ? strchr(words[1], 'x') : NULL;
  size_t len = x != NULL ? (size_t)(x - words[1]) : 0;
  if (x == NULL || len == 0 || len >= sizeof first) {
    return line_error(at, err, "expected 'input CxHxW', e.g. 'input 1x28x28'");
  }
  memcpy(first, words[1], len);
  first[len] = '\0';
  if (!parse_int(first, 0, &c) || !parse_pair(x + 1, &hw[0], &hw[1])) {
    return line_error(at, err, "expected 'input CxHxW', e.g. 'input 1x28x28'");
  }
  net->c = c;
  net->h = hw[0];
  net->w = hw[1];
  return PS_ERR_OK;
}

/* One line (comment stripped) into the network. */
static ps_err parse_line(char *line, net_desc *net, const line_ctx *at, ps_error *err) {
  char *words[16];
  int n = 0;
  for (char *save = NULL, *w = strtok_r(line, " \t\r", &save); w != NULL;
       w = strtok_r(NULL, " \t\r", &save)) {
    if (n == (int)(sizeof words / sizeof words[0])) return line_error(at, err, "too many words");
    words[n++] = w;
  }
  if (n == 0) return PS_ERR_OK;
  if (strcmp(words[0], "name") == 0 || strcmp(words[0], "input") == 0) {
    return parse_header(words, n, net, at, err);
  }
  int op = 0;
  while (op < OP_COUNT && strcmp(words[0], op_names[op]) != 0) op++;
  if (op == OP_COUNT) {
    char msg[200];
    snprintf(msg, sizeof msg,
             "unknown layer '%s' (name, input, conv, bn, relu, maxpool, avgpool, flatten, fc, "
             "block, shortcut, end)",
             words[0]);
    return line_error(at, err, msg);
  }
  if (net->count == NET_MAX_LAYERS) {
    char msg[64];
    snprintf(msg, sizeof msg, "more than %d layers", NET_MAX_LAYERS);
    return line_error(at, err, msg);
  }
  net_layer *l = &net->layers[net->count];
  memset(l, 0, sizeof *l);
  l->op = (net_op)op;
  if (parse_layer(words + 1, n - 1, l, at, err) != PS_ERR_OK) return err->code;
  net->count++;
  return PS_ERR_OK;
}

/* Blocks: no nesting, shortcut only inside one, every block ended. */
static ps_err check_blocks(const net_desc *net, const char *source, ps_error *err) {
  int open = -1, shortcut = 0;
  for (int i = 0; i < net->count; i++) {
    net_op op = net->layers[i].op;
    const char *problem = NULL;
    if (op == NET_BLOCK && open >= 0) problem = "block inside a block (blocks do not nest)";
    if ((op == NET_SHORTCUT || op == NET_END) && open < 0) problem = "outside a block";
    if (op == NET_SHORTCUT && open >= 0 && shortcut) problem = "a second shortcut in one block";
    if (problem != NULL) {
      return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s layer %d (%s): %s", source, i + 1,
                          op_names[op], problem);
    }
    if (op == NET_BLOCK) open = i, shortcut = 0;
    if (op == NET_SHORTCUT) shortcut = 1;
    if (op == NET_END) open = -1;
  }
  if (open >= 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s layer %d: block without its end",
                        source, open + 1);
  }
  return PS_ERR_OK;
}

ps_err net_parse_text(const char *text, char separator, const char *source, net_desc *net,
                      ps_error *err) {
  memset(net, 0, sizeof *net);
  char *copy = strdup(text);
  if (copy == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "%s: out of memory", source);
  line_ctx at = {source, 0};
  ps_err rc = PS_ERR_OK;
  for (char *line = copy, *next; line != NULL && rc == PS_ERR_OK; line = next) {
    next = strchr(line, separator);
    if (next != NULL) *next++ = '\0';
    at.line++;
    char *hash = strchr(line, '#');
    if (hash != NULL) *hash = '\0';
    rc = parse_line(line, net, &at, err);
  }
  free(copy);
  if (rc != PS_ERR_OK) return rc;
  if (net->name[0] == '\0') {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: no 'name NAME' line", source);
  }
  if (net->count == 0) return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "%s: no layers", source);
  if (check_blocks(net, source, err) != PS_ERR_OK) return err->code;
  return net->c > 0 ? net_check(net, NULL, err) : PS_ERR_OK;
}

ps_err net_read_file(const char *path, net_desc *net, ps_error *err) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    return ps_error_set(err, PS_ERR_IO, "opening model file %s: %s", path, strerror(errno));
  }
  char text[NET_TEXT_MAX * 4];
  size_t len = fread(text, 1, sizeof text - 1, f);
  int failed = ferror(f), longer = !failed && fgetc(f) != EOF;
  fclose(f);
  if (failed) return ps_error_set(err, PS_ERR_IO, "reading model file %s", path);
  if (longer) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "model file %s: longer than %zu bytes",
                        path, sizeof text - 1);
  }
  text[len] = '\0';
  if (memchr(text, '\0', len) != NULL || strchr(text, '|') != NULL) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "model file %s: holds a NUL byte or '|', which no line may", path);
  }
  char source[600];
  snprintf(source, sizeof source, "model file %s", path);
  if (net_parse_text(text, '\n', source, net, err) != PS_ERR_OK) return err->code;
  if (net->c == 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "model file %s: no 'input CxHxW' line (e.g. 'input 1x28x28')", path);
  }
  return PS_ERR_OK;
}

ps_err net_set_input(net_desc *net, int c, int h, int w, ps_error *err) {
  net->c = c;
  net->h = h;
  net->w = w;
  return net_check(net, NULL, err);
}

/* --- shapes ---------------------------------------------------------------- */

static int window_out(int in, int kernel, int stride, int pad) {
  int span = in + 2 * pad - kernel;
  return span < 0 ? 0 : span / stride + 1;
}

static ps_err shape_error(const net_desc *net, int i, net_shape in, ps_error *err,
                          const char *why) {
  return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                      "network %s layer %d (%s) over a %dx%dx%d input: %s", net->name, i + 1,
                      op_names[net->layers[i].op], in.c, in.h, in.w, why);
}

/* Layer i's output shape from its input `in`. */
static ps_err layer_shape(const net_desc *net, int i, net_shape in, net_shape *out,
                          ps_error *err) {
  const net_layer *l = &net->layers[i];
  int flat = in.h == 0;
  *out = in;
  switch (l->op) {
    case NET_CONV:
    case NET_MAXPOOL:
      if (flat) return shape_error(net, i, in, err, "needs a CxHxW input, not a flat one");
      /* PyTorch's rule: a pooling window is never more than half padding. */
      if (l->op == NET_MAXPOOL && (2 * l->pad > l->kh || 2 * l->pad > l->kw)) {
        return shape_error(net, i, in, err, "padding must be at most half the window");
      }
      out->h = window_out(in.h, l->kh, l->stride, l->pad);
      out->w = window_out(in.w, l->kw, l->stride, l->pad);
      if (out->h < 1 || out->w < 1) return shape_error(net, i, in, err, "the window does not fit");
      if (l->op == NET_CONV) out->c = l->out;
      return PS_ERR_OK;
    case NET_BN:
      return PS_ERR_OK;
    case NET_AVGPOOL:
      if (flat) return shape_error(net, i, in, err, "needs a CxHxW input, not a flat one");
      out->h = out->w = 0;
      return PS_ERR_OK;
    case NET_FLATTEN:
      if (!flat) *out = (net_shape){in.c * in.h * in.w, 0, 0};
      return PS_ERR_OK;
    case NET_FC:
      *out = (net_shape){l->out, 0, 0};
      return PS_ERR_OK;
    default:
      return PS_ERR_OK;
  }
}

static int shape_equal(net_shape a, net_shape b) { return a.c == b.c && a.h == b.h && a.w == b.w; }

ps_err net_check(const net_desc *net, net_shape *shapes, ps_error *err) {
  if (net->c < 1 || net->h < 1 || net->w < 1) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "network %s: no input shape", net->name);
  }
  net_shape cur = {net->c, net->h, net->w}, block_in = cur, body_out = cur;
  for (int i = 0; i < net->count; i++) {
    switch (net->layers[i].op) {
      case NET_BLOCK:
        block_in = body_out = cur;
        break;
      case NET_SHORTCUT:
        body_out = cur;
        cur = block_in;
        break;
      case NET_END: {
        /* Without a shortcut line the body ends here and the shortcut is x. */
        int had_shortcut = 0;
        for (int j = i - 1; j >= 0 && net->layers[j].op != NET_BLOCK; j--) {
          if (net->layers[j].op == NET_SHORTCUT) had_shortcut = 1;
        }
        net_shape body = had_shortcut ? body_out : cur, shortcut = had_shortcut ? cur : block_in;
        if (!shape_equal(body, shortcut)) {
          char why[160];
          snprintf(why, sizeof why, "the block's body gives %dx%dx%d but its shortcut %dx%dx%d",
                   body.c, body.h, body.w, shortcut.c, shortcut.h, shortcut.w);
          return shape_error(net, i, cur, err, why);
        }
        cur = body;
        break;
      }
      default:
        if (layer_shape(net, i, cur, &cur, err) != PS_ERR_OK) return err->code;
    }
    if ((size_t)cur.c * (size_t)(cur.h ? cur.h : 1) * (size_t)(cur.w ? cur.w : 1) > (1u << 26)) {
      return shape_error(net, i, cur, err, "its output is larger than 2^26 floats per example");
    }
    if (shapes != NULL) shapes[i] = cur;
  }
  const net_layer *last = &net->layers[net->count - 1];
  if (last->op != NET_FC) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "network %s: the last layer must be fc CLASSES (the logits), not %s",
                        net->name, op_names[last->op]);
  }
  return PS_ERR_OK;
}

int net_classes(const net_desc *net) {
  return net->count > 0 && net->layers[net->count - 1].op == NET_FC
             ? net->layers[net->count - 1].out
             : 0;
}

/* --- canonical text -------------------------------------------------------- */

static size_t format_layer(const net_layer *l, char *buf, size_t len) {
  switch (l->op) {
    case NET_CONV:
      return (size_t)snprintf(buf, len, "conv %d %dx%d stride %d pad %d%s", l->out, l->kh, l->kw,
                              l->stride, l->pad, l->bias ? "" : " nobias");
    case NET_MAXPOOL:
      return (size_t)snprintf(buf, len, "maxpool %dx%d stride %d pad %d", l->kh, l->kw,
                              l->stride, l->pad);
    case NET_FC:
      return (size_t)snprintf(buf, len, "fc %d", l->out);
    default:
      return (size_t)snprintf(buf, len, "%s", op_names[l->op]);
  }
}

void net_format(const net_desc *net, char *buf, size_t len) {
  if (len == 0) return;
  size_t used = (size_t)snprintf(buf, len, "name %s|input %dx%dx%d", net->name, net->c, net->h,
                                 net->w);
  for (int i = 0; i < net->count && used + 1 < len; i++) {
    buf[used++] = '|';
    buf[used] = '\0';
    used += format_layer(&net->layers[i], buf + used, len - used);
  }
}

/* --- layout ---------------------------------------------------------------- */

static ps_err add_tensor(tensor_layout *layout, const char *name, int rank, const long *shape,
                         tensor_init init, int trainable, ps_error *err) {
  if (tensor_layout_add(layout, name, rank, shape, err) != PS_ERR_OK) return err->code;
  tensor_layout_set_init(layout, layout->count - 1, init);
  tensor_layout_set_trainable(layout, layout->count - 1, trainable);
  return PS_ERR_OK;
}

static ps_err add_bn(tensor_layout *layout, int index, int channels, ps_error *err) {
  static const char *const parts[] = {"weight", "bias", "running_mean", "running_var"};
  static const tensor_init_kind inits[] = {TENSOR_INIT_ONES, TENSOR_INIT_ZEROS, TENSOR_INIT_ZEROS,
                                           TENSOR_INIT_ONES};
  char name[TENSOR_NAME_MAX];
  long shape[1] = {channels};
  for (int p = 0; p < 4; p++) {
    snprintf(name, sizeof name, "bn%d.%s", index, parts[p]);
    if (add_tensor(layout, name, 1, shape, (tensor_init){inits[p], 0}, p < 2, err) != PS_ERR_OK) {
      return err->code;
    }
  }
  return PS_ERR_OK;
}

ps_err net_build_layout(const net_desc *net, tensor_layout *layout, ps_error *err) {
  net_shape shapes[NET_MAX_LAYERS];
  if (net_check(net, shapes, err) != PS_ERR_OK) return err->code;
  int convs = 0, bns = 0, fcs = 0, last_fc = net->count - 1;
  char name[TENSOR_NAME_MAX];
  net_shape in = {net->c, net->h, net->w};
  for (int i = 0; i < net->count; i++) {
    const net_layer *l = &net->layers[i];
    /* A layer's input: the previous output, or the block's input after a shortcut line. */
    if (l->op == NET_CONV) {
      int fan_in = in.c * l->kh * l->kw;
      long w_shape[4] = {l->out, in.c, l->kh, l->kw}, b_shape[1] = {l->out};
      tensor_init he = {TENSOR_INIT_UNIFORM, (float)sqrt(6.0 / fan_in)};
      snprintf(name, sizeof name, "conv%d.weight", ++convs);
      if (add_tensor(layout, name, 4, w_shape, he, 1, err) != PS_ERR_OK) return err->code;
      snprintf(name, sizeof name, "conv%d.bias", convs);
      if (l->bias && add_tensor(layout, name, 1, b_shape, (tensor_init){TENSOR_INIT_ZEROS, 0}, 1,
                                err) != PS_ERR_OK) {
        return err->code;
      }
    } else if (l->op == NET_BN) {
      if (add_bn(layout, ++bns, in.c, err) != PS_ERR_OK) return err->code;
    } else if (l->op == NET_FC) {
      int fan_in = in.c * (in.h ? in.h : 1) * (in.w ? in.w : 1);
      long w_shape[2] = {l->out, fan_in}, b_shape[1] = {l->out};
      tensor_init init = {TENSOR_INIT_UNIFORM, (float)sqrt((i == last_fc ? 3.0 : 6.0) / fan_in)};
      snprintf(name, sizeof name, "fc%d.weight", ++fcs);
      if (add_tensor(layout, name, 2, w_shape, init, 1, err) != PS_ERR_OK) return err->code;
      snprintf(name, sizeof name, "fc%d.bias", fcs);
      if (add_tensor(layout, name, 1, b_shape, (tensor_init){TENSOR_INIT_ZEROS, 0}, 1, err) !=
          PS_ERR_OK) {
        return err->code;
      }
    }
    in = shapes[i];
    if (l->op == NET_SHORTCUT) {
      /* the shortcut path starts from the block's input */
      int b = i;
      while (net->layers[b].op != NET_BLOCK) b--;
      in = b == 0 ? (net_shape){net->c, net->h, net->w} : shapes[b - 1];
    }
  }
  return PS_ERR_OK;
}

/* --- built-ins ------------------------------------------------------------- */

ps_err net_builtin(const char *name, int c, int h, int w, net_desc *net, ps_error *err) {
  char text[NET_TEXT_MAX];
  if (net_builtin_text(name, c, h, w, text, sizeof text) != 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "no built-in network '%s' (%s)", name,
                        net_builtin_names());
  }
  char source[64];
  snprintf(source, sizeof source, "built-in network %s", name);
  return net_parse_text(text, '\n', source, net, err);
}
