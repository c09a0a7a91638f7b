/* How a worker pod stands, from its status, and above all how it ended:
 * the difference between a failure (counts against restartLimit) and a
 * preemption (the node went, the pod was evicted or deleted, the worker
 * stopped on SIGTERM with its checkpoint written) is what users of
 * PyTorchJob miss most -- spot reclaims there eat the restart budget. The
 * worker's exit status carries its class (util.h: rl_exit_class); this
 * file adds what only Kubernetes sees. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator.h"

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
    static const char *const n[] = {"Pending",   "Running", "Terminating",          "Succeeded",
                                    "Preempted", "Failed",  "InfrastructureFailed", "UserError"};
    _Static_assert(sizeof n / sizeof n[0] == RL_POD_STATE_LAST + 1, "a name for every rl_pod_state");
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

/* The worker's terminated state in one line: its status, the runtime's
 * reason and the last line of its termination message, the one that says
 * why (the worker writes "<class>: <message>"; with
 * FallbackToLogsOnError, its last log line). */
static void termination_message(const cJSON *term, int exit_code, char *msg, size_t n) {
    const char *treason = str(term, "reason"), *tmsg = str(term, "message");
    const char *last = tmsg + strlen(tmsg);
    while (last > tmsg && (last[-1] == '\n' || last[-1] == ' ')) last--;
    const char *nl = last;
    while (nl > tmsg && nl[-1] != '\n') nl--;
    snprintf(msg, n, "container exited with status %d%s%s%s%.*s", exit_code, *treason ? ": " : "", treason,
             last > nl ? ": " : "", (int)(last - nl), nl);
}

/* The state and reason an exit status gives: its class (util.h), except
 * that exit 0 is the job's completion (whatever the runtime adds) and the
 * kernel's OOM killer (reason OOMKilled) is infrastructure whatever the
 * status -- often a neighbour's fault on a shared node. */
static void judge_exit(int exit_code, const char *treason, rl_pod_info *p, const char *msg) {
    if (exit_code == 0) {
        p->state = RL_POD_SUCCEEDED;
        set(p, "Completed", msg);
        return;
    }
    if (!strcmp(treason, "OOMKilled")) {
        p->state = RL_POD_INFRA_FAILED;
        set(p, "OOMKilled", msg);
        return;
    }
    switch (rl_exit_class(exit_code)) {
    case RL_FAIL_USER:
        p->state = RL_POD_USER_ERROR;
        set(p, "UserError", msg);
        break;
    case RL_FAIL_PREEMPTION:
        p->state = RL_POD_PREEMPTED;
        set(p, exit_code == RL_EXIT_PREEMPTED ? "Preempted" : "Terminated", msg);
        break;
    case RL_FAIL_INFRA:
        p->state = RL_POD_INFRA_FAILED;
        set(p, exit_code == RL_EXIT_PEER_LOST ? "PeerLost" : "Infrastructure", msg);
        break;
    default: /* a crash (or no status at all): the runtime says how */
        p->state = RL_POD_FAILED;
        set(p, *treason ? treason : "Error", msg);
    }
}

/* How the pod ended: a pod-level reason or disruption (evicted, node
 * shutdown, preempted by the scheduler) is a preemption whatever the
 * worker's status; else the worker container's terminated state says. */
static void ended(const cJSON *status, rl_pod_info *p) {
    const char *reason = str(status, "reason"); /* pod-level: Evicted, Shutdown, NodeLost, ... */
    const cJSON *dt = condition(status, "DisruptionTarget");
    bool disrupted = dt && !strcmp(str(dt, "status"), "True");
    if (*reason || disrupted) {
        p->state = RL_POD_PREEMPTED;
        set(p, *reason ? reason : str(dt, "reason"), *reason ? str(status, "message") : str(dt, "message"));
        return;
    }
    const cJSON *term = worker_state(status, "terminated");
    if (!term) {
        p->state = RL_POD_FAILED;
        set(p, "Failed", str(status, "message"));
        return;
    }
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(term, "exitCode");
    int exit_code = cJSON_IsNumber(code) ? code->valueint : -1;
    char msg[512];
    termination_message(term, exit_code, msg, sizeof msg);
    judge_exit(exit_code, str(term, "reason"), p, msg);
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
         * non-zero; one stopped mid-collective, 76), so it is a preemption,
         * whatever class its status would have. */
        if (rl_pod_ended(p->state) && p->state != RL_POD_PREEMPTED && *str(md, "deletionTimestamp")) {
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
