// bench_attention.c: the CPU flash attention kernels (llmc/cpu/attention.inc) alone, forward and
// backward, at one shape: a check of the float kernel against the double one on the same inputs,
// then the best of --reps timed runs of each. For tile sizes and the like: build with another
// -DATT_BK or -DATT_BQ (make BUILD=/tmp/bk CFLAGS="-O3 -DATT_BK=128" /tmp/bk/bench_attention) and
// compare; ATT_BK must be a multiple of 16.
//   build/bench_attention --B 8 --T 256 --heads 4 --kv 2           # the bench model's layer
//   build/bench_attention --B 1 --T 1024 --heads 12 --kv 12        # the large shape's
// Threads: OMP_NUM_THREADS (pin with taskset for steady figures). Flops counted are the
// causal half of the six T x T products (forward S, O; backward dP, dV, dQ, dK), as
// dev/sgemm_roofline.c counts them; the kernel also recomputes S in the backward.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/cpu/kernels.h"

static double *rnd(size_t n, unsigned seed) {
    double *p = malloc(n * sizeof(double));
    if (!p) { fprintf(stderr, "error: out of memory (%zu doubles)\n", n); exit(1); }
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (double)(seed >> 8) / (1 << 24) * 2 - 1;
    }
    return p;
}

static float *to_f32(const double *x, size_t n) {
    float *p = malloc(n * sizeof(float));
    if (!p) { fprintf(stderr, "error: out of memory (%zu floats)\n", n); exit(1); }
    for (size_t i = 0; i < n; i++) p[i] = (float)x[i];
    return p;
}

// Largest |a - b| over the largest |b| (at least 1e-30), over n.
static double rel_err(const float *a, const double *b, size_t n) {
    double d = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]);
        if (e > d) d = e;
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return d / m;
}

int main(int argc, char **argv) {
    int B = 8, T = 256, Hq = 4, Hkv = 2, D = 64, reps = 10, window = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--B")) B = v;
        else if (!strcmp(argv[i], "--T")) T = v;
        else if (!strcmp(argv[i], "--heads")) Hq = v;
        else if (!strcmp(argv[i], "--kv")) Hkv = v;
        else if (!strcmp(argv[i], "--head-dim")) D = v;
        else if (!strcmp(argv[i], "--window")) window = v;
        else if (!strcmp(argv[i], "--reps")) reps = v;
        else { fprintf(stderr, "error: unknown option %s\n", argv[i]); return 1; }
    }
    if (B < 1 || T < 1 || D < 1 || Hkv < 1 || Hq < Hkv || Hq % Hkv || reps < 1) {
        fprintf(stderr, "error: need B, T, head-dim, reps >= 1 and heads a multiple of kv\n");
        return 1;
    }
    const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * Hq * T;
    double *q = rnd(nq, 1), *k = rnd(nk, 2), *v = rnd(nk, 3), *g = rnd(nq, 4);
    double *o = calloc(nq, sizeof(double)), *dq = calloc(nq, sizeof(double));
    double *dk = calloc(nk, sizeof(double)), *dv = calloc(nk, sizeof(double));
    float *qf = to_f32(q, nq), *kf = to_f32(k, nk), *vf = to_f32(v, nk), *gf = to_f32(g, nq);
    float *of = calloc(nq, sizeof(float)), *dqf = calloc(nq, sizeof(float));
    float *dkf = calloc(nk, sizeof(float)), *dvf = calloc(nk, sizeof(float));
    float *lse = calloc(nl, sizeof(float)), *lsef = calloc(nl, sizeof(float));
    if (!o || !dq || !dk || !dv || !of || !dqf || !dkf || !dvf || !lse || !lsef) {
        fprintf(stderr, "error: out of memory\n");
        return 1;
    }

    // Check: float against double on the same (float-representable) inputs.
    attention_fwd_f64(o, lse, q, k, v, B, T, 0, T, Hq, Hkv, D, window, NULL, 0, 0);
    attention_bwd_f64(dq, dk, dv, g, q, k, v, o, lse, B, T, 0, T, Hq, Hkv, D, window, NULL, 0, 0, 0);
    attention_fwd_f32(of, lsef, qf, kf, vf, B, T, 0, T, Hq, Hkv, D, window, NULL, 0, 0);
    attention_bwd_f32(dqf, dkf, dvf, gf, qf, kf, vf, of, lsef, B, T, 0, T, Hq, Hkv, D, window, NULL, 0, 0, 0);
    double eo = rel_err(of, o, nq), eq = rel_err(dqf, dq, nq), ek = rel_err(dkf, dk, nk), ev = rel_err(dvf, dv, nk);
    double worst = fmax(fmax(eo, eq), fmax(ek, ev));
    printf("check f32 vs f64: out %.1e dq %.1e dk %.1e dv %.1e (largest error / largest value) %s\n", eo,
           eq, ek, ev, worst < 1e-4 ? "ok" : "FAILED");

    double best_f = 1e30, best_b = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = omp_get_wtime();
        attention_fwd_f32(of, lsef, qf, kf, vf, B, T, 0, T, Hq, Hkv, D, window, NULL, 0, 0);
        double t1 = omp_get_wtime();
        attention_bwd_f32(dqf, dkf, dvf, gf, qf, kf, vf, of, lsef, B, T, 0, T, Hq, Hkv, D, window, NULL, 0, 0, 0);
        double t2 = omp_get_wtime();
        if (t1 - t0 < best_f) best_f = t1 - t0;
        if (t2 - t1 < best_b) best_b = t2 - t1;
    }
    const double half = 2.0 * B * Hq * (double)T * T * D / 2;  // one causal T x T product
    printf("attention B %d T %d heads %d/%d D %d window %d, %d threads, best of %d:\n", B, T, Hq,
           Hkv, D, window, omp_get_max_threads(), reps);
    printf("  forward  %8.2f ms (%.1f GFLOP/s counted)\n", best_f * 1e3, 2 * half / best_f * 1e-9);
    printf("  backward %8.2f ms (%.1f GFLOP/s counted)\n", best_b * 1e3, 4 * half / best_b * 1e-9);
    printf("  total    %8.2f ms\n", (best_f + best_b) * 1e3);
    free(q), free(k), free(v), free(g), free(o), free(dq), free(dk), free(dv);
    free(qf), free(kf), free(vf), free(gf), free(of), free(dqf), free(dkf), free(dvf), free(lse), free(lsef);
    return worst < 1e-4 ? 0 : 1;
}
