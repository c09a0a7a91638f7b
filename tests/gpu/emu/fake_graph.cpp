// Stream capture and CUDA graphs for the emulated build, with the rules of
// the real runtime that code under capture must follow (CUDA Runtime API,
// "Graph Management" and cudaStreamBeginCapture):
//
//  * work queued on a capturing stream -- kernels, cuBLASLt matmuls,
//    cudaMemcpyAsync, cudaMemsetAsync -- does not run: it is recorded, its
//    arguments taken by value then (as kernel parameters are), and runs at
//    each cudaGraphLaunch of the instantiated graph, in order. A copy from
//    host memory reads that memory at replay, not at capture;
//  * a copy to or from pageable host memory cannot be captured;
//  * while a thread captures (cudaStreamCaptureModeThreadLocal, or Global
//    from any thread), the calls that may synchronise -- stream/event
//    synchronize and query, cudaMemcpy, cudaMalloc/cudaFree -- fail with
//    cudaErrorStreamCaptureUnsupported and invalidate the capture, whose
//    cudaStreamEndCapture then fails with cudaErrorStreamCaptureInvalidated;
//  * an event recorded inside a capture is not a host-visible event: a
//    synchronize or query on it fails with cudaErrorCapturedEvent until it
//    is recorded again outside a capture.
// Other streams are not affected: their work runs when queued, as before.
//
// With RL_EMU_DEFER=1 work queued on a stream other than the legacy one
// does not run when queued either: it waits in the stream's queue, in
// order, until something needs it -- a synchronize or query of the stream
// or of an event recorded on it, a cudaStreamWaitEvent on such an event
// that another stream's work reaches (the waiting stream runs the other
// one's queue up to the event first), a synchronous copy, a free, the
// legacy stream, a graph, or an NCCL call on the stream (its inputs). So
// the order a GPU may take is taken: work on one stream that reads what
// another stream writes without waiting for it reads the old values, and
// a host write into pinned memory after queueing a copy of it is what the
// copy reads -- both show as wrong results, where the eager default hides
// them. A copy from or to pageable memory runs at once (the runtime's are
// synchronous), after its stream's queue. NCCL collectives still run when
// called (the fake NCCL's ranks meet on the calling threads).
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "tests/gpu/emu/emu.h"

struct CUgraph_st {
    std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
    std::vector<std::function<void()>> ops;
};

namespace {
struct capture {
    std::thread::id owner;
    cudaStreamCaptureMode mode;
    cudaError_t invalid = cudaSuccess; // first error that invalidated it
    std::vector<std::function<void()>> ops;
};
std::mutex mu;
std::map<cudaStream_t, capture> captures;
std::set<cudaEvent_t> captured_events;

// Must hold mu. A capture that makes the calling thread's unsafe calls fail.
capture *restricting_capture() {
    for (auto &kv : captures)
        if (kv.second.mode == cudaStreamCaptureModeGlobal ||
            (kv.second.mode == cudaStreamCaptureModeThreadLocal &&
             kv.second.owner == std::this_thread::get_id()))
            return &kv.second;
    return nullptr;
}

// Must hold mu. The call fails with err and, if it is the first failure,
// invalidates capture c (NULL: no capture is involved, the call succeeds).
cudaError_t spoil(capture *c, cudaError_t err) {
    if (!c) return cudaSuccess;
    if (c->invalid == cudaSuccess) c->invalid = err;
    return err;
}
capture *capture_of(cudaStream_t s) {
    auto it = s ? captures.find(s) : captures.end();
    return it == captures.end() ? nullptr : &it->second;
}

// ---- RL_EMU_DEFER: streams as queues ----
bool defer() {
    static const bool on = [] {
        const char *v = getenv("RL_EMU_DEFER");
        return v && !strcmp(v, "1");
    }();
    return on;
}
struct queued {
    uint64_t seq;
    std::function<void()> fn;     // empty: a wait for `on` up to `upto`
    cudaStream_t on = nullptr;
    uint64_t upto = 0;
};
struct stream_queue {
    std::deque<queued> q;
    uint64_t next = 1; // the seq the next op gets
};
// Recursive: running a wait runs another stream's queue. The ops that run
// under it never block (NCCL's meet is outside the queues).
std::recursive_mutex qmu;
std::map<cudaStream_t, stream_queue> queues;
std::map<cudaEvent_t, std::pair<cudaStream_t, uint64_t>> recorded; // stream, last seq before it

void run_until(cudaStream_t s, uint64_t upto) {
    std::lock_guard<std::recursive_mutex> g(qmu);
    auto it = queues.find(s);
    if (it == queues.end()) return;
    std::deque<queued> &q = it->second.q; // map nodes stay put while others are added
    while (!q.empty() && q.front().seq <= upto) {
        queued op = std::move(q.front());
        q.pop_front();
        if (op.fn) op.fn();
        else run_until(op.on, op.upto);
    }
}
void run_all() {
    std::lock_guard<std::recursive_mutex> g(qmu);
    for (auto &kv : queues) run_until(kv.first, UINT64_MAX);
}
// Runs ev's stream up to the point it was recorded at (nothing where it
// was never recorded, or on the legacy stream: done already).
void run_to_event(cudaEvent_t ev) {
    std::lock_guard<std::recursive_mutex> g(qmu);
    auto it = recorded.find(ev);
    if (it != recorded.end() && it->second.first) run_until(it->second.first, it->second.second);
}
} // namespace

bool rl_emu_enqueue(cudaStream_t s, const std::function<void()> &fn) {
    {
        std::lock_guard<std::mutex> g(mu);
        auto it = captures.find(s);
        if (it != captures.end()) {
            if (it->second.invalid == cudaSuccess) it->second.ops.push_back(fn);
            return true;
        }
    }
    if (defer() && s) {
        std::lock_guard<std::recursive_mutex> g(qmu);
        stream_queue &sq = queues[s];
        sq.q.push_back(queued{sq.next++, fn});
        return false;
    }
    if (defer()) run_all(); // the legacy stream waits for every other
    fn();
    return false;
}

void rl_emu_stream_run(cudaStream_t s) {
    if (!defer()) return;
    if (s) run_until(s, UINT64_MAX);
    else run_all();
}

void rl_emu_stream_wait(cudaStream_t s, cudaEvent_t ev) {
    if (!defer()) return;
    {
        std::lock_guard<std::mutex> g(mu);
        if (captures.count(s)) return; // a capture records in order already
    }
    if (!s) return run_to_event(ev);
    std::lock_guard<std::recursive_mutex> g(qmu);
    auto it = recorded.find(ev);
    if (it == recorded.end() || !it->second.first) return; // never recorded, or on the legacy stream: done
    stream_queue &sq = queues[s];
    sq.q.push_back(queued{sq.next++, {}, it->second.first, it->second.second});
}

void rl_emu_stream_forget(cudaStream_t s) {
    if (!defer()) return;
    std::lock_guard<std::recursive_mutex> g(qmu);
    run_until(s, UINT64_MAX);
    queues.erase(s);
}

cudaError_t rl_emu_capture_unsafe(cudaStream_t s) {
    std::lock_guard<std::mutex> g(mu);
    capture *c = capture_of(s);
    return spoil(c ? c : restricting_capture(), cudaErrorStreamCaptureUnsupported);
}

cudaError_t rl_emu_capture_copy(cudaStream_t s, bool pageable) {
    std::lock_guard<std::mutex> g(mu);
    return spoil(pageable ? capture_of(s) : nullptr, cudaErrorStreamCaptureUnsupported);
}

void rl_emu_capture_fail(cudaStream_t s, cudaError_t err) {
    std::lock_guard<std::mutex> g(mu);
    spoil(capture_of(s), err);
}

cudaError_t rl_emu_event_record(cudaEvent_t ev, cudaStream_t s) {
    bool captured;
    {
        std::lock_guard<std::mutex> g(mu);
        captured = captures.count(s);
        if (captured)
            captured_events.insert(ev);
        else
            captured_events.erase(ev);
    }
    if (defer() && !captured) {
        std::lock_guard<std::recursive_mutex> g(qmu);
        recorded[ev] = {s, s ? queues[s].next - 1 : 0};
    }
    return cudaSuccess;
}

cudaError_t rl_emu_event_usable(cudaEvent_t ev) {
    {
        std::lock_guard<std::mutex> g(mu);
        if (captured_events.count(ev)) return cudaErrorCapturedEvent;
        // an event wait or query is an unsafe call like any other
        if (cudaError_t c = spoil(restricting_capture(), cudaErrorStreamCaptureUnsupported)) return c;
    }
    if (defer()) run_to_event(ev);
    return cudaSuccess;
}

extern "C" {
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    if (!s) return cudaErrorStreamCaptureImplicit; // the legacy stream cannot capture
    std::lock_guard<std::mutex> g(mu);
    if (captures.count(s)) return cudaErrorIllegalState;
    capture &c = captures[s];
    c.owner = std::this_thread::get_id(), c.mode = mode;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
    std::lock_guard<std::mutex> g(mu);
    auto it = captures.find(s);
    if (it == captures.end()) return cudaErrorIllegalState;
    if (it->second.mode != cudaStreamCaptureModeRelaxed &&
        it->second.owner != std::this_thread::get_id())
        return cudaErrorStreamCaptureWrongThread;
    cudaError_t inv = it->second.invalid;
    *graph = nullptr;
    if (inv == cudaSuccess) *graph = new CUgraph_st{std::move(it->second.ops)};
    captures.erase(it);
    return inv == cudaSuccess ? cudaSuccess : cudaErrorStreamCaptureInvalidated;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *st) {
    std::lock_guard<std::mutex> g(mu);
    auto it = captures.find(s);
    *st = it == captures.end()                 ? cudaStreamCaptureStatusNone
          : it->second.invalid == cudaSuccess ? cudaStreamCaptureStatusActive
                                               : cudaStreamCaptureStatusInvalidated;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long) {
    if (!graph) return cudaErrorInvalidValue;
    *exec = new CUgraphExec_st{graph->ops};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    if (!exec) return cudaErrorInvalidValue;
    {
        std::lock_guard<std::mutex> g(mu);
        if (captures.count(s)) return cudaErrorStreamCaptureUnsupported; // no nested graphs here
    }
    // a copy: queued (RL_EMU_DEFER), it may run after the exec is destroyed
    auto ops = std::make_shared<const std::vector<std::function<void()>>>(exec->ops);
    rl_emu_enqueue(s, [ops] {
        for (const auto &op : *ops) op();
    });
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}
}
