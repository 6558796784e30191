// dev/cuda/gpt2.cu: GPT-2's ops -- LayerNorm forward (out, mean, rstd) and backward (dx, dw, db
// accumulated onto nonzero float gradients, at fp32 tolerance in both precisions; dw/db NULL
// for a frozen norm), GELU (tanh) forward and
// backward (also with dx aliasing dout), learned positions forward and backward -- against
// double references; then GB/s.
#include "dev_common.cuh"

static void layernorm(CudaCtx *c, int N, int C) {
    const int bf = c->bf16;
    const float eps = 1e-5f;
    char name[96];
    std::vector<float> x = randn((size_t)N * C, 2.0), w = randn(C), b = randn(C), dy = randn((size_t)N * C),
                       dx0 = randn((size_t)N * C), dw0 = randn(C), db0 = randn(C);
    for (auto &v : x) v += 0.5f;
    round_act(x, bf), round_act(w, bf), round_act(b, bf), round_act(dy, bf), round_act(dx0, bf);
    // dw0, db0: float gradients
    std::vector<double> out((size_t)N * C), mu(N), rs(N), dx = to_d(dx0), dw = to_d(dw0), db = to_d(db0);
    for (int n = 0; n < N; n++) {
        double s = 0, ss = 0, sg = 0, sgx = 0;
        for (int k = 0; k < C; k++) s += x[(size_t)n * C + k];
        const double m = s / C;
        for (int k = 0; k < C; k++) ss += (x[(size_t)n * C + k] - m) * (x[(size_t)n * C + k] - m);
        const double r = 1.0 / sqrt(ss / C + eps);
        mu[n] = m, rs[n] = r;
        for (int k = 0; k < C; k++) {
            const size_t i = (size_t)n * C + k;
            const double xh = (x[i] - m) * r, g = (double)dy[i] * w[k];
            out[i] = xh * w[k] + b[k];
            sg += g, sgx += g * xh;
            dw[k] += dy[i] * xh, db[k] += dy[i];
        }
        for (int k = 0; k < C; k++) {
            const size_t i = (size_t)n * C + k;
            dx[i] += r * ((double)dy[i] * w[k] - sg / C - (x[i] - m) * r * sgx / C);
        }
    }
    const size_t es = bf ? 2 : 4;
    void *dxi = up_act(x, bf), *dwi = up_act(w, bf), *dbi = up_act(b, bf), *o = dmalloc((size_t)N * C * es);
    float *dmu = (float *)dmalloc(N * 4), *drs = (float *)dmalloc(N * 4);
    k_layernorm_fwd(c, o, dmu, drs, dxi, dwi, dbi, N, C, eps);
    snprintf(name, sizeof name, "layernorm_fwd out %s %dx%d", prec(bf), N, C);
    check(name, down_act(o, (size_t)N * C, bf), out, tol_for(bf));
    snprintf(name, sizeof name, "layernorm_fwd mean %s %dx%d", prec(bf), N, C);
    check(name, down_f32(dmu, N), mu, 1e-5);
    snprintf(name, sizeof name, "layernorm_fwd rstd %s %dx%d", prec(bf), N, C);
    check(name, down_f32(drs, N), rs, 1e-5);
    void *ddy = up_act(dy, bf), *ddx = up_act(dx0, bf);
    float *ddw = (float *)up_act(dw0, 0), *ddb = (float *)up_act(db0, 0);
    k_layernorm_bwd(c, ddx, ddw, ddb, ddy, dxi, dwi, dmu, drs, N, C);
    snprintf(name, sizeof name, "layernorm_bwd dx %s %dx%d", prec(bf), N, C);
    check(name, down_act(ddx, (size_t)N * C, bf), dx, tol_for(bf));
    snprintf(name, sizeof name, "layernorm_bwd dw %s %dx%d", prec(bf), N, C);
    check(name, down_f32(ddw, C), dw, 1e-5);
    snprintf(name, sizeof name, "layernorm_bwd db %s %dx%d", prec(bf), N, C);
    check(name, down_f32(ddb, C), db, 1e-5);
    k_layernorm_bwd(c, ddx, NULL, NULL, ddy, dxi, dwi, dmu, drs, N, C);  // frozen
    cudaFree(dxi), cudaFree(dwi), cudaFree(dbi), cudaFree(o), cudaFree(dmu), cudaFree(drs), cudaFree(ddy);
    cudaFree(ddx), cudaFree(ddw), cudaFree(ddb);
}

static void gelu_pos(CudaCtx *c, size_t n, int B, int T, int C) {
    const int bf = c->bf16;
    char name[96];
    const double K = 0.7978845608028654;
    std::vector<float> x = randn(n, 2.0), d = randn(n);
    round_act(x, bf), round_act(d, bf);
    std::vector<double> y(n), dx(n);
    for (size_t i = 0; i < n; i++) {
        const double v = x[i], u = K * (v + 0.044715 * v * v * v), t = tanh(u);
        y[i] = 0.5 * v * (1 + t);
        dx[i] = d[i] * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * K * (1 + 3 * 0.044715 * v * v));
    }
    void *dxin = up_act(x, bf), *dy = dmalloc(n * (bf ? 2 : 4)), *dd = up_act(d, bf);
    k_gelu_fwd(c, dy, dxin, n);
    snprintf(name, sizeof name, "gelu_fwd %s n=%zu", prec(bf), n);
    check(name, down_act(dy, n, bf), y, tol_for(bf));
    k_gelu_bwd(c, dd, dd, dxin, n);  // dx aliasing dout
    snprintf(name, sizeof name, "gelu_bwd (dx aliasing dout) %s n=%zu", prec(bf), n);
    check(name, down_act(dd, n, bf), dx, tol_for(bf));
    const size_t m = (size_t)B * T * C;
    std::vector<float> out0 = randn(m), wpe = randn((size_t)T * C), dwpe0 = randn((size_t)T * C);
    round_act(out0, bf), round_act(wpe, bf);  // dwpe0: a float gradient
    std::vector<double> ro(m), rw = to_d(dwpe0);
    for (size_t i = 0; i < m; i++) ro[i] = (double)out0[i] + wpe[i % ((size_t)T * C)], rw[i % ((size_t)T * C)] += out0[i];
    void *dout = up_act(out0, bf), *dwpe = up_act(wpe, bf);
    float *ddw = (float *)up_act(dwpe0, 0);
    k_pos_bwd(c, ddw, dout, B, T, C);
    k_pos_fwd(c, dout, dwpe, B, T, C);
    snprintf(name, sizeof name, "pos_fwd %s B=%d T=%d C=%d", prec(bf), B, T, C);
    check(name, down_act(dout, m, bf), ro, tol_for(bf));
    snprintf(name, sizeof name, "pos_bwd %s B=%d T=%d C=%d", prec(bf), B, T, C);
    check(name, down_f32(ddw, (size_t)T * C), rw, 1e-5);
    cudaFree(dxin), cudaFree(dy), cudaFree(dd), cudaFree(dout), cudaFree(dwpe), cudaFree(ddw);
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    for (int bf = 0; bf < 2; bf++) {
        CudaCtx *c = cuda_ctx_create(bf, 0);
        layernorm(c, 37, 96);
        layernorm(c, 70, 100);
        gelu_pos(c, 3001, 3, 17, 24);
        if (!g_quick) {
            const int N = 16384, C = 768;
            const size_t es = bf ? 2 : 4;
            void *x = dmalloc((size_t)N * C * es), *w = dmalloc(C * es), *b = dmalloc(C * es), *o = dmalloc((size_t)N * C * es);
            float *mu = (float *)dmalloc(N * 4), *rs = (float *)dmalloc(N * 4);
            dev_noise(x, (size_t)N * C * es, es);
            dev_noise(w, C * es, es);
            dev_noise(b, C * es, es);
            char name[64];
            snprintf(name, sizeof name, "layernorm_fwd %s %dx%d", prec(bf), N, C);
            report_bw(name, bench_ms(c, 20, [&] { k_layernorm_fwd(c, o, mu, rs, x, w, b, N, C, 1e-5f); }), 2.0 * N * C * es);
            snprintf(name, sizeof name, "gelu_fwd %s n=%d", prec(bf), N * C);
            report_bw(name, bench_ms(c, 20, [&] { k_gelu_fwd(c, o, x, (size_t)N * C); }), 2.0 * N * C * es);
            cudaFree(x), cudaFree(w), cudaFree(b), cudaFree(o), cudaFree(mu), cudaFree(rs);
        }
        cuda_ctx_destroy(c);
    }
    return dev_finish("gpt2");
}
