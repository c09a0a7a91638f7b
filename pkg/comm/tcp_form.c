/* tcp backend: forming the ring (tcp.c's opening comment; tcp_ring.h):
 * listening, the address records, and each link's handshake (hello.c
 * decides, this file moves the bytes). */
#include "comm/tcp_ring.h"

/* TCP_NODELAY: the op headers and the last small piece of each step must
 * not wait for Nagle. Socket buffers: by default we leave Linux's
 * autotuning on. Setting SO_RCVBUF turns autotuning off and is capped at
 * net.core.rmem_max, which is ~208 KiB on a stock kernel (a node's sysctl
 * in Kubernetes), far below what autotuning reaches (tcp_rmem's max, 6 MiB
 * by default); over loopback the two measured the same (see
 * bench/comm_allreduce.c). sockbuf_bytes > 0 asks for an explicit size.
 * Best effort: failing to tune a socket makes it slower, not wrong. */
static void tune_socket(int fd, size_t sockbuf) {
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (sockbuf > 0) {
        int sz = sockbuf > (size_t)INT_MAX / 2 ? INT_MAX / 2 : (int)sockbuf;
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    }
}

static void sockaddr_str(const struct sockaddr *sa, char *out, size_t n) {
    char h[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &s4->sin_addr, h, sizeof h);
        port = ntohs(s4->sin_port);
        snprintf(out, n, "%s:%d", h, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, h, sizeof h);
        port = ntohs(s6->sin6_port);
        snprintf(out, n, "[%s]:%d", h, port);
    } else {
        snprintf(out, n, "(unknown address family %d)", sa->sa_family);
    }
}

/* ---- address records (tcp_internal.h) ---------------------------------------- */

/* A copy of untrusted text fit for a one-line message: at most 100 bytes,
 * anything but printable ASCII shown as '?'. */
static const char *printable(const char *s, char out[104]) {
    size_t i = 0;
    for (; s[i] && i < 100; i++) out[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    out[i] = '\0';
    return out;
}

int rl_comm_tcp_parse_record(const char *rec, const char *key, char *host, size_t hostn,
                             int *port, int *world, rl_err *e) {
    char shown[104];
    printable(rec, shown);
    const char *sp = strrchr(rec, ' ');
    if (!sp || sp == rec)
        return rl_errf(e, RL_EINPUT, "store key %s: record \"%s\" is not \"host:port world\"",
                       key, shown);
    char *end;
    errno = 0;
    long w = strtol(sp + 1, &end, 10);
    if (errno || *end || end == sp + 1 || w < 1 || w > RL_COMM_MAX_WORLD)
        return rl_errf(e, RL_EINPUT, "store key %s: bad world in record \"%s\"", key, shown);
    const char *colon = NULL;
    for (const char *p = rec; p < sp; p++)
        if (*p == ':') colon = p;
    if (!colon || colon == rec)
        return rl_errf(e, RL_EINPUT, "store key %s: no host:port in record \"%s\"", key, shown);
    errno = 0;
    long pt = strtol(colon + 1, &end, 10);
    if (errno || end != sp || end == colon + 1 || pt < 1 || pt > 65535)
        return rl_errf(e, RL_EINPUT, "store key %s: bad port in record \"%s\"", key, shown);
    const char *h0 = rec, *h1 = colon;
    if (*h0 == '[' && h1 > h0 + 1 && h1[-1] == ']') {
        h0++;
        h1--;
    }
    size_t hl = (size_t)(h1 - h0);
    bool ok = hl > 0 && hl < hostn;
    /* host names and IP literals only (':' and '%' for IPv6 and its zone) */
    for (const char *p = h0; ok && p < h1; p++)
        ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
             *p == '.' || *p == '-' || *p == '_' || *p == ':' || *p == '%';
    if (!ok)
        return rl_errf(e, RL_EINPUT, "store key %s: bad host in record \"%s\"", key, shown);
    memcpy(host, h0, hl);
    host[hl] = '\0';
    *port = (int)pt;
    *world = (int)w;
    return RL_OK;
}

/* ---- forming the ring ------------------------------------------------------------ */

/* Listen on an ephemeral port of `host` (falling back to the wildcard
 * address when host is a name of this pod that is not a local address,
 * e.g. behind NAT). *src gets the address bound with port 0, for our own
 * connection to leave from; family AF_UNSPEC after the fallback. */
static int listen_on(const char *host, size_t sockbuf, int *fd_out, int *port_out,
                     struct sockaddr_storage *src, rl_err *e) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int g = getaddrinfo(host, "0", &hints, &ai);
    if (g != 0)
        return rl_errf(e, RL_EINPUT, "cannot resolve comm host \"%.200s\": %s", host,
                       gai_strerror(g));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        freeaddrinfo(ai);
        return rl_errf(e, RL_EIO, "socket() for listening on %.200s: %s", host, strerror(err));
    }
    tune_socket(fd, sockbuf); /* inherited by accepted sockets; window scale is set at SYN */
    int rc = bind(fd, ai->ai_addr, ai->ai_addrlen);
    memset(src, 0, sizeof *src);
    if (rc == 0) memcpy(src, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EADDRNOTAVAIL) {
        struct sockaddr_storage any = {0};
        any.ss_family = (sa_family_t)ai->ai_family; /* zero address, port 0: wildcard */
        rc = bind(fd, (struct sockaddr *)&any,
                  ai->ai_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                            : sizeof(struct sockaddr_in));
    }
    int err = errno;
    freeaddrinfo(ai);
    if (rc != 0 || listen(fd, 16) != 0) {
        if (rc == 0) err = errno;
        close(fd);
        return rl_errf(e, RL_EIO, "cannot listen on %.200s: %s", host, strerror(err));
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        err = errno;
        close(fd);
        return rl_errf(e, RL_EIO, "getsockname on %.200s: %s", host, strerror(err));
    }
    *port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                         : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (src->ss_family == AF_INET6) ((struct sockaddr_in6 *)src)->sin6_port = 0;
    if (src->ss_family == AF_INET) ((struct sockaddr_in *)src)->sin_port = 0;
    *fd_out = fd;
    return RL_OK;
}

/* Read a neighbour's record from the store and check its world. */
static int get_neighbour(rl_comm *c, const rl_comm_opts *o, int peer, double deadline,
                         char *addr, size_t addrn, char *host, size_t hostn, int *port,
                         rl_err *e) {
    char key[1100];
    snprintf(key, sizeof key, "%s/addr/%d", o->prefix, peer);
    double left = deadline - rl_now();
    if (left <= 0)
        return rl_errf(e, RL_ETIMEOUT, "rank %d: timed out before reading rank %d's address "
                       "(key %s)", c->rank, peer, key);
    void *val = NULL;
    size_t len = 0;
    int rc = rl_store_get(o->store, key, left, &val, &len, e);
    if (rc) {
        rl_err_wrap(e, "rank %d: waiting for rank %d's ring address", c->rank, peer);
        return rc;
    }
    int world = 0;
    char rec[ADDR_LEN + 32];
    snprintf(rec, sizeof rec, "%.*s", (int)min_sz(len, ADDR_LEN + 16), (const char *)val);
    free(val);
    rc = rl_comm_tcp_parse_record(rec, key, host, hostn, port, &world, e);
    if (rc) return rl_err_wrap(e, "rank %d: rank %d's ring address", c->rank, peer);
    const char *sp = strrchr(rec, ' ');
    snprintf(addr, addrn, "%.*s", (int)(sp - rec), rec);
    if (world != c->world)
        return rl_errf(e, RL_EINPUT,
                       "rank %d: rank %d (%s) was started with world size %d, this rank with "
                       "%d (key %s): every rank of a round must agree",
                       c->rank, peer, addr, world, c->world, key);
    return RL_OK;
}

/* ---- forming the ring: the link handshakes ------------------------------------------ */

/* One end of a link in its handshake (tcp_internal.h): our connection to
 * the right neighbour, or an accepted connection that may or may not be
 * the left one. */
typedef struct hslink {
    int fd; /* -1: a free slot */
    bool connecting, up_after_send;
    rl_comm_hs hs;
    uint8_t in[RL_COMM_HELLO_BYTES], out[RL_COMM_HELLO_BYTES];
    size_t got, sent, outlen; /* sent < outlen: writing */
    double since;             /* accepted at */
    char peer[ADDR_LEN + 40];
} hslink;

static bool again(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

/* Move a link's handshake on once poll says it can. 1: the link is up;
 * 0: not yet; -1: refused or failed, e says why (the caller closes). */
static int hs_io(const rl_comm_link *l, hslink *L, rl_err *e) {
    if (L->connecting) {
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(L->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
        if (err == EINPROGRESS) return 0;
        if (err) {
            rl_errf(e, RL_EPEER, "cannot connect to %s: %s%s", L->peer, strerror(err),
                    err == ECONNREFUSED ? " (is that rank still running?)" : "");
            return -1;
        }
        L->connecting = false;
    }
    if (L->sent < L->outlen) {
        ssize_t n = send(L->fd, L->out + L->sent, L->outlen - L->sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && !again(errno)) {
            rl_errf(e, RL_EPEER, "sending the handshake to %s: %s", L->peer, strerror(errno));
            return -1;
        }
        if (n > 0) L->sent += (size_t)n;
        return L->sent == L->outlen && L->up_after_send ? 1 : 0;
    }
    ssize_t n = recv(L->fd, L->in + L->got, sizeof L->in - L->got, MSG_DONTWAIT);
    if (n < 0 && again(errno)) return 0;
    if (n < 0) {
        rl_errf(e, RL_EPEER, "reading the handshake of %s: %s", L->peer, strerror(errno));
        return -1;
    }
    if (n == 0) {
        rl_errf(e, RL_EPEER, "%s closed the connection %s", L->peer,
                L->hs.accepting ? "during the handshake"
                                : "before the handshake ended (it refused us, or failed)");
        return -1;
    }
    L->got += (size_t)n;
    if (!rl_comm_tcp_hello_complete(L->in, L->got)) return 0;
    size_t outlen;
    rl_hs_action a = rl_comm_tcp_hs_step(l, &L->hs, L->in, L->got, L->peer, L->out, &outlen, e);
    L->got = 0;
    if (a == RL_HS_REFUSE) {
        /* best effort: an honest peer then knows why */
        if (outlen) (void)send(L->fd, L->out, outlen, MSG_NOSIGNAL | MSG_DONTWAIT);
        return -1;
    }
    if (a == RL_HS_UP) return 1;
    L->outlen = outlen, L->sent = 0, L->up_after_send = a == RL_HS_SEND_UP;
    return hs_io(l, L, e);
}

/* Addresses as 16 bytes (IPv4 mapped into IPv6), to compare peers. */
static bool addr16(const struct sockaddr *sa, uint8_t out[16]) {
    if (sa->sa_family == AF_INET6) {
        memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        return true;
    }
    if (sa->sa_family != AF_INET) return false;
    memset(out, 0, 10);
    out[10] = out[11] = 0xff;
    memcpy(out + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    return true;
}

#define MAX_LEFT_ADDRS 8
typedef struct ring_setup {
    int lfd;
    const char *rhost;
    int rport;
    const struct sockaddr_storage *src; /* bind our connection to this (NULL: any) */
    rl_comm_link right, left;           /* our end of each link */
    uint8_t left_ip[MAX_LEFT_ADDRS][16]; /* where the left neighbour may connect from */
    int nleft_ip;
    double deadline;
    const volatile int *cancel; /* rl_comm_opts.cancel */
} ring_setup;

/* The addresses the left neighbour's published host stands for: only a
 * connection from one of them can be the left neighbour. */
static int resolve_left(rl_comm *c, tcp *T, const char *lhost, ring_setup *rs, rl_err *e) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int g = getaddrinfo(lhost, NULL, &hints, &ai);
    if (g != 0)
        return rl_errf(e, RL_EPEER, "rank %d: cannot resolve rank %d's address %s: %s", c->rank,
                       T->left, T->left_addr, gai_strerror(g));
    rs->nleft_ip = 0;
    for (struct addrinfo *p = ai; p && rs->nleft_ip < MAX_LEFT_ADDRS; p = p->ai_next)
        if (addr16(p->ai_addr, rs->left_ip[rs->nleft_ip])) rs->nleft_ip++;
    freeaddrinfo(ai);
    return RL_OK;
}

static bool from_left(const ring_setup *rs, const struct sockaddr *sa) {
    uint8_t a[16];
    if (!addr16(sa, a)) return false;
    for (int i = 0; i < rs->nleft_ip; i++)
        if (memcmp(a, rs->left_ip[i], 16) == 0) return true;
    return false;
}

/* Start the connection to the right neighbour, from our published address
 * where we have it, so the neighbour sees the address it expects. */
static int dial_right(rl_comm *c, tcp *T, const ring_setup *rs, hslink *L, rl_err *e) {
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", rs->rport);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV},
                    *ai = NULL;
    int g = getaddrinfo(rs->rhost, portstr, &hints, &ai);
    if (g != 0)
        return rl_errf(e, RL_EPEER, "rank %d: cannot resolve rank %d's address %s: %s", c->rank,
                       T->right, T->right_addr, gai_strerror(g));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        freeaddrinfo(ai);
        return rl_errf(e, RL_EIO, "rank %d: socket(): %s", c->rank, strerror(err));
    }
    tune_socket(fd, T->sockbuf);
    if (rs->src && rs->src->ss_family == ai->ai_family)
        (void)bind(fd, (const struct sockaddr *)rs->src,
                   ai->ai_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                             : sizeof(struct sockaddr_in));
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen), err = errno;
    freeaddrinfo(ai);
    if (rc != 0 && err != EINPROGRESS) {
        close(fd);
        return rl_errf(e, RL_EPEER, "rank %d: connecting to rank %d (%s): %s", c->rank, T->right,
                       T->right_addr, strerror(err));
    }
    L->fd = fd;
    L->connecting = rc != 0;
    snprintf(L->peer, sizeof L->peer, "rank %d (%s)", T->right, T->right_addr);
    uint8_t cn[RL_COMM_NONCE_BYTES];
    if (RAND_bytes(cn, sizeof cn) != 1) return rl_errf(e, RL_EINTERNAL, "rank %d: no random "
                                                       "bytes for a nonce", c->rank);
    rl_comm_tcp_hs_connect(&rs->right, &L->hs, cn, L->out);
    L->outlen = RL_COMM_HELLO_BYTES;
    return RL_OK;
}

/* What became of the connections that were not the left neighbour: the
 * ring's timeout message names the last, and the first few are logged. */
typedef struct refusals {
    int n;
    char last[400];
} refusals;

static void refuse(refusals *rf, hslink *L, const char *why) {
    if (rf->n++ < 3) {
        char esc[500];
        rl_log(RL_LOG_WARN, "comm_connection_refused", "\"reason\":\"%s\"",
               rl_json_escape(esc, sizeof esc, why));
    }
    snprintf(rf->last, sizeof rf->last, "%.399s", why);
    if (L->fd >= 0) close(L->fd);
    L->fd = -1;
}

/* Take one connection from the listening socket into a handshake slot. A
 * connection from anywhere but the left neighbour's address is closed
 * before we read a byte; with every slot taken the oldest goes, so idle
 * connections cannot keep the real peer out. */
static int take_connection(rl_comm *c, ring_setup *rs, hslink *pend, refusals *rf, rl_err *e) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(rs->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
        if (again(errno) || errno == ECONNABORTED) return RL_OK;
        return rl_errf(e, RL_EIO, "rank %d: accept: %s", c->rank, strerror(errno));
    }
    hslink tmp = {.fd = fd};
    char where[64], why[200];
    sockaddr_str((struct sockaddr *)&ss, where, sizeof where);
    if (!from_left(rs, (struct sockaddr *)&ss)) {
        snprintf(why, sizeof why, "a connection from %s, not from rank %u's address", where,
                 rs->left.peer);
        refuse(rf, &tmp, why);
        return RL_OK;
    }
    hslink *slot = NULL;
    for (int i = 0; i < MAX_PENDING && !slot; i++)
        if (pend[i].fd < 0) slot = &pend[i];
    if (!slot) {
        slot = &pend[0];
        for (int i = 1; i < MAX_PENDING; i++)
            if (pend[i].since < slot->since) slot = &pend[i];
        snprintf(why, sizeof why, "%.120s: closed unfinished for a newer connection (more than %d "
                 "in their handshake)", slot->peer, MAX_PENDING);
        refuse(rf, slot, why);
    }
    memset(slot, 0, sizeof *slot);
    slot->fd = fd;
    slot->since = rl_now();
    snprintf(slot->peer, sizeof slot->peer, "a connection from %s", where);
    uint8_t sn[RL_COMM_NONCE_BYTES];
    if (RAND_bytes(sn, sizeof sn) != 1) {
        close(fd);
        slot->fd = -1;
        return rl_errf(e, RL_EINTERNAL, "rank %d: no random bytes for a nonce", c->rank);
    }
    rl_comm_tcp_hs_accept(&slot->hs, sn);
    return RL_OK;
}

static int ring_timeout(rl_comm *c, tcp *T, const hslink *right, bool right_up, bool left_up,
                        const refusals *rf, rl_err *e) {
    char a[400] = "", b[900] = "";
    if (!right_up)
        snprintf(a, sizeof a, "; %s rank %d (%s)",
                 right->connecting ? "could not connect to" : "no handshake with", T->right,
                 T->right_addr);
    if (!left_up)
        snprintf(b, sizeof b, "; no handshake from rank %d (%s)", T->left, T->left_addr);
    if (!left_up && rf->n)
        snprintf(b + strlen(b), sizeof b - strlen(b), "; refused %d other connection%s, the "
                 "last: %s", rf->n, rf->n == 1 ? "" : "s", rf->last);
    return rl_errf(e, RL_ETIMEOUT, "rank %d: forming the ring timed out after %.1f s%s%s",
                   c->rank, c->timeout_s, a, b);
}

/* Connect to the right neighbour and accept the left one, concurrently.
 * Anything wrong on our own connection fails the ring (we dialled the
 * published address); a connection that is not the left neighbour, or
 * does not finish its handshake within HANDSHAKE_S, is closed and
 * accepting goes on, so the ring fails only when the real left neighbour
 * does not come within the timeout. */
static int form_ring(rl_comm *c, tcp *T, ring_setup *rs, rl_err *e) {
    hslink right = {.fd = -1}, pend[MAX_PENDING];
    for (int i = 0; i < MAX_PENDING; i++) pend[i].fd = -1;
    refusals rf = {0};
    int rc = dial_right(c, T, rs, &right, e), afd = -1;
    bool right_up = false;
    while (!rc && (!right_up || afd < 0)) {
        double now = rl_now(), wake = rs->deadline;
        if (rs->cancel && *rs->cancel) {
            rc = rl_errf(e, RL_EABORT, "rank %d: forming the ring given up (cancelled)", c->rank);
            break;
        }
        if (rs->cancel && wake > now + RL_CANCEL_SLICE_S) wake = now + RL_CANCEL_SLICE_S;
        for (int i = 0; i < MAX_PENDING; i++) {
            if (pend[i].fd < 0) continue;
            if (now >= pend[i].since + HANDSHAKE_S) {
                char why[200];
                snprintf(why, sizeof why, "%s did not finish its handshake within %.0f s",
                         pend[i].peer, HANDSHAKE_S);
                refuse(&rf, &pend[i], why);
            } else if (pend[i].since + HANDSHAKE_S < wake) {
                wake = pend[i].since + HANDSHAKE_S;
            }
        }
        struct pollfd p[2 + MAX_PENDING];
        int idx[MAX_PENDING];
        nfds_t np = 0;
        if (!right_up)
            p[np++] = (struct pollfd){
                .fd = right.fd,
                .events = right.connecting || right.sent < right.outlen ? POLLOUT : POLLIN};
        int il = -1;
        if (afd < 0) {
            il = (int)np;
            p[np++] = (struct pollfd){.fd = rs->lfd, .events = POLLIN};
        }
        for (int i = 0; i < MAX_PENDING; i++) {
            idx[i] = -1;
            if (afd >= 0 || pend[i].fd < 0) continue;
            idx[i] = (int)np;
            p[np++] = (struct pollfd){
                .fd = pend[i].fd, .events = pend[i].sent < pend[i].outlen ? POLLOUT : POLLIN};
        }
        int r = poll_until(p, np, wake);
        if (r < 0) {
            rc = rl_errf(e, RL_EIO, "rank %d: poll while forming the ring: %s", c->rank,
                         strerror(errno));
            break;
        }
        if (r == 0) {
            if (rl_now() >= rs->deadline) rc = ring_timeout(c, T, &right, right_up, afd >= 0, &rf, e);
            continue;
        }
        if (!right_up && p[0].revents) {
            int k = hs_io(&rs->right, &right, e);
            if (k < 0) {
                rc = e->code ? e->code : RL_EPEER;
                rl_err_wrap(e, "rank %d", c->rank);
                break;
            }
            right_up = k > 0;
        }
        for (int i = 0; i < MAX_PENDING && afd < 0; i++) {
            if (idx[i] < 0 || !p[idx[i]].revents || pend[i].fd < 0) continue;
            rl_err pe = {0};
            int k = hs_io(&rs->left, &pend[i], &pe);
            if (k < 0) refuse(&rf, &pend[i], pe.msg);
            if (k > 0) afd = pend[i].fd, pend[i].fd = -1;
        }
        if (afd < 0 && il >= 0 && p[il].revents) rc = take_connection(c, rs, pend, &rf, e);
    }
    if (!rc) {
        T->sfd = right.fd, T->rfd = afd;
        right.fd = afd = -1;
    }
    if (right.fd >= 0) close(right.fd);
    if (afd >= 0) close(afd);
    for (int i = 0; i < MAX_PENDING; i++)
        if (pend[i].fd >= 0) close(pend[i].fd);
    return rc;
}

/* Listen, publish, read both neighbours' records, then the handshakes. */
int rl_tcp_form_ring(rl_comm *c, tcp *T, const rl_comm_opts *o, double deadline, int *port_out,
                     rl_err *e) {
    int rc, lfd = -1;
    const char *host = o->host && *o->host ? o->host : "127.0.0.1";
    int port = 0;
    struct sockaddr_storage src;
    if ((rc = listen_on(host, T->sockbuf, &lfd, &port, &src, e))) {
        rl_err_wrap(e, "rank %d: comm init", c->rank);
        return rc;
    }
    char rec[ADDR_LEN + 32], key[1100];
    snprintf(rec, sizeof rec, strchr(host, ':') ? "[%.255s]:%d %d" : "%.255s:%d %d", host, port,
             c->world);
    snprintf(key, sizeof key, "%s/addr/%d", o->prefix, c->rank);
    if ((rc = rl_store_set(o->store, key, rec, strlen(rec), e))) {
        rl_err_wrap(e, "rank %d: publishing the ring address (key %s)", c->rank, key);
        goto out;
    }
    char rhost[ADDR_LEN], lhost[ADDR_LEN];
    int lport = 0;
    ring_setup rs = {.lfd = lfd, .rhost = rhost, .deadline = deadline, .cancel = o->cancel,
                     .src = src.ss_family != AF_UNSPEC ? &src : NULL};
    /* Left first: its record tells whether it agrees on the world size, and
     * with a smaller world than ours our right neighbour may never exist. */
    if ((rc = get_neighbour(c, o, T->left, deadline, T->left_addr, sizeof T->left_addr, lhost,
                            sizeof lhost, &lport, e)))
        goto out;
    if ((rc = get_neighbour(c, o, T->right, deadline, T->right_addr, sizeof T->right_addr,
                            rhost, sizeof rhost, &rs.rport, e)))
        goto out;
    /* our end of each link: the same secret and round, the other rank */
    rs.right = (rl_comm_link){.secret = o->secret, .slen = o->secret ? o->secret_len : 0,
                              .prefix = o->prefix, .world = (uint32_t)c->world,
                              .rank = (uint32_t)c->rank, .peer = (uint32_t)T->right};
    rs.left = rs.right;
    rs.left.peer = (uint32_t)T->left;
    if ((rc = resolve_left(c, T, lhost, &rs, e)) || (rc = form_ring(c, T, &rs, e))) goto out;
    tune_socket(T->sfd, T->sockbuf);
    tune_socket(T->rfd, T->sockbuf);
    *port_out = port;
out:
    if (lfd >= 0) close(lfd);
    return rc;
}
