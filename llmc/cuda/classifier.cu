// classifier.cu: fused, chunked classifier + cross-entropy (backend.h classifier_ce).
// Run on one GPU once (H200, 2026-11-27: dev/results/gpu_h200_2026-11-27/).
//
// Same math as classifier_ce in llmc/cpu/kernels.inc. Rows are taken in chunks whose logits fit
// CE_CHUNK_ELEMS elements, so the N x V logits never exist whole:
//   1. logits[nr, V] = x_chunk W^T          cuBLASLt, fp32 output (bf16 inputs in bf16 mode)
//   2. one block per row: max, sum of exp, loss = lse - z[target] (0 where target < 0), and the
//      gradient (softmax - onehot) * scale (0 for ignored rows) in act precision -- in place over
//      the fp32 logits in float mode, into a separate bf16 buffer in bf16 mode
//   3. dx_chunk = grad W (cuBLASLt, beta 0), dW += grad^T x_chunk (beta 1, into the float dW)
// The fp32 logits keep the loss accurate in bf16 mode; only the gradient is rounded to bf16.
#include "kernels.cuh"

#define CE_THREADS 512

template <class G> __global__ void ce_row_kernel(float *losses, G *grad, const float *logits,
                                                const int32_t *targets, int V, float scale,
                                                int want_grad, float softcap) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    const float *z = logits + (size_t)r * V;
    float mx = -INFINITY;
    for (int c = threadIdx.x; c < V; c += blockDim.x) mx = fmaxf(mx, z[c]);
    mx = block_max(mx, scratch);
    float s = 0.0f;
    for (int c = threadIdx.x; c < V; c += blockDim.x) s += expf(z[c] - mx);
    s = block_sum<float>(s, scratch);
    const float lz = mx + logf(s);
    const int t = targets[r];
    // every thread has read z[t] (if it reads it at all) before any thread writes the gradient
    // in place: the block_sum above ends with a barrier, and z[t] is read here, before the
    // barrier below
    const float zt = t >= 0 && t < V ? z[t] : 0.0f;
    if (threadIdx.x == 0) losses[r] = t < 0 ? 0.0f : lz - zt;
    if (!want_grad) return;
    __syncthreads();
    const float sc = t < 0 ? 0.0f : scale;
    G *gr = grad + (size_t)r * V;
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
        float g = expf(z[c] - lz) * sc;
        if (c == t) g -= sc;
        g *= soft_cap_slope(z[c], softcap);  // z is the capped logit (1 without a cap)
        gr[c] = from_f<G>(g);
    }
}

// Gemma 2's final_logit_softcapping: z = cap tanh(z / cap), in place over the fp32 logits.
__global__ void ce_softcap_kernel(float *z, size_t n, float cap) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        z[i] = soft_cap(z[i], cap);
}

void k_classifier_ce(CudaCtx *c, float *losses, void *dx, float *dW, const void *x, const void *W,
                     const int32_t *targets, int N, int V, int C, float scale, float softcap) {
    if (N <= 0) return;
    size_t rows = (c->ce_chunk_elems ? c->ce_chunk_elems : CE_CHUNK_ELEMS) / (size_t)V;
    if (rows < 1) rows = 1;
    if (rows > (size_t)N) rows = (size_t)N;
    const int want_grad = dx || dW;
    float *logits = (float *)ctx_scratch(c, SCR_CE_LOGITS, rows * (size_t)V * sizeof(float));
    void *grad = logits;  // float mode: the gradient overwrites the logits in place
    if (c->bf16 && want_grad) grad = ctx_scratch(c, SCR_CE_GRAD, rows * (size_t)V * sizeof(bf16));
    const size_t A = act_size(c);
    for (int n0 = 0; n0 < N; n0 += (int)rows) {
        const int nr = N - n0 < (int)rows ? N - n0 : (int)rows;
        const char *xc = (const char *)x + (size_t)n0 * C * A;
        k_matmul_f32out(c, logits, xc, W, nr, V, C, 0, 1, 1.0f, 0.0f);
        if (softcap > 0.0f) {
            const size_t n = (size_t)nr * V;
            LAUNCH((unsigned)((n + 255) / 256 < 65535 ? (n + 255) / 256 : 65535), 256, 0, c->stream, ce_softcap_kernel)(logits, n, softcap);
            LAUNCH_CHECK("ce_softcap");
        }
        if (c->bf16)
            LAUNCH(nr, CE_THREADS, 0, c->stream, ce_row_kernel<bf16>)(losses + n0, (bf16 *)grad, logits, targets + n0, V, scale, want_grad, softcap);
        else
            LAUNCH(nr, CE_THREADS, 0, c->stream, ce_row_kernel<float>)(losses + n0, (float *)grad, logits, targets + n0, V, scale, want_grad, softcap);
        LAUNCH_CHECK("ce_row");
        if (dx) k_matmul(c, (char *)dx + (size_t)n0 * C * A, grad, W, nr, C, V, 0, 0, 1.0f, 0.0f);
        if (dW) k_matmul_f32out(c, dW, grad, xc, V, C, nr, 1, 0, 1.0f, 1.0f);
    }
}
