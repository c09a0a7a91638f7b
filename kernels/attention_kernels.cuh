// Causal grouped-query attention, flash style: tiles of Q, K, V in shared
// memory, scores in registers, an online softmax, no T x T matrix anywhere
// in global memory. bf16 operands on the tensor cores (mma.sync
// m16n8k16, sm_80 and sm_90 alike), fp32 accumulation and softmax.
//
// Layout (the model's fused projections): qkv rows are [q heads | k heads |
// v heads] of head_dim hd each, row n = b*T + t; out / dout rows are the H q
// heads; query head h reads kv head h / (H / KV) (transformers' repeat_kv).
// RoPE is applied before these kernels run.
//
// Three kernels, no atomics anywhere (the same bits every run):
//   fwd    one CTA per (query block, b, h): loop over key blocks <= the
//          diagonal; writes out (bf16) and the row log-sum-exp (fp32, log2
//          domain) for the backward.
//   dkdv   one CTA per (key block, b, kv head): loops over the group's
//          query heads and the query blocks at or below the diagonal; owns
//          its dK, dV rows outright, so the GQA sum over heads needs no
//          atomics.
//   dq     one CTA per (query block, b, h): recomputes P and dP for its rows
//          (two more small GEMMs than an atomic-add dQ, for determinism).
// plus a small one for D_i = rowsum(dO_i * O_i).
//
// Warp tiling: 4 warps, each owns 16 rows of the CTA's 64; the other
// dimension is a 64-wide tile. Head dims are padded to 32, 64 or 128 in
// shared memory with zeros (the zero columns add nothing to Q.K and give
// zero output columns that are not stored).
//
// Fragment layouts of mma.m16n8k16 (PTX ISA), lane = 4 * gr + tq:
//   A (16x16, row): a[0] = (gr,   2tq..+1)  a[1] = (gr+8, 2tq..+1)
//                   a[2] = (gr,   2tq+8..)  a[3] = (gr+8, 2tq+8..)
//   B (16x8, col):  b[0] = (k 2tq..+1, n gr) b[1] = (k 2tq+8..+9, n gr)
//   C (16x8 fp32):  c[0..1] = (gr, 2tq..+1)  c[2..3] = (gr+8, 2tq..+1)
// so B is read from a tile stored [n][k] (k contiguous), and two adjacent
// C tiles (n 0-7, 8-15) of a score block are exactly the A fragment of the
// next product: probabilities never leave registers.
//
// This header holds the device code alone, so that tests/gpu/kernels_emu.cpp
// can compile the very same kernels for the host (one std::thread per CUDA
// thread, barriers for __syncthreads and the shuffles, an exact emulation
// of the mma instruction) and check them without a GPU. It depends on
// nothing but device_common.cuh for that reason; gpu_attention.cu has the
// launchers.
#pragma once

#include <math.h>
#include <string.h>

#include "kernels/device_common.cuh"

#define ATT_BR 64 // query rows per CTA tile
#define ATT_BC 64 // key rows per CTA tile
#define ATT_THREADS 128
#define STRT (ATT_BC + 8) // row stride of transposed tiles [HD][64]: +8 keeps rows 16-byte aligned and spreads banks

#ifndef RL_KERNEL_EMU
static __device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif // else the emulator defines mma_bf16, __syncthreads, __shfl_xor_sync

static __device__ __forceinline__ uint32_t ld32(const bf16 *p) {
    return *reinterpret_cast<const uint32_t *>(p);
}

// low half = lo (the lower column), as the fragments want
static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, sizeof u); // a register move on the device
    return u;
}

// A fragment of rows [r, r+16) and columns [c, c+16) of a row-major tile.
static __device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16 *tile, int stride,
                                              int r, int c, int gr, int tq) {
    const bf16 *p = tile + (r + gr) * stride + c + 2 * tq;
    a[0] = ld32(p);
    a[1] = ld32(p + 8 * stride);
    a[2] = ld32(p + 8);
    a[3] = ld32(p + 8 * stride + 8);
}

// Accumulator pairs (n tiles 2j, 2j+1) -> A fragment (bf16) of k block j.
static __device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                              const float (&c1)[4]) {
    a[0] = pack2(c0[0], c0[1]);
    a[1] = pack2(c0[2], c0[3]);
    a[2] = pack2(c1[0], c1[1]);
    a[3] = pack2(c1[2], c1[3]);
}

// Rows [r0, r0 + 64) of a global matrix (row stride ld elements, starting
// at column 0 of src), columns [0, hd), into a row-major tile [64][HD + 8]
// and/or its transpose [HD][STRT]. Rows >= rmax and columns >= hd are zero.
// vec: 16-byte loads (hd % 8 == 0 and 16-byte aligned rows).
template <int HD>
static __device__ void load_tile(bf16 *tile, bf16 *tileT, const bf16 *src, size_t ld, int r0,
                                 int rmax, int hd, bool vec) {
    constexpr int STR = HD + 8;
    if (vec) {
        constexpr int CH = HD / 8;
        for (int c = threadIdx.x; c < ATT_BR * CH; c += ATT_THREADS) {
            int r = c / CH, col = (c % CH) * 8;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (r0 + r < rmax && col < hd)
                v = *reinterpret_cast<const uint4 *>(src + (size_t)(r0 + r) * ld + col);
            if (tile) *reinterpret_cast<uint4 *>(tile + r * STR + col) = v;
            if (tileT) {
                const bf16 *pv = reinterpret_cast<const bf16 *>(&v);
#pragma unroll
                for (int i = 0; i < 8; i++) tileT[(col + i) * STRT + r] = pv[i];
            }
        }
    } else {
        for (int c = threadIdx.x; c < ATT_BR * HD; c += ATT_THREADS) {
            int r = c / HD, col = c % HD;
            bf16 v = __float2bfloat16_rn(0.0f);
            if (r0 + r < rmax && col < hd) v = src[(size_t)(r0 + r) * ld + col];
            if (tile) tile[r * STR + col] = v;
            if (tileT) tileT[col * STRT + r] = v;
        }
    }
}

// ---- forward -------------------------------------------------------------------------------
template <int HD>
static __global__ void __launch_bounds__(ATT_THREADS)
    attn_fwd_kernel(bf16 *out, float *lse, const bf16 *qkv, int T, int H, int KV, int hd,
                    float scale_log2, int vec) {
    constexpr int STR = HD + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = reinterpret_cast<bf16 *>(smem); // [64][STR]
    bf16 *Ks = Qs + ATT_BR * STR;              // [64][STR]
    bf16 *Vt = Ks + ATT_BC * STR;              // [HD][STRT]

    const int qb = gridDim.y - 1 - blockIdx.y; // the longest rows start first
    const int bh = blockIdx.x, b = bh / H, h = bh % H, g = h / (H / KV);
    const size_t C3 = (size_t)(H + 2 * KV) * hd, qd = (size_t)H * hd, kvd = (size_t)KV * hd;
    const bf16 *base = qkv + (size_t)b * T * C3;
    const int q0 = qb * ATT_BR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    const int t0 = q0 + warp * 16 + gr, t1 = t0 + 8; // this thread's two query rows

    load_tile<HD>(Qs, nullptr, base + (size_t)h * hd, C3, q0, T, hd, vec);
    __syncthreads();
    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) load_a(qf[kk], Qs, STR, warp * 16, kk * 16, gr, tq);

    float o[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};

    for (int kb = 0; kb <= qb; kb++) {
        const int k0 = kb * ATT_BC;
        __syncthreads(); // every warp is done with the previous K, V tiles
        load_tile<HD>(Ks, nullptr, base + qd + (size_t)g * hd, C3, k0, T, hd, vec);
        load_tile<HD>(nullptr, Vt, base + qd + kvd + (size_t)g * hd, C3, k0, T, hd, vec);
        __syncthreads();

        float sc[ATT_BC / 8][4];
#pragma unroll
        for (int nt = 0; nt < ATT_BC / 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int nt = 0; nt < ATT_BC / 8; nt++) {
                const bf16 *kp = Ks + (nt * 8 + gr) * STR + kk * 16 + 2 * tq;
                mma_bf16(sc[nt], qf[kk], ld32(kp), ld32(kp + 8));
            }

        // scale into the log2 domain, mask (key > query; keys past T are
        // past every valid query), row maxima over the quad of lanes
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < ATT_BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + nt * 8 + 2 * tq + (e & 1), row = e < 2 ? t0 : t1;
                float v = key > row ? -INFINITY : sc[nt][e] * scale_log2;
                sc[nt][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        float sub[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mnew = fmaxf(mrow[r], mx[r]);
            sub[r] = mnew == -INFINITY ? 0.0f : mnew; // a row with nothing visible yet: no NaN
            alpha[r] = exp2f(mrow[r] - sub[r]);
            mrow[r] = mnew;
        }
        float ls[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < ATT_BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(sc[nt][e] - sub[e >> 1]);
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
        // O += P V, P straight from the score registers
#pragma unroll
        for (int j = 0; j < ATT_BC / 16; j++) {
            uint32_t pa[4];
            c_to_a(pa, sc[2 * j], sc[2 * j + 1]);
#pragma unroll
            for (int d = 0; d < HD / 8; d++) {
                const bf16 *vp = Vt + (d * 8 + gr) * STRT + j * 16 + 2 * tq;
                mma_bf16(o[d], pa, ld32(vp), ld32(vp + 8));
            }
        }
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
static __global__ void attn_dsum_kernel(float *dsum, const bf16 *dout, const bf16 *out, int N, int T,
                                 int H, int hd) {
    int idx = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (idx >= N * H) return;
    int n = idx / H, h = idx % H;
    size_t off = (size_t)n * H * hd + (size_t)h * hd;
    float acc = 0.0f;
    for (int d = lane; d < hd; d += 32) acc += bf2f(dout[off + d]) * bf2f(out[off + d]);
    acc = warp_sum(acc);
    if (lane == 0) {
        int b = n / T, t = n % T;
        dsum[((size_t)b * H + h) * T + t] = acc;
    }
}

// ---- backward: dK, dV -------------------------------------------------------------------------
// Rows of the warp tiles are keys here: S^T = K Q^T and dP^T = V dO^T, so
// P^T and dS^T come out as A fragments for dV += P^T dO and dK += dS^T Q.
template <int HD>
static __global__ void __launch_bounds__(ATT_THREADS)
    attn_bwd_dkdv_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                         const float *dsum, int T, int H, int KV, int hd, float scale_log2,
                         float scale, int vec) {
    constexpr int STR = HD + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Ks = reinterpret_cast<bf16 *>(smem); // [64][STR]
    bf16 *Vs = Ks + ATT_BC * STR;              // [64][STR]
    bf16 *Qs = Vs + ATT_BC * STR;              // [64][STR]
    bf16 *Os = Qs + ATT_BR * STR;              // dO [64][STR]
    bf16 *Qt = Os + ATT_BR * STR;              // [HD][STRT]
    bf16 *Ot = Qt + HD * STRT;                 // dO^T [HD][STRT]
    float *lse_s = reinterpret_cast<float *>(Ot + HD * STRT); // [64]
    float *d_s = lse_s + ATT_BR;                              // [64]

    const int kb = blockIdx.y; // key block 0 has the most query blocks: it starts first
    const int bg = blockIdx.x, b = bg / KV, g = bg % KV, rep = H / KV;
    const size_t C3 = (size_t)(H + 2 * KV) * hd, qd = (size_t)H * hd, kvd = (size_t)KV * hd;
    const bf16 *base = qkv + (size_t)b * T * C3;
    const bf16 *obase = dout + (size_t)b * T * qd;
    const int k0 = kb * ATT_BC, nqb = (T + ATT_BR - 1) / ATT_BR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    const int key0 = k0 + warp * 16 + gr, key1 = key0 + 8;

    load_tile<HD>(Ks, nullptr, base + qd + (size_t)g * hd, C3, k0, T, hd, vec);
    load_tile<HD>(Vs, nullptr, base + qd + kvd + (size_t)g * hd, C3, k0, T, hd, vec);

    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;

    for (int h = g * rep; h < (g + 1) * rep; h++) {
        const float *lse_h = lse + ((size_t)b * H + h) * T, *d_h = dsum + ((size_t)b * H + h) * T;
        for (int qb = kb; qb < nqb; qb++) {
            const int q0 = qb * ATT_BR;
            __syncthreads(); // previous Q, dO tiles consumed (and K, V loaded)
            load_tile<HD>(Qs, Qt, base + (size_t)h * hd, C3, q0, T, hd, vec);
            load_tile<HD>(Os, Ot, obase + (size_t)h * hd, qd, q0, T, hd, vec);
            for (int i = threadIdx.x; i < ATT_BR; i += ATT_THREADS) {
                bool ok = q0 + i < T;
                lse_s[i] = ok ? lse_h[q0 + i] : 0.0f;
                d_s[i] = ok ? d_h[q0 + i] : 0.0f;
            }
            __syncthreads();

            float st[ATT_BR / 8][4], dpt[ATT_BR / 8][4];
#pragma unroll
            for (int nt = 0; nt < ATT_BR / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) st[nt][e] = dpt[nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t ka[4], va[4];
                load_a(ka, Ks, STR, warp * 16, kk * 16, gr, tq);
                load_a(va, Vs, STR, warp * 16, kk * 16, gr, tq);
#pragma unroll
                for (int nt = 0; nt < ATT_BR / 8; nt++) {
                    const bf16 *qp = Qs + (nt * 8 + gr) * STR + kk * 16 + 2 * tq;
                    const bf16 *op = Os + (nt * 8 + gr) * STR + kk * 16 + 2 * tq;
                    mma_bf16(st[nt], ka, ld32(qp), ld32(qp + 8));
                    mma_bf16(dpt[nt], va, ld32(op), ld32(op + 8));
                }
            }
            // P^T = exp2(S^T * scale_log2 - lse[query]); dS^T = P^T (dP^T - D[query])
#pragma unroll
            for (int nt = 0; nt < ATT_BR / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int qi = nt * 8 + 2 * tq + (e & 1), query = q0 + qi;
                    int key = e < 2 ? key0 : key1;
                    bool ok = key <= query && query < T;
                    float p = ok ? exp2f(st[nt][e] * scale_log2 - lse_s[qi]) : 0.0f;
                    st[nt][e] = p;
                    dpt[nt][e] = p * (dpt[nt][e] - d_s[qi]);
                }
            // dV += P^T dO ; dK += dS^T Q   (the k dimension is the query)
#pragma unroll
            for (int j = 0; j < ATT_BR / 16; j++) {
                uint32_t pa[4], da[4];
                c_to_a(pa, st[2 * j], st[2 * j + 1]);
                c_to_a(da, dpt[2 * j], dpt[2 * j + 1]);
#pragma unroll
                for (int d = 0; d < HD / 8; d++) {
                    const bf16 *op = Ot + (d * 8 + gr) * STRT + j * 16 + 2 * tq;
                    const bf16 *qp = Qt + (d * 8 + gr) * STRT + j * 16 + 2 * tq;
                    mma_bf16(dv[d], pa, ld32(op), ld32(op + 8));
                    mma_bf16(dk[d], da, ld32(qp), ld32(qp + 8));
                }
            }
        }
    }

    bf16 *dbase = dqkv + (size_t)b * T * C3;
    bf16 *dkb = dbase + qd + (size_t)g * hd, *dvb = dbase + qd + kvd + (size_t)g * hd;
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        int col = d * 8 + 2 * tq;
        if (col >= hd) continue;
        if (key0 < T) {
            *reinterpret_cast<__nv_bfloat162 *>(dkb + (size_t)key0 * C3 + col) =
                __floats2bfloat162_rn(dk[d][0] * scale, dk[d][1] * scale);
            *reinterpret_cast<__nv_bfloat162 *>(dvb + (size_t)key0 * C3 + col) =
                __floats2bfloat162_rn(dv[d][0], dv[d][1]);
        }
        if (key1 < T) {
            *reinterpret_cast<__nv_bfloat162 *>(dkb + (size_t)key1 * C3 + col) =
                __floats2bfloat162_rn(dk[d][2] * scale, dk[d][3] * scale);
            *reinterpret_cast<__nv_bfloat162 *>(dvb + (size_t)key1 * C3 + col) =
                __floats2bfloat162_rn(dv[d][2], dv[d][3]);
        }
    }
}

// ---- backward: dQ -----------------------------------------------------------------------------------
template <int HD>
static __global__ void __launch_bounds__(ATT_THREADS)
    attn_bwd_dq_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                       const float *dsum, int T, int H, int KV, int hd, float scale_log2,
                       float scale, int vec) {
    constexpr int STR = HD + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = reinterpret_cast<bf16 *>(smem); // [64][STR]
    bf16 *Os = Qs + ATT_BR * STR;              // dO [64][STR]
    bf16 *Ks = Os + ATT_BR * STR;              // [64][STR]
    bf16 *Vs = Ks + ATT_BC * STR;              // [64][STR]
    bf16 *Kt = Vs + ATT_BC * STR;              // [HD][STRT]

    const int qb = gridDim.y - 1 - blockIdx.y;
    const int bh = blockIdx.x, b = bh / H, h = bh % H, g = h / (H / KV);
    const size_t C3 = (size_t)(H + 2 * KV) * hd, qd = (size_t)H * hd, kvd = (size_t)KV * hd;
    const bf16 *base = qkv + (size_t)b * T * C3;
    const int q0 = qb * ATT_BR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    const int t0 = q0 + warp * 16 + gr, t1 = t0 + 8;

    load_tile<HD>(Qs, nullptr, base + (size_t)h * hd, C3, q0, T, hd, vec);
    load_tile<HD>(Os, nullptr, dout + (size_t)b * T * qd + (size_t)h * hd, qd, q0, T, hd, vec);
    const float *lse_h = lse + (size_t)bh * T, *d_h = dsum + (size_t)bh * T;
    float lr[2] = {t0 < T ? lse_h[t0] : 0.0f, t1 < T ? lse_h[t1] : 0.0f};
    float dr[2] = {t0 < T ? d_h[t0] : 0.0f, t1 < T ? d_h[t1] : 0.0f};

    float dq[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;

    for (int kb = 0; kb <= qb; kb++) {
        const int k0 = kb * ATT_BC;
        __syncthreads();
        load_tile<HD>(Ks, Kt, base + qd + (size_t)g * hd, C3, k0, T, hd, vec);
        load_tile<HD>(Vs, nullptr, base + qd + kvd + (size_t)g * hd, C3, k0, T, hd, vec);
        __syncthreads();

        float s[ATT_BC / 8][4], dp[ATT_BC / 8][4];
#pragma unroll
        for (int nt = 0; nt < ATT_BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t qa[4], oa[4];
            load_a(qa, Qs, STR, warp * 16, kk * 16, gr, tq);
            load_a(oa, Os, STR, warp * 16, kk * 16, gr, tq);
#pragma unroll
            for (int nt = 0; nt < ATT_BC / 8; nt++) {
                const bf16 *kp = Ks + (nt * 8 + gr) * STR + kk * 16 + 2 * tq;
                const bf16 *vp = Vs + (nt * 8 + gr) * STR + kk * 16 + 2 * tq;
                mma_bf16(s[nt], qa, ld32(kp), ld32(kp + 8));
                mma_bf16(dp[nt], oa, ld32(vp), ld32(vp + 8));
            }
        }
#pragma unroll
        for (int nt = 0; nt < ATT_BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + nt * 8 + 2 * tq + (e & 1), r = e >> 1, row = r ? t1 : t0;
                bool ok = key <= row && row < T;
                float p = ok ? exp2f(s[nt][e] * scale_log2 - lr[r]) : 0.0f;
                s[nt][e] = p * (dp[nt][e] - dr[r]); // dS
            }
        // dQ += dS K   (k dimension: the key)
#pragma unroll
        for (int j = 0; j < ATT_BC / 16; j++) {
            uint32_t da[4];
            c_to_a(da, s[2 * j], s[2 * j + 1]);
#pragma unroll
            for (int d = 0; d < HD / 8; d++) {
                const bf16 *kp = Kt + (d * 8 + gr) * STRT + j * 16 + 2 * tq;
                mma_bf16(dq[d], da, ld32(kp), ld32(kp + 8));
            }
        }
    }

    bf16 *dqb = dqkv + (size_t)b * T * C3 + (size_t)h * hd;
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        int col = d * 8 + 2 * tq;
        if (col >= hd) continue;
        if (t0 < T)
            *reinterpret_cast<__nv_bfloat162 *>(dqb + (size_t)t0 * C3 + col) =
                __floats2bfloat162_rn(dq[d][0] * scale, dq[d][1] * scale);
        if (t1 < T)
            *reinterpret_cast<__nv_bfloat162 *>(dqb + (size_t)t1 * C3 + col) =
                __floats2bfloat162_rn(dq[d][2] * scale, dq[d][3] * scale);
    }
}

