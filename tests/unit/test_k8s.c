/* k8s: the parsers on their own (YAML, kubeconfig files, exec plugin
 * configs and their ExecCredential answers, Status lines, watch lines and
 * events, times, Lease and EndpointSlice views). The client against the
 * local API stand-in, and KUBECONFIG lists checked against the real
 * kubectl, are in tests/integration/test_k8s_standin.c. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k8s/k8s.h"
#include "standin.h" /* rl_test_json_path */
#include "testutil.h"

/* ---- YAML ----------------------------------------------------------------------------- */
static const char *KUBECTL_STYLE =
    "apiVersion: v1\n"
    "clusters:\n"
    "- cluster:\n"
    "    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCmFiYwo=\n"
    "    server: https://10.0.0.1:6443   # the API\n"
    "  name: prod\n"
    "- cluster:\n"
    "    certificate-authority: certs/ca.crt\n"
    "    server: \"https://127.0.0.1:8443/\"\n"
    "  name: 'local # not a comment'\n"
    "contexts:\n"
    "- context:\n"
    "    cluster: prod\n"
    "    user: alice\n"
    "  name: prod-ctx\n"
    "- context:\n"
    "    cluster: 'local # not a comment'\n"
    "    namespace: ml\n"
    "    user: bob\n"
    "  name: local\n"
    "current-context: local\n"
    "kind: Config\n"
    "preferences: {}\n"
    "# a comment line\n"
    "users:\n"
    "- name: alice\n"
    "  user:\n"
    "    token: \"abc\\u00e9\"\n"
    "- name: bob\n"
    "  user:\n"
    "    tokenFile: /var/run/tok\n"
    "    extra: ~\n";

Test(k8s_yaml, kubectl_style_document) {
    cJSON *j = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_yaml_parse(KUBECTL_STYLE, strlen(KUBECTL_STYLE), "kc", &j, &e), RL_OK,
                 "%s", e.msg);
    char *s = cJSON_PrintUnformatted(j);
    cr_assert_str_eq(
        s,
        "{\"apiVersion\":\"v1\",\"clusters\":[{\"cluster\":{\"certificate-authority-data\":"
        "\"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCmFiYwo=\",\"server\":\"https://10.0.0.1:6443\"},"
        "\"name\":\"prod\"},{\"cluster\":{\"certificate-authority\":\"certs/ca.crt\",\"server\":"
        "\"https://127.0.0.1:8443/\"},\"name\":\"local # not a comment\"}],\"contexts\":[{"
        "\"context\":{\"cluster\":\"prod\",\"user\":\"alice\"},\"name\":\"prod-ctx\"},{\"context\":"
        "{\"cluster\":\"local # not a comment\",\"namespace\":\"ml\",\"user\":\"bob\"},\"name\":"
        "\"local\"}],\"current-context\":\"local\",\"kind\":\"Config\",\"preferences\":{},"
        "\"users\":[{\"name\":\"alice\",\"user\":{\"token\":\"abc\xc3\xa9\"}},{\"name\":\"bob\","
        "\"user\":{\"tokenFile\":\"/var/run/tok\",\"extra\":null}}]}");
    free(s);
    cJSON_Delete(j);
}

Test(k8s_yaml, indented_sequences_nesting_and_quotes) {
    const char *y = "---\na:\n  - x\n  - 'it''s'\n  -\n    - 1\n    - k: v\n      k2: \"q\\\"\"\nb: []\n";
    cJSON *j = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_yaml_parse(y, strlen(y), "t", &j, &e), RL_OK, "%s", e.msg);
    char *s = cJSON_PrintUnformatted(j);
    cr_assert_str_eq(s, "{\"a\":[\"x\",\"it's\",[\"1\",{\"k\":\"v\",\"k2\":\"q\\\"\"}]],\"b\":[]}");
    free(s);
    cJSON_Delete(j);
    const char *js = " {\"a\": true}";
    cr_assert_eq(rl_k8s_yaml_parse(js, strlen(js), "t", &j, &e), RL_OK, "%s", e.msg);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "a")));
    cJSON_Delete(j);
}

Test(k8s_yaml, refusals_name_the_line) {
    struct {
        const char *doc, *want;
    } bad[] = {
        {"a: 1\n\tb: 2\n", "line 2: "},
        {"a:\n  b: 1\n c: 2\n", "line 3: "},
        {"a: 1\na: 2\n", "line 2: duplicate key \"a\""},
        {"a: {b: 1, \"b\": 2}\n", "line 1: duplicate key \"b\""},
        {"a: \"open\n", "line 2: found unexpected end of stream"},
        {"- a\nb: 1\n", "line 2"},
        {"a: 1\n---\nb: 2\n", "line 2: only one YAML document"},
        {"a: \"\\q\"\n", "line 1: found unknown escape character"},
        {"a: \"x\\0y\"\n", "line 1: a NUL character in a string"},
        {"a: *x\n", "line 1: alias *x names no anchor before it"},
        {"a: &x [1, *x]\n", "line 1: an alias inside the node it names"},
        {"a: !vault secret\n", "line 1: tag !vault is not supported"},
        {"a: !!binary aGk=\n", "tag tag:yaml.org,2002:binary is not supported"},
        {"base: &b {x: 1}\nmore:\n  <<: *b\n", "line 3: merge keys (<<) are not supported"},
        {"? [a, b]\n: c\n", "line 1: a mapping key must be a plain or quoted scalar"},
        {"", "empty document"},
        {"# only a comment\n", "empty document"},
        {"---\n", "empty document"},
        {"{\"a\":", "did not find expected node content"},
        {NULL, NULL}};
    for (int i = 0; bad[i].doc; i++) {
        cJSON *j = NULL;
        rl_err e = {0};
        cr_assert_eq(rl_k8s_yaml_parse(bad[i].doc, strlen(bad[i].doc), "f.yaml", &j, &e),
                     RL_EINPUT, "case %d accepted", i);
        cr_assert_null(j);
        cr_assert(strstr(e.msg, "f.yaml: ") && strstr(e.msg, bad[i].want) && !strchr(e.msg, '\n'),
                  "case %d: %s", i, e.msg);
    }
    /* depth is bounded, not a stack overflow */
    char deep[8000] = "";
    for (int i = 0; i < 200; i++) strcat(deep, "- ");
    strcat(deep, "x\n");
    cJSON *j = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_yaml_parse(deep, strlen(deep), "d", &j, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "nested too deeply"), "%s", e.msg);
    /* aliases are copies: a "billion laughs" is refused, not expanded */
    char laughs[4096] = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
    for (char c = 'b'; c <= 'j'; c++) {
        char line[128];
        snprintf(line, sizeof line, "%c: &%c [*%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c]\n",
                 c, c, c - 1, c - 1, c - 1, c - 1, c - 1, c - 1, c - 1, c - 1, c - 1, c - 1);
        strcat(laughs, line);
    }
    cr_assert_eq(rl_k8s_yaml_parse(laughs, strlen(laughs), "l", &j, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "aliases expand to too many nodes"), "%s", e.msg);
}

/* What gcloud, aws and az write beyond kubectl's own block style. */
Test(k8s_yaml, cloud_cli_forms) {
    const char *y =
        "%YAML 1.1\n"
        "---\n"
        "# written by a cloud CLI\n"
        "\"apiVersion\": v1\n"
        "clusters: [{name: gke_p_z_c, cluster: {server: 'https://34.1.2.3', "
        "certificate-authority-data: \"QUJD\"}}]\n"
        "users:\n"
        "- name: aks\n"
        "  user:\n"
        "    exec: &ex\n"
        "      command: kubelogin   # in PATH\n"
        "      args:\n"
        "        - get-token\n"
        "        - --server-id\n"
        "        - '6dae42f8-4368-4678-94ff-3960e28e3630'\n"
        "      env: null\n"
        "      installHint: |\n"
        "        kubelogin is not installed.\n"
        "          See https://aka.ms/aks/kubelogin\n"
        "      note: >\n"
        "        folded\n"
        "        text\n"
        "- name: copy\n"
        "  user: {exec: *ex}\n"
        "'quoted key': !!str 007\n"
        "...\n";
    cJSON *j = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_yaml_parse(y, strlen(y), "cloud", &j, &e), RL_OK, "%s", e.msg);
    cr_assert_str_eq(rl_test_json_path(j, "apiVersion")->valuestring, "v1");
    const cJSON *cl = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "clusters"), 0);
    cr_assert_str_eq(rl_test_json_path(cl, "cluster.server")->valuestring, "https://34.1.2.3");
    const cJSON *u = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "users"), 0);
    cr_assert_str_eq(rl_test_json_path(u, "user.exec.command")->valuestring, "kubelogin");
    cr_assert_str_eq(cJSON_GetArrayItem(rl_test_json_path(u, "user.exec.args"), 2)->valuestring,
                     "6dae42f8-4368-4678-94ff-3960e28e3630");
    cr_assert(cJSON_IsNull(rl_test_json_path(u, "user.exec.env")));
    cr_assert_str_eq(rl_test_json_path(u, "user.exec.installHint")->valuestring,
                     "kubelogin is not installed.\n  See https://aka.ms/aks/kubelogin\n");
    cr_assert_str_eq(rl_test_json_path(u, "user.exec.note")->valuestring, "folded text\n");
    const cJSON *u2 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "users"), 1);
    cr_assert(cJSON_Compare(rl_test_json_path(u, "user.exec"), rl_test_json_path(u2, "user.exec"), true),
              "the alias is a copy of the anchored node");
    cr_assert_str_eq(cJSON_GetObjectItem(j, "quoted key")->valuestring, "007");
    cJSON_Delete(j);
}

/* ---- kubeconfig ------------------------------------------------------------------- */
Test(k8s_config, kubeconfig_fields_and_relative_paths) {
    rl_k8s_config c;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_config_parse(KUBECTL_STYLE, strlen(KUBECTL_STYLE), "/home/u/.kube/config",
                                     NULL, &c, &e), RL_OK, "%s", e.msg);
    cr_assert_str_eq(c.server, "https://127.0.0.1:8443");
    cr_assert_str_eq(c.ns, "ml");
    cr_assert_str_eq(c.ca_file, "/home/u/.kube/certs/ca.crt");
    cr_assert_str_eq(c.token_file, "/var/run/tok");
    cr_assert_null(c.token);
    rl_k8s_config_free(&c);
    cr_assert_eq(rl_k8s_config_parse(KUBECTL_STYLE, strlen(KUBECTL_STYLE), "kc", "prod-ctx", &c, &e),
                 RL_OK, "%s", e.msg);
    cr_assert_str_eq(c.server, "https://10.0.0.1:6443");
    cr_assert_str_eq(c.ns, "default");
    cr_assert_eq(c.ca_pem_len, 32);
    cr_assert(memcmp(c.ca_pem, "-----BEGIN CERTIFICATE-----\nabc\n", 32) == 0);
    cr_assert_str_eq(c.token, "abc\xc3\xa9");
    cr_assert_eq(c.ca_file[0], '\0');
    rl_k8s_config_free(&c);
}

Test(k8s_config, bad_kubeconfigs_name_file_and_field) {
    const char *head = "clusters:\n- name: c\n  cluster:\n    server: https://h:1\n";
    struct {
        const char *tail, *want;
    } bad[] = {
        {"    insecure-skip-tls-verify: yes\ncontexts:\n- name: x\n  context: {cluster: c}\n"
         "current-context: x\n",
         "clusters[name=c].cluster.insecure-skip-tls-verify: refused"},
        {"    insecure-skip-tls-verify: true\ncontexts:\n- name: x\n  context:\n    cluster: c\n"
         "current-context: x\n",
         "clusters[name=c].cluster.insecure-skip-tls-verify: refused"},
        {"contexts:\n- name: x\n  context:\n    cluster: c\n", "current-context is not set"},
        {"contexts:\n- name: x\n  context:\n    cluster: nope\ncurrent-context: x\n",
         "clusters: no entry named \"nope\""},
        {"contexts:\n- name: x\n  context:\n    cluster: c\ncurrent-context: y\n",
         "contexts: no entry named \"y\""},
        {"contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
         "users:\n- name: u\n  user:\n    auth-provider: {name: gcp}\n",
         "users[name=u].user.auth-provider: not supported"},
        {"contexts:\n- name: x\n  context: {cluster: c}\n- name: x\n  context: {cluster: c}\n",
         "contexts: duplicate name \"x\""},
        {"contexts: [7]\n", "contexts[0]: must be a mapping"},
        {"contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
         "users:\n- name: u\n  user:\n    client-certificate: a.crt\n",
         "client-certificate given without client-key"},
        {"    certificate-authority-data: '@@@'\ncontexts:\n- name: x\n  context:\n    cluster: c\n"
         "current-context: x\n",
         "certificate-authority-data: not valid base64"},
        {"contexts:\n- name: x\n  context:\n    cluster: c\n    namespace: [] \ncurrent-context: x\n",
         "context.namespace: must be a string"},
        {NULL, NULL}};
    for (int i = 0; bad[i].tail; i++) {
        char doc[2048];
        snprintf(doc, sizeof doc, "%s%s", head, bad[i].tail);
        rl_k8s_config c;
        rl_err e = {0};
        cr_assert_eq(rl_k8s_config_parse(doc, strlen(doc), "/etc/kc.yaml", NULL, &c, &e), RL_EINPUT,
                     "case %d accepted", i);
        cr_assert(strstr(e.msg, "/etc/kc.yaml") && strstr(e.msg, bad[i].want), "case %d: %s", i,
                  e.msg);
    }
    /* a JSON kubeconfig with a server that is not a URL */
    const char *js = "{\"clusters\":[{\"name\":\"c\",\"cluster\":{\"server\":\"h:1\"}}],"
                     "\"contexts\":[{\"name\":\"x\",\"context\":{\"cluster\":\"c\"}}],"
                     "\"current-context\":\"x\"}";
    rl_k8s_config c;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_config_parse(js, strlen(js), "k.json", NULL, &c, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "k.json: clusters[name=c].cluster.server: must start with https://"),
              "%s", e.msg);
}

Test(k8s_config, in_cluster_from_env_and_sa_dir) {
    char dir[] = "/tmp/rlk8s-sa-XXXXXX";
    cr_assert(mkdtemp(dir));
    char p[256];
    setenv("RL_K8S_SA_DIR", dir, 1);
    unsetenv("KUBERNETES_SERVICE_HOST");
    rl_k8s_config c;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_config_in_cluster(&c, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "KUBERNETES_SERVICE_HOST"), "%s", e.msg);
    setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
    setenv("KUBERNETES_SERVICE_PORT", "443", 1);
    cr_assert_eq(rl_k8s_config_in_cluster(&c, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "token") && strstr(e.msg, dir), "%s", e.msg);
    snprintf(p, sizeof p, "%s/token", dir);
    rl_test_write(p, "tok\n", 4);
    snprintf(p, sizeof p, "%s/ca.crt", dir);
    rl_test_write(p, "x", 1);
    snprintf(p, sizeof p, "%s/namespace", dir);
    rl_test_write(p, "team-a\n", 7);
    cr_assert_eq(rl_k8s_config_auto(&c, &e), RL_OK, "%s", e.msg);
    cr_assert_str_eq(c.server, "https://[fd00::1]:443");
    cr_assert_str_eq(c.ns, "team-a");
    cr_assert(strstr(c.token_file, "/token"));
    rl_k8s_config_free(&c);
    rl_test_rmdir(dir);
}

/* ---- Status, lines, events -------------------------------------------------------- */
Test(k8s_parse, status_message_line) {
    cJSON *st = cJSON_Parse("{\"kind\":\"Status\",\"status\":\"Failure\",\"message\":"
                            "\"Operation cannot be fulfilled on leases \\\"x\\\": the object has "
                            "been modified\\nplease retry\",\"reason\":\"Conflict\",\"code\":409}");
    char m[512];
    rl_k8s_status_message("PUT", "/apis/coordination.k8s.io/v1/namespaces/d/leases/x?dryRun=All",
                          409, st, m, sizeof m);
    cr_assert_str_eq(m, "PUT leases/x: 409 Conflict: Operation cannot be fulfilled on leases "
                        "\"x\": the object has been modified please retry (reason Conflict)");
    rl_k8s_status_message("GET", "/api", 502, NULL, m, sizeof m);
    cr_assert_str_eq(m, "GET /api: 502 Bad Gateway");
    cJSON_Delete(st);
}

typedef struct collect {
    char all[4096];
    int n;
} collect;
static int on_line(void *ud, const char *line, size_t len) {
    collect *c = ud;
    strncat(c->all, line, len);
    strcat(c->all, "|");
    c->n++;
    return 0;
}

Test(k8s_parse, line_splitter_any_split) {
    const char *stream = "{\"a\":1}\n{\"b\":2}\r\n\n{\"c\":3}\n{\"partial";
    size_t n = strlen(stream);
    for (size_t chunk = 1; chunk <= n; chunk++) {
        rl_http_lines l;
        rl_http_lines_init(&l, 64, "watch stream");
        collect c = {0};
        rl_err e = {0};
        for (size_t off = 0; off < n; off += chunk) {
            size_t k = n - off < chunk ? n - off : chunk;
            cr_assert_eq(rl_http_lines_feed(&l, stream + off, k, on_line, &c, &e), RL_OK);
        }
        cr_assert_str_eq(c.all, "{\"a\":1}|{\"b\":2}|{\"c\":3}|", "chunk %zu", chunk);
        cr_assert_eq(l.len, 9, "the partial line waits for its end");
        rl_http_lines_free(&l);
    }
    rl_http_lines l;
    rl_http_lines_init(&l, 8, "watch stream");
    collect c = {0};
    rl_err e = {0};
    cr_assert_eq(rl_http_lines_feed(&l, "12345", 5, on_line, &c, &e), RL_OK);
    cr_assert_eq(rl_http_lines_feed(&l, "6789\n", 5, on_line, &c, &e), RL_EIO);
    cr_assert(strstr(e.msg, "longer than 8 bytes"), "%s", e.msg);
    rl_http_lines_free(&l);
}

Test(k8s_parse, watch_events) {
    rl_k8s_event ev;
    rl_err e = {0};
    const char *a = "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"x\",\"resourceVersion\":\"17\"}}}";
    cr_assert_eq(rl_k8s_event_parse(a, strlen(a), &ev, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(ev.type, RL_K8S_ADDED);
    cr_assert_str_eq(ev.resource_version, "17");
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(ev.object, "metadata"), "name")->valuestring, "x");
    rl_k8s_event_free(&ev);
    const char *b = "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Lease\",\"metadata\":{\"resourceVersion\":\"99\"}}}";
    cr_assert_eq(rl_k8s_event_parse(b, strlen(b), &ev, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(ev.type, RL_K8S_BOOKMARK);
    cr_assert_str_eq(ev.resource_version, "99");
    rl_k8s_event_free(&ev);
    const char *g = "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410,\"reason\":"
                    "\"Expired\",\"message\":\"too old resource version: 5 (9)\"}}";
    cr_assert_eq(rl_k8s_event_parse(g, strlen(g), &ev, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(ev.type, RL_K8S_ERROR);
    cr_assert_eq(ev.code, 410);
    cr_assert_str_eq(ev.message, "Expired: too old resource version: 5 (9)");
    rl_k8s_event_free(&ev);
    const char *bad[] = {"", "nope", "[]", "{\"type\":\"ADDED\"}", "{\"type\":\"SNAPSHOT\",\"object\":{}}",
                         "{\"type\":\"BOOKMARK\",\"object\":{}}", "{\"type\":7,\"object\":{}}",
                         "{\"type\":\"MODIFIED\",\"object\":{\"metadata\":{\"resourceVersion\":5}}}", NULL};
    for (int i = 0; bad[i]; i++)
        cr_assert_eq(rl_k8s_event_parse(bad[i], strlen(bad[i]), &ev, &e), RL_EINPUT, "%s", bad[i]);
}

/* ---- objects ----------------------------------------------------------------------- */
Test(k8s_objects, microtime_and_lease_round_trip) {
    char ts[64];
    rl_k8s_microtime_format(1136214245.25, ts, sizeof ts);
    cr_assert_str_eq(ts, "2006-01-02T15:04:05.250000Z");
    double t;
    cr_assert_eq(rl_k8s_time_parse("2006-01-02T15:04:05.000001Z", &t), RL_OK);
    cr_assert_float_eq(t, 1136214245.000001, 1e-6);
    cr_assert_eq(rl_k8s_time_parse("2006-01-02T17:04:05+02:00", &t), RL_OK);
    cr_assert_float_eq(t, 1136214245.0, 1e-9);
    const char *bad[] = {"", "2006-01-02", "2006-01-02T15:04:05", "2006-13-02T15:04:05Z",
                         "2006-01-02T15:04:05.Z", "2006-01-02T15:04:05Zjunk", NULL};
    for (int i = 0; bad[i]; i++) cr_assert_eq(rl_k8s_time_parse(bad[i], &t), RL_EINPUT, "%s", bad[i]);

    rl_k8s_lease l = {.name = "job-leader", .resource_version = "42", .holder = "pod-0",
                      .duration_s = 15, .acquire_time = 1700000000.5, .renew_time = 1700000010.123456,
                      .transitions = 3};
    cJSON *o = rl_k8s_lease_build("ml", &l);
    cr_assert_not_null(o);
    rl_k8s_lease r;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_lease_read(o, &r, &e), RL_OK, "%s", e.msg);
    cr_assert_str_eq(r.name, "job-leader");
    cr_assert_str_eq(r.resource_version, "42");
    cr_assert_str_eq(r.holder, "pod-0");
    cr_assert_eq(r.duration_s, 15);
    cr_assert_eq(r.transitions, 3);
    cr_assert_float_eq(r.acquire_time, 1700000000.5, 1e-6);
    cr_assert_float_eq(r.renew_time, 1700000010.123456, 1e-6);
    char *s = cJSON_PrintUnformatted(cJSON_GetObjectItem(o, "spec"));
    cr_assert(strstr(s, "\"renewTime\":\"2023-11-14T22:13:30.123456Z\""), "%s", s);
    free(s);
    cJSON_Delete(o);
    /* a Lease edited by hand into nonsense */
    const char *junk[] = {
        "{\"metadata\":{\"name\":\"x\"},\"spec\":{\"leaseDurationSeconds\":\"15\"}}",
        "{\"metadata\":{\"name\":\"x\"},\"spec\":{\"renewTime\":\"yesterday\"}}",
        "{\"metadata\":{\"name\":\"x\"},\"spec\":{\"holderIdentity\":7}}",
        "{\"metadata\":{\"name\":\"x\"},\"spec\":[]}", "{\"spec\":{}}", NULL};
    const char *field[] = {"spec.leaseDurationSeconds", "spec.renewTime", "spec.holderIdentity",
                           "spec: must be", "metadata missing"};
    for (int i = 0; junk[i]; i++) {
        cJSON *j = cJSON_Parse(junk[i]);
        cr_assert_eq(rl_k8s_lease_read(j, &r, &e), RL_EINPUT, "%s", junk[i]);
        cr_assert(strstr(e.msg, field[i]), "%s", e.msg);
        cJSON_Delete(j);
    }
}

Test(k8s_objects, endpoint_defaults_and_paths) {
    cJSON *s = cJSON_Parse(
        "{\"metadata\":{\"name\":\"svc-abc\"},\"endpoints\":["
        "{\"addresses\":[\"127.0.0.2\"],\"hostname\":\"job-0\",\"targetRef\":{\"kind\":\"Pod\",\"name\":\"job-0\"}},"
        "{\"addresses\":[\"127.0.0.3\"],\"conditions\":{\"ready\":false,\"terminating\":true},\"zone\":\"z\"},"
        "{\"addresses\":[]}]}");
    rl_k8s_endpoint ep[4];
    int n = 0;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_endpointslice_endpoints(s, ep, 4, &n, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(ep[0].address, "127.0.0.2");
    cr_assert_str_eq(ep[0].hostname, "job-0");
    cr_assert_str_eq(ep[0].target, "job-0");
    cr_assert(ep[0].ready && ep[0].serving && !ep[0].terminating);
    cr_assert(!ep[1].ready && ep[1].serving && ep[1].terminating);
    cr_assert_str_eq(ep[0].zone, "");
    cr_assert_str_eq(ep[1].zone, "z");
    cJSON_Delete(s);
    s = cJSON_Parse("{\"metadata\":{\"name\":\"q\"},\"endpoints\":[{\"addresses\":[\"1\"],\"conditions\":{\"ready\":\"yes\"}}]}");
    cr_assert_eq(rl_k8s_endpointslice_endpoints(s, ep, 4, &n, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "EndpointSlice q: endpoints[0]: conditions.ready"), "%s", e.msg);
    cJSON_Delete(s);

    char p[256];
    cr_assert_eq(rl_k8s_path(p, sizeof p, "coordination.k8s.io/v1", "ml", "leases", "a.b", &e), RL_OK);
    cr_assert_str_eq(p, "/apis/coordination.k8s.io/v1/namespaces/ml/leases/a.b");
    cr_assert_eq(rl_k8s_path(p, sizeof p, "v1", NULL, "namespaces", NULL, &e), RL_OK);
    cr_assert_str_eq(p, "/api/v1/namespaces");
    cr_assert_eq(rl_k8s_path(p, sizeof p, "v1", "ml", "pods", "../secrets", &e), RL_EINPUT);
    cr_assert_eq(rl_k8s_path(p, sizeof p, "v1", "ML", "pods", NULL, &e), RL_EINPUT);
    cr_assert_eq(rl_k8s_path(p, sizeof p, "v1", "ml", "pods", "a?b", &e), RL_EINPUT);
}


/* ---- exec credential configs and answers ------------------------------------------------- */
#define EXEC_HEAD                                                                                  \
    "clusters:\n- name: c\n  cluster:\n    server: https://h:1\n    extensions:\n"               \
    "    - name: client.authentication.k8s.io/exec\n      extension: {audience: x}\n"            \
    "contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"              \
    "users:\n- name: u\n  user:\n    exec:\n"

Test(k8s_config, exec_sections) {
    const char *ok = EXEC_HEAD
        "      apiVersion: client.authentication.k8s.io/v1\n"
        "      command: bin/plugin\n"
        "      args: [get-token, --cluster, \"c 1\"]\n"
        "      env:\n      - {name: A, value: one}\n      - name: B\n"
        "      interactiveMode: IfAvailable\n"
        "      provideClusterInfo: true\n"
        "      installHint: install it\n";
    rl_k8s_config c;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_config_parse(ok, strlen(ok), "/etc/kube/config", NULL, &c, &e), RL_OK, "%s", e.msg);
    cr_assert_not_null(c.exec);
    cr_assert_str_eq(c.exec->argv[0], "/etc/kube/bin/plugin", "a command with '/' is relative to the file");
    cr_assert_str_eq(c.exec->argv[3], "c 1");
    cr_assert_null(c.exec->argv[4]);
    cr_assert_str_eq(c.exec->env[0], "A=one");
    cr_assert_str_eq(c.exec->env[1], "B=");
    cr_assert(c.exec->provide_cluster_info);
    cr_assert_str_eq(c.exec->cluster_config, "{\"audience\":\"x\"}");
    cr_assert_str_eq(c.exec->where, "kubeconfig /etc/kube/config: users[name=u].user.exec");
    cr_assert_null(c.token);
    rl_k8s_config_free(&c);
    const char *bare = EXEC_HEAD "      apiVersion: client.authentication.k8s.io/v1beta1\n      command: aws\n";
    cr_assert_eq(rl_k8s_config_parse(bare, strlen(bare), "/etc/kube/config", NULL, &c, &e), RL_OK, "%s", e.msg);
    cr_assert_str_eq(c.exec->argv[0], "aws", "a bare name is looked up in PATH");
    rl_k8s_config_free(&c);

    struct {
        const char *tail, *want;
    } bad[] = {
        {"      apiVersion: client.authentication.k8s.io/v1\n      command: p\n      interactiveMode: Always\n",
         "users[name=u].user.exec.interactiveMode: Always needs a terminal"},
        {"      apiVersion: client.authentication.k8s.io/v1\n      command: p\n",
         "users[name=u].user.exec.interactiveMode: missing"},
        {"      apiVersion: client.authentication.k8s.io/v1alpha1\n      command: p\n",
         "users[name=u].user.exec.apiVersion: must be"},
        {"      apiVersion: client.authentication.k8s.io/v1beta1\n", "users[name=u].user.exec.command: missing"},
        {"      apiVersion: client.authentication.k8s.io/v1beta1\n      command: p\n      args: [a, [b]]\n",
         "users[name=u].user.exec.args[1]: must be a string"},
        {"      apiVersion: client.authentication.k8s.io/v1beta1\n      command: p\n      env: [{value: v}]\n",
         "users[name=u].user.exec.env[0].name: must be a variable name"},
        {"      apiVersion: client.authentication.k8s.io/v1beta1\n      command: p\n    token: t\n",
         "users[name=u].user.exec: cannot be combined with token"},
        {"      apiVersion: client.authentication.k8s.io/v1beta1\n      command: p\n      interactiveMode: Sometimes\n",
         "interactiveMode: must be Never, IfAvailable or Always"},
        {NULL, NULL}};
    for (int i = 0; bad[i].tail; i++) {
        char doc[2048];
        snprintf(doc, sizeof doc, "%s%s", EXEC_HEAD, bad[i].tail);
        cr_assert_eq(rl_k8s_config_parse(doc, strlen(doc), "/etc/kc", NULL, &c, &e), RL_EINPUT, "case %d", i);
        cr_assert(strstr(e.msg, "kubeconfig /etc/kc: ") && strstr(e.msg, bad[i].want) && !strchr(e.msg, '\n'),
                  "case %d: %s", i, e.msg);
        cr_assert_null(c.exec);
    }
}

Test(k8s_config, exec_credential_answers) {
    const char *v1 = "client.authentication.k8s.io/v1";
    const char *good = "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\","
                       "\"status\":{\"token\":\"s3cr3t-tok\",\"expirationTimestamp\":\"2030-01-02T03:04:05Z\"}}";
    char *tok = NULL;
    double exp = 0;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_exec_credential_parse(good, strlen(good), v1, "w", &tok, &exp, &e), RL_OK, "%s", e.msg);
    cr_assert_str_eq(tok, "s3cr3t-tok");
    cr_assert_float_eq(exp, 1893553445.0, 1e-6);
    free(tok);
    struct {
        const char *doc, *want;
    } bad[] = {
        {"s3cr3t-tok", "not an ExecCredential"},
        {"{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\","
         "\"status\":{\"token\":\"s3cr3t-tok\"}}", "apiVersion: not client.authentication.k8s.io/v1, which"},
        {"{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"Secret\",\"status\":{\"token\":\"s3cr3t-tok\"}}",
         "kind: must be ExecCredential"},
        {"{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\"}", "status: missing"},
        {"{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{}}",
         "status.token: missing"},
        {"{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\","
         "\"status\":{\"token\":\"s3cr3t-tok \\n\"}}", "status.token: not a single printable token"},
        {"{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\","
         "\"status\":{\"token\":\"s3cr3t-tok\",\"expirationTimestamp\":\"soon\"}}",
         "status.expirationTimestamp: not an RFC 3339 time"},
        {"{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\","
         "\"status\":{\"clientCertificateData\":\"-----BEGIN\",\"clientKeyData\":\"s3cr3t-tok\"}}",
         "client certificates from plugins are not supported"},
        {NULL, NULL}};
    for (int i = 0; bad[i].doc; i++) {
        cr_assert_eq(rl_k8s_exec_credential_parse(bad[i].doc, strlen(bad[i].doc), v1, "kubeconfig k: users[name=u].user.exec",
                                                  &tok, &exp, &e), RL_EINPUT, "case %d", i);
        cr_assert_null(tok);
        cr_assert(strstr(e.msg, "kubeconfig k: users[name=u].user.exec: ") && strstr(e.msg, bad[i].want),
                  "case %d: %s", i, e.msg);
        cr_assert_null(strstr(e.msg, "s3cr3t"), "case %d: the token leaked: %s", i, e.msg);
    }
}

/* Manifests typed as kubectl types them (YAML 1.2's core schema), for
 * `ringleader-operator render`: plain scalars become booleans and numbers,
 * quoted ones and everything else stay strings. */
Test(k8s_yaml, typed_plain_scalars) {
    const char *y = "a: 2\nb: -1.5e3\nc: true\nd: False\ne: 0x1F\nf: 0o17\ng: \"3\"\nh: 1Gi\ni: .inf\nj: ~\n"
                    "k: 0x\nl: yes\nm: .5\nn: 12abc\n";
    cJSON *o = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_yaml_parse_typed(y, strlen(y), "t.yaml", &o, &e), RL_OK, "%s", e.msg);
    char *s = cJSON_PrintUnformatted(o);
    cr_expect_str_eq(s, "{\"a\":2,\"b\":-1500,\"c\":true,\"d\":false,\"e\":31,\"f\":15,\"g\":\"3\",\"h\":\"1Gi\","
                        "\"i\":\".inf\",\"j\":null,\"k\":\"0x\",\"l\":\"yes\",\"m\":0.5,\"n\":\"12abc\"}");
    free(s);
    cJSON_Delete(o);
    /* the untyped reader, the kubeconfig's: strings */
    cr_assert_eq(rl_k8s_yaml_parse(y, strlen(y), "t.yaml", &o, &e), RL_OK, "%s", e.msg);
    cr_expect(cJSON_IsString(cJSON_GetObjectItem(o, "a")) && cJSON_IsString(cJSON_GetObjectItem(o, "c")));
    cJSON_Delete(o);
}
