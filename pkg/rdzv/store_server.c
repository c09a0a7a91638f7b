/* The store server: one background thread, one poll() over the listening
 * socket, a wake-up pipe and every client (no thread per client, so a
 * thousand ranks cost a thousand small buffers, not a thousand stacks).
 * All sockets are non-blocking; each connection has an input buffer that
 * holds at most about one frame and an output buffer that is drained before
 * the next request is handled, so a client that stops reading slows only
 * itself (TCP back-pressure) and memory stays bounded. A GET for an absent
 * key with a wait is parked on its connection until a write of that key or
 * its deadline. Request semantics live in store_db.c. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rdzv/rdzv.h"
#include "rdzv/store_db.h"

#define MAX_CONNS 4096
#define READ_SLACK (64u << 10)  /* input read beyond the current frame */
#define OUT_HIGH (256u << 10)   /* stop handling requests while this much is unsent */
#define CLOSE_GRACE_S 2.0       /* to flush an EPROTO answer and drain before close */

typedef struct conn {
    int fd;
    char peer[80];
    rl_store_buf in, out;
    rl_store_session sess;
    size_t need;        /* bytes the current frame needs (from the last step) */
    bool parked;        /* a GET waits for its key */
    uint8_t *wkey;
    uint32_t wklen;
    double wdeadline;
    bool eof;           /* the client closed its side */
    bool closing;       /* protocol error: flush, shut down, drain, close */
    bool shut;          /* SHUT_WR done */
    double close_deadline;
    bool dead;
} conn;

struct rl_store_server {
    int lfd, wake[2], port;
    char where[300]; /* "host:port" for logs */
    pthread_t thread;
    bool started;
    atomic_bool stop;
    rl_store_db *db;
    conn **conns;
    size_t nconns, cap;
    struct pollfd *pfds;
    size_t pcap;
    double accept_pause_until;
};

static int set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void sockaddr_str(const struct sockaddr *sa, char *dst, size_t n) {
    char h[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)(const void *)sa;
        inet_ntop(AF_INET, &s4->sin_addr, h, sizeof h);
        port = ntohs(s4->sin_port);
        snprintf(dst, n, "%s:%d", h, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)(const void *)sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, h, sizeof h);
        port = ntohs(s6->sin6_port);
        snprintf(dst, n, "[%s]:%d", h, port);
    } else {
        snprintf(dst, n, "?");
    }
}

/* ---- connections ------------------------------------------------------------------ */
static void conn_free(conn *c) {
    if (c->fd >= 0) close(c->fd);
    rl_store_buf_free(&c->in);
    rl_store_buf_free(&c->out);
    free(c->wkey);
    free(c);
}

static void accept_all(rl_store_server *s) {
    for (;;) {
        if (s->nconns >= MAX_CONNS) return;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of descriptors: leave the rest in the backlog for a
                 * while instead of spinning on a readable listener. */
                s->accept_pause_until = rl_now() + 0.1;
                rl_log(RL_LOG_WARN, "store_accept_failed", "\"error\":\"%s\"", strerror(errno));
            }
            return;
        }
        if (s->nconns == s->cap) {
            size_t nc = s->cap ? s->cap * 2 : 16;
            conn **cs = realloc(s->conns, nc * sizeof *cs);
            if (!cs) {
                close(fd);
                return;
            }
            s->conns = cs, s->cap = nc;
        }
        conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            return;
        }
        c->fd = fd;
        c->need = RL_STORE_HEADER_BYTES;
        char addr[72];
        sockaddr_str((struct sockaddr *)&ss, addr, sizeof addr);
        snprintf(c->peer, sizeof c->peer, "client %s", addr);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
#ifdef SO_NOSIGPIPE
        setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
        s->conns[s->nconns++] = c;
    }
}

/* How much more input this connection may buffer: the current frame plus
 * some slack, so that small pipelined requests are read in one go. */
static size_t read_allowance(const conn *c) {
    size_t pending = c->in.len - c->in.off;
    size_t limit = (c->need > READ_SLACK ? c->need : 0) + READ_SLACK;
    return pending < limit ? limit - pending : 0;
}

static void conn_read(conn *c) {
    for (;;) {
        size_t room;
        if (c->closing) {
            /* Draining after the answer: discard, only EOF matters. */
            c->in.len = c->in.off = 0;
            room = READ_SLACK;
        } else {
            room = read_allowance(c);
            if (room == 0) return;
            if (room > (1u << 20)) room = 1u << 20;
        }
        rl_store_buf_compact(&c->in);
        if (rl_store_buf_reserve(&c->in, room) != 0) {
            rl_log(RL_LOG_WARN, "store_conn_dropped", "\"reason\":\"out of memory\"");
            c->dead = true;
            return;
        }
        ssize_t r = recv(c->fd, c->in.p + c->in.len, room, 0);
        if (r > 0) {
            c->in.len += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r == 0) {
            c->eof = true;
            if (c->closing || c->parked) c->dead = true;
        } else {
            c->dead = true;
        }
        return;
    }
}

static void conn_flush(conn *c) {
    while (c->out.off < c->out.len) {
        ssize_t w = send(c->fd, c->out.p + c->out.off, c->out.len - c->out.off, MSG_NOSIGNAL);
        if (w > 0) {
            c->out.off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        c->dead = true; /* EPIPE, ECONNRESET: the client is gone */
        return;
    }
    rl_store_buf_compact(&c->out);
}

static void park(conn *c, const rl_store_step *st, double now) {
    free(c->wkey);
    c->wkey = malloc(st->klen);
    if (!c->wkey) {
        c->dead = true;
        return;
    }
    memcpy(c->wkey, st->key, st->klen);
    c->wklen = st->klen;
    c->wdeadline = now + st->wait_ms / 1000.0;
    c->parked = true;
}

static void unpark(conn *c) {
    free(c->wkey);
    c->wkey = NULL;
    c->wklen = 0;
    c->parked = false;
}

/* A key got a value: answer every GET parked on it. */
static bool wake_waiters(rl_store_server *s, const uint8_t *key, uint32_t klen) {
    bool any = false;
    for (size_t i = 0; i < s->nconns; i++) {
        conn *w = s->conns[i];
        if (!w->parked || w->dead || w->wklen != klen || memcmp(w->wkey, key, klen) != 0)
            continue;
        int r = rl_store_db_answer_get(s->db, w->wkey, w->wklen, false, &w->out);
        if (r < 0) w->dead = true;
        if (r != 0) {
            unpark(w);
            any = true;
        }
    }
    return any;
}

/* Handle the complete requests buffered on c. Returns true when a parked
 * connection was released (its own buffered requests may now proceed). */
static bool conn_process(rl_store_server *s, conn *c, double now) {
    bool released = false;
    /* Append answers after what is unsent, not after what was sent. */
    if (c->out.off) rl_store_buf_compact(&c->out);
    while (!c->dead && !c->closing && !c->parked && c->out.len - c->out.off < OUT_HIGH) {
        rl_store_step st;
        rl_err e = {0};
        const uint8_t *p = c->in.p ? c->in.p + c->in.off : NULL; /* NULL before any read */
        size_t n = c->in.len - c->in.off;
        rl_store_step_result r = rl_store_db_step(s->db, &c->sess, p, n, c->peer, &c->out, &st, &e);
        if (r == RL_STORE_STEP_MORE) {
            c->need = st.need;
            break;
        }
        if (r == RL_STORE_STEP_NOMEM) {
            rl_log_msg(RL_LOG_WARN, "store_conn_dropped", e.msg);
            c->dead = true;
            break;
        }
        if (r == RL_STORE_STEP_ERROR) {
            rl_log_msg(RL_LOG_WARN, st.auth_failed ? "store_auth_refused" : "store_protocol_error", e.msg);
            c->closing = true;
            c->close_deadline = now + CLOSE_GRACE_S;
            break;
        }
        if (r == RL_STORE_STEP_WAIT) park(c, &st, now);
        if (r == RL_STORE_STEP_REPLY && st.wrote && wake_waiters(s, st.key, st.klen))
            released = true;
        c->in.off += st.used;
        c->need = RL_STORE_HEADER_BYTES;
    }
    if (c->in.off == c->in.len) rl_store_buf_compact(&c->in);
    return released;
}

/* ---- the loop --------------------------------------------------------------------- */
/* Has a buffered request that can be handled now. */
static bool runnable(const conn *c) {
    return !c->dead && !c->closing && !c->parked && c->out.len - c->out.off < OUT_HIGH &&
           c->in.len - c->in.off >= c->need;
}

/* Everything that does not wait for the network: expire parked GETs, handle
 * buffered requests, send, retire connections. */
static void advance(rl_store_server *s, double now) {
    for (size_t i = 0; i < s->nconns; i++) {
        conn *c = s->conns[i];
        if (c->parked && !c->dead && c->wdeadline <= now) {
            if (rl_store_db_answer_get(s->db, c->wkey, c->wklen, true, &c->out) < 0)
                c->dead = true;
            unpark(c);
        }
    }
    /* A write may release GETs parked on connections already visited, so go
     * round until nothing moves (a pass repeats only when it released a
     * parked connection, so this ends). */
    for (bool again = true; again;) {
        again = false;
        for (size_t i = 0; i < s->nconns; i++)
            if (conn_process(s, s->conns[i], now)) again = true;
    }
    size_t j = 0;
    for (size_t i = 0; i < s->nconns; i++) {
        conn *c = s->conns[i];
        if (!c->dead && c->out.off < c->out.len) conn_flush(c);
        bool flushed = c->out.off == c->out.len;
        if (c->closing && !c->dead && flushed && !c->shut) {
            /* Half-close, then read until the client's EOF, so that the
             * kernel does not answer its unread bytes with a RST that could
             * destroy the EPROTO answer before the client reads it. */
            shutdown(c->fd, SHUT_WR);
            c->shut = true;
        }
        if (c->closing && now >= c->close_deadline) c->dead = true;
        /* The client closed its side and nothing is left to answer. */
        if (c->eof && !c->closing && !c->parked && flushed && !runnable(c)) c->dead = true;
        if (c->dead) conn_free(c);
        else s->conns[j++] = c;
    }
    s->nconns = j;
}

static void *serve(void *arg) {
    rl_store_server *s = arg;
    while (!atomic_load(&s->stop)) {
        double now = rl_now();
        advance(s, now);
        size_t np = 2 + s->nconns;
        if (np > s->pcap) {
            struct pollfd *p = realloc(s->pfds, np * sizeof *p);
            if (!p) { /* try again shortly rather than die: the job needs its store */
                poll(NULL, 0, 10);
                continue;
            }
            s->pfds = p, s->pcap = np;
        }
        double next = -1;
        s->pfds[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        bool can_accept = s->nconns < MAX_CONNS && now >= s->accept_pause_until;
        s->pfds[1] = (struct pollfd){.fd = can_accept ? s->lfd : -1, .events = POLLIN};
        if (!can_accept && s->nconns < MAX_CONNS) next = s->accept_pause_until;
        for (size_t i = 0; i < s->nconns; i++) {
            conn *c = s->conns[i];
            short ev = 0;
            if (c->out.off < c->out.len) ev |= POLLOUT;
            if (c->closing) {
                if (c->shut) ev |= POLLIN;
                if (next < 0 || c->close_deadline < next) next = c->close_deadline;
            } else if (!c->eof) {
                ev |= POLLRDHUP;
                if (read_allowance(c) > 0) ev |= POLLIN;
            }
            if (c->parked && (next < 0 || c->wdeadline < next)) next = c->wdeadline;
            if (runnable(c)) next = now;
            s->pfds[2 + i] = (struct pollfd){.fd = c->fd, .events = ev};
        }
        int timeout = -1;
        if (next >= 0) {
            double ms = (next - now) * 1000.0;
            /* Round up so that a deadline is never woken for just early. */
            timeout = ms <= 0 ? 0 : ms > 60000 ? 60000 : (int)ms + 1;
        }
        int pr = poll(s->pfds, np, timeout);
        if (pr < 0 && errno != EINTR) {
            rl_log(RL_LOG_ERROR, "store_poll_failed", "\"error\":\"%s\"", strerror(errno));
            poll(NULL, 0, 10);
            continue;
        }
        if (atomic_load(&s->stop)) break;
        if (pr <= 0) continue;
        if (s->pfds[0].revents & POLLIN) {
            char b[64];
            while (read(s->wake[0], b, sizeof b) > 0) {
            }
        }
        for (size_t i = 0; i < s->nconns; i++) {
            conn *c = s->conns[i];
            short re = s->pfds[2 + i].revents;
            if (re & POLLNVAL) c->dead = true;
            if (c->dead || re == 0) continue;
            if (re & POLLOUT) conn_flush(c);
            if (re & (POLLIN | POLLHUP | POLLERR)) conn_read(c);
            if (re & (POLLRDHUP | POLLHUP | POLLERR)) {
                /* Closed by the peer, perhaps while we were not reading
                 * (back-pressure, a parked GET): nobody is left to take a
                 * parked answer. */
                c->eof = true;
                if (c->parked) c->dead = true;
            }
        }
        if (s->pfds[1].revents & POLLIN) accept_all(s);
    }
    return NULL;
}

/* ---- public ----------------------------------------------------------------------- */
int rl_store_server_start(const char *host, int port, rl_store_server **out, rl_err *e) {
    return rl_store_server_start_auth(host, port, NULL, 0, out, e);
}

int rl_store_server_start_auth(const char *host, int port, const void *secret, size_t slen,
                               rl_store_server **out, rl_err *e) {
    *out = NULL;
    const char *h = host && *host ? host : "0.0.0.0";
    if (port < 0 || port > 65535)
        return rl_errf(e, RL_EINPUT, "store port %d is outside 0..65535", port);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(h, ps, &hints, &ai);
    if (g != 0)
        return rl_errf(e, RL_EINPUT, "store: cannot listen on %s:%d: %s", h, port,
                       gai_strerror(g));
    rl_store_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(ai);
        return rl_errf(e, RL_ENOMEM, "store: out of memory");
    }
    s->lfd = s->wake[0] = s->wake[1] = -1;
    int rc = RL_OK;
    s->lfd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (s->lfd < 0) {
        rc = rl_errf(e, RL_EIO, "store: socket for %s:%d: %s", h, port, strerror(errno));
        goto fail;
    }
    int one = 1;
    /* Restarting after a crash must not wait out TIME_WAIT on the port. */
    setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s->lfd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno == EADDRINUSE)
            rc = rl_errf(e, RL_EINPUT, "store: port %d on %s is in use", port, h);
        else
            rc = rl_errf(e, RL_EINPUT, "store: cannot listen on %s:%d: %s", h, port,
                         strerror(errno));
        goto fail;
    }
    if (listen(s->lfd, 1024) != 0 || set_nonblock(s->lfd) != 0) {
        rc = rl_errf(e, RL_EIO, "store: listen on %s:%d: %s", h, port, strerror(errno));
        goto fail;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(s->lfd, (struct sockaddr *)&ss, &sl) != 0) {
        rc = rl_errf(e, RL_EIO, "store: getsockname: %s", strerror(errno));
        goto fail;
    }
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    snprintf(s->where, sizeof s->where, "%s:%d", h, s->port);
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        rc = rl_errf(e, RL_EIO, "store: pipe: %s", strerror(errno));
        goto fail;
    }
    s->db = rl_store_db_new(RL_STORE_MAX_TOTAL);
    if (!s->db || (slen > 0 && rl_store_db_set_secret(s->db, secret, slen) != 0)) {
        rc = rl_errf(e, RL_ENOMEM, "store: out of memory");
        goto fail;
    }
    atomic_init(&s->stop, false);
    /* The server thread takes no signals: SIGTERM and friends belong to the
     * threads that handle them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int pe = pthread_create(&s->thread, NULL, serve, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pe != 0) {
        rc = rl_errf(e, RL_EIO, "store: cannot start the server thread: %s", strerror(pe));
        goto fail;
    }
    s->started = true;
    freeaddrinfo(ai);
    char esc[320];
    rl_log(RL_LOG_INFO, "store_listen", "\"addr\":\"%s\",\"auth\":%s",
           rl_json_escape(esc, sizeof esc, s->where), slen > 0 ? "true" : "false");
    *out = s;
    return RL_OK;
fail:
    freeaddrinfo(ai);
    rl_store_server_stop(s);
    return rc;
}

int rl_store_server_port(const rl_store_server *s) { return s ? s->port : 0; }

void rl_store_server_stop(rl_store_server *s) {
    if (!s) return;
    if (s->started) {
        atomic_store(&s->stop, true);
        char b = 1;
        ssize_t w;
        do w = write(s->wake[1], &b, 1);
        while (w < 0 && errno == EINTR);
        pthread_join(s->thread, NULL);
    }
    /* Closing the client sockets is what makes blocked clients (a GET
     * waiting for a key) fail promptly instead of waiting out their time. */
    for (size_t i = 0; i < s->nconns; i++) conn_free(s->conns[i]);
    free(s->conns);
    free(s->pfds);
    if (s->lfd >= 0) close(s->lfd);
    if (s->wake[0] >= 0) close(s->wake[0]);
    if (s->wake[1] >= 0) close(s->wake[1]);
    rl_store_db_free(s->db);
    free(s);
}
