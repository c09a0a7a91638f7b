/* Spawn, await and stop server processes for tests; see daemon.h. */
#include "daemon.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s) { usleep((useconds_t)(s * 1e6)); }

int rl_test_daemon_spawn(const rl_test_daemon_opts *o) {
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0) return pid < 0 ? -1 : (int)pid;
    prctl(PR_SET_PDEATHSIG, o->death_signal ? o->death_signal : SIGKILL);
    if (getppid() != parent) _exit(127); /* the test died before prctl */
    if (o->dir && chdir(o->dir) != 0) _exit(126);
    if (o->log) {
        int fd = open(o->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2), close(fd);
    }
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    for (int i = 0; o->env && o->env[i]; i++) putenv((char *)o->env[i]);
    execvp(o->argv[0], o->argv);
    _exit(127);
}

int rl_test_daemon_await(int *pid, bool (*ready)(void *ud), void *ud, double timeout_s, double poll_s,
                         int *status) {
    double deadline = mono_s() + timeout_s;
    while (mono_s() < deadline) {
        if (ready(ud)) return 0;
        int st;
        if (waitpid((pid_t)*pid, &st, WNOHANG) == (pid_t)*pid) { /* died: a port taken, a bad flag */
            if (status) *status = st;
            *pid = -1;
            return -1;
        }
        sleep_s(poll_s);
    }
    return -2;
}

void rl_test_daemon_stop(int *pid, double grace_s) {
    if (*pid <= 0) return;
    pid_t p = (pid_t)*pid;
    *pid = -1;
    int st;
    if (grace_s > 0) {
        kill(p, SIGTERM);
        double deadline = mono_s() + grace_s;
        for (;;) {
            pid_t w = waitpid(p, &st, WNOHANG);
            if (w == p || (w < 0 && errno != EINTR)) return; /* exited (or not ours) */
            if (mono_s() > deadline) break;
            sleep_s(0.01);
        }
    }
    kill(p, SIGKILL);
    while (waitpid(p, &st, 0) < 0 && errno == EINTR) {}
}

int rl_test_daemon_run(const rl_test_daemon_opts *o, double timeout_s) {
    int pid = rl_test_daemon_spawn(o);
    if (pid < 0) return -1;
    double end = mono_s() + timeout_s;
    int st;
    while (mono_s() < end) {
        if (waitpid((pid_t)pid, &st, WNOHANG) == (pid_t)pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        sleep_s(0.02);
    }
    rl_test_daemon_stop(&pid, 0);
    return -1;
}

void rl_test_daemon_log_tail(const char *path, size_t max) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, sz > (long)max ? sz - (long)max : 0, SEEK_SET);
    char *buf = malloc(max + 1);
    size_t got = buf ? fread(buf, 1, max, f) : 0;
    fclose(f);
    if (!buf) return;
    buf[got] = '\0';
    fprintf(stderr, "---- %s (tail)\n%s\n", path, buf);
    free(buf);
}

int rl_test_daemon_free_ports(int *ports, int n) {
    int fds[4] = {-1, -1, -1, -1}, ok = 0;
    for (int i = 0; i < n && i < 4; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t sl = sizeof sa;
        if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&sa, sizeof sa) != 0 ||
            getsockname(fds[i], (struct sockaddr *)&sa, &sl) != 0)
            break;
        ports[i] = ntohs(sa.sin_port), ok++;
    }
    for (int i = 0; i < 4; i++)
        if (fds[i] >= 0) close(fds[i]);
    return ok == n ? 0 : -1;
}
