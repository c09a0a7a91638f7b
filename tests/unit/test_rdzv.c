/* rdzv: the store's wire frame and request handling, the TCP store server
 * and client against each other (threads and forked processes), failure
 * modes that must be errors and never hangs, and the static environment
 * readers (torchrun, SLURM, Kubeflow PET_*). Every server listens on an
 * ephemeral port on 127.0.0.1, so tests can run in parallel. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "children.h"
#include "rdzv/rdzv.h"
#include "store/store_db.h"

/* ---- helpers ------------------------------------------------------------------------ */
static rl_store_server *start_server(int *port) {
    rl_store_server *s = NULL;
    rl_err e = {0};
    rl_log_set_level(RL_LOG_ERROR); /* keep the test output to failures */
    cr_assert_eq(rl_store_server_start("127.0.0.1", 0, &s, &e), RL_OK, "%s", e.msg);
    *port = rl_store_server_port(s);
    cr_assert(*port > 0);
    return s;
}

static rl_store *client(int port) {
    rl_store *c = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_store_connect("127.0.0.1", port, 5.0, &c, &e), RL_OK, "%s", e.msg);
    return c;
}

/* A blocking raw socket with a receive timeout, for speaking bad protocol. */
static int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {.tv_sec = 3};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Read until EOF (or the 3 s receive timeout); returns bytes read. */
static size_t raw_read_all(int fd, uint8_t *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, buf + got, n - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
    }
    return got;
}

static void wait_children(pid_t *pids, int n) {
    int st[RL_TEST_MAX_CHILDREN];
    cr_assert_eq(rl_test_wait_n(pids, n, 60, st), 0, "a child still ran after 60 s (killed)");
    for (int i = 0; i < n; i++)
        cr_expect(WIFEXITED(st[i]) && WEXITSTATUS(st[i]) == 0, "child %d failed (status %d)", i, st[i]);
}

static void sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* ---- frames ------------------------------------------------------------------------- */
Test(rdzv_frame, round_trip) {
    rl_store_frame f = {.version = RL_STORE_VERSION, .op = RL_STORE_CAS, .status = RL_STORE_MISMATCH,
                        .klen = RL_STORE_MAX_KEY, .vlen = RL_STORE_MAX_VALUE, .v2len = 7};
    uint8_t b[RL_STORE_HEADER_BYTES];
    rl_store_frame_encode(b, &f);
    /* big-endian on the wire */
    cr_expect_eq(b[0], 'R');
    cr_expect_eq(b[3], 'T');
    cr_expect_eq(b[5], 1);
    cr_expect_eq(b[7], RL_STORE_CAS);
    cr_expect_eq(b[23], 7);
    rl_store_frame g;
    rl_err e = {0};
    cr_assert_eq(rl_store_frame_parse(b, sizeof b, "p:1", &g, &e), RL_OK, "%s", e.msg);
    cr_expect(memcmp(&f, &g, sizeof f) == 0);
}

static int parse_bytes(const uint8_t *b, size_t n, rl_err *e) {
    rl_store_frame g = {.op = 99};
    int rc = rl_store_frame_parse(b, n, "127.0.0.1:29400", &g, e);
    if (rc != RL_OK) cr_expect_eq(g.op, 99, "output touched on error");
    return rc;
}

Test(rdzv_frame, rejections_name_the_peer_and_cause) {
    rl_store_frame f = {.version = 1, .op = RL_STORE_GET, .klen = 3, .vlen = 4};
    uint8_t b[RL_STORE_HEADER_BYTES], c[RL_STORE_HEADER_BYTES];
    rl_store_frame_encode(b, &f);
    rl_err e = {0};
    cr_expect_eq(parse_bytes(b, 23, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "short frame header"), "%s", e.msg);

    memcpy(c, b, sizeof c);
    memcpy(c, "HTTP", 4);
    cr_expect_eq(parse_bytes(c, sizeof c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "store 127.0.0.1:29400: bad magic"), "%s", e.msg);

    memcpy(c, b, sizeof c);
    c[5] = 2;
    cr_expect_eq(parse_bytes(c, sizeof c, &e), RL_EINPUT);
    cr_expect_str_eq(e.msg, "store 127.0.0.1:29400: protocol version 2, expected 1");

    memcpy(c, b, sizeof c);
    c[7] = 0;
    cr_expect_eq(parse_bytes(c, sizeof c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "unknown op 0"), "%s", e.msg);
    c[7] = RL_STORE_AUTH + 1;
    cr_expect_eq(parse_bytes(c, sizeof c, &e), RL_EINPUT);

    memcpy(c, b, sizeof c);
    put_be32(c + 8, RL_STORE_EAUTH + 1);
    cr_expect_eq(parse_bytes(c, sizeof c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "unknown status 6"), "%s", e.msg);

    memcpy(c, b, sizeof c);
    put_be32(c + 12, RL_STORE_MAX_KEY + 1);
    cr_expect_eq(parse_bytes(c, sizeof c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "key length 1025"), "%s", e.msg);

    memcpy(c, b, sizeof c);
    put_be32(c + 16, RL_STORE_MAX_VALUE + 1);
    cr_expect_eq(parse_bytes(c, sizeof c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "value length"), "%s", e.msg);

    memcpy(c, b, sizeof c);
    put_be32(c + 20, 0xffffffffu);
    cr_expect_eq(parse_bytes(c, sizeof c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "value2 length"), "%s", e.msg);
}

/* The pure request handler, without sockets. */
Test(rdzv_frame, db_step_partial_foreign_and_full) {
    rl_store_db *db = rl_store_db_new(1000);
    rl_store_session sess = {0};
    cr_assert(db);
    rl_store_buf out = {0};
    rl_store_step st;
    rl_err e = {0};
    uint8_t req[64];
    rl_store_frame f = {.version = 1, .op = RL_STORE_SET, .klen = 1, .vlen = 3};
    rl_store_frame_encode(req, &f);
    memcpy(req + 24, "kabc", 4);
    /* every proper prefix is "need more", with the right need once the header is in */
    for (size_t n = 0; n < 28; n++) {
        cr_assert_eq(rl_store_db_step(db, &sess, req, n, "c", &out, &st, &e), RL_STORE_STEP_MORE, "n=%zu", n);
        cr_expect_eq(st.need, n < 24 ? 24u : 28u);
    }
    cr_expect_eq(out.len, 0);
    cr_assert_eq(rl_store_db_step(db, &sess, req, 28, "c", &out, &st, &e), RL_STORE_STEP_REPLY);
    cr_expect_eq(st.used, 28);
    cr_expect(st.wrote);
    cr_expect_eq(out.len, 24);
    cr_expect_eq(rl_store_db_count(db), 1);
    /* a foreign protocol is refused from its first bytes, before a full header */
    out.len = 0;
    cr_expect_eq(rl_store_db_step(db, &sess, (const uint8_t *)"GET / HTTP/1.1\r\n", 16, "c", &out, &st, &e),
                 RL_STORE_STEP_ERROR);
    rl_store_frame g;
    cr_assert_eq(rl_store_frame_parse(out.p, out.len, "s", &g, &e), RL_OK);
    cr_expect_eq(g.status, RL_STORE_EPROTO);
    cr_expect_eq(out.len, 24u + g.vlen);
    /* over the memory bound: EFULL, store unchanged */
    uint8_t big[24 + 1 + 2000];
    f = (rl_store_frame){.version = 1, .op = RL_STORE_SET, .klen = 1, .vlen = 2000};
    rl_store_frame_encode(big, &f);
    memset(big + 24, 'x', sizeof big - 24);
    out.len = 0;
    cr_assert_eq(rl_store_db_step(db, &sess, big, sizeof big, "c", &out, &st, &e), RL_STORE_STEP_REPLY);
    cr_assert_eq(rl_store_frame_parse(out.p, out.len, "s", &g, &e), RL_OK);
    cr_expect_eq(g.status, RL_STORE_EFULL);
    cr_expect_eq(rl_store_db_count(db), 1);
    /* a GET with a malformed wait is a protocol error naming the cause */
    f = (rl_store_frame){.version = 1, .op = RL_STORE_GET, .klen = 1, .vlen = 3};
    rl_store_frame_encode(req, &f);
    out.len = 0;
    cr_expect_eq(rl_store_db_step(db, &sess, req, 28, "client 1.2.3.4:5", &out, &st, &e), RL_STORE_STEP_ERROR);
    cr_expect(strstr(e.msg, "client 1.2.3.4:5") && strstr(e.msg, "GET value is 3 bytes, expected 4"),
              "%s", e.msg);
    rl_store_buf_free(&out);
    rl_store_db_free(db);
}

/* Before authentication the header alone decides: nothing bigger than a
 * handshake frame is ever waited for. */
static rl_store_step_result step_header(rl_store_db *db, rl_store_session *sess, uint16_t op,
                                        uint32_t klen, uint32_t vlen, uint32_t v2len,
                                        rl_store_step *st, rl_store_frame *ans, rl_err *e) {
    uint8_t hdr[RL_STORE_HEADER_BYTES];
    rl_store_frame f = {.version = 1, .op = op, .klen = klen, .vlen = vlen, .v2len = v2len};
    rl_store_frame_encode(hdr, &f);
    rl_store_buf out = {0};
    rl_store_step_result r = rl_store_db_step(db, sess, hdr, sizeof hdr, "client 1.2.3.4:5", &out, st, e);
    memset(ans, 0, sizeof *ans);
    if (out.len) cr_assert_eq(rl_store_frame_parse(out.p, out.len, "s", ans, e), RL_OK);
    rl_store_buf_free(&out);
    return r;
}

Test(rdzv_frame, unauthenticated_frames_are_judged_from_the_header) {
    rl_store_db *db = rl_store_db_new(1 << 20);
    cr_assert(db && rl_store_db_set_secret(db, "s", 1) == 0);
    rl_store_session sess = {0};
    rl_store_step st;
    rl_store_frame a;
    rl_err e = {0};
    /* a 64 MiB SET: refused from its 24 header bytes, EAUTH */
    cr_expect_eq(step_header(db, &sess, RL_STORE_SET, 1, RL_STORE_MAX_VALUE, 0, &st, &a, &e), RL_STORE_STEP_ERROR);
    cr_expect(a.status == RL_STORE_EAUTH && st.auth_failed && st.used == 0);
    cr_expect(strstr(e.msg, "client 1.2.3.4:5: SET before authentication"), "%s", e.msg);
    cr_expect_eq(step_header(db, &sess, RL_STORE_CAS, 1, 0, 5, &st, &a, &e), RL_STORE_STEP_ERROR);
    cr_expect_eq(a.status, RL_STORE_EAUTH);
    /* handshake ops of the wrong size: EPROTO naming the field */
    static const struct { uint16_t op; uint32_t k, v, v2; const char *want; } bad[] = {
        {RL_STORE_CHALLENGE, 5, 65, 0, "CHALLENGE before authentication: value is 65 bytes, expected 16..64"},
        {RL_STORE_CHALLENGE, 5, 15, 0, "value is 15 bytes, expected 16..64"},
        {RL_STORE_CHALLENGE, 0, 32, 0, "key (client id) is 0 bytes, expected 1..1024"},
        {RL_STORE_AUTH, 5, RL_STORE_MAX_VALUE, 0, "AUTH before authentication: value is 67108864 bytes, expected 32"},
        {RL_STORE_AUTH, 5, 32, 1, "value2 is 1 bytes"},
        {RL_STORE_PING, 5, 0, 0, "PING before authentication: key (client id) is 5 bytes, expected 0"},
        {RL_STORE_PING, 0, 1, 0, "value is 1 bytes, expected 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(step_header(db, &sess, bad[i].op, bad[i].k, bad[i].v, bad[i].v2, &st, &a, &e),
                     RL_STORE_STEP_ERROR, "case %zu", i);
        cr_expect(a.status == RL_STORE_EPROTO && strstr(e.msg, bad[i].want), "case %zu: %s", i, e.msg);
    }
    /* the real handshake frames wait for their (small) bodies */
    cr_expect_eq(step_header(db, &sess, RL_STORE_CHALLENGE, RL_STORE_MAX_KEY, RL_STORE_NONCE_MAX, 0, &st, &a, &e),
                 RL_STORE_STEP_MORE);
    cr_expect_eq(st.need, RL_STORE_HANDSHAKE_MAX);
    cr_expect_eq(step_header(db, &sess, RL_STORE_AUTH, 9, 32, 0, &st, &a, &e), RL_STORE_STEP_MORE);
    cr_expect_eq(step_header(db, &sess, RL_STORE_PING, 0, 0, 0, &st, &a, &e), RL_STORE_STEP_REPLY);
    /* authenticated, or on an open store, a big value is just a big value */
    sess.authed = true;
    cr_expect_eq(step_header(db, &sess, RL_STORE_SET, 1, RL_STORE_MAX_VALUE, 0, &st, &a, &e), RL_STORE_STEP_MORE);
    cr_expect_eq(st.need, RL_STORE_HEADER_BYTES + 1 + (size_t)RL_STORE_MAX_VALUE);
    rl_store_db *open = rl_store_db_new(1 << 20);
    rl_store_session s0 = {0};
    cr_expect_eq(step_header(open, &s0, RL_STORE_SET, 1, RL_STORE_MAX_VALUE, 0, &st, &a, &e), RL_STORE_STEP_MORE);
    /* the pure judge itself */
    rl_store_frame f = {.version = 1, .op = RL_STORE_AUTH, .klen = 1, .vlen = 32};
    cr_expect_eq(rl_store_judge_unauth(&f, NULL, &e), RL_STORE_PRE_OK);
    f.op = RL_STORE_GET, f.vlen = 4;
    cr_expect_eq(rl_store_judge_unauth(&f, NULL, &e), RL_STORE_PRE_REFUSED);
    cr_expect(strstr(e.msg, "store ?: GET before authentication"), "%s", e.msg);
    rl_store_db_free(open);
    rl_store_db_free(db);
}

Test(rdzv_frame, key_desc_escapes_binary) {
    char d[96];
    cr_expect_str_eq(rl_store_key_desc(d, sizeof d, "a\0b'\n", 5), "a\\x00b\\x27\\x0a");
    char longk[300];
    memset(longk, 'k', sizeof longk);
    rl_store_key_desc(d, sizeof d, longk, sizeof longk);
    cr_expect(strlen(d) <= 84 && strstr(d, "..."), "%s", d);
}

/* ---- store: basics ------------------------------------------------------------------ */
Test(rdzv_store, set_get_overwrite) {
    int port;
    rl_store_server *srv = start_server(&port);
    rl_store *c = client(port);
    rl_err e = {0};
    cr_assert_eq(rl_store_set(c, "a", "hello", 5, &e), RL_OK, "%s", e.msg);
    void *v = NULL;
    size_t n = 0;
    cr_assert_eq(rl_store_get(c, "a", 1.0, &v, &n, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(n, 5);
    cr_expect_str_eq((char *)v, "hello"); /* NUL-terminated for convenience */
    free(v);
    cr_assert_eq(rl_store_set(c, "a", "xy", 2, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_store_get(c, "a", 0, &v, &n, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(n, 2);
    cr_expect(memcmp(v, "xy", 2) == 0);
    free(v);
    /* a second client sees the same store */
    rl_store *d = client(port);
    cr_assert_eq(rl_store_get(d, "a", 0, &v, &n, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(n, 2);
    free(v);
    rl_store_close(d);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_store, default_host_listens_on_all_interfaces) {
    rl_store_server *s = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_store_server_start(NULL, 0, &s, &e), RL_OK, "%s", e.msg);
    rl_store *c = client(rl_store_server_port(s));
    cr_expect_eq(rl_store_set(c, "k", "v", 1, &e), RL_OK, "%s", e.msg);
    rl_store_close(c);
    rl_store_server_stop(s);
}

Test(rdzv_store, binary_values_empty_zero_bytes_and_1mib) {
    int port;
    rl_store_server *srv = start_server(&port);
    rl_store *c = client(port);
    rl_err e = {0};
    void *v = NULL;
    size_t n = 99;
    cr_assert_eq(rl_store_set(c, "empty", "", 0, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_store_get(c, "empty", 0, &v, &n, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(n, 0);
    cr_expect_eq(((char *)v)[0], '\0');
    free(v);
    const uint8_t zeros[5] = {0, 1, 0, 0xff, 0};
    cr_assert_eq(rl_store_set(c, "zeros", zeros, 5, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_store_get(c, "zeros", 0, &v, &n, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(n, 5);
    cr_expect(memcmp(v, zeros, 5) == 0);
    free(v);
    size_t big = 1u << 20;
    uint8_t *b = malloc(big);
    uint64_t x = 42;
    for (size_t i = 0; i < big; i++) b[i] = (uint8_t)(rl_splitmix64(&x) >> 56);
    cr_assert_eq(rl_store_set(c, "big", b, big, &e), RL_OK, "%s", e.msg);
    rl_store *d = client(port);
    cr_assert_eq(rl_store_get(d, "big", 1.0, &v, &n, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(n, big);
    cr_expect(memcmp(v, b, big) == 0, "1 MiB value corrupted");
    free(v);
    free(b);
    rl_store_close(d);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_store, add_semantics) {
    int port;
    rl_store_server *srv = start_server(&port);
    rl_store *c = client(port);
    rl_err e = {0};
    int64_t r = 0;
    cr_assert_eq(rl_store_add(c, "n", 5, &r, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(r, 5); /* missing key counts as 0 */
    cr_assert_eq(rl_store_add(c, "n", -7, &r, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(r, -2);
    void *v = NULL;
    size_t n = 0;
    cr_assert_eq(rl_store_get(c, "n", 0, &v, &n, &e), RL_OK, "%s", e.msg);
    const uint8_t want[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe};
    cr_expect(n == 8 && memcmp(v, want, 8) == 0, "counter is stored as 8-byte big-endian");
    free(v);
    cr_assert_eq(rl_store_set(c, "s", "text", 4, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(rl_store_add(c, "s", 1, &r, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "'s'") && strstr(e.msg, "counter"), "%s", e.msg);
    cr_assert_eq(rl_store_add(c, "big", INT64_MAX, &r, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(rl_store_add(c, "big", 1, &r, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "overflow"), "%s", e.msg);
    /* errors from the server's answer leave the connection usable */
    cr_expect_eq(rl_store_add(c, "n", 2, &r, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(r, 0);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_store, cas_semantics) {
    int port;
    rl_store_server *srv = start_server(&port);
    rl_store *c = client(port);
    rl_err e = {0};
    bool sw = false;
    void *cur = NULL;
    size_t cl = 0;
    /* absent + "only if absent": swaps */
    cr_assert_eq(rl_store_cas(c, "k", NULL, 0, "one", 3, &sw, &cur, &cl, &e), RL_OK, "%s", e.msg);
    cr_expect(sw);
    cr_expect(cl == 3 && memcmp(cur, "one", 3) == 0);
    free(cur);
    /* present + "only if absent": mismatch, current returned */
    cr_assert_eq(rl_store_cas(c, "k", NULL, 0, "two", 3, &sw, &cur, &cl, &e), RL_OK, "%s", e.msg);
    cr_expect(!sw);
    cr_expect(cl == 3 && memcmp(cur, "one", 3) == 0);
    free(cur);
    /* match: swaps */
    cr_assert_eq(rl_store_cas(c, "k", "one", 3, "three", 5, &sw, &cur, &cl, &e), RL_OK, "%s", e.msg);
    cr_expect(sw);
    cr_expect(cl == 5 && memcmp(cur, "three", 5) == 0);
    free(cur);
    /* mismatch: unchanged, current returned */
    cr_assert_eq(rl_store_cas(c, "k", "one", 3, "four", 4, &sw, &cur, &cl, &e), RL_OK, "%s", e.msg);
    cr_expect(!sw);
    cr_expect(cl == 5 && memcmp(cur, "three", 5) == 0);
    free(cur);
    /* absent + a non-empty expectation: mismatch with empty current */
    cr_assert_eq(rl_store_cas(c, "nokey", "x", 1, "y", 1, &sw, &cur, &cl, &e), RL_OK, "%s", e.msg);
    cr_expect(!sw);
    cr_expect_eq(cl, 0);
    free(cur);
    /* current is optional */
    cr_assert_eq(rl_store_cas(c, "k", "three", 5, "", 0, &sw, NULL, NULL, &e), RL_OK, "%s", e.msg);
    cr_expect(sw);
    void *v = NULL;
    size_t n = 9;
    cr_assert_eq(rl_store_get(c, "k", 0, &v, &n, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(n, 0);
    free(v);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_store, delete_and_key_limits) {
    int port;
    rl_store_server *srv = start_server(&port);
    rl_store *c = client(port);
    rl_err e = {0};
    cr_assert_eq(rl_store_set(c, "d", "1", 1, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_store_delete(c, "d", &e), RL_OK, "%s", e.msg);
    void *v = NULL;
    size_t n;
    cr_expect_eq(rl_store_get(c, "d", 0, &v, &n, &e), RL_ETIMEOUT);
    cr_expect(strstr(e.msg, "'d'"), "%s", e.msg);
    cr_expect_null(v);
    cr_expect_eq(rl_store_delete(c, "never", &e), RL_OK, "%s", e.msg);
    char longk[RL_STORE_MAX_KEY + 2];
    memset(longk, 'k', sizeof longk - 1);
    longk[sizeof longk - 1] = '\0';
    cr_expect_eq(rl_store_set(c, longk, "1", 1, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "limit 1024"), "%s", e.msg);
    cr_expect_eq(rl_store_set(c, "", "1", 1, &e), RL_EINPUT);
    /* oversize values are refused before anything is sent or read */
    cr_expect_eq(rl_store_set(c, "v", "x", (size_t)RL_STORE_MAX_VALUE + 1, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "'v'"), "%s", e.msg);
    longk[RL_STORE_MAX_KEY] = '\0'; /* exactly at the limit is fine */
    cr_expect_eq(rl_store_set(c, longk, "1", 1, &e), RL_OK, "%s", e.msg);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

/* ---- store: waiting --------------------------------------------------------------- */
typedef struct setter_arg {
    int port, delay_ms;
} setter_arg;

static void *late_setter(void *p) {
    setter_arg *a = p;
    rl_store *c = NULL;
    rl_err e;
    if (rl_store_connect("127.0.0.1", a->port, 5.0, &c, &e) != RL_OK) return (void *)1;
    sleep_ms(a->delay_ms);
    int rc = rl_store_set(c, "late", "v1", 2, &e);
    rl_store_close(c);
    return (void *)(intptr_t)rc;
}

Test(rdzv_store, get_waits_for_a_later_set_from_a_thread) {
    int port;
    rl_store_server *srv = start_server(&port);
    rl_store *c = client(port);
    setter_arg a = {port, 150};
    pthread_t t;
    double t0 = rl_now();
    pthread_create(&t, NULL, late_setter, &a);
    void *v = NULL;
    size_t n = 0;
    rl_err e = {0};
    cr_assert_eq(rl_store_get(c, "late", 5.0, &v, &n, &e), RL_OK, "%s", e.msg);
    double dt = rl_now() - t0;
    cr_expect(n == 2 && memcmp(v, "v1", 2) == 0);
    cr_expect(dt >= 0.1 && dt < 2.0, "waited %.3f s", dt);
    free(v);
    void *trc;
    pthread_join(t, &trc);
    cr_expect_eq((intptr_t)trc, 0);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_store, get_waits_for_a_later_set_from_another_process) {
    int port;
    rl_store_server *srv = start_server(&port);
    pid_t pid;
    int child = rl_test_fork_n(1, &pid);
    cr_assert(child != -2);
    if (child == 0) {
        rl_store *c = NULL;
        rl_err e;
        if (rl_store_connect("127.0.0.1", port, 5.0, &c, &e) != RL_OK) _exit(1);
        sleep_ms(100);
        int rc = rl_store_set(c, "from-child", "\0\1", 2, &e);
        rl_store_close(c);
        _exit(rc == RL_OK ? 0 : 2);
    }
    rl_store *c = client(port);
    void *v = NULL;
    size_t n = 0;
    rl_err e = {0};
    cr_assert_eq(rl_store_get(c, "from-child", 5.0, &v, &n, &e), RL_OK, "%s", e.msg);
    cr_expect(n == 2 && memcmp(v, "\0\1", 2) == 0);
    free(v);
    wait_children(&pid, 1);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

static void *raise_later(void *arg) {
    sleep_ms(200);
    *(volatile int *)arg = 1;
    return NULL;
}

/* A flag set by another thread ends a long GET within 100 ms of it: what
 * lets an agent end a round whose trainer waits for a peer's address. */
Test(rdzv_store, a_cancel_flag_ends_a_waiting_get) {
    int port;
    rl_store_server *srv = start_server(&port);
    rl_store *c = client(port);
    volatile int flag = 0;
    rl_store_set_cancel(c, &flag);
    pthread_t t;
    pthread_create(&t, NULL, raise_later, (void *)&flag);
    void *v = NULL;
    size_t n = 0;
    rl_err e = {0};
    double t0 = rl_now();
    cr_expect_eq(rl_store_get(c, "never", 30.0, &v, &n, &e), RL_EABORT);
    double dt = rl_now() - t0;
    pthread_join(t, NULL);
    cr_expect(dt >= 0.19 && dt < 1.5, "gave up after %.3f s (flag at 0.2 s)", dt);
    cr_expect(strstr(e.msg, "GET") && strstr(e.msg, "cancelled"), "%s", e.msg);
    cr_expect_eq(rl_store_set(c, "k", "1", 1, &e), RL_EPEER, "a cancelled client is unusable");
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_store, get_timeout_is_prompt_and_names_the_key) {
    int port;
    rl_store_server *srv = start_server(&port);
    rl_store *c = client(port);
    void *v = NULL;
    size_t n = 0;
    rl_err e = {0};
    double t0 = rl_now();
    cr_expect_eq(rl_store_get(c, "absent/key", 0.2, &v, &n, &e), RL_ETIMEOUT);
    double dt = rl_now() - t0;
    cr_expect(dt >= 0.19 && dt < 1.5, "took %.3f s for a 0.2 s wait", dt);
    char want[128];
    snprintf(want, sizeof want, "store 127.0.0.1:%d: key 'absent/key' not set within 0.2 s", port);
    cr_expect_str_eq(e.msg, want);
    /* the connection stays usable after a NOTFOUND */
    cr_expect_eq(rl_store_set(c, "absent/key", "1", 1, &e), RL_OK, "%s", e.msg);
    t0 = rl_now();
    cr_expect_eq(rl_store_get(c, "other", 0, &v, &n, &e), RL_ETIMEOUT);
    cr_expect(rl_now() - t0 < 1.0, "a zero wait must not wait");
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_store, many_waiters_on_one_key_all_released) {
    int port;
    rl_store_server *srv = start_server(&port);
    enum { N = 6 };
    pid_t pids[N];
    int i = rl_test_fork_n(N, pids);
    cr_assert(i != -2);
    if (i >= 0) {
        rl_store *c = NULL;
        rl_err e;
        void *v = NULL;
        size_t n = 0;
        if (rl_store_connect("127.0.0.1", port, 5.0, &c, &e) != RL_OK) _exit(1);
        if (rl_store_get(c, "go", 5.0, &v, &n, &e) != RL_OK) _exit(2);
        int ok = n == 3 && memcmp(v, "now", 3) == 0;
        free(v);
        rl_store_close(c);
        _exit(ok ? 0 : 3);
    }
    sleep_ms(100);
    rl_store *c = client(port);
    rl_err e = {0};
    cr_assert_eq(rl_store_set(c, "go", "now", 3, &e), RL_OK, "%s", e.msg);
    wait_children(pids, N);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

/* ---- store: concurrency ------------------------------------------------------------ */
Test(rdzv_store, concurrent_adds_from_processes_sum_exactly) {
    int port;
    rl_store_server *srv = start_server(&port);
    enum { P = 4, K = 100 };
    pid_t pids[P];
    int i = rl_test_fork_n(P, pids);
    cr_assert(i != -2);
    if (i >= 0) {
        rl_store *c = NULL;
        rl_err e;
        if (rl_store_connect("127.0.0.1", port, 5.0, &c, &e) != RL_OK) _exit(1);
        int64_t last = 0, r = 0;
        for (int k = 0; k < K; k++) {
            if (rl_store_add(c, "ctr", 1, &r, &e) != RL_OK) _exit(2);
            if (r <= last || r > P * K) _exit(3); /* strictly increasing, in range */
            last = r;
        }
        rl_store_close(c);
        _exit(0);
    }
    wait_children(pids, P);
    rl_store *c = client(port);
    int64_t total = 0;
    rl_err e = {0};
    cr_assert_eq(rl_store_add(c, "ctr", 0, &total, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(total, P * K);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_store, barrier_with_four_processes) {
    int port;
    rl_store_server *srv = start_server(&port);
    enum { P = 4 };
    pid_t pids[P];
    int i = rl_test_fork_n(P, pids);
    cr_assert(i != -2);
    if (i >= 0) {
        rl_store *c = NULL;
        rl_err e;
        if (rl_store_connect("127.0.0.1", port, 5.0, &c, &e) != RL_OK) _exit(1);
        sleep_ms(30 * i); /* staggered arrivals */
        int64_t r;
        if (rl_store_add(c, "arrived", 1, &r, &e) != RL_OK) _exit(2);
        if (rl_store_barrier(c, "round/0/b", P, 5.0, &e) != RL_OK) _exit(3);
        /* nobody leaves before everybody arrived */
        if (rl_store_add(c, "arrived", 0, &r, &e) != RL_OK || r != P) _exit(4);
        rl_store_close(c);
        _exit(0);
    }
    wait_children(pids, P);
    rl_store_server_stop(srv);
}

Test(rdzv_store, barrier_timeout_says_how_many_arrived) {
    int port;
    rl_store_server *srv = start_server(&port);
    rl_store *c = client(port);
    rl_err e = {0};
    double t0 = rl_now();
    cr_expect_eq(rl_store_barrier(c, "b1", 3, 0.2, &e), RL_ETIMEOUT);
    cr_expect(rl_now() - t0 < 2.0);
    cr_expect(strstr(e.msg, "barrier 'b1': only 1 of 3 processes arrived"), "%s", e.msg);
    cr_expect_eq(rl_store_barrier(c, "b2", 0, 1.0, &e), RL_EINPUT);
    /* a single-process barrier passes at once */
    cr_expect_eq(rl_store_barrier(c, "b3", 1, 1.0, &e), RL_OK, "%s", e.msg);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_store, many_clients_at_once) {
    int port;
    rl_store_server *srv = start_server(&port);
    enum { N = 64 };
    rl_store *cs[N];
    rl_err e = {0};
    for (int i = 0; i < N; i++) cs[i] = client(port);
    for (int i = 0; i < N; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        cr_assert_eq(rl_store_set(cs[i], k, k, strlen(k), &e), RL_OK, "%s", e.msg);
    }
    for (int i = 0; i < N; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", (i + 1) % N);
        void *v;
        size_t n;
        cr_assert_eq(rl_store_get(cs[i], k, 0, &v, &n, &e), RL_OK, "%s", e.msg);
        cr_expect(n == strlen(k) && memcmp(v, k, n) == 0);
        free(v);
    }
    for (int i = 0; i < N; i++) rl_store_close(cs[i]);
    rl_store_server_stop(srv);
}

/* ---- store: failures --------------------------------------------------------------- */
Test(rdzv_store, connect_with_nothing_listening_fails_within_timeout) {
    /* A bound socket that never listens: connections to it are refused. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    int port = ntohs(a.sin_port);
    rl_store *c = NULL;
    rl_err e = {0};
    double t0 = rl_now();
    cr_expect_eq(rl_store_connect("127.0.0.1", port, 0.3, &c, &e), RL_ETIMEOUT);
    double dt = rl_now() - t0;
    cr_expect(dt >= 0.25 && dt < 2.0, "took %.3f s for a 0.3 s timeout", dt);
    cr_expect_null(c);
    char want[128];
    snprintf(want, sizeof want, "store 127.0.0.1:%d unreachable after 0.3 s: Connection refused",
             port);
    cr_expect_str_eq(e.msg, want);
    close(fd);
}

Test(rdzv_store, connect_retries_until_the_server_starts) {
    /* Find a free port, then start the server on it a little later. */
    rl_store_server *s = NULL;
    int port;
    s = start_server(&port);
    rl_store_server_stop(s);
    pid_t pid;
    int child = rl_test_fork_n(1, &pid);
    cr_assert(child != -2);
    if (child == 0) {
        sleep_ms(200);
        rl_store_server *s2 = NULL;
        rl_err e;
        if (rl_store_server_start("127.0.0.1", port, &s2, &e) != RL_OK) _exit(1);
        /* serve until the parent has been through */
        rl_store *c2 = NULL;
        void *v = NULL;
        size_t n;
        int rc = rl_store_connect("127.0.0.1", port, 2.0, &c2, &e);
        if (rc == RL_OK) rc = rl_store_get(c2, "x", 3.0, &v, &n, &e);
        free(v);
        rl_store_close(c2);
        rl_store_server_stop(s2);
        _exit(rc == RL_OK ? 0 : 2);
    }
    rl_store *c = NULL;
    rl_err e = {0};
    cr_expect_eq(rl_store_connect("127.0.0.1", port, 3.0, &c, &e), RL_OK, "%s", e.msg);
    if (c) cr_expect_eq(rl_store_set(c, "x", "1", 1, &e), RL_OK, "%s", e.msg);
    rl_store_close(c);
    wait_children(&pid, 1);
}

typedef struct foreign_arg {
    int lfd;
    const char *reply;
} foreign_arg;

static void *foreign_server(void *p) {
    foreign_arg *a = p;
    int fd = accept(a->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    if (a->reply) {
        ssize_t w = send(fd, a->reply, strlen(a->reply), MSG_NOSIGNAL);
        (void)w;
    }
    sleep_ms(50);
    close(fd);
    return NULL;
}

static int listen_any(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(fd, 4), 0);
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    *port = ntohs(a.sin_port);
    return fd;
}

Test(rdzv_store, connect_to_another_protocol_is_a_clear_error) {
    int port;
    foreign_arg a = {listen_any(&port), "HTTP/1.1 400\r\n"};
    pthread_t t;
    pthread_create(&t, NULL, foreign_server, &a);
    rl_store *c = NULL;
    rl_err e = {0};
    double t0 = rl_now();
    cr_expect_eq(rl_store_connect("127.0.0.1", port, 5.0, &c, &e), RL_EINPUT);
    cr_expect(rl_now() - t0 < 2.0, "should fail at once, not retry until the timeout");
    char want[128];
    snprintf(want, sizeof want, "store 127.0.0.1:%d is not a ringleader store (bad magic)", port);
    cr_expect_str_eq(e.msg, want);
    pthread_join(t, NULL);
    close(a.lfd);
}

Test(rdzv_store, connect_to_a_newer_protocol_version_is_a_clear_error) {
    int port;
    static char reply[RL_STORE_HEADER_BYTES + 1];
    rl_store_frame f = {.version = 2, .op = RL_STORE_PING};
    rl_store_frame_encode(reply, &f);
    /* the header has zero bytes; send it raw below instead of as a string */
    int lfd = listen_any(&port);
    pid_t pid;
    int child = rl_test_fork_n(1, &pid);
    cr_assert(child != -2);
    if (child == 0) {
        int fd = accept(lfd, NULL, NULL);
        ssize_t w = send(fd, reply, RL_STORE_HEADER_BYTES, MSG_NOSIGNAL);
        sleep_ms(100);
        _exit(w == RL_STORE_HEADER_BYTES ? 0 : 1);
    }
    rl_store *c = NULL;
    rl_err e = {0};
    cr_expect_neq(rl_store_connect("127.0.0.1", port, 2.0, &c, &e), RL_OK);
    cr_expect(strstr(e.msg, "protocol version 2, expected 1"), "%s", e.msg);
    wait_children(&pid, 1);
    close(lfd);
}

Test(rdzv_store, a_peer_that_never_answers_times_out) {
    int port;
    int lfd = listen_any(&port); /* the kernel accepts; nobody answers */
    rl_store *c = NULL;
    rl_err e = {0};
    double t0 = rl_now();
    cr_expect_eq(rl_store_connect("127.0.0.1", port, 0.3, &c, &e), RL_ETIMEOUT);
    double dt = rl_now() - t0;
    cr_expect(dt >= 0.25 && dt < 2.5, "took %.3f s", dt);
    cr_expect(strstr(e.msg, "no answer to PING"), "%s", e.msg);
    cr_expect_null(c);
    close(lfd);
}

Test(rdzv_store, malformed_frame_gets_eproto_and_others_keep_working) {
    int port;
    rl_store_server *srv = start_server(&port);
    rl_store *good = client(port);
    rl_err e = {0};
    cr_assert_eq(rl_store_set(good, "k", "v", 1, &e), RL_OK, "%s", e.msg);
    /* version 2 */
    int fd = raw_connect(port);
    uint8_t req[RL_STORE_HEADER_BYTES];
    rl_store_frame f = {.version = 2, .op = RL_STORE_PING};
    rl_store_frame_encode(req, &f);
    cr_assert_eq(send(fd, req, sizeof req, 0), (ssize_t)sizeof req);
    uint8_t resp[1024];
    size_t got = raw_read_all(fd, resp, sizeof resp); /* answer, then EOF */
    rl_store_frame g;
    cr_assert_eq(rl_store_frame_parse(resp, got, "srv", &g, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(g.status, RL_STORE_EPROTO);
    cr_expect_eq(got, RL_STORE_HEADER_BYTES + g.vlen, "server closed after the EPROTO answer");
    resp[got < sizeof resp ? got : sizeof resp - 1] = '\0';
    cr_expect(strstr((char *)resp + 24, "protocol version 2, expected 1"), "%s", resp + 24);
    close(fd);
    /* an HTTP request */
    fd = raw_connect(port);
    const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    cr_assert_eq(send(fd, http, strlen(http), 0), (ssize_t)strlen(http));
    got = raw_read_all(fd, resp, sizeof resp);
    cr_assert_eq(rl_store_frame_parse(resp, got, "srv", &g, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(g.status, RL_STORE_EPROTO);
    close(fd);
    /* the well-behaved client never noticed */
    void *v;
    size_t n;
    cr_expect_eq(rl_store_get(good, "k", 0, &v, &n, &e), RL_OK, "%s", e.msg);
    free(v);
    rl_store_close(good);
    rl_store_server_stop(srv);
}

Test(rdzv_store, frames_trickling_in_byte_by_byte) {
    int port;
    rl_store_server *srv = start_server(&port);
    int fd = raw_connect(port);
    uint8_t req[2 * (24 + 2 + 3)];
    rl_store_frame f = {.version = 1, .op = RL_STORE_SET, .klen = 2, .vlen = 3};
    rl_store_frame_encode(req, &f);
    memcpy(req + 24, "tkabc", 5);
    f.op = RL_STORE_DEL; /* then a pipelined DEL of another key */
    f.vlen = 0;
    rl_store_frame_encode(req + 29, &f);
    memcpy(req + 53, "zz", 2);
    for (size_t i = 0; i < 55; i++) cr_assert_eq(send(fd, req + i, 1, 0), 1);
    uint8_t resp[48];
    size_t got = 0;
    while (got < 48) {
        ssize_t r = recv(fd, resp + got, 48 - got, 0);
        cr_assert(r > 0, "no answer");
        got += (size_t)r;
    }
    rl_store_frame g;
    rl_err e = {0};
    cr_assert_eq(rl_store_frame_parse(resp, 24, "s", &g, &e), RL_OK);
    cr_expect(g.op == RL_STORE_SET && g.status == RL_STORE_OK);
    cr_assert_eq(rl_store_frame_parse(resp + 24, 24, "s", &g, &e), RL_OK);
    cr_expect(g.op == RL_STORE_DEL && g.status == RL_STORE_OK);
    close(fd);
    rl_store *c = client(port);
    void *v;
    size_t n;
    cr_assert_eq(rl_store_get(c, "tk", 0, &v, &n, &e), RL_OK, "%s", e.msg);
    cr_expect(n == 3 && memcmp(v, "abc", 3) == 0);
    free(v);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_store, port_in_use_is_an_input_error) {
    int port;
    rl_store_server *a = start_server(&port);
    rl_store_server *b = NULL;
    rl_err e = {0};
    cr_expect_eq(rl_store_server_start("127.0.0.1", port, &b, &e), RL_EINPUT);
    cr_expect_null(b);
    char want[96];
    snprintf(want, sizeof want, "store: port %d on 127.0.0.1 is in use", port);
    cr_expect_str_eq(e.msg, want);
    cr_expect_eq(rl_store_server_start("127.0.0.1", 70000, &b, &e), RL_EINPUT);
    rl_store_server_stop(a);
    rl_store_server_stop(NULL);
}

typedef struct blocked_arg {
    int port, rc;
    double secs;
    char msg[512];
} blocked_arg;

static void *blocked_get(void *p) {
    blocked_arg *a = p;
    rl_store *c = NULL;
    rl_err e = {0};
    a->rc = rl_store_connect("127.0.0.1", a->port, 5.0, &c, &e);
    if (a->rc != RL_OK) return NULL;
    void *v = NULL;
    size_t n;
    double t0 = rl_now();
    a->rc = rl_store_get(c, "never", 60.0, &v, &n, &e);
    a->secs = rl_now() - t0;
    snprintf(a->msg, sizeof a->msg, "%s", e.msg);
    /* later calls fail fast, naming the first cause */
    int64_t r;
    double t1 = rl_now();
    if (rl_store_add(c, "x", 1, &r, &e) == RL_OK || rl_now() - t1 > 0.5) a->rc = -1;
    free(v);
    rl_store_close(c);
    return NULL;
}

Test(rdzv_store, stop_releases_blocked_clients_promptly) {
    int port;
    rl_store_server *srv = start_server(&port);
    blocked_arg a[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        a[i] = (blocked_arg){.port = port, .rc = -2};
        pthread_create(&t[i], NULL, blocked_get, &a[i]);
    }
    sleep_ms(200);
    double t0 = rl_now();
    rl_store_server_stop(srv);
    cr_expect(rl_now() - t0 < 1.0, "stop took %.3f s", rl_now() - t0);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        cr_expect_eq(a[i].rc, RL_EPEER, "%d: %s", a[i].rc, a[i].msg);
        cr_expect(a[i].secs < 2.0, "blocked %.3f s for a 60 s GET stopped after 0.2 s", a[i].secs);
        cr_expect(strstr(a[i].msg, "closed the connection during GET 'never'"), "%s", a[i].msg);
    }
}

Test(rdzv_store, client_that_disconnects_while_parked_does_not_disturb) {
    int port;
    rl_store_server *srv = start_server(&port);
    int fd = raw_connect(port);
    uint8_t req[24 + 1 + 4];
    rl_store_frame f = {.version = 1, .op = RL_STORE_GET, .klen = 1, .vlen = 4};
    rl_store_frame_encode(req, &f);
    req[24] = 'w';
    put_be32(req + 25, 60000);
    cr_assert_eq(send(fd, req, sizeof req, 0), (ssize_t)sizeof req);
    sleep_ms(50);
    close(fd); /* parked GET's client goes away */
    sleep_ms(50);
    rl_store *c = client(port);
    rl_err e = {0};
    cr_expect_eq(rl_store_set(c, "w", "1", 1, &e), RL_OK, "%s", e.msg);
    void *v;
    size_t n;
    cr_expect_eq(rl_store_get(c, "w", 0, &v, &n, &e), RL_OK, "%s", e.msg);
    free(v);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_store, connect_argument_errors) {
    rl_store *c = NULL;
    rl_err e = {0};
    cr_expect_eq(rl_store_connect("", 1, 1, &c, &e), RL_EINPUT);
    cr_expect_eq(rl_store_connect("h", 0, 1, &c, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "port 0"), "%s", e.msg);
    cr_expect_eq(rl_store_connect("h", 1, 0, &c, &e), RL_EINPUT);
    cr_expect_null(c);
}

/* ---- store: authentication with the rendezvous secret ------------------------------ */
static rl_store_server *start_auth_server(int *port, const char *secret) {
    rl_store_server *s = NULL;
    rl_err e = {0};
    rl_log_set_level(RL_LOG_ERROR);
    cr_assert_eq(rl_store_server_start_auth("127.0.0.1", 0, secret, strlen(secret), &s, &e), RL_OK,
                 "%s", e.msg);
    *port = rl_store_server_port(s);
    return s;
}

Test(rdzv_auth, right_secret_authenticates_and_the_store_works) {
    int port;
    rl_store_server *srv = start_auth_server(&port, "s3cret-of-the-job");
    rl_store *c = client(port);
    rl_err e = {0};
    cr_assert_eq(rl_store_auth(c, "pod-a", "s3cret-of-the-job", 17, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_store_set(c, "k", "v", 1, &e), RL_OK, "%s", e.msg);
    int64_t r;
    cr_assert_eq(rl_store_add(c, "n", 2, &r, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(r, 2);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_auth, wrong_secret_is_refused_and_others_are_not_disturbed) {
    int port;
    rl_store_server *srv = start_auth_server(&port, "right");
    rl_store *good = client(port), *bad = client(port);
    rl_err e = {0};
    cr_assert_eq(rl_store_auth(good, "pod-a", "right", 5, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rl_store_set(good, "round", "1", 1, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(rl_store_auth(bad, "pod-x", "wrong", 5, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "refused") && strstr(e.msg, "wrong rendezvous secret") &&
              strstr(e.msg, "pod-x") && !strstr(e.msg, "right"), "%s", e.msg);
    /* the refused connection is closed; nothing it did reached the store */
    cr_expect_neq(rl_store_set(bad, "round", "666", 3, &e), RL_OK);
    void *v = NULL;
    size_t n;
    cr_assert_eq(rl_store_get(good, "round", 0, &v, &n, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(n, 1);
    cr_expect(memcmp(v, "1", 1) == 0);
    free(v);
    rl_store_close(bad);
    rl_store_close(good);
    rl_store_server_stop(srv);
}

Test(rdzv_auth, ops_before_auth_are_refused_with_a_reason) {
    int port;
    rl_store_server *srv = start_auth_server(&port, "right");
    rl_store *c = client(port); /* PING (inside connect) is allowed */
    rl_err e = {0};
    cr_expect_eq(rl_store_set(c, "k", "v", 1, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "SET before authentication") && strstr(e.msg, "rendezvous secret"),
              "%s", e.msg);
    rl_store_close(c);
    /* a replayed or made-up AUTH without CHALLENGE is refused too */
    int fd = raw_connect(port);
    rl_store_buf req = {0};
    uint8_t mac[32] = {0};
    cr_assert_eq(rl_store_buf_frame(&req, RL_STORE_AUTH, 0, "pod-z", 5, mac, 32, NULL, 0), 0);
    cr_assert_eq(send(fd, req.p, req.len, MSG_NOSIGNAL), (ssize_t)req.len);
    uint8_t buf[512];
    size_t got = raw_read_all(fd, buf, sizeof buf);
    rl_store_frame f;
    cr_assert_eq(rl_store_frame_parse(buf, got, "t", &f, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(f.status, RL_STORE_EAUTH);
    cr_expect(got >= RL_STORE_HEADER_BYTES + f.vlen && memmem(buf, got, "without a CHALLENGE", 19));
    close(fd);
    rl_store_buf_free(&req);
    rl_store_server_stop(srv);
}

Test(rdzv_auth, a_64mib_set_before_auth_is_refused_from_its_header) {
    int port;
    rl_store_server *srv = start_auth_server(&port, "right");
    int fd = raw_connect(port);
    /* the header announces 64 MiB; not one byte of it follows */
    uint8_t req[RL_STORE_HEADER_BYTES + 1];
    rl_store_frame f = {.version = 1, .op = RL_STORE_SET, .klen = 1, .vlen = RL_STORE_MAX_VALUE};
    rl_store_frame_encode(req, &f);
    req[24] = 'k';
    cr_assert_eq(send(fd, req, sizeof req, MSG_NOSIGNAL), (ssize_t)sizeof req);
    uint8_t buf[512];
    size_t got = raw_read_all(fd, buf, sizeof buf); /* the answer, then EOF; 3 s at most */
    rl_store_frame g;
    rl_err e = {0};
    cr_assert_eq(rl_store_frame_parse(buf, got, "t", &g, &e), RL_OK, "got %zu bytes: %s", got, e.msg);
    cr_expect_eq(g.status, RL_STORE_EAUTH);
    cr_expect(memmem(buf, got, "SET before authentication", 25), "%.*s", (int)got, (char *)buf);
    close(fd);
    /* others unaffected */
    rl_store *c = client(port);
    cr_expect_eq(rl_store_auth(c, "pod", "right", 5, &e), RL_OK, "%s", e.msg);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

Test(rdzv_auth, a_client_with_a_secret_refuses_an_open_store) {
    int port;
    rl_store_server *srv = start_server(&port);
    rl_store *c = client(port);
    rl_err e = {0};
    cr_expect_eq(rl_store_auth(c, "pod-a", "s", 1, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "does not authenticate"), "%s", e.msg);
    rl_store_close(c);
    rl_store_server_stop(srv);
}

/* An impostor at the leader's address: answers like a store but knows no
 * secret, so it accepts any AUTH. The client must still refuse it. */
static void *impostor(void *p) {
    int lfd = *(int *)p, fd = accept(lfd, NULL, NULL);
    if (fd < 0) return NULL;
    uint8_t in[4096];
    for (int k = 0; k < 3; k++) { /* PING, CHALLENGE, AUTH */
        size_t got = 0;
        while (got < RL_STORE_HEADER_BYTES) {
            ssize_t r = recv(fd, in + got, sizeof in - got, 0);
            if (r <= 0) goto done;
            got += (size_t)r;
        }
        rl_store_frame f;
        if (rl_store_frame_parse(in, got, "t", &f, NULL) != RL_OK) goto done;
        size_t total = RL_STORE_HEADER_BYTES + f.klen + f.vlen + f.v2len;
        while (got < total) {
            ssize_t r = recv(fd, in + got, sizeof in - got, 0);
            if (r <= 0) goto done;
            got += (size_t)r;
        }
        uint8_t junk[64];
        for (int i = 0; i < 64; i++) junk[i] = (uint8_t)(i * 37 + 11);
        rl_store_buf out = {0};
        rl_store_buf_frame(&out, f.op, RL_STORE_OK, NULL, 0, junk,
                           f.op == RL_STORE_CHALLENGE ? 64 : 0, NULL, 0);
        ssize_t w = send(fd, out.p, out.len, MSG_NOSIGNAL);
        (void)w;
        rl_store_buf_free(&out);
    }
done:
    close(fd);
    return NULL;
}

Test(rdzv_auth, an_impostor_store_is_refused) {
    int port, lfd = listen_any(&port);
    pthread_t t;
    pthread_create(&t, NULL, impostor, &lfd);
    rl_store *c = client(port);
    rl_err e = {0};
    cr_expect_eq(rl_store_auth(c, "pod-a", "s", 1, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "could not prove it knows the rendezvous secret"), "%s", e.msg);
    rl_store_close(c);
    pthread_join(t, NULL);
    close(lfd);
}

/* ---- static environment ----------------------------------------------------------- */
static const char *all_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
    "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR", "PET_MASTER_PORT",
    "NNODES", "NODE_RANK", "NPROC_PER_NODE",
};

/* Criterion runs each test in its own process, so only inherited values
 * (a test run under torchrun or SLURM) need clearing. */
static void clear_env(void) {
    for (size_t i = 0; i < sizeof all_vars / sizeof *all_vars; i++) unsetenv(all_vars[i]);
}

static void set_torchrun(void) {
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("MASTER_ADDR", "trainer-0.svc", 1);
    setenv("MASTER_PORT", "29500", 1);
}

static int read_env(rl_static_env *x, bool *found, rl_err *e) {
    memset(x, 0, sizeof *x);
    *found = true;
    return rl_static_env_read(getenv, x, found, e);
}

Test(rdzv_env, nothing_set_is_not_found) {
    clear_env();
    setenv("MASTER_ADDR", "x", 1); /* alone it describes no trainer */
    rl_static_env x;
    bool found;
    rl_err e = {0};
    cr_expect_eq(read_env(&x, &found, &e), RL_OK, "%s", e.msg);
    cr_expect(!found);
}

Test(rdzv_env, torchrun_form) {
    clear_env();
    set_torchrun();
    setenv("SLURM_PROCID", "0", 1); /* torchrun inside SLURM: torchrun's view wins */
    rl_static_env x;
    bool found;
    rl_err e = {0};
    cr_assert_eq(read_env(&x, &found, &e), RL_OK, "%s", e.msg);
    cr_expect(found);
    cr_expect(x.rank == 5 && x.world == 8 && x.local_rank == 1 && x.local_world == 4);
    cr_expect_str_eq(x.master_addr, "trainer-0.svc");
    cr_expect_eq(x.master_port, 29500);
    cr_expect_str_eq(x.source, "torchrun");
}

static void expect_env_error(const char *want) {
    rl_static_env x;
    bool found;
    rl_err e = {0};
    cr_expect_eq(read_env(&x, &found, &e), RL_EINPUT, "expected an error like %s", want);
    cr_expect(strstr(e.msg, want), "got '%s', want '%s'", e.msg, want);
    cr_expect(!strchr(e.msg, '\n'));
}

Test(rdzv_env, torchrun_missing_variables_are_named) {
    const char *vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                          "MASTER_PORT"};
    for (size_t i = 0; i < 6; i++) {
        clear_env();
        set_torchrun();
        unsetenv(vars[i]);
        char want[64];
        snprintf(want, sizeof want, "%s is not set", vars[i]);
        expect_env_error(want);
    }
}

Test(rdzv_env, torchrun_garbage_and_inconsistency) {
    clear_env();
    set_torchrun();
    setenv("LOCAL_RANK", "x", 1);
    expect_env_error("LOCAL_RANK: 'x' is not an integer");
    setenv("LOCAL_RANK", " 1", 1);
    expect_env_error("LOCAL_RANK: ' 1' is not an integer");
    setenv("LOCAL_RANK", "1", 1);
    setenv("RANK", "4", 1);
    setenv("WORLD_SIZE", "4", 1);
    expect_env_error("RANK=4 is not below WORLD_SIZE=4");
    setenv("RANK", "-1", 1);
    expect_env_error("RANK=-1 is outside 0..");
    setenv("RANK", "99999999999999999999", 1);
    expect_env_error("RANK: '99999999999999999999' is not an integer");
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    expect_env_error("LOCAL_WORLD_SIZE=4 is above WORLD_SIZE=2");
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "4", 1);
    expect_env_error("LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4");
    setenv("LOCAL_RANK", "0", 1);
    setenv("MASTER_PORT", "70000", 1);
    expect_env_error("MASTER_PORT=70000 is outside 1..65535");
    setenv("MASTER_PORT", "0", 1);
    expect_env_error("MASTER_PORT=0 is outside 1..65535");
    setenv("MASTER_PORT", "29500", 1);
    setenv("MASTER_ADDR", "", 1);
    expect_env_error("MASTER_ADDR is empty");
    setenv("MASTER_ADDR", "a b", 1);
    expect_env_error("MASTER_ADDR: 'a b' is not a host name");
}

static void set_slurm(void) {
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_TASKS_PER_NODE", "4(x2)", 1);
    setenv("SLURM_JOB_NODELIST", "gpu[03-04]", 1);
}

Test(rdzv_env, slurm_form) {
    clear_env();
    set_slurm();
    rl_static_env x;
    bool found;
    rl_err e = {0};
    cr_assert_eq(read_env(&x, &found, &e), RL_OK, "%s", e.msg);
    cr_expect(found);
    cr_expect(x.rank == 5 && x.world == 8 && x.local_rank == 1 && x.local_world == 4);
    cr_expect_str_eq(x.master_addr, "gpu03");
    cr_expect_eq(x.master_port, RL_STORE_DEFAULT_PORT);
    cr_expect_str_eq(x.source, "slurm");
    /* SLURM_NTASKS_PER_NODE wins; MASTER_PORT and MASTER_ADDR override */
    setenv("SLURM_NTASKS_PER_NODE", "2", 1);
    setenv("MASTER_PORT", "1234", 1);
    cr_assert_eq(read_env(&x, &found, &e), RL_OK, "%s", e.msg);
    cr_expect_eq(x.local_world, 2);
    cr_expect_eq(x.master_port, 1234);
    setenv("MASTER_ADDR", "10.1.2.3", 1);
    cr_assert_eq(read_env(&x, &found, &e), RL_OK, "%s", e.msg);
    cr_expect_str_eq(x.master_addr, "10.1.2.3");
    /* SLURM_NODELIST is the fallback; uneven tasks per node use SLURM_NODEID */
    unsetenv("MASTER_ADDR");
    unsetenv("SLURM_NTASKS_PER_NODE");
    unsetenv("SLURM_JOB_NODELIST");
    setenv("SLURM_NODELIST", "a1,b2", 1);
    setenv("SLURM_TASKS_PER_NODE", "2,3(x2)", 1);
    setenv("SLURM_NODEID", "2", 1);
    cr_assert_eq(read_env(&x, &found, &e), RL_OK, "%s", e.msg);
    cr_expect_str_eq(x.master_addr, "a1");
    cr_expect_eq(x.local_world, 3);
}

Test(rdzv_env, slurm_errors_name_the_variable) {
    clear_env();
    set_slurm();
    unsetenv("SLURM_NTASKS");
    expect_env_error("SLURM_NTASKS is not set");
    set_slurm();
    setenv("SLURM_TASKS_PER_NODE", "4(y2)", 1);
    expect_env_error("SLURM_TASKS_PER_NODE: '4(y2)' is not a task count list");
    setenv("SLURM_TASKS_PER_NODE", "4(x2)", 1);
    setenv("SLURM_NODEID", "2", 1);
    expect_env_error("SLURM_TASKS_PER_NODE='4(x2)' has no entry for SLURM_NODEID=2");
    unsetenv("SLURM_NODEID");
    unsetenv("SLURM_TASKS_PER_NODE");
    expect_env_error("SLURM_NTASKS_PER_NODE and SLURM_TASKS_PER_NODE are not set");
    set_slurm();
    setenv("SLURM_JOB_NODELIST", "gpu[03-", 1);
    expect_env_error("SLURM_JOB_NODELIST: SLURM node list 'gpu[03-'");
    unsetenv("SLURM_JOB_NODELIST");
    expect_env_error("SLURM_JOB_NODELIST and SLURM_NODELIST are not set");
    set_slurm();
    setenv("SLURM_PROCID", "8", 1);
    expect_env_error("SLURM_PROCID=8 is not below SLURM_NTASKS=8");
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_LOCALID", "4", 1);
    expect_env_error("SLURM_LOCALID=4 is not below SLURM_TASKS_PER_NODE=4");
}

/* Where a static job's store listens: loopback for one node, MASTER_ADDR's
 * interface for several, every interface only when MASTER_ADDR is loopback
 * here (other nodes could not reach a loopback store). */
Test(rdzv_env, static_store_host) {
    char h[256];
    cr_expect(!rl_static_store_host("10.1.2.3", true, h, sizeof h));
    cr_expect_str_eq(h, "127.0.0.1");
    cr_expect(!rl_static_store_host("10.1.2.3", false, h, sizeof h));
    cr_expect_str_eq(h, "10.1.2.3");
    cr_expect(rl_static_store_host("127.0.1.1", false, h, sizeof h));
    cr_expect_str_eq(h, "0.0.0.0");
    cr_expect(rl_static_store_host("localhost", false, h, sizeof h));
    cr_expect_str_eq(h, "0.0.0.0");
    cr_expect(!rl_static_store_host("fd00::1", false, h, sizeof h));
    cr_expect_str_eq(h, "fd00::1");
}

Test(rdzv_env, node_env_defaults_and_forms) {
    clear_env();
    rl_node_env x;
    rl_err e = {0};
    cr_assert_eq(rl_node_env_read(getenv, &x, &e), RL_OK, "%s", e.msg);
    cr_expect(x.nnodes == 1 && x.node_rank == 0 && x.nproc_per_node == 0);
    cr_expect_str_eq(x.master_addr, "127.0.0.1");
    cr_expect_eq(x.master_port, 29400);
    /* unprefixed */
    setenv("NNODES", "3", 1);
    setenv("NODE_RANK", "2", 1);
    setenv("NPROC_PER_NODE", "8", 1);
    setenv("MASTER_ADDR", "m0", 1);
    setenv("MASTER_PORT", "2000", 1);
    cr_assert_eq(rl_node_env_read(getenv, &x, &e), RL_OK, "%s", e.msg);
    cr_expect(x.nnodes == 3 && x.node_rank == 2 && x.nproc_per_node == 8);
    cr_expect_str_eq(x.master_addr, "m0");
    cr_expect_eq(x.master_port, 2000);
    /* PET_ wins */
    setenv("PET_NNODES", "4:4", 1);
    setenv("PET_NODE_RANK", "3", 1);
    setenv("PET_NPROC_PER_NODE", "auto", 1);
    setenv("PET_MASTER_ADDR", "job-master-0", 1);
    setenv("PET_MASTER_PORT", "23456", 1);
    cr_assert_eq(rl_node_env_read(getenv, &x, &e), RL_OK, "%s", e.msg);
    cr_expect(x.nnodes == 4 && x.node_rank == 3 && x.nproc_per_node == RL_NPROC_AUTO);
    cr_expect_str_eq(x.master_addr, "job-master-0");
    cr_expect_eq(x.master_port, 23456);
}

Test(rdzv_env, node_env_errors_name_the_variable) {
    clear_env();
    rl_node_env x;
    rl_err e = {0};
    setenv("PET_NNODES", "1:4", 1);
    cr_expect_eq(rl_node_env_read(getenv, &x, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "PET_NNODES: '1:4' is an elastic range"), "%s", e.msg);
    setenv("PET_NNODES", "2", 1);
    setenv("NODE_RANK", "2", 1);
    cr_expect_eq(rl_node_env_read(getenv, &x, &e), RL_EINPUT);
    cr_expect_str_eq(e.msg, "NODE_RANK=2 is not below PET_NNODES=2");
    setenv("NODE_RANK", "1", 1);
    setenv("PET_NPROC_PER_NODE", "many", 1);
    cr_expect_eq(rl_node_env_read(getenv, &x, &e), RL_EINPUT);
    cr_expect_str_eq(e.msg, "PET_NPROC_PER_NODE: 'many' is not an integer");
    unsetenv("PET_NPROC_PER_NODE");
    setenv("PET_MASTER_PORT", "http", 1);
    cr_expect_eq(rl_node_env_read(getenv, &x, &e), RL_EINPUT);
    cr_expect_str_eq(e.msg, "PET_MASTER_PORT: 'http' is not an integer");
    unsetenv("PET_MASTER_PORT");
    setenv("NNODES", "0", 1);
    unsetenv("PET_NNODES");
    cr_expect_eq(rl_node_env_read(getenv, &x, &e), RL_EINPUT);
    cr_expect_str_eq(e.msg, "NNODES=0 is outside 1..2147483647");
}

/* ---- SLURM node lists -------------------------------------------------------------- */
static void expect_first(const char *list, const char *want) {
    char out[64];
    rl_err e = {0};
    cr_expect_eq(rl_slurm_first_host(list, out, sizeof out, &e), RL_OK, "%s: %s", list, e.msg);
    cr_expect_str_eq(out, want, "%s", list);
}

static void expect_bad(const char *list, const char *why) {
    char out[64] = "untouched";
    rl_err e = {0};
    cr_expect_eq(rl_slurm_first_host(list, out, sizeof out, &e), RL_EINPUT, "%s accepted", list);
    cr_expect(strstr(e.msg, why), "%s: got '%s', want '%s'", list, e.msg, why);
    cr_expect_str_eq(out, "", "output must be empty on error");
}

Test(rdzv_slurm, first_host_forms) {
    expect_first("a,b", "a");
    expect_first("node1", "node1");
    expect_first("node[01-04,7]", "node01");
    expect_first("node[7,01-04]", "node7");
    expect_first("n[1-2]-ib,x", "n1-ib");
    expect_first("gpu[001-128]", "gpu001");
    expect_first("rack[1-2]-n[01-04]", "rack1-n01");
    expect_first("x,node[01-04]", "x");
    expect_first("host.example.com", "host.example.com");
    expect_first("a[09-10]", "a09");
}

Test(rdzv_slurm, malformed_lists) {
    expect_bad("", "empty");
    expect_bad("node[01-04", "unbalanced '['");
    expect_bad("node01]", "unbalanced ']'");
    expect_bad("node[[1]]", "");
    expect_bad("node[1[2]]", "nested '['");
    expect_bad("node[]", "needs a number");
    expect_bad("node[1-]", "needs a number after '-'");
    expect_bad("node[4-1]", "backwards");
    expect_bad("node[a]", "needs a number");
    expect_bad("a,,b", "empty host name");
    expect_bad(",a", "empty host name");
    expect_bad("a,", "empty host name");
    expect_bad("a b", "unexpected character");
    expect_bad("a,b[1", "unbalanced");
    char out[4];
    rl_err e = {0};
    cr_expect_eq(rl_slurm_first_host("longname", out, sizeof out, &e), RL_EINPUT);
    cr_expect(strstr(e.msg, "too long"), "%s", e.msg);
}
