/* One reconcile of one TrainingJob: read it and what it owns, take the
 * next steps toward its spec, write its status. Nothing is remembered
 * between calls except what the API server holds, so a restarted operator
 * carries on where the last one stopped. Order matters in one place: a
 * pod that ended is counted in the status first and deleted after, so a
 * crash in between neither loses nor doubles a count (the status keeps the
 * uids of counted pods until they are gone). */
#include <cjson/cJSON.h>
#include <math.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "operator/cache.h"
#include "operator.h"

/* An Event waits in `pending` for the status write that records what it
 * announces: posted before it, a failed write would leave an Event for a
 * change that never happened (and the next pass would post it again).
 * `recent` folds repeats of one Event (same job, type, reason, message)
 * into its count and lastTimestamp, as client-go's event recorder does. */
typedef struct op_event {
    char ns[254], job[254], uid[128], reason[64], msg[1024];
    bool warning;
} op_event;

#define RECENT_EVENTS 256
#define ENSURED_JOBS 1024
#define ENSURE_EVERY_S 600.0
#define REFUSED_RETRY_S 30.0
typedef struct recent_event {
    uint64_t key; /* 0: free */
    char ns[254], name[128];
    long count;
} recent_event;

struct rl_op {
    rl_k8s *k;
    op_event *pending;
    int npending, cap;
    recent_event recent[RECENT_EVENTS];
    int next_recent; /* the slot the next new Event takes (oldest first) */
    double stuck_s;  /* rl_op_set_stuck_after */
    char metrics_ns[384]; /* rl_op_set_metrics_ns */
    rl_op_cache *cache; /* rl_op_use_cache: reads from memory, else the API */
    char job_rv[64];    /* the job as read: status writes are conditional on it */
    double requeue_s;   /* rl_op_requeue_after: when the last job wants a look again */
    /* jobs whose owned objects were ensured (uid, when): looked up again
     * only after ENSURE_EVERY_S, not on every pass */
    struct { char uid[128]; double at; } ensured[ENSURED_JOBS];
    int next_ensured;
};

int rl_op_new(rl_k8s *k, rl_op **out, rl_err *e) {
    rl_op *op = calloc(1, sizeof *op);
    if (!op) return rl_errf(e, RL_ENOMEM, "out of memory");
    op->k = k;
    op->stuck_s = 60;
    snprintf(op->metrics_ns, sizeof op->metrics_ns, "%s", RL_OP_METRICS_NS_DEFAULT);
    *out = op;
    return RL_OK;
}

void rl_op_set_metrics_ns(rl_op *op, const char *kv) {
    if (kv) snprintf(op->metrics_ns, sizeof op->metrics_ns, "%s", kv);
}

void rl_op_set_stuck_after(rl_op *op, double seconds) {
    if (seconds > 0) op->stuck_s = seconds;
}

void rl_op_use_cache(rl_op *op, rl_op_cache *c) { op->cache = c; }

double rl_op_requeue_after(const rl_op *op) { return op->requeue_s; }

/* The last reconcile's job wants another look in s seconds at the latest. */
static void requeue_within(rl_op *op, double s) {
    if (s > 0 && (op->requeue_s <= 0 || s < op->requeue_s)) op->requeue_s = s;
}

static bool cached(const rl_op *op, rl_opc_kind k) { return op->cache && rl_op_cache_synced(op->cache, k); }

void rl_op_free(rl_op *op) {
    if (op) free(op->pending);
    free(op);
}

/* ---- small JSON helpers ------------------------------------------------------------------- */
static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return cJSON_IsString(v) ? v->valuestring : "";
}

static cJSON *jobj(cJSON *o, const char *k) {
    cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return cJSON_IsObject(v) ? v : NULL;
}

static void jset(cJSON *o, const char *k, cJSON *v) {
    if (cJSON_GetObjectItemCaseSensitive(o, k)) cJSON_ReplaceItemInObjectCaseSensitive(o, k, v);
    else cJSON_AddItemToObject(o, k, v);
}

static void rfc3339(char *out, size_t n) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* ---- conditions ------------------------------------------------------------------------------
 * Set a condition; lastTransitionTime moves only when the status flips.
 * Returns true when status or reason changed: the moment worth an Event. */
static bool set_condition(cJSON *st, const char *type, bool on, const char *reason, const char *msg) {
    cJSON *cs = cJSON_GetObjectItemCaseSensitive(st, "conditions");
    if (!cJSON_IsArray(cs)) {
        cJSON_DeleteItemFromObjectCaseSensitive(st, "conditions");
        cs = cJSON_AddArrayToObject(st, "conditions");
    }
    cJSON *c = NULL;
    for (cJSON *it = cs->child; it; it = it->next)
        if (!strcmp(jstr(it, "type"), type)) c = it;
    const char *want = on ? "True" : "False";
    bool flip = !c || strcmp(jstr(c, "status"), want) != 0;
    bool changed = flip || strcmp(jstr(c, "reason"), reason) != 0;
    if (!c) {
        c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "type", type);
        cJSON_AddItemToArray(cs, c);
    }
    jset(c, "status", cJSON_CreateString(want));
    jset(c, "reason", cJSON_CreateString(reason));
    jset(c, "message", cJSON_CreateString(msg));
    if (flip) {
        char ts[32];
        rfc3339(ts, sizeof ts);
        jset(c, "lastTransitionTime", cJSON_CreateString(ts));
    }
    return changed;
}

static bool condition_on(const cJSON *st, const char *type) {
    const cJSON *cs = cJSON_IsObject(st) ? cJSON_GetObjectItemCaseSensitive(st, "conditions") : NULL;
    if (!cJSON_IsArray(cs)) return false;
    for (const cJSON *it = cs->child; it; it = it->next)
        if (!strcmp(jstr(it, "type"), type)) return !strcmp(jstr(it, "status"), "True");
    return false;
}

static long long st_int(const cJSON *st, const char *k) {
    const cJSON *v = cJSON_IsObject(st) ? cJSON_GetObjectItemCaseSensitive(st, k) : NULL;
    return cJSON_IsNumber(v) ? (long long)v->valuedouble : 0;
}

/* ---- events ------------------------------------------------------------------------------------ */
/* Queue an Event; write_status posts it once the status is written. */
static void event(rl_op *op, const rl_op_job *j, bool warning, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void event(rl_op *op, const rl_op_job *j, bool warning, const char *reason, const char *fmt, ...) {
    if (op->npending == op->cap) {
        int cap = op->cap ? 2 * op->cap : 8;
        op_event *v = realloc(op->pending, (size_t)cap * sizeof *v);
        if (!v) return; /* an Event is worth less than the reconcile */
        op->pending = v, op->cap = cap;
    }
    op_event *ev = &op->pending[op->npending++];
    snprintf(ev->ns, sizeof ev->ns, "%s", j->ns);
    snprintf(ev->job, sizeof ev->job, "%s", j->name);
    snprintf(ev->uid, sizeof ev->uid, "%s", j->uid);
    snprintf(ev->reason, sizeof ev->reason, "%s", reason);
    ev->warning = warning;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ev->msg, sizeof ev->msg, fmt, ap);
    va_end(ap);
}

static uint64_t event_key(const op_event *ev) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the fields that make two Events one */
    const char *parts[] = {ev->ns, ev->uid, ev->reason, ev->msg, ev->warning ? "W" : "N"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        for (const char *c = parts[i];; c++) {
            h = (h ^ (unsigned char)*c) * 1099511628211ull;
            if (!*c) break;
        }
    return h ? h : 1;
}

/* A repeat of a recent Event: count + 1 and lastTimestamp on it. False when
 * it is not recent or is gone (Events expire after an hour): post anew. */
static bool fold_event(rl_op *op, recent_event *r) {
    char path[512], ts[32];
    rfc3339(ts, sizeof ts);
    rl_err e = {0};
    if (rl_k8s_path(path, sizeof path, "v1", r->ns, "events", r->name, &e)) return false;
    cJSON *patch = cJSON_CreateObject();
    cJSON_AddNumberToObject(patch, "count", (double)(r->count + 1));
    cJSON_AddStringToObject(patch, "lastTimestamp", ts);
    long code = 0;
    int rc = rl_k8s_merge_patch(op->k, path, patch, &code, NULL, &e);
    cJSON_Delete(patch);
    if (rc == RL_OK) r->count++;
    else r->key = 0;
    return rc == RL_OK;
}

static void post_event(rl_op *op, const op_event *ev) {
    char esc[1100];
    rl_log(ev->warning ? RL_LOG_WARN : RL_LOG_INFO, "job_event", "\"job\":\"%s/%s\",\"reason\":\"%s\",\"msg\":\"%s\"",
           ev->ns, ev->job, ev->reason, rl_json_escape(esc, sizeof esc, ev->msg));
    uint64_t key = event_key(ev);
    for (int i = 0; i < RECENT_EVENTS; i++)
        if (op->recent[i].key == key && fold_event(op, &op->recent[i])) return;
    char name[128], ts[32], path[512];
    unsigned char rnd[8];
    if (RAND_bytes(rnd, sizeof rnd) != 1) memset(rnd, 0, sizeof rnd);
    snprintf(name, sizeof name, "%.100s.%02x%02x%02x%02x%02x%02x%02x%02x", ev->job, rnd[0], rnd[1], rnd[2],
             rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    rfc3339(ts, sizeof ts);
    cJSON *obj = cJSON_CreateObject();
    cJSON_AddStringToObject(obj, "apiVersion", "v1");
    cJSON_AddStringToObject(obj, "kind", "Event");
    cJSON *md = cJSON_AddObjectToObject(obj, "metadata");
    cJSON_AddStringToObject(md, "name", name);
    cJSON_AddStringToObject(md, "namespace", ev->ns);
    cJSON *io = cJSON_AddObjectToObject(obj, "involvedObject");
    cJSON_AddStringToObject(io, "apiVersion", RL_OP_GV);
    cJSON_AddStringToObject(io, "kind", "TrainingJob");
    cJSON_AddStringToObject(io, "name", ev->job);
    cJSON_AddStringToObject(io, "namespace", ev->ns);
    cJSON_AddStringToObject(io, "uid", ev->uid);
    cJSON_AddStringToObject(obj, "reason", ev->reason);
    cJSON_AddStringToObject(obj, "message", ev->msg);
    cJSON_AddStringToObject(obj, "type", ev->warning ? "Warning" : "Normal");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(obj, "source"), "component", "ringleader-operator");
    cJSON_AddStringToObject(obj, "reportingComponent", "ringleader-operator");
    cJSON_AddStringToObject(obj, "firstTimestamp", ts);
    cJSON_AddStringToObject(obj, "lastTimestamp", ts);
    cJSON_AddNumberToObject(obj, "count", 1);
    rl_err e = {0};
    long code = 0;
    if (rl_k8s_path(path, sizeof path, "v1", ev->ns, "events", NULL, &e) == RL_OK &&
        rl_k8s_create(op->k, path, obj, &code, NULL, &e) == RL_OK) {
        recent_event *r = &op->recent[op->next_recent];
        op->next_recent = (op->next_recent + 1) % RECENT_EVENTS;
        r->key = key, r->count = 1;
        snprintf(r->ns, sizeof r->ns, "%s", ev->ns);
        snprintf(r->name, sizeof r->name, "%s", name);
    } else {
        rl_log(RL_LOG_WARN, "event", "\"job\":\"%s/%s\",\"error\":\"%s\"", ev->ns, ev->job,
               rl_json_escape(esc, sizeof esc, e.msg));
    }
    cJSON_Delete(obj);
}

/* After a status write: what it recorded may now be announced. */
static void post_pending(rl_op *op) {
    for (int i = 0; i < op->npending; i++) post_event(op, &op->pending[i]);
    op->npending = 0;
}

/* ---- owned objects ------------------------------------------------------------------------------ */
static bool owned_by(const cJSON *o, const char *uid) {
    const cJSON *refs = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "metadata"),
                                                         "ownerReferences");
    if (!cJSON_IsArray(refs)) return false;
    for (const cJSON *r = refs->child; r; r = r->next)
        if (!strcmp(jstr(r, "uid"), uid)) return true;
    return false;
}

/* Create `want` unless an object of that name exists. One that exists but
 * is not ours is a conflict the user must resolve: *conflict names it. */
static int ensure(rl_op *op, const rl_op_job *j, const char *gv, const char *resource, cJSON *want,
                  char *conflict, size_t cn, rl_err *e) {
    const char *name = jstr(jobj(want, "metadata"), "name");
    char path[512], coll[512];
    int rc;
    if ((rc = rl_k8s_path(path, sizeof path, gv, j->ns, resource, name, e)) ||
        (rc = rl_k8s_path(coll, sizeof coll, gv, j->ns, resource, NULL, e)))
        goto out;
    long code = 0;
    cJSON *have = NULL;
    rc = rl_k8s_get(op->k, path, &code, &have, e);
    if (rc == RL_OK) {
        if (!owned_by(have, j->uid) && !conflict[0])
            snprintf(conflict, cn, "%s %s exists and is not owned by this TrainingJob", resource, name);
    } else if (code == 404) {
        rc = rl_k8s_create(op->k, coll, want, &code, NULL, e);
        if (rc == RL_OK) {
            rl_log(RL_LOG_INFO, "created", "\"job\":\"%s/%s\",\"kind\":\"%s\",\"name\":\"%s\"", j->ns, j->name,
                   resource, name);
        } else if (code == 409) {
            rc = RL_OK; /* a retried POST met itself, or a race: next pass looks again */
        }
    }
    cJSON_Delete(have);
out:
    cJSON_Delete(want);
    return rc;
}

static void random_hex(char *out, size_t bytes) {
    unsigned char b[64];
    if (bytes > sizeof b) bytes = sizeof b;
    if (RAND_bytes(b, (int)bytes) != 1) {
        /* no entropy is no secret: refuse to make a guessable one */
        out[0] = '\0';
        return;
    }
    for (size_t i = 0; i < bytes; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static int ensure_each(rl_op *op, const rl_op_job *j, const cJSON *old, cJSON *st, char *conflict, size_t cn,
                       rl_err *e);

/* The ensured-slot of a job that was ensured lately, or -1. */
static int ensured_lately(const rl_op *op, const char *uid) {
    for (int i = 0; i < ENSURED_JOBS; i++)
        if (!strcmp(op->ensured[i].uid, uid) && rl_now() - op->ensured[i].at < ENSURE_EVERY_S) return i;
    return -1;
}

static int ensure_all(rl_op *op, const rl_op_job *j, const cJSON *old, cJSON *st, char *conflict, size_t cn,
                      rl_err *e) {
    /* made or found lately: no GETs; the next look comes within minutes */
    if (ensured_lately(op, j->uid) >= 0) return RL_OK;
    int rc = ensure_each(op, j, old, st, conflict, cn, e);
    if (rc == RL_OK && !conflict[0]) {
        int i = op->next_ensured;
        op->next_ensured = (i + 1) % ENSURED_JOBS;
        snprintf(op->ensured[i].uid, sizeof op->ensured[i].uid, "%s", j->uid);
        op->ensured[i].at = rl_now();
    }
    return rc;
}

/* The rendezvous Secret is created, never read: the operator holds no
 * `get` on Secrets (reading every Secret of the cluster is close to
 * cluster-admin). status.rdzvSecret records whose it is: "Pending" is
 * written before the first create, so a 409 then means someone else's
 * Secret (a conflict to report, "Conflict"), while a 409 after a "Pending"
 * found in the status (an answer lost, the operator restarted in between)
 * is our own create. The create is sent once: a transport retry would
 * meet itself as 409. */
#define SECRET_FIELD "rdzvSecret"
static int write_status(rl_op *op, const rl_op_job *j, const cJSON *old, cJSON *st, rl_err *e);
static int ensure_secret(rl_op *op, const rl_op_job *j, const cJSON *old, cJSON *st, char *conflict, size_t cn,
                         rl_err *e) {
    char hex[129], rec[16], path[512];
    random_hex(hex, 32);
    if (!hex[0]) return rl_errf(e, RL_EINTERNAL, "no randomness for the rendezvous secret");
    snprintf(rec, sizeof rec, "%s", jstr(st, SECRET_FIELD));
    int rc;
    if (!rec[0]) {
        jset(st, SECRET_FIELD, cJSON_CreateString("Pending"));
        if ((rc = write_status(op, j, old, st, e))) return rc;
    }
    cJSON *want = rl_op_secret(j, hex);
    long code = 0;
    rc = rl_k8s_path(path, sizeof path, "v1", j->ns, "secrets", NULL, e);
    if (!rc) rc = rl_k8s_create_once(op->k, path, want, &code, NULL, e);
    const char *name = jstr(jobj(want, "metadata"), "name");
    if (rc == RL_OK || (code == 409 && strcmp(rec, "") && strcmp(rec, "Conflict"))) {
        if (rc == RL_OK)
            rl_log(RL_LOG_INFO, "created", "\"job\":\"%s/%s\",\"kind\":\"secrets\",\"name\":\"%s\"", j->ns, j->name,
                   name);
        jset(st, SECRET_FIELD, cJSON_CreateString("Created"));
        rc = RL_OK;
    } else if (code == 409) {
        jset(st, SECRET_FIELD, cJSON_CreateString("Conflict"));
        if (!conflict[0]) snprintf(conflict, cn, "secrets %s exists and was not created for this TrainingJob", name);
        rc = RL_OK;
    }
    cJSON_Delete(want);
    return rc;
}

static int ensure_each(rl_op *op, const rl_op_job *j, const cJSON *old, cJSON *st, char *conflict, size_t cn,
                       rl_err *e) {
    int rc;
    if ((rc = ensure(op, j, "v1", "services", rl_op_service(j), conflict, cn, e)) ||
        (rc = ensure_secret(op, j, old, st, conflict, cn, e)) ||
        (rc = ensure(op, j, "v1", "serviceaccounts", rl_op_service_account(j), conflict, cn, e)) ||
        (rc = ensure(op, j, "rbac.authorization.k8s.io/v1", "roles", rl_op_role(j), conflict, cn, e)) ||
        (rc = ensure(op, j, "rbac.authorization.k8s.io/v1", "rolebindings", rl_op_role_binding(j), conflict, cn, e)) ||
        (rc = ensure(op, j, "policy/v1", "poddisruptionbudgets", rl_op_pdb(j), conflict, cn, e)))
        return rc;
    if (j->network_policy &&
        (rc = ensure(op, j, "networking.k8s.io/v1", "networkpolicies", rl_op_network_policy(j, op->metrics_ns), conflict,
                     cn, e)))
        return rc;
    return RL_OK;
}

static int delete_pod(rl_op *op, const rl_op_job *j, const char *name, rl_err *e) {
    char path[512];
    long code = 0;
    int rc = rl_k8s_path(path, sizeof path, "v1", j->ns, "pods", name, e);
    if (!rc) rc = rl_k8s_delete(op->k, path, &code, e);
    if (rc && code == 404) rc = RL_OK;
    if (!rc) rl_log(RL_LOG_INFO, "deleted", "\"job\":\"%s/%s\",\"pod\":\"%s\"", j->ns, j->name, name);
    return rc;
}

/* ---- counted pods --------------------------------------------------------------------------------- */
static bool is_counted(const cJSON *st, const char *uid) {
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(st, "countedPods");
    if (!cJSON_IsArray(l)) return false;
    for (const cJSON *it = l->child; it; it = it->next)
        if (cJSON_IsString(it) && !strcmp(it->valuestring, uid)) return true;
    return false;
}

static void add_counted(cJSON *st, const char *uid, const char *counter) {
    cJSON *l = cJSON_GetObjectItemCaseSensitive(st, "countedPods");
    if (!cJSON_IsArray(l)) {
        cJSON_DeleteItemFromObjectCaseSensitive(st, "countedPods");
        l = cJSON_AddArrayToObject(st, "countedPods");
    }
    cJSON_AddItemToArray(l, cJSON_CreateString(uid));
    if (counter) jset(st, counter, cJSON_CreateNumber((double)(st_int(st, counter) + 1)));
}

/* Keep only uids of pods that still exist: a counted pod stays listed
 * until it is gone, after that it can never be seen (and counted) again. */
static void prune_counted(cJSON *st, const rl_pod_info *pods, int n) {
    cJSON *l = cJSON_GetObjectItemCaseSensitive(st, "countedPods");
    if (!cJSON_IsArray(l)) return;
    cJSON *keep = cJSON_CreateArray();
    for (const cJSON *it = l->child; it; it = it->next) {
        bool live = false;
        for (int i = 0; i < n && !live; i++) live = cJSON_IsString(it) && !strcmp(pods[i].uid, it->valuestring);
        if (live) cJSON_AddItemToArray(keep, cJSON_CreateString(it->valuestring));
    }
    jset(st, "countedPods", keep);
}

/* ---- progress, as the rank-0 agent reports it on <job>-progress ------------------------------------ */
static void mirror_progress(rl_op *op, const rl_op_job *j, cJSON *st) {
    char path[512], name[128];
    snprintf(name, sizeof name, "%s-progress", j->name);
    rl_err e = {0};
    long code = 0;
    cJSON *lease = NULL;
    if (cached(op, RL_OPC_LEASES)) {
        if (!(lease = rl_op_cache_get(op->cache, RL_OPC_LEASES, j->ns, name))) return;
    } else if (rl_k8s_path(path, sizeof path, "coordination.k8s.io/v1", j->ns, "leases", name, &e) ||
               rl_k8s_get(op->k, path, &code, &lease, &e)) {
        cJSON_Delete(lease);
        return;
    }
    const cJSON *ann = jobj(jobj(lease, "metadata"), "annotations");
    static const struct { const char *ann, *field; int kind; /* 0 int, 1 number, 2 string */ } map[] = {
        {"ringleader.dev/step", "step", 0},
        {"ringleader.dev/loss", "loss", 1},
        {"ringleader.dev/tokens-per-second", "tokensPerSecond", 1},
        {"ringleader.dev/last-checkpoint", "lastCheckpoint", 2},
        {"ringleader.dev/round", "round", 0},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        const char *v = jstr(ann, map[i].ann);
        if (!*v) continue;
        if (map[i].kind == 2) {
            jset(st, map[i].field, cJSON_CreateString(v));
            continue;
        }
        char *end;
        double d = strtod(v, &end);
        if (*end || !isfinite(d)) continue; /* a worker's garbage is not worth a failure */
        if (map[i].kind == 0) d = floor(d);
        else d = round(d * 1e4) / 1e4;
        jset(st, map[i].field, cJSON_CreateNumber(d));
    }
    cJSON_Delete(lease);
}

/* ---- status ------------------------------------------------------------------------------------------ */
/* Write the status if it changed; then post the Events queued for it. */
static int write_status(rl_op *op, const rl_op_job *j, const cJSON *old, cJSON *st, rl_err *e) {
    if (old && cJSON_Compare(old, st, 1)) { /* nothing changed: no write, no watch event */
        post_pending(op);
        return RL_OK;
    }
    char path[600];
    int rc = rl_k8s_path(path, sizeof path - 8, RL_OP_GV, j->ns, "trainingjobs", j->name, e);
    if (rc) return rc;
    strcat(path, "/status");
    cJSON *patch = cJSON_CreateObject(), *got = NULL;
    /* merge-patch replaces each member we send; send them all. On the job
     * as read: a read that lagged (the cache) meets 409, never overwrites
     * a count written since. */
    cJSON_AddItemToObject(patch, "status", cJSON_Duplicate(st, 1));
    if (op->job_rv[0]) cJSON_AddStringToObject(cJSON_AddObjectToObject(patch, "metadata"), "resourceVersion", op->job_rv);
    long code = 0;
    rc = rl_k8s_merge_patch(op->k, path, patch, &code, &got, e);
    cJSON_Delete(patch);
    if (rc == RL_OK) {
        snprintf(op->job_rv, sizeof op->job_rv, "%s", jstr(jobj(got, "metadata"), "resourceVersion"));
        post_pending(op);
    }
    cJSON_Delete(got);
    return rc;
}

static bool terminal(const char *phase) { return !strcmp(phase, "Succeeded") || !strcmp(phase, "Failed"); }

/* After the end: pods go per cleanPodPolicy (All: every pod; Running:
 * those still running or pending, so a failed pod's logs stay readable;
 * None: all stay). */
static int cleanup(rl_op *op, const rl_op_job *j, const rl_pod_info *pods, int n, rl_err *e) {
    int rc = RL_OK;
    for (int i = 0; i < n && !rc; i++) {
        const rl_pod_info *p = &pods[i];
        if (p->state == RL_POD_TERMINATING || !strcmp(j->clean_policy, "None")) continue;
        if (!strcmp(j->clean_policy, "Running") && p->state != RL_POD_RUNNING && p->state != RL_POD_PENDING)
            continue;
        rc = delete_pod(op, j, p->name, e);
    }
    return rc;
}

static void count_pods(const rl_op_job *j, const rl_pod_info *pods, int n, cJSON *st) {
    int exist = 0, ready = 0;
    for (int i = 0; i < n; i++) {
        if (pods[i].state == RL_POD_TERMINATING) continue;
        exist++;
        if (pods[i].state == RL_POD_RUNNING && pods[i].ready) ready++;
    }
    char sel[128];
    snprintf(sel, sizeof sel, RL_OP_LABEL_JOB "=%s", j->name);
    jset(st, "replicas", cJSON_CreateNumber(exist));
    jset(st, "readyReplicas", cJSON_CreateNumber(ready));
    jset(st, "selector", cJSON_CreateString(sel));
    /* counters present from the start: "0 restarts" is information */
    if (!cJSON_GetObjectItemCaseSensitive(st, "restarts")) cJSON_AddNumberToObject(st, "restarts", 0);
    if (!cJSON_GetObjectItemCaseSensitive(st, "preemptions")) cJSON_AddNumberToObject(st, "preemptions", 0);
}

/* ---- list this job's pods --------------------------------------------------------------------------- */
static int list_pods(rl_op *op, const rl_op_job *j, rl_pod_info **out, int *n, rl_err *e) {
    char path[700], coll[512];
    *out = NULL, *n = 0;
    int rc = rl_k8s_path(coll, sizeof coll, "v1", j->ns, "pods", NULL, e);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s?labelSelector=" RL_OP_LABEL_JOB "%%3D%s", coll, j->name);
    cJSON *list = NULL;
    long code = 0;
    const cJSON *items;
    if (cached(op, RL_OPC_PODS)) {
        items = list = rl_op_cache_list(op->cache, RL_OPC_PODS, j->ns, j->name);
    } else {
        if ((rc = rl_k8s_get(op->k, path, &code, &list, e))) return rc;
        items = cJSON_GetObjectItemCaseSensitive(list, "items");
    }
    int cap = cJSON_IsArray(items) ? cJSON_GetArraySize(items) : 0;
    rl_pod_info *pods = calloc(cap > 0 ? (size_t)cap : 1, sizeof *pods);
    if (!pods) {
        cJSON_Delete(list);
        return rl_errf(e, RL_ENOMEM, "out of memory");
    }
    double now = rl_wall_now();
    for (const cJSON *it = cap ? items->child : NULL; it; it = it->next) {
        if (!owned_by(it, j->uid)) continue; /* a previous job of the same name: the GC takes it */
        rl_pod_info *p = &pods[(*n)++];
        rl_op_pod_classify(it, p);
        /* deletionTimestamp is when the grace period ends: the delete was
         * asked for deletionGracePeriodSeconds before it */
        const cJSON *md = jobj((cJSON *)it, "metadata");
        double at;
        if (p->state == RL_POD_TERMINATING && rl_k8s_time_parse(jstr(md, "deletionTimestamp"), &at) == RL_OK) {
            const cJSON *g = cJSON_GetObjectItemCaseSensitive(md, "deletionGracePeriodSeconds");
            p->overdue_s = now - at;
            p->deleting_s = p->overdue_s + (cJSON_IsNumber(g) ? g->valuedouble : 0);
        }
    }
    cJSON_Delete(list);
    *out = pods;
    return RL_OK;
}

/* ---- the reconcile ----------------------------------------------------------------------------------- */
static int reconcile_job(rl_op *op, const rl_op_job *j, const cJSON *old, cJSON *st, rl_err *e);

int rl_op_reconcile(rl_op *op, const char *ns, const char *name, rl_err *e) {
    op->requeue_s = 0;
    char path[512];
    int rc = rl_k8s_path(path, sizeof path, RL_OP_GV, ns, "trainingjobs", name, e);
    if (rc) return rc;
    long code = 0;
    cJSON *obj = NULL;
    if (cached(op, RL_OPC_JOBS)) {
        if (!(obj = rl_op_cache_get(op->cache, RL_OPC_JOBS, ns, name))) return RL_OK; /* gone */
    } else if ((rc = rl_k8s_get(op->k, path, &code, &obj, e))) {
        cJSON_Delete(obj);
        return code == 404 ? RL_OK : rc; /* gone: the garbage collector removes what it owned */
    }
    cJSON *md = jobj(obj, "metadata");
    snprintf(op->job_rv, sizeof op->job_rv, "%s", jstr(md, "resourceVersion"));
    if (*jstr(md, "deletionTimestamp")) {
        cJSON_Delete(obj);
        return RL_OK;
    }
    const cJSON *old = jobj(obj, "status");
    cJSON *st = old ? cJSON_Duplicate(old, 1) : cJSON_CreateObject();
    rl_op_job j;
    rl_err perr = {0};
    int prc = rl_op_job_parse(obj, &j, &perr);
    const char *phase = jstr(old, "phase");
    bool started = !strcmp(phase, "Running") || !strcmp(phase, "Restarting") || !strcmp(phase, "Pending") ||
                   !strcmp(phase, "Suspended");
    if (prc && started) {
        /* An edit that breaks a job already under way (a scale to a world
         * size the batch does not divide, a typo): refuse the edit, not the
         * job. Pods stay as they are until the spec is fixed. */
        snprintf(j.ns, sizeof j.ns, "%s", ns);
        snprintf(j.name, sizeof j.name, "%s", name);
        snprintf(j.uid, sizeof j.uid, "%s", jstr(md, "uid"));
        if (set_condition(st, "SpecRejected", true, "InvalidSpec", perr.msg))
            event(op, &j, true, "SpecRejected", "%s (the job goes on with its pods as they are)", perr.msg);
        rc = write_status(op, &j, old, st, e);
    } else if (prc) {
        /* a spec the schema let through but the job cannot run: Failed,
         * with the field named, once */
        snprintf(j.ns, sizeof j.ns, "%s", ns);
        snprintf(j.name, sizeof j.name, "%s", name);
        snprintf(j.uid, sizeof j.uid, "%s", jstr(md, "uid"));
        j.generation = (long long)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(md, "generation"));
        snprintf(j.clean_policy, sizeof j.clean_policy, "All");
        if (set_condition(st, "Failed", true, "InvalidSpec", perr.msg))
            event(op, &j, true, "InvalidSpec", "%s", perr.msg);
        set_condition(st, "Running", false, "InvalidSpec", "");
        jset(st, "phase", cJSON_CreateString("Failed"));
        rl_pod_info *pods = NULL;
        int n = 0;
        if (!(rc = list_pods(op, &j, &pods, &n, e)) && !(rc = cleanup(op, &j, pods, n, e))) {
            count_pods(&j, pods, n, st);
            jset(st, "observedGeneration", cJSON_CreateNumber((double)j.generation));
            rc = write_status(op, &j, old, st, e);
        }
        free(pods);
    } else {
        if (condition_on(st, "SpecRejected"))
            set_condition(st, "SpecRejected", false, "SpecValid", "the spec is valid again");
        rc = reconcile_job(op, &j, old, st, e);
    }
    /* Events whose status write never happened: the next pass sees the
     * same change unrecorded and queues them again. */
    op->npending = 0;
    rl_op_job_free(&j);
    cJSON_Delete(st);
    cJSON_Delete(obj);
    return rc;
}

/* Create pod `index`. Admission refusing it (PodSecurity, a ResourceQuota
 * or LimitRange, a validating webhook: 400, 403, 422) is no error of the
 * reconcile but the job's state: the API's message goes to *refused (when
 * still empty) for the status, and the next pass tries again. */
static int create_pod(rl_op *op, const rl_op_job *j, int index, char *refused, size_t rn, rl_err *e) {
    char coll[512];
    int rc = rl_k8s_path(coll, sizeof coll, "v1", j->ns, "pods", NULL, e);
    if (rc) return rc;
    cJSON *pod = rl_op_pod(j, index), *status = NULL;
    long code = 0;
    rc = rl_k8s_create(op->k, coll, pod, &code, &status, e);
    cJSON_Delete(pod);
    if (rc && code == 409) rc = RL_OK; /* the old one is still going away */
    else if (rc && (code == 400 || code == 403 || code == 422)) {
        const char *m = jstr(status, "message");
        if (!refused[0]) snprintf(refused, rn, "pod %s-%d: %s", j->name, index, *m ? m : e->msg);
        rc = RL_OK;
    } else if (!rc) {
        rl_log(RL_LOG_INFO, "created", "\"job\":\"%s/%s\",\"pod\":\"%s-%d\"", j->ns, j->name, j->name, index);
    }
    cJSON_Delete(status);
    return rc;
}

/* A pod that outlives its grace period by stuck_s: only the kubelet ends a
 * graceful delete, so its node is most likely unreachable, and the pod's
 * fixed name stays taken (its replacement cannot be created) until the node
 * comes back or someone force-deletes it. Name the longest-stuck pod and
 * how long, in whole minutes so the status does not change every pass. */
static void note_stuck(rl_op *op, const rl_op_job *j, const rl_pod_info *pods, int n, cJSON *st) {
    const rl_pod_info *worst = NULL;
    for (int i = 0; i < n; i++) {
        if (pods[i].state != RL_POD_TERMINATING) continue;
        if (pods[i].overdue_s < op->stuck_s) /* no event will say when it is due: look then */
            requeue_within(op, op->stuck_s - pods[i].overdue_s + 0.1);
        else if (!worst || pods[i].overdue_s > worst->overdue_s)
            worst = &pods[i];
    }
    if (!worst) {
        if (condition_on(st, "PodStuckTerminating"))
            set_condition(st, "PodStuckTerminating", false, "NoneStuck", "no pod is stuck terminating");
        return;
    }
    char msg[900];
    snprintf(msg, sizeof msg,
             "pod %s has been terminating for %.0f min (its grace period ended %.0f min ago): its node may be "
             "unreachable, and its replacement waits for the name; if the node is gone: kubectl delete pod %s "
             "--force --grace-period=0",
             worst->name, floor(worst->deleting_s / 60), floor(worst->overdue_s / 60), worst->name);
    if (set_condition(st, "PodStuckTerminating", true, "StuckTerminating", msg))
        event(op, j, true, "PodStuckTerminating", "%s", msg);
}

static int reconcile_job(rl_op *op, const rl_op_job *j, const cJSON *old, cJSON *st, rl_err *e) {
    int rc;
    const char *phase0 = jstr(old, "phase");
    char phase[32];
    snprintf(phase, sizeof phase, "%s", phase0);
    jset(st, "observedGeneration", cJSON_CreateNumber((double)j->generation));
    rl_pod_info *pods = NULL;
    int n = 0;
    if ((rc = list_pods(op, j, &pods, &n, e))) return rc;

    /* Over: only cleanup remains. */
    if (terminal(phase)) {
        if (!(rc = cleanup(op, j, pods, n, e))) {
            count_pods(j, pods, n, st);
            prune_counted(st, pods, n);
            rc = write_status(op, j, old, st, e);
        }
        free(pods);
        return rc;
    }
    char conflict[512] = "";
    if ((rc = ensure_all(op, j, old, st, conflict, sizeof conflict, e))) goto out;
    if (set_condition(st, "Created", true, "Created", "service, secret, RBAC and pods are managed"))
        event(op, j, false, "Created", "created the headless Service %s, its rendezvous Secret and RBAC", j->name);
    if (!jstr(st, "startTime")[0]) {
        char ts[32];
        rfc3339(ts, sizeof ts);
        jset(st, "startTime", cJSON_CreateString(ts));
    }

    /* The job is complete when a worker exits 0: agents do so only once
     * the whole job finished. */
    for (int i = 0; i < n; i++)
        if (pods[i].state == RL_POD_SUCCEEDED) {
            char ts[32];
            rfc3339(ts, sizeof ts);
            set_condition(st, "Succeeded", true, "Completed", "rank 0 finished training");
            set_condition(st, "Running", false, "Completed", "");
            set_condition(st, "Restarting", false, "Completed", "");
            jset(st, "phase", cJSON_CreateString("Succeeded"));
            jset(st, "completionTime", cJSON_CreateString(ts));
            mirror_progress(op, j, st);
            event(op, j, false, "Succeeded", "training completed (pod %s exited 0)", pods[i].name);
            if ((rc = write_status(op, j, old, st, e))) goto out;
            rc = cleanup(op, j, pods, n, e);
            goto out;
        }

    if (j->suspend) {
        if (set_condition(st, "Suspended", true, "Suspended", "spec.suspend is true: pods deleted"))
            event(op, j, false, "Suspended", "suspending: deleting %d pod(s); workers checkpoint on SIGTERM", n);
        set_condition(st, "Running", false, "Suspended", "");
        jset(st, "phase", cJSON_CreateString("Suspended"));
        /* pods we stop are not preemptions: mark them seen, count nothing */
        for (int i = 0; i < n; i++)
            if (!is_counted(st, pods[i].uid)) add_counted(st, pods[i].uid, NULL);
        if ((rc = write_status(op, j, old, st, e))) goto out;
        for (int i = 0; i < n && !rc; i++)
            if (pods[i].state != RL_POD_TERMINATING) rc = delete_pod(op, j, pods[i].name, e);
        if (!rc) {
            count_pods(j, pods, n, st);
            prune_counted(st, pods, n);
            rc = write_status(op, j, old, st, e);
        }
        goto out;
    }
    if (condition_on(st, "Suspended") && set_condition(st, "Suspended", false, "Resumed", "spec.suspend is false"))
        event(op, j, false, "Resumed", "resuming: recreating %d pod(s)", j->replicas);

    /* Pods that ended, or are being deleted by someone else: count each once
     * (status first), then make room for a replacement. */
    bool replaced = false;
    char last_fail[800] = "";
    for (int i = 0; i < n; i++) {
        rl_pod_info *p = &pods[i];
        bool ended = p->state == RL_POD_FAILED || p->state == RL_POD_PREEMPTED;
        bool taken = p->state == RL_POD_TERMINATING && p->index >= 0 && p->index < j->replicas;
        if ((!ended && !taken) || is_counted(st, p->uid)) continue;
        if (p->state == RL_POD_FAILED) {
            add_counted(st, p->uid, "restarts");
            snprintf(last_fail, sizeof last_fail, "pod %s failed: %s", p->name, p->message);
            event(op, j, true, "PodFailed", "%s (%lld of restartLimit %d)", last_fail, st_int(st, "restarts"),
                  j->restart_limit);
        } else {
            add_counted(st, p->uid, "preemptions");
            event(op, j, false, "PodPreempted", "pod %s %s (%s%s%s): replaced, not counted against restartLimit",
                  p->name, taken ? "is being deleted" : "ended", p->reason, p->message[0] ? ": " : "", p->message);
        }
        replaced = true;
    }
    long long restarts = st_int(st, "restarts");
    if (restarts > j->restart_limit) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%lld pod failures exceed restartLimit %d%s%s", restarts, j->restart_limit,
                 last_fail[0] ? "; last: " : "", last_fail);
        set_condition(st, "Failed", true, "RestartLimitExceeded", msg);
        set_condition(st, "Running", false, "RestartLimitExceeded", "");
        set_condition(st, "Restarting", false, "RestartLimitExceeded", "");
        jset(st, "phase", cJSON_CreateString("Failed"));
        char ts[32];
        rfc3339(ts, sizeof ts);
        jset(st, "completionTime", cJSON_CreateString(ts));
        event(op, j, true, "Failed", "%s", msg);
        if ((rc = write_status(op, j, old, st, e))) goto out;
        rc = cleanup(op, j, pods, n, e);
        goto out;
    }
    if (replaced) {
        set_condition(st, "Restarting", true, "PodReplaced", "replacing pods; training resumes from the last checkpoint");
        if ((rc = write_status(op, j, old, st, e))) goto out; /* counted before deleted */
    }
    for (int i = 0; i < n && !rc; i++) {
        rl_pod_info *p = &pods[i];
        if (p->state == RL_POD_FAILED || p->state == RL_POD_PREEMPTED) {
            rc = delete_pod(op, j, p->name, e);
            p->state = RL_POD_TERMINATING;
        } else if (p->state != RL_POD_TERMINATING && (p->index < 0 || p->index >= j->replicas)) {
            event(op, j, false, "ScaledDown", "deleting pod %s (replicas %d)", p->name, j->replicas);
            rc = delete_pod(op, j, p->name, e);
            p->state = RL_POD_TERMINATING;
        }
    }
    if (rc) goto out;

    /* Create what is missing (a name still held by a terminating pod waits). */
    char refused[1024] = "";
    if (!conflict[0]) {
        int created = 0;
        for (int idx = 0; idx < j->replicas && !rc; idx++) {
            bool have = false;
            for (int i = 0; i < n && !have; i++) have = pods[i].index == idx;
            if (have) continue;
            char no[sizeof refused] = "";
            if (!(rc = create_pod(op, j, idx, no, sizeof no, e)) && !no[0]) created++;
            if (no[0] && !refused[0]) snprintf(refused, sizeof refused, "%s", no);
        }
        if (rc) goto out;
        if (created)
            event(op, j, false, "CreatedPods", "created %d pod(s) for %d node(s)", created, j->replicas);
        /* every refused pass, folded into one Event's count; no watch event
         * tells when the refusal goes (a quota freed): try again soon */
        if (refused[0]) {
            event(op, j, true, "PodCreateFailed", "%s", refused);
            requeue_within(op, REFUSED_RETRY_S);
        }
    }

    /* Phase */
    count_pods(j, pods, n, st);
    int ready = 0, need = j->elastic ? j->min_nodes : j->replicas;
    const rl_pod_info *why = NULL;
    for (int i = 0; i < n; i++) {
        if (pods[i].state == RL_POD_RUNNING && pods[i].ready) ready++;
        if (pods[i].state == RL_POD_PENDING && !why && strcmp(pods[i].reason, "Pending") != 0) why = &pods[i];
    }
    if (conflict[0]) {
        if (set_condition(st, "Running", false, "ResourceConflict", conflict))
            event(op, j, true, "ResourceConflict", "%s", conflict);
        snprintf(phase, sizeof phase, "Pending");
    } else if (refused[0] && ready < need) {
        set_condition(st, "Running", false, "PodCreateFailed", refused);
        snprintf(phase, sizeof phase, "%s", condition_on(st, "Restarting") ? "Restarting" : "Pending");
    } else if (ready >= need && ready > 0) {
        if (condition_on(st, "Restarting") && ready >= j->replicas)
            set_condition(st, "Restarting", false, "Recovered", "every pod is running again");
        if (set_condition(st, "Running", true, "Running", "") && !condition_on(st, "Restarting"))
            event(op, j, false, "Running", "%d of %d node(s) running", ready, j->replicas);
        snprintf(phase, sizeof phase, "%s", condition_on(st, "Restarting") ? "Restarting" : "Running");
    } else {
        char msg[900];
        if (why) snprintf(msg, sizeof msg, "pod %s: %s%s%s", why->name, why->reason, why->message[0] ? ": " : "", why->message);
        else snprintf(msg, sizeof msg, "%d of %d node(s) ready", ready, need);
        const char *reason = why ? why->reason : "PodsNotReady";
        if (set_condition(st, "Running", false, reason, msg) && why)
            event(op, j, true, reason, "%s", msg);
        snprintf(phase, sizeof phase, "%s", condition_on(st, "Restarting") ? "Restarting" : "Pending");
    }
    jset(st, "phase", cJSON_CreateString(phase));
    note_stuck(op, j, pods, n, st);
    mirror_progress(op, j, st);
    prune_counted(st, pods, n);
    rc = write_status(op, j, old, st, e);
out:
    free(pods);
    return rc;
}
