// fma_peak.c: the float32 FMA peak of one core, the ceiling under dev/sgemm_roofline.c's figures.
// Twelve independent chains of vector FMAs (enough to cover the FMA latency on two ports), the
// widest vectors the compiler is allowed (-march=native: AVX-512 where the CPU has it), fastest
// of 5 runs. Run one copy per core at once to see whether the cores slow each other down (a
// shared FMA unit or a lower all-core clock would).
//   gcc -O3 -march=native -o build/fma_peak dev/fma_peak.c
//   taskset -c 0 build/fma_peak; (taskset -c 0 build/fma_peak & taskset -c 1 build/fma_peak; wait)
#include <stdio.h>
#include <time.h>

#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float vf __attribute__((vector_size(LANES * sizeof(float))));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define STEP(a) a = a * x + y  // contracted to one FMA (-O3, gnu mode)

int main(void) {
    const long n = 100000000;
    vf x, y, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11;
    for (int l = 0; l < LANES; l++) x[l] = 1.0000001f, y[l] = 0.9999999f;
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = a10 = a11 = y;
        const double t0 = now();
        for (long k = 0; k < n; k++) {
            // twelve independent chains in registers; the empty asm stops the compiler folding them
            __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));
            __asm__ volatile("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
            STEP(a0), STEP(a1), STEP(a2), STEP(a3), STEP(a4), STEP(a5);
            STEP(a6), STEP(a7), STEP(a8), STEP(a9), STEP(a10), STEP(a11);
        }
        const double t = now() - t0;
        if (t < best) best = t;
    }
    const vf s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
    printf("fma peak: %.1f GFLOP/s on one core (%d-lane float vectors, 12 chains, fastest of 5; checksum %g)\n",
           (double)n * 12 * LANES * 2 / best / 1e9, LANES, (double)s[0]);
    return 0;
}
