// int8.c: see int8.h.
#include "int8.h"
#include <math.h>
#include <string.h>
#include "nf4.h"
#include "util.h"

static size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

// bitsandbytes multiplies by 1.0 / 127.0, a Python float that PyTorch rounds to fp32.
static const float INV127 = (float)7.874015718698502e-3;

size_t int8_region_bytes(size_t rows, size_t cols) {
    return sizeof(Nf4RegionHeader) + align16(rows * sizeof(float)) + align16(rows * cols);
}

float int8_round_f16(float w) {
    if (!isfinite(w)) return w;
    float a = fabsf(w);
    if (a >= 65520.0f) return copysignf(INFINITY, w);  // 65504 + half an ulp rounds up
    // The spacing of float16 values near a: 2^-24 below 2^-14 (subnormals), else 2^(e - 11)
    // for a in [2^(e-1), 2^e). Scaling by a power of two is exact, rintf rounds ties to even.
    float q = 5.9604644775390625e-08f;
    if (a >= 6.103515625e-05f) {
        int e;
        frexpf(a, &e);
        q = ldexpf(1.0f, e - 11);
    }
    return copysignf(rintf(a / q) * q, w);
}

void int8_quantize(const float *w, size_t rows, size_t cols, void *region, const char *name) {
    Nf4RegionHeader h = {0};
    h.n = rows * cols, h.nblocks = rows, h.blocksize = (int32_t)cols, h.format = REGION_INT8;
    if (cols > INT32_MAX) fail("%s: %zu columns are too many for an 8-bit region", name, cols);
    memset(region, 0, int8_region_bytes(rows, cols));
    memcpy(region, &h, sizeof h);
    float *scb = (float *)((char *)region + sizeof h);
    int8_t *code = (int8_t *)((char *)region + sizeof h + align16(rows * sizeof(float)));
    for (size_t r = 0; r < rows; r++) {
        const float *row = w + r * cols;
        float absmax = 0.0f;
        for (size_t c = 0; c < cols; c++) {
            float v = int8_round_f16(row[c]);
            if (!isfinite(v))
                fail("%s: element [%zu, %zu] = %g %s; load_in_8bit casts weights to float16 first, as "
                     "bitsandbytes does", name, r, c, row[c], isfinite(row[c]) ? "is past float16's range" :
                     "is not finite");
            absmax = fmaxf(absmax, fabsf(v));
        }
        scb[r] = absmax;
        if (absmax == 0.0f) continue;  // an all-zero row: codes 0
        // PyTorch evaluates bitsandbytes' `127.0 / row_stats` as reciprocal(row_stats) * 127.
        const float scale = (1.0f / absmax) * 127.0f;
        for (size_t c = 0; c < cols; c++)
            code[r * cols + c] = (int8_t)rintf(int8_round_f16(row[c]) * scale);
    }
}

void int8_region_dequantize(const void *region, float *out) {
    Nf4RegionHeader h;
    memcpy(&h, region, sizeof h);
    const size_t rows = h.nblocks, cols = (size_t)h.blocksize;
    const float *scb = (const float *)((const char *)region + sizeof h);
    const int8_t *code = (const int8_t *)((const char *)region + sizeof h + align16(rows * sizeof(float)));
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        const float f = scb[r] * INV127;
        for (size_t c = 0; c < cols; c++)
            out[r * cols + c] = (float)code[r * cols + c] * f;
    }
}
