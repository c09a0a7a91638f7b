/* A node's trainer processes: fork/exec with their rank environment, reap,
 * signal, stop with a grace period. Shared by the static launcher and the
 * elastic agent, which differ only in where the ranks come from. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

struct rl_group {
    int n, rank0;
    pid_t *pid;
    bool *alive;
    int *status;
    int *msg_fd; /* each trainer's termination message (a memfd; -1: none) */
    int *ctl_fd; /* the agent's end of each control channel (-1: none) */
    unsigned char *parked; /* 0, or how: PARKED_LOST (its ring broke) or PARKED_YIELD */
    long long *parked_step;
    char parked_why[400]; /* the first parked trainer's words */
    int left;
};

enum { PARKED_LOST = 1, PARKED_YIELD = 2 };

int rl_wait_exit_status(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

void rl_group_describe(char *dst, size_t n, int status) {
    if (WIFEXITED(status)) snprintf(dst, n, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(dst, n, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else snprintf(dst, n, "ended with wait status %d", status);
}

int rl_group_spawn(const rl_group_opts *o, rl_group **out, rl_err *e) {
    *out = NULL;
    int n = o->nproc;
    rl_group *g = calloc(1, sizeof *g);
    if (g) {
        g->pid = calloc((size_t)n, sizeof *g->pid);
        g->alive = calloc((size_t)n, sizeof *g->alive);
        g->status = calloc((size_t)n, sizeof *g->status);
        g->msg_fd = malloc((size_t)n * sizeof *g->msg_fd);
        g->ctl_fd = malloc((size_t)n * sizeof *g->ctl_fd);
        g->parked = calloc((size_t)n, sizeof *g->parked);
        g->parked_step = calloc((size_t)n, sizeof *g->parked_step);
    }
    if (!g || !g->pid || !g->alive || !g->status || !g->msg_fd || !g->ctl_fd || !g->parked || !g->parked_step) {
        if (g) free(g->msg_fd), free(g->ctl_fd), g->msg_fd = g->ctl_fd = NULL; /* not filled yet */
        rl_group_free(g);
        return rl_errf(e, RL_ENOMEM, "launcher: out of memory");
    }
    g->n = n, g->rank0 = o->rank0;
    /* The trainers' termination messages (their RL_ENV_TERMINATION_LOG):
     * memory files, so no directory has to be writable and nothing is left
     * behind; without one a trainer says why in its log only. */
    for (int i = 0; i < n; i++) {
        g->msg_fd[i] = memfd_create("ringleader-termination", MFD_CLOEXEC);
        g->ctl_fd[i] = -1; /* what rl_group_free closes, should the next step fail */
    }
    int *child_ctl = malloc((size_t)n * sizeof *child_ctl);
    if (!child_ctl) {
        rl_group_free(g);
        return rl_errf(e, RL_ENOMEM, "launcher: out of memory");
    }
    for (int i = 0; i < n; i++) {
        int sv[2] = {-1, -1};
        if (o->ctl && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) sv[0] = sv[1] = -1;
        g->ctl_fd[i] = sv[0], child_ctl[i] = sv[1];
    }
    pid_t parent = getpid();
    char val[32];
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p < 0) {
            int err = errno;
            for (int k = i; k < n; k++)
                if (child_ctl[k] >= 0) close(child_ctl[k]);
            free(child_ctl);
            rl_group_stop(g, 0);
            rl_group_free(g);
            return rl_errf(e, RL_EIO, "launcher: fork: %s", strerror(err));
        }
        if (p == 0) {
            /* A trainer must not outlive its agent: an agent killed with
             * SIGKILL cannot stop its children, and an orphaned trainer
             * would hold its GPU and ring sockets into the next round. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);
            int rank = o->rank0 + i;
#define SETI(k, v) (snprintf(val, sizeof val, "%d", (v)), setenv((k), val, 1))
            SETI("RANK", rank);
            SETI("WORLD_SIZE", o->world);
            SETI("LOCAL_RANK", i);
            SETI("LOCAL_WORLD_SIZE", n);
            SETI("GROUP_RANK", o->group_rank);
            SETI("MASTER_PORT", o->master_port);
            setenv("MASTER_ADDR", o->master_addr, 1);
            /* N trainers each running as many OpenMP threads as there are
             * cores oversubscribe the node (spinning threads then starve each
             * other); like torchrun, split the cores unless the user chose. */
            if (!getenv("OMP_NUM_THREADS")) {
                long cpus = sysconf(_SC_NPROCESSORS_ONLN);
                SETI("OMP_NUM_THREADS", cpus / n > 1 ? (int)(cpus / n) : 1);
            }
            for (int k = 0; o->env && o->env[k]; k += 2) setenv(o->env[k], o->env[k + 1], 1);
            /* The stats pipe goes to local rank 0 only: one writer per node
             * is enough (losses and norms are already averaged over every
             * rank) and global rank 0, which saves checkpoints, is always a
             * local rank 0. Everyone else loses the fd at exec (CLOEXEC). */
            if (i == 0 && o->stats_fd > 2 && fcntl(o->stats_fd, F_SETFD, 0) == 0) {
                SETI(RL_ENV_STATS_FD, o->stats_fd);
            } else {
                unsetenv(RL_ENV_STATS_FD);
            }
            /* its own message file, not the pod's: the agent says why the
             * pod ends, with what the trainer wrote here */
            if (g->msg_fd[i] >= 0 && fcntl(g->msg_fd[i], F_SETFD, 0) == 0) {
                char path[64];
                snprintf(path, sizeof path, "/proc/self/fd/%d", g->msg_fd[i]);
                setenv(RL_ENV_TERMINATION_LOG, path, 1);
            } else {
                unsetenv(RL_ENV_TERMINATION_LOG);
            }
            /* its control channel: without one it ends when its round does */
            if (child_ctl[i] >= 0 && fcntl(child_ctl[i], F_SETFD, 0) == 0) SETI(RL_ENV_CTL_FD, child_ctl[i]);
            else unsetenv(RL_ENV_CTL_FD);
            setenv(RL_ENV_CHILD, "1", 1);
            setenv(RL_ENV_STORE_HOSTED, "1", 1);
#undef SETI
            /* the agent's signal mask and handlers are not the trainer's */
            sigset_t none;
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, NULL);
            execv(o->argv[0], o->argv);
            fprintf(stderr, "ringleader-worker: error: rank %d: exec %s: %s\n", rank, o->argv[0],
                    strerror(errno));
            _exit(127);
        }
        if (child_ctl[i] >= 0) close(child_ctl[i]), child_ctl[i] = -1;
        g->pid[i] = p, g->alive[i] = true, g->left++;
        rl_log(RL_LOG_INFO, "spawned", "\"rank\":%d,\"local_rank\":%d,\"pid\":%d", o->rank0 + i, i, (int)p);
    }
    free(child_ctl);
    *out = g;
    return RL_OK;
}

/* How much an ended process explains a failure. When a rank dies its peers
 * fail milliseconds later, often within one look, so blame one: a rank
 * killed by a signal is the likelier cause than one that exited with an
 * error, and a status whose class says "not mine" (a lost peer, the
 * infrastructure, a preemption) is the least likely. */
static int blame(int status) {
    switch (rl_exit_class(rl_wait_exit_status(status))) {
    case RL_FAIL_NONE: return 0;
    case RL_FAIL_INFRA:
    case RL_FAIL_PREEMPTION: return 1;
    default: return WIFSIGNALED(status) ? 3 : 2;
    }
}

int rl_group_poll(rl_group *g, int *bad_local, int *bad_status) {
    int status, first = -1, worst = 0;
    pid_t p;
    while ((p = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < g->n; i++) {
            if (!g->alive[i] || g->pid[i] != p) continue;
            g->alive[i] = false, g->left--;
            g->status[i] = status;
            int b = blame(status);
            if (b > worst) worst = b, first = i;
        }
    }
    if (first < 0) return 0;
    if (bad_local) *bad_local = first;
    if (bad_status) *bad_status = g->status[first];
    return 1;
}

int rl_group_left(const rl_group *g) { return g ? g->left : 0; }
int rl_group_rank0(const rl_group *g) { return g->rank0; }
pid_t rl_group_pid(const rl_group *g, int i) { return g->pid[i]; }

void rl_group_signal(rl_group *g, int sig) {
    for (int i = 0; g && i < g->n; i++)
        if (g->alive[i]) kill(g->pid[i], sig);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void rl_group_stop(rl_group *g, double grace_s) {
    if (!g) return;
    rl_group_signal(g, grace_s > 0 ? SIGTERM : SIGKILL);
    /* a stopped trainer (SIGSTOP, a debugger's hold: what a hang verdict
     * names) takes its SIGTERM only once it runs again */
    if (grace_s > 0) rl_group_signal(g, SIGCONT);
    double kill_at = rl_now() + grace_s;
    while (g->left > 0) {
        rl_group_poll(g, NULL, NULL);
        if (g->left == 0) break;
        if (rl_now() > kill_at) {
            rl_group_signal(g, SIGKILL);
            kill_at = rl_now() + 3600;
        }
        sleep_ms(10);
    }
}

void rl_group_message(const rl_group *g, int i, char *dst, size_t n) {
    dst[0] = '\0';
    if (!g || i < 0 || i >= g->n || g->msg_fd[i] < 0 || n == 0) return;
    ssize_t r = pread(g->msg_fd[i], dst, n - 1, 0);
    size_t len = r > 0 ? (size_t)r : 0;
    while (len > 0 && (dst[len - 1] == '\n' || dst[len - 1] == ' ')) len--;
    dst[len] = '\0';
    /* the trainer's class prefix: whoever reads this names the class itself */
    rl_fail_class cls;
    const char *why = rl_fail_message_split(dst, &cls);
    memmove(dst, why, strlen(why) + 1);
    /* one line: the report and the log take it as a field */
    for (char *c = dst; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
}

int rl_group_size(const rl_group *g) { return g ? g->n : 0; }

bool rl_group_any_stopped(const rl_group *g) {
    for (int i = 0; g && i < g->n; i++) {
        if (!g->alive[i]) continue;
        char path[64], buf[256];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)g->pid[i]);
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = 0;
        /* "pid (comm) S ...": the state follows the last ')' */
        const char *p = strrchr(buf, ')');
        if (p && (p[1] == ' ') && (p[2] == 'T' || p[2] == 't')) return true;
    }
    return false;
}

int rl_group_parked(rl_group *g, long long *step, char *why, size_t wn) {
    int parked = 0;
    char m[512];
    for (int i = 0; g && i < g->n; i++) {
        ssize_t r;
        while (!g->parked[i] && g->ctl_fd[i] >= 0 && (r = recv(g->ctl_fd[i], m, sizeof m - 1, MSG_DONTWAIT)) > 0) {
            m[r] = 0;
            char *end;
            bool lost = strncmp(m, "parked ", 7) == 0, yielded = strncmp(m, "yielded ", 8) == 0;
            long long s = lost || yielded ? strtoll(m + (lost ? 7 : 8), &end, 10) : -1;
            if (s < 0) continue; /* nothing else is said this way */
            g->parked[i] = lost ? PARKED_LOST : PARKED_YIELD, g->parked_step[i] = s;
            if (!g->parked_why[0]) snprintf(g->parked_why, sizeof g->parked_why, "%s", *end ? end + 1 : "");
        }
        if (g->parked[i] && g->alive[i]) {
            if (!parked++ || g->parked_step[i] > *step) *step = g->parked_step[i];
        }
    }
    if (why && wn) snprintf(why, wn, "%s", g ? g->parked_why : "");
    return parked;
}

int rl_group_yielded(const rl_group *g) {
    int n = 0;
    for (int i = 0; g && i < g->n; i++) n += g->alive[i] && g->parked[i] == PARKED_YIELD;
    return n;
}

static void say(rl_group *g, const char *m) {
    for (int i = 0; g && i < g->n; i++)
        if (g->alive[i] && !g->parked[i] && g->ctl_fd[i] >= 0) (void)send(g->ctl_fd[i], m, strlen(m), MSG_NOSIGNAL);
}

void rl_group_park(rl_group *g) { say(g, "park"); }
void rl_group_yield(rl_group *g) { say(g, "yield"); }

int rl_group_rejoin(rl_group *g, const rl_ctl_round *first, rl_err *e) {
    char m[512];
    for (int i = 0; i < g->n; i++) {
        rl_ctl_round r = *first;
        r.rank = first->rank + i;
        int len = rl_ctl_round_format(&r, m, sizeof m);
        if (!g->alive[i] || g->ctl_fd[i] < 0 || len < 0 || send(g->ctl_fd[i], m, (size_t)len, MSG_NOSIGNAL) != len)
            return rl_errf(e, RL_EIO, "trainer %d (pid %d) cannot take the new round", first->rank + i, (int)g->pid[i]);
        g->parked[i] = 0;
        rl_log(RL_LOG_INFO, "rejoined", "\"rank\":%d,\"local_rank\":%d,\"pid\":%d,\"world\":%d", r.rank, i,
               (int)g->pid[i], r.world);
    }
    g->rank0 = first->rank;
    g->parked_why[0] = 0;
    return RL_OK;
}

void rl_group_free(rl_group *g) {
    if (!g) return;
    for (int i = 0; g->msg_fd && i < g->n; i++)
        if (g->msg_fd[i] >= 0) close(g->msg_fd[i]);
    for (int i = 0; g->ctl_fd && i < g->n; i++)
        if (g->ctl_fd[i] >= 0) close(g->ctl_fd[i]);
    free(g->ctl_fd);
    free(g->parked);
    free(g->parked_step);
    free(g->msg_fd);
    free(g->pid);
    free(g->alive);
    free(g->status);
    free(g);
}
