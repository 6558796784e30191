// reduce.cu: sumsq (of a float gradient) and sum_f32 in double, deterministic. Run on one
// GPU once (H200, 2026-11-27).
//
// A fixed grid (RED_BLOCKS x RED_THREADS, independent of the GPU) walks the array with a grid
// stride; each thread sums its elements in order in double, each block reduces in a fixed tree
// into one partial, and one block adds the partials in a fixed tree. The same input gives the
// same bits on every run and every GPU. The result goes to pinned host memory and the host
// waits for it (backend.h's sum_f32 returns a double; its sumsq_many is k_sumsq_many below).
// k_sumsq_many does the same for a list of tensors (the gradient norm's per-tensor sums) in two
// launches and one wait: each tensor's grid row walks it exactly as k_sumsq's grid does, so
// every sum has k_sumsq's bits. One wait a tensor (201 at the 1.1B shape) cost 8 ms of a 400 ms
// step on the H200 (dev/results/gpu_h200_2026-11-27/call3_profile.txt, where the profiler's own
// per-op sync adds to it).
#include "kernels.cuh"

#ifndef LLMC_EMU
#define RED_BLOCKS 512
#else
#define RED_BLOCKS 8  // the CPU emulator pays for every block; the order changes, not the result
#endif
#define RED_THREADS 256

// Block blockIdx.x's partial of x[0, n) (grid stride gridDim.x blocks), in every thread.
template <class T, int SQUARE> __device__ double block_partial(const T *x, size_t n, double *scratch) {
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double v = (double)to_f<T>(x[i]);
        s += SQUARE ? v * v : v;
    }
    return block_sum<double>(s, scratch);
}

template <class T, int SQUARE> __global__ void reduce_partial_kernel(double *part, const T *x, size_t n) {
    __shared__ double scratch[32];
    const double s = block_partial<T, SQUARE>(x, n, scratch);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// Tensor blockIdx.y of the list: its partials in row blockIdx.y of part (gridDim.x a row).
__global__ void sumsq_many_partial_kernel(double *part, const float *const *x, const size_t *n) {
    __shared__ double scratch[32];
    const double s = block_partial<float, 1>(x[blockIdx.y], n[blockIdx.y], scratch);
    if (threadIdx.x == 0) part[(size_t)blockIdx.y * gridDim.x + blockIdx.x] = s;
}

// out[blockIdx.x] = the fixed-tree sum of part row blockIdx.x (np partials).
__global__ void reduce_finish_kernel(double *out, const double *part, int np) {
    __shared__ double scratch[32];
    const double *row = part + (size_t)blockIdx.x * np;
    double s = 0.0;
    for (int i = threadIdx.x; i < np; i += blockDim.x) s += row[i];
    s = block_sum<double>(s, scratch);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
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

// The list goes up as one table (pointers, then lengths) and the sums come back in one copy.
// Grid rows are limited to 65535: longer lists go in pieces.
void k_sumsq_many(CudaCtx *c, const float *const *x, const size_t *n, int count, double *each) {
    enum { PIECE = 4096 };
    for (int at = 0; at < count; at += PIECE) {
        const int k = count - at < PIECE ? count - at : PIECE;
        const size_t table = 2 * sizeof(void *) * (size_t)k;
        char *buf = (char *)ctx_scratch(c, SCR_LIST, table + sizeof(double) * (size_t)k);
        const float **dx = (const float **)buf;
        size_t *dn = (size_t *)(buf + sizeof(void *) * (size_t)k);
        double *dsum = (double *)(buf + table);
        double *part = (double *)ctx_scratch(c, SCR_PARTIAL, (size_t)k * RED_BLOCKS * sizeof(double));
        // The table is staged in host memory that lives until the wait below.
        char *host = (char *)malloc(table);
        if (!host) fail("out of host memory for a list of %d tensors to sum", k);
        memcpy(host, x + at, sizeof(void *) * (size_t)k);
        memcpy(host + sizeof(void *) * (size_t)k, n + at, sizeof(size_t) * (size_t)k);
        CUDA_CHECK(cudaMemcpyAsync(buf, host, table, cudaMemcpyHostToDevice, c->stream));
        LAUNCH(dim3(RED_BLOCKS, k), RED_THREADS, 0, c->stream, sumsq_many_partial_kernel)(part, dx, dn);
        LAUNCH(k, RED_THREADS, 0, c->stream, reduce_finish_kernel)(dsum, part, RED_BLOCKS);
        LAUNCH_CHECK("sumsq_many");
        CUDA_CHECK(cudaMemcpyAsync(each + at, dsum, sizeof(double) * (size_t)k, cudaMemcpyDeviceToHost, c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        free(host);
    }
}
