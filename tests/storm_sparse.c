/* storm_client's sparse rows: a CTR request's valid SparseRows (keys the
 * target pserver owns) and their mutations, and the encoding of rows whose
 * counts do not match their keys. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>

#include "tests/storm.h"

const uint64_t *pick_keys(storm *s, int p, size_t n) {
  size_t from = (size_t)rng_below(&s->r, (uint64_t)(s->pool_n - n + 1));
  return s->pool + (size_t)p * s->pool_n + from;
}

/* Sets r's keys (and counts, 1..4 as a batch's repeats give) and sizes its
 * values for them. */
static void rows_set_keys(storm *s, storm_rows *r, const uint64_t *keys, size_t n) {
  memcpy(r->keys, keys, n * sizeof *keys);
  for (size_t i = 0; i < n; i++) r->counts[i] = 1 + (uint32_t)rng_below(&s->r, 4);
  r->n = r->count_n = n;
  r->value_count = r->table < (uint32_t)s->tables ? n * (size_t)s->dim[r->table] : n;
}

storm_rows *rows_add(storm *s, unsigned field, uint32_t table, const uint64_t *keys, size_t n) {
  storm_rows *r = &s->rows[s->row_count++];
  r->field = field;
  r->table = table;
  r->has_values = field == WIRE_SPARSE_GRADS;
  r->has_counts = field == WIRE_SPARSE_KEYS;
  rows_set_keys(s, r, keys, n);
  return r;
}

/* A random SparseRows of the request in `field` (0: any). */
static storm_rows *rows_pick(storm *s, unsigned field) {
  storm_rows *any[WIRE_MAX_SPARSE];
  int n = 0;
  for (int i = 0; i < s->row_count; i++) {
    if (field == 0 || s->rows[i].field == field) any[n++] = &s->rows[i];
  }
  return n > 0 ? any[rng_below(&s->r, (uint64_t)n)] : NULL;
}

/* At least min keys in r (fresh ones of pserver p when it has fewer). */
static void rows_at_least(storm *s, storm_rows *r, int p, size_t min) {
  if (r->n < min) rows_set_keys(s, r, pick_keys(s, p, min), min);
}

/* A key of r repeated later in it. */
static void duplicate_key(storm *s, storm_rows *r, int p) {
  rows_at_least(s, r, p, 2);
  size_t j = 1 + (size_t)rng_below(&s->r, r->n - 1);
  r->keys[j] = r->keys[rng_below(&s->r, j)];
}

void sparse_mutate(storm *s, int p, int kind) {
  rng *g = &s->r;
  storm_rows *r = rows_pick(s, kind == SMUT_VALUES_WIDTH ? WIRE_SPARSE_GRADS
                               : kind == SMUT_COUNTS_WIDTH || kind == SMUT_COUNT_ZERO
                                   ? WIRE_SPARSE_KEYS
                                   : 0);
  if (r == NULL) return; /* build() always writes the rows a kind needs */
  const int pservers = s->job.pservers;
  switch (kind) {
  case SMUT_TOO_MANY: /* one more than a batch can hold */
    rows_set_keys(s, r, pick_keys(s, p, s->max_keys + 1), s->max_keys + 1);
    break;
  case SMUT_FOREIGN_KEY:
    if (pservers > 1) {
      rows_at_least(s, r, p, 1);
      int other = (p + 1 + (int)rng_below(g, (uint64_t)pservers - 1)) % pservers;
      r->keys[rng_below(g, r->n)] = pick_keys(s, other, 1)[0];
    } else { /* one pserver owns every key */
      duplicate_key(s, r, p);
    }
    break;
  case SMUT_DUPLICATE_KEY:
    duplicate_key(s, r, p);
    break;
  case SMUT_VALUES_WIDTH: { /* a float more or less, a row more or less, or none */
    size_t want = r->value_count, dim = (size_t)s->dim[r->table];
    switch (rng_below(g, 4)) {
    case 0: r->value_count = want + 1; break;
    case 1: r->value_count = want > 0 ? want - 1 : want + dim; break;
    case 2: r->value_count = want >= dim ? want - dim : want + dim; break;
    default: r->value_count = want + dim * (1 + (size_t)rng_below(g, 4)); break;
    }
    if (rng_below(g, 8) == 0 && want > 0) r->value_count = 0;
    break;
  }
  case SMUT_COUNTS_WIDTH: /* never 0 counts: a lookup may leave them out */
    rows_at_least(s, r, p, 1);
    r->count_n = r->n >= 2 && rng_below(g, 2) ? r->n - 1 : r->n + 1 + (size_t)rng_below(g, 3);
    break;
  case SMUT_COUNT_ZERO:
    rows_at_least(s, r, p, 1);
    r->counts[rng_below(g, r->n)] = 0;
    break;
  case SMUT_TABLE_RANGE:
    r->table = rng_below(g, 2) ? (uint32_t)(s->tables + (int)rng_below(g, 4))
                               : (uint32_t)rng_next(g) | 0x80000000u;
    break;
  case SMUT_TABLE_TWICE: {
    /* Another of the field's rows renamed, or a copy of this one added. */
    storm_rows *other = NULL;
    for (int i = 0; i < s->row_count; i++) {
      if (&s->rows[i] != r && s->rows[i].field == r->field) other = &s->rows[i];
    }
    if (other != NULL && (s->row_count == WIRE_MAX_SPARSE || rng_below(g, 2))) {
      other->table = r->table;
      rows_set_keys(s, other, pick_keys(s, p, r->n), r->n);
    } else if (s->row_count < WIRE_MAX_SPARSE) {
      storm_rows *copy = rows_add(s, r->field, r->table, r->keys, r->n);
      memcpy(copy->counts, r->counts, r->n * sizeof *r->counts);
    }
    break;
  }
  case SMUT_WRONG_FIELD:
    r->field = r->field == WIRE_SPARSE_GRADS ? WIRE_SPARSE_KEYS : WIRE_SPARSE_GRADS;
    break;
  default:
    break;
  }
}

static size_t put_varint(uint8_t *b, uint64_t v) {
  size_t n = 0;
  for (; v >= 0x80; v >>= 7) b[n++] = (uint8_t)(v | 0x80);
  b[n++] = (uint8_t)v;
  return n;
}

static size_t varint_size(uint64_t v) {
  uint8_t b[10];
  return put_varint(b, v);
}

void append_rows(buf *out, const storm_rows *r, const float *values) {
  const void *data[3] = {r->keys, r->has_values ? values : NULL, r->has_counts ? r->counts : NULL};
  size_t lens[3] = {r->n * 8, r->value_count * 4, r->count_n * 4};
  size_t inner = 1 + varint_size(r->table);
  for (int i = 0; i < 3; i++) {
    if (data[i] != NULL) inner += 1 + varint_size(lens[i]) + lens[i];
  }
  buf_reserve(out, out->len + inner + 16);
  uint8_t *b = out->data + out->len;
  size_t n = 0;
  b[n++] = (uint8_t)(r->field << 3 | 2);
  n += put_varint(b + n, inner);
  b[n++] = 1 << 3 | 0;
  n += put_varint(b + n, r->table);
  for (int i = 0; i < 3; i++) {
    if (data[i] == NULL) continue;
    b[n++] = (uint8_t)((2 + i) << 3 | 2);
    n += put_varint(b + n, lens[i]);
    if (lens[i] > 0) memcpy(b + n, data[i], lens[i]);
    n += lens[i];
  }
  out->len += n;
}
