/* The whole path a user takes, end to end: the real kubectl against the
 * Kubernetes stand-in (whose kubelet runs each Pod as a local process on
 * its own 127.0.0.N), the CRD from manifests/, the operator binary, worker
 * pods that find each other through the API, and checkpoints in a real
 * radosgw. Timing is scaled down (rendezvous heartbeats of 1 s, leases of
 * a few seconds) so a run takes tens of seconds, not minutes. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rgwtest.h"
#include "s3/s3.h"
#include "daemon.h"
#include "standin.h"
#include "testutil.h"
#include "util/util.h"

#define BUCKET "rl-e2e"
/* 120 sequences of 32 tokens per step: whole on 2 and 3 nodes (micro-batch 4) */
#define SEQS 120
#define LOG_MAX (16 << 20)

typedef struct e2e {
    rl_test_standin s;
    rl_test_rgw rgw;
    char dir[64], op_log[128], op_kubeconfig[128];
    pid_t op, op2; /* the operator, and a standby replica */
} e2e;

static e2e g = {.rgw = {.mon_pid = -1, .osd_pid = -1, .rgw_pid = -1}};

static int kubectl(const char *args, const char *in, char *out, size_t n) {
    return rl_test_kubectl(&g.s, args, in, out, n);
}

static pid_t spawn_operator(const char *id) {
    char bin[1024], kc[400];
    snprintf(bin, sizeof bin, "%s/ringleader-operator", rl_test_bindir());
    snprintf(kc, sizeof kc, "%s", g.op_kubeconfig);
    char env[96];
    snprintf(env, sizeof env, "POD_NAME=%s", id); /* the candidate's identity on the Lease */
    const char *envs[] = {env, NULL};
    char *argv[] = {bin, "--kubeconfig", kc, "--lease-namespace", "ringleader-system", "--resync-seconds", "0.5",
                    "--metrics-port", "0", "--leader-elect-lease-duration", "4", "--leader-elect-renew-deadline", "3",
                    "--leader-elect-retry-period", "0.5", NULL};
    rl_test_daemon_opts o = {.argv = argv, .log = g.op_log, .env = envs};
    pid_t p = rl_test_daemon_spawn(&o);
    cr_assert(p >= 0);
    return p;
}

static void start_operator(void) { g.op = spawn_operator("operator-a"); }

/* up() runs before any job: a missing binary must fail at once, not after
 * every wait runs out */
static void need_binary(const char *name) {
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", rl_test_bindir(), name);
    cr_assert_eq(access(p, X_OK), 0, "%s is not built", p);
}

static void stop_pid(pid_t *p, int sig) {
    if (*p <= 0) return;
    kill(*p, sig);
    waitpid(*p, NULL, 0);
    *p = 0;
}

static void stop_operator(int sig) { stop_pid(&g.op, sig); }

/* who holds the operator's Lease */
static void lease_holder(char *out, size_t n) {
    if (kubectl("get lease ringleader-operator -n ringleader-system -o jsonpath='{.spec.holderIdentity}'", NULL, out, n) != 0)
        out[0] = '\0';
}

/* standin_args: the stand-in's cluster shape (NULL: one node) */
static void up_with(const char *standin_args) {
    cr_assert(rl_test_bindir(), "binaries not found (RL_TEST_BIN or bin/)");
    need_binary("ringleader-operator");
    need_binary("ringleader-worker");
    rl_test_arith_dir(g.dir, sizeof g.dir, 200000);
    snprintf(g.op_log, sizeof g.op_log, "%s/operator.log", g.dir);
    cr_assert_eq(rl_test_rgw_start(&g.rgw, 512), 0, "radosgw did not start");
    rl_s3_config c = {0};
    snprintf(c.endpoint, sizeof c.endpoint, "%s", g.rgw.endpoint);
    snprintf(c.region, sizeof c.region, "us-east-1");
    rl_err e = {0};
    cr_assert_eq(rl_s3_creds_static(g.rgw.access_key, g.rgw.secret_key, NULL, &c.creds, &e), 0, "%s", e.msg);
    rl_s3 *s3;
    cr_assert_eq(rl_s3_open(&c, &s3, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_s3_create_bucket(s3, BUCKET, &e), 0, "%s", e.msg);
    rl_s3_close(s3);

    /* the kubelet runs image ringleader:* from our bin/; pods inherit RL_*
     * from the stand-in: progress every half second */
    char image[1200];
    snprintf(image, sizeof image, "ringleader:*=%s", rl_test_bindir());
    rl_test_standin_opts so = {.images = {image}, .backoff_s = 1, .env = {"RL_PROGRESS_INTERVAL_S=0.5"},
                               .extra_args = standin_args};
    cr_assert_eq(rl_test_standin_start_opts(&g.s, &so), 0, "the Kubernetes stand-in did not start");
    char out[8192];
    cr_assert_eq(kubectl("apply -f manifests/crd.yaml", NULL, out, sizeof out), 0, "%s", out);
    /* the jobs' namespace enforces the "restricted" Pod Security Standard,
     * as hardened clusters do: PodSecurity admission refuses any worker pod
     * that does not pass it (the stand-in checks at admission; its kubelet
     * runs the processes as its own user) */
    cr_assert_eq(kubectl("label ns default pod-security.kubernetes.io/enforce=restricted", NULL, out, sizeof out), 0,
                 "%s", out);
    char secret[512];
    snprintf(secret, sizeof secret,
             "create secret generic s3-creds --from-literal=AWS_ACCESS_KEY_ID=%s --from-literal=AWS_SECRET_ACCESS_KEY=%s",
             g.rgw.access_key, g.rgw.secret_key);
    cr_assert_eq(kubectl(secret, NULL, out, sizeof out), 0, "%s", out);
    /* The operator runs as the ServiceAccount of manifests/operator.yaml,
     * bound to its ClusterRole: the stand-in enforces RBAC for
     * service-account tokens, so a permission missing there fails here. */
    cr_assert_eq(kubectl("apply -f manifests/operator.yaml", NULL, out, sizeof out), 0, "%s", out);
    char tok[2048];
    cr_assert_eq(rl_test_standin_sa_token(&g.s, "ringleader-system", "ringleader-operator", tok, sizeof tok), 0);
    snprintf(g.op_kubeconfig, sizeof g.op_kubeconfig, "%s/operator.kubeconfig", g.dir);
    cr_assert_eq(rl_test_standin_write_kubeconfig(&g.s, tok, "ringleader-system", g.op_kubeconfig), 0);
    start_operator();
}

static void up(void) { up_with(NULL); }

/* An autoscaled pool: 2 nodes now, up to 4; a pod Unschedulable for 15 s
 * gets a node (long enough for a round to form on the 2 nodes first). */
static void up_pool(void) { up_with("--nodes 2 --autoscaler 4 --scale-up-delay 15"); }
/* racks r2, r1 over the zones' nodes (a/r2, b/r2, a/r1, b/r1), copied onto
 * pods at binding as the PodTopologyLabels admission plugin does with the
 * key configured */
static void up_zones(void) {
    up_with("--nodes 4 --zones a,b --racks r2,r1 --pod-topology-labels nvidia.com/gpu.clique");
}

static void down(void) {
    stop_operator(SIGTERM);
    stop_pid(&g.op2, SIGTERM);
    rl_test_standin_stop(&g.s); /* its kubelet takes the pods with it */
    rl_test_rgw_stop(&g.rgw);
    if (getenv("RL_TEST_KEEP_JOB")) fprintf(stderr, "e2e: kept %s\n", g.dir);
    else if (g.dir[0]) rl_test_rmdir(g.dir);
}

/* A CPU TrainingJob on the tiny model, seqs sequences of 32 tokens per
 * step. extra: more spec members ("" or ",..."); rdzv: more members of
 * training.rdzv (likewise). */
static void apply_job_rdzv(const char *name, int replicas, const char *extra, long long steps, int seqs,
                           const char *rdzv) {
    char y[8192], out[8192];
    snprintf(y, sizeof y,
             "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"%s\"},"
             "\"spec\":{\"image\":\"ringleader:test\",\"replicas\":%d,\"terminationGracePeriodSeconds\":20,"
             "\"metricsPort\":0,\"env\":[{\"name\":\"OMP_NUM_THREADS\",\"value\":\"1\"}],"
             "\"s3\":{\"endpoint\":\"%s\",\"region\":\"us-east-1\",\"credentialsSecret\":{\"name\":\"s3-creds\"}},"
             "\"training\":{" RL_TEST_TINY_MODEL_JSON
             "\"train\":{\"steps\":%lld,\"warmup_steps\":2,\"seq_len\":32,\"micro_batch\":4,\"global_batch_tokens\":%d,"
             "\"eval_every\":0,\"eval_batches\":0,\"log_every\":1},"
             "\"data\":{\"train\":\"%s/train_*.bin\",\"val\":\"\",\"eval_task\":\"\"},"
             "\"dist\":{\"timeout_s\":20},"
             "\"checkpoint\":{\"uri\":\"s3://" BUCKET "/%s\",\"every_steps\":20,\"keep\":2},"
             "\"rdzv\":{\"heartbeat_s\":1,\"heartbeat_misses\":5,\"last_call_s\":2,\"lease_s\":3,"
             "\"renew_deadline_s\":2,\"retry_s\":0.5,\"stop_grace_s\":10%s}}%s}}",
             name, replicas, g.rgw.endpoint, steps, 32 * seqs, g.dir, name, rdzv, extra);
    cr_assert_eq(kubectl("apply -f -", y, out, sizeof out), 0, "%s", out);
}

static void apply_job(const char *name, int replicas, const char *extra, long long steps) {
    apply_job_rdzv(name, replicas, extra, steps, SEQS, "");
}

/* kubectl get tj NAME -o jsonpath=... (empty string when absent) */
static void tj(const char *name, const char *path, char *out, size_t n) {
    char args[512];
    snprintf(args, sizeof args, "get tj %s -o jsonpath='%s'", name, path);
    if (kubectl(args, NULL, out, n) != 0) out[0] = '\0';
}

/* Poll a field until it contains `needle` (or timeout_s passes); out keeps the last value. */
static void tj_await(const char *name, const char *path, const char *needle, double timeout_s, char *out, size_t n) {
    double end = rl_now() + timeout_s;
    do {
        tj(name, path, out, n);
        if (strstr(out, needle)) return;
        usleep(300000);
    } while (rl_now() < end);
}

static long long tj_num(const char *name, const char *path) {
    char out[256];
    tj(name, path, out, sizeof out);
    return out[0] ? atoll(out) : -1;
}

static bool phase_is(const char *name, const char *phase) {
    char out[256];
    tj(name, "{.status.phase}", out, sizeof out);
    return !strcmp(out, phase);
}

/* Wait for a phase; on timeout, fail with what kubectl shows. */
static void wait_phase(const char *name, const char *phase, double timeout) {
    double end = rl_now() + timeout;
    while (!phase_is(name, phase) && rl_now() < end) usleep(300000);
    if (!phase_is(name, phase)) {
        char out[16384], st[4096];
        kubectl("get pods -o wide", NULL, out, sizeof out);
        tj(name, "{.status}", st, sizeof st);
        cr_assert_fail("%s never reached %s in %.0f s: status %s\npods:\n%s", name, phase, timeout, st, out);
    }
}

/* status.step goes down when a new round resumes from an older checkpoint,
 * so the verdict is on the value the loop saw, not on a second read. */
static void wait_step(const char *name, long long step, double timeout) {
    double end = rl_now() + timeout;
    long long v;
    while ((v = tj_num(name, "{.status.step}")) < step && rl_now() < end) usleep(300000);
    cr_assert(v >= step, "%s: status.step did not reach %lld in %.0f s (last %lld)", name, step, timeout, v);
}

/* Wait until the job runs `nodes` ready pods in a round newer than `round`. */
static long long await_round(const char *job, int nodes, long long round, double timeout) {
    double end = rl_now() + timeout;
    while ((tj_num(job, "{.status.readyReplicas}") != nodes || tj_num(job, "{.status.round}") <= round) &&
           rl_now() < end)
        usleep(300000);
    char out[16384];
    kubectl("get pods -o wide", NULL, out, sizeof out);
    cr_assert_eq(tj_num(job, "{.status.readyReplicas}"), nodes, "ready pods; pods:\n%s", out);
    cr_assert_gt(tj_num(job, "{.status.round}"), round, "no round after %lld; pods:\n%s", round, out);
    return tj_num(job, "{.status.round}");
}


/* some line of text holds both a and b */
static bool has_line(const char *text, const char *a, const char *b) {
    for (const char *l = text; l && *l;) {
        const char *nl = strchr(l, '\n'), *end = nl ? nl : l + strlen(l);
        const char *x = strstr(l, a), *y = strstr(l, b);
        if (x && y && x < end && y < end) return true;
        l = nl ? nl + 1 : NULL;
    }
    return false;
}

static int count_lines(const char *text) {
    int n = 0;
    for (const char *p = text; *p; p++) n += *p == '\n';
    return n;
}

/* The objects a job owns, by kind, as kubectl lists them (names only). */
static int owned(const char *kind, const char *name) {
    char args[256], out[8192];
    snprintf(args, sizeof args, "get %s -l ringleader.dev/job=%s -o name", kind, name);
    if (kubectl(args, NULL, out, sizeof out) != 0) return -1;
    return count_lines(out);
}

/* the test's radosgw (NULL when it cannot be opened) */
static rl_s3 *s3_open(void) {
    rl_s3_config c = {0};
    snprintf(c.endpoint, sizeof c.endpoint, "%s", g.rgw.endpoint);
    snprintf(c.region, sizeof c.region, "us-east-1");
    rl_err e = {0};
    rl_s3 *s3;
    if (rl_s3_creds_static(g.rgw.access_key, g.rgw.secret_key, NULL, &c.creds, &e) || rl_s3_open(&c, &s3, &e))
        return NULL;
    return s3;
}

static int s3_checkpoints(const char *prefix) {
    rl_err e = {0};
    rl_s3 *s3 = s3_open();
    if (!s3) return -1;
    rl_s3_list l = {0};
    int n = -1;
    if (rl_s3_list_objects(s3, BUCKET, prefix, &l, &e) == RL_OK) {
        n = 0;
        for (size_t i = 0; i < l.n; i++) n += strstr(l.keys[i], "/manifest.json") != NULL;
        rl_s3_list_free(&l);
    }
    rl_s3_close(s3);
    return n;
}

Test(e2e, train_lose_a_pod_restart_the_operator_succeed_and_clean_up, .init = up, .fini = down, .timeout = 600) {
    const char *job = "llama";
    g.op2 = spawn_operator("operator-b"); /* a standby: only one replica acts */
    apply_job(job, 2, "", 1000);
    char out[16384];
    /* pods, Service, Secret, RBAC appear; the job runs and reports progress */
    wait_phase(job, "Running", 90);
    cr_expect_eq(owned("pods", job), 2);
    cr_expect_eq(owned("services", job), 1);
    cr_expect_eq(owned("secrets", job), 1);
    cr_expect_eq(owned("roles", job), 1);
    wait_step(job, 30, 120);
    long long s1 = tj_num(job, "{.status.step}");
    cr_assert_eq(kubectl("get tj", NULL, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "STEP") && strstr(out, "LOSS") && strstr(out, "Running"), "kubectl get tj:\n%s", out);
    wait_step(job, s1 + 5, 60);

    /* a worker pod deleted mid-run: replaced, not counted, training resumes.
     * The Restarting phase lasts as long as the replacement takes, which on
     * the stand-in can be shorter than one kubectl call on a loaded
     * machine; its condition stays behind (PodReplaced, then Recovered),
     * and there is none before a replacement. */
    cr_assert_eq(kubectl("delete pod llama-1 --wait=false", NULL, out, sizeof out), 0, "%s", out);
    double end = rl_now() + 60;
    bool restarting = false;
    char why[256] = "";
    while (!restarting && rl_now() < end) {
        tj(job, "{.status.conditions[?(@.type==\"Restarting\")].reason}", why, sizeof why);
        restarting = phase_is(job, "Restarting") || !strcmp(why, "PodReplaced") || !strcmp(why, "Recovered");
        if (!restarting) usleep(200000);
    }
    cr_expect(restarting, "never showed Restarting after a pod was deleted (condition reason '%s')", why);

    /* the operator killed mid-run: a standby replica takes the Lease over
     * and carries on; the killed one comes back as a standby. Nothing lost,
     * nothing doubled. */
    char holder[256];
    lease_holder(holder, sizeof holder);
    bool a_leads = !strcmp(holder, "operator-a");
    cr_assert(a_leads || !strcmp(holder, "operator-b"), "Lease holder: '%s'", holder);
    const char *other = a_leads ? "operator-b" : "operator-a";
    stop_pid(a_leads ? &g.op : &g.op2, SIGKILL);
    end = rl_now() + 20;
    do {
        lease_holder(holder, sizeof holder);
        if (!strcmp(holder, other)) break;
        usleep(200000);
    } while (rl_now() < end);
    cr_expect_str_eq(holder, other, "the standby did not take over the Lease");
    if (a_leads) g.op = spawn_operator("operator-a");
    else g.op2 = spawn_operator("operator-b");
    wait_phase(job, "Running", 120);
    cr_expect_eq(owned("pods", job), 2, "pods after the operator restart");
    if (tj_num(job, "{.status.restarts}") != 0) {
        kubectl("get events --field-selector involvedObject.name=llama -o jsonpath='{range .items[*]}{.reason}: {.message}{\"\\n\"}{end}'",
                NULL, out, sizeof out);
        cr_expect_fail("a deleted pod is not a failure; events:\n%s", out);
    }
    cr_expect_geq(tj_num(job, "{.status.preemptions}"), 1);
    /* rank 0 (llama-0) resumed the new round from a checkpoint */
    char *log = malloc(LOG_MAX);
    cr_assert(log);
    end = rl_now() + 60;
    do {
        kubectl("logs llama-0", NULL, log, LOG_MAX);
        if (strstr(log, "\"found\":true")) break;
        usleep(500000);
    } while (rl_now() < end);
    cr_expect(strstr(log, "\"found\":true"), "no resume from a checkpoint in llama-0's log:\n%.3000s", log);
    free(log);

    wait_phase(job, "Succeeded", 240);
    cr_expect_eq(tj_num(job, "{.status.step}"), 1000, "the job ends with every step done");
    tj(job, "{.status.lastCheckpoint}", out, sizeof out);
    cr_expect(strstr(out, "s3://" BUCKET "/llama/step-"), "lastCheckpoint: %s", out);
    cr_expect_geq(s3_checkpoints("llama/"), 1, "checkpoints in radosgw");
    end = rl_now() + 30;
    while (owned("pods", job) != 0 && rl_now() < end) usleep(300000);
    cr_expect_eq(owned("pods", job), 0, "cleanPodPolicy All leaves no pod");
    cr_assert_eq(kubectl("get events --field-selector involvedObject.name=llama -o jsonpath='{.items[*].reason}'", NULL, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "PodPreempted") && strstr(out, "Succeeded"), "events:\n%s", out);

    /* deleting the job deletes everything it owns */
    cr_assert_eq(kubectl("delete tj llama", NULL, out, sizeof out), 0, "%s", out);
    end = rl_now() + 30;
    while ((owned("services", job) || owned("secrets", job) || owned("serviceaccounts", job) ||
            owned("roles", job) || owned("rolebindings", job)) && rl_now() < end)
        usleep(300000);
    cr_expect_eq(owned("services", job) + owned("secrets", job) + owned("serviceaccounts", job) +
                     owned("roles", job) + owned("rolebindings", job), 0, "objects outlived their job");
}

Test(e2e, scale_an_elastic_job_to_three_nodes, .init = up, .fini = down, .timeout = 600) {
    const char *job = "grow";
    apply_job(job, 2, ",\"elastic\":{\"minReplicas\":2,\"maxReplicas\":3}", 100000);
    wait_phase(job, "Running", 90);
    wait_step(job, 20, 120);
    long long round = tj_num(job, "{.status.round}");
    char out[8192];
    cr_assert_eq(kubectl("scale tj/grow --replicas=3", NULL, out, sizeof out), 0, "%s", out);
    double end = rl_now() + 90;
    while ((owned("pods", job) != 3 || tj_num(job, "{.status.readyReplicas}") != 3 ||
            tj_num(job, "{.status.round}") <= round) && rl_now() < end)
        usleep(300000);
    cr_expect_eq(owned("pods", job), 3);
    cr_expect_eq(tj_num(job, "{.status.readyReplicas}"), 3);
    cr_expect_gt(tj_num(job, "{.status.round}"), round, "no new round after the scale up");
    long long s = tj_num(job, "{.status.step}");
    wait_step(job, s + 10, 120); /* the 3-node round trains */
    char *log = malloc(LOG_MAX);
    cr_assert(log);
    cr_assert_eq(kubectl("logs grow-0", NULL, log, LOG_MAX), 0, "%.2000s", log);
    cr_expect(has_line(log, "\"event\":\"round_start\"", "\"nodes\":3"), "no 3-node round in grow-0's log:\n%.2000s", log);
    /* the two yielded at an agreed step and the three resumed from them */
    cr_expect(has_line(log, "\"event\":\"resume\"", "\"live\":true"), "the growth did not resume live:\n%.2000s", log);
    free(log);
}

Test(e2e, bad_jobs_are_refused_or_failed_with_the_field_named, .init = up, .fini = down, .timeout = 300) {
    char out[8192];
    /* what the schema can say, the API server refuses */
    int rc = kubectl("apply -f -",
                     "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"bad1\"},"
                     "\"spec\":{\"image\":\"ringleader:test\",\"replicas\":-1}}", out, sizeof out);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "spec.replicas"), "%s", out);
    /* what it cannot (min above max): Failed, with a condition and an Event naming the field */
    apply_job("bad2", 2, ",\"elastic\":{\"minReplicas\":3,\"maxReplicas\":2}", 10);
    wait_phase("bad2", "Failed", 30);
    tj("bad2", "{.status.conditions[?(@.type==\"Failed\")].message}", out, sizeof out);
    cr_expect(strstr(out, "spec.elastic.maxReplicas"), "condition: %s", out);
    cr_assert_eq(kubectl("get events --field-selector involvedObject.name=bad2 -o jsonpath='{.items[*].message}'", NULL, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "spec.elastic.maxReplicas"), "events:\n%s", out);
    cr_expect_eq(owned("pods", "bad2"), 0);
    /* an image that cannot be pulled shows in the status, not only in logs */
    char y[1024];
    snprintf(y, sizeof y,
             "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"noimg\"},"
             "\"spec\":{\"image\":\"registry.invalid/nope:1\",\"replicas\":1,\"metricsPort\":0,"
             "\"training\":{\"train\":{\"steps\":10,\"warmup_steps\":1}}}}");
    cr_assert_eq(kubectl("apply -f -", y, out, sizeof out), 0, "%s", out);
    tj_await("noimg", "{.status.conditions[?(@.type==\"Running\")].reason}", "ImagePull", 30, out, sizeof out);
    cr_expect(strstr(out, "ErrImagePull") || strstr(out, "ImagePullBackOff"), "Running reason: %s", out);
    /* a missing Secret shows in the status too */
    snprintf(y, sizeof y,
             "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"nosecret\"},"
             "\"spec\":{\"image\":\"ringleader:test\",\"replicas\":1,\"metricsPort\":0,"
             "\"s3\":{\"credentialsSecret\":{\"name\":\"missing\"}},\"training\":{\"train\":{\"steps\":10,\"warmup_steps\":1}}}}");
    cr_assert_eq(kubectl("apply -f -", y, out, sizeof out), 0, "%s", out);
    tj_await("nosecret", "{.status.conditions[?(@.type==\"Running\")].message}", "missing", 30, out, sizeof out);
    cr_expect(strstr(out, "secret \"missing\" not found"), "Running message: %s", out);
    /* a gang that does not fit (an autoscaled pool not grown yet): the
     * scheduler's reason is in the status, not only on the pods */
    cr_assert_eq(rl_test_standin_set_max_pods(&g.s, 3), 200); /* noimg-0, nosecret-0 and one more */
    apply_job("gang", 2, "", 10);
    tj_await("gang", "{.status.conditions[?(@.type==\"Running\")].message}", "Unschedulable", 30, out, sizeof out);
    cr_expect(strstr(out, "Unschedulable") && strstr(out, "Too many pods"), "Running message: %s", out);
    cr_expect(phase_is("gang", "Pending"));
    /* the operator is still alive after all of it */
    cr_expect_eq(waitpid(g.op, NULL, WNOHANG), 0, "the operator exited");
}

/* The pid of a trainer (a process an agent started) of pod `pod`, -1 when
 * there is none: the stand-in's containers are local processes, and each
 * trainer's environment names its pod. */
static int trainer_of(const char *pod) {
    char want[300], path[64];
    snprintf(want, sizeof want, "POD_NAME=%s", pod);
    DIR *d = opendir("/proc");
    int found = -1;
    for (struct dirent *de; d && found < 0 && (de = readdir(d));) {
        if (de->d_name[0] < '1' || de->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%.20s/environ", de->d_name);
        static char env[1 << 16];
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd >= 0 ? read(fd, env, sizeof env - 2) : -1; /* NUL-separated; the start is enough */
        if (fd >= 0) close(fd);
        env[n > 0 ? n : 0] = env[n > 0 ? n + 1 : 1] = '\0';
        bool child = false, mine = false;
        for (char *v = env; *v; v += strlen(v) + 1) {
            child |= !strcmp(v, "RINGLEADER_CHILD=1");
            mine |= !strcmp(v, want);
        }
        if (child && mine) found = atoi(de->d_name);
    }
    if (d) closedir(d);
    return found;
}

/* Failures by class (util.h): a user error fails the job at once; a crash
 * counts against restartLimit. */
Test(e2e, a_user_error_fails_at_once_a_crash_counts, .init = up, .fini = down, .timeout = 300) {
    /* a job whose data is missing: a user error, restartLimit 1 unused */
    char y[4096], out[8192];
    snprintf(y, sizeof y,
             "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"nodata\"},"
             "\"spec\":{\"image\":\"ringleader:test\",\"replicas\":1,\"restartLimit\":1,\"metricsPort\":0,"
             "\"training\":{\"train\":{\"steps\":10,\"warmup_steps\":1},\"data\":{\"train\":\"%s/none_*.bin\"}}}}", g.dir);
    cr_assert_eq(kubectl("apply -f -", y, out, sizeof out), 0, "%s", out);
    wait_phase("nodata", "Failed", 90);
    cr_expect_eq(tj_num("nodata", "{.status.restarts}"), 0, "a user error is not retried");
    tj("nodata", "{.status.conditions[?(@.type==\"Failed\")].reason}", out, sizeof out);
    cr_expect_str_eq(out, "UserError");
    /* the termination message names the pod and the file */
    tj("nodata", "{.status.conditions[?(@.type==\"Failed\")].message}", out, sizeof out);
    cr_expect(strstr(out, "nodata-0") && strstr(out, "UserError") && strstr(out, "none_*.bin: no files match"),
              "%s", out);

    /* a trainer that crashes (SIGABRT, a failed assertion; not SIGSEGV,
     * which ASan turns into exit 1) past rdzv.max_restarts 0: the job's
     * pods fail, and that counts: restartLimit 0 -> Failed */
    const char *job = "crash";
    apply_job_rdzv(job, 1, ",\"restartLimit\":0", 100000, SEQS, ",\"max_restarts\":0");
    wait_phase(job, "Running", 90);
    wait_step(job, 3, 90);
    int pid = trainer_of("crash-0");
    cr_assert_gt(pid, 0, "no trainer of pod crash-0");
    kill(pid, SIGABRT);
    wait_phase(job, "Failed", 90);
    tj(job, "{.status.conditions[?(@.type==\"Failed\")].reason}", out, sizeof out);
    cr_expect_str_eq(out, "RestartLimitExceeded");
    cr_expect_eq(tj_num(job, "{.status.restarts}"), 1);
    tj(job, "{.status.conditions[?(@.type==\"Failed\")].message}", out, sizeof out);
    cr_expect(strstr(out, "pod crash-0 failed: container exited with status 1") && strstr(out, "signal 6"), "%s", out);
}

/* Evictions and the infrastructure are replaced and not counted. */
Test(e2e, failures_count_against_the_limit_evictions_do_not, .init = up, .fini = down, .timeout = 300) {
    char out[8192];
    /* an eviction is replaced and not counted */
    const char *job = "evict";
    apply_job(job, 2, ",\"restartLimit\":0", 100000);
    wait_phase(job, "Running", 90);
    wait_step(job, 5, 60);
    long long round = tj_num(job, "{.status.round}");
    cr_assert_eq(rl_test_standin_evict(&g.s, "default", "evict-1", "The node was low on resource: memory."), 200);
    double end = rl_now() + 30;
    while (tj_num(job, "{.status.preemptions}") < 1 && rl_now() < end) usleep(200000);
    cr_expect_eq(tj_num(job, "{.status.preemptions}"), 1);
    cr_expect_eq(tj_num(job, "{.status.restarts}"), 0, "an eviction counted as a failure");
    /* and the job trains on. (Waiting for status.round to pass `round`
     * first timed out once under ASan with both pods Running: the progress
     * Lease kept round 1. Left to a later session; wait_step judges the
     * value its loop saw, so a step that goes down cannot fail it.) */
    wait_phase(job, "Running", 90);
    long long s = tj_num(job, "{.status.step}");
    wait_step(job, s + 5, 90);
    (void)round;
    cr_assert_eq(kubectl("get events --field-selector involvedObject.name=evict -o jsonpath='{.items[*].message}'",
                         NULL, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "Evicted") && strstr(out, "not counted"), "events: %s", out);

    /* suspend deletes the pods, resume brings them back */
    cr_assert_eq(kubectl("patch tj evict --type=merge -p '{\"spec\":{\"suspend\":true}}'", NULL, out, sizeof out), 0, "%s", out);
    wait_phase(job, "Suspended", 30);
    end = rl_now() + 40;
    while (owned("pods", job) != 0 && rl_now() < end) usleep(300000);
    cr_expect_eq(owned("pods", job), 0, "suspended job kept pods");
    cr_assert_eq(kubectl("patch tj evict --type=merge -p '{\"spec\":{\"suspend\":false}}'", NULL, out, sizeof out), 0, "%s", out);
    wait_phase(job, "Running", 90);
    cr_expect_eq(tj_num(job, "{.status.restarts}"), 0);
    cr_expect_eq(tj_num(job, "{.status.preemptions}"), 1, "a suspension is not a preemption");
    cr_assert_eq(kubectl("delete tj evict --wait=false", NULL, out, sizeof out), 0, "%s", out);

    /* a container over its memory limit is OOM-killed by the kernel (the
     * stand-in's kubelet enforces limits.memory so): the infrastructure,
     * replaced and not counted, even with restartLimit 0 (an agent and
     * the tiny model's trainer hold about 5 MiB of their own memory) */
    job = "oom";
    apply_job(job, 1, ",\"restartLimit\":0,\"resources\":{\"limits\":{\"memory\":\"4Mi\"}}", 100000);
    end = rl_now() + 90;
    while (tj_num(job, "{.status.infrastructureFailures}") < 2 && rl_now() < end) usleep(300000);
    cr_expect_geq(tj_num(job, "{.status.infrastructureFailures}"), 2, "OOM kills, each replaced");
    cr_expect_eq(tj_num(job, "{.status.restarts}"), 0, "an OOM kill counted as a failure");
    cr_expect(!phase_is(job, "Failed"));
    cr_assert_eq(kubectl("get events --field-selector involvedObject.name=oom -o jsonpath='{.items[*].message}'",
                         NULL, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "OOMKilled") && strstr(out, "not counted"), "events: %s", out);
}

/* the node a pod is bound to ("" when none) */
static void node_of(const char *pod, char *out, size_t n) {
    rl_test_pod p;
    out[0] = '\0';
    if (rl_test_standin_pod(&g.s, "default", pod, NULL, &p) == 0 && p.exists) snprintf(out, n, "%s", p.node);
}

static int nodes_now(void) {
    char out[4096];
    if (kubectl("get nodes -o name", NULL, out, sizeof out) != 0) return -1;
    return count_lines(out);
}

/* The autoscaled, spot path end to end: an elastic 2..4 job, one pod per
 * node, starts on the 2 nodes that exist; the autoscaler adds nodes for the
 * Unschedulable pods and the round grows to 4; a spot reclaim (SIGTERM
 * with a notice, then the node gone) is a preemption: the job checkpoints,
 * re-forms, resumes, and the replacement gets a new node; at the elastic
 * minimum a drain is refused by the job's PodDisruptionBudget. */
Test(e2e, an_autoscaled_spot_pool_grows_survives_a_reclaim_and_refuses_a_drain, .init = up_pool, .fini = down,
     .timeout = 600) {
    const char *job = "pool";
    /* 48 sequences a step: whole micro-batches of 4 on 2, 3 and 4 nodes */
    apply_job_rdzv(job, 4,
                   ",\"elastic\":{\"minReplicas\":2,\"maxReplicas\":4},"
                   "\"affinity\":{\"podAntiAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":"
                   "[{\"topologyKey\":\"kubernetes.io/hostname\",\"labelSelector\":{\"matchLabels\":{\"ringleader.dev/job\":\"pool\"}}}]}}",
                   100000, 48, "");
    char out[16384], node[64];
    /* 2 nodes: two pods run and form a round, two wait for nodes */
    wait_phase(job, "Running", 90);
    wait_step(job, 3, 120);
    cr_expect_eq(nodes_now(), 2, "the autoscaler added nodes before its delay");
    rl_test_pod p;
    cr_assert_eq(rl_test_standin_pod(&g.s, "default", "pool-3", NULL, &p), 0);
    cr_expect(p.scheduled == 0 && !strcmp(p.sched_reason, "Unschedulable"), "pool-3: %s %s", p.sched_reason,
              p.sched_message);
    char *log = malloc(LOG_MAX);
    cr_assert(log);
    cr_assert_eq(kubectl("logs pool-0", NULL, log, LOG_MAX), 0, "%.2000s", log);
    cr_expect(has_line(log, "\"event\":\"round_start\"", "\"nodes\":2"), "no 2-node round:\n%.2000s", log);

    /* the autoscaler adds two nodes; the round grows to 4 */
    long long round = await_round(job, 4, tj_num(job, "{.status.round}"), 120);
    cr_expect_eq(nodes_now(), 4);
    cr_assert_eq(kubectl("get events --field-selector reason=TriggeredScaleUp -o name", NULL, out, sizeof out), 0, "%s", out);
    cr_expect_geq(count_lines(out), 1, "no TriggeredScaleUp event");
    long long s = tj_num(job, "{.status.step}");
    wait_step(job, s + 3, 120);

    /* a spot reclaim of pool-1's node: SIGTERM now, the node gone after
     * the notice; a preemption, not a failure */
    node_of("pool-1", node, sizeof node);
    cr_assert(node[0], "pool-1 is not bound");
    char path[128];
    snprintf(path, sizeof path, "/nodes/%s/reclaim", node);
    cr_assert_eq(rl_test_standin_admin(&g.s, "POST", path, "{\"notice\":15}", out, sizeof out), 200, "%s", out);
    double end = rl_now() + 60;
    while (tj_num(job, "{.status.preemptions}") < 1 && rl_now() < end) usleep(300000);
    cr_expect_geq(tj_num(job, "{.status.preemptions}"), 1, "the reclaim was not counted as a preemption");
    /* the replacement waits for a node: the reclaimed one goes, a new one comes */
    round = await_round(job, 4, round, 180);
    node_of("pool-1", out, sizeof out);
    cr_expect(out[0] && strcmp(out, node), "pool-1 is back on the reclaimed node %s", node);
    cr_expect_eq(tj_num(job, "{.status.restarts}"), 0, "a reclaim is not a failure");
    end = rl_now() + 60;
    do {
        kubectl("logs pool-0", NULL, log, LOG_MAX);
        if (strstr(log, "\"found\":true")) break;
        usleep(500000);
    } while (rl_now() < end);
    cr_expect(strstr(log, "\"found\":true"), "no resume from a checkpoint in pool-0's log:\n%.3000s", log);
    s = tj_num(job, "{.status.step}");
    wait_step(job, s + 3, 120);

    /* at the elastic minimum, the PodDisruptionBudget refuses a drain */
    cr_assert_eq(kubectl("scale tj/pool --replicas=2", NULL, out, sizeof out), 0, "%s", out);
    await_round(job, 2, round, 120);
    node_of("pool-0", node, sizeof node);
    char args[256];
    snprintf(args, sizeof args, "drain %s --ignore-daemonsets --delete-emptydir-data --timeout=8s", node);
    cr_expect_neq(kubectl(args, NULL, out, sizeof out), 0, "the drain went through:\n%s", out);
    cr_expect(strstr(out, "disruption budget"), "kubectl drain:\n%s", out);
    cr_expect_eq(owned("pods", job), 2);
    cr_expect_eq(tj_num(job, "{.status.readyReplicas}"), 2);
    s = tj_num(job, "{.status.step}");
    wait_step(job, s + 2, 60);
    free(log);
}

/* Topology: four nodes in zones a, b, a, b (the stand-in's labels, which
 * its EndpointSlice controller copies into each endpoint, as the real one
 * does) and racks r2, r2, r1, r1 (spec.rackLabel: each pod reads its
 * node's rack from its own labels); one pod per node. The leader orders
 * the ring by zone, then rack, so it crosses zones twice, not four times
 * as the ids would, each rack is entered once, and the order is logged. */
Test(e2e, ranks_follow_the_zones_and_racks_of_the_nodes, .init = up_zones, .fini = down, .timeout = 300) {
    const char *job = "zone";
    apply_job_rdzv(job, 4,
                   ",\"rackLabel\":\"nvidia.com/gpu.clique\",\"affinity\":{\"podAntiAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":"
                   "[{\"topologyKey\":\"kubernetes.io/hostname\",\"labelSelector\":{\"matchLabels\":{\"ringleader.dev/job\":\"zone\"}}}]}}",
                   100000, 48, "");
    wait_phase(job, "Running", 90);
    wait_step(job, 2, 120);
    char *log = malloc(LOG_MAX), pod[32], args[256], want_zone[8][16], want_rack[8][16], order[1024] = "";
    cr_assert(log);
    for (int i = 0; i < 4; i++) { /* each pod's zone and rack, from its node's labels */
        char node[64], out[256];
        snprintf(pod, sizeof pod, "zone-%d", i);
        node_of(pod, node, sizeof node);
        snprintf(args, sizeof args, "get node %s -o jsonpath='{.metadata.labels.topology\\.kubernetes\\.io/zone}'", node);
        cr_assert_eq(kubectl(args, NULL, out, sizeof out), 0, "%s", out);
        snprintf(want_zone[i], sizeof want_zone[i], "%.15s", out);
        snprintf(args, sizeof args, "get node %s -o jsonpath='{.metadata.labels.nvidia\\.com/gpu\\.clique}'", node);
        cr_assert_eq(kubectl(args, NULL, out, sizeof out), 0, "%s", out);
        snprintf(want_rack[i], sizeof want_rack[i], "%.15s", out);
        /* the leader's log has the order */
        snprintf(args, sizeof args, "logs %s", pod);
        if (kubectl(args, NULL, log, LOG_MAX) != 0) continue;
        const char *l = strstr(log, "\"event\":\"round_order\"");
        const char *o = l ? strstr(l, "\"order\":\"") : NULL;
        if (o) sscanf(o + 9, "%1023[^\"]", order);
    }
    cr_assert(order[0], "no round_order in any pod's log");
    /* order: "zone-X@z/r,zone-Y@z/r,..." -- each pod with its node's zone
     * and rack, sorted by (zone, rack, id): zones contiguous, racks
     * contiguous within them */
    int n = 0, changes = 0, got[4], want[4] = {0, 1, 2, 3};
    char prev[16] = "", first[16] = "";
    for (char *save = NULL, *t = strtok_r(order, ",", &save); t; t = strtok_r(NULL, ",", &save), n++) {
        int idx = -1;
        char z[16] = "", r[16] = "";
        cr_assert_eq(sscanf(t, "zone-%d@%15[^/]/%15s", &idx, z, r), 3, "%s", t);
        cr_assert(idx >= 0 && idx < 4 && n < 4);
        cr_expect_str_eq(z, want_zone[idx], "%s: its node says zone \"%s\"", t, want_zone[idx]);
        cr_expect_str_eq(r, want_rack[idx], "%s: its node says rack \"%s\"", t, want_rack[idx]);
        got[n] = idx;
        if (n == 0) snprintf(first, sizeof first, "%s", z);
        else changes += strcmp(prev, z) != 0;
        snprintf(prev, sizeof prev, "%s", z);
    }
    for (int i = 0; i < 4; i++) /* the (zone, rack, id) order, by insertion */
        for (int k = i; k > 0; k--) {
            int a = want[k - 1], b = want[k], c = strcmp(want_zone[a], want_zone[b]);
            if (!c) c = strcmp(want_rack[a], want_rack[b]);
            if (c <= 0) break;
            want[k - 1] = b, want[k] = a;
        }
    cr_expect(n == 4 && !memcmp(got, want, sizeof want), "ring order %d %d %d %d, want %d %d %d %d", got[0], got[1],
              got[2], got[3], want[0], want[1], want[2], want[3]);
    /* what makes the check bite: within a zone the racks are not in id order */
    bool rack_first = false;
    for (int i = 0; i < 4; i++)
        for (int k = i + 1; k < 4; k++)
            rack_first |= !strcmp(want_zone[i], want_zone[k]) && strcmp(want_rack[i], want_rack[k]) > 0;
    cr_expect(rack_first, "the placement put the racks in id order: the rack order is not exercised");
    changes += strcmp(prev, first) != 0; /* the ring closes */
    int by_id = 0; /* what the id order alone would cross (4 when the scheduler alternates zones) */
    for (int i = 0; i < 4; i++) by_id += strcmp(want_zone[i], want_zone[(i + 1) % 4]) != 0;
    cr_log_info("zones by pod: %s %s %s %s; the id order would cross %d times", want_zone[0], want_zone[1],
                want_zone[2], want_zone[3], by_id);
    cr_expect_eq(n, 4);
    cr_expect_eq(changes, 2, "the ring crosses zones %d times", changes);
    free(log);
}


/* Issue 17's hang proof on the cluster: one trainer SIGSTOPped mid-run.
 * With the default hang settings (10 x the median step, at least 5 s; the
 * job's dist.timeout_s is 20 s) rank 0 names it, pod and node, in the Hung
 * condition, writes every rank's records next to the checkpoints in S3,
 * and the job re-forms and trains on: infrastructure, not counted. */
Test(e2e, a_stopped_trainer_is_named_in_the_hung_condition, .init = up, .fini = down, .timeout = 300) {
    char out[8192], node[128];
    const char *job = "hang";
    apply_job(job, 2, ",\"restartLimit\":0", 100000);
    wait_phase(job, "Running", 90);
    wait_step(job, 8, 90);
    int pid = trainer_of("hang-1");
    cr_assert_gt(pid, 0, "no trainer of pod hang-1");
    node_of("hang-1", node, sizeof node);
    long long round = tj_num(job, "{.status.round}");
    double stopped = rl_wall_now();
    kill(pid, SIGSTOP);
    tj_await(job, "{.status.lastHang.message}", "hang-1", 60, out, sizeof out);
    char want[256];
    snprintf(want, sizeof want, "rank 1 (pod hang-1, node %s) stopped responding in ", node);
    cr_assert(strstr(out, want), "lastHang.message: %s (want \"%s\")", out, want);
    cr_expect(!strstr(out, "rank 0 "), "rank 0 only waited: %s", out);
    tj(job, "{.status.conditions[?(@.type==\"Hung\")].message}", out, sizeof out);
    cr_expect(strstr(out, want), "Hung condition: %s", out);
    /* the dump: in S3 next to the checkpoints, parseable, rank 1 silent */
    char dump[512];
    tj(job, "{.status.lastHang.dump}", dump, sizeof dump);
    const char *pre = "s3://" BUCKET "/";
    cr_assert(!strncmp(dump, pre, strlen(pre)) && strstr(dump, "/hang/hangs/r"), "dump at %s", dump);
    rl_s3 *s3 = s3_open();
    cr_assert(s3);
    void *body = NULL;
    size_t len;
    rl_err e = {0};
    cr_assert_eq(rl_s3_get(s3, BUCKET, dump + strlen(pre), 0, UINT64_MAX, &body, &len, &e), RL_OK, "%s", e.msg);
    rl_s3_close(s3);
    cJSON *d = cJSON_ParseWithLength(body, len);
    free(body);
    cr_assert(cJSON_IsObject(d), "the dump is not JSON");
    const cJSON *ranks = cJSON_GetObjectItem(d, "ranks");
    cr_assert_eq(cJSON_GetArraySize(ranks), 2);
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(ranks, 0), "answered")));
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItem(cJSON_GetArrayItem(ranks, 1), "answered")));
    double deadline = cJSON_GetObjectItem(d, "deadline_s")->valuedouble;
    double dumped = cJSON_GetObjectItem(d, "dumped_unix")->valuedouble;
    cJSON_Delete(d);
    cr_log_info("hang deadline %.2f s; dumped %.2f s after the stop", deadline, dumped - stopped);
    cr_expect(deadline >= 5 && dumped - stopped <= deadline + 3, "dumped %.2f s after the stop, deadline %.2f s",
              dumped - stopped, deadline);
    /* recovered: a new round trains on, the condition says so, nothing counted */
    long long s = tj_num(job, "{.status.step}");
    wait_step(job, s + 5, 120);
    tj_await(job, "{.status.conditions[?(@.type==\"Hung\")].reason}", "Recovered", 60, out, sizeof out);
    cr_expect_str_eq(out, "Recovered");
    cr_expect_gt(tj_num(job, "{.status.round}"), round);
    cr_expect_eq(tj_num(job, "{.status.restarts}"), 0, "a hang is not the job's fault");
    /* the recovery, measured by rank 0's agent: last step before -> first after */
    for (double end = rl_now() + 30; tj_num(job, "{.status.lastRecovery.round}") <= round && rl_now() < end;)
        usleep(300000);
    tj(job, "{.status.lastRecovery.round}", out, sizeof out);
    char secs[64], lost[64];
    tj(job, "{.status.lastRecovery.seconds}", secs, sizeof secs);
    tj(job, "{.status.lastRecovery.stepsLost}", lost, sizeof lost);
    cr_log_info("recovered into round %s in %s s, %s steps done again (in place; checkpoint every 20 steps)", out,
                secs, lost);
    /* rank 0 parked with its state and the restarted rank 1 took it live */
    cr_expect(atoll(out) > round && atof(secs) > 0 && atoll(lost) >= 0 && atoll(lost) <= 1,
              "lastRecovery: round %s, %s s, %s steps lost", out, secs, lost);
    cr_assert_eq(kubectl("get events --field-selector involvedObject.name=hang -o jsonpath='{.items[*].reason}'",
                         NULL, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "Hung"), "events: %s", out);
}
