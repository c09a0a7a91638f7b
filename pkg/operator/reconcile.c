/* One reconcile of one TrainingJob: read it and what it owns, take the
 * next steps toward its spec, write its status. Nothing is remembered
 * between calls except what the API server holds, so a restarted operator
 * carries on where the last one stopped. This file is the I/O: what the
 * steps are, and their order, is decided in decide.c. */
#include <cjson/cJSON.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "operator/cache.h"
#include "operator/decide.h"
#include "operator.h"

#define jstr rl_op_jstr
#define jobj rl_op_jobj
#define jset rl_op_jset

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
static void rfc3339(char *out, size_t n) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
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

/* "Pending" makes a 409 ours, so it is trusted only as the API holds it
 * now: a cache that lags our own writes can still show "Pending" after a
 * pass recorded "Conflict", and taking someone else's Secret for ours
 * would start the job's pods with it. One GET, in this state only. */
static int fresh_secret_record(rl_op *op, const rl_op_job *j, char *rec, size_t n, rl_err *e) {
    char path[512];
    long code = 0;
    cJSON *obj = NULL;
    int rc = rl_k8s_path(path, sizeof path, RL_OP_GV, j->ns, "trainingjobs", j->name, e);
    if (!rc) rc = rl_k8s_get(op->k, path, &code, &obj, e);
    if (!rc) snprintf(rec, n, "%s", jstr(jobj(obj, "status"), SECRET_FIELD));
    cJSON_Delete(obj);
    return rc;
}

static int ensure_secret(rl_op *op, const rl_op_job *j, const cJSON *old, cJSON *st, char *conflict, size_t cn,
                         rl_err *e) {
    char hex[129], rec[16], path[512];
    random_hex(hex, 32);
    if (!hex[0]) return rl_errf(e, RL_EINTERNAL, "no randomness for the rendezvous secret");
    snprintf(rec, sizeof rec, "%s", jstr(st, SECRET_FIELD));
    int rc;
    if (!strcmp(rec, "Pending") && cached(op, RL_OPC_JOBS) &&
        (rc = fresh_secret_record(op, j, rec, sizeof rec, e)))
        return rc;
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
static int reconcile_job(rl_op *op, const rl_op_job *j, const cJSON *old, cJSON *st, const char *now,
                         rl_err *e);

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
    char now[32];
    rfc3339(now, sizeof now);
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
        if (rl_op_set_condition(st, "SpecRejected", true, "InvalidSpec", perr.msg, now))
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
        if (rl_op_set_condition(st, "Failed", true, "InvalidSpec", perr.msg, now))
            event(op, &j, true, "InvalidSpec", "%s", perr.msg);
        rl_op_set_condition(st, "Running", false, "InvalidSpec", "", now);
        jset(st, "phase", cJSON_CreateString("Failed"));
        jset(st, "observedGeneration", cJSON_CreateNumber((double)j.generation));
        rc = reconcile_job(op, &j, old, st, now, e); /* over: its pods cleaned up */
    } else {
        if (rl_op_condition_on(st, "SpecRejected"))
            rl_op_set_condition(st, "SpecRejected", false, "SpecValid", "the spec is valid again", now);
        jset(st, "observedGeneration", cJSON_CreateNumber((double)j.generation));
        rc = reconcile_job(op, &j, old, st, now, e);
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

/* The progress Lease's annotations (NULL: none, or not readable now: the
 * status keeps what it had). */
static cJSON *observe_progress(rl_op *op, const rl_op_job *j) {
    char path[512], name[128];
    snprintf(name, sizeof name, "%s-progress", j->name);
    rl_err e = {0};
    long code = 0;
    cJSON *lease = NULL;
    if (cached(op, RL_OPC_LEASES)) {
        if (!(lease = rl_op_cache_get(op->cache, RL_OPC_LEASES, j->ns, name))) return NULL;
    } else if (rl_k8s_path(path, sizeof path, "coordination.k8s.io/v1", j->ns, "leases", name, &e) ||
               rl_k8s_get(op->k, path, &code, &lease, &e)) {
        cJSON_Delete(lease);
        return NULL;
    }
    cJSON *ann = jobj(jobj(lease, "metadata"), "annotations");
    cJSON *out = ann ? cJSON_Duplicate(ann, 1) : NULL;
    cJSON_Delete(lease);
    return out;
}

/* Apply a plan's steps from `from` on, in order, stopping at the first
 * error. Creates count into *created; the first admission refusal goes to
 * refused. */
static int apply(rl_op *op, const rl_op_job *j, const cJSON *old, const rl_op_plan *p, int from,
                 int *created, char *refused, size_t rn, rl_err *e) {
    if (p->nomem) return rl_errf(e, RL_ENOMEM, "out of memory");
    int rc = RL_OK;
    for (int i = from; i < p->n && !rc; i++) {
        const rl_op_step *s = &p->steps[i];
        switch (s->kind) {
        case RL_OP_EVENT: event(op, j, s->warning, s->reason, "%s", s->msg); break;
        case RL_OP_WRITE: rc = write_status(op, j, old, s->status, e); break;
        case RL_OP_DELETE: rc = delete_pod(op, j, s->pod, e); break;
        case RL_OP_CREATE: {
            char no[1024] = "";
            if (!(rc = create_pod(op, j, s->index, no, sizeof no, e)) && !no[0]) (*created)++;
            if (no[0] && !refused[0]) snprintf(refused, rn, "%s", no);
            break;
        }
        }
    }
    requeue_within(op, p->requeue_s);
    return rc;
}

/* Observe (pods, owned objects, progress), decide (decide.c), act. */
static int reconcile_job(rl_op *op, const rl_op_job *j, const cJSON *old, cJSON *st, const char *now,
                         rl_err *e) {
    rl_pod_info *pods = NULL;
    int n = 0, rc;
    if ((rc = list_pods(op, j, &pods, &n, e))) return rc;
    char conflict[512] = "";
    bool over = rl_op_terminal(jstr(st, "phase"));
    if (!over && (rc = ensure_all(op, j, old, st, conflict, sizeof conflict, e))) {
        free(pods);
        return rc;
    }
    cJSON *progress = over || j->suspend ? NULL : observe_progress(op, j);
    rl_op_seen seen = {.job = j, .pods = pods, .n = n, .conflict = conflict, .progress = progress,
                       .stuck_s = op->stuck_s, .now = now};
    rl_op_plan plan;
    rl_op_decide(&seen, st, &plan);
    int created = 0;
    char refused[1024] = "";
    rc = apply(op, j, old, &plan, 0, &created, refused, sizeof refused, e);
    if (!rc && plan.then_phase) {
        int from = plan.n; /* only the steps the phase adds */
        rl_op_decide_phase(&seen, created, refused, &plan);
        rc = apply(op, j, old, &plan, from, &created, refused, sizeof refused, e);
    }
    rl_op_plan_free(&plan);
    cJSON_Delete(progress);
    free(pods);
    return rc;
}
