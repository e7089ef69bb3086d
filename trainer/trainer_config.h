/* The trainer's configuration: its option table (flags, environment
 * variables, --help) and the checked, parsed settings the rest of the
 * trainer reads. */
#ifndef PSTRAIN_TRAINER_TRAINER_CONFIG_H
#define PSTRAIN_TRAINER_TRAINER_CONFIG_H

#include <stdbool.h>
#include <stdio.h>

#include "common/endpoints.h"
#include "common/error.h"
#include "common/job.h"
#include "common/log.h"
#include "common/model.h"
#include "common/optimizer.h"
#include "common/options.h"
#include "common/sparse_table.h"
#include "common/tls.h"

/* Examples per evaluation batch: no backward pass, so larger than training's. */
#define TRAINER_EVAL_BATCH 2048

/* Raw option values, as the table fills them. */
typedef struct trainer_options {
  const char *mode;
  const char *update;
  const char *staleness; /* "" when not given */
  const char *geo_steps; /* "" when not given */
  const char *async_push;
  double slowdown;
  const char *pservers;
  long trainers;
  long id;
  long block_size;
  const char *wire_dtype;
  double connect_timeout;
  double rpc_timeout;
  double recover_timeout;
  bool overlap;
  bool prefetch; /* pserver mode with a disk tier: the next step's keys sent ahead */
  long max_steps;
  long shard_steps;
  const char *elastic;
  const char *token_file;
  const char *tls_cert, *tls_key, *tls_ca, *tls_server_name;
  const char *export_path;
  bool export_replicas; /* collective: every rank exports its replica (PATH.rankN) */
  const char *checkpoint_dir;
  long checkpoint_every;
  bool resume;
  long resume_step;
  const char *data;
  const char *data_format;
  const char *test_data;
  bool skip_bad_lines;
  long eval_every;
  const char *sparse_optimizer;
  double sparse_lr;
  double max_table_mb;
  long admit_after;
  long evict_after;
  const char *model;
  const char *model_file; /* a network's text; "" when --model names the model */
  long bn_group;
  long epochs;
  long batch;
  const char *optimizer;
  double lr;
  double weight_decay;
  double momentum;
  double beta1, beta2, epsilon;
  const char *lr_schedule;
  long lr_step_size;
  double lr_gamma;
  double min_lr;
  long seed;
  long threads;
  const char *device;
  long gpu;
  const char *metrics;
  const char *tensorboard; /* "" when off */
  const char *timeline;
  const char *timeline_steps;
  long train_samples;
  long test_samples;
  double progress_interval;
  const char *metrics_listen;
  const char *log_level;
  bool check_config;
} trainer_options;

/* Options plus what was parsed out of them. */
typedef struct trainer_settings {
  trainer_options opt;
  model_desc model;
  int pserver_mode;
  int collective_mode;
  update_mode update;
  wire_dtype wire_dtype;  /* f32 outside pserver mode */
  int staleness; /* --staleness (ssp only) */
  int geo_steps; /* --geo-steps (geo only) */
  int async_whole; /* --async-push whole (async and ssp only) */
  int elastic_min; /* --elastic MIN (0: a fixed count); MAX is opt.trainers */
  endpoint_list pservers; /* pserver mode */
  char token[256];        /* from --token-file; "" for none */
  tls_config tls;         /* the --tls-* paths (checked); all empty for plaintext */
  optimizer_config optimizer; /* total_steps is set once the data size is known */
  int criteo;                 /* --data is a Criteo TSV file (the CTR models' data) */
  int cifar;                  /* --data is a CIFAR-10 binary folder (else IDX, when not criteo) */
  char input_norm[PSTRAIN_INPUT_NORM_MAX]; /* the data's, once loaded (job.h) */
  sparse_optimizer_config sparse_opt; /* the CTR models' tables */
  log_level level;
  long timeline_first, timeline_last; /* --timeline-steps, both included */
  long timeline_every;                /* --timeline-steps A:B/K: K (else 1) */
  char metrics_addr[300];     /* --metrics-listen as HOST:PORT; "" when off */
} trainer_settings;

/* Fills settings from defaults, environment and argv, and checks them. On
 * OPTIONS_ERROR err says which flag or variable and why. */
options_result trainer_settings_load(trainer_settings *s, int argc, char **argv, ps_error *err);

void trainer_print_help(FILE *out);

/* "name=value ..." of every option, for the start-up log line. */
void trainer_settings_format(const trainer_settings *s, char *buf, size_t len);

#endif
