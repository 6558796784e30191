// norms.cu: RMSNorm forward and backward. Run on one GPU once (H200, 2026-11-27).
//
// One warp per row (4 rows per 128-thread block); a row's sums are per-lane partials combined
// by a butterfly, so each row's result is fixed. The weight gradient is summed over rows in two
// fixed-order passes (row-range partials, then the partials in order), never with atomics.
#include "kernels.cuh"

#define ROWS_PER_BLOCK 4

template <class T, int V> __global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *x, const T *w,
                                                            float w_add, int N, int C, float eps) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *xr = x + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        float a[V];
        load_f<V>(a, xr + c);
#pragma unroll
        for (int k = 0; k < V; k++) ss += a[k] * a[k];
    }
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (lane == 0) rstd[row] = r;
    T *o = out + (size_t)row * C;
    for (int c = lane * V; c < C; c += 32 * V) {
        float a[V], g[V];
        load_f<V>(a, xr + c);
        load_f<V>(g, w + c);
#pragma unroll
        for (int k = 0; k < V; k++) a[k] = (a[k] * r) * (g[k] + w_add);
        store_f<V>(o + c, a);
    }
}

void k_rmsnorm_fwd(CudaCtx *c, void *out, float *rstd, const void *x, const void *w, float w_add, int N,
                   int C, float eps) {
    if (N <= 0) return;
    const unsigned g = (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, t = 32 * ROWS_PER_BLOCK;
    if (c->bf16) {
        if (C % 8 == 0 && can_vec<bf16>((size_t)C, out, x, w))
            LAUNCH(g, t, 0, c->stream, rmsnorm_fwd_kernel<bf16, 8>)((bf16 *)out, rstd, (const bf16 *)x, (const bf16 *)w, w_add, N, C, eps);
        else
            LAUNCH(g, t, 0, c->stream, rmsnorm_fwd_kernel<bf16, 1>)((bf16 *)out, rstd, (const bf16 *)x, (const bf16 *)w, w_add, N, C, eps);
    } else {
        if (C % 4 == 0 && can_vec<float>((size_t)C, out, x, w))
            LAUNCH(g, t, 0, c->stream, rmsnorm_fwd_kernel<float, 4>)((float *)out, rstd, (const float *)x, (const float *)w, w_add, N, C, eps);
        else
            LAUNCH(g, t, 0, c->stream, rmsnorm_fwd_kernel<float, 1>)((float *)out, rstd, (const float *)x, (const float *)w, w_add, N, C, eps);
    }
    LAUNCH_CHECK("rmsnorm_fwd");
}

// dx += r * w * dy - x * (r^3 / C) * sum(w * dy * x)
template <class T, int V> __global__ void rmsnorm_bwd_dx_kernel(T *dx, const T *dy, const T *x, const T *w,
                                                               float w_add, const float *rstd, int N, int C) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *xr = x + (size_t)row * C, *g = dy + (size_t)row * C;
    const float r = rstd[row];
    float dot = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        float a[V], b[V], ww[V];
        load_f<V>(a, xr + c);
        load_f<V>(b, g + c);
        load_f<V>(ww, w + c);
#pragma unroll
        for (int k = 0; k < V; k++) dot += (ww[k] + w_add) * b[k] * a[k];
    }
    dot = warp_sum(dot);
    const float kk = dot * r * r * r / (float)C;
    T *d = dx + (size_t)row * C;
    for (int c = lane * V; c < C; c += 32 * V) {
        float a[V], b[V], ww[V], o[V];
        load_f<V>(a, xr + c);
        load_f<V>(b, g + c);
        load_f<V>(ww, w + c);
        load_f<V>(o, d + c);
#pragma unroll
        for (int k = 0; k < V; k++) o[k] += r * (ww[k] + w_add) * b[k] - a[k] * kk;
        store_f<V>(d + c, o);
    }
}

// dw partials: block (x, y) sums column x*256+tid of dy * x * rstd over its row range, in order.
template <class T> __global__ void rmsnorm_dw_partial_kernel(float *part, const T *dy, const T *x,
                                                            const float *rstd, int N, int C, int rows) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    const int n0 = blockIdx.y * rows, n1 = n0 + rows < N ? n0 + rows : N;
    float s = 0.0f;
    for (int n = n0; n < n1; n++) {
        size_t i = (size_t)n * C + col;
        s += to_f<T>(dy[i]) * to_f<T>(x[i]) * rstd[n];
    }
    part[(size_t)blockIdx.y * C + col] = s;
}

// Into the float weight gradient (backend.h).
__global__ void rmsnorm_dw_finish_kernel(float *dw, const float *part, int R, int C) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    double s = 0.0;
    for (int r = 0; r < R; r++) s += part[(size_t)r * C + col];
    dw[col] += (float)s;
}

void k_rmsnorm_bwd(CudaCtx *c, void *dx, float *dw, const void *dout, const void *x, const void *w,
                   float w_add, const float *rstd, int N, int C) {
    if (N <= 0) return;
    const unsigned g = (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, t = 32 * ROWS_PER_BLOCK;
    if (c->bf16) {
        if (C % 8 == 0 && can_vec<bf16>((size_t)C, dx, dout, x) && can_vec<bf16>((size_t)C, w))
            LAUNCH(g, t, 0, c->stream, rmsnorm_bwd_dx_kernel<bf16, 8>)((bf16 *)dx, (const bf16 *)dout, (const bf16 *)x, (const bf16 *)w, w_add, rstd, N, C);
        else
            LAUNCH(g, t, 0, c->stream, rmsnorm_bwd_dx_kernel<bf16, 1>)((bf16 *)dx, (const bf16 *)dout, (const bf16 *)x, (const bf16 *)w, w_add, rstd, N, C);
    } else {
        if (C % 4 == 0 && can_vec<float>((size_t)C, dx, dout, x) && can_vec<float>((size_t)C, w))
            LAUNCH(g, t, 0, c->stream, rmsnorm_bwd_dx_kernel<float, 4>)((float *)dx, (const float *)dout, (const float *)x, (const float *)w, w_add, rstd, N, C);
        else
            LAUNCH(g, t, 0, c->stream, rmsnorm_bwd_dx_kernel<float, 1>)((float *)dx, (const float *)dout, (const float *)x, (const float *)w, w_add, rstd, N, C);
    }
    LAUNCH_CHECK("rmsnorm_bwd");
    if (!dw) return;  // frozen norm weight
    int R = (N + 63) / 64;
    R = R < 1 ? 1 : R > 64 ? 64 : R;
    const int rows = (N + R - 1) / R;
    float *part = (float *)ctx_scratch(c, SCR_PARTIAL, (size_t)R * C * sizeof(float));
    dim3 gp((C + 255) / 256, R);
    if (c->bf16) LAUNCH(gp, 256, 0, c->stream, rmsnorm_dw_partial_kernel<bf16>)(part, (const bf16 *)dout, (const bf16 *)x, rstd, N, C, rows);
    else LAUNCH(gp, 256, 0, c->stream, rmsnorm_dw_partial_kernel<float>)(part, (const float *)dout, (const float *)x, rstd, N, C, rows);
    LAUNCH((C + 255) / 256, 256, 0, c->stream, rmsnorm_dw_finish_kernel)(dw, part, R, C);
    LAUNCH_CHECK("rmsnorm_bwd dw");
}
