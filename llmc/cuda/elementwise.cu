// elementwise.cu: add, accumulate, scale, bias, SwiGLU, dropout, conversions.
// Run on one GPU once (H200, 2026-11-27: dev/results/gpu_h200_2026-11-27/).
//
// Each op is a functor applied to V consecutive elements per thread in a grid-stride loop:
// V = 16 bytes of elements (one vector load per operand) when every pointer is 16-byte aligned
// and n is a multiple of V, else 1. Arithmetic is in float, rounded once on store, in the same
// order as the CPU kernel (llmc/cpu/kernels.inc).
#include "kernels.cuh"

template <int V, class F> __global__ void map_kernel(size_t nvec, F f) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec;
         i += (size_t)gridDim.x * blockDim.x)
        f(i * V);
}

template <int V, class F> static void run_map(CudaCtx *c, size_t n, F f) {
    size_t nv = n / V;
    if (!nv) return;
    LAUNCH(grid_for(nv, 256), 256, 0, c->stream, map_kernel<V, F>)(nv, f);
    LAUNCH_CHECK("map_kernel");
}

// Runs Op<T, V> with the widest V the pointers allow.
#define RUN_OP(T, n, vec_ok, Op, ...)                                                      \
    do {                                                                                   \
        if (vec_ok) run_map<VecWidth<T>::value>(c, n, Op<T, VecWidth<T>::value>{__VA_ARGS__}); \
        else run_map<1>(c, n, Op<T, 1>{__VA_ARGS__});                                      \
    } while (0)

template <class T, int V> struct AddOp {
    T *y;
    const T *a, *b;
    __device__ void operator()(size_t i) const {
        float x[V], z[V];
        load_f<V>(x, a + i);
        load_f<V>(z, b + i);
#pragma unroll
        for (int k = 0; k < V; k++) x[k] += z[k];
        store_f<V>(y + i, x);
    }
};

template <class T, int V> struct AccOp {
    T *y;
    const T *x;
    __device__ void operator()(size_t i) const {
        float a[V], b[V];
        load_f<V>(a, y + i);
        load_f<V>(b, x + i);
#pragma unroll
        for (int k = 0; k < V; k++) a[k] += b[k];
        store_f<V>(y + i, a);
    }
};

template <class T, int V> struct ScaleOp {
    T *y;
    float s;
    __device__ void operator()(size_t i) const {
        float a[V];
        load_f<V>(a, y + i);
#pragma unroll
        for (int k = 0; k < V; k++) a[k] *= s;
        store_f<V>(y + i, a);
    }
};

// The gated MLPs: h = act(gate) * up; backward dgate = dh * up * act'(gate), dup = dh * act(gate),
// each activation's arithmetic in its own order (SwiGLU's as it always was).
struct SiluAct {  // Llama: silu(g) = g * sigmoid(g)
    __device__ static float fwd(float g, float u) { return g / (1.0f + expf(-g)) * u; }
    __device__ static void bwd(float d, float g, float u, float &dg, float &du) {
        const float s = 1.0f / (1.0f + expf(-g));
        dg = d * u * s * (1.0f + g * (1.0f - s));
        du = d * g * s;
    }
};
struct GeluTanhAct {  // Gemma: gelu_pytorch_tanh, GPT-2's GELU (common.cuh)
    __device__ static float fwd(float g, float u) { return gelu_tanh(g) * u; }
    __device__ static void bwd(float d, float g, float u, float &dg, float &du) {
        dg = d * u * gelu_tanh_slope(g);
        du = d * gelu_tanh(g);
    }
};
struct GeluErfAct {  // transformers' "gelu": g Phi(g), Phi by erf (Gemma 1 configs' hidden_act)
    __device__ static float fwd(float g, float u) { return 0.5f * g * (1.0f + erff(g * 0.70710678f)) * u; }
    __device__ static void bwd(float d, float g, float u, float &dg, float &du) {
        const float p = 0.5f * (1.0f + erff(g * 0.70710678f));
        dg = d * u * (p + g * 0.39894228f * expf(-0.5f * g * g));
        du = d * g * p;
    }
};

template <class A, class T, int V> struct GluFwdOp {
    T *h;
    const T *gate, *up;
    __device__ void operator()(size_t i) const {
        float g[V], u[V];
        load_f<V>(g, gate + i);
        load_f<V>(u, up + i);
#pragma unroll
        for (int k = 0; k < V; k++) g[k] = A::fwd(g[k], u[k]);
        store_f<V>(h + i, g);
    }
};

// dgate may alias dh: every operand is loaded before anything is stored.
template <class A, class T, int V> struct GluBwdOp {
    T *dgate, *dup;
    const T *dh, *gate, *up;
    __device__ void operator()(size_t i) const {
        float g[V], u[V], d[V], dg[V], du[V];
        load_f<V>(g, gate + i);
        load_f<V>(u, up + i);
        load_f<V>(d, dh + i);
#pragma unroll
        for (int k = 0; k < V; k++) A::bwd(d[k], g[k], u[k], dg[k], du[k]);
        store_f<V>(dgate + i, dg);
        store_f<V>(dup + i, du);
    }
};
template <class T, int V> using SwigluFwdOp = GluFwdOp<SiluAct, T, V>;
template <class T, int V> using SwigluBwdOp = GluBwdOp<SiluAct, T, V>;
template <class T, int V> using GegluFwdOp = GluFwdOp<GeluTanhAct, T, V>;
template <class T, int V> using GegluBwdOp = GluBwdOp<GeluTanhAct, T, V>;
template <class T, int V> using GegluErfFwdOp = GluFwdOp<GeluErfAct, T, V>;
template <class T, int V> using GegluErfBwdOp = GluBwdOp<GeluErfAct, T, V>;

// The CPU's counter hash (kernels.inc dropout_u): element i is kept when
// (double)(h >> 11) * 2^-53 >= p, i.e. when the 53-bit integer h >> 11 >= ceil(p * 2^53), which
// the host computes exactly (p is a float, so p * 2^53 is exact in double).
__device__ __forceinline__ uint64_t dropout_bits(uint64_t seed, uint64_t i) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return (z ^ (z >> 31)) >> 11;
}

template <class T, int V> struct DropoutOp {
    T *y;
    const T *x;
    uint64_t seed, first, thresh;
    float keep;
    __device__ void operator()(size_t i) const {
        float a[V];
        load_f<V>(a, x + i);
#pragma unroll
        for (int k = 0; k < V; k++)
            a[k] = dropout_bits(seed, first + i + k) >= thresh ? a[k] * keep : 0.0f;
        store_f<V>(y + i, a);
    }
};

template <class T, int V> struct ToActOp {
    T *y;
    const float *x;
    __device__ void operator()(size_t i) const {
        float a[V];
#pragma unroll
        for (int k = 0; k < V; k++) a[k] = x[i + k];
        store_f<V>(y + i, a);
    }
};

template <class T, int V> struct ToF32Op {
    float *y;
    const T *x;
    __device__ void operator()(size_t i) const {
        float a[V];
        load_f<V>(a, x + i);
#pragma unroll
        for (int k = 0; k < V; k++) y[i + k] = a[k];
    }
};

void k_add(CudaCtx *c, void *y, const void *a, const void *b, size_t n) {
    if (c->bf16) RUN_OP(bf16, n, can_vec<bf16>(n, y, a, b), AddOp, (bf16 *)y, (const bf16 *)a, (const bf16 *)b);
    else RUN_OP(float, n, can_vec<float>(n, y, a, b), AddOp, (float *)y, (const float *)a, (const float *)b);
}

void k_accumulate(CudaCtx *c, void *y, const void *x, size_t n) {
    if (c->bf16) RUN_OP(bf16, n, can_vec<bf16>(n, y, x), AccOp, (bf16 *)y, (const bf16 *)x);
    else RUN_OP(float, n, can_vec<float>(n, y, x), AccOp, (float *)y, (const float *)x);
}

void k_accumulate_f32(CudaCtx *c, float *y, const float *x, size_t n) {
    RUN_OP(float, n, can_vec<float>(n, y, x), AccOp, y, x);
}

void k_scale(CudaCtx *c, void *y, float s, size_t n) {
    if (c->bf16) RUN_OP(bf16, n, can_vec<bf16>(n, y), ScaleOp, (bf16 *)y, s);
    else RUN_OP(float, n, can_vec<float>(n, y), ScaleOp, (float *)y, s);
}

// The gated MLPs' launches, one per direction, over an activation's ops.
template <template <class, int> class Op> static void glu_fwd(CudaCtx *c, void *h, const void *gate, const void *up, size_t n) {
    if (c->bf16) RUN_OP(bf16, n, can_vec<bf16>(n, h, gate, up), Op, (bf16 *)h, (const bf16 *)gate, (const bf16 *)up);
    else RUN_OP(float, n, can_vec<float>(n, h, gate, up), Op, (float *)h, (const float *)gate, (const float *)up);
}

template <template <class, int> class Op>
static void glu_bwd(CudaCtx *c, void *dgate, void *dup, const void *dh, const void *gate, const void *up, size_t n) {
    int ok_b = can_vec<bf16>(n, dgate, dup, dh) && can_vec<bf16>(n, gate, up);
    int ok_f = can_vec<float>(n, dgate, dup, dh) && can_vec<float>(n, gate, up);
    if (c->bf16) RUN_OP(bf16, n, ok_b, Op, (bf16 *)dgate, (bf16 *)dup, (const bf16 *)dh, (const bf16 *)gate, (const bf16 *)up);
    else RUN_OP(float, n, ok_f, Op, (float *)dgate, (float *)dup, (const float *)dh, (const float *)gate, (const float *)up);
}

void k_swiglu_fwd(CudaCtx *c, void *h, const void *gate, const void *up, size_t n) { glu_fwd<SwigluFwdOp>(c, h, gate, up, n); }
void k_swiglu_bwd(CudaCtx *c, void *dgate, void *dup, const void *dh, const void *gate, const void *up, size_t n) {
    glu_bwd<SwigluBwdOp>(c, dgate, dup, dh, gate, up, n);
}
void k_geglu_fwd(CudaCtx *c, void *h, const void *gate, const void *up, size_t n, int exact) {
    if (exact) glu_fwd<GegluErfFwdOp>(c, h, gate, up, n);
    else glu_fwd<GegluFwdOp>(c, h, gate, up, n);
}
void k_geglu_bwd(CudaCtx *c, void *dgate, void *dup, const void *dh, const void *gate, const void *up, size_t n,
                 int exact) {
    if (exact) glu_bwd<GegluErfBwdOp>(c, dgate, dup, dh, gate, up, n);
    else glu_bwd<GegluBwdOp>(c, dgate, dup, dh, gate, up, n);
}

void k_dropout(CudaCtx *c, void *y, const void *x, size_t n, float p, uint64_t seed, size_t first) {
    double t = ceil((double)p * 9007199254740992.0);
    uint64_t thresh = t >= 9007199254740992.0 ? (1ULL << 53) : t <= 0 ? 0 : (uint64_t)t;
    float keep = (float)(1.0 / (1.0 - p));
    if (c->bf16) RUN_OP(bf16, n, can_vec<bf16>(n, y, x), DropoutOp, (bf16 *)y, (const bf16 *)x, seed, (uint64_t)first, thresh, keep);
    else RUN_OP(float, n, can_vec<float>(n, y, x), DropoutOp, (float *)y, (const float *)x, seed, (uint64_t)first, thresh, keep);
}

void k_f32_to_act(CudaCtx *c, void *dst, const float *src, size_t n) {
    if (c->bf16) RUN_OP(bf16, n, can_vec<bf16>(n, dst), ToActOp, (bf16 *)dst, src);
    else CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
}

void k_act_to_f32(CudaCtx *c, float *dst, const void *src, size_t n) {
    if (c->bf16) RUN_OP(bf16, n, can_vec<bf16>(n, src), ToF32Op, dst, (const bf16 *)src);
    else CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
}

// ---- bias -------------------------------------------------------------------------------
template <class T> __global__ void add_bias_kernel(T *y, const T *bias, int N, int D) {
    size_t total = (size_t)N * D;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = from_f<T>(to_f<T>(y[i]) + to_f<T>(bias[i % D]));
}

void k_add_bias(CudaCtx *c, void *y, const void *bias, int N, int D) {
    size_t total = (size_t)N * D;
    if (!total) return;
    if (c->bf16) LAUNCH(grid_for(total, 256), 256, 0, c->stream, add_bias_kernel<bf16>)((bf16 *)y, (const bf16 *)bias, N, D);
    else LAUNCH(grid_for(total, 256), 256, 0, c->stream, add_bias_kernel<float>)((float *)y, (const float *)bias, N, D);
    LAUNCH_CHECK("add_bias");
}

// Column sums in two fixed-order passes: block (x, y) sums column x*256+tid over its row range
// in row order into part[y][col]; then each column's R partials are added in order (double).
// R depends only on N, so the result is the same on every GPU and run.
static int colsum_parts(int N) {
    int r = (N + 63) / 64;
    return r < 1 ? 1 : r > 64 ? 64 : r;
}

template <class T> __global__ void colsum_partial_kernel(float *part, const T *dy, int N, int D, int rows) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= D) return;
    int n0 = blockIdx.y * rows, n1 = n0 + rows < N ? n0 + rows : N;
    float s = 0.0f;
    for (int n = n0; n < n1; n++) s += to_f<T>(dy[(size_t)n * D + col]);
    part[(size_t)blockIdx.y * D + col] = s;
}

// Into the float bias gradient (backend.h): one rounding per call.
__global__ void colsum_finish_kernel(float *out, const float *part, int R, int D) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= D) return;
    double s = 0.0;
    for (int r = 0; r < R; r++) s += part[(size_t)r * D + col];
    out[col] += (float)s;
}

void k_bias_grad(CudaCtx *c, float *dbias, const void *dy, int N, int D) {
    if (N <= 0 || D <= 0) return;
    int R = colsum_parts(N), rows = (N + R - 1) / R;
    float *part = (float *)ctx_scratch(c, SCR_PARTIAL, (size_t)R * D * sizeof(float));
    dim3 g((D + 255) / 256, R);
    if (c->bf16) LAUNCH(g, 256, 0, c->stream, colsum_partial_kernel<bf16>)(part, (const bf16 *)dy, N, D, rows);
    else LAUNCH(g, 256, 0, c->stream, colsum_partial_kernel<float>)(part, (const float *)dy, N, D, rows);
    LAUNCH((D + 255) / 256, 256, 0, c->stream, colsum_finish_kernel)(dbias, part, R, D);
    LAUNCH_CHECK("bias_grad");
}
