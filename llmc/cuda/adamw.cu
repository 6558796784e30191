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
