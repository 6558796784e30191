// Scratch timing of 2026-12-03 (dev/results/cpu_performance_log.md, that day's 11:28 entry): the
// small benchmark step's SwiGLU and RMSNorm-backward sizes (2048 x 688 and 2048 x 256 floats),
// 2 threads. Kept as the record of those measurements, not built by the Makefile and not used by
// the trainer. Reproduce (links the AVX-512 kernel object of the build to measure; the figures
// "before" came from build 081acda's, "after" from 8f532bc's):
//   make build/llmc/cpu/kernels_f32_avx512.o build/llmc/util.o
//   gcc -O2 -fopenmp -mavx2 -mfma -mavx512f -mavx512bw -mavx512dq -mavx512vl
//       dev/results/scratch_elementwise_2026-12-03.c build/llmc/cpu/kernels_f32_avx512.o
//       build/llmc/util.o -o /tmp/ew -lm -lopenblas                     (one line)
//   OMP_NUM_THREADS=2 taskset -c 0,1 /tmp/ew rotate 16   # the kernels, buffers rotated over 16 sets
//   OMP_NUM_THREADS=2 taskset -c 0,1 /tmp/ew stream 16   # SwiGLU stored plainly vs streamed (below)
//   OMP_NUM_THREADS=1 taskset -c 0 /tmp/ew rms 512 20000 # RMSNorm backward, rows in cache, 1 thread
// rotate: SwiGLU forward and RMSNorm backward of the linked object, best and mean of 400 calls,
// the buffers rotated through S sets (1: 23 MB, 4: 93, 16: 371, 40: 928), so with many sets each
// call starts from memory. stream: this file's own copies of the AVX-512 SwiGLU loops, one with
// plain stores, one with streaming stores (the same arithmetic as kernels.inc), best and mean of
// 300 (written after the log's first stream figures, which came from the build's kernel against
// a streamed copy; this is the like-for-like form). rms: repeated calls of the linked
// rmsnorm_bwd on N rows (time the run with /usr/bin/time).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define EXPV 16
#include "../../llmc/cpu/vexp.h"

void swiglu_fwd_f32_avx512(float *h, const float *g, const float *u, size_t n);
void rmsnorm_bwd_f32_avx512(float *dx, float *dw, const float *dy, const float *x, const float *w0, float w_add,
                            const float *rstd, int N, int C);

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static float *buf(size_t n) {
    float *p = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
    if (!p) { fprintf(stderr, "error: out of memory\n"); exit(1); }
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    return p;
}

static void fwd(float *h, const float *gate, const float *up, size_t n, int st) {
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (size_t i = 0; i < n; i += 16) {
            const vf g = _mm512_load_ps(gate + i);
            const vf y = vmul(vdiv(g, vadd(vset(1), vexpv(vneg(g)))), _mm512_load_ps(up + i));
            if (st) vstream(h + i, y);
            else _mm512_store_ps(h + i, y);
        }
        _mm_sfence();
    }
}
static void bwd(float *dgate, float *dup, const float *dh, const float *gate, const float *up, size_t n, int st) {
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (size_t i = 0; i < n; i += 16) {
            const vf g = _mm512_load_ps(gate + i), u = _mm512_load_ps(up + i), d = _mm512_load_ps(dh + i), one = vset(1);
            const vf s = vdiv(one, vadd(one, vexpv(vneg(g))));
            _mm512_store_ps(dgate + i, vmul(vmul(vmul(d, u), s), vadd(one, vmul(g, vsub(one, s)))));
            if (st) vstream(dup + i, vmul(vmul(d, g), s));
            else _mm512_store_ps(dup + i, vmul(vmul(d, g), s));
        }
        _mm_sfence();
    }
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s rotate|stream SETS | rms ROWS CALLS\n", argv[0]); return 1; }
    const int S = atoi(argv[2]), N = 2048, C = 256;
    const size_t n = (size_t)N * 688;
    if (!strcmp(argv[1], "rms")) {
        const int reps = argc > 3 ? atoi(argv[3]) : 1000;
        float *dx = buf((size_t)S * C), *dy = buf((size_t)S * C), *x = buf((size_t)S * C), *w = buf(C), *dw = buf(C), *r = buf(S);
        for (int k = 0; k < reps; k++) rmsnorm_bwd_f32_avx512(dx, dw, dy, x, w, 0, r, S, C);
        printf("%g\n", dx[5]);
        return 0;
    }
    if (S < 1 || S > 64) { fprintf(stderr, "error: SETS %d: expected 1-64\n", S); return 1; }
    float *g[64], *u[64], *h[64], *d[64], *dx[64], *dy[64], *x[64];
    for (int s = 0; s < S; s++) g[s] = buf(n), u[s] = buf(n), h[s] = buf(n), d[s] = buf(n), dx[s] = buf((size_t)N * C),
                                dy[s] = buf((size_t)N * C), x[s] = buf((size_t)N * C);
    float *w = buf(C), *dw = buf(C), *r = buf(N);
    for (int i = 0; i < N; i++) r[i] = 1;
    if (!strcmp(argv[1], "rotate")) {
        double b[2] = {1e9, 1e9}, m[2] = {0};
        for (int k = 0; k < 400; k++) {
            const int s = k % S;
            double t = now();
            swiglu_fwd_f32_avx512(h[s], g[s], u[s], n);
            t = now() - t, b[0] = t < b[0] ? t : b[0], m[0] += t;
            t = now();
            rmsnorm_bwd_f32_avx512(dx[s], dw, dy[s], x[s], w, 0, r, N, C);
            t = now() - t, b[1] = t < b[1] ? t : b[1], m[1] += t;
        }
        printf("sets %d: swiglu_fwd best %.1f mean %.1f us; rmsnorm_bwd best %.1f mean %.1f us\n", S, b[0] * 1e6,
               m[0] / 400 * 1e6, b[1] * 1e6, m[1] / 400 * 1e6);
    } else {  // stream
        double b[4] = {1e9, 1e9, 1e9, 1e9}, m[4] = {0};
        for (int k = 0; k < 300; k++)
            for (int v = 0; v < 4; v++) {
                const int s = k % S;
                double t = now();
                if (v < 2) fwd(h[s], g[s], u[s], n, v);
                else bwd(h[s], d[s], h[s], g[s], u[s], n, v - 2);
                t = now() - t, b[v] = t < b[v] ? t : b[v], m[v] += t;
            }
        printf("sets %d (best/mean us): fwd %.0f/%.0f streamed %.0f/%.0f; bwd %.0f/%.0f streamed %.0f/%.0f\n", S,
               b[0] * 1e6, m[0] / 300 * 1e6, b[1] * 1e6, m[1] / 300 * 1e6, b[2] * 1e6, m[2] / 300 * 1e6, b[3] * 1e6,
               m[3] / 300 * 1e6);
    }
    return 0;
}
