/* k8s: the parsers on their own (YAML subset, kubeconfig, Status lines,
 * watch lines and events, times, Lease and EndpointSlice views), then the
 * client against the local API stand-in (tests/k8s/standin.py): CA
 * verification, 401 and token re-read, 403 not retried, 404/409 outcomes,
 * Lease create/update with conflicts, LIST+WATCH in order, relist after
 * compaction (ERROR 410 in a 200 stream), retries through 503 and refused
 * connections, and the stop flag. Each integration test starts its own
 * stand-in on ephemeral ports. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k8s/k8s.h"
#include "standin.h"
#include "testutil.h"

/* ---- YAML subset ------------------------------------------------------------------ */
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
        {"a: 1\n\tb: 2\n", "line 2: tab in indentation"},
        {"a:\n  b: 1\n c: 2\n", "line 3: unexpected indentation"},
        {"a: &x 1\n", "line 1: anchors"},
        {"a: |\n  text\n", "line 1: anchors, aliases, tags, block scalars"},
        {"a: 1\na: 2\n", "line 2: duplicate key \"a\""},
        {"a: \"open\n", "line 1: unterminated"},
        {"a: {b: 1}\n", "line 1: flow collections"},
        {"a: b\n  c\n", "line 2: unexpected indentation"},
        {"- a\nb: 1\n", "line 2"},
        {"a: 1\n---\nb: 2\n", "line 2: only one YAML document"},
        {"a: \"\\q\"\n", "line 1: unknown escape"},
        {"", "empty document"},
        {"{\"a\":", "not valid JSON"},
        {NULL, NULL}};
    for (int i = 0; bad[i].doc; i++) {
        cJSON *j = NULL;
        rl_err e = {0};
        cr_assert_eq(rl_k8s_yaml_parse(bad[i].doc, strlen(bad[i].doc), "f.yaml", &j, &e),
                     RL_EINPUT, "case %d accepted", i);
        cr_assert_null(j);
        cr_assert(strstr(e.msg, "f.yaml") && strstr(e.msg, bad[i].want), "case %d: %s", i, e.msg);
    }
    /* depth is bounded, not a stack overflow */
    char deep[8000] = "";
    for (int i = 0; i < 200; i++) strcat(deep, "- ");
    strcat(deep, "x\n");
    cJSON *j = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_yaml_parse(deep, strlen(deep), "d", &j, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "nested too deeply"), "%s", e.msg);
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
        {"    insecure-skip-tls-verify: true\ncontexts:\n- name: x\n  context: {cluster: c}\n",
         "flow collections"},
        {"    insecure-skip-tls-verify: true\ncontexts:\n- name: x\n  context:\n    cluster: c\n"
         "current-context: x\n",
         "clusters[name=c].cluster.insecure-skip-tls-verify: refused"},
        {"contexts:\n- name: x\n  context:\n    cluster: c\n", "current-context is not set"},
        {"contexts:\n- name: x\n  context:\n    cluster: nope\ncurrent-context: x\n",
         "clusters: no entry named \"nope\""},
        {"contexts:\n- name: x\n  context:\n    cluster: c\ncurrent-context: y\n",
         "contexts: no entry named \"y\""},
        {"contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
         "users:\n- name: u\n  user:\n    exec:\n      command: aws\n",
         "users[name=u].user.exec: not supported"},
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
        rl_k8s_lines l;
        rl_k8s_lines_init(&l, 64);
        collect c = {0};
        rl_err e = {0};
        for (size_t off = 0; off < n; off += chunk) {
            size_t k = n - off < chunk ? n - off : chunk;
            cr_assert_eq(rl_k8s_lines_feed(&l, stream + off, k, on_line, &c, &e), RL_OK);
        }
        cr_assert_str_eq(c.all, "{\"a\":1}|{\"b\":2}|{\"c\":3}|", "chunk %zu", chunk);
        cr_assert_eq(l.len, 9, "the partial line waits for its end");
        rl_k8s_lines_free(&l);
    }
    rl_k8s_lines l;
    rl_k8s_lines_init(&l, 8);
    collect c = {0};
    rl_err e = {0};
    cr_assert_eq(rl_k8s_lines_feed(&l, "12345", 5, on_line, &c, &e), RL_OK);
    cr_assert_eq(rl_k8s_lines_feed(&l, "6789\n", 5, on_line, &c, &e), RL_EIO);
    cr_assert(strstr(e.msg, "longer than 8 bytes"), "%s", e.msg);
    rl_k8s_lines_free(&l);
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

/* ---- against the stand-in ---------------------------------------------------------- */
static rl_test_standin g_s;
static void standin_up(void) {
    rl_log_set_level(RL_LOG_ERROR);
    cr_assert_eq(rl_test_standin_start(&g_s, NULL), 0, "stand-in did not start");
}
static void standin_up_nobookmarks(void) {
    rl_log_set_level(RL_LOG_ERROR);
    cr_assert_eq(rl_test_standin_start(&g_s, "--bookmark-interval 1000"), 0,
                 "stand-in did not start");
}
static void standin_down(void) { rl_test_standin_stop(&g_s); }

static rl_k8s_opts fast_opts(void) {
    rl_k8s_opts o = {.timeout_s = 20, .backoff = {.base_s = 0.05, .cap_s = 0.5, .attempts = 40}};
    return o;
}

/* The stand-in's own kubeconfig; token_file non-NULL swaps its inline token
 * for that file (so token rotation can be exercised). */
static rl_k8s *client_for(const char *token_file) {
    rl_k8s_config cfg;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_config_kubeconfig(g_s.kubeconfig, NULL, &cfg, &e), RL_OK, "%s", e.msg);
    if (token_file) {
        free(cfg.token);
        cfg.token = NULL;
        snprintf(cfg.token_file, sizeof cfg.token_file, "%s", token_file);
    }
    rl_k8s_opts o = fast_opts();
    rl_k8s *c = NULL;
    cr_assert_eq(rl_k8s_new(&cfg, &o, &c, &e), RL_OK, "%s", e.msg);
    rl_k8s_config_free(&cfg);
    return c;
}

static void admin(const char *method, const char *path, const char *body) {
    char out[512];
    int st = rl_test_standin_admin(&g_s, method, path, body, out, sizeof out);
    cr_assert_eq(st, 200, "admin %s %s: %d %s", method, path, st, out);
}

static char *admin_token(void) {
    char *t = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_read_file(g_s.token_file, &t, NULL, &e), RL_OK, "%s", e.msg);
    t[strcspn(t, "\r\n")] = '\0';
    return t;
}

static void write_token(const char *path, const char *tok) {
    char tmp[400];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    rl_test_write(tmp, tok, strlen(tok));
    cr_assert_eq(rename(tmp, path), 0);
}

TestSuite(k8s_standin, .init = standin_up, .fini = standin_down, .timeout = 60);

Test(k8s_standin, ca_is_verified) {
    rl_k8s *c = client_for(NULL);
    long st = 0;
    cJSON *o = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_get(c, "/api/v1/namespaces/default", &st, &o, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(st, 200);
    cJSON_Delete(o);
    rl_k8s_free(c);

    /* the same server with a CA of our own making: refused, not retried */
    char dir[] = "/tmp/rlk8s-ca-XXXXXX";
    cr_assert(mkdtemp(dir));
    char cmd[512], err[256];
    snprintf(cmd, sizeof cmd, "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
                              "-keyout %s/k -out %s/ca.crt -days 1 -subj /CN=impostor", dir, dir);
    cr_assert_eq(rl_test_run(cmd, err, sizeof err), 0, "%s", err);
    rl_k8s_config cfg;
    cr_assert_eq(rl_k8s_config_kubeconfig(g_s.kubeconfig, NULL, &cfg, &e), RL_OK, "%s", e.msg);
    snprintf(cfg.ca_file, sizeof cfg.ca_file, "%s/ca.crt", dir);
    rl_k8s_opts opts = fast_opts();
    cr_assert_eq(rl_k8s_new(&cfg, &opts, &c, &e), RL_OK, "%s", e.msg);
    double t0 = rl_now();
    cr_assert_eq(rl_k8s_get(c, "/api/v1/namespaces/default", &st, NULL, &e), RL_EIO);
    cr_assert_lt(rl_now() - t0, 2.0);
    cr_assert_eq(st, 0);
    cr_assert(strstr(e.msg, "TLS verification failed"), "%s", e.msg);
    cr_assert_null(strstr(e.msg, cfg.token), "token leaked: %s", e.msg);
    rl_k8s_free(c);
    rl_k8s_config_free(&cfg);
    rl_test_rmdir(dir);
}

Test(k8s_standin, unauthorized_then_token_rotation) {
    char dir[] = "/tmp/rlk8s-tok-XXXXXX";
    cr_assert(mkdtemp(dir));
    char tf[128];
    snprintf(tf, sizeof tf, "%s/token", dir);
    admin("POST", "/tokens", "{\"token\":\"rotating-one\"}");
    write_token(tf, "rotating-one\n");
    rl_k8s *c = client_for(tf);
    const char *path = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    long st = 0;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_get(c, path, &st, NULL, &e), RL_OK, "%s", e.msg);
    /* revoked: 401, re-read (same file), retried once, then reported */
    admin("POST", "/tokens/revoke", "{\"token\":\"rotating-one\"}");
    double t0 = rl_now();
    cr_assert_eq(rl_k8s_get(c, path, &st, NULL, &e), RL_EINPUT);
    cr_assert_lt(rl_now() - t0, 2.0, "a 401 is not retried with backoff");
    cr_assert_eq(st, 401);
    cr_assert(strstr(e.msg, "GET leases: 401 Unauthorized"), "%s", e.msg);
    cr_assert_null(strstr(e.msg, "rotating-one"));
    /* the kubelet rotates the file: the next 401 makes us re-read it */
    char *good = admin_token();
    write_token(tf, good);
    cr_assert_eq(rl_k8s_get(c, path, &st, NULL, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(st, 200);
    free(good);
    rl_k8s_free(c);

    /* no token at all */
    rl_k8s_config cfg;
    cr_assert_eq(rl_k8s_config_kubeconfig(g_s.kubeconfig, NULL, &cfg, &e), RL_OK, "%s", e.msg);
    free(cfg.token);
    cfg.token = NULL;
    rl_k8s_opts opts = fast_opts();
    cr_assert_eq(rl_k8s_new(&cfg, &opts, &c, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_k8s_get(c, path, &st, NULL, &e), RL_EINPUT);
    cr_assert_eq(st, 401);
    rl_k8s_free(c);
    rl_k8s_config_free(&cfg);
    rl_test_rmdir(dir);
}

Test(k8s_standin, forbidden_is_clear_and_not_retried) {
    char dir[] = "/tmp/rlk8s-rbac-XXXXXX";
    cr_assert(mkdtemp(dir));
    char tf[128];
    snprintf(tf, sizeof tf, "%s/token", dir);
    admin("POST", "/tokens", "{\"token\":\"no-leases\",\"deny\":[\"leases\"]}");
    write_token(tf, "no-leases");
    rl_k8s *c = client_for(tf);
    rl_k8s_lease l;
    long st = 0;
    rl_err e = {0};
    double t0 = rl_now();
    cr_assert_eq(rl_k8s_lease_get(c, NULL, "leader", &l, NULL, &st, &e), RL_EINPUT);
    cr_assert_lt(rl_now() - t0, 2.0);
    cr_assert_eq(st, 403);
    cr_assert(strstr(e.msg, "GET leases/leader: 403 Forbidden: ") && strstr(e.msg, "cannot get"),
              "%s", e.msg);
    /* a watch loop ends with the 403 instead of retrying for ever */
    char path[256];
    cr_assert_eq(rl_k8s_path(path, sizeof path, "coordination.k8s.io/v1", "default", "leases", NULL, &e), RL_OK);
    volatile int stop = 0;
    rl_k8s_watch_opts o = {.path = path, .stop = &stop};
    t0 = rl_now();
    cr_assert_eq(rl_k8s_list_watch(c, &o, NULL, NULL, &e), RL_EINPUT);
    cr_assert_lt(rl_now() - t0, 2.0);
    cr_assert(strstr(e.msg, "403 Forbidden"), "%s", e.msg);
    rl_k8s_free(c);
    rl_test_rmdir(dir);
}

Test(k8s_standin, lease_create_update_conflict) {
    rl_k8s *c = client_for(NULL);
    rl_k8s_lease got, made, upd;
    long st = 0;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_lease_get(c, NULL, "leader", &got, NULL, &st, &e), RL_EINPUT);
    cr_assert_eq(st, 404);
    cr_assert(strstr(e.msg, "GET leases/leader: 404 Not Found"), "%s", e.msg);

    double now = rl_wall_now();
    rl_k8s_lease l = {.name = "leader", .holder = "pod-a", .duration_s = 15, .acquire_time = now,
                      .renew_time = now, .transitions = 0};
    cr_assert_eq(rl_k8s_lease_create(c, NULL, &l, &made, &st, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(st, 201);
    cr_assert_str_eq(made.holder, "pod-a");
    cr_assert(made.resource_version[0]);
    cr_assert_float_eq(made.renew_time, now, 2e-6);
    /* creating it again: 409 AlreadyExists */
    cr_assert_eq(rl_k8s_lease_create(c, NULL, &l, NULL, &st, &e), RL_EINPUT);
    cr_assert_eq(st, 409);
    /* renew with the version we read */
    upd = made;
    upd.renew_time = now + 2;
    cr_assert_eq(rl_k8s_lease_update(c, NULL, &upd, &got, &st, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(st, 200);
    cr_assert_str_neq(got.resource_version, made.resource_version);
    /* a competitor still holding the old version loses with 409 */
    rl_k8s_lease stale = made;
    snprintf(stale.holder, sizeof stale.holder, "pod-b");
    stale.transitions = 1;
    cr_assert_eq(rl_k8s_lease_update(c, NULL, &stale, NULL, &st, &e), RL_EINPUT);
    cr_assert_eq(st, 409);
    cr_assert(strstr(e.msg, "PUT leases/leader: 409 Conflict"), "%s", e.msg);
    /* merge-patch and delete through the generic helpers */
    char path[256];
    cr_assert_eq(rl_k8s_path(path, sizeof path, "coordination.k8s.io/v1", "default", "leases", "leader", &e), RL_OK);
    cJSON *patch = cJSON_Parse("{\"spec\":{\"holderIdentity\":\"\"}}");
    cJSON *out = NULL;
    cr_assert_eq(rl_k8s_merge_patch(c, path, patch, &st, &out, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_k8s_lease_read(out, &got, &e), RL_OK);
    cr_assert_str_eq(got.holder, "");
    cr_assert_eq(got.duration_s, 15);
    cJSON_Delete(patch);
    cJSON_Delete(out);
    cr_assert_eq(rl_k8s_delete(c, path, &st, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_k8s_delete(c, path, &st, &e), RL_EINPUT);
    cr_assert_eq(st, 404);
    rl_k8s_free(c);
}

Test(k8s_standin, retries_through_503_and_refused_connections) {
    rl_k8s *c = client_for(NULL);
    rl_k8s_lease got;
    long st = 0;
    rl_err e = {0};
    admin("POST", "/outage", "{\"mode\":\"503\",\"seconds\":1.5}");
    double t0 = rl_now();
    cr_assert_eq(rl_k8s_lease_get(c, NULL, "absent", &got, NULL, &st, &e), RL_EINPUT, "%s", e.msg);
    double dt = rl_now() - t0;
    cr_assert_eq(st, 404, "the answer after the outage: %s", e.msg);
    cr_assert(dt > 1.0 && dt < 8.0, "took %.2f s", dt);

    admin("POST", "/outage", "{\"mode\":\"refuse\",\"seconds\":1.5}");
    t0 = rl_now();
    cr_assert_eq(rl_k8s_lease_get(c, NULL, "absent", &got, NULL, &st, &e), RL_EINPUT, "%s", e.msg);
    dt = rl_now() - t0;
    cr_assert_eq(st, 404, "%s", e.msg);
    cr_assert(dt > 1.0 && dt < 8.0, "took %.2f s", dt);
    rl_k8s_free(c);

    /* a deadline shorter than the outage: the last error comes back in time */
    rl_k8s_config cfg;
    cr_assert_eq(rl_k8s_config_kubeconfig(g_s.kubeconfig, NULL, &cfg, &e), RL_OK, "%s", e.msg);
    rl_k8s_opts o = fast_opts();
    o.timeout_s = 1.0;
    cr_assert_eq(rl_k8s_new(&cfg, &o, &c, &e), RL_OK, "%s", e.msg);
    rl_k8s_config_free(&cfg);
    admin("POST", "/outage", "{\"mode\":\"503\",\"seconds\":5}");
    t0 = rl_now();
    cr_assert_eq(rl_k8s_lease_get(c, NULL, "absent", &got, NULL, &st, &e), RL_EPEER);
    cr_assert_eq(st, 503);
    cr_assert(strstr(e.msg, "503 Service Unavailable"), "%s", e.msg);
    cr_assert_lt(rl_now() - t0, 2.0);
    admin("POST", "/outage", "{\"mode\":\"none\"}");
    rl_k8s_free(c);
}

/* ---- watch ------------------------------------------------------------------------------ */
typedef struct seen {
    pthread_mutex_t mu;
    char log[8192];
    int syncs, events;
    char last_sync[1024];
} seen;

static int record(void *ud, rl_k8s_event_type t, const cJSON *obj) {
    seen *s = ud;
    pthread_mutex_lock(&s->mu);
    if (t == RL_K8S_SYNC) {
        s->syncs++;
        s->last_sync[0] = '\0';
        const cJSON *it;
        cJSON_ArrayForEach(it, obj) {
            const cJSON *n = cJSON_GetObjectItem(cJSON_GetObjectItem(it, "metadata"), "name");
            strcat(s->last_sync, n->valuestring);
            strcat(s->last_sync, ",");
        }
        strcat(s->log, "SYNC;");
    } else {
        static const char *names[] = {"", "ADDED", "MODIFIED", "DELETED"};
        const cJSON *md = cJSON_GetObjectItem(obj, "metadata");
        const cJSON *n = cJSON_GetObjectItem(md, "name");
        const cJSON *sp = cJSON_GetObjectItem(obj, "spec");
        const cJSON *h = cJSON_GetObjectItem(sp, "holderIdentity");
        char line[200];
        snprintf(line, sizeof line, "%s %s %s;", names[t], n->valuestring,
                 cJSON_IsString(h) ? h->valuestring : "-");
        strcat(s->log, line);
        s->events++;
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

typedef struct watcher {
    rl_k8s *c;
    rl_k8s_watch_opts o;
    seen *s;
    int rc;
    rl_err e;
    double ended;
} watcher;

static void *watch_main(void *arg) {
    watcher *w = arg;
    w->rc = rl_k8s_list_watch(w->c, &w->o, record, w->s, &w->e);
    w->ended = rl_now();
    return NULL;
}

/* Wait (bounded) until the log contains want. */
static bool await_log(seen *s, const char *want, double timeout_s) {
    double end = rl_now() + timeout_s;
    while (rl_now() < end) {
        pthread_mutex_lock(&s->mu);
        bool ok = strstr(s->log, want) != NULL;
        pthread_mutex_unlock(&s->mu);
        if (ok) return true;
        usleep(20 * 1000);
    }
    return false;
}

static void put_lease(rl_k8s *c, const char *name, const char *holder, const char *label) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "apiVersion", "coordination.k8s.io/v1");
    cJSON_AddStringToObject(o, "kind", "Lease");
    cJSON *md = cJSON_AddObjectToObject(o, "metadata");
    cJSON_AddStringToObject(md, "name", name);
    if (label) cJSON_AddStringToObject(cJSON_AddObjectToObject(md, "labels"), "app", label);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "spec"), "holderIdentity", holder);
    long st;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_create(c, "/apis/coordination.k8s.io/v1/namespaces/default/leases", o,
                               &st, NULL, &e), RL_OK, "%s", e.msg);
    cJSON_Delete(o);
}

static void patch_holder(rl_k8s *c, const char *name, const char *holder) {
    char path[256], body[128];
    snprintf(path, sizeof path, "/apis/coordination.k8s.io/v1/namespaces/default/leases/%s", name);
    snprintf(body, sizeof body, "{\"spec\":{\"holderIdentity\":\"%s\"}}", holder);
    long st;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_request(c, "PATCH", path, "application/merge-patch+json", body, &st, NULL, &e),
                 RL_OK, "%s", e.msg);
}

Test(k8s_standin, list_watch_in_order_and_stop_flag) {
    rl_k8s *c = client_for(NULL);
    /* five matching leases and one other: paginated 2 at a time */
    put_lease(c, "a1", "h", "x");
    put_lease(c, "a2", "h", "x");
    put_lease(c, "a3", "h", "x");
    put_lease(c, "a4", "h", "x");
    put_lease(c, "a5", "h", "x");
    put_lease(c, "other", "h", "y");
    seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    volatile int stop = 0;
    watcher w = {.c = c, .s = &s,
                 .o = {.path = "/apis/coordination.k8s.io/v1/namespaces/default/leases",
                       .label_selector = "app=x", .page_limit = 2, .watch_timeout_s = 2,
                       .stop = &stop}};
    pthread_t th;
    pthread_create(&th, NULL, watch_main, &w);
    cr_assert(await_log(&s, "SYNC;", 10), "no initial list");
    pthread_mutex_lock(&s.mu);
    cr_assert_str_eq(s.last_sync, "a1,a2,a3,a4,a5,");
    pthread_mutex_unlock(&s.mu);
    /* changes from this thread while the other one watches, on the same client */
    put_lease(c, "b1", "h1", "x");
    patch_holder(c, "b1", "h2");
    put_lease(c, "ignored", "h", "y");
    patch_holder(c, "b1", "h3");
    char path[256];
    long st;
    rl_err e = {0};
    snprintf(path, sizeof path, "/apis/coordination.k8s.io/v1/namespaces/default/leases/a1");
    cr_assert_eq(rl_k8s_delete(c, path, &st, &e), RL_OK, "%s", e.msg);
    const char *want = "SYNC;ADDED b1 h1;MODIFIED b1 h2;MODIFIED b1 h3;DELETED a1 h;";
    cr_assert(await_log(&s, want, 10), "events: %s", s.log);
    /* across a server-side stream end (timeoutSeconds 2) nothing is lost or repeated */
    usleep(2500 * 1000);
    patch_holder(c, "b1", "h4");
    cr_assert(await_log(&s, "MODIFIED b1 h4;", 10), "events: %s", s.log);
    pthread_mutex_lock(&s.mu);
    cr_assert_eq(s.syncs, 1, "a normal stream end must not relist: %s", s.log);
    cr_assert_eq(s.events, 5, "%s", s.log);
    pthread_mutex_unlock(&s.mu);
    double t0 = rl_now();
    stop = 1;
    pthread_join(th, NULL);
    cr_assert_eq(w.rc, RL_OK, "%s", w.e.msg);
    cr_assert_lt(w.ended - t0, 1.6, "stop took %.2f s", w.ended - t0);
    rl_k8s_free(c);
}

Test(k8s_standin_compact, relist_after_410_in_a_200_stream, .init = standin_up_nobookmarks,
     .fini = standin_down, .timeout = 60) {
    rl_k8s *c = client_for(NULL);
    put_lease(c, "w1", "h", "x");
    seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    volatile int stop = 0;
    watcher w = {.c = c, .s = &s,
                 .o = {.path = "/apis/coordination.k8s.io/v1/namespaces/default/leases",
                       .label_selector = "app=x", .watch_timeout_s = 1, .stop = &stop}};
    pthread_t th;
    pthread_create(&th, NULL, watch_main, &w);
    cr_assert(await_log(&s, "SYNC;", 10));
    put_lease(c, "w2", "h", "x");
    cr_assert(await_log(&s, "ADDED w2 h;", 10), "%s", s.log);
    /* writes the watch does not see (other label, no bookmarks) move the
     * server past our version; compaction then forgets it, so when the
     * stream ends (timeoutSeconds 1) the next watch from our version gets
     * an ERROR 410 event inside a 200 stream and we must list again */
    put_lease(c, "o1", "h", "y");
    put_lease(c, "o2", "h", "y");
    admin("POST", "/compact", "{}");
    cr_assert(await_log(&s, "SYNC;ADDED w2 h;SYNC;", 10), "no relist after compaction: %s", s.log);
    pthread_mutex_lock(&s.mu);
    cr_assert_str_eq(s.last_sync, "w1,w2,");
    pthread_mutex_unlock(&s.mu);
    /* and the watch goes on from the new list */
    put_lease(c, "w3", "h", "x");
    cr_assert(await_log(&s, "SYNC;ADDED w2 h;SYNC;ADDED w3 h;", 10), "%s", s.log);
    stop = 1;
    pthread_join(th, NULL);
    cr_assert_eq(w.rc, RL_OK, "%s", w.e.msg);
    rl_k8s_free(c);
}

Test(k8s_standin, watch_survives_an_outage) {
    rl_k8s *c = client_for(NULL);
    seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    volatile int stop = 0;
    watcher w = {.c = c, .s = &s,
                 .o = {.path = "/apis/coordination.k8s.io/v1/namespaces/default/leases",
                       .watch_timeout_s = 30, .idle_timeout_s = 5, .stop = &stop}};
    pthread_t th;
    pthread_create(&th, NULL, watch_main, &w);
    cr_assert(await_log(&s, "SYNC;", 10));
    admin("POST", "/outage", "{\"mode\":\"refuse\",\"seconds\":1.0}");
    usleep(300 * 1000);
    put_lease(c, "after", "h", NULL); /* retried by the client until the server is back */
    cr_assert(await_log(&s, "after", 15), "%s", s.log);
    stop = 1;
    pthread_join(th, NULL);
    cr_assert_eq(w.rc, RL_OK, "%s", w.e.msg);
    rl_k8s_free(c);
}
