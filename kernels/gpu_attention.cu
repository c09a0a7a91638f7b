// Launchers of the attention kernels (attention_kernels.cuh has the kernels
// and the design notes).
#include <math.h>

#include "kernels/attention_kernels.cuh"
#include "kernels/gpu_internal.cuh"

// ---- host side ----------------------------------------------------------------------------------
// Shared memory: tiles of [64][HD + 8] bf16 -- forward Q + 2 K + 2 V; dK/dV
// K + V + 2 Q + 2 dO (+ lse and D of two query blocks); dQ Q + dO + 2 K + 2 V.
template <int HD> static constexpr size_t tile_bytes() {
    return (size_t)ATT_BR * (HD + 8) * sizeof(bf16);
}
template <int HD> static constexpr size_t fwd_smem() { return 5 * tile_bytes<HD>(); }
template <int HD> static constexpr size_t dkdv_smem() {
    return 6 * tile_bytes<HD>() + 4 * ATT_BR * sizeof(float);
}
template <int HD> static constexpr size_t dq_smem() { return 6 * tile_bytes<HD>(); }

template <int HD> static int attn_set_smem(rl_err *e) {
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void *>(&attn_fwd_kernel<HD>),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fwd_smem<HD>()));
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void *>(&attn_bwd_dkdv_kernel<HD>),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dkdv_smem<HD>()));
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void *>(&attn_bwd_dq_kernel<HD>),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dq_smem<HD>()));
    return RL_OK;
}

int rl_gpu_attn_init(rl_err *e) {
    RL_TRY(attn_set_smem<32>(e));
    RL_TRY(attn_set_smem<64>(e));
    RL_TRY(attn_set_smem<128>(e));
    return RL_OK;
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

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

template <int HD>
static int fwd_launch(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int H, int KV, int hd,
                      float sl2, int vec, cudaStream_t s, rl_err *e) {
    dim3 grid(B * H, (T + ATT_BR - 1) / ATT_BR);
    RL_LAUNCH(attn_fwd_kernel<HD>, grid, ATT_THREADS, fwd_smem<HD>(), s, out, lse, qkv, T, H, KV,
              hd, sl2, vec);
    LAUNCH_CHECK();
    return RL_OK;
}

int rl_k_attn_fwd(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int H, int KV, int hd,
                  cudaStream_t s, rl_err *e) {
    RL_TRY(attn_check(B, T, H, KV, hd, e));
    float scale = 1.0f / sqrtf((float)hd), sl2 = scale * 1.4426950408889634f;
    int vec = hd % 8 == 0 && aligned16(qkv);
    if (hd <= 32) return fwd_launch<32>(out, lse, qkv, B, T, H, KV, hd, sl2, vec, s, e);
    if (hd <= 64) return fwd_launch<64>(out, lse, qkv, B, T, H, KV, hd, sl2, vec, s, e);
    return fwd_launch<128>(out, lse, qkv, B, T, H, KV, hd, sl2, vec, s, e);
}

template <int HD>
static int bwd_launch(bf16 *dqkv, const float *dsum, const bf16 *dout, const bf16 *qkv,
                      const float *lse, int B, int T, int H, int KV, int hd, float sl2, float scale,
                      int vec, cudaStream_t s, rl_err *e) {
    int nb = (T + ATT_BR - 1) / ATT_BR;
    RL_LAUNCH(attn_bwd_dkdv_kernel<HD>, dim3(B * KV, nb), ATT_THREADS, dkdv_smem<HD>(), s, dqkv,
              dout, qkv, lse, dsum, T, H, KV, hd, sl2, scale, vec);
    LAUNCH_CHECK();
    RL_LAUNCH(attn_bwd_dq_kernel<HD>, dim3(B * H, nb), ATT_THREADS, dq_smem<HD>(), s, dqkv, dout,
              qkv, lse, dsum, T, H, KV, hd, sl2, scale, vec);
    LAUNCH_CHECK();
    return RL_OK;
}

int rl_k_attn_bwd(bf16 *dqkv, float *dsum, const bf16 *dout, const bf16 *qkv, const bf16 *out,
                  const float *lse, int B, int T, int H, int KV, int hd, cudaStream_t s,
                  rl_err *e) {
    RL_TRY(attn_check(B, T, H, KV, hd, e));
    int N = B * T;
    RL_LAUNCH(attn_dsum_kernel, rl_cdiv((size_t)N * H, 8), 256, 0, s, dsum, dout, out, N, T, H, hd);
    LAUNCH_CHECK();
    float scale = 1.0f / sqrtf((float)hd), sl2 = scale * 1.4426950408889634f;
    int vec = hd % 8 == 0 && aligned16(qkv) && aligned16(dout) && aligned16(dqkv);
    if (hd <= 32)
        return bwd_launch<32>(dqkv, dsum, dout, qkv, lse, B, T, H, KV, hd, sl2, scale, vec, s, e);
    if (hd <= 64)
        return bwd_launch<64>(dqkv, dsum, dout, qkv, lse, B, T, H, KV, hd, sl2, scale, vec, s, e);
    return bwd_launch<128>(dqkv, dsum, dout, qkv, lse, B, T, H, KV, hd, sl2, scale, vec, s, e);
}
