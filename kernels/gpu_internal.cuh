// Internal to kernels/*.cu: error macros, bf16 helpers, the kernel launchers
// and the cuBLASLt wrapper. The C host code sees only llama_gpu.h.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/device_common.cuh"
#include "kernels/gpu_layout.h" // RL_K_NORM_BLOCKS, RL_GEMM_WORKSPACE
#include "kernels/llama_gpu.h"

// ---- errors -------------------------------------------------------------------
// Every host function that can fail has `rl_err *e` in scope and returns an
// rl_err code; these macros turn a CUDA or cuBLAS status into one line naming
// the call, file and line, and return (never exit: the worker decides).
int rl_gpu_cuda_fail(rl_err *e, cudaError_t err, const char *call, const char *file, int line);
int rl_gpu_cublas_fail(rl_err *e, cublasStatus_t st, const char *call, const char *file, int line);

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t rl_ce_ = (call);                                                               \
        if (rl_ce_ != cudaSuccess) return rl_gpu_cuda_fail(e, rl_ce_, #call, __FILE__, __LINE__);  \
    } while (0)
#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t rl_cs_ = (call);                                                            \
        if (rl_cs_ != CUBLAS_STATUS_SUCCESS)                                                       \
            return rl_gpu_cublas_fail(e, rl_cs_, #call, __FILE__, __LINE__);                       \
    } while (0)
// After a kernel launch: a bad configuration is reported at once (the
// kernel's own faults surface at the next synchronising call).
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())
// Propagate an rl_err code from a launcher.
#define RL_TRY(x)                                                                                  \
    do {                                                                                           \
        int rl_rc_ = (x);                                                                          \
        if (rl_rc_) return rl_rc_;                                                                 \
    } while (0)

static inline unsigned rl_cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

// Called once per process before the first launch: raises the dynamic
// shared-memory limit of the kernels that need more than 48 KiB.
int rl_gpu_kernels_init(rl_err *e);

// ---- kernel launchers (gpu_kernels.cu) ----------------------------------------------
// All take the stream last but one and rl_err last; shapes are row-major.
//
// Beside each launcher its cost for the model's step plan: pure host
// arithmetic (no CUDA call), FLOPs (exp, sqrt, divide count one each), the
// DRAM bytes the launch must move at least (each operand read once, each
// output written once) and how many kernels it launches.
typedef struct {
    double flops, bytes;
    int launches;
} rl_k_cost;

// x0[n, :] = emb[tok[n], :]   (bf16 rows widened: the residual stream is fp32)
int rl_k_embed_fwd(float *x0, const bf16 *emb, const int32_t *tok, int N, int D, cudaStream_t s,
                   rl_err *e);
rl_k_cost rl_k_embed_fwd_cost(int N, int D);
// demb[uniq[u], :] (accumulate ? += : =) sum over p in [seg[u], seg[u+1]) of
// dres[pos[p], :]: positions grouped by token id on the host, summed in
// ascending position order, so no atomics and the same bits every run. Only
// the U rows of tokens in the batch are touched (with accumulate = 0 they are
// not read); the others are the caller's to clear.
// The grouping rl_k_embed_bwd wants, computed on the host (gpu_model.cu):
// uniq[U] distinct ids ascending, seg[U + 1] starts into pos[N], positions
// ascending within an id. cnt: V + 1 ints of scratch. Returns U.
int rl_gpu_group_tokens(const int32_t *tok, int N, int V, int32_t *cnt, int32_t *uniq, int32_t *seg,
                        int32_t *pos);
// U is read on the device from *count (it changes with every batch); the
// grid has max_u >= U blocks of ids, those past U returning at once, so a
// captured CUDA graph replays for any batch with max_u = min(N, V).
int rl_k_embed_bwd(float *demb, const float *dres, const int32_t *uniq, const int32_t *seg,
                   const int32_t *pos, const int32_t *count, int max_u, int D, int accumulate,
                   cudaStream_t s, rl_err *e);
rl_k_cost rl_k_embed_bwd_cost(int N, int U, int D);
int rl_k_rmsnorm_fwd(bf16 *out, float *rstd, const float *x, const bf16 *w, int N, int D,
                     float eps, cudaStream_t s, rl_err *e);
rl_k_cost rl_k_rmsnorm_fwd_cost(int N, int D);
// From dout (bf16, the GEMM's output; fp32 arithmetic): dres (=, or += when
// accumulate) and dres16 = bf16(dres); dw (accumulate_dw ? += : =, not read
// then) via partial sums in `partial` (rl_k_rmsnorm_partial_floats(N, D)
// floats); y (NULL: none) the forward's output again, bit for bit. Two
// launches.
size_t rl_k_rmsnorm_partial_floats(int N, int D);
int rl_k_rmsnorm_bwd(float *dres, bf16 *dres16, bf16 *y, float *dw, float *partial,
                     const bf16 *dout, const float *x, const bf16 *w, const float *rstd, int N,
                     int D, int accumulate, int accumulate_dw, cudaStream_t s, rl_err *e);
rl_k_cost rl_k_rmsnorm_bwd_cost(int N, int D, int y);
// In place on rows of width ld: heads [0, nh) of head_dim hd starting at
// column 0 (q heads then k heads of the fused qkv row). rope: [P, hd/2]
// cos, then [P, hd/2] sin (fp32, the CPU model's table).
int rl_k_rope(bf16 *x, const float *rope, int N, int T, int nh, int hd, int ld, int max_pos,
              int inverse, cudaStream_t s, rl_err *e);
rl_k_cost rl_k_rope_cost(int N, int nh, int hd);
int rl_k_swiglu_fwd(bf16 *h, const bf16 *gu, int N, int F, cudaStream_t s, rl_err *e);
rl_k_cost rl_k_swiglu_fwd_cost(int N, int F);
// dgate | dup from dh; h (NULL: none) the forward's product again, bit for bit
int rl_k_swiglu_bwd(bf16 *dgu, bf16 *h, const bf16 *dh, const bf16 *gu, int N, int F,
                    cudaStream_t s, rl_err *e);
rl_k_cost rl_k_swiglu_bwd_cost(int N, int F, int h);
// The classifier, loss and gradient in one kernel. logits: [N, ld] bf16, the
// vocabulary in columns [0, V), V <= ld; columns V..ld-1 are padding, left
// out of the softmax. Writes losses[n] = lse[n] - logit[n, tgt[n]] and
// lse[n] (fp32; lse may be NULL). With grad != 0 it then rewrites each row
// in place: scale * (softmax - onehot(tgt)) for j < V, exactly 0 for
// V <= j < ld; with grad = 0 the logits are only read. Targets must be in
// [0, V) (checked on the host). 16-byte path when ld % 8 == 0 and logits is
// 16-byte aligned, for any V.
int rl_k_xent(bf16 *logits, float *losses, float *lse, const int32_t *tgt, int N, int V, int ld,
              float scale, int grad, cudaStream_t s, rl_err *e);
rl_k_cost rl_k_xent_cost(int N, int V, int ld, int grad);
// acc[0] = (reset ? 0 : acc[0]) + weight * mean(losses[0:n]): the mean in
// double, one block, a fixed order (bit-identical run to run); with reset
// acc is not read. n >= 1. The micro-batch losses of a step averaged on the
// device (weight = 1 / micro-batches), for the host to read a step later.
int rl_k_loss_accum(float *acc, const float *losses, int n, float weight, int reset, cudaStream_t s,
                    rl_err *e);
rl_k_cost rl_k_loss_accum_cost(int n);
// Sum of squares in fixed-size blocks, then one block over the partials:
// out[0] = sqrt(sum g^2). partial: RL_K_NORM_BLOCKS floats. Two launches.
int rl_k_norm(float *out, float *partial, const float *g, size_t n, cudaStream_t s, rl_err *e);
rl_k_cost rl_k_norm_cost(size_t n);

int rl_k_adamw(float *master, bf16 *params, float *mom, float *vel, const float *grads,
               const float *norm, const rl_param_layout *lay, int L, int D,
               const rl_k_adamw_args *a, cudaStream_t s, rl_err *e);
rl_k_cost rl_k_adamw_cost(size_t n_params);
// sq[0] = this rank's sum of g^2 over its counted ranges, in double: fp32
// block partials (RL_K_NORM_BLOCKS floats) summed as rl_k_norm sums them.
// compact: g is the shard's own gradient [held], else the flat one.
int rl_k_norm_sq_ranges(double *sq, float *partial, const float *g, int compact, const rl_k_range *r, int nr,
                        size_t held, cudaStream_t s, rl_err *e);
// out[0] = sqrt(sq[0]), rounded to fp32 (one thread)
int rl_k_sqrt_d(float *out, const double *sq, cudaStream_t s, rl_err *e);
// rl_k_adamw over the shard's ranges: the master, m and v [held] in shard
// order, the bf16 copy at the flat offsets, the gradients at either
// (compact: the shard's own [held])
int rl_k_adamw_ranges(float *master, bf16 *params, float *mom, float *vel, const float *grads, int compact,
                      const float *norm, const rl_param_layout *lay, int L, int D,
                      const rl_k_range *r, int nr, size_t held, const rl_k_adamw_args *a,
                      cudaStream_t s, rl_err *e);
// The shard's elements between its compact array [held] and a flat one
// holding the model's layout's elements [lo, hi) (0, SIZE_MAX: all of it):
// to_flat 1 compact -> flat's ranges, 0 the reverse.
int rl_k_ranges_copy(float *compact, float *flat, const rl_k_range *r, int nr, size_t held, size_t lo,
                     size_t hi, int to_flat, cudaStream_t s, rl_err *e);
int rl_k_f32_to_bf16(bf16 *dst, const float *src, size_t n, cudaStream_t s, rl_err *e);
int rl_k_bf16_to_f32(float *dst, const bf16 *src, size_t n, cudaStream_t s, rl_err *e);
int rl_k_init_random(float *master, const rl_param_layout *lay, int L, int D, uint64_t seed,
                     float std, cudaStream_t s, rl_err *e);

// ---- attention (gpu_attention.cu) ---------------------------------------------------
// Picks, for head_dim hd on the current device, the tile variant each
// attention kernel runs with (double-buffered where the device's shared
// memory per block allows, else single) and raises the kernels' shared-
// memory limits to match; an error naming hd and the device's limit if
// nothing fits. Optional -- every launch does the same on first use -- but
// a model calls it at creation so that a head dim the GPU cannot run fails
// there. Thread-safe.
int rl_gpu_attn_prepare(int hd, rl_err *e);
// qkv: [B*T, (H + 2 KV) * hd] rows (q heads, k heads, v heads), q and k as
// attention sees them (with RoPE: already rotated, rl_k_rope). out:
// [B*T, H*hd]; lse: [B*H, T] (log2 domain, for the backward).
int rl_k_attn_fwd(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int H, int KV, int hd,
                  cudaStream_t s, rl_err *e);
// dqkv (same layout as qkv) from dout [B*T, H*hd]; dsum: [B*H, T] scratch;
// qkv as the forward had it, so dq, dk are with respect to the rotated q, k
// (rl_k_rope's inverse takes them back). dq_acc: NULL, dQ by a kernel of its own that recomputes P and dP (the
// same bits every run); else fp32 [B*T, H*hd] scratch (no initial value
// needed) into which the dK/dV kernel adds dQ's parts with atomics: less
// work, but dQ's last bits depend on the order the CTAs run in. rope (the
// model's cos then sin table of max_pos positions; NULL: none) rotates dq
// and dk back as they are stored, for head dims where
// rl_k_attn_rope_fusable, instead of rl_k_rope's separate inverse pass.
int rl_k_attn_bwd(bf16 *dqkv, float *dsum, float *dq_acc, const bf16 *dout, const bf16 *qkv,
                  const bf16 *out, const float *lse, int B, int T, int H, int KV, int hd,
                  const float *rope, int max_pos, cudaStream_t s, rl_err *e);
int rl_k_attn_rope_fusable(int hd);
// Forward: Q K^T and P V over the causal half (4 B H hd T(T+1)/2 FLOPs,
// FlashAttention's count); q, k, v read once, out and lse written (the
// RoPE table, L2-resident, left out).
rl_k_cost rl_k_attn_fwd_cost(int B, int T, int H, int KV, int hd);
// Backward: D = rowsum(dO o O), then dK/dV and dQ, which both recompute P
// and dP (3.5 x the forward's FLOPs); q, k, v, dO, O, lse, D read once,
// D and dq|dk|dv written. dq_atomic (rl_k_attn_bwd with dq_acc): dQ's
// parts come from the dK/dV kernel (2.5 x the forward's FLOPs), and the
// fp32 accumulator is zeroed and read back once more (a lower bound: its
// atomic additions are left out, as if L2 absorbed them).
rl_k_cost rl_k_attn_bwd_cost(int B, int T, int H, int KV, int hd, int dq_atomic);

// ---- attention through cuDNN (gpu_attn_cudnn.cu) ----------------------------------------
// The same computation as rl_k_attn_fwd/bwd on the same buffers (q|k in
// qkv already rotated, dq|dk with respect to the rotated q|k), through
// cuDNN 9's backend graph API (libcudnn.so.9 dlopen'ed on first use). One
// object per model: a handle, plans per (B, T) built on first use (the
// creation's at creation) and one workspace. stats: [B*H, T], natural log
// (not our kernels' log2): only this backend's backward reads them.
// deterministic: the backward's engines noted non-deterministic are
// skipped (the same bits every run; on hardware such an engine may ask for
// a workspace that grows with T^2); else the heuristic's first that
// finalizes, as rl_gpu_options.attn_dq_atomic allows.
typedef struct rl_cudnn_attn rl_cudnn_attn;
int rl_cudnn_attn_create(rl_cudnn_attn **out, int B, int T, int H, int KV, int hd,
                         int deterministic, cudaStream_t s, rl_err *e);
void rl_cudnn_attn_free(rl_cudnn_attn *a);
size_t rl_cudnn_attn_device_bytes(const rl_cudnn_attn *a);
int rl_k_attn_cudnn_fwd(rl_cudnn_attn *a, bf16 *out, float *stats, const bf16 *qkv, int B, int T,
                        cudaStream_t s, rl_err *e);
int rl_k_attn_cudnn_bwd(rl_cudnn_attn *a, bf16 *dqkv, float *dsum, const bf16 *dout,
                        const bf16 *qkv, const bf16 *out, const float *stats, int B, int T,
                        cudaStream_t s, rl_err *e);
rl_k_cost rl_k_attn_cudnn_fwd_cost(int B, int T, int H, int KV, int hd);
rl_k_cost rl_k_attn_cudnn_bwd_cost(int B, int T, int H, int KV, int hd);
// train.attention: *out NULL for our kernels, else the cuDNN backend to
// use (mode RL_GPU_ATTN_*; auto probes, compares, times and logs).
// deterministic as rl_cudnn_attn_create's, and our kernels' dQ in the
// probe the same way (its own kernel, or atomics).
int rl_gpu_attn_select(rl_cudnn_attn **out, int mode, int B, int T, int H, int KV, int hd,
                       int deterministic, cudaStream_t s, rl_err *e);

// ---- GEMM through cuBLASLt (gpu_gemm.cu) ------------------------------------------------
struct rl_gemm_plan;
typedef struct rl_gemm {
    cublasLtHandle_t lt;
    void *ws; // workspace, allocated once by the owner
    size_t ws_bytes;
    struct rl_gemm_plan *plans; // descriptors + the chosen algorithm per shape
    int n_plans, cap, evict;
    int sm_count; // > 0: cuBLASLt's SM count target for every product (set before the first)
} rl_gemm;
#define RL_GEMM_CANDIDATES 4 // heuristic algorithms timed per shape
int rl_gemm_init(rl_gemm *g, void *ws, size_t ws_bytes, rl_err *e);
void rl_gemm_free(rl_gemm *g);
// Row-major, bf16 operands, fp32 accumulation:
// out[M,N] = in[M,K] . w[N,K]^T (+ res). out_f32: fp32 out (res fp32 or NULL);
// else bf16 out (res must be NULL).
int rl_gemm_fwd(rl_gemm *g, void *out, int out_f32, const bf16 *in, const bf16 *w, const float *res,
                int M, int N, int K, cudaStream_t s, rl_err *e);
// din[M,K] = dout[M,N] . w[N,K]
int rl_gemm_bwd_data(rl_gemm *g, void *din, int din_f32, const bf16 *dout, const bf16 *w, int M,
                     int N, int K, cudaStream_t s, rl_err *e);
// dw[N,K] (accumulate ? += : =) dout[M,N]^T . in[M,K]   (fp32 gradients;
// accumulate = 0 is beta = 0: dw is not read, so it needs no zeroing)
int rl_gemm_bwd_weight(rl_gemm *g, float *dw, const bf16 *dout, const bf16 *in, int M, int N, int K,
                       int accumulate, cudaStream_t s, rl_err *e);
// A product out[M,N] = A[M,K] . B[K,N] (either transposed): 2 M N K FLOPs;
// bf16 A and B read once, out written (out_bytes per element: 2 or 4) and C
// read (c_bytes per element: 4 when accumulating into fp32, else 0)
rl_k_cost rl_k_gemm_cost(int M, int N, int K, int out_bytes, int c_bytes);

// ---- GEMMs with SwiGLU fused in (gpu_gemm_fused.cu, gemm_kernels.cuh) ----------------------
// Shapes as the model's: M tokens, K the hidden size, F the intermediate
// size; gu and dgu rows [gate | up] of 2F.
// Whether the fused kernels take these shapes and the n pointers (NULLs
// skipped): K, F multiples of 8, 16-byte alignment. The model checks once
// at creation and otherwise runs cuBLASLt and the separate SwiGLU kernels.
int rl_k_gemm_swiglu_ok(int M, int K, int F, const void *const *ptrs, int n);
int rl_gemm_swiglu_init(rl_err *e); // from rl_gpu_kernels_init: their shared memory
// gu = x[M,K] . wgu[2F,K]^T and h = silu(gate) * up
int rl_k_gemm_swiglu_fwd(bf16 *gu, bf16 *h, const bf16 *x, const bf16 *wgu, int M, int K, int F,
                         cudaStream_t s, rl_err *e);
rl_k_cost rl_k_gemm_swiglu_fwd_cost(int M, int K, int F);
// dgu = SwiGLU's backward of dh = dy[M,K] . wdown[K,F] at gu; h (may be
// NULL) = silu(gate) * up again
int rl_k_gemm_swiglu_bwd(bf16 *dgu, bf16 *h, const bf16 *dy, const bf16 *wdown, const bf16 *gu,
                         int M, int K, int F, cudaStream_t s, rl_err *e);
rl_k_cost rl_k_gemm_swiglu_bwd_cost(int M, int K, int F, int h);

// ---- the classifier fused (gpu_gemm_fused.cu, gemm_kernels.cuh) ---------------------------------
// M rows of hidden size D, V classes padded to Vp; stats [2][M][ntiles],
// fac [M][ntiles] (ntiles = cdiv(Vp, RL_CLS_TILE)), tlogit [M]. Whether
// the kernels take the shapes and the n pointers (NULLs skipped).
int rl_k_cls_fused_ok(int M, int D, int Vp, const void *const *ptrs, int n);
// P [M, Vp] = exp(logits - the tile's max), the tiles' max and sums, the
// targets' logits
int rl_k_cls_fused_fwd(bf16 *P, float *stats, float *tlogit, const bf16 *x, const bf16 *wlm,
                       const int32_t *tgt, int M, int D, int V, int Vp, cudaStream_t s, rl_err *e);
rl_k_cost rl_k_cls_fused_fwd_cost(int M, int D, int Vp);
// losses, lse (may be NULL) and fac = scale * exp(m_t - lse) from the statistics
int rl_k_cls_merge(float *losses, float *lse, float *fac, const float *stats, const float *tlogit,
                   int M, int Vp, float scale, cudaStream_t s, rl_err *e);
rl_k_cost rl_k_cls_merge_cost(int M, int Vp);
// dx [M, D] = dlogits . wlm and dw [Vp, D] (+)= dlogits^T . x, dlogits =
// P * fac - scale at the target, made in the products' operand loads
int rl_k_cls_fused_dx(bf16 *dx, const bf16 *P, const float *fac, const int32_t *tgt,
                      const bf16 *wlm, int M, int D, int Vp, float scale, cudaStream_t s,
                      rl_err *e);
rl_k_cost rl_k_cls_fused_dx_cost(int M, int D, int Vp);
int rl_k_cls_fused_dw(float *dw, const bf16 *P, const float *fac, const int32_t *tgt,
                      const bf16 *x, int M, int D, int Vp, float scale, int accumulate,
                      cudaStream_t s, rl_err *e);
rl_k_cost rl_k_cls_fused_dw_cost(int M, int D, int Vp, int accumulate);
