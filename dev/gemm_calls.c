// gemm_calls.c: times every cblas_sgemm call of a program by shape (an LD_PRELOAD shim), to see
// which matrix products of a training step are slow against dev/sgemm_roofline.c's figures.
// At exit it prints, per (transposes, M, N, K, beta != 0): calls, mean and total time, GFLOP/s.
// Times are wall time per call, so calls made inside a parallel region add up across threads.
//   gcc -O2 -fopenmp -shared -fPIC -o build/gemm_calls.so dev/gemm_calls.c -ldl
//       -I/usr/include/x86_64-linux-gnu/openblas-openmp    (one line)
//   LD_PRELOAD=build/gemm_calls.so ./train_llama -c cfg.yaml --set num_threads=1
// GEMM_CALLS_SKIP=n leaves out the program's first n calls: a run's first step pays for the
// first touch of its buffers (page faults, slow on VMs), which would otherwise weigh on the
// means. Twice the count a 1-step run reports leaves the steady state (small shape: 174 calls
// at 1 thread, 200 at 2).
#define _GNU_SOURCE
#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*sgemm_fn)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE, const enum CBLAS_TRANSPOSE,
                         const blasint, const blasint, const blasint, const float, const float *, const blasint,
                         const float *, const blasint, const float, float *, const blasint);
typedef struct { int ta, tb, M, N, K, beta; double s; long n; } Shape;

static sgemm_fn real_sgemm;
static Shape shapes[512];
static int nshapes, ncalls;
static long skip = -1;  // GEMM_CALLS_SKIP

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void report(void) {
    double total = 0;
    for (int i = 0; i < nshapes; i++) total += shapes[i].s;
    fprintf(stderr, "cblas_sgemm: %d calls (the first %ld left out), %.1f ms in all\n", ncalls, skip, total * 1e3);
    for (int i = 0; i < nshapes; i++) {
        const Shape *e = &shapes[i];
        fprintf(stderr, "  ta %d tb %d M %5d N %5d K %5d beta %d  calls %7ld  mean %.3f ms  total %8.1f ms  %6.1f GFLOP/s\n",
                e->ta, e->tb, e->M, e->N, e->K, e->beta, e->n, e->s / e->n * 1e3, e->s * 1e3,
                2.0 * e->M * e->N * e->K * e->n / e->s * 1e-9);
    }
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init(void) {
    real_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    if (!real_sgemm) { fprintf(stderr, "gemm_calls: no cblas_sgemm to wrap\n"); abort(); }
    const char *e = getenv("GEMM_CALLS_SKIP");
    skip = e ? atol(e) : 0;
    atexit(report);
}

void cblas_sgemm(const enum CBLAS_ORDER o, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,
                 const blasint M, const blasint N, const blasint K, const float alpha, const float *A,
                 const blasint lda, const float *B, const blasint ldb, const float beta, float *C,
                 const blasint ldc) {
    pthread_once(&once, init);  // first calls may come from several threads at once
    const double t0 = now_s();
    real_sgemm(o, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    const double dt = now_s() - t0;
    const Shape key = {ta == CblasTrans, tb == CblasTrans, M, N, K, beta != 0, 0, 0};
    if (__atomic_add_fetch(&ncalls, 1, __ATOMIC_RELAXED) <= skip) return;
    #pragma omp critical(gemm_calls)
    {
        int i = 0;
        while (i < nshapes && !(shapes[i].ta == key.ta && shapes[i].tb == key.tb && shapes[i].M == M &&
                                shapes[i].N == N && shapes[i].K == K && shapes[i].beta == key.beta))
            i++;
        if (i == nshapes && nshapes < 512) shapes[nshapes++] = key;
        if (i < nshapes) shapes[i].s += dt, shapes[i].n++;
    }
}
