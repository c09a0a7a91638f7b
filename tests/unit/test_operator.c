/* The operator's pure parts: reading a TrainingJob (defaults, and every
 * refusal naming its field), the objects it owns, how a pod ended, and the
 * hang the rank-0 agent reports (the rest of decide.c: test_decide.c).
 * Single reconciles against the Kubernetes stand-in are in
 * tests/integration/test_operator_standin.c; the whole controller against
 * a cluster is in tests/e2e/test_e2e.c. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "operator/decide.h"
#include "operator/operator.h"
#include "standin.h"
#include "testutil.h"

/* 24 sequences of 64 tokens per step: whole on 1, 2, 3, 4, 6 and 8 ranks */
#define SMALL "\"training\":{\"train\":{\"seq_len\":64,\"micro_batch\":1,\"global_batch_tokens\":1536}}"

static cJSON *job(const char *spec) {
    char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\","
             "\"metadata\":{\"name\":\"llama\",\"namespace\":\"ml\",\"uid\":\"u-1\",\"generation\":3},"
             "\"spec\":%s}", spec);
    cJSON *o = cJSON_Parse(buf);
    cr_assert(o, "fixture does not parse: %s", buf);
    return o;
}

static const char *env_of(const cJSON *pod, const char *name) {
    const cJSON *c = cJSON_GetArrayItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "spec"), "containers"), 0);
    const cJSON *env = cJSON_GetObjectItem(c, "env");
    for (const cJSON *it = env ? env->child : NULL; it; it = it->next)
        if (!strcmp(cJSON_GetObjectItem(it, "name")->valuestring, name)) {
            const cJSON *v = cJSON_GetObjectItem(it, "value");
            if (v) return v->valuestring;
            const cJSON *vf = cJSON_GetObjectItem(it, "valueFrom");
            const cJSON *r = cJSON_GetObjectItem(vf, "secretKeyRef");
            if (!r) r = cJSON_GetObjectItem(vf, "fieldRef");
            static char ref[256];
            char *s = cJSON_PrintUnformatted(r);
            snprintf(ref, sizeof ref, "%s", s);
            cJSON_free(s);
            return ref;
        }
    return NULL;
}

Test(operator, defaults_and_the_worker_config) {
    cJSON *o = job("{\"image\":\"rl:1\",\"training\":{\"train\":{\"steps\":30,\"warmup_steps\":5}}}");
    rl_op_job j;
    rl_err e = {0};
    cr_assert_eq(rl_op_job_parse(o, &j, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(j.replicas, 1);
    cr_expect_eq(j.min_nodes, 1);
    cr_expect_eq(j.max_nodes, 1);
    cr_expect_eq(j.nproc, 1);
    cr_expect_eq(j.restart_limit, 3);
    cr_expect_eq(j.grace_s, 60);
    cr_expect_eq(j.metrics_port, 9090);
    cr_expect_eq(j.rdzv_port, 29400);
    cr_expect_str_eq(j.clean_policy, "All");
    cr_expect_str_eq(j.pull_policy, "IfNotPresent");
    /* the worker's config: what the user wrote, plus the job's port */
    cJSON *cfg = cJSON_Parse(j.training_json);
    cr_assert(cfg);
    cr_expect_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "train"), "steps")->valueint, 30);
    cr_expect_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "rdzv"), "port")->valueint, 29400);
    cJSON_Delete(cfg);
    rl_op_job_free(&j);
    cJSON_Delete(o);
}

Test(operator, refusals_name_the_field) {
    static const char *const cases[][2] = {
        {"{}", "spec.image: required"},
        {"{\"image\":\"x\",\"replicas\":0}", "spec.replicas"},
        {"{\"image\":\"x\",\"elastic\":{\"minReplicas\":3,\"maxReplicas\":2}}", "spec.elastic.maxReplicas: 2 is below minReplicas 3"},
        {"{\"image\":\"x\",\"imagePullPolicy\":\"Sometimes\"}", "spec.imagePullPolicy"},
        {"{\"image\":\"x\",\"cleanPodPolicy\":\"Some\"}", "spec.cleanPodPolicy"},
        {"{\"image\":\"x\",\"metricsPort\":29400}", "spec.metricsPort"},
        {"{\"image\":\"x\",\"nprocPerNode\":0}", "spec.nprocPerNode"},
        {"{\"image\":\"x\",\"training\":{\"train\":{\"micro_batch\":-1}}}", "spec.training: train.micro_batch"},
        {"{\"image\":\"x\",\"training\":{\"model\":{\"hidden_szie\":8}}}", "hidden_szie"},
        {"{\"image\":\"x\",\"training\":{\"rdzv\":{\"port\":1}}}", "spec.training.rdzv.port: set by the TrainingJob (spec.rdzvPort)"},
        /* 3 nodes x 1 process: 16 sequences of the global batch do not divide */
        {"{\"image\":\"x\",\"elastic\":{\"minReplicas\":2,\"maxReplicas\":3},"
         "\"training\":{\"train\":{\"seq_len\":64,\"micro_batch\":1,\"global_batch_tokens\":1024}}}", "with 3 nodes x 1 process"},
        {"{\"image\":\"x\",\"s3\":{\"credentialsSecret\":{}}}", "spec.s3.credentialsSecret.name: required"},
        {"{\"image\":\"x\",\"s3\":{\"endpoint\":\"rgw:7480\"}}", "spec.s3.endpoint"},
        {"{\"image\":\"x\",\"suspend\":\"yes\"}", "spec.suspend"},
        {"{\"image\":\"x\",\"volumeMounts\":[{\"name\":\"data\",\"mountPath\":\"/data\"}]}",
         "spec.volumeMounts[0].name: no volume \"data\" in spec.volumes"},
        {"{\"image\":\"x\",\"volumes\":[{\"name\":\"d\",\"emptyDir\":{}}],\"volumeMounts\":[{\"name\":\"d\",\"mountPath\":\"/dev/shm\"}]}",
         "spec.volumeMounts[0].mountPath: /dev/shm is mounted by the operator"},
        {"{\"image\":\"x\",\"volumes\":[{\"name\":\"ringleader-shm\",\"emptyDir\":{}}]}", "spec.volumes[0].name"},
        /* what a TrainingJob may not hand its pods: the node's files, other Secrets */
        {"{\"image\":\"x\",\"volumes\":[{\"name\":\"root\",\"hostPath\":{\"path\":\"/\"}}]}",
         "spec.volumes[0].hostPath: not an allowed volume source"},
        {"{\"image\":\"x\",\"volumes\":[{\"name\":\"d\",\"emptyDir\":{},\"configMap\":{\"name\":\"c\"}}]}",
         "spec.volumes[0]: needs exactly one volume source"},
        {"{\"image\":\"x\",\"volumes\":[{\"name\":\"s\",\"secret\":{\"secretName\":\"db-admin\"}}]}",
         "spec.volumes[0].secret.secretName: Secret \"db-admin\" is not in spec.secretRefs"},
        {"{\"image\":\"x\",\"secretRefs\":[{\"name\":\"a\"}],\"volumes\":[{\"name\":\"p\",\"projected\":{\"sources\":"
         "[{\"secret\":{\"name\":\"a\"}},{\"secret\":{\"name\":\"b\"}}]}}]}",
         "spec.volumes[0].projected.sources[1].secret.name: Secret \"b\""},
        {"{\"image\":\"x\",\"volumes\":[{\"name\":\"c\",\"csi\":{\"driver\":\"d\",\"nodePublishSecretRef\":{\"name\":\"k\"}}}]}",
         "spec.volumes[0].csi.nodePublishSecretRef.name: Secret \"k\""},
        {"{\"image\":\"x\",\"env\":[{\"name\":\"P\",\"valueFrom\":{\"secretKeyRef\":{\"name\":\"db\",\"key\":\"p\"}}}]}",
         "spec.env[0].valueFrom.secretKeyRef.name: Secret \"db\" is not in spec.secretRefs"},
        {"{\"image\":\"x\",\"secretRefs\":[{}]}", "spec.secretRefs[0].name: required"},
        {"{\"image\":\"x\",\"volumes\":[{\"name\":\"ringleader-tmp\",\"emptyDir\":{}}]}",
         "spec.volumes[0].name: \"ringleader-tmp\" is the operator's own /tmp volume"},
        {"{\"image\":\"x\",\"volumes\":[{\"name\":\"d\",\"emptyDir\":{}}],\"volumeMounts\":[{\"name\":\"d\",\"mountPath\":\"/tmp\"}]}",
         "spec.volumeMounts[0].mountPath: /tmp is mounted by the operator"},
        {"{\"image\":\"x\",\"shmSize\":\"lots\"}", "spec.shmSize"},
        {"{\"image\":\"x\",\"rackLabel\":\"rack']\"}", "spec.rackLabel: \"rack']\" is not a label key"},
        {"{\"image\":\"x\",\"rackLabel\":\"Example.com/rack\"}", "spec.rackLabel"},
        {"{\"image\":\"x\",\"nprocPerNode\":4,\"gpusPerNode\":2}", "spec.nprocPerNode: 4 trainer processes but gpusPerNode 2"},
        {"{\"image\":\"x\",\"gpusPerNode\":1,\"training\":{\"dist\":{\"backend\":\"tcp\"}}}",
         "spec.training.dist.backend: \"tcp\" on a job with gpusPerNode 1"},
        {"{\"image\":\"x\",\"gpusPerNode\":1,\"training\":{\"train\":{\"device\":\"cpu\"}}}",
         "spec.training.train.device: \"cpu\" on a job with gpusPerNode 1"},
        /* the default model's shared host state is 14 B x 0.8 M parameters: 11 MB */
        {"{\"image\":\"x\",\"nprocPerNode\":2,\"gpusPerNode\":2,\"shmSize\":\"8Mi\","
         "\"training\":{\"train\":{\"offload\":\"layers\"}}}",
         "spec.shmSize: 8Mi cannot hold the host state the 2 trainers of a pod share"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *o = job(cases[i][0]);
        rl_op_job j;
        rl_err e = {0};
        cr_expect_eq(rl_op_job_parse(o, &j, &e), RL_EINPUT, "accepted: %s", cases[i][0]);
        cr_expect(strstr(e.msg, cases[i][1]) != NULL, "%s -> \"%s\", want \"%s\"", cases[i][0], e.msg, cases[i][1]);
        cr_expect(strchr(e.msg, '\n') == NULL);
        rl_op_job_free(&j);
        cJSON_Delete(o);
    }
    /* a name too long for <name>-<index> hostnames */
    cJSON *o = cJSON_Parse("{\"metadata\":{\"name\":\"a-very-long-name-that-leaves-no-room-for-the-index-suffix-x\"},"
                           "\"spec\":{\"image\":\"x\"}}");
    rl_op_job j;
    rl_err e = {0};
    cr_expect_eq(rl_op_job_parse(o, &j, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "metadata.name"), "%s", e.msg);
    rl_op_job_free(&j);
    cJSON_Delete(o);
}

/* The same pod with room for the shared host state, with none asked for
 * (a trainer a pod, offload_share false, or dist.shard: each rank keeps its
 * shard, nothing is shared), or with no limit is taken. */
Test(operator, a_shm_size_that_holds_the_shared_host_state_is_taken) {
    const char *ok[] = {
        "{\"image\":\"x\",\"nprocPerNode\":2,\"gpusPerNode\":2,\"shmSize\":\"12M\","
        "\"training\":{\"train\":{\"offload\":\"layers\"}}}",
        "{\"image\":\"x\",\"nprocPerNode\":2,\"gpusPerNode\":2,\"shmSize\":\"8Mi\","
        "\"training\":{\"train\":{\"offload\":\"layers\",\"offload_share\":false}}}",
        "{\"image\":\"x\",\"nprocPerNode\":1,\"gpusPerNode\":1,\"shmSize\":\"8Mi\","
        "\"training\":{\"train\":{\"offload\":\"optimizer\"}}}",
        "{\"image\":\"x\",\"nprocPerNode\":2,\"gpusPerNode\":2,\"shmSize\":\"8Mi\","
        "\"training\":{\"train\":{\"offload\":\"optimizer\"},\"dist\":{\"shard\":\"gradients\"}}}",
        "{\"image\":\"x\",\"nprocPerNode\":2,\"gpusPerNode\":2,\"training\":{\"train\":{\"offload\":\"layers\"}}}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        cJSON *o = job(ok[i]);
        rl_op_job j;
        rl_err e = {0};
        cr_expect_eq(rl_op_job_parse(o, &j, &e), RL_OK, "%s: %s", ok[i], e.msg);
        rl_op_job_free(&j);
        cJSON_Delete(o);
    }
}

Test(operator, elastic_replicas_clamped_into_the_range) {
    cJSON *o = job("{\"image\":\"x\",\"replicas\":9,\"elastic\":{\"minReplicas\":2,\"maxReplicas\":4}," SMALL "}");
    rl_op_job j;
    rl_err e = {0};
    cr_assert_eq(rl_op_job_parse(o, &j, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(j.replicas, 4);
    cr_expect(j.elastic && j.min_nodes == 2 && j.max_nodes == 4);
    rl_op_job_free(&j);
    cJSON_Delete(o);
}

/* Autoscaled pools: the pods keep their nodes through a scale-down unless
 * the job says it may be moved; a PodDisruptionBudget keeps drains above
 * the elastic minimum, and takes no pod of a fixed-size job. */
Test(operator, autoscalers_and_drains) {
    static const char *const specs[] = {"{\"image\":\"rl:1\",\"replicas\":3,\"elastic\":{\"minReplicas\":2,\"maxReplicas\":4},"
                                        "\"training\":{\"train\":{\"seq_len\":64,\"micro_batch\":1,\"global_batch_tokens\":768}}}",
                                        "{\"image\":\"rl:1\",\"replicas\":2,\"disruptible\":true}"};
    for (int k = 0; k < 2; k++) {
        cJSON *o = job(specs[k]);
        rl_op_job j;
        rl_err e = {0};
        cr_assert_eq(rl_op_job_parse(o, &j, &e), RL_OK, "%s", e.msg);
        cJSON *pod = rl_op_pod(&j, 0), *pdb = rl_op_pdb(&j);
        const cJSON *ann = rl_test_json_path(pod, "metadata.annotations");
        const char *evict = cJSON_GetStringValue(cJSON_GetObjectItem(ann, "cluster-autoscaler.kubernetes.io/safe-to-evict"));
        const char *keep = cJSON_GetStringValue(cJSON_GetObjectItem(ann, "karpenter.sh/do-not-disrupt"));
        if (k == 0) {
            cr_expect(evict && !strcmp(evict, "false") && keep && !strcmp(keep, "true"));
            cr_expect_eq(cJSON_GetNumberValue(rl_test_json_path(pdb, "spec.minAvailable")), 2);
        } else {
            cr_expect(!evict && !keep, "disruptible: true lifts both annotations");
            cr_expect(!rl_test_json_path(pdb, "spec.minAvailable"));
            cr_expect_eq(cJSON_GetNumberValue(rl_test_json_path(pdb, "spec.maxUnavailable")), 0);
        }
        const cJSON *sel = rl_test_json_path(pdb, "spec.selector.matchLabels");
        cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(sel, RL_OP_LABEL_JOB)), "llama");
        const cJSON *refs = rl_test_json_path(pdb, "metadata.ownerReferences");
        cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(refs, 0), "uid")), "u-1");
        cJSON_Delete(pdb);
        cJSON_Delete(pod);
        rl_op_job_free(&j);
        cJSON_Delete(o);
    }
    cJSON *o = job("{\"image\":\"rl:1\",\"disruptible\":\"yes\"}");
    rl_op_job j;
    rl_err e = {0};
    cr_expect_eq(rl_op_job_parse(o, &j, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "spec.disruptible: must be a boolean"), "%s", e.msg);
    rl_op_job_free(&j);
    cJSON_Delete(o);
}

/* Pod labels and annotations (Kueue, cost labels), affinity and spread
 * reach every pod as written, beside the operator's own keys, which the
 * user cannot take over. */
Test(operator, pod_metadata_affinity_and_spread_pass_through) {
    cJSON *o = job("{\"image\":\"rl:1\",\"replicas\":2,"
                   "\"podMetadata\":{\"labels\":{\"kueue.x-k8s.io/queue-name\":\"gpu\",\"team\":\"\"},"
                   "\"annotations\":{\"example.com/cost\":\"ml 42\"}},"
                   "\"affinity\":{\"podAntiAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":"
                   "[{\"topologyKey\":\"kubernetes.io/hostname\"}]}},"
                   "\"topologySpreadConstraints\":[{\"maxSkew\":1,\"topologyKey\":\"topology.kubernetes.io/zone\","
                   "\"whenUnsatisfiable\":\"DoNotSchedule\"}]}");
    rl_op_job j;
    rl_err e = {0};
    cr_assert_eq(rl_op_job_parse(o, &j, &e), RL_OK, "%s", e.msg);
    cJSON *pod = rl_op_pod(&j, 1);
    const cJSON *labels = rl_test_json_path(pod, "metadata.labels"), *ann = rl_test_json_path(pod, "metadata.annotations");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(labels, "kueue.x-k8s.io/queue-name")), "gpu");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(labels, "team")), "");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(labels, RL_OP_LABEL_JOB)), "llama");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(labels, RL_OP_LABEL_INDEX)), "1");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(ann, "example.com/cost")), "ml 42");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(ann, RL_OP_ANN_SAFE_TO_EVICT)), "false");
    const cJSON *terms = rl_test_json_path(pod, "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(terms, 0), "topologyKey")),
                     "kubernetes.io/hostname");
    const cJSON *tsc = rl_test_json_path(pod, "spec.topologySpreadConstraints");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(tsc, 0), "whenUnsatisfiable")),
                     "DoNotSchedule");
    cJSON_Delete(pod);
    rl_op_job_free(&j);
    cJSON_Delete(o);

    /* Secrets the job names may be used: secretRefs and the S3 credentials */
    o = job("{\"image\":\"rl:1\",\"secretRefs\":[{\"name\":\"hf\"}],\"s3\":{\"credentialsSecret\":{\"name\":\"s3c\"}},"
            "\"env\":[{\"name\":\"HF_TOKEN\",\"valueFrom\":{\"secretKeyRef\":{\"name\":\"hf\",\"key\":\"t\"}}},"
            "{\"name\":\"K\",\"valueFrom\":{\"secretKeyRef\":{\"name\":\"s3c\",\"key\":\"k\"}}}],"
            "\"volumes\":[{\"name\":\"tok\",\"secret\":{\"secretName\":\"hf\"}},{\"name\":\"c\",\"csi\":{\"driver\":\"d\"}}]}");
    e = (rl_err){0};
    cr_expect_eq(rl_op_job_parse(o, &j, &e), RL_OK, "%s", e.msg);
    rl_op_job_free(&j);
    cJSON_Delete(o);

    static const struct {
        const char *spec, *want;
    } bad[] = {
        {"\"podMetadata\":{\"labels\":{\"ringleader.dev/job\":\"other\"}}", "spec.podMetadata.labels.ringleader.dev/job: set by the operator"},
        {"\"podMetadata\":{\"labels\":{\"app.kubernetes.io/managed-by\":\"me\"}}", "labels.app.kubernetes.io/managed-by: set by"},
        {"\"podMetadata\":{\"annotations\":{\"cluster-autoscaler.kubernetes.io/safe-to-evict\":\"true\"}}",
         "safe-to-evict: set by the operator from spec.disruptible"},
        {"\"podMetadata\":{\"labels\":{\"Team/x\":\"a\"}}", "spec.podMetadata.labels: key \"Team/x\" is not a qualified name"},
        {"\"podMetadata\":{\"labels\":{\"team\":\"a b\"}}", "spec.podMetadata.labels.team: \"a b\" is not a label value"},
        {"\"podMetadata\":{\"labels\":{\"team\":7}}", "spec.podMetadata.labels.team: must be a string"},
        {"\"podMetadata\":[]", "spec.podMetadata: must be an object"},
        {"\"affinity\":[]", "spec.affinity: must be an object"},
        {"\"topologySpreadConstraints\":[1]", "spec.topologySpreadConstraints[0]: must be an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char spec[512];
        snprintf(spec, sizeof spec, "{\"image\":\"rl:1\",%s}", bad[i].spec);
        o = job(spec);
        e = (rl_err){0};
        cr_expect_eq(rl_op_job_parse(o, &j, &e), RL_EINPUT, "%s", spec);
        cr_expect(strstr(e.msg, bad[i].want), "%s: got %s", spec, e.msg);
        rl_op_job_free(&j);
        cJSON_Delete(o);
    }
}

/* The job's NetworkPolicy: its own pods on every port, metrics from the
 * operator's namespaces; spec.networkPolicy: false turns it off. */
Test(operator, network_policy) {
    cJSON *o = job("{\"image\":\"rl:1\",\"metricsPort\":9191}");
    rl_op_job j;
    rl_err e = {0};
    cr_assert_eq(rl_op_job_parse(o, &j, &e), RL_OK, "%s", e.msg);
    cr_expect(j.network_policy, "on by default");
    cJSON *np = rl_op_network_policy(&j, "team=monitoring");
    char *t = cJSON_PrintUnformatted(np);
    cr_expect(strstr(t, "\"spec\":{\"podSelector\":{\"matchLabels\":{\"ringleader.dev/job\":\"llama\"}},"
                        "\"policyTypes\":[\"Ingress\"],\"ingress\":[{\"from\":[{\"podSelector\":{\"matchLabels\":"
                        "{\"ringleader.dev/job\":\"llama\"}}}]},{\"from\":[{\"namespaceSelector\":{\"matchLabels\":"
                        "{\"team\":\"monitoring\"}}}],\"ports\":[{\"protocol\":\"TCP\",\"port\":9191}]}]}"),
              "%s", t);
    free(t);
    cJSON_Delete(np);
    np = rl_op_network_policy(&j, ""); /* any namespace */
    t = cJSON_PrintUnformatted(np);
    cr_expect(strstr(t, "{\"from\":[{\"namespaceSelector\":{}}],\"ports\""), "%s", t);
    free(t);
    cJSON_Delete(np);
    rl_op_job_free(&j);
    cJSON_Delete(o);
    o = job("{\"image\":\"rl:1\",\"networkPolicy\":false}");
    cr_assert_eq(rl_op_job_parse(o, &j, &e), RL_OK, "%s", e.msg);
    cr_expect(!j.network_policy);
    rl_op_job_free(&j);
    cJSON_Delete(o);
    cr_expect_eq(rl_op_check_label_pair("kubernetes.io/metadata.name=monitoring", "--x", &e), RL_OK);
    cr_expect_eq(rl_op_check_label_pair("", "--x", &e), RL_OK);
    cr_expect_eq(rl_op_check_label_pair("no-equals", "--x", &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "--x: \"no-equals\" is not key=value"), "%s", e.msg);
    cr_expect_eq(rl_op_check_label_pair("a=b c", "--x", &e), RL_EINPUT);
}

Test(operator, the_pod_a_job_wants) {
    cJSON *o = job("{\"image\":\"rl:1\",\"nprocPerNode\":2,\"gpusPerNode\":8,\"terminationGracePeriodSeconds\":45,"
                   "\"elastic\":{\"minReplicas\":2,\"maxReplicas\":4},\"replicas\":3,"
                   "\"resources\":{\"limits\":{\"memory\":\"8Gi\"}},\"nodeSelector\":{\"pool\":\"gpu\"},"
                   "\"env\":[{\"name\":\"RL_LOG_LEVEL\",\"value\":\"debug\"}],\"shmSize\":\"16Gi\","
                   "\"rackLabel\":\"nvidia.com/gpu.clique\","
                   "\"volumes\":[{\"name\":\"data\",\"persistentVolumeClaim\":{\"claimName\":\"corpus\"}}],"
                   "\"volumeMounts\":[{\"name\":\"data\",\"mountPath\":\"/data\",\"readOnly\":true}],"
                   "\"training\":{\"dist\":{\"backend\":\"nccl\"},\"train\":{\"seq_len\":64,\"micro_batch\":1,\"global_batch_tokens\":1536}},"
                   "\"s3\":{\"endpoint\":\"http://rgw:7480\",\"region\":\"eu-1\",\"credentialsSecret\":{\"name\":\"s3c\"}}}");
    rl_op_job j;
    rl_err e = {0};
    cr_assert_eq(rl_op_job_parse(o, &j, &e), RL_OK, "%s", e.msg);
    cJSON *pod = rl_op_pod(&j, 2);
    const cJSON *md = cJSON_GetObjectItem(pod, "metadata"), *spec = cJSON_GetObjectItem(pod, "spec");
    cr_expect_str_eq(cJSON_GetObjectItem(md, "name")->valuestring, "llama-2");
    cr_expect_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(md, "labels"), RL_OP_LABEL_INDEX)->valuestring, "2");
    const cJSON *ref = cJSON_GetArrayItem(cJSON_GetObjectItem(md, "ownerReferences"), 0);
    cr_expect_str_eq(cJSON_GetObjectItem(ref, "uid")->valuestring, "u-1");
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(ref, "controller")));
    cr_expect_str_eq(cJSON_GetObjectItem(spec, "hostname")->valuestring, "llama-2");
    cr_expect_str_eq(cJSON_GetObjectItem(spec, "subdomain")->valuestring, "llama");
    cr_expect_str_eq(cJSON_GetObjectItem(spec, "restartPolicy")->valuestring, "Never");
    cr_expect_str_eq(cJSON_GetObjectItem(spec, "serviceAccountName")->valuestring, "llama-worker");
    cr_expect_eq(cJSON_GetObjectItem(spec, "terminationGracePeriodSeconds")->valueint, 45);
    cr_expect_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(spec, "nodeSelector"), "pool")->valuestring, "gpu");
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(spec, "containers"), 0);
    const cJSON *lim = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "resources"), "limits");
    cr_expect_str_eq(cJSON_GetObjectItem(lim, "nvidia.com/gpu")->valuestring, "8");
    cr_expect_str_eq(cJSON_GetObjectItem(lim, "memory")->valuestring, "8Gi");
    cr_expect_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(c, "args"), 3)->valuestring, "2");
    cr_expect_str_eq(env_of(pod, "RINGLEADER_NNODES"), "2:4");
    cr_expect_str_eq(env_of(pod, "RINGLEADER_JOB"), "llama");
    cr_expect_str_eq(env_of(pod, "RINGLEADER_RDZV"), "k8s");
    cr_expect_str_eq(env_of(pod, "AWS_ENDPOINT_URL_S3"), "http://rgw:7480");
    cr_expect(strstr(env_of(pod, "AWS_SECRET_ACCESS_KEY"), "\"name\":\"s3c\""));
    cr_expect(strstr(env_of(pod, "AWS_SECRET_ACCESS_KEY"), "\"key\":\"AWS_SECRET_ACCESS_KEY\""));
    cr_expect(strstr(env_of(pod, "RINGLEADER_RDZV_SECRET"), "\"name\":\"llama-rdzv\""));
    cr_expect(strstr(env_of(pod, "POD_IP"), "status.podIP"));
    /* the node's rack as the pod carries it (spec.rackLabel) */
    cr_expect(strstr(env_of(pod, "RINGLEADER_RACK"), "\"fieldPath\":\"metadata.labels['nvidia.com/gpu.clique']\""),
              "%s", env_of(pod, "RINGLEADER_RACK"));
    cr_expect_str_eq(env_of(pod, "RL_LOG_LEVEL"), "debug");
    cr_expect(strstr(env_of(pod, "RINGLEADER_CONFIG"), "\"nccl\""));
    /* the user's data volume, and /dev/shm in memory for NCCL */
    char *pt = cJSON_PrintUnformatted(pod);
    cr_expect(strstr(pt, "\"volumes\":[{\"name\":\"data\",\"persistentVolumeClaim\":{\"claimName\":\"corpus\"}},"
                         "{\"name\":\"ringleader-shm\",\"emptyDir\":{\"medium\":\"Memory\",\"sizeLimit\":\"16Gi\"}},"
                         "{\"name\":\"ringleader-tmp\",\"emptyDir\":{}}]"),
              "%s", pt);
    cr_expect(strstr(pt, "\"volumeMounts\":[{\"name\":\"data\",\"mountPath\":\"/data\",\"readOnly\":true},"
                         "{\"name\":\"ringleader-shm\",\"mountPath\":\"/dev/shm\"},"
                         "{\"name\":\"ringleader-tmp\",\"mountPath\":\"/tmp\"}]"),
              "%s", pt);
    /* the "restricted" Pod Security Standard, with a read-only root filesystem */
    cr_expect(strstr(pt, "\"securityContext\":{\"runAsNonRoot\":true,\"runAsUser\":65532,\"runAsGroup\":65532,"
                         "\"fsGroup\":65532,\"seccompProfile\":{\"type\":\"RuntimeDefault\"}}"),
              "%s", pt);
    cr_expect(strstr(pt, "\"securityContext\":{\"allowPrivilegeEscalation\":false,\"capabilities\":{\"drop\":[\"ALL\"]},"
                         "\"readOnlyRootFilesystem\":true}"),
              "%s", pt);
    cJSON_free(pt);
    cJSON_Delete(pod);

    /* the Role: named Leases for get/update/patch, create unnamed, slices read-only */
    cJSON *role = rl_op_role(&j);
    char *txt = cJSON_PrintUnformatted(role);
    cr_expect(strstr(txt, "\"resourceNames\":[\"llama-leader\",\"llama-progress\"]"), "%s", txt);
    cr_expect(strstr(txt, "\"verbs\":[\"get\",\"update\",\"patch\"]"), "%s", txt);
    cr_expect(strstr(txt, "\"resources\":[\"endpointslices\"],\"verbs\":[\"get\",\"list\",\"watch\"]"), "%s", txt);
    cJSON_free(txt);
    cJSON_Delete(role);
    cJSON *svc = rl_op_service(&j);
    txt = cJSON_PrintUnformatted(svc);
    cr_expect(strstr(txt, "\"clusterIP\":\"None\",\"publishNotReadyAddresses\":true"), "%s", txt);
    cJSON_free(txt);
    cJSON_Delete(svc);
    rl_op_job_free(&j);
    cJSON_Delete(o);
}

static rl_pod_state classify(const char *json, rl_pod_info *p) {
    cJSON *o = cJSON_Parse(json);
    cr_assert(o, "%s", json);
    rl_op_pod_classify(o, p);
    cJSON_Delete(o);
    return p->state;
}

#define META "\"metadata\":{\"name\":\"llama-1\",\"uid\":\"p1\",\"labels\":{\"ringleader.dev/index\":\"1\"}}"
#define TERM(code, reason) \
    "\"containerStatuses\":[{\"name\":\"worker\",\"state\":{\"terminated\":{\"exitCode\":" #code ",\"reason\":\"" reason "\"}}}]"

Test(operator, how_a_pod_ended) {
    rl_pod_info p;
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Succeeded\"}}", &p), RL_POD_SUCCEEDED);
    cr_expect_eq(p.index, 1);
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Failed\"," TERM(1, "Error") "}}", &p), RL_POD_FAILED);
    cr_expect(strstr(p.message, "status 1"), "%s", p.message);
    /* a crash: an assertion (SIGABRT), the runtime's reason kept */
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Failed\"," TERM(134, "Error") "}}", &p), RL_POD_FAILED);
    cr_expect_str_eq(p.reason, "Error");
    /* the exit statuses' classes (util.h) and the reasons that name them */
    static const struct {
        int code;
        const char *treason;
        rl_pod_state state;
        const char *reason;
    } ends[] = {
        {2, "Error", RL_POD_USER_ERROR, "UserError"},          /* bad config or data: the job fails */
        {75, "Error", RL_POD_PREEMPTED, "Preempted"},          /* checkpointed on SIGTERM */
        {143, "Error", RL_POD_PREEMPTED, "Terminated"},        /* a SIGTERM death */
        {130, "Error", RL_POD_PREEMPTED, "Terminated"},        /* a SIGINT death */
        {76, "Error", RL_POD_INFRA_FAILED, "PeerLost"},        /* a collective broke */
        {77, "Error", RL_POD_INFRA_FAILED, "Infrastructure"},  /* network, storage, device */
        {137, "OOMKilled", RL_POD_INFRA_FAILED, "OOMKilled"},  /* the kernel's OOM killer */
        {1, "OOMKilled", RL_POD_INFRA_FAILED, "OOMKilled"},    /* whatever the status */
        {137, "Error", RL_POD_FAILED, "Error"},                /* SIGKILL, not by the OOM killer */
        {0, "OOMKilled", RL_POD_SUCCEEDED, "Completed"},       /* done is done */
    };
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        char json[512];
        snprintf(json, sizeof json,
                 "{" META ",\"status\":{\"phase\":\"Failed\",\"containerStatuses\":[{\"name\":\"worker\","
                 "\"state\":{\"terminated\":{\"exitCode\":%d,\"reason\":\"%s\"}}}]}}",
                 ends[i].code, ends[i].treason);
        cr_expect_eq(classify(json, &p), ends[i].state, "exit %d %s: %s", ends[i].code, ends[i].treason,
                     rl_pod_state_name(p.state));
        cr_expect_str_eq(p.reason, ends[i].reason, "exit %d %s", ends[i].code, ends[i].treason);
    }
    /* the worker's own words: the last line of its termination message */
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Failed\",\"containerStatuses\":[{\"name\":\"worker\","
                          "\"state\":{\"terminated\":{\"exitCode\":2,\"reason\":\"Error\",\"message\":"
                          "\"loading\\nUserError: data.train: no file matches /x/none_*.bin\\n\"}}}]}}", &p),
                 RL_POD_USER_ERROR);
    cr_expect_str_eq(p.message, "container exited with status 2: Error: UserError: data.train: no file matches /x/none_*.bin");
    /* evicted by the kubelet, or a disruption (preemption, node drain) */
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Failed\",\"reason\":\"Evicted\",\"message\":\"low on memory\"}}", &p),
                 RL_POD_PREEMPTED);
    cr_expect_str_eq(p.reason, "Evicted");
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Failed\",\"conditions\":[{\"type\":\"DisruptionTarget\","
                          "\"status\":\"True\",\"reason\":\"PreemptionByScheduler\"}]," TERM(137, "Error") "}}", &p),
                 RL_POD_PREEMPTED);
    cr_expect_str_eq(p.reason, "PreemptionByScheduler");
    /* deleted, then ended with an error: the deletion stopped it */
    cr_expect_eq(classify("{\"metadata\":{\"name\":\"x\",\"deletionTimestamp\":\"2026-01-01T00:00:00Z\"},"
                          "\"status\":{\"phase\":\"Failed\"," TERM(1, "Error") "}}", &p), RL_POD_PREEMPTED);
    cr_expect_str_eq(p.reason, "Deleted");
    /* of any class: a deleted pod's user error or infrastructure failure is the deletion's doing */
    cr_expect_eq(classify("{\"metadata\":{\"name\":\"x\",\"deletionTimestamp\":\"2026-01-01T00:00:00Z\"},"
                          "\"status\":{\"phase\":\"Failed\"," TERM(2, "Error") "}}", &p), RL_POD_PREEMPTED);
    cr_expect_str_eq(p.reason, "Deleted");
    cr_expect_eq(classify("{\"metadata\":{\"name\":\"x\",\"deletionTimestamp\":\"2026-01-01T00:00:00Z\"},"
                          "\"status\":{\"phase\":\"Failed\"," TERM(137, "OOMKilled") "}}", &p), RL_POD_PREEMPTED);
    cr_expect_str_eq(p.reason, "Deleted");
    /* checkpointed on the deletion's SIGTERM: its own reason stays */
    cr_expect_eq(classify("{\"metadata\":{\"name\":\"x\",\"deletionTimestamp\":\"2026-01-01T00:00:00Z\"},"
                          "\"status\":{\"phase\":\"Failed\"," TERM(75, "Error") "}}", &p), RL_POD_PREEMPTED);
    cr_expect_str_eq(p.reason, "Preempted");
    /* waiting: why, as the kubelet says */
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Pending\",\"containerStatuses\":[{\"name\":\"worker\",\"state\":{\"waiting\":"
                          "{\"reason\":\"ErrImagePull\",\"message\":\"not found\"}}}]}}", &p), RL_POD_PENDING);
    cr_expect_str_eq(p.reason, "ErrImagePull");
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Pending\",\"conditions\":[{\"type\":\"PodScheduled\","
                          "\"status\":\"False\",\"reason\":\"Unschedulable\",\"message\":\"0/3 nodes\"}]}}", &p), RL_POD_PENDING);
    cr_expect_str_eq(p.reason, "Unschedulable");
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Running\",\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\"}]}}", &p),
                 RL_POD_RUNNING);
    cr_expect(p.ready);
    cr_expect_eq(classify("{\"metadata\":{\"name\":\"x\",\"deletionTimestamp\":\"2026-01-01T00:00:00Z\"},"
                          "\"status\":{\"phase\":\"Running\"}}", &p), RL_POD_TERMINATING);
    cr_expect_eq(p.index, -1);
    /* garbage never crashes */
    cr_expect_eq(classify("{\"status\":7,\"metadata\":[]}", &p), RL_POD_PENDING);
}

/* A service mesh's proxy beside the worker: the kubelet sorts
 * containerStatuses by name, so istio-proxy (or any "aaa-proxy") comes
 * first; how the pod stands is the worker's, found by name. */
#define PROXY_RUNNING "{\"name\":\"istio-proxy\",\"state\":{\"running\":{}}}"
Test(operator, sidecars_sorted_before_the_worker) {
    rl_pod_info p;
    /* the worker failed, the proxy runs on: the pod is still Running, and ended */
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Running\",\"containerStatuses\":[" PROXY_RUNNING ","
                          "{\"name\":\"worker\",\"state\":{\"terminated\":{\"exitCode\":3,\"reason\":\"Error\"}}}]}}", &p),
                 RL_POD_FAILED);
    cr_expect(strstr(p.message, "container exited with status 3"), "%s", p.message);
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Running\",\"containerStatuses\":[" PROXY_RUNNING ","
                          "{\"name\":\"worker\",\"state\":{\"terminated\":{\"exitCode\":0,\"reason\":\"Completed\"}}}]}}", &p),
                 RL_POD_SUCCEEDED);
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Running\",\"containerStatuses\":[" PROXY_RUNNING ","
                          "{\"name\":\"worker\",\"state\":{\"terminated\":{\"exitCode\":75}}}]}}", &p),
                 RL_POD_PREEMPTED);
    /* a proxy that ended 0 before the worker's OOM kill is not the job's success */
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Failed\",\"containerStatuses\":["
                          "{\"name\":\"aaa-proxy\",\"state\":{\"terminated\":{\"exitCode\":0,\"reason\":\"Completed\"}}},"
                          "{\"name\":\"worker\",\"state\":{\"terminated\":{\"exitCode\":137,\"reason\":\"OOMKilled\"}}}]}}", &p),
                 RL_POD_INFRA_FAILED);
    cr_expect_str_eq(p.reason, "OOMKilled");
    /* waiting: the worker's reason, not the running proxy's silence */
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Pending\",\"containerStatuses\":[" PROXY_RUNNING ","
                          "{\"name\":\"worker\",\"state\":{\"waiting\":{\"reason\":\"CreateContainerConfigError\","
                          "\"message\":\"secret \\\"s3\\\" not found\"}}}]}}", &p),
                 RL_POD_PENDING);
    cr_expect_str_eq(p.reason, "CreateContainerConfigError");
    /* a native sidecar (an init container, restartPolicy Always) that cannot
     * start holds the worker in PodInitializing: its reason is the pod's */
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Pending\",\"initContainerStatuses\":[{\"name\":\"istio-proxy\","
                          "\"state\":{\"waiting\":{\"reason\":\"ImagePullBackOff\",\"message\":\"Back-off pulling image\"}}}],"
                          "\"containerStatuses\":[{\"name\":\"worker\",\"state\":{\"waiting\":{\"reason\":\"PodInitializing\"}}}]}}",
                          &p),
                 RL_POD_PENDING);
    cr_expect_str_eq(p.reason, "ImagePullBackOff");
    cr_expect_str_eq(p.message, "init container istio-proxy: Back-off pulling image");
    /* running with its native sidecar: Running */
    cr_expect_eq(classify("{" META ",\"status\":{\"phase\":\"Running\",\"initContainerStatuses\":[{\"name\":\"istio-proxy\","
                          "\"state\":{\"running\":{}}}],\"containerStatuses\":[{\"name\":\"worker\",\"state\":{\"running\":{}}}],"
                          "\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\"}]}}", &p),
                 RL_POD_RUNNING);
    cr_expect(p.ready);
}

/* ---- a hang the rank-0 agent diagnosed (decide.c: condition Hung, status.lastHang) ---------- */
#define HUNG "rank 1 (pod llama-1, node gpu-12) stopped responding in allreduce #1580 (last heartbeat 2.1 s ago)"
#define DUMP "s3://bucket/prefix/hangs/r3-seq1580.json"
#define HUNG_ANN(round, hung_round)                                                                        \
    "{" round "\"ringleader.dev/hung\":\"" HUNG "\",\"ringleader.dev/hung-round\":\"" hung_round "\","  \
    "\"ringleader.dev/hung-dump\":\"" DUMP "\",\"ringleader.dev/hung-time\":\"2026-11-26T11:59:58Z\"}"

typedef struct {
    cJSON *st;                /* the status last written (owned) */
    int hung, recovered;      /* Events Hung, HangRecovered */
    int degraded;             /* Events Degraded */
    bool hung_warning, recovered_warning;
    char msg[1024];           /* the last of the two's message */
} hang_pass;

/* One reconcile of a running 2-node job (status: the last one's, or NULL)
 * whose progress Lease has the annotations ann (JSON; NULL: none). */
static hang_pass reconcile_hang(const char *ann, const cJSON *status, int restart_limit, rl_pod_state second) {
    rl_op_job j;
    memset(&j, 0, sizeof j);
    snprintf(j.name, sizeof j.name, "llama");
    snprintf(j.ns, sizeof j.ns, "ml");
    snprintf(j.clean_policy, sizeof j.clean_policy, "None");
    j.replicas = j.min_nodes = j.max_nodes = 2;
    j.restart_limit = restart_limit;
    rl_pod_info pods[2];
    memset(pods, 0, sizeof pods);
    for (int i = 0; i < 2; i++) {
        pods[i].index = i, pods[i].state = i ? second : RL_POD_RUNNING, pods[i].ready = true;
        snprintf(pods[i].name, sizeof pods[i].name, "llama-%d", i);
        snprintf(pods[i].uid, sizeof pods[i].uid, "u-pod-%d", i);
    }
    cJSON *progress = ann ? cJSON_Parse(ann) : NULL;
    cr_assert(!ann || progress, "fixture does not parse: %s", ann);
    rl_op_seen s = {.job = &j, .pods = pods, .n = 2, .conflict = "", .progress = progress, .stuck_s = 60,
                    .now = "2026-11-26T12:00:00Z"};
    rl_op_plan p;
    rl_op_decide(&s, status, &p);
    if (p.then_phase) rl_op_decide_phase(&s, 0, "", &p);
    hang_pass r = {0};
    for (int i = 0; i < p.n; i++) {
        const rl_op_step *x = &p.steps[i];
        if (x->kind == RL_OP_WRITE) {
            cJSON_Delete(r.st);
            r.st = cJSON_Duplicate(x->status, 1);
        }
        bool hung = x->kind == RL_OP_EVENT && !strcmp(x->reason, "Hung");
        bool back = x->kind == RL_OP_EVENT && !strcmp(x->reason, "HangRecovered");
        if (hung) r.hung++, r.hung_warning = x->warning;
        if (back) r.recovered++, r.recovered_warning = x->warning;
        if (hung || back) snprintf(r.msg, sizeof r.msg, "%s", x->msg);
        r.degraded += x->kind == RL_OP_EVENT && !strcmp(x->reason, "Degraded") && x->warning;
    }
    cr_assert(r.st, "no status written");
    rl_op_plan_free(&p);
    cJSON_Delete(progress);
    return r;
}

static const char *cond_field(const cJSON *st, const char *type, const char *field) {
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(st, "conditions");
    for (const cJSON *c = cs ? cs->child : NULL; c; c = c->next)
        if (!strcmp(rl_op_jstr(c, "type"), type)) return rl_op_jstr(c, field);
    return NULL;
}

static const char *hung_field(const cJSON *st, const char *field) { return cond_field(st, "Hung", field); }

/* The pre-flight's verdict (ringleader.dev/degraded) as condition Degraded,
 * and stragglers (ringleader.dev/stragglers) as status.stragglers. */
Test(operator, degraded_and_stragglers_follow_the_annotations) {
#define SLOWR "rank 2 (pod llama-1, node n1): copy 1.2 GB/s, 0.30x the median 4.0 GB/s"
    hang_pass a = reconcile_hang("{\"ringleader.dev/degraded\":\"\",\"ringleader.dev/stragglers\":\"\"}", NULL, 3,
                                 RL_POD_RUNNING);
    cr_expect_null(cond_field(a.st, "Degraded", "status"), "a job never degraded has no condition");
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(a.st, "stragglers"));
    hang_pass b = reconcile_hang("{\"ringleader.dev/degraded\":\"" SLOWR "\",\"ringleader.dev/stragglers\":\"rank 2 "
                                 "is a straggler\"}",
                                 a.st, 3, RL_POD_RUNNING);
    cr_expect_str_eq(cond_field(b.st, "Degraded", "status"), "True");
    cr_expect_str_eq(cond_field(b.st, "Degraded", "reason"), "PreflightBelowMedian");
    cr_expect_str_eq(cond_field(b.st, "Degraded", "message"), SLOWR);
    cr_expect_eq(b.degraded, 1);
    cr_expect_str_eq(rl_op_jstr(b.st, "stragglers"), "rank 2 is a straggler");
    hang_pass c = reconcile_hang("{\"ringleader.dev/degraded\":\"" SLOWR "\"}", b.st, 3, RL_POD_RUNNING);
    cr_expect_eq(c.degraded, 0, "one event per transition");
    hang_pass d = reconcile_hang("{\"ringleader.dev/degraded\":\"\",\"ringleader.dev/stragglers\":\"\"}", c.st, 3,
                                 RL_POD_RUNNING);
    cr_expect_str_eq(cond_field(d.st, "Degraded", "status"), "False");
    cr_expect_str_eq(cond_field(d.st, "Degraded", "reason"), "PreflightPassed");
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(d.st, "stragglers"), "none now: the field goes");
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(d.st, "lastRecovery"));
    hang_pass r = reconcile_hang("{\"ringleader.dev/recovery-round\":\"4\",\"ringleader.dev/recovery-seconds\":"
                                 "\"10.4567\",\"ringleader.dev/recovery-steps-lost\":\"13\"}",
                                 d.st, 3, RL_POD_RUNNING);
    cr_expect_eq(cJSON_GetNumberValue(rl_test_json_path(r.st, "lastRecovery.round")), 4);
    cr_expect_float_eq(cJSON_GetNumberValue(rl_test_json_path(r.st, "lastRecovery.seconds")), 10.457, 1e-9);
    cr_expect_eq(cJSON_GetNumberValue(rl_test_json_path(r.st, "lastRecovery.stepsLost")), 13);
    hang_pass g = reconcile_hang("{\"ringleader.dev/recovery-round\":\"5\",\"ringleader.dev/recovery-seconds\":"
                                 "\"nan\",\"ringleader.dev/recovery-steps-lost\":\"1\"}",
                                 r.st, 3, RL_POD_RUNNING);
    cr_expect_eq(cJSON_GetNumberValue(rl_test_json_path(g.st, "lastRecovery.round")), 4, "garbage keeps the last");
    cJSON_Delete(r.st), cJSON_Delete(g.st);
    cJSON_Delete(a.st), cJSON_Delete(b.st), cJSON_Delete(c.st), cJSON_Delete(d.st);
#undef SLOWR
}

Test(operator, a_hang_is_a_condition_an_event_and_status_last_hang) {
    hang_pass a = reconcile_hang(HUNG_ANN("\"ringleader.dev/round\":\"3\",", "3"), NULL, 3, RL_POD_RUNNING);
    cr_expect_str_eq(hung_field(a.st, "status"), "True");
    cr_expect_str_eq(hung_field(a.st, "reason"), "CollectiveHung");
    cr_expect_str_eq(hung_field(a.st, "message"), HUNG " (records: " DUMP ")");
    cr_expect_eq(a.hung, 1);
    cr_expect(a.hung_warning);
    cr_expect_str_eq(a.msg, HUNG);
    const cJSON *lh = cJSON_GetObjectItemCaseSensitive(a.st, "lastHang");
    cr_expect_str_eq(rl_op_jstr(lh, "message"), HUNG);
    cr_expect_eq(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(lh, "round")), 3);
    cr_expect_str_eq(rl_op_jstr(lh, "dump"), DUMP);
    cr_expect_str_eq(rl_op_jstr(lh, "time"), "2026-11-26T11:59:58Z");
    cr_expect_str_eq(rl_op_jstr(a.st, "phase"), "Running", "a hang is not a phase");

    /* the same annotations again: no second Event, the transition time kept */
    hang_pass b = reconcile_hang(HUNG_ANN("\"ringleader.dev/round\":\"3\",", "3"), a.st, 3, RL_POD_RUNNING);
    cr_expect_eq(b.hung, 0);
    cr_expect_str_eq(hung_field(b.st, "status"), "True");
    cr_expect_str_eq(hung_field(b.st, "lastTransitionTime"), hung_field(a.st, "lastTransitionTime"));

    /* the next round: recovered, the sentence still readable */
    hang_pass c = reconcile_hang(HUNG_ANN("\"ringleader.dev/round\":\"4\",", "3"), b.st, 3, RL_POD_RUNNING);
    cr_expect_str_eq(hung_field(c.st, "status"), "False");
    cr_expect_str_eq(hung_field(c.st, "reason"), "Recovered");
    cr_expect_str_eq(hung_field(c.st, "message"), "recovered in round 4: " HUNG);
    cr_expect_eq(c.hung, 0);
    cr_expect_eq(c.recovered, 1);
    cr_expect(!c.recovered_warning);
    cr_expect_str_eq(c.msg, "recovered in round 4: " HUNG);
    cr_expect_eq(cJSON_GetNumberValue(rl_test_json_path(c.st, "lastHang.round")), 3);
    hang_pass d = reconcile_hang(HUNG_ANN("\"ringleader.dev/round\":\"5\",", "3"), c.st, 3, RL_POD_RUNNING);
    cr_expect_eq(d.hung + d.recovered, 0, "recovered once");
    cr_expect_str_eq(hung_field(d.st, "message"), "recovered in round 5: " HUNG);

    /* no round reported yet: still hung; no dump written: no "(records: ...)" */
    hang_pass e = reconcile_hang("{\"ringleader.dev/hung\":\"" HUNG "\",\"ringleader.dev/hung-round\":\"0\"}", NULL,
                                 3, RL_POD_RUNNING);
    cr_expect_str_eq(hung_field(e.st, "status"), "True");
    cr_expect_str_eq(hung_field(e.st, "message"), HUNG);
    cr_expect_str_eq(rl_test_json_path(e.st, "lastHang.dump")->valuestring, "");
    cJSON_Delete(a.st), cJSON_Delete(b.st), cJSON_Delete(c.st), cJSON_Delete(d.st), cJSON_Delete(e.st);
}

Test(operator, no_hang_no_hung_condition) {
    static const char *const anns[] = {
        NULL,
        "{\"ringleader.dev/round\":\"3\",\"ringleader.dev/step\":\"120\"}",
        "{\"ringleader.dev/hung\":\"\",\"ringleader.dev/hung-round\":\"3\"}",
        "{\"ringleader.dev/hung\":7,\"ringleader.dev/hung-round\":\"3\"}", /* not a string: no sentence */
    };
    for (size_t i = 0; i < sizeof anns / sizeof anns[0]; i++) {
        hang_pass r = reconcile_hang(anns[i], NULL, 3, RL_POD_RUNNING);
        cr_expect_null(hung_field(r.st, "status"), "%s", anns[i] ? anns[i] : "(no Lease)");
        cr_expect_null(cJSON_GetObjectItemCaseSensitive(r.st, "lastHang"));
        cr_expect_eq(r.hung + r.recovered, 0);
        cJSON_Delete(r.st);
    }
}

/* Garbage rounds are unknown: never Recovered, never a failed reconcile,
 * never a round in the status the API server would refuse. */
Test(operator, garbage_hang_annotations) {
    static const struct {
        const char *round, *hung_round;
    } cases[] = {
        {"\"ringleader.dev/round\":\"9\",", "x3"},
        {"\"ringleader.dev/round\":\"9\",", ""},
        {"\"ringleader.dev/round\":\"9\",", "-1"},
        {"\"ringleader.dev/round\":\"9\",", "3.5"},
        {"\"ringleader.dev/round\":\"9\",", " 3"},
        {"\"ringleader.dev/round\":\"1e999\",", "99999999999999999999999"},
        {"\"ringleader.dev/round\":\"abc\",", "3"},
        {"\"ringleader.dev/round\":\"4x\",", "3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char ann[1024];
        snprintf(ann, sizeof ann,
                 "{%s\"ringleader.dev/hung\":\"" HUNG "\",\"ringleader.dev/hung-round\":\"%s\","
                 "\"ringleader.dev/hung-time\":\"yesterday\"}",
                 cases[i].round, cases[i].hung_round);
        hang_pass r = reconcile_hang(ann, NULL, 3, RL_POD_RUNNING);
        cr_expect_str_eq(hung_field(r.st, "status"), "True", "%s", ann);
        cr_expect_str_eq(hung_field(r.st, "reason"), "CollectiveHung", "%s", ann);
        cr_expect_eq(r.hung, 1, "%s", ann);
        cr_expect_eq(r.recovered, 0, "%s", ann);
        const cJSON *round = rl_test_json_path(r.st, "lastHang.round");
        cr_expect(!round || cJSON_GetNumberValue(round) == 3, "%s", ann);
        cr_expect_str_eq(rl_test_json_path(r.st, "lastHang.time")->valuestring, "yesterday");
        cJSON_Delete(r.st);
    }
    /* a sentence far past the ~500 bytes agreed: cut, never in a character's middle */
    char ann[8192] = "{\"ringleader.dev/hung\":\"x";
    for (int i = 0; i < 1000; i++) strcat(ann, "\u00e9");
    strcat(ann, "\",\"ringleader.dev/hung-round\":\"2\"}");
    hang_pass r = reconcile_hang(ann, NULL, 3, RL_POD_RUNNING);
    const char *msg = hung_field(r.st, "message");
    cr_expect(strlen(msg) > 500 && strlen(msg) <= 600, "%zu bytes", strlen(msg));
    cr_expect_eq(strlen(msg) % 2, 1, "x, then whole 2-byte characters");
    cr_expect_str_eq(r.msg, msg);
    cJSON_Delete(r.st);
}

/* Nothing is read after the job ends: a hang seen as it fails stays named. */
Test(operator, a_hang_seen_as_the_job_fails_stays_in_the_status) {
    hang_pass r = reconcile_hang(HUNG_ANN("\"ringleader.dev/round\":\"3\",", "3"), NULL, 0, RL_POD_FAILED);
    cr_expect_str_eq(rl_op_jstr(r.st, "phase"), "Failed");
    cr_expect_str_eq(hung_field(r.st, "status"), "True");
    cr_expect_str_eq(rl_test_json_path(r.st, "lastHang.message")->valuestring, HUNG);
    cr_expect_eq(r.hung, 1);
    cJSON_Delete(r.st);
}
