// common.cuh: what every CUDA file of the backend shares: types, conversions, vector loads,
// warp/block reductions, launch and error macros.
//
// STATUS: this code has run on one GPU once (an H200, 2026-11-27; dev/results/
// gpu_h200_2026-11-27/): correct there, slow in attention. Its logic also runs on the CPU
// through the SIMT emulator in dev/cuda/emu (the same source compiled by g++, one fiber per CUDA
// thread, checked against the CPU backend), which checks indexing, barriers and arithmetic,
// mma.sync's documented fragment layout, not timing, WMMA's real fragment layouts, memory
// ordering within a warp or real cuBLASLt behaviour. See dev/cuda/README.md.
//
// Precision: "act" tensors are bf16 (act_bytes 2) or float (act_bytes 4, for checking against
// the CPU backend). Every kernel loads act values into float, computes in float (reductions of
// long rows in float or double, as noted per kernel) and rounds once when it stores. Parameter
// gradients are float in both precisions (backend.h): kernels add into them without rounding
// to bf16, so sums over micro-batches, MLP chunks and attention tiles keep fp32 precision.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include "../util.h"
}

#ifdef LLMC_EMU
// CPU emulation build (dev/cuda/emu): the same source compiled by g++.
#include "cuda_emu.h"
#else
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <mma.h>
// The kernel goes last so that template arguments with commas need no parentheses:
//   LAUNCH(grid, block, smem, stream, my_kernel<float, 4>)(args...);
#define LAUNCH(g, b, s, st, ...) __VA_ARGS__<<<(g), (b), (s), (st)>>>
// Dynamically sized shared memory of a kernel.
#define DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#define EMU_CHECK_ALIGN(p, n) ((void)0)
#endif

typedef __nv_bfloat16 bf16;

// Fails (util.h's fail(): one line, exit 1) naming the call and CUDA's reason.
void cuda_fail(const char *what, cudaError_t e, const char *file, int line);
#define CUDA_CHECK(call)                                                       \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        if (e_ != cudaSuccess) cuda_fail(#call, e_, __FILE__, __LINE__);       \
    } while (0)
// After a launch: catches a bad configuration (too many threads, too much shared memory).
#define LAUNCH_CHECK(name) CUDA_CHECK(cudaGetLastError())

// ---- element conversions ----------------------------------------------------------------
// GELU, tanh approximation (GPT-2's, and Gemma's gelu_pytorch_tanh in GeGLU): value and slope.
#define GELU_TANH_K 0.7978845608028654f  // sqrt(2/pi)
__device__ __forceinline__ float gelu_tanh(float v) {
    return 0.5f * v * (1.0f + tanhf(GELU_TANH_K * (v + 0.044715f * v * v * v)));
}
__device__ __forceinline__ float gelu_tanh_slope(float v) {
    const float u = GELU_TANH_K * (v + 0.044715f * v * v * v), t = tanhf(u);
    const float du = GELU_TANH_K * (1.0f + 3.0f * 0.044715f * v * v);
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
}

// Logit soft-capping (Gemma 2; cap 0: none): cap tanh(s / cap), and its slope at the capped
// value, 1 - (capped / cap)^2 (1 without a cap): the attention kernels' scores, the classifier's logits.
__device__ __forceinline__ float soft_cap(float s, float cap) { return cap > 0.0f ? cap * tanhf(s / cap) : s; }
__device__ __forceinline__ float soft_cap_slope(float sc, float cap) {
    if (!(cap > 0.0f)) return 1.0f;
    const float t = sc / cap;
    return 1.0f - t * t;
}

template <class T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f<bf16>(bf16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

// ---- vector loads ---------------------------------------------------------------------------
// V consecutive elements to/from float. When V elements are 16 bytes the access is one 16-byte
// load/store (the caller guarantees 16-byte alignment); otherwise element by element.
template <class T> struct VecWidth { static constexpr int value = 16 / (int)sizeof(T); };

struct __align__(16) Raw16 { uint32_t w[4]; };
// The same 16 bytes seen as elements (a union: the type pun both nvcc and g++ define).
template <class T> union Pack16 {
    Raw16 raw;
    T e[16 / sizeof(T)];
    __host__ __device__ Pack16() {}
};

template <int V, class T> __device__ __forceinline__ void load_f(float *out, const T *p) {
    if constexpr (V * sizeof(T) == 16) {
        EMU_CHECK_ALIGN(p, 16);
        Pack16<T> pk;
        pk.raw = *reinterpret_cast<const Raw16 *>(p);
#pragma unroll
        for (int k = 0; k < V; k++) out[k] = to_f<T>(pk.e[k]);
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) out[k] = to_f<T>(p[k]);
    }
}

template <int V, class T> __device__ __forceinline__ void store_f(T *p, const float *in) {
    if constexpr (V * sizeof(T) == 16) {
        EMU_CHECK_ALIGN(p, 16);
        Pack16<T> pk;
#pragma unroll
        for (int k = 0; k < V; k++) pk.e[k] = from_f<T>(in[k]);
        *reinterpret_cast<Raw16 *>(p) = pk.raw;
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) p[k] = from_f<T>(in[k]);
    }
}

// Largest power of two (at most 256) dividing the address: what vector paths and cuBLASLt's
// alignment preferences are told.
static inline unsigned ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 1 && (a & (al - 1))) al >>= 1;
    return al;
}
// True when every pointer is 16-byte aligned and n is a multiple of 16 bytes' worth of T.
template <class T> static inline int can_vec(size_t n, const void *a, const void *b = nullptr,
                                             const void *c = nullptr) {
    const int V = VecWidth<T>::value;
    return n % V == 0 && ptr_align(a) >= 16 && (!b || ptr_align(b) >= 16) && (!c || ptr_align(c) >= 16);
}

// ---- reductions -------------------------------------------------------------------------
// Butterfly reductions: every lane ends with the result, and the order of additions is fixed,
// so results are the same on every run.
template <class R> __device__ __forceinline__ R warp_sum(R v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Block-wide sum (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 values; the function synchronises before returning so it can be reused.
template <class R> __device__ R block_sum(R v, R *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    R t = lane < nw ? scratch[lane] : (R)0;
    t = warp_sum(t);
    __syncthreads();
    return t;
}
__device__ __forceinline__ float block_max(float v, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nw ? scratch[lane] : -INFINITY;
    t = warp_max(t);
    __syncthreads();
    return t;
}

// Grid size for a grid-stride loop over `work` items with `threads` per block.
static inline unsigned grid_for(size_t work, int threads, unsigned cap = 1u << 20) {
    size_t b = (work + (size_t)threads - 1) / (size_t)threads;
    if (b < 1) b = 1;
    return (unsigned)(b < cap ? b : cap);
}
