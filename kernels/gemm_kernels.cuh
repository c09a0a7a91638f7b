// GEMMs of our own with the memory-bound work next to them fused in
// (issue 13: SwiGLU's separate passes were 21.7 GB and the classifier's
// 6.6 GB of config a's 53 GB of memory-bound traffic per step, and
// cuBLASLt's fixed epilogues cannot take them in):
//
//   fwd  [gate | up] = x . Wgu^T and h = silu(gate) * up, both from the
//        product's tile: each CTA computes the same 64 columns of gate and
//        of up (Wgu's rows j and F + j), so a thread holds the gate and up
//        of its elements in its own accumulators. gate|up are stored (the
//        backward reads them), h beside them; no pass reads gu back.
//   bwd  dh = dy . Wdown, never stored: the epilogue reads gate and up at
//        its elements, turns dh into d gate | d up and, when asked, writes
//        h again (the recompute mode's rebuild, as swiglu_bwd_kernel).
//   the classifier (its section below): the lm_head product's epilogue
//        keeps the softmax's statistics per tile of logits, and the two
//        backward products make dlogits as they stage their operand.
//
// SwiGLU's arithmetic is the separate path's, in the same order per element:
// the accumulator rounded to bf16 first (what cuBLASLt stores), then
// swiglu_h / swiglu_grad (device_common.cuh) on those bf16 values. So given
// the same gate|up and dh, the bits equal swiglu_fwd_kernel's and
// swiglu_bwd_kernel's; only the products' own rounding differs from
// cuBLASLt's (a different order of fp32 sums).
//
// The product: CTA tile 128 x 128, k step 32, 8 warps of 64 x 32 (4 m16 x
// 4 n8 mma.sync tiles each, 16 per k16 step: 64 fp32 accumulators a
// thread), operand tiles staged through shared memory in three cp.async
// stages (one barrier per k step), ldmatrix fragment loads from tiles with
// rows padded by 8 elements (conflict-free, as attention's). x and dy are
// read as row-major [M, K] A tiles; Wgu as [n][k] tiles (its rows are the
// output columns: ldmatrix), Wdown as [k][n] tiles (ldmatrix.trans). Rows
// past M, columns past F and k past K are zero-filled by cp.async. Needs K
// and F multiples of 8 and 16-byte aligned operands (the launcher checks;
// the model takes the separate path otherwise). No atomics, no split-K:
// every output element is summed by one thread in k order, so a repeated
// step gives the same bits.
#pragma once

#include "kernels/device_common.cuh"
#include "kernels/mma_common.cuh"

#define FG_BM 128 // rows per CTA
#define FG_BN 128 // output columns per CTA (fwd: 64 of gate + the same 64 of up)
#define FG_BK 32  // k per stage
#define FG_STAGES 3
#define FG_THREADS 256
#define FG_STR (FG_BK + 8)    // [row][k] tiles' row stride (elements)
#define FG_STR_KN (FG_BN + 8) // [k][n] and [k][m] tiles' row stride

// The products, by their operand layouts (A [M, K] and B, row-major in
// global memory; "mk" = A's rows are its output rows, "km" = A stored
// transposed, "nk" = B's rows are output columns, "kn" = B's rows are k):
//   FG_FWD     SwiGLU's gate|up   x [M, K] . Wgu [2F, K]^T      A mk, B nk, paired
//   FG_BWD     SwiGLU's dh        dy [M, K] . Wdown [K, F]      A mk, B kn
//   FG_LM_FWD  the logits         x [M, K] . Wlm [Vp, K]^T      A mk, B nk
//   FG_LM_DX   d x of lm_head     dlogits [M, Vp] . Wlm [Vp, N] A mk made from P, B kn
//   FG_LM_DW   d Wlm              dlogits^T [Vp, M'] . x [M', N] A km made from P, B kn
enum fg_kind { FG_FWD, FG_BWD, FG_LM_FWD, FG_LM_DX, FG_LM_DW };
static __host__ __device__ constexpr bool fg_a_km(int kind) { return kind == FG_LM_DW; }
static __host__ __device__ constexpr bool fg_b_nk(int kind) {
    return kind == FG_FWD || kind == FG_LM_FWD;
}
static __host__ __device__ constexpr size_t fg_a_tile(int kind) {
    return fg_a_km(kind) ? (size_t)FG_BK * FG_STR_KN : (size_t)FG_BM * FG_STR;
}
static __host__ __device__ constexpr size_t fg_b_tile(int kind) {
    return fg_b_nk(kind) ? (size_t)FG_BN * FG_STR : (size_t)FG_BK * FG_STR_KN;
}
static __host__ __device__ constexpr size_t fg_smem_bytes(int kind) {
    return FG_STAGES * (fg_a_tile(kind) + fg_b_tile(kind)) * sizeof(bf16);
}

// The classifier's backward operands: dlogits is never stored. The fused
// forward leaves P = exp(logit - m_t) (bf16) per row and column tile t of
// FG_BN logits, and the merge kernel the factor fac[row][t] = scale *
// exp(m_t - lse[row]); so dlogits = P * fac - scale at the target, made
// from each staged P chunk in shared memory before the tile is used.
struct fg_cls {
    const float *fac;   // [rows][ntiles]
    const int32_t *tgt; // [rows]
    int ntiles;
    float scale;
};

// 8 staged P values of row `row` from column col on -> dlogits, in place
static __device__ __forceinline__ void fg_dlogits(bf16 *p, const fg_cls &c, int row, int col) {
    float f = c.fac[(size_t)row * c.ntiles + col / FG_BN];
    int t = c.tgt[row] - col;
#pragma unroll
    for (int e = 0; e < 8; e++) p[e] = f2bf(bf2f(p[e]) * f - (e == t ? c.scale : 0.0f));
}

// Stage k tile kt of A and B into As, Bs: 512 16-byte chunks each, two per
// thread. A is [M, K] (mk) or [K, M] (km), B [N, K] (nk) or [K, N] (kn):
// leading dimensions K, M, K, N. Chunks past an edge are zero-filled. The
// dlogits kinds then turn this thread's own A chunks into dlogits (cls):
// its cp.async copies have landed once it has waited for their group, so
// only the barrier after that is needed before other warps read them.
template <int KIND>
static __device__ __forceinline__ void fg_load(bf16 *As, bf16 *Bs, const bf16 *A, const bf16 *W,
                                               int M, int K, int N, int m0, int j0, int kt) {
    const int k0 = kt * FG_BK;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int c = threadIdx.x + i * FG_THREADS;
        if constexpr (fg_a_km(KIND)) {
            int k = c >> 4, mc = (c & 15) * 8;
            bool ok = k0 + k < K && m0 + mc < M;
            cp_async16(As + k * FG_STR_KN + mc, ok ? A + (size_t)(k0 + k) * M + m0 + mc : A, ok);
        } else {
            int r = c >> 2, kc = (c & 3) * 8;
            bool ok = m0 + r < M && k0 + kc < K;
            cp_async16(As + r * FG_STR + kc, ok ? A + (size_t)(m0 + r) * K + k0 + kc : A, ok);
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int c = threadIdx.x + i * FG_THREADS;
        if constexpr (fg_b_nk(KIND)) {
            // tile row n is B's row j0 + n; paired (SwiGLU): gate row j0 + n
            // for n < 64, else up row N + j0 + n - 64
            int n = c >> 2, kc = (c & 3) * 8;
            int j = KIND == FG_FWD ? j0 + (n & 63) : j0 + n;
            bool ok = j < N && k0 + kc < K;
            size_t row = (size_t)j + (KIND == FG_FWD && n >= 64 ? (size_t)N : 0);
            cp_async16(Bs + n * FG_STR + kc, ok ? W + row * K + k0 + kc : W, ok);
        } else {
            int k = c >> 4, nc = (c & 15) * 8;
            bool ok = k0 + k < K && j0 + nc < N;
            cp_async16(Bs + k * FG_STR_KN + nc, ok ? W + (size_t)(k0 + k) * N + j0 + nc : W, ok);
        }
    }
}

// This thread's A chunks of stage kt (as fg_load placed them) into dlogits.
template <int KIND>
static __device__ __forceinline__ void fg_make_dlogits(bf16 *As, const fg_cls &cls, int M, int K,
                                                       int m0, int kt) {
    const int k0 = kt * FG_BK;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int c = threadIdx.x + i * FG_THREADS;
        if constexpr (KIND == FG_LM_DW) { // [k = token][m = vocabulary]
            int k = c >> 4, mc = (c & 15) * 8;
            if (k0 + k < K && m0 + mc < M) fg_dlogits(As + k * FG_STR_KN + mc, cls, k0 + k, m0 + mc);
        } else { // [m = token][k = vocabulary]
            int r = c >> 2, kc = (c & 3) * 8;
            if (m0 + r < M && k0 + kc < K) fg_dlogits(As + r * FG_STR + kc, cls, m0 + r, k0 + kc);
        }
    }
}

// The main loop: acc[mi][ni] is the warp's m16 tile mi and n8 tile ni (fwd:
// ni 0, 1 gate columns 16 wn + 8 ni; 2, 3 the same columns of up; others:
// 32 wn + 8 ni), over all of K.
template <int KIND>
static __device__ __forceinline__ void fg_mainloop(float (&acc)[4][4][4], const bf16 *A,
                                                   const bf16 *W, int M, int K, int N, int m0,
                                                   int j0, const fg_cls &cls) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr size_t AT = fg_a_tile(KIND), BT = fg_b_tile(KIND);
    bf16 *As = reinterpret_cast<bf16 *>(smem), *Bs = As + FG_STAGES * AT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
    const int nk = (K + FG_BK - 1) / FG_BK;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[mi][ni][q] = 0.0f;
    // stages 0 .. STAGES-2 in flight; a group is committed every step, empty
    // or not, so "all but the newest STAGES-2 landed" always means tile kt
#pragma unroll
    for (int st = 0; st < FG_STAGES - 1; st++) {
        if (st < nk) fg_load<KIND>(As + st * AT, Bs + st * BT, A, W, M, K, N, m0, j0, st);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<FG_STAGES - 2>();
        bf16 *as = As + (kt % FG_STAGES) * AT;
        const bf16 *bs = Bs + (kt % FG_STAGES) * BT;
        if constexpr (KIND == FG_LM_DX || KIND == FG_LM_DW)
            fg_make_dlogits<KIND>(as, cls, M, K, m0, kt);
        __syncthreads(); // tile kt visible; every warp is done with tile kt - 1's buffer
        int nxt = kt + FG_STAGES - 1;
        if (nxt < nk)
            fg_load<KIND>(As + (nxt % FG_STAGES) * AT, Bs + (nxt % FG_STAGES) * BT, A, W, M, K, N,
                          m0, j0, nxt);
        cp_async_commit();
#pragma unroll
        for (int ks = 0; ks < FG_BK; ks += 16) {
            uint32_t a[4][4], b[2][4];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                if constexpr (fg_a_km(KIND))
                    ldsm_x4_t(a[mi], a_frag_addr_t(as, FG_STR_KN, wm * 64 + mi * 16, ks, lane));
                else
                    ldsm_x4(a[mi], a_frag_addr(as, FG_STR, wm * 64 + mi * 16, ks, lane));
            }
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                if constexpr (KIND == FG_FWD)
                    ldsm_x4(b[nj], b_frag_addr_nk(bs, FG_STR, nj * 64 + wn * 16, ks, lane));
                else if constexpr (fg_b_nk(KIND))
                    ldsm_x4(b[nj], b_frag_addr_nk(bs, FG_STR, wn * 32 + nj * 16, ks, lane));
                else
                    ldsm_x4_t(b[nj], b_frag_addr_kn(bs, FG_STR_KN, ks, wn * 32 + nj * 16, lane));
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int nj = 0; nj < 2; nj++) {
                    mma_bf16(acc[mi][2 * nj], a[mi], b[nj][0], b[nj][1]);
                    mma_bf16(acc[mi][2 * nj + 1], a[mi], b[nj][2], b[nj][3]);
                }
        }
    }
    cp_async_wait<0>(); // nothing left in flight (the trailing groups are empty)
}

// The accumulator element q of an n8 tile: row (q >> 1) * 8 + lane / 4,
// column 2 (lane % 4) + (q & 1): q = 0, 1 and 2, 3 are column pairs.
static __device__ __forceinline__ void st_pair(bf16 *p, float lo, float hi) {
    *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(lo, hi);
}

// f(row, col, v) for each of the thread's column pairs of a 128 x 128
// accumulator tile at (m0, j0) that lies inside [M, N) (N even: col < N
// means col + 1 < N): v[0], v[1] are (row, col) and (row, col + 1).
template <class Fn>
static __device__ __forceinline__ void fg_each_pair(const float (&acc)[4][4][4], int m0, int j0,
                                                    int M, int N, Fn f) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            int col = j0 + wn * 32 + ni * 8 + 2 * (lane & 3);
            if (col >= N) continue;
#pragma unroll
            for (int half = 0; half < 2; half++) {
                int row = m0 + wm * 64 + mi * 16 + half * 8 + (lane >> 2);
                if (row < M) f(row, col, &acc[mi][ni][2 * half]);
            }
        }
}

// gu [M, 2F] (gate | up) and h [M, F] from x [M, K] and Wgu [2F, K].
// Grid: (ceil(F / 64), ceil(M / 128)).
static __global__ void __launch_bounds__(FG_THREADS, 2)
    gemm_swiglu_fwd_kernel(bf16 *gu, bf16 *h, const bf16 *x, const bf16 *wgu, int M, int K, int F) {
    const int m0 = blockIdx.y * FG_BM, j0 = blockIdx.x * (FG_BN / 2);
    float acc[4][4][4];
    fg_mainloop<FG_FWD>(acc, x, wgu, M, K, F, m0, j0, fg_cls{});
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 2; ni++) {
            int col = j0 + wn * 16 + ni * 8 + 2 * (lane & 3); // col + 1 < F when col < F (F even)
            if (col >= F) continue;
#pragma unroll
            for (int half = 0; half < 2; half++) {
                int row = m0 + wm * 64 + mi * 16 + half * 8 + (lane >> 2);
                if (row >= M) continue;
                const float *g = &acc[mi][ni][2 * half], *u = &acc[mi][ni + 2][2 * half];
                // rounded as stored, then SwiGLU on the stored values
                float g0 = bf2f(f2bf(g[0])), g1 = bf2f(f2bf(g[1]));
                float u0 = bf2f(f2bf(u[0])), u1 = bf2f(f2bf(u[1]));
                bf16 *r = gu + (size_t)row * 2 * F + col;
                st_pair(r, g0, g1);
                st_pair(r + F, u0, u1);
                st_pair(h + (size_t)row * F + col, swiglu_h(g0, u0), swiglu_h(g1, u1));
            }
        }
}

// dgu [M, 2F] (d gate | d up) from dy [M, K] . Wdown [K, F] and gu; h [M,
// F], when not NULL, gets silu(gate) * up again. Grid: (ceil(F / 128),
// ceil(M / 128)).
static __global__ void __launch_bounds__(FG_THREADS, 2)
    gemm_swiglu_bwd_kernel(bf16 *dgu, bf16 *h, const bf16 *dy, const bf16 *wdown, const bf16 *gu,
                           int M, int K, int F) {
    const int m0 = blockIdx.y * FG_BM, j0 = blockIdx.x * FG_BN;
    float acc[4][4][4];
    fg_mainloop<FG_BWD>(acc, dy, wdown, M, K, F, m0, j0, fg_cls{});
    fg_each_pair(acc, m0, j0, M, F, [&](int row, int col, const float *d) {
        const bf16 *r = gu + (size_t)row * 2 * F + col;
        __nv_bfloat162 g2 = *reinterpret_cast<const __nv_bfloat162 *>(r),
                       u2 = *reinterpret_cast<const __nv_bfloat162 *>(r + F);
        float g[2] = {__low2float(g2), __high2float(g2)};
        float u[2] = {__low2float(u2), __high2float(u2)};
        float dg[2], du[2];
        swiglu_grad(bf2f(f2bf(d[0])), g[0], u[0], &dg[0], &du[0]);
        swiglu_grad(bf2f(f2bf(d[1])), g[1], u[1], &dg[1], &du[1]);
        bf16 *o = dgu + (size_t)row * 2 * F + col;
        st_pair(o, dg[0], dg[1]);
        st_pair(o + F, du[0], du[1]);
        if (h) st_pair(h + (size_t)row * F + col, swiglu_h(g[0], u[0]), swiglu_h(g[1], u[1]));
    });
}

// ---- the classifier -----------------------------------------------------------------------------
// The logits of V classes (rows padded to Vp, a multiple of 64) for M
// rows: the forward's epilogue rounds each logit to bf16 (as cuBLASLt
// stores them, and as xent_kernel reads them), takes per row and column
// tile t of FG_BN the tile's max m_t and s_t = sum exp(logit - m_t) over
// the real classes, writes P = exp(logit - m_t) (bf16; 0 for the padding)
// where the logits would have been, and the target's logit. Then one
// merge per row (lse, loss, and the factors the backward's dlogits need),
// and the two backward products read P with the factors: the logits are
// never read again and dlogits never exist in memory (xent_kernel read
// the logits and wrote dlogits: 4 bytes a logit).

// Grid: (ntiles = ceil(Vp / 128), ceil(M / 128)). stats: [M][ntiles] max,
// then [M][ntiles] sums; tlogit [M].
static __global__ void __launch_bounds__(FG_THREADS, 2)
    gemm_lm_fwd_kernel(bf16 *P, float *stats, float *tlogit, const bf16 *x, const bf16 *wlm,
                       const int32_t *tgt, int M, int K, int V, int Vp) {
    const int m0 = blockIdx.y * FG_BM, j0 = blockIdx.x * FG_BN, ntiles = gridDim.x;
    float acc[4][4][4];
    fg_mainloop<FG_LM_FWD>(acc, x, wlm, M, K, Vp, m0, j0, fg_cls{});
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
    __syncthreads(); // the stages' shared memory is free: the row reductions' now
    extern __shared__ __align__(16) unsigned char smem[];
    float *red = reinterpret_cast<float *>(smem); // [128 rows][4 warps across]
    // Everything works on acc in place, indices known at compile time (a
    // copy, or an index by the target's column, would put 64 floats on
    // the stack). A thread's row slot r = mi * 2 + half is tile row
    // lrow(r); its values acc[mi][ni][2 half + c], column col(ni) + c.
    auto lrow = [&](int r) { return wm * 64 + (r >> 1) * 16 + (r & 1) * 8 + (lane >> 2); };
    auto col = [&](int ni) { return j0 + wn * 32 + ni * 8 + 2 * (lane & 3); };
    float mx[8], sm[8];
    // logits rounded as stored (padding -inf), the thread's row maxima,
    // and the target's logit from the thread that holds it
#pragma unroll
    for (int r = 0; r < 8; r++) {
        mx[r] = -INFINITY;
        const int row = m0 + lrow(r), t = row < M ? tgt[row] : -1;
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                float &v = acc[r >> 1][ni][(r & 1) * 2 + c];
                v = col(ni) + c < V ? bf2f(f2bf(v)) : -INFINITY;
                mx[r] = v > mx[r] ? v : mx[r];
                if (t == col(ni) + c) tlogit[row] = v;
            }
    }
    // the tile's row max: the 4 lanes of a row, then the 4 warps across
#pragma unroll
    for (int r = 0; r < 8; r++) {
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
            float t = __shfl_xor_sync(0xffffffffu, mx[r], o);
            mx[r] = t > mx[r] ? t : mx[r];
        }
        if ((lane & 3) == 0) red[lrow(r) * 4 + wn] = mx[r];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 8; r++) {
        const float *q = red + lrow(r) * 4;
        float m = q[0];
        for (int w = 1; w < 4; w++) m = q[w] > m ? q[w] : m;
        mx[r] = m;
        sm[r] = 0.0f;
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                // padding: 0; a NaN logit makes s (and the loss) NaN, even
                // in a tile of NaNs alone (whose max stays -inf)
                float &v = acc[r >> 1][ni][(r & 1) * 2 + c];
                v = v == -INFINITY ? 0.0f : expf(v - m);
                sm[r] += v;
            }
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) sm[r] += __shfl_xor_sync(0xffffffffu, sm[r], o);
    }
    __syncthreads(); // every max is read: red takes the sums
#pragma unroll
    for (int r = 0; r < 8; r++)
        if ((lane & 3) == 0) red[lrow(r) * 4 + wn] = sm[r];
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 8; r++) {
        const int row = m0 + lrow(r);
        if (row >= M) continue;
        if (wn == 0 && (lane & 3) == 0) {
            const float *q = red + lrow(r) * 4;
            stats[(size_t)row * ntiles + blockIdx.x] = mx[r];
            stats[((size_t)M + row) * ntiles + blockIdx.x] = q[0] + q[1] + q[2] + q[3];
        }
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
            if (col(ni) < Vp) // Vp % 64 == 0: col + 1 < Vp too
                st_pair(P + (size_t)row * Vp + col(ni), acc[r >> 1][ni][(r & 1) * 2],
                        acc[r >> 1][ni][(r & 1) * 2 + 1]);
    }
}

// (m, s) and (m2, s2): max and sum of exps relative to it, merged. A tile
// of padding alone is (-inf, 0) and adds nothing; a NaN sum stays NaN.
static __device__ __forceinline__ void cls_merge(float &m, float &s, float m2, float s2) {
    if (m2 == -INFINITY && s2 == 0.0f) return;
    if (m == -INFINITY && s == 0.0f) {
        m = m2, s = s2;
    } else if (m2 > m) {
        s = s * expf(m - m2) + s2, m = m2;
    } else {
        s += s2 * expf(m2 - m);
    }
}

// One warp per row: the tiles' (max, sum) merged into lse, the row's loss
// lse - logit[target], and fac[row][t] = scale * exp(m_t - lse) for the
// backward (0 for a tile of padding alone).
static __global__ void cls_merge_kernel(float *losses, float *lse_out, float *fac,
                                        const float *stats, const float *tlogit, int M, int ntiles,
                                        float scale) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= M) return;
    const float *mt = stats + (size_t)row * ntiles, *st = stats + ((size_t)M + row) * ntiles;
    float m = -INFINITY, s = 0.0f;
    for (int t = lane; t < ntiles; t += 32) cls_merge(m, s, mt[t], st[t]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        cls_merge(m, s, m2, s2);
    }
    float L = m + logf(s);
    if (lane == 0) {
        losses[row] = L - tlogit[row];
        if (lse_out) lse_out[row] = L;
    }
    for (int t = lane; t < ntiles; t += 32)
        fac[(size_t)row * ntiles + t] = mt[t] == -INFINITY ? 0.0f : scale * expf(mt[t] - L);
}

// dx [M, N] (bf16) = dlogits [M, Vp] . Wlm [Vp, N], dlogits made from P.
// Grid: (ceil(N / 128), ceil(M / 128)).
static __global__ void __launch_bounds__(FG_THREADS, 2)
    gemm_lm_dx_kernel(bf16 *dx, const bf16 *P, const bf16 *wlm, fg_cls cls, int M, int N, int Vp) {
    const int m0 = blockIdx.y * FG_BM, j0 = blockIdx.x * FG_BN;
    float acc[4][4][4];
    fg_mainloop<FG_LM_DX>(acc, P, wlm, M, Vp, N, m0, j0, cls);
    fg_each_pair(acc, m0, j0, M, N, [&](int row, int col, const float *v) {
        st_pair(dx + (size_t)row * N + col, v[0], v[1]);
    });
}

// dw [Vp, N] (fp32; added to when accumulate) = dlogits^T . x for M rows
// of x [M, N], dlogits made from P [M, Vp] read transposed. Grid:
// (ceil(N / 128), Vp / 128 rounded up).
static __global__ void __launch_bounds__(FG_THREADS, 2)
    gemm_lm_dw_kernel(float *dw, const bf16 *P, const bf16 *x, fg_cls cls, int M, int N, int Vp,
                      int accumulate) {
    const int m0 = blockIdx.y * FG_BM, j0 = blockIdx.x * FG_BN;
    float acc[4][4][4];
    fg_mainloop<FG_LM_DW>(acc, P, x, Vp, M, N, m0, j0, cls);
    fg_each_pair(acc, m0, j0, Vp, N, [&](int row, int col, const float *v) {
        float2 *d = reinterpret_cast<float2 *>(dw + (size_t)row * N + col);
        float2 a = make_float2(v[0], v[1]);
        if (accumulate) a.x += d->x, a.y += d->y;
        *d = a;
    });
}
