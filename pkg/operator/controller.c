/* The controller around rl_op_reconcile: leader election on a Lease (one
 * active replica), LIST+WATCH of TrainingJobs, of the pods they own and of
 * their progress Leases into an informer cache (cache.h) that reconciles
 * read instead of the API server, a de-duplicated work queue (each event
 * names a job to look at), per-job exponential back-off after a failed
 * reconcile (client-go's workqueue: 5 ms doubling to 1000 s), and a
 * resync (10 minutes) that looks at every job again. Reconciles run on one
 * thread: jobs are independent and each pass is a handful of API calls at
 * most, so one thread keeps the reasoning simple at the scale of training
 * jobs. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics/metrics.h"
#include "operator.h"
#include "operator/cache.h"
#include "elect/elect.h"

typedef struct job_key {
    char ns[254], name[64];
} job_key;

typedef struct keyset {
    job_key *v;
    int n, cap;
} keyset;

/* A job to look at later: after a back-off, or when something it is
 * waiting for is due (rl_op_requeue_after). */
typedef struct later {
    job_key k;
    double at;
    int failures; /* consecutive failed reconciles: the back-off's exponent */
} later;

typedef struct ctl {
    rl_k8s *k;
    rl_op *op;
    const rl_op_opts *o;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    keyset queue, known;
    later *later;
    int nlater, caplater;
    rl_op_cache *cache;
    volatile int halt; /* watches end within ~1 s of this */
    rl_metrics *m;
    int m_leading, m_jobs, m_reconciles, m_errors, m_seconds;
} ctl;

typedef struct watcher {
    ctl *c;
    char path[512];
    const char *ns; /* NULL: every namespace */
    rl_opc_kind kind;
    pthread_t th;
    bool started;
} watcher;

static int keyset_find(const keyset *s, const char *ns, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i].ns, ns) && !strcmp(s->v[i].name, name)) return i;
    return -1;
}

static void keyset_add(keyset *s, const char *ns, const char *name) {
    if (!*ns || !*name || strlen(ns) >= sizeof s->v->ns || strlen(name) >= sizeof s->v->name ||
        keyset_find(s, ns, name) >= 0)
        return;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        job_key *v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v) return; /* the resync finds it again */
        s->v = v, s->cap = cap;
    }
    snprintf(s->v[s->n].ns, sizeof s->v->ns, "%s", ns);
    snprintf(s->v[s->n].name, sizeof s->v->name, "%s", name);
    s->n++;
}

static void keyset_del(keyset *s, int i) {
    if (i < 0 || i >= s->n) return;
    s->v[i] = s->v[--s->n];
}

/* Called with c->mu held. */
static void enqueue_locked(ctl *c, const cJSON *obj, bool pod) {
    keyset_add(&c->queue, rl_op_meta_str(obj, "namespace"), pod ? rl_op_job_label(obj) : rl_op_meta_str(obj, "name"));
}

/* ---- later: back-off and due times -------------------------------------------------------- */
static int later_find(const ctl *c, const job_key *k) {
    for (int i = 0; i < c->nlater; i++)
        if (!strcmp(c->later[i].k.ns, k->ns) && !strcmp(c->later[i].k.name, k->name)) return i;
    return -1;
}

/* After a reconcile of k (c->mu held): failed, back off (5 ms doubling per
 * consecutive failure to 1000 s); else forget its failures, and come back
 * in `due` seconds if the reconcile asked for it (0: not). */
static void after_reconcile_locked(ctl *c, const job_key *k, bool failed, double due) {
    int i = later_find(c, k);
    int failures = failed ? (i >= 0 ? c->later[i].failures : 0) + 1 : 0;
    double delay = failed ? 0.005 * (double)(1ull << (failures < 20 ? failures - 1 : 19)) : due;
    if (delay > 1000) delay = 1000;
    if (!failed && due <= 0) {
        if (i >= 0) c->later[i] = c->later[--c->nlater];
        return;
    }
    if (i < 0) {
        if (c->nlater == c->caplater) {
            int cap = c->caplater ? 2 * c->caplater : 16;
            later *v = realloc(c->later, (size_t)cap * sizeof *v);
            if (!v) return; /* the resync comes back to it */
            c->later = v, c->caplater = cap;
        }
        i = c->nlater++;
        c->later[i].k = *k;
    }
    c->later[i].failures = failures;
    c->later[i].at = rl_now() + delay;
}

/* Queue what is due (c->mu held); the seconds until the next one (<= 0.5). */
static double queue_due_locked(ctl *c) {
    double now = rl_now(), wait = 0.5;
    for (int i = 0; i < c->nlater; i++) {
        if (c->later[i].at <= now) {
            keyset_add(&c->queue, c->later[i].k.ns, c->later[i].k.name);
            c->later[i].at = now + 1e9; /* queued; its failures stay until a success */
        } else if (c->later[i].at - now < wait) {
            wait = c->later[i].at - now;
        }
    }
    return wait;
}

static int on_event(void *ud, rl_k8s_event_type type, const cJSON *obj) {
    watcher *w = ud;
    ctl *c = w->c;
    rl_op_cache_apply(c->cache, w->kind, w->ns, type, obj);
    bool owned = w->kind != RL_OPC_JOBS; /* pods and Leases name their job in a label */
    pthread_mutex_lock(&c->mu);
    if (type == RL_K8S_SYNC) {
        if (!owned) {
            /* the whole set of jobs in this watch's scope: drop those gone */
            for (int i = c->known.n - 1; i >= 0; i--) {
                bool in_scope = !w->ns || !strcmp(w->ns, c->known.v[i].ns);
                bool present = false;
                for (const cJSON *it = obj->child; it && !present; it = it->next)
                    present = !strcmp(rl_op_meta_str(it, "namespace"), c->known.v[i].ns) &&
                              !strcmp(rl_op_meta_str(it, "name"), c->known.v[i].name);
                if (in_scope && !present) keyset_del(&c->known, i);
            }
        }
        for (const cJSON *it = obj->child; it; it = it->next) {
            enqueue_locked(c, it, owned);
            if (!owned) keyset_add(&c->known, rl_op_meta_str(it, "namespace"), rl_op_meta_str(it, "name"));
        }
    } else if (owned) {
        enqueue_locked(c, obj, true);
    } else if (type == RL_K8S_DELETED) {
        keyset_del(&c->known, keyset_find(&c->known, rl_op_meta_str(obj, "namespace"), rl_op_meta_str(obj, "name")));
    } else {
        enqueue_locked(c, obj, false);
        keyset_add(&c->known, rl_op_meta_str(obj, "namespace"), rl_op_meta_str(obj, "name"));
    }
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* A watch that ends with an error (the CRD not installed yet, RBAC not in
 * place, the API away) is retried: an operator that exits for that would
 * crash-loop through an install. */
static void *watch_main(void *arg) {
    watcher *w = arg;
    rl_k8s_watch_opts wo = {.path = w->path, .label_selector = w->kind != RL_OPC_JOBS ? RL_OP_LABEL_JOB : NULL,
                            .stop = &w->c->halt};
    char last[512] = "";
    while (!w->c->halt) {
        rl_err e = {0};
        int rc = rl_k8s_list_watch(w->c->k, &wo, on_event, w, &e);
        if (rc == RL_OK || w->c->halt) break;
        if (strcmp(last, e.msg) != 0) { /* say it once, not every retry */
            char esc[600];
            rl_log(RL_LOG_WARN, "watch_failed", "\"path\":\"%s\",\"error\":\"%s\",\"msg\":\"retrying\"", w->path,
                   rl_json_escape(esc, sizeof esc, e.msg));
            snprintf(last, sizeof last, "%s", e.msg);
        }
        for (int i = 0; i < 20 && !w->c->halt; i++) usleep(100 * 1000);
    }
    return NULL;
}

static int start_watchers(ctl *c, watcher *ws, int *nw, rl_err *e) {
    const char *const all[] = {NULL, NULL};
    const char *const *nss = c->o->namespaces && c->o->namespaces[0] ? c->o->namespaces : all;
    static const struct { const char *gv, *resource; } what[RL_OPC_KINDS] = {
        [RL_OPC_JOBS] = {RL_OP_GV, "trainingjobs"},
        [RL_OPC_PODS] = {"v1", "pods"},
        [RL_OPC_LEASES] = {"coordination.k8s.io/v1", "leases"},
    };
    int count = 0, scopes = 0;
    for (const char *const *ns = nss; scopes == 0 || *ns; ns++) {
        scopes++;
        for (int k = 0; k < RL_OPC_KINDS; k++) {
            watcher *w = &ws[count];
            memset(w, 0, sizeof *w);
            w->c = c, w->kind = (rl_opc_kind)k, w->ns = *ns;
            int rc = rl_k8s_path(w->path, sizeof w->path, what[k].gv, *ns, what[k].resource, NULL, e);
            if (rc) return rc;
            if (pthread_create(&w->th, NULL, watch_main, w) != 0)
                return rl_errf(e, RL_EINTERNAL, "cannot start a watch thread");
            w->started = true;
            *nw = ++count;
        }
        if (!*ns) break;
    }
    for (int k = 0; k < RL_OPC_KINDS; k++) rl_op_cache_expect(c->cache, (rl_opc_kind)k, scopes);
    return RL_OK;
}

static bool leadership_lost(rl_elector *el) {
    if (!el) return false;
    rl_elect_state st;
    rl_elector_state(el, &st);
    return !st.leading;
}

/* The operator's own metrics, served before the election so a standby
 * replica answers /healthz too. */
static int define_metrics(ctl *c, rl_err *e) {
    int rc;
    if ((rc = rl_metrics_new(&c->m, e)) ||
        (rc = rl_metrics_define(c->m, RL_METRIC_GAUGE, "ringleader_operator_leading",
                                "1 while this replica holds the operator Lease", &c->m_leading, e)) ||
        (rc = rl_metrics_define(c->m, RL_METRIC_GAUGE, "ringleader_operator_jobs",
                                "TrainingJobs watched", &c->m_jobs, e)) ||
        (rc = rl_metrics_define(c->m, RL_METRIC_COUNTER, "ringleader_operator_reconciles_total",
                                "reconciles run", &c->m_reconciles, e)) ||
        (rc = rl_metrics_define(c->m, RL_METRIC_COUNTER, "ringleader_operator_reconcile_errors_total",
                                "reconciles that failed (retried at the next resync)", &c->m_errors, e)) ||
        (rc = rl_metrics_define(c->m, RL_METRIC_GAUGE, "ringleader_operator_reconcile_seconds",
                                "duration of the last reconcile", &c->m_seconds, e)))
        return rc;
    rl_metrics_set(c->m, c->m_leading, 0);
    return RL_OK;
}

/* --leader-elect: hold the operator's Lease before doing anything (RL_OK
 * with *el NULL: not asked; RL_OK and *o->stop: stopped while waiting). */
static int wait_to_lead(const rl_op_opts *o, rl_elector **el, rl_err *e) {
    *el = NULL;
    if (!o->leader_elect) return RL_OK;
    rl_elector_opts eo = {.backend = "k8s", .id = o->id, .addr = "", .port = 0,
                          .lease_s = o->lease_s, .renew_deadline_s = o->renew_deadline_s,
                          .retry_s = o->retry_s, .kubeconfig = o->kubeconfig, .ns = o->lease_ns,
                          .lease_name = o->lease_name};
    int rc = rl_elector_start(&eo, el, e);
    if (rc) return rc;
    rl_log(RL_LOG_INFO, "election", "\"lease\":\"%s/%s\",\"msg\":\"waiting to lead\"", o->lease_ns, o->lease_name);
    rl_elect_state st = {0};
    rl_elector_state(*el, &st);
    while (!st.leading && !*o->stop) rl_elector_wait(*el, st.gen, 1.0, &st);
    if (!*o->stop) rl_log(RL_LOG_INFO, "leading", "\"lease\":\"%s/%s\"", o->lease_ns, o->lease_name);
    return RL_OK;
}

/* The next job to reconcile, waiting for one (or for the next due retry,
 * or a resync of every known job) at most a moment. */
static bool next_job(ctl *c, double resync, double *next_resync, job_key *k) {
    bool have = false;
    pthread_mutex_lock(&c->mu);
    if (rl_now() >= *next_resync) {
        for (int i = 0; i < c->known.n; i++) keyset_add(&c->queue, c->known.v[i].ns, c->known.v[i].name);
        *next_resync = rl_now() + resync;
    }
    double wait = queue_due_locked(c);
    if (c->queue.n == 0) rl_cond_wait_s(&c->cv, &c->mu, wait);
    rl_metrics_set(c->m, c->m_jobs, c->known.n);
    if (c->queue.n > 0) {
        *k = c->queue.v[0];
        memmove(c->queue.v, c->queue.v + 1, (size_t)(c->queue.n - 1) * sizeof *k);
        c->queue.n--;
        have = true;
    }
    pthread_mutex_unlock(&c->mu);
    return have;
}

static void reconcile_one(ctl *c, const job_key *k) {
    rl_err re = {0};
    double t0 = rl_now();
    int rrc = rl_op_reconcile(c->op, k->ns, k->name, &re);
    rl_metrics_inc(c->m, c->m_reconciles, 1);
    rl_metrics_set(c->m, c->m_seconds, rl_now() - t0);
    if (rrc != RL_OK) {
        rl_metrics_inc(c->m, c->m_errors, 1);
        char esc[600];
        rl_log(RL_LOG_WARN, "reconcile_failed", "\"job\":\"%s/%s\",\"error\":\"%s\"", k->ns, k->name,
               rl_json_escape(esc, sizeof esc, re.msg));
    }
    pthread_mutex_lock(&c->mu);
    after_reconcile_locked(c, k, rrc != RL_OK, rl_op_requeue_after(c->op));
    pthread_mutex_unlock(&c->mu);
}

int rl_op_run(const rl_op_opts *o, rl_err *e) {
    ctl c;
    memset(&c, 0, sizeof c);
    c.o = o;
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    rl_elector *el = NULL;
    int nns = 0;
    while (o->namespaces && o->namespaces[nns]) nns++;
    watcher *ws = calloc((size_t)(nns ? nns : 1) * RL_OPC_KINDS, sizeof *ws);
    int nw = 0, rc;
    rl_metrics_server *ms = NULL;
    c.cache = rl_op_cache_new();
    if (!ws || !c.cache) {
        free(ws);
        rl_op_cache_free(c.cache);
        return rl_errf(e, RL_ENOMEM, "out of memory");
    }
    rl_k8s_opts ko = {.timeout_s = 30, .connect_timeout_s = 5, .qps = o->qps > 0 ? o->qps : 20,
                      .burst = o->burst > 0 ? o->burst : 30};
    if ((rc = rl_k8s_connect(o->kubeconfig, &ko, &c.k, e)) || (rc = rl_op_new(c.k, &c.op, e))) goto out;
    rl_op_set_stuck_after(c.op, o->stuck_s);
    rl_op_set_metrics_ns(c.op, o->metrics_ns);
    rl_op_use_cache(c.op, c.cache);
    if ((rc = define_metrics(&c, e)) || (rc = rl_metrics_start(o->metrics_port, NULL, c.m, &ms, e)) ||
        (rc = wait_to_lead(o, &el, e)) || *o->stop)
        goto out;
    rl_metrics_set(c.m, c.m_leading, 1);
    if ((rc = start_watchers(&c, ws, &nw, e))) goto out;

    double resync = o->resync_s > 0 ? o->resync_s : 600, next_resync = rl_now() + resync;
    while (!*o->stop) {
        if (leadership_lost(el)) {
            rc = rl_errf(e, RL_EPEER, "lost the leader Lease %s/%s: stopping so another replica takes over",
                         o->lease_ns, o->lease_name);
            break;
        }
        job_key k;
        if (next_job(&c, resync, &next_resync, &k)) reconcile_one(&c, &k);
    }
out:
    c.halt = 1;
    for (int i = 0; i < nw; i++)
        if (ws[i].started) pthread_join(ws[i].th, NULL);
    free(ws);
    if (el) rl_elector_stop(el, true);
    rl_metrics_stop(ms);
    if (c.m) rl_metrics_free(c.m);
    if (c.op) rl_op_free(c.op);
    rl_op_cache_free(c.cache);
    free(c.later);
    if (c.k) rl_k8s_free(c.k);
    free(c.queue.v);
    free(c.known.v);
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
    return rc;
}
