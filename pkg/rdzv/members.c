/* The generic membership watcher: a thread running its backend's watch
 * loop, and the published set that the rendezvous reads. Backends publish
 * whole sets (not deltas), so a reader never sees half an update and the
 * version changes only when the set really did. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdzv/members_internal.h"

struct rl_members {
    const rl_members_backend *vt;
    void *ctx;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    volatile int stop;
    rl_peer *peers;
    int n;
    uint64_t version;
    bool synced;
};

static int by_id(const void *a, const void *b) {
    return strcmp(((const rl_peer *)a)->id, ((const rl_peer *)b)->id);
}

void rl_members_set(rl_members *m, const rl_peer *peers, int n) {
    rl_peer *p = malloc(sizeof *p * (size_t)(n > 0 ? n : 1));
    if (!p) return; /* keep the old set; the next change publishes again */
    if (n > 0) memcpy(p, peers, sizeof *p * (size_t)n);
    qsort(p, (size_t)n, sizeof *p, by_id);
    pthread_mutex_lock(&m->mu);
    bool same = m->synced && n == m->n && (n == 0 || memcmp(p, m->peers, sizeof *p * (size_t)n) == 0);
    if (same) {
        free(p);
    } else {
        free(m->peers);
        m->peers = p, m->n = n;
        m->version++;
        m->synced = true;
        rl_log(RL_LOG_INFO, "members", "\"count\":%d,\"version\":%llu", n,
               (unsigned long long)m->version);
        pthread_cond_broadcast(&m->cv);
    }
    pthread_mutex_unlock(&m->mu);
}

static void *run(void *arg) {
    rl_members *m = arg;
    rl_err e = {0};
    if (m->vt->run(m->ctx, m, &m->stop, &e) != RL_OK) rl_log_msg(RL_LOG_ERROR, "members_failed", e.msg);
    return NULL;
}

int rl_members_start(const rl_members_opts *o, rl_members **out, rl_err *e) {
    *out = NULL;
    rl_members *m = calloc(1, sizeof *m);
    if (!m) return rl_errf(e, RL_ENOMEM, "members: out of memory");
    int rc;
    if (!o->backend || strcmp(o->backend, "k8s") == 0)
        rc = rl_members_k8s_new(o, &m->vt, &m->ctx, e);
    else if (strcmp(o->backend, "etcd") == 0)
        rc = rl_members_etcd_new(o, &m->vt, &m->ctx, e);
    else
        rc = rl_errf(e, RL_EINPUT, "members: unknown backend \"%.32s\" (k8s or etcd)", o->backend);
    if (rc) {
        free(m);
        return rc;
    }
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    if (pthread_create(&m->thread, NULL, run, m) != 0) {
        m->vt->destroy(m->ctx);
        free(m);
        return rl_errf(e, RL_EINTERNAL, "members: cannot start its thread");
    }
    m->started = true;
    *out = m;
    return RL_OK;
}

int rl_members_snapshot(rl_members *m, rl_peer *peers, int cap, uint64_t *version, bool *synced) {
    pthread_mutex_lock(&m->mu);
    int n = m->n;
    if (peers && cap > 0 && n > 0) memcpy(peers, m->peers, sizeof *peers * (size_t)(n < cap ? n : cap));
    if (version) *version = m->version;
    if (synced) *synced = m->synced;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void rl_members_wait(rl_members *m, uint64_t seen, double timeout_s) {
    double end = rl_now() + timeout_s;
    pthread_mutex_lock(&m->mu);
    while (m->version == seen && rl_now() < end) rl_cond_wait_s(&m->cv, &m->mu, end - rl_now());
    pthread_mutex_unlock(&m->mu);
}

void rl_members_stop(rl_members *m) {
    if (!m) return;
    m->stop = 1;
    if (m->started) pthread_join(m->thread, NULL);
    m->vt->destroy(m->ctx);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m->peers);
    free(m);
}
