// Device discovery. A missing driver or no device is not an error: the
// worker then runs the CPU path and says so.
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "kernels/gpu.h"
}

extern "C" int rl_gpu_device_count(char *name, size_t n) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    if (count > 0 && name && n > 0) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) snprintf(name, n, "%s", p.name);
        else snprintf(name, n, "unknown");
    }
    return count;
}
