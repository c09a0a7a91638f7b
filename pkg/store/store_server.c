/* The store server: one background thread, one poll() over the listening
 * socket, a wake-up pipe and every client (no thread per client, so a
 * thousand ranks cost a thousand small buffers, not a thousand stacks).
 * All sockets are non-blocking; each connection has an input buffer that
 * holds at most about one frame and an output buffer that is drained before
 * the next request is handled, so a client that stops reading slows only
 * itself (TCP back-pressure) and memory stays bounded. A GET for an absent
 * key with a wait is parked on its connection until a write of that key or
 * its deadline. Request semantics live in store_db.c.
 *
 * Anyone who can reach the port can connect, so a connection that has not
 * authenticated yet is kept small and short-lived: its frames are judged
 * from their headers before any body is read (rl_store_judge_unauth), it
 * has HANDSHAKE_S to authenticate, and such connections are capped in all
 * and per source address. Authenticated connections that go quiet are
 * closed after IDLE_S, and the store never takes the descriptors its
 * process needs for everything else (FD_RESERVE_*). */
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store/store.h"
#include "store/store_db.h"
#include "store/store_internal.h"

#define READ_SLACK (64u << 10)  /* input read beyond the current frame */
#define OUT_HIGH (256u << 10)   /* stop handling requests while this much is unsent */
#define CLOSE_GRACE_S 2.0       /* to flush an EPROTO answer and drain before close */
/* A connection refused before it authenticated is drained (its bytes
 * thrown away) only this far: enough that a real client's small request
 * is taken in whole and no RST destroys the answer, not the 64 MiB body an
 * attacker keeps sending. */
#define DRAIN_UNAUTH_MAX (64u << 10)

/* ---- limits ----------------------------------------------------------------------
 * Connections in all: one per rank and agent of the largest job planned
 * for; fewer when the descriptor limit leaves less (conn_budget). */
#define MAX_CONNS 4096
/* Connections not authenticated yet (on a store without a secret: not
 * answered once yet). A real client is here for a few round trips
 * (connect's PING, CHALLENGE, AUTH), milliseconds, so this is plenty for a
 * whole job joining at once; it keeps silent sockets from taking the slots
 * and descriptors of authenticated clients. */
#define UNAUTH_MAX 128
/* ... of them from one source address, so that one address cannot take
 * them all. A node's trainers start together (up to 1024 per node): those
 * over the cap are turned away (see EVICT_AFTER_S) and retry. */
#define UNAUTH_PER_ADDR 32
/* A newcomer over a cap takes the place of the oldest connection that has
 * handshaken longer than this (or was refused already): a real client is
 * done in milliseconds, so the oldest is most likely a silent socket, and
 * a flood of them keeps a real client out for about this long (plus its
 * connect backoff), not for the whole HANDSHAKE_S. Younger ones are never
 * displaced; the newcomer is closed instead. Either way the client loses
 * nothing: rl_store_connect retries a closed PING, rl_store_auth connects
 * again when closed during the handshake. */
#define EVICT_AFTER_S 0.5
/* From accept to authenticated (no secret: to the first answer).
 * Clients PING as they connect and authenticate right after. */
#define HANDSHAKE_S 5.0
/* An authenticated connection with nothing pending for this long is
 * closed. The clock stops while a GET is parked or an answer is unsent, so
 * no wait is ever cut. Real clients are never near this quiet: agents
 * heartbeat and look at the round every 0.2 s (whatever heartbeat_s), the
 * coordinator polls every 0.1 s, and a trainer's one gap is its device
 * start-up between claiming its rank and forming the ring; after that it
 * never uses the store again, and closing its connection gives the slot and
 * descriptor back for the rest of the run. */
#define IDLE_S 600.0
/* Descriptors the store leaves to the rest of its process (the leader
 * agent's Kubernetes calls, trainer pipes, checkpoint files): a quarter of
 * RLIMIT_NOFILE, at least 64. */
#define FD_RESERVE_DIV 4
#define FD_RESERVE_MIN 64
/* ... but a store always takes this many, so a tiny limit still runs a
 * small job. */
#define MIN_CONNS 16
/* Accepts per loop turn: a connection flood must not keep the loop from
 * serving the clients already in. */
#define ACCEPT_BATCH 64
/* After an accept failure for want of descriptors or memory, leave the
 * backlog alone this long instead of spinning on a readable listener. */
#define ACCEPT_PAUSE_S 0.1
/* Repeated events (accept failures, refused, evicted or timed-out
 * connections, protocol and authentication errors) are logged at most
 * LOG_BURST times per LOG_EVERY_S each; the next line says how many were
 * held back, so an attack cannot flood the log. */
#define LOG_EVERY_S 10.0
#define LOG_BURST 5

typedef struct ratelog {
    double window_end;
    unsigned n, held;
} ratelog;

typedef struct conn {
    int fd;
    char peer[80];
    uint8_t addr[16];   /* source address (IPv4 v4-mapped), for UNAUTH_PER_ADDR */
    rl_store_buf in, out;
    rl_store_session sess;
    size_t need;        /* bytes the current frame needs (from the last step) */
    bool handshaking;   /* not authenticated yet (no secret: not answered yet) */
    double accepted_at; /* handshake deadline: accepted_at + HANDSHAKE_S */
    double active_at;   /* last byte in or out or request handled: IDLE_S */
    bool parked;        /* a GET waits for its key */
    uint8_t *wkey;
    uint32_t wklen;
    double wdeadline;
    bool eof;           /* the client closed its side */
    bool closing;       /* protocol error: flush, shut down, drain, close */
    bool shut;          /* SHUT_WR done */
    double close_deadline;
    size_t drained;     /* bytes thrown away while closing */
    bool dead;
} conn;

struct rl_store_server {
    int lfd, wake[2], port;
    char where[300]; /* "host:port" for logs */
    pthread_t thread;
    bool started;
    bool secured;    /* a secret: connections must authenticate */
    atomic_bool stop;
    rl_store_db *db;
    conn **conns;
    size_t nconns, cap;
    size_t budget;   /* connections allowed now (conn_budget) */
    struct pollfd *pfds;
    size_t pcap;
    double accept_pause_until;
    uint8_t drain[16384]; /* where closing connections' input is discarded */
    ratelog lg_accept, lg_refused, lg_handshake, lg_idle, lg_proto, lg_auth;
    rl_store_limits lim;
};

void rl_store_limits_default(rl_store_limits *l) {
    *l = (rl_store_limits){.handshake_s = HANDSHAKE_S, .idle_s = IDLE_S,
                           .evict_after_s = EVICT_AFTER_S, .unauth_max = UNAUTH_MAX,
                           .unauth_per_addr = UNAUTH_PER_ADDR};
}

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

/* The source address as 16 bytes, IPv4 as ::ffff:a.b.c.d, so that a v4
 * client of a dual-stack listener counts as the same address either way. */
static void sockaddr_key(const struct sockaddr *sa, uint8_t key[16]) {
    memset(key, 0, 16);
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)(const void *)sa;
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &s4->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
    }
}

/* ---- decisions (no I/O) ------------------------------------------------------------ */
/* Whether to log one more of a repeated event now; *held gets how many
 * were swallowed since the last line. */
static bool ratelog_due(ratelog *r, double now, unsigned *held) {
    if (now >= r->window_end) r->window_end = now + LOG_EVERY_S, r->n = 0;
    if (r->n >= LOG_BURST) {
        r->held++;
        return false;
    }
    r->n++;
    *held = r->held;
    r->held = 0;
    return true;
}

/* How many connections the store may hold under a descriptor limit of
 * `nofile` (0: none): MAX_CONNS, less the reserve and the store's own three
 * descriptors (listener, wake-up pipe). */
static size_t conn_budget(unsigned long long nofile) {
    if (nofile == 0) return MAX_CONNS;
    unsigned long long reserve = nofile / FD_RESERVE_DIV;
    if (reserve < FD_RESERVE_MIN) reserve = FD_RESERVE_MIN;
    unsigned long long left = nofile > reserve + 3 ? nofile - reserve - 3 : 0;
    if (left < MIN_CONNS) left = MIN_CONNS;
    return left < MAX_CONNS ? (size_t)left : MAX_CONNS;
}

/* A handshaking connection a newcomer may displace. */
static bool evictable(const rl_store_limits *lim, const conn *c, double now) {
    return c->closing || now - c->accepted_at >= lim->evict_after_s;
}

typedef struct admission {
    bool admit;
    conn *evict;        /* to close first (NULL: a free place) */
    const char *why;    /* when refused or evicting: the cap */
} admission;

/* Whether a newcomer from `addr` gets a handshake place, and whom it
 * displaces (the oldest evictable one, of its own address when that is
 * the cap it hits). `full`: the store is at its connection budget, so the
 * newcomer needs someone's place in any case. */
static admission admit(const rl_store_server *s, const uint8_t addr[16], bool full, double now) {
    size_t total = 0, same = 0;
    conn *oldest = NULL, *oldest_same = NULL;
    for (size_t i = 0; i < s->nconns; i++) {
        conn *c = s->conns[i];
        if (c->dead || !c->handshaking) continue;
        bool mine = memcmp(c->addr, addr, 16) == 0;
        total++, same += mine;
        if (!evictable(&s->lim, c, now)) continue;
        if (!oldest || c->accepted_at < oldest->accepted_at) oldest = c;
        if (mine && (!oldest_same || c->accepted_at < oldest_same->accepted_at)) oldest_same = c;
    }
    if (same >= (size_t)s->lim.unauth_per_addr)
        return (admission){oldest_same != NULL, oldest_same, "unauthenticated connections from one address"};
    if (total >= (size_t)s->lim.unauth_max)
        return (admission){oldest != NULL, oldest, "unauthenticated connections"};
    if (full) return (admission){oldest != NULL, oldest, "connections (descriptor budget)"};
    return (admission){true, NULL, NULL};
}

/* At the budget, a newcomer can still come in when a stale handshake can
 * make room: silent sockets must not keep real clients in the backlog. */
static bool can_take_one(const rl_store_server *s, double now) {
    if (s->nconns < s->budget) return true;
    for (size_t i = 0; i < s->nconns; i++) {
        const conn *c = s->conns[i];
        if (!c->dead && c->handshaking && evictable(&s->lim, c, now)) return true;
    }
    return false;
}

/* Nothing is pending on c, so the idle clock runs. */
static bool idle_clock_runs(const conn *c) {
    return !c->handshaking && !c->parked && !c->closing && !c->dead && c->out.off == c->out.len;
}

/* Not authenticated to a store that wants it: only handshake frames. */
static bool pre_auth(const rl_store_server *s, const conn *c) {
    return s->secured && !c->sess.authed;
}

/* ---- connections ------------------------------------------------------------------ */
static void conn_free(conn *c) {
    if (c->fd >= 0) close(c->fd);
    rl_store_buf_free(&c->in);
    rl_store_buf_free(&c->out);
    free(c->wkey);
    free(c);
}

/* Close now (its place is needed): the descriptor goes back at once, the
 * rest when advance() retires it. */
static void conn_drop(conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->dead = true;
}

static void log_held(ratelog *r, rl_log_level lvl, const char *event, const char *peer,
                     const char *why, double now) {
    unsigned held;
    if (!ratelog_due(r, now, &held)) return;
    char e1[200], e2[400];
    rl_log(lvl, event, "\"peer\":\"%s\",\"reason\":\"%s\",\"suppressed\":%u",
           rl_json_escape(e1, sizeof e1, peer), rl_json_escape(e2, sizeof e2, why), held);
}

/* A new connection, admitted: a handshake place and its buffers. Closes
 * fd when there is no memory for it. */
static void conn_add(rl_store_server *s, int fd, const struct sockaddr *sa, const uint8_t key[16],
                     double now) {
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
    c->handshaking = true;
    c->accepted_at = c->active_at = now;
    memcpy(c->addr, key, 16);
    char addr[72];
    sockaddr_str(sa, addr, sizeof addr);
    snprintf(c->peer, sizeof c->peer, "client %s", addr);
    rl_store__tune_socket(fd);
    s->conns[s->nconns++] = c;
}

/* accept4 failed: leave the backlog alone for a while when it was for want
 * of descriptors or memory, so the loop does not spin on a readable
 * listener. True when accepting may go on at once. */
static bool accept_failed(rl_store_server *s, int err, double now) {
    if (err == EINTR || err == ECONNABORTED || err == EPROTO || err == ENETDOWN ||
        err == ENOPROTOOPT || err == EHOSTDOWN || err == ENONET || err == EHOSTUNREACH ||
        err == ENETUNREACH)
        return true; /* that one connection failed (accept(2)): take the next */
    if (err == EAGAIN || err == EWOULDBLOCK) return false;
    s->accept_pause_until = now + ACCEPT_PAUSE_S;
    unsigned held;
    if (ratelog_due(&s->lg_accept, now, &held))
        rl_log(RL_LOG_WARN, "store_accept_failed", "\"error\":\"%s\",\"budget\":%zu,\"conns\":%zu,"
               "\"suppressed\":%u", strerror(err), s->budget, s->nconns, held);
    return false;
}

static void accept_some(rl_store_server *s, double now) {
    for (int n = 0; n < ACCEPT_BATCH && can_take_one(s, now); n++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (accept_failed(s, errno, now)) continue;
            return;
        }
        uint8_t key[16];
        sockaddr_key((struct sockaddr *)&ss, key);
        admission a = admit(s, key, s->nconns >= s->budget, now);
        if (!a.admit) {
            char addr[72];
            sockaddr_str((struct sockaddr *)&ss, addr, sizeof addr);
            log_held(&s->lg_refused, RL_LOG_WARN, "store_conn_refused", addr, a.why, now);
            close(fd); /* before reading a byte: the client's connect retries */
            continue;
        }
        if (a.evict) {
            log_held(&s->lg_refused, RL_LOG_WARN, "store_conn_evicted", a.evict->peer, a.why, now);
            conn_drop(a.evict);
        }
        conn_add(s, fd, (struct sockaddr *)&ss, key, now);
    }
}

/* How much more input this connection may buffer: the current frame plus
 * some slack, so that small pipelined requests are read in one go; before
 * authentication no more than the largest handshake frame. */
static size_t read_allowance(const rl_store_server *s, const conn *c) {
    size_t pending = c->in.len - c->in.off;
    size_t limit = (c->need > READ_SLACK ? c->need : 0) + READ_SLACK;
    if (pre_auth(s, c)) limit = RL_STORE_HANDSHAKE_MAX;
    return pending < limit ? limit - pending : 0;
}

/* A closing connection: read and discard until its EOF (before
 * authentication: at most DRAIN_UNAUTH_MAX, then close). */
static void conn_drain(rl_store_server *s, conn *c) {
    c->in.len = c->in.off = 0;
    for (;;) {
        ssize_t r = recv(c->fd, s->drain, sizeof s->drain, 0);
        if (r > 0) {
            c->drained += (size_t)r;
            if (pre_auth(s, c) && c->drained > DRAIN_UNAUTH_MAX) {
                c->dead = true;
                return;
            }
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        c->eof = c->dead = true;
        return;
    }
}

static void conn_read(rl_store_server *s, conn *c, double now) {
    if (c->closing) {
        conn_drain(s, c);
        return;
    }
    for (;;) {
        size_t room = read_allowance(s, c);
        if (room == 0) return;
        if (room > (1u << 20)) room = 1u << 20;
        rl_store_buf_compact(&c->in);
        if (rl_store_buf_reserve(&c->in, room) != 0) {
            rl_log(RL_LOG_WARN, "store_conn_dropped", "\"reason\":\"out of memory\"");
            c->dead = true;
            return;
        }
        ssize_t r = recv(c->fd, c->in.p + c->in.len, room, 0);
        if (r > 0) {
            c->in.len += (size_t)r;
            c->active_at = now;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r == 0) {
            c->eof = true;
            if (c->parked) c->dead = true;
        } else {
            c->dead = true;
        }
        return;
    }
}

static void conn_flush(conn *c, double now) {
    while (c->out.off < c->out.len) {
        ssize_t w = send(c->fd, c->out.p + c->out.off, c->out.len - c->out.off, MSG_NOSIGNAL);
        if (w > 0) {
            c->out.off += (size_t)w;
            c->active_at = now;
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

static void unpark(conn *c, double now) {
    free(c->wkey);
    c->wkey = NULL;
    c->wklen = 0;
    c->parked = false;
    c->active_at = now; /* the idle clock starts again from the answer */
}

/* A key got a value: answer every GET parked on it. */
static bool wake_waiters(rl_store_server *s, const uint8_t *key, uint32_t klen, double now) {
    bool any = false;
    for (size_t i = 0; i < s->nconns; i++) {
        conn *w = s->conns[i];
        if (!w->parked || w->dead || w->wklen != klen || memcmp(w->wkey, key, klen) != 0)
            continue;
        int r = rl_store_db_answer_get(s->db, w->wkey, w->wklen, false, &w->out);
        if (r < 0) w->dead = true;
        if (r != 0) {
            unpark(w, now);
            any = true;
        }
    }
    return any;
}

/* Unsent bytes above which no more requests are handled: before
 * authentication one answer at a time (a real client waits for each), so
 * a peer that never reads cannot make the server hold its answers. */
static size_t out_high(const rl_store_server *s, const conn *c) {
    return pre_auth(s, c) ? 1 : OUT_HIGH;
}

/* A request failed: log it (at a bounded rate: an attack can send many)
 * and close after the answer. */
static void conn_fail(rl_store_server *s, conn *c, const rl_store_step *st, const rl_err *e,
                      double now) {
    unsigned held;
    ratelog *r = st->auth_failed ? &s->lg_auth : &s->lg_proto;
    if (ratelog_due(r, now, &held)) {
        char esc[1100];
        rl_log(RL_LOG_WARN, st->auth_failed ? "store_auth_refused" : "store_protocol_error",
               "\"msg\":\"%s\",\"suppressed\":%u", rl_json_escape(esc, sizeof esc, e->msg), held);
    }
    c->closing = true;
    c->close_deadline = now + CLOSE_GRACE_S;
    rl_store_buf_free(&c->in); /* whatever follows is discarded */
}

/* Handle the complete requests buffered on c. Returns true when a parked
 * connection was released (its own buffered requests may now proceed). */
static bool conn_process(rl_store_server *s, conn *c, double now) {
    bool released = false;
    /* Append answers after what is unsent, not after what was sent. */
    if (c->out.off) rl_store_buf_compact(&c->out);
    while (!c->dead && !c->closing && !c->parked && c->out.len - c->out.off < out_high(s, c)) {
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
            conn_fail(s, c, &st, &e, now);
            break;
        }
        if (r == RL_STORE_STEP_WAIT) park(c, &st, now);
        if (r == RL_STORE_STEP_REPLY && st.wrote && wake_waiters(s, st.key, st.klen, now))
            released = true;
        c->in.off += st.used;
        c->need = RL_STORE_HEADER_BYTES;
        c->active_at = now;
        if (c->handshaking && (!s->secured || c->sess.authed)) c->handshaking = false;
    }
    if (c->in.off == c->in.len) rl_store_buf_compact(&c->in);
    return released;
}

/* ---- the loop --------------------------------------------------------------------- */
/* Has a buffered request that can be handled now. */
static bool runnable(const rl_store_server *s, const conn *c) {
    return !c->dead && !c->closing && !c->parked && c->out.len - c->out.off < out_high(s, c) &&
           c->in.len - c->in.off >= c->need;
}

/* The first time something is due on c without the network (a parked GET,
 * a close, the handshake or idle deadline); -1 when nothing is. */
static double conn_due(const rl_store_limits *lim, const conn *c) {
    double t = -1;
    if (c->closing) t = c->close_deadline;
    else if (c->handshaking) t = c->accepted_at + lim->handshake_s;
    else if (idle_clock_runs(c)) t = c->active_at + lim->idle_s;
    if (c->parked && (t < 0 || c->wdeadline < t)) t = c->wdeadline;
    return t;
}

/* Bytes are waiting in the kernel: the client is not idle, only not read
 * yet (a request racing the idle deadline must not be cut). */
static bool input_waiting(const conn *c) {
    char b;
    return recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

/* The handshake and idle deadlines. */
static void expire(rl_store_server *s, conn *c, double now) {
    if (c->dead || c->closing) return;
    if (c->handshaking && now >= c->accepted_at + s->lim.handshake_s) {
        log_held(&s->lg_handshake, RL_LOG_WARN, "store_handshake_timeout", c->peer,
                 s->secured ? "not authenticated in time" : "no request in time", now);
        c->dead = true;
    } else if (idle_clock_runs(c) && now >= c->active_at + s->lim.idle_s && !input_waiting(c)) {
        log_held(&s->lg_idle, RL_LOG_INFO, "store_idle_closed", c->peer, "idle", now);
        c->dead = true;
    }
}

/* Everything that does not wait for the network: expire parked GETs and
 * deadlines, handle buffered requests, send, retire connections. */
static void advance(rl_store_server *s, double now) {
    for (size_t i = 0; i < s->nconns; i++) {
        conn *c = s->conns[i];
        if (c->parked && !c->dead && c->wdeadline <= now) {
            if (rl_store_db_answer_get(s->db, c->wkey, c->wklen, true, &c->out) < 0)
                c->dead = true;
            unpark(c, now);
        }
        expire(s, c, now);
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
        if (!c->dead && c->out.off < c->out.len) conn_flush(c, now);
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
        if (c->eof && !c->closing && !c->parked && flushed && !runnable(s, c)) c->dead = true;
        if (c->dead) conn_free(c);
        else s->conns[j++] = c;
    }
    s->nconns = j;
}

static short conn_events(const rl_store_server *s, const conn *c) {
    short ev = 0;
    if (c->out.off < c->out.len) ev |= POLLOUT;
    if (c->closing) {
        if (c->shut) ev |= POLLIN;
    } else if (!c->eof) {
        ev |= POLLRDHUP;
        if (read_allowance(s, c) > 0) ev |= POLLIN;
    }
    return ev;
}

/* Fill pfds for this turn; returns the poll timeout in ms (-1: none). */
static int prepare_poll(rl_store_server *s, double now) {
    struct rlimit rl;
    bool limited = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY;
    s->budget = conn_budget(limited ? (unsigned long long)rl.rlim_cur : 0);
    double next = -1;
    s->pfds[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
    bool room = can_take_one(s, now);
    bool can_accept = room && now >= s->accept_pause_until;
    s->pfds[1] = (struct pollfd){.fd = can_accept ? s->lfd : -1, .events = POLLIN};
    if (room && !can_accept) next = s->accept_pause_until;
    for (size_t i = 0; i < s->nconns; i++) {
        conn *c = s->conns[i];
        double due = conn_due(&s->lim, c);
        /* full: wake when a handshake grows old enough to make room */
        if (!room && c->handshaking && !c->dead) {
            double ev = c->accepted_at + s->lim.evict_after_s;
            if (due < 0 || ev < due) due = ev;
        }
        if (due >= 0 && (next < 0 || due < next)) next = due;
        if (runnable(s, c)) next = now;
        s->pfds[2 + i] = (struct pollfd){.fd = c->fd, .events = conn_events(s, c)};
    }
    if (next < 0) return -1;
    double ms = (next - now) * 1000.0;
    /* Round up so that a deadline is never woken for just early. */
    return ms <= 0 ? 0 : ms > 60000 ? 60000 : (int)ms + 1;
}

static void handle_events(rl_store_server *s, double now) {
    for (size_t i = 0; i < s->nconns; i++) {
        conn *c = s->conns[i];
        short re = s->pfds[2 + i].revents;
        if (re & POLLNVAL) c->dead = true;
        if (c->dead || re == 0) continue;
        if (re & POLLOUT) conn_flush(c, now);
        if (re & (POLLIN | POLLHUP | POLLERR)) conn_read(s, c, now);
        if (re & (POLLRDHUP | POLLHUP | POLLERR)) {
            /* Closed by the peer, perhaps while we were not reading
             * (back-pressure, a parked GET): nobody is left to take a
             * parked answer. */
            c->eof = true;
            if (c->parked) c->dead = true;
        }
    }
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
        int timeout = prepare_poll(s, now);
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
        now = rl_now();
        handle_events(s, now);
        if (s->pfds[1].revents & POLLIN) accept_some(s, now);
    }
    return NULL;
}

/* ---- public ----------------------------------------------------------------------- */
int rl_store_server_start(const char *host, int port, rl_store_server **out, rl_err *e) {
    return rl_store_server_start_auth(host, port, NULL, 0, out, e);
}

int rl_store_server_start_auth(const char *host, int port, const void *secret, size_t slen,
                               rl_store_server **out, rl_err *e) {
    return rl_store_server_start_limits(host, port, secret, slen, NULL, out, e);
}

int rl_store_server_start_limits(const char *host, int port, const void *secret, size_t slen,
                                 const rl_store_limits *lim, rl_store_server **out, rl_err *e) {
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
    s->secured = slen > 0;
    if (lim) s->lim = *lim;
    else rl_store_limits_default(&s->lim);
    s->budget = MAX_CONNS;
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
