/* The store client: one TCP connection, one request at a time. The socket
 * is non-blocking and every wait goes through poll() with a deadline, so no
 * call can outlive its timeout; after a timeout or a framing error the
 * stream's position is unknown, so the connection is marked broken and every
 * later call fails fast naming the first cause. Values are never logged. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"
#include "store/store_db.h"
#include "store/store_internal.h"

struct rl_store {
    int fd;
    int port;
    double timeout;
    char host[256];
    char peer[300]; /* "host:port", as messages name the store */
    bool broken;
    bool lost;      /* broken because the store closed or reset the connection */
    const volatile int *cancel; /* set: the call waiting gives up (rl_store_set_cancel) */
    char broken_why[200];
};

/* ---- deadline-bounded socket I/O ---------------------------------------------------- */
/* 1 ready, 0 deadline passed, -1 poll failed (errno), -2 *cancel set
 * (looked at every RL_CANCEL_SLICE_S). */
static int wait_fd(int fd, short ev, double deadline, const volatile int *cancel) {
    for (;;) {
        if (cancel && *cancel) return -2;
        double left = deadline - rl_now();
        if (left <= 0) return 0;
        if (cancel && left > RL_CANCEL_SLICE_S) left = RL_CANCEL_SLICE_S;
        double ms = ceil(left * 1000.0);
        struct pollfd p = {.fd = fd, .events = ev};
        int r = poll(&p, 1, ms > INT_MAX ? INT_MAX : (int)ms);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r > 0) return 1;
        if (cancel && *cancel) return -2;
    }
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* 0, RL_ETIMEOUT, RL_EABORT (cancelled) or RL_EPEER with *err = errno (EPIPE etc.). */
static int send_iov(int fd, struct iovec *iov, int n, double deadline, const volatile int *cancel, int *err) {
    while (n > 0) {
        if (iov->iov_len == 0) {
            iov++, n--;
            continue;
        }
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                *err = errno;
                return RL_EPEER;
            }
            int r = wait_fd(fd, POLLOUT, deadline, cancel);
            if (r == 0) return RL_ETIMEOUT;
            if (r == -2) return RL_EABORT;
            if (r < 0) {
                *err = errno;
                return RL_EPEER;
            }
            continue;
        }
        size_t left = (size_t)w;
        while (n > 0 && left >= iov->iov_len) left -= iov->iov_len, iov++, n--;
        if (n > 0) iov->iov_base = (char *)iov->iov_base + left, iov->iov_len -= left;
    }
    return 0;
}

/* Read exactly n bytes (buf NULL: discard them). *got counts what arrived.
 * 0, RL_ETIMEOUT, RL_EABORT (cancelled) or RL_EPEER with *err = errno (0
 * for an orderly EOF). */
static int recv_n(int fd, void *buf, size_t n, double deadline, const volatile int *cancel, size_t *got,
                  int *err) {
    uint8_t scratch[4096];
    *got = 0;
    while (*got < n) {
        size_t want = n - *got;
        void *dst = buf ? (uint8_t *)buf + *got : scratch;
        if (!buf && want > sizeof scratch) want = sizeof scratch;
        ssize_t r = recv(fd, dst, want, 0);
        if (r > 0) {
            *got += (size_t)r;
            continue;
        }
        if (r == 0) {
            *err = 0;
            return RL_EPEER;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            *err = errno;
            return RL_EPEER;
        }
        int w = wait_fd(fd, POLLIN, deadline, cancel);
        if (w == 0) return RL_ETIMEOUT;
        if (w == -2) return RL_EABORT;
        if (w < 0) {
            *err = errno;
            return RL_EPEER;
        }
    }
    return 0;
}

/* ---- requests ------------------------------------------------------------------------ */
static int broken(rl_store *s, rl_err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Fail the call and poison the connection: after a partial exchange the
 * next frame boundary is unknown. */
static int broken(rl_store *s, rl_err *e, int code, const char *fmt, ...) {
    char msg[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!s->broken) {
        s->broken = true;
        snprintf(s->broken_why, sizeof s->broken_why, "%.199s", msg);
    }
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    return rl_errf(e, code, "%s", msg);
}

/* The cancel flag was set during `what` (rl_store_set_cancel). */
static int cancelled(rl_store *s, rl_err *e, const char *what) {
    return broken(s, e, RL_EABORT, "store %s: %s given up (cancelled)", s->peer, what);
}

typedef struct reply {
    rl_store_frame f;
    uint8_t *val; /* malloc'd, vlen + 1 bytes, NUL-terminated */
} reply;

/* One request/response exchange bounded by `deadline`. `what` names it in
 * messages ("GET 'key'"). A response with status EPROTO is an error here;
 * every other status is for the caller. */
static int request(rl_store *s, uint16_t op, const char *what, const void *key, size_t klen,
                   const void *v, size_t vlen, const void *v2, size_t v2len, double deadline,
                   reply *rp, rl_err *e) {
    memset(rp, 0, sizeof *rp);
    double budget = deadline - rl_now(); /* for messages */
    if (s->broken)
        return rl_errf(e, RL_EPEER, "store %s: connection unusable after an earlier error (%s)",
                       s->peer, s->broken_why);
    uint8_t hdr[RL_STORE_HEADER_BYTES];
    rl_store_frame f = {.version = RL_STORE_VERSION, .op = op, .klen = (uint32_t)klen,
                        .vlen = (uint32_t)vlen, .v2len = (uint32_t)v2len};
    rl_store_frame_encode(hdr, &f);
    struct iovec iov[4] = {{hdr, sizeof hdr}, {(void *)key, klen}, {(void *)v, vlen},
                           {(void *)v2, v2len}};
    int err = 0;
    int rc = send_iov(s->fd, iov, 4, deadline, s->cancel, &err);
    if (rc == RL_EABORT) return cancelled(s, e, what);
    if (rc == RL_ETIMEOUT)
        return broken(s, e, RL_ETIMEOUT, "store %s: could not send %s within %.3g s",
                      s->peer, what, budget);
    /* A send error may follow an answer the server sent before closing
     * (EPROTO); try to read it so that the message says why. */
    double rdl = rc ? fmin(deadline, rl_now() + 0.2) : deadline;
    int send_err = rc ? err : 0;
    size_t got = 0;
    rc = recv_n(s->fd, hdr, sizeof hdr, rdl, s->cancel, &got, &err);
    if (rc == RL_EABORT) return cancelled(s, e, what);
    if (rc != 0 && got > 0 && got < 4 && memcmp(hdr, "RLST", got) != 0) rc = -1;
    if (rc != 0 && got >= 4 && memcmp(hdr, "RLST", 4) != 0) rc = -1;
    if (rc == -1)
        return broken(s, e, RL_EINPUT, "store %s is not a ringleader store (bad magic)", s->peer);
    s->lost = rc != 0 && rc != RL_ETIMEOUT; /* closed or reset, not just slow */
    if (rc != 0 && send_err)
        return broken(s, e, RL_EPEER, "store %s: connection lost sending %s: %s", s->peer, what,
                      strerror(send_err));
    if (rc == RL_ETIMEOUT)
        return broken(s, e, RL_ETIMEOUT, "store %s: no answer to %s within %.3g s", s->peer,
                      what, budget);
    if (rc != 0)
        return broken(s, e, RL_EPEER, "store %s closed the connection during %s%s%s", s->peer,
                      what, err ? ": " : "", err ? strerror(err) : "");
    rl_err pe;
    if (rl_store_frame_parse(hdr, sizeof hdr, s->peer, &rp->f, &pe) != RL_OK) {
        if (memcmp(hdr, "RLST", 4) != 0)
            return broken(s, e, RL_EINPUT, "store %s is not a ringleader store (bad magic)",
                          s->peer);
        return broken(s, e, RL_EINPUT, "%s (answering %s)", pe.msg, what);
    }
    if (rp->f.op != op)
        return broken(s, e, RL_EINPUT, "store %s answered op %s to %s", s->peer,
                      rl_store_op_name(rp->f.op), what);
    rp->val = malloc((size_t)rp->f.vlen + 1);
    if (!rp->val)
        return broken(s, e, RL_ENOMEM, "store %s: out of memory for a %u-byte value of %s",
                      s->peer, (unsigned)rp->f.vlen, what);
    rc = recv_n(s->fd, NULL, rp->f.klen, deadline, s->cancel, &got, &err);
    if (rc == 0) rc = recv_n(s->fd, rp->val, rp->f.vlen, deadline, s->cancel, &got, &err);
    if (rc == 0) rc = recv_n(s->fd, NULL, rp->f.v2len, deadline, s->cancel, &got, &err);
    if (rc != 0) {
        free(rp->val);
        rp->val = NULL;
        if (rc == RL_EABORT) return cancelled(s, e, what);
        if (rc == RL_ETIMEOUT)
            return broken(s, e, RL_ETIMEOUT, "store %s: answer to %s incomplete within %.3g s",
                          s->peer, what, budget);
        s->lost = true;
        return broken(s, e, RL_EPEER, "store %s closed the connection during %s%s%s", s->peer,
                      what, err ? ": " : "", err ? strerror(err) : "");
    }
    rp->val[rp->f.vlen] = '\0';
    if (rp->f.status == RL_STORE_EPROTO || rp->f.status == RL_STORE_EAUTH) {
        /* The server's reason, made one printable line. */
        char why[240];
        size_t n = rp->f.vlen < sizeof why - 1 ? rp->f.vlen : sizeof why - 1;
        for (size_t i = 0; i < n; i++) {
            uint8_t c = rp->val[i];
            why[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
        }
        why[n] = '\0';
        free(rp->val);
        rp->val = NULL;
        return broken(s, e, RL_EINPUT, "store %s rejected %s: %s", s->peer, what, why);
    }
    if (send_err) { /* an answer arrived although the request did not go out whole */
        s->lost = true;
        free(rp->val);
        rp->val = NULL;
        return broken(s, e, RL_EPEER, "store %s: connection lost sending %s: %s", s->peer,
                      what, strerror(send_err));
    }
    return RL_OK;
}

static int check_key(const rl_store *s, const char *key, char *desc, size_t dn, rl_err *e) {
    if (!key) return rl_errf(e, RL_EINPUT, "store %s: NULL key", s ? s->peer : "?");
    size_t n = strlen(key);
    rl_store_key_desc(desc, dn, key, n);
    if (n == 0) return rl_errf(e, RL_EINPUT, "store %s: empty key", s->peer);
    if (n > RL_STORE_MAX_KEY)
        return rl_errf(e, RL_EINPUT, "store %s: key '%s' is %zu bytes, limit %u", s->peer, desc,
                       n, RL_STORE_MAX_KEY);
    return RL_OK;
}

static int check_value(const rl_store *s, const char *desc, const char *name, size_t len,
                       rl_err *e) {
    if (len > RL_STORE_MAX_VALUE)
        return rl_errf(e, RL_EINPUT, "store %s: %s for key '%s' is %zu bytes, limit %u",
                       s->peer, name, desc, len, RL_STORE_MAX_VALUE);
    return RL_OK;
}

static int full(const rl_store *s, const char *what, rl_err *e) {
    return rl_errf(e, RL_EIO, "store %s is full (limit %u MiB of keys and values) at %s",
                   s->peer, RL_STORE_MAX_TOTAL >> 20, what);
}

static int unexpected(rl_store *s, const char *what, uint32_t status, rl_err *e) {
    return broken(s, e, RL_EPEER, "store %s: unexpected status %u answering %s", s->peer,
                  (unsigned)status, what);
}

/* ---- connect ------------------------------------------------------------------------- */
/* One attempt: 0 with *fd connected, or -1 with why[] (worth retrying). */
static int connect_once(const char *host, int port, double deadline, int *fd, char *why,
                        size_t wn) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    /* getaddrinfo cannot be bounded; DNS in a cluster answers fast or fails
     * fast, and a name that does not exist yet (a headless Service just
     * created) is retried like a refused connection. */
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g != 0) {
        snprintf(why, wn, "%s", g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        return -1;
    }
    int rc = -1;
    for (struct addrinfo *a = ai; a && rc != 0; a = a->ai_next) {
        int s = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                       a->ai_protocol);
        if (s < 0) {
            snprintf(why, wn, "socket: %s", strerror(errno));
            continue;
        }
        int r = connect(s, a->ai_addr, a->ai_addrlen);
        if (r != 0 && (errno == EINPROGRESS || errno == EINTR)) {
            int w = wait_fd(s, POLLOUT, deadline, NULL);
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (w == 1 && getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0) {
                r = 0;
            } else {
                errno = w == 0 ? ETIMEDOUT : w < 0 ? errno : soerr ? soerr : EIO;
            }
        }
        if (r == 0) {
            *fd = s;
            rc = 0;
        } else {
            snprintf(why, wn, "%s", strerror(errno));
            close(s);
        }
    }
    freeaddrinfo(ai);
    return rc;
}

void rl_store__tune_socket(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
#ifdef SO_NOSIGPIPE
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
#if defined(TCP_KEEPIDLE) && defined(TCP_KEEPINTVL) && defined(TCP_KEEPCNT)
    int idle = 10, intvl = 5, cnt = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
#endif
}

/* Connect and PING, retrying until `deadline` (the server may start later
 * than its clients, or turn us away while its handshake places are full).
 * RL_OK with s->fd open; a wrong protocol or version, or a PING that got no
 * answer, at once; otherwise RL_ETIMEOUT naming the last failure. */
static int dial(rl_store *s, double deadline, rl_err *e) {
    double start = rl_now(), backoff = 0.02;
    char why[160] = "no attempt";
    for (int attempt = 1;; attempt++) {
        int fd = -1;
        if (connect_once(s->host, s->port, deadline, &fd, why, sizeof why) == 0) {
            rl_store__tune_socket(fd);
            s->fd = fd;
            s->broken = s->lost = false;
            /* The handshake: proves the peer is a store speaking our version
             * before anyone trusts it with keys. Give it at least a second
             * even when the connect used up the budget. */
            double pdl = fmax(deadline, rl_now() + fmin(1.0, s->timeout));
            reply rp;
            rl_err pe = {0};
            int rc = request(s, RL_STORE_PING, "PING", NULL, 0, NULL, 0, NULL, 0, pdl, &rp, &pe);
            free(rp.val);
            if (rc == RL_OK && rp.f.status == RL_STORE_OK) {
                if (attempt > 1)
                    rl_log(RL_LOG_DEBUG, "store_connected", "\"attempts\":%d,\"secs\":%.3f",
                           attempt, rl_now() - start);
                return RL_OK;
            }
            if (s->fd >= 0) close(s->fd);
            s->fd = -1;
            s->broken = false;
            /* A wrong protocol or version will not fix itself: say so now. */
            if (rc == RL_EINPUT || rc == RL_ETIMEOUT) return rl_errf(e, rc, "%s", pe.msg);
            if (rc == RL_OK) rc = rl_errf(&pe, RL_EPEER, "PING answered with status %u",
                                          (unsigned)rp.f.status);
            snprintf(why, sizeof why, "%.150s", pe.msg);
        }
        double now = rl_now();
        if (now >= deadline) break;
        sleep_s(fmin(backoff, deadline - now));
        backoff = fmin(backoff * 2, 0.5);
        if (rl_now() >= deadline) break;
    }
    return rl_errf(e, RL_ETIMEOUT, "store %s unreachable after %g s: %s", s->peer, s->timeout,
                   why);
}

int rl_store_connect(const char *host, int port, double timeout_s, rl_store **out, rl_err *e) {
    *out = NULL;
    if (!host || !*host) return rl_errf(e, RL_EINPUT, "store: empty host");
    if (strlen(host) > 255) return rl_errf(e, RL_EINPUT, "store: host name longer than 255");
    if (port < 1 || port > 65535)
        return rl_errf(e, RL_EINPUT, "store %s: port %d is outside 1..65535", host, port);
    if (!(timeout_s > 0) || timeout_s > 1e6)
        return rl_errf(e, RL_EINPUT, "store %s:%d: timeout %g s is outside (0, 1e6]", host,
                       port, timeout_s);
    rl_store *s = calloc(1, sizeof *s);
    if (!s) return rl_errf(e, RL_ENOMEM, "store: out of memory");
    s->fd = -1, s->port = port, s->timeout = timeout_s;
    snprintf(s->host, sizeof s->host, "%s", host);
    if (strchr(host, ':')) snprintf(s->peer, sizeof s->peer, "[%s]:%d", host, port);
    else snprintf(s->peer, sizeof s->peer, "%s:%d", host, port);
    int rc = dial(s, rl_now() + timeout_s, e);
    if (rc != RL_OK) {
        free(s);
        return rc;
    }
    *out = s;
    return RL_OK;
}

void rl_store_set_cancel(rl_store *s, const volatile int *cancel) {
    if (s) s->cancel = cancel;
}

void rl_store_close(rl_store *s) {
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    free(s);
}

/* ---- operations ---------------------------------------------------------------------- */
int rl_store_set(rl_store *s, const char *key, const void *val, size_t len, rl_err *e) {
    char kd[96], what[120];
    int rc = check_key(s, key, kd, sizeof kd, e);
    if (rc == RL_OK) rc = check_value(s, kd, "value", len, e);
    if (rc != RL_OK) return rc;
    snprintf(what, sizeof what, "SET '%s'", kd);
    reply rp;
    rc = request(s, RL_STORE_SET, what, key, strlen(key), val, len, NULL, 0,
                 rl_now() + s->timeout, &rp, e);
    free(rp.val);
    if (rc != RL_OK) return rc;
    if (rp.f.status == RL_STORE_EFULL) return full(s, what, e);
    if (rp.f.status != RL_STORE_OK) return unexpected(s, what, rp.f.status, e);
    return RL_OK;
}

int rl_store_get(rl_store *s, const char *key, double timeout_s, void **val, size_t *len,
                 rl_err *e) {
    *val = NULL;
    if (len) *len = 0;
    char kd[96], what[120];
    int rc = check_key(s, key, kd, sizeof kd, e);
    if (rc != RL_OK) return rc;
    snprintf(what, sizeof what, "GET '%s'", kd);
    if (!(timeout_s >= 0)) timeout_s = 0; /* NaN and negatives: just look */
    double ms = ceil(timeout_s * 1000.0);
    uint32_t wait_ms = ms >= 4e9 ? 4000000000u : (uint32_t)ms;
    uint8_t wv[4] = {(uint8_t)(wait_ms >> 24), (uint8_t)(wait_ms >> 16), (uint8_t)(wait_ms >> 8),
                     (uint8_t)wait_ms};
    reply rp;
    /* The server answers by wait_ms; our own bound adds the call timeout
     * for the round trip. */
    rc = request(s, RL_STORE_GET, what, key, strlen(key), wv, 4, NULL, 0,
                 rl_now() + wait_ms / 1000.0 + s->timeout, &rp, e);
    if (rc != RL_OK) return rc;
    if (rp.f.status == RL_STORE_NOTFOUND) {
        free(rp.val);
        return rl_errf(e, RL_ETIMEOUT, "store %s: key '%s' not set within %g s", s->peer, kd,
                       timeout_s);
    }
    if (rp.f.status != RL_STORE_OK) {
        free(rp.val);
        return unexpected(s, what, rp.f.status, e);
    }
    *val = rp.val;
    if (len) *len = rp.f.vlen;
    return RL_OK;
}

int rl_store_add(rl_store *s, const char *key, int64_t delta, int64_t *result, rl_err *e) {
    char kd[96], what[120];
    int rc = check_key(s, key, kd, sizeof kd, e);
    if (rc != RL_OK) return rc;
    snprintf(what, sizeof what, "ADD '%s'", kd);
    uint8_t d[8];
    uint64_t u = (uint64_t)delta;
    for (int i = 0; i < 8; i++) d[i] = (uint8_t)(u >> (56 - 8 * i));
    reply rp;
    rc = request(s, RL_STORE_ADD, what, key, strlen(key), d, 8, NULL, 0, rl_now() + s->timeout,
                 &rp, e);
    if (rc != RL_OK) return rc;
    uint32_t st = rp.f.status, vl = rp.f.vlen;
    u = 0;
    for (uint32_t i = 0; st == RL_STORE_OK && i < 8 && vl == 8; i++) u = u << 8 | rp.val[i];
    free(rp.val);
    if (st == RL_STORE_MISMATCH)
        return rl_errf(e, RL_EINPUT,
                       "store %s: %s: the key holds a value that is not an 8-byte counter, or "
                       "adding %lld overflows it", s->peer, what, (long long)delta);
    if (st == RL_STORE_EFULL) return full(s, what, e);
    if (st != RL_STORE_OK) return unexpected(s, what, st, e);
    if (vl != 8)
        return broken(s, e, RL_EPEER, "store %s: %s answered with %u bytes, expected 8", s->peer,
                      what, (unsigned)vl);
    if (result) *result = (int64_t)u;
    return RL_OK;
}

int rl_store_cas(rl_store *s, const char *key, const void *expected, size_t elen,
                 const void *desired, size_t dlen, bool *swapped, void **current, size_t *clen,
                 rl_err *e) {
    if (swapped) *swapped = false;
    if (current) *current = NULL;
    if (clen) *clen = 0;
    char kd[96], what[120];
    int rc = check_key(s, key, kd, sizeof kd, e);
    if (rc == RL_OK) rc = check_value(s, kd, "expected value", expected ? elen : 0, e);
    if (rc == RL_OK) rc = check_value(s, kd, "desired value", dlen, e);
    if (rc != RL_OK) return rc;
    snprintf(what, sizeof what, "CAS '%s'", kd);
    reply rp;
    rc = request(s, RL_STORE_CAS, what, key, strlen(key), expected, expected ? elen : 0, desired,
                 dlen, rl_now() + s->timeout, &rp, e);
    if (rc != RL_OK) return rc;
    if (rp.f.status == RL_STORE_EFULL) {
        free(rp.val);
        return full(s, what, e);
    }
    if (rp.f.status != RL_STORE_OK && rp.f.status != RL_STORE_MISMATCH) {
        free(rp.val);
        return unexpected(s, what, rp.f.status, e);
    }
    if (swapped) *swapped = rp.f.status == RL_STORE_OK;
    if (clen) *clen = rp.f.vlen;
    if (current) *current = rp.val;
    else free(rp.val);
    return RL_OK;
}

int rl_store_delete(rl_store *s, const char *key, rl_err *e) {
    char kd[96], what[120];
    int rc = check_key(s, key, kd, sizeof kd, e);
    if (rc != RL_OK) return rc;
    snprintf(what, sizeof what, "DEL '%s'", kd);
    reply rp;
    rc = request(s, RL_STORE_DEL, what, key, strlen(key), NULL, 0, NULL, 0,
                 rl_now() + s->timeout, &rp, e);
    free(rp.val);
    if (rc != RL_OK) return rc;
    if (rp.f.status != RL_STORE_OK) return unexpected(s, what, rp.f.status, e);
    return RL_OK;
}

/* One CHALLENGE + AUTH exchange on the current connection. */
static int handshake(rl_store *s, const char *id, const char *kd, const void *secret, size_t slen,
                     rl_err *e) {
    char what[140];
    int rc;
    uint8_t cn[32], mac[32];
    if (RAND_bytes(cn, sizeof cn) != 1)
        return rl_errf(e, RL_EINTERNAL, "store %s: no random bytes for a nonce", s->peer);
    snprintf(what, sizeof what, "CHALLENGE as '%s'", kd);
    reply ch;
    rc = request(s, RL_STORE_CHALLENGE, what, id, strlen(id), cn, sizeof cn, NULL, 0,
                 rl_now() + s->timeout, &ch, e);
    if (rc != RL_OK) return rc;
    if (ch.f.status != RL_STORE_OK) {
        free(ch.val);
        return unexpected(s, what, ch.f.status, e);
    }
    if (ch.f.vlen == 0) {
        free(ch.val);
        return broken(s, e, RL_EINPUT, "store %s does not authenticate its clients, but this job "
                      "has a rendezvous secret: refusing to use it", s->peer);
    }
    if (ch.f.vlen != 64) { /* server nonce + server proof */
        free(ch.val);
        return broken(s, e, RL_EINPUT, "store %s: CHALLENGE answer of %u bytes, expected 64",
                      s->peer, (unsigned)ch.f.vlen);
    }
    uint8_t sn[32], sproof[32];
    memcpy(sn, ch.val, 32);
    memcpy(sproof, ch.val + 32, 32);
    free(ch.val);
    rl_store_proof_client(secret, slen, sn, cn, sizeof cn, id, strlen(id), mac);
    snprintf(what, sizeof what, "AUTH as '%s'", kd);
    reply au;
    rc = request(s, RL_STORE_AUTH, what, id, strlen(id), mac, sizeof mac, NULL, 0,
                 rl_now() + s->timeout, &au, e);
    free(au.val);
    if (rc != RL_OK) return rc;
    if (au.f.status != RL_STORE_OK) return unexpected(s, what, au.f.status, e);
    rl_store_proof_server(secret, slen, cn, sizeof cn, sn, mac);
    if (CRYPTO_memcmp(mac, sproof, 32) != 0)
        return broken(s, e, RL_EINPUT, "store %s accepted us but could not prove it knows the "
                      "rendezvous secret (an impostor at the leader's address?)", s->peer);
    return RL_OK;
}

int rl_store_auth(rl_store *s, const char *id, const void *secret, size_t slen, rl_err *e) {
    char kd[96];
    int rc = check_key(s, id, kd, sizeof kd, e);
    if (rc != RL_OK) return rc;
    if (!secret || slen == 0) return rl_errf(e, RL_EINPUT, "store %s: empty rendezvous secret", s->peer);
    double deadline = rl_now() + s->timeout;
    bool usable = !s->broken; /* a connection broken earlier stays broken */
    for (int attempt = 1;; attempt++) {
        rc = handshake(s, id, kd, secret, slen, e);
        /* Closed before we were in: a store under a flood of
         * unauthenticated connections gives the place of the oldest to a
         * newcomer. Nothing was done on this connection, so connect again. */
        if (rc != RL_EPEER || !usable || !s->lost || rl_now() >= deadline) return rc;
        rl_log(RL_LOG_DEBUG, "store_auth_retry", "\"attempt\":%d", attempt);
        if (s->fd >= 0) close(s->fd);
        s->fd = -1;
        if ((rc = dial(s, deadline, e)) != RL_OK) return rc;
    }
}

int rl_store_barrier(rl_store *s, const char *key, int count, double timeout_s, rl_err *e) {
    char kd[96];
    int rc = check_key(s, key, kd, sizeof kd, e);
    if (rc != RL_OK) return rc;
    if (count < 1)
        return rl_errf(e, RL_EINPUT, "store %s: barrier '%s': count %d is below 1", s->peer, kd,
                       count);
    size_t kl = strlen(key);
    if (kl + 9 > RL_STORE_MAX_KEY)
        return rl_errf(e, RL_EINPUT, "store %s: barrier key '%s' is too long", s->peer, kd);
    char ckey[RL_STORE_MAX_KEY + 16], rkey[RL_STORE_MAX_KEY + 16];
    snprintf(ckey, sizeof ckey, "%s/count", key);
    snprintf(rkey, sizeof rkey, "%s/release", key);
    double deadline = rl_now() + (timeout_s > 0 ? timeout_s : 0);
    int64_t n = 0;
    if ((rc = rl_store_add(s, ckey, 1, &n, e)) != RL_OK)
        return rl_err_wrap(e, "barrier '%s'", kd);
    if (n > count)
        return rl_errf(e, RL_EINPUT,
                       "store %s: barrier '%s': arrival %lld for a count of %d (key reused, or "
                       "processes disagree on the count)", s->peer, kd, (long long)n, count);
    /* The last to arrive releases everyone; nobody polls. */
    if (n == count && (rc = rl_store_set(s, rkey, "1", 1, e)) != RL_OK)
        return rl_err_wrap(e, "barrier '%s'", kd);
    void *v = NULL;
    size_t vl = 0;
    rc = rl_store_get(s, rkey, fmax(0, deadline - rl_now()), &v, &vl, e);
    free(v);
    if (rc == RL_ETIMEOUT && !s->broken) {
        /* Say how far it got: the count is what an operator needs. */
        int64_t now_n = -1;
        if (rl_store_add(s, ckey, 0, &now_n, NULL) != RL_OK) now_n = -1;
        if (now_n >= 0)
            return rl_errf(e, RL_ETIMEOUT,
                           "store %s: barrier '%s': only %lld of %d processes arrived within %g s",
                           s->peer, kd, (long long)now_n, count, timeout_s);
    }
    if (rc != RL_OK) return rl_err_wrap(e, "barrier '%s'", kd);
    return RL_OK;
}
