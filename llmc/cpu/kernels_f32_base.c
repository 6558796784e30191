// The float kernels for any x86-64 (SSE2): see kernels_f32.c.
#include <cblas.h>
#include "kernels.h"
#include "vexp.h"
#define R float
#define FN(name) name##_f32_base
#define GEMM cblas_sgemm
#define EXP vexpf
#define MADD fmaf
#include "kernels.inc"
