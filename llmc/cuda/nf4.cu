// nf4.cu: dequantize an NF4 region (llmc/nf4.h's device layout) into an act tensor.
// Run on one GPU once (H200, 2026-11-27: dev/results/gpu_h200_2026-11-27/).
//
// Same arithmetic as nf4_region_dequantize (llmc/nf4.c): absmax' = map[q] * nested_absmax +
// offset (nested) or the stored fp32 absmax, then code * absmax', each step rounded to fp32 in
// that order (__fmul_rn/__fadd_rn keep the compiler from fusing them into an FMA, which would
// round once and could differ from the CPU in the last bit). The fp32 result is exact to the
// CPU's; in bf16 mode it is then rounded to bf16.
#include "kernels.cuh"
#ifndef _Static_assert
#define _Static_assert static_assert  // nf4.h is C11
#endif
extern "C" {
#include "../nf4.h"
}

__constant__ float d_nf4_code[16];

static __host__ __device__ inline size_t al16(size_t x) { return (x + 15) & ~(size_t)15; }

// One thread per packed byte (elements 2i and 2i+1; blocksize is even, so both share a block).
template <class T> __global__ void nf4_kernel(T *out, const unsigned char *region) {
    const Nf4RegionHeader *h = (const Nf4RegionHeader *)region;
    const size_t n = h->n, nblocks = h->nblocks, bs = (size_t)h->blocksize;
    const int nested = h->nested;
    const unsigned char *p = region + sizeof(Nf4RegionHeader);
    const float *map = nullptr, *nabs = nullptr, *absf = nullptr;
    if (nested) {
        map = (const float *)p;
        p += al16(256 * sizeof(float));
        nabs = (const float *)p;
        p += al16(h->nested_nblocks * sizeof(float));
    } else {
        absf = (const float *)p;
        p += al16(nblocks * sizeof(float));
    }
    const unsigned char *packed = p;
    const unsigned char *qabs = nested ? packed + al16((n + 1) / 2) : nullptr;
    const size_t nbytes = (n + 1) / 2, nbs = (size_t)h->nested_blocksize;
    const float offset = h->offset;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nbytes;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t e = 2 * i, b = e / bs;
        const float am = nested ? __fadd_rn(__fmul_rn(map[qabs[b]], nabs[b / nbs]), offset) : absf[b];
        const unsigned char byte = packed[i];
        out[e] = from_f<T>(__fmul_rn(d_nf4_code[byte >> 4], am));
        if (e + 1 < n) out[e + 1] = from_f<T>(__fmul_rn(d_nf4_code[byte & 15], am));
    }
}

void k_nf4_init(void) { CUDA_CHECK(cudaMemcpyToSymbol(d_nf4_code, nf4_code, sizeof(float) * 16)); }

void k_nf4_dequantize(CudaCtx *c, void *out, const void *region, size_t n) {
    const size_t nbytes = (n + 1) / 2;
    if (!nbytes) return;
    if (c->bf16)
        LAUNCH(grid_for(nbytes, 256), 256, 0, c->stream, nf4_kernel<bf16>)((bf16 *)out, (const unsigned char *)region);
    else
        LAUNCH(grid_for(nbytes, 256), 256, 0, c->stream, nf4_kernel<float>)((float *)out, (const unsigned char *)region);
    LAUNCH_CHECK("nf4_dequantize");
}
