// NCCL for the emulated build (make test-gpu-emu): the API pkg/comm/nccl.c
// calls, for any number of ranks that are threads of one process, each on
// its own emulated device (fake_cuda.cpp, RL_EMU_DEVICES). "Device" memory
// is host memory, so a collective reduces the ranks' buffers directly --
// shared memory, the transport NCCL itself uses between processes of a node.
//
// What it keeps of NCCL's semantics, because nccl.c relies on them:
//  - the unique id names the clique: ranks that pass the same id (rank 0
//    makes it, the others get it through the store) and the same nranks
//    form one communicator; a rank taken twice, nranks that disagree, or
//    two ranks on the same device ("Duplicate GPU detected") fail the init
//    on every rank with ncclInvalidUsage;
//  - non-blocking communicators (config.blocking = 0, nccl.c's only mode):
//    init returns ncclInProgress and ncclCommGetAsyncError says
//    ncclInProgress until every rank has joined -- a rank that never comes
//    keeps it so, and only the caller's own deadline ends that (nccl.c:
//    RL_ETIMEOUT, then ncclCommAbort);
//  - collectives match across ranks in call order (the n-th call of each
//    rank is one collective) and must agree on the op, count, type,
//    reduction and root: a mismatch, which real NCCL does not detect (it
//    hangs or corrupts), fails the communicator on every rank with
//    ncclInvalidUsage naming both calls;
//  - buffers are device memory of the communicator's device (a host or
//    another device's pointer would fault in NCCL's kernel: refused here
//    with ncclInvalidArgument, as fake_cuda's allocations remember their
//    device);
//  - ncclCommAbort, from any thread, frees the communicator at once; its
//    peers are not told (over shared memory or NVLink nothing tells them):
//    their collectives with the aborted rank never complete, until their
//    own deadline aborts them too;
//  - sum and avg of float32/64, bf16 and integers: the sum in rank order in
//    the type's arithmetic (bf16 rounded to nearest even after each
//    addition), avg that sum divided by nranks -- as the tcp backend
//    computes. At two ranks that is NCCL's result too, subnormals aside
//    (a + b does not depend on the order, and NCCL's avg of floating
//    types multiplies each input by 1/nranks before summing).
//    Other reductions and types are refused as not emulated.
//  - point-to-point: ncclSend and ncclRecv inside ncclGroupStart/End, at
//    most one of each per group (what the link probe issues); the group is
//    the rank's call in the collective order, and it completes once every
//    rank has entered its group -- the pairs must match (a send from r to
//    p meets a receive on p from r of the same bytes), else the
//    communicator fails naming both. Real NCCL lets ranks outside the
//    pairs go on; here every rank takes part, as the probe's ring does.
//
// Where the wait is. The fake CUDA runtime runs everything when it is
// queued, so a collective cannot be left on a stream for its peers to meet
// later: whatever the caller queues next would run before it. Instead the
// call itself stays "in progress" (returns ncclInProgress, and
// ncclCommGetAsyncError says ncclInProgress) until the last rank enters
// the same collective; that rank combines every rank's buffers before it
// returns, and the others' state turns to ncclSuccess. So in emulation a
// missing peer shows in nccl.c's settle() -- the poll of
// ncclCommGetAsyncError after every enqueue -- and not in rl_comm_wait's
// cudaStreamQuery (always done here); both loops end the same way (the
// deadline or rl_comm_abort, then ncclCommAbort), but only settle's is run.
// Real NCCL returns from the enqueue without its peers and waits on the
// GPU. Blocking communicators of more than one rank are not emulated.
//
// Ranks in different processes (fork) cannot meet here: each process has
// its own cliques, so such a rank would wait until its deadline.
#include <cuda_runtime.h>
#include <nccl.h>

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tests/gpu/emu/emu.h"

namespace {
struct clique;
}

struct ncclComm {
    clique *cq;
    int rank, nranks, device;
    uint64_t issued, done; // collectives entered / completed, in call order
    bool finalized;
    char last[320]; // this rank's last refusal (ncclGetLastError)
};

namespace {
enum coll_kind { ALLREDUCE, BROADCAST, ALLGATHER, REDUCE_SCATTER, SENDRECV };
const char *const kind_name[] = {"allreduce", "broadcast", "allgather", "reduce_scatter", "send/recv group"};

// One collective as the ranks enter it: defined by the first, checked
// against it by the others, run by the last.
struct coll {
    coll_kind kind;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t red;
    int root, first;
    std::vector<const void *> send;
    std::vector<void *> recv;
    int arrived = 0;
    // SENDRECV: per rank, its peers (-1: none) and bytes; count/type unused
    std::vector<int> to, from;
    std::vector<size_t> sbytes, rbytes;
};

// A rank's open group (ncclGroupStart .. ncclGroupEnd): its one send and
// one receive, sent as one call at the end.
struct group {
    int depth = 0;
    ncclComm *c = nullptr;
    const void *sbuf = nullptr;
    void *rbuf = nullptr;
    int to = -1, from = -1;
    size_t sbytes = 0, rbytes = 0;
    char refused[320] = ""; // a refusal inside the group, returned at its end
};
thread_local group grp;

struct clique {
    std::string id;
    int nranks, joined = 0, left = 0;
    // every rank joined and none had left by then: until so, init is in
    // progress (a rank that aborts during init leaves the others waiting)
    bool formed = false;
    std::vector<ncclComm *> members; // by rank; null once it left
    ncclResult_t failed = ncclSuccess;
    char why[320] = ""; // set once, with failed; never changed after
    std::map<uint64_t, coll> pending; // by sequence number
};

// Everything shared between ranks, behind one lock: collectives are rare
// and small in the tests, and a combine is short.
std::mutex mu;
std::map<std::string, clique *> forming; // cliques still waiting for ranks, by id

thread_local char thread_last[320]; // ncclGetLastError(NULL)

ncclResult_t refuse(ncclComm *c, ncclResult_t r, const char *fmt, ...) {
    char *buf = c ? c->last : thread_last;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof thread_last, fmt, ap);
    va_end(ap);
    return r;
}

// The whole communicator fails, on every rank (called with mu held).
ncclResult_t fail_clique(clique *q, ncclResult_t r, const char *fmt, ...) {
    if (q->failed != ncclSuccess) return q->failed;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->why, sizeof q->why, fmt, ap);
    va_end(ap);
    q->failed = r;
    return r;
}

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0; // fp16 and fp8: not emulated
    }
}

const char *type_name(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: return "int8";
    case ncclUint8: return "uint8";
    case ncclInt32: return "int32";
    case ncclUint32: return "uint32";
    case ncclInt64: return "int64";
    case ncclUint64: return "uint64";
    case ncclFloat32: return "float32";
    case ncclFloat64: return "float64";
    case ncclBfloat16: return "bfloat16";
    default: return "an unemulated type";
    }
}

// bf16 <-> f32 as pkg/comm computes it: round to nearest even, NaN kept NaN.
float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

// acc[i] (+)= x[i] over n elements of type t; avg divides the finished sum.
template <class T> void add_into(void *acc, const void *x, size_t n) {
    T *a = (T *)acc;
    const T *b = (const T *)x;
    for (size_t i = 0; i < n; i++) a[i] = (T)(a[i] + b[i]);
}
template <class T> void divide(void *acc, size_t n, int d) {
    T *a = (T *)acc;
    for (size_t i = 0; i < n; i++) a[i] = (T)(a[i] / (T)d);
}
void accumulate(void *acc, const void *x, size_t n, ncclDataType_t t) {
    switch (t) {
    case ncclInt8: add_into<uint8_t>(acc, x, n); break; // wraps, as two's complement does
    case ncclUint8: add_into<uint8_t>(acc, x, n); break;
    case ncclInt32: case ncclUint32: add_into<uint32_t>(acc, x, n); break;
    case ncclInt64: case ncclUint64: add_into<uint64_t>(acc, x, n); break;
    case ncclFloat32: add_into<float>(acc, x, n); break;
    case ncclFloat64: add_into<double>(acc, x, n); break;
    case ncclBfloat16: {
        uint16_t *a = (uint16_t *)acc;
        const uint16_t *b = (const uint16_t *)x;
        for (size_t i = 0; i < n; i++) a[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
        break;
    }
    default: break; // refused at entry
    }
}
void average(void *acc, size_t n, ncclDataType_t t, int d) {
    switch (t) {
    case ncclInt8: divide<int8_t>(acc, n, d); break;
    case ncclUint8: divide<uint8_t>(acc, n, d); break;
    case ncclInt32: divide<int32_t>(acc, n, d); break;
    case ncclUint32: divide<uint32_t>(acc, n, d); break;
    case ncclInt64: divide<int64_t>(acc, n, d); break;
    case ncclUint64: divide<uint64_t>(acc, n, d); break;
    case ncclFloat32: divide<float>(acc, n, d); break;
    case ncclFloat64: divide<double>(acc, n, d); break;
    case ncclBfloat16: {
        uint16_t *a = (uint16_t *)acc;
        for (size_t i = 0; i < n; i++) a[i] = f32_to_bf16(bf16_to_f32(a[i]) / (float)d);
        break;
    }
    default: break;
    }
}

// out = the reduction over ranks of each rank's `n` elements at byte offset
// `off` of its send buffer.
void reduce(const coll &c, size_t off, size_t n, char *out) {
    size_t es = type_size(c.type);
    memcpy(out, (const char *)c.send[0] + off, n * es);
    for (size_t r = 1; r < c.send.size(); r++) accumulate(out, (const char *)c.send[r] + off, n, c.type);
    if (c.red == ncclAvg) average(out, n, c.type, (int)c.send.size());
}

// Run a collective every rank has entered (mu held, by the last rank to
// enter). The result goes through a temporary first: a rank's receive
// buffer may be its own, or the root's, send buffer.
void run(const coll &c) {
    int nr = (int)c.send.size();
    if (c.kind == SENDRECV) { // through copies: a buffer may be sent and received into
        std::vector<std::vector<char>> out(nr);
        for (int r = 0; r < nr; r++)
            if (c.to[r] >= 0) out[r].assign((const char *)c.send[r], (const char *)c.send[r] + c.sbytes[r]);
        for (int r = 0; r < nr; r++)
            if (c.to[r] >= 0 && !out[r].empty()) memcpy(c.recv[c.to[r]], out[r].data(), out[r].size());
        return;
    }
    size_t es = type_size(c.type), bytes = c.count * es;
    std::vector<char> tmp(c.kind == ALLGATHER || c.kind == REDUCE_SCATTER ? bytes * nr : bytes);
    if (tmp.empty()) return;
    switch (c.kind) {
    case ALLREDUCE:
        reduce(c, 0, c.count, tmp.data());
        for (int r = 0; r < nr; r++) memcpy(c.recv[r], tmp.data(), bytes);
        break;
    case BROADCAST:
        memcpy(tmp.data(), c.send[c.root], bytes);
        for (int r = 0; r < nr; r++) memcpy(c.recv[r], tmp.data(), bytes);
        break;
    case ALLGATHER:
        for (int r = 0; r < nr; r++) memcpy(tmp.data() + r * bytes, c.send[r], bytes);
        for (int r = 0; r < nr; r++) memcpy(c.recv[r], tmp.data(), bytes * nr);
        break;
    case REDUCE_SCATTER:
        for (int r = 0; r < nr; r++) reduce(c, r * bytes, c.count, tmp.data() + r * bytes);
        for (int r = 0; r < nr; r++) memcpy(c.recv[r], tmp.data() + r * bytes, bytes);
        break;
    case SENDRECV: break; // above
    }
}

// NCCL's kernels dereference the pointer on the communicator's device.
bool on_device(const void *p, int device) {
    cudaPointerAttributes a;
    return cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeDevice &&
           a.device == device;
}

// A rank's arguments, before it takes part (mu not held).
ncclResult_t check_args(ncclComm *c, coll_kind k, const void *send, void *recv, size_t count,
                        ncclDataType_t t, ncclRedOp_t red, int root) {
    const char *what = kind_name[k];
    if (!c) return refuse(c, ncclInvalidArgument, "%s: communicator is NULL", what);
    if (!type_size(t))
        return refuse(c, ncclInvalidArgument, "%s: data type %d is not emulated", what, (int)t);
    if ((k == ALLREDUCE || k == REDUCE_SCATTER) && red != ncclSum && red != ncclAvg)
        return refuse(c, ncclInvalidArgument, "%s: reduction %d is not emulated (sum and avg are)",
                      what, (int)red);
    if (k == BROADCAST && (root < 0 || root >= c->nranks))
        return refuse(c, ncclInvalidArgument, "%s: root %d outside 0..%d", what, root, c->nranks - 1);
    if (count && (!on_device(send, c->device) || !on_device(recv, c->device)))
        return refuse(c, ncclInvalidArgument,
                      "%s: rank %d: buffer %p or %p is not device memory of CUDA device %d (NCCL "
                      "would fault on it)",
                      what, c->rank, send, recv, c->device);
    return ncclSuccess;
}

// A send/recv group every rank entered: each send meets the receive its
// peer posted for it (mu held); the first mismatch, described.
bool pairs_match(const coll &op, char *why, size_t n) {
    int nr = (int)op.to.size();
    for (int r = 0; r < nr; r++) {
        int p = op.to[r];
        if (p >= 0 && (op.from[p] != r || op.rbytes[p] != op.sbytes[r])) {
            snprintf(why, n, "send/recv: rank %d sends %zu bytes to rank %d, which receives %zu from rank %d", r,
                     op.sbytes[r], p, op.rbytes[p], op.from[p]);
            return false;
        }
        int q = op.from[r];
        if (q >= 0 && op.to[q] != r) {
            snprintf(why, n, "send/recv: rank %d receives from rank %d, which sends to rank %d", r, q, op.to[q]);
            return false;
        }
    }
    return true;
}

// The n-th collective of every rank must be the same call.
bool same_call(const coll &a, const coll &b) {
    bool reduces = a.kind == ALLREDUCE || a.kind == REDUCE_SCATTER;
    return a.kind == b.kind && a.count == b.count && a.type == b.type &&
           (!reduces || a.red == b.red) && (a.kind != BROADCAST || a.root == b.root);
}

ncclResult_t take_part(ncclComm *c, const coll &mine);

ncclResult_t enter(ncclComm *c, coll_kind k, const void *send, void *recv, size_t count,
                   ncclDataType_t t, ncclRedOp_t red, int root) {
    ncclResult_t r = check_args(c, k, send, recv, count, t, red, root);
    if (r != ncclSuccess) return r;
    return take_part(c, coll{k, count, t, red, root, c->rank, {send}, {recv}, 0, {}, {}, {}, {}});
}

// A checked call joins the collective of its sequence number; the last
// rank to arrive runs it.
ncclResult_t take_part(ncclComm *c, const coll &mine) {
    coll_kind k = mine.kind;
    std::lock_guard<std::mutex> g(mu);
    clique *q = c->cq;
    if (q->failed != ncclSuccess) return q->failed;
    if (!q->formed || c->done < c->issued || c->finalized)
        return refuse(c, ncclInvalidUsage,
                      "%s: rank %d: the communicator is %s (a non-blocking communicator takes the "
                      "next call only once ncclCommGetAsyncError says ncclSuccess)",
                      kind_name[k], c->rank,
                      c->finalized ? "finalized" : !q->formed ? "still forming" : "busy with a call");
    uint64_t seq = c->issued++;
    coll &op = q->pending.try_emplace(seq, mine).first->second;
    if (op.arrived == 0) {
        op.send.assign(q->nranks, nullptr);
        op.recv.assign(q->nranks, nullptr);
        op.to.assign(q->nranks, -1), op.from.assign(q->nranks, -1);
        op.sbytes.assign(q->nranks, 0), op.rbytes.assign(q->nranks, 0);
    } else if (!same_call(op, mine)) {
        return fail_clique(q, ncclInvalidUsage,
                           "collective #%llu: rank %d called %s of %zu %s (op %d, root %d), rank "
                           "%d %s of %zu %s (op %d, root %d): the ranks' calls must match",
                           (unsigned long long)seq, op.first, kind_name[op.kind], op.count,
                           type_name(op.type), (int)op.red, op.root, c->rank, kind_name[k], mine.count,
                           type_name(mine.type), (int)mine.red, mine.root);
    }
    int me = c->rank;
    op.send[me] = mine.send.empty() ? nullptr : mine.send[0];
    op.recv[me] = mine.recv.empty() ? nullptr : mine.recv[0];
    if (k == SENDRECV)
        op.to[me] = mine.to[0], op.from[me] = mine.from[0], op.sbytes[me] = mine.sbytes[0],
        op.rbytes[me] = mine.rbytes[0];
    // A rank that left (aborted, destroyed) never enters again: the
    // collective stays in progress, as NCCL's kernels would wait.
    if (++op.arrived < q->nranks || q->left) return ncclInProgress;
    char why[320];
    if (k == SENDRECV && !pairs_match(op, why, sizeof why)) return fail_clique(q, ncclInvalidUsage, "%s", why);
    run(op);
    q->pending.erase(seq);
    for (ncclComm *m : q->members) m->done = seq + 1;
    return ncclSuccess;
}

// A communicator leaves its clique (mu held): its peers' collectives with
// it can no longer complete; the last one out frees the clique.
void leave(ncclComm *c) {
    clique *q = c->cq;
    q->members[c->rank] = nullptr;
    q->left++;
    if (q->joined < q->nranks && q->joined == q->left) forming.erase(q->id);
    if (q->left == q->joined) delete q;
    free(c);
}
} // namespace

extern "C" {
ncclResult_t ncclGetVersion(int *v) {
    *v = NCCL_VERSION_CODE;
    return ncclSuccess;
}
// Unique within the process, which is where the ranks meet.
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static std::atomic<unsigned long long> next{1};
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "emulated nccl clique %llu of pid %ld",
             next.fetch_add(1), (long)getpid());
    return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *cfg) {
    *out = nullptr;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return refuse(nullptr, ncclInvalidArgument, "init: rank %d of %d", rank, nranks);
    bool blocking = !cfg || cfg->blocking != 0; // NCCL's default is blocking
    if (blocking && nranks > 1)
        return refuse(nullptr, ncclInvalidUsage,
                      "init: blocking communicators of %d ranks are not emulated "
                      "(pkg/comm/nccl.c sets config.blocking = 0)",
                      nranks);
    int device = 0;
    cudaGetDevice(&device); // NCCL's device is the caller's current one
    std::lock_guard<std::mutex> g(mu);
    std::string key(id.internal, sizeof id.internal);
    clique *&slot = forming[key];
    if (!slot) {
        slot = new clique;
        slot->id = key;
        slot->nranks = nranks;
        slot->members.assign(nranks, nullptr);
    }
    clique *q = slot;
    if (q->nranks != nranks || q->members[rank]) { // the others learn it from their async error
        fail_clique(q, ncclInvalidUsage, "init: rank %d %s", rank,
                    q->members[rank] ? "joined twice" : "disagrees on the number of ranks");
        return refuse(nullptr, ncclInvalidUsage, "%s", q->why);
    }
    ncclComm *c = (ncclComm *)calloc(1, sizeof *c);
    *c = ncclComm{q, rank, nranks, device, 0, 0, false, ""};
    q->members[rank] = c;
    q->formed = ++q->joined == q->nranks && !q->left;
    if (q->joined == q->nranks) {
        forming.erase(key); // complete: no later init can join it
        for (int a = 0; a < nranks; a++)
            for (int b = a + 1; b < nranks; b++)
                if (q->members[a] && q->members[b] && q->members[a]->device == q->members[b]->device)
                    fail_clique(q, ncclInvalidUsage,
                                "init: Duplicate GPU detected: rank %d and rank %d both on CUDA "
                                "device %d",
                                a, b, q->members[a]->device);
    }
    *out = c;
    return q->formed ? ncclSuccess : ncclInProgress;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *st) {
    if (!c) return ncclInvalidArgument;
    std::lock_guard<std::mutex> g(mu);
    const clique *q = c->cq;
    *st = q->failed != ncclSuccess              ? q->failed
          : !q->formed || c->done < c->issued ? ncclInProgress
                                                         : ncclSuccess;
    return ncclSuccess;
}
// As NCCL's: the last failure's detail (here the communicator's, or the
// calling thread's where there is no communicator).
const char *ncclGetLastError(ncclComm_t c) {
    if (!c) return thread_last;
    std::lock_guard<std::mutex> g(mu);
    return c->cq->failed != ncclSuccess ? c->cq->why : c->last;
}
const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t c, cudaStream_t st) {
    rl_emu_stream_run(st);
    return enter(c, ALLREDUCE, s, r, n, t, op, 0);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root,
                           ncclComm_t c, cudaStream_t st) {
    rl_emu_stream_run(st);
    // only the root's send buffer is read; the others may pass their recv
    return enter(c, BROADCAST, c && c->rank == root ? s : r, r, n, t, ncclSum, root);
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t st) {
    rl_emu_stream_run(st);
    return enter(c, ALLGATHER, s, r, n, t, ncclSum, 0);
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t st) {
    rl_emu_stream_run(st);
    return enter(c, REDUCE_SCATTER, s, r, n, t, op, 0);
}
ncclResult_t ncclGroupStart(void) {
    if (grp.depth++ == 0) grp = group{1};
    return ncclSuccess;
}
// One half of a pair, recorded in the open group (refusals are kept for
// its end, where a real group reports them too).
static ncclResult_t p2p(bool send, const void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t c) {
    const char *what = send ? "ncclSend" : "ncclRecv";
    if (grp.depth == 0) return refuse(c, ncclInvalidUsage, "%s outside a group is not emulated", what);
    ncclResult_t r = ncclSuccess;
    if (!c || (grp.c && grp.c != c)) r = refuse(c, ncclInvalidUsage, "%s: one communicator per group", what);
    else if (!type_size(t)) r = refuse(c, ncclInvalidArgument, "%s: data type %d is not emulated", what, (int)t);
    else if (peer < 0 || peer >= c->nranks) r = refuse(c, ncclInvalidArgument, "%s: peer %d outside 0..%d", what, peer, c->nranks - 1);
    else if ((send ? grp.to : grp.from) >= 0) r = refuse(c, ncclInvalidUsage, "%s: a second one in a group is not emulated", what);
    else if (n && !on_device(buf, c->device))
        r = refuse(c, ncclInvalidArgument, "%s: rank %d: buffer %p is not device memory of CUDA device %d", what,
                   c->rank, buf, c->device);
    if (r != ncclSuccess) {
        if (!grp.refused[0]) snprintf(grp.refused, sizeof grp.refused, "%s", c ? c->last : thread_last);
        return r;
    }
    grp.c = c;
    if (send) grp.sbuf = buf, grp.to = peer, grp.sbytes = n * type_size(t);
    else grp.rbuf = (void *)buf, grp.from = peer, grp.rbytes = n * type_size(t);
    return ncclSuccess;
}
ncclResult_t ncclSend(const void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    rl_emu_stream_run(st); // its inputs: what the stream queued before it
    return p2p(true, buf, n, t, peer, c);
}
ncclResult_t ncclRecv(void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    rl_emu_stream_run(st);
    return p2p(false, buf, n, t, peer, c);
}
ncclResult_t ncclGroupEnd(void) {
    if (grp.depth == 0) return refuse(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--grp.depth > 0) return ncclSuccess;
    group g = grp;
    grp = group{};
    if (g.refused[0]) return refuse(g.c, ncclInvalidUsage, "%s", g.refused);
    if (!g.c) return ncclSuccess; // an empty group
    coll mine{SENDRECV, 0, ncclInt8, ncclSum, 0, g.c->rank, {g.sbuf}, {g.rbuf}, 0, {g.to}, {g.from}, {g.sbytes},
              {g.rbytes}};
    return take_part(g.c, mine);
}
// Nothing is left to flush (a collective's data moves when its last rank
// enters), unless a call is still waiting for its peers.
ncclResult_t ncclCommFinalize(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    std::lock_guard<std::mutex> g(mu);
    c->finalized = true;
    return c->cq->failed != ncclSuccess ? c->cq->failed
           : c->done < c->issued        ? ncclInProgress
                                        : ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    std::lock_guard<std::mutex> g(mu);
    leave(c);
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclSuccess;
    std::lock_guard<std::mutex> g(mu);
    leave(c);
    return ncclSuccess;
}
}
