/* `ringleader-operator render` prints exactly what the operator creates:
 * the same job created on the stand-in and reconciled once, every object
 * render printed is there, equal in every field render set (the API adds
 * defaults and metadata; only the job's uid and the rendezvous secret are
 * placeholders). The examples' render -- schemas, Pod Security, refusals --
 * is checked by tests/manifests/check.py (test_manifests.c). */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/k8s.h"
#include "operator/operator.h"
#include "standin.h"
#include "testutil.h"

#define JOB                                                                                                      \
    "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"look\"},"     \
    "\"spec\":{\"image\":\"ringleader:test\",\"replicas\":2,\"metricsPort\":0,"                                 \
    "\"env\":[{\"name\":\"OMP_NUM_THREADS\",\"value\":\"1\"}],"                                                  \
    "\"training\":{\"train\":{\"steps\":10,\"warmup_steps\":1}}}}"

/* A scalar as text: our YAML reader gives every scalar as a string. */
static char *text_of(const cJSON *v) {
    if (cJSON_IsString(v)) return strdup(v->valuestring);
    return cJSON_PrintUnformatted(v);
}

/* Every member of want is in got with the same value; what differs only by
 * placeholder (the owner's uid, the secret) is skipped, and the server may
 * append to volumes and volumeMounts (the ServiceAccount admission plugin's
 * token volume). path: for messages. */
static void subset(const cJSON *want, const cJSON *got, const char *path) {
    if (cJSON_IsObject(want)) {
        cr_assert(cJSON_IsObject(got), "%s: not an object on the server", path);
        for (const cJSON *m = want->child; m; m = m->next) {
            bool secret = !strncmp(path, "Secret/", 7) && !strcmp(m->string, "data");
            if (!strcmp(m->string, "uid") || secret) continue;
            char p[512];
            snprintf(p, sizeof p, "%s.%s", path, m->string);
            subset(m, cJSON_GetObjectItemCaseSensitive(got, m->string), p);
        }
    } else if (cJSON_IsArray(want)) {
        const char *leaf = strrchr(path, '.');
        bool appended = leaf && (!strcmp(leaf, ".volumes") || !strcmp(leaf, ".volumeMounts"));
        int nw = cJSON_GetArraySize(want), ng = cJSON_IsArray(got) ? cJSON_GetArraySize(got) : -1;
        cr_assert(ng == nw || (appended && ng > nw), "%s: %d items rendered, %d on the server", path, nw, ng);
        int i = 0;
        for (const cJSON *w = want->child, *g = got->child; w; w = w->next, g = g->next, i++) {
            char p[512];
            snprintf(p, sizeof p, "%s[%d]", path, i);
            subset(w, g, p);
        }
    } else {
        char *a = text_of(want), *b = got ? text_of(got) : NULL;
        cr_expect(b && !strcmp(a, b), "%s: rendered %s, created %s", path, a, b ? b : "(absent)");
        free(a);
        free(b);
    }
}

static const char *resource_of(const char *kind) {
    static const char *const map[][2] = {{"Service", "services"},          {"Secret", "secrets"},
                                         {"ServiceAccount", "serviceaccounts"}, {"Role", "roles"},
                                         {"RoleBinding", "rolebindings"},  {"Pod", "pods"},
                                         {"PodDisruptionBudget", "poddisruptionbudgets"},
                                         {"NetworkPolicy", "networkpolicies"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i][0], kind)) return map[i][1];
    return NULL;
}

Test(render, what_render_prints_the_operator_creates, .timeout = 60) {
    char *yaml = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_op_render(JOB, strlen(JOB), "job.json", "default", RL_OP_METRICS_NS_DEFAULT, &yaml, &e), RL_OK, "%s", e.msg);
    cJSON *list = NULL;
    cr_assert_eq(rl_k8s_yaml_parse(yaml, strlen(yaml), "render", &list, &e), RL_OK, "%s\n%s", e.msg, yaml);
    const cJSON *items = cJSON_GetObjectItem(list, "items");
    cr_assert_eq(cJSON_GetArraySize(items), 7 + 2, "%s", yaml);

    rl_test_standin s;
    cr_assert_eq(rl_test_standin_start(&s, NULL), 0);
    rl_log_set_level(RL_LOG_ERROR);
    char out[4096];
    cr_assert_eq(rl_test_kubectl(&s, "apply -f manifests/crd.yaml", NULL, out, sizeof out), 0, "%s", out);
    cr_assert_eq(rl_test_kubectl(&s, "apply -f -", JOB, out, sizeof out), 0, "%s", out);
    rl_k8s *k;
    cr_assert_eq(rl_k8s_connect(s.kubeconfig, NULL, &k, &e), RL_OK, "%s", e.msg);
    rl_op *op;
    cr_assert_eq(rl_op_new(k, &op, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_op_reconcile(op, "default", "look", &e), RL_OK, "%s", e.msg);
    const cJSON *it;
    cJSON_ArrayForEach(it, items) {
        const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(it, "kind"));
        const char *gv = cJSON_GetStringValue(cJSON_GetObjectItem(it, "apiVersion"));
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(it, "metadata"), "name"));
        cr_assert(kind && gv && name && resource_of(kind), "an object render should not print: %s", kind);
        char path[512];
        cr_assert_eq(rl_k8s_path(path, sizeof path, gv, "default", resource_of(kind), name, &e), RL_OK);
        cJSON *got = NULL;
        long code = 0;
        cr_expect_eq(rl_k8s_get(k, path, &code, &got, &e), RL_OK, "%s %s was not created: %s", kind, name, e.msg);
        if (got) {
            char where[128];
            snprintf(where, sizeof where, "%s/%s", kind, name);
            subset(it, got, where);
        }
        cJSON_Delete(got);
    }
    rl_op_free(op);
    rl_k8s_free(k);
    rl_test_standin_stop(&s);
    cJSON_Delete(list);
    free(yaml);
}

Test(render, refusals_name_the_file_and_field) {
    const char *bad = "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"x\"},"
                      "\"spec\":{\"image\":\"i\",\"replicas\":2,\"elastic\":{\"minReplicas\":3,\"maxReplicas\":2}}}";
    char *yaml = NULL;
    rl_err e = {0};
    cr_expect_eq(rl_op_render(bad, strlen(bad), "bad.json", NULL, "", &yaml, &e), RL_EINPUT);
    cr_expect(yaml == NULL);
    cr_expect(strstr(e.msg, "bad.json") && strstr(e.msg, "spec.elastic.maxReplicas"), "%s", e.msg);
    const char *none = "---\n# only a comment\n---\n{\"apiVersion\":\"v1\",\"kind\":\"Secret\",\"metadata\":{\"name\":\"s\"}}\n";
    cr_expect_eq(rl_op_render(none, strlen(none), "none.yaml", NULL, "", &yaml, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "none.yaml: no TrainingJob"), "%s", e.msg);
    const char *latin1 = "kind: TrainingJob\nmetadata: {name: caf\xe9}\n";
    cr_expect_eq(rl_op_render(latin1, strlen(latin1), "l1.yaml", NULL, "", &yaml, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "l1.yaml: line 2: not UTF-8"), "%s", e.msg);
    /* what JSON's printer leaves raw but YAML refuses (DEL, a C1 control,
     * U+FFFE) is escaped, and reads back the same */
    const char *odd = "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"x\"},"
                      "\"spec\":{\"image\":\"a\\u007fb\\u0085c\\ufffed\\\"e\",\"replicas\":1}}";
    cr_assert_eq(rl_op_render(odd, strlen(odd), "odd.json", NULL, "", &yaml, &e), RL_OK, "%s", e.msg);
    cJSON *back = NULL;
    cr_assert_eq(rl_k8s_yaml_parse(yaml, strlen(yaml), "rendered", &back, &e), RL_OK, "%s\n%s", e.msg, yaml);
    const cJSON *pod = cJSON_GetArrayItem(cJSON_GetObjectItem(back, "items"), 7); /* after the job's 7 objects */
    const cJSON *c0 = cJSON_GetArrayItem(rl_test_json_path(pod, "spec.containers"), 0);
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(c0, "image")), "a\x7f" "b\xc2\x85" "c\xef\xbf\xbe" "d\"e");
    cJSON_Delete(back);
    free(yaml);
    /* keys past YAML's 1024 characters for an implicit key (fuzz_render
     * found one) are written as explicit keys, also first in a list item */
    char longk[1201], big[4096];
    memset(longk, 'k', 1200);
    longk[1200] = '\0';
    snprintf(big, sizeof big,
             "{\"apiVersion\":\"ringleader.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"x\"},"
             "\"spec\":{\"image\":\"i\",\"replicas\":1,\"nodeSelector\":{\"%s\":\"v\"},"
             "\"topologySpreadConstraints\":[{\"%s\":1,\"maxSkew\":1}]}}", longk, longk);
    cr_assert_eq(rl_op_render(big, strlen(big), "long.json", NULL, "", &yaml, &e), RL_OK, "%s", e.msg);
    back = NULL;
    cr_assert_eq(rl_k8s_yaml_parse(yaml, strlen(yaml), "rendered", &back, &e), RL_OK, "%s", e.msg);
    pod = cJSON_GetArrayItem(cJSON_GetObjectItem(back, "items"), 7);
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(rl_test_json_path(pod, "spec.nodeSelector"), longk)), "v");
    const cJSON *tsc = cJSON_GetArrayItem(rl_test_json_path(pod, "spec.topologySpreadConstraints"), 0);
    const cJSON *lk = cJSON_GetObjectItem(tsc, longk);
    cr_expect(lk && (cJSON_GetNumberValue(lk) == 1 || !strcmp(cJSON_GetStringValue(lk) ? cJSON_GetStringValue(lk) : "", "1")),
              "%s", yaml);
    cJSON_Delete(back);
    free(yaml);
    /* several documents: the TrainingJobs among them, in one List */
    char two[2048];
    snprintf(two, sizeof two, "%s\n---\n%s\n", none, JOB);
    cr_assert_eq(rl_op_render(two, strlen(two), "two.yaml", NULL, "", &yaml, &e), RL_OK, "%s", e.msg);
    cr_expect(strstr(yaml, "kind: \"List\"") && strstr(yaml, "name: \"look-1\""), "%s", yaml);
    free(yaml);
}
