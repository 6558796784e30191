// dev/cuda/elementwise.cu: add, accumulate, scale, add_bias, bias_grad, SwiGLU forward/backward
// (also with dgate aliasing dh), dropout (the mask must equal the CPU formula's bit for bit),
// each on a vector-friendly size, an odd size, and pointers offset by one element; then GB/s.
#include "dev_common.cuh"

static uint64_t cpu_bits(uint64_t seed, uint64_t i) {  // llmc/cpu/kernels.inc dropout_u, as an integer
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return (z ^ (z >> 31)) >> 11;
}
static int cpu_keep(uint64_t seed, uint64_t i, float p) {
    return (double)cpu_bits(seed, i) * (1.0 / 9007199254740992.0) >= p;
}

static void run(CudaCtx *c, size_t n, int off) {
    const int bf = c->bf16;
    const size_t es = bf ? 2 : 4;
    char name[128];
    std::vector<float> a = randn(n + 1), b = randn(n + 1), y0 = randn(n + 1);
    round_act(a, bf), round_act(b, bf), round_act(y0, bf);
    char *da = (char *)up_act(a, bf), *db = (char *)up_act(b, bf), *dy = (char *)up_act(y0, bf);
    const size_t o = off;
    auto ref_of = [&](auto f) {
        std::vector<double> r(n);
        for (size_t i = 0; i < n; i++) r[i] = f(i + o);
        return r;
    };
    auto got_of = [&](const void *d) {
        std::vector<float> g = down_act(d, n + 1, bf);
        return std::vector<float>(g.begin() + o, g.begin() + o + n);
    };
#define NAME(op) (snprintf(name, sizeof name, "%s %s n=%zu%s", op, prec(bf), n, off ? " misaligned" : ""), name)
    k_add(c, dy + o * es, da + o * es, db + o * es, n);
    check(NAME("add"), got_of(dy), ref_of([&](size_t i) { return (double)a[i] + b[i]; }), tol_for(bf));
    std::vector<float> y1 = got_of(dy);
    k_accumulate(c, dy + o * es, da + o * es, n);
    check(NAME("accumulate"), got_of(dy), ref_of([&](size_t i) { return (double)y1[i - o] + a[i]; }), tol_for(bf));
    k_scale(c, da + o * es, 0.37f, n);
    check(NAME("scale"), got_of(da), ref_of([&](size_t i) { return 0.37 * a[i]; }), tol_for(bf));
    // SwiGLU: h = silu(g) * u
    CUDA_CHECK(dev_copy(da, up_act(a, bf), (n + 1) * es, cudaMemcpyDeviceToDevice));
    void *dh = dmalloc((n + 1) * es);
    k_swiglu_fwd(c, (char *)dh + o * es, da + o * es, db + o * es, n);
    check(NAME("swiglu_fwd"), got_of(dh), ref_of([&](size_t i) { double g = a[i]; return g / (1 + exp(-g)) * b[i]; }), tol_for(bf));
    std::vector<float> d = randn(n + 1);
    round_act(d, bf);
    void *ddh = up_act(d, bf), *dg = dmalloc((n + 1) * es), *du = dmalloc((n + 1) * es);
    auto sig = [](double g) { return 1 / (1 + exp(-g)); };
    auto rdg = ref_of([&](size_t i) { double s = sig(a[i]); return d[i] * b[i] * s * (1 + a[i] * (1 - s)); });
    auto rdu = ref_of([&](size_t i) { return d[i] * a[i] * sig(a[i]); });
    k_swiglu_bwd(c, (char *)dg + o * es, (char *)du + o * es, (char *)ddh + o * es, da + o * es, db + o * es, n);
    check(NAME("swiglu_bwd dgate"), got_of(dg), rdg, tol_for(bf));
    check(NAME("swiglu_bwd dup"), got_of(du), rdu, tol_for(bf));
    k_swiglu_bwd(c, (char *)ddh + o * es, (char *)du + o * es, (char *)ddh + o * es, da + o * es, db + o * es, n);
    check(NAME("swiglu_bwd dgate aliasing dh"), got_of(ddh), rdg, tol_for(bf));
    // GeGLU (Gemma): h = gelu_tanh(g) * u, and its backward (dgate may alias dh)
    auto gk = sqrt(2.0 / M_PI);
    auto gt = [&](double g) { return tanh(gk * (g + 0.044715 * g * g * g)); };
    k_geglu_fwd(c, (char *)dh + o * es, da + o * es, db + o * es, n, 0);
    check(NAME("geglu_fwd"), got_of(dh), ref_of([&](size_t i) { return 0.5 * a[i] * (1 + gt(a[i])) * b[i]; }), tol_for(bf));
    void *d0 = up_act(d, bf);  // dh again: the aliased swiglu_bwd above overwrote it
    CUDA_CHECK(dev_copy(ddh, d0, (n + 1) * es, cudaMemcpyDeviceToDevice));
    cudaFree(d0);
    auto gdg = ref_of([&](size_t i) {
        double g = a[i], t = gt(g), dt = gk * (1 + 3 * 0.044715 * g * g);
        return d[i] * b[i] * (0.5 * (1 + t) + 0.5 * g * (1 - t * t) * dt);
    });
    auto gdu = ref_of([&](size_t i) { return d[i] * 0.5 * a[i] * (1 + gt(a[i])); });
    k_geglu_bwd(c, (char *)dg + o * es, (char *)du + o * es, (char *)ddh + o * es, da + o * es, db + o * es, n, 0);
    check(NAME("geglu_bwd dgate"), got_of(dg), gdg, tol_for(bf));
    check(NAME("geglu_bwd dup"), got_of(du), gdu, tol_for(bf));
    k_geglu_bwd(c, (char *)ddh + o * es, (char *)du + o * es, (char *)ddh + o * es, da + o * es, db + o * es, n, 0);
    check(NAME("geglu_bwd dgate aliasing dh"), got_of(ddh), gdg, tol_for(bf));
    // GeGLU with exact GELU (transformers' "gelu": g Phi(g), Phi by erf), and its backward
    auto phi = [](double g) { return 0.5 * (1 + erf(g / sqrt(2.0))); };
    k_geglu_fwd(c, (char *)dh + o * es, da + o * es, db + o * es, n, 1);
    check(NAME("geglu_fwd exact"), got_of(dh), ref_of([&](size_t i) { return a[i] * phi(a[i]) * b[i]; }), tol_for(bf));
    d0 = up_act(d, bf);  // dh again: the aliased geglu_bwd above overwrote it
    CUDA_CHECK(dev_copy(ddh, d0, (n + 1) * es, cudaMemcpyDeviceToDevice));
    cudaFree(d0);
    auto edg = ref_of([&](size_t i) {
        double g = a[i];
        return d[i] * b[i] * (phi(g) + g * exp(-0.5 * g * g) / sqrt(2 * M_PI));
    });
    auto edu = ref_of([&](size_t i) { return d[i] * a[i] * phi(a[i]); });
    k_geglu_bwd(c, (char *)dg + o * es, (char *)du + o * es, (char *)ddh + o * es, da + o * es, db + o * es, n, 1);
    check(NAME("geglu_bwd exact dgate"), got_of(dg), edg, tol_for(bf));
    check(NAME("geglu_bwd exact dup"), got_of(du), edu, tol_for(bf));
    k_geglu_bwd(c, (char *)ddh + o * es, (char *)du + o * es, (char *)ddh + o * es, da + o * es, db + o * es, n, 1);
    check(NAME("geglu_bwd exact dgate aliasing dh"), got_of(ddh), edg, tol_for(bf));
    // dropout: y = keep ? x / (1 - p) : 0, the CPU's mask exactly
    const float p = 0.3f;
    const uint64_t seed = 0x1234567890abcdefULL;
    const size_t first = 98765;
    k_dropout(c, (char *)dh + o * es, da + o * es, n, p, seed, first);
    std::vector<float> got = got_of(dh);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += (got[i] != 0.0f) != (cpu_keep(seed, first + i, p) && a[i + o] != 0.0f);
    char det[64];
    snprintf(det, sizeof det, "%zu of %zu mask bits differ", bad, n);
    check_true(NAME("dropout mask equals the CPU's"), bad == 0, det);
    const double keep = (float)(1.0 / (1.0 - p));
    check(NAME("dropout values"), got, ref_of([&](size_t i) { return cpu_keep(seed, first + i - o, p) ? a[i] * keep : 0.0; }), tol_for(bf));
    k_dropout(c, da + o * es, da + o * es, n, p, seed, first);  // in place
    std::vector<float> got2 = got_of(da);
    check_true(NAME("dropout in place"), !memcmp(got.data(), got2.data(), n * 4), "in-place result differs");
    cudaFree(da), cudaFree(db), cudaFree(dy), cudaFree(dh), cudaFree(ddh), cudaFree(dg), cudaFree(du);
}

static void bias(CudaCtx *c, int N, int D) {
    const int bf = c->bf16;
    char name[96];
    std::vector<float> y = randn((size_t)N * D), bvec = randn(D), db0 = randn(D);
    round_act(y, bf), round_act(bvec, bf);  // db0: a float gradient
    void *dy = up_act(y, bf), *dbias = up_act(bvec, bf);
    float *ddb = (float *)up_act(db0, 0);
    std::vector<double> r((size_t)N * D), rb(D);
    for (int n = 0; n < N; n++)
        for (int d = 0; d < D; d++) r[(size_t)n * D + d] = (double)y[(size_t)n * D + d] + bvec[d];
    k_add_bias(c, dy, dbias, N, D);
    snprintf(name, sizeof name, "add_bias %s %dx%d", prec(bf), N, D);
    check(name, down_act(dy, (size_t)N * D, bf), r, tol_for(bf));
    for (int d = 0; d < D; d++) {
        rb[d] = db0[d];
        for (int n = 0; n < N; n++) rb[d] += y[(size_t)n * D + d];
    }
    CUDA_CHECK(dev_copy(dy, up_act(y, bf), (size_t)N * D * (bf ? 2 : 4), cudaMemcpyDeviceToDevice));
    k_bias_grad(c, ddb, dy, N, D);
    snprintf(name, sizeof name, "bias_grad %s %dx%d", prec(bf), N, D);
    check(name, down_f32(ddb, D), rb, 1e-5);
    cudaFree(dy), cudaFree(dbias), cudaFree(ddb);
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    for (int bf = 0; bf < 2; bf++) {
        CudaCtx *c = cuda_ctx_create(bf, 0);
        run(c, 4096, 0);
        run(c, 1001, 0);
        run(c, 2048, 1);
        bias(c, 37, 24);
        bias(c, 300, 70);
        if (!g_quick) {
            const size_t n = (size_t)1 << 26, es = bf ? 2 : 4;
            void *x = dmalloc(n * es), *y = dmalloc(n * es), *z = dmalloc(n * es);
            dev_noise(x, n * es, es);
            dev_noise(y, n * es, es);
            char name[64];
            snprintf(name, sizeof name, "add %s n=2^26", prec(bf));
            report_bw(name, bench_ms(c, 20, [&] { k_add(c, z, x, y, n); }), 3.0 * n * es);
            snprintf(name, sizeof name, "swiglu_bwd %s n=2^26", prec(bf));
            report_bw(name, bench_ms(c, 20, [&] { k_swiglu_bwd(c, z, x, z, x, y, n); }), 5.0 * n * es);
            snprintf(name, sizeof name, "dropout %s n=2^26", prec(bf));
            report_bw(name, bench_ms(c, 20, [&] { k_dropout(c, z, x, n, 0.1f, 7, 0); }), 2.0 * n * es);
            cudaFree(x), cudaFree(y), cudaFree(z);
        }
        cuda_ctx_destroy(c);
    }
    return dev_finish("elementwise");
}
