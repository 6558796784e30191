// dev/cuda/classifier.cu: fused chunked classifier + cross-entropy against a double reference:
// per-token losses (0 for ignored targets), dx = scale dL/dx, dW += scale dL/dW (onto a nonzero
// float dW), with V large enough that the rows are processed in several chunks; then time per call.
#include "dev_common.cuh"

// cap: Gemma 2's final_logit_softcapping (0: none), z' = cap tanh(z / cap) before the softmax.
static void one(CudaCtx *c, int N, int V, int C, double cap = 0) {
    const int bf = c->bf16;
    char name[128];
    std::vector<float> x = randn((size_t)N * C), W = randn((size_t)V * C, 0.3), dW0 = randn((size_t)V * C, 0.01);
    round_act(x, bf), round_act(W, bf);  // dW0: a float gradient
    std::vector<int32_t> tgt(N);
    int valid = 0;
    for (int n = 0; n < N; n++) tgt[n] = n % 7 == 3 ? -1 : (int)(urand() * V), valid += tgt[n] >= 0;
    const double scale = 1.0 / valid;
    std::vector<double> loss(N), dx((size_t)N * C, 0), dW = to_d(dW0), z(V);
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) {
            double d = 0;
            for (int k = 0; k < C; k++) d += (double)x[(size_t)n * C + k] * W[(size_t)v * C + k];
            if (cap > 0) d = cap * tanh(d / cap);
            z[v] = d, mx = fmax(mx, d);
        }
        for (int v = 0; v < V; v++) s += exp(z[v] - mx);
        const double lz = mx + log(s);
        loss[n] = tgt[n] < 0 ? 0 : lz - z[tgt[n]];
        if (tgt[n] < 0) continue;
        for (int v = 0; v < V; v++) {
            double g = (exp(z[v] - lz) - (v == tgt[n])) * scale;
            if (cap > 0) g *= 1 - (z[v] / cap) * (z[v] / cap);
            for (int k = 0; k < C; k++) {
                dx[(size_t)n * C + k] += g * W[(size_t)v * C + k];
                dW[(size_t)v * C + k] += g * x[(size_t)n * C + k];
            }
        }
    }
    const size_t es = bf ? 2 : 4;
    void *dxin = up_act(x, bf), *dWin = up_act(W, bf), *ddx = dmalloc((size_t)N * C * es);
    float *ddW = (float *)up_act(dW0, 0);
    void *dt = up_bytes(tgt.data(), N * 4);
    float *dl = (float *)dmalloc(N * 4);
    k_classifier_ce(c, dl, ddx, ddW, dxin, dWin, (const int32_t *)dt, N, V, C, (float)scale, (float)cap);
    size_t rows = CE_CHUNK_ELEMS / V;
    snprintf(name, sizeof name, "classifier_ce %s N=%d V=%d C=%d (%zu chunks)%s", prec(bf), N, V, C,
             (N + (rows < 1 ? 1 : rows) - 1) / (rows < 1 ? 1 : rows), cap > 0 ? " soft-capped" : "");
    std::string base(name);
    check((base + " losses").c_str(), down_f32(dl, N), loss, bf ? 2e-3 : 1e-5);
    check((base + " dx").c_str(), down_act(ddx, (size_t)N * C, bf), dx, tol_for(bf));
    // bf16: the chunk's softmax gradient is rounded to bf16 before the dW GEMM (fp32 output)
    check((base + " dW").c_str(), down_f32(ddW, (size_t)V * C), dW, tol_for(bf));
    k_classifier_ce(c, dl, NULL, NULL, dxin, dWin, (const int32_t *)dt, N, V, C, (float)scale, (float)cap);  // eval: losses only
    check((base + " losses (no grad)").c_str(), down_f32(dl, N), loss, bf ? 2e-3 : 1e-5);
    cudaFree(dxin), cudaFree(dWin), cudaFree(ddW), cudaFree(ddx), cudaFree(dt), cudaFree(dl);
}

// chunk: the logits a chunk holds (0: CE_CHUNK_ELEMS, the trainer's)
static void bench(CudaCtx *c, int N, int V, int C, size_t chunk) {
    const int bf = c->bf16;
    const size_t es = bf ? 2 : 4;
    void *x = dmalloc((size_t)N * C * es), *W = dmalloc((size_t)V * C * es), *dx = dmalloc((size_t)N * C * es),
         *t = dmalloc(N * 4);
    float *dW = (float *)dmalloc((size_t)V * C * 4);
    float *l = (float *)dmalloc(N * 4);
    dev_noise(x, (size_t)N * C * es, es);
    dev_noise(W, (size_t)V * C * es, es, -0.05f, 0.05f);
    {
        std::vector<int32_t> tok(N);
        for (auto &v : tok) v = (int32_t)(urand() * V);
        CUDA_CHECK(dev_copy(t, tok.data(), N * 4, cudaMemcpyHostToDevice));
    }
    c->ce_chunk_elems = chunk;
    const size_t rows = (chunk ? chunk : CE_CHUNK_ELEMS) / V;
    char name[128];
    snprintf(name, sizeof name, "classifier_ce %s N=%d V=%d C=%d (3 GEMMs, chunks of %zu rows)", prec(bf), N, V, C, rows);
    report_flops(name, bench_ms(c, 3, [&] { k_classifier_ce(c, l, dx, dW, x, W, (const int32_t *)t, N, V, C, 1.0f, 0); }),
                 3 * 2.0 * N * V * C);
    c->ce_chunk_elems = 0;
    cudaFree(x), cudaFree(W), cudaFree(dx), cudaFree(dW), cudaFree(t), cudaFree(l);
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    for (int bf = 0; bf < 2; bf++) {
        CudaCtx *c = cuda_ctx_create(bf, 0);
        one(c, 37, 300, 32);
        one(c, 40, 420000, 4);  // N*V > CE_CHUNK_ELEMS: two chunks
        one(c, 37, 300, 32, 1.5);  // soft-capped logits (Gemma 2)
        one(c, 40, 420000, 4, 2.0);
        if (!g_quick) {
            // Llama-3's vocabulary at 8B's width; the 1.1B benchmark's; GPT-2 124M at B 16, T 1024,
            // whose 77 TFLOP/s in the trainer (H200, 2026-11-28) came with 333-row chunks: it is
            // timed at the default chunk and at chunks of 4x as many logits
            bench(c, 8192, 128256, 4096, 0);
            bench(c, 4096, 32000, 2048, 0);
            bench(c, 16384, 50304, 768, 0);
            bench(c, 16384, 50304, 768, CE_CHUNK_ELEMS * 4);
        }
        cuda_ctx_destroy(c);
    }
    return dev_finish("classifier");
}
