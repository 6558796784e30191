// dev/cuda/int8.cu: k_int8_dequantize against the CPU's int8_region_dequantize (llmc/int8.c) on
// regions made by int8_quantize: fp32 output must be bit-identical, bf16 output must be the CPU's
// value rounded to bf16; rows of different scales, an all-zero row, odd sizes. Then GB/s.
#include "dev_common.cuh"
#ifndef _Static_assert
#define _Static_assert static_assert
#endif
extern "C" {
#include "llmc/int8.h"
}

static void one(CudaCtx *c, int64_t rows, int64_t cols) {
    const int bf = c->bf16;
    const size_t n = (size_t)(rows * cols);
    std::vector<float> w = randn(n, 0.05);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++) w[r * cols + k] *= (r % 3 == 2) ? 0.0f : (float)(1 + r % 5);
    const size_t bytes = int8_region_bytes(rows, cols);
    std::vector<unsigned char> region(bytes);
    int8_quantize(w.data(), rows, cols, region.data(), "test.weight");
    std::vector<float> ref(n);
    int8_region_dequantize(region.data(), ref.data());
    if (bf) round_act(ref, 1);
    void *dr = up_bytes(region.data(), bytes), *out = dmalloc(n * (bf ? 2 : 4));
    k_int8_dequantize(c, out, dr, n);
    std::vector<float> got = down_act(out, n, bf);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&got[i], &ref[i], 4) != 0;
    char name[128], det[64];
    snprintf(name, sizeof name, "int8_dequantize %s %lldx%lld: bit-identical to the CPU", prec(bf),
             (long long)rows, (long long)cols);
    snprintf(det, sizeof det, "%zu of %zu elements differ", bad, n);
    check_true(name, bad == 0, det);
    cudaFree(dr), cudaFree(out);
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    for (int bf = 0; bf < 2; bf++) {
        CudaCtx *c = cuda_ctx_create(bf, 0);
        one(c, 37, 64);
        one(c, 7, 333);
        one(c, 300, 100);
        if (!g_quick) {
            const int64_t rows = 4096, cols = 14336;
            const size_t n = (size_t)(rows * cols);
            std::vector<float> w = randn(n, 0.05);
            const size_t bytes = int8_region_bytes(rows, cols);
            std::vector<unsigned char> region(bytes);
            int8_quantize(w.data(), rows, cols, region.data(), "bench");
            void *dr = up_bytes(region.data(), bytes), *out = dmalloc(n * (bf ? 2 : 4));
            char name[64];
            snprintf(name, sizeof name, "int8_dequantize %s 4096x14336", prec(bf));
            report_bw(name, bench_ms(c, 10, [&] { k_int8_dequantize(c, out, dr, n); }), (double)bytes + n * (bf ? 2 : 4));
            cudaFree(dr), cudaFree(out);
        }
        cuda_ctx_destroy(c);
    }
    return dev_finish("int8");
}
