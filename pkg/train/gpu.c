/* The trainer on a CUDA device: thin glue between the step structure of
 * trainer.c and the model of kernels/llama_gpu.h.
 *
 * Why a separate file: trainer.c stays one readable loop for both devices
 * (it branches on tr->gpu at each stage of a step), and everything that
 * needs the CUDA headers stays here and in kernels/.
 *
 * Synchronisation per optimizer step: one wait, after AdamW is queued, for
 * the step's loss and gradient norm (the log, the ranks' agreement and the
 * non-finite check need them on the host). Clipping is computed on the
 * device from the norm there (torch.nn.utils.clip_grad_norm_'s factor, in
 * fp32), and a non-finite norm makes the AdamW kernel leave the weights
 * alone, so the check that follows stops a run whose weights are intact. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train_gpu.h"

#ifdef RL_CUDA
#include <cuda_runtime_api.h>

#include "kernels/gpu.h"
#include "kernels/llama_gpu.h"

int rl_train_gpu_count(char *name, size_t n) { return rl_gpu_device_count(name, n); }

int rl_train_gpu_open(rl_trainer *tr, int device, rl_err *e) {
    const rl_train_config *t = &tr->cfg.train;
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return rl_errf(e, RL_EIO, "train.device cuda: cudaSetDevice(%d) (LOCAL_RANK): %s", device,
                       cudaGetErrorString(ce));
    cudaStream_t s;
    if ((ce = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess)
        return rl_errf(e, RL_EIO, "train.device cuda: cudaStreamCreate: %s", cudaGetErrorString(ce));
    tr->gpu_stream = s;
    rl_gpu_model *m;
    rl_gpu_options opt = {0};
    opt.attention = !strcmp(t->attention, "own")     ? RL_GPU_ATTN_OWN
                    : !strcmp(t->attention, "cudnn") ? RL_GPU_ATTN_CUDNN
                                                     : RL_GPU_ATTN_AUTO;
    int rc = rl_gpu_model_create(&m, &tr->cfg.model, t->micro_batch, t->seq_len, &opt, s, e);
    if (rc) return rl_err_wrap(e, "building the model on GPU %d", device);
    tr->gpu = m;
    tr->gpu_device = device;
    return rl_train_gpu_upload(tr, false, e);
}

void rl_train_gpu_close(rl_trainer *tr) {
    if (tr->gpu_ckpt) cudaFree(tr->gpu_ckpt);
    if (tr->gpu_ckpt_ready) cudaEventDestroy((cudaEvent_t)tr->gpu_ckpt_ready);
    tr->gpu_ckpt = NULL, tr->gpu_ckpt_ready = NULL;
    if (tr->gpu) rl_gpu_model_free(tr->gpu);
    if (tr->gpu_stream) cudaStreamDestroy((cudaStream_t)tr->gpu_stream);
    tr->gpu = NULL, tr->gpu_stream = NULL;
}

int rl_train_gpu_zero_grad(rl_trainer *tr, rl_err *e) { return rl_gpu_model_zero_grad(tr->gpu, e); }

int rl_train_gpu_micro(rl_trainer *tr, float scale, rl_grad_ready_fn hook, void *hook_ctx,
                       rl_err *e) {
    const rl_train_config *t = &tr->cfg.train;
    return rl_gpu_model_train_micro(tr->gpu, tr->inputs, tr->targets, t->micro_batch, t->seq_len,
                                    scale, hook, hook_ctx, e);
}

int rl_train_gpu_update(rl_trainer *tr, double lr, double clip_max, double *loss, double *norm,
                        rl_err *e) {
    const rl_train_config *t = &tr->cfg.train;
    rl_gpu_adamw a = {.lr = lr,
                      .beta1 = t->beta1,
                      .beta2 = t->beta2,
                      .eps = t->eps,
                      .weight_decay = t->weight_decay,
                      .t = tr->step + 1,
                      .grad_scale = 1.0,
                      .clip_max_norm = clip_max};
    float l = 0, n = 0;
    int rc = rl_gpu_model_grad_norm(tr->gpu, NULL, e);
    if (!rc) rc = rl_gpu_model_adamw(tr->gpu, &a, e);
    if (!rc) rc = rl_gpu_model_step_end(tr->gpu, e);
    if (!rc) rc = rl_gpu_model_step_stats(tr->gpu, 0, &l, &n, e);
    *loss = l, *norm = n;
    return rc;
}

int rl_train_gpu_eval(rl_trainer *tr, int B, int T, float *loss, rl_err *e) {
    return rl_gpu_model_forward(tr->gpu, tr->inputs, tr->targets, B, T, loss, e);
}

int rl_train_gpu_download(rl_trainer *tr, bool opt, rl_err *e) {
    int rc = rl_gpu_model_download_params(tr->gpu, tr->model.params, e);
    if (!rc && opt) rc = rl_gpu_model_download_opt(tr->gpu, tr->opt, e);
    return rc;
}

int rl_train_gpu_upload(rl_trainer *tr, bool opt, rl_err *e) {
    int rc = rl_gpu_model_upload_params(tr->gpu, tr->model.params, e);
    if (!rc && opt) rc = rl_gpu_model_upload_opt(tr->gpu, tr->opt, e);
    return rc;
}

/* Straight to the host: the fallback, and the staged path's second half. */
static int to_host(rl_trainer *tr, const float *master, const float *mv, float *params, float *m,
                   float *v, rl_err *e) {
    size_t n = tr->model.lay.total * sizeof(float);
    cudaError_t ce = cudaSetDevice(tr->gpu_device);
    if (ce == cudaSuccess) ce = cudaMemcpy(params, master, n, cudaMemcpyDeviceToHost);
    if (ce == cudaSuccess) ce = cudaMemcpy(m, mv, n, cudaMemcpyDeviceToHost);
    if (ce == cudaSuccess) ce = cudaMemcpy(v, (const char *)mv + n, n, cudaMemcpyDeviceToHost);
    return ce == cudaSuccess ? RL_OK
                             : rl_errf(e, RL_EIO, "checkpoint: device-to-host copy: %s", cudaGetErrorString(ce));
}

int rl_train_gpu_take(void *ctx, float *params, float *m, float *v, bool *later, rl_err *e) {
    rl_trainer *tr = ctx;
    size_t n = tr->model.lay.total;
    cudaStream_t s = (cudaStream_t)tr->gpu_stream;
    *later = false;
    const char *stage = getenv("RL_GPU_CKPT_STAGE");
    if (!tr->gpu_ckpt && !tr->gpu_ckpt_off) {
        cudaEvent_t ev;
        if ((stage && !strcmp(stage, "0")) ||
            cudaMalloc((void **)&tr->gpu_ckpt, 3 * n * sizeof(float)) != cudaSuccess) {
            (void)cudaGetLastError(); /* an out-of-memory here is not the run's error */
            tr->gpu_ckpt = NULL, tr->gpu_ckpt_off = true;
            rl_log(RL_LOG_INFO, "checkpoint_staging", "\"on_gpu\":false,\"bytes\":%zu,\"msg\":\"copying "
                   "checkpoints to the host in the pause\"", 3 * n * sizeof(float));
        } else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
            return rl_errf(e, RL_EIO, "checkpoint: cudaEventCreate failed");
        } else {
            tr->gpu_ckpt_ready = ev;
        }
    }
    float *master = rl_gpu_model_master(tr->gpu), *mv = rl_gpu_model_opt(tr->gpu);
    cudaError_t ce;
    if (!tr->gpu_ckpt) {
        /* the host copies wait for the step's AdamW, queued on the model's stream */
        if ((ce = cudaStreamSynchronize(s)) != cudaSuccess)
            return rl_errf(e, RL_EIO, "checkpoint: %s", cudaGetErrorString(ce));
        return to_host(tr, master, mv, params, m, v, e);
    }
    /* queued behind the step's AdamW and ahead of the next step: no wait */
    ce = cudaMemcpyAsync(tr->gpu_ckpt, master, n * sizeof(float), cudaMemcpyDeviceToDevice, s);
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(tr->gpu_ckpt + n, mv, 2 * n * sizeof(float), cudaMemcpyDeviceToDevice, s);
    if (ce == cudaSuccess) ce = cudaEventRecord((cudaEvent_t)tr->gpu_ckpt_ready, s);
    if (ce != cudaSuccess) return rl_errf(e, RL_EIO, "checkpoint: staging copy: %s", cudaGetErrorString(ce));
    *later = true;
    return RL_OK;
}

int rl_train_gpu_fill(void *ctx, float *params, float *m, float *v, rl_err *e) {
    rl_trainer *tr = ctx;
    size_t n = tr->model.lay.total;
    /* polled with a bound, not cudaEventSynchronize: the copy sits on the
     * model's stream behind the step, and a wedged stream must end this
     * save with an error instead of holding the saver's thread forever */
    cudaError_t ce = cudaSetDevice(tr->gpu_device);
    double deadline = rl_now() + 300;
    while (ce == cudaSuccess && (ce = cudaEventQuery((cudaEvent_t)tr->gpu_ckpt_ready)) == cudaErrorNotReady) {
        if (rl_now() > deadline)
            return rl_errf(e, RL_ETIMEOUT, "checkpoint: the staging copy on the GPU is not done after 300 s");
        nanosleep(&(struct timespec){0, 1000000}, NULL);
        ce = cudaSuccess;
    }
    if (ce != cudaSuccess) return rl_errf(e, RL_EIO, "checkpoint: staging copy: %s", cudaGetErrorString(ce));
    return to_host(tr, tr->gpu_ckpt, tr->gpu_ckpt + n, params, m, v, e);
}

float *rl_train_gpu_grads(rl_trainer *tr) { return rl_gpu_model_grads(tr->gpu); }
void *rl_train_gpu_stream(rl_trainer *tr) { return tr->gpu_stream; }

#else /* no CUDA in this build */

static int none(rl_err *e) {
    return rl_errf(e, RL_EINTERNAL, "train.device cuda: this build has no CUDA");
}
int rl_train_gpu_count(char *name, size_t n) {
    if (name && n) name[0] = '\0';
    return 0;
}
int rl_train_gpu_open(rl_trainer *tr, int device, rl_err *e) { return (void)tr, (void)device, none(e); }
void rl_train_gpu_close(rl_trainer *tr) { (void)tr; }
int rl_train_gpu_zero_grad(rl_trainer *tr, rl_err *e) { return (void)tr, none(e); }
int rl_train_gpu_micro(rl_trainer *tr, float scale, rl_grad_ready_fn hook, void *hook_ctx,
                       rl_err *e) {
    return (void)tr, (void)scale, (void)hook, (void)hook_ctx, none(e);
}
int rl_train_gpu_update(rl_trainer *tr, double lr, double clip_max, double *loss, double *norm,
                        rl_err *e) {
    return (void)tr, (void)lr, (void)clip_max, (void)loss, (void)norm, none(e);
}
int rl_train_gpu_eval(rl_trainer *tr, int B, int T, float *loss, rl_err *e) {
    return (void)tr, (void)B, (void)T, (void)loss, none(e);
}
int rl_train_gpu_download(rl_trainer *tr, bool opt, rl_err *e) { return (void)tr, (void)opt, none(e); }
int rl_train_gpu_upload(rl_trainer *tr, bool opt, rl_err *e) { return (void)tr, (void)opt, none(e); }
int rl_train_gpu_take(void *ctx, float *params, float *m, float *v, bool *later, rl_err *e) {
    return (void)ctx, (void)params, (void)m, (void)v, (void)later, none(e);
}
int rl_train_gpu_fill(void *ctx, float *params, float *m, float *v, rl_err *e) {
    return (void)ctx, (void)params, (void)m, (void)v, none(e);
}
float *rl_train_gpu_grads(rl_trainer *tr) { return (void)tr, NULL; }
void *rl_train_gpu_stream(rl_trainer *tr) { return (void)tr, NULL; }
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
    return rl_train_check_pair(dev, be, e);
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
