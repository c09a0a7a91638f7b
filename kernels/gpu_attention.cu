// Launchers of the attention kernels (attention_kernels.cuh has the kernels
// and the design notes).
#include <math.h>

#include <atomic>
#include <type_traits>

#include "kernels/attention_kernels.cuh"
#include "kernels/gpu_internal.cuh"

// ---- shared memory per device -------------------------------------------------------------------
// Each kernel runs double-buffered where the device allows the shared
// memory per block, single-buffered otherwise: sm_80 and sm_90 (163 and
// 227 KB) fit every head-dim class double-buffered, sm_86 and sm_89 (99 KB)
// not the head_dim-128 backward (dK/dV 112 KB, dQ 102 KB). The choice is
// made per device, kernel and head-dim class on first use, and the
// kernel's limit raised to what that variant needs -- only then, and only
// as far: raising it above the device's maximum is an error, not a no-op.
// Several host threads may get here at once (one per model): each finds
// the same variant and sets the same limit, so a race only repeats the
// work, and the choice is published after its limit is set.
#define ATT_MAX_DEVICES 64
static std::atomic<int> attn_nbuf[ATT_MAX_DEVICES][3][3]; // [device][kind][HD class]; 0: not yet
static const char *const attn_kind_name[3] = {"forward", "dK/dV backward", "dQ backward"};

// f(HD, NB) with std::integral_constants for the instance (head dims padded
// to HD, NB buffers) that runs head_dim hd (bounded by attn_check) with nbuf.
template <int V> using int_c = std::integral_constant<int, V>;
template <class F> static auto attn_variant(int hd, int nbuf, F &&f) {
    auto with_nbuf = [&](auto HD) { return nbuf == 2 ? f(HD, int_c<2>()) : f(HD, int_c<1>()); };
    if (hd <= 32) return with_nbuf(int_c<32>());
    if (hd <= 64) return with_nbuf(int_c<64>());
    return with_nbuf(int_c<128>());
}
static int attn_hd_pad(int hd) { return hd <= 32 ? 32 : hd <= 64 ? 64 : 128; }

static const void *attn_kernel(int kind, int hd, int nbuf) {
    return attn_variant(hd, nbuf, [&](auto HD_, auto NB_) {
        constexpr int HD = decltype(HD_)::value, NB = decltype(NB_)::value;
        if (kind == ATT_FWD) return reinterpret_cast<const void *>(&attn_fwd_kernel<HD, NB>);
        if (kind == ATT_DKDV) return reinterpret_cast<const void *>(&attn_bwd_dkdv_kernel<HD, NB>);
        return reinterpret_cast<const void *>(&attn_bwd_dq_kernel<HD, NB>);
    });
}

// *nbuf: the buffering kernel `kind` runs with for head_dim hd on the
// current device.
static int attn_pick(int kind, int hd, int *nbuf, rl_err *e) {
    int dev, optin, pad = attn_hd_pad(hd);
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= ATT_MAX_DEVICES)
        return rl_errf(e, RL_EINTERNAL, "attention: device %d is above the %d this build handles",
                       dev, ATT_MAX_DEVICES);
    std::atomic<int> &slot = attn_nbuf[dev][kind][pad == 32 ? 0 : pad == 64 ? 1 : 2];
    if ((*nbuf = slot.load(std::memory_order_acquire))) return RL_OK;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    for (int nb = 2; nb >= 1; nb--) {
        size_t need = attn_smem_bytes(kind, pad, nb);
        if (need > (size_t)optin) continue;
        CUDA_CHECK(cudaFuncSetAttribute(attn_kernel(kind, hd, nb),
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need));
        slot.store(nb, std::memory_order_release);
        *nbuf = nb;
        return RL_OK;
    }
    return rl_errf(e, RL_EINPUT,
                   "attention: head_dim %d needs %zu bytes of shared memory per block in the %s "
                   "kernel even single-buffered; GPU %d allows %d "
                   "(cudaDevAttrMaxSharedMemoryPerBlockOptin)",
                   hd, attn_smem_bytes(kind, pad, 1), attn_kind_name[kind], dev, optin);
}

static int attn_check(int B, int T, int H, int KV, int hd, rl_err *e) {
    if (B < 1 || T < 1 || H < 1 || KV < 1 || H % KV != 0 || hd < 2 || hd % 2 != 0 ||
        hd > RL_GPU_MAX_HEAD_DIM)
        return rl_errf(e, RL_EINPUT,
                       "attention: unsupported shape B=%d T=%d heads=%d kv_heads=%d head_dim=%d "
                       "(head_dim must be even and at most %d)",
                       B, T, H, KV, hd, RL_GPU_MAX_HEAD_DIM);
    if ((size_t)B * H > 0x7fffffffu || (T + ATT_BR - 1) / ATT_BR > 65535)
        return rl_errf(e, RL_EINPUT, "attention: grid too large for B=%d T=%d heads=%d", B, T, H);
    return RL_OK;
}
int rl_gpu_attn_prepare(int hd, rl_err *e) {
    RL_TRY(attn_check(1, 1, 1, 1, hd, e));
    int nbuf;
    for (int kind = ATT_FWD; kind <= ATT_DQ; kind++) RL_TRY(attn_pick(kind, hd, &nbuf, e));
    return RL_OK;
}

// ---- launches -----------------------------------------------------------------------------------
static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// The kernels are named in parentheses in RL_LAUNCH: the comma between
// their template arguments would split the macro's arguments otherwise.
int rl_k_attn_fwd(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int H, int KV, int hd,
                  cudaStream_t s, rl_err *e) {
    int nbuf;
    RL_TRY(attn_check(B, T, H, KV, hd, e));
    RL_TRY(attn_pick(ATT_FWD, hd, &nbuf, e));
    float scale = 1.0f / sqrtf((float)hd), sl2 = scale * 1.4426950408889634f;
    int vec = hd % 8 == 0 && aligned16(qkv);
    dim3 grid(B * H, (T + ATT_FWD_BR - 1) / ATT_FWD_BR);
    return attn_variant(hd, nbuf, [&](auto HD_, auto NB_) {
        constexpr int HD = decltype(HD_)::value, NB = decltype(NB_)::value;
        RL_LAUNCH((attn_fwd_kernel<HD, NB>), grid, ATT_FWD_THREADS,
                  attn_smem_bytes(ATT_FWD, HD, NB), s, out, lse, qkv, T, H, KV, hd, sl2, vec);
        LAUNCH_CHECK();
        return (int)RL_OK;
    });
}

// head dims padded to nothing: a column's RoPE partner is in the same
// thread's fragments (store_frags)
int rl_k_attn_rope_fusable(int hd) { return hd == 32 || hd == 64 || hd == 128; }

int rl_k_attn_bwd(bf16 *dqkv, float *dsum, float *dq_acc, const bf16 *dout, const bf16 *qkv,
                  const bf16 *out, const float *lse, int B, int T, int H, int KV, int hd,
                  const float *rope, int max_pos, cudaStream_t s, rl_err *e) {
    int nbuf_kv, nbuf_q = 0;
    RL_TRY(attn_check(B, T, H, KV, hd, e));
    if (rope && (!rl_k_attn_rope_fusable(hd) || max_pos < T))
        return rl_errf(e, RL_EINTERNAL, "attention backward: RoPE at the store needs head dim 32, "
                       "64 or 128 (not %d) and max_pos >= T (%d < %d)", hd, max_pos, T);
    attn_rope rp = {rope, rope ? rope + (size_t)max_pos * (hd / 2) : NULL};
    RL_TRY(attn_pick(ATT_DKDV, hd, &nbuf_kv, e));
    if (!dq_acc) RL_TRY(attn_pick(ATT_DQ, hd, &nbuf_q, e));
    int N = B * T, nb = (T + ATT_BR - 1) / ATT_BR;
    RL_LAUNCH(attn_dsum_kernel, rl_cdiv((size_t)N * H, 8), 256, 0, s, dsum, dq_acc, dout, out, N,
              T, H, hd);
    LAUNCH_CHECK();
    float scale = 1.0f / sqrtf((float)hd), sl2 = scale * 1.4426950408889634f;
    int vec = hd % 8 == 0 && aligned16(qkv) && aligned16(dout) && aligned16(dqkv);
    RL_TRY(attn_variant(hd, nbuf_kv, [&](auto HD_, auto NB_) {
        constexpr int HD = decltype(HD_)::value, NB = decltype(NB_)::value;
        RL_LAUNCH((attn_bwd_dkdv_kernel<HD, NB>), dim3(B * KV, nb), ATT_THREADS,
                  attn_smem_bytes(ATT_DKDV, HD, NB), s, dqkv, dq_acc, dout, qkv, lse, dsum, T, H,
                  KV, hd, sl2, scale, vec, rp);
        LAUNCH_CHECK();
        return (int)RL_OK;
    }));
    if (dq_acc) { // a pair per thread, a few waves of 256-thread blocks
        size_t pairs = (size_t)N * H * (hd / 2);
        unsigned blocks = (unsigned)(pairs / 256 + 1 < 65536 ? pairs / 256 + 1 : 65536);
        RL_LAUNCH(attn_dq_store_kernel, blocks, 256, 0, s, dqkv, dq_acc, N, T, H, KV, hd, scale,
                  rp);
        LAUNCH_CHECK();
        return RL_OK;
    }
    return attn_variant(hd, nbuf_q, [&](auto HD_, auto NB_) {
        constexpr int HD = decltype(HD_)::value, NB = decltype(NB_)::value;
        RL_LAUNCH((attn_bwd_dq_kernel<HD, NB>), dim3(B * H, nb), ATT_THREADS,
                  attn_smem_bytes(ATT_DQ, HD, NB), s, dqkv, dout, qkv, lse, dsum, T, H, KV, hd, sl2,
                  scale, vec, rp);
        LAUNCH_CHECK();
        return (int)RL_OK;
    });
}

rl_k_cost rl_k_attn_fwd_cost(int B, int T, int H, int KV, int hd) {
    double N = (double)B * T, causal = (double)T * (T + 1) / 2;
    rl_k_cost c;
    c.flops = 4.0 * B * H * hd * causal;
    c.bytes = N * ((H + 2.0 * KV) * hd * 2 + (double)H * hd * 2 + H * 4.0);
    c.launches = 1;
    return c;
}

rl_k_cost rl_k_attn_bwd_cost(int B, int T, int H, int KV, int hd, int dq_atomic) {
    double N = (double)B * T, causal = (double)T * (T + 1) / 2, qd = (double)H * hd;
    double qkv = N * (H + 2.0 * KV) * hd * 2;
    rl_k_cost c;
    c.flops = (dq_atomic ? 2.5 : 3.5) * 4.0 * B * H * hd * causal + 2 * N * qd;
    c.bytes = (N * qd * 4 + N * H * 4) + (2 * qkv + N * qd * 2 + N * H * 8);
    if (dq_atomic) c.bytes += N * qd * 8; // the accumulator zeroed, then read back
    c.launches = 3;
    return c;
}
