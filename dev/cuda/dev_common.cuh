// dev_common.cuh: helpers shared by the per-kernel test + benchmark programs in dev/cuda.
//
// Each program computes a reference on the CPU in double (written in the program, from the op's
// definition in backend.h / llmc/cpu/kernels.inc), runs the CUDA launcher on random inputs in
// float and in bf16 act precision, and prints one line per check:
//   PASS name (err E)       or       FAIL name: err E > tol T (worst element i: got G want W)
// err is normwise: max |got - ref| / max |ref| over the tensor (a cancelling, near-zero element
// would otherwise dominate an elementwise relative error). Tolerances: 1e-5 in float, 1e-2 in
// bf16, unless a check says otherwise. Inputs are rounded to bf16 before the reference sees
// them, so the bf16 error measures the kernel's own rounding.
// Then, unless --quick (the emulator runs --quick), timings with cudaEvents over repeated
// launches at a realistic size: "TIME name: t ms, B GB/s" or "... T TFLOP/s".
// Exit status 1 if any check failed.
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>
#include "llmc/cuda/kernels.cuh"

static int g_fail, g_pass, g_quick;

static void dev_init(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
}
static int dev_finish(const char *prog) {
    printf("%s: %d passed, %d failed\n", prog, g_pass, g_fail);
    return g_fail ? 1 : 0;
}

// xorshift64*: reproducible inputs
static uint64_t g_rng = 0x9E3779B97F4A7C15ULL;
static double urand() {
    g_rng ^= g_rng >> 12, g_rng ^= g_rng << 25, g_rng ^= g_rng >> 27;
    return (double)((g_rng * 2685821657736338717ULL) >> 11) * (1.0 / 9007199254740992.0);
}
static double nrand() {
    double u = urand() + 1e-300, v = urand();
    return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}
static std::vector<float> randn(size_t n, double scale = 1.0) {
    std::vector<float> x(n);
    for (auto &v : x) v = (float)(nrand() * scale);
    return x;
}

static uint16_t host_f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float host_bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// Rounds in place to what an act tensor of this precision holds.
static void round_act(std::vector<float> &x, int bf) {
    if (bf)
        for (auto &v : x) v = host_bf2f(host_f2bf(v));
}
static std::vector<double> to_d(const std::vector<float> &x) { return std::vector<double>(x.begin(), x.end()); }

// Plain cudaMemcpy / cudaMemset run on the legacy default stream, which does NOT order with the
// backend's compute stream (created cudaStreamNonBlocking): a plain copy followed by a kernel
// on c->stream races (a pageable host-to-device cudaMemcpy may return before its DMA lands; a
// cudaMemset is asynchronous). Every plain copy or memset here goes through these, fenced by
// device synchronisation on both sides. The emulator's stream-order check (dev/cuda/emu) fails
// a program that skips them.
static cudaError_t dev_copy(void *d, const void *s, size_t n, cudaMemcpyKind k) {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(d, s, n, k));
    return cudaDeviceSynchronize();
}
static cudaError_t dev_memset(void *d, int v, size_t n) {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemset(d, v, n));
    return cudaDeviceSynchronize();
}

// Device buffers.
static void *dmalloc(size_t bytes) {
    void *p;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}
// Timing inputs: uniform in [lo, hi), float when es is 4 and bf16 when 2, never zeros. A
// product of zeros runs faster than one of real data on Hopper (METHOD.md: 13% on an H200), and
// zeros hide unwritten outputs; the first GPU timings here (H200, 2026-11-27) were taken on
// memset zeros. Filled on the host (a fast LCG) and copied: only the timing sections use it.
static void dev_noise(void *d, size_t bytes, size_t es, float lo = -1.0f, float hi = 1.0f) {
    const size_t n = bytes / es;
    uint64_t x = g_rng ^ (uint64_t)bytes;
    auto next = [&] {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        return lo + (hi - lo) * (float)((x >> 40) * (1.0 / 16777216.0));
    };
    if (es == 2) {
        std::vector<uint16_t> h(n);
        for (auto &v : h) v = host_f2bf(next());
        CUDA_CHECK(dev_copy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
    } else {
        std::vector<float> h(n);
        for (auto &v : h) v = next();
        CUDA_CHECK(dev_copy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
    }
}
static void *up_act(const std::vector<float> &x, int bf) {
    void *d = dmalloc(x.size() * (bf ? 2 : 4));
    if (bf) {
        std::vector<uint16_t> h(x.size());
        for (size_t i = 0; i < x.size(); i++) h[i] = host_f2bf(x[i]);
        CUDA_CHECK(dev_copy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    } else {
        CUDA_CHECK(dev_copy(d, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    }
    return d;
}
static void *up_bytes(const void *x, size_t bytes) {
    void *d = dmalloc(bytes);
    CUDA_CHECK(dev_copy(d, x, bytes, cudaMemcpyHostToDevice));
    return d;
}
static std::vector<float> down_act(const void *d, size_t n, int bf) {
    std::vector<float> x(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (bf) {
        std::vector<uint16_t> h(n);
        CUDA_CHECK(dev_copy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) x[i] = host_bf2f(h[i]);
    } else {
        CUDA_CHECK(dev_copy(x.data(), d, n * 4, cudaMemcpyDeviceToHost));
    }
    return x;
}
static std::vector<float> down_f32(const float *d, size_t n) { return down_act(d, n, 0); }

// Normwise error of got against ref; reports a PASS/FAIL line.
static double check(const char *name, const std::vector<float> &got, const std::vector<double> &ref, double tol) {
    double emax = 0, rmax = 0;
    size_t worst = 0;
    int nan = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        double e = fabs((double)got[i] - ref[i]);
        if (isnan(got[i]) != isnan(ref[i])) nan = 1, worst = i;
        if (e > emax) emax = e, worst = i;
        if (fabs(ref[i]) > rmax) rmax = fabs(ref[i]);
    }
    double err = nan ? INFINITY : emax / (rmax > 0 ? rmax : 1.0);
    if (err <= tol) {
        printf("PASS %s (err %.2e)\n", name, err);
        g_pass++;
    } else {
        printf("FAIL %s: err %.3e > tol %.1e (worst element %zu: got %.8g want %.8g)\n", name, err, tol, worst,
               ref.empty() ? 0.0 : (double)got[worst], ref.empty() ? 0.0 : ref[worst]);
        g_fail++;
    }
    return err;
}
static void check_true(const char *name, int ok, const char *detail) {
    if (ok) printf("PASS %s\n", name), g_pass++;
    else printf("FAIL %s: %s\n", name, detail), g_fail++;
}
static double tol_for(int bf) { return bf ? 1e-2 : 1e-5; }
static const char *prec(int bf) { return bf ? "bf16" : "fp32"; }

// Mean time of fn over iters launches (after warmup), in ms.
template <class F> static double bench_ms(CudaCtx *c, int iters, F fn) {
    for (int i = 0; i < 2; i++) fn();
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    CUDA_CHECK(cudaEventRecord(a, c->stream));
    for (int i = 0; i < iters; i++) fn();
    CUDA_CHECK(cudaEventRecord(b, c->stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    return ms / iters;
}
static void report_bw(const char *name, double ms, double bytes) {
    printf("TIME %s: %.4f ms, %.1f GB/s\n", name, ms, bytes / (ms * 1e-3) / 1e9);
}
static void report_flops(const char *name, double ms, double flops) {
    printf("TIME %s: %.4f ms, %.1f TFLOP/s\n", name, ms, flops / (ms * 1e-3) / 1e12);
}
