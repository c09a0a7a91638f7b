// Launchers of the GEMMs with SwiGLU fused in (gemm_kernels.cuh has the
// kernels and their notes) and their costs for the step's plan.
#include "kernels/gemm_kernels.cuh"
#include "kernels/gpu_internal.cuh"

// K and F multiples of 8 and every operand 16-byte aligned: the kernels'
// cp.async chunks and paired stores need both. Grid rows are token tiles
// (gridDim.y, at most 65535 of them).
int rl_k_gemm_swiglu_ok(int M, int K, int F, const void *const *ptrs, int n) {
    if (M < 1 || K < 8 || F < 8 || K % 8 || F % 8 || (M + FG_BM - 1) / FG_BM > 65535) return 0;
    for (int i = 0; i < n; i++)
        if (ptrs[i] && !vec_ok(ptrs[i], 8, 2)) return 0;
    return 1;
}

int rl_gemm_swiglu_init(rl_err *e) {
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void *>(&gemm_swiglu_fwd_kernel),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fg_smem_bytes(FG_FWD)));
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void *>(&gemm_swiglu_bwd_kernel),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fg_smem_bytes(FG_BWD)));
    return RL_OK;
}

static int refuse(int M, int K, int F, rl_err *e) {
    return rl_errf(e, RL_EINTERNAL,
                   "gemm_swiglu: M=%d K=%d F=%d or an operand's alignment is not what the fused "
                   "kernel takes (K, F multiples of 8, 16-byte aligned)",
                   M, K, F);
}

int rl_k_gemm_swiglu_fwd(bf16 *gu, bf16 *h, const bf16 *x, const bf16 *wgu, int M, int K, int F,
                         cudaStream_t s, rl_err *e) {
    const void *p[] = {gu, h, x, wgu};
    if (!rl_k_gemm_swiglu_ok(M, K, F, p, 4)) return refuse(M, K, F, e);
    dim3 grid(rl_cdiv(F, FG_BN / 2), rl_cdiv(M, FG_BM));
    RL_LAUNCH(gemm_swiglu_fwd_kernel, grid, FG_THREADS, fg_smem_bytes(FG_FWD), s, gu, h, x, wgu, M,
              K, F);
    LAUNCH_CHECK();
    return RL_OK;
}

int rl_k_gemm_swiglu_bwd(bf16 *dgu, bf16 *h, const bf16 *dy, const bf16 *wdown, const bf16 *gu,
                         int M, int K, int F, cudaStream_t s, rl_err *e) {
    const void *p[] = {dgu, h, dy, wdown, gu};
    if (!rl_k_gemm_swiglu_ok(M, K, F, p, 5)) return refuse(M, K, F, e);
    dim3 grid(rl_cdiv(F, FG_BN), rl_cdiv(M, FG_BM));
    RL_LAUNCH(gemm_swiglu_bwd_kernel, grid, FG_THREADS, fg_smem_bytes(FG_BWD), s, dgu, h, dy, wdown,
              gu, M, K, F);
    LAUNCH_CHECK();
    return RL_OK;
}

// The plan counts the product's FLOPs alone (SwiGLU's 6 to 16 per element
// are noise beside its 2 K; GEMM FLOPs stay 6 x matrix parameters x
// tokens). Bytes: the operands once, gate|up and h written.
rl_k_cost rl_k_gemm_swiglu_fwd_cost(int M, int K, int F) {
    rl_k_cost c = rl_k_gemm_cost(M, 2 * F, K, 2, 0);
    c.bytes += 2.0 * M * F;
    return c;
}

// dy and Wdown once; gate|up read, d gate|d up written, h written when
// rebuilt; dh itself never leaves the chip
rl_k_cost rl_k_gemm_swiglu_bwd_cost(int M, int K, int F, int h) {
    rl_k_cost c = rl_k_gemm_cost(M, F, K, 0, 0);
    c.bytes += (double)M * F * 2 * (2 + 2 + (h ? 1 : 0));
    return c;
}
