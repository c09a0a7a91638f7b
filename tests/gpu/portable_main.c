/* The multi-call binary of `make gpu-portable`: test_gpu.c and bench_gpu.c
 * compiled with their main renamed, behind one executable, so that one
 * statically linked copy of OpenBLAS serves both (a GPU machine whose image
 * cannot build the project gets them as one carried file; see
 * kernels/README.md). build/portable/gpu_test and gpu_bench are the
 * wrappers that call it. */
#include <stdio.h>
#include <string.h>

int rl_gpu_test_main(int argc, char **argv);
int rl_gpu_bench_main(int argc, char **argv);

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "test")) return rl_gpu_test_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "bench")) return rl_gpu_bench_main(argc - 1, argv + 1);
    fprintf(stderr, "usage: %s test [filter] | bench [gpu_bench options]\n", argv[0]);
    return 2;
}
