// sgemm_roofline.c: the SGEMM-only time of one training step of a Llama-shaped model, with
// the OpenBLAS the trainer links. Every matrix product a float32 training step does is timed
// at its own shape with cblas_sgemm, best of --reps; the sum is the roofline the trainer is
// measured against (dev/bench_cpu.sh): what the step would cost if everything besides the
// GEMMs (norms, RoPE, softmax, SwiGLU, the optimizer) took no time.
//   per layer: q, k, v, o, gate, up, down projections: forward Y = X W^T, backward dX = dY W
//              and dW = dY^T X (3 GEMMs each);
//   attention per (row, head): S = Q K^T, O = P V forward; dP = dO V^T, dV = P^T dO,
//              dQ = dS K, dK = dS^T Q backward, at T x T, counted at half time (causal);
//   classifier: logits = X E^T, dX, dE.
//   build/sgemm_roofline --layers 4 --hidden 256 --inter 688 --heads 4 --kv 2 --vocab 256 --B 8 --T 256
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

char *openblas_get_config(void);
char *openblas_get_corename(void);
void openblas_set_num_threads(int);

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static float *buf(size_t n) {
    float *p = malloc(n * sizeof(float));
    if (!p) { fprintf(stderr, "error: out of memory (%zu floats)\n", n); exit(1); }
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    return p;
}

// Best time of reps runs of C[M,N] = op(A) op(B) (row-major), times `count` identical calls.
static double gemm_s(int ta, int tb, int M, int N, int K, int reps) {
    float *a = buf((size_t)M * K), *b = buf((size_t)K * N), *c = buf((size_t)M * N);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
                    1.0f, a, ta ? M : K, b, tb ? K : N, 0.0f, c, N);
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    free(a), free(b), free(c);
    return best;
}

// Forward and backward of a linear layer [N, in] -> [N, out].
static double linear_s(int N, int in, int out, int reps, double *flops) {
    *flops += 6.0 * N * in * out;
    return gemm_s(0, 1, N, out, in, reps) + gemm_s(0, 0, N, in, out, reps) + gemm_s(1, 0, out, in, N, reps);
}

int main(int argc, char **argv) {
    int L = 4, C = 256, FF = 688, Hq = 4, Hkv = 2, V = 256, B = 8, T = 256, reps = 5, threads = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--layers")) L = v;
        else if (!strcmp(argv[i], "--hidden")) C = v;
        else if (!strcmp(argv[i], "--inter")) FF = v;
        else if (!strcmp(argv[i], "--heads")) Hq = v;
        else if (!strcmp(argv[i], "--kv")) Hkv = v;
        else if (!strcmp(argv[i], "--vocab")) V = v;
        else if (!strcmp(argv[i], "--B")) B = v;
        else if (!strcmp(argv[i], "--T")) T = v;
        else if (!strcmp(argv[i], "--reps")) reps = v;
        else if (!strcmp(argv[i], "--threads")) threads = v;
        else { fprintf(stderr, "error: unknown option %s\n", argv[i]); return 2; }
    }
    if (threads > 0) openblas_set_num_threads(threads);
    const int N = B * T, D = C / Hq;
    double flops = 0, lin = 0, att = 0, cls = 0;
    // Identical layers: time one, count L.
    // k and v, gate and up share a shape: timed once, counted twice (time and flops).
    double kv = linear_s(N, C, Hkv * D, reps, &flops), gu = linear_s(N, C, FF, reps, &flops);
    flops += 6.0 * N * C * Hkv * D + 6.0 * N * C * FF;
    double one = linear_s(N, C, Hq * D, reps, &flops) + 2 * kv + linear_s(N, Hq * D, C, reps, &flops) + 2 * gu +
                 linear_s(N, FF, C, reps, &flops);
    lin = L * one;
    flops *= L;
    // Attention of one (row, head), causal half: 2 forward + 4 backward T x T x D products.
    double a1 = gemm_s(0, 1, T, T, D, reps) + gemm_s(0, 0, T, D, T, reps) + gemm_s(0, 1, T, T, D, reps) +
                gemm_s(1, 0, T, D, T, reps) + gemm_s(0, 0, T, D, T, reps) + gemm_s(1, 0, T, D, T, reps);
    att = 0.5 * a1 * (double)B * Hq * L;
    flops += 0.5 * 12.0 * T * T * D * (double)B * Hq * L;
    double fl = 0;
    cls = linear_s(N, C, V, reps, &fl);
    flops += fl;
    const double total = lin + att + cls;
    printf("openblas: %s | core %s | threads %d\n", openblas_get_config(), openblas_get_corename(), threads);
    printf("sgemm roofline: %.1f ms/step (linear %.1f, attention %.1f, classifier %.1f), %.0f tok/s, %.1f GFLOP/s\n",
           total * 1e3, lin * 1e3, att * 1e3, cls * 1e3, N / total, flops / total * 1e-9);
    printf("{\"ms\": %.3f, \"tokens_per_sec\": %.1f, \"gflops\": %.2f, \"core\": \"%s\"}\n", total * 1e3, N / total,
           flops / total * 1e-9, openblas_get_corename());
    return 0;
}
