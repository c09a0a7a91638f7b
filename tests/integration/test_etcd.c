/* etcd: the v3 JSON-gateway client, the etcd elector backend and the etcd
 * membership backend, against a real etcd (Debian's etcd-server) that each
 * test starts on free loopback ports in its own temp dir; plus the answer
 * and watch-stream parsers on hand-made input (what a real etcd never
 * sends but a broken proxy or a hand-edited key might). */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "etcdtest.h"
#include "http/http.h"
#include "elect/elect_internal.h"
#include "rdzv/members_internal.h"
#include "etcd/etcd.h"
#include "rdzv/rdzv.h"

static rl_test_etcd g_etcd;

static void etcd_up(void) {
    rl_log_set_level(RL_LOG_ERROR);
    cr_assert_eq(rl_test_etcd_start(&g_etcd), 0, "etcd did not start (see stderr)");
}
static void etcd_down(void) { rl_test_etcd_stop(&g_etcd); }

static rl_etcd *client(void) {
    rl_etcd *c = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_etcd_new(g_etcd.endpoint, 5.0, &c, &e), RL_OK, "%s", e.msg);
    return c;
}

/* A raw gateway call for what the client deliberately lacks (compaction). */
static void raw_post(const char *path, const char *body) {
    rl_http *h = NULL;
    cr_assert_eq(rl_http_new(&h, NULL), RL_OK);
    char url[160];
    snprintf(url, sizeof url, "%s%s", g_etcd.endpoint, path);
    rl_http_req req = {.method = "POST", .url = url, .body = body, .body_len = strlen(body),
                       .timeout_s = 5};
    rl_http_resp r = {0};
    rl_err e = {0};
    cr_assert_eq(rl_http_do(h, &req, &r, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(r.status, 200, "%s: HTTP %ld %s", path, r.status, r.body ? r.body : "");
    rl_http_resp_free(&r);
    rl_http_free(h);
}

static double now(void) { return rl_now(); }

/* ---- parsers on hand-made input ------------------------------------------------------ */
Test(etcd_parse, base64_strict) {
    char *out;
    size_t n;
    cr_assert_eq(rl_base64_decode("Zm9vYg==", 8, false, &out, &n), 0);
    cr_assert_eq(n, 4);
    cr_assert_str_eq(out, "foob");
    free(out);
    cr_assert_eq(rl_base64_decode("", 0, false, &out, &n), 0);
    cr_assert_eq(n, 0);
    free(out);
    const char *bad[] = {"Zm9vYg=", "Zm9v!g==", "Zm=vYg==", "Zm9vYh==", "Zg=a", "====", "Zm9vY==="};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_neq(rl_base64_decode(bad[i], strlen(bad[i]), false, &out, &n), 0, "%s", bad[i]);
    char all[256];
    for (int i = 0; i < 256; i++) all[i] = (char)i;
    for (size_t len = 0; len <= 256; len += 37) {
        char *b = rl_base64_encode(all, len);
        cr_assert_eq(rl_base64_decode(b, strlen(b), false, &out, &n), 0);
        cr_assert_eq(n, len);
        cr_assert_eq(memcmp(out, all, len), 0);
        free(out);
        free(b);
    }
}

Test(etcd_parse, range_answers_strictly) {
    rl_etcd_kvs r;
    rl_err e = {0};
    const char *ok = "{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"key\":\"YS9i\",\"create_revision\":\"3\","
                     "\"mod_revision\":\"6\",\"version\":\"2\",\"value\":\"eA==\",\"lease\":\"99\"},"
                     "{\"key\":\"YS9j\"}],\"count\":\"2\",\"unknown_future_field\":[1]}";
    cr_assert_eq(rl_etcd_parse_range(ok, strlen(ok), "t", &r, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(r.revision, 7);
    cr_assert_eq(r.n, 2);
    cr_assert_eq(r.count, 2);
    cr_assert_str_eq(r.kvs[0].key, "a/b");
    cr_assert_str_eq(r.kvs[0].value, "x");
    cr_assert_eq(r.kvs[0].lease, 99);
    cr_assert_eq(r.kvs[0].create_rev, 3);
    cr_assert_eq(r.kvs[1].value_len, 0); /* absent = empty (protobuf default) */
    rl_etcd_kvs_free(&r);

    struct {
        const char *doc, *names;
    } bad[] = {
        {"{\"header\":{\"revision\":7}}", "'revision'"},
        {"{\"count\":2}", "'count'"},
        {"{\"count\":\"2x\"}", "'count'"},
        {"{\"count\":\"99999999999999999999\"}", "'count'"},
        {"{\"count\":\"-1\"}", "'count'"},
        {"{\"kvs\":{}}", "'kvs'"},
        {"{\"kvs\":[3]}", "key-value"},
        {"{\"kvs\":[{\"key\":\"Y!==\"}]}", "'key'"},
        {"{\"kvs\":[{\"key\":5}]}", "'key'"},
        {"{\"more\":\"yes\"}", "'more'"},
        {"[1]", "not a JSON object"},
        {"{} trailing", "not a JSON object"},
        {"", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        e.msg[0] = '\0';
        cr_expect_eq(rl_etcd_parse_range(bad[i].doc, strlen(bad[i].doc), "etcd range", &r, &e),
                     RL_EIO, "%s", bad[i].doc);
        cr_expect(strstr(e.msg, bad[i].names) && strstr(e.msg, "etcd range"), "%s -> %s", bad[i].doc,
                  e.msg);
        cr_expect_eq(r.n, 0);
        cr_expect_null(r.kvs);
    }
}

Test(etcd_parse, watch_lines) {
    rl_etcd_watch_msg m;
    rl_err e = {0};
    /* PUT is the enum's zero value: the gateway leaves "type" out */
    const char *put = "{\"result\":{\"header\":{\"revision\":\"6\"},\"events\":[{\"kv\":{\"key\":\"cDE=\","
                      "\"value\":\"eA==\",\"mod_revision\":\"6\"}},{\"type\":\"DELETE\",\"kv\":{\"key\":\"cDI=\"}}]}}";
    cr_assert_eq(rl_etcd_parse_watch_msg(put, strlen(put), "w", &m, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(m.n, 2);
    cr_assert_eq(m.events[0].type, RL_ETCD_EV_PUT);
    cr_assert_str_eq(m.events[0].kv.key, "p1");
    cr_assert_eq(m.events[1].type, RL_ETCD_EV_DELETE);
    cr_assert_eq(m.revision, 6);
    rl_etcd_watch_msg_free(&m);

    const char *cancel = "{\"result\":{\"canceled\":true,\"compact_revision\":\"12\",\"cancel_reason\":\"x\\u0001y\"}}";
    cr_assert_eq(rl_etcd_parse_watch_msg(cancel, strlen(cancel), "w", &m, &e), RL_OK);
    cr_assert(m.canceled);
    cr_assert_eq(m.compact_revision, 12);
    cr_assert_str_eq(m.cancel_reason, "x?y"); /* control bytes never reach our messages */
    rl_etcd_watch_msg_free(&m);

    const char *err = "{\"error\":{\"grpc_code\":14,\"message\":\"etcdserver: no leader\"}}";
    cr_assert_eq(rl_etcd_parse_watch_msg(err, strlen(err), "w", &m, &e), RL_EPEER);
    cr_assert(strstr(e.msg, "no leader"), "%s", e.msg);

    const char *bad[] = {"{\"result\":{\"events\":[{\"type\":\"PATCH\",\"kv\":{}}]}}",
                         "{\"result\":{\"events\":[{}]}}", "{\"result\":{\"created\":1}}",
                         "{\"result\":[]}", "{}", "{\"result\":{\"events\":[{\"kv\":{\"key\":\"a\"}}]}}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_eq(rl_etcd_parse_watch_msg(bad[i], strlen(bad[i]), "w", &m, &e), RL_EIO, "%s", bad[i]);
}

typedef struct collect {
    int msgs, events, created;
    char keys[16][32];
    int types[16];
    int stop_after_events;
    int stop_after_progress;
    int progress;
    atomic_int created_flag;
} collect;

static int collect_fn(void *ud, const rl_etcd_watch_msg *m) {
    collect *c = ud;
    c->msgs++;
    if (m->created) {
        c->created++;
        atomic_store(&c->created_flag, 1);
    }
    if (!m->created && !m->canceled && m->n == 0) c->progress++;
    for (int i = 0; i < m->n && c->events < 16; i++, c->events++) {
        snprintf(c->keys[c->events], sizeof c->keys[0], "%s", m->events[i].kv.key);
        c->types[c->events] = m->events[i].type;
    }
    if (c->stop_after_events && c->events >= c->stop_after_events) return 1;
    if (c->stop_after_progress && c->progress >= c->stop_after_progress) return 1;
    return 0;
}

Test(etcd_parse, line_splitting_any_chunking) {
    const char *stream = "{\"result\":{\"created\":true}}\n\n{\"result\":{\"events\":[{\"kv\":{\"key\":\"YQ==\"}}]}}\r\n"
                         "{\"result\":{\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":\"Yg==\"}}]}}\n";
    size_t n = strlen(stream);
    for (size_t chunk = 1; chunk <= n; chunk += 7) {
        rl_http_lines lb;
        rl_http_lines_init(&lb, 0, "w");
        collect c = {0};
        bool stop = false;
        rl_err e = {0};
        for (size_t off = 0; off < n; off += chunk) {
            size_t take = n - off < chunk ? n - off : chunk;
            cr_assert_eq(rl_etcd_watch_feed(&lb, stream + off, take, collect_fn, &c, &stop, &e),
                         RL_OK, "chunk %zu: %s", chunk, e.msg);
        }
        cr_assert_eq(c.created, 1);
        cr_assert_eq(c.events, 2, "chunk %zu", chunk);
        cr_assert_str_eq(c.keys[0], "a");
        cr_assert_str_eq(c.keys[1], "b");
        cr_assert_eq(c.types[1], RL_ETCD_EV_DELETE);
        rl_http_lines_free(&lb);
    }
    /* an over-long line is an error, not unbounded memory */
    rl_http_lines lb;
    rl_http_lines_init(&lb, 64, "w");
    char big[100];
    memset(big, 'x', sizeof big);
    bool stop = false;
    rl_err e = {0};
    cr_assert_eq(rl_etcd_watch_feed(&lb, big, sizeof big, collect_fn, NULL, &stop, &e), RL_EIO);
    rl_http_lines_free(&lb);
}

Test(etcd_parse, endpoint_validation) {
    rl_etcd *c = NULL;
    rl_err e = {0};
    const char *bad[] = {"", "127.0.0.1:2379", "ftp://x", "http://", "http://h:1/v3/x",
                         "http://user:pw@h:1", "http://h:1?x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(rl_etcd_new(bad[i], 1, &c, &e), RL_EINPUT, "%s", bad[i]);
        cr_expect_null(c);
        cr_expect_null(strstr(e.msg, "pw"), "user info leaked: %s", e.msg);
    }
    cr_assert_eq(rl_etcd_new("http://127.0.0.1:1/", 1, &c, &e), RL_OK, "%s", e.msg);
    cr_assert_str_eq(rl_etcd_endpoint(c), "http://127.0.0.1:1");
    rl_etcd_free(c);
}

/* ---- the client against a real etcd ------------------------------------------------- */
TestSuite(etcd, .init = etcd_up, .fini = etcd_down, .timeout = 40);

Test(etcd, lease_grant_keepalive_revoke) {
    rl_etcd *c = client();
    rl_err e = {0};
    int64_t id = 0, ttl = 0;
    cr_assert_eq(rl_etcd_lease_grant(c, 7, &id, &ttl, &e), RL_OK, "%s", e.msg);
    cr_assert_neq(id, 0);
    cr_assert_eq(ttl, 7);
    int64_t left = -1;
    cr_assert_eq(rl_etcd_lease_keepalive(c, id, &left, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(left, 7);
    cr_assert_eq(rl_etcd_lease_ttl(c, id, &left, &e), RL_OK, "%s", e.msg);
    cr_assert(left >= 6 && left <= 7, "time to live %" PRId64, left);
    cr_assert_eq(rl_etcd_lease_revoke(c, id, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_etcd_lease_ttl(c, id, &left, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(left, 0, "a revoked lease has no time left");
    cr_assert_eq(rl_etcd_lease_keepalive(c, id, &left, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(left, 0, "a revoked lease must read as gone");
    cr_assert_eq(rl_etcd_lease_revoke(c, id, &e), RL_OK, "revoking twice: %s", e.msg);
    cr_assert_eq(rl_etcd_lease_grant(c, 0, &id, &ttl, &e), RL_EINPUT);
    rl_etcd_free(c);
}

Test(etcd, put_range_prefix_delete) {
    rl_etcd *c = client();
    rl_err e = {0};
    int64_t rev = 0;
    cr_assert_eq(rl_etcd_put(c, "job/m/b", "2", 1, 0, &rev, &e), RL_OK, "%s", e.msg);
    cr_assert_gt(rev, 0);
    cr_assert_eq(rl_etcd_put(c, "job/m/a", "1", 1, 0, NULL, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_etcd_put(c, "job/m0", "x", 1, 0, NULL, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_etcd_put(c, "job/n", "y", 1, 0, NULL, &e), RL_OK, "%s", e.msg);
    rl_etcd_kvs r;
    cr_assert_eq(rl_etcd_range(c, "job/m/", true, &r, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(r.n, 2);
    cr_assert_str_eq(r.kvs[0].key, "job/m/a");
    cr_assert_str_eq(r.kvs[1].key, "job/m/b");
    cr_assert_str_eq(r.kvs[1].value, "2");
    cr_assert_gt(r.revision, rev);
    rl_etcd_kvs_free(&r);
    cr_assert_eq(rl_etcd_range(c, "job/m/a", false, &r, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(r.n, 1);
    rl_etcd_kvs_free(&r);
    cr_assert_eq(rl_etcd_range(c, "job/none", false, &r, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(r.n, 0);
    rl_etcd_kvs_free(&r);
    /* binary value survives base64 both ways */
    const char bin[] = {0, '\n', (char)0xff, '"'};
    cr_assert_eq(rl_etcd_put(c, "job/bin", bin, sizeof bin, 0, NULL, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_etcd_range(c, "job/bin", false, &r, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(r.kvs[0].value_len, sizeof bin);
    cr_assert_eq(memcmp(r.kvs[0].value, bin, sizeof bin), 0);
    rl_etcd_kvs_free(&r);
    int64_t deleted = 0;
    cr_assert_eq(rl_etcd_delete(c, "job/m/", true, &deleted, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(deleted, 2);
    cr_assert_eq(rl_etcd_range(c, "job/", true, &r, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(r.n, 3, "job/m0, job/n and job/bin stay");
    rl_etcd_kvs_free(&r);
    rl_etcd_free(c);
}

Test(etcd, txn_both_branches) {
    rl_etcd *c = client();
    rl_err e = {0};
    rl_etcd_cmp absent = {.target = RL_ETCD_CMP_CREATE, .key = "lead", .rev = 0};
    rl_etcd_op put = {.type = RL_ETCD_OP_PUT, .key = "lead", .value = "me", .value_len = 2};
    rl_etcd_op get = {.type = RL_ETCD_OP_RANGE, .key = "lead"};
    bool ok = false;
    rl_etcd_kvs r;
    cr_assert_eq(rl_etcd_txn(c, &absent, 1, &put, 1, &get, 1, &ok, &r, &e), RL_OK, "%s", e.msg);
    cr_assert(ok);
    cr_assert_eq(r.n, 0);
    rl_etcd_kvs_free(&r);
    rl_etcd_op put2 = put;
    put2.value = "you";
    put2.value_len = 3;
    cr_assert_eq(rl_etcd_txn(c, &absent, 1, &put2, 1, &get, 1, &ok, &r, &e), RL_OK, "%s", e.msg);
    cr_assert(!ok);
    cr_assert_eq(r.n, 1);
    cr_assert_str_eq(r.kvs[0].value, "me", "the failure branch reads the holder");
    rl_etcd_kvs_free(&r);
    /* value compare: delete only if it is still ours */
    rl_etcd_cmp mine = {.target = RL_ETCD_CMP_VALUE, .key = "lead", .value = "you", .value_len = 3};
    rl_etcd_op del = {.type = RL_ETCD_OP_DELETE, .key = "lead"};
    cr_assert_eq(rl_etcd_txn(c, &mine, 1, &del, 1, NULL, 0, &ok, NULL, &e), RL_OK, "%s", e.msg);
    cr_assert(!ok);
    mine.value = "me";
    mine.value_len = 2;
    cr_assert_eq(rl_etcd_txn(c, &mine, 1, &del, 1, NULL, 0, &ok, NULL, &e), RL_OK, "%s", e.msg);
    cr_assert(ok);
    cr_assert_eq(rl_etcd_range(c, "lead", false, &r, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(r.n, 0);
    rl_etcd_kvs_free(&r);
    rl_etcd_free(c);
}

Test(etcd, expired_lease_takes_its_key) {
    rl_etcd *c = client();
    rl_err e = {0};
    int64_t id = 0, ttl = 0;
    cr_assert_eq(rl_etcd_lease_grant(c, 1, &id, &ttl, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_etcd_put(c, "tmp/k", "v", 1, id, NULL, &e), RL_OK, "%s", e.msg);
    rl_etcd_kvs r;
    cr_assert_eq(rl_etcd_range(c, "tmp/k", false, &r, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(r.n, 1);
    cr_assert_eq(r.kvs[0].lease, id);
    rl_etcd_kvs_free(&r);
    double t0 = now(), gone = -1;
    while (now() - t0 < (double)ttl + 3.0) {
        cr_assert_eq(rl_etcd_range(c, "tmp/k", false, &r, &e), RL_OK, "%s", e.msg);
        int n = r.n;
        rl_etcd_kvs_free(&r);
        if (n == 0) {
            gone = now() - t0;
            break;
        }
        usleep(100 * 1000);
    }
    cr_assert_geq(gone, 0, "the key outlived its %" PRId64 " s lease by 3 s", ttl);
    cr_assert_gt(gone, (double)ttl * 0.5, "the key went long before its lease ran out");
    int64_t left = -1;
    cr_assert_eq(rl_etcd_lease_keepalive(c, id, &left, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(left, 0);
    /* putting on a lease that is gone is an error naming the call */
    cr_assert_neq(rl_etcd_put(c, "tmp/k", "v", 1, id, NULL, &e), RL_OK);
    cr_assert(strstr(e.msg, "/v3/kv/put") && strstr(e.msg, "lease not found"), "%s", e.msg);
    rl_etcd_free(c);
}

typedef struct writer_arg {
    collect *c;
    int rc;
} writer_arg;

static void *writer_main(void *p) {
    writer_arg *w = p;
    double t0 = rl_now();
    while (!atomic_load(&w->c->created_flag) && rl_now() - t0 < 10) usleep(5000);
    rl_etcd *c = NULL;
    rl_err e = {0};
    w->rc = rl_etcd_new(g_etcd.endpoint, 5, &c, &e);
    if (!w->rc) w->rc = rl_etcd_put(c, "w/1", "a", 1, 0, NULL, &e);
    if (!w->rc) w->rc = rl_etcd_put(c, "other", "x", 1, 0, NULL, &e); /* outside the prefix */
    if (!w->rc) w->rc = rl_etcd_put(c, "w/2", "b", 1, 0, NULL, &e);
    if (!w->rc) w->rc = rl_etcd_delete(c, "w/1", false, NULL, &e);
    rl_etcd_free(c);
    return NULL;
}

Test(etcd, watch_sees_put_and_delete_in_order) {
    rl_etcd *c = client();
    rl_err e = {0};
    collect col = {.stop_after_events = 3};
    writer_arg w = {.c = &col};
    pthread_t th;
    pthread_create(&th, NULL, writer_main, &w);
    int rc = rl_etcd_watch(c, "w/", true, 0, 10, collect_fn, &col, &e);
    pthread_join(th, NULL);
    cr_assert_eq(rc, RL_OK, "%s", e.msg);
    cr_assert_eq(w.rc, RL_OK);
    cr_assert_eq(col.created, 1);
    cr_assert_eq(col.events, 3);
    cr_assert_str_eq(col.keys[0], "w/1");
    cr_assert_eq(col.types[0], RL_ETCD_EV_PUT);
    cr_assert_str_eq(col.keys[1], "w/2");
    cr_assert_eq(col.types[1], RL_ETCD_EV_PUT);
    cr_assert_str_eq(col.keys[2], "w/1");
    cr_assert_eq(col.types[2], RL_ETCD_EV_DELETE);

    /* history from a revision replays the same order */
    rl_etcd_kvs r;
    cr_assert_eq(rl_etcd_range(c, "w/2", false, &r, &e), RL_OK, "%s", e.msg);
    int64_t rev2 = r.kvs[0].mod_rev;
    rl_etcd_kvs_free(&r);
    collect col2 = {.stop_after_events = 2};
    cr_assert_eq(rl_etcd_watch(c, "w/", true, rev2, 10, collect_fn, &col2, &e), RL_OK, "%s", e.msg);
    cr_assert_str_eq(col2.keys[0], "w/2");
    cr_assert_eq(col2.types[1], RL_ETCD_EV_DELETE);
    rl_etcd_free(c);
}

Test(etcd, watch_progress_idle_and_abort) {
    rl_etcd *c = client();
    rl_err e = {0};
    /* the test etcd notifies progress every second: an idle stream is alive */
    collect col = {.stop_after_progress = 1};
    double t0 = now();
    cr_assert_eq(rl_etcd_watch(c, "quiet/", true, 0, 5, collect_fn, &col, &e), RL_OK, "%s", e.msg);
    cr_assert_lt(now() - t0, 4.0);
    /* the abort flag ends a watch within about a second */
    static volatile int flag = 1;
    rl_etcd_set_abort(c, &flag);
    collect col2 = {0};
    t0 = now();
    cr_assert_eq(rl_etcd_watch(c, "quiet/", true, 0, 30, collect_fn, &col2, &e), RL_EABORT, "%s", e.msg);
    cr_assert_lt(now() - t0, 2.5);
    rl_etcd_free(c);
}

Test(etcd, watch_compacted_revision_is_an_error) {
    rl_etcd *c = client();
    rl_err e = {0};
    int64_t rev = 0;
    for (int i = 0; i < 5; i++) cr_assert_eq(rl_etcd_put(c, "cmp/k", "v", 1, 0, &rev, &e), RL_OK);
    char body[64];
    snprintf(body, sizeof body, "{\"revision\":\"%" PRId64 "\",\"physical\":true}", rev);
    raw_post("/v3/kv/compaction", body);
    collect col = {0};
    int rc = rl_etcd_watch(c, "cmp/", true, 2, 10, collect_fn, &col, &e);
    cr_assert_eq(rc, RL_EPEER, "%s", e.msg);
    cr_assert(strstr(e.msg, "compacted"), "%s", e.msg);
    rl_etcd_free(c);
}

Test(etcd, unreachable_is_a_clear_error) {
    rl_etcd *c = NULL;
    rl_err e = {0};
    char ep[64];
    snprintf(ep, sizeof ep, "%s", g_etcd.endpoint);
    rl_test_etcd_kill(&g_etcd);
    cr_assert_eq(rl_etcd_new(ep, 2, &c, &e), RL_OK);
    double t0 = now();
    int64_t id, ttl;
    int rc = rl_etcd_lease_grant(c, 5, &id, &ttl, &e);
    cr_assert(rc == RL_EPEER || rc == RL_ETIMEOUT, "rc %d: %s", rc, e.msg);
    cr_assert(strstr(e.msg, "/v3/lease/grant") && strstr(e.msg, ep + 7), "%s", e.msg);
    cr_assert_lt(now() - t0, 3.0);
    collect col = {0};
    rc = rl_etcd_watch(c, "x/", true, 0, 5, collect_fn, &col, &e);
    cr_assert(rc == RL_EPEER || rc == RL_ETIMEOUT, "rc %d: %s", rc, e.msg);
    /* back on the same port: the same client works again */
    cr_assert_eq(rl_test_etcd_restart(&g_etcd), 0);
    cr_assert_eq(rl_etcd_lease_grant(c, 5, &id, &ttl, &e), RL_OK, "%s", e.msg);
    rl_etcd_free(c);
}

/* ---- the elector backend, driven directly ------------------------------------------ */
typedef struct cand {
    const rl_elect_backend *vt;
    void *ctx;
} cand;

static cand candidate(const char *id, int port, double lease_s) {
    rl_elector_opts o = {.backend = "etcd", .id = id, .addr = "127.0.0.9", .port = port,
                         .lease_s = lease_s, .etcd_endpoint = g_etcd.endpoint,
                         .etcd_key = "/ringleader/job/leader"};
    cand c = {0};
    rl_err e = {0};
    cr_assert_eq(rl_elect_etcd_new(&o, &c.vt, &c.ctx, &e), RL_OK, "%s", e.msg);
    return c;
}

static bool try_lead(cand *c, rl_leader *l) {
    bool leading = false;
    rl_err e = {0};
    cr_assert_eq(c->vt->attempt(c->ctx, &leading, l, &e), RL_OK, "%s", e.msg);
    return leading;
}

Test(etcd, elect_backend_one_leader_takeover_release) {
    cand a = candidate("node-a", 1001, 15), b = candidate("node-b", 1002, 15);
    rl_leader l;
    cr_assert(try_lead(&a, &l));
    cr_assert_str_eq(l.id, "node-a");
    cr_assert_eq(l.port, 1001);
    cr_assert(!try_lead(&b, &l));
    cr_assert_str_eq(l.id, "node-a", "the follower reads the holder");
    cr_assert_str_eq(l.addr, "127.0.0.9");
    cr_assert_eq(l.port, 1001);
    cr_assert(try_lead(&a, &l), "renewing keeps the lead");
    cr_assert(!try_lead(&b, &l));
    /* step_down revokes: b takes over at the next attempt, not after 15 s */
    a.vt->step_down(a.ctx);
    cr_assert(try_lead(&b, &l));
    cr_assert_str_eq(l.id, "node-b");
    cr_assert(!try_lead(&a, &l));
    cr_assert_str_eq(l.id, "node-b");
    /* release deletes the key: a takes over at once */
    rl_err e = {0};
    cr_assert_eq(b.vt->release(b.ctx, &e), RL_OK, "%s", e.msg);
    cr_assert(try_lead(&a, &l));
    cr_assert_str_eq(l.id, "node-a");
    /* a release by a non-leader touches nothing */
    cr_assert_eq(b.vt->release(b.ctx, &e), RL_OK, "%s", e.msg);
    cr_assert(try_lead(&a, &l));
    a.vt->destroy(a.ctx);
    b.vt->destroy(b.ctx);
}

Test(etcd, elect_backend_silent_leader_expires) {
    cand a = candidate("node-a", 1, 2), b = candidate("node-b", 2, 2);
    rl_leader l;
    cr_assert(try_lead(&a, &l));
    /* a stops renewing (paused, killed): b leads once the 2 s lease is gone */
    double t0 = now();
    bool led = false;
    while (!led && now() - t0 < 6.0) {
        led = try_lead(&b, &l);
        if (!led) {
            cr_assert_str_eq(l.id, "node-a");
            usleep(200 * 1000);
        }
    }
    cr_assert(led, "b never took over from a silent leader");
    cr_assert_gt(now() - t0, 1.0, "b took over before a's lease could have expired");
    /* a, back, finds its lease gone and follows */
    cr_assert(!try_lead(&a, &l));
    cr_assert_str_eq(l.id, "node-b");
    a.vt->destroy(a.ctx);
    b.vt->destroy(b.ctx);
}

Test(etcd, elect_backend_garbage_record_is_an_error) {
    cand a = candidate("node-a", 1, 15);
    rl_etcd *c = client();
    rl_err e = {0};
    const char *garbage[] = {"not json", "{\"id\":5,\"addr\":\"x\",\"port\":1}", "{\"id\":\"x\"}",
                             "{\"id\":\"x\",\"addr\":\"y\",\"port\":70000}", "[]", ""};
    for (size_t i = 0; i < sizeof garbage / sizeof *garbage; i++) {
        cr_assert_eq(rl_etcd_put(c, "/ringleader/job/leader", garbage[i], strlen(garbage[i]), 0, NULL, &e),
                     RL_OK, "%s", e.msg);
        bool leading = true;
        rl_leader l = {.id = "untouched"};
        int rc = a.vt->attempt(a.ctx, &leading, &l, &e);
        cr_assert_eq(rc, RL_EIO, "%s: rc %d", garbage[i], rc);
        cr_assert(strstr(e.msg, "/ringleader/job/leader"), "%s", e.msg);
        cr_assert_str_eq(l.id, "untouched", "an error leaves the outputs alone");
    }
    /* deleting it lets the election go on */
    cr_assert_eq(rl_etcd_delete(c, "/ringleader/job/leader", false, NULL, &e), RL_OK);
    rl_leader l;
    cr_assert(try_lead(&a, &l));
    rl_etcd_free(c);
    a.vt->destroy(a.ctx);
}

Test(etcd, elect_backend_bad_options) {
    const rl_elect_backend *vt;
    void *ctx;
    rl_err e = {0};
    rl_elector_opts o = {.id = "a", .addr = "h", .etcd_endpoint = "http://127.0.0.1:1", .etcd_key = "k"};
    rl_elector_opts bad = o;
    bad.etcd_endpoint = NULL;
    cr_assert_eq(rl_elect_etcd_new(&bad, &vt, &ctx, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "etcd_endpoint"), "%s", e.msg);
    bad = o;
    bad.etcd_endpoint = "127.0.0.1:2379";
    cr_assert_eq(rl_elect_etcd_new(&bad, &vt, &ctx, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "etcd_endpoint"), "%s", e.msg);
    bad = o;
    bad.etcd_key = "";
    cr_assert_eq(rl_elect_etcd_new(&bad, &vt, &ctx, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "etcd_key"), "%s", e.msg);
    bad = o;
    bad.addr = NULL;
    cr_assert_eq(rl_elect_etcd_new(&bad, &vt, &ctx, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "addr"), "%s", e.msg);
    /* etcd unreachable: the attempt fails fast naming the call and endpoint */
    cr_assert_eq(rl_elect_etcd_new(&o, &vt, &ctx, &e), RL_OK, "%s", e.msg);
    bool leading = false;
    rl_leader l;
    double t0 = now();
    int rc = vt->attempt(ctx, &leading, &l, &e);
    cr_assert(rc == RL_EPEER || rc == RL_ETIMEOUT, "rc %d %s", rc, e.msg);
    cr_assert(strstr(e.msg, "127.0.0.1:1"), "%s", e.msg);
    cr_assert_lt(now() - t0, 5.0);
    vt->destroy(ctx);
}

Test(etcd_parse, lease_answers) {
    rl_err e = {0};
    int64_t id = 0, ttl = -1;
    const char *g = "{\"header\":{\"revision\":\"1\"},\"ID\":\"4111120196351618566\",\"TTL\":\"5\"}";
    cr_assert_eq(rl_etcd_parse_grant(g, strlen(g), "g", &id, &ttl, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(id, 4111120196351618566LL);
    cr_assert_eq(ttl, 5);
    const char *g0 = "{\"ID\":\"7\",\"TTL\":\"0\"}";
    cr_assert_eq(rl_etcd_parse_grant(g0, strlen(g0), "g", &id, &ttl, &e), RL_EIO);
    /* keepalive of a lease that is gone: TTL left out (0) */
    const char *gone = "{\"result\":{\"header\":{\"revision\":\"2\"},\"ID\":\"12345\"}}";
    cr_assert_eq(rl_etcd_parse_keepalive(gone, strlen(gone), "k", &ttl, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(ttl, 0);
    const char *err = "{\"error\":{\"grpc_code\":14,\"message\":\"etcdserver: no leader\"}}";
    cr_assert_eq(rl_etcd_parse_keepalive(err, strlen(err), "k", &ttl, &e), RL_EPEER);
    cr_assert(strstr(e.msg, "no leader"), "%s", e.msg);
    const char *bad = "{\"result\":{\"TTL\":5}}";
    cr_assert_eq(rl_etcd_parse_keepalive(bad, strlen(bad), "k", &ttl, &e), RL_EIO);
    cr_assert(strstr(e.msg, "'TTL'"), "%s", e.msg);
}

/* ---- the elector through the public API -------------------------------------------- */
#define LEADER_KEY "/ringleader/api/leader"

static rl_elector *elector(const char *id, double lease_s) {
    rl_elector_opts o = {.backend = "etcd", .id = id, .addr = "127.0.0.7", .port = 29400,
                         .lease_s = lease_s, .renew_deadline_s = lease_s * 2 / 3, .retry_s = 0.3,
                         .etcd_endpoint = g_etcd.endpoint, .etcd_key = LEADER_KEY};
    rl_elector *el = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_elector_start(&o, &el, &e), RL_OK, "%s", e.msg);
    return el;
}

/* The id recorded in the leader key ("" when there is none). */
static void key_holder(char *id, size_t n) {
    rl_etcd *c = client();
    rl_etcd_kvs r;
    rl_err e = {0};
    cr_assert_eq(rl_etcd_range(c, LEADER_KEY, false, &r, &e), RL_OK, "%s", e.msg);
    id[0] = '\0';
    rl_leader l;
    if (r.n == 1 && rl_elect_etcd_parse_leader(LEADER_KEY, r.kvs[0].value, r.kvs[0].value_len, &l, &e) == RL_OK)
        snprintf(id, n, "%.63s", l.id);
    rl_etcd_kvs_free(&r);
    rl_etcd_free(c);
}

/* Index of the one elector that leads, -1 if none; fails on two. */
static int sole_leader(rl_elector **els, int n) {
    int who = -1;
    for (int i = 0; i < n; i++) {
        if (!els[i]) continue;
        rl_elect_state st;
        rl_elector_state(els[i], &st);
        if (st.leading) {
            cr_assert_eq(who, -1, "two leaders at once: %d and %d", who, i);
            who = i;
        }
    }
    return who;
}

/* Wait up to limit_s for some elector to lead, checking all along that
 * never more than one does. Returns its index, -1 on timeout. */
static int await_leader(rl_elector **els, int n, double limit_s, int not_this) {
    double t0 = now();
    while (now() - t0 < limit_s) {
        int who = sole_leader(els, n);
        if (who >= 0 && who != not_this) return who;
        usleep(20 * 1000);
    }
    return -1;
}

Test(etcd, elector_two_and_three_candidates_one_leader) {
    for (int n = 2; n <= 3; n++) {
        rl_elector *els[3] = {0};
        char id[3][32];
        for (int i = 0; i < n; i++) {
            snprintf(id[i], sizeof id[i], "cand-%d-%d", n, i);
            els[i] = elector(id[i], 3);
        }
        int who = await_leader(els, n, 5, -1);
        cr_assert_geq(who, 0, "nobody led within 5 s");
        /* stable: the same single leader for a while, seen by everyone */
        double t0 = now();
        while (now() - t0 < 1.0) {
            cr_assert_eq(sole_leader(els, n), who);
            usleep(50 * 1000);
        }
        for (int i = 0; i < n; i++) {
            rl_elect_state st;
            rl_elector_state(els[i], &st);
            cr_assert_str_eq(st.leader.id, id[who], "candidate %d sees '%s'", i, st.leader.id);
            cr_assert_str_eq(st.leader.addr, "127.0.0.7");
            cr_assert_eq(st.leader.port, 29400);
        }
        char holder[64];
        key_holder(holder, sizeof holder);
        cr_assert_str_eq(holder, id[who]);
        for (int i = 0; i < n; i++) rl_elector_stop(els[i], true);
        key_holder(holder, sizeof holder);
        cr_assert_str_eq(holder, "", "release left the key behind");
    }
}

Test(etcd, elector_release_hands_over_at_once) {
    rl_elector *els[2] = {elector("a", 10), elector("b", 10)};
    int who = await_leader(els, 2, 5, -1);
    cr_assert_geq(who, 0);
    double t0 = now();
    rl_elector_stop(els[who], true);
    els[who] = NULL;
    int next = await_leader(els, 2, 3, -1);
    cr_assert_geq(next, 0, "nobody took over within 3 s of a release (lease 10 s)");
    cr_assert_lt(now() - t0, 2.0, "takeover after release waited for the lease");
    rl_elector_stop(els[next], true);
}

Test(etcd, elector_killed_leader_replaced_after_its_lease) {
    const double lease = 3, retry = 0.3;
    /* the first leader is a child process, so it can die for real */
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
        rl_elector *el = elector("doomed", lease);
        (void)el;
        for (;;) pause();
    }
    char holder[64] = "";
    double t0 = now();
    while (strcmp(holder, "doomed") != 0 && now() - t0 < 10) {
        usleep(50 * 1000);
        key_holder(holder, sizeof holder);
    }
    cr_assert_str_eq(holder, "doomed", "the child never led");
    rl_elector *els[2] = {elector("heir-a", lease), elector("heir-b", lease)};
    usleep(200 * 1000);
    cr_assert_eq(sole_leader(els, 2), -1, "a follower led while the child held the lease");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    double killed = now();
    int who = await_leader(els, 2, lease + retry + 3, -1);
    double took = now() - killed;
    cr_assert_geq(who, 0, "nobody took over within lease + retry + 3 s");
    cr_assert_lt(took, lease + retry + 1.5, "took %.2f s", took);
    /* the child renewed at most a retry period (+ a call) before it died */
    cr_assert_gt(took, lease - retry - 1.0, "took over after %.2f s, before the lease could expire", took);
    rl_elector_stop(els[0], true);
    rl_elector_stop(els[1], true);
}

Test(etcd, elector_garbage_key_errors_then_recovers) {
    rl_etcd *c = client();
    rl_err e = {0};
    cr_assert_eq(rl_etcd_put(c, LEADER_KEY, "{\"id\":", 6, 0, NULL, &e), RL_OK, "%s", e.msg);
    rl_elector *els[2] = {elector("a", 3), elector("b", 3)};
    rl_elect_state st;
    double t0 = now();
    do {
        usleep(50 * 1000);
        rl_elector_state(els[0], &st);
    } while (st.errors < 2 && now() - t0 < 5);
    cr_assert_geq(st.errors, 2, "no errors reported for a garbage leader key");
    cr_assert(strstr(st.last_error, LEADER_KEY), "%s", st.last_error);
    cr_assert_eq(sole_leader(els, 2), -1);
    cr_assert_eq(rl_etcd_delete(c, LEADER_KEY, false, NULL, &e), RL_OK);
    cr_assert_geq(await_leader(els, 2, 3, -1), 0, "no leader after the garbage was deleted");
    t0 = now();
    do {
        usleep(50 * 1000);
        rl_elector_state(els[0], &st);
    } while (st.errors != 0 && now() - t0 < 2);
    cr_assert_eq(st.errors, 0, "the error count stays after recovery: %s", st.last_error);
    rl_elector_stop(els[0], true);
    rl_elector_stop(els[1], true);
    rl_etcd_free(c);
}

Test(etcd, elector_etcd_outage_no_split_brain_and_recovery) {
    const double lease = 3;
    rl_elector *els[2] = {elector("a", lease), elector("b", lease)};
    int who = await_leader(els, 2, 5, -1);
    cr_assert_geq(who, 0);
    rl_test_etcd_kill(&g_etcd);
    double t0 = now();
    /* the leader cannot renew: it steps down within the renew deadline (2 s) */
    while (sole_leader(els, 2) >= 0 && now() - t0 < 2 + 0.3 + 1.5) usleep(20 * 1000);
    cr_assert_eq(sole_leader(els, 2), -1, "still leading %.1f s into an etcd outage", now() - t0);
    rl_elect_state st;
    rl_elector_state(els[who], &st);
    cr_assert_gt(st.errors, 0);
    cr_assert(strstr(st.last_error, g_etcd.endpoint + 7), "%s", st.last_error);
    cr_assert_eq(rl_test_etcd_restart(&g_etcd), 0);
    cr_assert_geq(await_leader(els, 2, lease + 5, -1), 0, "no leader after etcd came back");
    t0 = now();
    while (now() - t0 < 1.0) {
        sole_leader(els, 2);
        usleep(50 * 1000);
    }
    rl_elector_stop(els[0], true);
    rl_elector_stop(els[1], true);
}

/* ---- membership through the public API ------------------------------------------------ */
#define MEMBER_PREFIX "/ringleader/api/members/"

static rl_members *member(const char *id, double ttl) {
    rl_members_opts o = {.backend = "etcd", .etcd_endpoint = g_etcd.endpoint,
                         .etcd_prefix = MEMBER_PREFIX, .self_id = id, .self_addr = "127.0.0.3",
                         .ttl_s = ttl};
    rl_members *m = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_members_start(&o, &m, &e), RL_OK, "%s", e.msg);
    return m;
}

/* Wait until m's set is exactly `want` (comma-separated sorted ids). */
static bool await_set(rl_members *m, const char *want, double limit_s) {
    double t0 = now();
    uint64_t ver = 0;
    /* the first publication (version 0 -> 1) before any snapshot: members.c's
     * snapshot of a never-set list memcpy()s from NULL (UBSan) */
    rl_members_wait(m, 0, limit_s);
    for (;;) {
        rl_peer p[16];
        bool synced = false;
        int n = rl_members_snapshot(m, p, 16, &ver, &synced);
        char got[512] = "";
        for (int i = 0; i < n && i < 16; i++) {
            if (i) strcat(got, ",");
            strncat(got, p[i].id, 60);
            cr_assert(p[i].ready && !p[i].terminating);
            cr_assert_str_eq(p[i].addr, "127.0.0.3");
        }
        if (synced && strcmp(got, want) == 0) return true;
        double left = limit_s - (now() - t0);
        if (left <= 0) {
            cr_log_error("set is '%s', want '%s'", got, want);
            return false;
        }
        rl_members_wait(m, ver, left < 0.5 ? left : 0.5);
    }
}

Test(etcd, members_three_appear_one_dies_one_leaves) {
    const double ttl = 3;
    /* Fork before this process starts any thread: a child forked from a
     * threaded parent can inherit a lock held mid-call (seen under ASan:
     * node-c never appeared). */
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        member("node-c", ttl);
        for (;;) pause();
    }
    rl_members *a = member("node-a", ttl), *b = member("node-b", ttl);
    cr_assert(await_set(a, "node-a,node-b,node-c", 5));
    cr_assert(await_set(b, "node-a,node-b,node-c", 5));
    /* a node that dies stops renewing: it goes once its TTL runs out */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    double t0 = now();
    cr_assert(await_set(a, "node-a,node-b", ttl + 2));
    double took = now() - t0;
    cr_assert_gt(took, ttl / 3, "a killed node vanished after %.2f s, before its lease could expire", took);
    cr_assert(await_set(b, "node-a,node-b", 1));
    /* a clean stop revokes: it goes at once */
    t0 = now();
    rl_members_stop(b);
    cr_assert(await_set(a, "node-a", 1.5));
    rl_members_stop(a);
}

Test(etcd, members_garbage_key_ignored) {
    rl_etcd *c = client();
    rl_err e = {0};
    cr_assert_eq(rl_etcd_put(c, MEMBER_PREFIX "bogus", "junk", 4, 0, NULL, &e), RL_OK);
    cr_assert_eq(rl_etcd_put(c, MEMBER_PREFIX "liar", "{\"id\":\"other\",\"addr\":\"x\"}", 26, 0, NULL, &e),
                 RL_OK);
    rl_members *a = member("node-a", 3);
    cr_assert(await_set(a, "node-a", 5));
    /* and changed into garbage while watched: the node drops out, nothing breaks */
    rl_members *b = member("node-b", 3);
    cr_assert(await_set(a, "node-a,node-b", 5));
    cr_assert_eq(rl_etcd_put(c, MEMBER_PREFIX "node-b", "[]", 2, 0, NULL, &e), RL_OK);
    /* node-b's keeper notices its key was changed and writes it back */
    cr_assert(await_set(a, "node-a,node-b", 5));
    rl_members_stop(b);
    rl_members_stop(a);
    rl_etcd_free(c);
}

Test(etcd, members_etcd_outage_and_recovery) {
    rl_members *a = member("node-a", 3), *b = member("node-b", 3);
    cr_assert(await_set(a, "node-a,node-b", 5));
    rl_test_etcd_kill(&g_etcd);
    usleep(1500 * 1000);
    cr_assert_eq(rl_test_etcd_restart(&g_etcd), 0);
    rl_members *c = member("node-c", 3);
    cr_assert(await_set(a, "node-a,node-b,node-c", 8), "no recovery after etcd came back");
    cr_assert(await_set(c, "node-a,node-b,node-c", 5));
    rl_members_stop(c);
    /* a's watch may still be re-establishing itself after the outage (it
     * backs off with jitter, slower under ASan): within its resync, not at once */
    cr_assert(await_set(a, "node-a,node-b", 8));
    rl_members_stop(b);
    rl_members_stop(a);
}
