// dev/cuda/reduce.cu: k_sumsq (of a float gradient, in both act precisions) and k_sum_f32
// (double, fixed-order) against a double sum (relative 1e-12: only the order of double additions
// differs), and bit-identical repeats.
#include "dev_common.cuh"

int main(int argc, char **argv) {
    dev_init(argc, argv);
    for (int bf = 0; bf < 2; bf++) {
        CudaCtx *c = cuda_ctx_create(bf, 0);
        const size_t sizes[] = {1, 1000, 100003, (size_t)1 << 20};
        for (size_t n : sizes) {
            std::vector<float> x = randn(n, 3.0);
            float *dx = (float *)up_act(x, 0);  // gradients are float whatever the act precision
            double ss = 0, s = 0;
            for (float v : x) ss += (double)v * v, s += v;
            double g1 = k_sumsq(c, dx, n), g2 = k_sumsq(c, dx, n);
            char name[96];
            snprintf(name, sizeof name, "sumsq %s n=%zu", prec(bf), n);
            check(name, {(float)(g1 / ss - 1.0)}, {0.0}, 1e-12);
            snprintf(name, sizeof name, "sumsq %s n=%zu repeat is bit-identical", prec(bf), n);
            check_true(name, !memcmp(&g1, &g2, 8), "two runs differ");
            if (!bf) {
                void *fx = up_act(x, 0);
                double a = k_sum_f32(c, (const float *)fx, n), b = k_sum_f32(c, (const float *)fx, n);
                snprintf(name, sizeof name, "sum_f32 n=%zu", n);
                check(name, {(float)(a - s)}, {0.0}, 1e-9 * (fabs(s) + 1));
                snprintf(name, sizeof name, "sum_f32 n=%zu repeat is bit-identical", n);
                check_true(name, !memcmp(&a, &b, 8), "two runs differ");
                cudaFree(fx);
            }
            cudaFree(dx);
        }
        {  // the list form: every sum k_sumsq's bits, one wait (lengths 0 and 1 included)
            const size_t lens[] = {1000, 0, 1, 100003, 7, (size_t)1 << 20, 33};
            const int k = (int)(sizeof lens / sizeof *lens);
            std::vector<float *> xs(k);
            for (int i = 0; i < k; i++) xs[i] = (float *)up_act(randn(lens[i] ? lens[i] : 1, 1.0 + i), 0);
            std::vector<double> each(k, -1.0);
            k_sumsq_many(c, xs.data(), lens, k, each.data());
            int same = 1;
            for (int i = 0; i < k; i++) {
                const double one = k_sumsq(c, xs[i], lens[i]);
                same &= !memcmp(&one, &each[i], 8);
            }
            char name[96];
            snprintf(name, sizeof name, "sumsq_many %s: %d tensors, each bit-identical to sumsq", prec(bf), k);
            check_true(name, same, "a sum differs from sumsq's");
            for (float *p : xs) cudaFree(p);
        }
        if (!g_quick) {
            const size_t n = (size_t)1 << 28, es = 4;
            float *x = (float *)dmalloc(n * es);
            dev_noise(x, n * es, es);
            char name[64];
            snprintf(name, sizeof name, "sumsq %s n=2^28 (incl. host sync)", prec(bf));
            report_bw(name, bench_ms(c, 10, [&] { k_sumsq(c, x, n); }), (double)n * es);
            cudaFree(x);
        }
        cuda_ctx_destroy(c);
    }
    return dev_finish("reduce");
}
