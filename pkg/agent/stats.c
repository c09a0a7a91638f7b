/* Node stats: the trainers' stats lines -> the latest values and the
 * agent's Prometheus metrics; and the trainer's reporter. */
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"

enum {
    M_STEP, M_LOSS, M_TPS, M_GNORM, M_LR, M_STEP_S, M_TFLOPS, M_MFU, M_AR, M_AR_BUSY,
    M_CKPT_S, M_CKPT_STEP, M_CKPT_AGE, M_ROUND, M_WORLD, M_RESTARTS, M_ROUNDS, M_HANGS, M_RECOVERY_S, M_STEPS_LOST,
    M_SLOW, /* RL_STATS_SLOW_MAX slots of ringleader_straggler, one family */
    M_N = M_SLOW + RL_STATS_SLOW_MAX
};

static const struct {
    rl_metric_kind kind;
    const char *name, *help;
} defs[M_N] = {
    [M_STEP] = {RL_METRIC_GAUGE, "ringleader_step", "Optimizer steps completed by the job."},
    [M_LOSS] = {RL_METRIC_GAUGE, "ringleader_loss", "Training loss of the last step (mean over the global batch)."},
    [M_TPS] = {RL_METRIC_GAUGE, "ringleader_tokens_per_second",
               "Tokens of the last step, all ranks, divided by its wall time."},
    [M_GNORM] = {RL_METRIC_GAUGE, "ringleader_grad_norm", "Global gradient norm of the last step, before clipping."},
    [M_LR] = {RL_METRIC_GAUGE, "ringleader_learning_rate", "Learning rate of the last step."},
    [M_STEP_S] = {RL_METRIC_GAUGE, "ringleader_step_seconds", "Wall time of the last optimizer step."},
    [M_TFLOPS] = {RL_METRIC_GAUGE, "ringleader_model_tflops",
                  "Model FLOP/s of the whole job / 1e12: (6 N + 12 L H T) x tokens per second "
                  "(N multiplying parameters, L layers, H heads x head_dim, T sequence length)."},
    [M_MFU] = {RL_METRIC_GAUGE, "ringleader_mfu",
               "Model FLOPs utilisation: ringleader_model_tflops / (RINGLEADER_PEAK_TFLOPS x world size)."},
    [M_AR] = {RL_METRIC_GAUGE, "ringleader_allreduce_seconds",
              "Time the last step waited after backward for gradient reduction (the part not overlapped)."},
    [M_AR_BUSY] = {RL_METRIC_GAUGE, "ringleader_allreduce_busy_seconds",
                   "Time the last step's gradient buckets spent in allreduce, overlapped or not."},
    [M_CKPT_S] = {RL_METRIC_GAUGE, "ringleader_checkpoint_seconds",
                  "Duration of the last checkpoint save, snapshot to commit."},
    [M_CKPT_STEP] = {RL_METRIC_GAUGE, "ringleader_checkpoint_last_step", "Step of the last committed checkpoint."},
    [M_CKPT_AGE] = {RL_METRIC_AGE, "ringleader_checkpoint_age_seconds", "Seconds since the last checkpoint committed."},
    [M_ROUND] = {RL_METRIC_GAUGE, "ringleader_rdzv_round", "Rendezvous round this node's trainers run in."},
    [M_WORLD] = {RL_METRIC_GAUGE, "ringleader_world_size", "Trainer processes in the job (all nodes)."},
    [M_RESTARTS] = {RL_METRIC_COUNTER, "ringleader_restarts_total",
                    "Trainer crashes on this node (lost peers and preemptions are not crashes)."},
    [M_ROUNDS] = {RL_METRIC_COUNTER, "ringleader_rounds_total", "Rounds this node's trainers were started for."},
    [M_HANGS] = {RL_METRIC_COUNTER, "ringleader_hangs_total",
                 "Stuck collectives rank 0 diagnosed here (the job's Hung condition names the rank)."},
    [M_RECOVERY_S] = {RL_METRIC_GAUGE, "ringleader_recovery_seconds",
                      "The last round change: from the last step before it to the first step after it."},
    [M_STEPS_LOST] = {RL_METRIC_GAUGE, "ringleader_recovery_steps_lost",
                      "The last round change: steps done again (the last step before it less the one resumed from)."},
#define SLOT(k) [M_SLOW + k] = {RL_METRIC_GAUGE, "ringleader_straggler{slot=\"" #k "\"}", SLOW_HELP}
#define SLOW_HELP "A straggler rank: its busy time per step over the median rank's (absent when none)."
    SLOT(0), SLOT(1), SLOT(2), SLOT(3),
#undef SLOT
#undef SLOW_HELP
};

struct rl_node_stats {
    rl_node_stats_opts o;
    rl_metrics *reg;
    int id[M_N];
    rl_metrics_server *srv;
    int rfd, wfd; /* the pipe; -1 when none */
    rl_stats_reader rd;
    pthread_mutex_t mu; /* snap: the agent's loop, or a trainer thread in-process */
    rl_node_snapshot snap;
    /* recovery: the last step seen before the current round, and when */
    double last_step_unix;
    long long before_step;
    double before_unix;
    bool awaiting_first; /* no step of the current round yet */
};

int rl_node_stats_start(const rl_node_stats_opts *o, rl_node_stats **out, rl_err *e) {
    *out = NULL;
    rl_node_stats *ns = calloc(1, sizeof *ns);
    if (!ns) return rl_errf(e, RL_ENOMEM, "metrics: out of memory");
    ns->o = *o;
    ns->rfd = ns->wfd = -1;
    pthread_mutex_init(&ns->mu, NULL);
    ns->snap = (rl_node_snapshot){.step = -1, .steps = -1, .loss = NAN, .tokens_per_s = NAN, .ckpt_step = -1,
                                  .round = -1};
    ns->before_step = -1;
    int rc = rl_metrics_new(&ns->reg, e);
    for (int i = 0; !rc && i < M_N; i++) rc = rl_metrics_define(ns->reg, defs[i].kind, defs[i].name, defs[i].help, &ns->id[i], e);
    if (!rc && o->pipe) {
        int fds[2];
        /* both ends non-blocking (one open file description each, so the
         * trainers' write end is too): the agent polls, a trainer drops */
        if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) rc = rl_errf(e, RL_EIO, "metrics: cannot create the stats pipe");
        else ns->rfd = fds[0], ns->wfd = fds[1];
        rl_stats_reader_init(&ns->rd, ns->rfd);
    }
    if (!rc) rc = rl_metrics_start(o->port, o->addr, ns->reg, &ns->srv, e);
    if (rc) {
        rl_node_stats_stop(ns);
        return rc;
    }
    if (ns->srv) {
        char b[160];
        rl_log(RL_LOG_INFO, "metrics_listen", "\"addr\":\"%s\",\"port\":%d,\"paths\":[\"/metrics\",\"/healthz\"]",
               rl_json_escape(b, sizeof b, o->addr[0] ? o->addr : "0.0.0.0"), rl_metrics_server_port(ns->srv));
    }
    *out = ns;
    return RL_OK;
}

void rl_node_stats_stop(rl_node_stats *ns) {
    if (!ns) return;
    rl_metrics_stop(ns->srv); /* first: the HTTP thread reads the registry */
    rl_metrics_free(ns->reg);
    if (ns->rfd >= 0) close(ns->rfd);
    if (ns->wfd >= 0) close(ns->wfd);
    pthread_mutex_destroy(&ns->mu);
    free(ns);
}

int rl_node_stats_fd(const rl_node_stats *ns) { return ns ? ns->wfd : -1; }
int rl_node_stats_port(const rl_node_stats *ns) { return ns ? rl_metrics_server_port(ns->srv) : 0; }
rl_metrics *rl_node_stats_registry(rl_node_stats *ns) { return ns ? ns->reg : NULL; }

static void set_if(rl_node_stats *ns, int k, double v, bool ok) {
    if (ok && isfinite(v)) rl_metrics_set(ns->reg, ns->id[k], v);
}

/* Rank 0's stragglers: the gauge slots relabelled {rank,pod,node}, the rest absent. */
static void apply_pace(rl_node_stats *ns, const rl_stats_msg *m) {
    for (int i = 0; i < RL_STATS_SLOW_MAX; i++) {
        int id = ns->id[M_SLOW + i];
        char rank[16];
        snprintf(rank, sizeof rank, "%d", i < m->nslow ? m->slow[i].rank : 0);
        const char *labels[] = {"rank", rank, "pod", m->slow[i].pod, "node", m->slow[i].node, NULL};
        rl_err e = {0};
        if (i < m->nslow && rl_metrics_relabel(ns->reg, id, labels, &e) == RL_OK && isfinite(m->slow[i].ratio))
            rl_metrics_set(ns->reg, id, m->slow[i].ratio);
        else
            rl_metrics_clear(ns->reg, id);
    }
    pthread_mutex_lock(&ns->mu);
    snprintf(ns->snap.stragglers, sizeof ns->snap.stragglers, "%s", m->why);
    ns->snap.pace_known = true;
    pthread_mutex_unlock(&ns->mu);
}

/* The first step of a round after one that had steps: how long the job
 * was without one, and how many steps it does again. Under ns->mu. */
static void recovered(rl_node_stats *ns, long long step) {
    double now = rl_wall_now();
    if (ns->awaiting_first && ns->before_step >= 0) {
        rl_node_snapshot *s = &ns->snap;
        s->recovery_s = now - ns->before_unix;
        s->steps_lost = ns->before_step - (step - 1) > 0 ? ns->before_step - (step - 1) : 0;
        s->recovery_round = s->round, s->recovered = true;
        rl_metrics_set(ns->reg, ns->id[M_RECOVERY_S], s->recovery_s);
        rl_metrics_set(ns->reg, ns->id[M_STEPS_LOST], (double)s->steps_lost);
        rl_log(RL_LOG_INFO, "recovered", "\"round\":%lld,\"seconds\":%.3f,\"steps_lost\":%lld,\"resumed_at\":%lld",
               s->round, s->recovery_s, s->steps_lost, step);
    }
    ns->awaiting_first = false;
    ns->last_step_unix = now;
}

void rl_node_stats_apply(rl_node_stats *ns, const rl_stats_msg *m) {
    if (!ns) return;
    if (m->kind == RL_STATS_STEP) {
        set_if(ns, M_STEP, (double)m->step, true);
        set_if(ns, M_LOSS, m->loss, true);
        set_if(ns, M_TPS, m->tokens_per_s, true);
        set_if(ns, M_GNORM, m->grad_norm, true);
        set_if(ns, M_LR, m->lr, true);
        set_if(ns, M_STEP_S, m->step_s, true);
        double tflops = m->flops_per_token * m->tokens_per_s / 1e12;
        set_if(ns, M_TFLOPS, tflops, m->flops_per_token > 0);
        /* Only against a peak someone stated: a CPU has no honest single
         * peak (vector width, clocks and cores shared with other work all
         * move it), so without RINGLEADER_PEAK_TFLOPS the metric is absent
         * rather than a made-up fraction. */
        set_if(ns, M_MFU, tflops / (ns->o.peak_tflops * (m->world > 0 ? m->world : 1)),
               ns->o.peak_tflops > 0 && m->flops_per_token > 0);
        set_if(ns, M_AR, m->allreduce_s, m->allreduce_s >= 0);
        set_if(ns, M_AR_BUSY, m->allreduce_busy_s, m->allreduce_busy_s >= 0);
        set_if(ns, M_WORLD, m->world, m->world > 0);
        pthread_mutex_lock(&ns->mu);
        recovered(ns, m->step);
        ns->snap.step = m->step, ns->snap.steps = m->steps;
        ns->snap.loss = m->loss, ns->snap.tokens_per_s = m->tokens_per_s;
        if (m->world > 0) ns->snap.world = m->world;
        pthread_mutex_unlock(&ns->mu);
    } else if (m->kind == RL_STATS_CKPT) {
        pthread_mutex_lock(&ns->mu);
        /* a resumed-from checkpoint never replaces a newer commit we saw */
        bool newer = !m->resumed || m->step >= ns->snap.ckpt_step;
        if (newer) {
            ns->snap.ckpt_step = m->step, ns->snap.ckpt_unix = m->ckpt_unix;
            snprintf(ns->snap.ckpt_uri, sizeof ns->snap.ckpt_uri, "%s", m->uri);
        }
        pthread_mutex_unlock(&ns->mu);
        if (!newer) return;
        set_if(ns, M_CKPT_STEP, (double)m->step, true);
        set_if(ns, M_CKPT_AGE, m->ckpt_unix, m->ckpt_unix > 0);
        set_if(ns, M_CKPT_S, m->ckpt_s, m->ckpt_s >= 0);
    } else if (m->kind == RL_STATS_PACE) {
        apply_pace(ns, m);
    } else if (m->kind == RL_STATS_DEGRADED) {
        pthread_mutex_lock(&ns->mu);
        snprintf(ns->snap.degraded, sizeof ns->snap.degraded, "%s", m->why);
        ns->snap.preflight_known = true;
        ns->snap.ndegraded = 0;
        for (int i = 0; i < m->nslow && i < RL_STATS_SLOW_MAX; i++)
            if (m->slow[i].pod[0])
                snprintf(ns->snap.degraded_pods[ns->snap.ndegraded++], sizeof ns->snap.degraded_pods[0], "%s",
                         m->slow[i].pod);
        ns->snap.degraded_round = ns->snap.round;
        pthread_mutex_unlock(&ns->mu);
    } else if (m->kind == RL_STATS_HUNG) {
        rl_metrics_inc(ns->reg, ns->id[M_HANGS], 1);
        pthread_mutex_lock(&ns->mu);
        snprintf(ns->snap.hung_why, sizeof ns->snap.hung_why, "%s", m->why[0] ? m->why : "a collective hung");
        snprintf(ns->snap.hung_dump, sizeof ns->snap.hung_dump, "%s", m->uri);
        ns->snap.hung_round = ns->snap.round, ns->snap.hung_unix = rl_wall_now();
        pthread_mutex_unlock(&ns->mu);
    }
}

static void apply_cb(void *ud, const rl_stats_msg *m) { rl_node_stats_apply(ud, m); }

void rl_node_stats_poll(rl_node_stats *ns) {
    if (ns && ns->rfd >= 0) rl_stats_read(&ns->rd, apply_cb, ns);
}

void rl_node_stats_round(rl_node_stats *ns, long long round, int world) {
    if (!ns) return;
    rl_metrics_set(ns->reg, ns->id[M_ROUND], (double)round);
    rl_metrics_set(ns->reg, ns->id[M_WORLD], world);
    rl_metrics_inc(ns->reg, ns->id[M_ROUNDS], 1);
    pthread_mutex_lock(&ns->mu);
    ns->snap.round = round, ns->snap.world = world;
    /* what the round change is measured from (a round without steps in
     * between keeps the older mark) */
    if (!ns->awaiting_first) ns->before_step = ns->snap.step, ns->before_unix = ns->last_step_unix;
    ns->awaiting_first = true;
    pthread_mutex_unlock(&ns->mu);
}

void rl_node_stats_crash(rl_node_stats *ns) {
    if (ns) rl_metrics_inc(ns->reg, ns->id[M_RESTARTS], 1);
}

void rl_node_stats_snapshot(rl_node_stats *ns, rl_node_snapshot *out) {
    pthread_mutex_lock(&ns->mu);
    *out = ns->snap;
    pthread_mutex_unlock(&ns->mu);
}

/* ---- the trainer's side ------------------------------------------------------------------- */
void rl_stats_sink_open(rl_stats_sink *s, rl_node_stats *direct, const char *stats_fd) {
    rl_stats_writer_open(&s->w, stats_fd);
    s->direct = direct;
}

void rl_stats_sink_send(rl_stats_sink *s, const rl_stats_msg *m) {
    if (s->w.fd >= 0) rl_stats_send(&s->w, m);
    else rl_node_stats_apply(s->direct, m);
}

static void on_step(void *ud, const rl_step_stats *st) {
    rl_stats_reporter *r = ud;
    rl_stats_msg m = {.kind = RL_STATS_STEP, .step = st->step, .steps = r->steps, .loss = st->loss, .lr = st->lr,
                      .grad_norm = st->grad_norm, .tokens_per_s = st->tokens_per_s, .step_s = st->step_s,
                      .allreduce_s = st->allreduce_s, .allreduce_busy_s = st->allreduce_busy_s,
                      .flops_per_token = r->flops_per_token, .world = r->world};
    rl_stats_sink_send(&r->sink, &m);
    if (r->also.on_step) r->also.on_step(r->also.ud, st);
}

static void on_ckpt(void *ud, const rl_train_ckpt_event *ev) {
    rl_stats_reporter *r = ud;
    rl_stats_msg m = {.kind = RL_STATS_CKPT, .step = ev->step, .ckpt_s = ev->seconds, .ckpt_unix = ev->unix_time,
                      .resumed = ev->resumed};
    snprintf(m.uri, sizeof m.uri, "%s", ev->uri);
    rl_stats_sink_send(&r->sink, &m);
    if (r->also.on_checkpoint) r->also.on_checkpoint(r->also.ud, ev);
}

void rl_stats_reporter_attach(rl_stats_reporter *r, rl_trainer *tr, rl_node_stats *direct, const char *stats_fd,
                              const rl_train_observer *also) {
    memset(r, 0, sizeof *r);
    rl_stats_sink_open(&r->sink, direct, stats_fd);
    if (also) r->also = *also;
    if (r->sink.w.fd < 0 && !direct && !also) return; /* nobody listens: no observer at all */
    r->steps = rl_trainer_config(tr)->train.steps;
    r->world = rl_trainer_world(tr);
    r->flops_per_token = rl_trainer_flops_per_token(tr);
    rl_trainer_set_observer(tr, &(rl_train_observer){.ud = r, .on_step = on_step, .on_checkpoint = on_ckpt});
}
