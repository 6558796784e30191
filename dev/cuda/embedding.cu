// dev/cuda/embedding.cu: embedding forward (exact copy) and the deterministic backward (counting
// sort by token, then per-token sums in ascending row order) against a double reference, with
// heavily repeated tokens, into a float gradient (fp32 tolerance in both precisions); the
// backward must give bit-identical results on repeated runs.
#include "dev_common.cuh"

static void one(CudaCtx *c, int N, int C, int V) {
    const int bf = c->bf16;
    char name[96];
    std::vector<int32_t> tok(N);
    for (int n = 0; n < N; n++) tok[n] = n % 5 == 0 ? 3 : (int)(urand() * V);  // token 3 repeats a lot
    std::vector<float> table = randn((size_t)V * C), dout = randn((size_t)N * C), dt0 = randn((size_t)V * C);
    round_act(table, bf), round_act(dout, bf);  // dt0: a float gradient
    void *dtok = up_bytes(tok.data(), N * 4), *dtab = up_act(table, bf), *dout_d = up_act(dout, bf);
    void *out = dmalloc((size_t)N * C * (bf ? 2 : 4));
    k_embedding_fwd(c, out, (const int32_t *)dtok, dtab, N, C);
    std::vector<double> ref((size_t)N * C);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < C; k++) ref[(size_t)n * C + k] = table[(size_t)tok[n] * C + k];
    snprintf(name, sizeof name, "embedding_fwd %s N=%d C=%d", prec(bf), N, C);
    check(name, down_act(out, (size_t)N * C, bf), ref, 0.0);
    std::vector<double> rt = to_d(dt0);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < C; k++) rt[(size_t)tok[n] * C + k] += dout[(size_t)n * C + k];
    float *dt = (float *)up_act(dt0, 0);
    k_embedding_bwd(c, dt, dout_d, (const int32_t *)dtok, N, C, V);
    std::vector<float> g1 = down_f32(dt, (size_t)V * C);
    snprintf(name, sizeof name, "embedding_bwd %s N=%d C=%d V=%d", prec(bf), N, C, V);
    check(name, g1, rt, 1e-5);
    CUDA_CHECK(dev_copy(dt, dt0.data(), (size_t)V * C * 4, cudaMemcpyHostToDevice));
    k_embedding_bwd(c, dt, dout_d, (const int32_t *)dtok, N, C, V);
    std::vector<float> g2 = down_f32(dt, (size_t)V * C);
    snprintf(name, sizeof name, "embedding_bwd %s N=%d repeat is bit-identical", prec(bf), N);
    check_true(name, !memcmp(g1.data(), g2.data(), g1.size() * 4), "two runs differ");
    cudaFree(dtok), cudaFree(dtab), cudaFree(dout_d), cudaFree(out), cudaFree(dt);
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    for (int bf = 0; bf < 2; bf++) {
        CudaCtx *c = cuda_ctx_create(bf, 0);
        one(c, 300, 24, 50);
        one(c, 2100, 64, 37);  // more than one 1024-token placement chunk
        one(c, 77, 13, 1000);  // odd width: scalar path
        if (!g_quick) {
            const int N = 16384, C = 4096, V = 128256;
            const size_t es = bf ? 2 : 4;
            std::vector<int32_t> tok(N);
            for (auto &t : tok) t = (int)(urand() * V);
            void *dtok = up_bytes(tok.data(), N * 4), *tab = dmalloc((size_t)V * C * es), *o = dmalloc((size_t)N * C * es);
            float *dtab = (float *)dmalloc((size_t)V * C * 4);
            dev_noise(tab, (size_t)V * C * es, es);
            CUDA_CHECK(dev_memset(dtab, 0, (size_t)V * C * 4));
            CUDA_CHECK(dev_memset(o, 0, (size_t)N * C * es));
            char name[64];
            snprintf(name, sizeof name, "embedding_fwd %s N=%d C=%d", prec(bf), N, C);
            report_bw(name, bench_ms(c, 20, [&] { k_embedding_fwd(c, o, (const int32_t *)dtok, tab, N, C); }), 2.0 * N * C * es);
            snprintf(name, sizeof name, "embedding_bwd %s N=%d C=%d V=%d", prec(bf), N, C, V);
            report_bw(name, bench_ms(c, 10, [&] { k_embedding_bwd(c, dtab, o, (const int32_t *)dtok, N, C, V); }), N * C * (es + 8.0));
            cudaFree(dtok), cudaFree(tab), cudaFree(o), cudaFree(dtab);
        }
        cuda_ctx_destroy(c);
    }
    return dev_finish("embedding");
}
