/* The etcd membership backend.
 *
 * Every node keeps one key, prefix + its id = {"id","addr"}, bound to a
 * lease of its own (TTL ttl_s) that a keeper thread renews every ttl/3. A
 * node that dies stops renewing, etcd deletes its key when the lease runs
 * out, and everyone watching the prefix sees it leave; a clean stop
 * revokes the lease so the others see it leave at once.
 *
 * The set is read with a range and then followed with a watch from the
 * range's revision + 1, so no change between the two is missed. Anything
 * that breaks the watch (compaction, a lost connection, an idle stream)
 * goes back to the range: the range is the truth and the watch only an
 * optimisation. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http.h"
#include "rdzv/members_internal.h"
#include "etcd/etcd.h"

/* Watch streams carry etcd's progress notifications only as often as the
 * server sends them (10 min by default), so an idle limit cannot tell a dead
 * connection from a quiet job quickly; on expiry we simply range again. */
#define WATCH_IDLE_S 45.0

typedef struct etcd_members {
    char endpoint[256];
    char prefix[1024];
    char key[1300]; /* prefix + self id */
    char id[254];
    char *record;
    size_t record_len;
    double ttl_s;
} etcd_members;

/* ---- the keeper: our own key, bound to our lease ------------------------------------ */
typedef struct keeper {
    const etcd_members *x;
    const volatile int *stop;
    pthread_t th;
} keeper;

static void warn_err(const char *event, const rl_err *e, int *streak) {
    /* the first failure of a streak, then every 10th: enough to see it,
     * not a line every second while etcd is down */
    if ((*streak)++ % 10 == 0) rl_log_msg(RL_LOG_WARN, event, e->msg);
}

static int register_self(rl_etcd *c, const etcd_members *x, int64_t *lease, rl_err *e) {
    int64_t id = 0;
    int rc = rl_etcd_lease_grant(c, (int64_t)ceil(x->ttl_s), &id, NULL, e);
    if (rc) return rc;
    rc = rl_etcd_put(c, x->key, x->record, x->record_len, id, NULL, e);
    if (rc) {
        rl_err ignore = {0};
        rl_etcd_lease_revoke(c, id, &ignore);
        return rc;
    }
    *lease = id;
    return RL_OK;
}

/* Renew; put the key again if someone deleted or overwrote it. *lease
 * becomes 0 when the lease is gone. */
static int renew_self(rl_etcd *c, const etcd_members *x, int64_t *lease, rl_err *e) {
    int64_t ttl = 0;
    int rc = rl_etcd_lease_keepalive(c, *lease, &ttl, e);
    if (rc) return rc;
    if (ttl == 0) {
        rl_log(RL_LOG_WARN, "members_etcd_lease_lost", "\"lease\":\"%" PRIx64 "\"", (uint64_t)*lease);
        *lease = 0;
        return RL_OK;
    }
    rl_etcd_kvs r;
    rc = rl_etcd_range(c, x->key, false, &r, e);
    bool intact = !rc && r.n == 1 && r.kvs[0].lease == *lease && r.kvs[0].value_len == x->record_len &&
                  memcmp(r.kvs[0].value, x->record, x->record_len) == 0;
    rl_etcd_kvs_free(&r);
    if (rc || intact) return rc;
    rl_log_msg(RL_LOG_WARN, "members_etcd_key_restored", "our member key was deleted or changed");
    return rl_etcd_put(c, x->key, x->record, x->record_len, *lease, NULL, e);
}

static void *keeper_main(void *arg) {
    keeper *k = arg;
    const etcd_members *x = k->x;
    double period = x->ttl_s / 3;
    rl_etcd *c = NULL;
    rl_err e = {0};
    /* every call well inside one renewal period */
    if (rl_etcd_new(x->endpoint, period < 5 ? period : 5, &c, &e) != RL_OK) {
        rl_log_msg(RL_LOG_ERROR, "members_etcd_keeper", e.msg);
        return NULL;
    }
    rl_etcd_set_abort(c, k->stop);
    int64_t lease = 0;
    int streak = 0;
    while (!*k->stop) {
        int rc = lease ? renew_self(c, x, &lease, &e) : register_self(c, x, &lease, &e);
        if (rc == RL_EABORT) break;
        if (rc) {
            warn_err("members_etcd_keepalive_failed", &e, &streak);
        } else {
            if (streak) rl_log_msg(RL_LOG_INFO, "members_etcd_keepalive_recovered", x->key);
            streak = 0;
            if (!lease) continue; /* lease gone: register again at once */
        }
        /* after a failure, retry sooner than a full period: the lease may
         * have little time left */
        rl_http_sleep(rc ? (period < 1 ? period : 1) : period, k->stop);
    }
    if (lease) {
        /* a clean stop: leave at once instead of after the TTL */
        rl_etcd_set_abort(c, NULL);
        rl_etcd_set_timeout(c, 1.0);
        if (rl_etcd_lease_revoke(c, lease, &e) != RL_OK)
            rl_log_msg(RL_LOG_DEBUG, "members_etcd_revoke_failed", e.msg);
    }
    rl_etcd_free(c);
    return NULL;
}

/* ---- the watcher: everyone's keys ----------------------------------------------- */
typedef struct peer_set {
    rl_peer *p;
    int n, cap;
    const etcd_members *x;
    rl_members *m;
    int bad_logged;
} peer_set;

static int find(const peer_set *s, const char *id) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->p[i].id, id) == 0) return i;
    return -1;
}

static void drop(peer_set *s, const char *id) {
    int i = find(s, id);
    if (i >= 0) s->p[i] = s->p[--s->n];
}

/* A key with a record that makes no sense is nobody: logged, not fatal (a
 * hand-edited key must not take the job down). */
static void upsert(peer_set *s, const rl_etcd_kv *kv) {
    rl_peer p;
    rl_err e = {0};
    size_t pl = strlen(s->x->prefix);
    const char *suffix = kv->key_len >= pl ? kv->key + pl : "";
    if (rl_members_etcd_parse(kv->key, s->x->prefix, kv->value, kv->value_len, &p, &e) != RL_OK) {
        if (s->bad_logged++ < 20) rl_log_msg(RL_LOG_WARN, "members_etcd_bad_record", e.msg);
        drop(s, suffix);
        return;
    }
    int i = find(s, p.id);
    if (i >= 0) {
        s->p[i] = p;
        return;
    }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 16;
        rl_peer *np = realloc(s->p, (size_t)cap * sizeof *np);
        if (!np) return; /* keeps the old set; the next resync tries again */
        s->p = np;
        s->cap = cap;
    }
    s->p[s->n++] = p;
}

static int on_watch(void *ud, const rl_etcd_watch_msg *msg) {
    peer_set *s = ud;
    if (msg->n == 0) return 0; /* created / progress */
    for (int i = 0; i < msg->n; i++) {
        const rl_etcd_event *ev = &msg->events[i];
        if (strncmp(ev->kv.key, s->x->prefix, strlen(s->x->prefix)) != 0) continue;
        if (ev->type == RL_ETCD_EV_DELETE)
            drop(s, ev->kv.key + strlen(s->x->prefix));
        else
            upsert(s, &ev->kv);
    }
    rl_members_set(s->m, s->p, s->n);
    return 0;
}

static int run(void *ctx, rl_members *m, const volatile int *stop, rl_err *e) {
    etcd_members *x = ctx;
    rl_etcd *c = NULL;
    int rc = rl_etcd_new(x->endpoint, 5.0, &c, e);
    if (rc) return rc;
    rl_etcd_set_abort(c, stop);
    keeper k = {.x = x, .stop = stop};
    if (pthread_create(&k.th, NULL, keeper_main, &k) != 0) {
        rl_etcd_free(c);
        return rl_errf(e, RL_EINTERNAL, "etcd membership: cannot start the keepalive thread");
    }
    peer_set s = {.x = x, .m = m};
    uint64_t jitter = rl_http_jitter_seed();
    rl_http_backoff bo = {.base_s = 0.2, .cap_s = 5.0};
    int failures = 0, streak = 0;
    rl_err err = {0};
    while (!*stop) {
        rl_etcd_kvs r;
        rc = rl_etcd_range(c, x->prefix, true, &r, &err);
        if (rc == RL_OK) {
            s.n = 0;
            for (int i = 0; i < r.n; i++) upsert(&s, &r.kvs[i]);
            rl_members_set(m, s.p, s.n);
            int64_t from = r.revision + 1;
            rl_etcd_kvs_free(&r);
            if (streak) rl_log_msg(RL_LOG_INFO, "members_etcd_recovered", x->prefix);
            streak = 0;
            rc = rl_etcd_watch(c, x->prefix, true, from, WATCH_IDLE_S, on_watch, &s, &err);
            if (rc == RL_ETIMEOUT) {
                failures = 0; /* a quiet stream: just look again */
                continue;
            }
            if (rc == RL_EPEER && strstr(err.msg, "compacted")) {
                rl_log_msg(RL_LOG_INFO, "members_etcd_resync", err.msg);
                failures = 0;
                continue;
            }
        } else {
            rl_etcd_kvs_free(&r);
        }
        if (rc == RL_EABORT || *stop) break;
        warn_err("members_etcd_watch_failed", &err, &streak);
        rl_http_sleep(rl_http_backoff_delay(&bo, failures < 10 ? failures : 10, -1, &jitter), stop);
        failures++;
    }
    pthread_join(k.th, NULL);
    free(s.p);
    rl_etcd_free(c);
    return RL_OK;
}

static void destroy(void *ctx) {
    etcd_members *x = ctx;
    if (!x) return;
    free(x->record);
    free(x);
}

static const rl_members_backend VT = {run, destroy};

int rl_members_etcd_new(const rl_members_opts *o, const rl_members_backend **vt, void **ctx,
                        rl_err *e) {
    *vt = NULL;
    *ctx = NULL;
    if (!o->etcd_endpoint || !*o->etcd_endpoint)
        return rl_errf(e, RL_EINPUT, "membership etcd_endpoint: not set (want http://host:port)");
    size_t pl = o->etcd_prefix ? strlen(o->etcd_prefix) : 0;
    /* the trailing '/' keeps job "a" from seeing job "ab"'s members */
    if (pl == 0 || pl >= 1024 || o->etcd_prefix[pl - 1] != '/')
        return rl_errf(e, RL_EINPUT, "membership etcd_prefix: empty, over 1023 bytes or not ending in '/'");
    if (!o->self_id || !*o->self_id || strlen(o->self_id) > 253 || strchr(o->self_id, '/'))
        return rl_errf(e, RL_EINPUT, "membership self_id: empty, over 253 bytes or containing '/'");
    if (!o->self_addr || !*o->self_addr || strlen(o->self_addr) >= sizeof ((rl_peer *)0)->addr)
        return rl_errf(e, RL_EINPUT, "membership self_addr: empty or over 63 bytes");
    double ttl = o->ttl_s > 0 ? o->ttl_s : 15.0;
    if (ttl < 2 || ttl > 3600)
        return rl_errf(e, RL_EINPUT, "membership ttl_s: %g, want 2..3600 seconds", ttl);
    etcd_members *x = calloc(1, sizeof *x);
    if (!x) return rl_errf(e, RL_ENOMEM, "etcd membership: out of memory");
    snprintf(x->endpoint, sizeof x->endpoint, "%s", o->etcd_endpoint);
    snprintf(x->prefix, sizeof x->prefix, "%s", o->etcd_prefix);
    snprintf(x->id, sizeof x->id, "%s", o->self_id);
    snprintf(x->key, sizeof x->key, "%s%s", o->etcd_prefix, o->self_id);
    x->ttl_s = ttl;
    cJSON *j = cJSON_CreateObject();
    if (j) {
        cJSON_AddStringToObject(j, "id", o->self_id);
        cJSON_AddStringToObject(j, "addr", o->self_addr);
        x->record = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
    }
    if (!x->record) {
        free(x);
        return rl_errf(e, RL_ENOMEM, "etcd membership: out of memory");
    }
    x->record_len = strlen(x->record);
    /* the endpoint's form is checked here, not first on the thread */
    rl_etcd *probe = NULL;
    int rc = rl_etcd_new(x->endpoint, 1, &probe, e);
    rl_etcd_free(probe);
    if (rc) {
        destroy(x);
        return rl_err_wrap(e, "membership etcd_endpoint");
    }
    *vt = &VT;
    *ctx = x;
    return RL_OK;
}

int rl_members_etcd_parse(const char *key, const char *prefix, const char *val, size_t len,
                         rl_peer *out, rl_err *e) {
    size_t pl = strlen(prefix);
    char where[96];
    rl_json_escape(where, sizeof where, key);
    if (strncmp(key, prefix, pl) != 0 || key[pl] == '\0')
        return rl_errf(e, RL_EIO, "etcd key '%s': not a member key under the prefix", where);
    cJSON *j = rl_etcd_record(key, val, len, e);
    if (!j) return RL_EIO;
    rl_peer p = {0};
    int rc = rl_etcd_record_str(j, key, "id", true, p.id, sizeof p.id, e);
    if (!rc) rc = rl_etcd_record_str(j, key, "addr", true, p.addr, sizeof p.addr, e);
    if (!rc && strcmp(p.id, key + pl) != 0)
        rc = rl_errf(e, RL_EIO, "etcd key '%s': the record's 'id' differs from the key", where);
    cJSON_Delete(j);
    if (!rc) {
        p.ready = true;
        p.terminating = false;
        *out = p;
    }
    return rc;
}
