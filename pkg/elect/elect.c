/* The generic elector: one thread that asks its backend to acquire or
 * renew every retry period and owns the renew deadline. Keeping the
 * deadline here (not in each backend) makes the safety rule the same for
 * every backend: a leader whose last successful renewal is older than
 * renew_deadline stops leading before it asks anything again -- also when
 * its whole process was paused (SIGSTOP, a stalled VM), because the check
 * runs first on every wake-up and uses the monotonic clock. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "elect/elect_internal.h"

struct rl_elector {
    char id[254];
    double lease_s, renew_deadline_s, retry_s;
    const rl_elect_backend *vt;
    void *ctx;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    rl_elect_state st;
    double last_renew; /* monotonic time of the last successful attempt while leading */
};

/* Caller holds mu. */
static void publish(rl_elector *el, bool leading, const rl_leader *leader) {
    bool changed = leading != el->st.leading || strcmp(leader->id, el->st.leader.id) != 0 ||
                   strcmp(leader->addr, el->st.leader.addr) != 0 || leader->port != el->st.leader.port;
    if (!changed) return;
    char a[300], b[300];
    if (leading && !el->st.leading)
        rl_log(RL_LOG_INFO, "leader_elected", "\"id\":\"%s\"", rl_json_escape(a, sizeof a, el->id));
    else if (!leading && el->st.leading)
        rl_log(RL_LOG_WARN, "leader_lost", "\"id\":\"%s\"", rl_json_escape(a, sizeof a, el->id));
    if (!leading && strcmp(leader->id, el->st.leader.id) != 0)
        rl_log(RL_LOG_INFO, "leader_observed", "\"leader\":\"%s\",\"addr\":\"%s\",\"port\":%d",
               rl_json_escape(a, sizeof a, leader->id), rl_json_escape(b, sizeof b, leader->addr),
               leader->port);
    el->st.leading = leading;
    el->st.leader = *leader;
    el->st.gen++;
    pthread_cond_broadcast(&el->cv);
}

static void *run(void *arg) {
    rl_elector *el = arg;
    pthread_mutex_lock(&el->mu);
    while (!el->stop) {
        if (el->st.leading && rl_now() - el->last_renew > el->renew_deadline_s) {
            el->vt->step_down(el->ctx);
            rl_log(RL_LOG_WARN, "leader_step_down",
                   "\"reason\":\"no successful renewal for %.1f s (renew deadline %.1f s)\"",
                   rl_now() - el->last_renew, el->renew_deadline_s);
            rl_leader none = {0};
            publish(el, false, &none);
        }
        pthread_mutex_unlock(&el->mu);

        bool leading = false;
        rl_leader leader = {0};
        rl_err e = {0};
        int rc = el->vt->attempt(el->ctx, &leading, &leader, &e);
        double now = rl_now();

        pthread_mutex_lock(&el->mu);
        if (rc == RL_OK) {
            if (el->st.errors > 0)
                rl_log(RL_LOG_INFO, "elector_recovered", "\"after_errors\":%d", el->st.errors);
            el->st.errors = 0;
            if (leading) el->last_renew = now;
            publish(el, leading, &leader);
        } else {
            /* A failed renewal does not end leadership by itself: the
             * deadline above does, so one slow answer costs nothing. */
            el->st.errors++;
            snprintf(el->st.last_error, sizeof el->st.last_error, "%s", e.msg);
            if (el->st.errors == 1 || el->st.errors % 10 == 0)
                rl_log(RL_LOG_WARN, "elector_error", "\"errors\":%d,\"msg\":\"%s\"",
                       el->st.errors, rl_json_escape((char[300]){0}, 300, e.msg));
            pthread_cond_broadcast(&el->cv);
        }
        double wait = el->retry_s;
        if (!el->st.leading && el->vt->expires_at) {
            double at = el->vt->expires_at(el->ctx) - rl_now() + 0.01;
            if (at > 0 && at < wait) wait = at;
        }
        if (!el->stop) rl_cond_wait_s(&el->cv, &el->mu, wait);
    }
    pthread_mutex_unlock(&el->mu);
    return NULL;
}

int rl_elector_start(const rl_elector_opts *o, rl_elector **out, rl_err *e) {
    *out = NULL;
    if (!o->id || !*o->id || strlen(o->id) >= sizeof((rl_leader){0}.id))
        return rl_errf(e, RL_EINPUT, "elector: id must be 1..253 characters");
    rl_elector *el = calloc(1, sizeof *el);
    if (!el) return rl_errf(e, RL_ENOMEM, "elector: out of memory");
    snprintf(el->id, sizeof el->id, "%s", o->id);
    el->lease_s = o->lease_s > 0 ? o->lease_s : 15;
    el->renew_deadline_s = o->renew_deadline_s > 0 ? o->renew_deadline_s : 10;
    el->retry_s = o->retry_s > 0 ? o->retry_s : 2;
    /* client-go's rules: the deadline must end leadership before the lease
     * can expire for others, and a renewal must fit in the deadline. */
    int rc = RL_OK;
    if (el->renew_deadline_s >= el->lease_s)
        rc = rl_errf(e, RL_EINPUT, "elector: renew deadline %.3g s must be below the lease duration %.3g s",
                     el->renew_deadline_s, el->lease_s);
    else if (el->retry_s * 1.2 > el->renew_deadline_s)
        rc = rl_errf(e, RL_EINPUT, "elector: retry period %.3g s must be below renew deadline / 1.2 (%.3g s)",
                     el->retry_s, el->renew_deadline_s / 1.2);
    else if (!o->backend || strcmp(o->backend, "k8s") == 0)
        rc = rl_elect_k8s_new(o, &el->vt, &el->ctx, e);
    else if (strcmp(o->backend, "etcd") == 0)
        rc = rl_elect_etcd_new(o, &el->vt, &el->ctx, e);
    else
        rc = rl_errf(e, RL_EINPUT, "elector: unknown backend \"%.32s\" (k8s or etcd)", o->backend);
    if (rc) {
        free(el);
        return rc;
    }
    pthread_mutex_init(&el->mu, NULL);
    pthread_cond_init(&el->cv, NULL);
    if (pthread_create(&el->thread, NULL, run, el) != 0) {
        el->vt->destroy(el->ctx);
        free(el);
        return rl_errf(e, RL_EINTERNAL, "elector: cannot start its thread");
    }
    el->started = true;
    *out = el;
    return RL_OK;
}

void rl_elector_state(rl_elector *el, rl_elect_state *st) {
    pthread_mutex_lock(&el->mu);
    *st = el->st;
    /* A caller asking between wake-ups must not be told "leading" past the
     * deadline either. */
    if (st->leading && rl_now() - el->last_renew > el->renew_deadline_s) st->leading = false;
    pthread_mutex_unlock(&el->mu);
}

void rl_elector_wait(rl_elector *el, uint64_t seen, double timeout_s, rl_elect_state *st) {
    double end = rl_now() + timeout_s;
    pthread_mutex_lock(&el->mu);
    while (el->st.gen == seen && !el->stop && rl_now() < end) rl_cond_wait_s(&el->cv, &el->mu, end - rl_now());
    pthread_mutex_unlock(&el->mu);
    rl_elector_state(el, st);
}

void rl_elector_stop(rl_elector *el, bool release) {
    if (!el) return;
    pthread_mutex_lock(&el->mu);
    el->stop = true;
    pthread_cond_broadcast(&el->cv);
    pthread_mutex_unlock(&el->mu);
    if (el->started) pthread_join(el->thread, NULL);
    if (release && el->st.leading && rl_now() - el->last_renew <= el->renew_deadline_s) {
        rl_err e = {0};
        if (el->vt->release(el->ctx, &e) != RL_OK)
            rl_log_msg(RL_LOG_WARN, "leader_release_failed", e.msg);
        else
            rl_log(RL_LOG_INFO, "leader_released", "\"id\":\"%s\"",
                   rl_json_escape((char[300]){0}, 300, el->id));
    }
    el->vt->destroy(el->ctx);
    pthread_mutex_destroy(&el->mu);
    pthread_cond_destroy(&el->cv);
    free(el);
}
