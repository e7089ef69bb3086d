/* copy_row: one sparse row's floats. A libc call per row costs more than
 * copying the few bytes of a wide weight or a 16-float embedding: the usual
 * widths copy a constant size, which the compiler inlines. */
#ifndef PSTRAIN_COMMON_COPY_ROW_H
#define PSTRAIN_COMMON_COPY_ROW_H

#include <stddef.h>
#include <string.h>

static inline void copy_row(float *restrict dst, const float *restrict src, size_t dim) {
  switch (dim) {
  case 1: *dst = *src; break;
  case 8: memcpy(dst, src, 8 * sizeof(float)); break;
  case 16: memcpy(dst, src, 16 * sizeof(float)); break;
  case 32: memcpy(dst, src, 32 * sizeof(float)); break;
  default: memcpy(dst, src, dim * sizeof(float)); break;
  }
}

#endif
