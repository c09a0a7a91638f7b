/* tcp backend: a ring over TCP between the ranks of one round, for CPU
 * buffers.
 *
 * Forming the ring. Each rank listens on an ephemeral port on opts.host,
 * publishes "<host>:<port> <world>" under <prefix>/addr/<rank>, reads the
 * records of its two neighbours (a neighbour started with another world
 * size is refused right there), then connects to its right neighbour
 * (rank+1) and accepts its left one (rank-1) in one poll loop, so no order
 * of arrival can deadlock. Each link starts with a handshake (hello.c,
 * tcp_internal.h) in which each side proves it knows the job's rendezvous
 * secret over nonces the other chose, and checks version, world, rank and
 * round; the connecting side reports any difference naming the peer. The
 * accepting side takes connections only from the left neighbour's
 * published address, and closes any that fails its handshake or does not
 * finish it in HANDSHAKE_S and goes on accepting: a stranger on the port
 * cannot fail the ring, only the real neighbour's absence can. Data flows one
 * way on each link: we send on `sfd` (to the right) and receive on `rfd`
 * (from the left), so with two ranks the pair holds two connections.
 *
 * Moving data. Every collective is a sequence of ring steps; in a step each
 * rank sends one block to its right while receiving one block from its
 * left. Both sockets are non-blocking and one loop progresses both
 * directions (send what the kernel takes, receive what has arrived, poll
 * only when neither can move), so large blocks stream and no pair of ranks
 * can deadlock on full socket buffers. Each send()/recv() moves at most
 * chunk_bytes; a reducing step receives into a chunk-sized staging buffer
 * and adds each full chunk into place while it is still in cache.
 *
 * Every op starts with a 32-byte header (op, dtype, count, root/op, a
 * sequence number) sent to the right and checked against the one from the
 * left, so ranks that call different collectives get an error naming the
 * neighbour instead of mixing up data or hanging.
 *
 * Allreduce is reduce-scatter then allgather over N segments (the sizes
 * differ by at most one element, so any count works). Determinism: element
 * i of segment k is reduced in the fixed order x[k], x[k+1], ..., x[k+N-1]
 * (ring order, whatever the timing or chunk size), by exactly one chain of
 * ranks, ending at its owner rank k-1; AVG divides there, once. The
 * allgather then copies that single reduced value byte for byte to every
 * other rank, so all ranks end with bit-identical buffers, run after run.
 *
 * Same-host links. Right after the hellos each link negotiates its data
 * path (shm_setup): the sending side offers a shared-memory ring (a
 * /dev/shm object, O_EXCL, 0600, posix_fallocate'd so a small /dev/shm
 * fails now rather than with SIGBUS later) with its host identity
 * (boot_id/hostname), the object's name, a random cookie and the size; the
 * receiver maps it only if the identities match, shm is allowed on its
 * side (opts.shm >= 0, RL_COMM_SHM not 0) and the object is exactly the one
 * offered (size, magic, cookie); both unlink the name at once, and any
 * failure leaves that link on TCP, silently. On a shm link the bytes go
 * through the ring (a byte stream with head/tail counters; every transfer
 * starts 64-byte aligned, so elements never straddle the ring's end), and
 * the receiver reduces or copies straight from the ring into place: one
 * copy on each side instead of two kernel copies plus staging. The TCP
 * socket stays as the doorbell and liveness channel: a side with nothing
 * to do spins ~50 us, then raises its sleeping flag and polls the socket
 * (and the abort eventfd) with the same timeout; the peer rings one byte
 * when it sees the flag. A dead peer shows as EOF on that socket, a silent
 * one as the timeout, exactly as on TCP. Op headers travel the same path,
 * so the collective checks are unchanged; the reduction order, hence the
 * bits, does not depend on the path.
 *
 * Failure. Every wait is a poll() bounded by timeout_s without progress,
 * that also watches an eventfd which rl_comm_abort() makes readable. An
 * error, EOF, timeout or abort fails the op naming the neighbour's rank
 * and address; comm.c then marks the communicator dead and calls
 * tcp_kill(), which shuts both sockets down so the neighbours see EOF at
 * once and fail too: a failure travels around the ring in milliseconds
 * instead of one timeout per rank. */
#include "comm/comm_internal.h"
#include "comm/tcp_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#define OPHDR_MAGIC 0x524c4f50u /* 'RLOP' */
#define OPHDR_BYTES 32
#define MAX_PENDING 8            /* accepted connections still in their handshake */
#define HANDSHAKE_S 5.0          /* what one of them gets to finish it */
#define ADDR_LEN 300

enum { OP_ALLREDUCE = 1, OP_BROADCAST, OP_ALLGATHER, OP_REDUCE_SCATTER, OP_BARRIER };

/* A one-way shared-memory byte ring (see "Same-host links" above). The
 * header sits in its own page; head and tail in their own cache lines. */
#define SHM_MAGIC 0x524c5348u /* 'RLSH' */
#define SHM_ACK_MAGIC 0x524c5341u /* 'RLSA' */
#define SHM_HDR_BYTES 4096
#define SHM_OFFER_BYTES 256
#define SHM_HOST_LEN 136
#define SHM_NAME_LEN 96
#define SHM_ALIGN 64 /* every transfer starts at a multiple of this in the ring */

typedef struct shm_hdr {
    uint64_t magic, cookie, cap;
    char pad0[40];
    _Atomic uint64_t head; /* bytes published by the sender */
    char pad1[56];
    _Atomic uint64_t tail; /* bytes consumed by the receiver */
    char pad2[56];
    _Atomic uint32_t rx_sleeping; /* the receiver is about to poll: ring on publish */
    char pad3[60];
    _Atomic uint32_t tx_sleeping; /* the sender is about to poll: ring on consume */
    char pad4[60];
} shm_hdr;

typedef struct shm_link {
    shm_hdr *h; /* NULL: this direction uses TCP */
    char *data;
    size_t cap, maplen;
    uint64_t pos; /* tx: our head; rx: our tail */
} shm_link;

typedef struct tcp {
    int sfd;  /* to the right neighbour: we send */
    int rfd;  /* from the left neighbour: we receive */
    int wake; /* eventfd, readable once aborted; every poll watches it */
    int left, right;
    char left_addr[ADDR_LEN], right_addr[ADDR_LEN]; /* "host:port" as published */
    size_t chunk;                                   /* bytes per send/recv call */
    size_t sockbuf;                                 /* 0: kernel autotuning */
    char *stage;                                    /* reduce staging, `chunk` bytes */
    char *scratch;                                  /* reduce_scatter ping-pong blocks */
    size_t scratch_cap;
    shm_link tx, rx; /* same-host shared-memory links (h == NULL: plain TCP) */
    uint64_t seq; /* ops issued, checked against the neighbour's */
    /* what the current op is doing, for error messages */
    const char *op, *phase;
    int step, nsteps;
} tcp;

/* ---- small helpers -------------------------------------------------------- */

static int ring_mod(long a, int n) {
    long m = a % n;
    return (int)(m < 0 ? m + n : m);
}

/* Segment k of count elements split N ways: sizes differ by at most one. */
static void segment(size_t count, int n, int k, size_t *off, size_t *len) {
    size_t base = count / (size_t)n, rem = count % (size_t)n, kk = (size_t)k;
    *off = kk * base + (kk < rem ? kk : rem);
    *len = base + (kk < rem ? 1 : 0);
}

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* poll() until something is ready or the monotonic deadline passes.
 * Returns >0 ready, 0 timed out, -1 error (errno set). EINTR is retried. */
static int poll_until(struct pollfd *p, nfds_t n, double deadline) {
    for (;;) {
        double left = deadline - rl_now();
        if (left <= 0) return 0;
        int ms = left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
        int r = poll(p, n, ms);
        if (r > 0) return r;
        if (r < 0 && errno != EINTR) return -1;
        /* r == 0: loop to recheck the deadline; EINTR: retry */
    }
}

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

/* ---- errors of the data phase ------------------------------------------------ */

static void where(const rl_comm *c, const tcp *T, char *out, size_t n) {
    if (T->nsteps > 0)
        snprintf(out, n, "rank %d: %s (%s step %d/%d)", c->rank, T->op, T->phase, T->step,
                 T->nsteps);
    else
        snprintf(out, n, "rank %d: %s", c->rank, T->op);
}

/* A socket error: an abort takes precedence (our own shutdown() makes the
 * sockets fail too, and the caller asked for RL_EABORT). */
static int sock_fail(rl_comm *c, tcp *T, rl_err *e, bool right, int err, const char *what) {
    char w[160];
    where(c, T, w, sizeof w);
    if (atomic_load(&c->aborted)) return rl_errf(e, RL_EABORT, "%s: aborted", w);
    int peer = right ? T->right : T->left;
    const char *addr = right ? T->right_addr : T->left_addr;
    if (err == 0)
        return rl_errf(e, RL_EPEER,
                       "%s: rank %d (%s) closed the connection (it exited, failed or aborted)",
                       w, peer, addr);
    return rl_errf(e, RL_EPEER, "%s: %s rank %d (%s) failed: %s", w, what, peer, addr,
                   strerror(err));
}

/* ---- one ring step ------------------------------------------------------------- */

typedef struct xfer {
    const char *send; /* slen bytes to the right */
    size_t slen;
    char *recv; /* rlen bytes from the left */
    size_t rlen;
    const char *own; /* reduce: recv[i] = own[i] + incoming[i] (own may be recv); NULL: copy */
    rl_dtype t;
    bool forward; /* send is recv: only bytes already received may go on (broadcast) */
} xfer;

/* ---- same-host links: the shared-memory ring ---------------------------------- */

/* Ring a link's doorbell: one byte on its socket says "look at the
 * counters". A full socket buffer means the peer has unread doorbells
 * already, so EAGAIN is fine. Errors are ignored here: a peer that is gone
 * is detected where it matters, when we wait for it (drain() sees EOF);
 * a peer that finished the op and closed needs no more doorbells. */
static void doorbell(tcp *T, bool right) {
    char b = 1;
    while (send(right ? T->sfd : T->rfd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
           errno == EINTR) {
    }
}

/* Read the pending doorbell bytes of a link; EOF or an error means the peer
 * is gone (exited, failed, or shut the link down). */
static int drain(rl_comm *c, tcp *T, bool right, rl_err *e) {
    char buf[512];
    for (;;) {
        ssize_t n = recv(right ? T->sfd : T->rfd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == (ssize_t)sizeof buf) continue;
        if (n > 0) return RL_OK;
        if (n == 0) return sock_fail(c, T, e, right, 0, NULL);
        if (errno == EAGAIN || errno == EWOULDBLOCK) return RL_OK;
        if (errno != EINTR) return sock_fail(c, T, e, right, errno, "the link with");
    }
}

/* Waking a peer. A side that found nothing to do spins a little (the
 * peer is usually about to move), then drains its doorbells, raises its
 * *_sleeping flag and looks once more before it polls the socket. The
 * other side rings only when it sees the flag after publishing. Both the
 * flag and the counters are seq_cst, so at least one side sees the other's
 * store (Dekker): either the sleeper finds the new counter, or the
 * publisher finds the flag and rings. */
#define SHM_SPIN_S 50e-6
/* Publish/consume in pieces of at most 256 KiB (or the chunk, if
 * smaller): the pieces in flight stay in cache between the sender's copy
 * and the receiver's reduction (measured with bench/comm_allreduce.c). */
#define SHM_PIECE(T) min_sz((T)->chunk, (size_t)256 << 10)

/* Copy what the ring has room for (at most one chunk) and publish it.
 * *padded: the transfer's start was aligned to SHM_ALIGN already. Sets
 * *moved, or *wait when the ring is full (wait for a doorbell on sfd).
 * settle: done spinning, prepare to sleep. */
static bool shm_put(tcp *T, const xfer *x, size_t *sent, size_t limit, bool *padded) {
    shm_link *L = &T->tx;
    uint64_t tail = atomic_load(&L->h->tail);
    size_t room = L->cap - (size_t)(L->pos - tail);
    size_t pad = *padded ? 0 : (size_t)(-L->pos & (SHM_ALIGN - 1));
    if (room <= pad) return false;
    L->pos += pad;
    room -= pad;
    *padded = true;
    size_t off = (size_t)(L->pos % L->cap);
    size_t n = min_sz(min_sz(limit, room), min_sz(L->cap - off, SHM_PIECE(T)));
    memcpy(L->data + off, x->send + *sent, n);
    L->pos += n;
    *sent += n;
    atomic_store(&L->h->head, L->pos);
    if (atomic_load(&L->h->rx_sleeping)) doorbell(T, true);
    return true;
}

static int shm_send(rl_comm *c, tcp *T, const xfer *x, size_t *sent, size_t got, bool *padded,
                    bool settle, bool *moved, bool *wait, rl_err *e) {
    shm_link *L = &T->tx;
    size_t limit = (x->forward ? got : x->slen) - *sent;
    if (limit == 0) return RL_OK; /* forwarding: nothing received yet to pass on */
    if (shm_put(T, x, sent, limit, padded)) {
        atomic_store_explicit(&L->h->tx_sleeping, 0, memory_order_relaxed);
        *moved = true;
        return RL_OK;
    }
    *wait = true;
    if (!settle) return RL_OK;
    /* A peer that is gone fails us only if the second look finds no room
     * either (it may have freed the room, then exited). */
    int gone = drain(c, T, true, e);
    atomic_store(&L->h->tx_sleeping, 1);
    if (shm_put(T, x, sent, limit, padded)) {
        atomic_store_explicit(&L->h->tx_sleeping, 0, memory_order_relaxed);
        *moved = true;
        *wait = false;
        return RL_OK;
    }
    return gone;
}

/* Consume what the ring holds (whole elements when reducing, at most one
 * chunk): reduce or copy it straight into place, then free the room. */
static bool shm_take(tcp *T, const xfer *x, size_t *got, bool *padded) {
    shm_link *L = &T->rx;
    size_t es = x->own ? rl_dtype_size(x->t) : 1;
    uint64_t head = atomic_load(&L->h->head);
    size_t avail = (size_t)(head - L->pos);
    size_t pad = *padded ? 0 : (size_t)(-L->pos & (SHM_ALIGN - 1));
    if (avail < pad + es) return false;
    L->pos += pad;
    avail -= pad;
    *padded = true;
    /* the transfer started aligned and cap is a multiple of SHM_ALIGN, so
     * no element straddles the end of the ring */
    size_t off = (size_t)(L->pos % L->cap);
    size_t n = min_sz(min_sz(avail, x->rlen - *got), min_sz(L->cap - off, SHM_PIECE(T)));
    n -= n % es;
    if (x->own)
        rl_comm_reduce_sum(x->recv + *got, x->own + *got, L->data + off, n / es, x->t);
    else
        memcpy(x->recv + *got, L->data + off, n);
    L->pos += n;
    *got += n;
    atomic_store(&L->h->tail, L->pos);
    if (atomic_load(&L->h->tx_sleeping)) doorbell(T, false);
    return true;
}

static int shm_recv(rl_comm *c, tcp *T, const xfer *x, size_t *got, bool *padded, bool settle,
                    bool *moved, bool *wait, rl_err *e) {
    shm_link *L = &T->rx;
    if (shm_take(T, x, got, padded)) {
        atomic_store_explicit(&L->h->rx_sleeping, 0, memory_order_relaxed);
        *moved = true;
        return RL_OK;
    }
    *wait = true;
    if (!settle) return RL_OK;
    /* as in shm_send: data published before the peer left is ours */
    int gone = drain(c, T, false, e);
    atomic_store(&L->h->rx_sleeping, 1);
    if (shm_take(T, x, got, padded)) {
        atomic_store_explicit(&L->h->rx_sleeping, 0, memory_order_relaxed);
        *moved = true;
        *wait = false;
        return RL_OK;
    }
    return gone;
}

/* ---- the transfer loop ---------------------------------------------------------- */

static int run_xfer(rl_comm *c, tcp *T, const xfer *x, rl_err *e) {
    size_t sent = 0, got = 0, staged = 0;
    size_t es = x->own ? rl_dtype_size(x->t) : 1;
    size_t unit = T->chunk / 8 * 8; /* a whole number of elements of any dtype */
    bool tx_padded = false, rx_padded = false;
    double deadline = rl_now() + c->timeout_s, idle_since = 0;
    while (sent < x->slen || got < x->rlen) {
        if (atomic_load_explicit(&c->aborted, memory_order_relaxed)) {
            char w[160];
            where(c, T, w, sizeof w);
            return rl_errf(e, RL_EABORT, "%s: aborted", w);
        }
        /* want_out: POLLOUT on sfd (TCP); tx_wait: POLLIN on sfd (a shm
         * doorbell); want_in: POLLIN on rfd (data, or a shm doorbell) */
        bool moved = false, want_out = false, want_in = false, tx_wait = false;
        bool settle = idle_since > 0 && rl_now() - idle_since >= SHM_SPIN_S;
        if (sent < x->slen && T->tx.h) {
            int rc = shm_send(c, T, x, &sent, got, &tx_padded, settle, &moved, &tx_wait, e);
            if (rc) return rc;
        } else if (sent < x->slen) {
            size_t avail = min_sz((x->forward ? got : x->slen) - sent, T->chunk);
            if (avail > 0) {
                ssize_t n = send(T->sfd, x->send + sent, avail, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n > 0) {
                    sent += (size_t)n;
                    moved = true;
                } else if (n == 0 || errno == EAGAIN || errno == EWOULDBLOCK) {
                    want_out = true; /* the socket buffer is full: poll for room */
                } else if (errno != EINTR) {
                    return sock_fail(c, T, e, true, errno, "sending to");
                }
            }
        }
        if (got < x->rlen && T->rx.h) {
            int rc = shm_recv(c, T, x, &got, &rx_padded, settle, &moved, &want_in, e);
            if (rc) return rc;
        } else if (got < x->rlen) {
            ssize_t n;
            size_t block = 0;
            if (x->own) {
                block = min_sz(unit, x->rlen - got); /* whole elements: rlen is */
                n = recv(T->rfd, T->stage + staged, block - staged, MSG_DONTWAIT);
            } else {
                n = recv(T->rfd, x->recv + got, min_sz(T->chunk, x->rlen - got), MSG_DONTWAIT);
            }
            if (n > 0) {
                moved = true;
                if (x->own) {
                    staged += (size_t)n;
                    if (staged == block) {
                        rl_comm_reduce_sum(x->recv + got, x->own + got, T->stage, block / es,
                                           x->t);
                        got += block;
                        staged = 0;
                    }
                } else {
                    got += (size_t)n;
                }
            } else if (n == 0) {
                return sock_fail(c, T, e, false, 0, NULL);
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                want_in = true;
            } else if (errno != EINTR) {
                return sock_fail(c, T, e, false, errno, "receiving from");
            }
        }
        if (moved) {
            deadline = rl_now() + c->timeout_s; /* the bound is on time without progress */
            idle_since = 0;
            continue;
        }
        if (!want_in && !want_out && !tx_wait) continue; /* interrupted: retry */
        if ((T->tx.h || T->rx.h) && !settle) {
            if (idle_since == 0) idle_since = rl_now();
            continue; /* spin a little before sleeping (see SHM_SPIN_S) */
        }
        struct pollfd p[3] = {{.fd = T->wake, .events = POLLIN}};
        nfds_t np = 1;
        if (want_in) p[np++] = (struct pollfd){.fd = T->rfd, .events = POLLIN};
        if (want_out || tx_wait)
            p[np++] = (struct pollfd){.fd = T->sfd,
                                      .events = (short)((want_out ? POLLOUT : 0) |
                                                        (tx_wait ? POLLIN : 0))};
        int r = poll_until(p, np, deadline);
        if (r < 0) {
            char w[160];
            where(c, T, w, sizeof w);
            return rl_errf(e, RL_EIO, "%s: poll: %s", w, strerror(errno));
        }
        if (p[0].revents || atomic_load(&c->aborted)) {
            char w[160];
            where(c, T, w, sizeof w);
            return rl_errf(e, RL_EABORT, "%s: aborted", w);
        }
        if (r == 0) {
            char w[160], a[400] = "", b[400] = "";
            where(c, T, w, sizeof w);
            if (want_in)
                snprintf(a, sizeof a, "; waiting for data from rank %d (%s), %zu of %zu bytes "
                         "received", T->left, T->left_addr, got + staged, x->rlen);
            if (want_out || tx_wait)
                snprintf(b, sizeof b, "; rank %d (%s) is not taking data, %zu of %zu bytes "
                         "sent", T->right, T->right_addr, sent, x->slen);
            return rl_errf(e, RL_ETIMEOUT, "%s: no progress for %.1f s%s%s", w, c->timeout_s,
                           a, b);
        }
        /* Readable/writable, or POLLERR/POLLHUP: the next send()/recv()
         * either moves bytes or reports the error. */
    }
    return RL_OK;
}

/* ---- per-op header ------------------------------------------------------------ */

static const char *op_name(int op) {
    switch (op) {
    case OP_ALLREDUCE: return "allreduce";
    case OP_BROADCAST: return "broadcast";
    case OP_ALLGATHER: return "allgather";
    case OP_REDUCE_SCATTER: return "reduce_scatter";
    case OP_BARRIER: return "barrier";
    }
    return "unknown op";
}

static void describe_op(char *out, size_t n, int op, int dtype, int arg, uint64_t count,
                        uint64_t seq) {
    static const char *dt[] = {"f32", "f64", "bf16", "i64"};
    const char *d = dtype >= 0 && dtype < 4 ? dt[dtype] : "?";
    if (op == OP_BROADCAST)
        snprintf(out, n, "%s(count %llu, %s, root %d) as op #%llu", op_name(op),
                 (unsigned long long)count, d, arg, (unsigned long long)seq);
    else if (op == OP_ALLREDUCE || op == OP_REDUCE_SCATTER)
        snprintf(out, n, "%s(count %llu, %s, %s) as op #%llu", op_name(op),
                 (unsigned long long)count, d, arg == RL_AVG ? "avg" : "sum",
                 (unsigned long long)seq);
    else
        snprintf(out, n, "%s(count %llu, %s) as op #%llu", op_name(op),
                 (unsigned long long)count, d, (unsigned long long)seq);
}

/* Send our op header to the right, check the left's against ours. By
 * induction around the ring every rank then runs the same collective. */
static int op_begin(rl_comm *c, tcp *T, int op, size_t count, rl_dtype t, int arg, rl_err *e) {
    T->op = op_name(op);
    T->phase = "header";
    T->step = T->nsteps = 0;
    T->seq++;
    uint8_t mine[OPHDR_BYTES] = {0}, theirs[OPHDR_BYTES];
    rl_put_be32(mine, OPHDR_MAGIC);
    rl_put_be16(mine + 4, (uint16_t)op);
    rl_put_be16(mine + 6, (uint16_t)t);
    rl_put_be32(mine + 8, (uint32_t)arg);
    rl_put_be64(mine + 12, (uint64_t)count);
    rl_put_be64(mine + 20, T->seq);
    xfer x = {.send = (const char *)mine, .slen = OPHDR_BYTES, .recv = (char *)theirs,
              .rlen = OPHDR_BYTES};
    int rc = run_xfer(c, T, &x, e);
    if (rc) return rc;
    if (rl_get_be32(theirs) != OPHDR_MAGIC)
        return rl_errf(e, RL_EPEER,
                       "rank %d: %s: the stream from rank %d (%s) is out of step (bad op "
                       "header magic 0x%08x)",
                       c->rank, T->op, T->left, T->left_addr, rl_get_be32(theirs));
    if (memcmp(mine + 4, theirs + 4, OPHDR_BYTES - 4) != 0) {
        char a[160], b[160];
        describe_op(a, sizeof a, op, (int)t, arg, count, T->seq);
        describe_op(b, sizeof b, rl_get_be16(theirs + 4), rl_get_be16(theirs + 6),
                    (int)rl_get_be32(theirs + 8), rl_get_be64(theirs + 12), rl_get_be64(theirs + 20));
        return rl_errf(e, RL_EINTERNAL,
                       "rank %d: collective mismatch: this rank called %s, rank %d (%s) "
                       "called %s (every rank must issue the same collectives in the same "
                       "order)",
                       c->rank, a, T->left, T->left_addr, b);
    }
    return RL_OK;
}

/* ---- collectives --------------------------------------------------------------- */

static int ring_allreduce(rl_comm *c, tcp *T, char *b, size_t count, rl_dtype t, rl_redop op,
                          rl_err *e) {
    int n = c->world, r = c->rank, rc;
    size_t es = rl_dtype_size(t), so, sl, ro, rl;
    T->nsteps = n - 1;
    T->phase = "reduce-scatter";
    for (int s = 0; s < n - 1; s++) {
        T->step = s + 1;
        segment(count, n, ring_mod((long)r - s, n), &so, &sl);
        segment(count, n, ring_mod((long)r - s - 1, n), &ro, &rl);
        xfer x = {.send = b + so * es, .slen = sl * es, .recv = b + ro * es, .rlen = rl * es,
                  .own = b + ro * es, .t = t};
        if ((rc = run_xfer(c, T, &x, e))) return rc;
    }
    /* This rank now holds the full sum of segment r+1: average it here,
     * once, so every rank receives the same divided value. */
    if (op == RL_AVG) {
        segment(count, n, ring_mod((long)r + 1, n), &so, &sl);
        rl_comm_divide(b + so * es, sl, t, n);
    }
    T->phase = "allgather";
    for (int s = 0; s < n - 1; s++) {
        T->step = s + 1;
        segment(count, n, ring_mod((long)r + 1 - s, n), &so, &sl);
        segment(count, n, ring_mod((long)r - s, n), &ro, &rl);
        xfer x = {.send = b + so * es, .slen = sl * es, .recv = b + ro * es, .rlen = rl * es};
        if ((rc = run_xfer(c, T, &x, e))) return rc;
    }
    return RL_OK;
}

static int tcp_allreduce(rl_comm *c, void *buf, size_t count, rl_dtype t, rl_redop op,
                         rl_err *e) {
    if (c->world == 1) return RL_OK; /* the sum of one; x / 1 == x */
    tcp *T = c->impl;
    int rc = op_begin(c, T, OP_ALLREDUCE, count, t, (int)op, e);
    /* count 0 still exchanges the header (keeps ranks in step, catches a
     * mismatch); buf may then be NULL, so no pointer arithmetic on it */
    if (rc || count == 0) return rc;
    return ring_allreduce(c, T, buf, count, t, op, e);
}

static int tcp_barrier(rl_comm *c, rl_err *e) {
    if (c->world == 1) return RL_OK;
    tcp *T = c->impl;
    int rc = op_begin(c, T, OP_BARRIER, 1, RL_I64, 0, e);
    if (rc) return rc;
    /* One element around the ring twice: the value every rank ends with
     * depends on every rank's entry, so no rank leaves before all came. */
    int64_t token = 1;
    return ring_allreduce(c, T, (char *)&token, 1, RL_I64, RL_SUM, e);
}

static int tcp_broadcast(rl_comm *c, void *buf, size_t count, rl_dtype t, int root, rl_err *e) {
    if (c->world == 1) return RL_OK;
    tcp *T = c->impl;
    int rc = op_begin(c, T, OP_BROADCAST, count, t, root, e);
    if (rc) return rc;
    /* A pipeline root -> root+1 -> ... -> root-1: each rank forwards every
     * chunk as soon as it has it, so the time is ~ one buffer, not N. */
    size_t bytes = count * rl_dtype_size(t);
    T->phase = "pipeline";
    T->step = T->nsteps = 1;
    xfer x = {0};
    if (c->rank == root) {
        x.send = buf;
        x.slen = bytes;
    } else {
        x.recv = buf;
        x.rlen = bytes;
        if (T->right != root) {
            x.send = buf;
            x.slen = bytes;
            x.forward = true;
        }
    }
    return run_xfer(c, T, &x, e);
}

static int tcp_allgather(rl_comm *c, const void *send, void *recv, size_t count, rl_dtype t,
                         rl_err *e) {
    size_t blk = count * rl_dtype_size(t);
    char *out = recv;
    int n = c->world, r = c->rank, rc;
    if (blk && out + (size_t)r * blk != (const char *)send)
        memmove(out + (size_t)r * blk, send, blk);
    if (n == 1) return RL_OK;
    tcp *T = c->impl;
    if ((rc = op_begin(c, T, OP_ALLGATHER, count, t, 0, e)) || blk == 0) return rc;
    T->phase = "ring";
    T->nsteps = n - 1;
    for (int s = 0; s < n - 1; s++) {
        T->step = s + 1;
        size_t so = (size_t)ring_mod((long)r - s, n) * blk;
        size_t ro = (size_t)ring_mod((long)r - s - 1, n) * blk;
        xfer x = {.send = out + so, .slen = blk, .recv = out + ro, .rlen = blk};
        if ((rc = run_xfer(c, T, &x, e))) return rc;
    }
    return RL_OK;
}

static int tcp_reduce_scatter(rl_comm *c, const void *send, void *recv, size_t count,
                              rl_dtype t, rl_redop op, rl_err *e) {
    size_t blk = count * rl_dtype_size(t);
    int n = c->world, r = c->rank, rc;
    if (n == 1) {
        if (blk && recv != send) memmove(recv, send, blk);
        return RL_OK;
    }
    tcp *T = c->impl;
    if ((rc = op_begin(c, T, OP_REDUCE_SCATTER, count, t, (int)op, e)) || blk == 0) return rc;
    /* `send` is const, so partial sums go to scratch blocks: step s sends
     * block r-s-1 (our own at s = 0, else the partial sum made at step
     * s-1) and receives block r-s-2, adding our own contribution. Two
     * scratch blocks alternate; the last step writes into recv. recv may be
     * our own block of send (in place): only the last step writes there,
     * and it adds element by element into the same place. */
    size_t nscratch = n >= 4 ? 2 : (size_t)(n - 2);
    if (nscratch && blk) {
        if (blk > SIZE_MAX / nscratch)
            return rl_errf(e, RL_ENOMEM, "rank %d: reduce_scatter: block too large", c->rank);
        if (T->scratch_cap < nscratch * blk) {
            char *p = realloc(T->scratch, nscratch * blk);
            if (!p)
                return rl_errf(e, RL_ENOMEM, "rank %d: reduce_scatter: out of memory for %zu "
                               "bytes of scratch", c->rank, nscratch * blk);
            T->scratch = p;
            T->scratch_cap = nscratch * blk;
        }
    }
    const char *in = send;
    const char *prev = in + (size_t)ring_mod((long)r - 1, n) * blk;
    T->phase = "ring";
    T->nsteps = n - 1;
    for (int s = 0; s < n - 1; s++) {
        T->step = s + 1;
        char *dst = s == n - 2 ? (char *)recv : T->scratch + (size_t)(s % 2) * blk;
        const char *own = in + (size_t)ring_mod((long)r - s - 2, n) * blk;
        xfer x = {.send = prev, .slen = blk, .recv = dst, .rlen = blk, .own = own, .t = t};
        if ((rc = run_xfer(c, T, &x, e))) return rc;
        prev = dst;
    }
    if (op == RL_AVG) rl_comm_divide(recv, count, t, n);
    return RL_OK;
}

static int tcp_wait(rl_comm *c, rl_err *e) {
    (void)c;
    (void)e;
    return RL_OK; /* every tcp op is complete when it returns */
}

static void tcp_kill(rl_comm *c) {
    tcp *T = c->impl;
    /* Not close(): rl_comm_abort may use the descriptors from another
     * thread until destroy. shutdown() sends FIN now, so the neighbours'
     * blocked receives see EOF and fail at once. */
    if (T->sfd >= 0) shutdown(T->sfd, SHUT_RDWR);
    if (T->rfd >= 0) shutdown(T->rfd, SHUT_RDWR);
}

static void tcp_abort(rl_comm *c) {
    tcp *T = c->impl;
    uint64_t one = 1;
    /* write() and shutdown() are async-signal-safe: abort may come from a
     * signal-handling thread. The eventfd stays readable from now on, so
     * every later poll returns at once too. */
    if (write(T->wake, &one, sizeof one) < 0) { /* already readable: fine */
    }
    tcp_kill(c);
}

static void shm_unmap(shm_link *L);

static void tcp_free(tcp *T) {
    if (!T) return;
    if (T->sfd >= 0) close(T->sfd);
    if (T->rfd >= 0) close(T->rfd);
    if (T->wake >= 0) close(T->wake);
    shm_unmap(&T->tx);
    shm_unmap(&T->rx);
    free(T->stage);
    free(T->scratch);
    free(T);
}

static void tcp_destroy(rl_comm *c) { tcp_free(c->impl); }

static const rl_comm_ops tcp_ops = {
    .allreduce = tcp_allreduce,
    .broadcast = tcp_broadcast,
    .allgather = tcp_allgather,
    .reduce_scatter = tcp_reduce_scatter,
    .barrier = tcp_barrier,
    .wait = tcp_wait,
    .kill = tcp_kill,
    .abort = tcp_abort,
    .destroy = tcp_destroy,
};

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
        if (err)
            return rl_errf(e, RL_EPEER, "cannot connect to %s: %s%s", L->peer, strerror(err),
                           err == ECONNREFUSED ? " (is that rank still running?)" : ""),
                   -1;
        L->connecting = false;
    }
    if (L->sent < L->outlen) {
        ssize_t n = send(L->fd, L->out + L->sent, L->outlen - L->sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && !again(errno))
            return rl_errf(e, RL_EPEER, "sending the handshake to %s: %s", L->peer,
                           strerror(errno)),
                   -1;
        if (n > 0) L->sent += (size_t)n;
        return L->sent == L->outlen && L->up_after_send ? 1 : 0;
    }
    ssize_t n = recv(L->fd, L->in + L->got, sizeof L->in - L->got, MSG_DONTWAIT);
    if (n < 0)
        return again(errno) ? 0
                            : (rl_errf(e, RL_EPEER, "reading the handshake of %s: %s", L->peer,
                                       strerror(errno)),
                               -1);
    if (n == 0)
        return rl_errf(e, RL_EPEER, "%s closed the connection %s", L->peer,
                       L->hs.accepting ? "during the handshake"
                                       : "before the handshake ended (it refused us, or failed)"),
               -1;
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

/* ---- same-host links: setting them up ---------------------------------------------- */

static void shm_unmap(shm_link *L) {
    if (L->h) munmap(L->h, L->maplen);
    memset(L, 0, sizeof *L);
}

/* RL_COMM_SHM=0 (or off/no/false) in the environment, or opts.shm < 0. */
static bool shm_allowed(const rl_comm_opts *o) {
    if (o->shm < 0) return false;
    const char *v = getenv("RL_COMM_SHM");
    return !(v && (!strcmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "no") ||
                   !strcasecmp(v, "false")));
}

/* "<boot_id>/<hostname>": equal on two ranks only when they run on one
 * booted kernel under one host name. Empty when either is unknown. */
static void host_identity(char *out, size_t n) {
    char boot[80] = "", hn[72] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    if (gethostname(hn, sizeof hn - 1) != 0) hn[0] = '\0';
    hn[sizeof hn - 1] = '\0';
    out[0] = '\0';
    if (boot[0] && hn[0]) snprintf(out, n, "%.63s/%.71s", boot, hn);
}

static bool shm_name_ok(const char *name) {
    if (strncmp(name, "/rl-comm-", 9) != 0 || strlen(name) < 10) return false;
    for (const char *p = name + 1; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || *p == '-')) return false;
    return true;
}

int rl_comm_tcp_shm_sweep(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int removed = 0;
    for (struct dirent *de; (de = readdir(d));) {
        char name[SHM_NAME_LEN];
        if ((size_t)snprintf(name, sizeof name, "/%s", de->d_name) >= sizeof name || !shm_name_ok(name)) continue;
        char *end = NULL;
        long pid = strtol(name + 9, &end, 10);
        /* a live pid keeps its names, even if it is another process now:
         * the next sweep after it ends takes them */
        if (pid <= 0 || *end != '-' || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        if (shm_unlink(name) == 0) removed++;
    }
    closedir(d);
    return removed;
}

/* Create and map the ring we send into. Best effort: -1 means "use TCP".
 * posix_fallocate reserves the pages now, so a small /dev/shm fails here
 * instead of with SIGBUS in the middle of a collective. */
static int shm_create(tcp *T, int rank, char *name, size_t namen, uint64_t *cookie) {
    size_t cap = T->chunk > (64u << 20) ? (256u << 20) : 4 * T->chunk;
    cap = (cap + 4095) / 4096 * 4096;
    if (cap < (64u << 10)) cap = 64u << 10;
    *cookie = rl_hash64(((uint64_t)getpid() << 32) ^ (uint64_t)(rl_now() * 1e9) ^
                        (uint64_t)(uintptr_t)T ^ (uint64_t)rank) | 1;
    snprintf(name, namen, "/rl-comm-%d-%d-%016llx", (int)getpid(), rank,
             (unsigned long long)*cookie);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    size_t len = SHM_HDR_BYTES + cap;
    void *m = MAP_FAILED;
    if (posix_fallocate(fd, 0, (off_t)len) == 0)
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        shm_unlink(name);
        return -1;
    }
    shm_hdr *h = m;
    h->magic = SHM_MAGIC;
    h->cookie = *cookie;
    h->cap = cap;
    atomic_store(&h->head, 0);
    atomic_store(&h->tail, 0);
    T->tx = (shm_link){.h = h, .data = (char *)m + SHM_HDR_BYTES, .cap = cap, .maplen = len};
    return 0;
}

/* Map the ring our left neighbour offered; false (use TCP) unless it is
 * exactly the object it made (size, magic, cookie). */
static bool shm_attach(tcp *T, const char *name, uint64_t cookie, uint64_t cap) {
    if (cap < 4096 || cap % 4096 || cap > (1ull << 30)) return false;
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return false;
    size_t len = SHM_HDR_BYTES + (size_t)cap;
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == len)
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return false;
    shm_hdr *h = m;
    if (h->magic != SHM_MAGIC || h->cookie != cookie || h->cap != cap) {
        munmap(m, len);
        return false;
    }
    T->rx = (shm_link){.h = h, .data = (char *)m + SHM_HDR_BYTES, .cap = (size_t)cap,
                       .maplen = len};
    return true;
}

/* Move a small frame over one link, bounded by the deadline and abort. */
static int link_io(rl_comm *c, tcp *T, bool right, bool sending, uint8_t *buf, size_t len,
                   double deadline, rl_err *e) {
    int fd = right ? T->sfd : T->rfd;
    size_t done = 0;
    while (done < len) {
        if (atomic_load(&c->aborted)) return rl_errf(e, RL_EABORT, "rank %d: init: aborted", c->rank);
        ssize_t n = sending ? send(fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : recv(fd, buf + done, len - done, MSG_DONTWAIT);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n == 0 && !sending) return sock_fail(c, T, e, right, 0, NULL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return sock_fail(c, T, e, right, errno, sending ? "sending to" : "receiving from");
        struct pollfd p[2] = {{.fd = T->wake, .events = POLLIN},
                              {.fd = fd, .events = sending ? POLLOUT : POLLIN}};
        int r = poll_until(p, 2, deadline);
        if (r < 0)
            return rl_errf(e, RL_EIO, "rank %d: init: poll: %s", c->rank, strerror(errno));
        if (p[0].revents) return rl_errf(e, RL_EABORT, "rank %d: init: aborted", c->rank);
        if (r == 0)
            return rl_errf(e, RL_ETIMEOUT, "rank %d: init: setting up the link with rank %d "
                           "(%s) timed out after %.1f s", c->rank, right ? T->right : T->left,
                           right ? T->right_addr : T->left_addr, c->timeout_s);
    }
    return RL_OK;
}

/* Right after the hellos, each link negotiates its data path. The sender
 * offers a shared-memory ring (its host identity, the ring's name, cookie
 * and size; or "no offer"); the receiver maps it only when its own host
 * identity matches and shm is allowed here, and answers whether it did.
 * Both then unlink the name, so nothing outlives the processes. Any
 * failure to set a ring up is silent: that link stays on TCP. */
static int shm_setup(rl_comm *c, tcp *T, const rl_comm_opts *o, double deadline, rl_err *e) {
    bool on = shm_allowed(o);
    char me[SHM_HOST_LEN] = "", name[SHM_NAME_LEN] = "";
    if (on) host_identity(me, sizeof me);
    if (!me[0]) on = false;
    if (on) (void)rl_comm_tcp_shm_sweep();
    uint64_t cookie = 0;
    bool offered = on && shm_create(T, c->rank, name, sizeof name, &cookie) == 0;
    uint8_t offer[SHM_OFFER_BYTES] = {0}, theirs[SHM_OFFER_BYTES], ack[8], their_ack[8];
    rl_put_be32(offer, SHM_MAGIC);
    rl_put_be32(offer + 4, offered ? 1 : 0);
    rl_put_be64(offer + 8, cookie);
    rl_put_be64(offer + 16, offered ? (uint64_t)T->tx.cap : 0);
    memcpy(offer + 24, me, strlen(me));
    if (offered) memcpy(offer + 24 + SHM_HOST_LEN, name, strlen(name));
    T->op = "init (link setup)";
    int rc = link_io(c, T, true, true, offer, sizeof offer, deadline, e);
    if (!rc) rc = link_io(c, T, false, false, theirs, sizeof theirs, deadline, e);
    if (!rc && rl_get_be32(theirs) != SHM_MAGIC)
        rc = rl_errf(e, RL_EPEER, "rank %d: init: rank %d (%s) sent no link setup frame (bad "
                     "magic 0x%08x)", c->rank, T->left, T->left_addr, rl_get_be32(theirs));
    if (!rc) {
        char *th = (char *)theirs + 24, *tn = (char *)theirs + 24 + SHM_HOST_LEN;
        th[SHM_HOST_LEN - 1] = '\0';
        tn[SHM_NAME_LEN - 1] = '\0';
        bool ok = false;
        if (on && rl_get_be32(theirs + 4) == 1 && strcmp(th, me) == 0 && shm_name_ok(tn)) {
            ok = shm_attach(T, tn, rl_get_be64(theirs + 8), rl_get_be64(theirs + 16));
            shm_unlink(tn);
        }
        rl_put_be32(ack, SHM_ACK_MAGIC);
        rl_put_be32(ack + 4, ok ? 1 : 0);
        rc = link_io(c, T, false, true, ack, sizeof ack, deadline, e);
    }
    if (!rc) rc = link_io(c, T, true, false, their_ack, sizeof their_ack, deadline, e);
    if (!rc && rl_get_be32(their_ack) != SHM_ACK_MAGIC)
        rc = rl_errf(e, RL_EPEER, "rank %d: init: rank %d (%s) sent a bad link setup answer "
                     "(magic 0x%08x)", c->rank, T->right, T->right_addr, rl_get_be32(their_ack));
    if (offered) shm_unlink(name);
    if (rc || rl_get_be32(their_ack + 4) != 1) shm_unmap(&T->tx);
    T->op = "init";
    return rc;
}

int rl_comm_tcp_shm_links(const rl_comm *c) {
    if (!c || !c->impl || strcmp(c->backend, "tcp") != 0) return 0;
    const tcp *T = c->impl;
    return (T->tx.h ? 1 : 0) | (T->rx.h ? 2 : 0);
}

int rl_comm_tcp_init(const rl_comm_opts *o, rl_comm *c, rl_err *e) {
    tcp *T = calloc(1, sizeof *T);
    if (!T) return rl_errf(e, RL_ENOMEM, "rank %d: comm init: out of memory", c->rank);
    T->sfd = T->rfd = T->wake = -1;
    c->impl = T;
    c->ops = &tcp_ops;
    T->chunk = o->chunk_bytes ? o->chunk_bytes : RL_COMM_DEFAULT_CHUNK;
    if (T->chunk < 64) T->chunk = 64; /* at least a few elements per reduction */
    T->sockbuf = o->sockbuf_bytes;
    T->left = ring_mod((long)c->rank - 1, c->world);
    T->right = ring_mod((long)c->rank + 1, c->world);
    T->op = "init";
    int rc = RL_OK, lfd = -1;
    T->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    T->stage = malloc(T->chunk);
    if (T->wake < 0 || !T->stage) {
        rc = rl_errf(e, T->stage ? RL_EIO : RL_ENOMEM, "rank %d: comm init: %s", c->rank,
                     T->stage ? strerror(errno) : "out of memory");
        goto fail;
    }
    if (c->world == 1) return RL_OK; /* no peers: every op is local */

    double deadline = rl_now() + c->timeout_s;
    const char *host = o->host && *o->host ? o->host : "127.0.0.1";
    int port = 0;
    struct sockaddr_storage src;
    if ((rc = listen_on(host, T->sockbuf, &lfd, &port, &src, e))) {
        rl_err_wrap(e, "rank %d: comm init", c->rank);
        goto fail;
    }
    char rec[ADDR_LEN + 32], key[1100];
    snprintf(rec, sizeof rec, strchr(host, ':') ? "[%.255s]:%d %d" : "%.255s:%d %d", host, port,
             c->world);
    snprintf(key, sizeof key, "%s/addr/%d", o->prefix, c->rank);
    if ((rc = rl_store_set(o->store, key, rec, strlen(rec), e))) {
        rl_err_wrap(e, "rank %d: publishing the ring address (key %s)", c->rank, key);
        goto fail;
    }
    char rhost[ADDR_LEN], lhost[ADDR_LEN];
    int lport = 0;
    ring_setup rs = {.lfd = lfd, .rhost = rhost, .deadline = deadline,
                     .src = src.ss_family != AF_UNSPEC ? &src : NULL};
    /* Left first: its record tells whether it agrees on the world size, and
     * with a smaller world than ours our right neighbour may never exist. */
    if ((rc = get_neighbour(c, o, T->left, deadline, T->left_addr, sizeof T->left_addr, lhost,
                            sizeof lhost, &lport, e)))
        goto fail;
    if ((rc = get_neighbour(c, o, T->right, deadline, T->right_addr, sizeof T->right_addr,
                            rhost, sizeof rhost, &rs.rport, e)))
        goto fail;
    /* our end of each link: the same secret and round, the other rank */
    rs.right = (rl_comm_link){.secret = o->secret, .slen = o->secret ? o->secret_len : 0,
                              .prefix = o->prefix, .world = (uint32_t)c->world,
                              .rank = (uint32_t)c->rank, .peer = (uint32_t)T->right};
    rs.left = rs.right;
    rs.left.peer = (uint32_t)T->left;
    if ((rc = resolve_left(c, T, lhost, &rs, e)) || (rc = form_ring(c, T, &rs, e))) goto fail;
    close(lfd);
    lfd = -1;
    tune_socket(T->sfd, T->sockbuf);
    tune_socket(T->rfd, T->sockbuf);
    if ((rc = shm_setup(c, T, o, deadline, e))) goto fail;
    rl_log(RL_LOG_DEBUG, "comm_ring_formed",
           "\"backend\":\"tcp\",\"world\":%d,\"listen_port\":%d,\"chunk_bytes\":%zu,"
           "\"shm_send\":%d,\"shm_recv\":%d", c->world, port, T->chunk, T->tx.h != NULL,
           T->rx.h != NULL);
    return RL_OK;
fail:
    if (lfd >= 0) close(lfd);
    tcp_free(T);
    c->impl = NULL;
    return rc;
}
