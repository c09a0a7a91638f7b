/* How a worker pod stands, from its status, and above all how it ended:
 * the difference between a failure (counts against restartLimit) and a
 * preemption (the node went, the pod was evicted or deleted, the worker
 * stopped on SIGTERM with its checkpoint written) is what users of
 * PyTorchJob miss most -- spot reclaims there eat the restart budget. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator.h"

/* the worker's exit statuses that mean "not my fault" (cmd/worker,
 * pkg/agent): 75 stopped on SIGTERM with a committed checkpoint, 76 a peer
 * was lost; 143 is a SIGTERM death (128 + 15) */
static bool benign_exit(int code) { return code == 75 || code == 76 || code == 143; }

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return cJSON_IsString(v) ? v->valuestring : "";
}

static const cJSON *obj(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return cJSON_IsObject(v) ? v : NULL;
}

static const cJSON *condition(const cJSON *status, const char *type) {
    const cJSON *cs = cJSON_IsObject(status) ? cJSON_GetObjectItemCaseSensitive(status, "conditions") : NULL;
    if (!cJSON_IsArray(cs)) return NULL;
    for (const cJSON *c = cs->child; c; c = c->next)
        if (!strcmp(str(c, "type"), type)) return c;
    return NULL;
}

const char *rl_pod_state_name(rl_pod_state s) {
    static const char *const n[] = {"Pending", "Running", "Terminating", "Succeeded", "Preempted", "Failed"};
    return (unsigned)s < sizeof n / sizeof n[0] ? n[s] : "?";
}

static void set(rl_pod_info *p, const char *reason, const char *message) {
    snprintf(p->reason, sizeof p->reason, "%s", reason);
    snprintf(p->message, sizeof p->message, "%s", message);
}

/* The worker's state `which` (waiting, running, terminated), or NULL. Its
 * status is found by name: the kubelet sorts containerStatuses by name,
 * and a service mesh's injected proxy (istio-proxy, linkerd-proxy) may
 * sort before it. Native sidecars report in initContainerStatuses. */
static const cJSON *worker_state(const cJSON *status, const char *which) {
    const cJSON *cs = cJSON_IsObject(status) ? cJSON_GetObjectItemCaseSensitive(status, "containerStatuses") : NULL;
    for (const cJSON *c = cJSON_IsArray(cs) ? cs->child : NULL; c; c = c->next)
        if (!strcmp(str(c, "name"), RL_OP_CONTAINER)) return obj(obj(c, "state"), which);
    return NULL;
}

/* How the pod ended, from the worker container's terminated state. */
static void ended(const cJSON *status, rl_pod_info *p) {
    const char *reason = str(status, "reason"); /* pod-level: Evicted, Shutdown, NodeLost, ... */
    const cJSON *dt = condition(status, "DisruptionTarget");
    bool disrupted = dt && !strcmp(str(dt, "status"), "True");
    const cJSON *term = worker_state(status, "terminated");
    const cJSON *code = term ? cJSON_GetObjectItemCaseSensitive(term, "exitCode") : NULL;
    int exit_code = cJSON_IsNumber(code) ? code->valueint : -1;
    if (*reason || disrupted) {
        p->state = RL_POD_PREEMPTED;
        set(p, *reason ? reason : str(dt, "reason"), *reason ? str(status, "message") : str(dt, "message"));
        return;
    }
    char msg[512];
    if (term) {
        const char *treason = str(term, "reason"), *tmsg = str(term, "message");
        /* the termination message: the worker's last log line is the one that says why */
        const char *last = tmsg + strlen(tmsg);
        while (last > tmsg && (last[-1] == '\n' || last[-1] == ' ')) last--;
        const char *nl = last;
        while (nl > tmsg && nl[-1] != '\n') nl--;
        snprintf(msg, sizeof msg, "container exited with status %d%s%s%s%.*s", exit_code, *treason ? ": " : "",
                 treason, last > nl ? ": " : "", (int)(last - nl), nl);
        if (exit_code == 0) {
            p->state = RL_POD_SUCCEEDED;
            set(p, "Completed", msg);
        } else if (benign_exit(exit_code)) {
            p->state = RL_POD_PREEMPTED;
            set(p, exit_code == 75 ? "Preempted" : exit_code == 76 ? "PeerLost" : "Terminated", msg);
        } else {
            p->state = RL_POD_FAILED;
            set(p, *treason ? treason : "Error", msg);
        }
        return;
    }
    p->state = RL_POD_FAILED;
    set(p, "Failed", str(status, "message"));
}

/* The first init container (a native sidecar, or one that runs to
 * completion) that waits for a reason worth reporting, or NULL. */
static const cJSON *waiting_init_container(const cJSON *status) {
    const cJSON *cs = cJSON_IsObject(status) ? cJSON_GetObjectItemCaseSensitive(status, "initContainerStatuses") : NULL;
    for (const cJSON *c = cJSON_IsArray(cs) ? cs->child : NULL; c; c = c->next) {
        const char *r = str(obj(obj(c, "state"), "waiting"), "reason");
        if (*r && strcmp(r, "PodInitializing") != 0 && strcmp(r, "ContainerCreating") != 0) return c;
    }
    return NULL;
}

void rl_op_pod_classify(const cJSON *pod, rl_pod_info *p) {
    memset(p, 0, sizeof *p);
    const cJSON *md = obj(pod, "metadata"), *status = obj(pod, "status");
    snprintf(p->name, sizeof p->name, "%s", str(md, "name"));
    snprintf(p->uid, sizeof p->uid, "%s", str(md, "uid"));
    const char *idx = str(obj(md, "labels"), RL_OP_LABEL_INDEX);
    char *end;
    long i = strtol(idx, &end, 10);
    p->index = *idx && !*end && i >= 0 && i < 100000 ? (int)i : -1;
    const char *phase = str(status, "phase");
    if (!strcmp(phase, "Succeeded")) {
        p->state = RL_POD_SUCCEEDED;
        set(p, "Completed", "");
        return;
    }
    /* Failed, or the worker ended while a sidecar keeps the pod Running: a
     * mesh's proxy as a plain container never exits by itself, so with
     * restartPolicy Never (the operator's pods) the worker's own ending is
     * the pod's. */
    if (!strcmp(phase, "Failed") || worker_state(status, "terminated")) {
        ended(status, p);
        /* Deleted, then ended: whatever its exit status, the deletion
         * stopped it (a worker SIGTERMed before its first checkpoint exits
         * non-zero), so it is not the pod's failure. */
        if (p->state == RL_POD_FAILED && *str(md, "deletionTimestamp")) {
            p->state = RL_POD_PREEMPTED;
            snprintf(p->reason, sizeof p->reason, "Deleted");
        }
        return;
    }
    if (*str(md, "deletionTimestamp")) {
        p->state = RL_POD_TERMINATING;
        set(p, "Terminating", "");
        return;
    }
    const cJSON *ready = condition(status, "Ready");
    p->ready = ready && !strcmp(str(ready, "status"), "True");
    if (!strcmp(phase, "Running")) {
        p->state = RL_POD_RUNNING;
        return;
    }
    /* Pending (or no status yet): say why, as kubectl describe would */
    p->state = RL_POD_PENDING;
    const cJSON *sched = condition(status, "PodScheduled");
    if (sched && !strcmp(str(sched, "status"), "False")) {
        set(p, *str(sched, "reason") ? str(sched, "reason") : "Unschedulable", str(sched, "message"));
        return;
    }
    const cJSON *waiting = worker_state(status, "waiting");
    const cJSON *init = waiting_init_container(status);
    if (init && (!waiting || !strcmp(str(waiting, "reason"), "PodInitializing"))) {
        /* the worker waits for an init container (a native sidecar that
         * cannot start): that one says why */
        const cJSON *w = obj(obj(init, "state"), "waiting");
        char msg[sizeof p->message];
        snprintf(msg, sizeof msg, "init container %s: %s", str(init, "name"), str(w, "message"));
        set(p, str(w, "reason"), msg);
        return;
    }
    if (waiting) {
        set(p, str(waiting, "reason"), str(waiting, "message"));
        return;
    }
    set(p, "Pending", "");
}
