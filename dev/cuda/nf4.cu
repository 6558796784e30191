// dev/cuda/nf4.cu: k_nf4_dequantize against the CPU's nf4_region_dequantize (llmc/nf4.c) on
// regions packed by nf4_region_pack: fp32 output must be bit-identical, bf16 output must be the
// CPU's value rounded to bf16; nested (double-quantized) and plain absmax, odd element counts.
// Then GB/s.
#include "dev_common.cuh"
#ifndef _Static_assert
#define _Static_assert static_assert
#endif
extern "C" {
#include "llmc/nf4.h"
}

static void one(CudaCtx *c, int64_t rows, int64_t cols, int blocksize, int nested) {
    const int bf = c->bf16;
    const size_t n = (size_t)(rows * cols);
    std::vector<float> w = randn(n, 0.05);
    Nf4Weight q;
    int64_t shape[2] = {rows, cols};
    nf4_quantize(&q, w.data(), 2, shape, blocksize, nested, "float32", "test.weight");
    const size_t bytes = nf4_region_bytes(n, blocksize, nested);
    std::vector<unsigned char> region(bytes);
    nf4_region_pack(&q, region.data());
    std::vector<float> ref(n);
    nf4_region_dequantize(region.data(), ref.data());
    if (bf) round_act(ref, 1);
    void *dr = up_bytes(region.data(), bytes), *out = dmalloc(n * (bf ? 2 : 4));
    k_nf4_dequantize(c, out, dr, n);
    std::vector<float> got = down_act(out, n, bf);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&got[i], &ref[i], 4) != 0;
    char name[128], det[64];
    snprintf(name, sizeof name, "nf4_dequantize %s %lldx%lld blocksize %d%s: bit-identical to the CPU", prec(bf),
             (long long)rows, (long long)cols, blocksize, nested ? " nested" : "");
    snprintf(det, sizeof det, "%zu of %zu elements differ", bad, n);
    check_true(name, bad == 0, det);
    nf4_free(&q);
    cudaFree(dr), cudaFree(out);
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    for (int bf = 0; bf < 2; bf++) {
        CudaCtx *c = cuda_ctx_create(bf, 0);
        one(c, 37, 64, 64, 1);
        one(c, 7, 333, 64, 1);    // odd count: the last byte's low nibble is padding
        one(c, 300, 100, 64, 1);  // more than 256 blocks: several nested blocks
        one(c, 9, 65, 128, 0);
        if (!g_quick) {
            const size_t n = (size_t)4096 * 14336;
            std::vector<float> w = randn(n, 0.05);
            Nf4Weight q;
            int64_t shape[2] = {4096, 14336};
            nf4_quantize(&q, w.data(), 2, shape, 64, 1, "float32", "bench");
            const size_t bytes = nf4_region_bytes(n, 64, 1);
            std::vector<unsigned char> region(bytes);
            nf4_region_pack(&q, region.data());
            void *dr = up_bytes(region.data(), bytes), *out = dmalloc(n * (bf ? 2 : 4));
            char name[64];
            snprintf(name, sizeof name, "nf4_dequantize %s 4096x14336", prec(bf));
            report_bw(name, bench_ms(c, 10, [&] { k_nf4_dequantize(c, out, dr, n); }), (double)bytes + n * (bf ? 2 : 4));
            nf4_free(&q);
            cudaFree(dr), cudaFree(out);
        }
        cuda_ctx_destroy(c);
    }
    return dev_finish("nf4");
}
