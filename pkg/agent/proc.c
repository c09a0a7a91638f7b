/* One trainer process of a distributed job. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "comm/comm.h"
#include "ddp/ddp.h"
#include "hang/hang.h"

/* Catch inconsistent launches before any collective can hang on them: the
 * first process to arrive fixes WORLD_SIZE, and each rank can be claimed
 * once. Two processes with one RANK, or ranks that disagree on the world
 * size, fail here with a message naming the cause. */
static int claim_place(rl_store *s, const char *prefix, const rl_static_env *env, rl_err *e) {
    char key[320], mine[32];
    snprintf(mine, sizeof mine, "%d", env->world);
    bool swapped;
    void *cur = NULL;
    size_t clen;
    snprintf(key, sizeof key, "%s/world", prefix);
    int rc = rl_store_cas(s, key, NULL, 0, mine, strlen(mine), &swapped, &cur, &clen, e);
    if (rc) return rc;
    if (!swapped && (clen != strlen(mine) || memcmp(cur, mine, clen) != 0)) {
        rc = rl_errf(e, RL_EINPUT, "WORLD_SIZE=%d, but another rank of this job said WORLD_SIZE=%.*s",
                     env->world, (int)(clen < 16 ? clen : 16), (const char *)cur);
        free(cur);
        return rc;
    }
    free(cur);
    snprintf(key, sizeof key, "%s/rank/%d", prefix, env->rank);
    if ((rc = rl_store_cas(s, key, NULL, 0, "1", 1, &swapped, NULL, NULL, e))) return rc;
    if (!swapped)
        return rl_errf(e, RL_EINPUT, "RANK=%d is claimed by another process of this job (duplicate RANK)",
                       env->rank);
    return RL_OK;
}

static void watch_step(void *ud, const rl_step_stats *st) {
    rl_hang_watch_step(ud, st->step, st->step_s, st->allreduce_s);
}

/* The watch's lines to the agent, on a sink of its own (its own thread). */
static void watch_report(void *ud, const rl_stats_msg *m) { rl_stats_sink_send(ud, m); }

/* The pre-flight's network probe: long enough that a link's start and
 * the ranks' skew are small beside it (1.3 ms at 100 Gb/s, 13 ms at 10) */
#define PREFLIGHT_PROBE_BYTES ((size_t)16 << 20)

/* With more than one node, the pre-flight measures the links between them. */
static bool probes(const rl_job_config *settled, const rl_static_env *env) {
    return settled->dist.preflight_min_ratio > 0 && env->world > env->local_world;
}

/* The link into this node, measured by its first rank (whose left
 * neighbour is the node before) once the watch runs, so that the other
 * figures are judged without waiting for it (a starved node is slow at
 * this too); every rank takes part: a collective. */
static int probe_links(const rl_job_config *settled, const rl_static_env *env, rl_comm *comm, rl_hang_watch *watch,
                       rl_err *e) {
    double net = 0;
    if (!probes(settled, env) || !watch) return RL_OK; /* no watch on any rank: nobody judges */
    /* every rank's copy figure is measured before any link carries the
     * probe, which would slow the copies it overlapped */
    if (rl_comm_barrier(comm, e) || rl_comm_link_probe(comm, PREFLIGHT_PROBE_BYTES, &net, e))
        return rl_err_wrap(e, "the pre-flight's link probe");
    if (env->local_rank == 0) rl_hang_watch_set_net(watch, net);
    return RL_OK;
}

/* The hang watch of this rank (hang.h); NULL when dist.hang_factor is 0. */
static int start_watch(const rl_proc_opts *o, const rl_static_env *env, const rl_job_config *settled, rl_comm *comm,
                       const char *prefix, rl_stats_sink *sink, rl_hang_watch **out, rl_err *e) {
    rl_stats_sink_open(sink, o->stats, o->stats_fd);
    double shm = 0, gbps = 0;
    if (settled->dist.preflight_min_ratio > 0 && env->world > 1) rl_hang_measure(&shm, &gbps);
    rl_hang_watch_opts ho = {
        .comm = comm, .rank = env->rank, .world = env->world,
        .store_host = env->master_addr, .store_port = env->master_port, .secret = o->secret,
        .prefix = prefix, .pod = o->pod, .node = o->node,
        /* the first rank of the second node, whose agent has a stats pipe */
        .deputy = env->rank == (env->world > env->local_world ? env->local_world : 1),
        .factor = settled->dist.hang_factor, .min_s = settled->dist.hang_min_s, .timeout_s = settled->dist.timeout_s,
        .straggler_factor = settled->dist.straggler_factor, .ckpt = &settled->ckpt,
        .preflight_min_ratio = settled->dist.preflight_min_ratio, .shm_bytes = shm, .copy_gbps = gbps,
        .net_pending = probes(settled, env) && env->local_rank == 0,
        .report = watch_report, .report_ud = sink,
    };
    return rl_hang_watch_start(&ho, out, e);
}

/* What one round of this process holds: its store client, communicator,
 * hang watch and DDP. The trainer outlives it when the agent parks the
 * process (in-place recovery, rl_ctl). */
typedef struct round_parts {
    rl_store *store;
    rl_comm *comm;
    rl_ddp *ddp;
    rl_hang_watch *watch;
    rl_stats_sink sink;
} round_parts;

/* Store, place, communicator, watch; the trainer built (first round) or
 * moved into the new world; DDP; identical replicas. */
static int round_up(const rl_proc_opts *o, const rl_job_config *settled, const rl_static_env *env,
                    const char *prefix, rl_ctl *ctl, round_parts *p, rl_train_dist *dist, rl_trainer **tr,
                    rl_stats_reporter *reporter, rl_err *e) {
    const rl_job_config *cfg = o->cfg;
    const char *secret = o->secret;
    int rc;
    if ((rc = rl_job_config_check_world(cfg, env->world, "config", e)) ||
        (rc = rl_store_connect(env->master_addr, env->master_port, cfg->dist.timeout_s, &p->store, e)))
        return rc;
    char id[32], comm_prefix[300];
    snprintf(id, sizeof id, "rank-%d", env->rank);
    snprintf(comm_prefix, sizeof comm_prefix, "%s/comm", prefix);
    /* the agent may end the round while it forms (rl_ctl_cancel_flag) */
    rl_store_set_cancel(p->store, rl_ctl_cancel_flag(ctl));
    if (secret && *secret && (rc = rl_store_auth(p->store, id, secret, strlen(secret), e))) return rc;
    if ((rc = claim_place(p->store, prefix, env, e))) return rc;
    rl_comm_opts co = {
        .backend = settled->dist.backend,
        .rank = env->rank,
        .world = env->world,
        .store = p->store,
        .secret = secret,
        .secret_len = secret ? strlen(secret) : 0,
        .prefix = comm_prefix,
        /* in a pod the operator sets POD_IP; locally everything is loopback */
        .host = o->host && *o->host ? o->host : "127.0.0.1",
        .timeout_s = cfg->dist.timeout_s,
        .device = env->local_rank,
        .cancel = rl_ctl_cancel_flag(ctl),
    };
    if ((rc = rl_comm_init(&co, &p->comm, e))) return rc;
    if (!rl_ctl_arm(ctl, p->comm)) return rl_errf(e, RL_EABORT, "the agent parked this rank before it started");
    if ((rc = start_watch(o, env, settled, p->comm, prefix, &p->sink, &p->watch, e)) ||
        (rc = probe_links(settled, env, p->comm, p->watch, e)) || (rc = rl_comm_barrier(p->comm, e)))
        return rc;
    rl_ctl_steady(ctl); /* every rank is in: a yield from now on waits for an agreed step */
    *dist = (rl_train_dist){.rank = env->rank, .world = env->world, .local_rank = env->local_rank};
    if (!*tr ? (rc = rl_trainer_new(tr, settled, dist, e)) : (rc = rl_trainer_set_dist(*tr, dist, e))) return rc;
    rl_trainer_set_stop(*tr, o->stop);
    rl_trainer_set_yield(*tr, rl_ctl_yield_flag(ctl));
    /* steps and checkpoints to the agent's pipe (local rank 0 has one), or
     * to in-process metrics */
    rl_stats_reporter_attach(reporter, *tr, o->stats, o->stats_fd,
                             p->watch ? &(rl_train_observer){.ud = p->watch, .on_step = watch_step} : NULL);
    rl_ddp_opts dopt = {
        .first_bucket_bytes = rl_train_mib_bytes(cfg->dist.first_bucket_mb),
        .bucket_bytes = rl_train_mib_bytes(cfg->dist.bucket_mb),
        .min_buckets = cfg->dist.min_buckets,
        .timeout_s = cfg->dist.timeout_s * 4,
        .grad_stream = rl_trainer_stream(*tr),
        .reduce_bf16 = strcmp(cfg->dist.reduce_dtype, "bf16") == 0,
        .shard = rl_shard_mode_of(cfg->dist.shard),
        .stretch = rl_train_stretch(&cfg->model),
        .host_update = strcmp(cfg->train.offload, "none") != 0, /* the host updates the shard */
    };
    dopt.regions = rl_trainer_grad_regions(*tr, &dopt.nregions);
    if ((rc = rl_ddp_create(p->comm, rl_trainer_grads(*tr), rl_trainer_nparams(*tr), &dopt, &p->ddp, e))) return rc;
    rl_ddp_attach(p->ddp, dist);
    /* identical replicas come with the resume in rl_trainer_run: the most
     * advanced live one, a checkpoint, or rank 0's initial weights */
    if (env->rank == 0)
        rl_log(RL_LOG_INFO, "ddp", "\"world\":%d,\"backend\":\"%s\",\"buckets\":%d,\"source\":\"%s\"",
               env->world, rl_comm_backend(p->comm), rl_ddp_nbuckets(p->ddp), env->source);
    return RL_OK;
}

/* The round's parts gone; a hang verdict becomes the failure's words. */
static int round_down(round_parts *p, rl_ctl *ctl, int rc, bool keep_ring, rl_err *e) {
    if (rc && p->comm && !keep_ring) rl_comm_abort(p->comm);
    rl_ctl_arm(ctl, NULL);
    /* a hang aborted the ring: infrastructure (a peer stopped), named */
    char hung[600];
    if (rl_hang_watch_stop(p->watch, rc != 0 && !keep_ring, hung, sizeof hung) && rc) rc = rl_errf(e, RL_EPEER, "hang: %s", hung);
    rl_ddp_destroy(p->ddp);
    if (p->comm) rl_comm_destroy(p->comm);
    if (p->store) rl_store_close(p->store);
    *p = (round_parts){0};
    return rc;
}

/* A failure the replica survives whole: a peer or the ring gone (or a
 * round that could not form), not this process's own fault nor a stop;
 * or a yield (the agent asked, the round ends gracefully). */
static bool parkable(int rc, const rl_proc_opts *o, const rl_trainer *tr) {
    if (*o->stop || (tr && rl_trainer_summary(tr)->preempted)) return false;
    if (tr && rl_trainer_summary(tr)->yielded) return true;
    return rc == RL_EPEER || rc == RL_EABORT || rc == RL_ETIMEOUT || rc == RL_EIO;
}

/* Wait, parked, for the agent's next round: env and prefix then name this
 * process's place in it. */
static int park(rl_ctl *ctl, const rl_proc_opts *o, rl_trainer *tr, rl_static_env *env, char *prefix, size_t pn,
                const char *why, rl_err *e) {
    long long step = tr ? rl_trainer_steps_done(tr) : 0;
    bool yielded = tr && rl_trainer_summary(tr)->yielded;
    char j[700];
    rl_log(yielded ? RL_LOG_INFO : RL_LOG_WARN, "parked", "\"step\":%lld,\"yielded\":%s,\"why\":\"%s\"", step,
           yielded ? "true" : "false", rl_json_escape(j, sizeof j, why));
    rl_ctl_round next;
    int rc = rl_ctl_park(ctl, step, yielded, why, o->stop, &next, e);
    if (rc) return rc;
    env->rank = next.rank, env->world = next.world, env->master_port = next.master_port;
    snprintf(env->master_addr, sizeof env->master_addr, "%s", next.master_addr);
    snprintf(prefix, pn, "%s", next.prefix);
    rl_log_rank(env->rank);
    return RL_OK;
}

int rl_proc_run(const rl_proc_opts *o, rl_run_summary *summary, rl_err *e) {
    const rl_job_config *cfg = o->cfg;
    rl_static_env env = *o->env;
    rl_store_server *server = NULL;
    rl_trainer *tr = NULL;
    rl_ctl *ctl = NULL;
    rl_train_dist dist;
    rl_stats_reporter reporter;
    int rc;
    memset(summary, 0, sizeof *summary);

    if ((rc = rl_job_config_check_world(cfg, env.world, "config", e))) return rc;
    /* Launched by SLURM or by hand, nobody hosts the store: rank 0 does, on
     * MASTER_ADDR (where the others look for it), with the job's secret. */
    const char *secret = o->secret;
    if (env.rank == 0 && !o->store_hosted) {
        char host[256];
        /* one node: MASTER_ADDR is this machine whatever it resolves to */
        if (env.world == env.local_world) snprintf(host, sizeof host, "%s", env.master_addr);
        else rl_static_store_host(env.master_addr, false, host, sizeof host);
        size_t sl = secret ? strlen(secret) : 0;
        if ((rc = rl_store_server_start_auth(host, env.master_port, sl ? secret : NULL, sl, &server, e))) return rc;
    }
    /* An elastic agent runs each round's trainers under their own key
     * prefix on the leader's store, which wants the job's secret. */
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%.63s", o->store_prefix && *o->store_prefix ? o->store_prefix : "static");
    /* the device decides the backend; settled once, here, for both */
    rl_job_config settled = *cfg;
    if ((rc = rl_train_pick_device(&settled, e))) goto out;
    if (o->ctl_fd && (rc = rl_ctl_open(o->ctl_fd, &ctl, e))) goto out;
    for (;;) {
        round_parts p = {0};
        bool together = false; /* every rank leaves the ring after the same step */
        rc = round_up(o, &settled, &env, prefix, ctl, &p, &dist, &tr, &reporter, e);
        /* resumes from the newest checkpoint first (rank 0 reads,
         * broadcasts), or live from a replica that survived a round change */
        if (!rc && o->starting) *o->starting = 0;
        if (!rc && !(rc = rl_trainer_run(tr, e))) {
            uint64_t digest[2] = {rl_trainer_summary(tr)->data_count, rl_trainer_summary(tr)->data_sum};
            if (!(rc = rl_ddp_sum_u64(p.ddp, digest, 2, e))) {
                *summary = *rl_trainer_summary(tr);
                summary->data_count = digest[0], summary->data_sum = digest[1];
                if (o->save_params) rc = rl_trainer_save_params(tr, o->save_params, e); /* rank 0 writes */
                /* nobody leaves (closing its sockets) while a peer still reduces */
                if (!rc) rc = rl_comm_barrier(p.comm, e);
            }
        } else if (rc && tr && (rl_trainer_summary(tr)->preempted || rl_trainer_summary(tr)->yielded)) {
            summary->preempted = rl_trainer_summary(tr)->preempted;
            summary->preempt_saved = rl_trainer_summary(tr)->preempt_saved;
            /* every rank stopped after the same step (and, preempted, knows
             * the checkpoint is committed): leave together instead of
             * aborting the ring */
            rl_err be = {0};
            together = summary->preempted ? summary->preempt_saved : true;
            if (together) (void)rl_comm_barrier(p.comm, &be);
        }
        rc = round_down(&p, ctl, rc, together, e);
        if (!rc || !ctl || !parkable(rc, o, tr)) break;
        char why[520];
        snprintf(why, sizeof why, "%s", e->msg);
        if (park(ctl, o, tr, &env, prefix, sizeof prefix, why, e)) {
            rc = rl_errf(e, RL_EPEER, "%s", why); /* the agent ended it: the failure stands */
            break;
        }
        *e = (rl_err){0};
    }
out:
    rl_ctl_close(ctl);
    rl_trainer_free(tr);
    if (server) rl_store_server_stop(server);
    if (rc) rl_err_wrap(e, "rank %d", env.rank);
    return rc;
}
