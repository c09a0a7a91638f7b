/* The float instantiation of cpu_impl.inc: what the trainer runs. */
#include "cpu.h"
#define R float
#define FN(x) x##_f32
#define GEMM cblas_sgemm
#define EXP expf
#include "cpu_impl.inc"
