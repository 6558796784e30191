// dev/cuda/grad_accum.cu: parameter gradients accumulate in fp32 with bf16 activations.
//
// Every op that adds into a weight gradient, called through the Backend table as model.c calls
// it (bf16 act precision): matmul_dw (linear and LoRA weights, both transpose pairs),
// bias_grad, rmsnorm_bwd's dw (norms, q/k norms), layernorm_bwd's dw and db, embedding_bwd,
// pos_bwd, classifier_ce's dW, and accumulate_f32 (ZeRO-3's reduced pieces). Each starts from a
// large gradient (1..3 in magnitude) and adds 64 small contributions (about 1e-4 of it: four
// input variants in turn), as 64 micro-batches, MLP chunks or attention tiles would; the result
// is checked against a double reference at fp32 tolerance (1e-5 normwise). Summed in bf16 the
// contributions vanish (bf16's spacing at 1 is 2^-7): the same sums rounded to bf16 after each
// call are computed on the host and must miss the tolerance by 100x or more, so the test would
// fail if the gradients were bf16. The matmul also runs the old path (k_matmul into a bf16 C
// with beta 1), which fails likewise.
#include "dev_common.cuh"
extern "C" {
#include "llmc/backend.h"
}

#define CALLS 64
#define VARIANTS 4
static const double TOL = 1e-5;

static float bf(double x) { return host_bf2f(host_f2bf((float)x)); }

// A large starting gradient: magnitudes 1..3, both signs.
static std::vector<float> big_grad(size_t n) {
    std::vector<float> g(n);
    for (auto &v : g) v = (float)((urand() < 0.5 ? -1 : 1) * (1.0 + 2.0 * urand()));
    return g;
}

static float *up_grad(Backend *bk, const std::vector<float> &g) {
    float *d = (float *)bk->dev_alloc(bk, g.size() * sizeof(float), "gradient");
    bk->copy_h2d(bk, d, g.data(), g.size() * sizeof(float), NULL);
    bk->sync(bk);
    return d;
}
static void *up(Backend *bk, const std::vector<float> &x) {  // x already rounded to bf16
    void *d = bk->dev_alloc(bk, x.size() * 2, "act");
    bk->upload_act(bk, d, x.data(), x.size());
    return d;
}
static std::vector<float> down_grad(Backend *bk, const float *d, size_t n) {
    std::vector<float> h(n);
    bk->sync(bk);
    bk->copy_d2h(bk, h.data(), d, n * sizeof(float), NULL);
    bk->sync(bk);
    return h;
}

// Runs `call(variant)` CALLS times on the device, compares with g0 + sum of contrib[variant]
// (double), and with what bf16 accumulation of the same contributions would give.
template <class F>
static void accumulate_case(Backend *bk, const char *name, const std::vector<float> &g0, float *dg,
                            const std::vector<std::vector<double>> &contrib, F call) {
    const size_t n = g0.size();
    std::vector<double> ref(g0.begin(), g0.end()), as_bf16(g0.begin(), g0.end());
    for (int k = 0; k < CALLS; k++) {
        call(k % VARIANTS);
        const std::vector<double> &c = contrib[k % VARIANTS];
        for (size_t i = 0; i < n; i++) ref[i] += c[i], as_bf16[i] = bf(as_bf16[i] + bf(c[i]));
    }
    char label[200];
    snprintf(label, sizeof label, "%s: %d small contributions onto a large float gradient, bf16 activations", name, CALLS);
    check(label, down_grad(bk, dg, n), ref, TOL);
    double emax = 0, rmax = 0;
    for (size_t i = 0; i < n; i++) emax = fmax(emax, fabs(as_bf16[i] - ref[i])), rmax = fmax(rmax, fabs(ref[i]));
    char detail[160];
    snprintf(detail, sizeof detail, "bf16 sums err %.3g, not past 100x the tolerance: the case would not catch them",
             emax / rmax);
    snprintf(label, sizeof label, "%s: the same sums in bf16 would err by %.2e (> 100 x %.0e)", name, emax / rmax, TOL);
    check_true(label, emax / rmax > 100 * TOL, detail);
}

static std::vector<float> small_act(size_t n, double scale) {
    std::vector<float> x = randn(n, scale);
    round_act(x, 1);
    return x;
}

static void case_matmul(Backend *bk, CudaCtx *raw, int ta, int tb) {
    const int M = 24, N = 40, K = 16;  // dW[M,N] += op(A)[M,K] op(B)[K,N]
    std::vector<float> g0 = big_grad((size_t)M * N);
    std::vector<std::vector<float>> A(VARIANTS), B(VARIANTS);
    std::vector<std::vector<double>> contrib(VARIANTS, std::vector<double>((size_t)M * N, 0.0));
    std::vector<void *> dA(VARIANTS), dB(VARIANTS);
    const float alpha = 0.5f;
    for (int v = 0; v < VARIANTS; v++) {
        A[v] = small_act((size_t)M * K, 0.01), B[v] = small_act((size_t)K * N, 0.01);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0;
                for (int k = 0; k < K; k++)
                    s += (double)(ta ? A[v][(size_t)k * M + i] : A[v][(size_t)i * K + k]) *
                         (tb ? B[v][(size_t)j * K + k] : B[v][(size_t)k * N + j]);
                contrib[v][(size_t)i * N + j] = alpha * s;
            }
        dA[v] = up(bk, A[v]), dB[v] = up(bk, B[v]);
    }
    float *dg = up_grad(bk, g0);
    char name[96];
    snprintf(name, sizeof name, "matmul_dw ta%d tb%d (linear / LoRA weight)", ta, tb);
    accumulate_case(bk, name, g0, dg, contrib, [&](int v) { bk->matmul_dw(bk, dg, dA[v], dB[v], M, N, K, ta, tb, alpha); });
    // The path before gradients were float: the same GEMMs into a bf16 gradient with beta 1.
    std::vector<float> g0b = g0;
    round_act(g0b, 1);
    void *db16 = up_act(g0b, 1);
    std::vector<double> ref(g0b.begin(), g0b.end());
    for (int k = 0; k < CALLS; k++) {
        k_matmul(raw, db16, dA[k % VARIANTS], dB[k % VARIANTS], M, N, K, ta, tb, alpha, 1.0f);
        for (size_t i = 0; i < ref.size(); i++) ref[i] += contrib[k % VARIANTS][i];
    }
    CUDA_CHECK(cudaStreamSynchronize(raw->stream));
    std::vector<float> got = down_act(db16, ref.size(), 1);
    double emax = 0, rmax = 0;
    for (size_t i = 0; i < ref.size(); i++) emax = fmax(emax, fabs(got[i] - ref[i])), rmax = fmax(rmax, fabs(ref[i]));
    snprintf(name, sizeof name, "matmul ta%d tb%d into a bf16 gradient (the old path) errs by %.2e (> 100 x %.0e)", ta, tb,
             emax / rmax, TOL);
    check_true(name, emax / rmax > 100 * TOL, "the old path passed: the case would not catch it");
    cudaFree(db16);
    for (int v = 0; v < VARIANTS; v++) bk->dev_free(bk, dA[v]), bk->dev_free(bk, dB[v]);
    bk->dev_free(bk, dg);
}

static void case_bias(Backend *bk) {
    const int N = 16, D = 40;
    std::vector<float> g0 = big_grad(D);
    std::vector<std::vector<double>> contrib(VARIANTS, std::vector<double>(D, 0.0));
    std::vector<void *> dy(VARIANTS);
    for (int v = 0; v < VARIANTS; v++) {
        std::vector<float> y = small_act((size_t)N * D, 1e-5);
        for (int n = 0; n < N; n++)
            for (int d = 0; d < D; d++) contrib[v][d] += y[(size_t)n * D + d];
        dy[v] = up(bk, y);
    }
    float *dg = up_grad(bk, g0);
    accumulate_case(bk, "bias_grad", g0, dg, contrib, [&](int v) { bk->bias_grad(bk, dg, dy[v], N, D); });
    for (auto p : dy) bk->dev_free(bk, p);
    bk->dev_free(bk, dg);
}

// RMSNorm (gpt2 0) or LayerNorm (1): the weight (and bias) gradients.
static void case_norm(Backend *bk, int layer) {
    const int N = 12, C = 48;
    std::vector<float> x = small_act((size_t)N * C, 1.0), w = small_act(C, 1.0), b = small_act(C, 1.0);
    std::vector<double> mu(N, 0.0), rs(N);
    for (int n = 0; n < N; n++) {
        double s = 0, ss = 0;
        if (layer)
            for (int k = 0; k < C; k++) s += x[(size_t)n * C + k];
        mu[n] = s / C;
        for (int k = 0; k < C; k++) ss += (x[(size_t)n * C + k] - mu[n]) * (x[(size_t)n * C + k] - mu[n]);
        rs[n] = 1.0 / sqrt(ss / C + 1e-5);
    }
    void *dx = up(bk, x), *dw = up(bk, w), *dbias = up(bk, b), *out = bk->dev_alloc(bk, (size_t)N * C * 2, "out");
    void *dxg = bk->dev_alloc(bk, (size_t)N * C * 2, "dx");
    bk->memzero(bk, dxg, (size_t)N * C * 2, NULL);
    float *stats = (float *)bk->dev_alloc(bk, 2 * N * sizeof(float), "stats");
    if (layer) bk->layernorm_fwd(bk, out, stats, stats + N, dx, dw, dbias, N, C, 1e-5f);
    else bk->rmsnorm_fwd(bk, out, stats, dx, dw, 0.0f, N, C, 1e-5f);
    std::vector<std::vector<double>> cw(VARIANTS, std::vector<double>(C, 0.0)), cb = cw;
    std::vector<void *> dy(VARIANTS);
    for (int v = 0; v < VARIANTS; v++) {
        std::vector<float> y = small_act((size_t)N * C, 1e-5);
        for (int n = 0; n < N; n++)
            for (int k = 0; k < C; k++) {
                const size_t i = (size_t)n * C + k;
                cw[v][k] += (double)y[i] * (x[i] - mu[n]) * rs[n];
                cb[v][k] += y[i];
            }
        dy[v] = up(bk, y);
    }
    std::vector<float> gw0 = big_grad(C), gb0 = big_grad(C);
    float *gw = up_grad(bk, gw0), *gb = up_grad(bk, gb0);
    if (layer) {
        accumulate_case(bk, "layernorm_bwd dw", gw0, gw, cw, [&](int v) {
            bk->layernorm_bwd(bk, dxg, gw, gb, dy[v], dx, dw, stats, stats + N, N, C);
        });
        // db advanced alongside: CALLS calls of the same variants
        std::vector<double> ref(gb0.begin(), gb0.end());
        for (int k = 0; k < CALLS; k++)
            for (int c = 0; c < C; c++) ref[c] += cb[k % VARIANTS][c];
        check("layernorm_bwd db: 64 small contributions onto a large float gradient, bf16 activations",
              down_grad(bk, gb, C), ref, TOL);
    } else {
        accumulate_case(bk, "rmsnorm_bwd dw (norms, q/k norms)", gw0, gw, cw, [&](int v) {
            bk->rmsnorm_bwd(bk, dxg, gw, dy[v], dx, dw, 0.0f, stats, N, C);
        });
    }
    for (auto p : dy) bk->dev_free(bk, p);
    bk->dev_free(bk, dx), bk->dev_free(bk, dw), bk->dev_free(bk, dbias), bk->dev_free(bk, out);
    bk->dev_free(bk, dxg), bk->dev_free(bk, stats), bk->dev_free(bk, gw), bk->dev_free(bk, gb);
}

static void case_embedding(Backend *bk) {
    const int N = 40, C = 32, V = 10;
    std::vector<int32_t> tok(N);
    for (int n = 0; n < N; n++) tok[n] = n % 3 == 0 ? 2 : (int)(urand() * V);
    int32_t *dtok = (int32_t *)bk->dev_alloc(bk, N * 4, "tokens");
    bk->copy_h2d(bk, dtok, tok.data(), N * 4, NULL);
    std::vector<float> g0 = big_grad((size_t)V * C);
    std::vector<std::vector<double>> contrib(VARIANTS, std::vector<double>((size_t)V * C, 0.0));
    std::vector<void *> dy(VARIANTS);
    for (int v = 0; v < VARIANTS; v++) {
        std::vector<float> y = small_act((size_t)N * C, 1e-5);
        for (int n = 0; n < N; n++)
            for (int k = 0; k < C; k++) contrib[v][(size_t)tok[n] * C + k] += y[(size_t)n * C + k];
        dy[v] = up(bk, y);
    }
    float *dg = up_grad(bk, g0);
    accumulate_case(bk, "embedding_bwd", g0, dg, contrib, [&](int v) { bk->embedding_bwd(bk, dg, dy[v], dtok, N, C, V); });
    for (auto p : dy) bk->dev_free(bk, p);
    bk->dev_free(bk, dtok), bk->dev_free(bk, dg);
}

static void case_pos(Backend *bk) {
    const int B = 3, T = 8, C = 24;
    std::vector<float> g0 = big_grad((size_t)T * C);
    std::vector<std::vector<double>> contrib(VARIANTS, std::vector<double>((size_t)T * C, 0.0));
    std::vector<void *> dy(VARIANTS);
    for (int v = 0; v < VARIANTS; v++) {
        std::vector<float> y = small_act((size_t)B * T * C, 1e-5);
        for (size_t i = 0; i < y.size(); i++) contrib[v][i % ((size_t)T * C)] += y[i];
        dy[v] = up(bk, y);
    }
    float *dg = up_grad(bk, g0);
    accumulate_case(bk, "pos_bwd (GPT-2 positions)", g0, dg, contrib, [&](int v) { bk->pos_bwd(bk, dg, dy[v], B, T, C); });
    for (auto p : dy) bk->dev_free(bk, p);
    bk->dev_free(bk, dg);
}

// The classifier's dW: its softmax gradient is rounded to bf16 (an activation) before the GEMM,
// so a contribution carries bf16-level error of its own; kept about 1e-5 of the gradient, that
// stays below the fp32 tolerance while bf16 sums still lose every contribution.
static void case_classifier(Backend *bk) {
    const int N = 6, V = 20, C = 16;
    std::vector<float> x = small_act((size_t)N * C, 1.0), W = small_act((size_t)V * C, 0.3);
    std::vector<int32_t> tgt(N);
    for (int n = 0; n < N; n++) tgt[n] = (int)(urand() * V);
    void *dx = up(bk, x), *dW = up(bk, W), *gx = bk->dev_alloc(bk, (size_t)N * C * 2, "dx");
    int32_t *dt = (int32_t *)bk->dev_alloc(bk, N * 4, "targets");
    bk->copy_h2d(bk, dt, tgt.data(), N * 4, NULL);
    float *losses = (float *)bk->dev_alloc(bk, N * 4, "losses");
    std::vector<double> one((size_t)V * C, 0.0), z(V);
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) {
            double d = 0;
            for (int k = 0; k < C; k++) d += (double)x[(size_t)n * C + k] * W[(size_t)v * C + k];
            z[v] = d, mx = fmax(mx, d);
        }
        for (int v = 0; v < V; v++) s += exp(z[v] - mx);
        for (int v = 0; v < V; v++) {
            const double g = exp(z[v] - mx) / s - (v == tgt[n]);
            for (int k = 0; k < C; k++) one[(size_t)v * C + k] += g * x[(size_t)n * C + k];
        }
    }
    const float scales[VARIANTS] = {1e-5f, 1.5e-5f, 2e-5f, 2.5e-5f};
    std::vector<std::vector<double>> contrib(VARIANTS, one);
    for (int v = 0; v < VARIANTS; v++)
        for (auto &c : contrib[v]) c *= scales[v];
    std::vector<float> g0 = big_grad((size_t)V * C);
    float *dg = up_grad(bk, g0);
    accumulate_case(bk, "classifier_ce dW (lm_head)", g0, dg, contrib, [&](int v) {
        bk->classifier_ce(bk, losses, gx, dg, dx, dW, dt, N, V, C, scales[v], 0);
    });
    bk->dev_free(bk, dx), bk->dev_free(bk, dW), bk->dev_free(bk, gx), bk->dev_free(bk, dt);
    bk->dev_free(bk, losses), bk->dev_free(bk, dg);
}

// ZeRO-3 adds each unit's reduced gradient into this rank's float piece.
static void case_accumulate_f32(Backend *bk) {
    const size_t n = 1000;
    std::vector<float> g0 = big_grad(n);
    std::vector<std::vector<double>> contrib(VARIANTS);
    std::vector<float *> dx(VARIANTS);
    for (int v = 0; v < VARIANTS; v++) {
        std::vector<float> x = randn(n, 1e-4);  // float pieces: not rounded
        contrib[v] = to_d(x);
        dx[v] = up_grad(bk, x);
    }
    float *dg = up_grad(bk, g0);
    accumulate_case(bk, "accumulate_f32 (ZeRO-3 pieces)", g0, dg, contrib, [&](int v) { bk->accumulate_f32(bk, dg, dx[v], n); });
    for (auto p : dx) bk->dev_free(bk, p);
    bk->dev_free(bk, dg);
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    Backend *bk = backend_cuda_create(1, 0);  // bf16 activations
    CudaCtx *raw = cuda_ctx_create(1, 0);     // for the old bf16-gradient GEMM path
    case_matmul(bk, raw, 1, 0);               // dW = dy^T x, as linear_bwd and lora_bwd call it
    case_matmul(bk, raw, 0, 1);
    case_bias(bk);
    case_norm(bk, 0);
    case_norm(bk, 1);
    case_embedding(bk);
    case_pos(bk);
    case_classifier(bk);
    case_accumulate_f32(bk);
    cuda_ctx_destroy(raw);
    check_true("everything freed", bk->mem.in_use == 0, "device allocations left");
    bk->destroy(bk);
    return dev_finish("grad_accum");
}
