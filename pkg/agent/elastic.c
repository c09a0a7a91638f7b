/* The elastic node agent: election, membership, rounds, trainers.
 *
 * One loop, restartable at any point: find the leader (hosting the store
 * and the round coordinator when it is us), connect and authenticate, join
 * the current round, run this node's trainers for it, and go round again
 * when the round ends, the leader changes or the store goes away. Every
 * wait is a short slice, so a signal, a leader change or a lost store is
 * noticed within a fraction of a second. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

#define JOIN_SLICE_S 1.0
#define TICK_S 0.2
/* how long trainers get to drop their ring and park at a round's end (an
 * op in flight returns at once once aborted; a step's compute finishes first) */
#define PARK_WAIT_S 10.0
/* at a graceful end, how long trainers get at least to agree on a step to
 * yield after and leave together (a step's compute and one reduction) */
#define YIELD_WAIT_S 30.0
/* how long parked trainers wait for the next round (a leader's election
 * takes its lease, 15 s by default) */
#define PARK_KEEP_S 60.0

typedef struct agent {
    const rl_elastic_opts *o;
    rl_elector *el;
    rl_members *mem;
    rl_store_server *srv;
    rl_round_coord *coord;
    long long last_round;
    rl_round_table last_table; /* the last round this agent ran */
    uint64_t gen_seen;
    char leader_id[254];
    rl_node_stats *ns;         /* the trainers' stats, /metrics */
    rl_progress *prog;         /* the progress Lease (k8s only; NULL otherwise) */
    bool rank0_here;           /* this node's trainers include global rank 0 */
    bool user_error;           /* the job failed on a user error (exit 2, not 1) */
    rl_group *parked;          /* trainers kept from the last round for the next (in-place recovery) */
    double parked_since;
} agent;

static void nap(double s) { nanosleep(&(struct timespec){(time_t)s, (long)((s - (double)(time_t)s) * 1e9)}, NULL); }

static char *esc(char *dst, size_t n, const char *s) { return rl_json_escape(dst, n, s); }

/* Host the store and the coordinator exactly while we lead. */
static int follow_leadership(agent *a, const rl_elect_state *st, rl_err *e) {
    const rl_elastic_opts *o = a->o;
    if (st->leading && !a->srv) {
        int rc = rl_store_server_start_auth(o->addr, o->port, o->secret, o->secret_len, &a->srv, e);
        if (rc) return rc;
        /* The previous leader lost its lease: it is dead or cut off, so
         * the first round expects the rest of the last round only. */
        const char *gone = strcmp(a->leader_id, o->id) != 0 ? a->leader_id : NULL;
        rc = rl_round_coord_start(o->addr, rl_store_server_port(a->srv), o->secret, o->secret_len, &o->round,
                                  a->mem, a->last_round + 1, a->last_table.nnodes ? &a->last_table : NULL, gone,
                                  &a->coord, e);
        if (rc) {
            rl_store_server_stop(a->srv);
            a->srv = NULL;
            return rc;
        }
    } else if (!st->leading && a->srv) {
        rl_log_msg(RL_LOG_WARN, "store_stop", "not the leader any more: stopping the rendezvous store");
        rl_round_coord_stop(a->coord);
        rl_store_server_stop(a->srv);
        a->coord = NULL, a->srv = NULL;
    }
    return RL_OK;
}

/* Did the leader change since we joined (or did we gain or lose the lead)? */
static bool leader_changed(agent *a) {
    rl_elect_state st;
    rl_elector_state(a->el, &st);
    return st.leading != (a->srv != NULL) || strcmp(st.leader.id, a->leader_id) != 0;
}

/* The trainers' latest stats to the progress writer (which writes only
 * while we hold rank 0). */
static void publish(agent *a) {
    rl_node_stats_poll(a->ns);
    if (!a->prog) return;
    rl_node_snapshot s;
    rl_node_stats_snapshot(a->ns, &s);
    rl_progress_update(a->prog, &s, a->rank0_here);
}

static void stop_trainers(rl_group *g, double grace_s) {
    rl_group_stop(g, grace_s);
    rl_group_free(g);
}

/* Wait until every trainer parked (true) or one ended, or the time is up,
 * still heartbeating the old round: the next one waits for us. */
static bool all_park(agent *a, rl_group *g, rl_store **s, long long round, double wait_s, long long *step) {
    double until = rl_now() + wait_s, tick = 0;
    int n = rl_group_size(g), bad, status;
    /* (reaping: a trainer may end meanwhile, e.g. one that just finished) */
    while (rl_now() < until && (rl_group_poll(g, &bad, &status), rl_group_left(g) == n) &&
           rl_group_parked(g, step, NULL, 0) < n) {
        if (*s && rl_now() > tick) {
            rl_round_end end;
            rl_err te = {0};
            if (rl_round_tick(*s, round, a->o->id, 0, &end, &te) != RL_OK) *s = NULL;
            tick = rl_now() + TICK_S;
        }
        nap(0.01);
    }
    return rl_group_left(g) == n && rl_group_parked(g, step, NULL, 0) == n;
}

/* The round ended: keep the trainers for the next round when each parks --
 * drops its ring, keeps its state (rl_ctl) -- within the wait; else stop
 * them as before. At a graceful end (every member alive: the job grows)
 * they yield: agree on a step, leave the ring together, nothing lost and
 * nothing saved; failing that, SIGTERM and the grace, so rank 0 checkpoints
 * (and a trainer busy with the final checkpoint finishes it). At a round
 * that broke (or is about to) they park: their ring is aborted. */
static void park_or_stop(agent *a, rl_group *g, rl_store *s, long long round, bool graceful) {
    if (!g) return;
    /* a stopped trainer (what a hang verdict names) cannot park */
    if (a->o->in_place && rl_group_size(g) > 0 && !rl_group_any_stopped(g)) {
        long long step = -1;
        int n = rl_group_size(g);
        graceful ? rl_group_yield(g) : rl_group_park(g);
        double wait_s = !graceful ? PARK_WAIT_S : a->o->grace_s > YIELD_WAIT_S ? a->o->grace_s : YIELD_WAIT_S;
        if (all_park(a, g, &s, round, wait_s, &step)) {
            rl_log(RL_LOG_INFO, "trainers_parked", "\"trainers\":%d,\"step\":%lld,\"yielded\":%d", n, step,
                   rl_group_yielded(g));
            a->parked = g;
            a->parked_since = rl_now();
            return;
        }
        rl_log(RL_LOG_WARN, "park_failed", "\"trainers\":%d,\"left\":%d,\"yield\":%s", n, rl_group_left(g),
               graceful ? "true" : "false");
    }
    stop_trainers(g, graceful ? a->o->grace_s : 0);
}

/* This node's trainers for the round: the parked ones moved into it when
 * they fit (same count, all alive), else new processes. */
static int start_trainers(agent *a, const rl_group_opts *go, const char *prefix, rl_group **g, rl_err *e) {
    rl_group *kept = a->parked;
    a->parked = NULL;
    if (kept && rl_group_size(kept) == go->nproc) {
        rl_ctl_round first = {.rank = go->rank0, .world = go->world, .group_rank = go->group_rank,
                              .master_port = go->master_port};
        snprintf(first.prefix, sizeof first.prefix, "%s", prefix);
        snprintf(first.master_addr, sizeof first.master_addr, "%s", go->master_addr);
        rl_err re = {0};
        if (rl_group_rejoin(kept, &first, &re) == RL_OK) {
            *g = kept;
            return RL_OK;
        }
        rl_log_msg(RL_LOG_WARN, "rejoin_failed", re.msg);
    }
    stop_trainers(kept, 0);
    return rl_group_spawn(go, g, e);
}

/* Rank 0's pre-flight of this round named nodes below the median: tell
 * the coordinator (it leaves them out while the job keeps min_nodes). Once
 * a round; true when sent or nothing to send (rank 0 is elsewhere). */
static bool report_degraded(agent *a, rl_store *s, long long round) {
    if (!a->rank0_here) return true;
    rl_node_snapshot snap;
    rl_node_stats_snapshot(a->ns, &snap);
    if (!snap.preflight_known || snap.degraded_round != round) return false;
    rl_round_degraded d = {.n = snap.ndegraded < RL_ROUND_DEGRADED_MAX ? snap.ndegraded : RL_ROUND_DEGRADED_MAX};
    for (int i = 0; i < d.n; i++) snprintf(d.ids[i], sizeof d.ids[i], "%s", snap.degraded_pods[i]);
    snprintf(d.why, sizeof d.why, "%s", snap.degraded);
    rl_err e = {0};
    if (d.n && rl_round_report_degraded(s, round, &d, &e) != RL_OK)
        rl_log_msg(RL_LOG_WARN, "degraded_report_failed", e.msg);
    return true;
}

typedef enum { RUN_REJOIN, RUN_COMPLETE, RUN_FAILED, RUN_STOPPED } run_result;

/* A trainer ended badly: its class, and the report's words ("rank 3 (pid
 * 812) exited with status 2: data.train: ..."), with what the trainer
 * wrote to its termination message. */
static rl_fail_class trainer_failed(const rl_group *g, int rank0, int bad, int status, char *msg, size_t n) {
    rl_fail_class cls = rl_exit_class(rl_wait_exit_status(status));
    char how[96], said[320], j[1000];
    rl_group_describe(how, sizeof how, status);
    rl_group_message(g, bad, said, sizeof said);
    snprintf(msg, n, "rank %d (pid %d) %s%s%.300s", rank0 + bad, (int)rl_group_pid(g, bad), how,
             said[0] ? ": " : "", said);
    rl_log(cls == RL_FAIL_CRASH || cls == RL_FAIL_USER ? RL_LOG_ERROR : RL_LOG_WARN, "trainer_failed",
           "\"class\":\"%s\",\"msg\":\"%s\"", rl_fail_class_name(cls), esc(j, sizeof j, msg));
    return cls;
}

/* One round's trainers, from spawn to the end of the round. */
static run_result run_round(agent *a, rl_store *s, const rl_round_table *t, const rl_round_node *me,
                            const rl_elect_state *st, char *why, size_t wn) {
    const rl_elastic_opts *o = a->o;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "r%lld", t->round);
    const char *env[] = {RL_ENV_STORE_PREFIX, prefix, NULL};
    int group_rank = (int)(me - t->nodes);
    rl_group_opts go = {.argv = o->argv, .nproc = me->local_world, .rank0 = me->rank0, .world = t->world,
                        .group_rank = group_rank, .master_addr = st->leader.addr,
                        .master_port = st->leader.port, .env = env, .stats_fd = rl_node_stats_fd(a->ns),
                        .ctl = o->in_place};
    rl_group *g = NULL;
    rl_err e = {0};
    if (start_trainers(a, &go, prefix, &g, &e) != RL_OK) {
        snprintf(why, wn, "%s", e.msg);
        rl_round_report(s, t->round, o->id, rl_exit_class(rl_err_exit_status(e.code)), e.msg, &e);
        return RUN_REJOIN;
    }
    rl_node_stats_round(a->ns, t->round, t->world);
    a->rank0_here = me->rank0 == 0;
    publish(a);
    bool reported = false, degraded_sent = false;
    long long parked_step = -1;
    char parked_why[400], jbuf[1000];
    for (;;) {
        if (*o->stop) {
            /* SIGTERM (pod deletion, spot reclaim): trainers stop at a step
             * boundary and rank 0 checkpoints; give them the grace. */
            int sig = o->stop_sig && *o->stop_sig ? *o->stop_sig : SIGTERM;
            rl_log(RL_LOG_WARN, "signal", "\"forwarded\":%d", sig);
            rl_group_signal(g, sig);
            double until = rl_now() + o->grace_s;
            int bad, status;
            while (rl_group_left(g) > 0 && rl_now() < until) {
                if (rl_group_poll(g, &bad, &status) && WIFEXITED(status) &&
                    WEXITSTATUS(status) == RL_EXIT_PREEMPTED && o->preempted)
                    *o->preempted = true;
                nap(0.02);
            }
            stop_trainers(g, 0);
            snprintf(why, wn, "stopped by signal %d", sig);
            return RUN_STOPPED;
        }
        int bad, status;
        rl_round_end end;
        if (rl_round_tick(s, t->round, o->id, TICK_S, &end, &e) != RL_OK) {
            park_or_stop(a, g, NULL, 0, false);
            snprintf(why, wn, "lost the rendezvous store: %s", e.msg);
            return RUN_REJOIN;
        }
        /* Look at the trainers after the tick, not before: when one crashed,
         * its peers fail too and one of theirs may end the round first; the
         * crash must still be reported, or it would not count. Once the job
         * is over there is nothing left to count, and the leader's store may
         * already be gone (the tick told it we read the end). */
        publish(a);
        if (!degraded_sent) degraded_sent = report_degraded(a, s, t->round);
        rl_round_state rs = end.state;
        bool job_over = rs == RL_ROUND_COMPLETE || rs == RL_ROUND_FAILED;
        if (job_over) reported = true;
        if (!reported && rl_group_poll(g, &bad, &status)) {
            char msg[480];
            rl_fail_class cls = trainer_failed(g, me->rank0, bad, status, msg, sizeof msg);
            if (cls == RL_FAIL_CRASH) rl_node_stats_crash(a->ns);
            stop_trainers(g, 0);
            g = NULL;
            if (rl_round_report(s, t->round, o->id, cls, msg, &e) != RL_OK) {
                snprintf(why, wn, "%s", e.msg);
                return RUN_REJOIN;
            }
            reported = true;
        } else if (!reported && g &&
                   rl_group_parked(g, &parked_step, parked_why, sizeof parked_why) > rl_group_yielded(g)) {
            /* a trainer lost its ring and parked: the round is over for it
             * (one that yielded did so because the round ended gracefully:
             * no failure, and the end is on its way here) */
            char msg[480];
            snprintf(msg, sizeof msg, "a trainer of ranks %d-%d parked after step %lld: %.380s", me->rank0,
                     me->rank0 + me->local_world - 1, parked_step, parked_why);
            rl_log(RL_LOG_WARN, "trainer_failed", "\"class\":\"%s\",\"parked\":true,\"msg\":\"%s\"",
                   rl_fail_class_name(RL_FAIL_INFRA), esc(jbuf, sizeof jbuf, msg));
            if (rl_round_report(s, t->round, o->id, RL_FAIL_INFRA, msg, &e) != RL_OK) {
                park_or_stop(a, g, s, t->round, false);
                snprintf(why, wn, "%s", e.msg);
                return RUN_REJOIN;
            }
            reported = true;
        } else if (!reported && g && rl_group_left(g) == 0) {
            publish(a); /* their last lines, before the job can end */
            stop_trainers(g, 0);
            g = NULL;
            if (rl_round_report(s, t->round, o->id, RL_FAIL_NONE, "", &e) != RL_OK) {
                snprintf(why, wn, "%s", e.msg);
                return RUN_REJOIN;
            }
            reported = true;
        }
        if (rs != RL_ROUND_RUNNING) {
            if (rs == RL_ROUND_NEXT) park_or_stop(a, g, s, t->round, end.graceful);
            else stop_trainers(g, 0);
            snprintf(why, wn, "%s%s", rs == RL_ROUND_FAILED ? "the job failed: " : "", end.reason);
            a->user_error = rs == RL_ROUND_FAILED && end.cls == RL_FAIL_USER;
            return rs == RL_ROUND_COMPLETE ? RUN_COMPLETE : rs == RL_ROUND_FAILED ? RUN_FAILED : RUN_REJOIN;
        }
        if (leader_changed(a)) {
            park_or_stop(a, g, s, t->round, false);
            snprintf(why, wn, "the leader changed");
            return RUN_REJOIN;
        }
    }
}

static int agent_loop(agent *a, rl_err *e) {
    const rl_elastic_opts *o = a->o;
    char b1[300], b2[600];
    for (;;) {
        if (*o->stop) return rl_errf(e, RL_EABORT, "stopped by signal");
        rl_elect_state st;
        rl_elector_state(a->el, &st);
        int rc = follow_leadership(a, &st, e);
        if (rc) return rc;
        if (!st.leader.id[0] || st.leader.port <= 0) {
            rl_elector_wait(a->el, st.gen, 0.5, &st);
            continue;
        }
        snprintf(a->leader_id, sizeof a->leader_id, "%s", st.leader.id);
        rl_store *s = NULL;
        rl_err ce = {0};
        if (rl_store_connect(st.leader.addr, st.leader.port, 3, &s, &ce) != RL_OK ||
            rl_store_auth(s, o->id, o->secret, o->secret_len, &ce) != RL_OK) {
            rl_store_close(s);
            /* a store that refuses our secret is a misconfiguration, not a
             * race: say so and stop */
            if (ce.code == RL_EINPUT) return rl_errf(e, RL_EINPUT, "%s", ce.msg);
            rl_log(RL_LOG_WARN, "leader_unreachable", "\"leader\":\"%s\",\"msg\":\"%s\"",
                   esc(b1, sizeof b1, st.leader.id), esc(b2, sizeof b2, ce.msg));
            rl_elector_wait(a->el, st.gen, 1.0, &st);
            continue;
        }
        rl_round_table t = {0};
        long long joined = 0;
        run_result res = RUN_REJOIN;
        char why[600] = "";
        for (;;) {
            rl_err je = {0};
            rc = rl_round_join(s, o->id, o->addr, o->rack, o->nproc, JOIN_SLICE_S, &joined, &t, &je);
            /* parked trainers wait for a round, not for ever: a node left
             * out (a standby) or a long election starts fresh ones later */
            if (rc == RL_ETIMEOUT && a->parked && rl_now() - a->parked_since > PARK_KEEP_S) {
                rl_log(RL_LOG_WARN, "parked_stopped", "\"waited_s\":%.0f", rl_now() - a->parked_since);
                stop_trainers(a->parked, 0);
                a->parked = NULL;
            }
            if (rc == RL_ETIMEOUT && !*o->stop && !leader_changed(a)) {
                rl_elector_state(a->el, &st);
                if (follow_leadership(a, &st, e)) break;
                continue;
            }
            if (rc == RL_EPEER || rc == RL_EINPUT) {
                res = RUN_FAILED;
                a->user_error = rc == RL_EINPUT;
                snprintf(why, sizeof why, "%s", je.msg);
            } else if (rc == RL_OK && t.round < 0) {
                res = RUN_COMPLETE;
            } else if (rc == RL_OK) {
                /* keep the table: a new leader's first round expects it */
                rl_round_table_free(&a->last_table);
                a->last_table = t;
                t = (rl_round_table){0};
                const rl_round_table *lt = &a->last_table;
                const rl_round_node *me = NULL;
                for (int i = 0; i < lt->nnodes; i++)
                    if (strcmp(lt->nodes[i].id, o->id) == 0) me = &lt->nodes[i];
                a->last_round = lt->round;
                rl_log(RL_LOG_INFO, "round_start", "\"round\":%lld,\"world\":%d,\"rank0\":%d,\"nodes\":%d,\"restarts\":%d",
                       lt->round, lt->world, me->rank0, lt->nnodes, lt->restarts);
                res = run_round(a, s, lt, me, &st, why, sizeof why);
            } else {
                snprintf(why, sizeof why, "%s", rc == RL_ETIMEOUT ? "the leader changed" : je.msg);
            }
            break;
        }
        rl_round_table_free(&t);
        rl_store_close(s);
        /* rank 0 may land elsewhere next round: write nothing meanwhile
         * (a completed job keeps it, for the final write) */
        if (res != RUN_COMPLETE) a->rank0_here = false;
        publish(a);
        if (res != RUN_REJOIN) stop_trainers(a->parked, 0), a->parked = NULL;
        switch (res) {
        case RUN_COMPLETE:
            rl_log_msg(RL_LOG_INFO, "job_complete", "every node's trainers finished");
            return RL_OK;
        case RUN_FAILED: /* the exit status says which class failed the job */
            return rl_errf(e, a->user_error ? RL_EINPUT : RL_EPEER, "%s", why);
        case RUN_STOPPED:
            return rl_errf(e, RL_EABORT, "%s", why);
        case RUN_REJOIN:
            rl_log(RL_LOG_WARN, "rejoin", "\"after_round\":%lld,\"reason\":\"%s\"", a->last_round,
                   esc(b2, sizeof b2, why));
            break;
        }
    }
}

int rl_elastic_run(const rl_elastic_opts *o, rl_err *e) {
    if (!o->job || !*o->job) return rl_errf(e, RL_EINPUT, "elastic rendezvous: the job name is missing");
    if (!o->id || !*o->id) return rl_errf(e, RL_EINPUT, "elastic rendezvous: this node's id (POD_NAME) is missing");
    if (!o->addr || !*o->addr) return rl_errf(e, RL_EINPUT, "elastic rendezvous: this node's address (POD_IP) is missing");
    if (!o->secret || o->secret_len == 0)
        return rl_errf(e, RL_EINPUT, "elastic rendezvous: %s is empty (the job's rendezvous secret)", RL_ENV_RDZV_SECRET);
    if (o->nproc < 1) return rl_errf(e, RL_EINPUT, "elastic rendezvous: nproc per node must be at least 1");
    if (o->round.min_nodes < 1 || (o->round.max_nodes && o->round.max_nodes < o->round.min_nodes))
        return rl_errf(e, RL_EINPUT, "elastic rendezvous: nodes %d:%d must be MIN:MAX with 1 <= MIN <= MAX",
                       o->round.min_nodes, o->round.max_nodes);
    bool etcd = o->backend && strcmp(o->backend, "etcd") == 0;
    char lease[300], key[400], prefix[400];
    snprintf(lease, sizeof lease, "%s-leader", o->job);
    snprintf(key, sizeof key, "/ringleader/%s/leader", o->job);
    snprintf(prefix, sizeof prefix, "/ringleader/%s/members/", o->job);
    agent a = {.o = o};
    rl_node_stats_opts so = o->stats;
    so.pipe = true;
    int rc = rl_node_stats_start(&so, &a.ns, e);
    if (rc) return rc;
    if (!etcd) {
        rl_progress_opts po = {.kubeconfig = o->kubeconfig, .ns = o->ns, .job = o->job, .holder = o->id,
                               .interval_s = o->progress_interval_s};
        rl_err pe = {0};
        /* progress is for people and the operator, not for training: a
         * client that cannot be built is reported, and the job goes on */
        if (rl_progress_start(&po, &a.prog, &pe) != RL_OK)
            rl_log_msg(RL_LOG_WARN, "progress_disabled", pe.msg);
    }
    rl_members_opts mo = {.backend = o->backend, .kubeconfig = o->kubeconfig, .ns = o->ns, .service = o->job,
                          .etcd_endpoint = o->etcd_endpoint, .etcd_prefix = prefix, .self_id = o->id,
                          .self_addr = o->addr, .ttl_s = o->round.heartbeat_s * o->round.heartbeat_misses};
    rc = rl_members_start(&mo, &a.mem, e);
    if (rc) {
        rl_progress_stop(a.prog, false);
        rl_node_stats_stop(a.ns);
        return rc;
    }
    rl_elector_opts eo = {.backend = o->backend, .id = o->id, .addr = o->addr, .port = o->port,
                          .lease_s = o->lease_s, .renew_deadline_s = o->renew_deadline_s, .retry_s = o->retry_s,
                          .kubeconfig = o->kubeconfig, .ns = o->ns, .lease_name = lease,
                          .etcd_endpoint = o->etcd_endpoint, .etcd_key = key};
    if ((rc = rl_elector_start(&eo, &a.el, e))) {
        rl_members_stop(a.mem);
        rl_progress_stop(a.prog, false);
        rl_node_stats_stop(a.ns);
        return rc;
    }
    char b[300];
    rl_log(RL_LOG_INFO, "agent_start", "\"id\":\"%s\",\"backend\":\"%s\",\"nproc\":%d,\"nodes\":\"%d:%d\"",
           esc(b, sizeof b, o->id), etcd ? "etcd" : "k8s", o->nproc, o->round.min_nodes,
           o->round.max_nodes ? o->round.max_nodes : o->round.min_nodes);
    rc = agent_loop(&a, e);
    stop_trainers(a.parked, 0);
    /* the job's end, written once more by the holder of rank 0 (bounded by
     * the client's timeout; the trainers are done) */
    publish(&a);
    rl_progress_stop(a.prog, rc == RL_OK);
    rl_round_coord_stop(a.coord);
    rl_store_server_stop(a.srv);
    rl_elector_stop(a.el, true);
    rl_members_stop(a.mem);
    rl_round_table_free(&a.last_table);
    rl_node_stats_stop(a.ns);
    return rc;
}

/* ---- options from the config and the pod ------------------------------------------------ */
int rl_parse_nodes(const char *s, const char *what, int *min, int *max, rl_err *e) {
    char *end;
    long a = strtol(s, &end, 10), b = a;
    if (end != s && *end == ':') {
        const char *t = end + 1;
        b = strtol(t, &end, 10);
        if (end == t) a = -1;
    }
    if (end == s || *end || a < 1 || b < a || b > 1 << 16)
        return rl_errf(e, RL_EINPUT, "%s: \"%.40s\" is not N or MIN:MAX with 1 <= MIN <= MAX", what, s);
    *min = (int)a, *max = (int)b;
    return RL_OK;
}

int rl_elastic_setup(const rl_job_config *cfg, int nproc, const rl_elastic_env *env, rl_elastic_opts *o,
                     rl_err *e) {
    const rl_rdzv_config *rc = &cfg->rdzv;
    memset(o, 0, sizeof *o);
    o->backend = rc->backend;
    if (strcmp(o->backend, "k8s") != 0 && strcmp(o->backend, "etcd") != 0)
        return rl_errf(e, RL_EINPUT, "rdzv.backend: \"%.32s\" is not k8s or etcd", o->backend);
    o->round = (rl_round_opts){.min_nodes = rc->min_nodes, .max_nodes = rc->max_nodes ? rc->max_nodes : rc->min_nodes,
                               .last_call_s = rc->last_call_s, .heartbeat_s = rc->heartbeat_s,
                               .heartbeat_misses = rc->heartbeat_misses, .max_restarts = rc->max_restarts,
                               .bench_s = rc->bench_s};
    int err;
    o->job = rc->job, o->id = env->id, o->addr = env->addr ? env->addr : "", o->port = rc->port;
    o->rack = env->rack;
    o->nproc = nproc > 0 ? nproc : 1;
    o->secret = env->secret ? env->secret : "", o->secret_len = env->secret ? strlen(env->secret) : 0;
    o->lease_s = rc->lease_s, o->renew_deadline_s = rc->renew_deadline_s, o->retry_s = rc->retry_s;
    o->kubeconfig = env->kubeconfig && *env->kubeconfig ? env->kubeconfig : NULL;
    o->ns = env->ns && *env->ns ? env->ns : NULL;
    o->etcd_endpoint = rc->etcd_endpoint;
    o->grace_s = rc->stop_grace_s;
    o->in_place = rc->in_place;
    o->progress_interval_s = env->progress_interval_s;
    if (strcmp(o->backend, "etcd") == 0 && !rc->etcd_endpoint[0])
        return rl_errf(e, RL_EINPUT, "rdzv.etcd_endpoint (or RINGLEADER_ETCD_ENDPOINT) is missing for the etcd backend");
    /* Every world size the job may take must give a whole accumulation count. */
    for (int n = o->round.min_nodes; n <= o->round.max_nodes; n++)
        if ((err = rl_job_config_check_world(cfg, n * o->nproc, "config", e)))
            return rl_err_wrap(e, "with %d nodes x %d processes", n, o->nproc);
    return RL_OK;
}
