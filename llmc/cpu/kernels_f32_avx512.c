// The float kernels for CPUs with AVX512 (the Makefile enables it for this file): see kernels_f32.c.
#include <cblas.h>
#include "kernels.h"
#include "vexp.h"
#define R float
#define FN(name) name##_f32_avx512
#define GEMM cblas_sgemm
#define EXP vexpf
#define EXP16 vexpf16  // exponential loops 16 lanes at a time (kernels.inc)
#define MADD fmaf
#include "kernels.inc"
