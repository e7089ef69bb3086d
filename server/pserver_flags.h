/* The pserver daemon's flags: one table drives the long flags, their
 * environment variables (PSTRAIN_<NAME> unless named) and --help. */
#ifndef PSTRAIN_SERVER_PSERVER_FLAGS_H
#define PSTRAIN_SERVER_PSERVER_FLAGS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/options.h"

typedef struct pserver_options {
  long id;
  const char *pservers;
  long trainers;
  const char *listen;
  long port;
  long threads;
  double step_timeout;
  long log_every;
  long max_message_mb;
  long max_shard_mb;
  double max_table_mb;
  double table_memory_mb;
  long max_blocks;
  long max_registrations;
  double trainer_lease;
  const char *on_trainer_loss;
  const char *token_file;
  const char *tls_cert, *tls_key, *tls_ca;
  bool tls_check_trainer_id;
  bool insecure;
  const char *checkpoint_dir;
  const char *table_dir;
  long checkpoint_every;
  bool resume;
  bool resume_if_present;
  long resume_step;
  const char *timeline;
  const char *timeline_steps;
  const char *metrics_listen;
  const char *tensorboard;
  const char *log_level;
  bool check_config;
  /* hostile peers (docs/security.md "Hostile input") */
  long max_pending_calls;
  long max_receive_mb;
  long max_streams;
  double max_connection_idle;
  double max_connection_age;
  double keepalive;
  double shutdown_timeout;
} pserver_options;

extern const option_def pserver_option_table[];
extern const size_t pserver_option_count;

#endif
