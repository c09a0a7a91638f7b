/* The trainer on a CUDA device: the model of kernels/llama_gpu.h behind the
 * device seam (device.h), and the device choice (rl_train_pick_device).
 *
 * Why a separate file: everything that needs the CUDA headers stays here
 * and in kernels/, and trainer.c stays one loop for every device.
 *
 * Synchronisation per optimizer step: one wait, after AdamW is queued, for
 * the step's loss and gradient norm (the log, the ranks' agreement and the
 * non-finite check need them on the host). Clipping is computed on the
 * device from the norm there (torch.nn.utils.clip_grad_norm_'s factor, in
 * fp32), and a non-finite norm makes the AdamW kernel leave the weights
 * alone, so the check that follows stops a run whose weights are intact. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "memory.h"
#include "offload.h"
#include "train_gpu.h"

#ifdef RL_CUDA
#include <cuda_runtime_api.h>

#include "kernels/gpu.h"
#include "kernels/gpu_layout.h"
#include "kernels/llama_gpu.h"

/* The device's context; the host mirror of the master weights is the
 * device's params (malloc'ed here). */
typedef struct gpu_dev {
    rl_gpu_model *model;
    cudaStream_t stream; /* everything of the model runs on it */
    int device;
    float *ckpt;             /* device staging of a checkpoint (params + both moments), or NULL */
    size_t ckpt_floats;      /* its size */
    cudaEvent_t ckpt_ready;  /* the staging copy is done */
    bool ckpt_off;           /* no staging: no room on the GPU, or RL_GPU_CKPT_STAGE=0 */
    rl_offload *off;         /* train.offload: the host's update (offload.h) */
    bool layers;             /* train.offload "layers": the model streams its layers from it */
    double stream_wait_s, host_wait_s; /* the last step's (waits); < 0: none */
} gpu_dev;

static gpu_dev *ctx(rl_train_device *d) { return d->impl; }

int rl_train_gpu_count(char *name, size_t n) { return rl_gpu_device_count(name, n); }

/* The step's waits, read at its end (the stream is done by then). */
static int read_waits(rl_train_device *d, rl_err *e) {
    gpu_dev *g = ctx(d);
    double s;
    long long n;
    int rc = rl_gpu_model_stream_waits(g->model, &s, &n, e);
    g->stream_wait_s = rc || !n ? -1 : s;
    g->host_wait_s = g->off ? rl_offload_host_wait(g->off) : -1;
    return rc;
}

static void gpu_waits(rl_train_device *d, double *stream_s, double *host_s) {
    *stream_s = ctx(d)->stream_wait_s, *host_s = ctx(d)->host_wait_s;
}

static int gpu_zero_grad(rl_train_device *d, rl_err *e) { return rl_gpu_model_zero_grad(ctx(d)->model, e); }

/* the loss stays on the device (nothing waits) */
static int gpu_micro(rl_train_device *d, const int32_t *inputs, const int32_t *targets, float scale,
                     rl_grad_ready_fn hook, void *hook_ctx, rl_err *e) {
    const rl_train_config *t = &d->cfg->train;
    return rl_gpu_model_train_micro(ctx(d)->model, inputs, targets, t->micro_batch, t->seq_len, scale,
                                    hook, hook_ctx, e);
}

/* Norm, clipping and AdamW all queued, then the step's one wait for its
 * loss (the micro-batches' scaled sum) and gradient norm. With a shard the
 * seam's sum and gather are queued in between: the squared norm summed
 * over ranks before the clipping reads it, the updated bf16 weights
 * gathered before the next forward (the seam orders its collectives after
 * the model's stream and the stream after them, on the GPU). */
static int gpu_step_end(rl_train_device *d, const rl_train_update *u, double *loss, double *norm,
                        rl_err *e) {
    const rl_train_config *t = &d->cfg->train;
    rl_gpu_model *g = ctx(d)->model;
    rl_gpu_adamw a = {.lr = u->lr,
                      .beta1 = t->beta1,
                      .beta2 = t->beta2,
                      .eps = t->eps,
                      .weight_decay = t->weight_decay,
                      .t = u->t,
                      .grad_scale = 1.0,
                      .clip_max_norm = u->clip};
    float l = 0, n = 0;
    double *sq;
    int rc = d->shard ? rl_gpu_model_shard_sq(g, &sq, e) : rl_gpu_model_grad_norm(g, NULL, e);
    if (!rc && d->shard) rc = u->sum(u->dist_ctx, sq, 1, e);
    if (!rc && d->shard) rc = rl_gpu_model_shard_norm(g, e);
    if (!rc) rc = rl_gpu_model_adamw(g, &a, e);
    if (!rc && d->shard) rc = u->gather(u->dist_ctx, rl_gpu_model_params(g), true, e);
    if (!rc) rc = rl_gpu_model_step_end(g, e);
    if (!rc) rc = rl_gpu_model_step_stats(g, 0, &l, &n, e);
    if (!rc) rc = read_waits(d, e);
    *loss = l, *norm = n;
    return rc;
}

static int gpu_eval(rl_train_device *d, const int32_t *inputs, const int32_t *targets, int B, int T,
                    float *loss, rl_err *e) {
    return rl_gpu_model_forward(ctx(d)->model, inputs, targets, B, T, loss, e);
}

/* The whole fp32 master on the device: with a shard every rank's ranges
 * gathered into the gradient buffer (a collective: every rank calls it at
 * the same point, between steps). */
static int master_whole(rl_train_device *d, float **whole, rl_err *e) {
    int rc = rl_gpu_model_master_whole(ctx(d)->model, whole, e);
    if (!rc && d->shard) rc = d->gather(d->gather_ctx, *whole, false, e);
    if (!rc && d->shard && d->gathered) d->gathered(d->gather_ctx, SIZE_MAX); /* all of it, before the copies */
    return rc;
}

/* With gradient slots there is no whole fp32 buffer to gather into: the
 * master comes to host (NULL: this rank only takes part in the gathers)
 * region by region through a slot, each region's other ranges gathered
 * there (a collective, as master_whole). */
static int master_regions(rl_train_device *d, float *host, rl_err *e) {
    gpu_dev *g = ctx(d);
    int rc = RL_OK;
    for (int k = 0; k < rl_gpu_grad_regions(&d->cfg->model, NULL) && !rc; k++) {
        size_t off, len;
        rl_gpu_grad_region(&d->cfg->model, k, &off, &len);
        float *buf;
        rc = rl_gpu_model_master_region(g->model, off, len, &buf, e);
        if (!rc && d->shard) rc = d->gather_region(d->gather_ctx, buf, off, len, false, e);
        cudaError_t ce = rc || !host ? cudaSuccess
                                     : cudaMemcpyAsync(host + off, buf, len * sizeof(float), cudaMemcpyDeviceToHost,
                                                       g->stream);
        if (!rc && ce == cudaSuccess) ce = cudaStreamSynchronize(g->stream); /* the slot is reused next */
        if (ce != cudaSuccess) rc = rl_errf(e, RL_EIO, "gpu: the weights' copy to the host: %s", cudaGetErrorString(ce));
    }
    return rc;
}

static bool slotted(rl_train_device *d) { return !rl_gpu_model_grads(ctx(d)->model); }

static int gpu_download(rl_train_device *d, bool opt, rl_err *e) {
    gpu_dev *g = ctx(d);
    if (slotted(d)) {
        int rc = master_regions(d, d->params, e);
        return !rc && opt ? rl_gpu_model_download_opt(g->model, d->opt, e) : rc;
    }
    float *whole;
    int rc = master_whole(d, &whole, e);
    cudaError_t ce = rc ? cudaSuccess : cudaMemcpyAsync(d->params, whole, d->n * sizeof(float),
                                                        cudaMemcpyDeviceToHost, g->stream);
    if (!rc && ce == cudaSuccess) ce = cudaStreamSynchronize(g->stream);
    if (ce != cudaSuccess) rc = rl_errf(e, RL_EIO, "gpu: downloading the weights: %s", cudaGetErrorString(ce));
    if (!rc && opt) rc = rl_gpu_model_download_opt(g->model, d->opt, e);
    return rc;
}

static int gpu_upload(rl_train_device *d, bool opt, rl_err *e) {
    int rc = rl_gpu_model_upload_params(ctx(d)->model, d->params, e);
    if (!rc && opt) rc = rl_gpu_model_upload_opt(ctx(d)->model, d->opt, e);
    return rc;
}

/* Elements whose moments the device holds: all, or the shard's. */
static size_t held(const rl_train_device *d) { return d->shard ? d->shard->total : d->n; }

/* Straight to the host: the fallback, and the staged path's second half.
 * params NULL: a shard's rank that saves no weights. */
static int to_host(rl_train_device *d, const float *master, const float *mv, float *params, float *m,
                   float *v, rl_err *e) {
    size_t n = d->n * sizeof(float), h = held(d) * sizeof(float);
    cudaError_t ce = cudaSetDevice(ctx(d)->device);
    if (ce == cudaSuccess && params) ce = cudaMemcpy(params, master, n, cudaMemcpyDeviceToHost);
    if (ce == cudaSuccess) ce = cudaMemcpy(m, mv, h, cudaMemcpyDeviceToHost);
    if (ce == cudaSuccess) ce = cudaMemcpy(v, (const char *)mv + h, h, cudaMemcpyDeviceToHost);
    return ce == cudaSuccess ? RL_OK
                             : rl_errf(e, RL_EIO, "checkpoint: device-to-host copy: %s", cudaGetErrorString(ce));
}

/* take, in the pause: master weights and moments copied within the GPU to a
 * staging buffer (12 bytes a parameter; with a shard its moments, and the
 * weights only on the rank that saves them; allocated at the first
 * checkpoint, again when a new shard changed its size)
 * and queued on the model's stream, so the next step's optimizer runs
 * after the copy without the host waiting; fill, on the saver's thread:
 * staging -> the host snapshot. Where the GPU has no room for the staging
 * buffer (or RL_GPU_CKPT_STAGE=0), take copies to the host itself. */
static int gpu_take(rl_train_device *d, float *params, float *m, float *v, bool *later, rl_err *e) {
    gpu_dev *g = ctx(d);
    if (slotted(d)) { /* in the pause, no staging: the slots hold no whole master */
        int rc = master_regions(d, params, e);
        return rc ? rc : to_host(d, NULL, rl_gpu_model_opt(g->model), NULL, m, v, e);
    }
    size_t n = d->n, pn = params ? n : 0, need = pn + 2 * held(d);
    const char *stage = getenv("RL_GPU_CKPT_STAGE");
    if (g->ckpt && g->ckpt_floats != need) { /* no save is in flight: the saver takes one at a time */
        cudaFree(g->ckpt);
        g->ckpt = NULL;
    }
    if (!g->ckpt && !g->ckpt_off) {
        if ((stage && !strcmp(stage, "0")) || cudaMalloc((void **)&g->ckpt, need * sizeof(float)) != cudaSuccess) {
            (void)cudaGetLastError(); /* an out-of-memory here is not the run's error */
            g->ckpt = NULL, g->ckpt_off = true;
            rl_log(RL_LOG_INFO, "checkpoint_staging", "\"on_gpu\":false,\"bytes\":%zu,\"msg\":\"copying "
                   "checkpoints to the host in the pause\"", need * sizeof(float));
        } else if (!g->ckpt_ready && cudaEventCreateWithFlags(&g->ckpt_ready, cudaEventDisableTiming) != cudaSuccess) {
            g->ckpt_ready = NULL;
            return rl_errf(e, RL_EIO, "checkpoint: cudaEventCreate failed");
        } else {
            g->ckpt_floats = need;
        }
    }
    float *master, *mv = rl_gpu_model_opt(g->model);
    int rc = master_whole(d, &master, e); /* every rank: the gather is a collective */
    if (rc) return rc;
    cudaError_t ce;
    if (!g->ckpt) {
        /* the host copies wait for the step's AdamW, queued on the model's stream */
        if ((ce = cudaStreamSynchronize(g->stream)) != cudaSuccess)
            return rl_errf(e, RL_EIO, "checkpoint: %s", cudaGetErrorString(ce));
        return to_host(d, master, mv, params, m, v, e);
    }
    /* queued behind the step's AdamW and ahead of the next step: no wait */
    ce = pn ? cudaMemcpyAsync(g->ckpt, master, n * sizeof(float), cudaMemcpyDeviceToDevice, g->stream) : cudaSuccess;
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(g->ckpt + pn, mv, 2 * held(d) * sizeof(float), cudaMemcpyDeviceToDevice, g->stream);
    if (ce == cudaSuccess) ce = cudaEventRecord(g->ckpt_ready, g->stream);
    if (ce != cudaSuccess) return rl_errf(e, RL_EIO, "checkpoint: staging copy: %s", cudaGetErrorString(ce));
    *later = true;
    return RL_OK;
}

static int gpu_fill(rl_train_device *d, float *params, float *m, float *v, rl_err *e) {
    gpu_dev *g = ctx(d);
    /* polled with a bound, not cudaEventSynchronize: the copy sits on the
     * model's stream behind the step, and a wedged stream must end this
     * save with an error instead of holding the saver's thread forever */
    cudaError_t ce = cudaSetDevice(g->device);
    double deadline = rl_now() + 300;
    while (ce == cudaSuccess && (ce = cudaEventQuery(g->ckpt_ready)) == cudaErrorNotReady) {
        if (rl_now() > deadline)
            return rl_errf(e, RL_ETIMEOUT, "checkpoint: the staging copy on the GPU is not done after 300 s");
        nanosleep(&(struct timespec){0, 1000000}, NULL);
        ce = cudaSuccess;
    }
    if (ce != cudaSuccess) return rl_errf(e, RL_EIO, "checkpoint: staging copy: %s", cudaGetErrorString(ce));
    /* the layout take staged: the weights only when it was given them */
    return to_host(d, g->ckpt, g->ckpt + (params ? d->n : 0), params, m, v, e);
}

/* the dispatcher has set d->shard and d->opt: the model's master and
 * moments follow, and its forward waits for each layer's part of the
 * step's gather */
static int gpu_set_shard(rl_train_device *d, rl_err *e) {
    const rl_train_shard *s = d->shard;
    rl_gpu_model *m = ctx(d)->model;
    rl_gpu_model_set_params_wait(m, s ? d->gathered : NULL, d->gather_ctx);
    rl_gpu_model_set_grad_sink(m, s ? d->grad_slot : NULL, d->gather_ctx);
    rl_gpu_model_set_shard_grads(m, s ? s->grad : NULL);
    return rl_gpu_model_set_shard(ctx(d)->model, s ? s->r : NULL, s ? s->n : 0, d->rank, e);
}

static float *gpu_grads(rl_train_device *d) { return rl_gpu_model_grads(ctx(d)->model); }
static void *gpu_stream(rl_train_device *d) { return ctx(d)->stream; }

static void gpu_close(rl_train_device *d) {
    gpu_dev *g = ctx(d);
    if (!g) return;
    if (g->ckpt) cudaFree(g->ckpt);
    if (g->ckpt_ready) cudaEventDestroy(g->ckpt_ready);
    if (g->off) { /* before the model: it waits for the last copy into its weights */
        rl_offload_free(g->off);
        d->params = d->opt = NULL; /* its host state's */
    }
    if (g->model) rl_gpu_model_free(g->model);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g);
    free(d->params);
    d->impl = NULL, d->params = NULL;
}

/* ---- train.offload "optimizer": the host's state is the master ----------------
 * The GPU holds the bf16 weights, two gradient slots and the activations;
 * the fp32 master weights (d->params) and AdamW's moments (d->opt) stay in
 * the host's memory, as the CPU device keeps them. The gradients come down
 * region by region while the backward goes on (offload.c), and a step
 * ends with the norm and clipping on the host; AdamW (OpenMP, the CPU
 * device's own) and the bf16 weights' copy up then run on offload.c's
 * thread, overlapping the next forward layer by layer: 4 bytes a parameter
 * down and 2 up, for 16 bytes a parameter off the GPU (less the slots).
 * A checkpoint copies the host state in the pause (no device copy). */
static int offload_step_end(rl_train_device *d, const rl_train_update *u, double *loss, double *norm, rl_err *e) {
    gpu_dev *g = ctx(d);
    float l = 0, n_dev = 0;
    double sq = 0;
    int rc = rl_offload_join(g->off, e); /* the update is done and the gradients are down */
    if (!rc) rc = rl_gpu_model_step_end(g->model, e);
    if (!rc) rc = rl_gpu_model_step_stats(g->model, 0, &l, &n_dev, e);
    if (!rc) rc = read_waits(d, e);
    if (!rc) rc = rl_offload_grad_sq(g->off, &sq, e);
    *loss = l, *norm = sqrt(sq);
    if (rc || !isfinite(*norm)) return rc; /* the weights stay as they are */
    return rl_offload_step(g->off, u, rl_clip_factor(*norm, u->clip), e);
}

/* the host state is the truth: a copy in the pause, nothing staged (with
 * a shard the master gathered first, on every rank) */
static int offload_take(rl_train_device *d, float *params, float *m, float *v, bool *later, rl_err *e) {
    (void)later;
    int rc = rl_offload_master(ctx(d)->off, e);
    if (!rc) rl_train_host_take(d, params, m, v);
    return rc;
}

/* the host state is current once the update is done (and with a shard
 * the other ranks' ranges of the master are in) */
static int offload_download(rl_train_device *d, bool opt, rl_err *e) {
    (void)opt;
    return rl_offload_master(ctx(d)->off, e);
}

/* the update's collectives issued (a shard's gathers), on every rank */
static int offload_settle(rl_train_device *d, rl_err *e) { return rl_offload_join(ctx(d)->off, e); }

/* dist.shard: the host's update takes this rank's ranges (offload.h) */
static int offload_set_shard(rl_train_device *d, rl_err *e) { return rl_offload_set_shard(ctx(d)->off, e); }

/* the weights' bf16 copy from the host's master (layers: the host's copy
 * of it the model streams from, too); the moments never leave */
static int offload_upload(rl_train_device *d, bool opt, rl_err *e) {
    (void)opt;
    int rc = rl_offload_join(ctx(d)->off, e);
    if (!rc && ctx(d)->layers) rl_offload_set_bf16(ctx(d)->off);
    return rc ? rc : rl_gpu_model_upload_params(ctx(d)->model, d->params, e);
}

/* The gradients come down region by region through the model's slots (on
 * several ranks each averaged there first: the trainer's hook is the
 * seam's, offload.c calls it), and a later micro-batch's are added on the
 * host. */
static int offload_zero_grad(rl_train_device *d, rl_err *e) {
    rl_offload_zero(ctx(d)->off);
    return gpu_zero_grad(d, e);
}

static int offload_micro(rl_train_device *d, const int32_t *inputs, const int32_t *targets, float scale,
                         rl_grad_ready_fn hook, void *hook_ctx, rl_err *e) {
    (void)hook_ctx; /* the seam's ctx, which offload.c takes from d->dist */
    int rc = rl_offload_set_dist(ctx(d)->off, d->dist, hook, e);
    if (!rc) rc = gpu_micro(d, inputs, targets, scale, rl_offload_grad_ready, ctx(d)->off, e);
    return rc ? rc : rl_offload_micro_end(ctx(d)->off, e);
}

/* train.offload_share: one host state for the node's ranks (offload.h) */
static int offload_share(rl_train_device *d, const rl_train_dist *dist, rl_err *e) {
    bool shared = false;
    char why[160] = "train.offload_share is false";
    int rc = d->cfg->train.offload_share ? rl_offload_share(ctx(d)->off, dist, &shared, why, sizeof why, e) : RL_OK;
    char esc[2 * sizeof why];
    if (!rc && shared && dist->rank == 0) /* the master, the moments and the bf16 weights: once on the node */
        rl_log(RL_LOG_INFO, "offload_share", "\"shared\":true,\"ranks\":%d,\"host_bytes\":%zu", dist->world,
               d->n * RL_OFFLOAD_SHARED_BYTES);
    else if (!rc && !shared) /* each rank its own reason */
        rl_log(RL_LOG_INFO, "offload_share", "\"shared\":false,\"rank\":%d,\"why\":\"%s\"", dist->rank,
               rl_json_escape(esc, sizeof esc, why));
    return rc;
}

static int offload_unshare(rl_train_device *d, bool *whole, rl_err *e) {
    return rl_offload_unshare(ctx(d)->off, whole, e);
}

static const rl_train_device_ops gpu_ops = {
    .zero_grad = gpu_zero_grad,
    .micro = gpu_micro,
    .step_end = gpu_step_end,
    .eval = gpu_eval,
    .grads = gpu_grads,
    .stream = gpu_stream,
    .take = gpu_take,
    .fill = gpu_fill,
    .download = gpu_download,
    .upload = gpu_upload,
    .set_shard = gpu_set_shard,
    .waits = gpu_waits,
    .close = gpu_close,
};

static const rl_train_device_ops offload_ops = {
    .zero_grad = offload_zero_grad,
    .micro = offload_micro,
    .step_end = offload_step_end,
    .eval = gpu_eval,
    .grads = gpu_grads,
    .stream = gpu_stream,
    .take = offload_take,
    .download = offload_download,
    .upload = offload_upload,
    .set_shard = offload_set_shard,
    .settle = offload_settle,
    .waits = gpu_waits,
    .share = offload_share,
    .unshare = offload_unshare,
    .close = gpu_close,
};

/* Select `device`, make a stream, build the model for micro_batch x
 * seq_len; the host keeps only the parameters' mirror, not a CPU model's
 * activations and gradients. */
static int gpu_build(rl_train_device *d, gpu_dev *g, int device, rl_err *e) {
    const rl_train_config *t = &d->cfg->train;
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return rl_errf(e, RL_EIO, "train.device cuda: cudaSetDevice(%d) (LOCAL_RANK): %s", device,
                       cudaGetErrorString(ce));
    if ((ce = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking)) != cudaSuccess)
        return rl_errf(e, RL_EIO, "train.device cuda: cudaStreamCreate: %s", cudaGetErrorString(ce));
    rl_gpu_options opt = {0};
    opt.attention = !strcmp(t->attention, "own")     ? RL_GPU_ATTN_OWN
                    : !strcmp(t->attention, "cudnn") ? RL_GPU_ATTN_CUDNN
                                                     : RL_GPU_ATTN_AUTO;
    opt.recompute = t->recompute;
    opt.fused_gemm = !strcmp(t->fused_gemm, "on")    ? RL_GPU_FUSED_ON
                     : !strcmp(t->fused_gemm, "off") ? RL_GPU_FUSED_OFF
                                                     : RL_GPU_FUSED_AUTO;
    /* sharded state: the master and moments of this world's shard from the
     * start (set at resume exactly), so a model that fits only sharded is
     * built */
    rl_train_memory mem;
    int rc = rl_train_memory_of(d->cfg, d->world > 1 ? d->world : 1, 0, &mem, e);
    if (rc) return rc;
    opt.held = mem.shard_elems;
    opt.host_state = strcmp(t->offload, "none") != 0;
    g->layers = !strcmp(t->offload, "layers");
    opt.stream_layers = g->layers;
    if (opt.host_state) opt.grad_slots = RL_GPU_GRAD_SLOTS; /* the gradients leave as they are made */
    /* ZeRO-2's memory: no whole gradient buffer, DDP takes each region away */
    if (d->world > 1 && rl_shard_mode_of(d->cfg->dist.shard) == RL_SHARD_GRADIENTS) opt.grad_slots = RL_GPU_GRAD_SLOTS;
    if (rl_gpu_model_create(&g->model, &d->cfg->model, t->micro_batch, t->seq_len, &opt, g->stream, e))
        return rl_err_wrap(e, "building the model on GPU %d", device);
    g->device = device;
    rl_param_layout lay;
    rl_param_layout_init(&lay, &d->cfg->model);
    d->n = lay.total;
    if (!opt.host_state && !(d->params = malloc(d->n * sizeof(float))))
        return rl_errf(e, RL_ENOMEM, "trainer: out of memory for the parameters' host copy");
    if (opt.host_state) { /* the master and the moments: offload.c's host state (d->params, d->opt) */
        int rc2 = rl_offload_new(d, rl_gpu_model_params(g->model), g->stream, d->cfg->dist.timeout_s, g->layers,
                                 &g->off, e);
        if (rc2) return rc2;
        rl_gpu_model_set_params_wait(g->model, rl_offload_wait, g->off);
    }
    if (g->layers) rl_gpu_model_set_host_weights(g->model, rl_offload_bf16(g->off), rl_offload_ready, g->off);
    if (opt.host_state) rl_gpu_model_set_grad_sink(g->model, rl_offload_grad_slot, g->off);
    return RL_OK;
}

int rl_train_gpu_open(rl_train_device *d, int device, rl_err *e) {
    gpu_dev *g = calloc(1, sizeof *g);
    if (!g) return rl_errf(e, RL_ENOMEM, "trainer: out of memory");
    d->impl = g;
    int rc = gpu_build(d, g, device, e);
    if (rc) {
        gpu_close(d);
        return rc;
    }
    d->ops = strcmp(d->cfg->train.offload, "none") ? &offload_ops : &gpu_ops;
    return RL_OK;
}

/* ---- samples on a GPU (rl_lm, train.h) ---------------------------------------- */

typedef struct {
    rl_gpu_model *model;
    cudaStream_t stream;
} gpu_lm;

static int gpu_last_logits(rl_lm *lm, const int32_t *tok, int T, const float **logits, rl_err *e) {
    gpu_lm *g = lm->impl;
    int rc = rl_gpu_model_forward(g->model, tok, NULL, 1, T, NULL, e);
    if (!rc) rc = rl_gpu_model_download_logits_row(g->model, T - 1, lm->row, e);
    *logits = rc ? NULL : lm->row;
    return rc;
}

static void gpu_lm_close(rl_lm *lm) {
    gpu_lm *g = lm->impl;
    if (g) {
        rl_gpu_model_free(g->model);
        if (g->stream) cudaStreamDestroy(g->stream);
        free(g);
    }
    free(lm->row);
    *lm = (rl_lm){0};
}

int rl_lm_gpu(const rl_model_config *c, const float *params, int window, rl_lm *out, rl_err *e) {
    gpu_lm *g = calloc(1, sizeof *g);
    *out = (rl_lm){.vocab = c->vocab_size, .window = window, .last_logits = gpu_last_logits,
                   .close = gpu_lm_close, .impl = g, .row = malloc(sizeof(float) * (size_t)c->vocab_size)};
    if (!g || !out->row) {
        gpu_lm_close(out);
        return rl_errf(e, RL_ENOMEM, "generate: out of memory");
    }
    cudaError_t ce = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
    int rc = ce != cudaSuccess ? rl_errf(e, RL_EIO, "generate: cudaStreamCreate: %s", cudaGetErrorString(ce)) : RL_OK;
    if (!rc) rc = rl_gpu_model_create(&g->model, c, 1, window, NULL, g->stream, e);
    if (!rc) rc = rl_gpu_model_upload_params(g->model, params, e);
    if (rc) gpu_lm_close(out);
    return rc;
}

#else /* no CUDA in this build */

int rl_train_gpu_count(char *name, size_t n) {
    if (name && n) name[0] = '\0';
    return 0;
}
int rl_train_gpu_open(rl_train_device *d, int device, rl_err *e) {
    (void)d, (void)device;
    return rl_errf(e, RL_EINTERNAL, "train.device cuda: this build has no CUDA");
}
int rl_lm_gpu(const rl_model_config *c, const float *params, int window, rl_lm *out, rl_err *e) {
    (void)c, (void)params, (void)window;
    *out = (rl_lm){0};
    return rl_errf(e, RL_EINPUT, "--device cuda: this build has no CUDA (nvcc and nccl.h were not found when it "
                                 "was built)");
}
#endif

int rl_train_visible_gpus(void) { return rl_train_gpu_count(NULL, 0); }

/* One decision per process, before anything is built. Silent: a run that
 * then fails on bad input prints its one error line and nothing else; the
 * trainer announces a device it picked once it is built (log_device). */
int rl_train_pick_device(rl_job_config *c, rl_err *e) {
    char *dev = c->train.device, *be = c->dist.backend;
    if (!strcmp(dev, "auto") || !strcmp(dev, "cuda")) {
        int n = rl_train_gpu_count(NULL, 0);
        if (n == 0 && !strcmp(dev, "cuda")) {
#ifdef RL_CUDA
            return rl_errf(e, RL_EINPUT, "train.device is \"cuda\" but no GPU is visible to this process");
#else
            return rl_errf(e, RL_EINPUT, "train.device is \"cuda\" but this build has no CUDA "
                           "(nvcc and nccl.h were not found when it was built)");
#endif
        }
        if (!strcmp(dev, "auto")) c->train.device_picked = true;
        snprintf(dev, sizeof c->train.device, "%s", n > 0 ? "cuda" : "cpu");
    }
    if (!strcmp(be, "auto")) snprintf(be, sizeof c->dist.backend, "%s", !strcmp(dev, "cuda") ? "nccl" : "tcp");
    return rl_train_check_pair(c, e);
}

void rl_train_log_device(const rl_job_config *c, int local_rank) {
    if (!c->train.device_picked) return;
    if (!strcmp(c->train.device, "cpu")) {
#ifdef RL_CUDA
        rl_log_msg(RL_LOG_INFO, "device", "CUDA build, but no GPU is visible: training on the CPU");
#endif
        return;
    }
    char name[128] = "", esc[160];
    int n = rl_train_gpu_count(name, sizeof name);
    rl_log(RL_LOG_INFO, "device", "\"device\":\"cuda\",\"gpu\":%d,\"gpus\":%d,\"name\":\"%s\"",
           local_rank, n, rl_json_escape(esc, sizeof esc, name));
}
