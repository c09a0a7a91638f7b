// Launchers of the model's non-GEMM, non-attention kernels
// (model_kernels.cuh has the kernels and their notes).
#include <math.h>

#include "kernels/gpu_internal.cuh"
#include "kernels/model_kernels.cuh"

// Grid-stride loops launch at most this many blocks: enough to fill any
// current GPU several times over.
#define GRID_CAP 8192u

static unsigned grid_for(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return b > GRID_CAP ? GRID_CAP : (unsigned)b;
}

// The cost functions beside each launcher (gpu_internal.cuh): FLOPs (exp,
// sqrt and divide count as one each), the DRAM bytes the launch must move
// at least (each operand read once, each output written once), launches.
static rl_k_cost cost(double flops, double bytes, int launches) {
    rl_k_cost c;
    c.flops = flops, c.bytes = bytes, c.launches = launches;
    return c;
}

// ---- embedding -----------------------------------------------------------------------
int rl_k_embed_fwd(float *x0, const bf16 *emb, const int32_t *tok, int N, int D, cudaStream_t s,
                   rl_err *e) {
    if (D % 4 == 0 && vec_ok(x0, 4, 4) && vec_ok(emb, 4, 2))
        RL_LAUNCH(embed_fwd_kernel<4>, N, 256, 0, s, x0, emb, tok, D);
    else
        RL_LAUNCH(embed_fwd_kernel<1>, N, 256, 0, s, x0, emb, tok, D);
    LAUNCH_CHECK();
    return RL_OK;
}

// token ids and N gathered rows read (a repeated token's row may come from
// L2: an upper bound there), N rows written
rl_k_cost rl_k_embed_fwd_cost(int N, int D) { return cost(0, (double)N * 4 + (double)N * D * (2 + 4), 1); }

int rl_k_embed_bwd(float *demb, const float *dres, const int32_t *uniq, const int32_t *seg,
                   const int32_t *pos, const int32_t *count, int max_u, int D, int accumulate,
                   cudaStream_t s, rl_err *e) {
    if (max_u == 0) return RL_OK;
    dim3 grid(max_u, rl_cdiv(D, 256));
    RL_LAUNCH(embed_bwd_kernel, grid, 256, 0, s, demb, dres, uniq, seg, pos, count, D, accumulate);
    LAUNCH_CHECK();
    return RL_OK;
}

// N rows of dres summed into U rows written, the grouping's ints (+= reads
// the U rows too: U D 4 bytes more on a step's later micro-batches)
rl_k_cost rl_k_embed_bwd_cost(int N, int U, int D) {
    return cost((double)N * D, (double)N * D * 4 + (double)U * D * 4 + (2.0 * U + 1 + N) * 4,
                U > 0);
}

// ---- RMSNorm ----------------------------------------------------------------------------

int rl_k_rmsnorm_fwd(bf16 *out, float *rstd, const float *x, const bf16 *w, int N, int D,
                     float eps, cudaStream_t s, rl_err *e) {
    if (D % 4 == 0 && vec_ok(out, 4, 2) && vec_ok(x, 4, 4) && vec_ok(w, 4, 2))
        RL_LAUNCH(rmsnorm_fwd_kernel<4>, rl_cdiv(N, 8), 256, 0, s, out, rstd, x, w, N, D, eps);
    else
        RL_LAUNCH(rmsnorm_fwd_kernel<1>, rl_cdiv(N, 8), 256, 0, s, out, rstd, x, w, N, D, eps);
    LAUNCH_CHECK();
    return RL_OK;
}

// x (fp32) and w read, out (bf16) and rstd written; sum of squares + scale
rl_k_cost rl_k_rmsnorm_fwd_cost(int N, int D) {
    return cost(4.0 * N * D, (double)N * D * (4 + 2) + (double)D * 2 + (double)N * 4, 1);
}

size_t rl_k_rmsnorm_partial_floats(int N, int D) { return (size_t)rms_blocks(N) * D; }

int rl_k_rmsnorm_bwd(float *dres, bf16 *dres16, bf16 *y, float *dw, float *partial,
                     const bf16 *dout, const float *x, const bf16 *w, const float *rstd, int N,
                     int D, int accumulate, int accumulate_dw, cudaStream_t s, rl_err *e) {
    int nw = rms_warps(D), nblk = rms_blocks(N);
    size_t smem = (size_t)nw * D * sizeof(float);
    if (D % 4 == 0 && vec_ok(dres, 4, 4) && vec_ok(dres16, 4, 2) && vec_ok(dout, 4, 2) &&
        vec_ok(x, 4, 4) && vec_ok(w, 4, 2) && (!y || vec_ok(y, 4, 2)))
        RL_LAUNCH(rmsnorm_bwd_kernel<4>, nblk, nw * 32, smem, s, dres, dres16, y, partial, dout, x,
                  w, rstd, N, D, rms_rows_per_block(N), accumulate);
    else
        RL_LAUNCH(rmsnorm_bwd_kernel<1>, nblk, nw * 32, smem, s, dres, dres16, y, partial, dout, x,
                  w, rstd, N, D, rms_rows_per_block(N), accumulate);
    LAUNCH_CHECK();
    RL_LAUNCH(rmsnorm_dw_kernel, rl_cdiv(D, 256), 256, 0, s, dw, partial, nblk, D, accumulate_dw);
    LAUNCH_CHECK();
    return RL_OK;
}

// dout (bf16), x, w, rstd read; dres read and written (the layers
// accumulate into it: the final norm alone does not read it, 4 N D bytes
// less) and dres16 written; the per-block dw partials written and read back,
// dw read and written (D floats each way whether or not it accumulates);
// with y, the norm's output written again (bf16)
rl_k_cost rl_k_rmsnorm_bwd_cost(int N, int D, int y) {
    double nd = (double)N * D, part = (double)rms_blocks(N) * D;
    return cost(10.0 * nd + part + (y ? 2.0 * nd : 0.0),
                nd * (2 + 4 + 4 + 4 + 2 + (y ? 2 : 0)) + (double)D * (2 + 4 + 4) + (double)N * 4 +
                    part * 4 * 2,
                2);
}

// ---- RoPE ---------------------------------------------------------------------------------

int rl_k_rope(bf16 *x, const float *rope, int N, int T, int nh, int hd, int ld, int max_pos,
              int inverse, cudaStream_t s, rl_err *e) {
    int half = hd / 2;
    size_t total = (size_t)N * nh * half;
    const float *sn = rope + (size_t)max_pos * half;
    if (half % 8 == 0 && ld % 8 == 0 && vec_ok(x, 8, 2) && vec_ok(rope, 4, 4) && vec_ok(sn, 4, 4))
        RL_LAUNCH(rope_kernel<8>, grid_for(total / 8, 256), 256, 0, s, x, rope, sn, N, T, nh, hd,
                  ld, inverse);
    else
        RL_LAUNCH(rope_kernel<1>, grid_for(total, 256), 256, 0, s, x, rope, sn, N, T, nh, hd, ld,
                  inverse);
    LAUNCH_CHECK();
    return RL_OK;
}

// nh heads of hd bf16 read and written in place; 6 FLOPs per rotated pair.
// The cos/sin table is left out: T x hd fp32, read once per position and
// then from L2 for the batch's other sequences (0.3% of the bytes at T 2048,
// 36 heads of 64, batch 8)
rl_k_cost rl_k_rope_cost(int N, int nh, int hd) {
    double el = (double)N * nh * hd;
    return cost(3.0 * el, el * 2 * 2, 1);
}

// ---- SwiGLU ----------------------------------------------------------------------------------

int rl_k_swiglu_fwd(bf16 *h, const bf16 *gu, int N, int F, cudaStream_t s, rl_err *e) {
    if (F % 8 == 0 && vec_ok(h, 8, 2) && vec_ok(gu, 8, 2))
        RL_LAUNCH(swiglu_fwd_kernel<8>, grid_for((size_t)N * F / 8, 256), 256, 0, s, h, gu, N, F);
    else
        RL_LAUNCH(swiglu_fwd_kernel<1>, grid_for((size_t)N * F, 256), 256, 0, s, h, gu, N, F);
    LAUNCH_CHECK();
    return RL_OK;
}

// gate | up read, h written (bf16)
rl_k_cost rl_k_swiglu_fwd_cost(int N, int F) {
    double nf = (double)N * F;
    return cost(6.0 * nf, nf * 2 * 3, 1);
}

int rl_k_swiglu_bwd(bf16 *dgu, bf16 *h, const bf16 *dh, const bf16 *gu, int N, int F,
                    cudaStream_t s, rl_err *e) {
    if (F % 8 == 0 && vec_ok(dgu, 8, 2) && vec_ok(dh, 8, 2) && vec_ok(gu, 8, 2) &&
        (!h || vec_ok(h, 8, 2)))
        RL_LAUNCH(swiglu_bwd_kernel<8>, grid_for((size_t)N * F / 8, 256), 256, 0, s, dgu, h, dh, gu,
                  N, F);
    else
        RL_LAUNCH(swiglu_bwd_kernel<1>, grid_for((size_t)N * F, 256), 256, 0, s, dgu, h, dh, gu, N,
                  F);
    LAUNCH_CHECK();
    return RL_OK;
}

// gate | up and dh read, dgate | dup written (bf16); with h, the product
// written again
rl_k_cost rl_k_swiglu_bwd_cost(int N, int F, int h) {
    double nf = (double)N * F;
    return cost((h ? 16.0 : 14.0) * nf, nf * 2 * (h ? 6 : 5), 1);
}

// ---- classifier ---------------------------------------------------------------------------------

int rl_k_xent(bf16 *logits, float *losses, float *lse, const int32_t *tgt, int N, int V, int ld,
              float scale, int grad, cudaStream_t s, rl_err *e) {
    if (V < 1 || ld < V)
        return rl_errf(e, RL_EINTERNAL,
                       "xent: vocabulary V %d and row length ld %d (need 1 <= V <= ld)", V, ld);
    if (N < 1) return RL_OK;
    if (ld % 8 == 0 && vec_ok(logits, 8, 2))
        RL_LAUNCH(xent_kernel<8>, N, XENT_THREADS, 0, s, logits, losses, lse, tgt, V, ld, scale,
                  grad);
    else
        RL_LAUNCH(xent_kernel<1>, N, XENT_THREADS, 0, s, logits, losses, lse, tgt, V, ld, scale,
                  grad);
    LAUNCH_CHECK();
    return RL_OK;
}

// The V logits of each row read once; targets read, losses and lse written;
// with grad the whole row (ld) written. Pass 2's second read of the row is
// not counted: the block re-reads the row it has just read, from L2 -- but
// with ld * 2 bytes per block (100 KB at V = 50k) and a few blocks per SM in
// flight, that is about an H100's whole L2, so some of it may come from DRAM:
// this is the floor, not a promise.
rl_k_cost rl_k_xent_cost(int N, int V, int ld, int grad) {
    double nv = (double)N * V;
    return cost(nv * (grad ? 8 : 4), nv * 2 + (double)N * 4 * 3 + (grad ? (double)N * ld * 2 : 0),
                1);
}

// ---- reductions ---------------------------------------------------------------------------------

int rl_k_loss_accum(float *acc, const float *losses, int n, float weight, int reset, cudaStream_t s,
                    rl_err *e) {
    if (n < 1) return rl_errf(e, RL_EINTERNAL, "loss_accum: n %d losses (need at least 1)", n);
    RL_LAUNCH(loss_accum_kernel, 1, 1024, 0, s, acc, losses, n, weight, reset);
    LAUNCH_CHECK();
    return RL_OK;
}

// n losses read, the accumulator read and written
rl_k_cost rl_k_loss_accum_cost(int n) { return cost((double)n + 2, (double)n * 4 + 8, 1); }


int rl_k_norm(float *out, float *partial, const float *g, size_t n, cudaStream_t s, rl_err *e) {
    if (vec_ok(g, 4, 4))
        RL_LAUNCH(sumsq_kernel<4>, RL_K_NORM_BLOCKS, 256, 0, s, partial, g, n);
    else
        RL_LAUNCH(sumsq_kernel<1>, RL_K_NORM_BLOCKS, 256, 0, s, partial, g, n);
    LAUNCH_CHECK();
    RL_LAUNCH(sqrt_sum_kernel, 1, 1024, 0, s, out, partial, RL_K_NORM_BLOCKS);
    LAUNCH_CHECK();
    return RL_OK;
}

// n fp32 read once; the block partials written and read back, the norm written
rl_k_cost rl_k_norm_cost(size_t n) {
    return cost(2.0 * n + RL_K_NORM_BLOCKS, (double)n * 4 + RL_K_NORM_BLOCKS * 4.0 * 2 + 4, 2);
}

// ---- AdamW --------------------------------------------------------------------------------------

static dim3 region_grid(const rl_param_layout *lay, int L, unsigned per_thread) {
    size_t mx = lay->layers;
    if (lay->layer_size > mx) mx = lay->layer_size;
    if (lay->total - lay->final_norm > mx) mx = lay->total - lay->final_norm;
    // regions share grid.x: cap it so small regions' idle blocks stay cheap
    unsigned gx = rl_cdiv(mx, 256u * per_thread);
    if (gx > 2048) gx = 2048;
    return dim3(gx ? gx : 1, L + 2);
}

int rl_k_adamw(float *master, bf16 *params, float *mom, float *vel, const float *grads,
               const float *norm, const rl_param_layout *lay, int L, int D,
               const rl_k_adamw_args *a, cudaStream_t s, rl_err *e) {
    // whole float4s in every region, and aligned buffers: the 16-byte path
    bool v4 = lay->layers % 4 == 0 && lay->layer_size % 4 == 0 && lay->final_norm % 4 == 0 &&
              lay->total % 4 == 0 && vec_ok(master, 4, 4) && vec_ok(params, 4, 2) &&
              vec_ok(mom, 4, 4) && vec_ok(vel, 4, 4) && vec_ok(grads, 4, 4);
    if (v4)
        RL_LAUNCH(adamw_kernel<4>, region_grid(lay, L, 4), 256, 0, s, master, params, mom, vel,
                  grads, norm, make_layout(lay, L, D), *a);
    else
        RL_LAUNCH(adamw_kernel<1>, region_grid(lay, L, 1), 256, 0, s, master, params, mom, vel,
                  grads, norm, make_layout(lay, L, D), *a);
    LAUNCH_CHECK();
    return RL_OK;
}

// per parameter: grad, master, m, v read (fp32); master, m, v written (fp32)
// and the bf16 copy: 30 bytes (over a shard too: its master is compact)
rl_k_cost rl_k_adamw_cost(size_t n_params) { return cost(16.0 * n_params, 30.0 * n_params, 1); }

int rl_k_norm_sq_ranges(double *sq, float *partial, const float *g, int compact, const rl_k_range *r, int nr,
                        size_t held, cudaStream_t s, rl_err *e) {
    if (nr < 1 || held == 0) return rl_errf(e, RL_EINTERNAL, "norm over a shard of %d ranges", nr);
    RL_LAUNCH(sumsq_ranges_kernel, RL_K_NORM_BLOCKS, 256, 0, s, partial, g, r, nr, held, compact);
    LAUNCH_CHECK();
    RL_LAUNCH(sum_d_kernel, 1, 1024, 0, s, sq, partial, RL_K_NORM_BLOCKS);
    LAUNCH_CHECK();
    return RL_OK;
}

int rl_k_sqrt_d(float *out, const double *sq, cudaStream_t s, rl_err *e) {
    RL_LAUNCH(sqrt_d_kernel, 1, 32, 0, s, out, sq);
    LAUNCH_CHECK();
    return RL_OK;
}

int rl_k_adamw_ranges(float *master, bf16 *params, float *mom, float *vel, const float *grads, int compact,
                      const float *norm, const rl_param_layout *lay, int L, int D,
                      const rl_k_range *r, int nr, size_t held, const rl_k_adamw_args *a,
                      cudaStream_t s, rl_err *e) {
    if (nr < 1 || held == 0) return rl_errf(e, RL_EINTERNAL, "adamw over a shard of %d ranges", nr);
    RL_LAUNCH(adamw_ranges_kernel, grid_for(held, 256), 256, 0, s, master, params, mom, vel, grads,
              compact, norm, make_layout(lay, L, D), r, nr, held, *a);
    LAUNCH_CHECK();
    return RL_OK;
}

int rl_k_ranges_copy(float *compact, float *flat, const rl_k_range *r, int nr, size_t held, size_t lo,
                     size_t hi, int to_flat, cudaStream_t s, rl_err *e) {
    if (nr < 1 || held == 0) return rl_errf(e, RL_EINTERNAL, "copy over a shard of %d ranges", nr);
    RL_LAUNCH(ranges_copy_kernel, grid_for(held, 256), 256, 0, s, compact, flat, r, nr, held, lo, hi, to_flat);
    LAUNCH_CHECK();
    return RL_OK;
}

int rl_gpu_accum_f32(float *dst, const float *src, size_t n, int add, cudaStream_t s, rl_err *e) {
    if (n == 0) return RL_OK;
    RL_LAUNCH(accum_kernel, grid_for(n, 256), 256, 0, s, dst, src, n, add);
    LAUNCH_CHECK();
    return RL_OK;
}

// ---- casts and init -----------------------------------------------------------------------------
int rl_k_f32_to_bf16(bf16 *dst, const float *src, size_t n, cudaStream_t s, rl_err *e) {
    if (!n) return RL_OK;
    RL_LAUNCH(f32_to_bf16_kernel, grid_for(n, 256), 256, 0, s, dst, src, n);
    LAUNCH_CHECK();
    return RL_OK;
}

int rl_k_bf16_to_f32(float *dst, const bf16 *src, size_t n, cudaStream_t s, rl_err *e) {
    if (!n) return RL_OK;
    RL_LAUNCH(bf16_to_f32_kernel, grid_for(n, 256), 256, 0, s, dst, src, n);
    LAUNCH_CHECK();
    return RL_OK;
}

// the C entry points (llama_gpu.h) DDP's bf16 reduction uses
int rl_gpu_cast_f32_to_bf16(void *dst, const float *src, size_t n, cudaStream_t s, rl_err *e) {
    return rl_k_f32_to_bf16((bf16 *)dst, src, n, s, e);
}
int rl_gpu_cast_bf16_to_f32(float *dst, const void *src, size_t n, cudaStream_t s, rl_err *e) {
    return rl_k_bf16_to_f32(dst, (const bf16 *)src, n, s, e);
}

int rl_k_init_random(float *master, const rl_param_layout *lay, int L, int D, uint64_t seed,
                     float std, cudaStream_t s, rl_err *e) {
    RL_LAUNCH(init_random_kernel, region_grid(lay, L, 1), 256, 0, s, master, make_layout(lay, L, D),
              seed, std);
    LAUNCH_CHECK();
    return RL_OK;
}

// ---- one-time setup -----------------------------------------------------------------------------
int rl_gpu_kernels_init(rl_err *e) {
    // Per process and device; the model and the tests call it before their
    // first launch. Not thread-safe by design: one trainer thread drives a GPU.
    static int done_for = -1;
    int dev;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (done_for == dev) return RL_OK;
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void *>(&rmsnorm_bwd_kernel<1>),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void *>(&rmsnorm_bwd_kernel<4>),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    RL_TRY(rl_gemm_swiglu_init(e));
    done_for = dev; // attention's limits: per head dim, rl_gpu_attn_prepare
    return RL_OK;
}
