// The float kernels for CPUs with AVX2 (the Makefile enables it for this file): see kernels_f32.c.
#include <cblas.h>
#include "kernels.h"
#define EXPV 8  // the exponential loops 8 lanes at a time (vexp.h)
#include "vexp.h"
#define R float
#define FN(name) name##_f32_avx2
#define GEMM cblas_sgemm
#define EXP vexpf
#define MADD fmaf
#include "kernels.inc"
