/* The trainer's device seam (internal to pkg/train): everything in a step
 * that depends on where the model lives goes through one table of
 * operations, so trainer.c is one loop for every device and never asks
 * which one it runs on.
 *
 * Implementations: cpu.c (the CPU reference model, pkg/model) and gpu.c
 * (the CUDA model of kernels/llama_gpu.h). device.c is the dispatcher, as
 * comm.c is for the collectives: it picks the implementation from
 * train.device, checks arguments and the order of a step's calls once for
 * all of them, and keeps what they share (the host's AdamW moments); an
 * implementation only computes and moves data.
 *
 * Sharded state (dist.shard, ZeRO-1/2) is a property of the update, not a
 * device: with a shard set (rl_train_dev_set_shard) the moments hold only
 * the shard's ranges, and step_end takes the norm from partial sums, runs
 * AdamW on the shard and gathers the parameters through the update's
 * callbacks. The reduction itself is DDP's (pkg/ddp).
 *
 * train.offload plugged in here, not in trainer.c: gpu.c's second table
 * of ops over the same GPU model, whose host state (params, opt below) is
 * the master copy rather than a mirror (offload.h), with the optional
 * ops share, unshare and settle for what only it needs. */
#ifndef RL_TRAIN_DEVICE_H
#define RL_TRAIN_DEVICE_H

#include "train.h"

/* One optimizer step's AdamW settings (betas, eps and weight decay come
 * from the job config the device was opened with). */
typedef struct rl_train_update {
    double lr;   /* this step's learning rate (the schedule's) */
    double clip; /* max global gradient norm; <= 0: no clipping */
    long long t; /* AdamW's step count, from 1 */
    /* With a shard (rl_train_dev_set_shard): the seam's sum and gather
     * (rl_train_dist), called with dist_ctx. */
    void *dist_ctx;
    int (*sum)(void *ctx, double *v, int n, rl_err *e);
    int (*gather)(void *ctx, void *params, bool bf16, rl_err *e);
} rl_train_update;

typedef struct rl_train_device rl_train_device;

typedef struct rl_train_device_ops {
    /* Every op gets an open device; the dispatcher (device.c) has checked
     * the pointers and sizes each comment names, and the order of a step:
     * zero_grad, micro once or more, step_end. */

    /* Start a step: the next micro-batch's gradients replace the last
     * step's (the device may clear nothing if its first backward writes
     * rather than adds), and the step's loss starts from zero. */
    int (*zero_grad)(rl_train_device *d, rl_err *e);
    /* Forward over one micro-batch (micro_batch x seq_len tokens, non-NULL)
     * and backward with grads (+)= d(loss * scale)/dparams, scale > 0 and
     * finite; hook (may be NULL) is called with hook_ctx as gradients
     * become final (rl_grad_ready_fn). The loss is kept for step_end: the
     * device may leave it where it was computed, unwaited. */
    int (*micro)(rl_train_device *d, const int32_t *inputs, const int32_t *targets, float scale,
                 rl_grad_ready_fn hook, void *hook_ctx, rl_err *e);
    /* The step's end, after gradients are reduced: the global gradient
     * norm, clipping to u->clip and AdamW. *loss is the mean of the step's
     * micro-batch losses, *norm the norm before clipping. A non-finite
     * norm leaves the weights and moments alone, so the trainer's check
     * that follows stops a run whose weights are intact. With a shard,
     * only its ranges of the gradients are read and of the weights
     * updated: the norm's square is their sum over ranks (u->sum, shared
     * ranges counted by rank 0 alone), and u->gather completes the
     * weights; every rank sees the same norm, so all skip or none. */
    int (*step_end)(rl_train_device *d, const rl_train_update *u, double *loss, double *norm,
                    rl_err *e);
    /* Mean loss of one forward, no backward, over B x T tokens (1 <= B <=
     * micro_batch, 1 <= T <= seq_len, buffers non-NULL). */
    int (*eval)(rl_train_device *d, const int32_t *inputs, const int32_t *targets, int B, int T,
                float *loss, rl_err *e);
    /* The gradient buffer DDP reduces in place (in the model's layout; on
     * a GPU device memory) and the stream backward runs on (a
     * cudaStream_t; NULL where there is none). */
    float *(*grads)(rl_train_device *d);
    void *(*stream)(rl_train_device *d);
    /* The checkpoint saver's snapshot (rl_ckpt_data.take / fill): take runs
     * in the pause at a step boundary and either fills params/m/v (n floats
     * each, non-NULL; with a shard m and v hold its elements and params is
     * NULL on a rank that saves no weights) or stages the state and sets
     * *later; fill, called
     * only after a take that set *later, completes the host snapshot on
     * the saver's thread while training goes on (NULL: take never defers).
     * A device whose host state is the truth takes with
     * rl_train_host_take. */
    int (*take)(rl_train_device *d, float *params, float *m, float *v, bool *later, rl_err *e);
    int (*fill)(rl_train_device *d, float *params, float *m, float *v, rl_err *e);
    /* Host state <-> the device's: the master weights (and with opt the
     * AdamW moments) into params / opt below, or from them. No-ops where
     * the host state is the device's own. */
    int (*download)(rl_train_device *d, bool opt, rl_err *e);
    int (*upload)(rl_train_device *d, bool opt, rl_err *e);
    /* The dispatcher has set d->shard (NULL: none) and sized d->opt to it:
     * fit the device's own moments (zero). NULL: it keeps none of its own. */
    int (*set_shard)(rl_train_device *d, rl_err *e);
    /* Optional: issue now the collectives the device would issue within
     * its next forward (train.offload with a shard: the gathers of the
     * update's weights), before the ranks' paths part (an evaluation that
     * gives some ranks no batch, rank 0's own work). A collective. */
    int (*settle)(rl_train_device *d, rl_err *e);
    /* Optional: the last step's exposed waiting, read once step_end
     * returned -- how long the device's compute stream stood waiting on
     * copies or collectives (stream_s) and the training thread on the
     * device's own pipeline (host_s: train.offload's update and copies);
     * left < 0 where there is nothing of the kind. */
    void (*waits)(rl_train_device *d, double *stream_s, double *host_s);
    /* Optional (train.offload): the ranks of dist's round, whose host states
     * are equal (after the resume), keep one of them for all when they can
     * (a collective: every rank calls it); and before a new round each
     * takes a private copy back, *whole false when that copy is not one
     * step's state (a rank's part of the last update is missing). */
    int (*share)(rl_train_device *d, const rl_train_dist *dist, rl_err *e);
    int (*unshare)(rl_train_device *d, bool *whole, rl_err *e);
    /* Release everything the implementation's open made (impl, params). */
    void (*close)(rl_train_device *d);
} rl_train_device_ops;

struct rl_train_device {
    const rl_train_device_ops *ops; /* NULL: not open */
    void *impl;                     /* the implementation's own context */
    const rl_job_config *cfg;       /* the trainer's settled config; outlives the device */
    /* The host's copy of the training state in the model's layout: what
     * checkpoints, resume, evaluation tasks and the parameter broadcast
     * read and write. On the CPU it is the model's own; on a GPU a mirror,
     * current after download. params belongs to the implementation, opt
     * (m then v, 2 x n floats, zero at open) to the dispatcher, unless the
     * implementation's open set it (impl_opt: train.offload's host state,
     * which no shard replaces). */
    size_t n;
    float *params;
    float *opt;
    bool impl_opt;
    int micros; /* micro-batches since zero_grad (the dispatcher's count) */
    /* NULL: opt holds every element's moments (m then v, 2 x n). Else the
     * shard's ranges' only, one after the other (m then v, 2 x
     * shard->total): sharded state, rl_train_dev_set_shard. */
    const rl_train_shard *shard; /* &own_shard or NULL */
    rl_train_shard own_shard;
    rl_shard_range *ranges;      /* own_shard's, a copy of the seam's */
    int rank; /* with a shard: this rank (the one that counts shared ranges in the norm) */
    /* with a shard: the seam's gather and its ctx, the shard's round's (set
     * again with each round's shard). A device whose master is sharded (a
     * GPU's) gathers it whole with them to download it and to checkpoint:
     * then download and take are collectives, every rank calls them. */
    int (*gather)(void *ctx, void *params, bool bf16, rl_err *e);
    void (*gathered)(void *ctx, size_t upto); /* the seam's: NULL where gather returns with all of it */
    int (*gather_region)(void *ctx, void *buf, size_t off, size_t len, bool bf16, rl_err *e);
    void (*grad_slot)(void *ctx, size_t off, float *slot); /* the seam's (a GPU's gradient slots) */
    void *gather_ctx;
    int world; /* the ranks at open: a GPU sizes the moments for the shard dist.shard will give it */
    /* the trainer's seam (NULL: alone): a device that takes its gradients
     * away region by region (train.offload "layers") reads its grad_slot,
     * grad_ready and reduced at every micro-batch, whatever round is on */
    const rl_train_dist *dist;
};

/* Open the device train.device names ("cpu" or "cuda"; rl_train_pick_device
 * has settled "auto") for cfg's model at micro_batch x seq_len. The caller
 * then fills the host parameters (d->params) and uploads them
 * (rl_train_dev_upload); the moments start at zero on both sides.
 * local_rank is the GPU to use, world the ranks the job starts with. On
 * failure nothing is left open. */
int rl_train_dev_open(rl_train_device *d, const rl_job_config *cfg, int local_rank, int world, rl_err *e);
/* Idempotent; a device never opened (all zero) is fine. */
void rl_train_dev_close(rl_train_device *d);

/* The dispatcher's entry points, one per op (see the table above). take and
 * fill have rl_ckpt_data's shape: ctx is the rl_train_device. */
int rl_train_dev_zero_grad(rl_train_device *d, rl_err *e);
int rl_train_dev_micro(rl_train_device *d, const int32_t *inputs, const int32_t *targets,
                       float scale, rl_grad_ready_fn hook, void *hook_ctx, rl_err *e);
int rl_train_dev_step_end(rl_train_device *d, const rl_train_update *u, double *loss,
                          double *norm, rl_err *e);
int rl_train_dev_eval(rl_train_device *d, const int32_t *inputs, const int32_t *targets, int B,
                      int T, float *loss, rl_err *e);
float *rl_train_dev_grads(rl_train_device *d);
void *rl_train_dev_stream(rl_train_device *d);
int rl_train_dev_take(void *ctx, float *params, float *m, float *v, bool *later, rl_err *e);
int rl_train_dev_fill(void *ctx, float *params, float *m, float *v, rl_err *e);
int rl_train_dev_download(rl_train_device *d, bool opt, rl_err *e);
/* The ops' waits, -1 each where the device has none. */
void rl_train_dev_waits(rl_train_device *d, double *stream_s, double *host_s);
int rl_train_dev_upload(rl_train_device *d, bool opt, rl_err *e);
/* The op's settle; nothing where there is none. Every rank calls it. */
int rl_train_dev_settle(rl_train_device *d, rl_err *e);
/* The ops' share and unshare; nothing (and *whole true) where there are none. */
int rl_train_dev_share(rl_train_device *d, const rl_train_dist *dist, rl_err *e);
int rl_train_dev_unshare(rl_train_device *d, bool *whole, rl_err *e);
/* Keep the optimizer state of dist->shard's ranges only (dist or its shard
 * NULL: of every element), as rank dist->rank: the moments start again
 * from zero, so only before the first step or a resume that fills them
 * (and uploads the weights: a sharded master keeps its values only when it
 * was whole). The device copies the ranges (the seam's end with its
 * round). A failure leaves the device fit only for close. */
int rl_train_dev_set_shard(rl_train_device *d, const rl_train_dist *dist, rl_err *e);

/* The host's optimizer over d's ranges (all of them without a shard), for
 * an implementation whose AdamW runs on the CPU: AdamW on params with
 * grads (those of [from, to), grads[0] element from's; with a shard its
 * own gradient instead) and d->opt, every gradient times grad_scale, over
 * the elements in [from, to) (0, n: all);
 * and the squared gradient norm, with a shard
 * its ranges' summed over ranks through u->sum (a shared range counted by
 * rank 0 alone). */
void rl_train_host_adamw(rl_train_device *d, const rl_train_update *u, float *params, const float *grads,
                         double grad_scale, size_t from, size_t to);
int rl_train_host_grad_sq(rl_train_device *d, const rl_train_update *u, const float *grads, double *sq, rl_err *e);
/* The checkpoint's snapshot of the host state itself (d->params, d->opt:
 * the moments d holds), copied in the pause. */
void rl_train_host_take(const rl_train_device *d, float *params, float *m, float *v);

/* Implementations' opens, called by rl_train_dev_open with d->cfg set:
 * fill ops, impl, n and params (host, n floats), or leave d untouched and
 * release what they made. A build without CUDA has rl_train_gpu_open
 * report that (rl_train_pick_device refuses "cuda" before). */
int rl_train_cpu_open(rl_train_device *d, rl_err *e);
int rl_train_gpu_open(rl_train_device *d, int device, rl_err *e);

#endif
