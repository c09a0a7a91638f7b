/* One reconcile's decisions (decide.h): from what was seen to the steps
 * that move the job toward its spec, and the status that records them. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "operator/decide.h"

#define jstr rl_op_jstr
#define jobj rl_op_jobj
#define jset rl_op_jset

#define REFUSED_RETRY_S 30.0 /* no watch event says when a refusal goes (a quota freed) */

/* Infrastructure failures do not count against restartLimit, so a lasting
 * one (a memory limit the job cannot live in, a storage endpoint that is
 * down) would recreate pods as fast as the API takes them, on a shared
 * cluster. Replacements after infrastructure failures in a row back off
 * as the kubelet's CrashLoopBackOff does: 10 s, doubling to 5 min; a
 * failure more than 10 min after the last one starts the streak over. */
#define INFRA_BACKOFF_S 10.0
#define INFRA_BACKOFF_MAX_S 300.0
#define INFRA_STREAK_GAP_S 600.0

/* ---- conditions and counters ------------------------------------------------------------ */
bool rl_op_set_condition(cJSON *st, const char *type, bool on, const char *reason, const char *msg,
                         const char *now) {
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
    if (flip) jset(c, "lastTransitionTime", cJSON_CreateString(now));
    return changed;
}

bool rl_op_condition_on(const cJSON *st, const char *type) {
    const cJSON *cs = cJSON_IsObject(st) ? cJSON_GetObjectItemCaseSensitive(st, "conditions") : NULL;
    if (!cJSON_IsArray(cs)) return false;
    for (const cJSON *it = cs->child; it; it = it->next)
        if (!strcmp(jstr(it, "type"), type)) return !strcmp(jstr(it, "status"), "True");
    return false;
}

bool rl_op_terminal(const char *phase) {
    return !strcmp(phase, "Succeeded") || !strcmp(phase, "Failed");
}

static long long st_int(const cJSON *st, const char *k) {
    const cJSON *v = cJSON_IsObject(st) ? cJSON_GetObjectItemCaseSensitive(st, k) : NULL;
    return cJSON_IsNumber(v) ? (long long)v->valuedouble : 0;
}

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

static void count_pods(const rl_op_seen *s, cJSON *st) {
    int exist = 0, ready = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->pods[i].state == RL_POD_TERMINATING) continue;
        exist++;
        if (s->pods[i].state == RL_POD_RUNNING && s->pods[i].ready) ready++;
    }
    char sel[128];
    snprintf(sel, sizeof sel, RL_OP_LABEL_JOB "=%s", s->job->name);
    jset(st, "replicas", cJSON_CreateNumber(exist));
    jset(st, "readyReplicas", cJSON_CreateNumber(ready));
    jset(st, "selector", cJSON_CreateString(sel));
    /* counters present from the start: "0 restarts" is information */
    if (!cJSON_GetObjectItemCaseSensitive(st, "restarts")) cJSON_AddNumberToObject(st, "restarts", 0);
    if (!cJSON_GetObjectItemCaseSensitive(st, "preemptions")) cJSON_AddNumberToObject(st, "preemptions", 0);
    if (!cJSON_GetObjectItemCaseSensitive(st, "infrastructureFailures"))
        cJSON_AddNumberToObject(st, "infrastructureFailures", 0);
}

/* An annotation that is a finite number, whole text; false otherwise. */
static bool ann_num(const cJSON *ann, const char *k, double *out) {
    const char *t = jstr(ann, k);
    char *end;
    *out = strtod(t, &end);
    return *t && !*end && isfinite(*out);
}

/* The last round change the rank-0 agent measured: status.lastRecovery
 * {round, seconds, stepsLost}, only when all three are numbers. */
static void mirror_recovery(const cJSON *ann, cJSON *st) {
    static const char *const k[3] = {"ringleader.dev/recovery-round", "ringleader.dev/recovery-seconds",
                                     "ringleader.dev/recovery-steps-lost"};
    double v[3];
    for (int i = 0; i < 3; i++)
        if (!ann_num(ann, k[i], &v[i]) || v[i] < 0 || v[i] > 1e15) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "round", floor(v[0]));
    cJSON_AddNumberToObject(o, "seconds", round(v[1] * 1e3) / 1e3);
    cJSON_AddNumberToObject(o, "stepsLost", floor(v[2]));
    jset(st, "lastRecovery", o);
}

/* The agent writes a sentence of ~500 bytes and a URI; anything longer is
 * a worker's garbage, kept short rather than grown toward etcd's limit. */
#define HANG_TEXT_MAX 600
#define HANG_URI_MAX 1024

/* Copy at most max bytes of src, cut before a UTF-8 character's middle
 * (the status is JSON: a split character would be invalid text). */
static void clip(char *dst, size_t max, const char *src) {
    size_t n = strnlen(src, max + 1);
    if (n > max) {
        n = max;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80) n--;
    }
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* The rank-0 agent's progress (annotations of <job>-progress) into the
 * status: numbers only when they are numbers, a worker's garbage is not
 * worth a failure, and text is clipped. */
static void mirror_progress(const rl_op_seen *s, cJSON *st) {
    static const struct { const char *ann, *field; int kind; /* 0 int, 1 number, 2 string */ } map[] = {
        {"ringleader.dev/step", "step", 0},
        {"ringleader.dev/loss", "loss", 1},
        {"ringleader.dev/tokens-per-second", "tokensPerSecond", 1},
        {"ringleader.dev/last-checkpoint", "lastCheckpoint", 2},
        {"ringleader.dev/round", "round", 0},
    };
    if (!s->progress) return;
    mirror_recovery(s->progress, st);
    /* "" means rank 0 judged and found none: the field goes */
    char slow[HANG_TEXT_MAX + 1];
    clip(slow, HANG_TEXT_MAX, jstr(s->progress, "ringleader.dev/stragglers"));
    if (*slow) jset(st, "stragglers", cJSON_CreateString(slow));
    else cJSON_DeleteItemFromObjectCaseSensitive(st, "stragglers");
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        const char *v = jstr(s->progress, map[i].ann);
        if (!*v) continue;
        if (map[i].kind == 2) {
            char uri[HANG_URI_MAX + 1];
            clip(uri, HANG_URI_MAX, v);
            jset(st, map[i].field, cJSON_CreateString(uri));
            continue;
        }
        double d;
        if (!ann_num(s->progress, map[i].ann, &d)) continue;
        if (map[i].kind == 0) d = floor(d);
        else d = round(d * 1e4) / 1e4;
        jset(st, map[i].field, cJSON_CreateNumber(d));
    }
}

/* ---- building the plan ---------------------------------------------------------------------- */
static rl_op_step *add_step(rl_op_plan *p, rl_op_step_kind kind) {
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 16;
        rl_op_step *v = realloc(p->steps, (size_t)cap * sizeof *v);
        if (!v) {
            p->nomem = true;
            return NULL;
        }
        p->steps = v, p->cap = cap;
    }
    rl_op_step *st = &p->steps[p->n++];
    memset(st, 0, sizeof *st);
    st->kind = kind;
    return st;
}

static void event(rl_op_plan *p, bool warning, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void event(rl_op_plan *p, bool warning, const char *reason, const char *fmt, ...) {
    rl_op_step *st = add_step(p, RL_OP_EVENT);
    if (!st) return;
    st->warning = warning;
    snprintf(st->reason, sizeof st->reason, "%s", reason);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
}

static void write_now(rl_op_plan *p) {
    rl_op_step *st = add_step(p, RL_OP_WRITE);
    if (!st) return;
    if (!(st->status = cJSON_Duplicate(p->status, 1))) p->nomem = true;
}

static void delete_pod(rl_op_plan *p, rl_pod_info *pod) {
    rl_op_step *st = add_step(p, RL_OP_DELETE);
    if (st) snprintf(st->pod, sizeof st->pod, "%s", pod->name);
}

static void requeue_within(rl_op_plan *p, double s) {
    if (s > 0 && (p->requeue_s <= 0 || s < p->requeue_s)) p->requeue_s = s;
}

/* ---- a hang the agent diagnosed ------------------------------------------------------------ */
struct hang {
    char what[HANG_TEXT_MAX + 1], dump[HANG_URI_MAX + 1], time[64];
    long long round; /* -1: unknown */
};

/* A round annotation: a decimal integer within int, else -1 (unknown):
 * a garbage value must neither fail the reconcile nor a status write. */
static long long ann_round(const cJSON *ann, const char *k) {
    const char *v = jstr(ann, k);
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    return isdigit((unsigned char)*v) && !*end && !errno && n <= INT_MAX ? n : -1;
}

/* The ringleader.dev/hung annotations; false when there is no hang. */
static bool read_hang(const cJSON *ann, struct hang *h) {
    const char *what = jstr(ann, "ringleader.dev/hung");
    if (!*what) return false;
    clip(h->what, HANG_TEXT_MAX, what);
    clip(h->dump, HANG_URI_MAX, jstr(ann, "ringleader.dev/hung-dump"));
    clip(h->time, sizeof h->time - 1, jstr(ann, "ringleader.dev/hung-time"));
    h->round = ann_round(ann, "ringleader.dev/hung-round");
    return true;
}

static void last_hang(cJSON *st, const struct hang *h) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "message", h->what);
    if (h->round >= 0) cJSON_AddNumberToObject(o, "round", (double)h->round);
    cJSON_AddStringToObject(o, "dump", h->dump);
    cJSON_AddStringToObject(o, "time", h->time);
    jset(st, "lastHang", o);
}

/* Condition Hung, only on a job that hung: True while the leader's round
 * is the hung one (or unknown), False once a later round shows the job
 * got past it -- the sentence kept, so it can still be read. An unknown
 * hung round never counts as recovered. */
static void mirror_hang(const rl_op_seen *s, rl_op_plan *p) {
    struct hang h;
    if (!read_hang(s->progress, &h)) return;
    long long now_round = ann_round(s->progress, "ringleader.dev/round");
    bool past = h.round >= 0 && now_round > h.round;
    char msg[HANG_TEXT_MAX + HANG_URI_MAX + 64];
    if (past) snprintf(msg, sizeof msg, "recovered in round %lld: %s", now_round, h.what);
    else snprintf(msg, sizeof msg, "%s%s%s%s", h.what, h.dump[0] ? " (records: " : "", h.dump, h.dump[0] ? ")" : "");
    if (rl_op_set_condition(p->status, "Hung", !past, past ? "Recovered" : "CollectiveHung", msg, s->now)) {
        if (past) event(p, false, "HangRecovered", "%s", msg);
        else event(p, true, "Hung", "%s", h.what);
    }
    last_hang(p->status, &h);
}

/* Condition Degraded, from each round's pre-flight (ringleader.dev/degraded):
 * True naming the ranks below the median, False once a later round's
 * pre-flight found none; a job never found degraded has no such condition. */
static void mirror_degraded(const rl_op_seen *s, rl_op_plan *p) {
    const cJSON *a = s->progress ? cJSON_GetObjectItemCaseSensitive(s->progress, "ringleader.dev/degraded") : NULL;
    if (!cJSON_IsString(a)) return;
    char what[HANG_TEXT_MAX + 1];
    clip(what, HANG_TEXT_MAX, a->valuestring);
    if (!what[0] && !rl_op_condition_on(p->status, "Degraded")) return;
    if (rl_op_set_condition(p->status, "Degraded", what[0], what[0] ? "PreflightBelowMedian" : "PreflightPassed",
                            what[0] ? what : "every rank's pre-flight is within range of the median", s->now) &&
        what[0])
        event(p, true, "Degraded", "%s", what);
}

/* After the end: pods go per cleanPodPolicy (All: every pod; Running:
 * those still running or pending, so a failed pod's logs stay readable;
 * None: all stay). */
static void cleanup(const rl_op_seen *s, rl_op_plan *p) {
    const char *policy = s->job->clean_policy;
    for (int i = 0; i < s->n; i++) {
        rl_pod_info *q = &s->pods[i];
        if (q->state == RL_POD_TERMINATING || !strcmp(policy, "None")) continue;
        if (!strcmp(policy, "Running") && q->state != RL_POD_RUNNING && q->state != RL_POD_PENDING) continue;
        delete_pod(p, q);
    }
}

/* The job ends: Succeeded or Failed, written, then its pods cleaned up. */
static void finish(const rl_op_seen *s, rl_op_plan *p, bool ok, const char *reason, const char *msg) {
    cJSON *st = p->status;
    rl_op_set_condition(st, ok ? "Succeeded" : "Failed", true, reason, msg, s->now);
    rl_op_set_condition(st, "Running", false, reason, "", s->now);
    rl_op_set_condition(st, "Restarting", false, reason, "", s->now);
    jset(st, "phase", cJSON_CreateString(ok ? "Succeeded" : "Failed"));
    jset(st, "completionTime", cJSON_CreateString(s->now));
    if (ok) mirror_progress(s, st);
    mirror_hang(s, p); /* nothing is read after the end: a hang seen now stays named */
    write_now(p);
    cleanup(s, p);
}

/* spec.suspend: pods we stop are not preemptions (marked seen, counted
 * nowhere); written before they are deleted. */
static void suspend(const rl_op_seen *s, rl_op_plan *p) {
    cJSON *st = p->status;
    if (rl_op_set_condition(st, "Suspended", true, "Suspended", "spec.suspend is true: pods deleted", s->now))
        event(p, false, "Suspended", "suspending: deleting %d pod(s); workers checkpoint on SIGTERM", s->n);
    rl_op_set_condition(st, "Running", false, "Suspended", "", s->now);
    jset(st, "phase", cJSON_CreateString("Suspended"));
    for (int i = 0; i < s->n; i++)
        if (!is_counted(st, s->pods[i].uid)) add_counted(st, s->pods[i].uid, NULL);
    write_now(p);
    for (int i = 0; i < s->n; i++)
        if (s->pods[i].state != RL_POD_TERMINATING) delete_pod(p, &s->pods[i]);
    count_pods(s, st);
    prune_counted(st, s->pods, s->n);
    write_now(p);
}

/* How long replacements wait after the streak's last failure (0: none). */
static double infra_backoff_s(long long streak) {
    if (streak <= 0) return 0;
    double d = INFRA_BACKOFF_S * pow(2, (double)(streak < 16 ? streak - 1 : 15));
    return d < INFRA_BACKOFF_MAX_S ? d : INFRA_BACKOFF_MAX_S;
}

/* Seconds from the status's RFC 3339 field k to now (-1: no such time). */
static double since(const rl_op_seen *s, const cJSON *st, const char *k) {
    double then, now;
    if (rl_k8s_time_parse(jstr(st, k), &then) || rl_k8s_time_parse(s->now, &now)) return -1;
    return now - then;
}

/* An infrastructure failure now: the streak goes on, or starts over. */
static void infra_streak(const rl_op_seen *s, cJSON *st) {
    double gap = since(s, st, "lastInfrastructureFailureTime");
    long long streak = gap >= 0 && gap < INFRA_STREAK_GAP_S ? st_int(st, "infrastructureStreak") + 1 : 1;
    jset(st, "infrastructureStreak", cJSON_CreateNumber((double)streak));
    jset(st, "lastInfrastructureFailureTime", cJSON_CreateString(s->now));
}

/* Seconds replacements must still wait (0: none). */
static double infra_wait_s(const rl_op_seen *s, const cJSON *st) {
    double gap = since(s, st, "lastInfrastructureFailureTime");
    double left = infra_backoff_s(st_int(st, "infrastructureStreak")) - gap;
    return gap >= 0 && left > 0 ? left : 0;
}

/* One ended pod, not counted before: its uid and counter in the status
 * (written before it is deleted), and an Event that says which. */
static void count_one(const rl_op_seen *s, rl_op_plan *p, const rl_pod_info *q, char *last_fail, size_t lfn) {
    const char *sep = q->message[0] ? ": " : "";
    switch (q->state) {
    case RL_POD_FAILED:
        add_counted(p->status, q->uid, "restarts");
        snprintf(last_fail, lfn, "pod %s failed: %s", q->name, q->message);
        event(p, true, "PodFailed", "%s (%lld of restartLimit %d)", last_fail, st_int(p->status, "restarts"),
              s->job->restart_limit);
        break;
    case RL_POD_INFRA_FAILED:
        add_counted(p->status, q->uid, "infrastructureFailures");
        infra_streak(s, p->status);
        event(p, true, "InfrastructureFailure",
              "pod %s ended (%s%s%s): replaced in %.0f s, not counted against restartLimit", q->name, q->reason, sep,
              q->message, infra_backoff_s(st_int(p->status, "infrastructureStreak")));
        break;
    case RL_POD_USER_ERROR: /* fail_on_user_error ends the job before this */
        add_counted(p->status, q->uid, NULL);
        break;
    default: /* preempted, or being deleted by someone else */
        add_counted(p->status, q->uid, "preemptions");
        event(p, false, "PodPreempted", "pod %s %s (%s%s%s): replaced, not counted against restartLimit", q->name,
              q->state == RL_POD_TERMINATING ? "is being deleted" : "ended", q->reason, sep, q->message);
    }
}

/* Pods that ended, or are being deleted by someone else: count each once.
 * Returns whether any was; last_fail gets the last crash. */
static bool count_ended(const rl_op_seen *s, rl_op_plan *p, char *last_fail, size_t lfn) {
    const rl_op_job *j = s->job;
    bool any = false;
    for (int i = 0; i < s->n; i++) {
        const rl_pod_info *q = &s->pods[i];
        bool taken = q->state == RL_POD_TERMINATING && q->index >= 0 && q->index < j->replicas;
        if ((!rl_pod_ended(q->state) && !taken) || is_counted(p->status, q->uid)) continue;
        count_one(s, p, q, last_fail, lfn);
        any = true;
    }
    return any;
}

/* A user error (exit 2: a bad config, data or code path) fails the job at
 * once: a retry would end the same way. The first such pod is named; each
 * one's uid is counted (in no counter), so none is ever counted again.
 * Pods that ended beside it -- most likely peers that lost it -- are left
 * uncounted: the job is over. False when no pod ended so. */
static bool fail_on_user_error(const rl_op_seen *s, rl_op_plan *p) {
    const rl_pod_info *first = NULL;
    for (int i = 0; i < s->n; i++) {
        const rl_pod_info *q = &s->pods[i];
        if (q->state != RL_POD_USER_ERROR) continue;
        if (!first) first = q;
        if (!is_counted(p->status, q->uid)) add_counted(p->status, q->uid, NULL);
    }
    if (!first) return false;
    char msg[800];
    snprintf(msg, sizeof msg, "pod %s: %s", first->name, first->message);
    event(p, true, "UserError", "%s; the job failed (a user error is never retried)", msg);
    finish(s, p, false, "UserError", msg);
    return true;
}

/* Delete the pods that ended (counted already) and those past replicas,
 * then create what is missing (a name still held by a terminating pod
 * waits, and everything waits out an infrastructure back-off). */
static void replace_pods(const rl_op_seen *s, rl_op_plan *p) {
    const rl_op_job *j = s->job;
    for (int i = 0; i < s->n; i++) {
        rl_pod_info *q = &s->pods[i];
        if (rl_pod_ended(q->state)) {
            delete_pod(p, q);
            q->state = RL_POD_TERMINATING;
        } else if (q->state != RL_POD_TERMINATING && (q->index < 0 || q->index >= j->replicas)) {
            event(p, false, "ScaledDown", "deleting pod %s (replicas %d)", q->name, j->replicas);
            delete_pod(p, q);
            q->state = RL_POD_TERMINATING;
        }
    }
    if (s->conflict[0]) return;
    double wait = infra_wait_s(s, p->status);
    if (wait > 0) {
        requeue_within(p, wait + 0.1);
        return;
    }
    for (int idx = 0; idx < j->replicas; idx++) {
        bool have = false;
        for (int i = 0; i < s->n && !have; i++) have = s->pods[i].index == idx;
        rl_op_step *c = have ? NULL : add_step(p, RL_OP_CREATE);
        if (c) c->index = idx;
    }
}

void rl_op_decide(const rl_op_seen *s, const cJSON *status, rl_op_plan *p) {
    const rl_op_job *j = s->job;
    memset(p, 0, sizeof *p);
    p->status = status ? cJSON_Duplicate(status, 1) : cJSON_CreateObject();
    if (!p->status) {
        p->nomem = true;
        return;
    }
    cJSON *st = p->status;
    /* Over: only cleanup remains. */
    if (rl_op_terminal(jstr(st, "phase"))) {
        cleanup(s, p);
        count_pods(s, st);
        prune_counted(st, s->pods, s->n);
        write_now(p);
        return;
    }
    if (rl_op_set_condition(st, "Created", true, "Created", "service, secret, RBAC and pods are managed", s->now))
        event(p, false, "Created", "created the headless Service %s, its rendezvous Secret and RBAC", j->name);
    if (!jstr(st, "startTime")[0]) jset(st, "startTime", cJSON_CreateString(s->now));

    /* The job is complete when a worker exits 0: agents do so only once
     * the whole job finished. */
    for (int i = 0; i < s->n; i++)
        if (s->pods[i].state == RL_POD_SUCCEEDED) {
            event(p, false, "Succeeded", "training completed (pod %s exited 0)", s->pods[i].name);
            finish(s, p, true, "Completed", "rank 0 finished training");
            return;
        }
    if (j->suspend) {
        suspend(s, p);
        return;
    }
    if (rl_op_condition_on(st, "Suspended") &&
        rl_op_set_condition(st, "Suspended", false, "Resumed", "spec.suspend is false", s->now))
        event(p, false, "Resumed", "resuming: recreating %d pod(s)", j->replicas);

    if (fail_on_user_error(s, p)) return;
    char last_fail[800] = "";
    bool replaced = count_ended(s, p, last_fail, sizeof last_fail);
    long long restarts = st_int(st, "restarts");
    if (restarts > j->restart_limit) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%lld pod failures exceed restartLimit %d%s%s", restarts, j->restart_limit,
                 last_fail[0] ? "; last: " : "", last_fail);
        event(p, true, "Failed", "%s", msg);
        finish(s, p, false, "RestartLimitExceeded", msg);
        return;
    }
    if (replaced) {
        rl_op_set_condition(st, "Restarting", true, "PodReplaced",
                            "replacing pods; training resumes from the last checkpoint", s->now);
        write_now(p); /* counted before deleted */
    }
    replace_pods(s, p);
    p->then_phase = true;
}

/* A pod that outlives its grace period by stuck_s: only the kubelet ends a
 * graceful delete, so its node is most likely unreachable, and the pod's
 * fixed name stays taken (its replacement cannot be created) until the node
 * comes back or someone force-deletes it. Name the longest-stuck pod and
 * how long, in whole minutes so the status does not change every pass. */
static void note_stuck(const rl_op_seen *s, rl_op_plan *p) {
    const rl_pod_info *worst = NULL;
    for (int i = 0; i < s->n; i++) {
        if (s->pods[i].state != RL_POD_TERMINATING) continue;
        if (s->pods[i].overdue_s < s->stuck_s) /* no event will say when it is due: look then */
            requeue_within(p, s->stuck_s - s->pods[i].overdue_s + 0.1);
        else if (!worst || s->pods[i].overdue_s > worst->overdue_s)
            worst = &s->pods[i];
    }
    if (!worst) {
        if (rl_op_condition_on(p->status, "PodStuckTerminating"))
            rl_op_set_condition(p->status, "PodStuckTerminating", false, "NoneStuck", "no pod is stuck terminating",
                                s->now);
        return;
    }
    char msg[900];
    snprintf(msg, sizeof msg,
             "pod %s has been terminating for %.0f min (its grace period ended %.0f min ago): its node may be "
             "unreachable, and its replacement waits for the name; if the node is gone: kubectl delete pod %s "
             "--force --grace-period=0",
             worst->name, floor(worst->deleting_s / 60), floor(worst->overdue_s / 60), worst->name);
    if (rl_op_set_condition(p->status, "PodStuckTerminating", true, "StuckTerminating", msg, s->now))
        event(p, true, "PodStuckTerminating", "%s", msg);
}

/* The phase from the pods: Running once enough are ready (min_nodes for an
 * elastic job), Restarting while a replacement is under way, else Pending
 * with the first pod's reason for not running yet. */
static const char *phase_of(const rl_op_seen *s, const char *refused, rl_op_plan *p) {
    const rl_op_job *j = s->job;
    cJSON *st = p->status;
    int ready = 0, need = j->elastic ? j->min_nodes : j->replicas;
    const rl_pod_info *why = NULL;
    for (int i = 0; i < s->n; i++) {
        if (s->pods[i].state == RL_POD_RUNNING && s->pods[i].ready) ready++;
        if (s->pods[i].state == RL_POD_PENDING && !why && strcmp(s->pods[i].reason, "Pending") != 0)
            why = &s->pods[i];
    }
    const char *waiting = rl_op_condition_on(st, "Restarting") ? "Restarting" : "Pending";
    if (s->conflict[0]) {
        if (rl_op_set_condition(st, "Running", false, "ResourceConflict", s->conflict, s->now))
            event(p, true, "ResourceConflict", "%s", s->conflict);
        return "Pending";
    }
    if (refused[0] && ready < need) {
        rl_op_set_condition(st, "Running", false, "PodCreateFailed", refused, s->now);
        return waiting;
    }
    if (ready >= need && ready > 0) {
        if (rl_op_condition_on(st, "Restarting") && ready >= j->replicas)
            rl_op_set_condition(st, "Restarting", false, "Recovered", "every pod is running again", s->now);
        if (rl_op_set_condition(st, "Running", true, "Running", "", s->now) && !rl_op_condition_on(st, "Restarting"))
            event(p, false, "Running", "%d of %d node(s) running", ready, j->replicas);
        return rl_op_condition_on(st, "Restarting") ? "Restarting" : "Running";
    }
    char msg[900];
    if (why) snprintf(msg, sizeof msg, "pod %s: %s%s%s", why->name, why->reason, why->message[0] ? ": " : "", why->message);
    else snprintf(msg, sizeof msg, "%d of %d node(s) ready", ready, need);
    const char *reason = why ? why->reason : "PodsNotReady";
    if (rl_op_set_condition(st, "Running", false, reason, msg, s->now) && why) event(p, true, reason, "%s", msg);
    return waiting;
}

void rl_op_decide_phase(const rl_op_seen *s, int created, const char *refused, rl_op_plan *p) {
    p->then_phase = false;
    if (created) event(p, false, "CreatedPods", "created %d pod(s) for %d node(s)", created, s->job->replicas);
    /* every refused pass, folded into one Event's count; no watch event
     * tells when the refusal goes (a quota freed): try again soon */
    if (refused[0]) {
        event(p, true, "PodCreateFailed", "%s", refused);
        requeue_within(p, REFUSED_RETRY_S);
    }
    count_pods(s, p->status);
    jset(p->status, "phase", cJSON_CreateString(phase_of(s, refused, p)));
    note_stuck(s, p);
    mirror_progress(s, p->status);
    mirror_hang(s, p);
    mirror_degraded(s, p);
    prune_counted(p->status, s->pods, s->n);
    write_now(p);
}

void rl_op_plan_free(rl_op_plan *p) {
    for (int i = 0; i < p->n; i++) cJSON_Delete(p->steps[i].status);
    free(p->steps);
    cJSON_Delete(p->status);
    memset(p, 0, sizeof *p);
}
