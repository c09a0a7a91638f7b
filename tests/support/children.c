/* Fork N children and reap them with one deadline; see children.h. */
#include "children.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int rl_test_fork_n(int n, pid_t *pids) {
    if (n < 0 || n > RL_TEST_MAX_CHILDREN) return -2;
    fflush(NULL);
    for (int k = 0; k < n; k++) {
        pids[k] = fork();
        if (pids[k] == 0) return k;
        if (pids[k] < 0) {
            for (int j = 0; j < k; j++) kill(pids[j], SIGKILL), waitpid(pids[j], NULL, 0);
            return -2;
        }
    }
    return -1;
}

int rl_test_wait_n(const pid_t *pids, int n, double limit_s, int *status) {
    bool done[RL_TEST_MAX_CHILDREN] = {0};
    int left = n, lost = 0;
    double deadline = mono_s() + limit_s;
    while (left > 0) {
        for (int k = 0; k < n; k++) {
            if (done[k]) continue;
            pid_t w = waitpid(pids[k], &status[k], WNOHANG);
            if (w == pids[k] || (w < 0 && errno != EINTR)) {
                if (w < 0) status[k] = -1, lost++;
                done[k] = true, left--;
            }
        }
        if (left == 0) break;
        if (limit_s >= 0 && mono_s() > deadline) {
            /* the deadline is for all of them: whoever still runs hangs */
            for (int k = 0; k < n; k++)
                if (!done[k]) {
                    kill(pids[k], SIGKILL);
                    while (waitpid(pids[k], NULL, 0) < 0 && errno == EINTR) {}
                    status[k] = -1, lost++, done[k] = true;
                }
            break;
        }
        usleep(5000);
    }
    return lost;
}

int rl_test_exit_code(int status) {
    if (status == -1) return -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}
