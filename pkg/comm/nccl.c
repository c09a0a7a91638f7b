/* nccl backend: device buffers, NCCL collectives on a CUDA stream.
 *
 * Built only with CUDA (RL_CUDA); without it comm.c reports that this build
 * has no NCCL. NOTE: this file is compiled and linked in CUDA builds, but it
 * has not been run on a GPU by its author (the machine it was written on
 * has the CUDA toolkit and NCCL headers/libraries, no GPU). See the list of
 * unverified points at the end of this comment.
 *
 * Setup: rank 0 makes the ncclUniqueId and publishes it with its NCCL
 * version under <prefix>/nccl_id; the others read it (bounded by
 * timeout_s) and refuse a different NCCL version by name. The communicator
 * is non-blocking (config.blocking = 0): ncclCommInitRankConfig and every
 * collective return at once (possibly ncclInProgress) and we poll
 * ncclCommGetAsyncError with a deadline, so a missing or dead peer turns
 * into RL_ETIMEOUT + ncclCommAbort instead of a process stuck in NCCL.
 *
 * Ops are stream-ordered: they return once enqueued; rl_comm_wait polls
 * cudaStreamQuery and ncclCommGetAsyncError until the stream drains, an
 * asynchronous error appears, the deadline passes, or rl_comm_abort was
 * called -- in the last three cases the communicator is aborted.
 *
 * Threads: ops and wait run on one thread; rl_comm_abort may run on any
 * other. ncclCommAbort frees the communicator, so every NCCL call on it is
 * made under `mu`, and abort takes `mu`, aborts and clears `comm`; the op
 * thread then sees comm == NULL and fails with RL_EABORT. Because the
 * communicator is non-blocking no NCCL call holds `mu` for long.
 *
 * Unverified without a GPU (to check on the first GPU machine):
 *  - init against real peers, the ncclInProgress polling of init and of
 *    each enqueue (NCCL >= 2.14 semantics), and the init timeout path;
 *  - that ncclCommAbort issued from another thread (under `mu`) unblocks
 *    kernels already queued on the stream so cudaStreamQuery completes;
 *  - cudaPointerGetAttributes' classification of the caller's buffers (host
 *    buffers are staged through a device bounce buffer);
 *  - ncclAvg for bf16 (needs NCCL >= 2.10 and sm_80 for native bf16). */
#ifdef RL_CUDA

#include "comm/comm_internal.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* When ops ran on the GPU (the flight recorder's t_start/t_end): each
 * record slot has two events, recorded on the stream just before and just
 * after the op's NCCL call (a staged op: its first piece's start, its last
 * piece's end). The op thread resolves those that completed, before each
 * op and while it waits, into host time: a reference event synchronised
 * at init plus the elapsed time from it (a float of milliseconds: 4 ms
 * steps after 10 hours), kept between the op's issue and the moment it was
 * seen complete (rl_comm_rec_ran). Diagnostics: without events (creation
 * failed) the records simply have none. */
typedef struct gpu_times {
    bool ready;
    cudaEvent_t ev[RL_COMM_RECORDS][2], ref;
    uint64_t seq[RL_COMM_RECORDS]; /* the op each slot's events belong to (0: none) */
    double t[RL_COMM_RECORDS][2];  /* resolved host times (0: not yet) */
    double t_ref;                  /* rl_now() when ref was complete */
} gpu_times;

typedef struct nccl {
    gpu_times gt;
    const volatile int *cancel; /* rl_comm_opts.cancel: init gives up */
    pthread_mutex_t mu; /* guards comm against a concurrent rl_comm_abort */
    ncclComm_t comm;    /* NULL once aborted/destroyed */
    cudaStream_t stream;
    bool own_stream;
    int device;
    float *scratch; /* one device word for the barrier */
    void *stage;    /* device bounce buffer for host buffers, grown on demand */
    size_t stage_bytes;
} nccl;

/* Host buffers move through the bounce buffer in pieces of at most this. */
#define RL_NCCL_STAGE_MAX ((size_t)64 << 20)

static void nap(void) {
    struct timespec ts = {0, 100000}; /* 100 us: polling a GPU queue, not a socket */
    nanosleep(&ts, NULL);
}

static ncclDataType_t nccl_type(rl_dtype t) {
    switch (t) {
    case RL_F32: return ncclFloat32;
    case RL_F64: return ncclFloat64;
    case RL_BF16: return ncclBfloat16;
    case RL_I64: return ncclInt64;
    }
    return ncclFloat32; /* unreachable: validated by comm.c */
}

static void abort_locked(nccl *N) {
    if (N->comm) {
        ncclCommAbort(N->comm);
        N->comm = NULL;
    }
}

/* Wait until the communicator's state leaves ncclInProgress. On error,
 * timeout or abort the communicator is aborted and an error returned. */
static int settle(rl_comm *c, nccl *N, const char *what, rl_err *e) {
    double deadline = rl_now() + c->timeout_s;
    for (;;) {
        ncclResult_t st = ncclSuccess;
        pthread_mutex_lock(&N->mu);
        if (!N->comm || atomic_load(&c->aborted) || (N->cancel && *N->cancel)) {
            abort_locked(N);
            pthread_mutex_unlock(&N->mu);
            return rl_errf(e, RL_EABORT, "rank %d: nccl %s: aborted", c->rank, what);
        }
        ncclResult_t qr = ncclCommGetAsyncError(N->comm, &st);
        if (qr != ncclSuccess) st = qr;
        if (st != ncclSuccess && st != ncclInProgress) {
            const char *last = ncclGetLastError(N->comm);
            abort_locked(N);
            pthread_mutex_unlock(&N->mu);
            return rl_errf(e, st == ncclRemoteError ? RL_EPEER : RL_EIO,
                           "rank %d: nccl %s failed: %s (%s)", c->rank, what,
                           ncclGetErrorString(st), last && *last ? last : "no detail");
        }
        pthread_mutex_unlock(&N->mu);
        if (st == ncclSuccess) return RL_OK;
        if (rl_now() > deadline) {
            pthread_mutex_lock(&N->mu);
            abort_locked(N);
            pthread_mutex_unlock(&N->mu);
            return rl_errf(e, RL_ETIMEOUT,
                           "rank %d: nccl %s: still in progress after %.1f s (a peer is missing "
                           "or stuck): communicator aborted",
                           c->rank, what, c->timeout_s);
        }
        nap();
    }
}

/* ---- GPU times (gpu_times) ---- */
static void times_init(nccl *N) {
    gpu_times *g = &N->gt;
    bool ok = cudaEventCreate(&g->ref) == cudaSuccess;
    for (int s = 0; ok && s < RL_COMM_RECORDS; s++)
        for (int k = 0; ok && k < 2; k++) ok = cudaEventCreate(&g->ev[s][k]) == cudaSuccess;
    ok = ok && cudaEventRecord(g->ref, N->stream) == cudaSuccess && cudaEventSynchronize(g->ref) == cudaSuccess;
    g->t_ref = rl_now();
    g->ready = ok;
    if (!ok) (void)cudaGetLastError(); /* no times, nothing else lost */
}

static void times_free(nccl *N) {
    gpu_times *g = &N->gt;
    if (g->ref) cudaEventDestroy(g->ref);
    for (int s = 0; s < RL_COMM_RECORDS; s++)
        for (int k = 0; k < 2; k++)
            if (g->ev[s][k]) cudaEventDestroy(g->ev[s][k]);
}

/* The op being issued (comm.c's rec_begin ran on this thread, which is the
 * only writer of rec_seq): its start (end 0) or end event, on the stream. */
static void mark(rl_comm *c, nccl *N, int end) {
    gpu_times *g = &N->gt;
    uint64_t seq = c->rec_seq;
    int s = (int)((seq - 1) % RL_COMM_RECORDS);
    if (!g->ready || !seq || (!end && g->seq[s] == seq)) return; /* a later piece: the first start stands */
    if (!end) g->seq[s] = seq, g->t[s][0] = g->t[s][1] = 0;
    if (g->seq[s] == seq && cudaEventRecord(g->ev[s][end], N->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        g->seq[s] = 0; /* half-marked: no times for this op */
    }
}

/* The slots whose events completed since the last look, into the records. */
static void resolve(rl_comm *c, nccl *N) {
    gpu_times *g = &N->gt;
    if (!g->ready) return;
    double now = rl_now();
    for (int s = 0; s < RL_COMM_RECORDS; s++) {
        if (!g->seq[s] || g->t[s][1] > 0) continue;
        bool changed = false;
        for (int k = 0; k < 2 && (k == 0 || g->t[s][0] > 0); k++) {
            float ms = 0;
            if (g->t[s][k] > 0) continue;
            if (cudaEventQuery(g->ev[s][k]) != cudaSuccess ||
                cudaEventElapsedTime(&ms, g->ref, g->ev[s][k]) != cudaSuccess) {
                (void)cudaGetLastError(); /* not yet (or an aborted stream's): look again later */
                break;
            }
            g->t[s][k] = g->t_ref + ms / 1e3, changed = true;
        }
        if (changed) rl_comm_rec_ran(c, g->seq[s], g->t[s][0], g->t[s][1], now);
    }
}

/* Result of an enqueue call: ncclInProgress means "settle first". */
static int enqueued(rl_comm *c, nccl *N, ncclResult_t r, const char *what, rl_err *e) {
    if (r == ncclSuccess || r == ncclInProgress) return settle(c, N, what, e);
    pthread_mutex_lock(&N->mu);
    const char *last = N->comm ? ncclGetLastError(N->comm) : NULL;
    char detail[256];
    snprintf(detail, sizeof detail, "%s", last && *last ? last : "no detail");
    abort_locked(N);
    pthread_mutex_unlock(&N->mu);
    if (atomic_load(&c->aborted))
        return rl_errf(e, RL_EABORT, "rank %d: nccl %s: aborted", c->rank, what);
    return rl_errf(e, r == ncclInvalidArgument || r == ncclInvalidUsage ? RL_EINTERNAL : RL_EIO,
                   "rank %d: nccl %s: %s (%s)", c->rank, what, ncclGetErrorString(r), detail);
}

/* NCCL dereferences device pointers; a host pointer would fault in a
 * kernel far from the call. *host says whether p is host memory
 * (pageable or pinned): allreduce and broadcast stage those, the other ops
 * refuse them (with host_ok NULL), naming the op. */
static int check_device_ptr(rl_comm *c, const void *p, const char *what, bool *host_ok, rl_err *e) {
    if (host_ok) *host_ok = false;
    if (!p) return RL_OK;
    struct cudaPointerAttributes a;
    cudaError_t ce = cudaPointerGetAttributes(&a, p);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky-free error state */
        return rl_errf(e, RL_EINPUT, "rank %d: nccl %s: cannot inspect buffer %p: %s", c->rank,
                       what, p, cudaGetErrorString(ce));
    }
    bool host = a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
    if (host && host_ok) {
        *host_ok = true;
        return RL_OK;
    }
    if (host)
        return rl_errf(e, RL_EINPUT,
                       "rank %d: nccl %s: buffer %p is ordinary host memory; the nccl backend "
                       "needs device (or managed) memory, the tcp backend takes host buffers",
                       c->rank, what, p);
    return RL_OK;
}

/* Common prologue: the communicator exists and this thread targets our
 * device. Returns with the lock NOT held. */
static int begin(rl_comm *c, nccl *N, const char *what, rl_err *e) {
    cudaError_t ce = cudaSetDevice(N->device);
    if (ce != cudaSuccess)
        return rl_errf(e, RL_EIO, "rank %d: nccl %s: cudaSetDevice(%d): %s", c->rank, what,
                       N->device, cudaGetErrorString(ce));
    pthread_mutex_lock(&N->mu);
    bool gone = N->comm == NULL;
    pthread_mutex_unlock(&N->mu);
    if (gone || atomic_load(&c->aborted))
        return rl_errf(e, RL_EABORT, "rank %d: nccl %s: communicator was aborted", c->rank, what);
    resolve(c, N);
    return RL_OK;
}

/* Enqueue under the lock (the call is non-blocking), then settle. */
#define NCCL_ENQUEUE(c, N, what, e, call)                                                     \
    do {                                                                                      \
        pthread_mutex_lock(&(N)->mu);                                                         \
        ncclResult_t r_ = ncclInvalidUsage;                                                   \
        bool gone_ = (N)->comm == NULL;                                                       \
        if (!gone_) mark(c, N, 0), r_ = (call), mark(c, N, 1);                                \
        pthread_mutex_unlock(&(N)->mu);                                                       \
        if (gone_) return rl_errf(e, RL_EABORT, "rank %d: nccl %s: aborted", (c)->rank, what); \
        return enqueued(c, N, r_, what, e);                                                   \
    } while (0)

static int enqueue_allreduce(rl_comm *c, nccl *N, void *buf, size_t count, rl_dtype t,
                             rl_redop op, rl_err *e) {
    NCCL_ENQUEUE(c, N, "allreduce", e,
                 ncclAllReduce(buf, buf, count, nccl_type(t), op == RL_AVG ? ncclAvg : ncclSum,
                               N->comm, N->stream));
}

static int enqueue_broadcast(rl_comm *c, nccl *N, void *buf, size_t count, rl_dtype t, int root,
                             rl_err *e) {
    NCCL_ENQUEUE(c, N, "broadcast", e,
                 ncclBroadcast(buf, buf, count, nccl_type(t), root, N->comm, N->stream));
}

static int nccl_wait(rl_comm *c, rl_err *e);

/* A host buffer, piece by piece: copy in, the collective, copy out, wait.
 * Synchronous: these are small (metrics) or rare (the resume broadcast). */
static int staged(rl_comm *c, nccl *N, bool bcast, void *buf, size_t count, rl_dtype t,
                  rl_redop op, int root, rl_err *e) {
    size_t es = rl_dtype_size(t), per = RL_NCCL_STAGE_MAX / es;
    size_t want = (count < per ? count : per) * es;
    if (want > N->stage_bytes) {
        if (N->stage) cudaFree(N->stage);
        N->stage = NULL, N->stage_bytes = 0;
        cudaError_t ce = cudaMalloc(&N->stage, want);
        if (ce != cudaSuccess)
            return rl_errf(e, RL_ENOMEM, "rank %d: nccl: staging buffer of %zu bytes: %s", c->rank,
                           want, cudaGetErrorString(ce));
        N->stage_bytes = want;
    }
    for (size_t off = 0; off < count; off += per) {
        size_t n = count - off < per ? count - off : per;
        char *h = (char *)buf + off * es;
        cudaError_t ce = cudaMemcpyAsync(N->stage, h, n * es, cudaMemcpyHostToDevice, N->stream);
        if (ce != cudaSuccess)
            return rl_errf(e, RL_EIO, "rank %d: nccl: staging copy in: %s", c->rank, cudaGetErrorString(ce));
        int rc = bcast ? enqueue_broadcast(c, N, N->stage, n, t, root, e)
                       : enqueue_allreduce(c, N, N->stage, n, t, op, e);
        if (rc) return rc;
        ce = cudaMemcpyAsync(h, N->stage, n * es, cudaMemcpyDeviceToHost, N->stream);
        if (ce != cudaSuccess)
            return rl_errf(e, RL_EIO, "rank %d: nccl: staging copy out: %s", c->rank, cudaGetErrorString(ce));
        if ((rc = nccl_wait(c, e))) return rc;
    }
    return RL_OK;
}

static int nccl_allreduce(rl_comm *c, void *buf, size_t count, rl_dtype t, rl_redop op,
                          rl_err *e) {
    nccl *N = c->impl;
    bool host;
    int rc = begin(c, N, "allreduce", e);
    if (!rc) rc = check_device_ptr(c, buf, "allreduce", &host, e);
    if (rc) return rc;
    return host ? staged(c, N, false, buf, count, t, op, 0, e)
                : enqueue_allreduce(c, N, buf, count, t, op, e);
}

static int nccl_broadcast(rl_comm *c, void *buf, size_t count, rl_dtype t, int root,
                          rl_err *e) {
    nccl *N = c->impl;
    bool host;
    int rc = begin(c, N, "broadcast", e);
    if (!rc) rc = check_device_ptr(c, buf, "broadcast", &host, e);
    if (rc) return rc;
    return host ? staged(c, N, true, buf, count, t, RL_SUM, root, e)
                : enqueue_broadcast(c, N, buf, count, t, root, e);
}

static int nccl_allgather(rl_comm *c, const void *send, void *recv, size_t count, rl_dtype t,
                          rl_err *e) {
    nccl *N = c->impl;
    int rc = begin(c, N, "allgather", e);
    if (!rc) rc = check_device_ptr(c, send, "allgather", NULL, e);
    if (!rc) rc = check_device_ptr(c, recv, "allgather", NULL, e);
    if (rc) return rc;
    NCCL_ENQUEUE(c, N, "allgather", e,
                 ncclAllGather(send, recv, count, nccl_type(t), N->comm, N->stream));
}

static int nccl_reduce_scatter(rl_comm *c, const void *send, void *recv, size_t count,
                               rl_dtype t, rl_redop op, rl_err *e) {
    nccl *N = c->impl;
    int rc = begin(c, N, "reduce_scatter", e);
    if (!rc) rc = check_device_ptr(c, send, "reduce_scatter", NULL, e);
    if (!rc) rc = check_device_ptr(c, recv, "reduce_scatter", NULL, e);
    if (rc) return rc;
    NCCL_ENQUEUE(c, N, "reduce_scatter", e,
                 ncclReduceScatter(send, recv, count, nccl_type(t),
                                   op == RL_AVG ? ncclAvg : ncclSum, N->comm, N->stream));
}

static int nccl_wait(rl_comm *c, rl_err *e) {
    nccl *N = c->impl;
    int rc = begin(c, N, "wait", e);
    if (rc) return rc;
    double deadline = rl_now() + c->timeout_s;
    for (int round = 0;; round++) {
        cudaError_t q = cudaStreamQuery(N->stream);
        if (q == cudaSuccess || round % 16 == 15) resolve(c, N); /* what ran meanwhile, each ~2 ms */
        if (q != cudaSuccess && q != cudaErrorNotReady) {
            pthread_mutex_lock(&N->mu);
            abort_locked(N);
            pthread_mutex_unlock(&N->mu);
            return rl_errf(e, RL_EIO, "rank %d: nccl wait: CUDA stream failed: %s", c->rank,
                           cudaGetErrorString(q));
        }
        /* The async error first: a peer failure shows here while the
         * stream is still "not ready" (its kernels wait on the peer). */
        ncclResult_t st = ncclSuccess;
        pthread_mutex_lock(&N->mu);
        bool gone = N->comm == NULL || atomic_load(&c->aborted);
        if (!gone) {
            ncclResult_t qr = ncclCommGetAsyncError(N->comm, &st);
            if (qr != ncclSuccess) st = qr;
        }
        if (gone || (st != ncclSuccess && st != ncclInProgress)) {
            const char *last = !gone ? ncclGetLastError(N->comm) : NULL;
            char detail[256];
            snprintf(detail, sizeof detail, "%s", last && *last ? last : "no detail");
            abort_locked(N);
            pthread_mutex_unlock(&N->mu);
            if (gone) return rl_errf(e, RL_EABORT, "rank %d: nccl wait: aborted", c->rank);
            return rl_errf(e, st == ncclRemoteError ? RL_EPEER : RL_EIO,
                           "rank %d: nccl wait: %s (%s): communicator aborted", c->rank,
                           ncclGetErrorString(st), detail);
        }
        pthread_mutex_unlock(&N->mu);
        if (q == cudaSuccess) return RL_OK;
        if (rl_now() > deadline) {
            pthread_mutex_lock(&N->mu);
            abort_locked(N);
            pthread_mutex_unlock(&N->mu);
            return rl_errf(e, RL_ETIMEOUT,
                           "rank %d: nccl wait: collectives not finished after %.1f s (a peer is "
                           "missing or stuck): communicator aborted",
                           c->rank, c->timeout_s);
        }
        nap();
    }
}

static int nccl_barrier(rl_comm *c, rl_err *e) {
    /* NCCL has no barrier: a one-element allreduce on a scratch device
     * word, then wait, gives the same guarantee. */
    nccl *N = c->impl;
    int rc = nccl_allreduce(c, N->scratch, 1, RL_F32, RL_SUM, e);
    return rc ? rc : nccl_wait(c, e);
}

/* The link from the left neighbour (rl_comm_link_probe): one group of a
 * send of `bytes` to the right and a receive of as many from the left, so
 * each link carries one stream at once, timed on the stream by events
 * around it after a barrier has put every rank at the start line. NCCL
 * gives no first-byte time: the figure includes the kernel's launch and
 * the ranks' skew, small beside 16 MiB (0.3 ms on NVLink, 1.3 ms at
 * 100 Gb/s). Each rank sends a byte pattern of its own, and the last byte
 * received must be the left neighbour's: a misrouted peer is an error. */
static int probe_group(rl_comm *c, nccl *N, char *buf, size_t bytes, rl_err *e) {
    int right = (c->rank + 1) % c->world, left = (c->rank + c->world - 1) % c->world;
    pthread_mutex_lock(&N->mu);
    ncclResult_t r = ncclInvalidUsage;
    bool gone = N->comm == NULL;
    if (!gone) {
        mark(c, N, 0);
        r = ncclGroupStart();
        if (r == ncclSuccess) r = ncclSend(buf, bytes, ncclInt8, right, N->comm, N->stream);
        if (r == ncclSuccess) r = ncclRecv(buf + bytes, bytes, ncclInt8, left, N->comm, N->stream);
        ncclResult_t g = ncclGroupEnd(); /* always, so the group is closed */
        if (r == ncclSuccess) r = g;
        mark(c, N, 1);
    }
    pthread_mutex_unlock(&N->mu);
    if (gone) return rl_errf(e, RL_EABORT, "rank %d: nccl link_probe: aborted", c->rank);
    return enqueued(c, N, r, "link_probe", e);
}

static unsigned char probe_byte(int rank) { return (unsigned char)(rank % 251 + 1); }

static int nccl_link_probe(rl_comm *c, size_t bytes, double *in_gbps, rl_err *e) {
    nccl *N = c->impl;
    int rc = begin(c, N, "link_probe", e);
    if (rc) return rc;
    char *buf = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    cudaError_t ce = cudaMalloc((void **)&buf, 2 * bytes);
    if (ce == cudaSuccess) ce = cudaEventCreate(&ev[0]);
    if (ce == cudaSuccess) ce = cudaEventCreate(&ev[1]);
    if (ce == cudaSuccess) ce = cudaMemsetAsync(buf, probe_byte(c->rank), bytes, N->stream);
    if (ce != cudaSuccess) rc = rl_errf(e, RL_ENOMEM, "rank %d: nccl link_probe: %zu bytes of device memory: %s",
                                        c->rank, 2 * bytes, cudaGetErrorString(ce));
    if (!rc) rc = nccl_barrier(c, e);
    if (!rc && (ce = cudaEventRecord(ev[0], N->stream)) != cudaSuccess)
        rc = rl_errf(e, RL_EIO, "rank %d: nccl link_probe: event: %s", c->rank, cudaGetErrorString(ce));
    if (!rc) rc = probe_group(c, N, buf, bytes, e);
    if (!rc && (ce = cudaEventRecord(ev[1], N->stream)) != cudaSuccess)
        rc = rl_errf(e, RL_EIO, "rank %d: nccl link_probe: event: %s", c->rank, cudaGetErrorString(ce));
    if (!rc) rc = nccl_wait(c, e);
    unsigned char last = 0;
    float ms = 0;
    if (!rc && ((ce = cudaMemcpy(&last, buf + 2 * bytes - 1, 1, cudaMemcpyDeviceToHost)) != cudaSuccess ||
                (ce = cudaEventElapsedTime(&ms, ev[0], ev[1])) != cudaSuccess))
        rc = rl_errf(e, RL_EIO, "rank %d: nccl link_probe: reading back: %s", c->rank, cudaGetErrorString(ce));
    int left = (c->rank + c->world - 1) % c->world;
    if (!rc && last != probe_byte(left))
        rc = rl_errf(e, RL_EINTERNAL, "rank %d: nccl link_probe: the bytes received are not rank %d's", c->rank,
                     left);
    if (!rc) *in_gbps = ms > 0 ? (double)bytes / (ms * 1e-3) / 1e9 : 0;
    for (int i = 0; i < 2; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    cudaFree(buf);
    return rc;
}

static void nccl_abort(rl_comm *c) {
    nccl *N = c->impl;
    pthread_mutex_lock(&N->mu);
    abort_locked(N);
    pthread_mutex_unlock(&N->mu);
}

static void nccl_kill(rl_comm *c) { nccl_abort(c); }

static void nccl_destroy(rl_comm *c) {
    nccl *N = c->impl;
    if (!N) return;
    cudaSetDevice(N->device);
    pthread_mutex_lock(&N->mu);
    if (N->comm && !c->dead && !atomic_load(&c->aborted)) {
        /* A healthy communicator: flush it (bounded), then free it. */
        ncclResult_t r = ncclCommFinalize(N->comm);
        double deadline = rl_now() + c->timeout_s;
        ncclResult_t st = r;
        while (r == ncclSuccess || r == ncclInProgress) {
            st = ncclSuccess;
            if (ncclCommGetAsyncError(N->comm, &st) != ncclSuccess || st != ncclInProgress) break;
            if (rl_now() > deadline) break;
            pthread_mutex_unlock(&N->mu);
            nap();
            pthread_mutex_lock(&N->mu);
            if (!N->comm) break;
        }
        if (N->comm) {
            if ((r == ncclSuccess || r == ncclInProgress) && st == ncclSuccess)
                ncclCommDestroy(N->comm);
            else
                ncclCommAbort(N->comm);
            N->comm = NULL;
        }
    }
    abort_locked(N);
    pthread_mutex_unlock(&N->mu);
    times_free(N);
    if (N->scratch) cudaFree(N->scratch);
    if (N->stage) cudaFree(N->stage);
    if (N->own_stream && N->stream) cudaStreamDestroy(N->stream);
    pthread_mutex_destroy(&N->mu);
    free(N);
    c->impl = NULL;
}

static const rl_comm_ops nccl_ops = {
    .allreduce = nccl_allreduce,
    .broadcast = nccl_broadcast,
    .allgather = nccl_allgather,
    .reduce_scatter = nccl_reduce_scatter,
    .barrier = nccl_barrier,
    .link_probe = nccl_link_probe,
    .wait = nccl_wait,
    .kill = nccl_kill,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};

/* What rank 0 publishes: the NCCL version, then the unique id. */
typedef struct id_record {
    uint8_t version[4]; /* big-endian ncclGetVersion() */
    ncclUniqueId id;
} id_record;

/* The device, the stream ops go on, and a scratch word. */
static int setup_device(rl_comm *c, nccl *N, const rl_comm_opts *o, rl_err *e) {
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0)
        return rl_errf(e, RL_EIO, "rank %d: nccl init: no usable CUDA device (%s)", c->rank,
                       ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    if (o->device < 0 || o->device >= ndev)
        return rl_errf(e, RL_EINPUT, "rank %d: nccl init: device %d outside 0..%d (LOCAL_RANK vs "
                       "GPUs on this node)", c->rank, o->device, ndev - 1);
    if ((ce = cudaSetDevice(o->device)) != cudaSuccess)
        return rl_errf(e, RL_EIO, "rank %d: nccl init: cudaSetDevice(%d): %s", c->rank, o->device,
                       cudaGetErrorString(ce));
    if (o->stream) {
        N->stream = (cudaStream_t)o->stream;
    } else {
        /* the highest priority the device has: a reduction's kernels are
         * scheduled ahead of backward's queued work as SMs free up, so the
         * last buckets do not wait behind the whole remaining backward */
        int least = 0, greatest = 0;
        if ((ce = cudaDeviceGetStreamPriorityRange(&least, &greatest)) == cudaSuccess)
            ce = cudaStreamCreateWithPriority(&N->stream, cudaStreamNonBlocking, greatest);
        if (ce != cudaSuccess)
            return rl_errf(e, RL_EIO, "rank %d: nccl init: cudaStreamCreate: %s", c->rank,
                           cudaGetErrorString(ce));
        N->own_stream = true;
    }
    if ((ce = cudaMalloc((void **)&N->scratch, sizeof *N->scratch)) != cudaSuccess)
        return rl_errf(e, RL_EIO, "rank %d: nccl init: cudaMalloc: %s", c->rank, cudaGetErrorString(ce));
    times_init(N);
    return RL_OK;
}

/* Rank 0 makes the ncclUniqueId and publishes it with its NCCL version;
 * the others read it (by the deadline) and refuse another version. */
static int exchange_id(rl_comm *c, const rl_comm_opts *o, int ver, double deadline, id_record *rec, rl_err *e) {
    int rc;
    char key[1100];
    memset(rec, 0, sizeof *rec);
    snprintf(key, sizeof key, "%s/nccl_id", o->prefix ? o->prefix : "");
    if (c->rank == 0) {
        for (int i = 0; i < 4; i++) rec->version[i] = (uint8_t)((uint32_t)ver >> (24 - 8 * i));
        ncclResult_t r = ncclGetUniqueId(&rec->id);
        if (r != ncclSuccess)
            return rl_errf(e, RL_EIO, "rank 0: nccl init: ncclGetUniqueId: %s", ncclGetErrorString(r));
        if (o->store && (rc = rl_store_set(o->store, key, rec, sizeof *rec, e)))
            return rl_err_wrap(e, "rank 0: publishing the NCCL id (key %s)", key);
        return RL_OK;
    }
    void *val = NULL;
    size_t len = 0;
    double left = deadline - rl_now();
    if ((rc = rl_store_get(o->store, key, left > 0 ? left : 0.001, &val, &len, e)))
        return rl_err_wrap(e, "rank %d: waiting for rank 0's NCCL id", c->rank);
    if (len != sizeof *rec) {
        free(val);
        return rl_errf(e, RL_EPEER, "rank %d: NCCL id record under %s is %zu bytes, expected "
                       "%zu (rank 0 runs another ringleader build?)", c->rank, key, len, sizeof *rec);
    }
    memcpy(rec, val, sizeof *rec);
    free(val);
    int theirs = (int)(((uint32_t)rec->version[0] << 24) | ((uint32_t)rec->version[1] << 16) |
                       ((uint32_t)rec->version[2] << 8) | rec->version[3]);
    if (theirs != ver)
        return rl_errf(e, RL_EPEER, "rank %d: rank 0 uses NCCL version code %d, this rank %d: "
                       "every rank must run the same NCCL", c->rank, theirs, ver);
    return RL_OK;
}

int rl_comm_nccl_init(const rl_comm_opts *o, rl_comm *c, rl_err *e) {
    nccl *N = calloc(1, sizeof *N);
    if (!N) return rl_errf(e, RL_ENOMEM, "rank %d: nccl init: out of memory", c->rank);
    pthread_mutex_init(&N->mu, NULL);
    N->device = o->device;
    N->cancel = o->cancel;
    c->impl = N;
    c->ops = &nccl_ops;
    double deadline = rl_now() + c->timeout_s;
    int ver = 0, rc;
    ncclGetVersion(&ver);
    id_record rec;
    if ((rc = setup_device(c, N, o, e)) || (rc = exchange_id(c, o, ver, deadline, &rec, e))) goto fail;

    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* every call returns; we bound the waiting ourselves */
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, c->world, rec.id, c->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        if (comm) ncclCommAbort(comm);
        rc = rl_errf(e, RL_EIO, "rank %d: ncclCommInitRankConfig(world %d): %s", c->rank,
                     c->world, ncclGetErrorString(r));
        goto fail;
    }
    N->comm = comm;
    /* settle() bounds init by timeout_s and aborts on failure: a rank that
     * never shows up is a timeout naming this rank, not a hang. */
    if ((rc = settle(c, N, "init", e))) {
        rl_err_wrap(e, "forming the NCCL communicator (world %d, device %d)", c->world,
                    o->device);
        goto fail;
    }
    c->stream = N->stream;
    rl_log(RL_LOG_DEBUG, "comm_nccl_ready", "\"world\":%d,\"device\":%d,\"nccl_version\":%d",
           c->world, o->device, ver);
    return RL_OK;
fail:
    pthread_mutex_lock(&N->mu);
    abort_locked(N);
    pthread_mutex_unlock(&N->mu);
    times_free(N);
    if (N->scratch) cudaFree(N->scratch);
    if (N->own_stream && N->stream) cudaStreamDestroy(N->stream);
    pthread_mutex_destroy(&N->mu);
    free(N);
    c->impl = NULL;
    return rc;
}

#else
/* Without CUDA this unit is empty; comm.c rejects backend "nccl". */
typedef int rl_comm_nccl_unused;
#endif
