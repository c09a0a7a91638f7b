// Device helpers shared by the kernel headers. Depends on cuda_bf16.h
// alone, so that the host emulator (tests/gpu/kernels_emu.cpp) can compile
// the kernel headers with g++: it defines RL_KERNEL_EMU and supplies
// __syncthreads, __shfl_xor_sync and the mma before including them.
#pragma once

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef __nv_bfloat16 bf16;

// Kernel launches go through this macro: the triple-chevron launch on the
// GPU; in the emulator (tests/gpu/emu/emu.h) a host loop over the grid.
#ifndef RL_KERNEL_EMU
#define RL_LAUNCH(kernel, grid, block, smem_bytes, stream, ...)                                    \
    kernel<<<(grid), (block), (smem_bytes), (stream)>>>(__VA_ARGS__)
#else
#define RL_LAUNCH(kernel, grid, block, smem_bytes, stream, ...)                                    \
    rl_emu_launch_kernel(reinterpret_cast<const void *>(&kernel), dim3(grid), dim3(block),         \
                         (smem_bytes), (stream), rl_emu_bind(&kernel, __VA_ARGS__))
#endif

// Statically sized shared arrays: per block on the device; the emulator
// runs one block at a time, so a function-static array is the same thing.
#ifndef RL_KERNEL_EMU
#define RL_SMEM_STATIC __shared__
#else
#define RL_SMEM_STATIC static
#endif

static __device__ __forceinline__ float bf2f(bf16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ bf16 f2bf(float x) { return __float2bfloat16_rn(x); }

// Butterfly reductions: every lane ends with the same value, and the order of
// additions is fixed, so results are bit-identical run to run.
static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- V-wide loads and stores for the memory-bound kernels ------------------
// fvec<V> is V floats in registers. V = 1 is the plain scalar path; V = 4
// moves fp32 as one 16-byte float4 and bf16 as one 8-byte access; V = 8
// moves bf16 as one 16-byte access and fp32 as two. Callers check
// alignment before they pick V > 1 (see the launchers).
template <int V> struct fvec { float v[V]; };
template <int V> static __device__ __forceinline__ fvec<V> ld_f32(const float *p) {
    fvec<V> r;
    if constexpr (V == 4 || V == 8) {
#pragma unroll
        for (int h = 0; h < V; h += 4) {
            float4 t = *reinterpret_cast<const float4 *>(p + h);
            r.v[h] = t.x, r.v[h + 1] = t.y, r.v[h + 2] = t.z, r.v[h + 3] = t.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) r.v[k] = p[k];
    }
    return r;
}
template <int V> static __device__ __forceinline__ void st_f32(float *p, const fvec<V> &a) {
    if constexpr (V == 4) {
        *reinterpret_cast<float4 *>(p) = make_float4(a.v[0], a.v[1], a.v[2], a.v[3]);
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) p[k] = a.v[k];
    }
}
// bf16 is the top half of an fp32: widening is a shift.
static __device__ __forceinline__ float bf16_bits_lo(uint32_t w) {
    uint32_t u = w << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static __device__ __forceinline__ float bf16_bits_hi(uint32_t w) {
    uint32_t u = w & 0xffff0000u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static __device__ __forceinline__ uint32_t bf16_pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}
template <int V> static __device__ __forceinline__ fvec<V> ld_bf16(const bf16 *p) {
    fvec<V> r;
    if constexpr (V == 8) {
        uint4 t = *reinterpret_cast<const uint4 *>(p);
        uint32_t w[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
        for (int k = 0; k < 4; k++)
            r.v[2 * k] = bf16_bits_lo(w[k]), r.v[2 * k + 1] = bf16_bits_hi(w[k]);
    } else if constexpr (V == 4) {
        uint2 t = *reinterpret_cast<const uint2 *>(p);
        r.v[0] = bf16_bits_lo(t.x), r.v[1] = bf16_bits_hi(t.x);
        r.v[2] = bf16_bits_lo(t.y), r.v[3] = bf16_bits_hi(t.y);
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) r.v[k] = __bfloat162float(p[k]);
    }
    return r;
}
template <int V> static __device__ __forceinline__ void st_bf16(bf16 *p, const fvec<V> &a) {
    if constexpr (V == 8) {
        *reinterpret_cast<uint4 *>(p) =
            make_uint4(bf16_pack(a.v[0], a.v[1]), bf16_pack(a.v[2], a.v[3]),
                       bf16_pack(a.v[4], a.v[5]), bf16_pack(a.v[6], a.v[7]));
    } else if constexpr (V == 4) {
        *reinterpret_cast<uint2 *>(p) =
            make_uint2(bf16_pack(a.v[0], a.v[1]), bf16_pack(a.v[2], a.v[3]));
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) p[k] = __float2bfloat16_rn(a.v[k]);
    }
}
// SwiGLU's arithmetic on one gate/up pair (the CPU model's): the
// elementwise kernels and the fused GEMM epilogues (gemm_kernels.cuh) call
// these same lines, so where both read the same bf16 gate and up they write
// the same bits.
static __device__ __forceinline__ float swiglu_h(float g, float u) {
    float sig = 1.0f / (1.0f + expf(-g));
    return g * sig * u;
}
// d: the gradient of h; dg, du: of gate and up
static __device__ __forceinline__ void swiglu_grad(float d, float g, float u, float *dg,
                                                   float *du) {
    float sig = 1.0f / (1.0f + expf(-g));
    *dg = d * u * (sig * (1.0f + g * (1.0f - sig)));
    *du = d * (g * sig);
}

// Is p aligned for V-wide accesses of elements of `size` bytes?
static inline bool vec_ok(const void *p, int V, int size) {
    return ((uintptr_t)p % (uintptr_t)(V * size)) == 0;
}

// AdamW's per-step scalars, computed on the host (gpu_model.cu).
typedef struct rl_k_adamw_args {
    float b1, b2, c1, c2;  // betas and (1 - beta) rounded from double
    float step, sbc2, eps; // lr / bc1, sqrt(bc2)
    float decay;           // 1 - lr * wd (matrices)
    float grad_scale;
    float clip_max; // > 0: multiply by min(1, clip_max / (*norm + 1e-6))
} rl_k_adamw_args;

// A rank's shard of the flat state (dist.shard, rl_shard_range) as the
// kernels read it: range k covers flat offsets [off, off + len), its
// moments start at shard element `at` (the ranges' lengths summed before
// it), and norm says whether this rank adds it to the gradient norm (a
// range every rank holds is counted by rank 0 alone). In `at` order, none
// empty, nr >= 1; held = the lengths' sum.
typedef struct rl_k_range {
    size_t off, len, at;
    int norm;
} rl_k_range;
