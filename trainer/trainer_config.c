/* The trainer's option table and the checks that run before any work. */
#define _POSIX_C_SOURCE 200809L
#include "trainer/trainer_config.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/timeline.h"
#include "common/metrics_http.h"
#include "common/token.h"
#include "trainer/data/cifar.h"
#include "trainer/data/ctr_reader.h"

#define OFF(field) offsetof(trainer_options, field)
#define NUM(lo, hi) .min = (lo), .max = (hi)
#define ANY .min = 1, .max = 0

static const option_def trainer_option_table[] = {
    {"mode", NULL, OPT_CHOICE, OFF(mode), "local",
     "local: one process; pserver: push gradients to and pull weights from --pservers; "
     "collective: all-reduce gradients over MPI (start with mpirun or scripts/launch)",
     "local|pserver|collective", ANY},
    {"update", NULL, OPT_CHOICE, OFF(update), "sync",
     "pserver mode: sync (every step waits for all trainers), async (never waits), ssp "
     "(waits while more than --staleness steps ahead of the slowest) or geo (GEO-SGD: the "
     "optimizer runs here; every --geo-steps steps the change since the last exchange goes to "
     "the pservers, which add it / trainers, and the fresh values come back)",
     UPDATE_MODE_CHOICES, ANY},
    {"staleness", NULL, OPT_STRING, OFF(staleness), "",
     "--update ssp: steps a trainer may run ahead of the slowest (0: sync's semantics; "
     "needed with ssp, refused without)", NULL, ANY},
    {"geo-steps", NULL, OPT_STRING, OFF(geo_steps), "",
     "--update geo: local steps between exchanges with the pservers (1..1000000; needed with "
     "geo, refused without)", NULL, ANY},
    {"async-push", NULL, OPT_CHOICE, OFF(async_push), "mean",
     "--update async or ssp: each push scaled 1/--trainers, so the trainers' pushes together "
     "make one step the size of sync's (mean), or applied whole, as PaddlePaddle and "
     "TensorFlow do (whole: a recipe ported from them converges here as there)",
     "mean|whole", ANY},
    {"shard-steps", NULL, OPT_INT, OFF(shard_steps), "0",
     "pserver mode: pserver 0 hands the data out in shards of this many batches, each "
     "trained exactly once by whichever trainer takes it (a faster trainer takes more; a "
     "killed trainer's shard goes on from where the pservers applied it; sync: a trainer "
     "joins the steps while it has data); 0: each trainer takes a fixed 1/--trainers share",
     NULL, NUM(0, PSTRAIN_MAX_SHARD_STEPS)},
    {"elastic", NULL, OPT_STRING, OFF(elastic), "",
     "MIN:MAX: trainers may join and leave the running job (pserver mode with --shard-steps): "
     "each asks pserver 0 for an id below MAX (no --id, --trainers; pservers take --trainers "
     "MAX); below MIN the job waits", NULL, ANY},
    {"slowdown", NULL, OPT_DOUBLE, OFF(slowdown), "1",
     "make each step take this many times as long (sleeps after the step's compute; a "
     "straggler for tests and benchmarks)", NULL, NUM(1, 1000)},
    {"pservers", "PADDLE_PSERVERS_IP_PORT_LIST", OPT_STRING, OFF(pservers), "",
     "pserver mode: every pserver's HOST:PORT, comma-separated, in the same order everywhere",
     NULL, ANY},
    {"trainers", "PADDLE_TRAINERS_NUM", OPT_INT, OFF(trainers), "-1",
     "pserver mode: trainers in the job (-1: SLURM_NTASKS under srun, else 1)", NULL,
     NUM(-1, PSTRAIN_MAX_TRAINERS)},
    {"id", "PADDLE_TRAINER_ID", OPT_INT, OFF(id), "-1",
     "pserver mode: this trainer's id, 0..N-1 (-1: SLURM_PROCID under srun, else 0)", NULL,
     NUM(-1, PSTRAIN_MAX_TRAINERS - 1)},
    {"block-size", NULL, OPT_INT, OFF(block_size), "32768",
     "pserver mode: most floats per block of the shard map", NULL, NUM(1, 1 << 26)},
    {"wire-dtype", NULL, OPT_CHOICE, OFF(wire_dtype), "f32",
     "pserver mode: element type of dense gradients and parameters on the wire (bf16, fp16: "
     "half the bytes; pservers keep float32)", WIRE_DTYPE_CHOICES, ANY},
    {"connect-timeout", NULL, OPT_DOUBLE, OFF(connect_timeout), "60",
     "pserver mode: seconds to wait for every pserver to come up", NULL, NUM(0.1, 1e7)},
    {"rpc-timeout", NULL, OPT_DOUBLE, OFF(rpc_timeout), "300",
     "pserver mode: seconds one push-pull may take (a sync step waits for every trainer)", NULL,
     NUM(0.1, 1e7)},
    {"overlap", NULL, OPT_BOOL, OFF(overlap), "false",
     "pserver sync mode, CPU backend: push each layer's gradients as soon as backward has them, "
     "overlapping communication with the rest of backward (off: one push per pserver at the end "
     "of the step; on loopback with all cores busy it costs more than it hides)", NULL, ANY},
    {"prefetch", NULL, OPT_BOOL, OFF(prefetch), "true",
     "pserver mode, CTR models, pservers with a disk tier (--table-dir): send each step's next "
     "keys ahead (PULL_PREFETCH), so the pservers read those rows from disk while this trainer "
     "computes (false: its push brings them; where trainer and pserver share a machine's few "
     "cores and the reads come from the page cache, the ahead reads cost ~5%)", NULL, ANY},
    {"recover-timeout", NULL, OPT_DOUBLE, OFF(recover_timeout), "120",
     "pserver mode: seconds to wait for a lost or restarted pserver to come back before "
     "failing (0: fail at once)", NULL, NUM(0, 1e7)},
    {"token-file", NULL, OPT_STRING, OFF(token_file), "",
     "pserver mode: file whose first line is the job's shared secret (sent as a bearer token)",
     NULL, ANY},
    {"tls-ca", NULL, OPT_STRING, OFF(tls_ca), "",
     "pserver mode: talk TLS, verifying the pservers' certificates against this CA (PEM)", NULL,
     ANY},
    {"tls-cert", NULL, OPT_STRING, OFF(tls_cert), "",
     "pserver mode, with --tls-ca: this trainer's certificate (PEM), for pservers that require "
     "one (CN or SAN trainer-<id>)", NULL, ANY},
    {"tls-key", NULL, OPT_STRING, OFF(tls_key), "", "pserver mode: the private key of --tls-cert",
     NULL, ANY},
    {"tls-server-name", NULL, OPT_STRING, OFF(tls_server_name), "",
     "pserver mode, with --tls-ca: the name the pservers' certificates must carry (default: the "
     "host of each --pservers entry)", NULL, ANY},
    {"max-steps", NULL, OPT_INT, OFF(max_steps), "0",
     "stop after this many steps (0: run all epochs)", NULL, NUM(0, 1e15)},
    {"checkpoint-dir", NULL, OPT_STRING, OFF(checkpoint_dir), "",
     "local and collective mode: trainer 0 writes checkpoints of the whole model here (pserver "
     "mode: the pservers' --checkpoint-dir)", NULL, ANY},
    {"checkpoint-every", NULL, OPT_INT, OFF(checkpoint_every), "0",
     "steps between checkpoints (0: only at the end)", NULL, NUM(0, 1e15)},
    {"resume", NULL, OPT_BOOL, OFF(resume), "false",
     "start from the newest checkpoint in --checkpoint-dir (refused if missing, corrupt or "
     "another job's)", NULL, ANY},
    {"resume-step", NULL, OPT_INT, OFF(resume_step), "-1",
     "with --resume: the checkpoint of this step (-1: the newest)", NULL, NUM(-1, 1e15)},
    {"export", NULL, OPT_STRING, OFF(export_path), "",
     "write the trained model to this safetensors file (fc1.weight (out, in), fc1.bias, ...)",
     NULL, ANY},
    {"export-replicas", NULL, OPT_BOOL, OFF(export_replicas), "false",
     "with --export in collective mode (CTR models), every rank writes its replica too, as "
     "PATH.rankN beside rank 0's PATH: to check that the replicas agree", NULL, ANY},
    {"data", NULL, OPT_STRING, OFF(data), "/usr/share/datasets/fashion-mnist",
     "training data: a folder of IDX files (train-* and t10k-*, gzip'd or plain) or of CIFAR-10 "
     "binary batches (data_batch_1..5.bin, test_batch.bin) for mlp, or a Criteo TSV file (plain "
     "or gzip'd) for ctr and lr", NULL, ANY},
    {"data-format", NULL, OPT_CHOICE, OFF(data_format), "auto",
     "format of --data (auto: Criteo TSV when the file's first line has 40 tab-separated fields, "
     "CIFAR-10 when the folder holds data_batch_1.bin, else IDX)", "auto|idx|criteo|cifar", ANY},
    {"test-data", NULL, OPT_STRING, OFF(test_data), "",
     "ctr and lr: a Criteo TSV file to evaluate on (AUC and logloss); empty: no evaluation", NULL,
     ANY},
    {"skip-bad-lines", NULL, OPT_BOOL, OFF(skip_bad_lines), "false",
     "Criteo data: count and skip malformed lines instead of stopping at the first", NULL, ANY},
    {"eval-every", NULL, OPT_INT, OFF(eval_every), "0",
     "ctr and lr: also evaluate every N steps, mid-epoch (0: after each epoch only)", NULL,
     NUM(0, 1e15)},
    {"model", NULL, OPT_STRING, OFF(model), "mlp:784,256,128,10",
     "model: mlp:INPUTS,HIDDEN...,CLASSES (ReLU hidden layers); ctr:DIM:H1,H2,... (Wide&Deep on "
     "Criteo data: DIM-wide embeddings, ReLU layers H1, H2, ...); deepfm:DIM:H1,H2,... (DeepFM: "
     "Wide&Deep plus a factorization machine over the embeddings); lr (logistic regression); "
     "lenet, resnet18, resnet20 (convolutional networks over the images)", NULL, ANY},
    {"model-file", NULL, OPT_STRING, OFF(model_file), "",
     "a convolutional network described in a file, one layer a line (docs/models-and-data.md: "
     "Convolutional networks); instead of --model", NULL, ANY},
    {"bn-group", NULL, OPT_INT, OFF(bn_group), "0",
     "networks: batch-norm statistics per group of N examples of the batch (\"ghost batch "
     "norm\"; --batch N*G in local mode normalizes as G sync trainers of --batch N do; 0: the "
     "whole batch)", NULL, NUM(0, 65536)},
    {"sparse-optimizer", NULL, OPT_CHOICE, OFF(sparse_optimizer), "adagrad",
     "ctr and lr: update rule of the sparse tables (adagrad: one accumulator per row)",
     SPARSE_OPTIMIZER_CHOICES, ANY},
    {"sparse-lr", NULL, OPT_DOUBLE, OFF(sparse_lr), "0.05",
     "ctr and lr: learning rate of the sparse tables", NULL, NUM(1e-12, 1e6)},
    {"max-table-mb", NULL, OPT_DOUBLE, OFF(max_table_mb), "0",
     "ctr and lr: most memory per sparse table, MiB; reaching it stops the job unless "
     "--evict-after is set (0: no limit)", NULL, NUM(0, 1e9)},
    {"admit-after", NULL, OPT_INT, OFF(admit_after), "0",
     "ctr and lr: a feature gets a row at its N-th occurrence; before that it reads zeros "
     "(0: at once)", NULL, NUM(0, 255)},
    {"evict-after", NULL, OPT_INT, OFF(evict_after), "0",
     "ctr and lr: drop rows unseen for this many steps (0: never)", NULL, NUM(0, 1e15)},
    {"epochs", NULL, OPT_INT, OFF(epochs), "0",
     "passes over the training data (0: 12 for mlp, 1 for ctr and lr)", NULL, NUM(0, 100000)},
    {"batch", NULL, OPT_INT, OFF(batch), "0",
     "mini-batch size per trainer (0: 64 for mlp, 512 for ctr and lr)", NULL, NUM(0, 65536)},
    {"optimizer", NULL, OPT_CHOICE, OFF(optimizer), "adam", "update rule", OPTIMIZER_CHOICES, ANY},
    {"lr", NULL, OPT_DOUBLE, OFF(lr), "0.001", "learning rate", NULL, NUM(1e-12, 1e6)},
    {"weight-decay", NULL, OPT_DOUBLE, OFF(weight_decay), "0",
     "weight decay (L2 for sgd and momentum, decoupled for adam)", NULL, NUM(0, 1e6)},
    {"momentum", NULL, OPT_DOUBLE, OFF(momentum), "0.9", "momentum of --optimizer momentum", NULL,
     NUM(0, 0.999999)},
    {"beta1", NULL, OPT_DOUBLE, OFF(beta1), "0.9", "Adam's first-moment decay", NULL,
     NUM(0, 0.999999)},
    {"beta2", NULL, OPT_DOUBLE, OFF(beta2), "0.999", "Adam's second-moment decay", NULL,
     NUM(0, 0.999999)},
    {"epsilon", NULL, OPT_DOUBLE, OFF(epsilon), "1e-8", "Adam's epsilon", NULL, NUM(1e-30, 1)},
    {"lr-schedule", NULL, OPT_CHOICE, OFF(lr_schedule), "cosine",
     "learning-rate schedule (cosine decays to --min-lr over all steps)", LR_SCHEDULE_CHOICES, ANY},
    {"lr-step-size", NULL, OPT_INT, OFF(lr_step_size), "1000",
     "step schedule: steps between decays", NULL, NUM(1, 1e12)},
    {"lr-gamma", NULL, OPT_DOUBLE, OFF(lr_gamma), "0.5", "step schedule: decay factor", NULL,
     NUM(1e-12, 1)},
    {"min-lr", NULL, OPT_DOUBLE, OFF(min_lr), "0", "cosine schedule: final learning rate", NULL,
     NUM(0, 1e6)},
    {"seed", NULL, OPT_INT, OFF(seed), "1", "seed of initialization and data order", NULL,
     NUM(0, 9.2e18)},
    {"threads", NULL, OPT_INT, OFF(threads), "1", "BLAS threads (0: the BLAS default)", NULL,
     NUM(0, 1024)},
    {"device", NULL, OPT_CHOICE, OFF(device), "auto", "compute device (auto: GPU if visible)",
     "auto|cpu|cuda", ANY},
    {"gpu", NULL, OPT_INT, OFF(gpu), "-1",
     "which GPU with --device cuda or auto (-1: the launcher's local rank modulo the GPUs, "
     "else 0; CUDA_VISIBLE_DEVICES also applies)", NULL, NUM(-1, 1023)},
    {"metrics", NULL, OPT_STRING, OFF(metrics), "",
     "append one JSON object per epoch to this file", NULL, ANY},
    {"tensorboard", NULL, OPT_STRING, OFF(tensorboard), "",
     "write TensorBoard event files under this folder, run DIR/trainer-<id> (tensorboard "
     "--logdir DIR): after each epoch (CTR models: each evaluation too), at the job's step, "
     "the train loss, samples/s and communication share, and on trainer 0 the test accuracy "
     "or AUC and logloss: the values of the --metrics rows", NULL, ANY},
    {"timeline", NULL, OPT_STRING, OFF(timeline), "",
     "write Chrome trace events of each step (forward, backward, push, apply, checkpoint, "
     "evaluation) to this file, for Perfetto or chrome://tracing", NULL, ANY},
    {"timeline-steps", NULL, OPT_STRING, OFF(timeline_steps), TIMELINE_ALL_STEPS,
     "with --timeline: only steps A:B (zero-based, both included; A: or :B open-ended; "
     "A:B/K every K-th of them; default: all)", NULL, ANY},
    {"train-samples", NULL, OPT_INT, OFF(train_samples), "0",
     "use only the first N training samples (0: all)", NULL, NUM(0, 1e12)},
    {"test-samples", NULL, OPT_INT, OFF(test_samples), "0",
     "evaluate on only the first N test samples (0: all)", NULL, NUM(0, 1e12)},
    {"progress-interval", NULL, OPT_DOUBLE, OFF(progress_interval), "1",
     "seconds between progress lines (0: none)", NULL, NUM(0, 86400)},
    {"metrics-listen", NULL, OPT_STRING, OFF(metrics_listen), "",
     "serve Prometheus metrics at http://HOST:PORT/metrics: examples, loss, step, compute and "
     "communication time (a bare PORT: 127.0.0.1; name one interface, never 0.0.0.0; empty: "
     "off)", NULL, ANY},
    {"log-level", NULL, OPT_CHOICE, OFF(log_level), "info", "logging detail",
     "error|warn|info|debug", ANY},
    {"check-config", NULL, OPT_BOOL, OFF(check_config), "false",
     "check flags and environment, print the configuration they give and exit (0 if usable)",
     NULL, ANY},
};

#define TRAINER_OPTION_COUNT (sizeof trainer_option_table / sizeof trainer_option_table[0])

/* --model, or the network of --model-file. */
static ps_err model_load(trainer_settings *s, ps_error *err) {
  const trainer_options *o = &s->opt;
  if (o->model_file[0] == '\0') return model_parse(o->model, &s->model, err);
  if (strcmp(o->model, "mlp:784,256,128,10") != 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--model %s and --model-file %s: give one of them", o->model,
                        o->model_file);
  }
  return model_read_file(o->model_file, &s->model, err);
}

/* The data format, the defaults that depend on the model and the sparse
 * tables' settings. */
static ps_err ctr_settings_load(trainer_settings *s, ps_error *err) {
  trainer_options *o = &s->opt;
  int ctr = model_is_ctr(&s->model);
  if (strcmp(o->data_format, "auto") == 0) {
    s->criteo = ctr_reader_sniff(o->data);
    s->cifar = !s->criteo && cifar_detect(o->data);
  } else {
    s->criteo = strcmp(o->data_format, "criteo") == 0;
    s->cifar = strcmp(o->data_format, "cifar") == 0;
  }
  if (ctr && !s->criteo && access(o->data, R_OK) != 0) {
    return ps_error_set(err, PS_ERR_IO, "--data %s: cannot read: %s", o->data, strerror(errno));
  }
  if (ctr && o->test_data[0] != '\0' && access(o->test_data, R_OK) != 0) {
    return ps_error_set(err, PS_ERR_IO, "--test-data %s: cannot read: %s", o->test_data,
                        strerror(errno));
  }
  if (ctr && !s->criteo) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--model %s reads Criteo TSV data, but --data %s is not a Criteo TSV "
                        "file (40 tab-separated fields per line)",
                        o->model, o->data);
  }
  if (!ctr && s->criteo) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--data %s is Criteo TSV data: train it with --model ctr:DIM:H1,... or "
                        "--model lr (--model %s reads images)",
                        o->data, o->model);
  }
  if (!ctr && (o->test_data[0] != '\0' || o->eval_every > 0)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--test-data and --eval-every are for --model ctr and lr (mlp tests on "
                        "the t10k files or test_batch.bin of --data)");
  }
  if (o->epochs == 0) o->epochs = ctr ? 1 : s->model.kind == MODEL_NET ? 10 : 12;
  if (o->batch == 0) o->batch = ctr ? 512 : 64;
  if (o->bn_group > 0 && (s->model.kind != MODEL_NET || o->batch % o->bn_group != 0)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--bn-group %ld is for the networks (--model lenet, resnet18, resnet20 or "
                        "--model-file) and must divide --batch %ld",
                        o->bn_group, o->batch);
  }
  sparse_optimizer_config *c = &s->sparse_opt;
  if (sparse_optimizer_parse(o->sparse_optimizer, &c->kind, err) != PS_ERR_OK) return err->code;
  c->lr = o->sparse_lr;
  c->epsilon = 1e-8;
  c->initial_accumulator = 0.0;
  c->beta1 = o->beta1;
  c->beta2 = o->beta2;
  return PS_ERR_OK;
}

/* --staleness: an integer 0..PSTRAIN_MAX_STALENESS, given exactly when
 * --update is ssp (outside ssp it is not part of the job). */
static ps_err staleness_load(trainer_settings *s, ps_error *err) {
  const char *text = s->opt.staleness;
  int ssp = s->update == UPDATE_SSP;
  if (text[0] == '\0') {
    if (!ssp) return PS_ERR_OK;
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--update ssp needs --staleness S (steps a trainer may lead the slowest; "
                        "0: sync's semantics)");
  }
  if (!ssp) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--staleness is for --update ssp (this job's update is %s)", s->opt.update);
  }
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < 0 || v > PSTRAIN_MAX_STALENESS) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--staleness '%s' is not an integer 0..%d",
                        text, PSTRAIN_MAX_STALENESS);
  }
  s->staleness = (int)v;
  return PS_ERR_OK;
}

/* --geo-steps: an integer 1..PSTRAIN_MAX_GEO_STEPS, given exactly when
 * --update is geo; geo trainers keep every row they touch, so no admission
 * or eviction of rows. */
static ps_err geo_load(trainer_settings *s, ps_error *err) {
  const char *text = s->opt.geo_steps;
  int geo = s->update == UPDATE_GEO;
  if (text[0] == '\0') {
    if (!geo) return PS_ERR_OK;
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--update geo needs --geo-steps K (local steps between a trainer's "
                        "exchanges with the pservers)");
  }
  if (!geo) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--geo-steps is for --update geo (this job's update is %s)", s->opt.update);
  }
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < 1 || v > PSTRAIN_MAX_GEO_STEPS) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--geo-steps '%s' is not an integer 1..%d",
                        text, PSTRAIN_MAX_GEO_STEPS);
  }
  if (s->opt.admit_after > 1 || s->opt.evict_after > 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--update geo: --admit-after and --evict-after are for sync, async and "
                        "ssp (a GEO trainer keeps every row it touches until it sends its change)");
  }
  s->geo_steps = (int)v;
  return PS_ERR_OK;
}

/* --elastic MIN:MAX: MAX trainers at most (ids 0..MAX-1, assigned by
 * pserver 0 at the start: not --id), MIN at least. Before the ids are
 * resolved, so an --id given is told apart from none. */
static ps_err elastic_load(trainer_settings *s, ps_error *err) {
  trainer_options *o = &s->opt;
  if (o->elastic[0] == '\0') return PS_ERR_OK;
  long lo, hi;
  int used = 0;
  if (sscanf(o->elastic, "%ld:%ld%n", &lo, &hi, &used) != 2 || o->elastic[used] != '\0' ||
      lo < 1 || hi < lo || hi > PSTRAIN_MAX_TRAINERS) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--elastic '%s' is not MIN:MAX with 1 <= MIN <= MAX <= %d", o->elastic,
                        PSTRAIN_MAX_TRAINERS);
  }
  if (o->id >= 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--id with --elastic: pserver 0 gives each joining trainer its id");
  }
  if (o->trainers >= 0 && o->trainers != hi) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--trainers %ld with --elastic %s: the job has at most MAX trainers",
                        o->trainers, o->elastic);
  }
  o->trainers = hi;
  o->id = 0; /* until pserver 0 assigns one */
  s->elastic_min = (int)lo;
  return PS_ERR_OK;
}

/* Under srun, the task's place in its step stands in for absent ids. */
static ps_err slurm_ids_load(trainer_options *o, ps_error *err) {
  long procid, ntasks;
  ps_err rc = endpoints_slurm_task(&procid, &ntasks, err);
  if (rc != PS_ERR_OK) return rc;
  int from_slurm = strcmp(o->mode, "pserver") == 0 && procid >= 0;
  if (o->id < 0) o->id = from_slurm ? procid : 0;
  if (o->trainers < 0) o->trainers = from_slurm ? ntasks : 1;
  return PS_ERR_OK;
}

/* --mode, --update and --wire-dtype into their enums. */
static ps_err mode_load(trainer_settings *s, ps_error *err) {
  trainer_options *o = &s->opt;
  s->pserver_mode = strcmp(o->mode, "pserver") == 0;
  s->collective_mode = strcmp(o->mode, "collective") == 0;
#ifndef PSTRAIN_HAVE_MPI
  if (s->collective_mode) { /* said once, for every model, before any work */
    return ps_error_set(err, PS_ERR_UNSUPPORTED,
                        "--mode collective: this build has no MPI (install libopenmpi-dev and "
                        "rebuild)");
  }
#endif
  ps_err rc = update_mode_parse(o->update, &s->update, err);
  if (rc != PS_ERR_OK) return rc;
  return wire_dtype_parse(o->wire_dtype, &s->wire_dtype, err);
}

/* The flags that only some modes, updates or models take. */
static ps_err mode_flags_check(trainer_settings *s, ps_error *err) {
  trainer_options *o = &s->opt;
  if (s->wire_dtype != WIRE_DTYPE_F32 && !s->pserver_mode) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--wire-dtype %s is for pserver mode; --mode %s %s", o->wire_dtype,
                        o->mode,
                        s->collective_mode ? "all-reduces float32 gradients" : "sends nothing");
  }
  ps_err rc = staleness_load(s, err);
  if (rc == PS_ERR_OK) rc = geo_load(s, err);
  if (rc != PS_ERR_OK) return rc;
  s->async_whole = strcmp(o->async_push, "whole") == 0;
  if (s->async_whole &&
      (!s->pserver_mode || (s->update != UPDATE_ASYNC && s->update != UPDATE_SSP))) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--async-push whole is for --mode pserver with --update async or ssp "
                        "(here: --mode %s --update %s)",
                        o->mode, o->update);
  }
  if (o->shard_steps > 0 && !s->pserver_mode) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--shard-steps is for --mode pserver (here: --mode %s): the pservers "
                        "hand the data out", o->mode);
  }
  if (o->shard_steps > 0 && o->overlap && s->update == UPDATE_SYNC) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--overlap pushes a sync step in parts: not with --shard-steps, whose "
                        "steps carry their members in one push");
  }
  if (s->elastic_min > 0 && o->shard_steps == 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--elastic needs --shard-steps: trainers joining and leaving take their "
                        "data from pserver 0");
  }
  if (o->shard_steps > 0 && o->max_steps > 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--shard-steps hands out whole epochs: not with --max-steps");
  }
  if (o->export_replicas && (!s->collective_mode || !model_is_ctr(&s->model))) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--export-replicas is for the CTR models in collective mode, where every "
                        "rank holds a replica (here: --mode %s, --model %s)",
                        o->mode, o->model);
  }
  if (o->overlap && (!s->pserver_mode || s->update != UPDATE_SYNC || s->model.kind != MODEL_MLP)) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--overlap is for the MLP in pserver mode with --update sync (here: "
                        "--mode %s, --update %s, --model %s)",
                        o->mode, o->update, o->model);
  }
  return PS_ERR_OK;
}

/* Pserver mode: the pserver list, the credentials and this trainer's id. */
static ps_err pserver_settings_load(trainer_settings *s, ps_error *err) {
  trainer_options *o = &s->opt;
  ps_err rc = endpoints_check_role("TRAINER", err);
  if (rc == PS_ERR_OK) rc = endpoints_parse(o->pservers, "--pservers", &s->pservers, err);
  if (rc == PS_ERR_OK && o->token_file[0] != '\0') {
    rc = token_read_file(o->token_file, s->token, sizeof s->token, err);
  }
  if (rc != PS_ERR_OK) return rc;
  s->tls = (tls_config){o->tls_cert, o->tls_key, o->tls_ca, o->tls_server_name};
  rc = tls_check_client(&s->tls, err);
  for (int i = 0; i < s->pservers.count && !o->check_config && rc == PS_ERR_OK; i++) {
    rc = endpoint_resolve(s->pservers.items[i], "--pservers", o->connect_timeout, err);
  }
  if (rc != PS_ERR_OK) return rc;
  if (o->id >= o->trainers) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--id %ld is not 0..%ld (--trainers %ld)",
                        o->id, o->trainers - 1, o->trainers);
  }
  return PS_ERR_OK;
}

static ps_err checkpoint_flags_check(const trainer_settings *s, ps_error *err) {
  const trainer_options *o = &s->opt;
  if (o->checkpoint_dir[0] != '\0' && s->pserver_mode) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT,
                        "--checkpoint-dir is for local and collective mode; in pserver mode the "
                        "pservers write checkpoints (pserver --checkpoint-dir)");
  }
  if (o->resume && o->checkpoint_dir[0] == '\0') {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--resume needs --checkpoint-dir");
  }
  return PS_ERR_OK;
}

/* What the trainer reports while it runs: metrics endpoint, log level and
 * the timeline's steps. */
static ps_err reporting_settings_load(trainer_settings *s, ps_error *err) {
  const trainer_options *o = &s->opt;
  if (o->metrics_listen[0] != '\0') {
    ps_err rc = metrics_listen_check(o->metrics_listen, 0, "", s->metrics_addr,
                                     sizeof s->metrics_addr, err);
    if (rc != PS_ERR_OK) return rc;
  }
  if (log_level_parse(o->log_level, &s->level) != 0) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--log-level '%s' is unknown",
                        o->log_level);
  }
  return timeline_parse_flags(o->timeline, o->timeline_steps, &s->timeline_first,
                              &s->timeline_last, &s->timeline_every, err);
}

/* The dense optimizer and its learning-rate schedule. */
static ps_err optimizer_settings_load(trainer_settings *s, ps_error *err) {
  const trainer_options *o = &s->opt;
  optimizer_config *c = &s->optimizer;
  ps_err rc = optimizer_kind_parse(o->optimizer, &c->kind, err);
  if (rc == PS_ERR_OK) rc = lr_schedule_parse(o->lr_schedule, &c->schedule, err);
  if (rc != PS_ERR_OK) return rc;
  c->lr = o->lr;
  c->weight_decay = o->weight_decay;
  c->momentum = o->momentum;
  c->beta1 = o->beta1;
  c->beta2 = o->beta2;
  c->epsilon = o->epsilon;
  c->step_size = o->lr_step_size;
  c->gamma = o->lr_gamma;
  c->min_lr = o->min_lr;
  c->total_steps = 1; /* the trainer sets it from the data size */
  rc = optimizer_config_check(c, err);
  if (rc != PS_ERR_OK) return rc;
  if (c->schedule == LR_COSINE && c->min_lr > c->lr) {
    return ps_error_set(err, PS_ERR_INVALID_ARGUMENT, "--min-lr %g is above --lr %g", c->min_lr,
                        c->lr);
  }
  return PS_ERR_OK;
}

options_result trainer_settings_load(trainer_settings *s, int argc, char **argv, ps_error *err) {
  memset(s, 0, sizeof *s);
  options_result r =
      options_parse(trainer_option_table, TRAINER_OPTION_COUNT, &s->opt, argc, argv, err);
  if (r != OPTIONS_OK) return r;
  /* This order is the order in which a bad command line hears of its
   * mistakes: the first failing check's message is the one reported. */
  if (elastic_load(s, err) != PS_ERR_OK || slurm_ids_load(&s->opt, err) != PS_ERR_OK ||
      model_load(s, err) != PS_ERR_OK || ctr_settings_load(s, err) != PS_ERR_OK || mode_load(s, err) != PS_ERR_OK ||
      mode_flags_check(s, err) != PS_ERR_OK ||
      (s->pserver_mode && pserver_settings_load(s, err) != PS_ERR_OK) ||
      checkpoint_flags_check(s, err) != PS_ERR_OK ||
      reporting_settings_load(s, err) != PS_ERR_OK ||
      optimizer_settings_load(s, err) != PS_ERR_OK) {
    return OPTIONS_ERROR;
  }
  return OPTIONS_OK;
}

void trainer_print_help(FILE *out) {
  options_print_help(out,
                     "Usage: trainer [--mode local] [--OPTION VALUE]...\n"
                     "Trains an image classifier (mlp, or a convolutional network: lenet, resnet18,\n"
                     "resnet20, --model-file) on IDX or CIFAR-10 data and reports test accuracy, or a\n"
                     "click-through-rate model on Criteo TSV data (ctr, deepfm, lr) and reports AUC.",
                     trainer_option_table, TRAINER_OPTION_COUNT);
}

void trainer_settings_format(const trainer_settings *s, char *buf, size_t len) {
  options_format(trainer_option_table, TRAINER_OPTION_COUNT, &s->opt, buf, len);
}
