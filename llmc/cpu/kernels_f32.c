// Float instantiation of kernels.inc: the kernels the CPU backend runs.
#include <cblas.h>
#include "kernels.h"
#define R float
#define FN(name) name##_f32
#define GEMM cblas_sgemm
#define EXP expf
#include "kernels.inc"
