// Host stand-ins for the CUDA runtime and cuBLASLt calls kernels/ makes, for
// the emulated build (make test-gpu-emu): "device" memory is host memory,
// every operation completes when called (streams and events are in order
// trivially) unless its stream is capturing a CUDA graph (fake_graph.cpp:
// then it runs at each replay) or RL_EMU_DEFER=1 keeps it queued until
// something needs it (fake_graph.cpp: so a missing event wait between two
// streams shows), kernels run through tests/gpu/emu/emu.cpp. There are
// RL_EMU_DEVICES devices (default 1), alike; each host thread has its
// current one and every allocation remembers its device (the fake NCCL of
// fake_nccl.cpp checks buffers against its communicator's device). Kernels
// of all devices take turns on the one fiber scheduler.
//
// The device it reports is one architecture, RL_EMU_SM=80|86|89|90 (default
// 90), with that architecture's limits (CUDA C++ Programming Guide,
// "Technical Specifications per Compute Capability"); the limits are
// enforced as the hardware does: cudaFuncSetAttribute(MaxDynamicShared-
// MemorySize) above the opt-in maximum and a launch with more dynamic
// shared memory than the kernel's limit (48 KiB unless raised) fail with
// cudaErrorInvalidValue, reported by the next cudaGetLastError. So code that
// fits one GPU and not another fails here under the other's RL_EMU_SM.
//
// cublasLtMatmul is implemented from its documented semantics -- column-
// major D = alpha op(A) op(B) + beta C, op from the descriptor's TRANSA /
// TRANSB, shapes and leading dimensions from the layouts -- in fp32 over
// bf16 products, rounding to the output type. It refuses a layout whose
// shape disagrees with the product (CUBLAS_STATUS_INVALID_VALUE), so a
// wrong row-/column-major mapping in kernels/gpu_gemm.cu fails loudly here.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "tests/gpu/emu/emu.h"

namespace {
float ld_elem(const void *p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}
void st_elem(void *p, cudaDataType_t t, size_t i, float v) {
    if (t == CUDA_R_32F)
        ((float *)p)[i] = v;
    else
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
}
// The emulated devices: RL_EMU_DEVICES of them (default 1; the two-rank
// NCCL checks of tests/gpu/test_gpu_train.c ask for 2), all of the one
// architecture below, and each host thread's current device, as the
// runtime keeps it (per thread, 0 until cudaSetDevice). Read at every call,
// so a test may set the variable before it starts its ranks.
int device_count() {
    const char *v = getenv("RL_EMU_DEVICES");
    int n = v && *v ? atoi(v) : 1;
    return n >= 1 && n <= 16 ? n : 1;
}
thread_local int current_device = 0;

// Which "device" and pinned allocations exist, and on which device, so
// cudaPointerGetAttributes classifies pointers as the real runtime does
// (pkg/comm/nccl.c stages host buffers and refuses them elsewhere; the fake
// NCCL rejects host memory and another device's memory, as NCCL would fault
// on them). The DDP communication thread calls in too: locked.
struct alloc_info {
    size_t bytes;
    cudaMemoryType type;
    int device; // current at allocation, as the runtime records it
};
std::mutex alloc_mu;
std::map<const char *, alloc_info> allocs;
// Each emulated device's memory: RL_EMU_MEM bytes (a K, M or G suffix
// multiplies; default 80G, an H100's), read at every call as
// RL_EMU_DEVICES is. cudaMalloc past it fails as the real one does, and
// cudaMemGetInfo says what is left, so code that sizes itself by the
// device can be tested under a cap (the CUDA context's own share is not
// modelled).
size_t device_mem() {
    const char *v = getenv("RL_EMU_MEM");
    if (!v || !*v) return (size_t)80 << 30;
    char *end;
    double x = strtod(v, &end);
    double k = *end == 'K' ? 1024.0 : *end == 'M' ? 1048576.0 : *end == 'G' ? 1073741824.0 : 1.0;
    return x > 0 ? (size_t)(x * k) : (size_t)80 << 30;
}
// device bytes allocated on device d; the caller holds alloc_mu
size_t device_used(int d) {
    size_t n = 0;
    for (const auto &a : allocs)
        if (a.second.type == cudaMemoryTypeDevice && a.second.device == d) n += a.second.bytes;
    return n;
}
void track(void *p, size_t n, cudaMemoryType t) {
    std::lock_guard<std::mutex> g(alloc_mu);
    allocs[(const char *)p] = {n, t, current_device};
}
void untrack(void *p) {
    std::lock_guard<std::mutex> g(alloc_mu);
    allocs.erase((const char *)p);
}
// One row per RL_EMU_SM value: the limits code here may ask for. sm_86
// and sm_89 (A10, L4, L40S) allow 99 KB of shared memory per block, sm_80
// 163 KB, sm_90 227 KB; SM counts of the A10, A100, L40S and H100.
struct emu_arch {
    int sm, smem_optin, smem_per_sm, threads_per_sm, sms;
    const char *like;
};
const emu_arch archs[] = {
    {80, 166912, 167936, 2048, 108, "A100"},
    {86, 101376, 102400, 1536, 72, "A10"},
    {89, 101376, 102400, 1536, 142, "L40S"},
    {90, 232448, 233472, 2048, 132, "H100"},
};
constexpr int SMEM_DEFAULT = 48 * 1024; // a kernel's dynamic limit until raised

struct emu_device {
    emu_arch arch;
    std::mutex mu;
    std::map<const void *, int> max_dynamic_smem; // cudaFuncSetAttribute's, per kernel
};
emu_device &device() {
    static emu_device *d = [] {
        const char *v = getenv("RL_EMU_SM");
        int sm = v && *v ? atoi(v) : 90;
        for (const emu_arch &a : archs)
            if (a.sm == sm) {
                emu_device *n = new emu_device;
                n->arch = a;
                return n;
            }
        fprintf(stderr, "emu: RL_EMU_SM=%s is not one of 80, 86, 89, 90\n", v);
        exit(2);
    }();
    return *d;
}
thread_local cudaError_t last_error = cudaSuccess; // as the runtime's, per host thread

struct fake_desc {
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
};
struct fake_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
} // namespace

extern "C" {

// ---- runtime -------------------------------------------------------------------------
cudaError_t cudaGetDeviceCount(int *n) {
    *n = device_count();
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    const emu_arch &a = device().arch;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "host emulation (tests/gpu/emu) of sm_%d, like the %s", a.sm,
             a.like);
    p->major = a.sm / 10, p->minor = a.sm % 10;
    p->totalGlobalMem = device_mem(); // as cudaMemGetInfo says
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = (size_t)a.smem_optin;
    p->sharedMemPerMultiprocessor = (size_t)a.smem_per_sm;
    p->regsPerBlock = p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsPerMultiProcessor = a.threads_per_sm;
    p->multiProcessorCount = a.sms;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = current_device;
    return cudaSuccess;
}
// no PCI device (and so no NUMA node) behind an emulated GPU
cudaError_t cudaDeviceGetPCIBusId(char *, int, int) { return cudaErrorNotSupported; }
// The attributes kernels/ asks for; any other fails loudly rather than
// answering a plausible 0.
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int) {
    const emu_arch &a = device().arch;
    switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = a.smem_optin; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = SMEM_DEFAULT; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = a.smem_per_sm; break;
    case cudaDevAttrComputeCapabilityMajor: *v = a.sm / 10; break;
    case cudaDevAttrComputeCapabilityMinor: *v = a.sm % 10; break;
    case cudaDevAttrMultiProcessorCount: *v = a.sms; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = a.threads_per_sm; break;
    default:
        fprintf(stderr, "emu: cudaDeviceGetAttribute(%d) is not emulated; add it to fake_cuda.cpp\n",
                (int)attr);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *fn, cudaFuncAttribute attr, int v) {
    emu_device &d = device();
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess; // carveout hints
    if (v < 0 || v > d.arch.smem_optin) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> g(d.mu);
    d.max_dynamic_smem[fn] = v;
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    cudaError_t r = last_error;
    last_error = cudaSuccess;
    return r;
}
const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    default: return "cudaError (emulated)";
    }
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorStreamCaptureUnsupported:
        return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
        return "operation failed due to a previous error during capture";
    case cudaErrorCapturedEvent:
        return "operation not permitted on an event last recorded in a capturing stream";
    default: return "error (emulated)";
    }
}
static cudaError_t alloc(void **p, size_t n, cudaMemoryType t) {
    *p = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0xa5, n); // not zero: cudaMalloc gives garbage, code must not rely on zeros
    track(*p, n, t);
    return cudaSuccess;
}
// A call that synchronizes s (NULL: the device): refused under capture, and
// (RL_EMU_DEFER) what is queued runs first.
static cudaError_t run_stream(cudaStream_t s) {
    cudaError_t c = rl_emu_capture_unsafe(s);
    if (c == cudaSuccess) rl_emu_stream_run(s);
    return c;
}
cudaError_t cudaMalloc(void **p, size_t n) {
    if (cudaError_t c = rl_emu_capture_unsafe(nullptr)) return c;
    {
        std::lock_guard<std::mutex> g(alloc_mu);
        if (device_used(current_device) + n > device_mem()) {
            *p = nullptr;
            return cudaErrorMemoryAllocation;
        }
    }
    return alloc(p, n, cudaMemoryTypeDevice);
}
cudaError_t cudaFree(void *p) {
    if (cudaError_t c = run_stream(nullptr)) return c; // synchronizes: queued work on p runs first
    untrack(p);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) { return alloc(p, n, cudaMemoryTypeHost); }
cudaError_t cudaMallocHost(void **p, size_t n) { return alloc(p, n, cudaMemoryTypeHost); }
cudaError_t cudaFreeHost(void *p) { return cudaFree(p); }
// pinned in place: async copies from the range count as pinned until unregistered
cudaError_t cudaHostRegister(void *p, size_t n, unsigned) {
    if (!p || !n) return cudaErrorInvalidValue;
    track(p, n, cudaMemoryTypeHost);
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p) {
    rl_emu_stream_run(nullptr);
    untrack(p);
    return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p) {
    memset(a, 0, sizeof *a);
    a->type = cudaMemoryTypeUnregistered;
    std::lock_guard<std::mutex> g(alloc_mu);
    auto it = allocs.upper_bound((const char *)p);
    if (it != allocs.begin()) {
        --it;
        if ((const char *)p < it->first + it->second.bytes) {
            a->type = it->second.type;
            a->device = it->second.device;
            a->devicePointer = a->type == cudaMemoryTypeDevice ? (void *)p : nullptr;
            a->hostPointer = a->type == cudaMemoryTypeHost ? (void *)p : nullptr;
        }
    }
    return cudaSuccess;
}
// everything ran when queued (RL_EMU_DEFER: runs when asked for, fake_graph.cpp)
cudaError_t cudaStreamQuery(cudaStream_t s) { return run_stream(s); }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned) {
    rl_emu_stream_wait(s, ev);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
    if (cudaError_t c = run_stream(nullptr)) return c;
    memmove(d, s, n);
    return cudaSuccess;
}
static bool pageable(const void *p) {
    cudaPointerAttributes a;
    return cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeUnregistered;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t st) {
    bool sync = pageable(d) || pageable(s);
    if (cudaError_t c = rl_emu_capture_copy(st, sync)) return c;
    if (sync) { // the runtime's copy to or from pageable memory is done when it returns
        rl_emu_stream_run(st);
        memmove(d, s, n);
        return cudaSuccess;
    }
    rl_emu_enqueue(st, [=] { memmove(d, s, n); });
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
    rl_emu_enqueue(st, [=] { memset(d, v, n); });
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    *s = (cudaStream_t)malloc(1);
    return cudaSuccess;
}
// Priorities as CUDA reports them: lower numbers are higher priority
// (0 least, -5 greatest on the GPUs of this era); streams run when queued.
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    *least = 0, *greatest = -5;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority) {
    if (priority < -5 || priority > 0) return cudaErrorInvalidValue;
    return cudaStreamCreateWithFlags(s, flags);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    rl_emu_stream_forget(s); // its work still runs, as on a GPU
    free((void *)s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return run_stream(s); }
cudaError_t cudaDeviceSynchronize(void) { return run_stream(nullptr); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
    *e = (cudaEvent_t)malloc(1);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    rl_emu_event_record(e, nullptr); // forgotten: a later event at this address starts unrecorded
    free((void *)e);
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) { return rl_emu_event_record(ev, s); }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t) {
    *ms = 1.0f; // no clock on an emulated device: a fixed, plausible number
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= device_count()) return cudaErrorInvalidDevice;
    current_device = d;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
    std::lock_guard<std::mutex> g(alloc_mu);
    size_t cap = device_mem(), used = device_used(current_device);
    *free_b = used < cap ? cap - used : 0, *total = cap;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
    *v = 0;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) { return rl_emu_event_usable(ev); }
cudaError_t cudaEventQuery(cudaEvent_t ev) { return rl_emu_event_usable(ev); } // done when queued

// ---- cuBLASLt -------------------------------------------------------------------------
const char *cublasLtGetStatusName(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_(emulated error)";
}
const char *cublasLtGetStatusString(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "success" : "error";
}
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = (cublasLtHandle_t)malloc(1);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    free((void *)h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct,
                                        cudaDataType_t st) {
    if (ct != CUBLAS_COMPUTE_32F || st != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = (cublasLtMatmulDesc_t) new fake_desc;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete (fake_desc *)d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void *buf,
                                              size_t n) {
    fake_desc *f = (fake_desc *)d;
    if (n != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
    int32_t sms;
    if (a == CUBLASLT_MATMUL_DESC_TRANSA)
        memcpy(&f->ta, buf, n);
    else if (a == CUBLASLT_MATMUL_DESC_TRANSB)
        memcpy(&f->tb, buf, n);
    else if (a == CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET) // int32_t, > 0 (a hint: nothing to emulate)
        return memcpy(&sms, buf, n), sms > 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    else
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if ((int64_t)rows > ld) return CUBLAS_STATUS_INVALID_VALUE; // column-major: ld >= rows
    *l = (cublasLtMatrixLayout_t) new fake_layout{t, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete (fake_layout *)l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = (cublasLtMatmulPreference_t)malloc(1);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    free((void *)p);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t,
                                                    const void *, size_t) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t *res, int *count) {
    // Up to three "algorithms" (all the same reference product here), so the
    // caller's choice among several runs in emulation too.
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    *count = requested < 3 ? requested : 3;
    memset(res, 0, sizeof *res * (size_t)*count);
    for (int i = 0; i < *count; i++) res[i].state = CUBLAS_STATUS_SUCCESS;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                              cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t st) {
    // descriptors and alpha/beta (host pointer mode) are read now; the
    // product runs now or at each replay of a captured graph
    const fake_desc f = *(const fake_desc *)desc;
    const fake_layout la = *(const fake_layout *)Adesc, lb = *(const fake_layout *)Bdesc;
    const fake_layout lc = *(const fake_layout *)Cdesc, ld = *(const fake_layout *)Ddesc;
    uint64_t m = ld.rows, n = ld.cols;
    uint64_t am = f.ta == CUBLAS_OP_N ? la.rows : la.cols, k = f.ta == CUBLAS_OP_N ? la.cols : la.rows;
    uint64_t bk = f.tb == CUBLAS_OP_N ? lb.rows : lb.cols, bn = f.tb == CUBLAS_OP_N ? lb.cols : lb.rows;
    if (am != m || bk != k || bn != n || lc.rows != m || lc.cols != n || lc.type != ld.type) {
        fprintf(stderr,
                "emu cublasLtMatmul: shapes disagree: D %llux%llu, op(A) %llux%llu, op(B) "
                "%llux%llu, C %llux%llu\n",
                (unsigned long long)m, (unsigned long long)n, (unsigned long long)am,
                (unsigned long long)k, (unsigned long long)bk, (unsigned long long)bn,
                (unsigned long long)lc.rows, (unsigned long long)lc.cols);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    float al = *(const float *)alpha, be = *(const float *)beta;
    rl_emu_enqueue(st, [=] {
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                float acc = 0.0f;
                for (uint64_t p = 0; p < k; p++) {
                    float a = f.ta == CUBLAS_OP_N ? ld_elem(A, la.type, i + p * la.ld)
                                                  : ld_elem(A, la.type, p + i * la.ld);
                    float b = f.tb == CUBLAS_OP_N ? ld_elem(B, lb.type, p + j * lb.ld)
                                                  : ld_elem(B, lb.type, j + p * lb.ld);
                    acc += a * b;
                }
                float c = be != 0.0f ? ld_elem(C, lc.type, i + j * lc.ld) : 0.0f;
                st_elem(D, ld.type, i + j * ld.ld, al * acc + be * c);
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"

// ---- launches (RL_LAUNCH in the emulated build) ----------------------------------------
// What the hardware refuses is refused here, before anything runs: a grid
// or block beyond the limits (cudaErrorInvalidConfiguration), dynamic
// shared memory above the kernel's limit (cudaErrorInvalidValue).
void rl_emu_launch_kernel(const void *kernel, dim3 grid, dim3 block, size_t smem_bytes,
                          cudaStream_t stream, const std::function<void()> &fn) {
    if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.y > 65535 || grid.z > 65535 ||
        block.x * block.y * block.z > 1024 || block.x * block.y * block.z < 1) {
        last_error = cudaErrorInvalidConfiguration;
        rl_emu_capture_fail(stream, last_error);
        return;
    }
    emu_device &d = device();
    int limit = SMEM_DEFAULT;
    {
        std::lock_guard<std::mutex> g(d.mu);
        auto it = d.max_dynamic_smem.find(kernel);
        if (it != d.max_dynamic_smem.end()) limit = it->second;
    }
    if (smem_bytes > (size_t)limit) {
        last_error = cudaErrorInvalidValue;
        rl_emu_capture_fail(stream, last_error);
        return;
    }
    rl_emu_enqueue(stream, [=] { rl_emu_launch(grid, block, smem_bytes, fn); });
}

void rl_emu_set_smem_optin(int bytes) { device().arch.smem_optin = bytes; }
