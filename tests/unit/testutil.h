/* Helpers shared by the unit tests: temp dirs with generated data, and
 * running the built binaries. */
#ifndef RL_TESTUTIL_H
#define RL_TESTUTIL_H

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

#endif
