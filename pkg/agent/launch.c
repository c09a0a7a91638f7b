/* The local launcher: fork/exec nproc_per_node trainers and watch them. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

static void describe(char *dst, size_t n, int status) {
    if (WIFEXITED(status)) snprintf(dst, n, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(dst, n, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else snprintf(dst, n, "ended with wait status %d", status);
}

static void signal_all(const pid_t *pid, const bool *alive, int n, int sig) {
    for (int i = 0; i < n; i++)
        if (alive[i]) kill(pid[i], sig);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int rl_launch(const rl_launch_opts *o, rl_err *e) {
    const rl_node_env *ne = &o->node;
    int n = ne->nproc_per_node, world = ne->nnodes * n;
    if (n < 1) return rl_errf(e, RL_EINPUT, "--nproc-per-node must be at least 1");
    rl_store_server *server = NULL;
    int port = ne->master_port, rc;
    /* Node 0's agent hosts the store, as torchrun's static rendezvous does. */
    if (ne->node_rank == 0) {
        if ((rc = rl_store_server_start(NULL, ne->master_port, &server, e))) return rc;
        port = rl_store_server_port(server);
    }
    pid_t *pid = calloc((size_t)n, sizeof *pid);
    bool *alive = calloc((size_t)n, sizeof *alive);
    if (!pid || !alive) {
        free(pid), free(alive);
        if (server) rl_store_server_stop(server);
        return rl_errf(e, RL_ENOMEM, "launcher: out of memory");
    }
    char val[32];
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p < 0) {
            rc = rl_errf(e, RL_EIO, "launcher: fork: %s", strerror(errno));
            signal_all(pid, alive, i, SIGKILL);
            goto reap;
        }
        if (p == 0) {
            /* child: its rank environment, then the trainer command */
            int rank = ne->node_rank * n + i;
#define SETI(k, v) (snprintf(val, sizeof val, "%d", (v)), setenv((k), val, 1))
            SETI("RANK", rank);
            SETI("WORLD_SIZE", world);
            SETI("LOCAL_RANK", i);
            SETI("LOCAL_WORLD_SIZE", n);
            SETI("GROUP_RANK", ne->node_rank);
            SETI("MASTER_PORT", port);
            setenv("MASTER_ADDR", ne->master_addr, 1);
            /* N trainers each running as many OpenMP threads as there are
             * cores oversubscribe the node (spinning threads then starve each
             * other); like torchrun, split the cores unless the user chose. */
            if (!getenv("OMP_NUM_THREADS")) {
                long cpus = sysconf(_SC_NPROCESSORS_ONLN);
                SETI("OMP_NUM_THREADS", cpus / n > 1 ? (int)(cpus / n) : 1);
            }
#undef SETI
            setenv(RL_ENV_CHILD, "1", 1);
            setenv(RL_ENV_STORE_HOSTED, "1", 1);
            /* the launcher's signal mask and handlers are not the trainer's */
            sigset_t none;
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, NULL);
            execv(o->argv[0], o->argv);
            fprintf(stderr, "ringleader-worker: error: rank %d: exec %s: %s\n", rank, o->argv[0],
                    strerror(errno));
            _exit(127);
        }
        pid[i] = p, alive[i] = true;
        rl_log(RL_LOG_INFO, "spawned", "\"rank\":%d,\"local_rank\":%d,\"pid\":%d", ne->node_rank * n + i, i, (int)p);
    }
    rc = RL_OK;
reap:;
    int left = 0;
    for (int i = 0; i < n; i++) left += alive[i];
    bool stopping = false, forwarded = false;
    double kill_at = 0;
    while (left > 0) {
        if (o->stop && *o->stop && !forwarded) {
            int sig = o->stop_sig && *o->stop_sig ? *o->stop_sig : SIGTERM;
            rl_log(RL_LOG_WARN, "signal", "\"forwarded\":%d", sig);
            signal_all(pid, alive, n, sig);
            forwarded = stopping = true;
            kill_at = rl_now() + o->grace_s;
            if (!rc) rc = rl_errf(e, RL_EABORT, "stopped by signal %d", sig);
        }
        /* Reap everything that ended since the last look, then blame one:
         * when a rank dies, its peers fail a few milliseconds later, often
         * inside the same poll interval, and a rank killed by a signal is
         * the likelier cause than one that exited with an error. */
        int status, first_bad = -1, first_status = 0;
        pid_t p;
        bool reaped = false;
        while ((p = waitpid(-1, &status, WNOHANG)) > 0) {
            reaped = true;
            for (int i = 0; i < n; i++) {
                if (!alive[i] || pid[i] != p) continue;
                alive[i] = false, left--;
                bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
                if (!ok && (first_bad < 0 || (WIFSIGNALED(status) && !WIFSIGNALED(first_status))))
                    first_bad = i, first_status = status;
            }
        }
        if (first_bad >= 0) {
            if (!rc) {
                char how[96];
                describe(how, sizeof how, first_status);
                rc = rl_errf(e, RL_EPEER, "rank %d (pid %d) %s; stopping the other trainers",
                             ne->node_rank * n + first_bad, (int)pid[first_bad], how);
                rl_log_msg(RL_LOG_ERROR, "trainer_failed", e->msg);
            }
            if (!stopping) {
                signal_all(pid, alive, n, SIGTERM);
                stopping = true;
                kill_at = rl_now() + o->grace_s;
            }
        }
        if (reaped) continue;
        if (p < 0 && errno != EINTR) break; /* no children left */
        if (stopping && rl_now() > kill_at) {
            signal_all(pid, alive, n, SIGKILL);
            kill_at = rl_now() + 3600;
        }
        sleep_ms(20);
    }
    free(pid);
    free(alive);
    if (server) rl_store_server_stop(server);
    return rc;
}
