// Launchers of our GEMMs with SwiGLU and the classifier fused in
// (gemm_kernels.cuh has the kernels and their notes) and their costs for
// the step's plan.
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
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void *>(&gemm_lm_fwd_kernel),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fg_smem_bytes(FG_LM_FWD)));
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void *>(&gemm_lm_dx_kernel),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fg_smem_bytes(FG_LM_DX)));
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void *>(&gemm_lm_dw_kernel),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fg_smem_bytes(FG_LM_DW)));
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

// ---- the classifier ------------------------------------------------------------------------------
static_assert(FG_BN == RL_CLS_TILE, "the layout's statistics tile is the kernel's column tile");

int rl_k_cls_fused_ok(int M, int D, int Vp, const void *const *ptrs, int n) {
    if (M < 1 || D < 8 || D % 8 || Vp % 64 || (M + FG_BM - 1) / FG_BM > 65535 ||
        (Vp + FG_BM - 1) / FG_BM > 65535)
        return 0;
    for (int i = 0; i < n; i++)
        if (ptrs[i] && !vec_ok(ptrs[i], 8, 2)) return 0;
    return 1;
}

static int cls_refuse(int M, int D, int V, int Vp, rl_err *e) {
    return rl_errf(e, RL_EINTERNAL,
                   "cls_fused: M=%d D=%d V=%d Vp=%d or an alignment the kernels do not take", M, D,
                   V, Vp);
}

int rl_k_cls_fused_fwd(bf16 *P, float *stats, float *tlogit, const bf16 *x, const bf16 *wlm,
                       const int32_t *tgt, int M, int D, int V, int Vp, cudaStream_t s, rl_err *e) {
    const void *p[] = {P, x, wlm};
    if (!rl_k_cls_fused_ok(M, D, Vp, p, 3) || V < 1 || V > Vp) return cls_refuse(M, D, V, Vp, e);
    RL_LAUNCH(gemm_lm_fwd_kernel, dim3(rl_cdiv(Vp, FG_BN), rl_cdiv(M, FG_BM)), FG_THREADS,
              fg_smem_bytes(FG_LM_FWD), s, P, stats, tlogit, x, wlm, tgt, M, D, V, Vp);
    LAUNCH_CHECK();
    return RL_OK;
}

int rl_k_cls_merge(float *losses, float *lse, float *fac, const float *stats, const float *tlogit,
                   int M, int Vp, float scale, cudaStream_t s, rl_err *e) {
    RL_LAUNCH(cls_merge_kernel, rl_cdiv(M, 8), 256, 0, s, losses, lse, fac, stats, tlogit, M,
              (int)rl_cdiv(Vp, FG_BN), scale);
    LAUNCH_CHECK();
    return RL_OK;
}

int rl_k_cls_fused_dx(bf16 *dx, const bf16 *P, const float *fac, const int32_t *tgt,
                      const bf16 *wlm, int M, int D, int Vp, float scale, cudaStream_t s,
                      rl_err *e) {
    const void *p[] = {dx, P, wlm};
    if (!rl_k_cls_fused_ok(M, D, Vp, p, 3)) return cls_refuse(M, D, Vp, Vp, e);
    fg_cls c = {fac, tgt, (int)rl_cdiv(Vp, FG_BN), scale};
    RL_LAUNCH(gemm_lm_dx_kernel, dim3(rl_cdiv(D, FG_BN), rl_cdiv(M, FG_BM)), FG_THREADS,
              fg_smem_bytes(FG_LM_DX), s, dx, P, wlm, c, M, D, Vp);
    LAUNCH_CHECK();
    return RL_OK;
}

int rl_k_cls_fused_dw(float *dw, const bf16 *P, const float *fac, const int32_t *tgt,
                      const bf16 *x, int M, int D, int Vp, float scale, int accumulate,
                      cudaStream_t s, rl_err *e) {
    const void *p[] = {P, x, dw};
    if (!rl_k_cls_fused_ok(M, D, Vp, p, 3)) return cls_refuse(M, D, Vp, Vp, e);
    fg_cls c = {fac, tgt, (int)rl_cdiv(Vp, FG_BN), scale};
    RL_LAUNCH(gemm_lm_dw_kernel, dim3(rl_cdiv(D, FG_BN), rl_cdiv(Vp, FG_BM)), FG_THREADS,
              fg_smem_bytes(FG_LM_DW), s, dw, P, x, c, M, D, Vp, accumulate);
    LAUNCH_CHECK();
    return RL_OK;
}

// The forward's product: operands once, P written, the tiles' statistics
// (two floats a tile) and the target logits written
rl_k_cost rl_k_cls_fused_fwd_cost(int M, int D, int Vp) {
    rl_k_cost c = rl_k_gemm_cost(M, Vp, D, 2, 0);
    c.bytes += (double)M * rl_cdiv(Vp, FG_BN) * 4 * 2 + (double)M * (4 + 4);
    return c;
}

// The merge, the classifier's only pass of its own: the statistics and
// target logits read, the factors, losses and lse written
rl_k_cost rl_k_cls_merge_cost(int M, int Vp) {
    double tiles = (double)M * rl_cdiv(Vp, FG_BN);
    rl_k_cost c = {tiles * 6, tiles * 4 * 3 + (double)M * 4 * 3, 1};
    return c;
}

// The backward products: P and the other operand once, the factors and
// targets read; dx written (bf16), dw written or read and written (fp32)
rl_k_cost rl_k_cls_fused_dx_cost(int M, int D, int Vp) {
    rl_k_cost c = rl_k_gemm_cost(M, D, Vp, 2, 0);
    c.bytes += (double)M * rl_cdiv(Vp, FG_BN) * 4 + (double)M * 4;
    return c;
}
rl_k_cost rl_k_cls_fused_dw_cost(int M, int D, int Vp, int accumulate) {
    rl_k_cost c = rl_k_gemm_cost(Vp, D, M, 4, accumulate ? 4 : 0);
    c.bytes += (double)M * rl_cdiv(Vp, FG_BN) * 4 + (double)M * 4;
    return c;
}
