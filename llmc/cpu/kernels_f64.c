// Double instantiation of kernels.inc: used by the finite-difference tests.
#include <cblas.h>
#include "kernels.h"
#define R double
#define FN(name) name##_f64
#define GEMM cblas_dgemm
#define EXP exp
#define MADD(a, b, c) ((a) * (b) + (c))  // fma() is a call per element without -mfma: too slow for the tests
#include "kernels.inc"
