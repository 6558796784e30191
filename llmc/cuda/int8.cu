// int8.cu: dequantize an 8-bit region (llmc/int8.h: bitsandbytes' load_in_8bit storage) into an
// act tensor. Not yet run on a GPU; checked against the CPU in the emulator (dev/cuda/int8.cu).
//
// Same arithmetic as int8_region_dequantize (llmc/int8.c): code * (absmax * (float)(1/127)),
// each product rounded to fp32 (__fmul_rn keeps the compiler from contracting anything); in
// bf16 mode the fp32 result is then rounded to bf16, as bitsandbytes' bf16 mul_ does.
#include "kernels.cuh"
#ifndef _Static_assert
#define _Static_assert static_assert  // nf4.h is C11
#endif
extern "C" {
#include "../nf4.h"
}

static __host__ __device__ inline size_t al16(size_t x) { return (x + 15) & ~(size_t)15; }

// One thread per element (grid-stride).
template <class T> __global__ void int8_kernel(T *out, const unsigned char *region) {
    const Nf4RegionHeader *h = (const Nf4RegionHeader *)region;
    const size_t n = h->n, rows = h->nblocks, cols = (size_t)h->blocksize;
    const float *scb = (const float *)(region + sizeof(Nf4RegionHeader));
    const signed char *code = (const signed char *)(region + sizeof(Nf4RegionHeader) + al16(rows * sizeof(float)));
    const float inv127 = (float)7.874015718698502e-3;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_f<T>(__fmul_rn((float)code[i], __fmul_rn(scb[i / cols], inv127)));
}

void k_int8_dequantize(CudaCtx *c, void *out, const void *region, size_t n) {
    if (!n) return;
    if (c->bf16)
        LAUNCH(grid_for(n, 256), 256, 0, c->stream, int8_kernel<bf16>)((bf16 *)out, (const unsigned char *)region);
    else
        LAUNCH(grid_for(n, 256), 256, 0, c->stream, int8_kernel<float>)((float *)out, (const unsigned char *)region);
    LAUNCH_CHECK("int8_dequantize");
}
