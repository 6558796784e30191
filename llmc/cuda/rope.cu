// rope.cu: rotary position embedding in place on x [B,T,H,D] over each head's first rot
// dimensions, HF rotate_half pairing (i, i+rot/2), tables float [T, rot/2], position pos[b*T + t]
// or t when pos is NULL (backend.h); the other dimensions pass. sign -1 applies the inverse
// rotation (backward).
// Run on one GPU once (H200, 2026-11-27: dev/results/gpu_h200_2026-11-27/).
#include "kernels.cuh"

template <class T> __global__ void rope_kernel(T *x, const float *cosv, const float *sinv,
                                              const int32_t *pos, int B, int T_, int H, int D, int rot,
                                              float sign) {
    const int half = rot / 2;
    const size_t total = (size_t)B * T_ * H * half;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t row = i / half;  // (b, t, h)
        const int j = (int)(i % half);
        const size_t bt = row / H;
        const int t = pos ? pos[bt] : (int)(bt % T_);
        T *v = x + row * D;
        const float a = to_f<T>(v[j]), e = to_f<T>(v[j + half]);
        const float c = cosv[(size_t)t * half + j], sn = sign * sinv[(size_t)t * half + j];
        v[j] = from_f<T>(a * c - e * sn);
        v[j + half] = from_f<T>(e * c + a * sn);
    }
}

void k_rope(CudaCtx *c, void *x, const float *cosv, const float *sinv, const int32_t *pos, int B,
            int T, int H, int D, int rot, int sign) {
    const size_t total = (size_t)B * T * H * (rot / 2);
    if (!total) return;
    if (c->bf16)
        LAUNCH(grid_for(total, 256), 256, 0, c->stream, rope_kernel<bf16>)((bf16 *)x, cosv, sinv, pos, B, T, H, D, rot, (float)sign);
    else
        LAUNCH(grid_for(total, 256), 256, 0, c->stream, rope_kernel<float>)((float *)x, cosv, sinv, pos, B, T, H, D, rot, (float)sign);
    LAUNCH_CHECK("rope");
}
