/* N forked child processes for tests and benchmarks (ranks, clients,
 * candidates): fork them, then collect their wait statuses with one
 * deadline for all, killing the ones that hang so that a stuck child
 * fails its test instead of holding up the suite. No Criterion here, so
 * bench/ can use it too. */
#ifndef RL_TEST_CHILDREN_H
#define RL_TEST_CHILDREN_H

#include <sys/types.h>

#define RL_TEST_MAX_CHILDREN 64

/* Fork n (<= RL_TEST_MAX_CHILDREN) children, stdio flushed first so no
 * buffered output is written twice. In child k it returns k (the child
 * then runs its part and must _exit); in the parent it returns -1 with
 * pids[0..n-1] filled. When a fork fails, the children already forked
 * are SIGKILLed and reaped and it returns -2. */
int rl_test_fork_n(int n, pid_t *pids);

/* Wait for the n children, at most limit_s for all together (< 0: no
 * limit). status[i] is child i's waitpid status, or -1 when it was still
 * running at the deadline (it is then SIGKILLed and reaped) or could not
 * be waited for. Returns how many got -1. */
int rl_test_wait_n(const pid_t *pids, int n, double limit_s, int *status);

/* A waitpid status as one number: the exit status, 128 + the signal when
 * killed by one, -1 for rl_test_wait_n's -1. */
int rl_test_exit_code(int status);

#endif
