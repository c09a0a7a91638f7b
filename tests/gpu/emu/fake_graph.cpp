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
#include <cuda_runtime.h>

#include <map>
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
    fn();
    return false;
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
    std::lock_guard<std::mutex> g(mu);
    if (captures.count(s))
        captured_events.insert(ev);
    else
        captured_events.erase(ev);
    return cudaSuccess;
}

cudaError_t rl_emu_event_usable(cudaEvent_t ev) {
    std::lock_guard<std::mutex> g(mu);
    if (captured_events.count(ev)) return cudaErrorCapturedEvent;
    // an event wait or query is an unsafe call like any other
    return spoil(restricting_capture(), cudaErrorStreamCaptureUnsupported);
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
    for (const auto &op : exec->ops) op();
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
