/* The operator's single reconciles against the Kubernetes stand-in where
 * admission or the kubelet decides (PodSecurity, an injected sidecar). Its
 * pure parts are in tests/unit/test_operator.c; the whole controller
 * against a cluster is in tests/e2e/test_e2e.c. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "operator/operator.h"
#include "standin.h"
#include "testutil.h"

/* ---- one reconcile at a time against the stand-in ------------------------------------- */
static rl_test_standin g_s;
static char g_img[64];

static void standin_fini(void) {
    if (g_s.pid > 0) rl_test_standin_stop(&g_s);
    if (g_img[0]) rl_test_rmdir(g_img);
    g_img[0] = '\0';
}

static void kubectl_ok(const char *args, const char *in) {
    static char out[16384];
    int rc = rl_test_kubectl(&g_s, args, in, out, sizeof out);
    cr_assert_eq(rc, 0, "kubectl %s -> %d: %s", args, rc, out);
}

/* The CRD, namespace ns with labels ("k=v k2=v2"), and a TrainingJob `name`
 * there whose pods run the image ringleader:test. extra: more spec members. */
static void job_in(const char *ns, const char *labels, const char *name, const char *extra) {
    char args[512], y[2048];
    kubectl_ok("apply -f manifests/crd.yaml", NULL);
    snprintf(args, sizeof args, "create ns %s", ns);
    kubectl_ok(args, NULL);
    snprintf(args, sizeof args, "label ns %s %s", ns, labels);
    kubectl_ok(args, NULL);
    snprintf(y, sizeof y,
             "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"%s\",\"namespace\":\"%s\"},"
             "\"spec\":{\"image\":\"ringleader:test\",\"replicas\":1,\"metricsPort\":0,\"terminationGracePeriodSeconds\":5,"
             "\"training\":{\"train\":{\"steps\":10,\"warmup_steps\":1}}%s}}",
             name, ns, extra);
    kubectl_ok("apply -f -", y);
}

static rl_op *operator_on_standin(rl_k8s **k) {
    rl_err e = {0};
    cr_assert_eq(rl_k8s_connect(g_s.kubeconfig, NULL, k, &e), RL_OK, "%s", e.msg);
    rl_op *op = NULL;
    cr_assert_eq(rl_op_new(*k, &op, &e), RL_OK, "%s", e.msg);
    return op;
}

/* kubectl get ... -o jsonpath (empty when it fails) */
static void jsonpath(const char *what, const char *path, char *out, size_t n) {
    char args[512];
    snprintf(args, sizeof args, "get %s -o jsonpath='%s'", what, path);
    if (rl_test_kubectl(&g_s, args, NULL, out, n) != 0) out[0] = '\0';
}

/* A namespace that enforces the "restricted" Pod Security Standard admits
 * the worker pods: one reconcile creates them (before the pods carried a
 * securityContext, PodSecurity refused them with 403). */
Test(operator, restricted_namespace_admits_the_pods, .fini = standin_fini, .timeout = 60) {
    cr_assert_eq(rl_test_standin_start(&g_s, NULL), 0, "the stand-in did not start");
    job_in("secure", "pod-security.kubernetes.io/enforce=restricted", "llama", "");
    rl_k8s *k;
    rl_op *op = operator_on_standin(&k);
    rl_err e = {0};
    int rc = rl_op_reconcile(op, "secure", "llama", &e);
    cr_expect_eq(rc, RL_OK, "%s", e.msg);
    char out[4096];
    jsonpath("pods -n secure", "{.items[*].metadata.name}", out, sizeof out);
    cr_expect_str_eq(out, "llama-0", "the pod was not created: %s", e.msg);
    rl_op_free(op);
    rl_k8s_free(k);
}

/* Reconcile every 0.3 s until the job's phase is `want` (bounded); the last phase in out. */
static void reconcile_until(rl_op *op, const char *ns, const char *name, const char *want, double secs, char *out,
                            size_t n) {
    char what[256];
    snprintf(what, sizeof what, "tj %s -n %s", name, ns);
    double end = rl_now() + secs;
    do {
        rl_err e = {0};
        if (rl_op_reconcile(op, ns, name, &e) != RL_OK) fprintf(stderr, "reconcile %s: %s\n", name, e.msg);
        jsonpath(what, "{.status.phase}", out, n);
        if (!strcmp(out, want)) return;
        usleep(300000);
    } while (rl_now() < end);
}

/* Pods with Istio's proxy injected (it sorts before "worker" and never
 * exits by itself): the operator judges them by the worker container. A
 * worker that exits 3 fails the job at restartLimit 0, with its status
 * and last log line; one that exits 0 completes its job -- though each
 * pod stays Running while its proxy runs. */
Test(operator, sidecar_pods_judged_by_the_worker, .fini = standin_fini, .timeout = 120) {
    /* the "image": a ringleader-worker that exits as its job's name says */
    snprintf(g_img, sizeof g_img, "/tmp/rl-opimg-XXXXXX");
    cr_assert(mkdtemp(g_img));
    char path[128], image[128];
    snprintf(path, sizeof path, "%s/ringleader-worker", g_img);
    const char *script = "#!/bin/sh\nsleep 1\nif [ \"$RINGLEADER_JOB\" = ok ]; then exit 0; fi\n"
                         "echo 'data: no shards match /none_*.bin'\nexit 3\n";
    rl_test_write(path, script, strlen(script));
    chmod(path, 0755);
    snprintf(image, sizeof image, "ringleader:*=%s", g_img);
    rl_test_standin_opts so = {.images = {image}, .backoff_s = 0.3};
    cr_assert_eq(rl_test_standin_start_opts(&g_s, &so), 0, "the stand-in did not start");
    job_in("mesh", "istio-injection=enabled pod-security.kubernetes.io/enforce=restricted", "bad", ",\"restartLimit\":0");
    kubectl_ok("apply -f -",
               "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"ok\",\"namespace\":\"mesh\"},"
               "\"spec\":{\"image\":\"ringleader:test\",\"replicas\":1,\"metricsPort\":0,\"cleanPodPolicy\":\"None\","
               "\"training\":{\"train\":{\"steps\":10,\"warmup_steps\":1}}}}");
    rl_k8s *k;
    rl_op *op = operator_on_standin(&k);
    char out[4096];
    reconcile_until(op, "mesh", "bad", "Failed", 40, out, sizeof out);
    cr_expect_str_eq(out, "Failed", "job bad");
    jsonpath("pod bad-0 -n mesh", "{.status.containerStatuses[*].name}", out, sizeof out);
    cr_expect(!out[0] || !strcmp(out, "istio-proxy worker"), "statuses: %s", out);
    jsonpath("tj bad -n mesh", "{.status.restarts}", out, sizeof out);
    cr_expect_str_eq(out, "1");
    jsonpath("tj bad -n mesh", "{.status.conditions[?(@.type==\"Failed\")].message}", out, sizeof out);
    cr_expect(strstr(out, "pod bad-0 failed: container exited with status 3: Error: data: no shards match"), "%s", out);
    reconcile_until(op, "mesh", "ok", "Succeeded", 40, out, sizeof out);
    cr_expect_str_eq(out, "Succeeded", "job ok");
    jsonpath("pod ok-0 -n mesh", "{.status.phase} {.status.containerStatuses[*].name}", out, sizeof out);
    cr_expect_str_eq(out, "Running istio-proxy worker", "the proxy keeps the pod Running");
    rl_op_free(op);
    rl_k8s_free(k);
}
