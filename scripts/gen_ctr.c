/* gen_ctr: synthetic Criteo-format click logs (label, I1..I13, C1..C26) whose
 * labels come from a hidden model, so a trainer's test AUC can be compared
 * with the Bayes AUC (the AUC of the true probabilities). Not real data: the
 * marginals imitate Criteo Kaggle's (cardinalities, Zipf-like frequencies,
 * missing rates), the dependence structure is ours. See scripts/gen-ctr;
 * the output folder and its files are gen_ctr_out.c's. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rng.h"
#include "scripts/gen_ctr_out.h"

#define NI 13
#define NC 26
#define RANK 4        /* dimension of the interaction vectors */
#define NPAIRS 8
#define ZIPF_S 1.2    /* id frequency ~ 1 / (rank + 1)^ZIPF_S */
#define MIN_IDS 8     /* a field keeps at least min(cardinality, MIN_IDS) ids */

/* Criteo Kaggle's distinct values of C1..C26 (shared/data/criteo-sample/README.md). */
static const uint64_t kaggle_card[NC] = {1460,    583,   10131227, 2202608, 305, 24,      12517,
                                         633,     3,     93145,    5683,    8351593, 3194, 27,
                                         14992,   5461306, 10,     5652,    2173,    4,   7046547,
                                         18,      15,    286181,   105,     142572};
/* Missing rates; group > 0 fields go missing together (Criteo's C19, C20, C25,
 * C26 are empty on the same rows; so are I1 and I10). Estimated from the
 * 100-row sample and Criteo's published per-field rates. */
static const double cat_missing[NC] = {0, 0, .03, .03, 0, .11, 0, 0, 0, 0, 0, .03, 0,
                                       0, 0, .03, 0, 0, .44, .44, .03, .76, 0, .03, .44, .44};
static const int cat_group[NC] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                  0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1};
/* Count features: missing rate (group 2: I1 with I10), P(-1), P(0), and
 * log1p(x) ~ Normal(mu, sd) otherwise (heavy-tailed counts, x >= 1). */
typedef struct {
  double missing, neg, zero, mu, sd;
  int group;
} int_spec;
static const int_spec int_fields[NI] = {
    {.45, 0, .40, 1.7, .96, 2}, {0, .11, .12, 3.3, 2.0, 0},   {.21, 0, .02, 2.0, 1.1, 0},
    {.22, 0, .02, 1.7, .8, 0},  {.03, 0, .03, 7.6, 2.7, 0},   {.22, 0, .05, 3.5, 1.6, 0},
    {.04, 0, .22, 2.3, 1.2, 0}, {.01, 0, .16, 2.2, .9, 0},    {.04, 0, .02, 3.7, 1.5, 0},
    {.45, 0, .40, .8, .3, 2},   {.04, 0, .22, 1.3, .75, 0},   {.76, 0, .78, .83, .28, 0},
    {.22, 0, .04, 1.8, .9, 0}};

/* The hidden model. logit = bias + sum_f w_f(id) + sum_pairs gamma u_f(id).v_g(id)
 * + dense(d), d_j = log1p(I_j) (0 when missing or <= 0), what a model sees. */
static const double W_SIGMA = 0.5;   /* per-id weight scale (times a per-field factor) */
static const double W_K = 50;        /* weights shrink as (1 + rank / W_K)^-W_ALPHA */
static const double W_ALPHA = 1.0;
static const double INT_GAMMA = 0.35; /* interaction strength per pair */
static const double INT_K = 5;       /* interaction vectors shrink with rank faster */
static const double INT_ALPHA = 1.0;
static const double DENSE_GAMMA = 0.65;
static const int pairs[NPAIRS][2] = {{0, 1}, {4, 6}, {5, 10}, {7, 12}, {13, 14}, {16, 17}, {1, 9}, {22, 23}};
static const double TARGET_CTR = 0.25;

typedef struct {
  uint64_t n;          /* ids in this field */
  uint32_t *thr;       /* alias method: keep slot i when low 32 bits < thr[i] */
  uint32_t *alias;     /* else take alias[i] */
  uint32_t *hex;       /* the 32-bit value its 8 hex digits spell, per rank */
  float *w;            /* per-id weight */
  float *vec;          /* [n][RANK] interaction vectors, or NULL */
  uint32_t *count;     /* occurrences in the training file */
} field;

typedef struct {
  uint64_t seed, train_rows, test_rows;
  double scale;
  const char *out;
  int gzip, write_probs;
  field f[NC];
  double field_sigma[NC], bias;
} gen;

typedef struct {
  int label, cat_missing[NC], int_missing[NI];
  uint32_t rank[NC];
  int64_t x[NI];
  double logit_main, logit;  /* main effects alone; everything */
} row;

static double uniform_at(uint64_t seed, uint64_t stream, uint64_t i) {
  return ((double)(rng_mix64(rng_mix64(seed ^ rng_mix64(stream)) + i) >> 11) + 0.5) * 0x1p-53;
}
static double normal_at(uint64_t seed, uint64_t stream, uint64_t i) {
  double u1 = uniform_at(seed, stream, 2 * i), u2 = uniform_at(seed, stream, 2 * i + 1);
  return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}
static double uniform(rng *r) { return ((double)(rng_next(r) >> 11) + 0.5) * 0x1p-53; }
static double normal(rng *r) {
  double u1 = uniform(r), u2 = uniform(r);
  return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}
/* A bijection of 32-bit values keyed by k (murmur3's finalizer is one), so
 * the hex values of one field never collide. */
static uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  return h ^ (h >> 16);
}

/* Vose's alias method over Zipf weights: O(1) per draw. */
static void build_alias(field *f) {
  uint64_t n = f->n;
  double *p = xmalloc(n * sizeof *p), sum = 0;
  for (uint64_t i = 0; i < n; i++) sum += p[i] = pow((double)(i + 1), -ZIPF_S);
  uint32_t *small = xmalloc(n * sizeof *small), *large = xmalloc(n * sizeof *large);
  uint64_t ns = 0, nl = 0;
  for (uint64_t i = 0; i < n; i++) {
    p[i] *= (double)n / sum;
    if (p[i] < 1) small[ns++] = (uint32_t)i;
    else large[nl++] = (uint32_t)i;
  }
  f->thr = xmalloc(n * sizeof *f->thr);
  f->alias = xmalloc(n * sizeof *f->alias);
  while (ns > 0 && nl > 0) {
    uint32_t s = small[--ns], l = large[nl - 1];
    f->thr[s] = (uint32_t)(p[s] * 4294967296.0);
    f->alias[s] = l;
    p[l] -= 1 - p[s];
    if (p[l] < 1) {
      nl--;
      small[ns++] = l;
    }
  }
  /* Left-overs have probability 1 up to rounding. */
  while (nl > 0) f->thr[large[--nl]] = UINT32_MAX, f->alias[large[nl]] = large[nl];
  while (ns > 0) f->thr[small[--ns]] = UINT32_MAX, f->alias[small[ns]] = small[ns];
  free(p);
  free(small);
  free(large);
}

static int pair_field(int fi) {
  for (int p = 0; p < NPAIRS; p++)
    if (pairs[p][0] == fi || pairs[p][1] == fi) return 1;
  return 0;
}

static void build_model(gen *g) {
  for (int fi = 0; fi < NC; fi++) {
    field *f = &g->f[fi];
    uint64_t floor_ids = kaggle_card[fi] < MIN_IDS ? kaggle_card[fi] : MIN_IDS;
    f->n = (uint64_t)ceil((double)kaggle_card[fi] * g->scale);
    if (f->n < floor_ids) f->n = floor_ids;
    build_alias(f);
    uint64_t k = rng_mix64(g->seed * 0x100 + (uint64_t)fi);
    f->hex = xmalloc(f->n * sizeof *f->hex);
    f->w = xmalloc(f->n * sizeof *f->w);
    f->count = xmalloc(f->n * sizeof *f->count);
    /* Fields differ in how much they tell: a factor in [0.3, 1.3). */
    g->field_sigma[fi] = W_SIGMA * (0.3 + uniform_at(g->seed, 1000, (uint64_t)fi));
    for (uint64_t r = 0; r < f->n; r++) {
      f->hex[r] = fmix32(fmix32((uint32_t)r ^ (uint32_t)k) ^ (uint32_t)(k >> 32));
      double shrink = pow(1 + (double)r / W_K, -W_ALPHA);
      f->w[r] = (float)(g->field_sigma[fi] * shrink * normal_at(g->seed, 2000 + (uint64_t)fi, r));
    }
    if (pair_field(fi)) {
      f->vec = xmalloc(f->n * RANK * sizeof *f->vec);
      for (uint64_t r = 0; r < f->n; r++) {
        double shrink = pow(1 + (double)r / INT_K, -INT_ALPHA) / sqrt(RANK);
        for (int d = 0; d < RANK; d++)
          f->vec[r * RANK + (uint64_t)d] =
              (float)(shrink * normal_at(g->seed, 3000 + (uint64_t)fi, r * RANK + (uint64_t)d));
      }
    }
  }
}

/* The nonlinear part from count features: bounded, non-monotone pieces. */
static double dense_part(const double *d) {
  double h = 1.2 * tanh(1.5 * (d[0] - 1.0)) - 0.9 * cos(1.4 * d[2]) +
             0.8 * tanh(d[6] - 2.0) * tanh(2.0 * (d[10] - 1.0)) + 0.7 * exp(-0.5 * (d[4] - 7.0) * (d[4] - 7.0)) -
             0.5 * tanh(d[1] - 3.0);
  return DENSE_GAMMA * h;
}

static void sample_row(const gen *g, rng *r, row *out, int with_label) {
  int group_missing[3] = {0, 0, 0};
  group_missing[1] = uniform(r) < 0.44;  /* C19, C20, C25, C26 */
  group_missing[2] = uniform(r) < 0.45;  /* I1, I10 */
  double logit = 0, d[NI];
  for (int fi = 0; fi < NC; fi++) {
    const field *f = &g->f[fi];
    int miss = cat_group[fi] ? group_missing[cat_group[fi]]
                             : cat_missing[fi] > 0 && uniform(r) < cat_missing[fi];
    out->cat_missing[fi] = miss;
    if (miss) continue;
    uint64_t x = rng_next(r);
    uint32_t slot = (uint32_t)(((x >> 32) * f->n) >> 32);
    uint32_t rank = (uint32_t)x < f->thr[slot] ? slot : f->alias[slot];
    out->rank[fi] = rank;
    logit += f->w[rank];
  }
  out->logit_main = logit;
  for (int p = 0; p < NPAIRS; p++) {
    int a = pairs[p][0], b = pairs[p][1];
    if (out->cat_missing[a] || out->cat_missing[b]) continue;
    const float *u = g->f[a].vec + (uint64_t)out->rank[a] * RANK, *v = g->f[b].vec + (uint64_t)out->rank[b] * RANK;
    double dot = 0;
    for (int k = 0; k < RANK; k++) dot += (double)u[k] * v[k];
    logit += INT_GAMMA * dot;
  }
  for (int j = 0; j < NI; j++) {
    const int_spec *s = &int_fields[j];
    int miss = s->group ? group_missing[s->group] : s->missing > 0 && uniform(r) < s->missing;
    out->int_missing[j] = miss;
    d[j] = 0;
    if (miss) continue;
    double u = uniform(r);
    if (u < s->neg) {
      out->x[j] = -1;
    } else if (u < s->neg + s->zero) {
      out->x[j] = 0;
    } else {
      double lx = s->mu + s->sd * normal(r);
      double x = floor(expm1(lx > 20 ? 20 : lx) + 0.5);
      out->x[j] = x < 1 ? 1 : (int64_t)x;
      d[j] = log1p((double)out->x[j]);
    }
  }
  out->logit = logit + dense_part(d);
  if (with_label) {
    double p = 1 / (1 + exp(-(g->bias + out->logit)));
    out->label = uniform(r) < p;
  }
}

/* Bias for TARGET_CTR positives on average, by bisection over a calibration
 * sample from its own stream (so it does not disturb the files' streams). */
static void calibrate(gen *g) {
  enum { N = 100000 };
  double *z = xmalloc(N * sizeof *z);
  rng r;
  rng_seed(&r, g->seed, 7);
  row rw;
  for (int i = 0; i < N; i++) sample_row(g, &r, &rw, 0), z[i] = rw.logit;
  double lo = -20, hi = 20;
  for (int it = 0; it < 60; it++) {
    double mid = (lo + hi) / 2, sum = 0;
    for (int i = 0; i < N; i++) sum += 1 / (1 + exp(-(mid + z[i])));
    if (sum / N < TARGET_CTR) lo = mid;
    else hi = mid;
  }
  g->bias = (lo + hi) / 2;
  free(z);
}

/* --- rows as text, formatted by hand into the output buffer -------------- */

enum { ROW_MAX = 512 };

static char *put_u64(char *p, uint64_t v) {
  char tmp[24];
  int n = 0;
  do tmp[n++] = (char)('0' + v % 10), v /= 10;
  while (v != 0);
  while (n > 0) *p++ = tmp[--n];
  return p;
}

static char *format_row(char *p, const gen *g, const row *r) {
  static const char hexdig[] = "0123456789abcdef";
  *p++ = (char)('0' + r->label);
  for (int j = 0; j < NI; j++) {
    *p++ = '\t';
    if (r->int_missing[j]) continue;
    if (r->x[j] < 0) *p++ = '-', p = put_u64(p, (uint64_t)(-r->x[j]));
    else p = put_u64(p, (uint64_t)r->x[j]);
  }
  for (int fi = 0; fi < NC; fi++) {
    *p++ = '\t';
    if (r->cat_missing[fi]) continue;
    uint32_t v = g->f[fi].hex[r->rank[fi]];
    for (int s = 28; s >= 0; s -= 4) *p++ = hexdig[(v >> s) & 15];
  }
  *p++ = '\n';
  return p;
}

/* --- statistics ---------------------------------------------------------- */

typedef struct {
  double score;
  int label;
} scored;

static int by_score(const void *a, const void *b) {
  double x = ((const scored *)a)->score, y = ((const scored *)b)->score;
  return (x > y) - (x < y);
}

/* Exact AUC from ranks, tied scores sharing their average rank; sorts s.
 * Negative when one class is absent. */
static double auc(scored *s, uint64_t n) {
  qsort(s, n, sizeof *s, by_score);
  double pos = 0, rank_sum = 0;
  for (uint64_t i = 0; i < n;) {
    uint64_t j = i, npos = 0;
    while (j < n && s[j].score == s[i].score) npos += (uint64_t)s[j++].label;
    rank_sum += (double)npos * ((double)(i + 1) + (double)j) / 2;
    pos += (double)npos;
    i = j;
  }
  double neg = (double)n - pos;
  if (pos == 0 || neg == 0) return -1;
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

static int by_count_desc(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x < y) - (x > y);
}

/* Share of the training file's non-missing occurrences carried by the top 5%
 * of the ids it holds, all fields pooled. */
static double top_share(const gen *g) {
  uint64_t seen = 0, total = 0, top = 0;
  for (int fi = 0; fi < NC; fi++)
    for (uint64_t r = 0; r < g->f[fi].n; r++) seen += g->f[fi].count[r] != 0;
  uint32_t *c = xmalloc(seen * sizeof *c);
  uint64_t k = 0;
  for (int fi = 0; fi < NC; fi++)
    for (uint64_t r = 0; r < g->f[fi].n; r++)
      if (g->f[fi].count[r] != 0) c[k++] = g->f[fi].count[r];
  qsort(c, seen, sizeof *c, by_count_desc);
  uint64_t ntop = (seen + 19) / 20;
  for (uint64_t i = 0; i < seen; i++) {
    total += c[i];
    if (i < ntop) top += c[i];
  }
  free(c);
  return total ? (double)top / (double)total : 0;
}

/* --- command line and main ----------------------------------------------- */

static const char usage[] =
    "usage: gen-ctr --out DIR [options]\n"
    "Writes DIR/train.tsv and DIR/test.tsv: Criteo-format rows (label, I1..I13, C1..C26)\n"
    "labelled by a hidden model; prints one JSON line with the test set's Bayes AUC.\n"
    "  --out DIR          output folder (created if missing; its parent must exist)\n"
    "  --train-rows N     training rows (default 2000000)\n"
    "  --test-rows N      test rows (default 200000)\n"
    "  --scale S          Criteo Kaggle's cardinalities times S, 0 < S <= 1 (default 0.01)\n"
    "  --seed K           seed of the hidden model and the rows (default 1)\n"
    "  --gzip             write train.tsv.gz and test.tsv.gz\n"
    "  --write-probs      also write DIR/test.probs, the true probability of each test row\n"
    "  --help             this text\n";

static void bad_flag(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void bad_flag(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("gen-ctr: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs(" (see --help)\n", stderr);
  va_end(ap);
  exit(2);
}

static uint64_t parse_count(const char *flag, const char *s, uint64_t min, uint64_t max) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (*s == '\0' || *s == '-' || *s == '+' || *end != '\0' || errno != 0)
    bad_flag("%s: '%s' is not a non-negative integer", flag, s);
  if (v < min || v > max) bad_flag("%s: %s is outside [%llu, %llu]", flag, s, (unsigned long long)min,
                                   (unsigned long long)max);
  return (uint64_t)v;
}

static void parse_flags(gen *g, int argc, char **argv) {
  static const struct option opts[] = {
      {"out", required_argument, 0, 'o'},       {"train-rows", required_argument, 0, 'r'},
      {"test-rows", required_argument, 0, 't'}, {"scale", required_argument, 0, 's'},
      {"seed", required_argument, 0, 'k'},      {"gzip", no_argument, 0, 'z'},
      {"write-probs", no_argument, 0, 'p'},     {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  g->train_rows = 2000000, g->test_rows = 200000, g->scale = 0.01, g->seed = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    char *end;
    switch (c) {
      case 'o': g->out = optarg; break;
      case 'r': g->train_rows = parse_count("--train-rows", optarg, 1, (uint64_t)1 << 40); break;
      case 't': g->test_rows = parse_count("--test-rows", optarg, 1, (uint64_t)1 << 31); break;
      case 'k': g->seed = parse_count("--seed", optarg, 0, UINT64_MAX); break;
      case 'z': g->gzip = 1; break;
      case 'p': g->write_probs = 1; break;
      case 'h': fputs(usage, stdout); exit(0);
      case 's':
        errno = 0;
        g->scale = strtod(optarg, &end);
        if (*optarg == '\0' || *end != '\0' || errno != 0 || !(g->scale > 0 && g->scale <= 1))
          bad_flag("--scale: '%s' is not a number in (0, 1]", optarg);
        break;
      default:
        if (optopt != 0) bad_flag("option '%s' needs a value", argv[optind - 1]);
        bad_flag("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) bad_flag("unexpected argument '%s'", argv[optind]);
  if (g->out == NULL) bad_flag("--out DIR is required");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  static gen g;
  parse_flags(&g, argc, argv);
  prepare_out(g.out);
  double t0 = now_s();
  build_model(&g);
  calibrate(&g);
  double t1 = now_s();

  out_file train, test;
  out_open(&train, g.out, g.gzip ? "train.tsv.gz" : "train.tsv", g.gzip, 0);
  out_open(&test, g.out, g.gzip ? "test.tsv.gz" : "test.tsv", g.gzip, 1);
  scored *bayes = xmalloc(g.test_rows * sizeof *bayes), *main_fx = xmalloc(g.test_rows * sizeof *main_fx);
  double *probs = xmalloc(g.test_rows * sizeof *probs);
  uint64_t train_pos = 0, test_pos = 0;
  double logloss = 0;
  row r;
  rng stream;
  rng_seed(&stream, g.seed, 1);
  for (uint64_t i = 0; i < g.train_rows; i++) {
    sample_row(&g, &stream, &r, 1);
    train_pos += (uint64_t)r.label;
    for (int fi = 0; fi < NC; fi++)
      if (!r.cat_missing[fi] && g.f[fi].count[r.rank[fi]] < UINT32_MAX) g.f[fi].count[r.rank[fi]]++;
    if (train.len + ROW_MAX > OUT_BUF_SIZE) out_flush(&train, 0);
    train.len = (size_t)(format_row(train.buf + train.len, &g, &r) - train.buf);
  }
  rng_seed(&stream, g.seed, 2);
  for (uint64_t i = 0; i < g.test_rows; i++) {
    sample_row(&g, &stream, &r, 1);
    double p = 1 / (1 + exp(-(g.bias + r.logit)));
    probs[i] = p;
    bayes[i] = (scored){p, r.label};
    main_fx[i] = (scored){r.logit_main, r.label};
    test_pos += (uint64_t)r.label;
    logloss -= r.label ? log(p) : log1p(-p);
    if (test.len + ROW_MAX > OUT_BUF_SIZE) out_flush(&test, 1);
    test.len = (size_t)(format_row(test.buf + test.len, &g, &r) - test.buf);
  }
  out_close(&train, 0);
  out_close(&test, 1);
  if (g.write_probs) {
    out_file pf;
    out_open(&pf, g.out, "test.probs", 0, 2);
    for (uint64_t i = 0; i < g.test_rows; i++) {
      if (pf.len + 64 > OUT_BUF_SIZE) out_flush(&pf, 2);
      pf.len += (size_t)snprintf(pf.buf + pf.len, 64, "%.17g\n", probs[i]);
    }
    out_close(&pf, 2);
    out_commit(&pf, 2);
  }
  out_commit(&train, 0);
  out_commit(&test, 1);
  out_sync_folder(g.out);
  double t2 = now_s();

  printf("{\"train_rows\":%llu,\"test_rows\":%llu,\"scale\":%g,\"seed\":%llu,\"train_positive_fraction\":%.5f,"
         "\"test_positive_fraction\":%.5f,\"bias\":%.4f,\"ids_per_field\":[",
         (unsigned long long)g.train_rows, (unsigned long long)g.test_rows, g.scale, (unsigned long long)g.seed,
         (double)train_pos / (double)g.train_rows, (double)test_pos / (double)g.test_rows, g.bias);
  for (int fi = 0; fi < NC; fi++) printf("%s%llu", fi ? "," : "", (unsigned long long)g.f[fi].n);
  printf("],\"distinct_ids_train\":[");
  uint64_t all = 0;
  for (int fi = 0; fi < NC; fi++) {
    uint64_t seen = 0;
    for (uint64_t k = 0; k < g.f[fi].n; k++) seen += g.f[fi].count[k] != 0;
    all += seen;
    printf("%s%llu", fi ? "," : "", (unsigned long long)seen);
  }
  printf("],\"distinct_ids_train_total\":%llu,\"top5pct_ids_share\":%.4f,\"bayes_auc\":%.5f,"
         "\"bayes_logloss\":%.5f,\"main_effects_auc\":%.5f,\"seconds\":%.3f,\"rows_per_s\":%.0f}\n",
         (unsigned long long)all, top_share(&g), auc(bayes, g.test_rows), logloss / (double)g.test_rows,
         auc(main_fx, g.test_rows), t2 - t0, (double)(g.train_rows + g.test_rows) / (t2 - t1));
  if (fflush(stdout) != 0) die(1, "writing the summary: %s", strerror(errno));
  free(bayes);
  free(main_fx);
  free(probs);
  return 0;
}
