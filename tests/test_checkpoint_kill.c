/* Checkpoint writes killed at random moments (label "fault"): a child
 * process writes generation after generation of a 2 MB checkpoint, in the
 * two ways pstrain names them (one file per step, as pservers do; one name
 * replaced in place with the old one kept as .prev); the parent SIGKILLs it
 * at a random moment, many times. Afterwards every file under a final name
 * loads (CRC-32C included) and holds exactly one generation, the newest
 * complete generation is never lost, and the in-place name always exists. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/safetensors.h"
#include "tests/check.h"

#define FLOATS (1 << 19)
#define ROUNDS 40

static char dir[] = "/tmp/pstrain-test-ck-XXXXXX";
static tensor_layout layout;

static void write_generation(float *data, long gen, int fd) {
  for (long i = 0; i < FLOATS; i++) data[i] = (float)gen;
  char step[32], path[256];
  snprintf(step, sizeof step, "%ld", gen);
  const char *meta[] = {"step", step, NULL};
  ps_error err;
  snprintf(path, sizeof path, "%s/step-%09ld.safetensors", dir, gen);
  if (safetensors_write(path, &layout, data, meta, 0, &err) != PS_ERR_OK) _exit(3);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  if (safetensors_write(path, &layout, data, meta, 1, &err) != PS_ERR_OK) _exit(3);
  char done = 1;
  if (write(fd, &done, 1) != 1) _exit(3);
}

/* Loads path; returns its generation, or -1 when it is torn or mixed. */
static long load(const char *path, float *data) {
  safetensors_meta meta;
  ps_error err;
  if (safetensors_read(path, &layout, data, &meta, &err) != PS_ERR_OK) {
    fprintf(stderr, "%s\n", err.msg);
    return -1;
  }
  long gen = atol(safetensors_meta_get(&meta, "step"));
  for (long i = 0; i < FLOATS; i++) {
    if (data[i] != (float)gen) return -1;
  }
  return gen;
}

/* One round: a child writes generations from *gen + 1 on until killed at
 * a random moment after its first completes; *completed becomes the last
 * generation it completed, *gen the one it may have been writing. */
static void write_until_killed(float *data, long *gen, long *completed) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  long first = *gen + 1;
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(fds[0]);
    for (long g = first;; g++) write_generation(data, g, fds[1]);
  }
  close(fds[1]);
  /* Let one generation complete, then kill at a random moment. */
  char done;
  REQUIRE(read(fds[0], &done, 1) == 1);
  struct timespec pause = {0, (long)(rand() % 30000) * 1000};
  nanosleep(&pause, NULL);
  REQUIRE(kill(child, SIGKILL) == 0);
  int status;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  long finished = 1;
  while (read(fds[0], &done, 1) == 1) finished++; /* generations the child completed */
  close(fds[0]);
  *completed = first + finished - 1;
  *gen = *completed + 1; /* the one it may have been writing */
}

/* Every file under a final name is whole; the newest completed step is
 * there, and so is the in-place name. Counts loads and torn files. */
static void check_final_names(float *data, long completed, long *loads, long *torn) {
  DIR *d = opendir(dir);
  REQUIRE(d != NULL);
  struct dirent *e;
  long newest = -1;
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    /* Old steps and the killed writer's temporary file: as a pserver prunes. */
    if (strstr(e->d_name, ".tmp.") != NULL ||
        (strncmp(e->d_name, "step-", 5) == 0 && atol(e->d_name + 5) < completed - 2)) {
      CHECK(unlink(path) == 0);
      continue;
    }
    int final = n > 12 && strcmp(e->d_name + n - 12, ".safetensors") == 0;
    int prev = n > 5 && strcmp(e->d_name + n - 5, ".prev") == 0;
    if (!final && !prev) continue;
    long g = load(path, data);
    (*loads)++;
    if (g < 0) (*torn)++;
    if (strncmp(e->d_name, "step-", 5) == 0) {
      if (g != atol(e->d_name + 5)) (*torn)++;
      if (g > newest) newest = g;
    }
  }
  closedir(d);
  CHECK(newest >= completed);
  char path[512];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  long in_place = load(path, data);
  CHECK(in_place >= completed);
}

static void case_killed_writes_leave_whole_files(void) {
  tensor_layout_init(&layout);
  long shape[1] = {FLOATS};
  ps_error err;
  REQUIRE(tensor_layout_add(&layout, "params", 1, shape, &err) == PS_ERR_OK);
  float *data = malloc(FLOATS * sizeof *data);
  REQUIRE(data != NULL);
  srand((unsigned)time(NULL));
  long gen = 0, completed = 0, torn = 0, loads = 0;
  for (int round = 0; round < ROUNDS; round++) {
    write_until_killed(data, &gen, &completed);
    check_final_names(data, completed, &loads, &torn);
  }
  CHECK_EQ_INT(torn, 0);
  fprintf(stderr, "%d kills, %ld generations completed, %ld loads, %ld torn\n", ROUNDS, completed,
          loads, torn);
  free(data);
  tensor_layout_free(&layout);
}

int main(void) {
  REQUIRE(mkdtemp(dir) != NULL);
  RUN_CASE(case_killed_writes_leave_whole_files);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
  return check_report("test_checkpoint_kill");
}
