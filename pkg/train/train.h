/* train: the job config, AdamW, the LR schedule, clipping, and the training
 * loop (gradient accumulation to a fixed global batch, periodic eval, logs).
 *
 * The loop is written for data parallelism from the start: the data slice a
 * rank reads, the accumulation count and the scale of each micro-step's
 * gradient all derive from (global batch, world size, rank), and gradient
 * reduction enters through rl_train_dist -- a seam the DDP package fills.
 * With no dist attached the trainer is a single process. */
#ifndef RL_TRAIN_H
#define RL_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt.h"
#include "data/data.h"
#include "model/model.h"
#include "rdzv/rdzv.h"
#include "tok/tok.h"
#include "util/util.h"

#define RL_PATH_MAX 1024

typedef struct rl_train_config {
    uint64_t seed;
    long long steps;            /* optimizer steps */
    int seq_len;                /* T */
    int micro_batch;            /* B: sequences per forward, per rank */
    long long global_batch_tokens; /* tokens per optimizer step, all ranks */
    double lr, min_lr;          /* peak and floor */
    long long warmup_steps;
    double weight_decay, beta1, beta2, eps;
    double grad_clip;           /* max global norm; 0 disables */
    long long eval_every;       /* steps; 0: only at the end */
    int eval_batches;           /* micro-batches of the val split per eval */
    long long log_every;
    /* samples on rank 0 (sample.c), as llm.c prints them: every
     * sample_every steps (0: never), each line of sample_prompts continued
     * by sample_tokens tokens */
    long long sample_every;
    char sample_prompts[1024];
    int sample_tokens;
    double sample_temperature; /* 0: greedy */
    int sample_top_k;          /* 0: all */
    /* "auto": the GPU when this build has CUDA and one is visible, else the
     * CPU (saying so in one log line); "cpu"; "cuda" (an error without a
     * GPU). rl_train_pick_device settles it before anything is built. */
    char device[8];
    bool device_picked; /* set by rl_train_pick_device when it resolved "auto" (not JSON) */
    /* Attention on cuda: "auto" (cuDNN when libcudnn.so.9 is there, agrees
     * with our kernels on the model's shapes and is faster; else ours),
     * "cudnn" (an error without it), "own" (our kernels). No effect on cpu. */
    char attention[8];
    /* On cuda: "auto" (our GEMMs with SwiGLU and the classifier's softmax
     * fused in, or cuBLASLt and separate kernels, whichever is faster at
     * each site's first use; rl_gpu_options.fused_gemm), "on" or "off".
     * The same values up to rounding order. No effect on cpu. */
    char fused_gemm[8];
    /* On cuda: keep one layer's norm outputs and SwiGLU product, rebuilt in
     * the backward (rl_gpu_options.recompute), instead of every layer's.
     * The same results bit for bit; no effect on cpu. */
    bool recompute;
    /* On cuda: "none" (the GPU holds the fp32 master and AdamW moments),
     * "optimizer" (they stay in the host's memory, the device seam's host
     * state: the gradients come down, AdamW runs on the CPU and the bf16
     * weights go back up) or "layers" (the decoder layers' bf16 weights
     * stay there too, streamed up as they are read). Refused on cpu and,
     * for now, with dist.shard. */
    char offload[12];
    /* With offload on several ranks of one host (one pod): one copy of the
     * host state in shared memory for all of them, each rank updating its
     * slice (offload.h); false, or ranks on several hosts: a copy each. */
    bool offload_share;
} rl_train_config;
/* The host state offload keeps, a parameter: the fp32 master, the two fp32
 * AdamW moments and a bf16 copy (what a pod's ranks share in /dev/shm) */
#define RL_OFFLOAD_SHARED_BYTES 14

typedef struct rl_data_config {
    char train[RL_PATH_MAX]; /* shard file / glob / comma list */
    char val[RL_PATH_MAX];   /* may be empty: no eval loss */
    char eval_task[32];      /* "" or "arith": exact-match on held-out sums */
    int eval_examples;       /* for eval_task; 0 = all */
    char tokenizer[RL_PATH_MAX]; /* "" (byte-level) or a tokenizer.json */
} rl_data_config;

typedef struct rl_dist_config {
    char backend[16];       /* "auto" (nccl on cuda, tcp on cpu) | "tcp" | "nccl" */
    double timeout_s;       /* every collective and peer wait */
    double bucket_mb, first_bucket_mb;
    int min_buckets;        /* no bucket above 1/min_buckets of the gradients */
    char reduce_dtype[8];   /* "fp32" (default: exact average, as PyTorch DDP) | "bf16" */
    /* ZeRO (pkg/ddp/ddp.h, "Sharded state"): "none" (DDP: every rank holds
     * the whole optimizer state), "optimizer" (ZeRO-1: each rank keeps and
     * updates 1/world of the AdamW moments, the reduced gradients are
     * whole, the updated parameters are all-gathered), "gradients" (ZeRO-2:
     * the buckets are reduce-scattered, each rank keeps its part reduced). */
    char shard[12];
    double hang_factor;     /* a collective running this many median steps is a hang (0: no watch) */
    double hang_min_s;      /* ... and never less than this long (pkg/hang) */
    double straggler_factor; /* a rank this many times the median busy time per step is named (0: never) */
    double preflight_min_ratio; /* a node below this fraction of the median pre-flight is Degraded (0: no check) */
} rl_dist_config;

typedef struct rl_job_config {
    rl_model_config model;
    rl_train_config train;
    rl_data_config data;
    rl_dist_config dist;
    rl_ckpt_config ckpt; /* "checkpoint" section */
    rl_rdzv_config rdzv; /* "rdzv" section */
} rl_job_config;

/* The whole config's descriptor (util/cfg.h): its sections' tables, the
 * one source of defaults, parsing, to_json and the CRD's spec.training
 * schema (--print-schema). */
extern const rl_cfg_section rl_job_config_section;
/* The embedded default: the arithmetic run of `make run`. */
void rl_job_config_default(rl_job_config *c);
/* Parse JSON text over the defaults; `name` (the file) prefixes messages.
 * Unknown fields, wrong types, out-of-range values and inconsistencies
 * (batch not dividing the global batch, seq_len above
 * max_position_embeddings, ...) are RL_EINPUT naming the field. Fuzzed. */
int rl_job_config_parse(const char *text, size_t len, const char *name, rl_job_config *c,
                        rl_err *e);
/* Checks that depend on the world size (accumulation count must be whole). */
int rl_job_config_check_world(const rl_job_config *c, int world, const char *name, rl_err *e);
/* Settle train.device "auto" (cuda when this build has CUDA and a GPU is
 * visible, else cpu) and dist.backend "auto" (nccl on cuda, tcp on cpu).
 * Silent: the trainer logs the device once it is built (and that a CUDA
 * build found no GPU). A "cuda" that cannot be had, or a backend that
 * cannot reduce on the device, is RL_EINPUT naming the field.
 * rl_trainer_new calls it. */
int rl_train_pick_device(rl_job_config *c, rl_err *e);
/* CUDA devices this process sees (0 in a build without CUDA): what
 * --nproc-per-node auto / gpu starts one trainer per. */
int rl_train_visible_gpus(void);
/* The config as JSON (for logs and checkpoints); caller frees. */
char *rl_job_config_to_json(const rl_job_config *c);

/* ---- optimizer pieces (pure functions, unit-tested by hand values) ---------- */
/* Linear warmup from lr/warmup to lr over warmup steps, then cosine decay
 * to min_lr at step `steps`; step counts from 0. */
double rl_lr_at(const rl_train_config *t, long long step);
/* sqrt(sum g^2), accumulated in double over fixed chunks, so the value is
 * the same whatever the thread count. */
double rl_grad_norm(const float *g, size_t n);
double rl_grad_sq(const float *g, size_t n); /* the same sum, before the root */
/* Factor to multiply gradients by: min(1, max_norm / (norm + 1e-6)), as
 * torch.nn.utils.clip_grad_norm_. max_norm <= 0 disables (returns 1). */
double rl_clip_factor(double norm, double max_norm);
/* One AdamW update (PyTorch semantics: decoupled decay p *= 1 - lr*wd, then
 * the bias-corrected Adam step) over n elements. t counts from 1. Each
 * gradient is multiplied by grad_scale first (clipping folded in). */
void rl_adamw_update(float *p, const float *g, float *m, float *v, size_t n, double lr,
                     double beta1, double beta2, double eps, double wd, long long t,
                     double grad_scale);

/* ---- data-parallel seam ------------------------------------------------------------ */
/* dist.shard, parsed (rl_shard_mode_of: the config's names in this order). */
typedef enum { RL_SHARD_NONE = 0, RL_SHARD_OPTIMIZER, RL_SHARD_GRADIENTS } rl_shard_mode;
rl_shard_mode rl_shard_mode_of(const char *name);
/* A rank's part of the flat training state under a sharded mode (pkg/ddp
 * makes it from its buckets): ranges (model.h) in ascending order,
 * disjoint; the shared ones are the fewer-than-world elements a bucket
 * leaves over when it is split world ways. total: the elements of all. */
typedef struct rl_train_shard {
    int n;
    const rl_shard_range *r;
    size_t total;
    /* Where the shard's reduced gradient is after finish. NULL: in the
     * flat gradient buffer at the ranges' offsets. Else total floats, the
     * ranges one after another (the layout of the moments), and the flat
     * buffer is left zero: "gradients" on the host scatters every
     * micro-step's gradients into this and clears them (dist's
     * reduce_each_micro), so no rank holds them whole. Owned by the seam,
     * valid for its round. */
    const float *grad;
} rl_train_shard;

typedef struct rl_train_dist {
    int rank, world;
    int local_rank; /* this process's GPU on its node (LOCAL_RANK) */
    void *ctx;
    /* Called from backward on the last micro-step (on every one with
     * reduce_each_micro): grads[off:] are final. */
    rl_grad_ready_fn grad_ready;
    bool reduce_each_micro;
    /* Wait until every gradient is reduced (averaged over ranks). */
    int (*finish)(void *ctx, rl_err *e);
    /* Average n doubles over ranks in place (metrics). */
    int (*average)(void *ctx, double *v, int n, rl_err *e);
    /* root's bytes to every rank (resume); bytes a multiple of 4. */
    int (*broadcast)(void *ctx, int root, void *buf, size_t bytes, rl_err *e);
    /* Optional: the last step's gradient reduction, exposed after backward
     * and busy in all (seconds), once finish returned. */
    void (*timing)(void *ctx, double *exposed_s, double *busy_s);
    /* Sharded state (dist.shard; NULL: DDP, every rank updates everything).
     * After finish, this rank's ranges of the gradients hold their average
     * (the rest too with "optimizer"); the rank updates only them, and
     * gather brings every rank's updated ranges of params (n elements in
     * the model's layout, the device's: fp32, or bf16 2-byte ones) to
     * every rank. sum adds n doubles over
     * ranks in place (the gradient norm's partial sums). On a device with
     * a stream (train.device cuda) both buffers are device memory and both
     * calls stream-ordered: they follow the work queued on that stream, it
     * follows them, and they return once queued. */
    const rl_train_shard *shard;
    int (*sum)(void *ctx, double *v, int n, rl_err *e);
    int (*gather)(void *ctx, void *params, bool bf16, rl_err *e);
    /* On a device with a stream: gather returns with the buffer still
     * arriving; gathered(ctx, upto) makes the stream wait for elements
     * [0, upto) of it (SIZE_MAX: all), so a forward reads each layer as
     * soon as its part is in. NULL: gather returns with all of it. */
    void (*gathered)(void *ctx, size_t upto);
    /* gather over the elements [off, off + len) only, buf holding that
     * window (a device's master comes back whole region by region); returns
     * with all of it. */
    int (*gather_region)(void *ctx, void *buf, size_t off, size_t len, bool bf16, rl_err *e);
    /* A GPU whose gradients are written in slots (dist.shard "gradients",
     * shard->grad then device memory; or train.offload "layers" on several
     * ranks, with reduced below): the model calls it before it
     * writes a region into a slot (kernels/llama_gpu.h's rl_gpu_slot_fn).
     * NULL: the gradients have their buffer. */
    void (*grad_slot)(void *ctx, size_t off, float *slot);
    /* Slots whose regions are averaged in place, nothing kept (no shard: a
     * GPU whose gradients then leave it, train.offload "layers"): after the
     * hook handed the region at off over, `stream` (a cudaStream_t) waits
     * for its average; whoever takes it away orders the slot's next
     * grad_slot after that. NULL: the seam keeps what it reduces. */
    void (*reduced)(void *ctx, size_t off, void *stream);
    /* Optional, with reduced, between steps: from the next step on the
     * caller reads only its block of each region's average (the last rank
     * its block and the tail: rl_comm_reduce_scatter's split), so the seam
     * may reduce-scatter instead of allreduce. Until a new seam. */
    void (*split)(void *ctx);
    /* Optional: the most gradient memory this rank held at once in the
     * last step, measured (resident pages of the flat buffer, sampled at
     * every watermark, plus the shard's gradient); 0: not measured. */
    size_t (*grad_resident)(void *ctx);
} rl_train_dist;

/* ---- the trainer ---------------------------------------------------------------------- */
typedef struct rl_step_stats {
    long long step;   /* 1-based: optimizer steps completed */
    double loss;      /* mean over the global batch */
    double lr, grad_norm;
    double tokens_per_s, elapsed_s, step_s;
    double allreduce_s;      /* the step waited this long for reduction after backward; -1: no dist */
    double allreduce_busy_s; /* the reduction's whole time, overlapped or not; -1: no dist */
    size_t grad_resident;    /* the dist seam's grad_resident (bytes); 0: not measured */
    /* exposed waiting on a GPU (rl_train_dev_waits): its compute stream
     * on copies up/down or a sharded step's collectives, the training
     * thread on train.offload's host update and copies; -1: none */
    double stream_wait_s, host_wait_s;
} rl_step_stats;

/* A committed checkpoint (rank 0 only: it is the one that commits). */
typedef struct rl_train_ckpt_event {
    long long step;
    double seconds;    /* snapshot to commit; -1 for the checkpoint a run resumed from */
    double unix_time;  /* when it was committed */
    bool resumed;      /* the checkpoint this run started from, not a new save */
    char uri[RL_CKPT_URI_MAX + 32]; /* <checkpoint.uri>/step-NNNNNNNN */
} rl_train_ckpt_event;

/* Optional callbacks on the training thread, for metrics: after every
 * optimizer step (every rank), and when a checkpoint is known committed
 * (seen at the next step boundary for an asynchronous save, at once for a
 * synchronous one). They must return quickly and never block. */
typedef struct rl_train_observer {
    void *ud;
    void (*on_step)(void *ud, const rl_step_stats *st);
    void (*on_checkpoint)(void *ud, const rl_train_ckpt_event *ev);
} rl_train_observer;

/* Model FLOPs of one trained token, forward and backward, as in PaLM's
 * appendix B and nanoGPT/llm.c's MFU estimate: 6 x N (N = the parameters
 * that multiply: all but the input embedding table, a lookup; lm_head is
 * untied and counts) plus 12 x L x (heads x head_dim) x T for attention
 * scores and values over the full T x T (no discount for the causal
 * mask, as those estimates do). Recomputation and optimizer FLOPs are not
 * model FLOPs. */
double rl_train_flops_per_token(const rl_model_config *m, int seq_len, size_t nparams);

/* Greedy completion of "a+b=" prompts for the lines of the val split
 * (held-out pairs): exact-match counts and a few examples to show.
 * max_examples 0 = all. */
typedef struct rl_arith_result {
    int correct, total;
    int n_shown;
    char shown[6][80]; /* "37+48=85 ok" / "37+48=84 (want 85)" */
} rl_arith_result;
/* Results of the last run's final evaluation. */
typedef struct rl_run_summary {
    double unigram_entropy;        /* of the train split: the no-context baseline */
    double final_loss, val_loss;   /* val_loss < 0: no val split */
    double tokens_per_s, elapsed_s;
    bool has_arith;
    rl_arith_result arith;
    uint64_t data_count, data_sum; /* this rank's rl_loader_digest at the end */
    long long resumed_from;        /* checkpoint step resumed from; -1: fresh start */
    bool preempted;                /* stopped by a signal at a step boundary */
    bool preempt_saved;            /* ... and a checkpoint of that step is committed */
    bool yielded;                  /* left the round at a step boundary, state kept (rl_trainer_set_yield) */
} rl_run_summary;

/* The trainer is opaque outside pkg/train (trainer_internal.h holds it):
 * what runs where (device.h) and the loop's state are its own business. */
typedef struct rl_trainer rl_trainer;

/* Settle the device (rl_train_pick_device), build the model on it
 * (params initialised from the seed), open the data. *out is NULL on
 * failure. dist (NULL: one process) must outlive the trainer. */
int rl_trainer_new(rl_trainer **out, const rl_job_config *cfg, rl_train_dist *dist, rl_err *e);
/* Waits for a running checkpoint save; NULL is fine. */
void rl_trainer_free(rl_trainer *tr);
/* One optimizer step: accum micro-batches of forward + backward, reduce,
 * clip, AdamW. */
int rl_trainer_step(rl_trainer *tr, rl_step_stats *st, rl_err *e);
/* Mean loss over eval_batches micro-batches of the val split (fixed
 * samples, the same every time). */
int rl_trainer_eval_loss(rl_trainer *tr, double *loss, rl_err *e);
/* The whole run: steps, periodic eval, final eval (and the eval task). */
int rl_trainer_run(rl_trainer *tr, rl_err *e);

/* Set after rl_trainer_new, before running: a flag set asynchronously (a
 * signal) that stops the run at the next step boundary, and the observer
 * (copied; zero: none). */
void rl_trainer_set_stop(rl_trainer *tr, const volatile int *stop);
/* A flag set asynchronously (the agent's "yield": the round ends with every
 * member alive) that ends the run after the next step every rank agrees on,
 * without a checkpoint: rl_trainer_run returns RL_EABORT with
 * summary.yielded, the state whole for the next world (rl_trainer_set_dist). */
void rl_trainer_set_yield(rl_trainer *tr, const volatile int *yield);
void rl_trainer_set_observer(rl_trainer *tr, const rl_train_observer *o);
/* The job config as the trainer runs it (device and backend settled). */
const rl_job_config *rl_trainer_config(const rl_trainer *tr);
int rl_trainer_world(const rl_trainer *tr);   /* 1 without a dist */
long long rl_trainer_steps_done(const rl_trainer *tr); /* optimizer steps, resumed ones included */
uint64_t rl_trainer_sample_index(const rl_trainer *tr); /* global index of the next step's first sample */
uint64_t rl_trainer_tokens_seen(const rl_trainer *tr);  /* tokens trained on, resumed ones included */
double rl_trainer_flops_per_token(const rl_trainer *tr); /* rl_train_flops_per_token of this model */
/* Results of the run so far (final once rl_trainer_run returned). */
const rl_run_summary *rl_trainer_summary(const rl_trainer *tr);
/* The host's copy of the parameters (n floats in the model's layout) and
 * of the AdamW moments (m then v, 2 x n; with dist.shard the shard's
 * ranges only, once resumed): the model's own on the CPU, on a GPU a
 * mirror that rl_trainer_sync_host refreshes. */
size_t rl_trainer_nparams(const rl_trainer *tr);
float *rl_trainer_params(rl_trainer *tr);
float *rl_trainer_opt(rl_trainer *tr);
/* The checkpoint store and saver (rank 0 with checkpoint.uri set; else
 * NULL), for tests and benchmarks that inspect saves. */
rl_ckpt_store *rl_trainer_store(rl_trainer *tr);
rl_ckpt_saver *rl_trainer_saver(rl_trainer *tr);

/* ---- checkpoints (rank 0 commits; with dist.shard every rank writes its shard) ----------
 * Resume: rank 0 loads the newest checkpoint that verifies (pkg/ckpt) and
 * broadcasts step, data position, RNG, parameters and AdamW moments through
 * dist->broadcast (with dist.shard each rank reads its own ranges of the
 * moments instead); every rank then reads from the restored global sample
 * index. Called by rl_trainer_run if not called before; a no-op without
 * checkpoint.uri or with resume false (which refuses a URI that already
 * holds checkpoints). With dist.shard it first shrinks the moments to the
 * rank's shard (the seam's, attached after rl_trainer_new).
 * A live resume comes first: when any rank holds a replica from an
 * earlier round of its process (rl_trainer_set_dist), the lowest rank of
 * the most advanced ones broadcasts its state to the others (new processes
 * included) and no checkpoint is read. With nothing to resume, rank 0's
 * initial parameters go to every rank. */
int rl_trainer_resume(rl_trainer *tr, rl_err *e);
/* The process goes on in a new world after its peers changed (in-place
 * recovery): same device, new rank, world and seam; the accumulation count
 * and this rank's data slice follow the world, the checkpoint store goes
 * with rank 0, and the next rl_trainer_run resumes (live first). The old
 * seam's communicator must be gone; the state stays as the last whole step
 * left it. */
int rl_trainer_set_dist(rl_trainer *tr, rl_train_dist *dist, rl_err *e);
/* At a step boundary: report a failed background save (fails the run) and
 * start the save the cadence asks for (asynchronous). */
int rl_trainer_boundary(rl_trainer *tr, rl_err *e);
/* Synchronous checkpoint of the current step (waits for a running save
 * first; deadline in rl_now() terms, 0: none). No-op if already committed. */
int rl_trainer_checkpoint(rl_trainer *tr, double deadline, rl_err *e);
/* Replace the checkpoint store (takes ownership; tests wrap stores). */
int rl_trainer_use_store(rl_trainer *tr, rl_ckpt_store *s, rl_err *e);
/* Raw little-endian fp32 parameters (the whole buffer), written atomically
 * by rank 0; every rank calls it (sharded weights are gathered); for tests
 * and tools. */
int rl_trainer_save_params(rl_trainer *tr, const char *path, rl_err *e);
/* The gradients DDP reduces (device memory on a GPU) and the stream the
 * backward runs on (a cudaStream_t; NULL on the CPU). */
float *rl_trainer_grads(rl_trainer *tr);
void *rl_trainer_stream(rl_trainer *tr);
/* Where there is no gradient buffer (NULL grads: a GPU's gradient slots,
 * dist.shard "gradients", or train.offload on several ranks), DDP's
 * buckets must be the model's gradient regions: their starts, ascending,
 * *n of them (rl_ddp_opts.regions). NULL (and *n 0) where the gradients
 * have a buffer, and with train.offload on one rank (its slots go to the
 * host: DDP reduces nothing). */
const size_t *rl_trainer_grad_regions(rl_trainer *tr, int *n);
/* Rank 0's parameters to every rank through dist->broadcast (identical
 * replicas before the first step); rl_trainer_resume does it when there is
 * nothing to resume, so a caller of rl_trainer_run need not. */
int rl_trainer_broadcast_params(rl_trainer *tr, rl_err *e);
/* ---- samples: a prompt continued (sample.c) ----------------------------------------- */
typedef struct rl_sample_opts {
    int max_new_tokens;
    double temperature; /* 0: greedy (argmax, ties to the lowest id) */
    int top_k;          /* with temperature > 0: draw among the k likeliest; 0: all */
    uint64_t seed;      /* the draws' own stream */
    int64_t eos_id;     /* stop after this token; -1: never */
} rl_sample_opts;
/* What a sample runs on: a model that gives the logits of the last of T
 * tokens (T <= window), on the CPU or a GPU. The logits stay valid until
 * the next call. */
typedef struct rl_lm rl_lm;
struct rl_lm {
    int vocab, window;
    int (*last_logits)(rl_lm *lm, const int32_t *tok, int T, const float **logits, rl_err *e);
    void (*close)(rl_lm *lm); /* NULL: nothing to free */
    void *impl;
    float *row; /* a GPU's logits, copied to the host */
};
/* The CPU model m (batch >= 1; its T is the window). */
void rl_lm_cpu(rl_model *m, rl_lm *out);
/* A batch-1 GPU model of config c on the current device, from host fp32
 * params [layout total], window tokens (bf16 weights and logits, as the
 * GPU trainer computes). A build without CUDA: RL_EINPUT. */
int rl_lm_gpu(const rl_model_config *c, const float *params, int window, rl_lm *out, rl_err *e);
void rl_lm_close(rl_lm *lm);
/* Continue prompt[0..n) on lm (longer texts slide through its window).
 * *out (malloc'ed, *nout ids) is the prompt and what followed. RL_EINPUT
 * for an empty prompt or an id outside the vocabulary. */
int rl_sample(rl_lm *lm, const int32_t *prompt, int n, const rl_sample_opts *o, int32_t **out, int *nout,
              rl_err *e);
/* The same from text: a document boundary as training saw it (rl_bpe_frame's
 * fr->after then fr->before: Llama 3's BOS, GPT-2's end of text) then the prompt
 * through bpe (special tokens in it are tokens; NULL: bytes), continued;
 * *text (malloc'ed, *len bytes, NUL after) is the prompt and its
 * continuation decoded, without the frame and the EOS that stopped it. */
int rl_sample_text(rl_lm *lm, const rl_bpe *bpe, const rl_doc_frame *fr, const char *prompt,
                   const rl_sample_opts *o, char **text, size_t *len, rl_err *e);
/* `ringleader-worker generate`: the prompt continued by the model of a
 * checkpoint (file or s3 URI; step < 0: the newest committed), on device
 * "cpu", "cuda" (GPU 0) or "auto" (a GPU when one is visible), through the
 * tokenizer it carries (none: bytes); o->eos_id is ignored (its
 * config.json's is used). */
int rl_generate(const char *uri, long long step, const char *device, const char *prompt, const rl_sample_opts *o,
                char **text, size_t *len, rl_err *e);

/* On a GPU: the device's master weights (and with opt the AdamW moments)
 * into the host mirror (rl_trainer_params / rl_trainer_opt). No-op on the
 * CPU. With dist.shard on a GPU the master is gathered from every rank's
 * shard: a collective, every rank calls it. */
int rl_trainer_sync_host(rl_trainer *tr, bool opt, rl_err *e);

int rl_eval_arith(rl_model *m, rl_dataset *val, int max_examples, rl_arith_result *r, rl_err *e);

#endif
