/* The device choice's CUDA side (gpu.c), internal to pkg/train. The GPU
 * trainer itself is an implementation of the device seam (device.h). In a
 * build without CUDA no GPU is ever counted, so rl_train_pick_device never
 * settles on "cuda". */
#ifndef RL_TRAIN_GPU_H
#define RL_TRAIN_GPU_H

#include "train.h"

/* Whether the backend can reduce gradients on the device ("auto" pairs
 * with anything) and train.offload can run there: RL_EINPUT naming the
 * fields otherwise. The config parser and rl_train_pick_device (after
 * settling "auto") share it. */
int rl_train_check_pair(const rl_job_config *c, rl_err *e);
/* Visible CUDA devices (0 without CUDA or a driver); the first's name to name[n]. */
int rl_train_gpu_count(char *name, size_t n);
/* One line saying which device rl_train_pick_device chose for "auto" (and
 * that a CUDA build found no GPU); nothing for a device named outright. */
void rl_train_log_device(const rl_job_config *c, int local_rank);

#endif
