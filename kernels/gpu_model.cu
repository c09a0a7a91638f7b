// The GPU model object: buffers, forward, backward, gradient norm, AdamW.
//
// Design notes (the why; llama_gpu.h has the what):
//
// * Fused projections. q, k, v weights are contiguous in the parameter
//   layout ([qd + 2 kvd, D] together), and so are gate and up ([2F, D]):
//   one GEMM each, whose output rows hold [q | k | v] and [gate | up]. The
//   attention and SwiGLU kernels read those rows directly; in the backward
//   the matching single GEMMs produce the gradient of both weights at once
//   into their contiguous slice of the gradient buffer.
// * Residual stream in fp32. x_{l} and the mid-layer x are fp32, and the
//   residual add rides in the output projections' GEMM epilogue (D = A.B +
//   C with C the incoming fp32 stream), so it costs no kernel. The norms
//   read fp32 and write the bf16 GEMM input. This is what PyTorch autocast
//   does too (the stream stays fp32, only matmul inputs are bf16), and it
//   keeps the CPU fp32 reference close.
// * Weights read in bf16 everywhere, the embedding's rows and the norms'
//   weights too (autocast would read those in fp32; FSDP's and Megatron's
//   bf16 parameters do not): the fp32 master is then read by AdamW and
//   checkpoints alone, so a shard keeps only its ranges of it (12 of the 18
//   bytes an element DDP holds). The cost is one more bf16 rounding of
//   values that feed bf16 GEMMs anyway (the checks against the CPU model
//   keep their bounds).
// * Gradients in fp32 (default, and for now the only choice). Weight
//   gradients go from the GEMM straight into the fp32 buffer (beta = 0 on
//   a step's first micro-batch, beta = 1 after): accumulation over
//   micro-batches costs nothing extra and loses
//   nothing, and the DDP layer can all-reduce fp32 (exact averaging) or
//   cast to bf16 for half the bytes. bf16 gradient storage would save 2
//   bytes/param but round every micro-batch's sum.
// * Activation gradients: dres (the residual stream's gradient) in fp32,
//   with a bf16 copy written by the same norm-backward kernel for the next
//   GEMM; the GEMMs that feed a norm backward write fp32.
// * Determinism: no atomics; every reduction has a fixed order; the
//   embedding backward groups positions by token on the host (a counting
//   sort of the batch, done while the forward is enqueued). cuBLASLt is
//   deterministic for a fixed algorithm on a given GPU; its algorithm
//   choice is cached per shape, so a run keeps one choice throughout.
// * Padded vocabulary. The device's lm_head has Vp = V rounded up to 64
//   rows, the extra ones zero in the bf16 copy and never updated (AdamW and
//   the norm see the layout's `total` only), so logit rows are 128-byte
//   multiples (cuBLASLt's fast paths, the classifier's vector loads) and
//   the padding columns are masked in the loss and get exactly zero
//   gradient. Checkpoints and uploads keep the unpadded layout.
// * The classifier in chunks of rows, its backward inside the forward.
//   Logits for a whole batch are the largest activation (3.1 GiB on bench
//   config a); chunks of at most RL_CLS_CHUNK_BYTES each go logits -> loss
//   and dlogits in one kernel -> d(final norm output) and the lm_head
//   gradient, while the next chunk reuses the buffer. Hence a training
//   forward and its backward are one call (train_micro).
// * No host waits in a training step. zero_grad only marks the gradients
//   stale: the first micro-batch's weight-gradient GEMMs and norm
//   reductions write instead of adding (only the embedding's rows, touched
//   sparsely, are cleared). The loss accumulates on the device; step_end
//   queues it with the gradient norm into a pinned ring of two steps, so a
//   trainer reads step k's figures while step k+1 runs.
// * A micro-batch as one CUDA graph. What train_micro launches after the
//   batch's upload (some 300 kernels and GEMMs on config a) is captured
//   once and replayed: one launch for the host instead of hundreds. That
//   needs every launch to be the same from batch to batch, so nothing
//   that varies is a kernel argument -- the embedding backward reads its
//   number of distinct ids from the uploaded batch and has a block per
//   possible id -- and the batch itself goes up before the replay, from
//   the pinned ring as ever. A graph exists per variant (a step's first
//   micro-batch writes the gradients, later ones add) and is captured on
//   the variant's second use: the first runs eagerly and times the GEMMs'
//   algorithms, which waits for the GPU and cannot be captured. Launches
//   that carry a DDP hook (the host acts between kernels) and any other
//   shape than the model's full B x T launch eagerly.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gpu_internal.cuh"

extern "C" {
#include "model/cpu.h" // rl_cpu_rope_table_f32: the very table the CPU model uses
}

// Pinned staging slots for the batch: the host may queue this many
// micro-batches ahead of the GPU before it waits for a slot's copy.
#define RL_IO_SLOTS 3

// Timing events in pairs (the profiler's calls, the stream's waits).
struct pair_rec {
    int cat;
    cudaEvent_t ev[2];
};
struct ev_pairs {
    int used, cap;
    pair_rec *r;
};

// A micro-batch variant's graph (see the design notes).
struct micro_graph {
    int uses;          // eager runs so far; -1: capture failed, stay eager
    float loss_scale;  // a kernel argument: another scale is another graph
    cudaGraphExec_t exec;
};

enum { FUSE_OFF = 0, FUSE_ON = 1, FUSE_UNTIMED = -1 }; // rl_gpu_model.fused

struct rl_gpu_model {
    rl_model_config cfg;
    rl_param_layout lay;
    rl_gpu_options options;
    int B, T;         // capacity
    int cur_B, cur_T; // last forward
    int D, F, V, Vp, L, H, KV, hd, qd, kvd, C3;
    size_t pad;      // (Vp - V) * D: zero lm_head rows after `total` (bf16 params, grads)
    cudaStream_t s;
    rl_gpu_plan *plan; // a dry model (rl_gpu_model_plan): launches are counted, not made

    // the allocations, one per kind
    bf16 *params;           // [total + pad] compute copy
    float *master;          // [held]: every element, or a shard's ranges one after the other
    float *opt;             // [2 held]: m, then v, laid out as the master
    size_t held;            // elements of the optimizer's state (master, m, v): total, or a shard's
    int master_ok;          // master holds the weights: not so from a shard set over a compact
                            // master (or created compact) until the next upload_params
    rl_gpu_wait_fn params_in; // rl_gpu_model_set_params_wait: [0, upto) of params may be read
    void *params_in_ctx;
    // with a shard (rl_gpu_model_set_shard): its ranges (nranges) and the
    // norm's squared partial, one device allocation, sq first
    void *shard_buf;
    double *sq;
    rl_k_range *ranges;
    int nranges;
    float *grads;           // [total + pad]; NULL with grad slots
    // rl_gpu_options.grad_slots: the slots (one allocation, slot k at
    // k * slot_len), the next one to use, the sink that frees them, and the
    // shard's own gradient
    float *slots;
    size_t slot_len;
    unsigned slot_next;
    rl_gpu_slot_fn sink;
    void *sink_ctx;
    const float *shard_grad; // rl_gpu_model_set_shard_grads: the norm and AdamW read it
    // rl_gpu_options.stream_layers: the ring of layer buffers, the layer
    // each holds (-1: none) and when it was last used, the copy stream,
    // each buffer's "copied" event and the "readers queued" event a copy
    // waits for, the host's weights and their ready callback
    bf16 *ring;
    int ring_layer[RL_GPU_LAYER_RING];
    unsigned ring_used[RL_GPU_LAYER_RING], ring_clock;
    cudaStream_t copy_s;
    cudaEvent_t ring_in[RL_GPU_LAYER_RING], ring_free;
    const uint16_t *host_w;
    rl_gpu_wait_fn host_ready;
    void *host_ready_ctx;
    unsigned char *acts;    // activations (+ the RoPE table)
    unsigned char *scratch; // backward temporaries, reductions, batch, cuBLASLt workspace
    size_t bytes;

    rl_gpu_layout bl; // where every activation and scratch buffer lies (gpu_layout.h)
    // activations: layer l of a per-layer buffer at base + l * bl.s_* (elements)
    float *res, *res_mid, *rstd1, *rstd2, *att_lse, *rstdf, *lse_cls, *losses, *rope;
    bf16 *ln1, *qkv, *atty, *ln2, *gu, *hm, *lnf, *logits;
    // scratch
    float *dres, *dsum, *dq_acc, *rms_partial, *norm_partial, *cls_stats;
    float *scalars; // [0] the step's loss accumulator, [1] grad norm, [2] the last forward's loss
    bf16 *dres16, *dln, *datty, *dqkv, *dh, *dgu;
    int32_t *io; // tokens, targets, uniq, seg, pos
    void *ws;

    // host side
    int32_t *pinned_io[RL_IO_SLOTS];
    cudaEvent_t io_done[RL_IO_SLOTS];
    int io_next, io_used[RL_IO_SLOTS];
    float *pinned_scalars; // [0] the forward's loss; [2 + 2k], [3 + 2k]: step ring slot k
    int32_t *counts;       // [V + 1], for the counting sort
    int n_uniq;
    cudaEvent_t loss_ready, norm_ready, stats_ready[2];
    int logits_valid;
    int fresh;             // zero_grad since the last micro-batch: write the gradients, not add
    long long steps_ended; // step_end calls
    int graphs_on;         // rl_gpu_model_graphs
    // per RL_GPU_SITE_*: our fused GEMMs (FUSE_ON), the separate path
    // (FUSE_OFF) or auto before the site's first use (FUSE_UNTIMED); auto's
    // timing events
    int fused[RL_GPU_SITES];
    cudaEvent_t fused_ev[3];
    micro_graph graph[2];  // [fresh]
    long long replays;     // micro-batches run from a graph
    rl_gemm gemm;
    rl_cudnn_attn *cudnn; // train.attention's choice: cuDNN, or NULL for our kernels
    // optional per-category kernel timing (rl_gpu_model_profile)
    int prof_on;
    ev_pairs prof;
    // the stream's waits on other streams (rl_gpu_model_stream_waits)
    ev_pairs waits;
};

// The next event pair of a list (created on first use, reused after each
// read); NULL when none can be made.
static cudaEvent_t *pair_next(ev_pairs *l, int cat) {
    if (l->used == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        pair_rec *p = (pair_rec *)realloc(l->r, sizeof(pair_rec) * cap);
        if (!p) return NULL;
        for (int i = l->cap; i < cap; i++) {
            p[i].ev[0] = p[i].ev[1] = NULL;
            if (cudaEventCreate(&p[i].ev[0]) != cudaSuccess ||
                cudaEventCreate(&p[i].ev[1]) != cudaSuccess) {
                cudaGetLastError();
                if (p[i].ev[0]) cudaEventDestroy(p[i].ev[0]);
                l->r = p, l->cap = i;
                return NULL;
            }
        }
        l->r = p, l->cap = cap;
    }
    pair_rec *r = &l->r[l->used++];
    r->cat = cat;
    return r->ev;
}
static void pairs_free(ev_pairs *l) {
    for (int i = 0; i < l->cap; i++) {
        if (l->r[i].ev[0]) cudaEventDestroy(l->r[i].ev[0]);
        if (l->r[i].ev[1]) cudaEventDestroy(l->r[i].ev[1]);
    }
    free(l->r);
}
// a profiled call's pair; NULL turns profiling off rather than failing the step
static cudaEvent_t *prof_next(rl_gpu_model *m, int cat) {
    cudaEvent_t *p = pair_next(&m->prof, cat);
    if (!p) m->prof_on = 0;
    return p;
}

// The model's stream about to wait on another (weights copied up or
// gathered, a gradient slot's last copy down or reduction: all outside
// graphs, which these modes turn off): an event before and after the
// wait, so their distance is how long the stream stood still. A pair
// that cannot be made leaves the wait untimed.
static cudaEvent_t *wait_begin(rl_gpu_model *m) {
    // bounded where nobody reads them (rl_gpu_model_stream_waits)
    cudaEvent_t *p = m->plan || m->waits.used >= 1 << 16 ? NULL : pair_next(&m->waits, 0);
    if (p && cudaEventRecord(p[0], m->s) != cudaSuccess) m->waits.used--, p = NULL;
    return p;
}
static void wait_end(rl_gpu_model *m, cudaEvent_t *p) {
    if (p && cudaEventRecord(p[1], m->s) != cudaSuccess) m->waits.used--;
}

static void plan_add(rl_gpu_plan *p, int cat, rl_k_cost c) {
    p->flops[cat] += c.flops, p->bytes[cat] += c.bytes, p->launches[cat] += c.launches;
    p->calls++;
    p->roof_s[cat] += fmax(c.flops / p->peak_flops, c.bytes / p->peak_bytes_per_s);
}

// One launcher call of the step: a dry model adds its cost to the plan;
// a real one runs it, timed by category when profiling is on.
#define STEP(cat, cost, call)                                                                      \
    do {                                                                                           \
        if (m->plan) {                                                                             \
            plan_add(m->plan, (cat), (cost));                                                      \
            break;                                                                                 \
        }                                                                                          \
        cudaEvent_t *pe_ = m->prof_on ? prof_next(m, (cat)) : NULL;                                \
        if (pe_) CUDA_CHECK(cudaEventRecord(pe_[0], m->s));                                        \
        RL_TRY(call);                                                                              \
        if (pe_) CUDA_CHECK(cudaEventRecord(pe_[1], m->s));                                        \
    } while (0)

// Attention through cuDNN: the model's choice; a plan has none and counts
// cuDNN when the options ask for it outright.
static bool attn_cudnn(const rl_gpu_model *m) {
    return m->cudnn || (m->plan && m->options.attention == RL_GPU_ATTN_CUDNN);
}
int rl_gpu_model_attention(const rl_gpu_model *m) {
    return attn_cudnn(m) ? RL_GPU_ATTN_CUDNN : RL_GPU_ATTN_OWN;
}

// The host waits for the GPU: counted by a plan (a sync inside the step).
static int host_wait(rl_gpu_model *m, cudaEvent_t ev, rl_err *e) {
    if (m->plan) return m->plan->host_syncs++, RL_OK;
    CUDA_CHECK(cudaEventSynchronize(ev));
    return RL_OK;
}

// ---- buffer placement ---------------------------------------------------------------------------
// The activation and scratch pointers at the layout's offsets (gpu_layout.h).
static void place(rl_gpu_model *m, unsigned char *acts, unsigned char *scratch) {
    const rl_gpu_layout *l = &m->bl;
#define AT(base, name, type) m->name = (type *)(base + l->name)
    AT(acts, res, float), AT(acts, res_mid, float), AT(acts, ln1, bf16), AT(acts, rstd1, float);
    AT(acts, qkv, bf16), AT(acts, att_lse, float), AT(acts, atty, bf16), AT(acts, ln2, bf16);
    AT(acts, rstd2, float), AT(acts, gu, bf16), AT(acts, hm, bf16), AT(acts, lnf, bf16);
    AT(acts, rstdf, float), AT(acts, logits, bf16), AT(acts, lse_cls, float), AT(acts, losses, float);
    AT(acts, rope, float);
    AT(scratch, dres, float), AT(scratch, dres16, bf16), AT(scratch, dln, bf16), AT(scratch, datty, bf16);
    AT(scratch, dqkv, bf16), AT(scratch, dh, bf16), AT(scratch, dgu, bf16), AT(scratch, dsum, float);
    AT(scratch, rms_partial, float), AT(scratch, norm_partial, float), AT(scratch, scalars, float);
    AT(scratch, cls_stats, float);
    AT(scratch, io, int32_t);
#undef AT
    m->dq_acc = m->options.attn_dq_atomic ? (float *)(scratch + l->dq_acc) : NULL; // else the dQ kernel
    m->ws = scratch + l->ws;
}

// ---- create / free ------------------------------------------------------------------------------
void rl_gpu_model_free(rl_gpu_model *m) {
    if (!m) return;
    if (m->plan) { // a dry model owns nothing on the device
        free(m);
        return;
    }
    // nothing may still run on the buffers we free
    if (m->s || m->params) cudaStreamSynchronize(m->s);
    rl_gemm_free(&m->gemm);
    rl_cudnn_attn_free(m->cudnn);
    for (micro_graph &g : m->graph)
        if (g.exec) cudaGraphExecDestroy(g.exec);
    cudaFree(m->params);
    cudaFree(m->master);
    cudaFree(m->opt);
    cudaFree(m->shard_buf);
    cudaFree(m->grads);
    cudaFree(m->slots);
    if (m->copy_s) cudaStreamSynchronize(m->copy_s);
    cudaFree(m->ring);
    for (cudaEvent_t ev : m->ring_in)
        if (ev) cudaEventDestroy(ev);
    if (m->ring_free) cudaEventDestroy(m->ring_free);
    if (m->copy_s) cudaStreamDestroy(m->copy_s);
    cudaFree(m->acts);
    cudaFree(m->scratch);
    for (int k = 0; k < RL_IO_SLOTS; k++) {
        if (m->pinned_io[k]) cudaFreeHost(m->pinned_io[k]);
        if (m->io_done[k]) cudaEventDestroy(m->io_done[k]);
    }
    if (m->pinned_scalars) cudaFreeHost(m->pinned_scalars);
    cudaEvent_t evs[] = {m->loss_ready,   m->norm_ready,   m->stats_ready[0], m->stats_ready[1],
                         m->fused_ev[0],  m->fused_ev[1],  m->fused_ev[2]};
    for (cudaEvent_t ev : evs)
        if (ev) cudaEventDestroy(ev);
    free(m->counts);
    pairs_free(&m->prof);
    pairs_free(&m->waits);
    free(m);
}

// fp32 gradient elements the model allocates: the whole buffer, or the slots
static size_t grad_elems(const rl_gpu_model *m) {
    return m->options.grad_slots ? (size_t)m->options.grad_slots * m->slot_len : m->lay.total + m->pad;
}
// resident bf16 weights: all of them, or without the streamed layers
static size_t param_elems(const rl_gpu_model *m) {
    size_t all = m->lay.total + m->pad;
    return m->options.stream_layers ? all - (size_t)m->L * m->lay.layer_size : all;
}
static size_t ring_elems(const rl_gpu_model *m) {
    return m->options.stream_layers ? RL_GPU_LAYER_RING * m->lay.layer_size : 0;
}

// Shapes, the padded vocabulary, the classifier's chunk and the buffer
// sizes: everything about a model that needs no device (a plan stops here).
static int shape(rl_gpu_model *m, const rl_model_config *c, int B, int T, rl_err *e) {
    RL_TRY(rl_model_config_validate(c, "model", e));
    if (B < 1 || T < 1)
        return rl_errf(e, RL_EINPUT, "gpu model: batch %d x sequence %d must be positive", B, T);
    if (T > c->max_position_embeddings)
        return rl_errf(e, RL_EINPUT, "seq_len %d exceeds model.max_position_embeddings %d", T,
                       c->max_position_embeddings);
    // Kernels index rows (and attention's per-head statistics, rows x
    // heads) as int and elements as size_t; every size here is size_t.
    if ((long long)B * T * c->num_attention_heads >= (1ll << 31))
        return rl_errf(e, RL_EINPUT,
                       "gpu model: %d x %d tokens x %d heads per forward is too many (below 2^31)",
                       B, T, c->num_attention_heads);
    m->cfg = *c;
    rl_param_layout_init(&m->lay, c);
    m->B = B, m->T = T;
    m->D = c->hidden_size, m->F = c->intermediate_size, m->V = c->vocab_size;
    for (int &f : m->fused)
        f = m->options.fused_gemm == RL_GPU_FUSED_ON     ? FUSE_ON
            : m->options.fused_gemm == RL_GPU_FUSED_AUTO ? FUSE_UNTIMED
                                                         : FUSE_OFF;
    rl_gpu_layout_of(c, B, T, m->options.recompute, m->options.attn_dq_atomic,
                     m->options.classifier_rows, &m->bl);
    m->Vp = m->bl.Vp;
    m->pad = (size_t)(m->Vp - m->V) * m->D;
    m->L = c->num_hidden_layers, m->H = c->num_attention_heads, m->KV = c->num_key_value_heads;
    m->hd = rl_model_head_dim(c), m->qd = m->H * m->hd, m->kvd = m->KV * m->hd;
    m->C3 = m->qd + 2 * m->kvd;
    if (m->hd > RL_GPU_MAX_HEAD_DIM)
        return rl_errf(e, RL_EINPUT,
                       "model: head dim %d (hidden_size / num_attention_heads) is above the GPU "
                       "kernels' %d",
                       m->hd, RL_GPU_MAX_HEAD_DIM);
    size_t P = m->lay.total;
    m->held = m->options.host_state ? 0 : m->options.held && m->options.held < P ? m->options.held : P;
    m->master_ok = m->held == P;
    if (m->options.grad_slots < 0 || m->options.grad_slots > 8)
        return rl_errf(e, RL_EINTERNAL, "gpu model: %d gradient slots", m->options.grad_slots);
    m->slot_len = m->options.grad_slots ? rl_gpu_grad_slot_len(c) : 0;
    if (m->options.stream_layers && !m->options.host_state)
        return rl_errf(e, RL_EINTERNAL, "gpu model: streamed layers need the optimizer's state on the host");
    m->bytes = (param_elems(m) + ring_elems(m)) * sizeof(bf16) + grad_elems(m) * sizeof(float) +
               3 * m->held * sizeof(float) + m->bl.acts + m->bl.scratch;
    return RL_OK;
}

// Optimizer state for fewer elements than parameters and no shard yet: the
// update or a copy would run past it.
static int moments_ready(const rl_gpu_model *m, const char *what, rl_err *e) {
    if (m->plan || m->ranges || m->held == m->lay.total) return RL_OK; // a plan only counts
    return rl_errf(e, RL_EINTERNAL, "gpu model: %s with optimizer state for %zu of %zu parameters and no shard set",
                   what, m->held, m->lay.total);
}
// ... and the master must hold the weights (upload_params after a shard).
static int master_ready(const rl_gpu_model *m, const char *what, rl_err *e) {
    RL_TRY(moments_ready(m, what, e));
    if (m->plan || m->master_ok) return RL_OK;
    return rl_errf(e, RL_EINTERNAL, "gpu model: %s before the weights were uploaded into the shard's master", what);
}

// Before any allocation: a model the GPU cannot hold is refused with what
// it needs, by kind, instead of an "out of memory" from whichever
// cudaMalloc comes first (the CUDA context, cuBLASLt's and cuDNN's
// workspaces and NCCL's buffers come on top).
static int fits(const rl_gpu_model *m, rl_err *e) {
    size_t free_b = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    if (m->bytes <= free_b) return RL_OK;
    size_t v[] = {m->bytes, (param_elems(m) + ring_elems(m)) * sizeof(bf16), m->held * sizeof(float), grad_elems(m) * sizeof(float), 2 * m->held * sizeof(float),
                  m->bl.acts + m->bl.scratch, free_b, total};
    char s[8][24];
    for (int k = 0; k < 8; k++) // GiB, or MiB below one
        if (v[k] >= (size_t)1 << 30) snprintf(s[k], sizeof s[k], "%.2f GiB", v[k] / 1073741824.0);
        else snprintf(s[k], sizeof s[k], "%.1f MiB", v[k] / 1048576.0);
    return rl_errf(e, RL_EINPUT,
                   "gpu model: needs %s of GPU memory (bf16 weights %s, fp32 master %s, gradients %s, AdamW "
                   "moments %s, activations and scratch %s for %d x %d tokens); the GPU has %s free of %s: lower "
                   "train.micro_batch, set train.recompute, shard the optimizer state (dist.shard) or keep it in "
                   "the host's memory (train.offload)",
                   s[0], s[1], s[2], s[3], s[4], s[5], m->B, m->T, s[6], s[7]);
}

static int create(rl_gpu_model *m, const rl_model_config *c, int B, int T, rl_err *e) {
    RL_TRY(shape(m, c, B, T, e));
    int dev, optin;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if ((size_t)m->D * sizeof(float) > (size_t)optin)
        return rl_errf(e, RL_EINPUT, "model.hidden_size %d is too large for the GPU RMSNorm kernel",
                       m->D);
    RL_TRY(rl_gpu_kernels_init(e));
    RL_TRY(rl_gpu_attn_prepare(m->hd, e)); // a head dim this GPU cannot run fails here
    RL_TRY(fits(m, e));

    size_t P = m->lay.total, Pp = P + m->pad;
    CUDA_CHECK(cudaMalloc(&m->params, param_elems(m) * sizeof(bf16)));
    if (m->options.stream_layers) {
        CUDA_CHECK(cudaMalloc(&m->ring, ring_elems(m) * sizeof(bf16)));
        CUDA_CHECK(cudaStreamCreateWithFlags(&m->copy_s, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&m->ring_free, cudaEventDisableTiming));
        for (int k = 0; k < RL_GPU_LAYER_RING; k++) {
            CUDA_CHECK(cudaEventCreateWithFlags(&m->ring_in[k], cudaEventDisableTiming));
            m->ring_layer[k] = -1;
        }
    }
    if (m->held) CUDA_CHECK(cudaMalloc(&m->master, m->held * sizeof(float)));
    if (m->held) CUDA_CHECK(cudaMalloc(&m->opt, 2 * m->held * sizeof(float)));
    if (m->options.grad_slots) {
        CUDA_CHECK(cudaMalloc(&m->slots, grad_elems(m) * sizeof(float)));
        CUDA_CHECK(cudaMemsetAsync(m->slots, 0, grad_elems(m) * sizeof(float), m->s));
    } else {
        CUDA_CHECK(cudaMalloc(&m->grads, Pp * sizeof(float)));
        CUDA_CHECK(cudaMemsetAsync(m->grads, 0, Pp * sizeof(float), m->s));
    }
    CUDA_CHECK(cudaMalloc(&m->acts, m->bl.acts));
    CUDA_CHECK(cudaMalloc(&m->scratch, m->bl.scratch));
    place(m, m->acts, m->scratch);
    for (int k = 0; k < RL_IO_SLOTS; k++) {
        CUDA_CHECK(cudaMallocHost(&m->pinned_io[k], sizeof(int32_t) * m->bl.io_ints));
        CUDA_CHECK(cudaEventCreateWithFlags(&m->io_done[k], cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaMallocHost(&m->pinned_scalars, 8 * sizeof(float)));
    m->counts = (int32_t *)malloc(sizeof(int32_t) * ((size_t)m->V + 1));
    if (!m->counts) return rl_errf(e, RL_ENOMEM, "gpu model: host buffers");
    CUDA_CHECK(cudaEventCreateWithFlags(&m->loss_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&m->norm_ready, cudaEventDisableTiming));
    for (int k = 0; k < 2; k++)
        CUDA_CHECK(cudaEventCreateWithFlags(&m->stats_ready[k], cudaEventDisableTiming));
    if (m->options.fused_gemm == RL_GPU_FUSED_AUTO)
        for (cudaEvent_t &ev : m->fused_ev) CUDA_CHECK(cudaEventCreate(&ev));
    RL_TRY(rl_gemm_init(&m->gemm, m->ws, RL_GEMM_WORKSPACE, e));
    m->gemm.sm_count = m->options.gemm_sm_count;

    // zero state: parameters (the padded lm_head rows stay zero for good),
    // gradients, moments; the scalars too (a grad norm read before any was
    // computed is 0, not garbage)
    CUDA_CHECK(cudaMemsetAsync(m->params, 0, param_elems(m) * sizeof(bf16), m->s));
    if (m->held) CUDA_CHECK(cudaMemsetAsync(m->master, 0, m->held * sizeof(float), m->s));
    if (m->held) CUDA_CHECK(cudaMemsetAsync(m->opt, 0, 2 * m->held * sizeof(float), m->s));
    CUDA_CHECK(cudaMemsetAsync(m->scalars, 0, 4 * sizeof(float), m->s));

    size_t nrope = (size_t)c->max_position_embeddings * m->hd;
    float *rope = (float *)malloc(nrope * sizeof(float));
    if (!rope) return rl_errf(e, RL_ENOMEM, "gpu model: RoPE table");
    rl_cpu_rope_table_f32(c, rope);
    cudaError_t ce =
        cudaMemcpyAsync(m->rope, rope, nrope * sizeof(float), cudaMemcpyHostToDevice, m->s);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(m->s); // rope is pageable: wait before free
    free(rope);
    CUDA_CHECK(ce);
    // last: auto runs both attention backends on the model's shapes
    RL_TRY(rl_gpu_attn_select(&m->cudnn, m->options.attention, B, T, m->H, m->KV, m->hd,
                              !m->options.attn_dq_atomic, m->s, e));
    m->bytes += rl_cudnn_attn_device_bytes(m->cudnn);
    return RL_OK;
}

int rl_gpu_model_create(rl_gpu_model **out, const rl_model_config *c, int B, int T,
                        const rl_gpu_options *opt, cudaStream_t stream, rl_err *e) {
    *out = NULL;
    rl_gpu_model *m = (rl_gpu_model *)calloc(1, sizeof *m);
    if (!m) return rl_errf(e, RL_ENOMEM, "gpu model: out of host memory");
    if (opt) m->options = *opt;
    m->s = stream;
    m->graphs_on = 1;
    int rc = create(m, c, B, T, e);
    if (rc) {
        rl_gpu_model_free(m);
        return rc;
    }
    *out = m;
    return RL_OK;
}

const rl_param_layout *rl_gpu_model_layout(const rl_gpu_model *m) { return &m->lay; }
cudaStream_t rl_gpu_model_stream(const rl_gpu_model *m) { return m->s; }
size_t rl_gpu_model_device_bytes(const rl_gpu_model *m) { return m->bytes; }
float *rl_gpu_model_grads(rl_gpu_model *m) { return m->grads; }
void *rl_gpu_model_params(rl_gpu_model *m) { return m->params; }
float *rl_gpu_model_opt(rl_gpu_model *m) { return m->opt; }

// ---- host <-> device ----------------------------------------------------------------------------
// Before reading params[0, upto): the stream waits for what a gather still
// brings there (rl_gpu_model_set_params_wait).
static void params_wait(rl_gpu_model *m, size_t upto) {
    if (!m->params_in || m->plan) return;
    cudaEvent_t *w = wait_begin(m);
    m->params_in(m->params_in_ctx, upto);
    wait_end(m, w);
}

void rl_gpu_model_set_params_wait(rl_gpu_model *m, rl_gpu_wait_fn fn, void *ctx) {
    m->params_in = fn, m->params_in_ctx = ctx;
}

void rl_gpu_model_set_grad_sink(rl_gpu_model *m, rl_gpu_slot_fn fn, void *ctx) { m->sink = fn, m->sink_ctx = ctx; }
void rl_gpu_model_set_shard_grads(rl_gpu_model *m, const float *g) { m->shard_grad = g; }

void rl_gpu_model_set_host_weights(rl_gpu_model *m, const uint16_t *host, rl_gpu_wait_fn ready, void *ctx) {
    m->host_w = host, m->host_ready = ready, m->host_ready_ctx = ctx;
}

// The resident bf16 weights at layout offset off (the embedding's, the final
// norm's, lm_head's; every one's without streamed layers): with streamed
// layers the head follows the embedding in the allocation.
static bf16 *wres(const rl_gpu_model *m, size_t off) {
    if (!m->options.stream_layers || off < m->lay.layers) return m->params + off;
    return m->params + m->lay.layers + (off - m->lay.final_norm);
}

// Streamed layers: the ring buffer holding layer l, or else the least
// recently used one, into which a copy of l from the host is queued. The
// copy waits for every kernel queued on the model's stream so far (that
// buffer's last readers among them) and for the host's weights (ready).
static int ring_load(rl_gpu_model *m, int l, int *slot, rl_err *e) {
    int k = 0;
    for (int i = 0; i < RL_GPU_LAYER_RING; i++)
        if (m->ring_layer[i] == l) return *slot = i, RL_OK;
    for (int i = 1; i < RL_GPU_LAYER_RING; i++)
        if (m->ring_used[i] < m->ring_used[k]) k = i;
    size_t n = m->lay.layer_size, wl = m->lay.layers + (size_t)l * n;
    if (!m->plan) {
        if (!m->host_w) return rl_errf(e, RL_EINTERNAL, "gpu model: streamed layers without the host's weights");
        if (m->host_ready) m->host_ready(m->host_ready_ctx, wl + n);
        CUDA_CHECK(cudaEventRecord(m->ring_free, m->s));
        CUDA_CHECK(cudaStreamWaitEvent(m->copy_s, m->ring_free, 0));
        CUDA_CHECK(cudaMemcpyAsync(m->ring + (size_t)k * n, m->host_w + wl, n * sizeof(bf16), cudaMemcpyHostToDevice,
                                   m->copy_s));
        CUDA_CHECK(cudaEventRecord(m->ring_in[k], m->copy_s));
    }
    m->ring_layer[k] = l, m->ring_used[k] = ++m->ring_clock; // a prefetched layer is not evicted before its use
    *slot = k;
    return RL_OK;
}

// Layer l's bf16 weights for the kernels queued next: the resident ones
// (once a gather brought them), or a ring buffer with l's copy from the
// host, after which next's copy (none outside [0, L)) is queued to overlap
// l's kernels.
static int layer_weights(rl_gpu_model *m, int l, int next, const bf16 **w, rl_err *e) {
    size_t wl = m->lay.layers + (size_t)l * m->lay.layer_size;
    if (!m->options.stream_layers) {
        params_wait(m, wl + m->lay.layer_size);
        *w = m->params + wl;
        return RL_OK;
    }
    int k = 0, kn = 0;
    RL_TRY(ring_load(m, l, &k, e));
    if (!m->plan) {
        cudaEvent_t *wt = wait_begin(m);
        CUDA_CHECK(cudaStreamWaitEvent(m->s, m->ring_in[k], 0));
        wait_end(m, wt);
    }
    m->ring_used[k] = ++m->ring_clock;
    if (next >= 0 && next < m->L) RL_TRY(ring_load(m, next, &kn, e));
    *w = m->ring + (size_t)k * m->lay.layer_size;
    return RL_OK;
}

// Where backward writes the gradient region that starts at off: the flat
// buffer, or the next slot, once the sink has made the stream wait until
// that slot's last region is taken away.
static float *grad_region(rl_gpu_model *m, size_t off) {
    if (!m->slots) return m->grads + off;
    float *s = m->slots + (size_t)(m->slot_next++ % (unsigned)m->options.grad_slots) * m->slot_len;
    cudaEvent_t *w = wait_begin(m);
    m->sink(m->sink_ctx, off, s);
    wait_end(m, w);
    return s;
}

static int copy_sync(rl_gpu_model *m, void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                     rl_err *e) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, m->s));
    CUDA_CHECK(cudaStreamSynchronize(m->s));
    return RL_OK;
}

// fp32 src holding elements [off, off + len) -> the bf16 compute copy of
// those of them the GPU keeps (streamed layers' are the host's).
static int to_resident(rl_gpu_model *m, const float *src, size_t off, size_t len, rl_err *e) {
    if (!m->options.stream_layers) return rl_k_f32_to_bf16(m->params + off, src, len, m->s, e);
    size_t lo = m->lay.layers, hi = m->lay.final_norm, end = off + len, from = off > hi ? off : hi;
    if (off < lo) RL_TRY(rl_k_f32_to_bf16(m->params + off, src, (end < lo ? end : lo) - off, m->s, e));
    if (end > from) RL_TRY(rl_k_f32_to_bf16(wres(m, from), src + (from - off), end - from, m->s, e));
    return RL_OK;
}

// With gradient slots: the host array goes up region by region through
// slot 0, each region's bf16 copy and shard's ranges (a whole master: all
// of it) taken from there. Between steps: the slots hold nothing then.
static int upload_through_slot(rl_gpu_model *m, const float *host, rl_err *e) {
    size_t P = m->lay.total;
    for (int k = 0; k < rl_gpu_grad_regions(&m->cfg, NULL); k++) {
        size_t off, len;
        rl_gpu_grad_region(&m->cfg, k, &off, &len);
        CUDA_CHECK(cudaMemcpyAsync(m->slots, host + off, len * sizeof(float), cudaMemcpyHostToDevice, m->s));
        RL_TRY(to_resident(m, m->slots, off, len, e));
        if (m->ranges)
            RL_TRY(rl_k_ranges_copy(m->master, m->slots, m->ranges, m->nranges, m->held, off, off + len, 0, m->s, e));
        else if (m->held == P)
            CUDA_CHECK(cudaMemcpyAsync(m->master + off, m->slots, len * sizeof(float), cudaMemcpyDeviceToDevice, m->s));
    }
    m->master_ok = m->held == P || m->ranges;
    CUDA_CHECK(cudaStreamSynchronize(m->s));
    return RL_OK;
}

// A compact master takes its ranges from the whole array staged in the
// gradient buffer (the only other fp32 buffer of that size), or region by
// region in a gradient slot.
int rl_gpu_model_upload_params(rl_gpu_model *m, const float *host, rl_err *e) {
    size_t P = m->lay.total;
    params_wait(m, SIZE_MAX);
    if (m->slots) return upload_through_slot(m, host, e);
    float *whole = m->held == P && !m->ranges ? m->master : m->grads;
    RL_TRY(copy_sync(m, whole, host, P * sizeof(float), cudaMemcpyHostToDevice, e));
    RL_TRY(to_resident(m, whole, 0, P, e));
    if (whole == m->grads) {
        m->fresh = 1; // the gradients are gone: the next micro-batch writes them
        if (m->ranges)
            RL_TRY(rl_k_ranges_copy(m->master, m->grads, m->ranges, m->nranges, m->held, 0, SIZE_MAX, 0, m->s, e));
    }
    m->master_ok = whole == m->master || m->ranges;
    CUDA_CHECK(cudaStreamSynchronize(m->s));
    return RL_OK;
}

int rl_gpu_model_download_params(rl_gpu_model *m, float *host, rl_err *e) {
    if (m->held != m->lay.total || m->ranges)
        return rl_errf(e, RL_EINTERNAL, "gpu model: a shard's master downloaded whole (rl_gpu_model_master_whole)");
    RL_TRY(master_ready(m, "a download of the weights", e));
    return copy_sync(m, host, m->master, m->lay.total * sizeof(float), cudaMemcpyDeviceToHost, e);
}

int rl_gpu_model_upload_params_bf16(rl_gpu_model *m, const uint16_t *host, rl_err *e) {
    params_wait(m, SIZE_MAX);
    const rl_param_layout *p = &m->lay;
    size_t resident = m->options.stream_layers ? p->layers : p->total; // then the head, if not all
    CUDA_CHECK(cudaMemcpyAsync(m->params, host, resident * sizeof(bf16), cudaMemcpyHostToDevice, m->s));
    if (resident < p->total)
        CUDA_CHECK(cudaMemcpyAsync(wres(m, p->final_norm), host + p->final_norm, (p->total - p->final_norm) * sizeof(bf16),
                                   cudaMemcpyHostToDevice, m->s));
    return RL_OK;
}

int rl_gpu_model_master_whole(rl_gpu_model *m, float **whole, rl_err *e) {
    RL_TRY(master_ready(m, "the master's whole copy", e));
    if (!m->ranges) return *whole = m->master, RL_OK;
    if (m->slots) return rl_errf(e, RL_EINTERNAL, "gpu model: a whole master with gradient slots (master_region)");
    const rl_k_cost c = {0, 8.0 * (double)m->held, 1};
    STEP(RL_GPU_PROF_OPTIMIZER, c,
         rl_k_ranges_copy(m->master, m->grads, m->ranges, m->nranges, m->held, 0, SIZE_MAX, 1, m->s, e));
    m->fresh = 1;
    *whole = m->grads;
    return RL_OK;
}

int rl_gpu_model_master_region(rl_gpu_model *m, size_t off, size_t len, float **buf, rl_err *e) {
    RL_TRY(master_ready(m, "the master's region", e));
    if (!m->slots || len > m->slot_len || off > m->lay.total || len > m->lay.total - off)
        return rl_errf(e, RL_EINTERNAL, "gpu model: master region [%zu, +%zu) (slots of %zu)", off, len, m->slot_len);
    if (m->ranges)
        RL_TRY(rl_k_ranges_copy(m->master, m->slots, m->ranges, m->nranges, m->held, off, off + len, 1, m->s, e));
    else
        CUDA_CHECK(cudaMemcpyAsync(m->slots, m->master + off, len * sizeof(float), cudaMemcpyDeviceToDevice, m->s));
    *buf = m->slots;
    return RL_OK;
}

static float bf16_bits_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// bf16 device array -> fp32 host array, through a host staging copy (no
// device temporary: the logits can be gigabytes).
static int download_bf16(rl_gpu_model *m, float *host, const bf16 *src, size_t n, rl_err *e) {
    uint16_t *tmp = (uint16_t *)malloc(n * sizeof(uint16_t) + 1);
    if (!tmp) return rl_errf(e, RL_ENOMEM, "gpu model: host staging of %zu values", n);
    int rc = copy_sync(m, tmp, src, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, e);
    if (!rc)
        for (size_t i = 0; i < n; i++) host[i] = bf16_bits_to_float(tmp[i]);
    free(tmp);
    return rc;
}

int rl_gpu_model_download_params_bf16(rl_gpu_model *m, float *host, rl_err *e) {
    params_wait(m, SIZE_MAX);
    const rl_param_layout *p = &m->lay;
    if (!m->options.stream_layers) return download_bf16(m, host, m->params, p->total, e);
    if (!m->host_w) return rl_errf(e, RL_EINTERNAL, "gpu model: streamed layers without the host's weights");
    RL_TRY(download_bf16(m, host, m->params, p->layers, e));
    RL_TRY(download_bf16(m, host + p->final_norm, wres(m, p->final_norm), p->total - p->final_norm, e));
    for (size_t i = p->layers; i < p->final_norm; i++) host[i] = bf16_bits_to_float(m->host_w[i]); // the host's
    return RL_OK;
}

int rl_gpu_model_upload_grads(rl_gpu_model *m, const float *host, rl_err *e) {
    if (!m->grads) return rl_errf(e, RL_EINTERNAL, "gpu model: no gradient buffer (gradient slots)");
    m->fresh = 0; // the gradients are these now: a next micro-batch adds to them
    return copy_sync(m, m->grads, host, m->lay.total * sizeof(float), cudaMemcpyHostToDevice, e);
}
int rl_gpu_model_download_grads(rl_gpu_model *m, float *host, rl_err *e) {
    if (!m->grads) return rl_errf(e, RL_EINTERNAL, "gpu model: no gradient buffer (gradient slots)");
    return copy_sync(m, host, m->grads, m->lay.total * sizeof(float), cudaMemcpyDeviceToHost, e);
}
int rl_gpu_model_upload_opt(rl_gpu_model *m, const float *host, rl_err *e) {
    RL_TRY(moments_ready(m, "moments upload", e));
    return copy_sync(m, m->opt, host, 2 * m->held * sizeof(float), cudaMemcpyHostToDevice, e);
}
int rl_gpu_model_download_opt(rl_gpu_model *m, float *host, rl_err *e) {
    RL_TRY(moments_ready(m, "moments download", e));
    return copy_sync(m, host, m->opt, 2 * m->held * sizeof(float), cudaMemcpyDeviceToHost, e);
}

// ---- sharded state ------------------------------------------------------------------------------
// The master and moments are freed before the new ones are allocated, so
// the peak is the larger of the two, not their sum; the stream is idle
// first (nothing queued may still use them). A whole master's values wait
// in the gradient buffer meanwhile and the shard's ranges are taken from
// there; a compact one's cannot be re-cut here (other ranks hold the rest),
// so the master waits for the next upload_params.
int rl_gpu_model_set_shard(rl_gpu_model *m, const rl_shard_range *r, int nr, int rank, rl_err *e) {
    if (m->plan || m->options.host_state)
        return rl_errf(e, RL_EINTERNAL, "gpu model: a shard of state it does not hold (a plan, or the host's)");
    size_t held = 0, P = m->lay.total;
    for (int k = 0; r && k < nr; k++) {
        if (r[k].len == 0 || r[k].off > P || r[k].len > P - r[k].off)
            return rl_errf(e, RL_EINTERNAL, "gpu model: shard range %d [%zu, +%zu) of %zu", k, r[k].off, r[k].len, P);
        held += r[k].len;
    }
    if (r && (nr < 1 || held > P)) return rl_errf(e, RL_EINTERNAL, "gpu model: a shard of %d ranges, %zu elements", nr, held);
    rl_k_range *h = NULL;
    if (r && !(h = (rl_k_range *)malloc((size_t)nr * sizeof *h))) return rl_errf(e, RL_ENOMEM, "gpu model: shard ranges");
    for (size_t k = 0, at = 0; r && k < (size_t)nr; at += r[k].len, k++)
        h[k] = rl_k_range{r[k].off, r[k].len, at, !r[k].shared || rank == 0};
    // the master is whole: re-cut it (with gradient slots there is no whole
    // buffer to keep it in meanwhile: it waits for the next upload)
    bool keep = m->master_ok && m->held == P && !m->ranges && m->grads;
    cudaError_t ce = keep ? cudaMemcpyAsync(m->grads, m->master, P * sizeof(float), cudaMemcpyDeviceToDevice, m->s)
                          : cudaSuccess;
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(m->s);
    m->bytes -= 3 * m->held * sizeof(float) + (m->shard_buf ? sizeof(double) + (size_t)m->nranges * sizeof *h : 0);
    cudaFree(m->master), cudaFree(m->opt), cudaFree(m->shard_buf);
    m->master = m->opt = NULL, m->shard_buf = NULL, m->sq = NULL, m->ranges = NULL, m->nranges = 0;
    m->held = r ? held : P;
    m->master_ok = 0;
    m->fresh = 1; // the gradient buffer may hold the old master now
    size_t tab = r ? sizeof(double) + (size_t)nr * sizeof *h : 0;
    if (ce == cudaSuccess) ce = cudaMalloc(&m->master, m->held * sizeof(float));
    if (ce == cudaSuccess) ce = cudaMalloc(&m->opt, 2 * m->held * sizeof(float));
    if (ce == cudaSuccess && r) ce = cudaMalloc(&m->shard_buf, tab);
    if (ce == cudaSuccess) ce = cudaMemsetAsync(m->opt, 0, 2 * m->held * sizeof(float), m->s);
    if (ce == cudaSuccess && r) {
        m->sq = (double *)m->shard_buf, m->ranges = (rl_k_range *)(m->sq + 1), m->nranges = nr;
        ce = cudaMemcpyAsync(m->ranges, h, (size_t)nr * sizeof *h, cudaMemcpyHostToDevice, m->s);
    }
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(m->s); // h is pageable
    free(h);
    CUDA_CHECK(ce);
    m->bytes += 3 * m->held * sizeof(float) + tab; // allocated, whatever follows
    if (keep && r) RL_TRY(rl_k_ranges_copy(m->master, m->grads, m->ranges, nr, m->held, 0, SIZE_MAX, 0, m->s, e));
    if (keep && !r) CUDA_CHECK(cudaMemcpyAsync(m->master, m->grads, P * sizeof(float), cudaMemcpyDeviceToDevice, m->s));
    CUDA_CHECK(cudaStreamSynchronize(m->s));
    m->master_ok = keep;
    return RL_OK;
}

int rl_gpu_model_shard_sq(rl_gpu_model *m, double **sq, rl_err *e) {
    if (!m->ranges) return rl_errf(e, RL_EINTERNAL, "gpu model: a shard's norm without a shard");
    if (m->fresh) return rl_errf(e, RL_EINTERNAL, "gpu model: gradient norm of a step with no micro-batch");
    STEP(RL_GPU_PROF_OPTIMIZER, rl_k_norm_cost(m->held),
         rl_k_norm_sq_ranges(m->sq, m->norm_partial, m->shard_grad ? m->shard_grad : m->grads, !!m->shard_grad,
                             m->ranges, m->nranges, m->held, m->s, e));
    *sq = m->sq;
    return RL_OK;
}

int rl_gpu_model_shard_norm(rl_gpu_model *m, rl_err *e) {
    if (!m->ranges) return rl_errf(e, RL_EINTERNAL, "gpu model: a shard's norm without a shard");
    const rl_k_cost c = {1, 12, 1};
    STEP(RL_GPU_PROF_OPTIMIZER, c, rl_k_sqrt_d(m->scalars + 1, m->sq, m->s, e));
    return RL_OK;
}

int rl_gpu_model_init_random(rl_gpu_model *m, uint64_t seed, float std, rl_err *e) {
    if (m->held != m->lay.total || m->ranges) return rl_errf(e, RL_EINTERNAL, "gpu model: init_random of a shard");
    RL_TRY(rl_k_init_random(m->master, &m->lay, m->L, m->D, seed, std, m->s, e));
    RL_TRY(rl_k_f32_to_bf16(m->params, m->master, m->lay.total, m->s, e));
    CUDA_CHECK(cudaStreamSynchronize(m->s));
    m->master_ok = 1;
    return RL_OK;
}

int rl_gpu_model_download_logits(rl_gpu_model *m, float *host, rl_err *e) {
    if (!m->logits_valid)
        return rl_errf(e, RL_EINPUT,
                       "gpu model: no logits kept (the last call was not a forward, or its %d rows "
                       "did not fit one classifier chunk of %d)",
                       m->cur_B * m->cur_T, m->bl.crows);
    size_t N = (size_t)m->cur_B * m->cur_T, V = m->V, Vp = m->Vp;
    float *rows = (float *)malloc(N * Vp * sizeof(float));
    if (!rows) return rl_errf(e, RL_ENOMEM, "gpu model: host staging of %zu logits", N * Vp);
    int rc = download_bf16(m, rows, m->logits, N * Vp, e);
    for (size_t n = 0; !rc && n < N; n++) memcpy(host + n * V, rows + n * Vp, V * sizeof(float));
    free(rows);
    return rc;
}

int rl_gpu_model_download_logits_row(rl_gpu_model *m, int row, float *host, rl_err *e) {
    if (!m->logits_valid || row < 0 || row >= m->cur_B * m->cur_T)
        return rl_errf(e, RL_EINPUT, "gpu model: no logits row %d kept (the last forward had %d rows)", row,
                       m->logits_valid ? m->cur_B * m->cur_T : 0);
    return download_bf16(m, host, m->logits + (size_t)row * m->Vp, (size_t)m->V, e);
}

// ---- the batch ----------------------------------------------------------------------------------
// A counting sort by token id (stable: positions stay ascending within a
// token). cnt: V + 1 ints of scratch. Returns the number of distinct ids.
int rl_gpu_group_tokens(const int32_t *tok, int N, int V, int32_t *cnt, int32_t *uniq, int32_t *seg,
                        int32_t *pos) {
    memset(cnt, 0, sizeof(int32_t) * ((size_t)V + 1));
    for (int i = 0; i < N; i++) cnt[tok[i] + 1]++;
    int U = 0;
    for (int v = 0; v < V; v++) {
        if (cnt[v + 1]) uniq[U] = v, seg[U] = cnt[v], U++;
        cnt[v + 1] += cnt[v]; // cnt[v] becomes the start of token v's positions
    }
    seg[U] = N;
    for (int i = 0; i < N; i++) pos[cnt[tok[i]]++] = i;
    return U;
}

// Checks a forward's shape and token ids, and queues the batch: tokens and
// targets go up in one copy from a pinned slot, together with the embedding
// backward's grouping (positions sorted by token id, stable; the distinct
// ids; segment starts). A plan has no batch: every row a distinct token.
static int begin_forward(rl_gpu_model *m, const int32_t *tokens, const int32_t *targets, int B,
                         int T, rl_err *e) {
    if (B < 1 || T < 1 || (long long)B * T > (long long)m->B * m->T || T > m->T)
        return rl_errf(e, RL_EINTERNAL, "gpu model: forward of %dx%d exceeds capacity %dx%d", B, T,
                       m->B, m->T);
    m->cur_B = B, m->cur_T = T, m->logits_valid = 0;
    int N = B * T, V = m->V;
    size_t cap = (size_t)m->B * m->T;
    if (m->plan) {
        m->n_uniq = N < V ? N : V;
        return RL_OK;
    }
    for (int i = 0; i < N; i++)
        if (tokens[i] < 0 || tokens[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
            return rl_errf(e, RL_EINPUT, "model: token id %d at position %d is outside [0, %d)",
                           tokens[i] < 0 || tokens[i] >= V ? tokens[i] : targets[i], i, V);
    // a slot is reused RL_IO_SLOTS batches later; its copy is long done
    // unless the host ran that far ahead (then this wait is the queue bound)
    int k = m->io_next;
    m->io_next = (k + 1) % RL_IO_SLOTS;
    if (m->io_used[k]) CUDA_CHECK(cudaEventSynchronize(m->io_done[k]));
    int32_t *tok = m->pinned_io[k], *tgt = tok + cap, *uniq = tgt + cap, *seg = uniq + cap,
            *pos = seg + cap + 1;
    memcpy(tok, tokens, sizeof(int32_t) * N);
    if (targets) memcpy(tgt, targets, sizeof(int32_t) * N);
    m->n_uniq = rl_gpu_group_tokens(tokens, N, V, m->counts, uniq, seg, pos);
    pos[cap] = m->n_uniq;
    CUDA_CHECK(cudaMemcpyAsync(m->io, tok, sizeof(int32_t) * m->bl.io_ints, cudaMemcpyHostToDevice,
                               m->s));
    CUDA_CHECK(cudaEventRecord(m->io_done[k], m->s));
    m->io_used[k] = 1;
    return RL_OK;
}

// ---- our fused GEMMs or the separate path ---------------------------------------------------
// At three sites (RL_GPU_SITE_*: SwiGLU's forward and backward, a training
// chunk of the classifier) the step runs either our GEMMs with the
// memory-bound work next to them fused in (gemm_kernels.cuh) or cuBLASLt's
// products and the separate kernels. options.fused_gemm picks; auto times
// both at each site's first use (the first forward, backward, classifier
// chunk: outside any graph capture, where the GEMMs' own algorithms are
// timed and the host waits anyway) and keeps the faster. Both compute the
// same values up to rounding order. Shapes or alignments the fused kernels
// do not take run the separate path whatever was asked. A plan counts the
// fused kernels under auto: the choice needs a GPU.
static int fused_path(const rl_gpu_model *m, int site, bool shapes_ok) {
    if (!shapes_ok) return FUSE_OFF;
    return m->fused[site] == FUSE_UNTIMED && m->plan ? FUSE_ON : m->fused[site];
}

// the shapes decide first (the carved buffers and the layer's weight
// offsets are 16-byte aligned when the hidden and intermediate sizes are
// multiples of 8)
static bool site_shapes_ok(const rl_gpu_model *m, int site) {
    if (site == RL_GPU_SITE_CLASSIFIER) return rl_k_cls_fused_ok(m->bl.crows, m->D, m->Vp, NULL, 0);
    return rl_k_gemm_swiglu_ok(m->B * m->T, m->D, m->F, NULL, 0);
}
int rl_gpu_model_fused(const rl_gpu_model *m, int site) {
    return site >= 0 && site < RL_GPU_SITES && m->fused[site] == FUSE_ON && site_shapes_ok(m, site);
}

// auto: each way run once (the cuBLASLt shapes' own tuning, first
// launches), then twice each between events; the faster kept and run once
// more, so its outputs are the ones left behind. Both ways must be
// repeatable: they write their outputs, never add to them.
template <class Sep, class Fused>
static int fused_time(rl_gpu_model *m, int site, Sep &&sep, Fused &&fused, rl_err *e) {
    static const char *const name[RL_GPU_SITES] = {"swiglu_fwd", "swiglu_bwd", "classifier"};
    cudaEvent_t *ev = m->fused_ev;
    float ms[2];
    RL_TRY(sep());
    RL_TRY(fused());
    CUDA_CHECK(cudaEventRecord(ev[0], m->s));
    RL_TRY(sep());
    RL_TRY(sep());
    CUDA_CHECK(cudaEventRecord(ev[1], m->s));
    RL_TRY(fused());
    RL_TRY(fused());
    CUDA_CHECK(cudaEventRecord(ev[2], m->s));
    CUDA_CHECK(cudaEventSynchronize(ev[2]));
    CUDA_CHECK(cudaEventElapsedTime(&ms[0], ev[0], ev[1]));
    CUDA_CHECK(cudaEventElapsedTime(&ms[1], ev[1], ev[2]));
    m->fused[site] = ms[1] <= ms[0] ? FUSE_ON : FUSE_OFF;
    rl_log(RL_LOG_INFO, "fused_gemm",
           "\"site\":\"%s\",\"choice\":\"%s\",\"separate_ms\":%.3f,\"fused_ms\":%.3f,"
           "\"tokens\":%d",
           name[site], m->fused[site] == FUSE_ON ? "fused" : "separate", ms[0] / 2, ms[1] / 2,
           m->cur_B * m->cur_T);
    return m->fused[site] == FUSE_ON ? fused() : sep();
}

// The site's way: the fused or the separate lambda, or both timed first.
template <class Sep, class Fused>
static int fused_site(rl_gpu_model *m, int site, bool shapes_ok, Sep &&sep, Fused &&fused,
                      rl_err *e) {
    int path = fused_path(m, site, shapes_ok);
    if (path == FUSE_UNTIMED) return fused_time(m, site, sep, fused, e);
    return path == FUSE_ON ? fused() : sep();
}

// gu = ln2 . Wgu^T, hm = silu(gate) * up
static int mlp_up_fwd(rl_gpu_model *m, bf16 *gu, bf16 *hm, const bf16 *ln2, const bf16 *wgu, int N,
                      rl_err *e) {
    const int D = m->D, F = m->F;
    cudaStream_t s = m->s;
    const void *p[] = {gu, hm, ln2, wgu};
    auto sep = [&]() -> int {
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(N, 2 * F, D, 2, 0),
             rl_gemm_fwd(&m->gemm, gu, 0, ln2, wgu, NULL, N, 2 * F, D, s, e));
        STEP(RL_GPU_PROF_ELEMWISE, rl_k_swiglu_fwd_cost(N, F), rl_k_swiglu_fwd(hm, gu, N, F, s, e));
        return RL_OK;
    };
    auto fused = [&]() -> int {
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_swiglu_fwd_cost(N, D, F),
             rl_k_gemm_swiglu_fwd(gu, hm, ln2, wgu, N, D, F, s, e));
        return RL_OK;
    };
    return fused_site(m, RL_GPU_SITE_SWIGLU_FWD, rl_k_gemm_swiglu_ok(N, D, F, p, 4), sep, fused, e);
}

// dgu = SwiGLU's backward of dh = dy . Wdown at gu; hm rebuilt when not NULL
static int mlp_down_bwd(rl_gpu_model *m, bf16 *dgu, bf16 *hm, const bf16 *dy, const bf16 *wdown,
                        const bf16 *gu, int N, rl_err *e) {
    const int D = m->D, F = m->F;
    cudaStream_t s = m->s;
    const void *p[] = {dgu, hm, dy, wdown, gu};
    auto sep = [&]() -> int {
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(N, F, D, 2, 0),
             rl_gemm_bwd_data(&m->gemm, m->dh, 0, dy, wdown, N, D, F, s, e));
        STEP(RL_GPU_PROF_ELEMWISE, rl_k_swiglu_bwd_cost(N, F, hm != NULL),
             rl_k_swiglu_bwd(dgu, hm, m->dh, gu, N, F, s, e));
        return RL_OK;
    };
    auto fused = [&]() -> int {
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_swiglu_bwd_cost(N, D, F, hm != NULL),
             rl_k_gemm_swiglu_bwd(dgu, hm, dy, wdown, gu, N, D, F, s, e));
        return RL_OK;
    };
    return fused_site(m, RL_GPU_SITE_SWIGLU_BWD, rl_k_gemm_swiglu_ok(N, D, F, p, 5), sep, fused, e);
}

// ---- forward ------------------------------------------------------------------------------------
// The decoder layers: embedding to the last layer's output res[L].
static int layers_fwd(rl_gpu_model *m, int B, int T, rl_err *e) {
    const int N = B * T, D = m->D, F = m->F;
    cudaStream_t s = m->s;
    rl_gemm *g = &m->gemm;
    const rl_layer_offsets *o = &m->lay.in_layer;
    const float eps = (float)m->cfg.rms_norm_eps;
    const int32_t *d_tok = m->io;

    params_wait(m, m->lay.embed + (size_t)m->V * D);
    STEP(RL_GPU_PROF_ELEMWISE, rl_k_embed_fwd_cost(N, D),
         rl_k_embed_fwd(m->res, wres(m, m->lay.embed), d_tok, N, D, s, e));
    for (int k = 0; k < RL_GPU_LAYER_RING; k++) m->ring_layer[k] = -1; // the host's weights may be new
    for (int l = 0; l < m->L; l++) {
        const bf16 *w;
        RL_TRY(layer_weights(m, l, l + 1, &w, e));
        float *x = m->res + l * m->bl.s_btd, *xnext = x + m->bl.s_btd, *xmid = m->res_mid + l * m->bl.s_btd;
        bf16 *ln1 = m->ln1 + l * m->bl.s_ln, *ln2 = m->ln2 + l * m->bl.s_ln;
        bf16 *qkv = m->qkv + l * m->bl.s_qkv, *atty = m->atty + l * m->bl.s_att;
        bf16 *gu = m->gu + l * m->bl.s_gu, *hm = m->hm + l * m->bl.s_hm;
        float *rstd1 = m->rstd1 + l * m->bl.s_bt, *rstd2 = m->rstd2 + l * m->bl.s_bt;
        float *lse = m->att_lse + l * m->bl.s_bh;

        STEP(RL_GPU_PROF_NORM, rl_k_rmsnorm_fwd_cost(N, D),
             rl_k_rmsnorm_fwd(ln1, rstd1, x, w + o->ln1, N, D, eps, s, e));
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(N, m->C3, D, 2, 0),
             rl_gemm_fwd(g, qkv, 0, ln1, w + o->wq, NULL, N, m->C3, D, s, e));
        // q and k rotated in place: qkv keeps them so for the backward
        STEP(RL_GPU_PROF_ELEMWISE, rl_k_rope_cost(N, m->H + m->KV, m->hd),
             rl_k_rope(qkv, m->rope, N, T, m->H + m->KV, m->hd, m->C3,
                       m->cfg.max_position_embeddings, 0, s, e));
        if (attn_cudnn(m))
            STEP(RL_GPU_PROF_ATTN_FWD, rl_k_attn_cudnn_fwd_cost(B, T, m->H, m->KV, m->hd),
                 rl_k_attn_cudnn_fwd(m->cudnn, atty, lse, qkv, B, T, s, e));
        else
            STEP(RL_GPU_PROF_ATTN_FWD, rl_k_attn_fwd_cost(B, T, m->H, m->KV, m->hd),
                 rl_k_attn_fwd(atty, lse, qkv, B, T, m->H, m->KV, m->hd, s, e));
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(N, D, m->qd, 4, 4),
             rl_gemm_fwd(g, xmid, 1, atty, w + o->wo, x, N, D, m->qd, s, e));
        STEP(RL_GPU_PROF_NORM, rl_k_rmsnorm_fwd_cost(N, D),
             rl_k_rmsnorm_fwd(ln2, rstd2, xmid, w + o->ln2, N, D, eps, s, e));
        RL_TRY(mlp_up_fwd(m, gu, hm, ln2, w + o->wgate, N, e));
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(N, D, F, 4, 4),
             rl_gemm_fwd(g, xnext, 1, hm, w + o->wdown, xmid, N, D, F, s, e));
    }
    float *xL = m->res + (size_t)m->L * m->bl.s_btd;
    params_wait(m, SIZE_MAX); // the final norm, then the classifier's lm_head
    STEP(RL_GPU_PROF_NORM, rl_k_rmsnorm_fwd_cost(N, D),
         rl_k_rmsnorm_fwd(m->lnf, m->rstdf, xL, wres(m, m->lay.final_norm), N, D, eps, s, e));
    return RL_OK;
}

// A training chunk of the classifier, rows [r0, r0 + nc): losses (and
// lse), the chunk's share of d(final norm output) (bf16, into dln) and of
// the lm_head gradient (acc: added to dwlm, else written). Separate:
// logits (bf16, rows of Vp) -> one kernel turning them into scale *
// (softmax - onehot) in place -> the two backward products. Fused (site
// RL_GPU_SITE_CLASSIFIER): the lm_head product leaves P and the softmax's
// tile statistics, a merge per row makes the losses and the backward's
// factors, and the backward products make dlogits in their operand loads.
static int classifier_train(rl_gpu_model *m, int r0, int nc, const int32_t *tgt, float *dwlm,
                            int acc, float scale, rl_err *e) {
    const int D = m->D, V = m->V, Vp = m->Vp;
    cudaStream_t s = m->s;
    rl_gemm *g = &m->gemm;
    const bf16 *wlm = wres(m, m->lay.lm_head), *x = m->lnf + (size_t)r0 * D;
    bf16 *dx = m->dln + (size_t)r0 * D;
    float *losses = m->losses + r0, *lse = m->lse_cls + r0;
    const size_t nt = m->bl.cls_tiles, cr = m->bl.crows;
    float *stats = m->cls_stats, *fac = stats + 2 * cr * nt, *tlogit = fac + cr * nt;
    auto sep = [&]() -> int {
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(nc, Vp, D, 2, 0),
             rl_gemm_fwd(g, m->logits, 0, x, wlm, NULL, nc, Vp, D, s, e));
        STEP(RL_GPU_PROF_CLASSIFIER, rl_k_xent_cost(nc, V, Vp, 1),
             rl_k_xent(m->logits, losses, lse, tgt, nc, V, Vp, scale, 1, s, e));
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(nc, D, Vp, 2, 0),
             rl_gemm_bwd_data(g, dx, 0, m->logits, wlm, nc, Vp, D, s, e));
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(Vp, D, nc, 4, acc ? 4 : 0),
             rl_gemm_bwd_weight(g, dwlm, m->logits, x, nc, Vp, D, acc, s, e));
        return RL_OK;
    };
    auto fused = [&]() -> int {
        STEP(RL_GPU_PROF_GEMM, rl_k_cls_fused_fwd_cost(nc, D, Vp),
             rl_k_cls_fused_fwd(m->logits, stats, tlogit, x, wlm, tgt, nc, D, V, Vp, s, e));
        STEP(RL_GPU_PROF_CLASSIFIER, rl_k_cls_merge_cost(nc, Vp),
             rl_k_cls_merge(losses, lse, fac, stats, tlogit, nc, Vp, scale, s, e));
        STEP(RL_GPU_PROF_GEMM, rl_k_cls_fused_dx_cost(nc, D, Vp),
             rl_k_cls_fused_dx(dx, m->logits, fac, tgt, wlm, nc, D, Vp, scale, s, e));
        STEP(RL_GPU_PROF_GEMM, rl_k_cls_fused_dw_cost(nc, D, Vp, acc),
             rl_k_cls_fused_dw(dwlm, m->logits, fac, tgt, x, nc, D, Vp, scale, acc, s, e));
        return RL_OK;
    };
    const void *p[] = {m->logits, x, wlm, dx, dwlm};
    bool ok = rl_k_cls_fused_ok(nc, D, Vp, p, 5);
    // auto times both ways by running them twice: only on a chunk that
    // writes the lm_head gradient (a step's first), never one that adds
    if (acc && fused_path(m, RL_GPU_SITE_CLASSIFIER, ok) == FUSE_UNTIMED) return sep();
    return fused_site(m, RL_GPU_SITE_CLASSIFIER, ok, sep, fused, e);
}

// The classifier over rows [0, N) in chunks of crows, each chunk done
// before the next overwrites the logits buffer: logits (bf16, rows of Vp)
// -> per-row losses (with targets); with grad (dwlm), classifier_train.
// fresh: the lm_head gradient is written by the first chunk instead of
// added to.
static int classifier(rl_gpu_model *m, int N, const int32_t *d_tgt, float *dwlm, float loss_scale,
                      int fresh, rl_err *e) {
    const int D = m->D, V = m->V, Vp = m->Vp;
    cudaStream_t s = m->s;
    const bf16 *wlm = wres(m, m->lay.lm_head);
    for (int r0 = 0; r0 < N; r0 += m->bl.crows) {
        int nc = N - r0 < m->bl.crows ? N - r0 : m->bl.crows;
        if (dwlm) {
            RL_TRY(classifier_train(m, r0, nc, d_tgt + r0, dwlm, !fresh || r0 > 0,
                                    loss_scale / (float)N, e));
            continue;
        }
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(nc, Vp, D, 2, 0),
             rl_gemm_fwd(&m->gemm, m->logits, 0, m->lnf + (size_t)r0 * D, wlm, NULL, nc, Vp, D, s,
                         e));
        if (!d_tgt) continue;
        STEP(RL_GPU_PROF_CLASSIFIER, rl_k_xent_cost(nc, V, Vp, 0),
             rl_k_xent(m->logits, m->losses + r0, m->lse_cls + r0, d_tgt + r0, nc, V, Vp,
                       loss_scale / (float)N, 0, s, e));
    }
    return RL_OK;
}

int rl_gpu_model_forward(rl_gpu_model *m, const int32_t *tokens, const int32_t *targets, int B,
                         int T, float *loss, rl_err *e) {
    RL_TRY(begin_forward(m, tokens, targets, B, T, e));
    const int N = B * T;
    RL_TRY(layers_fwd(m, B, T, e));
    RL_TRY(classifier(m, N, targets ? m->io + (size_t)m->B * m->T : NULL, NULL, 1.0f, 0, e));
    m->logits_valid = N <= m->bl.crows;
    if (!targets) {
        if (loss) *loss = 0.0f;
        return RL_OK;
    }
    STEP(RL_GPU_PROF_CLASSIFIER, rl_k_loss_accum_cost(N),
         rl_k_loss_accum(m->scalars + 2, m->losses, N, 1.0f, 1, m->s, e));
    if (!m->plan) {
        CUDA_CHECK(cudaMemcpyAsync(m->pinned_scalars, m->scalars + 2, sizeof(float),
                                   cudaMemcpyDeviceToHost, m->s));
        CUDA_CHECK(cudaEventRecord(m->loss_ready, m->s));
    }
    if (!loss) return RL_OK;
    RL_TRY(host_wait(m, m->loss_ready, e));
    *loss = m->plan ? 0.0f : m->pinned_scalars[0];
    return RL_OK;
}

// ---- backward ----------------------------------------------------------------------------------
// A memset as a step launch: what the embedding's gradient rows need
static int zero_async(void *p, size_t bytes, cudaStream_t s, rl_err *e) {
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s));
    return RL_OK;
}
static rl_k_cost memset_cost(size_t bytes) { return rl_k_cost{0, (double)bytes, 1}; }

// From d(final norm output) in dln back through the layers to the
// embedding; hook as train_micro's. fresh: write the gradients (=). head:
// the head region's gradient (the final norm's first; grad_region).
static int layers_bwd(rl_gpu_model *m, int B, int T, int fresh, float *head, rl_grad_ready_fn hook,
                      void *hook_ctx, rl_err *e) {
    const int N = B * T, D = m->D, F = m->F;
    const size_t cap = (size_t)m->B * m->T;
    cudaStream_t s = m->s;
    rl_gemm *g = &m->gemm;
    const rl_layer_offsets *o = &m->lay.in_layer;
    const rl_param_layout *p = &m->lay;
    const int32_t *d_uniq = m->io + 2 * cap, *d_seg = m->io + 3 * cap, *d_pos = m->io + 4 * cap + 1;
    const int acc = !fresh;

    STEP(RL_GPU_PROF_NORM, rl_k_rmsnorm_bwd_cost(N, D, 0),
         rl_k_rmsnorm_bwd(m->dres, m->dres16, NULL, head, m->rms_partial,
                          m->dln,
                          m->res + (size_t)m->L * m->bl.s_btd, wres(m, p->final_norm), m->rstdf, N,
                          D, 0, acc, s, e));
    if (hook) hook(hook_ctx, p->final_norm);

    for (int l = m->L - 1; l >= 0; l--) {
        size_t wl = p->layers + (size_t)l * p->layer_size;
        const bf16 *w;
        RL_TRY(layer_weights(m, l, l - 1, &w, e));
        float *gw = grad_region(m, wl);
        float *x = m->res + l * m->bl.s_btd, *xmid = m->res_mid + l * m->bl.s_btd;
        bf16 *ln1 = m->ln1 + l * m->bl.s_ln, *ln2 = m->ln2 + l * m->bl.s_ln;
        bf16 *qkv = m->qkv + l * m->bl.s_qkv, *atty = m->atty + l * m->bl.s_att;
        bf16 *gu = m->gu + l * m->bl.s_gu, *hm = m->hm + l * m->bl.s_hm;
        float *rstd1 = m->rstd1 + l * m->bl.s_bt, *rstd2 = m->rstd2 + l * m->bl.s_bt;
        float *lse = m->att_lse + l * m->bl.s_bh;
        const int cb = acc ? 4 : 0; // a weight gradient read before it is added to
        // recompute: the SwiGLU and norm backward kernels write this layer's
        // hm, ln2 and ln1 again (the same bits as the forward), each before
        // the weight gradient that reads it; otherwise they are kept
        const int rc = m->options.recompute;
        const bool rope_at_store = !attn_cudnn(m) && rl_k_attn_rope_fusable(m->hd);

        // mlp; dres holds d x_{l+1} (fp32) and dres16 its bf16 copy
        RL_TRY(mlp_down_bwd(m, m->dgu, rc ? hm : NULL, m->dres16, w + o->wdown, gu, N, e));
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(D, F, N, 4, cb),
             rl_gemm_bwd_weight(g, gw + o->wdown, m->dres16, hm, N, D, F, acc, s, e));
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(N, D, 2 * F, 2, 0),
             rl_gemm_bwd_data(g, m->dln, 0, m->dgu, w + o->wgate, N, 2 * F, D, s, e));
        // the norm's backward writes dres16 (d xmid): the down projection's
        // weight gradient above has read d x_{l+1} already
        STEP(RL_GPU_PROF_NORM, rl_k_rmsnorm_bwd_cost(N, D, rc),
             rl_k_rmsnorm_bwd(m->dres, m->dres16, rc ? ln2 : NULL, gw + o->ln2, m->rms_partial,
                              m->dln, xmid, w + o->ln2, rstd2, N, D, 1, acc, s, e));
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(2 * F, D, N, 4, cb),
             rl_gemm_bwd_weight(g, gw + o->wgate, m->dgu, ln2, N, 2 * F, D, acc, s, e));
        // attention; dres is now d xmid
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(N, m->qd, D, 2, 0),
             rl_gemm_bwd_data(g, m->datty, 0, m->dres16, w + o->wo, N, D, m->qd, s, e));
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(D, m->qd, N, 4, cb),
             rl_gemm_bwd_weight(g, gw + o->wo, m->dres16, atty, N, D, m->qd, acc, s, e));
        if (attn_cudnn(m))
            STEP(RL_GPU_PROF_ATTN_BWD, rl_k_attn_cudnn_bwd_cost(B, T, m->H, m->KV, m->hd),
                 rl_k_attn_cudnn_bwd(m->cudnn, m->dqkv, m->dsum, m->datty, qkv, atty, lse, B, T, s,
                                     e));
        else
            STEP(RL_GPU_PROF_ATTN_BWD, rl_k_attn_bwd_cost(B, T, m->H, m->KV, m->hd, !!m->dq_acc),
                 rl_k_attn_bwd(m->dqkv, m->dsum, m->dq_acc, m->datty, qkv, atty, lse, B, T, m->H,
                               m->KV, m->hd, rope_at_store ? m->rope : NULL,
                               m->cfg.max_position_embeddings, s, e));
        // dq, dk back to the un-rotated q, k (the transposed rotation): by
        // our attention as it stores them where the head dim allows
        if (!rope_at_store)
            STEP(RL_GPU_PROF_ELEMWISE, rl_k_rope_cost(N, m->H + m->KV, m->hd),
                 rl_k_rope(m->dqkv, m->rope, N, T, m->H + m->KV, m->hd, m->C3,
                           m->cfg.max_position_embeddings, 1, s, e));
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(N, D, m->C3, 2, 0),
             rl_gemm_bwd_data(g, m->dln, 0, m->dqkv, w + o->wq, N, m->C3, D, s, e));
        STEP(RL_GPU_PROF_NORM, rl_k_rmsnorm_bwd_cost(N, D, rc),
             rl_k_rmsnorm_bwd(m->dres, m->dres16, rc ? ln1 : NULL, gw + o->ln1, m->rms_partial,
                              m->dln, x, w + o->ln1, rstd1, N, D, 1, acc, s, e));
        STEP(RL_GPU_PROF_GEMM, rl_k_gemm_cost(m->C3, D, N, 4, cb),
             rl_gemm_bwd_weight(g, gw + o->wq, m->dqkv, ln1, N, m->C3, D, acc, s, e));
        if (hook) hook(hook_ctx, wl);
    }
    // the embedding's gradient rows are touched only for tokens in the
    // batch: the rest are cleared here on a step's first micro-batch
    float *gemb = grad_region(m, p->embed);
    if (fresh)
        STEP(RL_GPU_PROF_OPTIMIZER, memset_cost((size_t)m->V * D * sizeof(float)),
             zero_async(gemb, (size_t)m->V * D * sizeof(float), s, e));
    STEP(RL_GPU_PROF_ELEMWISE, rl_k_embed_bwd_cost(N, m->n_uniq, D),
         rl_k_embed_bwd(gemb, m->dres, d_uniq, d_seg, d_pos, d_pos + cap,
                        N < m->V ? N : m->V, D, 1, s, e));
    if (hook) hook(hook_ctx, p->embed);
    return RL_OK;
}

// Everything a micro-batch launches once its batch is on the device.
static int micro_launches(rl_gpu_model *m, int B, int T, float loss_scale, int fresh,
                          rl_grad_ready_fn hook, void *hook_ctx, rl_err *e) {
    const int N = B * T;
    RL_TRY(layers_fwd(m, B, T, e));
    // the backward pass begins (model.h's hook contract: the buffer's length
    // first); a slot's region is written whole each time, never added to
    if (hook) hook(hook_ctx, m->lay.total);
    const int gfresh = fresh || m->slots;
    float *head = grad_region(m, m->lay.final_norm);
    RL_TRY(classifier(m, N, m->io + (size_t)m->B * m->T, head + (m->lay.lm_head - m->lay.final_norm), loss_scale,
                      gfresh, e));
    if (hook) hook(hook_ctx, m->lay.lm_head);
    STEP(RL_GPU_PROF_CLASSIFIER, rl_k_loss_accum_cost(N),
         rl_k_loss_accum(m->scalars, m->losses, N, loss_scale, fresh, m->s, e));
    return layers_bwd(m, B, T, gfresh, head, hook, hook_ctx, e);
}

// Captures the variant's launches into g->exec. Nothing runs while the
// stream captures; on failure the variant stays eager for good, with one
// log line (a capture that fails once fails every time).
static void capture_micro(rl_gpu_model *m, micro_graph *g, float loss_scale, int fresh) {
    cudaGraph_t graph = NULL;
    rl_err err = {};
    int rc = 0;
    cudaError_t ce = cudaStreamBeginCapture(m->s, cudaStreamCaptureModeThreadLocal);
    if (ce == cudaSuccess) {
        rc = micro_launches(m, m->B, m->T, loss_scale, fresh, NULL, NULL, &err);
        ce = cudaStreamEndCapture(m->s, &graph); // ends it whatever happened inside
    }
    if (!rc && ce == cudaSuccess) ce = cudaGraphInstantiate(&g->exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (!rc && ce == cudaSuccess) return;
    (void)cudaGetLastError(); // the capture's error is not the step's
    g->uses = -1, g->exec = NULL;
    char why[320];
    rl_json_escape(why, sizeof why, rc ? err.msg : cudaGetErrorName(ce));
    rl_log(RL_LOG_WARN, "cuda_graph",
           "\"captured\":false,\"msg\":\"micro-batches launch kernel by kernel: %s\"", why);
}

// The micro-batch from its variant's graph when it has one (captured on
// the second use); else launched as it goes.
static int micro_run(rl_gpu_model *m, int B, int T, float loss_scale, int fresh,
                     rl_grad_ready_fn hook, void *hook_ctx, rl_err *e) {
    micro_graph *g = &m->graph[fresh ? 1 : 0];
    // (the legacy default stream, 0, cannot capture)
    if (m->plan || !m->graphs_on || !m->s || hook || m->params_in || m->options.stream_layers || m->prof_on || B != m->B || T != m->T ||
        g->uses < 0)
        return micro_launches(m, B, T, loss_scale, fresh, hook, hook_ctx, e);
    if (g->exec && g->loss_scale != loss_scale) {
        CUDA_CHECK(cudaGraphExecDestroy(g->exec));
        g->exec = NULL, g->uses = 0;
    }
    if (!g->exec && g->uses++ == 0) {
        g->loss_scale = loss_scale;
        return micro_launches(m, B, T, loss_scale, fresh, NULL, NULL, e);
    }
    g->loss_scale = loss_scale; // the scale the graph (if captured now) holds
    if (!g->exec) capture_micro(m, g, loss_scale, fresh);
    if (!g->exec) return micro_launches(m, B, T, loss_scale, fresh, NULL, NULL, e);
    CUDA_CHECK(cudaGraphLaunch(g->exec, m->s));
    m->replays++;
    return RL_OK;
}

int rl_gpu_model_train_micro(rl_gpu_model *m, const int32_t *tokens, const int32_t *targets, int B,
                             int T, float loss_scale, rl_grad_ready_fn hook, void *hook_ctx,
                             rl_err *e) {
    if (!targets && !m->plan) return rl_errf(e, RL_EINTERNAL, "gpu model: training needs targets");
    if (m->slots && (!hook || !m->sink))
        return rl_errf(e, RL_EINTERNAL, "gpu model: gradient slots need the sink and the hook on every micro-batch");
    RL_TRY(begin_forward(m, tokens, targets, B, T, e));
    RL_TRY(micro_run(m, B, T, loss_scale, m->fresh, hook, hook_ctx, e));
    m->fresh = 0;
    return RL_OK;
}

int rl_gpu_model_graphs(rl_gpu_model *m, int on) {
    int was = m->graphs_on;
    m->graphs_on = on;
    return was;
}
long long rl_gpu_model_graph_replays(const rl_gpu_model *m) { return m->replays; }

int rl_gpu_model_zero_grad(rl_gpu_model *m, rl_err *e) {
    (void)e;
    m->fresh = 1;
    return RL_OK;
}

// ---- optimizer ----------------------------------------------------------------------------------
int rl_gpu_model_grad_norm(rl_gpu_model *m, float *norm, rl_err *e) {
    if (m->ranges || !m->grads)
        return rl_errf(e, RL_EINTERNAL, "gpu model: the whole gradient norm with a shard set (or gradient slots)");
    if (m->fresh) return rl_errf(e, RL_EINTERNAL, "gpu model: gradient norm of a step with no micro-batch");
    STEP(RL_GPU_PROF_OPTIMIZER, rl_k_norm_cost(m->lay.total),
         rl_k_norm(m->scalars + 1, m->norm_partial, m->grads, m->lay.total, m->s, e));
    if (!norm) return RL_OK;
    if (!m->plan) {
        CUDA_CHECK(cudaMemcpyAsync(m->pinned_scalars + 1, m->scalars + 1, sizeof(float),
                                   cudaMemcpyDeviceToHost, m->s));
        CUDA_CHECK(cudaEventRecord(m->norm_ready, m->s));
    }
    RL_TRY(host_wait(m, m->norm_ready, e));
    *norm = m->plan ? 0.0f : m->pinned_scalars[1];
    return RL_OK;
}

int rl_gpu_model_adamw(rl_gpu_model *m, const rl_gpu_adamw *a, rl_err *e) {
    if (a->t < 1) return rl_errf(e, RL_EINTERNAL, "adamw: step %lld must count from 1", a->t);
    RL_TRY(master_ready(m, "an AdamW step", e));
    params_wait(m, SIZE_MAX); // it writes the shard's bf16 weights: no gather may still send them
    // The scalars exactly as rl_adamw_update derives them (double, then
    // rounded once), so the CPU and GPU updates differ only by fp32
    // contraction in the kernel.
    double bc1 = 1.0 - pow(a->beta1, (double)a->t), bc2 = 1.0 - pow(a->beta2, (double)a->t);
    rl_k_adamw_args k;
    k.b1 = (float)a->beta1, k.b2 = (float)a->beta2;
    k.c1 = (float)(1.0 - a->beta1), k.c2 = (float)(1.0 - a->beta2);
    k.step = (float)(a->lr / bc1), k.sbc2 = (float)sqrt(bc2), k.eps = (float)a->eps;
    k.decay = (float)(1.0 - a->lr * a->weight_decay);
    k.grad_scale = (float)a->grad_scale;
    k.clip_max = (float)a->clip_max_norm;
    if (m->ranges)
        STEP(RL_GPU_PROF_OPTIMIZER, rl_k_adamw_cost(m->held),
             rl_k_adamw_ranges(m->master, m->params, m->opt, m->opt + m->held,
                               m->shard_grad ? m->shard_grad : m->grads, !!m->shard_grad, m->scalars + 1,
                               &m->lay, m->L, m->D, m->ranges, m->nranges, m->held, &k, m->s, e));
    else
        STEP(RL_GPU_PROF_OPTIMIZER, rl_k_adamw_cost(m->lay.total),
             rl_k_adamw(m->master, m->params, m->opt, m->opt + m->lay.total, m->grads, m->scalars + 1,
                        &m->lay, m->L, m->D, &k, m->s, e));
    return RL_OK;
}

// ---- the step's figures, read late --------------------------------------------------------------
int rl_gpu_model_step_end(rl_gpu_model *m, rl_err *e) {
    int k = (int)(m->steps_ended % 2);
    m->steps_ended++;
    if (m->plan) return RL_OK;
    CUDA_CHECK(cudaMemcpyAsync(m->pinned_scalars + 2 + 2 * k, m->scalars, 2 * sizeof(float),
                               cudaMemcpyDeviceToHost, m->s));
    CUDA_CHECK(cudaEventRecord(m->stats_ready[k], m->s));
    return RL_OK;
}

int rl_gpu_model_step_stats(rl_gpu_model *m, int ago, float *loss, float *norm, rl_err *e) {
    if (ago < 0 || ago > 1 || m->steps_ended <= ago)
        return rl_errf(e, RL_EINTERNAL, "gpu model: no step %d back (%lld ended)", ago,
                       m->steps_ended);
    int k = (int)((m->steps_ended - 1 - ago) % 2);
    RL_TRY(host_wait(m, m->stats_ready[k], e));
    if (m->plan) return *loss = 0, *norm = 0, RL_OK;
    *loss = m->pinned_scalars[2 + 2 * k], *norm = m->pinned_scalars[3 + 2 * k];
    return RL_OK;
}

// ---- the plan -----------------------------------------------------------------------------------
int rl_gpu_model_plan(const rl_model_config *c, int B, int T, const rl_gpu_options *opt, int accum,
                      double peak_flops, double peak_bytes_per_s, rl_gpu_plan *out, rl_err *e) {
    memset(out, 0, sizeof *out);
    if (accum < 1 || !(peak_flops > 0) || !(peak_bytes_per_s > 0))
        return rl_errf(e, RL_EINPUT, "gpu plan: accum %d and the peaks must be positive", accum);
    out->peak_flops = peak_flops, out->peak_bytes_per_s = peak_bytes_per_s;
    rl_gpu_model *m = (rl_gpu_model *)calloc(1, sizeof *m);
    if (!m) return rl_errf(e, RL_ENOMEM, "gpu plan: out of host memory");
    if (opt) m->options = *opt;
    m->plan = out;
    int rc = shape(m, c, B, T, e);
    if (!rc) {
        // addresses for the plan's arithmetic only (nothing is dereferenced):
        // 256-byte aligned as the real carving makes them
        m->params = (bf16 *)(uintptr_t)0x10000000, m->master = (float *)(uintptr_t)0x20000000;
        m->opt = (float *)(uintptr_t)0x30000000, m->grads = (float *)(uintptr_t)0x40000000;
        if (m->options.stream_layers) m->ring = (bf16 *)(uintptr_t)0x70000000;
        place(m, (unsigned char *)(uintptr_t)0x50000000, (unsigned char *)(uintptr_t)0x60000000);
        out->device_bytes = m->bytes;
        rl_gpu_adamw a = {.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                          .weight_decay = 0.1, .t = 1, .grad_scale = 1.0, .clip_max_norm = 1.0};
        rc = rl_gpu_model_zero_grad(m, e);
        for (int k = 0; k < accum && !rc; k++)
            rc = rl_gpu_model_train_micro(m, NULL, NULL, B, T, 1.0f / accum, NULL, NULL, e);
        if (!rc) rc = rl_gpu_model_grad_norm(m, NULL, e);
        if (!rc) rc = rl_gpu_model_adamw(m, &a, e);
        // (a trainer then reads the step before this one, complete by now)
        if (!rc) rc = rl_gpu_model_step_end(m, e);
    }
    rl_gpu_model_free(m);
    return rc;
}

// ---- profile ------------------------------------------------------------------------------------
const char *rl_gpu_prof_name(int cat) {
    static const char *const names[RL_GPU_PROF_N] = {
        "gemm", "attn_fwd", "attn_bwd", "rmsnorm", "elementwise", "classifier", "optimizer"};
    return cat >= 0 && cat < RL_GPU_PROF_N ? names[cat] : "?";
}

int rl_gpu_model_profile(rl_gpu_model *m, int on, rl_err *e) {
    (void)e;
    m->prof_on = on;
    m->prof.used = 0;
    return RL_OK;
}

int rl_gpu_model_profile_read(rl_gpu_model *m, double ms[RL_GPU_PROF_N], int *calls, rl_err *e) {
    for (int c = 0; c < RL_GPU_PROF_N; c++) ms[c] = 0;
    CUDA_CHECK(cudaStreamSynchronize(m->s));
    for (int i = 0; i < m->prof.used; i++) {
        float t;
        CUDA_CHECK(cudaEventElapsedTime(&t, m->prof.r[i].ev[0], m->prof.r[i].ev[1]));
        ms[m->prof.r[i].cat] += t;
    }
    if (calls) *calls = m->prof.used;
    m->prof.used = 0;
    return RL_OK;
}

int rl_gpu_model_stream_waits(rl_gpu_model *m, double *seconds, long long *waits, rl_err *e) {
    *seconds = 0, *waits = 0;
    if (m->plan || !m->waits.used) return RL_OK; /* nothing timed: no reason to wait for the stream */
    CUDA_CHECK(cudaStreamSynchronize(m->s));
    for (int i = 0; i < m->waits.used; i++) {
        float t;
        CUDA_CHECK(cudaEventElapsedTime(&t, m->waits.r[i].ev[0], m->waits.r[i].ev[1]));
        *seconds += t / 1e3;
    }
    *waits = m->waits.used;
    m->waits.used = 0;
    return RL_OK;
}

int rl_gpu_model_sync(rl_gpu_model *m, rl_err *e) {
    CUDA_CHECK(cudaStreamSynchronize(m->s));
    return RL_OK;
}
