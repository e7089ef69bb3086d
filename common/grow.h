/* grow_array: one realloc'd array resized, its contents kept. */
#ifndef PSTRAIN_COMMON_GROW_H
#define PSTRAIN_COMMON_GROW_H

#include <stdint.h>
#include <stdlib.h>

/* Resizes the array *(void **)array to count elements of size bytes (at
 * least one, so a NULL array is allocated). Returns 0, leaving the array as
 * it was, when memory runs out or count * size overflows. */
static inline int grow_array(void *array, size_t count, size_t size) {
  void **ptr = array;
  if (count == 0) count = 1;
  if (size != 0 && count > SIZE_MAX / size) return 0;
  void *p = realloc(*ptr, count * size);
  if (p == NULL) return 0;
  *ptr = p;
  return 1;
}

#endif
