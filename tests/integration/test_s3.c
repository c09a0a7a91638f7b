/* pkg/s3 against a real radosgw (it checks every signature), directly and
 * through a fault-injecting proxy. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "faultproxy.h"
#include "rgwtest.h"
#include "s3/s3.h"
#include "s3/s3_internal.h"
#include "util/util.h"

static rl_test_rgw g_rgw = {.mon_pid = -1, .osd_pid = -1, .rgw_pid = -1};

static void up(void) { cr_assert_eq(rl_test_rgw_start(&g_rgw, 1024), 0, "radosgw did not start"); }
static void down(void) { rl_test_rgw_stop(&g_rgw); }

/* A client for endpoint (the server's unless given) with the server's keys, or another secret. */
static rl_s3 *client(const char *endpoint, const char *secret, int attempts) {
    rl_s3_config c = {0};
    snprintf(c.endpoint, sizeof c.endpoint, "%s", endpoint ? endpoint : g_rgw.endpoint);
    snprintf(c.region, sizeof c.region, "us-east-1");
    c.part_size = 5u << 20, c.multipart_threshold = 8u << 20, c.parallel = 4;
    c.retry = (rl_http_backoff){.base_s = 0.05, .cap_s = 0.2, .attempts = attempts};
    rl_err e = {0};
    cr_assert_eq(rl_s3_creds_static(g_rgw.access_key, secret ? secret : g_rgw.secret_key, NULL, &c.creds, &e), 0);
    rl_s3 *s;
    cr_assert_eq(rl_s3_open(&c, &s, &e), 0, "%s", e.msg);
    return s;
}

Test(s3, objects_ranges_listing_and_deletes, .init = up, .fini = down, .timeout = 180) {
    rl_s3 *s = client(NULL, NULL, 3);
    rl_err e = {0};
    cr_assert_eq(rl_s3_create_bucket(s, "objs", &e), 0, "%s", e.msg);
    const char *k = "dir/a b+c~\xc3\xa9.txt"; /* the canonicalisation cases, signed for real */
    rl_s3_part parts[] = {{"hello, ", 7}, {"world", 5}};
    cr_assert_eq(rl_s3_put(s, "objs", k, parts, 2, &e), 0, "%s", e.msg);
    void *b;
    size_t n;
    cr_assert_eq(rl_s3_get(s, "objs", k, 0, UINT64_MAX, &b, &n, &e), 0, "%s", e.msg);
    cr_expect(n == 12 && !memcmp(b, "hello, world", 12));
    free(b);
    cr_assert_eq(rl_s3_get(s, "objs", k, 7, 3, &b, &n, &e), 0, "%s", e.msg);
    cr_expect(n == 3 && !memcmp(b, "wor", 3));
    free(b);
    cr_assert_eq(rl_s3_get(s, "objs", k, 9, UINT64_MAX, &b, &n, &e), 0, "%s", e.msg);
    cr_expect(n == 3 && !memcmp(b, "rld", 3));
    free(b);
    bool found;
    uint64_t size;
    cr_assert_eq(rl_s3_head(s, "objs", k, &found, &size, &e), 0, "%s", e.msg);
    cr_expect(found && size == 12);
    cr_assert_eq(rl_s3_head(s, "objs", "nope", &found, &size, &e), 0, "%s", e.msg);
    cr_expect(!found);
    cr_expect_eq(rl_s3_get(s, "objs", "nope", 0, UINT64_MAX, &b, &n, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "NoSuchKey") && strstr(e.msg, "objs/nope"), "%s", e.msg);
    /* listing over pages: 25 keys, 7 per page */
    char key[64];
    for (int i = 0; i < 25; i++) {
        snprintf(key, sizeof key, "many/%02d", 24 - i);
        cr_assert_eq(rl_s3_put(s, "objs", key, &(rl_s3_part){key, strlen(key)}, 1, &e), 0, "%s", e.msg);
    }
    rl_s3_list_page_size = 7;
    rl_s3_list l;
    cr_assert_eq(rl_s3_list_objects(s, "objs", "many/", &l, &e), 0, "%s", e.msg);
    rl_s3_list_page_size = 0;
    cr_assert_eq(l.n, 25);
    for (int i = 0; i < 25; i++) {
        snprintf(key, sizeof key, "many/%02d", i);
        cr_expect_str_eq(l.keys[i], key);
        cr_expect_eq(l.sizes[i], strlen(key));
    }
    rl_s3_list_free(&l);
    cr_assert_eq(rl_s3_delete(s, "objs", "many/03", &e), 0, "%s", e.msg);
    cr_assert_eq(rl_s3_delete(s, "objs", "many/03", &e), 0, "deleting a missing key is fine: %s", e.msg);
    cr_assert_eq(rl_s3_list_objects(s, "objs", "many/0", &l, &e), 0, "%s", e.msg);
    cr_expect_eq(l.n, 9);
    rl_s3_list_free(&l);
    cr_expect_eq(rl_s3_list_objects(s, "no-such-bucket", "", &l, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "NoSuchBucket"), "%s", e.msg);
    rl_s3_close(s);
}

Test(s3, multipart_upload_of_200_MiB, .init = up, .fini = down, .timeout = 300) {
    rl_s3 *s = client(NULL, NULL, 3);
    rl_err e = {0};
    cr_assert_eq(rl_s3_create_bucket(s, "big", &e), 0, "%s", e.msg);
    size_t n = 200u << 20;
    unsigned char *d = malloc(n);
    for (size_t i = 0; i < n; i++) d[i] = (unsigned char)(i * 2654435761u >> 13);
    /* three uneven pieces: parts straddle them */
    rl_s3_part parts[] = {{d, 3u << 20}, {d + (3u << 20), 100u << 20}, {d + (103u << 20), n - (103u << 20)}};
    double t0 = rl_now();
    cr_assert_eq(rl_s3_put(s, "big", "ckpt/model.safetensors", parts, 3, &e), 0, "%s", e.msg);
    double dt = rl_now() - t0;
    cr_log_info("200 MiB multipart upload (5 MiB parts, 4 in flight): %.2f s, %.0f MiB/s", dt, 200 / dt);
    void *b;
    size_t got;
    cr_assert_eq(rl_s3_get(s, "big", "ckpt/model.safetensors", 0, UINT64_MAX, &b, &got, &e), 0, "%s", e.msg);
    char h1[65], h2[65];
    rl_s3_sha256_hex(d, n, h1);
    rl_s3_sha256_hex(b, got, h2);
    cr_expect(got == n && !strcmp(h1, h2), "read back %zu bytes, sha256 %s vs %s", got, h2, h1);
    free(b);
    free(d);
    rl_s3_close(s);
}

Test(s3, wrong_secret_is_refused_clearly, .init = up, .fini = down, .timeout = 120) {
    rl_s3 *s = client(NULL, "not-the-secret-at-all", 3);
    rl_err e = {0};
    cr_expect_eq(rl_s3_create_bucket(s, "nope", &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "403") && strstr(e.msg, "SignatureDoesNotMatch"), "%s", e.msg);
    cr_expect(!strstr(e.msg, "not-the-secret") && !strstr(e.msg, g_rgw.secret_key), "a secret leaked: %s", e.msg);
    rl_s3_close(s);
    /* a clock 20 minutes off: refused as skewed */
    s = client(NULL, NULL, 1);
    s->clock_skew_s = 1200;
    cr_expect_eq(rl_s3_create_bucket(s, "skew", &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "RequestTimeTooSkewed"), "%s", e.msg);
    rl_s3_close(s);
}

Test(s3, retries_through_injected_faults, .init = up, .fini = down, .timeout = 300) {
    rl_fault_proxy *p;
    cr_assert_eq(rl_fault_proxy_start("127.0.0.1", g_rgw.port, &p), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", rl_fault_proxy_port(p));
    rl_s3 *s = client(ep, NULL, 5);
    rl_err e = {0};
    cr_assert_eq(rl_s3_create_bucket(s, "flaky", &e), 0, "%s", e.msg);
    /* 503 SlowDown twice, then through */
    rl_fault_proxy_inject(p, RL_FAULT_SLOWDOWN, 2, NULL);
    int before = rl_fault_proxy_requests(p);
    cr_assert_eq(rl_s3_put(s, "flaky", "a", &(rl_s3_part){"abc", 3}, 1, &e), 0, "%s", e.msg);
    cr_expect_eq(rl_fault_proxy_injected(p), 2);
    cr_expect_eq(rl_fault_proxy_requests(p) - before, 3, "two refused attempts and one that went through");
    /* connections dropped without an answer, twice */
    rl_fault_proxy_inject(p, RL_FAULT_DROP, 2, NULL);
    void *b;
    size_t n;
    cr_assert_eq(rl_s3_get(s, "flaky", "a", 0, UINT64_MAX, &b, &n, &e), 0, "%s", e.msg);
    cr_expect(n == 3 && !memcmp(b, "abc", 3));
    free(b);
    cr_expect_eq(rl_fault_proxy_injected(p), 4);
    /* a multipart upload whose parts and completion meet 500s and an <Error> inside a 200 */
    size_t big = 12u << 20;
    char *d = malloc(big);
    for (size_t i = 0; i < big; i++) d[i] = (char)(i * 31);
    rl_fault_proxy_inject(p, RL_FAULT_INTERNAL, 2, "partNumber=2");
    cr_assert_eq(rl_s3_put(s, "flaky", "mp", &(rl_s3_part){d, big}, 1, &e), 0, "%s", e.msg);
    cr_expect_eq(rl_fault_proxy_injected(p), 6);
    rl_fault_proxy_inject(p, RL_FAULT_ERROR_IN_200, 1, "POST /flaky/mp?uploadId=");
    cr_assert_eq(rl_s3_put(s, "flaky", "mp", &(rl_s3_part){d, big}, 1, &e), 0, "%s", e.msg);
    cr_expect_eq(rl_fault_proxy_injected(p), 7, "the <Error> in a 200 must have been seen and retried");
    cr_assert_eq(rl_s3_get(s, "flaky", "mp", 0, UINT64_MAX, &b, &n, &e), 0, "%s", e.msg);
    cr_expect(n == big && !memcmp(b, d, big));
    free(b);
    /* more faults than attempts: a clear error, in bounded time */
    rl_fault_proxy_inject(p, RL_FAULT_SLOWDOWN, 100, NULL);
    double t0 = rl_now();
    cr_expect_eq(rl_s3_put(s, "flaky", "b", &(rl_s3_part){"x", 1}, 1, &e), RL_EIO);
    cr_expect(strstr(e.msg, "503 SlowDown") && strstr(e.msg, "retries exhausted"), "%s", e.msg);
    cr_expect(rl_now() - t0 < 10, "gave up after %.1f s", rl_now() - t0);
    /* and a failed multipart upload is aborted: no object, no upload left */
    rl_fault_proxy_inject(p, RL_FAULT_INTERNAL, 100, "partNumber=3");
    cr_expect_eq(rl_s3_put(s, "flaky", "half", &(rl_s3_part){d, big}, 1, &e), RL_EIO);
    rl_fault_proxy_inject(p, 0, 0, NULL);
    bool found;
    cr_assert_eq(rl_s3_head(s, "flaky", "half", &found, NULL, &e), 0, "%s", e.msg);
    cr_expect(!found, "a failed upload must leave no object");
    free(d);
    rl_s3_close(s);
    rl_fault_proxy_stop(p);
}
