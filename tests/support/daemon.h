/* One way for test suites to run a server process (etcd, the Ceph daemons
 * and radosgw, the Kubernetes stand-in) or a one-shot setup command: spawn
 * it with its arguments, environment, working directory and a log file;
 * wait until it is ready (a check of the caller's) with a timeout, noticing
 * when it dies first; stop it with SIGTERM and, after a grace period,
 * SIGKILL. A daemon dies with the test process that started it, so a
 * crashed test leaves no server behind. No Criterion here, so bench/ and
 * tests/ref/ can use it too. */
#ifndef RL_TEST_DAEMON_H
#define RL_TEST_DAEMON_H

#include <stdbool.h>
#include <stddef.h>

typedef struct rl_test_daemon_opts {
    char *const *argv;       /* argv[0] is looked up on the PATH */
    const char *log;         /* stdout and stderr appended here (NULL: inherited) */
    const char *dir;         /* working directory (NULL: the caller's) */
    const char *const *env;  /* "NAME=value" entries added to its environment, NULL-terminated (or NULL) */
    int death_signal;        /* sent to it when the test process dies (0: SIGKILL) */
} rl_test_daemon_opts;

/* fork/exec; its stdin is /dev/null. The pid, or -1 when fork failed. */
int rl_test_daemon_spawn(const rl_test_daemon_opts *o);

/* Poll ready(ud) every poll_s seconds until it returns true (0), the
 * process exits first (-1; it is reaped, *pid set to -1 and its waitpid
 * status left in *status when status is not NULL) or timeout_s passes
 * (-2; it is left running). */
int rl_test_daemon_await(int *pid, bool (*ready)(void *ud), void *ud, double timeout_s, double poll_s,
                         int *status);

/* SIGTERM, then SIGKILL when it has not exited within grace_s (<= 0:
 * SIGKILL at once); reaped, *pid set to -1. Nothing when *pid <= 0. */
void rl_test_daemon_stop(int *pid, double grace_s);

/* Run a command to its end: its exit status, or -1 when it did not exit
 * normally or ran past timeout_s (then it is SIGKILLed). */
int rl_test_daemon_run(const rl_test_daemon_opts *o, double timeout_s);

/* n (at most 4) distinct free loopback ports for daemons to listen on,
 * held open together so they differ; 0, or -1 when there were none. */
int rl_test_daemon_free_ports(int *ports, int n);

/* The last `max` bytes of a log file to stderr, under a "---- PATH (tail)" line. */
void rl_test_daemon_log_tail(const char *path, size_t max);

#endif
