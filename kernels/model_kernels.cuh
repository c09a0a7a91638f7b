// The model's non-GEMM, non-attention kernels: embedding, RMSNorm, RoPE,
// SwiGLU, the classifier, reductions, AdamW, casts.
//
// Conventions: row-major; fp32 arithmetic everywhere (bf16 only as a storage
// format); no atomics: every output element is owned by one thread, and every
// reduction runs in an order fixed by the shapes alone, so two runs on the
// same inputs give the same bits. Most of these kernels are memory-bound:
// one pass over each operand, coalesced (consecutive threads, consecutive
// addresses), 16-byte accesses where shapes and alignment allow.
//
// The device code lives in this header and the launchers in gpu_kernels.cu,
// so that tests/gpu/kernels_emu.cpp can run these very kernels on the host.
#pragma once

#include <math.h>

#include "kernels/device_common.cuh"
#include "kernels/gpu_layout.h"

extern "C" {
#include "model/model.h"
}

// ---- embedding -----------------------------------------------------------------------
template <int V>
static __global__ void embed_fwd_kernel(float *x0, const bf16 *emb, const int32_t *tok, int D) {
    const bf16 *src = emb + (size_t)tok[blockIdx.x] * D;
    float *dst = x0 + (size_t)blockIdx.x * D;
    for (int j = threadIdx.x * V; j < D; j += blockDim.x * V)
        st_f32<V>(dst + j, ld_bf16<V>(src + j));
}

// One block row per distinct token, threads across channels: the rows of
// one token are summed in ascending position order (the CPU model's order),
// then added once (accumulate) or stored (the first micro-batch of a step:
// the row is not read, so it needs no clearing beforehand).
static __global__ void embed_bwd_kernel(float *demb, const float *dres, const int32_t *uniq,
                                        const int32_t *seg, const int32_t *pos,
                                        const int32_t *count, int D, int accumulate) {
    int u = blockIdx.x, j = blockIdx.y * blockDim.x + threadIdx.x;
    if (u >= *count || j >= D) return;
    float acc = 0.0f;
    for (int p = seg[u]; p < seg[u + 1]; p++) acc += dres[(size_t)pos[p] * D + j];
    float *d = demb + (size_t)uniq[u] * D + j;
    *d = accumulate ? *d + acc : acc;
}

// ---- RMSNorm ----------------------------------------------------------------------------

// One warp per row, each lane V consecutive channels at a time (V = 4 when
// the rows allow 16-byte accesses). The input is the fp32 residual stream,
// the arithmetic fp32; the weight is the bf16 compute copy, as every other
// weight the forward reads (so the fp32 master is the optimizer's alone and
// can be sharded: llama_gpu.h), and the output, which feeds a GEMM, bf16.
template <int V>
static __global__ void rmsnorm_fwd_kernel(bf16 *out, float *rstd, const float *x, const bf16 *w,
                                          int N, int D, float eps) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= N) return;
    const float *xr = x + (size_t)row * D;
    float ss = 0.0f;
    for (int j = lane * V; j < D; j += 32 * V) {
        fvec<V> a = ld_f32<V>(xr + j);
#pragma unroll
        for (int k = 0; k < V; k++) ss += a.v[k] * a.v[k];
    }
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)D + eps);
    if (lane == 0) rstd[row] = r;
    bf16 *o = out + (size_t)row * D;
    for (int j = lane * V; j < D; j += 32 * V) {
        fvec<V> a = ld_f32<V>(xr + j), wv = ld_bf16<V>(w + j), y;
#pragma unroll
        for (int k = 0; k < V; k++) y.v[k] = wv.v[k] * (a.v[k] * r);
        st_bf16<V>(o + j, y);
    }
}

// Backward. dout is bf16 (the GEMM before it writes half the bytes; the
// arithmetic is fp32). With g = dout * w and y = w * x * r:
//   dx = r g - (r^3 / D) x sum_k(g_k x_k)      dw = sum over rows of dout * x * r
// y, when not NULL, gets the forward's output again, w * (x r), in the
// forward's arithmetic on the same x and r, so the same bits: a model that
// does not keep each layer's norm output rebuilds it here, in a pass that
// reads x and w anyway, for the weight gradient's GEMM after it.
// dw is a reduction over all N rows. Deterministically: each warp keeps its
// own partial row of dw in shared memory (no two lanes share an element),
// the block adds its warps in order into partial[block], and a second
// kernel adds the blocks in order, onto dw or (accumulate_dw = 0, the first
// micro-batch) in place of it, without reading it. The block count depends
// on N only.
static int rms_rows_per_block(int N) { return rl_gpu_rms_rows_per_block(N); } // gpu_layout.h
static int rms_blocks(int N) { return rl_gpu_rms_blocks(N); }
// Warps per block: as many as fit 48 KiB of partial rows (up to 8); one warp
// with a larger opt-in limit beyond D = 12288.
static int rms_warps(int D) {
    int w = 8;
    while (w > 1 && (size_t)w * D * sizeof(float) > 48u * 1024) w >>= 1;
    return w;
}

template <int V>
static __global__ void rmsnorm_bwd_kernel(float *dres, bf16 *dres16, bf16 *y, float *partial,
                                          const bf16 *dout, const float *x, const bf16 *w,
                                          const float *rstd, int N, int D, int rows_per_block,
                                          int accumulate) {
    extern __shared__ __align__(16) unsigned char smem[];
    float *acc = reinterpret_cast<float *>(smem); // [warps][D]
    int nw = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *mine = acc + (size_t)warp * D;
    // each lane zeroes, updates and stores only its own V-wide slices of
    // the warp's row: no lane reads another's element before the block barrier
    for (int j = lane * V; j < D; j += 32 * V) st_f32<V>(mine + j, fvec<V>{});
    int r0 = blockIdx.x * rows_per_block, r1 = min(N, r0 + rows_per_block);
    for (int row = r0 + warp; row < r1; row += nw) {
        const bf16 *g = dout + (size_t)row * D;
        const float *xr = x + (size_t)row * D;
        float dot = 0.0f;
        for (int j = lane * V; j < D; j += 32 * V) {
            fvec<V> gv = ld_bf16<V>(g + j), wv = ld_bf16<V>(w + j), xv = ld_f32<V>(xr + j);
#pragma unroll
            for (int k = 0; k < V; k++) dot += gv.v[k] * wv.v[k] * xv.v[k];
        }
        dot = warp_sum(dot);
        float r = rstd[row];
        float c = dot * r * r * r / (float)D;
        float *dr = dres + (size_t)row * D;
        bf16 *d16 = dres16 + (size_t)row * D, *yr = y ? y + (size_t)row * D : NULL;
        for (int j = lane * V; j < D; j += 32 * V) {
            fvec<V> gv = ld_bf16<V>(g + j), wv = ld_bf16<V>(w + j), xv = ld_f32<V>(xr + j), v, yv;
            fvec<V> old = accumulate ? ld_f32<V>(dr + j) : fvec<V>{};
            fvec<V> mv = ld_f32<V>(mine + j);
#pragma unroll
            for (int k = 0; k < V; k++) {
                float dx = r * (gv.v[k] * wv.v[k]) - c * xv.v[k];
                v.v[k] = accumulate ? old.v[k] + dx : dx;
                mv.v[k] += gv.v[k] * xv.v[k] * r;
                yv.v[k] = wv.v[k] * (xv.v[k] * r); // rmsnorm_fwd_kernel's expression
            }
            st_f32<V>(dr + j, v);
            st_bf16<V>(d16 + j, v);
            st_f32<V>(mine + j, mv);
            if (yr) st_bf16<V>(yr + j, yv);
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float sum = 0.0f;
        for (int k = 0; k < nw; k++) sum += acc[(size_t)k * D + j];
        partial[(size_t)blockIdx.x * D + j] = sum;
    }
}

static __global__ void rmsnorm_dw_kernel(float *dw, const float *partial, int nblk, int D,
                                         int accumulate_dw) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= D) return;
    float sum = 0.0f;
    for (int b = 0; b < nblk; b++) sum += partial[(size_t)b * D + j];
    dw[j] = accumulate_dw ? dw[j] + sum : sum;
}

// ---- RoPE ---------------------------------------------------------------------------------

// Rotate-half on pairs (i, i + hd/2) of each head, angles from the CPU
// model's fp32 table (the same numbers Hugging Face computes). The backward
// applies the transposed rotation: the angle's sine negated. Each thread
// takes V consecutive pairs (V = 8: 16-byte accesses, for hd/2 % 8 == 0
// and aligned rows): the model runs it twice per layer over all of q|k.
template <int V>
static __global__ void rope_kernel(bf16 *x, const float *cs, const float *sn, int N, int T, int nh,
                                   int hd, int ld, int inverse) {
    const int half = hd / 2, hv = half / V;
    const float sign = inverse ? -1.0f : 1.0f;
    size_t total = (size_t)N * nh * hv;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % hv) * V;
        size_t rest = idx / hv;
        int hh = (int)(rest % nh);
        int n = (int)(rest / nh);
        size_t at = (size_t)(n % T) * half + i;
        bf16 *v = x + (size_t)n * ld + (size_t)hh * hd + i;
        fvec<V> x1 = ld_bf16<V>(v), x2 = ld_bf16<V>(v + half), c = ld_f32<V>(cs + at),
                s = ld_f32<V>(sn + at), y1, y2;
#pragma unroll
        for (int k = 0; k < V; k++) {
            float sv = sign * s.v[k];
            y1.v[k] = x1.v[k] * c.v[k] - x2.v[k] * sv;
            y2.v[k] = x2.v[k] * c.v[k] + x1.v[k] * sv;
        }
        st_bf16<V>(v, y1);
        st_bf16<V>(v + half, y2);
    }
}

// ---- SwiGLU ----------------------------------------------------------------------------------

// gu rows hold [gate | up] (one GEMM against the contiguous gate and up
// weights); h = silu(gate) * up, in the CPU model's arithmetic. Each thread
// takes V consecutive channels (V = 8: 16-byte accesses when F % 8 == 0).
template <int V> static __global__ void swiglu_fwd_kernel(bf16 *h, const bf16 *gu, int N, int F) {
    size_t FV = (size_t)F / V, total = (size_t)N * FV;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t n = idx / FV, j = idx % FV * V;
        const bf16 *row = gu + n * 2 * F;
        fvec<V> g = ld_bf16<V>(row + j), u = ld_bf16<V>(row + F + j), y;
#pragma unroll
        for (int k = 0; k < V; k++) y.v[k] = swiglu_h(g.v[k], u.v[k]);
        st_bf16<V>(h + n * F + j, y);
    }
}

// h, when not NULL, gets the forward's product again (swiglu_fwd_kernel's
// arithmetic on the same gate and up: the same bits), for the down
// projection's weight gradient after it: a model that does not keep it per
// layer rebuilds it here, where gate and up are read anyway.
template <int V>
static __global__ void swiglu_bwd_kernel(bf16 *dgu, bf16 *h, const bf16 *dh, const bf16 *gu, int N,
                                         int F) {
    size_t FV = (size_t)F / V, total = (size_t)N * FV;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t n = idx / FV, j = idx % FV * V;
        const bf16 *row = gu + n * 2 * F;
        fvec<V> g = ld_bf16<V>(row + j), u = ld_bf16<V>(row + F + j),
                d = ld_bf16<V>(dh + n * F + j);
        fvec<V> dg, du, y;
#pragma unroll
        for (int k = 0; k < V; k++) {
            swiglu_grad(d.v[k], g.v[k], u.v[k], &dg.v[k], &du.v[k]);
            y.v[k] = swiglu_h(g.v[k], u.v[k]);
        }
        bf16 *drow = dgu + n * 2 * F;
        st_bf16<V>(drow + j, dg);
        st_bf16<V>(drow + F + j, du);
        if (h) st_bf16<V>(h + n * F + j, y);
    }
}

// ---- classifier ---------------------------------------------------------------------------------

// One block per row of logits [N, ld] (bf16). The vocabulary is columns
// [0, V); columns V..ld-1 only pad the row (the model rounds the lm_head up
// to a multiple of 64 rows, zero beyond V, for the GEMMs and the 16-byte
// paths) and take no part in the softmax. Pass 1 reads the row once: an
// online (max, sum of exp) per thread, merged in a fixed tree -> the row's
// log-sum-exp (4 bytes kept, never the probabilities) and its loss. With
// grad, pass 2 reads the same row again -- the block's own, just read, so
// mostly from L2 -- and rewrites it in place as scale * (softmax - onehot),
// the padding as exact zeros (the lm_head's backward GEMMs then run over ld
// columns and the padded rows of its gradient come out zero). Loss and
// gradient in one kernel: one DRAM read and one write of the logits,
// instead of a read, then another read and a write in a second kernel.
#define XENT_THREADS 512

static __device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    float M = fmaxf(m, m2);
    if (M == -INFINITY) { // neither has a value yet; a NaN one of them saw is in s or s2
        s += s2;
        return;
    }
    s = s * expf(m - M) + s2 * expf(m2 - M);
    m = M;
}

// VW logits per thread per step: VW = 8 (16-byte accesses) when ld % 8 == 0
// and the row pointer is aligned, whatever V is: the columns at and past V
// in the last vector are masked one by one.
template <int VW>
static __global__ void __launch_bounds__(XENT_THREADS)
    xent_kernel(bf16 *logits, float *losses, float *lse_out, const int32_t *tgt, int V, int ld,
                float scale, int grad) {
    RL_SMEM_STATIC float sm[XENT_THREADS / 32], ss[XENT_THREADS / 32], row_lse;
    bf16 *l = logits + (size_t)blockIdx.x * ld;
    float m = -INFINITY, s = 0.0f;
    // j < V <= ld and ld % VW == 0: the VW-wide access at j stays in the row
    for (int j = threadIdx.x * VW; j < V; j += blockDim.x * VW) {
        fvec<VW> x = ld_bf16<VW>(l + j);
#pragma unroll
        for (int k = 0; k < VW; k++) {
            if (VW > 1 && j + k >= V) continue; // padding
            float v = x.v[k];
            if (v > m) {
                s = s * expf(m - v) + 1.0f;
                m = v;
            } else {
                s += expf(v - m); // a NaN logit lands here and poisons s: it must show
            }
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sm[warp] = m, ss[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = sm[0], S = ss[0];
        for (int k = 1; k < (int)(blockDim.x >> 5); k++) lse_merge(M, S, sm[k], ss[k]);
        float L = M + logf(S);
        if (lse_out) lse_out[blockIdx.x] = L;
        // read before the barrier below: pass 2 overwrites the target's logit
        losses[blockIdx.x] = L - bf2f(l[tgt[blockIdx.x]]);
        row_lse = L;
    }
    if (!grad) return; // the same for the whole block
    __syncthreads();
    float L = row_lse;
    int t = tgt[blockIdx.x];
    for (int j = threadIdx.x * VW; j < ld; j += blockDim.x * VW) {
        fvec<VW> x = j < V ? ld_bf16<VW>(l + j) : fvec<VW>{};
#pragma unroll
        for (int k = 0; k < VW; k++)
            x.v[k] = j + k < V ? (expf(x.v[k] - L) - (j + k == t ? 1.0f : 0.0f)) * scale : 0.0f;
        st_bf16<VW>(l + j, x);
    }
}

// ---- reductions ---------------------------------------------------------------------------------

// x[0:n] summed in double by one block (a multiple of 32 threads, at most
// 1024): each thread a strided slice, a fixed butterfly per warp, then the
// warps in order. The order depends on n and the block size alone. The
// total is valid in thread 0 only.
static __device__ double block_sum_d(const float *x, int n) {
    RL_SMEM_STATIC double part[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
    acc = warp_sum_d(acc);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    double t = 0.0;
    if (threadIdx.x == 0)
        for (int k = 0; k < (int)(blockDim.x >> 5); k++) t += part[k];
    return t;
}

// acc[0] = (reset ? 0 : acc[0]) + weight * mean(losses[0:n]), in double,
// one block of 1024 threads: the micro-batches' losses averaged on the
// device (a few microseconds), read by the host a step later.
static __global__ void __launch_bounds__(1024)
    loss_accum_kernel(float *acc, const float *losses, int n, float weight, int reset) {
    double t = block_sum_d(losses, n);
    if (threadIdx.x == 0) acc[0] = (float)((reset ? 0.0 : (double)acc[0]) + weight * (t / n));
}

// Sum of squares: RL_K_NORM_BLOCKS blocks, block b owns the contiguous
// chunk [b c, (b+1) c) with c = ceil(n / blocks) rounded up to V; threads
// stride through it V at a time accumulating in fp32 (the last block's
// ragged end one by one); a fixed tree per block; then one block adds the
// block sums in order. The layout of the work depends on n and V alone.
// acc summed over a block of 256 threads, a fixed butterfly per warp, then
// the warps in order; valid in thread 0.
static __device__ __forceinline__ float block_sum_256(float acc) {
    RL_SMEM_STATIC float part[8];
    acc = warp_sum(acc);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    float t = 0.0f;
    if (threadIdx.x == 0)
        for (int k = 0; k < 8; k++) t += part[k];
    return t;
}

template <int V>
static __global__ void __launch_bounds__(256)
    sumsq_kernel(float *partial, const float *g, size_t n) {
    size_t chunk = ((n + gridDim.x - 1) / gridDim.x + V - 1) / V * V;
    size_t lo = (size_t)blockIdx.x * chunk;
    size_t hi = lo >= n ? lo : (lo + chunk < n ? lo + chunk : n);
    size_t whole = lo + (hi - lo) / V * V;
    float acc = 0.0f;
    for (size_t i = lo + (size_t)threadIdx.x * V; i < whole; i += (size_t)blockDim.x * V) {
        fvec<V> a = ld_f32<V>(g + i);
#pragma unroll
        for (int k = 0; k < V; k++) acc += a.v[k] * a.v[k];
    }
    for (size_t i = whole + threadIdx.x; i < hi; i += blockDim.x) acc += g[i] * g[i];
    float t = block_sum_256(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = t;
}

static __global__ void __launch_bounds__(1024)
    sqrt_sum_kernel(float *out, const float *partial, int nb) {
    double t = block_sum_d(partial, nb);
    if (threadIdx.x == 0) out[0] = (float)sqrt(t);
}

// ---- AdamW --------------------------------------------------------------------------------------

// The parameter buffer in regions: blockIdx.y = 0 the embedding, 1..L the
// layers, L+1 the final norm and lm_head. Inside a layer the offset is
// small, so "is this a norm weight" (no decay) is two comparisons, not a
// 64-bit modulo per element.
struct adamw_layout {
    size_t layers, layer_size, final_norm, total, ln1, ln2;
    int L, D;
};

// [base, base + len): region reg (blockIdx.y) of the parameters.
static __device__ __forceinline__ void region_of(const adamw_layout &lay, int reg, size_t *base,
                                                 size_t *len) {
    if (reg == 0)
        *base = 0, *len = lay.layers;
    else if (reg <= lay.L)
        *base = lay.layers + (size_t)(reg - 1) * lay.layer_size, *len = lay.layer_size;
    else
        *base = lay.final_norm, *len = lay.total - lay.final_norm;
}

// Whether offset r of region reg is an RMSNorm weight (no decay; init 1).
static __device__ __forceinline__ bool is_norm(const adamw_layout &lay, int reg, size_t r) {
    if (reg == 0) return false;
    if (reg <= lay.L)
        return (r >= lay.ln1 && r < lay.ln1 + lay.D) || (r >= lay.ln2 && r < lay.ln2 + lay.D);
    return r < (size_t)lay.D;
}

// Whether flat offset i is an RMSNorm weight, any region.
static __device__ __forceinline__ bool is_norm_at(const adamw_layout &lay, size_t i) {
    if (i < lay.layers) return false;
    if (i < lay.final_norm) return is_norm(lay, 1, (i - lay.layers) % lay.layer_size);
    return is_norm(lay, lay.L + 1, i - lay.final_norm);
}

// The gradients' factor: grad_scale, times torch's clip_grad_norm_ factor
// when clipping.
static __device__ __forceinline__ float adamw_grad_scale(float norm, const rl_k_adamw_args &a) {
    float gs = a.grad_scale;
    if (a.clip_max > 0.0f) gs *= fminf(1.0f, a.clip_max / (norm + 1e-6f));
    return gs;
}

// One element's update, gradient g already scaled.
static __device__ __forceinline__ void adamw_elem(float *p, float *m, float *v, float g, bool nodecay,
                                                  const rl_k_adamw_args &a) {
    *m = a.b1 * *m + a.c1 * g;
    *v = a.b2 * *v + a.c2 * g * g;
    // PyTorch's order: decay, then p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
    *p = *p * (nodecay ? 1.0f : a.decay) - a.step * *m / (sqrtf(*v) / a.sbc2 + a.eps);
}

// V = 4 when every region starts and ends on a multiple of 4 elements
// (then every access below is 16-byte aligned, 8 for the bf16 copy).
template <int V>
static __global__ void adamw_kernel(float *master, bf16 *params, float *mom, float *vel,
                                    const float *grads, const float *norm, adamw_layout lay,
                                    rl_k_adamw_args a) {
    int reg = blockIdx.y;
    size_t base, len;
    region_of(lay, reg, &base, &len);
    // A non-finite gradient norm (a NaN or inf gradient anywhere) leaves
    // the weights and moments as they are: the host reads the norm after
    // this step is queued and stops the run, whose weights are then intact.
    if (!isfinite(norm[0])) return;
    float gs = adamw_grad_scale(norm[0], a);
    for (size_t r = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V; r < len;
         r += (size_t)gridDim.x * blockDim.x * V) {
        size_t i = base + r;
        fvec<V> g = ld_f32<V>(grads + i), m = ld_f32<V>(mom + i), v = ld_f32<V>(vel + i);
        fvec<V> p = ld_f32<V>(master + i);
#pragma unroll
        for (int k = 0; k < V; k++)
            adamw_elem(&p.v[k], &m.v[k], &v.v[k], g.v[k] * gs, is_norm(lay, reg, r + k), a);
        st_f32<V>(mom + i, m);
        st_f32<V>(vel + i, v);
        st_f32<V>(master + i, p);
        st_bf16<V>(params + i, p);
    }
}

// ---- a rank's shard (dist.shard): the norm's partial and AdamW over its ranges --------------
// Shard element j (0 <= j < held, the order of the compact moments) lies in
// the range k with r[k].at <= j < r[k].at + r[k].len; the ranges come in
// that order and none is empty. A thread bisects for its first j once and
// walks forward as j grows.
static __device__ __forceinline__ int range_find(const rl_k_range *r, int nr, size_t j) {
    int lo = 0, hi = nr - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (r[mid].at <= j) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}
static __device__ __forceinline__ int range_walk(const rl_k_range *r, int k, size_t j) {
    while (j >= r[k].at + r[k].len) k++;
    return k;
}

// sumsq_kernel over the shard's elements of the ranges this rank counts:
// block b owns shard elements [b c, (b+1) c), c = ceil(held / blocks); the
// order depends on the range list alone. compact: g is the shard's own
// gradient (at j), else the flat one (at the range's offset).
static __global__ void __launch_bounds__(256)
    sumsq_ranges_kernel(float *partial, const float *g, const rl_k_range *r, int nr, size_t held, int compact) {
    size_t chunk = (held + gridDim.x - 1) / gridDim.x;
    size_t lo = (size_t)blockIdx.x * chunk, hi = lo + chunk < held ? lo + chunk : held;
    float acc = 0.0f;
    size_t j = lo + threadIdx.x;
    for (int k = j < hi ? range_find(r, nr, j) : 0; j < hi; j += blockDim.x) {
        k = range_walk(r, k, j);
        if (r[k].norm) {
            float x = g[compact ? j : r[k].off + (j - r[k].at)];
            acc += x * x;
        }
    }
    float t = block_sum_256(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = t;
}

static __global__ void __launch_bounds__(1024) sum_d_kernel(double *out, const float *partial, int nb) {
    double t = block_sum_d(partial, nb);
    if (threadIdx.x == 0) out[0] = t;
}

static __global__ void sqrt_d_kernel(float *out, const double *sq) {
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = (float)sqrt(sq[0]);
}

// compact[j] <-> flat[i - lo], i = r[k].off + j - r[k].at, over the shard's
// elements with lo <= i < hi (flat holds the layout's window [lo, hi)):
// to_flat 1 writes the flat array's ranges from the compact one, 0 the
// other way
static __global__ void ranges_copy_kernel(float *compact, float *flat, const rl_k_range *r, int nr,
                                          size_t held, size_t lo, size_t hi, int to_flat) {
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (int k = j < held ? range_find(r, nr, j) : 0; j < held; j += stride) {
        k = range_walk(r, k, j);
        size_t i = r[k].off + (j - r[k].at);
        if (i < lo || i >= hi) continue;
        if (to_flat) flat[i - lo] = compact[j];
        else compact[j] = flat[i - lo];
    }
}

// dst = src (add 0) or dst += src (add 1): a reduced block into a shard's gradient
static __global__ void accum_kernel(float *dst, const float *src, size_t n, int add) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = add ? dst[i] + src[i] : src[i];
}

// adamw_kernel over the shard: master and moments at j (compact), the bf16
// copy at the flat offset, the gradient at j (compact: the shard's own) or
// at the flat offset.
static __global__ void adamw_ranges_kernel(float *master, bf16 *params, float *mom, float *vel,
                                           const float *grads, int compact, const float *norm,
                                           adamw_layout lay, const rl_k_range *r, int nr, size_t held,
                                           rl_k_adamw_args a) {
    if (!isfinite(norm[0])) return; // as adamw_kernel
    float gs = adamw_grad_scale(norm[0], a);
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (int k = j < held ? range_find(r, nr, j) : 0; j < held; j += stride) {
        k = range_walk(r, k, j);
        size_t i = r[k].off + (j - r[k].at);
        float p = master[j], m = mom[j], v = vel[j];
        adamw_elem(&p, &m, &v, grads[compact ? j : i] * gs, is_norm_at(lay, i), a);
        mom[j] = m, vel[j] = v, master[j] = p;
        params[i] = __float2bfloat16_rn(p);
    }
}

static adamw_layout make_layout(const rl_param_layout *lay, int L, int D) {
    adamw_layout l;
    l.layers = lay->layers, l.layer_size = lay->layer_size, l.final_norm = lay->final_norm;
    l.total = lay->total, l.ln1 = lay->in_layer.ln1, l.ln2 = lay->in_layer.ln2;
    l.L = L, l.D = D;
    return l;
}

// ---- casts and init -----------------------------------------------------------------------------
static __global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = f2bf(src[i]);
}
static __global__ void bf16_to_f32_kernel(float *dst, const bf16 *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = bf2f(src[i]);
}

// splitmix64 of (seed, index): independent per element, any launch shape.
static __device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static __global__ void init_random_kernel(float *master, adamw_layout lay, uint64_t seed,
                                          float std) {
    int reg = blockIdx.y;
    size_t base, len;
    region_of(lay, reg, &base, &len);
    for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < len;
         r += (size_t)gridDim.x * blockDim.x) {
        size_t i = base + r;
        if (is_norm(lay, reg, r)) {
            master[i] = 1.0f;
            continue;
        }
        uint64_t h = mix64(seed ^ mix64(i));
        // Box-Muller on two 32-bit uniforms; u1 in (0, 1] keeps log finite
        float u1 = ((float)(uint32_t)(h >> 32) + 1.0f) * 2.3283064e-10f;
        float u2 = (float)(uint32_t)h * 2.3283064e-10f;
        master[i] = std * sqrtf(-2.0f * logf(fminf(u1, 1.0f))) * cospif(2.0f * u2);
    }
}

// ---- one-time setup -----------------------------------------------------------------------------