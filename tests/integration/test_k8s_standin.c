/* k8s: the client against the local API stand-in (tests/k8s/standin.py):
 * CA verification, 401 and token re-read, 403 not retried, 404/409
 * outcomes, Lease create/update with conflicts, LIST+WATCH in order,
 * relist after compaction (ERROR 410 in a 200 stream), retries through 503
 * and refused connections, the stop flag, and exec credential plugins (run
 * once per token lifetime, again after expiry and after a 401, killed at
 * their timeout, their failures one line without the token); and
 * KUBECONFIG lists checked against the real kubectl. Each test starts its
 * own stand-in on ephemeral ports. The parsers on their own are in
 * tests/unit/test_k8s.c. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k8s/k8s.h"
#include "standin.h"
#include "testutil.h"

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

/* The client-side rate limit: a burst goes at once, the rest at qps (a
 * lower bound on the time, which load cannot break); a wait that would
 * outlast the call's deadline fails at once, naming the limit. */
Test(k8s_standin, client_side_rate_limit) {
    rl_k8s_config cfg;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_config_kubeconfig(g_s.kubeconfig, NULL, &cfg, &e), RL_OK, "%s", e.msg);
    rl_k8s_opts o = fast_opts();
    o.qps = 20, o.burst = 5;
    rl_k8s *c = NULL;
    cr_assert_eq(rl_k8s_new(&cfg, &o, &c, &e), RL_OK, "%s", e.msg);
    long st = 0;
    double t0 = rl_now();
    for (int i = 0; i < 25; i++) cr_assert_eq(rl_k8s_get(c, "/api/v1/namespaces/default/pods", &st, NULL, &e), RL_OK, "%s", e.msg);
    cr_expect_geq(rl_now() - t0, (25 - 5) / 20.0 - 0.05, "25 requests at 20/s after a burst of 5 took %.2f s",
                  rl_now() - t0);
    rl_k8s_free(c);
    o.qps = 0.5, o.burst = 1, o.timeout_s = 1;
    cr_assert_eq(rl_k8s_new(&cfg, &o, &c, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_k8s_get(c, "/api/v1/namespaces/default/pods", &st, NULL, &e), RL_OK, "%s", e.msg);
    t0 = rl_now();
    cr_expect_eq(rl_k8s_get(c, "/api/v1/namespaces/default/pods", &st, NULL, &e), RL_ETIMEOUT);
    cr_expect_lt(rl_now() - t0, 0.5, "it waited instead of failing at once");
    cr_expect(strstr(e.msg, "client-side rate limit"), "%s", e.msg);
    rl_k8s_free(c);
    rl_k8s_config_free(&cfg);
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

/* ---- KUBECONFIG lists, with the real kubectl as the oracle ------------------------------- */
static void put(const char *dir, const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    rl_test_write(p, text, strlen(text));
}

static char *slurp(const char *path) {
    char *t = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_read_file(path, &t, NULL, &e), RL_OK, "%s", e.msg);
    return t;
}

/* `kubectl config view --flatten -o json` of a KUBECONFIG list. */
static cJSON *kubectl_view(const char *list) {
    char cmd[2048], buf[65536];
    snprintf(cmd, sizeof cmd, "cd / && KUBECONFIG='%s' timeout 60 kubectl config view --flatten -o json 2>&1",
             list);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = '\0';
    cr_assert_eq(pclose(p), 0, "kubectl: %s", buf);
    cJSON *j = cJSON_Parse(buf);
    cr_assert_not_null(j, "kubectl printed: %s", buf);
    return j;
}

static const cJSON *named(const cJSON *root, const char *list, const char *inner, const char *name) {
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(root, list))
        if (!strcmp(cJSON_GetObjectItem(it, "name")->valuestring, name))
            return cJSON_GetObjectItem(it, inner);
    cr_assert_fail("kubectl has no %s named %s", list, name);
    return NULL;
}

/* A file our config names holds what kubectl inlined as base64. */
static void same_file_data(const char *file, const cJSON *b64, const char *what) {
    cr_assert(file[0] && cJSON_IsString(b64), "%s: ours %s, kubectl %s", what, file,
              b64 ? "data" : "none");
    char *want = NULL, *got = slurp(file);
    size_t wl = 0;
    cr_assert_eq(rl_base64_decode(b64->valuestring, strlen(b64->valuestring), false, &want, &wl), 0);
    cr_assert_str_eq(got, want, "%s: %s", what, file);
    free(want);
    free(got);
}

static void check_context_as_kubectl(const char *list, const cJSON *kv, const char *ctx) {
    const cJSON *cx = named(kv, "contexts", "context", ctx);
    const cJSON *cl = named(kv, "clusters", "cluster", cJSON_GetObjectItem(cx, "cluster")->valuestring);
    const cJSON *us = named(kv, "users", "user", cJSON_GetObjectItem(cx, "user")->valuestring);
    rl_k8s_config c;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_config_kubeconfig(list, ctx, &c, &e), RL_OK, "%s", e.msg);
    cr_assert_str_eq(c.server, cJSON_GetObjectItem(cl, "server")->valuestring, "context %s", ctx);
    const cJSON *ns = cJSON_GetObjectItem(cx, "namespace");
    cr_assert_str_eq(c.ns, ns ? ns->valuestring : "default", "context %s", ctx);
    same_file_data(c.ca_file, cJSON_GetObjectItem(cl, "certificate-authority-data"), ctx);
    const cJSON *tok = cJSON_GetObjectItem(us, "token");
    cr_assert_str_eq(c.token ? c.token : "", tok ? tok->valuestring : "", "context %s", ctx);
    const cJSON *cert = cJSON_GetObjectItem(us, "client-certificate-data");
    if (cert) {
        same_file_data(c.cert_file, cert, ctx);
        same_file_data(c.key_file, cJSON_GetObjectItem(us, "client-key-data"), ctx);
    } else {
        cr_assert_eq(c.cert_file[0], '\0');
    }
    const cJSON *tf = cJSON_GetObjectItem(us, "tokenFile");
    if (tf) {
        char suffix[300];
        snprintf(suffix, sizeof suffix, "/%s", tf->valuestring);
        size_t l = strlen(c.token_file), sl = strlen(suffix);
        cr_assert(l > sl && !strcmp(c.token_file + l - sl, suffix) && access(c.token_file, R_OK) == 0,
                  "tokenFile %s vs kubectl's %s", c.token_file, tf->valuestring);
    }
    rl_k8s_config_free(&c);
}

Test(k8s_config, kubeconfig_list_merged_as_kubectl_merges_it) {
    char root[] = "/tmp/rlk8s-list-XXXXXX", a[300], b[300], sub[320];
    cr_assert(mkdtemp(root));
    snprintf(a, sizeof a, "%s/A", root);
    snprintf(b, sizeof b, "%s/B", root);
    snprintf(sub, sizeof sub, "%s/sub", b);
    cr_assert(mkdir(a, 0700) == 0 && mkdir(b, 0700) == 0 && mkdir(sub, 0700) == 0);
    put(a, "ca.crt", "CA of A\n");
    put(b, "ca.crt", "CA of B\n");
    put(b, "sub/ca.crt", "CA of B2\n");
    put(b, "u2.crt", "CERT of u2\n");
    put(b, "u2.key", "KEY of u2\n");
    put(b, "u2.token", "tok2\n");
    /* the first file wins c1, u1 and x but sets no current-context */
    put(a, "config",
        "apiVersion: v1\nkind: Config\n"
        "clusters:\n- {name: c1, cluster: {server: \"https://a.example:6443\", certificate-authority: ca.crt}}\n"
        "users:\n- name: u1\n  user: {token: token-from-a}\n"
        "contexts:\n- name: x\n  context: {cluster: c1, user: u1, namespace: from-a}\n");
    put(b, "config",
        "apiVersion: v1\nkind: Config\ncurrent-context: only-b\n"
        "clusters:\n- name: c1\n  cluster:\n    server: https://b.example:6443\n    certificate-authority: ca.crt\n"
        "- name: c2\n  cluster: {server: 'https://b2.example', certificate-authority: sub/ca.crt}\n"
        "users:\n- name: u1\n  user: {token: token-from-b}\n"
        "- name: u2\n  user:\n    client-certificate: u2.crt\n    client-key: u2.key\n    tokenFile: u2.token\n"
        "contexts:\n- name: x\n  context: {cluster: c2, user: u2}\n"
        "- name: only-b\n  context: {cluster: c1, user: u2, namespace: ns-b}\n"
        "- name: mixed\n  context: {cluster: c2, user: u1}\n");
    char list[1100];
    snprintf(list, sizeof list, "%s/config::%s/missing:%s/config:%s/config", a, root, b, a);
    cJSON *kv = kubectl_view(list);
    const char *ctxs[] = {"x", "only-b", "mixed"};
    for (int i = 0; i < 3; i++) check_context_as_kubectl(list, kv, ctxs[i]);
    /* current-context: the first file that sets one */
    cr_assert_str_eq(cJSON_GetObjectItem(kv, "current-context")->valuestring, "only-b");
    rl_k8s_config c;
    rl_err e = {0};
    setenv("KUBECONFIG", list, 1);
    unsetenv("KUBERNETES_SERVICE_HOST");
    cr_assert_eq(rl_k8s_config_auto(&c, &e), RL_OK, "%s", e.msg);
    cr_assert(strstr(c.source, "(context only-b)") && strstr(c.source, b), "%s", c.source);
    cr_assert_str_eq(c.server, "https://a.example:6443");
    rl_k8s_config_free(&c);
    cJSON_Delete(kv);

    /* every file of the list must parse, and the message names the bad one */
    put(b, "bad", "clusters:\n- name: c1\n  cluster: {server: https://x}\n- name: c1\n");
    snprintf(list, sizeof list, "%s/config:%s/bad", a, b);
    cr_assert_eq(rl_k8s_config_kubeconfig(list, NULL, &c, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "/B/bad: clusters: duplicate name \"c1\""), "%s", e.msg);
    char out[1400];
    snprintf(out, sizeof out, "cd / && KUBECONFIG='%s' timeout 60 kubectl config view >/dev/null 2>&1", list);
    cr_assert_neq(system(out), 0, "kubectl refuses it too");
    snprintf(list, sizeof list, "%s/nope:%s/nope2", root, root);
    cr_assert_eq(rl_k8s_config_kubeconfig(list, NULL, &c, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "none of the 2 files"), "%s", e.msg);
    snprintf(list, sizeof list, "%s/nope", root);
    cr_assert_neq(rl_k8s_config_kubeconfig(list, NULL, &c, &e), RL_OK, "a single file must exist");
    cr_assert(strstr(e.msg, "/nope"), "%s", e.msg);
    rl_test_rmdir(root);
}

/* ---- exec plugins against the stand-in --------------------------------------------------- */
/* A plugin in the style of aws/gcloud/kubelogin: counts its runs, records
 * its args and env, prints DIR/token (with DIR/expiry when present), and
 * on cue hangs (with a child, as a CLI's helper) or fails with stderr. */
static const char *PLUGIN =
    "#!/bin/sh\n"
    "d=$(dirname \"$0\")/..\n"
    "echo run >> \"$d/runs\"\n"
    "printf '%s|%s|%s|%s\\n' \"$1\" \"$2\" \"$PLUGIN_VAR\" \"$KUBERNETES_EXEC_INFO\" > \"$d/seen\"\n"
    "if [ -f \"$d/hang\" ]; then sleep 60 & echo $! > \"$d/child\"; wait; fi\n"
    "if [ -f \"$d/fail\" ]; then echo 'some progress' >&2; echo \"error: login expired ($PLUGIN_VAR)\" >&2; exit 1; fi\n"
    "exp=''\n"
    "[ -f \"$d/expiry\" ] && exp=\",\\\"expirationTimestamp\\\":\\\"$(cat \"$d/expiry\")\\\"\"\n"
    "printf '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\","
    "\"status\":{\"token\":\"%s\"%s}}\\n' \"$(cat \"$d/token\")\" \"$exp\"\n";

typedef struct plug {
    char dir[64], kubeconfig[128];
} plug;

/* DIR/bin/plugin and DIR/config, a kubeconfig whose user runs it (by a
 * path relative to the kubeconfig, as kubectl resolves it). */
static void plugin_setup(plug *p) {
    snprintf(p->dir, sizeof p->dir, "/tmp/rlk8s-exec-XXXXXX");
    cr_assert(mkdtemp(p->dir));
    char bin[128], path[160];
    snprintf(bin, sizeof bin, "%s/bin", p->dir);
    cr_assert_eq(mkdir(bin, 0700), 0);
    snprintf(path, sizeof path, "%s/plugin", bin);
    rl_test_write(path, PLUGIN, strlen(PLUGIN));
    cr_assert_eq(chmod(path, 0700), 0);
    char kc[2048];
    snprintf(kc, sizeof kc,
             "apiVersion: v1\nkind: Config\ncurrent-context: e\n"
             "clusters:\n- name: s\n  cluster: {server: 'https://%s:%d', certificate-authority: %s}\n"
             "contexts:\n- name: e\n  context: {cluster: s, user: exec-user}\n"
             "users:\n- name: exec-user\n  user:\n    exec:\n"
             "      apiVersion: client.authentication.k8s.io/v1\n"
             "      command: ./bin/plugin\n      args: [get-token, --cluster=s]\n"
             "      env: [{name: PLUGIN_VAR, value: from-kubeconfig}]\n"
             "      interactiveMode: Never\n      provideClusterInfo: true\n",
             g_s.host, g_s.port, g_s.ca_file);
    snprintf(p->kubeconfig, sizeof p->kubeconfig, "%s/config", p->dir);
    rl_test_write(p->kubeconfig, kc, strlen(kc));
}

static int plugin_runs(const plug *p) {
    char path[160], line[64];
    snprintf(path, sizeof path, "%s/runs", p->dir);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && fgets(line, sizeof line, f)) n++;
    if (f) fclose(f);
    return n;
}

/* The plugin will print tok (registered with the stand-in first) expiring
 * in_s from now (in_s <= 0: no expirationTimestamp). */
static void plugin_token(const plug *p, const char *tok, double in_s) {
    char body[256], path[160], ts[64];
    snprintf(body, sizeof body, "{\"token\":\"%s\",\"user\":\"exec-user\"}", tok);
    admin("POST", "/tokens", body);
    snprintf(path, sizeof path, "%s/token", p->dir);
    write_token(path, tok);
    snprintf(path, sizeof path, "%s/expiry", p->dir);
    if (in_s > 0) {
        rl_k8s_microtime_format(rl_wall_now() + in_s, ts, sizeof ts);
        write_token(path, ts);
    } else {
        unlink(path);
    }
}

static rl_k8s *exec_client(const plug *p, double exec_timeout_s) {
    rl_k8s_config cfg;
    rl_err e = {0};
    cr_assert_eq(rl_k8s_config_kubeconfig(p->kubeconfig, NULL, &cfg, &e), RL_OK, "%s", e.msg);
    rl_k8s_opts o = fast_opts();
    o.exec_timeout_s = exec_timeout_s;
    rl_k8s *c = NULL;
    cr_assert_eq(rl_k8s_new(&cfg, &o, &c, &e), RL_OK, "%s", e.msg);
    rl_k8s_config_free(&cfg);
    return c;
}

static const char *LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases";

Test(k8s_standin, exec_token_cached_until_expiry_and_rerun_after_401) {
    plug p;
    plugin_setup(&p);
    plugin_token(&p, "exec-tok-one", 2.5);
    rl_k8s *c = exec_client(&p, 10);
    cr_assert_eq(plugin_runs(&p), 0, "the plugin runs when a token is first needed");
    long st = 0;
    rl_err e = {0};
    double t0 = rl_wall_now();
    for (int i = 0; i < 5; i++) cr_assert_eq(rl_k8s_get(c, LEASES, &st, NULL, &e), RL_OK, "%s", e.msg);
    cr_assert_lt(rl_wall_now() - t0, 2.0, "the requests were meant to fit in the token's life");
    cr_assert_eq(plugin_runs(&p), 1, "one run for many requests while the token is valid");
    /* what it was given: args, the kubeconfig's env, the request with the cluster */
    char seen_path[160];
    snprintf(seen_path, sizeof seen_path, "%s/seen", p.dir);
    char *args = slurp(seen_path);
    cr_assert(strstr(args, "get-token|--cluster=s|from-kubeconfig|{"), "%s", args);
    cJSON *info = cJSON_Parse(strchr(args, '{'));
    cr_assert_str_eq(rl_test_json_path(info, "apiVersion")->valuestring, "client.authentication.k8s.io/v1");
    cr_assert_str_eq(rl_test_json_path(info, "kind")->valuestring, "ExecCredential");
    cr_assert(cJSON_IsFalse(rl_test_json_path(info, "spec.interactive")));
    char server[128];
    snprintf(server, sizeof server, "https://%s:%d", g_s.host, g_s.port);
    cr_assert_str_eq(rl_test_json_path(info, "spec.cluster.server")->valuestring, server);
    char *ca = slurp(g_s.ca_file), *b64 = rl_base64_encode(ca, strlen(ca));
    cr_assert_str_eq(rl_test_json_path(info, "spec.cluster.certificate-authority-data")->valuestring, b64);
    free(ca);
    free(b64);
    cJSON_Delete(info);
    free(args);

    /* expired: the next request runs it again */
    while (rl_wall_now() < t0 + 2.7) usleep(50 * 1000);
    plugin_token(&p, "exec-tok-two", 0);
    cr_assert_eq(rl_k8s_get(c, LEASES, &st, NULL, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(plugin_runs(&p), 2);
    for (int i = 0; i < 3; i++) cr_assert_eq(rl_k8s_get(c, LEASES, &st, NULL, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(plugin_runs(&p), 2, "no expirationTimestamp: kept until refused");

    /* revoked: the 401 runs the plugin again and the request is retried once */
    admin("POST", "/tokens/revoke", "{\"token\":\"exec-tok-two\"}");
    plugin_token(&p, "exec-tok-three", 0);
    cr_assert_eq(rl_k8s_get(c, LEASES, &st, NULL, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(st, 200);
    cr_assert_eq(plugin_runs(&p), 3);
    /* a plugin still printing a revoked token: the 401 comes back, once */
    admin("POST", "/tokens/revoke", "{\"token\":\"exec-tok-three\"}");
    double t1 = rl_now();
    cr_assert_eq(rl_k8s_get(c, LEASES, &st, NULL, &e), RL_EINPUT);
    cr_assert_lt(rl_now() - t1, 5.0);
    cr_assert_eq(st, 401);
    cr_assert_eq(plugin_runs(&p), 4);
    cr_assert(strstr(e.msg, "GET leases: 401 Unauthorized"), "%s", e.msg);
    cr_assert_null(strstr(e.msg, "exec-tok"), "token leaked: %s", e.msg);
    /* the stand-in saw our requests as the plugin's user */
    char log[400];
    snprintf(log, sizeof log, "%s/standin.log", g_s.dir);
    cr_assert(rl_test_file_has(log, "\"user\": \"exec-user\"") || rl_test_file_has(log, "\"user\":\"exec-user\""));
    rl_k8s_free(c);
    rl_test_rmdir(p.dir);
}

Test(k8s_standin, exec_plugin_hang_and_failure_are_one_line) {
    plug p;
    plugin_setup(&p);
    plugin_token(&p, "exec-tok-hang", 0);
    char flag[160];
    snprintf(flag, sizeof flag, "%s/hang", p.dir);
    rl_test_write(flag, "", 0);
    rl_k8s *c = exec_client(&p, 1.0);
    long st = -1;
    rl_err e = {0};
    double t0 = rl_now();
    cr_assert_eq(rl_k8s_get(c, LEASES, &st, NULL, &e), RL_ETIMEOUT, "%s", e.msg);
    double dt = rl_now() - t0;
    cr_assert(dt >= 0.9 && dt < 4.0, "took %.2f s", dt);
    cr_assert_eq(st, 0, "nothing was sent");
    cr_assert_eq(plugin_runs(&p), 1, "a credential failure is not retried");
    cr_assert(strstr(e.msg, "users[name=exec-user].user.exec: ") && strstr(e.msg, "/bin/plugin did not finish "
              "within 1 s (killed)") && !strchr(e.msg, '\n'), "%s", e.msg);
    /* what it started was killed with it (its own process group) */
    snprintf(flag, sizeof flag, "%s/child", p.dir);
    char *child = slurp(flag), stat_path[64], *stat = NULL;
    snprintf(stat_path, sizeof stat_path, "/proc/%d/stat", atoi(child));
    bool gone = false;
    for (int i = 0; i < 100 && !gone; i++) {
        rl_err e2 = {0};
        gone = rl_read_file(stat_path, &stat, NULL, &e2) != RL_OK || strstr(stat, ") Z ");
        free(stat);
        stat = NULL;
        if (!gone) usleep(20 * 1000);
    }
    cr_assert(gone, "the plugin's child %s is still running", child);
    free(child);
    snprintf(flag, sizeof flag, "%s/hang", p.dir);
    unlink(flag);

    /* a failing plugin: its last stderr line, the user entry and the command */
    snprintf(flag, sizeof flag, "%s/fail", p.dir);
    rl_test_write(flag, "", 0);
    cr_assert_eq(rl_k8s_get(c, LEASES, &st, NULL, &e), RL_EINPUT);
    char want[400];
    snprintf(want, sizeof want, "kubeconfig %s: users[name=exec-user].user.exec: %s/./bin/plugin exited with "
             "status 1: error: login expired (from-kubeconfig)", p.kubeconfig, p.dir);
    cr_assert_str_eq(e.msg, want);
    unlink(flag);
    /* and the next request runs it again, now successfully */
    cr_assert_eq(rl_k8s_get(c, LEASES, &st, NULL, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(plugin_runs(&p), 3);
    rl_k8s_free(c);

    /* a plugin that is not there names the command and the installHint */
    rl_k8s_config cfg;
    cr_assert_eq(rl_k8s_config_kubeconfig(p.kubeconfig, NULL, &cfg, &e), RL_OK, "%s", e.msg);
    free(cfg.exec->argv[0]);
    cfg.exec->argv[0] = strdup("ringleader-no-such-plugin");
    cfg.exec->install_hint = strdup("install it from the cloud CLI");
    char *tok = NULL;
    double exp;
    cr_assert_eq(rl_k8s_exec_token(&cfg, 5, &tok, &exp, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "cannot run ringleader-no-such-plugin: No such file or directory; install it "
                            "from the cloud CLI"), "%s", e.msg);
    rl_k8s_config_free(&cfg);
    rl_test_rmdir(p.dir);
}
