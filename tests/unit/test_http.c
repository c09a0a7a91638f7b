/* http: the libcurl wrapper against a small in-process HTTP/1.1 server
 * (one thread per connection, behaviour chosen by the request path) and
 * against `openssl s_server` for TLS; plus the retry policy's pure parts
 * (backoff bounds, Retry-After, the retryable predicate). Every server
 * listens on an ephemeral loopback port, so suites can run in parallel. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "http/http.h"

/* ---- the test server -------------------------------------------------------------- */
typedef struct srv {
    int lfd, port;
    atomic_int accepts;
    pthread_t th;
} srv;

static srv g_srv;

static void send_all(int fd, const char *s, size_t n) {
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        s += w, n -= (size_t)w;
    }
}
static void send_str(int fd, const char *s) { send_all(fd, s, strlen(s)); }

/* Wait up to ms for the peer to close (or send); true if it closed. */
static bool wait_peer_close(int fd, int ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    double end = (double)time(NULL) + ms / 1000.0;
    while ((double)time(NULL) <= end) {
        if (poll(&p, 1, 100) > 0) {
            char b[256];
            if (recv(fd, b, sizeof b, MSG_DONTWAIT) <= 0) return true;
        }
    }
    return false;
}

static void *conn_main(void *arg) {
    int fd = (int)(intptr_t)arg;
    char buf[65536];
    size_t have = 0;
    for (;;) {
        char *end = NULL;
        while (!(end = memmem(buf, have, "\r\n\r\n", 4))) {
            if (have == sizeof buf) goto done;
            ssize_t r = recv(fd, buf + have, sizeof buf - have, 0);
            if (r <= 0) goto done;
            have += (size_t)r;
        }
        size_t hlen = (size_t)(end - buf) + 4;
        char method[16] = "", path[1024] = "";
        sscanf(buf, "%15s %1023s", method, path);
        path[strcspn(path, "?")] = '\0';
        size_t clen = 0;
        char *cl = strcasestr(buf, "\r\nContent-Length:");
        if (cl && cl < end) clen = strtoul(cl + 17, NULL, 10);
        while (have < hlen + clen) {
            ssize_t r = recv(fd, buf + have, sizeof buf - have, 0);
            if (r <= 0) goto done;
            have += (size_t)r;
        }
        char body[4096];
        size_t bl = clen < sizeof body - 1 ? clen : sizeof body - 1;
        memcpy(body, buf + hlen, bl);
        body[bl] = '\0';
        bool has_auth = strcasestr(buf, "\r\nX-Secret:") && strcasestr(buf, "\r\nX-Secret:") < end;
        memmove(buf, buf + hlen + clen, have - hlen - clen);
        have -= hlen + clen;

        char out[8192];
        if (strcmp(path, "/echo") == 0) {
            char b[5000];
            int n = snprintf(b, sizeof b, "%s %zu %s%s", method, clen, body,
                             has_auth ? " +secret" : "");
            snprintf(out, sizeof out,
                     "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s",
                     n, b);
            send_str(fd, out);
        } else if (strcmp(path, "/hdr") == 0) {
            send_str(fd, "HTTP/1.1 100 Continue\r\n\r\n");
            send_str(fd, "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\n"
                         "ETag:   \"abc\"  \r\nX-Dup: one\r\nx-dup: two\r\n"
                         "Content-Length: 4\r\n\r\nbusy");
        } else if (strcmp(path, "/stream") == 0) {
            send_str(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
            for (int i = 0; i < 200; i++) {
                char line[64], chunk[96];
                int ln = snprintf(line, sizeof line, "line %d\n", i);
                snprintf(chunk, sizeof chunk, "%x\r\n%s\r\n", ln, line);
                send_str(fd, chunk);
                struct timespec ts = {0, 20 * 1000000};
                nanosleep(&ts, NULL);
            }
            send_str(fd, "0\r\n\r\n");
        } else if (strcmp(path, "/big") == 0) {
            send_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n");
            char z[10000];
            memset(z, 'z', sizeof z);
            for (int i = 0; i < 10; i++) send_all(fd, z, sizeof z);
        } else if (strcmp(path, "/stall") == 0) {
            wait_peer_close(fd, 10000);
            goto done;
        } else if (strcmp(path, "/trickle") == 0) {
            send_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789");
            wait_peer_close(fd, 10000);
            goto done;
        } else if (strcmp(path, "/close") == 0) {
            goto done;
        } else {
            send_str(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        }
    }
done:
    close(fd);
    return NULL;
}

static void *accept_main(void *arg) {
    srv *s = arg;
    for (;;) {
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0) return NULL;
        atomic_fetch_add(&s->accepts, 1);
        pthread_t t;
        if (pthread_create(&t, NULL, conn_main, (void *)(intptr_t)fd) == 0) pthread_detach(t);
        else close(fd);
    }
}

static void srv_start(void) {
    srv *s = &g_srv;
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(s->lfd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(s->lfd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(s->lfd, 16), 0);
    socklen_t al = sizeof a;
    getsockname(s->lfd, (struct sockaddr *)&a, &al);
    s->port = ntohs(a.sin_port);
    atomic_store(&s->accepts, 0);
    cr_assert_eq(pthread_create(&s->th, NULL, accept_main, s), 0);
}

static void srv_stop(void) {
    shutdown(g_srv.lfd, SHUT_RDWR);
    close(g_srv.lfd);
    pthread_join(g_srv.th, NULL);
}

static void url(char *out, size_t n, const char *path) {
    snprintf(out, n, "http://127.0.0.1:%d%s", g_srv.port, path);
}

static rl_http *handle(void) {
    rl_http *h = NULL;
    rl_err e = {0};
    cr_assert_eq(rl_http_new(&h, &e), RL_OK, "%s", e.msg);
    return h;
}

TestSuite(http, .init = srv_start, .fini = srv_stop, .timeout = 30);

Test(http, get_status_headers_body_and_connection_reuse) {
    rl_http *h = handle();
    char u[128];
    url(u, sizeof u, "/hdr");
    rl_http_req rq = {.method = "GET", .url = u, .timeout_s = 5};
    rl_http_resp rs;
    rl_err e = {0};
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rs.status, 503);
    cr_assert_str_eq(rs.body, "busy");
    cr_assert_eq(rs.body_len, 4);
    cr_assert_str_eq(rl_http_resp_header(&rs, "retry-after"), "7");
    cr_assert_str_eq(rl_http_resp_header(&rs, "ETAG"), "\"abc\"");
    cr_assert_str_eq(rl_http_resp_header(&rs, "X-Dup"), "two");
    cr_assert_null(rl_http_resp_header(&rs, "Location"));
    rl_http_resp_free(&rs);
    /* the same handle again: the kept-alive connection is reused */
    url(u, sizeof u, "/echo");
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rs.status, 200);
    cr_assert_str_eq(rs.body, "GET 0 ");
    rl_http_resp_free(&rs);
    cr_assert_eq(atomic_load(&g_srv.accepts), 1);
    rl_http_free(h);
}

Test(http, methods_and_bodies_from_memory_and_callback) {
    rl_http *h = handle();
    char u[128];
    url(u, sizeof u, "/echo");
    const char *hdrs[] = {"Content-Type: application/json", "X-Secret: s3cr3t", NULL};
    const char *methods[] = {"POST", "PUT", "PATCH", "DELETE"};
    rl_err e = {0};
    for (int i = 0; i < 4; i++) {
        rl_http_req rq = {.method = methods[i], .url = u, .headers = hdrs, .body = "{\"a\":1}",
                          .body_len = 7, .timeout_s = 5};
        rl_http_resp rs;
        cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_OK, "%s", e.msg);
        char want[64];
        snprintf(want, sizeof want, "%s 7 {\"a\":1} +secret", methods[i]);
        cr_assert_str_eq(rs.body, want);
        rl_http_resp_free(&rs);
    }
    /* a POST without body still sends Content-Length: 0 */
    rl_http_req rq = {.method = "POST", .url = u, .timeout_s = 5};
    rl_http_resp rs;
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_OK, "%s", e.msg);
    cr_assert_str_eq(rs.body, "POST 0 ");
    rl_http_resp_free(&rs);
    rl_http_free(h);
}

typedef struct src {
    const char *data;
    size_t off, len;
    int calls;
} src;
static size_t read_src(void *ud, char *buf, size_t n) {
    src *s = ud;
    s->calls++;
    size_t k = s->len - s->off < 5 ? s->len - s->off : 5; /* small pieces on purpose */
    if (k > n) k = n;
    memcpy(buf, s->data + s->off, k);
    s->off += k;
    return k;
}
static size_t read_fail(void *ud, char *buf, size_t n) {
    (void)ud, (void)buf, (void)n;
    return RL_HTTP_READ_ABORT;
}

Test(http, body_through_read_callback) {
    rl_http *h = handle();
    char u[128];
    url(u, sizeof u, "/echo");
    src s = {.data = "part-one-of-a-multipart-upload", .len = 30};
    rl_http_req rq = {.method = "PUT", .url = u, .body_read = read_src, .body_ud = &s,
                      .body_read_len = 30, .timeout_s = 5};
    rl_http_resp rs;
    rl_err e = {0};
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_OK, "%s", e.msg);
    cr_assert_str_eq(rs.body, "PUT 30 part-one-of-a-multipart-upload");
    cr_assert_geq(s.calls, 6);
    rl_http_resp_free(&rs);
    rq.body_read = read_fail;
    int rc = rl_http_do(h, &rq, &rs, &e);
    cr_assert_eq(rc, RL_EIO, "%d %s", rc, e.msg);
    cr_assert(strstr(e.msg, "PUT http://127.0.0.1:"), "%s", e.msg);
    rl_http_resp_free(&rs);
    rl_http_free(h);
}

typedef struct lines {
    int n;
    char last[64];
} lines;
static int on_stream(void *ud, const char *d, size_t n) {
    lines *l = ud;
    for (size_t i = 0; i < n; i++)
        if (d[i] == '\n') l->n++;
    size_t k = n < sizeof l->last - 1 ? n : sizeof l->last - 1;
    memcpy(l->last, d, k);
    l->last[k] = '\0';
    return l->n >= 5; /* stop after five lines */
}

Test(http, streamed_body_stopped_by_callback) {
    rl_http *h = handle();
    char u[128];
    url(u, sizeof u, "/stream");
    lines l = {0};
    rl_http_req rq = {.url = u, .on_data = on_stream, .data_ud = &l, .idle_timeout_s = 2};
    rl_http_resp rs;
    rl_err e = {0};
    double t0 = rl_now();
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_OK, "%s", e.msg);
    cr_assert(rs.stopped);
    cr_assert_eq(rs.status, 200);
    cr_assert_eq(l.n, 5);
    cr_assert_null(rs.body);
    cr_assert_lt(rl_now() - t0, 2.0, "stopping must not wait for the 4 s stream to end");
    rl_http_resp_free(&rs);
    rl_http_free(h);
}

Test(http, total_timeout_is_etimeout) {
    rl_http *h = handle();
    char u[128];
    url(u, sizeof u, "/stall?token=hunter2");
    rl_http_req rq = {.url = u, .timeout_s = 0.5};
    rl_http_resp rs;
    rl_err e = {0};
    double t0 = rl_now();
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_ETIMEOUT, "%s", e.msg);
    double dt = rl_now() - t0;
    cr_assert(dt >= 0.45 && dt < 2.0, "took %.2f s", dt);
    cr_assert(strstr(e.msg, "GET http://127.0.0.1:"), "%s", e.msg);
    cr_assert(strstr(e.msg, "/stall"), "%s", e.msg);
    cr_assert_null(strstr(e.msg, "hunter2"), "query leaked: %s", e.msg);
    rl_http_resp_free(&rs);
    rl_http_free(h);
}

Test(http, idle_timeout_ends_a_stalled_stream) {
    rl_http *h = handle();
    char u[128];
    url(u, sizeof u, "/trickle");
    lines l = {0};
    rl_http_req rq = {.url = u, .on_data = on_stream, .data_ud = &l, .idle_timeout_s = 1};
    rl_http_resp rs;
    rl_err e = {0};
    double t0 = rl_now();
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_ETIMEOUT, "%s", e.msg);
    double dt = rl_now() - t0;
    cr_assert(dt >= 0.9 && dt < 4.0, "took %.2f s", dt);
    cr_assert_eq(rs.status, 200);
    cr_assert_str_eq(l.last, "0123456789");
    rl_http_resp_free(&rs);
    rl_http_free(h);
}

static volatile int g_abort;
static void *set_abort(void *arg) {
    (void)arg;
    struct timespec ts = {0, 300 * 1000000};
    nanosleep(&ts, NULL);
    g_abort = 1;
    return NULL;
}

Test(http, abort_flag_cancels_promptly) {
    rl_http *h = handle();
    char u[128];
    url(u, sizeof u, "/stall");
    g_abort = 0;
    rl_http_req rq = {.url = u, .timeout_s = 20, .abort_flag = &g_abort};
    rl_http_resp rs;
    rl_err e = {0};
    pthread_t t;
    double t0 = rl_now();
    pthread_create(&t, NULL, set_abort, NULL);
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_EABORT, "%s", e.msg);
    double dt = rl_now() - t0;
    pthread_join(t, NULL);
    cr_assert(dt >= 0.25 && dt < 1.6, "took %.2f s", dt);
    rl_http_resp_free(&rs);
    /* already set: fails before connecting */
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_EABORT);
    rl_http_resp_free(&rs);
    rl_http_free(h);
}

Test(http, refused_and_closed_connections_are_epeer) {
    rl_http *h = handle();
    /* a port nobody listens on: bind one, close it */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, (struct sockaddr *)&a, sizeof a);
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    close(fd);
    char u[128];
    snprintf(u, sizeof u, "http://user:pw@127.0.0.1:%d/x", ntohs(a.sin_port));
    rl_http_req rq = {.method = "DELETE", .url = u, .timeout_s = 5};
    rl_http_resp rs;
    rl_err e = {0};
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_EPEER, "%s", e.msg);
    cr_assert(strstr(e.msg, "DELETE http://127.0.0.1:"), "%s", e.msg);
    cr_assert_null(strstr(e.msg, "pw@"), "user info leaked: %s", e.msg);
    cr_assert_eq(rs.status, 0);
    rl_http_resp_free(&rs);
    url(u, sizeof u, "/close");
    rq.url = u;
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_EPEER, "%s", e.msg);
    rl_http_resp_free(&rs);
    rl_http_free(h);
}

Test(http, body_cap) {
    rl_http *h = handle();
    char u[128];
    url(u, sizeof u, "/big");
    rl_http_req rq = {.url = u, .timeout_s = 5, .max_body = 50000};
    rl_http_resp rs;
    rl_err e = {0};
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_EIO);
    cr_assert(strstr(e.msg, "over 50000 bytes"), "%s", e.msg);
    rl_http_resp_free(&rs);
    rq.max_body = 0;
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rs.body_len, 100000);
    rl_http_resp_free(&rs);
    rl_http_free(h);
}

/* ---- TLS against openssl s_server ------------------------------------------------ */
static int run_quiet(const char *cmd) {
    char full[2048];
    snprintf(full, sizeof full, "%s >/dev/null 2>&1", cmd);
    return system(full);
}

typedef struct tls_env {
    char dir[64];
    int port;
    pid_t pid;
} tls_env;

static void tls_start(tls_env *t) {
    snprintf(t->dir, sizeof t->dir, "/tmp/rlhttp-XXXXXX");
    cr_assert(mkdtemp(t->dir));
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
             "-keyout ca.key -out ca.crt -days 2 -subj /CN=test-ca && "
             "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
             "-keyout other.key -out other.crt -days 2 -subj /CN=other-ca && "
             "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout srv.key "
             "-out srv.csr -subj /CN=127.0.0.1 && printf 'subjectAltName=IP:127.0.0.1\\n' > ext && "
             "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
             "-out srv.crt -days 2 -extfile ext",
             t->dir);
    cr_assert_eq(run_quiet(cmd), 0, "openssl could not make test certificates");
    /* a free port: bind :0, read it, close, hand it to s_server */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, (struct sockaddr *)&a, sizeof a);
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    close(fd);
    t->port = ntohs(a.sin_port);
    t->pid = fork();
    cr_assert(t->pid >= 0);
    if (t->pid == 0) {
        char port[16], cert[128], key[128];
        snprintf(port, sizeof port, "%d", t->port);
        snprintf(cert, sizeof cert, "%s/srv.crt", t->dir);
        snprintf(key, sizeof key, "%s/srv.key", t->dir);
        int nul = open("/dev/null", 2);
        dup2(nul, 1), dup2(nul, 2);
        execlp("openssl", "openssl", "s_server", "-quiet", "-www", "-accept", port, "-cert",
               cert, "-key", key, (char *)NULL);
        _exit(127);
    }
    /* ready when it accepts connections (bounded) */
    for (int i = 0; i < 100; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        int ok = connect(c, (struct sockaddr *)&a, sizeof a) == 0;
        close(c);
        if (ok) return;
        usleep(50 * 1000);
    }
    cr_assert_fail("openssl s_server did not start");
}

static void tls_stop(tls_env *t) {
    if (t->pid > 0) {
        kill(t->pid, SIGTERM);
        waitpid(t->pid, NULL, 0);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", t->dir);
    run_quiet(cmd);
}

Test(http_tls, verified_against_the_given_ca_only, .timeout = 60) {
    tls_env t = {0};
    tls_start(&t);
    rl_http *h = handle();
    char u[128], ca[128], other[128];
    snprintf(u, sizeof u, "https://127.0.0.1:%d/", t.port);
    snprintf(ca, sizeof ca, "%s/ca.crt", t.dir);
    snprintf(other, sizeof other, "%s/other.crt", t.dir);
    rl_err e = {0};
    rl_http_resp rs;

    rl_http_tls tls = {.ca_file = ca};
    rl_http_req rq = {.url = u, .tls = &tls, .timeout_s = 10};
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rs.status, 200);
    rl_http_resp_free(&rs);

    /* the CA as a PEM blob */
    char *pem = NULL;
    size_t pl = 0;
    cr_assert_eq(rl_read_file(ca, &pem, &pl, &e), RL_OK);
    rl_http_tls blob = {.ca_pem = pem, .ca_pem_len = pl};
    rq.tls = &blob;
    cr_assert_eq(rl_http_do(h, &rq, &rs, &e), RL_OK, "%s", e.msg);
    cr_assert_eq(rs.status, 200);
    rl_http_resp_free(&rs);
    free(pem);

    /* another CA: refused, and the message says why */
    rl_http *h2 = handle();
    rl_http_tls wrong = {.ca_file = other};
    rq.tls = &wrong;
    cr_assert_eq(rl_http_do(h2, &rq, &rs, &e), RL_EIO);
    cr_assert(strstr(e.msg, "TLS verification failed"), "%s", e.msg);
    rl_http_resp_free(&rs);
    /* no CA given: the system store does not know our test CA either */
    rq.tls = NULL;
    cr_assert_eq(rl_http_do(h2, &rq, &rs, &e), RL_EIO);
    rl_http_resp_free(&rs);
    rl_http_free(h2);
    rl_http_free(h);
    tls_stop(&t);
}

/* ---- retry policy ------------------------------------------------------------------ */
Test(http_retry, backoff_full_jitter_bounds) {
    rl_http_backoff b = {.base_s = 0.1, .cap_s = 2.0, .attempts = 5};
    uint64_t st = 42;
    for (int k = 0; k < 10; k++) {
        double ceil_s = 0.1 * (double)(1 << k);
        if (ceil_s > 2.0) ceil_s = 2.0;
        double mx = 0, sum = 0;
        const int N = 4000;
        for (int i = 0; i < N; i++) {
            double d = rl_http_backoff_delay(&b, k, -1, &st);
            cr_assert(d >= 0 && d < ceil_s, "attempt %d: %f outside [0,%f)", k, d, ceil_s);
            if (d > mx) mx = d;
            sum += d;
        }
        /* full jitter: spread over the whole interval, mean about half */
        cr_assert_gt(mx, 0.9 * ceil_s);
        cr_assert(fabs(sum / N - ceil_s / 2) < 0.05 * ceil_s, "mean %f", sum / N);
    }
    /* Retry-After wins when longer than the jittered delay */
    for (int i = 0; i < 100; i++) {
        cr_assert_geq(rl_http_backoff_delay(&b, 0, 7.0, &st), 7.0);
        cr_assert_lt(rl_http_backoff_delay(&b, 0, 0.0, &st), 0.1);
    }
    /* defaults */
    rl_http_backoff d0 = {0};
    for (int i = 0; i < 100; i++) cr_assert_lt(rl_http_backoff_delay(&d0, 30, -1, &st), 30.0);
}

Test(http_retry, retry_after_values) {
    double s = -1;
    double now = 784111777.0; /* Sun, 06 Nov 1994 08:49:37 GMT */
    cr_assert_eq(rl_http_parse_retry_after("120", now, &s), RL_OK);
    cr_assert_float_eq(s, 120.0, 1e-9);
    cr_assert_eq(rl_http_parse_retry_after(" 0 ", now, &s), RL_OK);
    cr_assert_float_eq(s, 0.0, 1e-9);
    cr_assert_eq(rl_http_parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now, &s), RL_OK);
    cr_assert_float_eq(s, 30.0, 1e-9);
    cr_assert_eq(rl_http_parse_retry_after("Sunday, 06-Nov-94 08:49:47 GMT", now, &s), RL_OK);
    cr_assert_float_eq(s, 10.0, 1e-9);
    cr_assert_eq(rl_http_parse_retry_after("Sun Nov  6 08:49:42 1994", now, &s), RL_OK);
    cr_assert_float_eq(s, 5.0, 1e-9);
    cr_assert_eq(rl_http_parse_retry_after("Sat, 05 Nov 1994 08:49:37 GMT", now, &s), RL_OK);
    cr_assert_float_eq(s, 0.0, 1e-9, "a past date means now");
    const char *bad[] = {"", "soon", "-5", "1.5", "Sun, 06 Nov 1994 25:00:00 GMT",
                         "Sun, 06 Foo 1994 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:37 CET",
                         "99999999999", "Sun Nov  6 08:49:42", NULL};
    for (int i = 0; bad[i]; i++)
        cr_assert_eq(rl_http_parse_retry_after(bad[i], now, &s), RL_EINPUT, "'%s'", bad[i]);
}

Test(http_retry, retryable_outcomes) {
    cr_assert(rl_http_retryable(RL_ETIMEOUT, 0));
    cr_assert(rl_http_retryable(RL_EPEER, 0));
    cr_assert_not(rl_http_retryable(RL_EIO, 0), "TLS failures do not heal by retrying");
    cr_assert_not(rl_http_retryable(RL_EABORT, 0));
    long yes[] = {429, 500, 502, 503, 504, 599};
    long no[] = {200, 201, 400, 401, 403, 404, 409, 410, 422, 501, 505};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) cr_assert(rl_http_retryable(RL_OK, yes[i]));
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        cr_assert_not(rl_http_retryable(RL_OK, no[i]), "%ld", no[i]);
}

Test(http_retry, sleep_is_cancellable_and_escape) {
    g_abort = 0;
    pthread_t t;
    double t0 = rl_now();
    pthread_create(&t, NULL, set_abort, NULL);
    cr_assert_eq(rl_http_sleep(10, &g_abort), RL_EABORT);
    pthread_join(t, NULL);
    cr_assert_lt(rl_now() - t0, 1.0);
    cr_assert_eq(rl_http_sleep(0.05, NULL), RL_OK);
    char out[64];
    rl_err e = {0};
    cr_assert_eq(rl_http_query_escape("kubernetes.io/service-name=a b&c~", out, sizeof out, &e), RL_OK);
    cr_assert_str_eq(out, "kubernetes.io%2Fservice-name%3Da%20b%26c~");
    cr_assert_eq(rl_http_query_escape("////////////////////////", out, 16, &e), RL_EINPUT);
    char r[64];
    rl_http_url_redact("https://u:p@h:1/a/b?x=1#f", r, sizeof r);
    cr_assert_str_eq(r, "https://h:1/a/b");
    rl_http_url_redact("http://h/p@q?a@b", r, sizeof r);
    cr_assert_str_eq(r, "http://h/p@q");
    rl_http_url_redact("user:hunter2@h:9000/x", r, sizeof r); /* no scheme: still an authority */
    cr_assert_str_eq(r, "h:9000/x");
    /* where a token would travel in clear: http:// off this machine */
    static const struct {
        const char *url;
        bool remote;
    } ct[] = {{"http://rgw:7480", true},          {"HTTP://rgw.storage/", true},   {"http://127.evil.example/", true},
              {"http://10.0.0.1:9000", true},     {"https://rgw:7480", false},     {"http://127.0.0.1:9000/b", false},
              {"http://localhost", false},        {"http://[::1]:80/", false},     {"http://u:p@127.0.0.1:1/", false}};
    for (size_t i = 0; i < sizeof ct / sizeof ct[0]; i++)
        cr_expect_eq(rl_http_url_cleartext_remote(ct[i].url), ct[i].remote, "%s", ct[i].url);
    rl_err ce = {0};
    cr_expect_eq(rl_http_cleartext_check("http://u:pw@rgw:7480/x?y", false, "the token", "a.b", &ce), RL_EINPUT);
    cr_expect_str_eq(ce.msg, "http://rgw:7480/x: http:// would send the token in clear (use https://, or set a.b: true)");
    cr_expect_eq(rl_http_cleartext_check("http://rgw:7480", true, "the token", "a.b", &ce), RL_OK);
}
