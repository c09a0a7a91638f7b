/* Leader election on a coordination.k8s.io/v1 Lease, with client-go's
 * rules: the record is read, compared with the last one seen, and judged
 * expired only when it has not changed for its leaseDurationSeconds as
 * measured on our own monotonic clock from when we saw it change -- never
 * by comparing its renewTime with our clock, so clock skew between nodes
 * cannot make two leaders. Writes are optimistic (PUT with the
 * resourceVersion read), so of two candidates racing for an expired lease
 * the API server lets exactly one win (the other gets 409).
 *
 * A write is never retried by the HTTP layer: a PUT the server applied but
 * whose answer was lost (503, a reset, a timeout) would be sent again with
 * the resourceVersion it has just made stale, and its 409 would read as a
 * rival's win. The retry period is the retry (client-go's rule), and a 409
 * on our own renewal is checked against the record before it counts.
 *
 * The leader's rendezvous address rides on the Lease as annotations. A
 * Lease edited by hand into nonsense is logged and treated as held by
 * nobody valid: once it stays unchanged for a lease duration, it is taken
 * over and rewritten whole. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/k8s.h"
#include "elect/elect_internal.h"

#define ANN_ADDR "ringleader.dev/leader-addr"
#define ANN_PORT "ringleader.dev/leader-port"

typedef struct k8s_el {
    rl_k8s *c;
    char ns[254], name[254], id[254], addr[256];
    int port;
    double lease_s;
    char *obs;          /* the record last seen (spec + our annotations, as JSON text) */
    double obs_time;    /* monotonic time it was first seen */
    double obs_dur;     /* its leaseDurationSeconds */
    bool stepped_down;  /* our own record counts as someone else's until it expires */
    rl_leader last;     /* the holder last seen, reported when a write loses a race */
} k8s_el;

/* What decides "the record changed": the spec and where the leader listens. */
static char *record_text(const cJSON *obj) {
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
    const cJSON *an = md ? cJSON_GetObjectItemCaseSensitive(md, "annotations") : NULL;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(obj, "spec");
    char *a = sp ? cJSON_PrintUnformatted(sp) : NULL;
    const cJSON *ad = an ? cJSON_GetObjectItemCaseSensitive(an, ANN_ADDR) : NULL;
    const cJSON *po = an ? cJSON_GetObjectItemCaseSensitive(an, ANN_PORT) : NULL;
    size_t n = (a ? strlen(a) : 4) + 600;
    char *t = malloc(n);
    if (t) snprintf(t, n, "%s|%s|%s", a ? a : "null", cJSON_IsString(ad) ? ad->valuestring : "",
                    cJSON_IsString(po) ? po->valuestring : "");
    free(a);
    return t;
}

static void leader_of(const cJSON *obj, const char *holder, rl_leader *l) {
    memset(l, 0, sizeof *l);
    snprintf(l->id, sizeof l->id, "%s", holder);
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
    const cJSON *an = md ? cJSON_GetObjectItemCaseSensitive(md, "annotations") : NULL;
    const cJSON *ad = an ? cJSON_GetObjectItemCaseSensitive(an, ANN_ADDR) : NULL;
    const cJSON *po = an ? cJSON_GetObjectItemCaseSensitive(an, ANN_PORT) : NULL;
    if (cJSON_IsString(ad)) snprintf(l->addr, sizeof l->addr, "%s", ad->valuestring);
    if (cJSON_IsString(po)) {
        char *end;
        long p = strtol(po->valuestring, &end, 10);
        if (*end == '\0' && p > 0 && p < 65536) l->port = (int)p;
    }
}

static void observe(k8s_el *k, const cJSON *obj, double dur) {
    char *t = record_text(obj);
    if (!t) return;
    if (k->obs && strcmp(t, k->obs) == 0) {
        free(t);
        return;
    }
    free(k->obs);
    k->obs = t;
    k->obs_time = rl_now();
    k->obs_dur = dur;
}

/* Our record: spec and annotations set on a copy of what was read (other
 * metadata, labels included, survives). */
static int set_record(k8s_el *k, cJSON *obj, const rl_k8s_lease *old, bool valid, bool renew) {
    char now[64], port[16];
    rl_k8s_microtime_format(rl_wall_now(), now, sizeof now);
    snprintf(port, sizeof port, "%d", k->port);
    cJSON *md = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
    if (!cJSON_IsObject(md)) return -1;
    cJSON *an = cJSON_GetObjectItemCaseSensitive(md, "annotations");
    if (!cJSON_IsObject(an)) {
        cJSON_DeleteItemFromObjectCaseSensitive(md, "annotations");
        an = cJSON_AddObjectToObject(md, "annotations");
    }
    cJSON_DeleteItemFromObjectCaseSensitive(an, ANN_ADDR);
    cJSON_DeleteItemFromObjectCaseSensitive(an, ANN_PORT);
    cJSON_DeleteItemFromObjectCaseSensitive(obj, "spec");
    cJSON *sp = cJSON_AddObjectToObject(obj, "spec");
    char acquire[64];
    if (renew && valid && old->acquire_time >= 0) rl_k8s_microtime_format(old->acquire_time, acquire, sizeof acquire);
    else snprintf(acquire, sizeof acquire, "%s", now);
    long transitions = valid && old->transitions > 0 ? old->transitions : 0;
    if (!renew && valid && old->holder[0]) transitions++;
    bool ok = an && sp && cJSON_AddStringToObject(an, ANN_ADDR, k->addr) &&
              cJSON_AddStringToObject(an, ANN_PORT, port) &&
              cJSON_AddStringToObject(sp, "holderIdentity", k->id) &&
              cJSON_AddNumberToObject(sp, "leaseDurationSeconds", k->lease_s) &&
              cJSON_AddStringToObject(sp, "acquireTime", acquire) &&
              cJSON_AddStringToObject(sp, "renewTime", now) &&
              cJSON_AddNumberToObject(sp, "leaseTransitions", (double)transitions);
    return ok ? 0 : -1;
}

static int create_lease(k8s_el *k, const char *coll, bool *leading, rl_leader *leader, rl_err *e) {
    cJSON *obj = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(obj, "metadata");
    rl_k8s_lease none;
    memset(&none, 0, sizeof none);
    if (!md || !cJSON_AddStringToObject(obj, "apiVersion", "coordination.k8s.io/v1") ||
        !cJSON_AddStringToObject(obj, "kind", "Lease") ||
        !cJSON_AddStringToObject(md, "name", k->name) ||
        !cJSON_AddStringToObject(md, "namespace", k->ns) || set_record(k, obj, &none, false, false)) {
        cJSON_Delete(obj);
        return rl_errf(e, RL_ENOMEM, "Lease %s/%s: out of memory", k->ns, k->name);
    }
    long st = 0;
    cJSON *got = NULL;
    int rc = rl_k8s_create(k->c, coll, obj, &st, &got, e);
    cJSON_Delete(obj);
    if (rc == RL_OK) {
        observe(k, got, k->lease_s);
        *leading = true;
        leader_of(got, k->id, leader);
    } else if (st == 409) { /* another candidate created it first: we see it next time */
        rc = RL_OK;
        *leading = false;
        memset(leader, 0, sizeof *leader);
    }
    cJSON_Delete(got);
    return rc;
}

/* Our renewal got 409: the record changed since we read it. Most often it
 * was our own previous write, applied though its answer never came; or
 * someone edited the Lease's labels. If we still hold it, renew again on
 * the record as it is now; if someone else does, we lost it. An error
 * leaves the elector leading until its renew deadline, as any failed
 * renewal does. */
static int renew_after_conflict(k8s_el *k, const char *path, bool *leading, rl_leader *leader,
                                rl_err *e) {
    long st = 0;
    cJSON *obj = NULL, *got = NULL;
    rl_k8s_lease l;
    int rc = rl_k8s_get(k->c, path, &st, &obj, e);
    if (rc == RL_OK) rc = rl_k8s_lease_read(obj, &l, e);
    if (rc == RL_OK && strcmp(l.holder, k->id) != 0) { /* taken: follow the new holder */
        observe(k, obj, l.duration_s > 0 ? (double)l.duration_s : k->lease_s);
        *leading = false;
        leader_of(obj, l.holder, leader);
        k->last = *leader;
    } else if (rc == RL_OK) {
        if (set_record(k, obj, &l, true, true) != 0)
            rc = rl_errf(e, RL_ENOMEM, "Lease %s/%s: out of memory", k->ns, k->name);
        else if ((rc = rl_k8s_replace(k->c, path, obj, &st, &got, e)) == RL_OK) {
            rl_log(RL_LOG_INFO, "lease_renewed_after_conflict", "\"lease\":\"%s\"", k->name);
            observe(k, got, k->lease_s);
            *leading = true;
            leader_of(got, k->id, leader);
            k->last = *leader;
        }
    }
    cJSON_Delete(obj);
    cJSON_Delete(got);
    return rc;
}

static int attempt(void *ctx, bool *leading, rl_leader *leader, rl_err *e) {
    k8s_el *k = ctx;
    char coll[600], path[900];
    int rc = rl_k8s_path(coll, sizeof coll, "coordination.k8s.io/v1", k->ns, "leases", NULL, e);
    if (rc == RL_OK) rc = rl_k8s_path(path, sizeof path, "coordination.k8s.io/v1", k->ns, "leases", k->name, e);
    if (rc) return rc;
    long st = 0;
    cJSON *obj = NULL;
    rc = rl_k8s_get(k->c, path, &st, &obj, e);
    if (rc != RL_OK && st == 404) {
        cJSON_Delete(obj);
        return create_lease(k, coll, leading, leader, e);
    }
    if (rc != RL_OK) {
        cJSON_Delete(obj);
        return rc;
    }
    rl_k8s_lease l;
    rl_err pe = {0};
    bool valid = rl_k8s_lease_read(obj, &l, &pe) == RL_OK;
    double dur = valid && l.duration_s > 0 ? (double)l.duration_s : k->lease_s;
    char *before = k->obs ? strdup(k->obs) : NULL;
    observe(k, obj, dur);
    if (!valid && (!before || strcmp(before, k->obs) != 0))
        rl_log_msg(RL_LOG_WARN, "lease_invalid", pe.msg); /* once per distinct record */
    free(before);

    bool mine = valid && strcmp(l.holder, k->id) == 0 && !k->stepped_down;
    bool held_by_other = !valid || (l.holder[0] && !mine);
    if (held_by_other && rl_now() < k->obs_time + k->obs_dur) {
        *leading = false;
        if (valid) leader_of(obj, l.holder, leader);
        else memset(leader, 0, sizeof *leader);
        k->last = *leader;
        cJSON_Delete(obj);
        return RL_OK;
    }
    /* Ours to renew, or free / expired to take. */
    if (set_record(k, obj, &l, valid, mine) != 0) {
        cJSON_Delete(obj);
        return rl_errf(e, RL_ENOMEM, "Lease %s/%s: out of memory", k->ns, k->name);
    }
    cJSON *got = NULL;
    rc = rl_k8s_replace(k->c, path, obj, &st, &got, e);
    cJSON_Delete(obj);
    if (rc == RL_OK) {
        if (!mine)
            rl_log(RL_LOG_INFO, "lease_acquired", "\"lease\":\"%s\",\"transitions\":%ld", k->name,
                   valid && l.transitions > 0 ? l.transitions + (l.holder[0] ? 1 : 0) : 0);
        k->stepped_down = false;
        observe(k, got, k->lease_s);
        *leading = true;
        leader_of(got, k->id, leader);
    } else if (st == 409 && mine) {
        rc = renew_after_conflict(k, path, leading, leader, e);
    } else if (st == 409) {
        /* Someone wrote it since we read it -- most likely a rival that
         * took the expired lease a moment before us. Look again at once, so
         * that this agent follows the new leader now rather than a retry
         * period later; failing that, report the last holder seen (not
         * "nobody": members would restart their round for a blip). */
        rc = RL_OK;
        *leading = false;
        *leader = k->last;
        cJSON *again = NULL;
        rl_k8s_lease l2;
        rl_err ae = {0};
        if (rl_k8s_get(k->c, path, &st, &again, &ae) == RL_OK && rl_k8s_lease_read(again, &l2, &ae) == RL_OK &&
            l2.holder[0] && strcmp(l2.holder, k->id) != 0) {
            observe(k, again, l2.duration_s > 0 ? (double)l2.duration_s : k->lease_s);
            leader_of(again, l2.holder, leader);
            k->last = *leader;
        }
        cJSON_Delete(again);
    }
    if (rc == RL_OK && *leading) k->last = *leader;
    cJSON_Delete(got);
    return rc;
}

static void step_down(void *ctx) {
    k8s_el *k = ctx;
    k->stepped_down = true;
    k->obs_time = rl_now(); /* wait a whole lease from now before competing */
    k->obs_dur = k->lease_s;
}

static int release(void *ctx, rl_err *e) {
    k8s_el *k = ctx;
    char path[900];
    int rc = rl_k8s_path(path, sizeof path, "coordination.k8s.io/v1", k->ns, "leases", k->name, e);
    if (rc) return rc;
    long st = 0;
    cJSON *obj = NULL;
    if ((rc = rl_k8s_get(k->c, path, &st, &obj, e))) {
        cJSON_Delete(obj);
        return rc;
    }
    rl_k8s_lease l;
    if (rl_k8s_lease_read(obj, &l, e) != RL_OK || strcmp(l.holder, k->id) != 0) {
        cJSON_Delete(obj);
        return RL_OK; /* not ours any more: nothing to give up */
    }
    /* client-go's release: an empty holder and a 1 s lease, transitions kept */
    char now[64];
    rl_k8s_microtime_format(rl_wall_now(), now, sizeof now);
    cJSON *sp = cJSON_GetObjectItemCaseSensitive(obj, "spec");
    cJSON_ReplaceItemInObjectCaseSensitive(sp, "holderIdentity", cJSON_CreateString(""));
    cJSON_DeleteItemFromObjectCaseSensitive(sp, "leaseDurationSeconds");
    cJSON_AddNumberToObject(sp, "leaseDurationSeconds", 1);
    cJSON_DeleteItemFromObjectCaseSensitive(sp, "renewTime");
    cJSON_AddStringToObject(sp, "renewTime", now);
    rc = rl_k8s_replace(k->c, path, obj, &st, NULL, e);
    cJSON_Delete(obj);
    return rc;
}

static void destroy(void *ctx) {
    k8s_el *k = ctx;
    rl_k8s_free(k->c);
    free(k->obs);
    free(k);
}

static double expires_at(void *ctx) {
    const k8s_el *k = ctx;
    return k->obs ? k->obs_time + k->obs_dur : 0;
}

static const rl_elect_backend k8s_backend = {attempt, step_down, release, destroy, expires_at};

int rl_elect_k8s_new(const rl_elector_opts *o, const rl_elect_backend **vt, void **ctx, rl_err *e) {
    if (!o->lease_name || !*o->lease_name)
        return rl_errf(e, RL_EINPUT, "elector: the Lease name is missing");
    k8s_el *k = calloc(1, sizeof *k);
    if (!k) return rl_errf(e, RL_ENOMEM, "elector: out of memory");
    double retry = o->retry_s > 0 ? o->retry_s : 2, deadline = o->renew_deadline_s > 0 ? o->renew_deadline_s : 10;
    /* One call (retries inside included) must end well within the renew
     * deadline, or a slow API server could carry a leader past it. */
    double call = deadline / 2 < 2 * retry ? deadline / 2 : 2 * retry;
    /* one try per call: see the top of this file */
    rl_k8s_opts ko = {.timeout_s = call, .connect_timeout_s = call < 5 ? call : 5,
                      .backoff = {.attempts = 1}};
    int rc = rl_k8s_connect(o->kubeconfig, &ko, &k->c, e);
    if (rc) {
        free(k);
        return rc;
    }
    snprintf(k->ns, sizeof k->ns, "%s", o->ns && *o->ns ? o->ns : rl_k8s_namespace(k->c));
    snprintf(k->name, sizeof k->name, "%s", o->lease_name);
    snprintf(k->id, sizeof k->id, "%s", o->id);
    snprintf(k->addr, sizeof k->addr, "%s", o->addr ? o->addr : "");
    k->port = o->port;
    /* leaseDurationSeconds is a whole number on the wire */
    k->lease_s = ceil(o->lease_s > 0 ? o->lease_s : 15);
    *vt = &k8s_backend;
    *ctx = k;
    return RL_OK;
}
