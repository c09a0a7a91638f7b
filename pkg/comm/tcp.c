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
#include "comm/tcp_ring.h"

#include <math.h>

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
int rl_tcp_sock_fail(rl_comm *c, tcp *T, rl_err *e, bool right, int err, const char *what) {
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
            int rc = rl_tcp_shm_send(c, T, x, &sent, got, &tx_padded, settle, &moved, &tx_wait, e);
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
                    return rl_tcp_sock_fail(c, T, e, true, errno, "sending to");
                }
            }
        }
        if (got < x->rlen && T->rx.h) {
            int rc = rl_tcp_shm_recv(c, T, x, &got, &rx_padded, settle, &moved, &want_in, e);
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
                return rl_tcp_sock_fail(c, T, e, false, 0, NULL);
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                want_in = true;
            } else if (errno != EINTR) {
                return rl_tcp_sock_fail(c, T, e, false, errno, "receiving from");
            }
        }
        if (moved && x->rx_span && got > 0) {
            double now = rl_now();
            if (x->rx_span[0] == 0) x->rx_span[0] = now, x->rx_span[2] = (double)got;
            if (got == x->rlen && x->rx_span[1] == 0) x->rx_span[1] = now;
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
    case OP_LINK_PROBE: return "link_probe";
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

/* bytes to the right while as many come from the left, all ranks at once:
 * each link carries one stream, so the time from the first byte in to the
 * last is the left link's own (rl_comm_link_probe). */
static int tcp_link_probe(rl_comm *c, size_t bytes, double *in_gbps, rl_err *e) {
    tcp *T = c->impl;
    int rc = op_begin(c, T, OP_LINK_PROBE, bytes, RL_F32, 0, e);
    if (rc) return rc;
    char *out = malloc(bytes), *in = malloc(bytes);
    if (!out || !in) {
        free(out), free(in);
        return rl_errf(e, RL_ENOMEM, "rank %d: link_probe: %zu bytes", c->rank, bytes);
    }
    memset(out, 0x5a, bytes); /* real pages: no zero-page shortcut anywhere */
    double span[3] = {0, 0, 0};
    T->phase = "probe";
    xfer x = {.send = out, .slen = bytes, .recv = in, .rlen = bytes, .rx_span = span};
    rc = run_xfer(c, T, &x, e);
    free(out), free(in);
    /* the first read may already hold a whole socket buffer: the rate is
     * the rest's over the span (at least a microsecond) */
    if (!rc) *in_gbps = ((double)bytes - span[2]) / fmax(span[1] - span[0], 1e-6) / 1e9;
    return rc;
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

static void tcp_free(tcp *T) {
    if (!T) return;
    if (T->sfd >= 0) close(T->sfd);
    if (T->rfd >= 0) close(T->rfd);
    if (T->wake >= 0) close(T->wake);
    rl_tcp_shm_unmap(&T->tx);
    rl_tcp_shm_unmap(&T->rx);
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
    .link_probe = tcp_link_probe,
    .wait = tcp_wait,
    .kill = tcp_kill,
    .abort = tcp_abort,
    .destroy = tcp_destroy,
};

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
    int rc = RL_OK;
    T->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    T->stage = malloc(T->chunk);
    if (T->wake < 0 || !T->stage) {
        rc = rl_errf(e, T->stage ? RL_EIO : RL_ENOMEM, "rank %d: comm init: %s", c->rank,
                     T->stage ? strerror(errno) : "out of memory");
        goto fail;
    }
    if (c->world == 1) return RL_OK; /* no peers: every op is local */

    double deadline = rl_now() + c->timeout_s;
    int port = 0;
    if ((rc = rl_tcp_form_ring(c, T, o, deadline, &port, e))) goto fail;
    if ((rc = rl_tcp_shm_setup(c, T, o, deadline, e))) goto fail;
    rl_log(RL_LOG_DEBUG, "comm_ring_formed",
           "\"backend\":\"tcp\",\"world\":%d,\"listen_port\":%d,\"chunk_bytes\":%zu,"
           "\"shm_send\":%d,\"shm_recv\":%d", c->world, port, T->chunk, T->tx.h != NULL,
           T->rx.h != NULL);
    return RL_OK;
fail:
    tcp_free(T);
    c->impl = NULL;
    return rc;
}
