/* The double instantiation of cpu_impl.inc: the same code, for gradient
 * checks against finite differences. */
#include "cpu.h"
#define R double
#define FN(x) x##_f64
#define GEMM cblas_dgemm
#define EXP exp
#define HOT
#include "cpu_impl.inc"
