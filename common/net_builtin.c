/* The built-in networks as model-file text, so a built-in name and its
 * documented file are one network (same canonical text and hash). */
#include <stdio.h>
#include <string.h>

#include "common/net.h"

/* Appends printf-style text at *used; -1 once buf is full. */
#define PUT(...)                                                                        \
  do {                                                                                  \
    int n_ = snprintf(buf + *used, len - *used, __VA_ARGS__);                           \
    if (n_ < 0 || (size_t)n_ >= len - *used) return -1;                                \
    *used += (size_t)n_;                                                                \
  } while (0)

static int put_lenet(char *buf, size_t len, size_t *used) {
  PUT("# LeNet as in PaddlePaddle's MNIST tutorial\n");
  PUT("conv 20 5x5 pad 2\nrelu\nmaxpool 2x2\n");
  PUT("conv 20 5x5 pad 2\nrelu\nmaxpool 2x2\n");
  PUT("flatten\nfc 10\n");
  return 0;
}

/* A basic block of two 3x3 convolutions; a 1x1 convolution on the shortcut
 * where the shape changes (He et al.'s option B). */
static int put_block(char *buf, size_t len, size_t *used, int in, int out, int stride) {
  PUT("block\n");
  PUT("  conv %d 3x3 stride %d pad 1 nobias\n  bn\n  relu\n", out, stride);
  PUT("  conv %d 3x3 pad 1 nobias\n  bn\n", out);
  if (stride != 1 || in != out) PUT("shortcut\n  conv %d 1x1 stride %d nobias\n  bn\n", out, stride);
  PUT("end\nrelu\n");
  return 0;
}

/* Stages of `blocks` basic blocks over widths[], the first stage at stride 1. */
static int put_resnet(char *buf, size_t len, size_t *used, int stem_pad, const int *widths,
                      int stages, int blocks) {
  PUT("conv %d 3x3 pad %d nobias\nbn\nrelu\n", widths[0], stem_pad);
  int in = widths[0];
  for (int s = 0; s < stages; s++) {
    for (int b = 0; b < blocks; b++) {
      if (put_block(buf, len, used, in, widths[s], s > 0 && b == 0 ? 2 : 1) != 0) return -1;
      in = widths[s];
    }
  }
  PUT("avgpool\nfc 10\n");
  return 0;
}

static const char *const names[] = {"lenet", "resnet18", "resnet20"};

const char *net_builtin_names(void) { return "lenet, resnet18, resnet20"; }

int net_is_builtin(const char *name) {
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (strcmp(name, names[i]) == 0) return 1;
  }
  return 0;
}

int net_builtin_text(const char *name, int c, int h, int w, char *buf, size_t len) {
  size_t at = 0, *used = &at;
  if (!net_is_builtin(name) || len == 0) return -1;
  PUT("name %s\ninput %dx%dx%d\n", name, c, h, w);
  if (strcmp(name, "lenet") == 0) return put_lenet(buf, len, used);
  if (strcmp(name, "resnet20") == 0) {
    PUT("# ResNet-20 for CIFAR (He et al. 2016), 1x1 convolutions on changed shortcuts\n");
    static const int widths[] = {16, 32, 64};
    return put_resnet(buf, len, used, 1, widths, 3, 3);
  }
  /* ResNet-18 for small images: a 3x3 stem without pooling; smaller inputs
   * padded to 32x32 by the stem's padding (the same products as padding the
   * image with zeros first). */
  PUT("# ResNet-18 for 32x32 inputs (smaller ones padded to 32x32 by the stem)\n");
  int pad = h < 32 && h == w && (32 - h) % 2 == 0 ? 1 + (32 - h) / 2 : 1;
  static const int widths[] = {64, 128, 256, 512};
  return put_resnet(buf, len, used, pad, widths, 4, 2);
}
