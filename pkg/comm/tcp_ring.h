/* Internal to pkg/comm's tcp backend: the communicator's state and what
 * its three files share. tcp.c: the transfer loop, op headers, the
 * collectives and init; tcp_form.c: forming the ring (listening, address
 * records, the link handshakes); tcp_shm.c: same-host links (the
 * shared-memory ring and its setup). tcp.c's opening comment is the
 * design. */
#ifndef RL_COMM_TCP_RING_H
#define RL_COMM_TCP_RING_H

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

enum { OP_ALLREDUCE = 1, OP_BROADCAST, OP_ALLGATHER, OP_REDUCE_SCATTER, OP_BARRIER, OP_LINK_PROBE };

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

/* ---- one ring step ------------------------------------------------------------- */

typedef struct xfer {
    const char *send; /* slen bytes to the right */
    size_t slen;
    char *recv; /* rlen bytes from the left */
    size_t rlen;
    const char *own; /* reduce: recv[i] = own[i] + incoming[i] (own may be recv); NULL: copy */
    rl_dtype t;
    bool forward; /* send is recv: only bytes already received may go on (broadcast) */
    /* NULL, or [3]: when the first bytes and the last arrived (rl_now()),
     * and how many came with the first */
    double *rx_span;
} xfer;

/* ---- small helpers -------------------------------------------------------- */

static inline int ring_mod(long a, int n) {
    long m = a % n;
    return (int)(m < 0 ? m + n : m);
}

/* Segment k of count elements split N ways: sizes differ by at most one. */
static inline void segment(size_t count, int n, int k, size_t *off, size_t *len) {
    size_t base = count / (size_t)n, rem = count % (size_t)n, kk = (size_t)k;
    *off = kk * base + (kk < rem ? kk : rem);
    *len = base + (kk < rem ? 1 : 0);
}

static inline size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* poll() until something is ready or the monotonic deadline passes.
 * Returns >0 ready, 0 timed out, -1 error (errno set). EINTR is retried. */
static inline int poll_until(struct pollfd *p, nfds_t n, double deadline) {
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

/* A socket error of the data phase, naming the op, the step and the
 * neighbour; an abort takes precedence. */
int rl_tcp_sock_fail(rl_comm *c, tcp *T, rl_err *e, bool right, int err, const char *what);

/* Listen, publish our address record, read the neighbours' and form both
 * links (tcp_form.c). *port: where we listen. */
int rl_tcp_form_ring(rl_comm *c, tcp *T, const rl_comm_opts *o, double deadline, int *port,
                     rl_err *e);

/* Same-host links (tcp_shm.c): negotiate each link's data path right after
 * the handshakes, move one transfer's bytes through the rings, unmap. */
int rl_tcp_shm_setup(rl_comm *c, tcp *T, const rl_comm_opts *o, double deadline, rl_err *e);
int rl_tcp_shm_send(rl_comm *c, tcp *T, const xfer *x, size_t *sent, size_t got, bool *padded,
                    bool settle, bool *moved, bool *wait, rl_err *e);
int rl_tcp_shm_recv(rl_comm *c, tcp *T, const xfer *x, size_t *got, bool *padded, bool settle,
                    bool *moved, bool *wait, rl_err *e);
void rl_tcp_shm_unmap(shm_link *L);

#endif
