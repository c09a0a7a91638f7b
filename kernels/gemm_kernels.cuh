// GEMMs of our own with SwiGLU fused into them, for the two products next
// to it (issue 13: SwiGLU's separate passes were 21.7 GB of config a's
// 53 GB of memory-bound traffic per step, and cuBLASLt's fixed epilogues
// cannot take it in):
//
//   fwd  [gate | up] = x . Wgu^T and h = silu(gate) * up, both from the
//        product's tile: each CTA computes the same 64 columns of gate and
//        of up (Wgu's rows j and F + j), so a thread holds the gate and up
//        of its elements in its own accumulators. gate|up are stored (the
//        backward reads them), h beside them; no pass reads gu back.
//   bwd  dh = dy . Wdown, never stored: the epilogue reads gate and up at
//        its elements, turns dh into d gate | d up and, when asked, writes
//        h again (the recompute mode's rebuild, as swiglu_bwd_kernel).
//
// The arithmetic is the separate path's, in the same order per element:
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

#define FG_BM 128 // rows (tokens) per CTA
#define FG_BN 128 // output columns per CTA (fwd: 64 of gate + the same 64 of up)
#define FG_BK 32  // k per stage
#define FG_STAGES 3
#define FG_THREADS 256
#define FG_STR (FG_BK + 8)    // [row][k] tiles' row stride (elements)
#define FG_STR_KN (FG_BN + 8) // [k][n] tiles' row stride

enum fg_kind { FG_FWD, FG_BWD };
static __host__ __device__ constexpr size_t fg_a_tile() { return (size_t)FG_BM * FG_STR; }
static __host__ __device__ constexpr size_t fg_b_tile(int kind) {
    return kind == FG_FWD ? (size_t)FG_BN * FG_STR : (size_t)FG_BK * FG_STR_KN;
}
static __host__ __device__ constexpr size_t fg_smem_bytes(int kind) {
    return FG_STAGES * (fg_a_tile() + fg_b_tile(kind)) * sizeof(bf16);
}

// Stage k tile kt of A (rows m0.., [M, K] row-major) and B into buffer buf:
// 512 16-byte chunks each, two per thread.
template <int KIND>
static __device__ __forceinline__ void fg_load(bf16 *As, bf16 *Bs, const bf16 *A, const bf16 *W,
                                               int M, int K, int F, int m0, int j0, int kt) {
    const int k0 = kt * FG_BK;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int c = threadIdx.x + i * FG_THREADS, r = c >> 2, kc = (c & 3) * 8;
        bool ok = m0 + r < M && k0 + kc < K;
        cp_async16(As + r * FG_STR + kc, ok ? A + (size_t)(m0 + r) * K + k0 + kc : A, ok);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int c = threadIdx.x + i * FG_THREADS;
        if constexpr (KIND == FG_FWD) {
            // tile row n: gate row j0 + n (n < 64) or up row F + j0 + n - 64
            int n = c >> 2, kc = (c & 3) * 8, j = j0 + (n & 63);
            bool ok = j < F && k0 + kc < K;
            size_t row = (size_t)j + (n >= 64 ? (size_t)F : 0);
            cp_async16(Bs + n * FG_STR + kc, ok ? W + row * K + k0 + kc : W, ok);
        } else {
            // Wdown [K, F]: tile row k, columns j0..j0+127
            int k = c >> 4, nc = (c & 15) * 8;
            bool ok = k0 + k < K && j0 + nc < F;
            cp_async16(Bs + k * FG_STR_KN + nc, ok ? W + (size_t)(k0 + k) * F + j0 + nc : W, ok);
        }
    }
}

// The main loop: acc[mi][ni] is the warp's m16 tile mi and n8 tile ni (fwd:
// ni 0, 1 gate columns 16 wn + 8 ni; 2, 3 the same columns of up; bwd: 32 wn
// + 8 ni), over all of K.
template <int KIND>
static __device__ __forceinline__ void fg_mainloop(float (&acc)[4][4][4], const bf16 *A,
                                                   const bf16 *W, int M, int K, int F, int m0,
                                                   int j0) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *As = reinterpret_cast<bf16 *>(smem), *Bs = As + FG_STAGES * fg_a_tile();
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
        if (st < nk)
            fg_load<KIND>(As + st * fg_a_tile(), Bs + st * fg_b_tile(KIND), A, W, M, K, F, m0, j0,
                          st);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<FG_STAGES - 2>();
        __syncthreads(); // tile kt visible; every warp is done with tile kt - 1's buffer
        int nxt = kt + FG_STAGES - 1;
        if (nxt < nk)
            fg_load<KIND>(As + (nxt % FG_STAGES) * fg_a_tile(), Bs + (nxt % FG_STAGES) * fg_b_tile(KIND),
                          A, W, M, K, F, m0, j0, nxt);
        cp_async_commit();
        const bf16 *as = As + (kt % FG_STAGES) * fg_a_tile();
        const bf16 *bs = Bs + (kt % FG_STAGES) * fg_b_tile(KIND);
#pragma unroll
        for (int ks = 0; ks < FG_BK; ks += 16) {
            uint32_t a[4][4], b[2][4];
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
                ldsm_x4(a[mi], a_frag_addr(as, FG_STR, wm * 64 + mi * 16, ks, lane));
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                if constexpr (KIND == FG_FWD)
                    ldsm_x4(b[nj], b_frag_addr_nk(bs, FG_STR, nj * 64 + wn * 16, ks, lane));
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

// gu [M, 2F] (gate | up) and h [M, F] from x [M, K] and Wgu [2F, K].
// Grid: (ceil(F / 64), ceil(M / 128)).
static __global__ void __launch_bounds__(FG_THREADS, 2)
    gemm_swiglu_fwd_kernel(bf16 *gu, bf16 *h, const bf16 *x, const bf16 *wgu, int M, int K, int F) {
    const int m0 = blockIdx.y * FG_BM, j0 = blockIdx.x * (FG_BN / 2);
    float acc[4][4][4];
    fg_mainloop<FG_FWD>(acc, x, wgu, M, K, F, m0, j0);
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
    fg_mainloop<FG_BWD>(acc, dy, wdown, M, K, F, m0, j0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            int col = j0 + wn * 32 + ni * 8 + 2 * (lane & 3);
            if (col >= F) continue;
#pragma unroll
            for (int half = 0; half < 2; half++) {
                int row = m0 + wm * 64 + mi * 16 + half * 8 + (lane >> 2);
                if (row >= M) continue;
                const float *d = &acc[mi][ni][2 * half];
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
                if (h)
                    st_pair(h + (size_t)row * F + col, swiglu_h(g[0], u[0]), swiglu_h(g[1], u[1]));
            }
        }
}
