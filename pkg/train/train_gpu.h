/* The trainer's GPU half (gpu.c), internal to pkg/train: the model on a
 * CUDA device behind the same step structure as the CPU path. In a build
 * without CUDA every function but the first reports that, and the trainer
 * never calls them (rl_train_pick_device refuses "cuda" first). */
#ifndef RL_TRAIN_GPU_H
#define RL_TRAIN_GPU_H

#include "train.h"

/* Whether backend `be` can reduce gradients on device `dev` ("auto" pairs
 * with anything): RL_EINPUT naming both otherwise. The config parser and
 * rl_train_pick_device (after settling "auto") share it. */
int rl_train_check_pair(const char *dev, const char *be, rl_err *e);
/* Visible CUDA devices (0 without CUDA or a driver); the first's name to name[n]. */
int rl_train_gpu_count(char *name, size_t n);
/* Select `device`, make a stream, build the model for micro_batch x seq_len
 * and upload tr->model.params (the host mirror) into it. */
int rl_train_gpu_open(rl_trainer *tr, int device, rl_err *e);
void rl_train_gpu_close(rl_trainer *tr);
int rl_train_gpu_zero_grad(rl_trainer *tr, rl_err *e);
/* Forward over tr->inputs/targets, backward with grads (+)= d(loss *
 * scale); the loss stays on the device (nothing waits). */
int rl_train_gpu_micro(rl_trainer *tr, float scale, rl_grad_ready_fn hook, void *hook_ctx,
                       rl_err *e);
/* The step's end on the device: gradient norm, clipping to clip_max
 * (<= 0: none) and AdamW at lr, all queued; then the one wait of the step,
 * for its loss (the micro-batches' scaled sum) and gradient norm. */
int rl_train_gpu_update(rl_trainer *tr, double lr, double clip_max, double *loss, double *norm,
                        rl_err *e);
/* Mean loss of one forward over tr->inputs/targets (B x T). */
int rl_train_gpu_eval(rl_trainer *tr, int B, int T, float *loss, rl_err *e);
/* Master parameters (and with opt the AdamW moments) device -> host
 * mirror (tr->model.params, tr->opt), or host mirror -> device. */
int rl_train_gpu_download(rl_trainer *tr, bool opt, rl_err *e);
int rl_train_gpu_upload(rl_trainer *tr, bool opt, rl_err *e);
/* The checkpoint saver's take and fill (rl_ckpt_data; ctx is the trainer).
 * take, in the pause: master weights and moments copied within the GPU to
 * a staging buffer (12 bytes a parameter, allocated at the first
 * checkpoint) and queued on the model's stream, so the next step's
 * optimizer runs after the copy without the host waiting; fill, on the
 * saver's thread: staging -> the host snapshot. Where the GPU has no room
 * for the staging buffer (or RL_GPU_CKPT_STAGE=0), take copies to the host
 * itself, in the pause. */
int rl_train_gpu_take(void *ctx, float *params, float *m, float *v, bool *later, rl_err *e);
int rl_train_gpu_fill(void *ctx, float *params, float *m, float *v, rl_err *e);
float *rl_train_gpu_grads(rl_trainer *tr);
/* One line saying which device rl_train_pick_device chose for "auto" (and
 * that a CUDA build found no GPU); nothing for a device named outright. */
void rl_train_log_device(const rl_job_config *c, int local_rank);
void *rl_train_gpu_stream(rl_trainer *tr);

#endif
