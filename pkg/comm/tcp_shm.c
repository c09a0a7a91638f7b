/* tcp backend: same-host links (tcp.c's opening comment, "Same-host
 * links"; tcp_ring.h): the shared-memory ring a transfer moves through,
 * and its setup right after the handshakes. */
#include "comm/tcp_ring.h"

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
        if (n == 0) return rl_tcp_sock_fail(c, T, e, right, 0, NULL);
        if (errno == EAGAIN || errno == EWOULDBLOCK) return RL_OK;
        if (errno != EINTR) return rl_tcp_sock_fail(c, T, e, right, errno, "the link with");
    }
}


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

int rl_tcp_shm_send(rl_comm *c, tcp *T, const xfer *x, size_t *sent, size_t got, bool *padded,
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

int rl_tcp_shm_recv(rl_comm *c, tcp *T, const xfer *x, size_t *got, bool *padded, bool settle,
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

/* ---- same-host links: setting them up ---------------------------------------------- */

void rl_tcp_shm_unmap(shm_link *L) {
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
        if (n == 0 && !sending) return rl_tcp_sock_fail(c, T, e, right, 0, NULL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return rl_tcp_sock_fail(c, T, e, right, errno, sending ? "sending to" : "receiving from");
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
int rl_tcp_shm_setup(rl_comm *c, tcp *T, const rl_comm_opts *o, double deadline, rl_err *e) {
    bool on = shm_allowed(o);
    char me[SHM_HOST_LEN] = "", name[SHM_NAME_LEN] = "";
    if (on) rl_host_identity(me, sizeof me);
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
    if (rc || rl_get_be32(their_ack + 4) != 1) rl_tcp_shm_unmap(&T->tx);
    T->op = "init";
    return rc;
}

int rl_comm_tcp_shm_links(const rl_comm *c) {
    if (!c || !c->impl || strcmp(c->backend, "tcp") != 0) return 0;
    const tcp *T = c->impl;
    return (T->tx.h ? 1 : 0) | (T->rx.h ? 2 : 0);
}

