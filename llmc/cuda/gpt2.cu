// gpt2.cu: the GPT-2 ops -- LayerNorm forward/backward, GELU (tanh) forward/backward, learned
// position embeddings forward/backward -- with the semantics of llmc/cpu/kernels.inc.
// Run on one GPU once (H200, 2026-11-27: dev/results/gpu_h200_2026-11-27/).
//
// LayerNorm: a warp per row, two passes (mean, then the centred sum of squares, as the CPU
// does); the weight and bias gradients are column sums in two fixed-order passes (row-range
// partials, then the partials in order), never atomics. pos_bwd sums each element over the
// batch in order by one thread.
#include "kernels.cuh"

#define LN_ROWS 4  // rows (warps) per block

template <class T, int V> __global__ void layernorm_fwd_kernel(T *out, float *mean, float *rstd, const T *x,
                                                              const T *w, const T *b, int N, int C, float eps) {
    const int row = blockIdx.x * LN_ROWS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *xr = x + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        float a[V];
        load_f<V>(a, xr + c);
#pragma unroll
        for (int k = 0; k < V; k++) s += a[k];
    }
    const float mu = warp_sum(s) / (float)C;
    float ss = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        float a[V];
        load_f<V>(a, xr + c);
#pragma unroll
        for (int k = 0; k < V; k++) ss += (a[k] - mu) * (a[k] - mu);
    }
    const float r = 1.0f / sqrtf(warp_sum(ss) / (float)C + eps);
    if (lane == 0) mean[row] = mu, rstd[row] = r;
    T *o = out + (size_t)row * C;
    for (int c = lane * V; c < C; c += 32 * V) {
        float a[V], g[V], bb[V];
        load_f<V>(a, xr + c);
        load_f<V>(g, w + c);
        load_f<V>(bb, b + c);
#pragma unroll
        for (int k = 0; k < V; k++) a[k] = ((a[k] - mu) * r) * g[k] + bb[k];
        store_f<V>(o + c, a);
    }
}

// dx += r * (g*w - mean(g*w) - xhat * mean(g*w*xhat))
template <class T, int V> __global__ void layernorm_bwd_dx_kernel(T *dx, const T *dy, const T *x, const T *w,
                                                                 const float *mean, const float *rstd, int N, int C) {
    const int row = blockIdx.x * LN_ROWS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *xr = x + (size_t)row * C, *g = dy + (size_t)row * C;
    const float mu = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        float a[V], d[V], ww[V];
        load_f<V>(a, xr + c);
        load_f<V>(d, g + c);
        load_f<V>(ww, w + c);
#pragma unroll
        for (int k = 0; k < V; k++) {
            const float gc = d[k] * ww[k];
            sg += gc;
            sgx += gc * ((a[k] - mu) * r);
        }
    }
    const float mg = warp_sum(sg) / (float)C, mgx = warp_sum(sgx) / (float)C;
    T *o = dx + (size_t)row * C;
    for (int c = lane * V; c < C; c += 32 * V) {
        float a[V], d[V], ww[V], acc[V];
        load_f<V>(a, xr + c);
        load_f<V>(d, g + c);
        load_f<V>(ww, w + c);
        load_f<V>(acc, o + c);
#pragma unroll
        for (int k = 0; k < V; k++) acc[k] += r * (d[k] * ww[k] - mg - (a[k] - mu) * r * mgx);
        store_f<V>(o + c, acc);
    }
}

template <class T> __global__ void layernorm_dwdb_partial_kernel(float *pw, float *pb, const T *dy, const T *x,
                                                                const float *mean, const float *rstd, int N,
                                                                int C, int rows) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    const int n0 = blockIdx.y * rows, n1 = n0 + rows < N ? n0 + rows : N;
    float sw = 0.0f, sb = 0.0f;
    for (int n = n0; n < n1; n++) {
        const size_t i = (size_t)n * C + col;
        const float g = to_f<T>(dy[i]);
        sw += g * ((to_f<T>(x[i]) - mean[n]) * rstd[n]);
        sb += g;
    }
    pw[(size_t)blockIdx.y * C + col] = sw;
    pb[(size_t)blockIdx.y * C + col] = sb;
}

// Into the float weight and bias gradients (backend.h).
__global__ void layernorm_dwdb_finish_kernel(float *dw, float *db, const float *pw, const float *pb, int R, int C) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    double sw = 0.0, sb = 0.0;
    for (int r = 0; r < R; r++) sw += pw[(size_t)r * C + col], sb += pb[(size_t)r * C + col];
    dw[col] += (float)sw;
    if (db) db[col] += (float)sb;
}

template <class T> static void ln_fwd(CudaCtx *c, void *out, float *mean, float *rstd, const void *x, const void *w,
                                      const void *b, int N, int C, float eps) {
    const int V = VecWidth<T>::value;
    const unsigned g = (N + LN_ROWS - 1) / LN_ROWS, t = 32 * LN_ROWS;
    if (C % V == 0 && can_vec<T>((size_t)C, out, x, w) && can_vec<T>((size_t)C, b))
        LAUNCH(g, t, 0, c->stream, layernorm_fwd_kernel<T, VecWidth<T>::value>)((T *)out, mean, rstd, (const T *)x, (const T *)w, (const T *)b, N, C, eps);
    else
        LAUNCH(g, t, 0, c->stream, layernorm_fwd_kernel<T, 1>)((T *)out, mean, rstd, (const T *)x, (const T *)w, (const T *)b, N, C, eps);
    LAUNCH_CHECK("layernorm_fwd");
}

void k_layernorm_fwd(CudaCtx *c, void *out, float *mean, float *rstd, const void *x, const void *w, const void *b,
                     int N, int C, float eps) {
    if (N <= 0) return;
    if (c->bf16) ln_fwd<bf16>(c, out, mean, rstd, x, w, b, N, C, eps);
    else ln_fwd<float>(c, out, mean, rstd, x, w, b, N, C, eps);
}

template <class T> static void ln_bwd(CudaCtx *c, void *dx, float *dw, float *db, const void *dy, const void *x,
                                      const void *w, const float *mean, const float *rstd, int N, int C) {
    const int V = VecWidth<T>::value;
    const unsigned g = (N + LN_ROWS - 1) / LN_ROWS, t = 32 * LN_ROWS;
    if (C % V == 0 && can_vec<T>((size_t)C, dx, dy, x) && can_vec<T>((size_t)C, w))
        LAUNCH(g, t, 0, c->stream, layernorm_bwd_dx_kernel<T, VecWidth<T>::value>)((T *)dx, (const T *)dy, (const T *)x, (const T *)w, mean, rstd, N, C);
    else
        LAUNCH(g, t, 0, c->stream, layernorm_bwd_dx_kernel<T, 1>)((T *)dx, (const T *)dy, (const T *)x, (const T *)w, mean, rstd, N, C);
    LAUNCH_CHECK("layernorm_bwd");
    if (!dw) return;  // frozen
    int R = (N + 63) / 64;
    R = R < 1 ? 1 : R > 64 ? 64 : R;
    const int rows = (N + R - 1) / R;
    float *pw = (float *)ctx_scratch(c, SCR_PARTIAL, (size_t)2 * R * C * sizeof(float)), *pb = pw + (size_t)R * C;
    dim3 gp((C + 255) / 256, R);
    LAUNCH(gp, 256, 0, c->stream, layernorm_dwdb_partial_kernel<T>)(pw, pb, (const T *)dy, (const T *)x, mean, rstd, N, C, rows);
    LAUNCH((C + 255) / 256, 256, 0, c->stream, layernorm_dwdb_finish_kernel)(dw, db, pw, pb, R, C);
    LAUNCH_CHECK("layernorm_bwd dw");
}

void k_layernorm_bwd(CudaCtx *c, void *dx, float *dw, float *db, const void *dout, const void *x, const void *w,
                     const float *mean, const float *rstd, int N, int C) {
    if (N <= 0) return;
    if (c->bf16) ln_bwd<bf16>(c, dx, dw, db, dout, x, w, mean, rstd, N, C);
    else ln_bwd<float>(c, dx, dw, db, dout, x, w, mean, rstd, N, C);
}

// ---- GELU (tanh approximation), elementwise ------------------------------------------------
template <class T> __global__ void gelu_fwd_kernel(T *y, const T *x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = from_f<T>(gelu_tanh(to_f<T>(x[i])));
}

// dx may alias dout: each element is read before it is written, by the same thread.
template <class T> __global__ void gelu_bwd_kernel(T *dx, const T *dy, const T *x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dx[i] = from_f<T>(to_f<T>(dy[i]) * gelu_tanh_slope(to_f<T>(x[i])));
}

void k_gelu_fwd(CudaCtx *c, void *y, const void *x, size_t n) {
    if (!n) return;
    if (c->bf16) LAUNCH(grid_for(n, 256), 256, 0, c->stream, gelu_fwd_kernel<bf16>)((bf16 *)y, (const bf16 *)x, n);
    else LAUNCH(grid_for(n, 256), 256, 0, c->stream, gelu_fwd_kernel<float>)((float *)y, (const float *)x, n);
    LAUNCH_CHECK("gelu_fwd");
}

void k_gelu_bwd(CudaCtx *c, void *dx, const void *dout, const void *x, size_t n) {
    if (!n) return;
    if (c->bf16) LAUNCH(grid_for(n, 256), 256, 0, c->stream, gelu_bwd_kernel<bf16>)((bf16 *)dx, (const bf16 *)dout, (const bf16 *)x, n);
    else LAUNCH(grid_for(n, 256), 256, 0, c->stream, gelu_bwd_kernel<float>)((float *)dx, (const float *)dout, (const float *)x, n);
    LAUNCH_CHECK("gelu_bwd");
}

// ---- learned positions --------------------------------------------------------------------------
template <class T> __global__ void pos_fwd_kernel(T *out, const T *wpe, int B, int T_, int C) {
    const size_t total = (size_t)B * T_ * C, tc = (size_t)T_ * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_f<T>(to_f<T>(out[i]) + to_f<T>(wpe[i % tc]));
}

template <class T> __global__ void pos_bwd_kernel(float *dwpe, const T *dout, int B, int T_, int C) {
    const size_t tc = (size_t)T_ * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < tc; i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += to_f<T>(dout[(size_t)b * tc + i]);
        dwpe[i] += s;
    }
}

void k_pos_fwd(CudaCtx *c, void *out, const void *wpe, int B, int T, int C) {
    const size_t total = (size_t)B * T * C;
    if (!total) return;
    if (c->bf16) LAUNCH(grid_for(total, 256), 256, 0, c->stream, pos_fwd_kernel<bf16>)((bf16 *)out, (const bf16 *)wpe, B, T, C);
    else LAUNCH(grid_for(total, 256), 256, 0, c->stream, pos_fwd_kernel<float>)((float *)out, (const float *)wpe, B, T, C);
    LAUNCH_CHECK("pos_fwd");
}

void k_pos_bwd(CudaCtx *c, float *dwpe, const void *dout, int B, int T, int C) {
    const size_t tc = (size_t)T * C;
    if (!tc) return;
    if (c->bf16) LAUNCH(grid_for(tc, 256), 256, 0, c->stream, pos_bwd_kernel<bf16>)(dwpe, (const bf16 *)dout, B, T, C);
    else LAUNCH(grid_for(tc, 256), 256, 0, c->stream, pos_bwd_kernel<float>)(dwpe, (const float *)dout, B, T, C);
    LAUNCH_CHECK("pos_bwd");
}
