// sgemm_blocked.c: is there headroom over OpenBLAS in the linear layers' products? A blocked
// AVX-512 product y[M,N] = x[M,K] W[N,K]^T (the forward's layout), its weights packed once into
// 64-column blocks [N/64][K][64] (the layout such a kernel wants; packing is not timed), a 6 x 64
// register block (24 zmm accumulators) over K chunks of kc floats, every output one fma chain over k
// in order (a chunk reloads its accumulators from y, so chunking keeps the chain), timed against
// cblas_sgemm on the same operands, the two alternated, best of reps runs each, 1 thread. The check:
// every 97th row against a scalar fmaf chain, bit for bit. M must be a multiple of 6 and N of 64
// (a prototype: no edges).
//   B=/usr/lib/x86_64-linux-gnu/openblas-openmp; gcc -O3 -march=native -I/usr/include/x86_64-linux-gnu/openblas-openmp
//       dev/sgemm_blocked.c -o build/sgemm_blocked -L$B -lopenblas -lm
//   OPENBLAS_CORETYPE=Cooperlake OMP_NUM_THREADS=1 taskset -c 0 build/sgemm_blocked 2046 256 256
// Results: dev/results/cpu_performance_log.md (2026-12-03, 17:37-17:38 UTC).
#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef __AVX512F__
#error "sgemm_blocked.c is an AVX-512 prototype: build it with -march=native on an AVX-512 CPU"
#endif

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Rows [0, 6) of y's 64-column block += x's rows times the block's packed weights, k in [0, K):
// the accumulators start at zero on the first chunk (first) and from y after it.
static void block6x64(int K, const float *x, long ldx, const float *w, float *y, long ldy, int first) {
    __m512 acc[6][4];
    for (int i = 0; i < 6; i++)
        for (int v = 0; v < 4; v++) acc[i][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + i * ldy + 16 * v);
    for (int k = 0; k < K; k++, w += 64) {
        const __m512 b0 = _mm512_loadu_ps(w), b1 = _mm512_loadu_ps(w + 16), b2 = _mm512_loadu_ps(w + 32),
                     b3 = _mm512_loadu_ps(w + 48);
        for (int i = 0; i < 6; i++) {
            const __m512 s = _mm512_set1_ps(x[i * ldx + k]);
            acc[i][0] = _mm512_fmadd_ps(s, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(s, b1, acc[i][1]);
            acc[i][2] = _mm512_fmadd_ps(s, b2, acc[i][2]);
            acc[i][3] = _mm512_fmadd_ps(s, b3, acc[i][3]);
        }
    }
    for (int i = 0; i < 6; i++)
        for (int v = 0; v < 4; v++) _mm512_storeu_ps(y + i * ldy + 16 * v, acc[i][v]);
}

// K chunks of kc (a block's packed weights, kc x 64 floats, stay in L1 while every row group of
// the mc-row panel passes over them), then mc-row panels, then 64-column blocks.
static void gemm_blocked(int M, int N, int K, const float *x, const float *wp, float *y, int kc, int mc) {
    for (int k0 = 0; k0 < K; k0 += kc) {
        const int kn = K - k0 < kc ? K - k0 : kc;
        for (int i0 = 0; i0 < M; i0 += mc) {
            const int mn = M - i0 < mc ? M - i0 : mc;
            for (int jb = 0; jb < N / 64; jb++)
                for (int i = i0; i < i0 + mn; i += 6)
                    block6x64(kn, x + (long)i * K + k0, K, wp + ((long)jb * K + k0) * 64, y + (long)i * N + 64 * jb, N,
                              k0 == 0);
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s M N K [kc 128] [mc 96] [reps 15]\n", argv[0]);
        return 2;
    }
    const int M = atoi(argv[1]), N = atoi(argv[2]), K = atoi(argv[3]);
    const int kc = argc > 4 ? atoi(argv[4]) : 128, mc = argc > 5 ? atoi(argv[5]) : 96, reps = argc > 6 ? atoi(argv[6]) : 15;
    if (M <= 0 || N <= 0 || K <= 0 || M % 6 || N % 64 || mc % 6 || kc <= 0 || mc <= 0 || reps <= 0) {
        fprintf(stderr, "error: M a positive multiple of 6, N of 64, K > 0, kc > 0, mc a multiple of 6, reps > 0\n");
        return 2;
    }
    float *x = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K), *wp = malloc(sizeof(float) * N * K);
    float *y1 = malloc(sizeof(float) * M * N), *y2 = malloc(sizeof(float) * M * N);
    if (!x || !w || !wp || !y1 || !y2) {
        fprintf(stderr, "error: out of memory\n");
        return 1;
    }
    for (long i = 0; i < (long)M * K; i++) x[i] = sinf(0.37f * i);
    for (long i = 0; i < (long)N * K; i++) w[i] = cosf(0.21f * i);
    for (int j = 0; j < N; j++)
        for (int k = 0; k < K; k++) wp[((long)(j / 64) * K + k) * 64 + j % 64] = w[(long)j * K + k];
    double t_blas = 1e30, t_ours = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y1, N);
        if ((t = now_s() - t) < t_blas) t_blas = t;
        t = now_s();
        gemm_blocked(M, N, K, x, wp, y2, kc, mc);
        if ((t = now_s() - t) < t_ours) t_ours = t;
    }
    long bad = 0, checked = 0;
    for (int i = 0; i < M; i += 97)
        for (int j = 0; j < N; j++, checked++) {
            float s = 0;
            for (int k = 0; k < K; k++) s = fmaf(x[(long)i * K + k], w[(long)j * K + k], s);
            bad += memcmp(&s, &y2[(long)i * N + j], sizeof s) != 0;
        }
    const double gf = 2.0 * M * N * K * 1e-9;
    printf("%dx%dx%d kc %d mc %d: OpenBLAS %.1f GFLOP/s, blocked %.1f GFLOP/s; %ld of %ld checked outputs differ from "
           "the fma chain\n",
           M, N, K, kc, mc, gf / t_blas, gf / t_ours, bad, checked);
    free(x), free(w), free(wp), free(y1), free(y2);
    return bad != 0;
}
