/* The etcd elector backend: one leader key bound to the leader's etcd lease.
 *
 * Whoever creates the key (a transaction: "if create_revision(key) == 0 then
 * put key = record with my lease, else read key") leads for as long as its
 * lease lives; the lease's TTL (ceil(lease_s)) is the leaseDuration of the
 * k8s backend. Expiry is judged by etcd's own clock, so no candidate
 * compares clocks. Ownership is decided by the lease the key is bound to,
 * not by the id in the record: a record with our id but another lease is a
 * previous incarnation of us (before a step_down), and we treat it like
 * anyone else's until it expires -- the contract of step_down().
 *
 * The generic elector (elect.c) owns the retry period and the renew
 * deadline; attempt() is one try. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "elect/elect_internal.h"
#include "etcd/etcd.h"

typedef struct etcd_elect {
    rl_etcd *c;
    char key[1024];
    int64_t ttl;      /* lease TTL asked for, seconds */
    double call_s;    /* timeout of one call */
    int64_t lease;    /* 0: none held */
    bool leading;
    double expires;   /* monotonic time the holder's lease runs out (0: unknown) */
    char *record;     /* our record, byte for byte what we put */
    size_t record_len;
    rl_leader self;
} etcd_elect;

/* Keep our lease alive or get one. A lease that is gone takes our
 * leadership with it (its key went with it). */
static int ensure_lease(etcd_elect *x, rl_err *e) {
    if (x->lease) {
        int64_t ttl = 0;
        int rc = rl_etcd_lease_keepalive(x->c, x->lease, &ttl, e);
        if (rc) return rc;
        if (ttl > 0) return RL_OK;
        if (x->leading)
            rl_log(RL_LOG_WARN, "elect_etcd_lease_lost", "\"lease\":\"%" PRIx64 "\"", (uint64_t)x->lease);
        x->lease = 0;
        x->leading = false;
    }
    return rl_etcd_lease_grant(x->c, x->ttl, &x->lease, NULL, e);
}

static int attempt(void *ctx, bool *leading, rl_leader *leader, rl_err *e) {
    etcd_elect *x = ctx;
    int rc = ensure_lease(x, e);
    if (rc) return rl_err_wrap(e, "etcd elector");
    rl_etcd_cmp absent = {.target = RL_ETCD_CMP_CREATE, .key = x->key, .rev = 0};
    rl_etcd_op put = {.type = RL_ETCD_OP_PUT, .key = x->key, .value = x->record,
                      .value_len = x->record_len, .lease = x->lease};
    rl_etcd_op get = {.type = RL_ETCD_OP_RANGE, .key = x->key};
    bool created = false;
    rl_etcd_kvs r;
    rc = rl_etcd_txn(x->c, &absent, 1, &put, 1, &get, 1, &created, &r, e);
    if (rc) {
        rl_etcd_kvs_free(&r);
        return rl_err_wrap(e, "etcd elector");
    }
    rl_leader seen = {0};
    bool ours = created;
    x->expires = 0;
    if (!created && r.n > 0) {
        const rl_etcd_kv *kv = &r.kvs[0];
        /* bound to our live lease: ours (we were leading, or our put of an
         * earlier attempt landed although its answer was lost) */
        ours = x->lease != 0 && kv->lease == x->lease;
        /* when the holder's lease runs out, so the elector tries right
         * then; best effort (etcd rounds up to whole seconds) */
        int64_t left = 0;
        rl_err ignore = {0};
        if (!ours && kv->lease && rl_etcd_lease_ttl(x->c, kv->lease, &left, &ignore) == RL_OK)
            /* gone but its key not yet deleted: etcd's lessor lags by up to
             * half a second; look again shortly, not in a tight loop */
            x->expires = rl_now() + (left > 0 ? (double)left : 0.25);
        rc = rl_elect_etcd_parse_leader(x->key, kv->value, kv->value_len, &seen, e);
        if (rc) {
            /* whoever edited it, the key is not ours any more */
            if (!ours) x->leading = false;
            rl_etcd_kvs_free(&r);
            return rl_err_wrap(e, "etcd elector");
        }
    }
    rl_etcd_kvs_free(&r);
    if (ours) seen = x->self; /* what we report is what we wrote */
    if (ours != x->leading)
        rl_log(RL_LOG_INFO, ours ? "elect_etcd_acquired" : "elect_etcd_lost", "\"lease\":\"%" PRIx64 "\"",
               (uint64_t)x->lease);
    x->leading = ours;
    *leading = ours;
    *leader = seen;
    return RL_OK;
}

/* Short calls on the way out: the caller is giving up on etcd anyway. */
static void with_short_timeout(etcd_elect *x, double s) { rl_etcd_set_timeout(x->c, s); }

static void step_down(void *ctx) {
    etcd_elect *x = ctx;
    x->leading = false;
    if (!x->lease) return;
    /* The renew deadline passed, usually because etcd is out of reach; if it
     * is back, revoking lets the others take over now instead of after the
     * TTL. Either way we never touch that lease again. */
    with_short_timeout(x, 1.0);
    rl_err e = {0};
    if (rl_etcd_lease_revoke(x->c, x->lease, &e) != RL_OK)
        rl_log_msg(RL_LOG_DEBUG, "elect_etcd_revoke_failed", e.msg);
    with_short_timeout(x, x->call_s);
    x->lease = 0;
}

static int release(void *ctx, rl_err *e) {
    etcd_elect *x = ctx;
    int rc = RL_OK;
    if (x->leading) {
        /* only if it still holds our record: never delete a successor's key */
        rl_etcd_cmp mine = {.target = RL_ETCD_CMP_VALUE, .key = x->key, .value = x->record,
                            .value_len = x->record_len};
        rl_etcd_op del = {.type = RL_ETCD_OP_DELETE, .key = x->key};
        bool deleted = false;
        rc = rl_etcd_txn(x->c, &mine, 1, &del, 1, NULL, 0, &deleted, NULL, e);
        if (rc) rl_err_wrap(e, "etcd elector release");
    }
    x->leading = false;
    if (x->lease) {
        rl_err e2 = {0};
        int rc2 = rl_etcd_lease_revoke(x->c, x->lease, &e2);
        if (rc2 && !rc) {
            rc = rc2;
            if (e) *e = e2;
            rl_err_wrap(e, "etcd elector release");
        }
        x->lease = 0;
    }
    return rc;
}

static double expires_at(void *ctx) { return ((etcd_elect *)ctx)->expires; }

static void destroy(void *ctx) {
    etcd_elect *x = ctx;
    if (!x) return;
    rl_etcd_free(x->c);
    free(x->record);
    free(x);
}

static const rl_elect_backend VT = {attempt, step_down, release, destroy, expires_at};

int rl_elect_etcd_new(const rl_elector_opts *o, const rl_elect_backend **vt, void **ctx, rl_err *e) {
    *vt = NULL;
    *ctx = NULL;
    if (!o->etcd_endpoint || !*o->etcd_endpoint)
        return rl_errf(e, RL_EINPUT, "elector etcd_endpoint: not set (want http://host:port)");
    if (!o->etcd_key || !*o->etcd_key || strlen(o->etcd_key) >= 1024)
        return rl_errf(e, RL_EINPUT, "elector etcd_key: empty or longer than 1023 bytes");
    if (!o->id || !*o->id || strlen(o->id) > 253)
        return rl_errf(e, RL_EINPUT, "elector id: empty or longer than 253 bytes");
    /* the record is how followers find the leader's store: no address, no use */
    if (!o->addr || !*o->addr || strlen(o->addr) > 255)
        return rl_errf(e, RL_EINPUT, "elector addr: empty or longer than 255 bytes");
    if (o->port < 0 || o->port > 65535)
        return rl_errf(e, RL_EINPUT, "elector port: %d is not a port number", o->port);
    double lease_s = o->lease_s > 0 ? o->lease_s : 15.0;
    double renew_s = o->renew_deadline_s > 0 ? o->renew_deadline_s : 10.0;
    if (lease_s > 1e6) return rl_errf(e, RL_EINPUT, "elector lease_s: %g is too long", lease_s);

    etcd_elect *x = calloc(1, sizeof *x);
    if (!x) return rl_errf(e, RL_ENOMEM, "etcd elector: out of memory");
    snprintf(x->key, sizeof x->key, "%s", o->etcd_key);
    x->ttl = (int64_t)ceil(lease_s);
    if (x->ttl < 1) x->ttl = 1;
    /* an attempt makes at most three calls; together they must fit well
     * inside the renew deadline */
    x->call_s = renew_s / 3 < 5 ? renew_s / 3 : 5;
    if (x->call_s < 0.5) x->call_s = 0.5;
    snprintf(x->self.id, sizeof x->self.id, "%s", o->id);
    snprintf(x->self.addr, sizeof x->self.addr, "%s", o->addr);
    x->self.port = o->port;
    cJSON *j = cJSON_CreateObject();
    if (j) {
        cJSON_AddStringToObject(j, "id", x->self.id);
        cJSON_AddStringToObject(j, "addr", x->self.addr);
        cJSON_AddNumberToObject(j, "port", x->self.port);
        x->record = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
    }
    if (!x->record) {
        free(x);
        return rl_errf(e, RL_ENOMEM, "etcd elector: out of memory");
    }
    x->record_len = strlen(x->record);
    int rc = rl_etcd_new(o->etcd_endpoint, x->call_s, &x->c, e);
    if (rc) {
        destroy(x);
        return rl_err_wrap(e, "elector etcd_endpoint");
    }
    *vt = &VT;
    *ctx = x;
    return RL_OK;
}

int rl_elect_etcd_parse_leader(const char *key, const char *val, size_t len, rl_leader *out, rl_err *e) {
    cJSON *j = rl_etcd_record(key, val, len, e);
    if (!j) return RL_EIO;
    rl_leader l = {0};
    int rc = rl_etcd_record_str(j, key, "id", true, l.id, sizeof l.id, e);
    if (!rc) rc = rl_etcd_record_str(j, key, "addr", true, l.addr, sizeof l.addr, e);
    if (!rc) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "port");
        char where[96];
        rl_json_escape(where, sizeof where, key);
        if (!cJSON_IsNumber(p) || p->valuedouble < 0 || p->valuedouble > 65535 ||
            p->valuedouble != (double)(int)p->valuedouble)
            rc = rl_errf(e, RL_EIO, "etcd key '%s': the record's 'port' is not a port number", where);
        else
            l.port = (int)p->valuedouble;
    }
    cJSON_Delete(j);
    if (!rc) *out = l;
    return rc;
}
