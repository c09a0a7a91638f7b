/* ddp: PyTorch-DDP semantics over pkg/comm.
 *
 * The gradient buffer is cut into buckets from its end backwards (the order
 * backward produces gradients): the first bucket is first_bucket_bytes
 * (1 MiB, as PyTorch), the others bucket_bytes (25 MiB), but no bucket
 * larger than 1/min_buckets of the gradients (default 8). The last bucket
 * (layer 0 and the embedding) is ready only when backward ends, so its
 * reduction can never overlap: PyTorch's fixed sizes leave a small model in
 * two buckets with most of it in that last one. Above 8 x 25 MiB of
 * gradients the cap changes nothing. The model's
 * backward reports a watermark ("grads[off:] are final"); every bucket whose
 * start is at or above it is handed, in bucket order, to a communication
 * thread that average-allreduces it while backward goes on. Bucket
 * boundaries ignore tensor boundaries: readiness is one number, so a
 * bucket is launched exactly when its last gradient is written.
 *
 * Sharded state (opts.shard, dist.shard; ZeRO-1/2). Each bucket of len
 * elements is split the way rl_comm_reduce_scatter splits a buffer: world
 * blocks of len / world, block r rank r's, then a tail of len % world
 * (fewer than world elements) that every rank holds. A rank's shard is its
 * block of every bucket plus the tails (rl_ddp_shard_plan): following the
 * buckets, a "gradients" reduction is one reduce-scatter per bucket (and a
 * tiny allreduce of its tail), launched from the same hook at the same
 * point of backward as DDP's allreduce, and the update of every bucket's
 * blocks can be gathered bucket by bucket. The tail keeps equal blocks
 * without padding (NCCL's reduce-scatter and all-gather take equal
 * counts); its elements are reduced with an allreduce, so every rank holds
 * the same bits and updates them alike. "optimizer" allreduces as DDP and
 * shards only the update. Bucket order is fixed, so is the ring order of
 * every sum: a sharded run is deterministic, and it differs from DDP's
 * only in the order of the reduce-scatter's sums and of the norm's.
 *
 * "gradients" with host gradients frees the gradients too (ZeRO-2's
 * memory): every micro-step's backward passes the hook (the trainer reads
 * reduce_each_micro), each bucket's reduced block and tail are added into
 * the shard's own gradient (shard.grad, compact; = on the step's first
 * micro-step) and the whole bucket is cleared -- its pages go back to the
 * kernel and read zero; the next micro-step's backward writes over them
 * (the CPU model's overwrite: a page's first touch is a write, one fault)
 * and zero_grad has nothing to do. Gradient accumulation then costs a
 * reduction per micro-step (as DeepSpeed's ZeRO-2 and FSDP without
 * no_sync): "optimizer" keeps DDP's one. A rank holds the shard's gradient,
 * at most rl_train_scatter_window elements handed over and not yet cleared
 * (backward waits in the hook beyond that), what backward writes between
 * two watermarks, and a page where two buckets meet: the accounting
 * (memory.h) adds these up, and grad_resident measures it. Backward must
 * announce each pass (model.h: the hook with the buffer's length first):
 * the pass waits there for the last pass's buckets to be cleared.
 *
 * Slots ("gradients" with a GPU model's rl_gpu_options.grad_slots; created
 * with grads NULL and opts.regions). The flat buffer does not exist: the
 * model writes each region of every micro-step fresh into one of a few
 * slots and first calls rl_ddp_grad_slot, which makes its stream wait
 * (an event, no host wait but for the comm thread to have queued it) until
 * the slot's last region is reduce-scattered and added into the shard's
 * own gradient (shard.grad, device memory: = on the step's first pass, +=
 * after), all on the communicator's stream. So a rank holds its shard's
 * gradient and the slots, and every micro-step is reduced, as on the host.
 * The master comes back whole region by region (rl_ddp_gather_region).
 * Without a shard (train.offload on several ranks: the gradients leave
 * the GPU region by region) each bucket is average-allreduced in its slot
 * (or, after rl_ddp_split, reduce-scattered) and nothing is kept: the
 * caller copies the average away behind rl_ddp_reduced and orders the
 * slot's reuse after its copy. So with a shard and opts.host_update
 * (train.offload with dist.shard), reduce-scattered from the start: the
 * caller takes its block and the tail.
 *
 * Only the last micro-step of gradient accumulation passes the hook to
 * backward (no_sync on the others) -- the trainer does that. All comm ops,
 * including metric averages and the initial broadcast, run on the
 * communication thread, so the communicator is only ever used by one
 * thread. */
#ifndef RL_DDP_H
#define RL_DDP_H

#include <stddef.h>

#include "comm/comm.h"
#include "train/memory.h" /* the bucket plan */
#include "train/train.h"
#include "util/util.h"

typedef struct rl_ddp_opts {
    size_t first_bucket_bytes; /* default 1 MiB */
    size_t bucket_bytes;       /* default 25 MiB */
    int min_buckets;           /* default 8; 1 = PyTorch's sizes exactly */
    double timeout_s;          /* bound on waiting for the comm thread (default 300) */
    /* Gradients on a GPU (nccl backend): the cudaStream_t the backward runs
     * on. "Ready" then means "the kernels are queued": the hook records a
     * CUDA event on this stream, and the bucket's allreduce is queued on
     * the communicator's stream behind a wait for that event, so the
     * reduction of late layers runs while the GPU computes earlier ones.
     * finish then returns once every bucket is queued, with the backward's
     * stream made to wait for the last one: the optimizer queued next
     * waits on the GPU, the host does not. The step timings come from CUDA
     * events, complete once anything waited for the communicator (the
     * metric average does). NULL: host gradients. */
    void *grad_stream;
    /* Reduce in bf16: each bucket is rounded to bf16, averaged as bf16 (half
     * the bytes on the wire), and widened back. Default 0: fp32, the
     * gradients' own type, as PyTorch DDP does: the average is then exact up
     * to summation order and the run matches a single process's; within a
     * node the reduction hides behind backward anyway (see the overlap
     * figures), so halving its bytes matters only where the network is the
     * bottleneck (dist.reduce_dtype). */
    int reduce_bf16;
    rl_shard_mode shard; /* RL_SHARD_NONE (default): DDP; see "Sharded state" above */
    /* "gradients" on the host: the most elements backward writes between
     * two watermarks (rl_train_stretch); what it may leave handed over and
     * not yet cleared is rl_train_scatter_window of it and the buckets
     * (0: two of the largest bucket) */
    size_t stretch;
    /* Buckets cut at these element offsets instead of by size (ascending,
     * the first 0; each bucket ends where the next starts, the last at n):
     * a GPU model's gradient regions (kernels/gpu_layout.h). Required when
     * the gradients come in slots (grads NULL: "gradients" on a device,
     * ZeRO-2's memory; see "Slots" above), where a bucket must be a region
     * whole (or "none": allreduced in the slot, rl_ddp_reduced). NULL: cut
     * by size. (grads NULL without regions, on one rank:
     * a device that takes its gradients away itself, train.offload
     * "layers"; DDP then has no buckets.) */
    const size_t *regions;
    int nregions;
    /* Slots with a shard mode, either one, whose owner takes each bucket's
     * shard away itself (train.offload with dist.shard: the host updates
     * it): every bucket is reduce-scattered in its slot as after
     * rl_ddp_split, nothing is kept (the seam's reduced orders the copy
     * down), and the shard plan, sum and gather are the mode's. */
    bool host_update;
} rl_ddp_opts;

/* One bucket's life in the last step (for the overlap test and logs). */
typedef struct rl_ddp_event {
    size_t off, len;              /* elements */
    double t_ready, t_start, t_done; /* rl_now() */
} rl_ddp_event;

typedef struct rl_ddp rl_ddp;

int rl_ddp_create(rl_comm *comm, float *grads, size_t n, const rl_ddp_opts *o, rl_ddp **out,
                  rl_err *e);
int rl_ddp_nbuckets(const rl_ddp *d);
/* Broadcast root's parameters to every rank (before the first step: 0). */
int rl_ddp_broadcast(rl_ddp *d, int root, float *params, size_t n, rl_err *e);
/* Broadcast root's bytes (a multiple of 4) to every rank: the resumed
 * trainer state. Copied verbatim, whatever the bits. */
int rl_ddp_broadcast_bytes(void *ctx, int root, void *buf, size_t bytes, rl_err *e);
/* Point a trainer's dist seam at this DDP (with a shard mode, its shard,
 * sum and gather too). */
void rl_ddp_attach(rl_ddp *d, rl_train_dist *dist);
/* Rank `rank`'s shard of nb buckets (bucket b at boff[b], blen[b]
 * elements, in DDP's order: from the end of the buffer) over `world`
 * ranks: at most 2 x nb ranges into out, ascending; the count. */
int rl_ddp_shard_plan(const size_t *boff, const size_t *blen, int nb, int world, int rank, rl_shard_range *out);
/* This rank's shard (NULL without a shard mode, or without buckets: a
 * device that takes its gradients away itself, alone). */
const rl_train_shard *rl_ddp_shard(const rl_ddp *d);
/* The shard seam's sum (n doubles over ranks, in place) and gather (each
 * bucket's blocks of params, n elements in the buffer's layout, fp32 or
 * with bf16 2-byte ones, from their ranks to every rank; the tails are
 * every rank's already). With
 * gradients on a GPU (opts.grad_stream) the buffers are device memory and
 * the calls stream-ordered, as rl_train_dist says; gather returns with
 * the buckets still arriving, in the order a forward reads them. */
int rl_ddp_sum(void *ctx, double *v, int n, rl_err *e);
int rl_ddp_gather(void *ctx, void *params, bool bf16, rl_err *e);
/* The same for the buckets inside elements [off, off + len) only (a
 * bucket across either end is refused), buf holding that window; returns
 * with all of it in (on a device: the stream waits for it). */
int rl_ddp_gather_region(void *ctx, void *buf, size_t off, size_t len, bool bf16, rl_err *e);
/* Slots: backward is about to write the bucket that starts at off into
 * slot (rl_gpu_slot_fn): its stream waits until the slot's last bucket is
 * reduced and kept. */
void rl_ddp_grad_slot(void *ctx, size_t off, float *slot);
/* Slots without a shard: `stream` (a cudaStream_t) waits until the bucket
 * that starts at off, handed over by the hook this pass, is averaged in
 * its slot (a short host wait for the comm thread to have queued it). */
void rl_ddp_reduced(void *ctx, size_t off, void *stream);
/* Slots without a shard, between steps: from now on each bucket's average
 * is needed only in this rank's block of it (rl_comm_reduce_scatter's:
 * len / world elements, block r rank r's) and, on the last rank, the tail
 * -- a node's ranks sharing train.offload's host state each take their
 * block down (host_state.h's slices are these blocks). So each bucket is
 * reduce-scattered and its tail allreduced, as "gradients" does: half the
 * bytes of an allreduce. The rest of the slot holds partial sums. */
void rl_ddp_split(void *ctx);
/* After a device gather: the backward's stream waits for the buckets that
 * hold the elements below upto (SIZE_MAX: all). A reader of the gathered
 * buffer calls it first (the GPU model before each layer it reads); the
 * next device collective waits for the rest. */
void rl_ddp_gathered(void *ctx, size_t upto);
/* The hook, finish and average functions behind rl_train_dist. */
void rl_ddp_grad_ready(void *ctx, size_t off);
int rl_ddp_finish(void *ctx, rl_err *e);
int rl_ddp_average(void *ctx, double *v, int n, rl_err *e);
/* Sum n uint64 values over ranks (wrapping), e.g. data digests. */
int rl_ddp_sum_u64(rl_ddp *d, uint64_t *v, int n, rl_err *e);
/* Events of the last completed step, one per bucket in bucket order; the
 * time backward finished (the watermark reached 0) goes to *t_backward_end. */
const rl_ddp_event *rl_ddp_events(const rl_ddp *d, double *t_backward_end);
/* The last completed step's reduction, from those events: *exposed_s is
 * how long the step waited after backward ended for the last bucket (the
 * part the overlap did not hide; 0 when all of it did), *busy_s the sum of
 * the buckets' allreduce times (hidden or not). Call after finish. */
void rl_ddp_step_timing(const rl_ddp *d, double *exposed_s, double *busy_s);
void rl_ddp_timing(void *ctx, double *exposed_s, double *busy_s); /* the same, for rl_train_dist */
/* Host gradients: the most gradient memory resident at once in the last
 * completed step, in bytes -- the buffer's resident pages (mincore) at
 * every watermark, plus with "gradients" the shard's gradient. */
size_t rl_ddp_grad_resident(void *ctx);
void rl_ddp_abort(rl_ddp *d);
void rl_ddp_destroy(rl_ddp *d);

#endif
