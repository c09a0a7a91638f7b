/* The C face of the CUDA code in kernels/. Host code includes only this. */
#ifndef RL_KERNELS_GPU_H
#define RL_KERNELS_GPU_H

#include <stddef.h>

/* Number of visible CUDA devices (0 when none or the driver is missing);
 * the first device's name goes to name[n]. Never fails hard: a CUDA build
 * on a machine without a GPU must run the CPU path. */
int rl_gpu_device_count(char *name, size_t n);

#endif
