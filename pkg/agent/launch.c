/* The static launcher (torchrun --standalone / --nnodes with a fixed
 * master): node 0 hosts the store; each node forks its trainers and stops
 * them all when one fails. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "agent.h"

/* Node 0's store: on loopback for one node, else on MASTER_ADDR (see
 * rl_static_store_host); with the job's secret when one is given, and a
 * warning when a store that other nodes reach has none. */
static int host_store(const rl_launch_opts *o, rl_store_server **out, rl_err *e) {
    const rl_node_env *ne = &o->node;
    char host[256];
    bool every = rl_static_store_host(ne->master_addr, ne->nnodes == 1, host, sizeof host);
    bool secret = o->secret && *o->secret;
    if (every)
        rl_log(RL_LOG_WARN, "store_every_interface", "\"master_addr\":\"%s\",\"why\":\"it resolves to loopback "
               "here; other nodes reach it by its real address\"", ne->master_addr);
    if (ne->nnodes > 1 && !secret)
        rl_log(RL_LOG_WARN, "store_without_secret", "\"nnodes\":%d,\"why\":\"anyone reaching %s:%d can read and write "
               "the job's keys: set RINGLEADER_RDZV_SECRET on every node\"", ne->nnodes, host, ne->master_port);
    int rc = rl_store_server_start_auth(host, ne->master_port, secret ? o->secret : NULL, secret ? strlen(o->secret) : 0,
                                        out, e);
    if (rc && ne->nnodes > 1) rl_err_wrap(e, "MASTER_ADDR %s (node 0 hosts the store there)", ne->master_addr);
    return rc;
}

int rl_launch(const rl_launch_opts *o, rl_err *e) {
    const rl_node_env *ne = &o->node;
    int n = ne->nproc_per_node, world = ne->nnodes * n;
    if (n < 1) return rl_errf(e, RL_EINPUT, "--nproc-per-node must be at least 1");
    rl_store_server *server = NULL;
    rl_node_stats *ns = NULL;
    int port = ne->master_port, rc;
    /* one node: the trainers meet the store on loopback, where it listens */
    char addr[256];
    snprintf(addr, sizeof addr, "%s", ne->nnodes == 1 ? "127.0.0.1" : ne->master_addr);
    /* metrics first: a port in use is a configuration error, found before
     * anything starts */
    rl_node_stats_opts so = o->stats;
    so.pipe = true;
    if ((rc = rl_node_stats_start(&so, &ns, e))) return rc;
    if (ne->node_rank == 0) {
        if ((rc = host_store(o, &server, e))) {
            rl_node_stats_stop(ns);
            return rc;
        }
        port = rl_store_server_port(server);
    }
    rl_group_opts go = {.argv = o->argv, .nproc = n, .rank0 = ne->node_rank * n, .world = world,
                        .group_rank = ne->node_rank, .master_addr = addr,
                        .master_port = port, .stats_fd = rl_node_stats_fd(ns)};
    rl_group *g = NULL;
    if ((rc = rl_group_spawn(&go, &g, e))) {
        rl_store_server_stop(server);
        rl_node_stats_stop(ns);
        return rc;
    }
    /* a static job is one round */
    rl_node_stats_round(ns, 0, world);
    bool stopping = false, forwarded = false, preempted = false;
    double kill_at = 0;
    while (rl_group_left(g) > 0) {
        if (o->stop && *o->stop && !forwarded) {
            int sig = o->stop_sig && *o->stop_sig ? *o->stop_sig : SIGTERM;
            rl_log(RL_LOG_WARN, "signal", "\"forwarded\":%d", sig);
            rl_group_signal(g, sig);
            forwarded = stopping = true;
            kill_at = rl_now() + o->grace_s;
            if (!rc) rc = rl_errf(e, RL_EABORT, "stopped by signal %d", sig);
        }
        rl_node_stats_poll(ns);
        int bad, status;
        if (rl_group_poll(g, &bad, &status)) {
            /* the launcher ends in the trainer's class: a user error exits
             * 2, the infrastructure 77, a crash 1. The first failure
             * decides, but a user error coming after a peer's failure is
             * its cause (rank 0 refused a bad checkpoint; the others,
             * waiting for its state, may fail first) */
            rl_fail_class cls = rl_exit_class(rl_wait_exit_status(status));
            if (WIFEXITED(status) && WEXITSTATUS(status) == RL_EXIT_PREEMPTED) {
                preempted = true;
            } else if (!rc || rc == RL_EABORT || (cls == RL_FAIL_USER && rc != RL_EINPUT)) {
                if (!rc && cls == RL_FAIL_CRASH) rl_node_stats_crash(ns); /* not one we stopped ourselves */
                char how[96], said[300];
                rl_group_describe(how, sizeof how, status);
                rl_group_message(g, bad, said, sizeof said);
                rc = rl_errf(e, cls == RL_FAIL_USER ? RL_EINPUT : cls == RL_FAIL_INFRA ? RL_EIO : RL_EPEER,
                             "rank %d (pid %d) %s%s%s; stopping the other trainers", ne->node_rank * n + bad,
                             (int)rl_group_pid(g, bad), how, said[0] ? ": " : "", said);
                rl_log_msg(RL_LOG_ERROR, "trainer_failed", e->msg);
            }
            if (!stopping && rc) {
                rl_group_signal(g, SIGTERM);
                stopping = true;
                kill_at = rl_now() + o->grace_s;
            }
            continue;
        }
        if (stopping && rl_now() > kill_at) {
            rl_group_signal(g, SIGKILL);
            kill_at = rl_now() + 3600;
        }
        nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
    }
    rl_node_stats_poll(ns);
    rl_group_free(g);
    rl_store_server_stop(server);
    rl_node_stats_stop(ns);
    if (o->preempted) *o->preempted = preempted;
    return rc;
}
