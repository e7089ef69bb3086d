/* The pserver's option table (server/pserver_flags.h). */
#include "server/pserver_flags.h"

#include "common/job_limits.h"
#include "common/timeline.h"

#define OFF(field) offsetof(pserver_options, field)
const option_def pserver_option_table[] = {
    {"id", "PADDLE_PSERVER_ID", OPT_INT, OFF(id), "-1",
     "this pserver's index in --pservers (-1: SLURM_PROCID under srun, else the entry of "
     "POD_IP:PADDLE_PORT or of this host's name)", NULL, .min = -1,
     .max = PSTRAIN_MAX_PSERVERS - 1},
    {"pservers", "PADDLE_PSERVERS_IP_PORT_LIST", OPT_STRING, OFF(pservers), "",
     "every pserver's HOST:PORT, comma-separated, the same list on every process", NULL, .min = 1,
     .max = 0},
    {"trainers", "PADDLE_TRAINERS_NUM", OPT_INT, OFF(trainers), "1", "trainers in the job", NULL,
     .min = 1, .max = PSTRAIN_MAX_TRAINERS},
    {"listen", NULL, OPT_STRING, OFF(listen), "",
     "address to bind (default: this pserver's entry of --pservers)", NULL, .min = 1, .max = 0},
    {"port", "PADDLE_PORT", OPT_INT, OFF(port), "0",
     "port to bind when --listen is not given (0: the list entry's)", NULL, .min = 0,
     .max = 65535},
    {"rpc-threads", NULL, OPT_INT, OFF(threads), "1",
     "RPC worker threads (handlers never block: the disk is the work of the pserver's disk "
     "threads; more threads mean more hand-offs)", NULL,
     .min = 1, .max = 256},
    {"step-timeout", NULL, OPT_DOUBLE, OFF(step_timeout), "120",
     "seconds a sync step (an ssp push: for the slowest trainer) waits for the last trainer "
     "before the job stops", NULL, .min = 0.1,
     .max = 1e7},
    {"log-every", NULL, OPT_INT, OFF(log_every), "200", "steps between statistics lines (0: none)",
     NULL, .min = 0, .max = 1e12},
    {"max-message-mb", NULL, OPT_INT, OFF(max_message_mb), "512",
     "largest request or reply, in MiB", NULL, .min = 1, .max = 2047},
    {"max-shard-mb", NULL, OPT_INT, OFF(max_shard_mb), "8192",
     "refuse a job whose shard (parameters, optimizer state, gradients) needs more MiB", NULL,
     .min = 1, .max = 1 << 30},
    {"max-table-mb", NULL, OPT_DOUBLE, OFF(max_table_mb), "0",
     "CTR models: MiB each sparse table's rows on this pserver may hold (0: no limit); a pull "
     "that would pass it gets RESOURCE_EXHAUSTED naming the table, unless the job evicts",
     NULL, .min = 0, .max = 1e9},
    {"table-memory-mb", NULL, OPT_DOUBLE, OFF(table_memory_mb), "0",
     "CTR models: MiB all sparse tables on this pserver may hold together (0: 40% of the "
     "memory limit: RAM, the cgroup's limit or ulimit -v, the smallest); a pull that would "
     "pass it gets RESOURCE_EXHAUSTED naming the table and the limit, and the job stops",
     NULL, .min = 0, .max = 1e9},
    {"table-dir", NULL, OPT_STRING, OFF(table_dir), "",
     "CTR models: a local directory for the disk tier: rows past --table-memory-mb move to "
     "DIR/pserver-<id> (emptied at start: the checkpoint is the truth) instead of the job "
     "stopping",
     NULL, .min = 1, .max = 0},
    {"max-blocks-per-request", NULL, OPT_INT, OFF(max_blocks), "65536",
     "refuse a job whose push to this pserver carries more blocks (a small --block-size "
     "multiplies the per-block cost of every step and of the shard map)", NULL, .min = 1,
     .max = 1 << 30},
    {"max-registrations", NULL, OPT_INT, OFF(max_registrations), "100",
     "incarnations each trainer id may register over this pserver's life (each restart of a "
     "trainer is one; more get RESOURCE_EXHAUSTED; 0: no limit)", NULL, .min = 0, .max = 1e9},
    {"trainer-lease", NULL, OPT_DOUBLE, OFF(trainer_lease), "10",
     "jobs whose data is handed out in shards (trainer --shard-steps): seconds a trainer may "
     "hold a shard without a push before pserver 0 hands it to another (a trainer that "
     "registers again gives its shard back at once); sync: seconds a step waits for a member "
     "after its first push", NULL, .min = 0.1, .max = 1e7},
    {"token-file", NULL, OPT_STRING, OFF(token_file), "",
     "file whose first line is the job's shared secret: calls without it get UNAUTHENTICATED",
     NULL, .min = 1, .max = 0},
    {"tls-cert", NULL, OPT_STRING, OFF(tls_cert), "",
     "serve TLS with this certificate (PEM; scripts/make-certs makes one)", NULL, .min = 1,
     .max = 0},
    {"tls-key", NULL, OPT_STRING, OFF(tls_key), "", "the private key of --tls-cert (PEM)", NULL,
     .min = 1, .max = 0},
    {"tls-ca", NULL, OPT_STRING, OFF(tls_ca), "",
     "mutual TLS: require client certificates signed by this CA (PEM); others fail the handshake",
     NULL, .min = 1, .max = 0},
    {"tls-check-trainer-id", NULL, OPT_BOOL, OFF(tls_check_trainer_id), "true",
     "with --tls-ca: a trainer's certificate must name its id (CN or SAN trainer-<id>), else "
     "PERMISSION_DENIED; false accepts any certificate the CA signed", NULL, .min = 1, .max = 0},
    {"insecure", NULL, OPT_BOOL, OFF(insecure), "false",
     "allow listening beyond loopback with neither a token nor TLS (anyone who reaches the port "
     "can register, push and read the model)", NULL, .min = 1, .max = 0},
    {"on-trainer-loss", NULL, OPT_CHOICE, OFF(on_trainer_loss), "stop",
     "sync and ssp mode, when a trainer misses --step-timeout: stop the job naming it, or "
     "continue with the others", "stop|continue", .min = 1, .max = 0},
    {"checkpoint-dir", NULL, OPT_STRING, OFF(checkpoint_dir), "",
     "write checkpoints (safetensors) of this pserver's shard here: every --checkpoint-every "
     "steps, at the end and on SIGTERM/SIGINT", NULL, .min = 1, .max = 0},
    {"checkpoint-every", NULL, OPT_INT, OFF(checkpoint_every), "0",
     "steps between checkpoints (0: only at the end and on a signal)", NULL, .min = 0,
     .max = 1e15},
    {"resume", NULL, OPT_BOOL, OFF(resume), "false",
     "start from the checkpoint in --checkpoint-dir (refused if missing, corrupt or another job's); "
     "with only another --pservers count's files there, re-shard them onto this count",
     NULL, .min = 1, .max = 0},
    {"resume-if-present", NULL, OPT_BOOL, OFF(resume_if_present), "false",
     "resume from the newest checkpoint in --checkpoint-dir when there is one, else start "
     "fresh (for pservers a launcher, Kubernetes or Slurm restarts)", NULL, .min = 1, .max = 0},
    {"resume-step", NULL, OPT_INT, OFF(resume_step), "-1",
     "with --resume: the checkpoint of this step (-1: the newest); every pserver of a sync job "
     "must resume at the same step", NULL, .min = -1, .max = 1e15},
    {"timeline", NULL, OPT_STRING, OFF(timeline), "",
     "write Chrome trace events of each step (push arrivals, the wait for the last trainer, "
     "apply, reply, checkpoint writes) to this file, for Perfetto or chrome://tracing", NULL,
     .min = 1, .max = 0},
    {"timeline-steps", NULL, OPT_STRING, OFF(timeline_steps), TIMELINE_ALL_STEPS,
     "with --timeline: only steps A:B (zero-based, both included; A: or :B open-ended; "
     "A:B/K every K-th of them; default: all)", NULL, .min = 1, .max = 0},
    {"metrics-listen", NULL, OPT_STRING, OFF(metrics_listen), "",
     "serve Prometheus metrics at http://HOST:PORT/metrics (a bare PORT: 127.0.0.1; every "
     "interface, 0.0.0.0 or ::, needs --insecure; empty: off); no parameters are shown",
     NULL, .min = 1, .max = 0},
    {"tensorboard", NULL, OPT_STRING, OFF(tensorboard), "",
     "write the statistics lines (every --log-every steps: pushes/s, MB/s in and out, the sync "
     "wait for the last push, the tables' rows) as TensorBoard event files under this folder, "
     "run DIR/pserver-<id> (tensorboard --logdir DIR)", NULL, .min = 1, .max = 0},
    {"log-level", NULL, OPT_CHOICE, OFF(log_level), "info", "logging detail",
     "error|warn|info|debug", .min = 1, .max = 0},
    {"check-config", NULL, OPT_BOOL, OFF(check_config), "false",
     "check flags and environment, print the configuration they give and exit (0 if usable)",
     NULL, .min = 1, .max = 0},
    {"max-pending-calls", NULL, OPT_INT, OFF(max_pending_calls), "1024",
     "calls open at once (held for a step, reading their body, being answered); more are "
     "refused RESOURCE_EXHAUSTED unread", NULL, .min = 1, .max = 1 << 20},
    {"max-receive-mb", NULL, OPT_INT, OFF(max_receive_mb), "0",
     "memory (MiB) gRPC may hold for connections and request bodies being received; past it "
     "gRPC resets calls, RESOURCE_EXHAUSTED (0: half the memory limit: RAM, cgroup memory.max "
     "or ulimit -v, the smallest)", NULL, .min = 0, .max = 1 << 24},
    {"max-streams-per-connection", NULL, OPT_INT, OFF(max_streams), "100",
     "calls one connection may have open at once (HTTP/2 streams); more are refused by gRPC",
     NULL, .min = 1, .max = 1 << 20},
    {"max-connection-idle", NULL, OPT_DOUBLE, OFF(max_connection_idle), "60",
     "seconds a connection may go without calls (or stay in its handshake, at most 120) before "
     "it is closed; trainers reconnect by themselves (0: never)", NULL, .min = 0, .max = 1e7},
    {"max-connection-age", NULL, OPT_DOUBLE, OFF(max_connection_age), "1800",
     "seconds after which a connection is asked to go away (its calls get --step-timeout plus "
     "30 s to finish; trainers reconnect by themselves; 0: never)", NULL, .min = 0, .max = 1e7},
    {"keepalive", NULL, OPT_DOUBLE, OFF(keepalive), "60",
     "seconds without traffic after which a peer is pinged; one that does not answer in 20 s "
     "is closed with its calls (0: gRPC's 2 hours)", NULL, .min = 0, .max = 1e7},
    {"shutdown-timeout", NULL, OPT_DOUBLE, OFF(shutdown_timeout), "5",
     "on SIGTERM/SIGINT, after the final checkpoint: seconds to cancel open calls and close "
     "connections before exiting anyway", NULL, .min = 0.1, .max = 3600},
};
const size_t pserver_option_count = sizeof pserver_option_table / sizeof pserver_option_table[0];
