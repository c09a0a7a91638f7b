/* The progress Lease: <job>-progress, annotated by the agent that holds
 * global rank 0, read by the operator into the TrainingJob's status.
 *
 * A Lease of its own, so these writes never race the leader election's
 * optimistic updates of <job>-leader; a JSON merge patch, so no read and
 * no resourceVersion are needed and two writers (a round change in
 * flight) each leave a whole record. The writes run on a thread with the
 * client's timeouts: the agent's loop only swaps in the latest values. */
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent.h"
#include "k8s/k8s.h"

#define ANN "ringleader.dev/"

struct rl_progress {
    rl_k8s *c;
    char ns[254], name[320], job[254], holder[254], path[1024];
    double interval_s;
    pthread_t th;
    bool th_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rl_node_snapshot snap; /* the latest, from the agent */
    bool active, changed, stop, final;
    bool urgent;              /* a new hang: written at once, active or not */
    volatile int abort_calls; /* cancels a call in flight (not on a final stop) */
    bool exists;              /* the Lease is known to exist: patch straight away */
    int failures;
};

static void rfc3339(double unix_s, char *out, size_t n) {
    time_t t = (time_t)unix_s;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

cJSON *rl_progress_annotations(const rl_node_snapshot *s, double now_unix) {
    cJSON *a = cJSON_CreateObject();
    char v[64];
    if (!a) return NULL;
    if (s->step >= 0) {
        snprintf(v, sizeof v, "%lld", s->step);
        cJSON_AddStringToObject(a, ANN "step", v);
    }
    if (isfinite(s->loss)) {
        snprintf(v, sizeof v, "%.6g", s->loss);
        cJSON_AddStringToObject(a, ANN "loss", v);
    }
    if (isfinite(s->tokens_per_s)) {
        snprintf(v, sizeof v, "%.0f", s->tokens_per_s);
        cJSON_AddStringToObject(a, ANN "tokens-per-second", v);
    }
    /* absent rather than "": a patch without it keeps what an earlier
     * holder of rank 0 wrote */
    if (s->ckpt_step >= 0 && s->ckpt_uri[0]) cJSON_AddStringToObject(a, ANN "last-checkpoint", s->ckpt_uri);
    if (s->round >= 0) {
        snprintf(v, sizeof v, "%lld", s->round);
        cJSON_AddStringToObject(a, ANN "round", v);
    }
    if (s->pace_known) cJSON_AddStringToObject(a, ANN "stragglers", s->stragglers);
    if (s->preflight_known) cJSON_AddStringToObject(a, ANN "degraded", s->degraded);
    if (s->recovered) {
        snprintf(v, sizeof v, "%.3f", s->recovery_s);
        cJSON_AddStringToObject(a, ANN "recovery-seconds", v);
        snprintf(v, sizeof v, "%lld", s->steps_lost);
        cJSON_AddStringToObject(a, ANN "recovery-steps-lost", v);
        snprintf(v, sizeof v, "%lld", s->recovery_round);
        cJSON_AddStringToObject(a, ANN "recovery-round", v);
    }
    if (s->hung_why[0]) {
        cJSON_AddStringToObject(a, ANN "hung", s->hung_why);
        snprintf(v, sizeof v, "%lld", s->hung_round);
        cJSON_AddStringToObject(a, ANN "hung-round", v);
        cJSON_AddStringToObject(a, ANN "hung-dump", s->hung_dump);
        rfc3339(s->hung_unix, v, sizeof v);
        cJSON_AddStringToObject(a, ANN "hung-time", v);
    }
    rfc3339(now_unix, v, sizeof v);
    cJSON_AddStringToObject(a, ANN "updated", v);
    return a;
}

/* One write: merge patch, or create the Lease when it is not there. */
static int write_once(rl_progress *p, const rl_node_snapshot *s, rl_err *e) {
    cJSON *ann = rl_progress_annotations(s, rl_wall_now());
    cJSON *obj = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(obj, "metadata");
    cJSON *spec = cJSON_AddObjectToObject(obj, "spec");
    if (!ann || !md || !spec) {
        cJSON_Delete(ann);
        cJSON_Delete(obj);
        return rl_errf(e, RL_ENOMEM, "progress: out of memory");
    }
    cJSON_AddItemToObject(md, "annotations", ann);
    /* a record, not a lock: whoever writes is the holder */
    cJSON_AddStringToObject(spec, "holderIdentity", p->holder);
    long status = 0;
    int rc = RL_EPEER;
    if (p->exists) {
        rc = rl_k8s_merge_patch(p->c, p->path, obj, &status, NULL, e);
        if (rc && status == 404) p->exists = false; /* deleted by someone: create it again */
    }
    if (!p->exists) {
        cJSON_AddStringToObject(obj, "apiVersion", "coordination.k8s.io/v1");
        cJSON_AddStringToObject(obj, "kind", "Lease");
        cJSON_AddStringToObject(md, "name", p->name);
        cJSON_AddStringToObject(md, "namespace", p->ns);
        cJSON *labels = cJSON_AddObjectToObject(md, "labels");
        if (labels) cJSON_AddStringToObject(labels, "ringleader.dev/job", p->job);
        char coll[1024];
        rl_err pe = {0};
        rc = rl_k8s_path(coll, sizeof coll, "coordination.k8s.io/v1", p->ns, "leases", NULL, &pe);
        if (rc) *e = pe;
        else rc = rl_k8s_create(p->c, coll, obj, &status, NULL, e);
        if (rc == RL_OK) {
            p->exists = true;
        } else if (status == 409) {
            /* created meanwhile (by us on a retried POST, or a previous
             * holder): patch it. The create-only members do no harm in a
             * merge patch of the same object. */
            p->exists = true;
            rc = rl_k8s_merge_patch(p->c, p->path, obj, &status, NULL, e);
        }
    }
    cJSON_Delete(obj);
    return rc;
}

static void *progress_thread(void *arg) {
    rl_progress *p = arg;
    double next = 0; /* no write before this (rl_now) */
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && !p->urgent && !(p->active && p->changed && rl_now() >= next)) {
            double wait = p->active && p->changed ? next - rl_now() : 1.0;
            if (wait > 1.0) wait = 1.0;
            if (wait < 0.001) wait = 0.001;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + wait;
            ts.tv_sec = (time_t)t, ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
            pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        }
        bool last = p->stop;
        /* the job's end is written even when nothing changed: "updated"
         * then says when it ended */
        if (last && !(p->final && p->active) && !p->urgent) break;
        rl_node_snapshot s = p->snap;
        p->changed = p->urgent = false;
        pthread_mutex_unlock(&p->mu);

        rl_err e = {0};
        int rc = write_once(p, &s, &e);
        if (rc) {
            /* the first failure and then one in ten: an outage must show
             * without a line every interval */
            if (p->failures++ % 10 == 0) {
                char b[700];
                rl_log(RL_LOG_WARN, "progress_failed", "\"lease\":\"%s\",\"failures\":%d,\"msg\":\"%s\"", p->name,
                       p->failures, rl_json_escape(b, sizeof b, e.msg));
            }
        } else {
            if (p->failures) rl_log(RL_LOG_INFO, "progress_recovered", "\"lease\":\"%s\",\"after_failures\":%d", p->name,
                                    p->failures);
            p->failures = 0;
            rl_log(RL_LOG_DEBUG, "progress", "\"lease\":\"%s\",\"step\":%lld,\"round\":%lld", p->name, s.step, s.round);
        }
        pthread_mutex_lock(&p->mu);
        if (rc) p->changed = true; /* retry at the next interval */
        next = rl_now() + p->interval_s;
        if (last) break;
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int rl_progress_start(const rl_progress_opts *o, rl_progress **out, rl_err *e) {
    *out = NULL;
    if (!o->job || !*o->job || !o->holder || !*o->holder)
        return rl_errf(e, RL_EINPUT, "progress: the job name and this pod's name are needed");
    rl_progress *p = calloc(1, sizeof *p);
    if (!p) return rl_errf(e, RL_ENOMEM, "progress: out of memory");
    p->interval_s = o->interval_s > 0 ? o->interval_s : 5;
    double timeout = o->timeout_s > 0 ? o->timeout_s : 5;
    rl_k8s_opts ko = {.timeout_s = timeout, .connect_timeout_s = timeout < 2 ? timeout : 2,
                      .abort_flag = &p->abort_calls};
    int rc = rl_k8s_connect(o->kubeconfig, &ko, &p->c, e);
    if (!rc) {
        snprintf(p->ns, sizeof p->ns, "%s", o->ns && *o->ns ? o->ns : rl_k8s_namespace(p->c));
        snprintf(p->name, sizeof p->name, "%s-progress", o->job);
        snprintf(p->job, sizeof p->job, "%s", o->job);
        snprintf(p->holder, sizeof p->holder, "%s", o->holder);
        rc = rl_k8s_path(p->path, sizeof p->path, "coordination.k8s.io/v1", p->ns, "leases", p->name, e);
    }
    /* assume it exists (the usual case after the first round): a 404 on
     * the first patch creates it */
    p->exists = true;
    if (!rc) {
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->cv, NULL);
        if (pthread_create(&p->th, NULL, progress_thread, p) != 0) {
            pthread_mutex_destroy(&p->mu);
            pthread_cond_destroy(&p->cv);
            rc = rl_errf(e, RL_EINTERNAL, "progress: cannot start its thread");
        } else {
            p->th_started = true;
        }
    }
    if (rc) {
        rl_k8s_free(p->c);
        free(p);
        return rl_err_wrap(e, "progress Lease");
    }
    *out = p;
    return RL_OK;
}

static bool same(const rl_node_snapshot *a, const rl_node_snapshot *b) {
    return a->step == b->step && a->round == b->round && a->ckpt_step == b->ckpt_step &&
           strcmp(a->ckpt_uri, b->ckpt_uri) == 0 && a->hung_unix == b->hung_unix &&
           strcmp(a->stragglers, b->stragglers) == 0 && strcmp(a->degraded, b->degraded) == 0 &&
           a->preflight_known == b->preflight_known;
}

void rl_progress_update(rl_progress *p, const rl_node_snapshot *s, bool active) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    if (!same(&p->snap, s) || (active && !p->active)) p->changed = true;
    if (s->hung_unix != p->snap.hung_unix) p->urgent = true;
    p->snap = *s;
    p->active = active;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void rl_progress_stop(rl_progress *p, bool final) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true, p->final = final;
    if (!final) p->abort_calls = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->th_started) pthread_join(p->th, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    rl_k8s_free(p->c);
    free(p);
}
