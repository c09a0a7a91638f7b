/* The C face of the GPU Llama model (the .cu files in kernels/). Host code includes only
 * this header (and kernels/gpu.h for device discovery); everything CUDA C++
 * stays behind it.
 *
 * The model is the CPU model of pkg/model computed in bf16 mixed precision:
 *
 *   - parameters: fp32 master copy (what AdamW updates, what checkpoints
 *     hold; with a shard only its ranges) plus a bf16 compute copy that
 *     the forward and backward read, every GEMM, the embedding and the
 *     norms; same element layout as rl_param_layout, so a checkpoint or a
 *     CPU buffer maps 1:1;
 *   - gradients: fp32, same layout (plus zero rows for the padded
 *     vocabulary). Weight-gradient GEMMs write a step's first micro-batch
 *     into them (beta = 0) and accumulate the rest (beta = 1), so gradient
 *     accumulation over micro-batches and the all-reduce see fp32 values
 *     (default; see DESIGN notes in gpu_model.cu for why not bf16). Or
 *     every micro-batch writes them region by region into a few slots
 *     that a reduce-scatter empties (rl_gpu_options.grad_slots: ZeRO-2);
 *   - AdamW moments m and v: fp32, one allocation (m then v);
 *   - activations: bf16 for everything a GEMM or the attention reads, fp32
 *     for the residual stream and the per-row statistics (RMSNorm's 1/rms,
 *     attention's and the classifier's log-sum-exp);
 *   - loss and norms accumulate in fp32 or wider.
 *
 * One device allocation per kind of buffer (bf16 params, fp32 master, AdamW
 * m+v, fp32 grads, activations, scratch); every kernel and cuBLASLt call
 * runs on the stream given at creation. Nothing synchronises the host except
 * where a caller asks for a value (the loss, the grad norm) or a copy to
 * host memory, and a shape's first GEMM (its algorithms are timed once).
 *
 * Errors: every function returns RL_OK or an rl_err code and fills *e with
 * one line naming the CUDA/cuBLAS call, the file and the line. CUDA errors
 * are RL_EIO (RL_ENOMEM for allocations); bad shapes are RL_EINPUT. */
#ifndef RL_KERNELS_LLAMA_GPU_H
#define RL_KERNELS_LLAMA_GPU_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h> /* cudaStream_t; a C header */

#ifdef __cplusplus
extern "C" {
#endif

#include "model/model.h"
#include "util/util.h"

typedef struct rl_gpu_model rl_gpu_model; /* opaque */

typedef struct rl_gpu_options {
    /* Keep one layer's norm outputs and SwiGLU product instead of every
     * layer's: the backward's SwiGLU and RMSNorm kernels, which read their
     * inputs anyway, write them again (the same bits) just before the
     * weight gradients that read them. Saves L x B x T x (2 hidden +
     * intermediate) x 2 bytes (6.5 GiB on config b) for writing as many
     * bytes once more (under 1% of b's step by the plan). The step's
     * results are the same bit for bit either way. */
    int recompute;
    /* Rows per classifier chunk (0: chunks of at most 1 GiB of logits).
     * Tests set it small to cover several chunks on small batches. */
    int classifier_rows;
    /* SMs each GEMM may use (0: all; cuBLASLt's SM count target): leaves
     * the rest to NCCL's kernels while a reduction overlaps the backward. */
    int gemm_sm_count;
    /* dQ of the attention backward accumulated with fp32 atomics by the
     * dK/dV kernel (2.5x the forward's attention matrix work) instead of by
     * its own kernel, which recomputes P and dP (3.5x). Costs an fp32
     * [B*T, heads*head_dim] scratch, and determinism: the additions come in
     * the order the GPU runs the CTAs, so a repeated step is no longer
     * bit-identical (0, the default: it is). */
    int attn_dq_atomic;
    /* Attention backend (train.attention): RL_GPU_ATTN_OWN (0: an options
     * struct left zeroed, and NULL options, run our kernels -- what the
     * tests and the plan pin), RL_GPU_ATTN_CUDNN (cuDNN 9's fused SDPA
     * graphs; creation fails without a usable libcudnn.so.9), or
     * RL_GPU_ATTN_AUTO (the trainer's default: both run on probe inputs of
     * the model's shapes at creation, must agree, the faster is kept, one
     * log line says which; no cuDNN: ours). A plan counts cuDNN only for
     * RL_GPU_ATTN_CUDNN (auto's choice needs a GPU). */
    int attention;
    /* Elements of the optimizer's state (fp32 master, AdamW's m and v)
     * allocated at creation: 0 (or more than the model's) is the whole
     * model. A trainer that will shard that state passes its shard's size
     * (pkg/train/memory.h), so a model that fits only sharded can be built
     * at all; until rl_gpu_model_set_shard gives it a shard (or NULL:
     * whole) and upload_params its weights, a model with less state than
     * parameters refuses the update and the copies of the state rather
     * than run past them (upload_params then sets the bf16 copy only). */
    size_t held;
    /* 1: the optimizer's state lives elsewhere (train.offload: the host's
     * memory): no fp32 master and no moments on the GPU; the update and
     * the state's copies refuse, upload_params sets the bf16 copy only and
     * upload_params_bf16 takes the weights the host's AdamW made. */
    int host_state;
    /* Gradients in slots instead of one whole buffer (dist.shard
     * "gradients" on a GPU: ZeRO-2's memory). 0 (default): an fp32 buffer
     * [total]. RL_GPU_GRAD_SLOTS (gpu_layout.h): that many slots of the
     * longest region's length; every micro-batch's backward writes each
     * region (the embedding, a decoder layer, the head) fresh into the next
     * slot, after the gradient sink (rl_gpu_model_set_grad_sink) has made
     * the stream wait until the slot's last region was taken away (reduced
     * into the shard's own gradient). The step's gradients then never exist
     * whole: the norm and AdamW read the shard's gradient
     * (rl_gpu_model_set_shard_grads), grads() is NULL, the gradient copies
     * and the whole norm refuse, upload_params goes region by region
     * through a slot and the master comes out by regions
     * (rl_gpu_model_master_region). A micro-batch without the sink and the
     * hook is refused (its gradients would be lost). */
    int grad_slots;
    /* Stream the decoder layers' bf16 weights from the host's memory
     * (train.offload "layers"; needs host_state): only the embedding and
     * the head (final norm, lm_head) stay on the GPU. Each layer's weights
     * are copied from the host's array (rl_gpu_model_set_host_weights) into
     * a ring of RL_GPU_LAYER_RING layer buffers on a copy stream of the
     * model's own just before the forward reads the layer, and again in
     * reverse for the backward, the next layer's copy queued behind it so it
     * overlaps this layer's kernels; CUDA events order the two streams
     * (a copy into a buffer waits for every kernel queued before it). Each
     * forward copies every layer anew (the host's weights may have changed).
     * rl_gpu_model_params is then the resident part: the embedding, then the
     * head. */
    int stream_layers;
    /* Our GEMMs with the memory-bound work next to them fused in, at three
     * sites: SwiGLU's forward (gate|up with h written from the
     * accumulators), SwiGLU's backward (the down projection's data
     * gradient turned into d gate|d up in its epilogue) and a training
     * step's classifier (the logits' softmax statistics in the lm_head
     * product's epilogue, dlogits made in the two backward products'
     * operand loads: neither the logits nor dlogits are read or written
     * by a pass of their own). RL_GPU_FUSED_OFF (0: cuBLASLt and the
     * separate kernels), RL_GPU_FUSED_ON, or RL_GPU_FUSED_AUTO (the
     * trainer's default, train.fused_gemm, and gpu_bench's: both ways
     * timed at each site's first use, the faster kept, one log line each). They
     * agree up to rounding order. A plan counts the fused kernels under
     * auto. */
    int fused_gemm;
} rl_gpu_options;

#define RL_GPU_FUSED_OFF 0
#define RL_GPU_FUSED_AUTO 1
#define RL_GPU_FUSED_ON 2
#define RL_GPU_SITE_SWIGLU_FWD 0
#define RL_GPU_SITE_SWIGLU_BWD 1
#define RL_GPU_SITE_CLASSIFIER 2
#define RL_GPU_SITES 3
/* 1 when site runs our fused GEMMs: asked for, or auto's choice once
 * timed (0 before that), and shapes the kernels take. */
int rl_gpu_model_fused(const rl_gpu_model *m, int site);

#define RL_GPU_ATTN_OWN 0
#define RL_GPU_ATTN_AUTO 1
#define RL_GPU_ATTN_CUDNN 2
/* The backend a model runs: RL_GPU_ATTN_OWN or RL_GPU_ATTN_CUDNN. */
int rl_gpu_model_attention(const rl_gpu_model *m);

/* Head dims the attention kernels are compiled for (head_dim is padded up
 * to the next of 32, 64, 128 inside the kernels). */
#define RL_GPU_MAX_HEAD_DIM 128

/* Create on the current device, sized for B x T tokens per forward (any
 * smaller B or T later is fine). stream 0 is the legacy default stream;
 * pass an explicit one. opt may be NULL. Parameters start at zero. */
int rl_gpu_model_create(rl_gpu_model **out, const rl_model_config *c, int B, int T,
                        const rl_gpu_options *opt, cudaStream_t stream, rl_err *e);
void rl_gpu_model_free(rl_gpu_model *m);

const rl_param_layout *rl_gpu_model_layout(const rl_gpu_model *m);
cudaStream_t rl_gpu_model_stream(const rl_gpu_model *m);
/* Bytes of device memory the model allocated (all its buffers, cuBLASLt
 * workspace included): the model's whole footprint, fixed at creation. */
size_t rl_gpu_model_device_bytes(const rl_gpu_model *m);
/* Device pointers, for the DDP layer (NCCL all-reduce of the gradients,
 * all-gather of a shard's updated weights) and checkpoints. */
float *rl_gpu_model_grads(rl_gpu_model *m);   /* fp32 [total] */
void *rl_gpu_model_params(rl_gpu_model *m);   /* bf16 [total], the compute copy */
float *rl_gpu_model_opt(rl_gpu_model *m);     /* fp32 AdamW m then v [2 x held: total, or the shard's] */
/* *whole = the fp32 master in the model's layout, queued on the stream:
 * the master itself; with a shard the gradient buffer, its ranges written
 * from the compact master and the rest left for the caller to gather from
 * the other ranks (the gradients are lost: between steps only). */
int rl_gpu_model_master_whole(rl_gpu_model *m, float **whole, rl_err *e);

/* ---- host <-> device (each waits for its copy; not for the hot loop) ---- */
/* fp32 parameters [total] -> master (with a shard its ranges, through the
 * gradient buffer, whose gradients are lost), and the bf16 copy derived. */
int rl_gpu_model_upload_params(rl_gpu_model *m, const float *host, rl_err *e);
/* The whole master -> host; refused with a shard (master_whole). */
int rl_gpu_model_download_params(rl_gpu_model *m, float *host, rl_err *e);
/* Queues bf16 weights [total] (host: pinned, untouched until the stream
 * has run the copy) into the compute copy; the next forward follows it. */
int rl_gpu_model_upload_params_bf16(rl_gpu_model *m, const uint16_t *host, rl_err *e);
/* The bf16 compute copy, widened to fp32 (tests). */
int rl_gpu_model_download_params_bf16(rl_gpu_model *m, float *host, rl_err *e);
int rl_gpu_model_upload_grads(rl_gpu_model *m, const float *host, rl_err *e);
int rl_gpu_model_download_grads(rl_gpu_model *m, float *host, rl_err *e);
/* AdamW moments, m then v, 2 x held floats (checkpoints). */
int rl_gpu_model_upload_opt(rl_gpu_model *m, const float *host, rl_err *e);
int rl_gpu_model_download_opt(rl_gpu_model *m, float *host, rl_err *e);
/* Normal(0, std) matrices and ones for norms, generated on the device from
 * seed (a hash per element; not the CPU's sequence): for benchmarks of big
 * models, where a host-side init would take tens of seconds. A whole
 * master only. */
int rl_gpu_model_init_random(rl_gpu_model *m, uint64_t seed, float std, rl_err *e);
/* Logits of the last rl_gpu_model_forward, [B*T, vocab], widened to fp32:
 * only when its B*T rows fit one classifier chunk (small batches: tests);
 * RL_EINPUT otherwise. Valid until the next forward or train_micro. */
int rl_gpu_model_download_logits(rl_gpu_model *m, float *host, rl_err *e);
/* One row of them, [vocab] (sampling reads the last position only). */
int rl_gpu_model_download_logits_row(rl_gpu_model *m, int row, float *host, rl_err *e);

/* ---- training ----------------------------------------------------------
 * A step is: zero_grad, then per micro-batch train_micro, then grad_norm,
 * adamw, step_end. Nothing in it waits for the GPU: the loss is averaged on
 * the device and, with the gradient norm, read back by step_stats once the
 * step is done (a trainer reads step k's while step k+1 is queued). */

/* Loss only (evaluation): forward over host tokens[B*T] and targets, the
 * classifier in chunks of rows without gradients. Token ids are checked on
 * the host (RL_EINPUT). Waits for and returns the mean cross-entropy when
 * loss is non-NULL; targets NULL computes the logits only (tests). */
int rl_gpu_model_forward(rl_gpu_model *m, const int32_t *tokens, const int32_t *targets, int B,
                         int T, float *loss, rl_err *e);
/* One micro-batch of training: forward, then grads (+)= d(loss *
 * loss_scale)/dparams. The classifier's gradient is made chunk by chunk
 * inside the forward (the whole batch's logits never exist), so a forward
 * and its backward are one call. hook (may be NULL) is called on the host
 * as soon as the kernels that finish grads[offset:] have been enqueued on
 * the model's stream (the same watermark offsets as the CPU model): record
 * a CUDA event on rl_gpu_model_stream() there to start a reduction when
 * they complete. The step's loss accumulator gains loss_scale x this
 * micro-batch's mean loss (on the device). */
int rl_gpu_model_train_micro(rl_gpu_model *m, const int32_t *tokens, const int32_t *targets, int B,
                             int T, float loss_scale, rl_grad_ready_fn hook, void *hook_ctx,
                             rl_err *e);
/* CUDA graphs (on from creation): a micro-batch of the model's full B x T
 * without a hook, on a stream other than the legacy default, is captured as one graph on its second use (per variant:
 * a step's first micro-batch, the later ones) and replayed from then on;
 * the host's cost is then one launch, not hundreds. Off: every kernel is
 * launched each time (the comparison, in tests and gpu_bench). A capture
 * that fails leaves that variant eager, with one log line. Returns the
 * previous setting. replays: micro-batches run from a graph so far. */
int rl_gpu_model_graphs(rl_gpu_model *m, int on);
long long rl_gpu_model_graph_replays(const rl_gpu_model *m);
/* Starts a step: the next train_micro writes the gradients instead of
 * adding to them (no memset of the whole buffer) and resets the loss
 * accumulator. */
int rl_gpu_model_zero_grad(rl_gpu_model *m, rl_err *e);
/* sqrt(sum g^2) over all gradients, fp32 accumulation in a fixed reduction
 * order (bit-identical run to run). Kept on the device for AdamW's clipping;
 * norm may be NULL (nothing waits) or receives the value (waits). */
int rl_gpu_model_grad_norm(rl_gpu_model *m, float *norm, rl_err *e);
/* Queues the copy of this step's loss accumulator and gradient norm to the
 * host (a ring of two steps); step_stats waits for and reads the newest
 * (ago 0) or the one before it (ago 1: done while this one runs). */
int rl_gpu_model_step_end(rl_gpu_model *m, rl_err *e);
int rl_gpu_model_step_stats(rl_gpu_model *m, int ago, float *loss, float *norm, rl_err *e);
/* How long the model's stream stood waiting on other streams since the
 * last call, and how many waits: streamed layers' copies up, a params-wait
 * callback's weights (a gather, offload's copies up), a gradient sink's
 * slot (its last copy down or reduction). Each wait is timed by an event
 * before and after it on the stream; this waits for the stream when there
 * was any (a model without them, "none" on one GPU, returns at once). The
 * exposed part of the copies and collectives that the model's kernels did
 * not hide. */
int rl_gpu_model_stream_waits(rl_gpu_model *m, double *seconds, long long *waits, rl_err *e);

typedef struct rl_gpu_adamw {
    double lr, beta1, beta2, eps, weight_decay; /* decay on matrices only, not norms */
    long long t;       /* step, from 1 (bias correction) */
    double grad_scale; /* every gradient is multiplied by this first */
    /* > 0: also multiply by min(1, clip_max_norm / (norm + 1e-6)) with the
     * norm of the last rl_gpu_model_grad_norm, read on the device (no host
     * round trip), as torch.nn.utils.clip_grad_norm_. */
    double clip_max_norm;
} rl_gpu_adamw;
/* One AdamW step over the fp32 masters (PyTorch semantics, as
 * rl_adamw_update) that also writes the bf16 compute copy. When the last
 * rl_gpu_model_grad_norm is not finite it changes nothing (the caller,
 * reading that norm afterwards, stops with its weights intact). */
int rl_gpu_model_adamw(rl_gpu_model *m, const rl_gpu_adamw *a, rl_err *e);
/* ---- sharded state (dist.shard; ZeRO-1/2) -------------------------------
 * With a shard set, the fp32 master and the moments hold its ranges'
 * elements only (held, one range after the other) and AdamW updates only
 * them and its ranges of the bf16 weights; the gradients stay whole. The
 * forward reads nothing but the bf16 copy, so a step needs no fp32 weight
 * outside the shard: zero_grad, train_micro..., shard_sq, the caller sums
 * *sq over ranks on the model's stream, shard_norm, adamw, the caller
 * all-gathers the bf16 weights over ranks (half the bytes of the master;
 * overlapped with the next forward through set_params_wait), step_end. grad_norm refuses while a shard is set. */
/* A sharded step's gather of the bf16 weights may return with buckets still
 * arriving: fn(ctx, upto) (NULL: none) makes the model's stream wait for
 * params [0, upto) of it. The model calls it before each layer the forward
 * reads (and for all of them before anything else touches the weights), so
 * the next forward starts on the first layers while the last ones arrive;
 * micro-batches then launch kernel by kernel (a CUDA graph cannot wait on
 * another stream's event). */
typedef void (*rl_gpu_wait_fn)(void *ctx, size_t upto);
void rl_gpu_model_set_params_wait(rl_gpu_model *m, rl_gpu_wait_fn fn, void *ctx);
/* stream_layers: host (pinned, bf16 [total], the layout's order) is where
 * the decoder layers' weights are read from; ready (may be NULL) is called
 * with ctx and the end of the elements a copy is about to read, and
 * returns once they hold the weights the next kernels must see. */
void rl_gpu_model_set_host_weights(rl_gpu_model *m, const uint16_t *host, rl_gpu_wait_fn ready, void *ctx);
/* With grad_slots: fn(ctx, off, slot) is called on the host before the
 * backward writes the gradient region that starts at off into slot (slot[0]
 * is element off; the region is the one of gpu_layout.h's cuts starting
 * there): the callee makes the model's stream wait until slot's last
 * region has been consumed, and reads this one there once the hook
 * reports off. */
typedef void (*rl_gpu_slot_fn)(void *ctx, size_t off, float *slot);
void rl_gpu_model_set_grad_sink(rl_gpu_model *m, rl_gpu_slot_fn fn, void *ctx);
/* With a shard: g (device memory, held floats in the shard's order, NULL:
 * none) is where the step's reduced gradient of the shard is, for the
 * norm and AdamW, instead of the gradient buffer's ranges. */
void rl_gpu_model_set_shard_grads(rl_gpu_model *m, const float *g);
/* With grad_slots, between steps: *buf = the fp32 master's elements [off,
 * off + len) (one gradient region) in a slot, queued on the stream: the
 * shard's ranges written from the compact master, the rest left for the
 * caller to gather from the other ranks. */
int rl_gpu_model_master_region(rl_gpu_model *m, size_t off, size_t len, float **buf, rl_err *e);
/* Keep the optimizer's state of r[0..nr) only (NULL: of every element), as
 * rank `rank` (a range marked shared is counted in the norm by rank 0
 * alone). The moments start again from zero: before a step or an
 * upload_opt. The master keeps its values when it was whole; cut from a
 * shard it waits for the next upload_params (other ranks hold the rest).
 * The gradients are lost. Waits for the stream. */
int rl_gpu_model_set_shard(rl_gpu_model *m, const rl_shard_range *r, int nr, int rank, rl_err *e);
/* Queues this rank's sum of squared gradients over its counted ranges into
 * the device double *sq (valid until the next call). */
int rl_gpu_model_shard_sq(rl_gpu_model *m, double **sq, rl_err *e);
/* Queues the step's norm = sqrt(*sq), for adamw's clipping and step_end. */
int rl_gpu_model_shard_norm(rl_gpu_model *m, rl_err *e);
int rl_gpu_model_sync(rl_gpu_model *m, rl_err *e);

/* Casts on a stream, for DDP's bf16 gradient reduction: fp32 -> bf16
 * (round to nearest even) and back (exact). dst/src are device memory. */
int rl_gpu_cast_f32_to_bf16(void *dst, const float *src, size_t n, cudaStream_t s, rl_err *e);
int rl_gpu_cast_bf16_to_f32(float *dst, const void *src, size_t n, cudaStream_t s, rl_err *e);
/* dst = src (add 0) or dst += src (add 1), n fp32 device values, on s: a
 * reduced block into the shard's own gradient (DDP's "gradients" mode). */
int rl_gpu_accum_f32(float *dst, const float *src, size_t n, int add, cudaStream_t s, rl_err *e);

/* ---- profile (tuning): device time per kind of kernel ------------------------
 * While on, every launch the model makes is bracketed by two CUDA events
 * (a few microseconds each: turn it off for timings you report). read waits
 * for the stream, sums the elapsed times per category since the last read
 * (or since it was turned on), and starts over. */
enum {
    RL_GPU_PROF_GEMM,       /* every cuBLASLt matmul */
    RL_GPU_PROF_ATTN_FWD,   /* flash attention forward */
    RL_GPU_PROF_ATTN_BWD,   /* D = rowsum(dO O), dK/dV, dQ */
    RL_GPU_PROF_NORM,       /* RMSNorm forward and backward */
    RL_GPU_PROF_ELEMWISE,   /* RoPE, SwiGLU, embedding */
    RL_GPU_PROF_CLASSIFIER, /* cross-entropy forward, backward, mean */
    RL_GPU_PROF_OPTIMIZER,  /* gradient norm, AdamW */
    RL_GPU_PROF_N
};
const char *rl_gpu_prof_name(int cat);
int rl_gpu_model_profile(rl_gpu_model *m, int on, rl_err *e);
/* calls (may be NULL): how many launcher calls were timed */
int rl_gpu_model_profile_read(rl_gpu_model *m, double ms[RL_GPU_PROF_N], int *calls, rl_err *e);

/* ---- the plan of a step, without a GPU --------------------------------------
 * rl_gpu_model_plan builds a model that allocates nothing and launches
 * nothing, runs a training step through the very code a real model runs
 * (zero_grad, accum x train_micro, grad_norm, adamw with device clipping,
 * step_end), and records every launch it would make: per category (the
 * profile's), FLOPs, the DRAM bytes it must move at least, and the time a
 * roofline at the given peak allows (max of the two, per launch). Host
 * syncs are waits on the step's own work inside the step. It is how a
 * change is judged while no GPU is at hand (bench/gpu: gpu_bench --plan). */
typedef struct rl_gpu_plan {
    double flops[RL_GPU_PROF_N], bytes[RL_GPU_PROF_N], roof_s[RL_GPU_PROF_N]; /* per category, RL_GPU_PROF_* */
    int launches[RL_GPU_PROF_N];
    int calls;           /* launcher calls (a profiled step times each one) */
    int host_syncs;      /* waits for the step's own results inside the step */
    size_t device_bytes; /* what the model allocates (all of it, at creation) */
    double peak_flops, peak_bytes_per_s; /* the roofline's figures */
} rl_gpu_plan;
int rl_gpu_model_plan(const rl_model_config *c, int B, int T, const rl_gpu_options *opt, int accum,
                      double peak_flops, double peak_bytes_per_s, rl_gpu_plan *out, rl_err *e);

/* ---- single kernels on host arrays (tests: each call allocates, uploads,
 * runs on a private stream, downloads, frees) -----------------------------
 * Inputs marked bf16 are rounded to bf16 on the way in (round to nearest
 * even); a test should round them itself first so that its CPU reference
 * sees the very same values. Outputs marked bf16 come back widened. Every
 * output is poisoned (NaN) on the device before the kernel runs, so an
 * element the kernel forgot to write shows up as NaN. */

/* Round-to-nearest-even float -> bf16 -> float, on the host. */
float rl_gpu_bf16_round(float x);

/* out[n, :] = emb[tok[n], :] (emb bf16, out fp32) */
int rl_gpu_op_embed_fwd(float *out, const float *emb, const int32_t *tok, int N, int V, int D,
                        rl_err *e);
/* demb[t, :] (accumulate ? += : =) sum of dout[n, :] over the n with
 * tok[n] = t, for the tokens t in tok; the other rows of demb come back as
 * given (demb is read and written) */
int rl_gpu_op_embed_bwd(float *demb, const float *dout, const int32_t *tok, int N, int V, int D,
                        int accumulate, rl_err *e);
/* out (bf16) = x * rstd * w; x fp32, w bf16 */
int rl_gpu_op_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int D,
                          float eps, rl_err *e);
/* dx (fp32, accumulate ? += : =) and its bf16 copy dx16; dw (fp32,
 * accumulate_dw ? += : =, not read then); y (NULL: not asked for) the
 * forward's output rebuilt (bf16), as rl_gpu_options.recompute has it.
 * dout, w bf16; x, rstd fp32. */
int rl_gpu_op_rmsnorm_bwd(float *dx, float *dx16, float *dw, float *y, const float *dout,
                          const float *x, const float *w, const float *rstd, int N, int D,
                          int accumulate, int accumulate_dw, rl_err *e);
/* In place on x[B, T, nh, hd] (bf16), rotate-half; inverse = 1: backward. */
int rl_gpu_op_rope(float *x, const rl_model_config *c, int B, int T, int nh, int inverse, rl_err *e);
/* q [B,T,H,hd], k, v [B,T,KV,hd] (bf16) -> out [B,T,H,hd] (bf16). rope:
 * NULL, plain attention; else the config whose RoPE table (head_dim hd,
 * T <= max_position_embeddings) rotates q and k first (rl_k_rope, in
 * place), as the model runs them. */
int rl_gpu_op_attn_fwd(float *out, const float *q, const float *k, const float *v,
                       const rl_model_config *rope, int B, int T, int H, int KV, int hd, rl_err *e);
/* Runs the forward then the backward; dq, dk, dv (bf16) in the layouts of
 * q, k, v (with rope: with respect to the un-rotated q, k); dout bf16.
 * dq_atomic: dQ as rl_gpu_options.attn_dq_atomic makes it. */
int rl_gpu_op_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                       const float *k, const float *v, const rl_model_config *rope, int B, int T,
                       int H, int KV, int hd, int dq_atomic, rl_err *e);
/* rl_gpu_op_attn_fwd then (dout != NULL) _bwd through the cuDNN backend,
 * rope as there: q and k rotated before it, dq and dk rotated back after
 * (the error of a machine without cuDNN when it has none). deterministic:
 * the backward's engine as !rl_gpu_options.attn_dq_atomic picks it. */
int rl_gpu_op_attn_cudnn(float *out, float *dq, float *dk, float *dv, const float *dout,
                         const float *q, const float *k, const float *v,
                         const rl_model_config *rope, int B, int T, int H, int KV, int hd,
                         int deterministic, rl_err *e);
/* gu [N, 2F] (gate | up, bf16) -> h [N, F] (bf16) */
int rl_gpu_op_swiglu_fwd(float *h, const float *gu, int N, int F, rl_err *e);
/* dh [N, F], gu [N, 2F] (bf16) -> dgu [N, 2F] (bf16); h (NULL: not asked
 * for) the forward's product rebuilt, as rl_gpu_options.recompute has it */
int rl_gpu_op_swiglu_bwd(float *dgu, float *h, const float *dh, const float *gu, int N, int F,
                         rl_err *e);
/* logits [N, ld] (bf16; the vocabulary in columns [0, V), V <= ld, the
 * rest padding, uploaded as given) -> losses [N] and lse [N] (fp32; lse may
 * be NULL) and, with dlogits non-NULL, the kernel's in-place gradient
 * dlogits [N, ld] = scale * (softmax - onehot) (bf16), 0 in the padding;
 * dlogits NULL: loss only (no gradient pass). */
int rl_gpu_op_xent(float *losses, float *lse, float *dlogits, const float *logits,
                   const int32_t *targets, int N, int V, int ld, float scale, rl_err *e);
/* acc = (reset ? 0 : acc) + weight * mean(losses[0:n]) (acc read and written) */
int rl_gpu_op_loss_accum(float *acc, const float *losses, int n, float weight, int reset,
                         rl_err *e);
/* GEMMs through cuBLASLt (bf16 in, fp32 compute), row-major:
 *   RL_GPU_GEMM_FWD:      out[M,N] = in[M,K] . w[N,K]^T (+ res[M,N] if res)
 *   RL_GPU_GEMM_BWD_DATA: out[M,K] = dout[M,N] . w[N,K]
 *   RL_GPU_GEMM_BWD_W:    out[N,K] += dout[M,N]^T . in[M,K]   (fp32 out)
 *   RL_GPU_GEMM_BWD_W_SET: out[N,K] = dout[M,N]^T . in[M,K]   (fp32, beta 0) */
enum { RL_GPU_GEMM_FWD = 0, RL_GPU_GEMM_BWD_DATA = 1, RL_GPU_GEMM_BWD_W = 2,
       RL_GPU_GEMM_BWD_W_SET = 3 };
/* a, b: the two bf16 operands in the order of the formulas above (in/dout,
 * then w/in); out_f32: 1 fp32 output, 0 bf16 (ignored for the BWD_Ws); res:
 * fp32 residual for FWD with fp32 output, or NULL. out is read for BWD_W
 * only (BWD_W_SET poisons it on the device first: it must not be read). */
int rl_gpu_op_gemm(int kind, float *out, int out_f32, const float *a, const float *b,
                   const float *res, int M, int N, int K, rl_err *e);
/* sqrt(sum g^2) with the model's reduction, on a plain array */
int rl_gpu_op_sumsq_norm(float *norm, const float *g, size_t n, rl_err *e);

#ifdef __cplusplus
}
#endif

#endif
