/* Helpers shared by the unit tests: temp dirs with generated data, and
 * running the built binaries. */
#ifndef RL_TESTUTIL_H
#define RL_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* mkdtemp + rl_arith_generate(2 digits, 10% held out, seed 7, tokens). */
void rl_test_arith_dir(char *dir, size_t n, uint64_t tokens);
void rl_test_rmdir(const char *dir);
/* Absolute directory of the built binaries: $RL_TEST_BIN or "bin". */
const char *rl_test_bindir(void);
/* Run a shell command; capture stderr into err[n]; return the exit status
 * (or -1 if it did not exit normally). */
int rl_test_run(const char *cmd, char *err, size_t n);
/* Write bytes to a file (test fixtures). */
void rl_test_write(const char *path, const void *data, size_t len);

/* Whether the file contains needle (false when unreadable). */
bool rl_test_file_has(const char *path, const char *needle);
/* A file of raw little-endian floats (--save-params); *n floats. */
float *rl_test_read_floats(const char *path, size_t *n);
/* The tiny model the checkpoint tests train (a job config fragment). */
#define RL_TEST_TINY_MODEL_JSON                                                                      \
    "\"model\":{\"hidden_size\":32,\"intermediate_size\":64,\"num_hidden_layers\":2,"                      \
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"max_position_embeddings\":64},"
/* DIR/job.json: the tiny model on DIR's arithmetic data, `steps` steps of
 * global_tokens tokens (micro-batches of 4 x 32), checkpoints to ckpt_uri
 * (NULL: file://DIR/ck; "": none) plus the extra_ckpt fields
 * (",\"every_steps\":5" or ""). */
void rl_test_write_job(const char *dir, long long steps, int global_tokens, const char *ckpt_uri,
                       const char *extra_ckpt);
/* Start bin/ringleader-worker --config DIR/job.json [extra_args...] with
 * stderr to `log` (stdout discarded), OMP_NUM_THREADS=1; with rank >= 0
 * as that rank of a torchrun-style job (RANK, WORLD_SIZE, MASTER_ADDR
 * 127.0.0.1, MASTER_PORT port). extra_args: NULL-terminated, or NULL. */
int rl_test_spawn_worker(const char *dir, const char *log, int rank, int world, int port,
                         const char *const *extra_args);
/* Exit status of p (128 + signal when killed), waiting at most limit_s;
 * -1 (and p SIGKILLed) when it did not end in time. */
int rl_test_wait_status(int p, double limit_s);
/* The pid of `rank` from a launcher's "spawned" line in its log, or -1. */
int rl_test_spawned_pid(const char *log, int rank);
/* The last "step" event's step number in a worker's log, or -1. */
long long rl_test_last_step(const char *log);
/* Each "step" event's loss, indexed by step (losses[step], step < max);
 * returns the highest step seen, or -1. Later lines win (a resumed run
 * repeats steps after its checkpoint). */
long long rl_test_step_losses(const char *log, double *losses, int max);

#endif
