/* See faultproxy.h. One thread accepts; one thread per client connection
 * relays request by request over its own upstream connection. Every
 * socket wait is a poll() with a timeout, so stop is prompt. */
#include "faultproxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define HEAD_MAX 65536
#define BUF (1 << 20)

struct rl_fault_proxy {
    int lfd, port, up_port;
    char up_host[64];
    pthread_t acceptor;
    volatile int stop;
    pthread_mutex_t mu;
    rl_fault kind;
    int pending, requests, injected, live;
    char match[128];
};

typedef struct conn {
    rl_fault_proxy *p;
    int cfd, ufd;
    char *buf; /* bytes read from a side but not yet consumed */
    size_t have;
} conn;

/* Wait for fd readable (or writable); false on stop or after 60 s idle. */
static bool wait_fd(rl_fault_proxy *p, int fd, short ev) {
    for (int waited = 0; !p->stop && waited < 60000; waited += 200) {
        struct pollfd pf = {fd, ev, 0};
        int r = poll(&pf, 1, 200);
        if (r > 0) return true;
        if (r < 0 && errno != EINTR) return false;
    }
    return false;
}

static bool send_all(rl_fault_proxy *p, int fd, const char *d, size_t n) {
    while (n > 0) {
        if (!wait_fd(p, fd, POLLOUT)) return false;
        ssize_t w = send(fd, d, n, MSG_NOSIGNAL);
        if (w <= 0) {
            if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            return false;
        }
        d += w, n -= (size_t)w;
    }
    return true;
}

/* Read more from fd into buf[*have..cap). */
static bool fill(rl_fault_proxy *p, int fd, char *buf, size_t *have, size_t cap) {
    if (*have >= cap || !wait_fd(p, fd, POLLIN)) return false;
    ssize_t r = recv(fd, buf + *have, cap - *have, 0);
    if (r <= 0) return false;
    *have += (size_t)r;
    return true;
}

/* Read a head (through \r\n\r\n) into h; leftover bytes stay in buf. */
static long read_head(rl_fault_proxy *p, int fd, char *buf, size_t *have, char *h) {
    for (;;) {
        char *end = *have ? memmem(buf, *have, "\r\n\r\n", 4) : NULL;
        if (end) {
            size_t hl = (size_t)(end - buf) + 4;
            memcpy(h, buf, hl);
            h[hl] = '\0';
            memmove(buf, buf + hl, *have - hl);
            *have -= hl;
            return (long)hl;
        }
        if (*have >= HEAD_MAX || !fill(p, fd, buf, have, HEAD_MAX)) return -1;
    }
}

static long long header_num(const char *h, const char *name) {
    size_t nl = strlen(name);
    for (const char *l = strstr(h, "\r\n"); l && l[2]; l = strstr(l + 2, "\r\n"))
        if (!strncasecmp(l + 2, name, nl) && l[2 + nl] == ':') return atoll(l + 3 + nl);
    return -1;
}

static bool header_has(const char *h, const char *name, const char *value) {
    size_t nl = strlen(name);
    for (const char *l = strstr(h, "\r\n"); l && l[2]; l = strstr(l + 2, "\r\n"))
        if (!strncasecmp(l + 2, name, nl) && l[2 + nl] == ':') {
            const char *e = strstr(l + 2, "\r\n");
            for (const char *v = l + 3 + nl; v && v < e; v++)
                if (!strncasecmp(v, value, strlen(value))) return true;
        }
    return false;
}

/* Move n body bytes from `from` (buffered first) to `to` (or drop them when to < 0). */
static bool relay_n(rl_fault_proxy *p, int from, char *buf, size_t *have, int to, long long n) {
    while (n > 0) {
        if (*have == 0 && !fill(p, from, buf, have, BUF)) return false;
        size_t take = *have < (size_t)n ? *have : (size_t)n;
        if (to >= 0 && !send_all(p, to, buf, take)) return false;
        memmove(buf, buf + take, *have - take);
        *have -= take, n -= (long long)take;
    }
    return true;
}

/* Relay a chunked body, framing included, through the final empty chunk and trailers. */
static bool relay_chunked(rl_fault_proxy *p, int from, char *buf, size_t *have, int to) {
    for (;;) {
        char *eol;
        while (!(eol = *have ? memmem(buf, *have, "\r\n", 2) : NULL))
            if (!fill(p, from, buf, have, BUF)) return false;
        long long sz = strtoll(buf, NULL, 16);
        size_t line = (size_t)(eol - buf) + 2;
        if (sz < 0 || !relay_n(p, from, buf, have, to, (long long)line)) return false;
        if (sz == 0) { /* trailers end with an empty line */
            for (;;) {
                while (!(eol = *have ? memmem(buf, *have, "\r\n", 2) : NULL))
                    if (!fill(p, from, buf, have, BUF)) return false;
                size_t l = (size_t)(eol - buf) + 2;
                if (!relay_n(p, from, buf, have, to, (long long)l)) return false;
                if (l == 2) return true;
            }
        }
        if (!relay_n(p, from, buf, have, to, sz + 2)) return false;
    }
}

static void fault_answer(conn *c, rl_fault k) {
    static const char *const body[] = {
        "", "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InternalError</Code><Message>injected</Message></Error>",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InternalError</Code><Message>injected in a 200</Message></Error>"};
    static const char *const status[] = {"", "503 Slow Down", "500 Internal Server Error", "200 OK"};
    char h[256];
    int n = snprintf(h, sizeof h, "HTTP/1.1 %s\r\nContent-Type: application/xml\r\nContent-Length: %zu\r\n\r\n", status[k],
                     strlen(body[k]));
    send_all(c->p, c->cfd, h, (size_t)n);
    send_all(c->p, c->cfd, body[k], strlen(body[k]));
}

static void *serve(void *arg) {
    conn *c = arg;
    rl_fault_proxy *p = c->p;
    char *h = malloc(HEAD_MAX + 1), *ubuf = malloc(BUF);
    size_t uhave = 0;
    c->buf = malloc(BUF);
    c->have = 0;
    while (h && ubuf && c->buf && !p->stop) {
        if (read_head(p, c->cfd, c->buf, &c->have, h) < 0) break;
        long long clen = header_num(h, "content-length");
        bool head_req = !strncmp(h, "HEAD ", 5);
        pthread_mutex_lock(&p->mu);
        p->requests++;
        char *eol = strstr(h, "\r\n");
        bool hit = p->pending > 0 && (!p->match[0] || (memmem(h, (size_t)(eol - h), p->match, strlen(p->match))));
        rl_fault k = p->kind;
        if (hit) p->pending--, p->injected++;
        pthread_mutex_unlock(&p->mu);
        if (hit && k == RL_FAULT_DROP) break;
        if (hit && k == RL_FAULT_HOLD) { /* a request in flight for as long as its client lives */
            if (clen > 0 && !relay_n(p, c->cfd, c->buf, &c->have, -1, clen)) break;
            struct pollfd pf = {c->cfd, POLLIN, 0};
            char b;
            while (!p->stop && (poll(&pf, 1, 200) == 0 || recv(c->cfd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0))
                usleep(200 * 1000);
            break;
        }
        if (hit) {
            if (clen > 0 && !relay_n(p, c->cfd, c->buf, &c->have, -1, clen)) break;
            fault_answer(c, k);
            continue;
        }
        if (c->ufd < 0) {
            c->ufd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->up_port)};
            inet_pton(AF_INET, p->up_host, &sa.sin_addr);
            if (c->ufd < 0 || connect(c->ufd, (struct sockaddr *)&sa, sizeof sa) != 0) break;
        }
        if (!send_all(p, c->ufd, h, strlen(h)) || (clen > 0 && !relay_n(p, c->cfd, c->buf, &c->have, c->ufd, clen)))
            break;
        /* the answer */
        if (read_head(p, c->ufd, ubuf, &uhave, h) < 0 || !send_all(p, c->cfd, h, strlen(h))) break;
        int st = atoi(h + 9);
        long long rlen = header_num(h, "content-length");
        bool ok = true;
        if (head_req || st == 204 || st == 304 || (st >= 100 && st < 200)) ok = true;
        else if (header_has(h, "transfer-encoding", "chunked")) ok = relay_chunked(p, c->ufd, ubuf, &uhave, c->cfd);
        else if (rlen >= 0) ok = relay_n(p, c->ufd, ubuf, &uhave, c->cfd, rlen);
        else { /* until close */
            while (ok && fill(p, c->ufd, ubuf, &uhave, BUF)) ok = send_all(p, c->cfd, ubuf, uhave), uhave = 0;
            break;
        }
        if (!ok) break;
    }
    close(c->cfd);
    if (c->ufd >= 0) close(c->ufd);
    free(h), free(ubuf), free(c->buf);
    pthread_mutex_lock(&p->mu);
    p->live--;
    pthread_mutex_unlock(&p->mu);
    free(c);
    return NULL;
}

static void *acceptor(void *arg) {
    rl_fault_proxy *p = arg;
    while (!p->stop) {
        struct pollfd pf = {p->lfd, POLLIN, 0};
        if (poll(&pf, 1, 200) <= 0) continue;
        int fd = accept(p->lfd, NULL, NULL);
        if (fd < 0) continue;
        conn *c = calloc(1, sizeof *c);
        pthread_t t;
        if (!c) {
            close(fd);
            continue;
        }
        c->p = p, c->cfd = fd, c->ufd = -1;
        pthread_mutex_lock(&p->mu);
        p->live++;
        pthread_mutex_unlock(&p->mu);
        if (pthread_create(&t, NULL, serve, c) != 0) {
            close(fd), free(c);
            pthread_mutex_lock(&p->mu);
            p->live--;
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        pthread_detach(t);
    }
    return NULL;
}

int rl_fault_proxy_start(const char *up_host, int up_port, rl_fault_proxy **out) {
    rl_fault_proxy *p = calloc(1, sizeof *p);
    if (!p) return -1;
    snprintf(p->up_host, sizeof p->up_host, "%s", up_host);
    p->up_port = up_port;
    pthread_mutex_init(&p->mu, NULL);
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(p->lfd, 64) != 0 ||
        getsockname(p->lfd, (struct sockaddr *)&sa, &sl) != 0 || pthread_create(&p->acceptor, NULL, acceptor, p) != 0) {
        if (p->lfd >= 0) close(p->lfd);
        free(p);
        return -1;
    }
    p->port = ntohs(sa.sin_port);
    *out = p;
    return 0;
}

int rl_fault_proxy_port(const rl_fault_proxy *p) { return p->port; }

void rl_fault_proxy_inject(rl_fault_proxy *p, rl_fault kind, int n, const char *match) {
    pthread_mutex_lock(&p->mu);
    p->kind = kind, p->pending = n;
    snprintf(p->match, sizeof p->match, "%s", match ? match : "");
    pthread_mutex_unlock(&p->mu);
}

int rl_fault_proxy_requests(rl_fault_proxy *p) {
    pthread_mutex_lock(&p->mu);
    int n = p->requests;
    pthread_mutex_unlock(&p->mu);
    return n;
}

int rl_fault_proxy_injected(rl_fault_proxy *p) {
    pthread_mutex_lock(&p->mu);
    int n = p->injected;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void rl_fault_proxy_stop(rl_fault_proxy *p) {
    if (!p) return;
    p->stop = 1;
    pthread_join(p->acceptor, NULL);
    close(p->lfd);
    /* connection threads notice within a poll period */
    for (int i = 0; i < 50; i++) {
        pthread_mutex_lock(&p->mu);
        int live = p->live;
        pthread_mutex_unlock(&p->mu);
        if (!live) break;
        usleep(100 * 1000);
    }
    pthread_mutex_destroy(&p->mu);
    free(p);
}
