// Causal grouped-query attention, flash style: tiles of Q, K, V in shared
// memory, scores in registers, an online softmax, no T x T matrix anywhere
// in global memory. bf16 operands on the tensor cores (mma.sync
// m16n8k16, sm_80 and sm_90 alike), fp32 accumulation and softmax.
//
// Layout (the model's fused projections): qkv rows are [q heads | k heads |
// v heads] of head_dim hd each, row n = b*T + t; out / dout rows are the H q
// heads; query head h reads kv head h / (H / KV) (transformers' repeat_kv).
//
// RoPE's forward is not in here: q and k come rotated (the model rotates
// them in place in qkv after the projection, one pass). Rotating tiles as
// they were loaded cost more than that pass, measured on an H200
// (2026-11-26): every CTA rotated every K (or Q) tile it streamed -- a K
// tile once per query block and per head of its group -- about a fifth of
// the kernels' instructions. The backward's inverse rotation costs nothing
// like that: each dq and dk element is stored once, so where the head dim
// is unpadded (32, 64, 128) the stores rotate them back (store_frags,
// attn_dq_store_kernel) and the model skips its second pass.
//
// Three kernels, and dQ two ways:
//   fwd    one CTA per (block of 128 queries, b, h): loop over key blocks
//          <= the diagonal; writes out (bf16) and the row log-sum-exp
//          (fp32, log2 domain) for the backward.
//   dkdv   one CTA per (key block, b, kv head): loops over the group's
//          query heads and the query blocks at or below the diagonal; owns
//          its dK, dV rows outright, so the GQA sum over heads needs no
//          atomics. With a dQ accumulator (dq_acc != NULL) it also puts dS
//          in shared memory and adds dS K, this key block's part of dQ,
//          into fp32 dq_acc [B*T, H*hd] with atomicAdd: five products per
//          tile pair, 2.5x the forward's matrix work for the whole backward.
//          The additions to one dQ element arrive in whatever order the
//          CTAs of the key blocks run, so dQ's last bits (and everything
//          upstream of it) vary from run to run.
//   dq     the deterministic dQ (dq_acc == NULL): one CTA per (query block,
//          b, h) recomputes P and dP for its rows and owns its dQ rows, so
//          the same bits come out every run, for two more products per tile
//          pair (3.5x the forward's matrix work).
// plus two small ones: D_i = rowsum(dO_i * O_i) (which also zeroes the dQ
// accumulator's rows), and the accumulator's rows out to dqkv (scaled,
// rounded to bf16 once).
//
// Warp tiling: each warp owns 16 rows of the CTA's -- 8 warps and 128
// query rows in the forward (a K/V tile loaded once serves twice the rows
// it did with 64), 4 warps and 64 rows in the backward (its CTAs hold two
// accumulators of 64 x HD fp32; at 128 rows the head_dim-128 dK/dV kernel
// would need about 155 KB of shared memory double-buffered) -- and the other
// dimension is a 64-wide tile. Head dims are padded to 32, 64 or 128 in
// shared memory with zeros (the zero columns add nothing to Q.K and give
// zero output columns that are not stored).
//
// Data movement: the tiles that stream through a CTA's loop (K and V in the
// forward and dQ kernels, Q and dO in dK/dV) are double-buffered (NBUF = 2)
// and filled with cp.async while the previous tile is being used; the
// others are loaded once. Where a device's shared memory per block is too
// small for that (the head_dim-128 dK/dV kernel needs 112 KB; sm_86 and
// sm_89 allow 99 KB), the launcher runs the kernel's NBUF = 1 instance: one
// buffer, the next tile loaded after the current one is used. Shared tiles
// are row-major with rows padded by 8 elements (16 bytes), which puts the
// 8 row addresses of an ldmatrix in 8 different bank quads: conflict-free.
// Fragments come from ldmatrix.x4 -- four 8x8 matrices per instruction --
// and, where the product wants the tile's transpose (V in P.V, dO and Q in
// the dV/dK products, K in dS.K), from ldmatrix.x4.trans on the same
// row-major tile. When head_dim is not a
// multiple of 8 (rows not 16-byte aligned), tiles are loaded with plain
// scalar copies instead.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA), lane = 4 * gr + tq:
//   A (16x16, row): a[0] = (gr,   2tq..+1)  a[1] = (gr+8, 2tq..+1)
//                   a[2] = (gr,   2tq+8..)  a[3] = (gr+8, 2tq+8..)
//   B (16x8, col):  b[0] = (k 2tq..+1, n gr) b[1] = (k 2tq+8..+9, n gr)
//   C (16x8 fp32):  c[0..1] = (gr, 2tq..+1)  c[2..3] = (gr+8, 2tq..+1)
// so two adjacent C tiles (n 0-7, 8-15) of a score block are exactly the A
// fragment of the next product: probabilities never leave registers.
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i, and
// lane l receives (row l/4, cols 2(l%4)..+1) of each -- (row 2(l%4)..+1,
// col l/4) with .trans. The address helpers (mma_common.cuh, with the
// mma, ldmatrix and cp.async wrappers) pick the 4 matrices so
// that the 4 registers are one A fragment, or the B fragments of two
// adjacent n-tiles.
//
// This header holds the device code alone, so that tests/gpu/kernels_emu.cpp
// and the emulated build (tests/gpu/emu) compile the very same kernels for
// the host and check them without a GPU. It depends on nothing but
// device_common.cuh and mma_common.cuh for that reason; gpu_attention.cu has the launchers.
#pragma once

#include <math.h>
#include <string.h>

#include "kernels/device_common.cuh"
#include "kernels/mma_common.cuh"

#define ATT_BR 64 // query rows per CTA tile (the backward's)
#define ATT_BC 64 // key rows per CTA tile
#define ATT_THREADS 128
#define ATT_FWD_BR 128 // query rows per forward CTA: 8 warps share each K/V tile
#define ATT_FWD_THREADS 256
// CTAs per SM the compiler must leave registers for (__launch_bounds__'s
// second argument; kernels/README.md has the figures). The forward at head
// dims up to 64: two CTAs of 8 warps (128 registers; at 64 ptxas spills 12
// bytes on sm_90, none on sm_80): the H200 profile showed one CTA's 8 warps
// leaving the schedulers idle two cycles in three. At 128, one. Two dQ
// CTAs. The dK/dV kernel has none: at head dim 128 ptxas spilled with a
// stated minimum of 1 or 2, not without one.
static constexpr int attn_fwd_min_ctas(int HD) { return HD <= 64 ? 2 : 1; }
#define ATT_DQ_MIN_CTAS 2

// The three tiled kernels, and the dynamic shared memory each needs with
// nbuf (NBUF: 1 or 2) buffers of its streaming tiles, head dims padded to
// HD: tiles of [64][HD + 8] bf16 -- forward: Q (two tiles: 128 rows) and
// one K + V buffer, whatever nbuf, since a second buffer takes Q's place
// once Q is in registers; dK/dV K + V +
// nbuf (Q + dO + lse and D of 64 rows) + the dS tile [64][64 + 8] of the
// accumulating dQ (unused by the deterministic one, which keeps one
// instance of the kernel and 9 KB is not worth a second); dQ Q + dO + nbuf
// (K + V).
enum attn_kind { ATT_FWD, ATT_DKDV, ATT_DQ };
// query rows (key rows for dK/dV) and threads per CTA
static constexpr int attn_rows(int kind) { return kind == ATT_FWD ? ATT_FWD_BR : ATT_BR; }
static constexpr int attn_threads(int kind) {
    return kind == ATT_FWD ? ATT_FWD_THREADS : ATT_THREADS;
}
#define ATT_DS_STR (ATT_BR + 8) // the dS tile's row stride (its rows are keys, columns queries)
static constexpr size_t attn_smem_bytes(int kind, int HD, int nbuf) {
    size_t tile = (size_t)ATT_BR * (HD + 8) * sizeof(bf16), nb = (size_t)nbuf;
    return kind == ATT_FWD    ? 4 * tile
           : kind == ATT_DKDV ? (2 + 2 * nb) * tile + 2 * nb * ATT_BR * sizeof(float) +
                                    (size_t)ATT_BC * ATT_DS_STR * sizeof(bf16)
                              : (2 + 2 * nb) * tile;
}

// 2^x on the special-function unit, denormal results flushed to zero (the
// probabilities they would be are below bf16's reach in P V anyway); exp2f
// adds range handling around the same instruction.
#ifndef RL_KERNEL_EMU
static __device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#else
static inline float ex2(float x) { return exp2f(x); }
#endif

// Accumulator pairs (n tiles 2j, 2j+1) -> A fragment (bf16) of k block j.
static __device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                              const float (&c1)[4]) {
    a[0] = pack2(c0[0], c0[1]);
    a[1] = pack2(c0[2], c0[3]);
    a[2] = pack2(c1[0], c1[1]);
    a[3] = pack2(c1[2], c1[3]);
}

// Rows [r0, r0 + ROWS) of a global matrix (row stride ld elements, starting
// at column 0 of src), columns [0, hd), into a row-major tile [ROWS][HD + 8],
// by a CTA of NT threads.
// Rows >= rmax and columns >= hd are zero. vec (hd % 8 == 0, 16-byte
// aligned rows): cp.async, to be committed and waited for by the caller;
// otherwise plain copies, visible after the caller's next __syncthreads.
template <int HD, int ROWS = ATT_BR, int NT = ATT_THREADS>
static __device__ void load_tile(bf16 *tile, const bf16 *src, size_t ld, int r0, int rmax, int hd,
                                 bool vec) {
    constexpr int STR = HD + 8;
    if (vec) {
        // a thread's 16-byte chunk: one column, rows STEP apart; the addresses
        // computed once and stepped (this runs for every streamed tile)
        constexpr int CH = HD / 8, STEP = NT / CH;
        static_assert(NT % CH == 0 && ROWS % STEP == 0, "whole passes of the CTA's threads");
        const int r = threadIdx.x / CH, col = (threadIdx.x % CH) * 8;
        const bool col_ok = col < hd;
        const bf16 *s = src + (size_t)(r0 + r) * ld + col;
        bf16 *d = tile + r * STR + col;
#pragma unroll
        for (int i = 0; i < ROWS / STEP; i++) {
            bool ok = col_ok && r0 + r + i * STEP < rmax;
            cp_async16(d + i * STEP * STR, ok ? s + (size_t)i * STEP * ld : src, ok);
        }
    } else {
        for (int c = threadIdx.x; c < ROWS * HD; c += NT) {
            int r = c / HD, col = c % HD;
            bf16 v = __float2bfloat16_rn(0.0f);
            if (r0 + r < rmax && col < hd) v = src[(size_t)(r0 + r) * ld + col];
            tile[r * STR + col] = v;
        }
    }
}

// The streaming loop of each kernel: tile `it` of n is in buffer it & (NBUF
// - 1); fetch(i, buf) issues tile i into buffer buf. Before tile it is used:
// with two buffers tile it + 1 is issued into the other one and all but
// that group are waited for, with one everything is; the barrier then makes
// every thread's part of tile it visible.
template <int NBUF, class Fetch>
static __device__ __forceinline__ void stream_acquire(int it, int n, Fetch &&fetch) {
    if (NBUF == 2 && it + 1 < n) {
        fetch(it + 1, (it + 1) & 1);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}
// After tile it is used: the barrier frees its buffer (refilled by the
// acquire of tile it + 1 with two buffers); with one buffer tile it + 1 is
// issued only now.
template <int NBUF, class Fetch>
static __device__ __forceinline__ void stream_release(int it, int n, Fetch &&fetch) {
    __syncthreads();
    if (NBUF == 1 && it + 1 < n) {
        fetch(it + 1, 0);
        cp_async_commit();
    }
}

// ---- gradient rows out -----------------------------------------------------------------------
// RoPE's transposed rotation applied to dq and dk as they leave (the
// model's separate pass over dq|dk otherwise): cs and sn are the model's
// cos and sin tables [position][hd / 2] (cs NULL: none). Only for hd == HD
// (32, 64, 128), where column j's partner j + hd/2 sits in the same
// thread's fragments, HD/16 tiles further.
struct attn_rope {
    const float *cs, *sn;
};

// The backward's dQ, dK, dV leave as fp32 C fragments: rows warp * 16 + gr
// and + 8 of the CTA's 64, columns d * 8 + 2 tq, + 1; times scale, rounded
// once to bf16, a pair per store. Rows >= rmax and columns >= hd are not
// stored (hd is even: col < hd means col + 1 < hd). With rp.cs, rotated
// back first (rope_kernel's inverse arithmetic on the unrounded values).
template <int HD>
static __device__ __forceinline__ void store_frags(bf16 *dst, size_t ld,
                                                   const float (&acc)[HD / 8][4], int r0, int rmax,
                                                   int hd, float scale, attn_rope rp = {}) {
    const int lane = threadIdx.x & 31;
    const int t0 = r0 + (threadIdx.x >> 5) * 16 + (lane >> 2), t1 = t0 + 8;
    if (rp.cs) {
        constexpr int HALF = HD / 2, P = HD / 16;
#pragma unroll
        for (int d = 0; d < P; d++) {
            int col = d * 8 + 2 * (lane & 3);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int t = h ? t1 : t0;
                if (t >= rmax) continue;
                const float *c = rp.cs + (size_t)t * HALF + col, *sn = rp.sn + (size_t)t * HALF + col;
                float y1[2], y2[2];
#pragma unroll
                for (int k = 0; k < 2; k++) {
                    float x1 = acc[d][2 * h + k] * scale, x2 = acc[d + P][2 * h + k] * scale;
                    y1[k] = x1 * c[k] + x2 * sn[k];
                    y2[k] = x2 * c[k] - x1 * sn[k];
                }
                bf16 *row = dst + (size_t)t * ld + col;
                *reinterpret_cast<__nv_bfloat162 *>(row) = __floats2bfloat162_rn(y1[0], y1[1]);
                *reinterpret_cast<__nv_bfloat162 *>(row + HALF) = __floats2bfloat162_rn(y2[0], y2[1]);
            }
        }
        return;
    }
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        int col = d * 8 + 2 * (lane & 3);
        if (col >= hd) continue;
        if (t0 < rmax)
            *reinterpret_cast<__nv_bfloat162 *>(dst + (size_t)t0 * ld + col) =
                __floats2bfloat162_rn(acc[d][0] * scale, acc[d][1] * scale);
        if (t1 < rmax)
            *reinterpret_cast<__nv_bfloat162 *>(dst + (size_t)t1 * ld + col) =
                __floats2bfloat162_rn(acc[d][2] * scale, acc[d][3] * scale);
    }
}

// Keys after the query to -inf in a warp's 16 x 64 score tile (rows t0,
// t1; key0: the thread's first column's key). Only the tiles that cross
// the diagonal need it: the others skip the index arithmetic altogether.
static __device__ __forceinline__ void causal_mask(float (&sc)[ATT_BC / 8][4], int key0, int t0,
                                                   int t1) {
#pragma unroll
    for (int nt = 0; nt < ATT_BC / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (key0 + nt * 8 + (e & 1) > (e < 2 ? t0 : t1)) sc[nt][e] = -INFINITY;
}

// ---- forward -------------------------------------------------------------------------------
// 128 query rows per CTA, 8 warps of 16: each K/V tile is read from global
// memory once for 128 rows, and its ldmatrix loads serve 8 warps. Shared
// memory: region 0 holds the Q tile [128][HD + 8] until every warp has its
// Q fragments in registers, then K/V buffer 1; region 1 is K/V buffer 0.
// So double buffering costs no more than Q and one buffer (68 KB at head
// dim 128, inside sm_86/89's 99 KB).
template <int HD, int NBUF>
static __global__ void __launch_bounds__(ATT_FWD_THREADS, attn_fwd_min_ctas(HD))
    attn_fwd_kernel(bf16 *out, float *lse, const bf16 *qkv, int T, int H, int KV, int hd,
                    float scale_log2, int vec) {
    constexpr int STR = HD + 8, TILE = ATT_BC * STR;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = reinterpret_cast<bf16 *>(smem); // [128][STR], region 0
    // K/V buffer i: K then V, [64][STR] each
    auto kv_buf = [&](int i) { return Qs + (i == 0 ? 2 : 0) * TILE; };

    const int qb = gridDim.y - 1 - blockIdx.y; // the longest rows start first
    const int bh = blockIdx.x, b = bh / H, h = bh % H, g = h / (H / KV);
    const size_t C3 = (size_t)(H + 2 * KV) * hd, qd = (size_t)H * hd, kvd = (size_t)KV * hd;
    const bf16 *base = qkv + (size_t)b * T * C3;
    const bf16 *kbase = base + qd + (size_t)g * hd, *vbase = base + qd + kvd + (size_t)g * hd;
    const int q0 = qb * ATT_FWD_BR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    const int t0 = q0 + warp * 16 + gr, t1 = t0 + 8; // this thread's two query rows
    const int wlast = q0 + warp * 16 + 15;           // the warp's last row
    // key blocks up to the last row's (rows >= T have nothing to see)
    const int nkb = (min(q0 + ATT_FWD_BR, T) - 1) / ATT_BC + 1;

    auto fetch = [&](int kb, int buf) { // the K and V tiles of key block kb
        bf16 *kv = kv_buf(buf);
        load_tile<HD, ATT_BC, ATT_FWD_THREADS>(kv, kbase, C3, kb * ATT_BC, T, hd, vec);
        load_tile<HD, ATT_BC, ATT_FWD_THREADS>(kv + TILE, vbase, C3, kb * ATT_BC, T, hd, vec);
    };
    load_tile<HD, ATT_FWD_BR, ATT_FWD_THREADS>(Qs, base + (size_t)h * hd, C3, q0, T, hd, vec);
    cp_async_commit();
    fetch(0, 0);
    cp_async_commit();
    cp_async_wait<1>(); // Q's group; K/V tile 0 goes on loading
    __syncthreads();
    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        ldsm_x4(qf[kk], a_frag_addr(Qs, STR, warp * 16, kk * 16, lane));
    __syncthreads(); // region 0 is K/V buffer 1 from here

    float o[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};

    for (int kb = 0; kb < nkb; kb++) {
        const int k0 = kb * ATT_BC;
        stream_acquire<NBUF>(kb, nkb, fetch);
        bf16 *Kb = kv_buf(kb & (NBUF - 1)), *Vb = Kb + TILE;
        // a warp whose rows all precede the tile's first key sees none of
        // it (warp-uniform: the other warps' mma.sync are theirs alone)
        if (k0 > wlast) {
            stream_release<NBUF>(kb, nkb, fetch);
            continue;
        }

        float sc[ATT_BC / 8][4];
#pragma unroll
        for (int nt = 0; nt < ATT_BC / 8; nt++)
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int nt = 0; nt < ATT_BC / 8; nt += 2) {
                uint32_t bk[4];
                ldsm_x4(bk, b_frag_addr_nk(Kb, STR, nt * 8, kk * 16, lane));
                mma_bf16(sc[nt], qf[kk], bk[0], bk[1]);
                mma_bf16(sc[nt + 1], qf[kk], bk[2], bk[3]);
            }

        // the mask (key > query) where the tile crosses the warp's rows'
        // diagonal (keys past T are past every valid query), then row maxima
        // of the raw scores over the quad of lanes: the scale is positive,
        // so it is applied after, folded into one FFMA per score with the
        // maximum's subtraction (mrow is in the scaled log2 domain)
        if (k0 + ATT_BC - 1 > q0 + warp * 16) causal_mask(sc, k0 + 2 * tq, t0, t1);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < ATT_BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], sc[nt][e]);
        float sub[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mnew = fmaxf(mrow[r], mx[r] * scale_log2);
            sub[r] = mnew == -INFINITY ? 0.0f : mnew; // a row with nothing visible yet: no NaN
            alpha[r] = ex2(mrow[r] - sub[r]);
            mrow[r] = mnew;
        }
        float ls[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < ATT_BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = ex2(fmaf(sc[nt][e], scale_log2, -sub[e >> 1]));
                sc[nt][e] = p;
                ls[e >> 1] += p;
            }
        // per-lane partial row sums; the quad is summed once at the end
        lrow[0] = lrow[0] * alpha[0] + ls[0];
        lrow[1] = lrow[1] * alpha[1] + ls[1];
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            o[d][0] *= alpha[0], o[d][1] *= alpha[0];
            o[d][2] *= alpha[1], o[d][3] *= alpha[1];
        }
        // O += P V, P straight from the score registers, V through .trans
#pragma unroll
        for (int j = 0; j < ATT_BC / 16; j++) {
            uint32_t pa[4];
            c_to_a(pa, sc[2 * j], sc[2 * j + 1]);
#pragma unroll
            for (int d = 0; d < HD / 8; d += 2) {
                uint32_t bv[4];
                ldsm_x4_t(bv, b_frag_addr_kn(Vb, STR, j * 16, d * 8, lane));
                mma_bf16(o[d], pa, bv[0], bv[1]);
                mma_bf16(o[d + 1], pa, bv[2], bv[3]);
            }
        }
        stream_release<NBUF>(kb, nkb, fetch);
    }

    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
        lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
        inv[r] = lrow[r] > 0.0f ? 1.0f / lrow[r] : 0.0f;
    }
    bf16 *ob = out + (size_t)b * T * qd + (size_t)h * hd;
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        int col = d * 8 + 2 * tq; // hd is even: col < hd means col + 1 < hd
        if (col >= hd) continue;
        if (t0 < T)
            *reinterpret_cast<__nv_bfloat162 *>(ob + (size_t)t0 * qd + col) =
                __floats2bfloat162_rn(o[d][0] * inv[0], o[d][1] * inv[0]);
        if (t1 < T)
            *reinterpret_cast<__nv_bfloat162 *>(ob + (size_t)t1 * qd + col) =
                __floats2bfloat162_rn(o[d][2] * inv[1], o[d][3] * inv[1]);
    }
    if (tq == 0) {
        if (t0 < T) lse[(size_t)bh * T + t0] = mrow[0] + log2f(lrow[0]);
        if (t1 < T) lse[(size_t)bh * T + t1] = mrow[1] + log2f(lrow[1]);
    }
}

// ---- backward: D_i = dO_i . O_i -------------------------------------------------------------
// One warp per (row, head); dq_acc (the accumulating dQ's fp32 rows, same
// layout as dout) is zeroed here: the same rows, no launch of its own.
static __global__ void __launch_bounds__(256)
    attn_dsum_kernel(float *dsum, float *dq_acc, const bf16 *dout, const bf16 *out, int N, int T,
                     int H, int hd) {
    int idx = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (idx >= N * H) return;
    int n = idx / H, h = idx % H;
    size_t off = (size_t)n * H * hd + (size_t)h * hd;
    float acc = 0.0f;
    for (int d = lane; d < hd; d += 32) {
        acc += bf2f(dout[off + d]) * bf2f(out[off + d]);
        if (dq_acc) dq_acc[off + d] = 0.0f;
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        int b = n / T, t = n % T;
        dsum[((size_t)b * H + h) * T + t] = acc;
    }
}

// ---- backward: dK, dV (and dQ's parts) --------------------------------------------------------
// This key block's part of dQ for one (head, query block) pair, dS K, added
// into acc (fp32 rows of row stride ld, the head's column 0; rows q0..):
// dS^T is in Ss ([key][query], bf16, the very values dK used) and K in Ks
// ([key][HD + 8], rotated), both complete (after a barrier). Warp w takes
// query rows 16w..16w+15 over all 64 keys; its 4 A fragments come through
// ldmatrix.trans, and the output goes out 16 columns at a time (8
// accumulators live, not HD / 2: the dK and dV accumulators hold the
// registers). Rows >= T and columns >= hd (all zero) are not added.
template <int HD>
static __device__ __forceinline__ void dq_add_part(float *acc, size_t ld, const bf16 *Ss,
                                                   const bf16 *Ks, int q0, int T, int hd) {
    constexpr int STR = HD + 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    const int t0 = q0 + warp * 16 + gr, t1 = t0 + 8;
    uint32_t da[ATT_BC / 16][4];
#pragma unroll
    for (int j = 0; j < ATT_BC / 16; j++)
        ldsm_x4_t(da[j], a_frag_addr_t(Ss, ATT_DS_STR, warp * 16, j * 16, lane));
#pragma unroll
    for (int d = 0; d < HD / 8; d += 2) {
        float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int j = 0; j < ATT_BC / 16; j++) {
            uint32_t bk[4];
            ldsm_x4_t(bk, b_frag_addr_kn(Ks, STR, j * 16, d * 8, lane));
            mma_bf16(c[0], da[j], bk[0], bk[1]);
            mma_bf16(c[1], da[j], bk[2], bk[3]);
        }
#pragma unroll
        for (int x = 0; x < 2; x++) {
            int col = (d + x) * 8 + 2 * tq; // hd is even: col < hd means col + 1 < hd
            if (col >= hd) continue;
            if (t0 < T) {
                atomicAdd(acc + (size_t)t0 * ld + col, c[x][0]);
                atomicAdd(acc + (size_t)t0 * ld + col + 1, c[x][1]);
            }
            if (t1 < T) {
                atomicAdd(acc + (size_t)t1 * ld + col, c[x][2]);
                atomicAdd(acc + (size_t)t1 * ld + col + 1, c[x][3]);
            }
        }
    }
}

// Rows of the warp tiles are keys here: S^T = K Q^T and dP^T = V dO^T, so
// P^T and dS^T come out as A fragments for dV += P^T dO and dK += dS^T Q.
// The CTA walks (query head of the group, query block) pairs, the Q and dO
// tiles of the next pair loading while the current one is used. dq_acc:
// see dq_add_part (NULL: dQ is attn_bwd_dq_kernel's).
template <int HD, int NBUF>
static __global__ void __launch_bounds__(ATT_THREADS)
    attn_bwd_dkdv_kernel(bf16 *dqkv, float *dq_acc, const bf16 *dout, const bf16 *qkv,
                         const float *lse, const float *dsum, int T, int H, int KV, int hd,
                         float scale_log2, float scale, int vec, attn_rope rp) {
    constexpr int STR = HD + 8, TILE = ATT_BR * STR;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Ks = reinterpret_cast<bf16 *>(smem);                  // [64][STR]
    bf16 *Vs = Ks + TILE;                                       // [64][STR]
    bf16 *Qs = Vs + TILE;                                       // NBUF x [64][STR]
    bf16 *Os = Qs + NBUF * TILE;                                // dO, NBUF x [64][STR]
    float *lse_s = reinterpret_cast<float *>(Os + NBUF * TILE); // NBUF x [64]
    float *d_s = lse_s + NBUF * ATT_BR;                         // NBUF x [64]
    bf16 *Ss = reinterpret_cast<bf16 *>(d_s + NBUF * ATT_BR);   // dS^T [64 keys][ATT_DS_STR]

    const int kb = blockIdx.y; // key block 0 has the most query blocks: it starts first
    const int bg = blockIdx.x, b = bg / KV, g = bg % KV, rep = H / KV;
    const size_t C3 = (size_t)(H + 2 * KV) * hd, qd = (size_t)H * hd, kvd = (size_t)KV * hd;
    const bf16 *base = qkv + (size_t)b * T * C3;
    const bf16 *obase = dout + (size_t)b * T * qd;
    const int k0 = kb * ATT_BC, nqb = (T + ATT_BR - 1) / ATT_BR, nq = nqb - kb;
    const int n_it = rep * nq; // (head, query block) pairs
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    const int key0 = k0 + warp * 16 + gr, key1 = key0 + 8;

    load_tile<HD>(Ks, base + qd + (size_t)g * hd, C3, k0, T, hd, vec);
    load_tile<HD>(Vs, base + qd + kvd + (size_t)g * hd, C3, k0, T, hd, vec);
    cp_async_commit();
    // Q, dO tiles and the rows' lse and D of pair `it` into buffer `buf`
    auto fetch = [&](int it, int buf) {
        int h = g * rep + it / nq, q0 = (kb + it % nq) * ATT_BR;
        load_tile<HD>(Qs + buf * TILE, base + (size_t)h * hd, C3, q0, T, hd, vec);
        load_tile<HD>(Os + buf * TILE, obase + (size_t)h * hd, qd, q0, T, hd, vec);
        const float *lh = lse + ((size_t)b * H + h) * T, *dh = dsum + ((size_t)b * H + h) * T;
        for (int i = threadIdx.x; i < ATT_BR; i += ATT_THREADS) {
            bool ok = q0 + i < T;
            lse_s[buf * ATT_BR + i] = ok ? lh[q0 + i] : 0.0f;
            d_s[buf * ATT_BR + i] = ok ? dh[q0 + i] : 0.0f;
        }
    };
    fetch(0, 0);
    cp_async_commit();

    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;

    for (int it = 0; it < n_it; it++) {
        const int buf = it & (NBUF - 1), q0 = (kb + it % nq) * ATT_BR;
        stream_acquire<NBUF>(it, n_it, fetch);
        bf16 *Qb = Qs + buf * TILE;
        const bf16 *Ob = Os + buf * TILE;
        const float *lb = lse_s + buf * ATT_BR, *db = d_s + buf * ATT_BR;
        const bool diag = q0 == k0; // the one query block with keys after some of its queries

        // the query tile in passes of QW columns: at head dim 128 two of 32,
        // so that the score registers (2 x QW / 2 per thread) and the dK, dV
        // accumulators (HD per thread) fit without spilling
        constexpr int QW = HD > 64 ? 32 : ATT_BR;
#pragma unroll 1
        for (int c0 = 0; c0 < ATT_BR; c0 += QW) {
            float st[QW / 8][4], dpt[QW / 8][4];
#pragma unroll
            for (int nt = 0; nt < QW / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) st[nt][e] = dpt[nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t ka[4], va[4];
                ldsm_x4(ka, a_frag_addr(Ks, STR, warp * 16, kk * 16, lane));
                ldsm_x4(va, a_frag_addr(Vs, STR, warp * 16, kk * 16, lane));
#pragma unroll
                for (int nt = 0; nt < QW / 8; nt += 2) {
                    uint32_t bq[4], bo[4];
                    ldsm_x4(bq, b_frag_addr_nk(Qb, STR, c0 + nt * 8, kk * 16, lane));
                    ldsm_x4(bo, b_frag_addr_nk(Ob, STR, c0 + nt * 8, kk * 16, lane));
                    mma_bf16(st[nt], ka, bq[0], bq[1]);
                    mma_bf16(st[nt + 1], ka, bq[2], bq[3]);
                    mma_bf16(dpt[nt], va, bo[0], bo[1]);
                    mma_bf16(dpt[nt + 1], va, bo[2], bo[3]);
                }
            }
            // P^T = exp2(S^T * scale_log2 - lse[query]); dS^T = P^T (dP^T - D[query]).
            // Masked: keys after the query, on the diagonal block only. Queries
            // past T need none: their Q and dO rows, lse and D are zero, so
            // they add 0 to dV and dK (and are not added to dQ).
#pragma unroll
            for (int nt = 0; nt < QW / 8; nt++) {
                const int qi = c0 + nt * 8 + 2 * tq; // this thread's two queries: qi, qi + 1
                const float2 l2 = *reinterpret_cast<const float2 *>(lb + qi);
                const float2 d2 = *reinterpret_cast<const float2 *>(db + qi);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = ex2(fmaf(st[nt][e], scale_log2, -(e & 1 ? l2.y : l2.x)));
                    if (diag && (e < 2 ? key0 : key1) > q0 + qi + (e & 1)) p = 0.0f;
                    st[nt][e] = p;
                    dpt[nt][e] = p * (dpt[nt][e] - (e & 1 ? d2.y : d2.x));
                }
            }
            // dV += P^T dO ; dK += dS^T Q   (the k dimension is the query)
#pragma unroll
            for (int j = 0; j < QW / 16; j++) {
                const int q16 = c0 + j * 16; // the 16 queries of this k step
                uint32_t pa[4], da[4];
                c_to_a(pa, st[2 * j], st[2 * j + 1]);
                c_to_a(da, dpt[2 * j], dpt[2 * j + 1]);
                if (dq_acc) { // dS^T for dQ: rows key0 / key1, query columns q16 + 2 tq (+ 8)
                    uint32_t *s0 = reinterpret_cast<uint32_t *>(Ss + (key0 - k0) * ATT_DS_STR);
                    uint32_t *s1 = reinterpret_cast<uint32_t *>(Ss + (key1 - k0) * ATT_DS_STR);
                    s0[q16 / 2 + tq] = da[0], s1[q16 / 2 + tq] = da[1];
                    s0[q16 / 2 + 4 + tq] = da[2], s1[q16 / 2 + 4 + tq] = da[3];
                }
#pragma unroll
                for (int d = 0; d < HD / 8; d += 2) {
                    uint32_t bo[4], bq[4];
                    ldsm_x4_t(bo, b_frag_addr_kn(Ob, STR, q16, d * 8, lane));
                    ldsm_x4_t(bq, b_frag_addr_kn(Qb, STR, q16, d * 8, lane));
                    mma_bf16(dv[d], pa, bo[0], bo[1]);
                    mma_bf16(dv[d + 1], pa, bo[2], bo[3]);
                    mma_bf16(dk[d], da, bq[0], bq[1]);
                    mma_bf16(dk[d + 1], da, bq[2], bq[3]);
                }
            }
        }
        if (dq_acc) {
            __syncthreads(); // every warp's dS^T rows are in Ss
            int h = g * rep + it / nq;
            dq_add_part<HD>(dq_acc + (size_t)b * T * qd + (size_t)h * hd, qd, Ss, Ks, q0, T, hd);
        }
        stream_release<NBUF>(it, n_it, fetch);
    }

    bf16 *dbase = dqkv + (size_t)b * T * C3;
    store_frags<HD>(dbase + qd + (size_t)g * hd, C3, dk, k0, T, hd, scale, rp);
    store_frags<HD>(dbase + qd + kvd + (size_t)g * hd, C3, dv, k0, T, hd, 1.0f);
}

// ---- backward: the accumulated dQ out ---------------------------------------------------------
// dq_acc [N, H*hd] fp32 (sums of dS K) -> dqkv's q columns: times scale,
// rounded to bf16 once. One thread per pair of columns (hd is even); with
// rp.cs (hd a multiple of 4) the threads of the first half of each head
// rotate their pair with its partner hd/2 further, as store_frags.
static __global__ void __launch_bounds__(256)
    attn_dq_store_kernel(bf16 *dqkv, const float *dq_acc, int N, int T, int H, int KV, int hd,
                         float scale, attn_rope rp) {
    const size_t qd = (size_t)H * hd, C3 = (size_t)(H + 2 * KV) * hd, total = (size_t)N * qd / 2;
    const int half = hd / 2;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t n = 2 * idx / qd, c = 2 * idx % qd;
        float2 a = *reinterpret_cast<const float2 *>(dq_acc + 2 * idx);
        if (!rp.cs) {
            *reinterpret_cast<__nv_bfloat162 *>(dqkv + n * C3 + c) =
                __floats2bfloat162_rn(a.x * scale, a.y * scale);
            continue;
        }
        int j = (int)(c % hd);
        if (j >= half) continue; // its pair's thread stores it
        float2 b = *reinterpret_cast<const float2 *>(dq_acc + 2 * idx + half);
        size_t at = (size_t)(n % T) * half + j;
        float x1[2] = {a.x * scale, a.y * scale}, x2[2] = {b.x * scale, b.y * scale}, y1[2], y2[2];
        for (int k = 0; k < 2; k++) {
            y1[k] = x1[k] * rp.cs[at + k] + x2[k] * rp.sn[at + k];
            y2[k] = x2[k] * rp.cs[at + k] - x1[k] * rp.sn[at + k];
        }
        *reinterpret_cast<__nv_bfloat162 *>(dqkv + n * C3 + c) = __floats2bfloat162_rn(y1[0], y1[1]);
        *reinterpret_cast<__nv_bfloat162 *>(dqkv + n * C3 + c + half) =
            __floats2bfloat162_rn(y2[0], y2[1]);
    }
}

// ---- backward: dQ -------------------------------------------------------------------------------
template <int HD, int NBUF>
static __global__ void __launch_bounds__(ATT_THREADS, ATT_DQ_MIN_CTAS)
    attn_bwd_dq_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                       const float *dsum, int T, int H, int KV, int hd, float scale_log2,
                       float scale, int vec, attn_rope rp) {
    constexpr int STR = HD + 8, TILE = ATT_BR * STR;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = reinterpret_cast<bf16 *>(smem); // [64][STR]
    bf16 *Os = Qs + TILE;                      // dO [64][STR]
    bf16 *Ks = Os + TILE;                      // NBUF x [64][STR]
    bf16 *Vs = Ks + NBUF * TILE;               // NBUF x [64][STR]

    const int qb = gridDim.y - 1 - blockIdx.y;
    const int bh = blockIdx.x, b = bh / H, h = bh % H, g = h / (H / KV);
    const size_t C3 = (size_t)(H + 2 * KV) * hd, qd = (size_t)H * hd, kvd = (size_t)KV * hd;
    const bf16 *base = qkv + (size_t)b * T * C3;
    const bf16 *kbase = base + qd + (size_t)g * hd, *vbase = base + qd + kvd + (size_t)g * hd;
    const int q0 = qb * ATT_BR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    const int t0 = q0 + warp * 16 + gr, t1 = t0 + 8;

    auto fetch = [&](int kb, int buf) { // the K and V tiles of key block kb
        load_tile<HD>(Ks + buf * TILE, kbase, C3, kb * ATT_BC, T, hd, vec);
        load_tile<HD>(Vs + buf * TILE, vbase, C3, kb * ATT_BC, T, hd, vec);
    };
    load_tile<HD>(Qs, base + (size_t)h * hd, C3, q0, T, hd, vec);
    load_tile<HD>(Os, dout + (size_t)b * T * qd + (size_t)h * hd, qd, q0, T, hd, vec);
    cp_async_commit();
    fetch(0, 0);
    cp_async_commit();
    const float *lse_h = lse + (size_t)bh * T, *d_h = dsum + (size_t)bh * T;
    float lr[2] = {t0 < T ? lse_h[t0] : 0.0f, t1 < T ? lse_h[t1] : 0.0f};
    float dr[2] = {t0 < T ? d_h[t0] : 0.0f, t1 < T ? d_h[t1] : 0.0f};

    float dq[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;

    for (int kb = 0; kb <= qb; kb++) {
        const int buf = kb & (NBUF - 1), k0 = kb * ATT_BC;
        stream_acquire<NBUF>(kb, qb + 1, fetch);
        bf16 *Kb = Ks + buf * TILE;
        const bf16 *Vb = Vs + buf * TILE;

        float s[ATT_BC / 8][4], dp[ATT_BC / 8][4];
#pragma unroll
        for (int nt = 0; nt < ATT_BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t qa[4], oa[4];
            ldsm_x4(qa, a_frag_addr(Qs, STR, warp * 16, kk * 16, lane));
            ldsm_x4(oa, a_frag_addr(Os, STR, warp * 16, kk * 16, lane));
#pragma unroll
            for (int nt = 0; nt < ATT_BC / 8; nt += 2) {
                uint32_t bk[4], bv[4];
                ldsm_x4(bk, b_frag_addr_nk(Kb, STR, nt * 8, kk * 16, lane));
                ldsm_x4(bv, b_frag_addr_nk(Vb, STR, nt * 8, kk * 16, lane));
                mma_bf16(s[nt], qa, bk[0], bk[1]);
                mma_bf16(s[nt + 1], qa, bk[2], bk[3]);
                mma_bf16(dp[nt], oa, bv[0], bv[1]);
                mma_bf16(dp[nt + 1], oa, bv[2], bv[3]);
            }
        }
        // the mask on the diagonal block only; rows past T need none (their
        // Q and dO rows, lse and D are zero, and they are not stored)
        if (kb == qb) causal_mask(s, k0 + 2 * tq, t0, t1);
#pragma unroll
        for (int nt = 0; nt < ATT_BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                float p = ex2(fmaf(s[nt][e], scale_log2, -lr[r])); // -inf (masked) gives 0
                s[nt][e] = p * (dp[nt][e] - dr[r]);                // dS
            }
        // dQ += dS K   (k dimension: the key; K through .trans)
#pragma unroll
        for (int j = 0; j < ATT_BC / 16; j++) {
            uint32_t da[4];
            c_to_a(da, s[2 * j], s[2 * j + 1]);
#pragma unroll
            for (int d = 0; d < HD / 8; d += 2) {
                uint32_t bk[4];
                ldsm_x4_t(bk, b_frag_addr_kn(Kb, STR, j * 16, d * 8, lane));
                mma_bf16(dq[d], da, bk[0], bk[1]);
                mma_bf16(dq[d + 1], da, bk[2], bk[3]);
            }
        }
        stream_release<NBUF>(kb, qb + 1, fetch);
    }

    store_frags<HD>(dqkv + (size_t)b * T * C3 + (size_t)h * hd, C3, dq, q0, T, hd, scale, rp);
}
