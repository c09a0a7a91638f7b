// Device helpers shared by the kernel headers. Depends on cuda_bf16.h
// alone, so that the host emulator (tests/gpu/kernels_emu.cpp) can compile
// the kernel headers with g++: it defines RL_KERNEL_EMU and supplies
// __syncthreads, __shfl_xor_sync and the mma before including them.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

// Kernel launches go through this macro: the triple-chevron launch on the
// GPU; in the emulator (tests/gpu/emu/emu.h) a host loop over the grid.
#ifndef RL_KERNEL_EMU
#define RL_LAUNCH(kernel, grid, block, smem_bytes, stream, ...) \
    kernel<<<(grid), (block), (smem_bytes), (stream)>>>(__VA_ARGS__)
#else
#define RL_LAUNCH(kernel, grid, block, smem_bytes, stream, ...)                       \
    do {                                                                              \
        (void)(stream);                                                               \
        rl_emu_launch(dim3(grid), dim3(block), (smem_bytes), [&] { kernel(__VA_ARGS__); }); \
    } while (0)
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

// AdamW's per-step scalars, computed on the host (gpu_model.cu).
typedef struct rl_k_adamw_args {
    float b1, b2, c1, c2;  // betas and (1 - beta) rounded from double
    float step, sbc2, eps; // lr / bc1, sqrt(bc2)
    float decay;           // 1 - lr * wd (matrices)
    float grad_scale;
    float clip_max;        // > 0: multiply by min(1, clip_max / (*norm + 1e-6))
} rl_k_adamw_args;
