// dev/cuda/rmsnorm.cu: RMSNorm forward (out, rstd) and backward (dx accumulated onto a nonzero
// dx, dw accumulated in a fixed order into a float gradient, at fp32 tolerance in both
// precisions) against double references; then GB/s.
#include "dev_common.cuh"

// w_add 1: Gemma's norms, which apply 1 + w.
static void one(CudaCtx *c, int N, int C, float w_add) {
    const int bf = c->bf16;
    const float eps = 1e-5f;
    char name[96];
    std::vector<float> x = randn((size_t)N * C, 2.0), w = randn(C), dy = randn((size_t)N * C), dx0 = randn((size_t)N * C),
                       dw0 = randn(C);
    round_act(x, bf), round_act(w, bf), round_act(dy, bf), round_act(dx0, bf);  // dw0: a float gradient
    std::vector<double> out((size_t)N * C), rs(N), dx = to_d(dx0), dw = to_d(dw0);
    for (int n = 0; n < N; n++) {
        double ss = 0, dot = 0;
        for (int k = 0; k < C; k++) ss += (double)x[(size_t)n * C + k] * x[(size_t)n * C + k];
        double r = 1.0 / sqrt(ss / C + eps);
        rs[n] = r;
        for (int k = 0; k < C; k++) {
            size_t i = (size_t)n * C + k;
            const double wk = (double)(w[k] + w_add);  // added in float, as the kernel does
            out[i] = x[i] * r * wk;
            dot += wk * dy[i] * x[i];
            dw[k] += (double)dy[i] * x[i] * r;
        }
        for (int k = 0; k < C; k++) {
            size_t i = (size_t)n * C + k;
            dx[i] += r * (double)(w[k] + w_add) * dy[i] - x[i] * r * r * r / C * dot;
        }
    }
    void *dxi = up_act(x, bf), *dwi = up_act(w, bf), *dout = dmalloc((size_t)N * C * (bf ? 2 : 4));
    float *drs = (float *)dmalloc(N * 4);
    k_rmsnorm_fwd(c, dout, drs, dxi, dwi, w_add, N, C, eps);
    snprintf(name, sizeof name, "rmsnorm_fwd out %s %dx%d w+%g", prec(bf), N, C, w_add);
    check(name, down_act(dout, (size_t)N * C, bf), out, tol_for(bf));
    snprintf(name, sizeof name, "rmsnorm_fwd rstd %s %dx%d w+%g", prec(bf), N, C, w_add);
    check(name, down_f32(drs, N), rs, 1e-5);
    void *ddy = up_act(dy, bf), *ddx = up_act(dx0, bf);
    float *ddw = (float *)up_act(dw0, 0);
    k_rmsnorm_bwd(c, ddx, ddw, ddy, dxi, dwi, w_add, drs, N, C);
    snprintf(name, sizeof name, "rmsnorm_bwd dx %s %dx%d w+%g", prec(bf), N, C, w_add);
    check(name, down_act(ddx, (size_t)N * C, bf), dx, tol_for(bf));
    snprintf(name, sizeof name, "rmsnorm_bwd dw %s %dx%d w+%g", prec(bf), N, C, w_add);
    check(name, down_f32(ddw, C), dw, 1e-5);
    k_rmsnorm_bwd(c, ddx, NULL, ddy, dxi, dwi, w_add, drs, N, C);  // frozen weight: dw NULL
    cudaFree(dxi), cudaFree(dwi), cudaFree(dout), cudaFree(drs), cudaFree(ddy), cudaFree(ddx), cudaFree(ddw);
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    for (int bf = 0; bf < 2; bf++) {
        CudaCtx *c = cuda_ctx_create(bf, 0);
        one(c, 37, 96, 0.0f);
        one(c, 130, 100, 0.0f);  // not a multiple of the vector width
        one(c, 9, 1024, 0.0f);
        one(c, 37, 96, 1.0f);  // Gemma: 1 + w
        one(c, 130, 100, 1.0f);
        if (!g_quick) {
            const int N = 16384, C = 4096;
            const size_t es = bf ? 2 : 4;
            void *x = dmalloc((size_t)N * C * es), *w = dmalloc(C * es), *o = dmalloc((size_t)N * C * es),
                 *g = dmalloc((size_t)N * C * es);
            float *dw = (float *)dmalloc(C * 4);
            float *r = (float *)dmalloc(N * 4);
            dev_noise(x, (size_t)N * C * es, es);
            dev_noise(w, C * es, es);
            dev_noise(g, (size_t)N * C * es, es);
            char name[64];
            snprintf(name, sizeof name, "rmsnorm_fwd %s %dx%d", prec(bf), N, C);
            report_bw(name, bench_ms(c, 20, [&] { k_rmsnorm_fwd(c, o, r, x, w, 0.0f, N, C, 1e-5f); }), 2.0 * N * C * es);
            snprintf(name, sizeof name, "rmsnorm_bwd %s %dx%d", prec(bf), N, C);
            report_bw(name, bench_ms(c, 20, [&] { k_rmsnorm_bwd(c, o, dw, g, x, w, 0.0f, r, N, C); }), 5.0 * N * C * es);
            cudaFree(x), cudaFree(w), cudaFree(o), cudaFree(g), cudaFree(dw), cudaFree(r);
        }
        cuda_ctx_destroy(c);
    }
    return dev_finish("rmsnorm");
}
