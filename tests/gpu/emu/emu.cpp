// The fiber scheduler behind tests/gpu/emu/emu.h (see there).
#include "tests/gpu/emu/emu.h"

#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

rl_emu_dim3 threadIdx, blockIdx, gridDim, blockDim;
alignas(16) unsigned char smem[256 * 1024];

namespace {
constexpr size_t STACK = 96 * 1024;
constexpr int MAXT = 1024, CTA = 32; // wait targets: warps 0..31, CTA = the block

struct pending_copy {
    void *dst;
    const void *src;
    bool valid;
    int group; // -1: not committed yet
};
struct fiber {
    ucontext_t ctx;
    bool done;
    int wait_on; // -1 runnable, else a barrier
    std::vector<pending_copy> copies;
    int committed;
};
std::vector<fiber> fibers(MAXT);
std::vector<char> stacks;
ucontext_t sched;
int cur;
const std::function<void()> *job;
int arrived[33], alive[33];
double xch[32][32];
const __nv_bfloat16 *ldsm_rows[32][32];
uint32_t stage_a[32][32][4], stage_b[32][32][2];
bool reverse_blocks;

void release(int target) {
    arrived[target] = 0;
    for (auto &f : fibers)
        if (f.wait_on == target) f.wait_on = -1;
}

void arrive(int target) {
    if (++arrived[target] == alive[target]) {
        release(target); // the last one to arrive goes on at once
        return;
    }
    fibers[cur].wait_on = target;
    swapcontext(&fibers[cur].ctx, &sched);
}

void trampoline() {
    (*job)();
    if (!fibers[cur].copies.empty()) {
        fprintf(stderr,
                "emu: thread %d of block (%u,%u) ended with %zu cp.async copies never waited for\n",
                cur, blockIdx.x, blockIdx.y, fibers[cur].copies.size());
        abort();
    }
    // exited threads stop counting towards barriers (as on the GPU)
    fibers[cur].done = true;
    int w = cur / 32;
    for (int t : {w, CTA}) {
        alive[t]--;
        if (arrived[t] && arrived[t] == alive[t]) release(t);
    }
} // returns to sched through uc_link

// Apart, so that getcontext's "returns twice" cannot touch run_block's loop.
__attribute__((noinline)) void init_fiber(fiber &f, char *stack) {
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stack;
    f.ctx.uc_stack.ss_size = STACK;
    f.ctx.uc_link = &sched;
    makecontext(&f.ctx, trampoline, 0);
}

void run_block(unsigned threads) {
    for (unsigned i = 0; i < threads; i++) {
        fiber &f = fibers[i];
        init_fiber(f, stacks.data() + (size_t)i * STACK);
        f.done = false;
        f.wait_on = -1;
        f.copies.clear();
        f.committed = 0;
    }
    for (unsigned i = threads; i < (unsigned)MAXT; i++)
        fibers[i].done = true, fibers[i].wait_on = -1;
    memset(arrived, 0, sizeof arrived);
    for (int w = 0; w < 32; w++)
        alive[w] = (int)std::min(32u, threads > 32u * w ? threads - 32u * w : 0u);
    alive[CTA] = (int)threads;
    unsigned left = threads;
    while (left) {
        bool ran = false;
        for (unsigned i = 0; i < threads; i++) {
            fiber &f = fibers[i];
            if (f.done || f.wait_on != -1) continue;
            cur = (int)i;
            threadIdx = {i, 0, 0};
            swapcontext(&sched, &f.ctx);
            ran = true;
            if (f.done) left--;
        }
        if (!ran) {
            fprintf(
                stderr,
                "emu: deadlock in block (%u,%u): %u threads wait on barriers nobody else reaches\n",
                blockIdx.x, blockIdx.y, left);
            abort();
        }
    }
}

float bf_lo(uint32_t u) {
    uint32_t x = (u & 0xffffu) << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
float bf_hi(uint32_t u) {
    uint32_t x = u & 0xffff0000u;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
} // namespace

void __syncthreads() { arrive(CTA); }

double rl_emu_shfl_xor(double v, int lane_mask) {
    int w = cur / 32, l = cur % 32;
    xch[w][l] = v;
    arrive(w);
    double r = xch[w][l ^ lane_mask];
    arrive(w); // nobody writes the exchange again before every lane has read
    return r;
}

// From the PTX ISA's fragment tables for m16n8k16 with .bf16 (lane = 4 g + t):
// A regs r = 0..3 hold (row g + 8 (r & 1), cols 2t + 8 (r >> 1) + {0, 1});
// B regs r = 0..1 hold (k = 2t + 8 r + {0, 1}, n = g);
// C/D e = 0..3 is (row g + 8 (e >> 1), col 2t + (e & 1)). fp32 sums in k order.
void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    int w = cur / 32, l = cur % 32;
    memcpy(stage_a[w][l], a, sizeof stage_a[w][l]);
    stage_b[w][l][0] = b0, stage_b[w][l][1] = b1;
    arrive(w);
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        int g = L >> 2, t = L & 3;
        for (int r = 0; r < 4; r++) {
            int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
            A[row][col] = bf_lo(stage_a[w][L][r]);
            A[row][col + 1] = bf_hi(stage_a[w][L][r]);
        }
        for (int r = 0; r < 2; r++) {
            int k = 2 * t + 8 * r;
            B[k][g] = bf_lo(stage_b[w][L][r]);
            B[k + 1][g] = bf_hi(stage_b[w][L][r]);
        }
    }
    arrive(w);
    int g = l >> 2, t = l & 3;
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float s = d[e];
        for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
        d[e] = s;
    }
}

static uint32_t pack_bits(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    uint16_t a, b;
    memcpy(&a, &lo, 2);
    memcpy(&b, &hi, 2);
    return (uint32_t)a | (uint32_t)b << 16;
}

// From the PTX ISA: each 8x8 matrix i is given by the row addresses of
// lanes 8i..8i+7; lane l receives row l/4, elements 2(l%4) and 2(l%4)+1 --
// or, with .trans, the same of the transposed matrix: elements (row 2(l%4),
// col l/4) and (row 2(l%4)+1, col l/4) of the stored one.
static void ldsm(uint32_t (&r)[4], const __nv_bfloat16 *p, bool trans) {
    int w = cur / 32, l = cur % 32;
    ldsm_rows[w][l] = p;
    arrive(w);
    for (int i = 0; i < 4; i++) {
        const __nv_bfloat16 *const *rows = ldsm_rows[w] + 8 * i;
        if (!trans)
            r[i] = pack_bits(rows[l / 4][2 * (l % 4)], rows[l / 4][2 * (l % 4) + 1]);
        else
            r[i] = pack_bits(rows[2 * (l % 4)][l / 4], rows[2 * (l % 4) + 1][l / 4]);
    }
    arrive(w);
}
void ldsm_x4(uint32_t (&r)[4], const __nv_bfloat16 *p) { ldsm(r, p, false); }
void ldsm_x4_t(uint32_t (&r)[4], const __nv_bfloat16 *p) { ldsm(r, p, true); }

void cp_async16(__nv_bfloat16 *dst, const __nv_bfloat16 *src, bool valid) {
    if (((uintptr_t)dst | (uintptr_t)src) & 15u) {
        fprintf(stderr, "emu: cp.async with a misaligned address (%p <- %p)\n", (void *)dst,
                (const void *)src);
        abort();
    }
    fibers[cur].copies.push_back({dst, src, valid, -1});
}
void cp_async_commit() {
    fiber &f = fibers[cur];
    for (auto &c : f.copies)
        if (c.group < 0) c.group = f.committed;
    f.committed++;
}
void rl_emu_cp_async_wait(int n) {
    fiber &f = fibers[cur];
    std::vector<pending_copy> keep;
    for (auto &c : f.copies) {
        if (c.group >= 0 && c.group < f.committed - n) {
            if (c.valid)
                memcpy(c.dst, c.src, 16);
            else
                memset(c.dst, 0, 16);
        } else {
            keep.push_back(c);
        }
    }
    f.copies.swap(keep);
}

void rl_emu_launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()> &fn) {
    // One emulated GPU: launches from several host threads (DDP's
    // communication thread casts buckets while the trainer's thread runs
    // backward) take turns, as whole kernels -- the fiber state is global.
    static std::mutex gpu;
    std::lock_guard<std::mutex> hold(gpu);
    unsigned threads = block.x * block.y * block.z;
    if (threads < 1 || threads > (unsigned)MAXT || block.y != 1 || block.z != 1 ||
        smem_bytes > sizeof smem) {
        fprintf(stderr, "emu: unsupported launch: block %ux%ux%u, %zu bytes of shared memory\n",
                block.x, block.y, block.z, smem_bytes);
        abort();
    }
    if (stacks.empty()) stacks.resize((size_t)MAXT * STACK);
    gridDim = {grid.x, grid.y, grid.z};
    blockDim = {block.x, 1, 1};
    job = &fn;
    size_t nblocks = (size_t)grid.x * grid.y * grid.z;
    for (size_t i = 0; i < nblocks; i++) {
        size_t k = reverse_blocks ? nblocks - 1 - i : i; // x fastest, then y, then z
        blockIdx = {(unsigned)(k % grid.x), (unsigned)(k / grid.x % grid.y),
                    (unsigned)(k / grid.x / grid.y)};
        memset(smem, 0xff, smem_bytes); // NaN bits in bf16 and fp32
        run_block(threads);
    }
}

void rl_emu_set_block_order(bool reverse) { reverse_blocks = reverse; }
