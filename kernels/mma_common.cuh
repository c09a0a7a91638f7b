// The tensor-core building blocks the tiled kernels share (attention,
// the fused GEMMs): mma.sync m16n8k16 with bf16 operands and fp32
// accumulators, ldmatrix(.trans) fragment loads from shared tiles, cp.async
// copies, and the lane addresses that make ldmatrix's four registers one A
// fragment or the B fragments of two adjacent n-tiles. The fragment layouts
// are written out in attention_kernels.cuh's header comment; the emulator
// (tests/gpu/emu/emu.h) supplies these same functions for the host.
#pragma once

#include <string.h>

#include "kernels/device_common.cuh"

#ifndef RL_KERNEL_EMU
static __device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
// 16 bytes global -> shared, bypassing registers (and L1: .cg); with
// valid == false nothing is read and the destination is zero-filled.
static __device__ __forceinline__ void cp_async16(bf16 *dst, const bf16 *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
// all but the N most recently committed groups have landed (this thread's)
template <int N> static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#endif // else tests/gpu/emu/emu.h defines them (and __syncthreads, __shfl_xor_sync)

// low half = lo (the lower column), as the fragments want
static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, sizeof u); // a register move on the device
    return u;
}

// This lane's ldmatrix row address for:
// the A fragment of rows [r0, r0+16) x cols [c0, c0+16) of a row-major tile
// (matrix i: rows + 8 (i & 1), cols + 8 (i >> 1));
static __device__ __forceinline__ const bf16 *a_frag_addr(const bf16 *tile, int stride, int r0,
                                                          int c0, int lane) {
    return tile + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * stride + c0 + (lane >> 4) * 8;
}
// the B fragments of n-tiles [n0, n0+8) and [n0+8, n0+16), k block
// [k0, k0+16), from a tile stored [n][k] (matrix i: n + 8 (i >> 1), k + 8 (i & 1));
static __device__ __forceinline__ const bf16 *b_frag_addr_nk(const bf16 *tile, int stride, int n0,
                                                             int k0, int lane) {
    return tile + (n0 + (lane >> 4) * 8 + (lane & 7)) * stride + k0 + ((lane >> 3) & 1) * 8;
}
// the same from a tile stored [k][n], read with ldsm_x4_t (matrix i:
// k + 8 (i & 1), n + 8 (i >> 1)).
static __device__ __forceinline__ const bf16 *b_frag_addr_kn(const bf16 *tile, int stride, int k0,
                                                             int n0, int lane) {
    return tile + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * stride + n0 + (lane >> 4) * 8;
}
// the A fragment of rows [r0, r0+16) x cols [c0, c0+16) from a tile stored
// transposed, [col][row], read with ldsm_x4_t: matrix i is rows + 8 (i & 1),
// cols + 8 (i >> 1), and its 8 stored rows are the 8 columns.
static __device__ __forceinline__ const bf16 *a_frag_addr_t(const bf16 *tile, int stride, int r0,
                                                            int c0, int lane) {
    return tile + (c0 + (lane >> 4) * 8 + (lane & 7)) * stride + r0 + ((lane >> 3) & 1) * 8;
}
