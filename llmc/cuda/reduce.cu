// reduce.cu: sumsq (of a float gradient) and sum_f32 in double, deterministic. Run on one
// GPU once (H200, 2026-11-27).
//
// A fixed grid (RED_BLOCKS x RED_THREADS, independent of the GPU) walks the array with a grid
// stride; each thread sums its elements in order in double, each block reduces in a fixed tree
// into one partial, and one block adds the partials in a fixed tree. The same input gives the
// same bits on every run and every GPU. The result goes to pinned host memory and the host
// waits for it (the op returns a double, as in backend.h).
#include "kernels.cuh"

#ifndef LLMC_EMU
#define RED_BLOCKS 512
#else
#define RED_BLOCKS 8  // the CPU emulator pays for every block; the order changes, not the result
#endif
#define RED_THREADS 256

template <class T, int SQUARE> __global__ void reduce_partial_kernel(double *part, const T *x, size_t n) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double v = (double)to_f<T>(x[i]);
        s += SQUARE ? v * v : v;
    }
    s = block_sum<double>(s, scratch);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void reduce_finish_kernel(double *out, const double *part, int np) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < np; i += blockDim.x) s += part[i];
    s = block_sum<double>(s, scratch);
    if (threadIdx.x == 0) *out = s;
}

template <class T, int SQUARE> static double reduce_any(CudaCtx *c, const T *x, size_t n) {
    if (n == 0) return 0.0;
    double *part = (double *)ctx_scratch(c, SCR_PARTIAL, RED_BLOCKS * sizeof(double));
    LAUNCH(RED_BLOCKS, RED_THREADS, 0, c->stream, reduce_partial_kernel<T, SQUARE>)(part, x, n);
    LAUNCH(1, RED_THREADS, 0, c->stream, reduce_finish_kernel)(c->dev_result, part, RED_BLOCKS);
    LAUNCH_CHECK("reduce");
    CUDA_CHECK(cudaMemcpyAsync(c->host_result, c->dev_result, sizeof(double), cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return *c->host_result;
}

double k_sumsq(CudaCtx *c, const float *x, size_t n) { return reduce_any<float, 1>(c, x, n); }

double k_sum_f32(CudaCtx *c, const float *x, size_t n) { return reduce_any<float, 0>(c, x, n); }
