// adamw.cu: fused AdamW with PyTorch semantics, as adamw_f32 in llmc/cpu/kernels.inc:
//   grad = g * grad_scale; w = w * (1 - lr*wd); m, v moments; w -= step * m / (sqrt(v)/bc2s + eps)
// with step = lr / (1 - beta1^t) and bc2s = sqrt(1 - beta2^t) computed on the host in double.
// With a master copy (bf16 params), w is read from and written to the fp32 master and the
// param gets w rounded to bf16; without one the param itself (float) is updated. Gradients are
// float in both precisions (backend.h).
// Run on one GPU once (H200, 2026-11-27: dev/results/gpu_h200_2026-11-27/).
#include "kernels.cuh"

template <class T> __global__ void adamw_kernel(T *p, float *master, const float *g, float *m, float *v, size_t n,
                                               float lr, float b1, float b2, float eps, float wd,
                                               float gscale, float step, float bc2s) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float grad = g[i] * gscale;
        float w = (master ? master[i] : to_f<T>(p[i])) * (1.0f - lr * wd);
        float mi = b1 * m[i] + (1 - b1) * grad;
        float vi = b2 * v[i] + (1 - b2) * grad * grad;
        m[i] = mi;
        v[i] = vi;
        w = w - step * mi / (sqrtf(vi) / bc2s + eps);
        if (master) master[i] = w;
        p[i] = from_f<T>(w);
    }
}

void k_adamw(CudaCtx *c, void *params, float *master, const float *grads, float *m, float *v,
             size_t n, float lr, float beta1, float beta2, float eps, float wd, float grad_scale,
             int t) {
    if (!n) return;
    if (c->bf16 && !master) fail("internal: adamw on bf16 parameters needs the fp32 master copy");
    const double bc1 = 1.0 - pow(beta1, t), bc2 = 1.0 - pow(beta2, t);
    const float step = (float)(lr / bc1), bc2s = (float)sqrt(bc2);
    if (c->bf16)
        LAUNCH(grid_for(n, 256), 256, 0, c->stream, adamw_kernel<bf16>)((bf16 *)params, master, grads, m, v, n, lr, beta1, beta2, eps, wd, grad_scale, step, bc2s);
    else
        LAUNCH(grid_for(n, 256), 256, 0, c->stream, adamw_kernel<float>)((float *)params, master, grads, m, v, n, lr, beta1, beta2, eps, wd, grad_scale, step, bc2s);
    LAUNCH_CHECK("adamw");
}

// Blockwise 8-bit AdamW (llmc/optim.h), bitsandbytes' or torchao's, as adamw8_f32 in
// llmc/cpu/kernels.inc and in the same float operations, none contracted (__fmul_rn /
// __fadd_rn; division and sqrtf are IEEE without --use_fast_math): one thread block per
// ADAM8_BLOCK elements, one thread an element. Dequantize (map times the block's absmax),
// update, the block's new absmax by a shared-memory max, then the nearest code by binary search
// in the maps copied to shared memory. Not yet run on a GPU (emulated: dev/cuda/adamw.cu).
__device__ __forceinline__ unsigned char nearest_code(const float *map, float x, int torchao) {
    int lo = 0;
    for (int step = 128; step; step >>= 1)
        if (lo + step <= 255 && map[lo + step] <= x) lo += step;
    if (torchao)
        return (unsigned char)(lo < 255 && __fadd_rn(x, -map[lo]) >= __fmul_rn(__fadd_rn(map[lo + 1], -map[lo]), 0.5f)
                                   ? lo + 1 : lo);
    if (lo < 255 && fabsf(__fadd_rn(x, -map[lo + 1])) < fabsf(__fadd_rn(x, -map[lo]))) lo++;
    return (unsigned char)lo;
}

// torch.lerp(a, b, w), uncontracted.
__device__ __forceinline__ float lerp_rn(float a, float b, float w) {
    return w < 0.5f ? __fadd_rn(a, __fmul_rn(w, __fadd_rn(b, -a)))
                    : __fadd_rn(b, -__fmul_rn(__fadd_rn(b, -a), __fadd_rn(1.0f, -w)));
}

// torchao's single_param_adam on one element, as torchao_step in kernels.inc: the moments
// updated, the new weight returned; and its block scale, max |state| clipped to >= 1e-12.
__device__ __forceinline__ float torchao_step(float w, float grad, float &mi, float &vi, float lr, float lrwd,
                                              float c1, float c2, float bc1f, float bc2s, float eps) {
    w = __fadd_rn(w, -__fmul_rn(lrwd, w));
    mi = lerp_rn(mi, grad, c1);
    vi = lerp_rn(vi, __fmul_rn(grad, grad), c2);
    return __fadd_rn(w, -(__fmul_rn(lr, mi / bc1f) / __fadd_rn(sqrtf(vi) / bc2s, eps)));
}
__device__ __forceinline__ float torchao_scale(float mx) { return mx < 1e-12f ? 1e-12f : mx; }

template <class T>
__global__ void adamw8_kernel(T *p, float *master, const float *g, unsigned char *qm, unsigned char *qv, float *am,
                              float *av, const float *maps, size_t n, float b1, float b2, float c1, float c2,
                              float eps, int decays, float decay, float value, float bc2s, float gscale, int torchao,
                              float lr, float lrwd, float bc1f) {
    __shared__ float map[512], mx[2][ADAM8_BLOCK_CU];
    const int tid = threadIdx.x;
    const size_t b = blockIdx.x, i = b * ADAM8_BLOCK_CU + tid;
    for (int k = tid; k < 512; k += blockDim.x) map[k] = maps[k];
    __syncthreads();
    float mi = 0, vi = 0;
    if (i < n) {
        const float grad = __fmul_rn(g[i], gscale);
        mi = __fmul_rn(map[qm[i]], am[b]);
        vi = __fmul_rn(map[256 + qv[i]], av[b]);
        float w = master ? master[i] : to_f<T>(p[i]);
        if (torchao) {
            w = torchao_step(w, grad, mi, vi, lr, lrwd, c1, c2, bc1f, bc2s, eps);
        } else {
            mi = __fadd_rn(__fmul_rn(mi, b1), __fmul_rn(c1, grad));
            vi = __fadd_rn(__fmul_rn(vi, b2), __fmul_rn(__fmul_rn(c2, grad), grad));
            if (decays) w = __fmul_rn(w, decay);
            w = __fadd_rn(w, __fmul_rn(value, mi / __fadd_rn(sqrtf(vi) / bc2s, eps)));
        }
        if (master) master[i] = w;
        p[i] = from_f<T>(w);
    }
    mx[0][tid] = fabsf(mi), mx[1][tid] = fabsf(vi);
    __syncthreads();
    for (int s = ADAM8_BLOCK_CU / 2; s > 0; s >>= 1) {  // max is exact in any order
        if (tid < s) {
            mx[0][tid] = fmaxf(mx[0][tid], mx[0][tid + s]);
            mx[1][tid] = fmaxf(mx[1][tid], mx[1][tid + s]);
        }
        __syncthreads();
    }
    float sm = mx[0][0], sv = mx[1][0];
    if (torchao) sm = torchao_scale(sm), sv = torchao_scale(sv);
    else sm = sm == 0 ? 1.0f : sm, sv = sv == 0 ? 1.0f : sv;
    if (i < n) {
        qm[i] = nearest_code(map, mi / sm, torchao);
        qv[i] = nearest_code(map + 256, vi / sv, torchao);
    }
    if (tid == 0) am[b] = sm, av[b] = sv;
}

// torchao's AdamW4bit (llmc/optim.h; adamw4 in kernels.inc): one thread block per ADAM4_BLOCK
// elements, each thread a pair (2k, 2k + 1: one byte of codes), torchao's steps, the 16-entry
// maps searched linearly.
__device__ __forceinline__ unsigned code4(const float *map, float x) {
    unsigned lo = 0;
    for (unsigned i = 1; i < 16; i++)
        if (map[i] <= x) lo = i;
    const unsigned up = lo < 15 ? lo + 1 : 15;
    return __fadd_rn(x, -map[lo]) >= __fmul_rn(__fadd_rn(map[up], -map[lo]), 0.5f) ? up : lo;
}

template <class T>
__global__ void adamw4_kernel(T *p, float *master, const float *g, unsigned char *qm, unsigned char *qv, float *am,
                              float *av, const float *maps, float c1, float c2, float eps, float bc2s, float gscale,
                              float lr, float lrwd, float bc1f) {
    __shared__ float map[32], mx[2][ADAM4_BLOCK_CU / 2];
    const int tid = threadIdx.x;
    const size_t b = blockIdx.x, k = b * (ADAM4_BLOCK_CU / 2) + tid;  // the pair's byte
    if (tid < 16) map[tid] = maps[tid], map[16 + tid] = maps[256 + tid];
    __syncthreads();
    float ms[2], vs[2];
    for (int e = 0; e < 2; e++) {
        const size_t i = 2 * k + e;
        const int sh = e ? 0 : 4;
        const float grad = __fmul_rn(g[i], gscale);
        float mi = __fmul_rn(map[(qm[k] >> sh) & 15], am[b]), vi = __fmul_rn(map[16 + ((qv[k] >> sh) & 15)], av[b]);
        const float w = torchao_step(master ? master[i] : to_f<T>(p[i]), grad, mi, vi, lr, lrwd, c1, c2, bc1f, bc2s, eps);
        if (master) master[i] = w;
        p[i] = from_f<T>(w);
        ms[e] = mi, vs[e] = vi;
    }
    mx[0][tid] = fmaxf(fabsf(ms[0]), fabsf(ms[1])), mx[1][tid] = fmaxf(fabsf(vs[0]), fabsf(vs[1]));
    __syncthreads();
    for (int s = ADAM4_BLOCK_CU / 4; s > 0; s >>= 1) {
        if (tid < s) {
            mx[0][tid] = fmaxf(mx[0][tid], mx[0][tid + s]);
            mx[1][tid] = fmaxf(mx[1][tid], mx[1][tid + s]);
        }
        __syncthreads();
    }
    const float sm = torchao_scale(mx[0][0]), sv = torchao_scale(mx[1][0]);
    qm[k] = (unsigned char)(code4(map, ms[0] / sm) << 4 | code4(map, ms[1] / sm));
    qv[k] = (unsigned char)(code4(map + 16, vs[0] / sv) << 4 | code4(map + 16, vs[1] / sv));
    if (tid == 0) am[b] = sm, av[b] = sv;
}

void k_adamw8(CudaCtx *c, void *params, float *master, const float *grads, unsigned char *qm, unsigned char *qv,
              float *am, float *av, const float *maps, size_t n, float lr, float beta1, float beta2, float eps,
              float wd, float grad_scale, int t, int flavor) {
    if (!n) return;
    const int torchao = flavor != 0;
    if (c->bf16 && !master) fail("internal: adamw8 on bf16 parameters needs the fp32 master copy");
    const double bc1 = 1.0 - pow(beta1, t), bc2 = 1.0 - pow(beta2, t);
    const float value = (float)(-(double)lr / bc1), bc2s = (float)sqrt(bc2), bc1f = (float)bc1, lrwd = lr * wd;
    const float decay = (float)(1.0 - (double)lr * wd), c1 = (float)(1.0 - beta1), c2 = (float)(1.0 - beta2);
    if (flavor == 2) {  // n is a multiple of the block (optim.c's layout)
        const unsigned nb4 = (unsigned)(n / ADAM4_BLOCK_CU);
        if (c->bf16)
            LAUNCH(nb4, ADAM4_BLOCK_CU / 2, 0, c->stream, adamw4_kernel<bf16>)((bf16 *)params, master, grads, qm, qv, am,
                                                                               av, maps, c1, c2, eps, bc2s, grad_scale,
                                                                               lr, lrwd, bc1f);
        else
            LAUNCH(nb4, ADAM4_BLOCK_CU / 2, 0, c->stream, adamw4_kernel<float>)((float *)params, master, grads, qm, qv,
                                                                                am, av, maps, c1, c2, eps, bc2s,
                                                                                grad_scale, lr, lrwd, bc1f);
        LAUNCH_CHECK("adamw4");
        return;
    }
    const unsigned nb = (unsigned)((n + ADAM8_BLOCK_CU - 1) / ADAM8_BLOCK_CU);
    if (c->bf16)
        LAUNCH(nb, ADAM8_BLOCK_CU, 0, c->stream, adamw8_kernel<bf16>)((bf16 *)params, master, grads, qm, qv, am, av, maps,
                                                                      n, beta1, beta2, c1, c2, eps, wd > 0, decay, value,
                                                                      bc2s, grad_scale, torchao, lr, lrwd, bc1f);
    else
        LAUNCH(nb, ADAM8_BLOCK_CU, 0, c->stream, adamw8_kernel<float>)((float *)params, master, grads, qm, qv, am, av,
                                                                       maps, n, beta1, beta2, c1, c2, eps, wd > 0, decay,
                                                                       value, bc2s, grad_scale, torchao, lr, lrwd, bc1f);
    LAUNCH_CHECK("adamw8");
}
