/* What the cluster refuses or holds back must reach the TrainingJob's
 * status, where users look (the operator binary against the stand-in; real
 * kubectl reads what a user would; the stand-in's write history orders
 * status writes and Events).
 *
 * Admission refusing the pods: a ResourceQuota's 403, a validating
 * webhook's 400 and RBAC's 403 (the stand-in's POST /admission and token
 * deny rules, in the real API server's words) give Running=False, reason
 * PodCreateFailed, the API's message, phase Pending, as one Warning Event
 * whose count grows with every refused pass; every Event comes after the
 * status write that records it.
 *
 * A pod stuck terminating (its node unreachable: here a finalizer holds
 * it, the same API picture) is named in a PodStuckTerminating condition. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon.h"
#include "standin.h"
#include "testutil.h"
#include "util/util.h"

#define TOKEN "admission-test-operator"

static rl_test_standin s;
static pid_t op;

static int kubectl(const char *args, const char *in, char *out, size_t n) {
    return rl_test_kubectl(&s, args, in, out, n);
}

/* The operator's identity: a token the test can later deny pods:create. */
static void set_token(const char *deny) {
    char body[256], out[256];
    snprintf(body, sizeof body, "{\"token\":\"" TOKEN "\",\"user\":\"operator\",\"deny\":[%s]}", deny);
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/tokens", body, out, sizeof out), 200, "%s", out);
}

static void up(void) {
    cr_assert(rl_test_bindir(), "binaries not found (RL_TEST_BIN or bin/)");
    cr_assert_eq(rl_test_standin_start(&s, NULL), 0, "the Kubernetes stand-in did not start");
    char out[8192], path[400], bin[1200];
    cr_assert_eq(kubectl("apply -f manifests/crd.yaml", NULL, out, sizeof out), 0, "%s", out);
    set_token("");
    snprintf(path, sizeof path, "%s/operator.kubeconfig", s.dir);
    cr_assert_eq(rl_test_standin_write_kubeconfig(&s, TOKEN, NULL, path), 0);
    snprintf(bin, sizeof bin, "%s/ringleader-operator", rl_test_bindir());
    char log[400];
    snprintf(log, sizeof log, "%s/operator.log", s.dir);
    char *argv[] = {bin, "--kubeconfig", path, "--leader-elect=false", "--resync-seconds", "0.5", "--metrics-port",
                    "0", "--stuck-terminating-seconds", "1", NULL};
    rl_test_daemon_opts o = {.argv = argv, .log = log};
    op = rl_test_daemon_spawn(&o);
    cr_assert(op >= 0);
}

static void down(void) {
    rl_test_daemon_stop(&op, 30);
    rl_test_standin_stop(&s);
}

static void apply_job(const char *name, int replicas) {
    char y[1024], out[4096];
    snprintf(y, sizeof y,
             "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"%s\"},"
             "\"spec\":{\"image\":\"ringleader:test\",\"replicas\":%d,\"metricsPort\":0,"
             "\"training\":{\"train\":{\"steps\":10,\"warmup_steps\":1}}}}",
             name, replicas);
    cr_assert_eq(kubectl("apply -f -", y, out, sizeof out), 0, "%s", out);
}

/* kubectl get -o json of one object or list (NULL when kubectl fails) */
static cJSON *get_json(const char *args) {
    static char out[1 << 20];
    char a[512];
    snprintf(a, sizeof a, "get %s -o json", args);
    return kubectl(a, NULL, out, sizeof out) == 0 ? cJSON_Parse(out) : NULL;
}

static const char *str_at(const cJSON *o, const char *k) {
    const char *v = cJSON_GetStringValue(cJSON_GetObjectItem(o, k));
    return v ? v : "";
}

static const cJSON *condition(const cJSON *tj, const char *type) {
    const cJSON *c;
    cJSON_ArrayForEach(c, rl_test_json_path(tj, "status.conditions"))
        if (!strcmp(str_at(c, "type"), type)) return c;
    return NULL;
}

/* Wait until the job's Running condition has `reason` and its message holds
 * `needle`; the job (for more checks) or a failure showing the status. */
static cJSON *await_running(const char *name, const char *reason, const char *needle, double timeout) {
    char args[128];
    snprintf(args, sizeof args, "tj %s", name);
    double end = rl_now() + timeout;
    for (;;) {
        cJSON *tj = get_json(args);
        const cJSON *c = condition(tj, "Running");
        if (c && !strcmp(str_at(c, "reason"), reason) && strstr(str_at(c, "message"), needle)) return tj;
        if (rl_now() > end) {
            char *st = tj ? cJSON_Print(cJSON_GetObjectItem(tj, "status")) : NULL;
            cr_assert_fail("%s: Running never had reason %s with \"%s\": status %s", name, reason, needle,
                           st ? st : "(none)");
        }
        cJSON_Delete(tj);
        usleep(300000);
    }
}

/* The Events of one job with one reason, as kubectl lists them. */
static cJSON *events_of(const char *job, const char *reason) {
    char args[256];
    snprintf(args, sizeof args, "events --field-selector involvedObject.name=%s,reason=%s", job, reason);
    cJSON *l = get_json(args);
    cr_assert(l, "kubectl get events failed");
    return l;
}

/* The resourceVersion of the first write in an object's history whose
 * object satisfies pred (the stand-in's /history; -1 when none). */
static long long first_write(const char *resource, const char *name, bool (*pred)(const cJSON *obj)) {
    static char out[1 << 20];
    char path[300];
    snprintf(path, sizeof path, "/history?resource=%s&namespace=default&name=%s", resource, name);
    cr_assert_eq(rl_test_standin_admin(&s, "GET", path, NULL, out, sizeof out), 200, "%s", out);
    cJSON *h = cJSON_Parse(out);
    long long rv = -1;
    const cJSON *w;
    cJSON_ArrayForEach(w, h) {
        if (pred(cJSON_GetObjectItem(w, "object"))) {
            rv = atoll(str_at(w, "rv"));
            break;
        }
    }
    cJSON_Delete(h);
    return rv;
}

static bool refused_recorded(const cJSON *tj) {
    const cJSON *c = condition(tj, "Running");
    return c && !strcmp(str_at(c, "reason"), "PodCreateFailed");
}
static bool created_recorded(const cJSON *tj) { return condition(tj, "Created") != NULL; }
static bool any(const cJSON *o) { return o != NULL; }

/* One Event of that reason; its count (asserting there is exactly one). */
static int one_event(const char *job, const char *reason, char *name, size_t nn) {
    cJSON *l = events_of(job, reason);
    const cJSON *items = cJSON_GetObjectItem(l, "items");
    cr_assert_eq(cJSON_GetArraySize(items), 1, "%s: %d %s Events, want one (repeats folded into its count)", job,
                 cJSON_GetArraySize(items), reason);
    const cJSON *ev = cJSON_GetArrayItem(items, 0);
    int count = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(ev, "count"));
    if (name) snprintf(name, nn, "%s", str_at(cJSON_GetObjectItem(ev, "metadata"), "name"));
    if (!strcmp(reason, "PodCreateFailed"))
        cr_expect_str_eq(str_at(ev, "type"), "Warning");
    cJSON_Delete(l);
    return count;
}

Test(job_status, refused_pods_reach_the_status_as_one_event, .init = up, .fini = down, .timeout = 180) {
    char out[4096];
    /* a ResourceQuota's 403 */
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/admission",
                                       "{\"resource\":\"pods\",\"kind\":\"quota\",\"message\":\"compute, requested: "
                                       "nvidia.com/gpu=8, used: nvidia.com/gpu=8, limited: nvidia.com/gpu=8\"}",
                                       out, sizeof out),
                 200, "%s", out);
    apply_job("quota", 2);
    cJSON *tj = await_running("quota", "PodCreateFailed", "exceeded quota: compute", 30);
    cr_expect_str_eq(str_at(cJSON_GetObjectItem(tj, "status"), "phase"), "Pending");
    cr_expect(strstr(str_at(condition(tj, "Running"), "message"), "pods \"quota-0\" is forbidden"), "%s",
              str_at(condition(tj, "Running"), "message"));
    cJSON_Delete(tj);
    /* every resync (0.5 s) is refused again: one Event, counting */
    char ev_name[128];
    double end = rl_now() + 20;
    int count = 0;
    while ((count = one_event("quota", "PodCreateFailed", ev_name, sizeof ev_name)) < 3 && rl_now() < end)
        usleep(500000);
    cr_expect_geq(count, 3, "the refusal's Event did not count the repeated passes");
    /* the status was never lost between passes: Created was announced once */
    cr_expect_eq(one_event("quota", "Created", NULL, 0), 1);
    /* each Event came after the status write that recorded it */
    long long st_rv = first_write("trainingjobs.ringleader.dev", "quota", refused_recorded);
    long long ev_rv = first_write("events", ev_name, any);
    cr_expect(st_rv > 0 && ev_rv > st_rv, "PodCreateFailed Event at rv %lld, its status write at %lld", ev_rv, st_rv);
    char created[128];
    one_event("quota", "Created", created, sizeof created);
    st_rv = first_write("trainingjobs.ringleader.dev", "quota", created_recorded);
    ev_rv = first_write("events", created, any);
    cr_expect(st_rv > 0 && ev_rv > st_rv, "Created Event at rv %lld, its status write at %lld", ev_rv, st_rv);

    /* the quota freed: the pods are created and the refusal leaves the status */
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/admission", "{\"clear\":true}", out, sizeof out), 200);
    cJSON_Delete(await_running("quota", "PodsNotReady", "ready", 30));
    cJSON *pods = get_json("pods -l ringleader.dev/job=quota");
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(pods, "items")), 2);
    cJSON_Delete(pods);

    /* a validating webhook's denial (Kyverno, Gatekeeper): its message as the API gives it */
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/admission",
                                       "{\"resource\":\"pods\",\"kind\":\"webhook\",\"webhook\":\"validate.kyverno.svc\","
                                       "\"message\":\"resource Pod/default/hook-0 was blocked: require-labels\"}",
                                       out, sizeof out),
                 200, "%s", out);
    apply_job("hook", 1);
    cJSON_Delete(await_running("hook", "PodCreateFailed",
                               "admission webhook \"validate.kyverno.svc\" denied the request: resource Pod", 30));
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/admission", "{\"clear\":true}", out, sizeof out), 200);

    /* RBAC: the operator's own identity may not create pods */
    set_token("\"pods:create\"");
    apply_job("rbac", 1);
    cJSON_Delete(await_running("rbac", "PodCreateFailed", "cannot create resource \"pods\"", 30));
    cr_expect_eq(waitpid(op, NULL, WNOHANG), 0, "the operator exited");
}

/* The condition PodStuckTerminating of a job (NULL: none); caller frees tj. */
static const cJSON *stuck_condition(const char *name, cJSON **tj) {
    char args[128];
    snprintf(args, sizeof args, "tj %s", name);
    *tj = get_json(args);
    return condition(*tj, "PodStuckTerminating");
}

Test(job_status, a_pod_stuck_terminating_is_named, .init = up, .fini = down, .timeout = 120) {
    char out[4096];
    apply_job("held", 1);
    cJSON_Delete(await_running("held", "PodsNotReady", "ready", 30));
    /* a node that never answers: nothing finishes the pod's delete */
    cr_assert_eq(kubectl("patch pod held-0 --type=merge -p '{\"metadata\":{\"finalizers\":[\"test.ringleader.dev/hold\"]}}'",
                         NULL, out, sizeof out),
                 0, "%s", out);
    cr_assert_eq(kubectl("delete pod held-0 --grace-period=1 --wait=false", NULL, out, sizeof out), 0, "%s", out);
    /* a second past its grace (the operator runs with --stuck-terminating-seconds 1) */
    double end = rl_now() + 30;
    cJSON *tj = NULL;
    const cJSON *c = NULL;
    while (!(c = stuck_condition("held", &tj)) || strcmp(str_at(c, "status"), "True") != 0) {
        cJSON_Delete(tj);
        cr_assert(rl_now() < end, "no PodStuckTerminating condition");
        usleep(300000);
    }
    cr_expect_str_eq(str_at(c, "reason"), "StuckTerminating");
    cr_expect(strstr(str_at(c, "message"), "pod held-0 has been terminating for 0 min") &&
                  strstr(str_at(c, "message"), "kubectl delete pod held-0 --force --grace-period=0"),
              "%s", str_at(c, "message"));
    cJSON_Delete(tj);
    cr_expect_eq(one_event("held", "PodStuckTerminating", NULL, 0), 1);
    /* the node back (the finalizer gone): the pod goes, the replacement
     * comes, the condition clears */
    cr_assert_eq(kubectl("patch pod held-0 --type=merge -p '{\"metadata\":{\"finalizers\":null}}'", NULL, out,
                         sizeof out),
                 0, "%s", out);
    end = rl_now() + 30;
    while ((c = stuck_condition("held", &tj)) && strcmp(str_at(c, "status"), "False") != 0) {
        cJSON_Delete(tj);
        cr_assert(rl_now() < end, "the condition stayed");
        usleep(300000);
    }
    cr_expect(c != NULL, "the condition vanished instead of turning False");
    cJSON_Delete(tj);
}

/* status.rdzvSecret of a job ("" when absent) */
static void secret_record(const char *name, char *out, size_t n) {
    char args[128];
    snprintf(args, sizeof args, "tj %s", name);
    cJSON *tj = get_json(args);
    snprintf(out, n, "%s", str_at(cJSON_GetObjectItem(tj, "status"), "rdzvSecret"));
    cJSON_Delete(tj);
}

static void await_secret_record(const char *name, const char *want, double timeout) {
    char got[32];
    double end = rl_now() + timeout;
    do {
        secret_record(name, got, sizeof got);
        if (!strcmp(got, want)) return;
        usleep(300000);
    } while (rl_now() < end);
    cr_assert_fail("%s: status.rdzvSecret is \"%s\", want %s", name, got, want);
}

/* The operator never reads a Secret (its identity here may not get, list
 * or watch them): it creates <job>-rdzv and records that in the status; a
 * Secret of that name it did not make is a ResourceConflict found without
 * reading it; a create whose answer was lost is still its own. */
Test(job_status, the_rendezvous_secret_is_created_never_read, .init = up, .fini = down, .timeout = 120) {
    char out[4096];
    set_token("\"secrets:get\",\"secrets:list\",\"secrets:watch\"");
    apply_job("mine", 1);
    await_secret_record("mine", "Created", 30);
    cJSON_Delete(await_running("mine", "PodsNotReady", "ready", 30));
    cr_assert_eq(kubectl("get secret mine-rdzv -o jsonpath='{.metadata.ownerReferences[0].kind}'", NULL, out,
                         sizeof out), 0, "%s", out);
    cr_expect_str_eq(out, "TrainingJob");

    /* someone else's Secret of the job's name: a conflict, no pods */
    cr_assert_eq(kubectl("create secret generic clash-rdzv --from-literal=secret=known-to-them", NULL, out, sizeof out),
                 0, "%s", out);
    apply_job("clash", 1);
    cJSON_Delete(await_running("clash", "ResourceConflict", "secrets clash-rdzv exists and was not created for this", 30));
    secret_record("clash", out, sizeof out);
    cr_expect_str_eq(out, "Conflict");
    cJSON *pods = get_json("pods -l ringleader.dev/job=clash");
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(pods, "items")), 0, "pods of a job whose Secret is not its own");
    cJSON_Delete(pods);
    /* the user removes theirs: the operator makes its own and goes on */
    cr_assert_eq(kubectl("delete secret clash-rdzv", NULL, out, sizeof out), 0, "%s", out);
    await_secret_record("clash", "Created", 30);
    cJSON_Delete(await_running("clash", "PodsNotReady", "ready", 30));

    /* the create applied, its answer lost (a 503 instead): the next pass
     * meets its own Secret (409) and takes it as made */
    cr_assert_eq(rl_test_standin_admin(&s, "POST", "/faults",
                                       "{\"method\":\"POST\",\"resource\":\"secrets\",\"count\":1,\"answer\":\"503\"}", out,
                                       sizeof out),
                 200, "%s", out);
    apply_job("lost", 1);
    await_secret_record("lost", "Created", 30);
    cJSON_Delete(await_running("lost", "PodsNotReady", "ready", 30));
    cr_assert_eq(rl_test_standin_admin(&s, "GET", "/faults", NULL, out, sizeof out), 200);
    cr_expect(strstr(out, "\"left\": 0") || strstr(out, "\"left\":0"), "the fault was never met: %s", out);
}
