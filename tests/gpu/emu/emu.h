// Host emulation of the CUDA device features the kernels use, so that the
// kernels' own source (kernels/*.cuh, and kernels/*.cu for the launchers)
// compiles with g++ and runs on a CPU. Force-included (-include) into every
// translation unit of an emulated build; kernels/device_common.cuh turns
// kernel launches into rl_emu_launch calls when RL_KERNEL_EMU is defined.
//
// Model: a block runs as one fiber per CUDA thread on one OS thread, blocks
// one after another. __syncthreads is a barrier over the block's live
// fibers, __shfl_xor_sync and mma_bf16 barriers over the warp's around an
// exchange; a barrier nobody can complete aborts with "deadlock" (a
// barrier in divergent code). Dynamic shared memory is poisoned with NaN
// bits before each block.
#pragma once
#ifndef RL_KERNEL_EMU
#define RL_KERNEL_EMU 1
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>

#include <cuda_bf16.h>
#include <driver_types.h>
#include <vector_types.h>

struct rl_emu_dim3 {
    unsigned x, y, z;
};
extern rl_emu_dim3 threadIdx, blockIdx, gridDim, blockDim;
extern unsigned char smem[]; // the running block's dynamic shared memory

void __syncthreads();
double rl_emu_shfl_xor(double v, int lane_mask); // exact for float and double
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
    return (T)rl_emu_shfl_xor((double)v, lane_mask);
}
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 over the warp
void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 over the warp: p is this
// lane's row address (lanes 8i..8i+7 give the rows of matrix i)
void ldsm_x4(uint32_t (&r)[4], const __nv_bfloat16 *p);
void ldsm_x4_t(uint32_t (&r)[4], const __nv_bfloat16 *p);
// cp.async.cg 16 bytes (valid == false: zero fill), commit_group,
// wait_group N. Deferred: a copy lands only when a wait covers its group,
// so a read of shared memory before the wait sees stale or poisoned data.
void cp_async16(__nv_bfloat16 *dst, const __nv_bfloat16 *src, bool valid);
void cp_async_commit();
void rl_emu_cp_async_wait(int n);
template <int N> static inline void cp_async_wait() { rl_emu_cp_async_wait(N); }

// Runs fn for every thread of every block; 1-D blocks of at most 1024.
void rl_emu_launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()> &fn);
// A launch of `kernel` on `stream` as the runtime makes it (RL_LAUNCH,
// fake_cuda.cpp): refused, with the error cudaGetLastError then reports,
// where the hardware of the emulated architecture (RL_EMU_SM) would refuse
// it; else rl_emu_launch, now or, on a capturing stream, at each replay of
// the graph (fn must hold the kernel's arguments by value).
void rl_emu_launch_kernel(const void *kernel, dim3 grid, dim3 block, size_t smem_bytes,
                          cudaStream_t stream, const std::function<void()> &fn);

// A kernel call with its arguments evaluated now, as a launch evaluates
// them (a replayed graph reuses these values; `*args` is read once, here).
template <class K, class... A> std::function<void()> rl_emu_bind(K *kernel, A... args) {
    return [=] { kernel(args...); };
}

// Stream capture (fake_graph.cpp). rl_emu_enqueue runs fn now, or records
// it when s is capturing (returns true then). The checks return the error
// the runtime gives, and invalidate the capture they break: an unsafe call
// (one that may synchronise) while a capture restricts this thread, or on
// capturing stream s (s may be NULL); a copy from or to pageable memory on
// a capturing stream; an event recorded inside a capture used by the host.
bool rl_emu_enqueue(cudaStream_t s, const std::function<void()> &fn);
cudaError_t rl_emu_capture_unsafe(cudaStream_t s);
cudaError_t rl_emu_capture_copy(cudaStream_t s, bool pageable);
void rl_emu_capture_fail(cudaStream_t s, cudaError_t err);
cudaError_t rl_emu_event_record(cudaEvent_t ev, cudaStream_t s);
cudaError_t rl_emu_event_usable(cudaEvent_t ev);
// RL_EMU_DEFER=1 (fake_graph.cpp): streams keep their work queued until it
// is needed. Runs stream s's queue (NULL: every stream's); makes s's later
// work (NULL: the host, now) wait for ev's point in its stream; runs s's
// queue and forgets it (a destroyed stream). No-ops without the mode.
void rl_emu_stream_run(cudaStream_t s);
void rl_emu_stream_wait(cudaStream_t s, cudaEvent_t ev);
void rl_emu_stream_forget(cudaStream_t s);
// For tests, while no other thread uses the device: the opt-in shared-
// memory maximum the device reports from now on.
void rl_emu_set_smem_optin(int bytes);

// fp32 atomicAdd: blocks run one at a time and a fiber yields only at a
// barrier, so the read-modify-write is atomic as written. The additions
// come in the launch's block order, one of the many orders a GPU may take;
// rl_emu_set_block_order(true) runs the blocks in reverse, for tests of a
// kernel's independence of that order.
static inline float atomicAdd(float *p, float v) {
    float old = *p;
    *p = old + v;
    return old;
}
void rl_emu_set_block_order(bool reverse);

// device built-ins a host compiler lacks
#define __launch_bounds__(...)
using std::max;
using std::min;
static inline float cospif(float x) { return (float)std::cos(3.14159265358979323846 * (double)x); }
