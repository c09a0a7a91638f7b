// The kernels of kernels/attention_kernels.cuh, gemm_kernels.cuh and model_kernels.cuh
// -- the very source the GPU build compiles -- run on the host and checked
// against the CPU reference of pkg/model, so their index arithmetic
// (fragment layouts, tiles, masks, GQA head mapping, transposed tiles,
// padding of head_dim, grid-stride loops, reduction trees, parameter
// regions) is tested on machines without a GPU. `make test-gpu-emu` builds
// and runs it; the cuBLASLt GEMMs and the model's orchestration are left
// to tests/gpu/test_gpu.c on a GPU.
//
// How: tests/gpu/emu/ runs every CUDA thread of a block as a fiber;
// __syncthreads is a barrier over the block, __shfl_xor_sync and mma.sync
// are barriers over the warp around an exchange. mma is emulated from the
// PTX ISA's fragment layouts of m16n8k16 (the same tables the kernels'
// comment gives, written out independently there: if the kernels and the
// emulator disagreed on a layout, the results would be wrong). Shared
// memory is poisoned with NaN bits before each block and every output
// before each launch, so a read of an unwritten element or an unwritten
// output shows.
//
// The argument picks a group: attention, runtime (the emulated runtime's
// stream capture), model; none runs all.
//
// What it cannot show: timing, races that the barriers' memory ordering
// hides, and the exact accumulation order of the tensor cores (the
// emulation sums in fp32 in k order); tests/gpu/test_gpu.c checks those
// kernels on a GPU.
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "tests/gpu/emu/emu.h" // the host runtime: fibers, barriers, mma

#include "kernels/attention_kernels.cuh"
#include "kernels/gemm_kernels.cuh"
#include "kernels/gpu_internal.cuh" // the launchers' cost functions
#include "kernels/model_kernels.cuh"

extern "C" {
#include "model/cpu.h"
#include "train/train.h"
}
// gpu_model.cu's host-side grouping for the embedding backward
int rl_gpu_group_tokens(const int32_t *tok, int N, int V, int32_t *cnt, int32_t *uniq, int32_t *seg,
                        int32_t *pos);
int rl_gpu_attn_prepare(int hd, rl_err *e); // gpu_attention.cu

// Every thread of every block runs the kernel (sync only documents which
// kernels use barriers: the emulator handles both kinds alike).
template <class F>
static void launch(unsigned gx, unsigned gy, unsigned threads, F fn, bool sync = true) {
    (void)sync;
    rl_emu_launch(dim3(gx, gy), dim3(threads), 227 * 1024, fn);
}

static uint64_t rng_state = 88172645463325252ull;
static double randn() {
    auto u = [] {
        rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
        return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
    };
    return sqrt(-2 * log(u())) * cos(6.283185307179586 * u());
}

static int n_pass, n_fail;

// A check with its own measure: one line, counted.
static bool verdict(bool ok, const char *what, const char *fmt, ...) {
    char detail[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    printf("%-4s %-52s %s\n", ok ? "ok" : "FAIL", what, detail);
    (ok ? n_pass : n_fail)++;
    return ok;
}

static bool check(const char *what, const std::vector<float> &got, const std::vector<double> &ref,
                  double tol) {
    double num = 0, den = 0;
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); i++) {
        if (!std::isfinite(got[i])) {
            bad++;
            continue;
        }
        num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    return verdict(bad == 0 && rel <= tol, what, "rel %.2e (tol %.0e)%s", rel, tol,
                   bad ? " NON-FINITE VALUES" : "");
}

// ---- test data -------------------------------------------------------------------------
static std::vector<float> randv(size_t n, double std, bool bf) {
    std::vector<float> x(n);
    for (auto &e : x) {
        e = (float)(randn() * std);
        if (bf) e = __bfloat162float(__float2bfloat16_rn(e));
    }
    return x;
}
static std::vector<bf16> to_bf(const std::vector<float> &x) {
    std::vector<bf16> y(x.size());
    for (size_t i = 0; i < x.size(); i++) y[i] = __float2bfloat16_rn(x[i]);
    return y;
}
static std::vector<float> from_bf(const std::vector<bf16> &x) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); i++) y[i] = __bfloat162float(x[i]);
    return y;
}
static std::vector<double> tod(const std::vector<float> &x) {
    return std::vector<double>(x.begin(), x.end());
}
template <class T> static void poison(std::vector<T> &x) {
    memset((void *)x.data(), 0xff, x.size() * sizeof(T));
}
static std::vector<int32_t> rand_tok(int n, int V) {
    std::vector<int32_t> t(n);
    for (auto &e : t) e = (int32_t)(fabs(randn()) * 1e6) % V;
    return t;
}
static unsigned cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

// ---- attention ------------------------------------------------------------------------

// The emulated runtime refuses launches as the hardware of the emulated
// architecture would (tests/gpu/emu/fake_cuda.cpp), so a kernel whose
// shared memory fits one GPU and not another fails here too.
static void emu_launch_limits() {
    static const char kernel = 0; // any address names a kernel
    const void *k = &kernel;
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    int runs = 0;
    auto try_launch = [&](size_t smem) {
        rl_emu_launch_kernel(k, dim3(1), dim3(32), smem, nullptr, [&] { runs += threadIdx.x == 0; });
        return cudaGetLastError();
    };
    char what[64];
    snprintf(what, sizeof what, "emu launch limits of sm_%d%d", p.major, p.minor);
    bool ok = try_launch(48 * 1024) == cudaSuccess && runs == 1 &&
              try_launch(48 * 1024 + 16) == cudaErrorInvalidValue && runs == 1 &&
              cudaGetLastError() == cudaSuccess && // reported once, as by the runtime
              cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, optin + 1) ==
                  cudaErrorInvalidValue &&
              cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, optin) ==
                  cudaSuccess &&
              try_launch((size_t)optin) == cudaSuccess && runs == 2 &&
              try_launch((size_t)optin + 16) == cudaErrorInvalidValue && runs == 2;
    verdict(ok, what, "dynamic shared memory: 48 KiB until raised, at most %d B", optin);
}

// Stream capture keeps the real runtime's rules (tests/gpu/emu/
// fake_graph.cpp), which the model's CUDA graphs rely on: nothing runs while
// capturing; a kernel's arguments are the values at capture, a copy from
// host memory reads it at each replay; a sync inside a capture fails and
// spoils it; an event recorded inside one is no host event; pageable
// memory cannot be captured.
static void graph_probe(int v, int *out) {
    if (threadIdx.x == 0) *out = v;
}
static void emu_graph_capture() {
    cudaStream_t s;
    cudaEvent_t ev;
    int *dev, *pin, arg = 1;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEventCreate(&ev);
    cudaMalloc((void **)&dev, 2 * sizeof(int));
    cudaMallocHost((void **)&pin, sizeof(int));
    std::vector<int> pageable(1, 9);
    dev[0] = dev[1] = 0, *pin = 5;
    cudaGraph_t g = nullptr;
    cudaGraphExec_t x = nullptr;
    bool ok = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    rl_emu_launch_kernel(reinterpret_cast<const void *>(&graph_probe), dim3(1), dim3(32), 0, s,
                         rl_emu_bind(&graph_probe, arg, dev));
    ok = ok && cudaMemcpyAsync(dev + 1, pin, sizeof(int), cudaMemcpyHostToDevice, s) == cudaSuccess;
    ok = ok && dev[0] == 0 && dev[1] == 0; // nothing ran
    ok = ok && cudaStreamEndCapture(s, &g) == cudaSuccess && cudaGraphInstantiate(&x, g, 0) == 0;
    arg = 2, *pin = 7;
    ok = ok && cudaGraphLaunch(x, s) == cudaSuccess && dev[0] == 1 && dev[1] == 7;
    cudaGraphExecDestroy(x), cudaGraphDestroy(g);
    // a sync inside a capture
    bool sync = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess &&
                cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported &&
                cudaMalloc((void **)&x, 4) == cudaErrorStreamCaptureUnsupported &&
                cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && !g;
    // an event recorded inside a capture, then outside
    bool event = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess &&
                 cudaEventRecord(ev, s) == cudaSuccess && cudaStreamEndCapture(s, &g) == 0 &&
                 cudaEventSynchronize(ev) == cudaErrorCapturedEvent &&
                 cudaEventRecord(ev, s) == cudaSuccess && cudaEventSynchronize(ev) == cudaSuccess;
    cudaGraphDestroy(g);
    // pageable memory
    bool page = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess &&
                cudaMemcpyAsync(dev, pageable.data(), sizeof(int), cudaMemcpyHostToDevice, s) ==
                    cudaErrorStreamCaptureUnsupported &&
                cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated;
    verdict(ok && sync && event && page, "emu stream capture: the runtime's rules",
            "replay %s, sync in capture %s, captured event %s, pageable copy %s",
            ok ? "ok" : "wrong", sync ? "refused" : "wrong", event ? "refused" : "wrong",
            page ? "refused" : "wrong");
    cudaFree(dev), cudaFreeHost(pin), cudaEventDestroy(ev), cudaStreamDestroy(s);
}

// When no variant of a kernel fits the device's shared memory, the error
// names the head dim and the limit. Run first, with a limit below even the
// first kernel's smallest variant: the launchers remember what they chose
// per device, and must not remember anything from this.
static void emu_attn_no_fit() {
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    rl_emu_set_smem_optin(40 * 1024);
    rl_err e = {};
    int rc = rl_gpu_attn_prepare(128, &e);
    rl_emu_set_smem_optin(optin);
    bool ok = rc == RL_EINPUT && strstr(e.msg, "head_dim 128") && strstr(e.msg, "allows 40960");
    verdict(ok, "emu attention: nothing fits 40 KiB: error", "\"%s\"", e.msg);
    rl_err e2 = {};
    rc = rl_gpu_attn_prepare(128, &e2);
    verdict(rc == RL_OK, "emu attention: head_dim 128 fits this device", "%s",
            rc ? e2.msg : "prepared");
}

// pkg/model's attention in double on the values the kernels saw; with a
// RoPE table (tab != nullptr, P positions) q and k are rotated first, and
// dq, dk rotated back: the chain rule through the (orthogonal) rotation.
struct attn_ref {
    std::vector<double> out, dq, dk, dv;
};
static attn_ref attn_reference(const std::vector<float> &q, const std::vector<float> &k,
                               const std::vector<float> &v, const std::vector<float> &dout,
                               const double *tab, int P, int B, int T, int H, int KV, int hd) {
    std::vector<double> qr(q.begin(), q.end()), kr(k.begin(), k.end()), vr(v.begin(), v.end());
    std::vector<double> dor(dout.begin(), dout.end()), att((size_t)B * H * T * T),
        scr((size_t)B * KV * T * T);
    attn_ref r{std::vector<double>(q.size()), std::vector<double>(q.size()),
               std::vector<double>(k.size()), std::vector<double>(k.size())};
    if (tab) {
        rl_cpu_rope_fwd_f64(qr.data(), tab, B, T, H, hd, P);
        rl_cpu_rope_fwd_f64(kr.data(), tab, B, T, KV, hd, P);
    }
    rl_cpu_attn_fwd_f64(r.out.data(), att.data(), qr.data(), kr.data(), vr.data(), B, T, H, KV, hd);
    rl_cpu_attn_bwd_f64(r.dq.data(), r.dk.data(), r.dv.data(), scr.data(), dor.data(), att.data(),
                        qr.data(), kr.data(), vr.data(), B, T, H, KV, hd);
    if (tab) {
        rl_cpu_rope_bwd_f64(r.dq.data(), tab, B, T, H, hd, P);
        rl_cpu_rope_bwd_f64(r.dk.data(), tab, B, T, KV, hd, P);
    }
    return r;
}

// Each kernel in both instances: NB = 2 (double-buffered streaming tiles)
// and 1 (the fallback for devices with less shared memory per block); with
// RoPE (rope: q and k rotated by rope_kernel first, dq and dk rotated back
// after, as the model does) and without.
template <int HD, int NB>
static void run_case(int B, int T, int H, int KV, int hd, int vec, bool rope) {
    int N = B * T, qd = H * hd, kvd = KV * hd, C3 = qd + 2 * kvd;
    int P = T + 5; // table rows beyond T: the sin half starts at P, not T
    std::vector<float> q((size_t)N * qd), k((size_t)N * kvd), v((size_t)N * kvd),
        dout((size_t)N * qd);
    auto rnd = [](std::vector<float> &x) {
        for (auto &e : x) e = __bfloat162float(__float2bfloat16_rn((float)randn()));
    };
    rnd(q), rnd(k), rnd(v), rnd(dout);
    std::vector<bf16> qkv((size_t)N * C3), d_out((size_t)N * qd), d_dout((size_t)N * qd),
        d_dqkv((size_t)N * C3);
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < qd; j++)
            qkv[(size_t)n * C3 + j] = __float2bfloat16_rn(q[(size_t)n * qd + j]);
        for (int j = 0; j < kvd; j++) {
            qkv[(size_t)n * C3 + qd + j] = __float2bfloat16_rn(k[(size_t)n * kvd + j]);
            qkv[(size_t)n * C3 + qd + kvd + j] = __float2bfloat16_rn(v[(size_t)n * kvd + j]);
        }
        for (int j = 0; j < qd; j++)
            d_dout[(size_t)n * qd + j] = __float2bfloat16_rn(dout[(size_t)n * qd + j]);
    }
    rl_model_config c;
    rl_model_config_default(&c);
    c.hidden_size = H * hd, c.num_attention_heads = H, c.num_key_value_heads = KV,
    c.max_position_embeddings = P;
    std::vector<float> tab32((size_t)P * hd);
    std::vector<double> tab64((size_t)P * hd);
    rl_cpu_rope_table_f32(&c, tab32.data());
    rl_cpu_rope_table_f64(&c, tab64.data());
    // rope_kernel in place on q|k of rows of C3 (inverse: the transpose)
    auto rotate = [&](std::vector<bf16> &x, int inverse) {
        launch(
            cdiv((size_t)N * (H + KV) * (hd / 2), 256), 1, 256,
            [&] {
                rope_kernel<1>(x.data(), tab32.data(), tab32.data() + (size_t)P * (hd / 2), N, T,
                               H + KV, hd, C3, inverse);
            },
            false);
    };
    if (rope) rotate(qkv, 0);
    // the backward's inverse rotation: by the kernels as they store dq and dk
    // where the head dim is unpadded (the model's choice), else the pass
    const bool at_store = rope && hd == HD;
    const attn_rope rp = {at_store ? tab32.data() : nullptr,
                          at_store ? tab32.data() + (size_t)P * (hd / 2) : nullptr};

    std::vector<float> lse((size_t)N * H), dsum((size_t)N * H);
    poison(d_out), poison(d_dqkv), poison(lse), poison(dsum);
    float scale = 1.0f / sqrtf((float)hd), sl2 = scale * 1.4426950408889634f;
    // the shared memory the launcher gives each kernel: the emulator
    // poisons exactly that much
    auto tiled = [&](int kind, unsigned gx, const std::function<void()> &fn) {
        unsigned rows = (unsigned)attn_rows(kind), gy = ((unsigned)T + rows - 1) / rows;
        rl_emu_launch(dim3(gx, gy), dim3(attn_threads(kind)), attn_smem_bytes(kind, HD, NB), fn);
    };
    tiled(ATT_FWD, (unsigned)(B * H), [&] {
        attn_fwd_kernel<HD, NB>(d_out.data(), lse.data(), qkv.data(), T, H, KV, hd, sl2, vec);
    });
    launch((unsigned)((N * H + 7) / 8), 1, 256, [&] {
        attn_dsum_kernel(dsum.data(), nullptr, d_dout.data(), d_out.data(), N, T, H, hd);
    });
    tiled(ATT_DKDV, (unsigned)(B * KV), [&] {
        attn_bwd_dkdv_kernel<HD, NB>(d_dqkv.data(), nullptr, d_dout.data(), qkv.data(),
                                     lse.data(), dsum.data(), T, H, KV, hd, sl2, scale, vec, rp);
    });
    tiled(ATT_DQ, (unsigned)(B * H), [&] {
        attn_bwd_dq_kernel<HD, NB>(d_dqkv.data(), d_dout.data(), qkv.data(), lse.data(),
                                   dsum.data(), T, H, KV, hd, sl2, scale, vec, rp);
    });
    if (rope && !at_store) rotate(d_dqkv, 1);

    attn_ref r = attn_reference(q, k, v, dout, rope ? tab64.data() : nullptr, P, B, T, H, KV, hd);
    std::vector<float> dq((size_t)N * qd), dk((size_t)N * kvd), dv((size_t)N * kvd);
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < qd; j++)
            dq[(size_t)n * qd + j] = __bfloat162float(d_dqkv[(size_t)n * C3 + j]);
        for (int j = 0; j < kvd; j++) {
            dk[(size_t)n * kvd + j] = __bfloat162float(d_dqkv[(size_t)n * C3 + qd + j]);
            dv[(size_t)n * kvd + j] = __bfloat162float(d_dqkv[(size_t)n * C3 + qd + kvd + j]);
        }
    }
    printf("emu attention B=%d T=%d H=%d KV=%d hd=%d%s%s, %d buffer%s\n", B, T, H, KV, hd,
           vec ? " vec" : "", at_store ? " rope (back at the store)" : rope ? " rope" : "", NB,
           NB > 1 ? "s" : "");
    check("  out", from_bf(d_out), r.out, 1e-2);
    check("  dq", dq, r.dq, 2e-2);
    check("  dk", dk, r.dk, 2e-2);
    check("  dv", dv, r.dv, 2e-2);

    // dQ accumulated by the dK/dV kernel's atomics, every launch's blocks
    // in reverse order (another order of the additions, as a GPU may take):
    // dK and dV bit for bit as above, dQ against the reference. The
    // accumulator starts poisoned: the D kernel must zero it.
    std::vector<bf16> a_dqkv((size_t)N * C3);
    std::vector<float> acc((size_t)N * qd), dsum2((size_t)N * H);
    poison(a_dqkv), poison(acc), poison(dsum2);
    rl_emu_set_block_order(true);
    launch((unsigned)((N * H + 7) / 8), 1, 256, [&] {
        attn_dsum_kernel(dsum2.data(), acc.data(), d_dout.data(), d_out.data(), N, T, H, hd);
    });
    tiled(ATT_DKDV, (unsigned)(B * KV), [&] {
        attn_bwd_dkdv_kernel<HD, NB>(a_dqkv.data(), acc.data(), d_dout.data(), qkv.data(),
                                     lse.data(), dsum2.data(), T, H, KV, hd, sl2, scale, vec, rp);
    });
    launch(
        (unsigned)cdiv((size_t)N * H * (hd / 2), 256), 1, 256,
        [&] { attn_dq_store_kernel(a_dqkv.data(), acc.data(), N, T, H, KV, hd, scale, rp); },
        false);
    rl_emu_set_block_order(false);
    if (rope && !at_store) rotate(a_dqkv, 1);
    std::vector<float> dq2((size_t)N * qd);
    size_t kv_differ = 0;
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < qd; j++)
            dq2[(size_t)n * qd + j] = __bfloat162float(a_dqkv[(size_t)n * C3 + j]);
        for (int j = qd; j < C3; j++)
            kv_differ += memcmp(&a_dqkv[(size_t)n * C3 + j], &d_dqkv[(size_t)n * C3 + j],
                                sizeof(bf16)) != 0;
    }
    check("  dq by atomics, blocks reversed", dq2, r.dq, 2e-2);
    verdict(kv_differ == 0, "  dk, dv the same bits with the dq accumulator", "%zu of %zu differ",
            kv_differ, (size_t)N * 2 * kvd);
}

// ---- the model's other kernels -----------------------------------------------------
template <int VW> static void emu_embed() {
    int N = 129, V = 13, D = 60;
    auto emb = randv((size_t)V * D, 1, true); // the bf16 compute copy's values
    auto emb16 = to_bf(emb);
    auto tok = rand_tok(N, V);
    std::vector<float> x0((size_t)N * D);
    poison(x0);
    launch(
        N, 1, 256, [&] { embed_fwd_kernel<VW>(x0.data(), emb16.data(), tok.data(), D); }, false);
    std::vector<double> ref((size_t)N * D);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < D; j++) ref[(size_t)n * D + j] = emb[(size_t)tok[n] * D + j];
    check(VW > 1 ? "emu embed fwd N=129 V=13 D=60 (x4)" : "emu embed fwd N=129 V=13 D=60", x0, ref,
          0);

    if (VW > 1) return; // the backward has no vector variant
    std::vector<int32_t> cnt(V + 1), uniq(N), seg(N + 1), pos(N);
    int U = rl_gpu_group_tokens(tok.data(), N, V, cnt.data(), uniq.data(), seg.data(), pos.data());
    for (int acc = 0; acc < 2; acc++) {
        auto demb = randv((size_t)V * D, 1, false), dres = randv((size_t)N * D, 1, false);
        std::vector<double> r2 = tod(demb);
        // written, not read, without accumulate: NaN in the batch's rows must not show
        for (int n = 0; !acc && n < N; n++)
            for (int j = 0; j < D; j++)
                demb[(size_t)tok[n] * D + j] = NAN, r2[(size_t)tok[n] * D + j] = 0;
        for (int n = 0; n < N; n++)
            for (int j = 0; j < D; j++) r2[(size_t)tok[n] * D + j] += dres[(size_t)n * D + j];
        // a block per possible id (V here), those past U returning at once
        const int32_t count = U;
        launch(
            V, cdiv(D, 256), 256,
            [&] {
                embed_bwd_kernel(demb.data(), dres.data(), uniq.data(), seg.data(), pos.data(),
                                 &count, D, acc);
            },
            false);
        check(acc ? "emu embed bwd (grouped by token) N=129 V=13 D=60 +="
                  : "emu embed bwd (grouped by token) N=129 V=13 D=60 =",
              demb, r2, 1e-6);
    }
}

template <int VW> static void emu_rmsnorm(int N, int D) {
    char name[96];
    auto x = randv((size_t)N * D, 2, false), w = randv(D, 0.2, false);
    for (auto &e : w) e = __bfloat162float(__float2bfloat16_rn(e + 1.0f)); // the bf16 copy's values
    auto w16 = to_bf(w);
    std::vector<bf16> out((size_t)N * D);
    std::vector<float> rstd(N);
    poison(out), poison(rstd);
    launch(cdiv(N, 8), 1, 256, [&] {
        rmsnorm_fwd_kernel<VW>(out.data(), rstd.data(), x.data(), w16.data(), N, D, 1e-5f);
    });
    auto xd = tod(x), wd = tod(w);
    std::vector<double> ro((size_t)N * D), rr(N);
    rl_cpu_rmsnorm_fwd_f64(ro.data(), rr.data(), xd.data(), wd.data(), N, D, 1e-5);
    snprintf(name, sizeof name, "emu rmsnorm fwd N=%d D=%d (x%d)", N, D, VW);
    check(name, from_bf(out), ro, 4e-3);
    check("  rstd", rstd, rr, 1e-5);
    // dx accumulated and dw written, then the other way round
    for (int acc = 0; acc < 2; acc++) {
        int acc_dw = !acc;
        // dout bf16, as the GEMM before the backward writes it
        auto dout = randv((size_t)N * D, 1, true), dx = randv((size_t)N * D, 1, false),
             dw = randv(D, 1, false);
        auto dout16 = to_bf(dout);
        std::vector<double> dxr = acc ? tod(dx) : std::vector<double>((size_t)N * D, 0.0),
                            dwr = acc_dw ? tod(dw) : std::vector<double>(D, 0.0);
        std::vector<double> rd(rstd.begin(), rstd.end()), gd = tod(dout);
        rl_cpu_rmsnorm_bwd_f64(dxr.data(), dwr.data(), gd.data(), xd.data(), wd.data(), rd.data(),
                               N, D, 1);
        if (!acc) poison(dx);
        if (!acc_dw) poison(dw);
        std::vector<bf16> dx16((size_t)N * D), y((size_t)N * D);
        poison(dx16), poison(y);
        int nw = rms_warps(D), nblk = rms_blocks(N), rpb = rms_rows_per_block(N);
        std::vector<float> partial((size_t)nblk * D);
        poison(partial);
        // the forward's output rebuilt on the second round only: NULL is the other case
        launch(nblk, 1, nw * 32, [&] {
            rmsnorm_bwd_kernel<VW>(dx.data(), dx16.data(), acc ? y.data() : NULL, partial.data(),
                                   dout16.data(), x.data(), w16.data(), rstd.data(), N, D, rpb, acc);
        });
        launch(
            cdiv(D, 256), 1, 256,
            [&] { rmsnorm_dw_kernel(dw.data(), partial.data(), nblk, D, acc_dw); }, false);
        snprintf(name, sizeof name, "emu rmsnorm bwd N=%d D=%d %s (x%d, %d warps, %d blocks)", N, D,
                 acc ? "dx +=" : "dw +=", VW, nw, nblk);
        check(name, dx, dxr, 1e-4);
        check("  dx bf16 copy", from_bf(dx16), dxr, 4e-3);
        check("  dw", dw, dwr, 1e-4);
        if (acc) {
            size_t diff = 0;
            for (size_t i = 0; i < y.size(); i++)
                diff += memcmp(&y[i], &out[i], sizeof(bf16)) != 0;
            verdict(diff == 0, "  the forward's output rebuilt, bit for bit",
                    "%zu of %zu elements differ", diff, y.size());
        }
    }
}

static void emu_rope(int B, int T, int hidden, int heads) {
    rl_model_config c;
    rl_model_config_default(&c);
    c.hidden_size = hidden, c.num_attention_heads = heads, c.num_key_value_heads = 1,
    c.max_position_embeddings = 256;
    int hd = hidden / heads, nh = heads + 1, N = B * T,
        ld = (nh + 1) * hd; // one extra head per row: untouched
    std::vector<float> tab32((size_t)256 * hd);
    std::vector<double> tab64((size_t)256 * hd);
    rl_cpu_rope_table_f32(&c, tab32.data());
    rl_cpu_rope_table_f64(&c, tab64.data());
    for (int inv = 0; inv < 2; inv++) {
        auto x = randv((size_t)N * ld, 1, true);
        std::vector<double> ref((size_t)N * nh * hd);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < nh * hd; j++) ref[(size_t)n * nh * hd + j] = x[(size_t)n * ld + j];
        if (inv)
            rl_cpu_rope_bwd_f64(ref.data(), tab64.data(), B, T, nh, hd, 256);
        else
            rl_cpu_rope_fwd_f64(ref.data(), tab64.data(), B, T, nh, hd, 256);
        auto xb = to_bf(x);
        // the launcher's choice: 8 pairs per thread where hd/2 and the rows allow
        bool v8 = hd / 2 % 8 == 0 && ld % 8 == 0;
        size_t total = (size_t)N * nh * (hd / 2) / (v8 ? 8 : 1);
        const float *cs = tab32.data(), *sn = cs + (size_t)256 * (hd / 2);
        launch(
            std::min(cdiv(total, 256), 3u), 1, 256,
            [&] {
                if (v8)
                    rope_kernel<8>(xb.data(), cs, sn, N, T, nh, hd, ld, inv);
                else
                    rope_kernel<1>(xb.data(), cs, sn, N, T, nh, hd, ld, inv);
            },
            false);
        auto got = from_bf(xb);
        std::vector<float> g2((size_t)N * nh * hd);
        size_t touched = 0;
        for (int n = 0; n < N; n++) {
            for (int j = 0; j < nh * hd; j++) g2[(size_t)n * nh * hd + j] = got[(size_t)n * ld + j];
            for (int j = nh * hd; j < ld; j++)
                touched += got[(size_t)n * ld + j] != x[(size_t)n * ld + j];
        }
        char name[128];
        snprintf(name, sizeof name, "emu rope %s B=%d T=%d heads=%d hd=%d, %d per thread",
                 inv ? "bwd" : "fwd", B, T, nh, hd, v8 ? 8 : 1);
        check(name, g2, ref, 4e-3);
        verdict(touched == 0, "  heads beyond nh untouched", "%zu elements of the v head changed",
                touched);
    }
}

template <int VW> static void emu_swiglu(int N, int F) {
    size_t nf = (size_t)N * F;
    auto gu = randv(2 * nf, 2, true), dh = randv(nf, 1, true);
    std::vector<double> g(nf), u(nf), hr(nf), dg(nf), du(nf), dhd = tod(dh);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < F; j++)
            g[(size_t)n * F + j] = gu[(size_t)n * 2 * F + j],
                              u[(size_t)n * F + j] = gu[(size_t)n * 2 * F + F + j];
    rl_cpu_swiglu_fwd_f64(hr.data(), g.data(), u.data(), nf);
    rl_cpu_swiglu_bwd_f64(dg.data(), du.data(), dhd.data(), g.data(), u.data(), nf);
    std::vector<double> dref(2 * nf);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < F; j++)
            dref[(size_t)n * 2 * F + j] = dg[(size_t)n * F + j],
                                     dref[(size_t)n * 2 * F + F + j] = du[(size_t)n * F + j];
    auto gub = to_bf(gu), dhb = to_bf(dh);
    std::vector<bf16> h(nf), h2(nf), dgu(2 * nf), dgu2(2 * nf);
    poison(h), poison(h2), poison(dgu), poison(dgu2);
    unsigned grid = std::min(cdiv(nf / VW, 256), 3u);
    launch(
        grid, 1, 256, [&] { swiglu_fwd_kernel<VW>(h.data(), gub.data(), N, F); }, false);
    launch(
        grid, 1, 256,
        [&] { swiglu_bwd_kernel<VW>(dgu.data(), NULL, dhb.data(), gub.data(), N, F); }, false);
    launch(
        grid, 1, 256,
        [&] { swiglu_bwd_kernel<VW>(dgu2.data(), h2.data(), dhb.data(), gub.data(), N, F); },
        false);
    size_t diff = 0;
    for (size_t i = 0; i < nf; i++) diff += memcmp(&h2[i], &h[i], sizeof(bf16)) != 0;
    for (size_t i = 0; i < 2 * nf; i++) diff += memcmp(&dgu2[i], &dgu[i], sizeof(bf16)) != 0;
    char name[96];
    snprintf(name, sizeof name, "emu swiglu fwd N=%d F=%d (x%d)", N, F, VW);
    check(name, from_bf(h), hr, 4e-3);
    snprintf(name, sizeof name, "emu swiglu bwd N=%d F=%d (x%d)", N, F, VW);
    check(name, from_bf(dgu), dref, 4e-3);
    verdict(diff == 0, "  with h: the forward's product rebuilt and dgu the same, bit for bit",
            "%zu elements differ", diff);
}

// The GEMMs with SwiGLU fused in (gemm_kernels.cuh), on shapes that cut
// every tile (M past a 128-row tile, F past 64- and 128-column tiles, K not
// a multiple of the 32-wide stage and longer than the three stages).
// Against an f64 reference of the products (the tiling and the zero-filled
// edges); then bit for bit against the same sums in fp32, k in order (the
// emulator's mma order), rounded to bf16 and given to the separate SwiGLU
// kernels: that is the claim of the fused epilogues, the separate path's
// arithmetic on the same values.
static void emu_gemm_swiglu(int M, int K, int F) {
    size_t mf = (size_t)M * F;
    auto x = randv((size_t)M * K, 1, true), wgu = randv((size_t)2 * F * K, 1 / sqrt(K), true);
    auto dy = randv((size_t)M * K, 1, true), wd = randv((size_t)K * F, 1 / sqrt(F), true);
    // the products in f64 and in fp32 k order: gate|up [M, 2F], dh [M, F]
    std::vector<double> gu64(2 * mf), dh64(mf);
    std::vector<bf16> gu32(2 * mf), dh32(mf);
    for (int m = 0; m < M; m++) {
        for (int j = 0; j < 2 * F; j++) {
            double s = 0;
            float f = 0;
            for (int k = 0; k < K; k++) {
                float p = x[(size_t)m * K + k] * wgu[(size_t)j * K + k];
                s += p, f += p;
            }
            gu64[(size_t)m * 2 * F + j] = s, gu32[(size_t)m * 2 * F + j] = __float2bfloat16_rn(f);
        }
        for (int j = 0; j < F; j++) {
            double s = 0;
            float f = 0;
            for (int k = 0; k < K; k++) {
                float p = dy[(size_t)m * K + k] * wd[(size_t)k * F + j];
                s += p, f += p;
            }
            dh64[(size_t)m * F + j] = s, dh32[(size_t)m * F + j] = __float2bfloat16_rn(f);
        }
    }
    auto xb = to_bf(x), wgub = to_bf(wgu), dyb = to_bf(dy), wdb = to_bf(wd);
    std::vector<bf16> gu(2 * mf), h(mf), dgu(2 * mf), h2(mf), dgu_nh(2 * mf);
    poison(gu), poison(h), poison(dgu), poison(h2), poison(dgu_nh);
    launch(cdiv(F, FG_BN / 2), cdiv(M, FG_BM), FG_THREADS,
           [&] { gemm_swiglu_fwd_kernel(gu.data(), h.data(), xb.data(), wgub.data(), M, K, F); });
    launch(cdiv(F, FG_BN), cdiv(M, FG_BM), FG_THREADS, [&] {
        gemm_swiglu_bwd_kernel(dgu.data(), h2.data(), dyb.data(), wdb.data(), gu.data(), M, K, F);
    });
    launch(cdiv(F, FG_BN), cdiv(M, FG_BM), FG_THREADS, [&] {
        gemm_swiglu_bwd_kernel(dgu_nh.data(), NULL, dyb.data(), wdb.data(), gu.data(), M, K, F);
    });
    // the separate kernels on the fp32-ordered products
    std::vector<bf16> h_ref(mf), dgu_ref(2 * mf);
    unsigned grid = std::min(cdiv(mf, 256), 8u);
    launch(grid, 1, 256, [&] { swiglu_fwd_kernel<1>(h_ref.data(), gu32.data(), M, F); }, false);
    launch(grid, 1, 256, [&] {
        swiglu_bwd_kernel<1>(dgu_ref.data(), NULL, dh32.data(), gu32.data(), M, F);
    }, false);
    auto differ = [](const std::vector<bf16> &a, const std::vector<bf16> &b) {
        size_t n = 0;
        for (size_t i = 0; i < a.size(); i++) n += memcmp(&a[i], &b[i], sizeof(bf16)) != 0;
        return n;
    };
    char name[96];
    snprintf(name, sizeof name, "emu gemm+swiglu fwd M=%d K=%d F=%d: gate|up", M, K, F);
    check(name, from_bf(gu), gu64, 4e-3);
    size_t d_gu = differ(gu, gu32), d_h = differ(h, h_ref), d_dgu = differ(dgu, dgu_ref);
    size_t d_h2 = differ(h2, h), d_nh = differ(dgu_nh, dgu);
    verdict(d_gu == 0 && d_h == 0, "  gate|up = fp32 k-order sums, h = swiglu_fwd_kernel's",
            "%zu, %zu elements differ", d_gu, d_h);
    // the bwd's own product, against f64, through SwiGLU's f64 backward
    std::vector<double> g(mf), u(mf), dg(mf), du(mf), dref(2 * mf);
    for (size_t n = 0; n < (size_t)M; n++)
        for (int j = 0; j < F; j++)
            g[n * F + j] = __bfloat162float(gu[n * 2 * F + j]),
                      u[n * F + j] = __bfloat162float(gu[n * 2 * F + F + j]);
    rl_cpu_swiglu_bwd_f64(dg.data(), du.data(), dh64.data(), g.data(), u.data(), mf);
    for (size_t n = 0; n < (size_t)M; n++)
        for (int j = 0; j < F; j++)
            dref[n * 2 * F + j] = dg[n * F + j], dref[n * 2 * F + F + j] = du[n * F + j];
    snprintf(name, sizeof name, "emu gemm+swiglu bwd M=%d K=%d F=%d: dgate|dup", M, K, F);
    check(name, from_bf(dgu), dref, 8e-3);
    verdict(d_dgu == 0 && d_h2 == 0 && d_nh == 0,
            "  dgu = swiglu_bwd_kernel's on the same dh, h rebuilt, without h the same",
            "%zu, %zu, %zu elements differ", d_dgu, d_h2, d_nh);
}

// The classifier fused into our GEMMs (gemm_kernels.cuh), against the
// separate path on the same logits: the forward's products summed in fp32
// in k order and rounded to bf16 (the emulator's order, so the same bits),
// given to xent_kernel, which must agree on the losses and lse; dlogits
// rebuilt from P and the factors as the backward kernels make them, against
// xent's; dx and dw (added to, then written) against f64 products of xent's
// dlogits. With nan_row, one row of NaN inputs: that row's loss NaN and no
// other (its dlogits would poison all of dw: the products are not checked).
static void emu_cls_fused(int M, int D, int V, bool nan_row) {
    const int Vp = (V + 63) / 64 * 64, nt = (Vp + 127) / 128, bad = nan_row ? M / 2 : -1;
    const float scale = 1.0f / M;
    auto x = randv((size_t)M * D, 1, true), w = randv((size_t)Vp * D, 2 / sqrt(D), true);
    for (size_t i = (size_t)V * D; i < (size_t)Vp * D; i++) w[i] = 0; // padded rows: zero
    if (nan_row) x[(size_t)bad * D + 3] = NAN;
    auto tgt = rand_tok(M, V);
    tgt[0] = V - 1;
    std::vector<bf16> dlog((size_t)M * Vp); // the logits, then xent's dlogits in place
    for (int m = 0; m < M; m++)
        for (int j = 0; j < Vp; j++) {
            float f = 0;
            for (int k = 0; k < D; k++) f += x[(size_t)m * D + k] * w[(size_t)j * D + k];
            dlog[(size_t)m * Vp + j] = __float2bfloat16_rn(f);
        }
    std::vector<float> loss_ref(M), lse_ref(M);
    launch(M, 1, XENT_THREADS, [&] {
        xent_kernel<1>(dlog.data(), loss_ref.data(), lse_ref.data(), tgt.data(), V, Vp, scale, 1);
    });
    auto xb = to_bf(x), wb = to_bf(w);
    std::vector<bf16> P((size_t)M * Vp), dx((size_t)M * D);
    std::vector<float> stats((size_t)2 * M * nt), tl(M), fac((size_t)M * nt), loss(M), lse(M);
    // what dw held before: small beside the product, so the check sees the product
    std::vector<float> dw_add = randv((size_t)Vp * D, 1e-4, false), dw_w((size_t)Vp * D);
    std::vector<double> dwr = tod(dw_add), dwr_w((size_t)Vp * D, 0.0), dxr((size_t)M * D, 0.0);
    poison(P), poison(dx), poison(stats), poison(tl), poison(fac), poison(loss), poison(lse);
    poison(dw_w);
    launch(nt, cdiv(M, FG_BM), FG_THREADS, [&] {
        gemm_lm_fwd_kernel(P.data(), stats.data(), tl.data(), xb.data(), wb.data(), tgt.data(), M,
                           D, V, Vp);
    });
    launch(cdiv(M, 8), 1, 256, [&] {
        cls_merge_kernel(loss.data(), lse.data(), fac.data(), stats.data(), tl.data(), M, nt, scale);
    });
    char name[112];
    std::vector<float> l1, l2, e1, e2;
    size_t finite = 0;
    for (int m = 0; m < M; m++) {
        if (m == bad) continue;
        finite += std::isfinite(loss[m]);
        l1.push_back(loss[m]), l2.push_back(loss_ref[m]), e1.push_back(lse[m]), e2.push_back(lse_ref[m]);
    }
    if (nan_row) {
        snprintf(name, sizeof name, "emu classifier fused M=%d D=%d V=%d, a row of NaN inputs", M, D, V);
        verdict(std::isnan(loss[bad]) && finite == (size_t)M - 1, name,
                "row %d loss %g, %zu of %d others finite", bad, loss[bad], finite, M - 1);
        return;
    }
    snprintf(name, sizeof name, "emu classifier fused M=%d D=%d V=%d: loss vs xent_kernel's", M, D, V);
    check(name, l1, tod(l2), 2e-6);
    check("  lse", e1, tod(e2), 2e-6);
    fg_cls c = {fac.data(), tgt.data(), nt, scale};
    launch(cdiv(D, FG_BN), cdiv(M, FG_BM), FG_THREADS,
           [&] { gemm_lm_dx_kernel(dx.data(), P.data(), wb.data(), c, M, D, Vp); });
    launch(cdiv(D, FG_BN), cdiv(Vp, FG_BM), FG_THREADS,
           [&] { gemm_lm_dw_kernel(dw_add.data(), P.data(), xb.data(), c, M, D, Vp, 1); });
    launch(cdiv(D, FG_BN), cdiv(Vp, FG_BM), FG_THREADS,
           [&] { gemm_lm_dw_kernel(dw_w.data(), P.data(), xb.data(), c, M, D, Vp, 0); });
    std::vector<float> dl;
    std::vector<double> dl_ref;
    for (int m = 0; m < M; m++)
        for (int j = 0; j < Vp; j++) {
            float d = __bfloat162float(__float2bfloat16_rn(
                __bfloat162float(P[(size_t)m * Vp + j]) * fac[(size_t)m * nt + j / 128] -
                (j == tgt[m] ? scale : 0.0f)));
            double r = __bfloat162float(dlog[(size_t)m * Vp + j]);
            dl.push_back(d), dl_ref.push_back(r);
            for (int k = 0; k < D; k++) {
                dxr[(size_t)m * D + k] += r * w[(size_t)j * D + k];
                dwr[(size_t)j * D + k] += r * x[(size_t)m * D + k];
                dwr_w[(size_t)j * D + k] += r * x[(size_t)m * D + k];
            }
        }
    check("  dlogits from P and the factors vs xent's", dl, dl_ref, 4e-3);
    check("  dx = dlogits . W", from_bf(dx), dxr, 8e-3);
    check("  dw += dlogits^T . x", dw_add, dwr, 8e-3);
    check("  dw = dlogits^T . x", dw_w, dwr_w, 8e-3);
}

// The fused classifier on rows of ld >= V: padding that would dominate the
// softmax (1e4) or poison it (NaN) if read as vocabulary; loss only (the
// logits must come back untouched), loss and gradient (padding exactly 0),
// and a NaN logit at column V - 1 of one row (the last, partial vector). Then
// the device-side loss accumulation over the losses.
template <int VW> static void emu_xent(int N, int V, int ld) {
    auto logits = randv((size_t)N * ld, 2, true);
    for (int n = 0; n < N; n++)
        for (int j = V; j < ld; j++) logits[(size_t)n * ld + j] = j == V ? NAN : 1e4f;
    auto tgt = rand_tok(N, V);
    std::vector<double> ref((size_t)N * V), lr(N), lser(N);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < V; j++) ref[(size_t)n * V + j] = logits[(size_t)n * ld + j];
    float scale = 1.0f / N;
    rl_cpu_xent_fwd_f64(lr.data(), ref.data(), tgt.data(), N, V);
    for (int n = 0; n < N; n++) lser[n] = lr[n] + ref[(size_t)n * V + tgt[n]];
    rl_cpu_xent_bwd_f64(ref.data(), tgt.data(), N, V, scale);
    char name[96];
    static const char *modes[] = {"loss", "loss+grad", "NaN logit"};
    for (int mode = 0; mode < 3; mode++) {
        auto lb = to_bf(logits);
        int bad = mode == 2 ? N / 2 : -1;
        if (bad >= 0) lb[(size_t)bad * ld + V - 1] = __float2bfloat16_rn(NAN);
        auto in = lb;
        std::vector<float> losses(N), lse(N);
        poison(losses), poison(lse);
        launch(N, 1, XENT_THREADS, [&] {
            xent_kernel<VW>(lb.data(), losses.data(), lse.data(), tgt.data(), V, ld, scale,
                            mode > 0);
        });
        snprintf(name, sizeof name, "emu classifier %s N=%d V=%d ld=%d (x%d)", modes[mode], N, V,
                 ld, VW);
        auto got = from_bf(lb);
        if (mode < 2) {
            check(name, losses, lr, 1e-5);
            check("  lse", lse, lser, 1e-5);
        }
        if (mode == 0) {
            bool same = memcmp(lb.data(), in.data(), lb.size() * sizeof(bf16)) == 0;
            verdict(same, "  logits untouched without grad", "%s", "");
            continue;
        }
        size_t pad_bad = 0, row_ok = 0;
        std::vector<float> dl((size_t)N * V);
        for (int n = 0; n < N; n++) {
            for (int j = V; j < ld; j++) pad_bad += got[(size_t)n * ld + j] != 0.0f;
            for (int j = 0; j < V; j++) dl[(size_t)n * V + j] = got[(size_t)n * ld + j];
        }
        if (mode == 1)
            check("  dlogits in place", dl, ref, 4e-3);
        else {
            // the NaN row: loss, lse and every gradient NaN; the others finite
            row_ok += std::isnan(losses[bad]) && std::isnan(lse[bad]);
            for (int j = 0; j < V; j++) row_ok += std::isnan(dl[(size_t)bad * V + j]);
            size_t others = 0;
            for (int n = 0; n < N; n++) {
                if (n == bad) continue;
                others += !std::isfinite(losses[n]);
                for (int j = 0; j < V; j++) others += !std::isfinite(dl[(size_t)n * V + j]);
            }
            verdict(row_ok == (size_t)V + 1 && others == 0, name,
                    "%zu of %d NaN, %zu non-finite elsewhere", row_ok, V + 1, others);
        }
        verdict(pad_bad == 0, "  padding columns", "%zu not exactly 0", pad_bad);
    }

    std::vector<float> losses(lr.begin(), lr.end()), acc(1);
    double m = 0;
    for (float v : losses) m += v;
    for (int reset = 0; reset < 2; reset++) {
        if (reset)
            poison(acc);
        else
            acc[0] = 0.75f;
        double want = (reset ? 0.0 : 0.75) + 0.25 * (m / N);
        launch(1, 1, 1024, [&] { loss_accum_kernel(acc.data(), losses.data(), N, 0.25f, reset); });
        snprintf(name, sizeof name, "  loss accum n=%d%s", N, reset ? " reset" : "");
        check(name, acc, std::vector<double>{want}, 1e-6);
    }
}

template <int VW> static void emu_norm(size_t n) {
    auto g = randv(n, 1e-3, false);
    double ref = 0;
    for (float v : g) ref += (double)v * v;
    const int NB = 16; // the GPU runs RL_K_NORM_BLOCKS; the code is the same for any count
    std::vector<float> partial(NB), out(1);
    poison(partial), poison(out);
    launch(NB, 1, 256, [&] { sumsq_kernel<VW>(partial.data(), g.data(), n); });
    launch(1, 1, 1024, [&] { sqrt_sum_kernel(out.data(), partial.data(), NB); });
    char name[96];
    snprintf(name, sizeof name, "emu grad norm n=%zu (%d blocks, x%d)", n, NB, VW);
    check(name, out, std::vector<double>{sqrt(ref)}, 1e-5);
}

template <int VW> static void emu_adamw_init(int hidden) {
    rl_model_config c;
    rl_model_config_default(&c);
    c.vocab_size = 101, c.hidden_size = hidden, c.intermediate_size = 200, c.num_hidden_layers = 2;
    c.num_attention_heads = 3, c.num_key_value_heads = 1;
    rl_param_layout lay;
    rl_param_layout_init(&lay, &c);
    size_t P = lay.total;
    int L = c.num_hidden_layers, D = c.hidden_size;
    size_t mx = std::max({lay.layers, lay.layer_size, lay.total - lay.final_norm});
    unsigned gx = std::min(cdiv(mx, 256u * VW), 2048u);
    if (VW > 1 &&
        (lay.layers % VW || lay.layer_size % VW || lay.final_norm % VW || lay.total % VW)) {
        verdict(false, "emu adamw", "hidden %d does not give whole %d-vectors", hidden, VW);
        return;
    }
    adamw_layout al = make_layout(&lay, L, D);

    for (int clip = 0; clip < 2; clip++) {
        auto p = randv(P, 0.05, false), g = randv(P, 1e-2, false), m = randv(P, 1e-3, false),
             v = randv(P, 1e-5, false);
        for (auto &e : v) e = fabsf(e);
        std::vector<float> cp = p, cm = m, cv = v;
        double lr = 3e-3, wd = 0.1, b1 = 0.9, b2 = 0.95, eps = 1e-8, scale = 0.7, max_norm = 0.05;
        long long t = 3;
        std::vector<float> norm(1, 0.37f);
        double gs = scale * (clip ? std::min(1.0, max_norm / (norm[0] + 1e-6)) : 1.0);
        for (int i = 0; i < rl_model_n_tensors(&c); i++) {
            rl_tensor_info ti;
            rl_model_tensor(&c, i, &ti);
            rl_adamw_update(cp.data() + ti.offset, g.data() + ti.offset, cm.data() + ti.offset,
                            cv.data() + ti.offset, ti.numel, lr, b1, b2, eps, ti.decay ? wd : 0.0,
                            t, gs);
        }
        // the scalars as rl_gpu_model_adamw derives them
        double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
        rl_k_adamw_args a;
        a.b1 = (float)b1, a.b2 = (float)b2, a.c1 = (float)(1.0 - b1), a.c2 = (float)(1.0 - b2);
        a.step = (float)(lr / bc1), a.sbc2 = (float)sqrt(bc2), a.eps = (float)eps;
        a.decay = (float)(1.0 - lr * wd), a.grad_scale = (float)scale,
        a.clip_max = clip ? (float)max_norm : 0.0f;
        std::vector<bf16> p16(P);
        poison(p16);
        launch(
            gx, L + 2, 256,
            [&] {
                adamw_kernel<VW>(p.data(), p16.data(), m.data(), v.data(), g.data(), norm.data(),
                                 al, a);
            },
            false);
        char an[96];
        snprintf(an, sizeof an, "emu adamw%s hidden=%d (x%d) master",
                 clip ? " (clip on the device)" : "", hidden, VW);
        check(an, p, tod(cp), 1e-6);
        check("  m", m, tod(cm), 1e-6);
        check("  v", v, tod(cv), 1e-6);
        size_t bad = 0;
        for (size_t i = 0; i < P; i++)
            bad += __bfloat162float(p16[i]) != __bfloat162float(__float2bfloat16_rn(p[i]));
        verdict(bad == 0, "  bf16 copy = round(master)", "%zu of %zu differ", bad, P);
    }

    if (VW > 1) return; // init and casts have no vector variant
    std::vector<float> w(P);
    poison(w);
    gx = std::min(cdiv(mx, 256), 2048u);
    launch(
        gx, L + 2, 256, [&] { init_random_kernel(w.data(), al, 1234, 0.02f); }, false);
    size_t bad_norm = 0, nm = 0;
    double s1 = 0, s2 = 0;
    for (int i = 0; i < rl_model_n_tensors(&c); i++) {
        rl_tensor_info ti;
        rl_model_tensor(&c, i, &ti);
        for (size_t j = 0; j < ti.numel; j++) {
            float x = w[ti.offset + j];
            if (ti.ndim == 1)
                bad_norm += x != 1.0f;
            else
                s1 += x, s2 += (double)x * x, nm++, bad_norm += !std::isfinite(x);
        }
    }
    double mean = s1 / nm, sd = sqrt(s2 / nm - mean * mean);
    verdict(bad_norm == 0 && fabs(mean) < 1e-3 && fabs(sd - 0.02) < 0.02 * 0.02, "emu init_random",
            "norms %s, matrices mean %.2e std %.5f (want 0.02)", bad_norm ? "WRONG" : "all 1",
            mean, sd);

    auto x = randv(1000, 3, false);
    std::vector<bf16> xb(1000);
    poison(xb);
    launch(
        2, 1, 256, [&] { f32_to_bf16_kernel(xb.data(), x.data(), x.size()); }, false);
    size_t bad = 0;
    for (size_t i = 0; i < x.size(); i++)
        bad += __bfloat162float(xb[i]) != __bfloat162float(__float2bfloat16_rn(x[i]));
    verdict(bad == 0, "emu f32 -> bf16 (round to nearest even)", "%zu differ", bad);
}

// The step plan's cost functions (host arithmetic beside the launchers):
// the figures they must agree on, worked out by hand for one shape each.
static void emu_costs() {
    struct {
        const char *what;
        rl_k_cost got;
        double flops, bytes;
        int launches;
    } c[] = {
        // 2 M N K; bf16 A [M,K] and B [K,N], fp32 out read and written
        {"gemm 3x5x7 fp32 +=", rl_k_gemm_cost(3, 5, 7, 4, 4), 210, 2 * (21 + 35) + 15 * 8, 1},
        // 5 x 1000 bf16 logits read, tgt/loss/lse 3 x 5 x 4, the 5 x 1024 row written
        {"xent N=5 V=1000 ld=1024 grad", rl_k_xent_cost(5, 1000, 1024, 1), 5000 * 8,
         10000 + 60 + 10240, 1},
        {"xent N=5 V=1000 ld=1024 loss", rl_k_xent_cost(5, 1000, 1024, 0), 5000 * 4, 10000 + 60, 1},
        // 30 bytes and 16 FLOPs a parameter
        {"adamw n=10", rl_k_adamw_cost(10), 160, 300, 1},
        // 8 x 16 dout bf16, x fp32, dres fp32 read and written, dres16; w (the
        // bf16 copy), dw in and out (fp32), rstd 8, the one block's partial row
        // out and in
        {"rmsnorm bwd N=8 D=16", rl_k_rmsnorm_bwd_cost(8, 16, 0), 10 * 128 + 16,
         128 * 16.0 + 16 * 10 + 32 + 16 * 8, 2},
        // and the norm's output written again: 8 x 16 bf16, 2 FLOPs each
        {"rmsnorm bwd N=8 D=16 rebuilding y", rl_k_rmsnorm_bwd_cost(8, 16, 1), 12 * 128 + 16,
         128 * 18.0 + 16 * 10 + 32 + 16 * 8, 2},
        // gate|up 3 x 2 x 4, dh 3 x 4 read, dgate|dup written, h written again (bf16)
        {"swiglu bwd N=3 F=4 rebuilding h", rl_k_swiglu_bwd_cost(3, 4, 1), 16 * 12, 12 * 2 * 6, 1},
        {"embed bwd U=0", rl_k_embed_bwd_cost(4, 0, 8), 32, 4 * 8 * 4 + (1 + 4) * 4, 0},
        {"loss accum n=9", rl_k_loss_accum_cost(9), 11, 44, 1},
    };
    for (auto &x : c) {
        char what[96];
        snprintf(what, sizeof what, "cost %s", x.what);
        verdict(x.got.flops == x.flops && x.got.bytes == x.bytes && x.got.launches == x.launches,
                what, "flops %.0f bytes %.0f launches %d", x.got.flops, x.got.bytes,
                x.got.launches);
    }
}

// A rank's shard (dist.shard): the norm's partial over its counted ranges
// and AdamW over its ranges (moments compact, in range order), against the
// CPU: rl_adamw_update over each range's part of each tensor, as
// pkg/train/cpu.c runs it. The ranges cross tensors and regions (the
// embedding into layer 0, the last layer into the final norm, the
// lm_head's end), one is shared (counted by rank 0 only), and three blocks
// make every thread walk several ranges. Outside the ranges nothing moves:
// master bit for bit, the bf16 copy still poisoned.
static void emu_shard_kernels() {
    rl_model_config c;
    rl_model_config_default(&c);
    c.vocab_size = 101, c.hidden_size = 66, c.intermediate_size = 200, c.num_hidden_layers = 2;
    c.num_attention_heads = 3, c.num_key_value_heads = 1;
    rl_param_layout lay;
    rl_param_layout_init(&lay, &c);
    size_t P = lay.total;
    const rl_k_range r[3] = {{lay.layers - 40, 1000, 0, 1},
                             {lay.final_norm - 30, 60, 1000, 0},
                             {P - 17, 17, 1060, 1}};
    const int nr = 3;
    size_t held = 1077;
    auto p = randv(P, 0.05, false), g = randv(P, 1e-2, false), m = randv(held, 1e-3, false),
         v = randv(held, 1e-5, false);
    for (auto &e : v) e = fabsf(e);
    for (int rank = 0; rank < 2; rank++) { /* rank 1 leaves the shared range out of the norm */
        double ref = 0;
        for (const rl_k_range &k : r)
            for (size_t i = 0; i < k.len && (k.norm || rank == 0); i++) ref += (double)g[k.off + i] * g[k.off + i];
        std::vector<rl_k_range> rr(r, r + nr);
        for (auto &k : rr) k.norm = k.norm || rank == 0;
        const int NB = 16;
        std::vector<float> partial(NB);
        std::vector<double> sq(1);
        poison(partial);
        // the flat gradient (at the ranges' offsets) and the shard's own (compact, at j)
        std::vector<float> gc(held);
        for (const rl_k_range &k : r)
            for (size_t i = 0; i < k.len; i++) gc[k.at + i] = g[k.off + i];
        for (int compact = 0; compact < 2; compact++) {
            const float *gp = compact ? gc.data() : g.data();
            launch(NB, 1, 256,
                   [&] { sumsq_ranges_kernel(partial.data(), gp, rr.data(), nr, held, compact); });
            launch(1, 1, 1024, [&] { sum_d_kernel(sq.data(), partial.data(), NB); });
            char name[96];
            snprintf(name, sizeof name, "emu shard norm^2 as rank %d, %s gradient", rank,
                     compact ? "compact" : "flat");
            verdict(fabs(sq[0] - ref) <= 1e-6 * ref, name, "%.9g vs %.9g", sq[0], ref);
        }
    }
    std::vector<float> cp = p, cm = m, cv = v, norm(1, 0.37f);
    double lr = 3e-3, wd = 0.1, b1 = 0.9, b2 = 0.95, eps = 1e-8, max_norm = 0.05;
    long long t = 3;
    double gs = std::min(1.0, max_norm / (norm[0] + 1e-6));
    for (const rl_k_range &k : r)
        for (int i = 0; i < rl_model_n_tensors(&c); i++) {
            rl_tensor_info ti;
            rl_model_tensor(&c, i, &ti);
            size_t lo = std::max(ti.offset, k.off), hi = std::min(ti.offset + ti.numel, k.off + k.len);
            if (lo >= hi) continue;
            size_t at = k.at + (lo - k.off);
            rl_adamw_update(cp.data() + lo, g.data() + lo, cm.data() + at, cv.data() + at, hi - lo, lr, b1, b2,
                            eps, ti.decay ? wd : 0.0, t, gs);
        }
    double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
    rl_k_adamw_args a;
    a.b1 = (float)b1, a.b2 = (float)b2, a.c1 = (float)(1.0 - b1), a.c2 = (float)(1.0 - b2);
    a.step = (float)(lr / bc1), a.sbc2 = (float)sqrt(bc2), a.eps = (float)eps;
    a.decay = (float)(1.0 - lr * wd), a.grad_scale = 1.0f, a.clip_max = (float)max_norm;
    // the master is the shard's own (compact, at j, as the moments); the
    // bf16 copy is the whole model's, written at the ranges' flat offsets
    std::vector<float> pm(held), pm_ref(held);
    for (const rl_k_range &k : r)
        for (size_t i = 0; i < k.len; i++) pm[k.at + i] = p[k.off + i], pm_ref[k.at + i] = cp[k.off + i];
    std::vector<bf16> p16(P);
    poison(p16);
    adamw_layout al = make_layout(&lay, c.num_hidden_layers, c.hidden_size);
    launch(3, 1, 256, [&] {
        adamw_ranges_kernel(pm.data(), p16.data(), m.data(), v.data(), g.data(), 0, norm.data(), al, r, nr,
                            held, a);
    }, false);
    check("emu shard adamw (3 ranges, clip on the device) master", pm, tod(pm_ref), 1e-6);
    check("  m (the shard's)", m, tod(cm), 1e-6);
    check("  v (the shard's)", v, tod(cv), 1e-6);
    size_t in = 0, bad = 0, moved = 0;
    for (size_t i = 0; i < P; i++) {
        const rl_k_range *mine = NULL;
        for (const rl_k_range &k : r)
            if (i >= k.off && i < k.off + k.len) mine = &k;
        in += mine != NULL;
        if (mine)
            bad += __bfloat162float(p16[i]) !=
                   __bfloat162float(__float2bfloat16_rn(pm[mine->at + (i - mine->off)]));
        else
            moved += !std::isnan(__bfloat162float(p16[i]));
    }
    verdict(bad == 0 && moved == 0 && in == held, "  only the ranges' bf16 copies move",
            "%zu of %zu bf16 copies wrong, %zu elements outside touched", bad, in, moved);
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : "";
    if (!*only || strstr("attention", only)) {
        emu_launch_limits();
        emu_attn_no_fit();
        // head dims padded to each of 32, 64, 128; T = 1, below, at and over
        // a 64-row tile; grouped (KV < H) and plain (KV = H) heads; both load
        // paths; both buffering instances; RoPE inside and not
        auto cases = [](auto NB_, bool rope) {
            constexpr int NB = decltype(NB_)::value;
            run_case<32, NB>(1, 1, 3, 1, 32, 1, rope);
            run_case<32, NB>(2, 7, 3, 1, 20, 0, rope);
            run_case<64, NB>(1, 64, 2, 2, 64, 1, rope);
            run_case<64, NB>(1, 129, 4, 2, 64, 1, rope);
            run_case<64, NB>(1, 70, 2, 1, 64, 0, rope);
            run_case<64, NB>(2, 65, 3, 3, 40, 1, rope);
            run_case<128, NB>(1, 80, 2, 1, 96, 1, rope);
            run_case<128, NB>(1, 66, 2, 2, 128, 1, rope);
        };
        for (bool rope : {false, true}) {
            cases(std::integral_constant<int, 2>(), rope);
            cases(std::integral_constant<int, 1>(), rope);
        }
    }
    if (!*only || strstr("runtime", only)) emu_graph_capture();
    if (!*only || strstr("model", only)) {
        emu_embed<1>();
        emu_embed<4>();
        emu_rmsnorm<1>(7, 96);
        emu_rmsnorm<4>(7, 96);
        emu_rmsnorm<1>(33, 770);
        emu_rmsnorm<1>(20, 13000);
        emu_rmsnorm<4>(20, 13000);
        emu_rope(2, 7, 96, 3);
        emu_rope(1, 33, 60, 3);
        emu_swiglu<1>(7, 100);
        emu_swiglu<1>(3, 352);
        emu_swiglu<8>(3, 352);
        emu_gemm_swiglu(130, 40, 72);  // fewer k steps than stages, partial tiles
        emu_gemm_swiglu(257, 136, 136); // 5 k stages, 3 fwd / 2 bwd column tiles, 3 row tiles
        emu_cls_fused(130, 40, 300, false);  // 3 column tiles, the last part padding
        emu_cls_fused(200, 136, 1000, false); // 8 tiles, 5 k stages
        emu_cls_fused(70, 40, 300, true);
        emu_xent<1>(1, 257, 257); // V - 1 alone in its thread: a NaN must survive the merges
        emu_xent<8>(5, 1000, 1000);
        emu_xent<1>(3, 1000, 1003);
        emu_xent<8>(3, 1001, 1024);
        emu_xent<8>(2, 50257, 50304);
        emu_xent<1>(2, 32001, 32064);
        emu_norm<1>(1);
        emu_norm<4>(1);
        emu_norm<1>(100003);
        emu_norm<4>(100003);
        emu_adamw_init<1>(96);
        emu_adamw_init<4>(96);
        emu_adamw_init<1>(66); // regions not on multiples of 4
        emu_shard_kernels();
        emu_costs();
    }
    printf("kernel emulation: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
