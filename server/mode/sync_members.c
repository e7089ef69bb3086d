/* Sync steps of a job whose data is handed out (--shard-steps): trainers
 * join and leave the steps. Each time a trainer joins, pserver 0 gives it
 * a membership number (increasing over the job), and decides each step's
 * members when the step before it completes: that step's members less
 * those gone (left, done, silent past --trainer-lease, registered again)
 * plus those that asked to join (PULL_JOIN, held until then). Its replies
 * carry the members (id, number) of the step they begin and every push
 * carries those of its step, so the other pservers learn them from the
 * pushes; a leave names its number, so a pserver never waits for a
 * membership that ended, even when a later step still names it. A member
 * silent within a step is not waited for after its lease, on each pserver
 * alike; one killed in the middle of a push leaves its gradient on the
 * pservers that had it (its batch is trained again by the shard's next
 * holder: docs/elastic.md). A joiner pulls the parameters of its first
 * step, each pserver answering once it reaches that step; other pulls are
 * answered at once. Lock held throughout. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "server/mode/sync.h"
#include "server/pserver_internal.h"

struct sync_members {
  int n;              /* trainer ids */
  uint32_t *in;       /* (n) the current step's members' numbers, 0: not a member
                       * (pservers other than 0: once a push of the step named them) */
  int known;
  uint32_t *next;     /* (n) pserver 0: the next step's, decided before its replies */
  int decided;
  uint32_t *logged;   /* (n) the members last logged */
  uint32_t *left;     /* (n) the highest membership number that ended here */
  uint32_t *scratch;  /* (n) a push's members, or those to log */
  uint8_t *wire;      /* a members list as sent or received */
  uint32_t number;    /* pserver 0: the last membership number given */
  rpc_call **joins;   /* (n) pserver 0: PULL_JOINs held until the next step begins */
  uint32_t *join_number;
  rpc_call **pulls;   /* (n) PULL_STEPs held until this pserver reaches pull_at */
  long *pull_at;
  unsigned char *pull_keys; /* (n) the held pull's keys wait in the store */
  long pushes;        /* members' pushes applied since the pserver started: the schedule */
  double began;       /* when the current step began here */
};

void sync_members_free(pserver *ps, sync_members *sm) {
  if (sm == NULL) return;
  sync_members_drop(ps, sm, -1, PS_ERR_ABORTED, "the pserver dropped its job");
  free(sm->in);
  free(sm->next);
  free(sm->logged);
  free(sm->left);
  free(sm->scratch);
  free(sm->wire);
  free(sm->joins);
  free(sm->join_number);
  free(sm->pulls);
  free(sm->pull_at);
  free(sm->pull_keys);
  free(sm);
}

ps_err sync_members_create(pserver *ps, sync_members **out, ps_error *err) {
  *out = NULL;
  sync_members *sm = calloc(1, sizeof *sm);
  if (sm == NULL) return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory for members");
  size_t n = (size_t)ps->cfg.trainers;
  sm->n = ps->cfg.trainers;
  sm->in = calloc(n, sizeof *sm->in);
  sm->next = calloc(n, sizeof *sm->next);
  sm->logged = calloc(n, sizeof *sm->logged);
  sm->left = calloc(n, sizeof *sm->left);
  sm->scratch = calloc(n, sizeof *sm->scratch);
  sm->wire = malloc(WIRE_MEMBERS_MAX(n) + 1);
  sm->joins = calloc(n, sizeof *sm->joins);
  sm->join_number = calloc(n, sizeof *sm->join_number);
  sm->pulls = calloc(n, sizeof *sm->pulls);
  sm->pull_at = calloc(n, sizeof *sm->pull_at);
  sm->pull_keys = calloc(n, 1);
  if (sm->in == NULL || sm->next == NULL || sm->logged == NULL || sm->left == NULL ||
      sm->scratch == NULL || sm->wire == NULL || sm->joins == NULL || sm->join_number == NULL ||
      sm->pulls == NULL || sm->pull_at == NULL || sm->pull_keys == NULL) {
    sync_members_free(ps, sm);
    return ps_error_set(err, PS_ERR_NO_MEMORY, "pserver: out of memory for members");
  }
  sm->known = ps->cfg.id == 0;
  sm->began = now_s();
  *out = sm;
  return PS_ERR_OK;
}

/* Whether the step names trainer i by a membership that has not ended here. */
static int named(const sync_members *sm, int i) {
  return sm->known && sm->in[i] != 0 && sm->in[i] > sm->left[i];
}

int sync_members_expected(const pserver *ps, const sync_members *sm, int i) {
  const trainer_state *tr = &ps->trainers[i];
  return named(sm, i) && !tr->done && !tr->lost;
}

int sync_members_count(const pserver *ps, const sync_members *sm) {
  int count = 0;
  for (int i = 0; i < sm->n; i++) count += sync_members_expected(ps, sm, i);
  return count;
}

/* The ids set in a and not in b (b NULL: none) into buf: "0,2,3", or "none". */
static void list_ids(const uint32_t *a, const uint32_t *b, int n, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && used < len; i++) {
    if (a[i] == 0 || (b != NULL && b[i] == a[i])) continue;
    int w = snprintf(buf + used, len - used, "%s%d", used > 0 ? "," : "", i);
    if (w < 0) break;
    used += (size_t)w;
  }
  if (used == 0) snprintf(buf, len, "none");
}

/* Logs the current step's members (memberships not ended here) when they
 * differ from those last logged; a new number is a trainer back. */
static void log_members(const pserver *ps, sync_members *sm) {
  for (int i = 0; i < sm->n; i++) sm->scratch[i] = sm->in[i] > sm->left[i] ? sm->in[i] : 0;
  size_t size = (size_t)sm->n * sizeof *sm->in;
  if (memcmp(sm->scratch, sm->logged, size) == 0) return;
  char members[256], joined[256], left[256];
  list_ids(sm->scratch, NULL, sm->n, members, sizeof members);
  list_ids(sm->scratch, sm->logged, sm->n, joined, sizeof joined);
  list_ids(sm->logged, sm->scratch, sm->n, left, sizeof left);
  LOG_INFO("step %ld: members %s (joined: %s; left: %s)", ps->updates, members, joined, left);
  memcpy(sm->logged, sm->scratch, size);
}

ps_err sync_members_check_push(pserver *ps, sync_members *sm, rpc_call *call,
                               const rpc_message *msg, const wire_blocks_msg *m) {
  uint32_t id = m->key.trainer_id;
  ps_error err;
  if (m->members.len == 0 || m->members.len > WIRE_MEMBERS_MAX(sm->n)) {
    pserver_refuse(call, "PushPull", PS_ERR_INVALID_ARGUMENT,
                   "trainer %u's push of step %ld names %zu bytes of members (a sync job with "
                   "handed-out data names its step's members, at most %zu bytes)",
                   id, ps->updates, m->members.len, WIRE_MEMBERS_MAX(sm->n));
    return PS_ERR_INVALID_ARGUMENT;
  }
  wire_copy_block(msg, &m->members, sm->wire);
  if (wire_members_decode(sm->wire, m->members.len, sm->scratch, sm->n, &err) != PS_ERR_OK) {
    pserver_refuse(call, "PushPull", err.code, "trainer %u's push: %s", id, err.msg);
    return err.code;
  }
  if (!sm->known) {
    memcpy(sm->in, sm->scratch, (size_t)sm->n * sizeof *sm->in);
    sm->known = 1;
    log_members(ps, sm);
  } else if (memcmp(sm->in, sm->scratch, (size_t)sm->n * sizeof *sm->in) != 0) {
    char mine[256], theirs[256];
    list_ids(sm->in, NULL, sm->n, mine, sizeof mine);
    list_ids(sm->scratch, NULL, sm->n, theirs, sizeof theirs);
    pserver_refuse(call, "PushPull", PS_ERR_ABORTED,
                   "trainer %u's push of step %ld names members %s; this pserver's step has %s "
                   "(or other membership numbers): it joins the steps again", id, ps->updates,
                   theirs, mine);
    return PS_ERR_ABORTED;
  }
  if (!named(sm, (int)id)) {
    /* ABORTED: the trainer joins again (it may have stalled past its lease). */
    pserver_refuse(call, "PushPull", PS_ERR_ABORTED,
                   "trainer %u is not a member of step %ld (it never joined, left, or was "
                   "silent past --trainer-lease): it joins the steps again", id, ps->updates);
    return PS_ERR_ABORTED;
  }
  return PS_ERR_OK;
}

void sync_members_decide(pserver *ps, sync_members *sm, int count) {
  sm->pushes += count;
  if (ps->cfg.id != 0) return;
  for (int i = 0; i < sm->n; i++) {
    sm->next[i] = sm->joins[i] != NULL             ? sm->join_number[i]
                  : sync_members_expected(ps, sm, i) ? sm->in[i]
                                                     : 0;
  }
  sm->decided = 1;
}

/* Answers a held or new pull at the current step: the parameters, and the
 * rows of its keys (kept in the store) created. */
static void answer_pull(pserver *ps, int id, rpc_call *call, int keys_kept) {
  if (ps->store.rows != NULL && keys_kept) {
    store_reply_pulls(ps, &id, &call, 1, ps->updates, NULL, NULL);
  } else {
    pserver_reply_params(ps, &call, 1);
  }
}

void sync_members_begin_step(pserver *ps, sync_members *sm) {
  sm->began = now_s();
  if (ps->cfg.id == 0) {
    if (sm->decided) memcpy(sm->in, sm->next, (size_t)sm->n * sizeof *sm->in);
    sm->decided = 0;
    log_members(ps, sm);
    for (int i = 0; i < sm->n; i++) {
      if (sm->joins[i] == NULL || sm->in[i] != sm->join_number[i]) continue;
      pserver_reply_params(ps, &sm->joins[i], 1); /* its step and members: the reply's */
      sm->joins[i] = NULL;
    }
  } else {
    sm->known = 0; /* until a push of the new step names them */
  }
  for (int i = 0; i < sm->n; i++) {
    if (sm->pulls[i] == NULL || sm->pull_at[i] != ps->updates) continue;
    answer_pull(ps, i, sm->pulls[i], sm->pull_keys[i]);
    sm->pulls[i] = NULL;
  }
}

/* Pserver 0, a PULL_JOIN: a new membership number, admitted at once into
 * a step nobody trains (every member left), else held until the next
 * step begins. */
static void join(pserver *ps, sync_members *sm, rpc_call *call, int id, int step_started) {
  uint32_t number = ++sm->number;
  if (!step_started && sync_members_count(ps, sm) == 0) {
    sm->in[id] = number;
    log_members(ps, sm);
    pserver_reply_params(ps, &call, 1);
    return;
  }
  if (sm->joins[id] != NULL) {
    rpc_call_reply(sm->joins[id], PS_ERR_ABORTED, "superseded by a newer join", NULL, 0);
  }
  sm->joins[id] = call;
  sm->join_number[id] = number;
}

void sync_members_admit_waiting(pserver *ps, sync_members *sm, int step_started) {
  if (ps->cfg.id != 0 || step_started || sync_members_count(ps, sm) > 0) return;
  int admitted = 0;
  for (int i = 0; i < sm->n; i++) {
    if (sm->joins[i] == NULL) continue;
    sm->in[i] = sm->join_number[i];
    admitted = 1;
  }
  if (!admitted) return;
  log_members(ps, sm);
  for (int i = 0; i < sm->n; i++) {
    if (sm->joins[i] == NULL) continue;
    pserver_reply_params(ps, &sm->joins[i], 1);
    sm->joins[i] = NULL;
  }
}

void sync_members_pull(pserver *ps, sync_members *sm, rpc_call *call, const wire_blocks_msg *m,
                       int step_started) {
  int id = (int)m->key.trainer_id;
  long at = (long)m->key.step;
  int keys = ps->store.rows != NULL && m->sparse_count > 0;
  if (m->kind == PSTRAIN__PULL_KIND__PULL_JOIN) {
    if (ps->cfg.id != 0) {
      pserver_refuse(call, "Pull", PS_ERR_FAILED_PRECONDITION,
                     "trainer %d asked pserver %d to join the steps: pserver 0 admits", id,
                     ps->cfg.id);
      return;
    }
    join(ps, sm, call, id, step_started);
    return;
  }
  if (keys) store_keep_pull(ps, id);
  if (at <= ps->updates) {
    /* Now: a step begun (a joiner's first), or a read of what is there
     * (an evaluation's pull, which names no step). */
    answer_pull(ps, id, call, keys);
    return;
  }
  if (sm->pulls[id] != NULL) {
    rpc_call_reply(sm->pulls[id], PS_ERR_ABORTED, "superseded by a newer pull", NULL, 0);
  }
  sm->pulls[id] = call;
  sm->pull_at[id] = at;
  sm->pull_keys[id] = (unsigned char)keys;
}

void sync_members_drop(pserver *ps, sync_members *sm, int trainer, ps_err code, const char *why) {
  (void)ps;
  for (int i = 0; i < sm->n; i++) {
    if (trainer >= 0 && i != trainer) continue;
    if (sm->joins[i] != NULL) rpc_call_reply(sm->joins[i], code, why, NULL, 0);
    if (sm->pulls[i] != NULL) rpc_call_reply(sm->pulls[i], code, why, NULL, 0);
    sm->joins[i] = sm->pulls[i] = NULL;
  }
}

int sync_members_leave(pserver *ps, sync_members *sm, int trainer, uint32_t number,
                       const char *why) {
  int was = named(sm, trainer) && sm->in[trainer] <= number;
  if (number > sm->left[trainer]) sm->left[trainer] = number;
  if (was) LOG_INFO("step %ld: trainer %d leaves (%s)", ps->updates, trainer, why);
  return was;
}

int sync_members_waiting(const sync_members *sm, int trainer) {
  return sm->joins[trainer] != NULL || sm->pulls[trainer] != NULL;
}

uint32_t sync_members_number(const sync_members *sm, int trainer) {
  return sm->in[trainer] > sm->next[trainer] ? sm->in[trainer] : sm->next[trainer];
}

int sync_members_poll(pserver *ps, sync_members *sm, double now, int step_started) {
  /* The lease runs from the step's first push here: before it every member
   * may be waiting for another pserver's answer, silent here, for up to a
   * lease (that pserver's wait for a dead member). A step nobody pushed
   * (its members dead) waits two leases from its start. */
  double from = step_started ? ps->step_started : sm->began;
  double lease = step_started ? ps->cfg.trainer_lease : 2 * ps->cfg.trainer_lease;
  int left = 0;
  for (int i = 0; i < sm->n; i++) {
    const trainer_state *tr = &ps->trainers[i];
    if (!sync_members_expected(ps, sm, i) || tr->pushed) continue;
    double since = tr->last_seen > from ? tr->last_seen : from;
    if (now - since <= lease) continue;
    char why[160];
    snprintf(why, sizeof why, "silent for %.1f s after the step's %s, past %s--trainer-lease "
             "%.0f s", now - since, step_started ? "first push" : "start",
             step_started ? "" : "twice ", ps->cfg.trainer_lease);
    left += sync_members_leave(ps, sm, i, sm->in[i], why);
  }
  return left;
}

ps_err sync_members_write(const pserver *ps, const sync_members *sm, wire_writer *w) {
  if (ps->cfg.id != 0) return w->status;
  size_t len = wire_members_encode(sm->decided ? sm->next : sm->in, sm->n, sm->wire);
  return wire_writer_members(w, sm->wire, len);
}

long sync_members_schedule_step(const sync_members *sm, int trainers) {
  return sm->pushes / trainers;
}

/* Numbers given after the checkpoint a pserver 0 comes back from are not
 * in it: the restored count skips this many so none is given twice. */
#define NUMBERS_SKIPPED 65536u

void sync_members_save(const sync_members *sm, char *buf, size_t len) {
  snprintf(buf, len, "pushes=%ld number=%u", sm->pushes, sm->number);
}

ps_err sync_members_restore(pserver *ps, sync_members *sm, const char *text, ps_error *err) {
  long pushes = 0;
  unsigned number = 0;
  int used = 0;
  if (text != NULL && (sscanf(text, "pushes=%ld number=%u%n", &pushes, &number, &used) != 2 ||
                       text[used] != '\0' || pushes < 0 || number > UINT32_MAX - NUMBERS_SKIPPED)) {
    return ps_error_set(err, PS_ERR_CORRUPT_DATA, "the checkpoint's sync members \"%.40s\" are "
                        "not pushes=N number=M", text);
  }
  sync_members_drop(ps, sm, -1, PS_ERR_ABORTED, "the pserver went back to a checkpoint");
  size_t size = (size_t)sm->n * sizeof *sm->in;
  memset(sm->in, 0, size);
  memset(sm->next, 0, size);
  memset(sm->logged, 0, size);
  memset(sm->left, 0, size);
  sm->decided = 0;
  sm->known = ps->cfg.id == 0;
  sm->began = now_s();
  sm->pushes = pushes;
  /* A pserver 0 that kept running gave its numbers: they stay unique. */
  uint32_t restored = text != NULL ? (uint32_t)number + NUMBERS_SKIPPED : 0;
  if (restored > sm->number) sm->number = restored;
  LOG_INFO("step %ld: no members (every trainer joins the steps again); %ld members' pushes "
           "applied so far", ps->updates, sm->pushes);
  return PS_ERR_OK;
}
