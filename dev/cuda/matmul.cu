// dev/cuda/matmul.cu: k_matmul / k_matmul_f32out (cuBLASLt, row-major with transposes and
// alpha/beta) against a double reference; every transpose pair, beta 0 and 0.5, pointers
// offset by one element (less aligned than cuBLASLt assumes by default); then TFLOP/s.
#include "dev_common.cuh"

static void ref_mm(std::vector<double> &C, const std::vector<float> &A, const std::vector<float> &B, int M, int N,
                   int K, int ta, int tb, double alpha, double beta) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)(ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k]) * (tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j]);
            C[(size_t)i * N + j] = alpha * s + beta * C[(size_t)i * N + j];
        }
}

static void one(CudaCtx *c, int M, int N, int K, int ta, int tb, float beta, int offset, int f32out) {
    const int bf = c->bf16;
    std::vector<float> A = randn((size_t)M * K + 1), B = randn((size_t)K * N + 1), C0 = randn((size_t)M * N + 1);
    round_act(A, bf), round_act(B, bf);
    if (!f32out) round_act(C0, bf);
    char *dA = (char *)up_act(A, bf), *dB = (char *)up_act(B, bf);
    char *dC = (char *)(f32out ? up_act(C0, 0) : up_act(C0, bf));
    const size_t es = bf ? 2 : 4, cs = f32out ? 4 : es, o = offset ? 1 : 0;
    std::vector<float> Ao(A.begin() + o, A.end()), Bo(B.begin() + o, B.end());
    std::vector<double> ref(C0.begin() + o, C0.end());
    ref_mm(ref, Ao, Bo, M, N, K, ta, tb, 0.7, beta);
    if (f32out) k_matmul_f32out(c, (float *)(dC + o * cs), dA + o * es, dB + o * es, M, N, K, ta, tb, 0.7f, beta);
    else k_matmul(c, dC + o * cs, dA + o * es, dB + o * es, M, N, K, ta, tb, 0.7f, beta);
    std::vector<float> got = down_act(dC, (size_t)M * N + 1, f32out ? 0 : bf);
    std::vector<float> g2(got.begin() + o, got.end());
    ref.resize((size_t)M * N), g2.resize((size_t)M * N);
    char name[160];
    snprintf(name, sizeof name, "matmul %s%s %dx%dx%d ta%d tb%d beta%.1f%s", prec(bf), f32out ? " f32out" : "", M, N, K,
             ta, tb, beta, offset ? " misaligned" : "");
    check(name, g2, ref, f32out ? 1e-5 : tol_for(bf));
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    for (int bf = 0; bf < 2; bf++) {
        CudaCtx *c = cuda_ctx_create(bf, 0);
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                one(c, 33, 17, 29, ta, tb, 0.0f, 0, 0);
                one(c, 64, 48, 80, ta, tb, 0.5f, 0, 0);
                one(c, 31, 40, 24, ta, tb, 0.5f, 1, 0);
            }
        if (bf) one(c, 40, 72, 56, 0, 1, 0.0f, 0, 1), one(c, 40, 72, 56, 0, 1, 0.0f, 1, 1);
        if (!g_quick) {
            const int n = 4096;
            void *A = dmalloc((size_t)n * n * 4), *B = dmalloc((size_t)n * n * 4), *C = dmalloc((size_t)n * n * 4);
            dev_noise(A, (size_t)n * n * (bf ? 2 : 4), bf ? 2 : 4), dev_noise(B, (size_t)n * n * (bf ? 2 : 4), bf ? 2 : 4);
            for (int tb = 0; tb < 2; tb++) {
                double ms = bench_ms(c, 10, [&] { k_matmul(c, C, A, B, n, n, n, 0, tb, 1.0f, 0.0f); });
                char name[64];
                snprintf(name, sizeof name, "matmul %s %dx%dx%d tb%d", prec(bf), n, n, n, tb);
                report_flops(name, ms, 2.0 * n * n * n);
            }
            cudaFree(A), cudaFree(B), cudaFree(C);
        }
        cuda_ctx_destroy(c);
    }
    return dev_finish("matmul");
}
