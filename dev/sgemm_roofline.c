// sgemm_roofline.c: the SGEMM-only time of one training step of a Llama-shaped model, with
// the OpenBLAS the trainer links. Every matrix product a float32 training step does is timed
// at its own shape with cblas_sgemm, best of --reps, each the better of two ways to use n
// threads (alone and threaded by OpenBLAS, or n of them side by side, one a thread); the sum is
// the roofline the trainer is measured against (dev/bench_cpu.sh): what the step would cost if
// everything besides the GEMMs (norms, RoPE, softmax, SwiGLU, the optimizer) took no time. The
// second line gives the sums under each way alone.
//   per layer: q, k, v, o, gate, up, down projections: forward Y = X W^T, backward dX = dY W
//              and dW = dY^T X (3 GEMMs each);
//   attention per (row, head): S = Q K^T, O = P V forward; dP = dO V^T, dV = P^T dO,
//              dQ = dS K, dK = dS^T Q backward, at T x T, counted at half time (causal);
//   classifier: logits = X E^T, dX, dE.
//   build/sgemm_roofline --layers 4 --hidden 256 --inter 688 --heads 4 --kv 2 --vocab 256 --B 8 --T 256
// --shapes 1 also lists every shape's time (before the JSON line), in dev/gemm_calls.c's terms, to
// set against what the same products take inside a training step.
#include <cblas.h>
#include <omp.h>
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

static void gemm1(int ta, int tb, int M, int N, int K, const float *a, const float *b, float *c) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, a,
                ta ? M : K, b, tb ? K : N, 0.0f, c, N);
}

static int threads;  // --threads (0: OpenBLAS's default)
static int reps = 5;
enum { THREADED, SIDE, BEST };
static int sched = BEST;  // which schedule's times gemm_s returns

// Each shape is timed once, both ways; the step's sum is then taken under each schedule.
typedef struct { int ta, tb, M, N, K; double t[2]; } Timed;
static Timed timed[64];
static int ntimed;

static void time_both(Timed *e) {
    float *a = buf((size_t)e->M * e->K), *b = buf((size_t)e->K * e->N), *c = buf((size_t)e->M * e->N);
    e->t[THREADED] = e->t[SIDE] = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        gemm1(e->ta, e->tb, e->M, e->N, e->K, a, b, c);
        double dt = now_s() - t0;
        if (dt < e->t[THREADED]) e->t[THREADED] = dt;
    }
    free(a), free(b), free(c);
    const int n = threads > 0 ? threads : omp_get_max_threads();
    if (n < 2) {
        e->t[SIDE] = e->t[THREADED];
        return;
    }
    float **as = calloc(3 * (size_t)n, sizeof(float *));
    if (!as) { fprintf(stderr, "error: out of memory (%d threads' operands)\n", n); exit(1); }
    float **bs = as + n, **cs = as + 2 * n;
    for (int t = 0; t < n; t++) as[t] = buf((size_t)e->M * e->K), bs[t] = buf((size_t)e->K * e->N), cs[t] = buf((size_t)e->M * e->N);
    for (int r = 0; r < reps; r++) {
        double t0 = 0;
#pragma omp parallel num_threads(n)
        {
            const int t = omp_get_thread_num();
#pragma omp barrier
#pragma omp master
            t0 = now_s();
            gemm1(e->ta, e->tb, e->M, e->N, e->K, as[t], bs[t], cs[t]);
#pragma omp barrier
#pragma omp master
            {
                double dt = (now_s() - t0) / n;
                if (dt < e->t[SIDE]) e->t[SIDE] = dt;
            }
        }
    }
    for (int t = 0; t < n; t++) free(as[t]), free(bs[t]), free(cs[t]);
    free(as);
}

// The time of C[M,N] = op(A) op(B) (row-major) under `sched`, best of reps runs: the product
// alone, threaded by OpenBLAS (THREADED); n products side by side, each thread its own operands
// and a single-threaded GEMM inside a parallel region, at 1/n of their wall time (SIDE); or the
// better of the two (BEST, the roofline). A step has many independent products of each shape
// (heads, dx and dW, k and v), and at some shapes OpenBLAS's threading gains little (the
// attention's T x T x 64 products), so the threaded time alone would overstate the roofline.
static double gemm_s(int ta, int tb, int M, int N, int K) {
    Timed *e = NULL;
    for (int i = 0; i < ntimed && !e; i++)
        if (timed[i].ta == ta && timed[i].tb == tb && timed[i].M == M && timed[i].N == N && timed[i].K == K)
            e = &timed[i];
    if (!e) {
        if (ntimed == (int)(sizeof timed / sizeof *timed)) { fprintf(stderr, "error: too many shapes\n"); exit(1); }
        e = &timed[ntimed++];
        *e = (Timed){ta, tb, M, N, K, {0, 0}};
        time_both(e);
    }
    if (sched == BEST) return e->t[THREADED] < e->t[SIDE] ? e->t[THREADED] : e->t[SIDE];
    return e->t[sched];
}

// Forward and backward of a linear layer [N, in] -> [N, out].
static double linear_s(int N, int in, int out, double *flops) {
    *flops += 6.0 * N * in * out;
    return gemm_s(0, 1, N, out, in) + gemm_s(0, 0, N, in, out) + gemm_s(1, 0, out, in, N);
}

typedef struct { int L, C, FF, Hq, Hkv, V, B, T; } Shape;
typedef struct { double lin, att, cls, total, flops; } Step;

static Step step_s(const Shape *s) {
    const int N = s->B * s->T, D = s->C / s->Hq;
    Step r = {0};
    // Identical layers: time one, count L.
    // k and v, gate and up share a shape: timed once, counted twice (time and flops).
    double kv = linear_s(N, s->C, s->Hkv * D, &r.flops), gu = linear_s(N, s->C, s->FF, &r.flops);
    r.flops += 6.0 * N * s->C * s->Hkv * D + 6.0 * N * s->C * s->FF;
    double one = linear_s(N, s->C, s->Hq * D, &r.flops) + 2 * kv + linear_s(N, s->Hq * D, s->C, &r.flops) + 2 * gu +
                 linear_s(N, s->FF, s->C, &r.flops);
    r.lin = s->L * one;
    r.flops *= s->L;
    // Attention of one (row, head), causal half: 2 forward + 4 backward T x T x D products.
    const int T = s->T;
    double a1 = gemm_s(0, 1, T, T, D) + gemm_s(0, 0, T, D, T) + gemm_s(0, 1, T, T, D) + gemm_s(1, 0, T, D, T) +
                gemm_s(0, 0, T, D, T) + gemm_s(1, 0, T, D, T);
    r.att = 0.5 * a1 * (double)s->B * s->Hq * s->L;
    r.flops += 0.5 * 12.0 * T * T * D * (double)s->B * s->Hq * s->L;
    r.cls = linear_s(N, s->C, s->V, &r.flops);
    r.total = r.lin + r.att + r.cls;
    return r;
}

int main(int argc, char **argv) {
    Shape s = {4, 256, 688, 4, 2, 256, 8, 256};
    int shapes = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--layers")) s.L = v;
        else if (!strcmp(argv[i], "--hidden")) s.C = v;
        else if (!strcmp(argv[i], "--inter")) s.FF = v;
        else if (!strcmp(argv[i], "--heads")) s.Hq = v;
        else if (!strcmp(argv[i], "--kv")) s.Hkv = v;
        else if (!strcmp(argv[i], "--vocab")) s.V = v;
        else if (!strcmp(argv[i], "--B")) s.B = v;
        else if (!strcmp(argv[i], "--T")) s.T = v;
        else if (!strcmp(argv[i], "--reps")) reps = v;
        else if (!strcmp(argv[i], "--shapes")) shapes = v;
        else if (!strcmp(argv[i], "--threads")) threads = v;
        else { fprintf(stderr, "error: unknown option %s\n", argv[i]); return 2; }
    }
    if (threads > 0) openblas_set_num_threads(threads), omp_set_num_threads(threads);
    const int N = s.B * s.T;
    sched = BEST;
    const Step r = step_s(&s);
    sched = THREADED;
    const Step thr = step_s(&s);
    sched = SIDE;
    const Step side = step_s(&s);
    printf("openblas: %s | core %s | threads %d\n", openblas_get_config(), openblas_get_corename(), threads);
    printf("sgemm roofline: %.1f ms/step (linear %.1f, attention %.1f, classifier %.1f), %.0f tok/s, %.1f GFLOP/s\n",
           r.total * 1e3, r.lin * 1e3, r.att * 1e3, r.cls * 1e3, N / r.total, r.flops / r.total * 1e-9);
    printf("  each product threaded by OpenBLAS: %.1f ms (linear %.1f, attention %.1f); side by side, one a thread: "
           "%.1f ms (linear %.1f, attention %.1f)\n",
           thr.total * 1e3, thr.lin * 1e3, thr.att * 1e3, side.total * 1e3, side.lin * 1e3, side.att * 1e3);
    for (int i = 0; shapes && i < ntimed; i++) {
        const Timed *e = &timed[i];
        const double gf = 2.0 * e->M * e->N * e->K * 1e-9;
        printf("  ta %d tb %d M %5d N %5d K %5d  threaded %.3f ms (%.1f GFLOP/s)  side by side %.3f ms a product\n", e->ta,
               e->tb, e->M, e->N, e->K, e->t[THREADED] * 1e3, gf / e->t[THREADED], e->t[SIDE] * 1e3);
    }
    printf("{\"ms\": %.3f, \"tokens_per_sec\": %.1f, \"gflops\": %.2f, \"core\": \"%s\", \"threaded_ms\": %.3f, "
           "\"side_by_side_ms\": %.3f, \"linear_ms\": %.3f, \"attention_ms\": %.3f, \"classifier_ms\": %.3f}\n",
           r.total * 1e3, N / r.total, r.flops / r.total * 1e-9, openblas_get_corename(), thr.total * 1e3,
           side.total * 1e3, r.lin * 1e3, r.att * 1e3, r.cls * 1e3);
    return 0;
}
