// test_nf4.c: NF4 quantization (llmc/nf4.h): code table, decision thresholds, the 8-bit
// dynamic map, quantize/dequantize error bounds, the bitsandbytes serialized layout and its
// error paths. Error paths exit through fail(), so each runs in a forked child.
//
// Helper modes for test/test_nf4.py (which compares against test/nf4_ref.py):
//   test_nf4 --quantize in.f32 out.rec NAME DTYPE BLOCKSIZE NESTED D0 [D1 ...]
//       quantizes the float32 file and writes the emitted tensors, then "__deq__" (F32), as
//       records: u32 name_len, name, u32 dtype_len, dtype, u32 ndim, i64 shape[ndim],
//       u64 nbytes, bytes.
//   test_nf4 --load in.safetensors NAME out.f32   loads NAME's tensors, writes the dequantized
//       float32 values (exit 3 when NAME is not a 4-bit weight).
//   test_nf4 --repr in.f64                          prints nf4_py_repr of each double, one a line.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "nf4.h"
#include "safetensors.h"
#include "util.h"

static int n_pass, n_fail;
static int in_child;

int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) { return in_child; }

static void check(const char *name, int ok, const char *fmt, ...) {
    if (ok) {
        printf("PASS %s\n", name);
        n_pass++;
        return;
    }
    printf("FAIL %s: ", name);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    n_fail++;
}

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

// ---------------------------------------------------------------------------------------
// Tables and rounding rules

static void test_code_table(void) {
    // bitsandbytes get_4bit_type("nf4"), typed in independently of nf4.c
    static const double want[16] = {
        -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
        -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
        0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
        0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0};
    int ok = 1, k_bad = -1;
    for (int k = 0; k < 16; k++)
        if (bits(nf4_code[k]) != bits((float)want[k]) || (k && !(nf4_code[k] > nf4_code[k - 1])))
            ok = 0, k_bad = k;
    check("code_table", ok, "entry %d is %.9g", k_bad, k_bad >= 0 ? nf4_code[k_bad] : 0.0);
}

static void test_thresholds(void) {
    // Each threshold is one of the two fp32 values nearest the exact midpoint of its codes
    // (the nearest one unless the midpoint is an fp32 tie), and they ascend.
    int ok = 1, k_bad = -1;
    for (int k = 0; k < 15; k++) {
        double mid = ((double)nf4_code[k] + (double)nf4_code[k + 1]) / 2.0, t = nf4_threshold[k];
        double ulp = (double)nextafterf(fabsf(nf4_threshold[k]), INFINITY) - fabs(t);
        float f = (float)mid;
        double g = nextafterf(f, mid > f ? INFINITY : -INFINITY);
        int tie = f != mid && fabs(mid - f) == fabs(g - mid);  // halfway between two fp32
        if (!(fabs(t - mid) <= ulp / 2) || (!tie && t != (double)(float)mid) || (k && !(t > nf4_threshold[k - 1])))
            ok = 0, k_bad = k;
    }
    check("thresholds_are_midpoints", ok, "threshold %d is %.9g", k_bad,
          k_bad >= 0 ? nf4_threshold[k_bad] : 0.0);

    // On an exact threshold the value goes down; one ulp above goes up.
    ok = 1;
    char why[128] = "";
    for (int k = 0; k < 15 && ok; k++) {
        float t = nf4_threshold[k];
        if (nf4_encode(t) != k || nf4_encode(nextafterf(t, INFINITY)) != k + 1 ||
            nf4_encode(nextafterf(t, -INFINITY)) != k)
            ok = 0, snprintf(why, sizeof why, "around threshold %d: %d %d %d", k, nf4_encode(t),
                             nf4_encode(nextafterf(t, INFINITY)), nf4_encode(nextafterf(t, -INFINITY)));
    }
    for (int k = 0; k < 16 && ok; k++)
        if (nf4_encode(nf4_code[k]) != k) ok = 0, snprintf(why, sizeof why, "code %d -> %d", k, nf4_encode(nf4_code[k]));
    check("encode_midpoints", ok, "%s", why);

    check("encode_specials",
          nf4_encode(NAN) == 0 && nf4_encode(-0.0f) == 7 && nf4_encode(0.0f) == 7 &&
              nf4_encode(1.5f) == 15 && nf4_encode(-1.5f) == 0 && nf4_encode(INFINITY) == 15,
          "NaN %d, -0 %d, 0 %d, 1.5 %d, -1.5 %d", nf4_encode(NAN), nf4_encode(-0.0f), nf4_encode(0.0f),
          nf4_encode(1.5f), nf4_encode(-1.5f));

    // Away from thresholds the code is the nearest value.
    Rng r;
    rng_seed(&r, 7);
    ok = 1;
    for (int i = 0; i < 200000 && ok; i++) {
        float s = rng_uniform(&r) * 2.2f - 1.1f;
        int c = nf4_encode(s);
        for (int k = 0; k < 16; k++)
            if (fabsf(s - nf4_code[k]) + 1e-6f < fabsf(s - nf4_code[c]))
                ok = 0, snprintf(why, sizeof why, "%.9g -> %d, but %d is nearer", s, c, k);
    }
    check("encode_nearest", ok, "%s", why);
}

static void test_dynamic_map(void) {
    float m[256];
    nf4_dynamic_map(m);
    int ok = 1, k_bad = -1;
    for (int k = 1; k < 256; k++)
        if (!(m[k] > m[k - 1])) ok = 0, k_bad = k;
    check("dynamic_map_sorted", ok, "entry %d", k_bad);
    ok = 1;
    for (int k = 0; k < 127; k++)
        if (m[k] != -m[254 - k]) ok = 0, k_bad = k;
    check("dynamic_map_symmetric", ok && m[127] == 0 && m[255] == 1.0f, "entry %d", k_bad);
    // Values torch.linspace-based create_dynamic_map gives (entries 0 and 128..142 come from
    // the groups where every PyTorch version agrees).
    static const struct { int i; uint32_t b; } spot[] = {
        {0, 0xbf7e3333}, {127, 0x00000000}, {128, 0x3513a3b7}, {129, 0x365a1a94},
        {130, 0x370205ff}, {131, 0x37b24206}, {135, 0x3923d70b}, {255, 0x3f800000}};
    ok = 1;
    for (size_t s = 0; s < sizeof spot / sizeof spot[0]; s++)
        if (bits(m[spot[s].i]) != spot[s].b) ok = 0, k_bad = spot[s].i;
    check("dynamic_map_values", ok, "entry %d is %.9g", k_bad, k_bad >= 0 ? m[k_bad] : 0.0);

    // 8-bit rounding: each entry maps to itself; a midpoint goes to the even index of its two
    // neighbours, one ulp off it to the nearer one.
    ok = 1;
    char why[160] = "";
    for (int k = 0; k < 256 && ok; k++)
        if (nf4_dyn_encode(m, m[k]) != k) ok = 0, snprintf(why, sizeof why, "entry %d -> %d", k, nf4_dyn_encode(m, m[k]));
    for (int k = 0; k + 1 < 256 && ok; k++) {
        float mid = (m[k] + m[k + 1]) * 0.5f;
        int even = k % 2 == 0 ? k : k + 1;
        int a = nf4_dyn_encode(m, mid), up = nf4_dyn_encode(m, nextafterf(mid, INFINITY)),
            dn = nf4_dyn_encode(m, nextafterf(mid, -INFINITY));
        if (a != even || up != k + 1 || dn != k)
            ok = 0, snprintf(why, sizeof why, "midpoint %d|%d: %d, above %d, below %d", k, k + 1, a, up, dn);
    }
    check("dyn_encode_midpoints", ok, "%s", why);
    check("dyn_encode_specials",
          nf4_dyn_encode(m, NAN) == 0 && nf4_dyn_encode(m, 1.01f) == 255 && nf4_dyn_encode(m, -1.0f) == 0 &&
              nf4_dyn_encode(m, 0.0f) == 127,
          "NaN %d, 1.01 %d, -1 %d, 0 %d", nf4_dyn_encode(m, NAN), nf4_dyn_encode(m, 1.01f),
          nf4_dyn_encode(m, -1.0f), nf4_dyn_encode(m, 0.0f));
    Rng r;
    rng_seed(&r, 9);
    ok = 1;
    for (int i = 0; i < 200000 && ok; i++) {
        float s = rng_uniform(&r) * 2.0f - 1.0f;
        if (i % 3 == 0) s *= 1e-4f;
        int c = nf4_dyn_encode(m, s);
        int lo = 0;
        while (lo < 255 && m[lo + 1] < s) lo++;  // nearest is lo or lo+1
        float dbest = fminf(fabsf(s - m[lo]), lo < 255 ? fabsf(s - m[lo + 1]) : INFINITY);
        if (fabsf(s - m[c]) > dbest) ok = 0, snprintf(why, sizeof why, "%.9g -> %d, not nearest", s, c);
    }
    check("dyn_encode_nearest", ok, "%s", why);
}

// ---------------------------------------------------------------------------------------
// Quantize / dequantize

static void test_small_blocks(void) {
    // one block of 64 with absmax 2: w = 2 * code gives back the code
    float w[129];
    for (int i = 0; i < 64; i++) w[i] = 2.0f * nf4_code[i % 16];
    for (int i = 64; i < 128; i++) w[i] = 0.0f;  // an all-zero block
    w[128] = -3.0f;                              // a last block of one element
    Nf4Weight q;
    int64_t shape[1] = {129};
    nf4_quantize(&q, w, 1, shape, 64, 0, "float32", "small");
    int ok = q.nblocks == 3 && q.absmax[0] == 2.0f && q.absmax[1] == 0.0f && q.absmax[2] == 3.0f;
    for (int i = 0; i < 32; i++) ok &= q.packed[i] == (uint8_t)(((2 * i) % 16) << 4 | ((2 * i + 1) % 16));
    for (int i = 32; i < 64; i++) ok &= q.packed[i] == 0;  // NaN -> code 0 in the zero block
    ok &= q.packed[64] == 0x07;                            // -3 -> -1 (code 0), padding 0 -> code 7
    check("quantize_layout", ok, "absmax %g %g %g, bytes %02x %02x %02x", q.absmax[0], q.absmax[1],
          q.absmax[2], q.packed[0], q.packed[32], q.packed[64]);
    float d[129];
    nf4_dequantize(&q, d);
    ok = 1;
    for (int i = 0; i < 64; i++) ok &= d[i] == w[i];
    for (int i = 64; i < 128; i++) ok &= d[i] == 0 && signbit(d[i]);  // -1 * 0
    ok &= d[128] == -3.0f;
    check("dequantize_exact_codes", ok, "d[0..2] %g %g %g, d[64] %g, d[128] %g", d[0], d[1], d[2], d[64], d[128]);
    nf4_free(&q);
}

// |w - deq| <= absmax * max half-gap of the code + |absmax - absmax'| (+ fp32 rounding).
static double max_half_gap(const float *c, int n) {
    double g = 0;
    for (int k = 0; k + 1 < n; k++) g = fmax(g, ((double)c[k + 1] - c[k]) / 2);
    return g;
}

static void test_error_bounds(void) {
    static const struct { int64_t rows, cols; int nested, bs; } cases[] = {
        {1, 64, 1, 64}, {7, 9, 1, 64}, {33, 1000, 1, 64}, {256, 64, 0, 64}, {130, 257, 1, 64},
        {64, 513, 1, 128}, {3, 1001, 0, 32}, {1024, 300, 1, 64}};
    float dm[256];
    nf4_dynamic_map(dm);
    double hg = max_half_gap(nf4_code, 16), dhg = max_half_gap(dm, 256);
    Rng r;
    rng_seed(&r, 11);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t shape[2] = {cases[c].rows, cases[c].cols};
        size_t n = (size_t)(shape[0] * shape[1]);
        float *w = xmalloc(n * sizeof(float)), *d = xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            w[i] = 0.02f * rng_normal(&r);
            if (rng_uniform(&r) < 0.001f) w[i] *= 300.0f;  // outliers
            if ((i / 64) % 17 == 5) w[i] = 0.0f;          // zero stretches
        }
        Nf4Weight q;
        nf4_quantize(&q, w, 2, shape, cases[c].bs, cases[c].nested, "bfloat16", "bounds");
        nf4_dequantize(&q, d);
        double worst = 0, worst_a = 0;
        int ok = 1;
        for (size_t b = 0; b < q.nblocks; b++) {
            size_t s0 = b * (size_t)q.blocksize, e = s0 + (size_t)q.blocksize < n ? s0 + (size_t)q.blocksize : n;
            double at = 0;
            for (size_t i = s0; i < e; i++) at = fmax(at, fabs(w[i]));
            double ad = nf4_block_absmax(&q, b), da = fabs(at - ad);
            if (q.nested) {  // the 8-bit quantization error of absmax - offset
                double a2 = q.nested_absmax[b / 256];
                double lim = a2 * dhg * (1 + 1e-5) + 1e-7 * (fabs(q.offset) + at);
                if (da > lim) ok = 0;
                worst_a = fmax(worst_a, da / (lim > 0 ? lim : 1));
            } else if (da != 0) {
                ok = 0;
            }
            double lim = at * hg * (1 + 1e-5) + da + 1e-6 * (at + fabs(ad));
            for (size_t i = s0; i < e; i++) {
                double err = fabs((double)w[i] - d[i]);
                if (err > lim) ok = 0;
                worst = fmax(worst, lim > 0 ? err / lim : err);
            }
        }
        char name[64];
        snprintf(name, sizeof name, "error_bound_%lldx%lld_%s_bs%d", (long long)shape[0],
                 (long long)shape[1], cases[c].nested ? "nested" : "plain", cases[c].bs);
        check(name, ok, "worst error / bound %.3g, absmax error / bound %.3g", worst, worst_a);
        // a range matches the whole
        size_t b0 = n / 3, cnt = n - b0 > 777 ? 777 : n - b0;
        float *part = xmalloc((cnt ? cnt : 1) * sizeof(float));
        nf4_dequantize_range(&q, b0, cnt, part);
        snprintf(name, sizeof name, "dequantize_range_%lldx%lld", (long long)shape[0], (long long)shape[1]);
        check(name, cnt == 0 || memcmp(part, d + b0, cnt * sizeof(float)) == 0, "differs");
        free(part);
        nf4_free(&q);
        free(w);
        free(d);
    }
}

static void test_nested_fields(void) {
    size_t n = 64 * 600 + 10;
    float *w = xmalloc(n * sizeof(float));
    Rng r;
    rng_seed(&r, 3);
    for (size_t i = 0; i < n; i++) w[i] = rng_normal(&r) * (1 + (float)(i / 64 % 5));
    int64_t shape[1] = {(int64_t)n};
    Nf4Weight a, b;
    nf4_quantize(&a, w, 1, shape, 64, 1, "float32", "nested");
    nf4_quantize(&b, w, 1, shape, 64, 0, "float32", "plain");
    double sum = 0;
    for (size_t k = 0; k < b.nblocks; k++) sum += b.absmax[k];
    int ok = a.nblocks == 601 && a.nested_blocksize == 256 && a.nested_nblocks == 3 &&
             a.offset == (float)(sum / 601) && memcmp(a.packed, b.packed, (n + 1) / 2) == 0;
    float dm[256];
    nf4_dynamic_map(dm);
    ok &= memcmp(dm, a.nested_code, sizeof dm) == 0;
    // nested_absmax = max |absmax - offset| per 256 blocks
    for (size_t g = 0; g < 3; g++) {
        float m = 0;
        for (size_t k = g * 256; k < b.nblocks && k < g * 256 + 256; k++) m = fmaxf(m, fabsf(b.absmax[k] - a.offset));
        ok &= a.nested_absmax[g] == m;
    }
    check("nested_fields", ok, "nblocks %zu, nested %zu, offset %.9g vs %.9g", a.nblocks, a.nested_nblocks,
          a.offset, (float)(sum / 601));
    nf4_free(&a);
    nf4_free(&b);
    free(w);
}

static void test_py_repr(void) {
    static const struct { double v; const char *s; } cases[] = {
        {0.1, "0.1"}, {1e-5, "1e-05"}, {0.5, "0.5"}, {1.0, "1.0"}, {1e16, "1e+16"},
        {1e15, "1000000000000000.0"}, {123456.0, "123456.0"}, {9.313225746154785e-10, "9.313225746154785e-10"},
        {5e-324, "5e-324"}, {0.0001, "0.0001"}, {1.5e-05, "1.5e-05"}, {1e22, "1e+22"},
        {1.7976931348623157e308, "1.7976931348623157e+308"}, {2.2250738585072014e-308, "2.2250738585072014e-308"},
        {9007199254740992.0, "9007199254740992.0"}, {0.0, "0.0"}, {-0.0, "-0.0"}, {-2.5, "-2.5"},
        {(double)0.1f, "0.10000000149011612"}, {(double)1e-5f, "9.999999747378752e-06"},
        {(double)0.0123f, "0.012299999594688416"}, {(double)1e20f, "1.0000000200408773e+20"}};
    int ok = 1;
    char got[32], why[128] = "";
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nf4_py_repr(cases[i].v, got);
        if (strcmp(got, cases[i].s) != 0) ok = 0, snprintf(why, sizeof why, "%s, want %s", got, cases[i].s);
    }
    check("py_repr", ok, "%s", why);
}

static void test_json(void) {
    float w[15] = {0};
    w[3] = 1;
    int64_t shape[2] = {3, 5};
    Nf4Weight q;
    nf4_quantize(&q, w, 2, shape, 64, 0, "bfloat16", "j");
    char *s = nf4_quant_state_json(&q);
    check("json_plain", strcmp(s, "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [3, 5]}") == 0,
          "%s", s);
    free(s);
    nf4_free(&q);
    nf4_quantize(&q, w, 2, shape, 64, 1, "float16", "j");
    s = nf4_quant_state_json(&q);  // one block of absmax 1: offset 1.0
    check("json_nested",
          strcmp(s, "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float16\", \"shape\": [3, 5], "
                    "\"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": 1.0}") == 0,
          "%s", s);
    free(s);
    nf4_free(&q);
}

// ---------------------------------------------------------------------------------------
// Serialized layout

typedef struct {
    StTensor *t;
    int n;
} TList;

static const StTensor *tlist_find(void *ctx, const char *name) {
    TList *l = ctx;
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->t[i].name, name) == 0) return &l->t[i];
    return NULL;
}

static const StTensor *file_find(void *ctx, const char *name) { return st_find(ctx, name); }

// A safetensors file holding tensors of any dtype (the library writer does F32 only).
static void write_st(const char *path, const StTensor *t, int n) {
    cJSON *h = cJSON_CreateObject();
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "dtype", t[i].dtype);
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t[i].ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + t[i].nbytes)));
        off += t[i].nbytes;
        cJSON_AddItemToObject(h, t[i].name, e);
    }
    char *hs = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    uint64_t hl = strlen(hs);
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    fwrite(&hl, 8, 1, f);
    fwrite(hs, 1, hl, f);
    for (int i = 0; i < n; i++) fwrite(t[i].data, 1, t[i].nbytes, f);
    if (fclose(f) != 0) { perror(path); exit(2); }
    free(hs);
}

static int same_weight(const Nf4Weight *a, const Nf4Weight *b) {
    int ok = a->ndim == b->ndim && a->n == b->n && a->blocksize == b->blocksize &&
             a->nblocks == b->nblocks && a->nested == b->nested && strcmp(a->dtype, b->dtype) == 0 &&
             memcmp(a->shape, b->shape, sizeof a->shape) == 0 &&
             memcmp(a->packed, b->packed, (a->n + 1) / 2) == 0;
    if (!ok) return 0;
    if (!a->nested) return memcmp(a->absmax, b->absmax, a->nblocks * 4) == 0;
    return bits(a->offset) == bits(b->offset) && a->nested_blocksize == b->nested_blocksize &&
           a->nested_nblocks == b->nested_nblocks && memcmp(a->qabsmax, b->qabsmax, a->nblocks) == 0 &&
           memcmp(a->nested_absmax, b->nested_absmax, a->nested_nblocks * 4) == 0 &&
           memcmp(a->nested_code, b->nested_code, sizeof a->nested_code) == 0;
}

static char tmpdir[256];

static void test_roundtrip(void) {
    for (int nested = 0; nested < 2; nested++) {
        int64_t shape[2] = {37, 129};  // odd count, partial last block
        size_t n = 37 * 129;
        float *w = xmalloc(n * 4), *d1 = xmalloc(n * 4), *d2 = xmalloc(n * 4);
        Rng r;
        rng_seed(&r, 5 + (uint64_t)nested);
        for (size_t i = 0; i < n; i++) w[i] = rng_normal(&r) * 0.05f;
        Nf4Weight q, p;
        nf4_quantize(&q, w, 2, shape, 64, nested, "bfloat16", "m.w");
        StTensor t[NF4_MAX_TENSORS + 1];
        int k = nf4_emit(&q, "model.layers.0.mlp.up_proj.weight", t);
        // a plain tensor beside it
        float bias[3] = {1, 2, 3};
        memset(&t[k], 0, sizeof t[k]);
        t[k].name = "model.norm.weight";
        snprintf(t[k].dtype, sizeof t[k].dtype, "F32");
        t[k].ndim = 1;
        t[k].shape[0] = 3;
        t[k].data = bias;
        t[k].nbytes = sizeof bias;
        char path[512];
        snprintf(path, sizeof path, "%s/rt%d.safetensors", tmpdir, nested);
        write_st(path, t, k + 1);
        int names_ok = k == (nested ? 6 : 4) && strcmp(t[0].name, "model.layers.0.mlp.up_proj.weight") == 0 &&
                       strcmp(t[0].dtype, "U8") == 0 && t[0].ndim == 2 && t[0].shape[0] == (int64_t)(n + 1) / 2 &&
                       t[0].shape[1] == 1 && strcmp(t[1].dtype, nested ? "U8" : "F32") == 0 &&
                       strcmp(t[k - 1].name, "model.layers.0.mlp.up_proj.weight.quant_state.bitsandbytes__nf4") == 0;
        nf4_emit_free(t, k);
        StFile *f = st_open(path);
        int got = nf4_load(&p, "model.layers.0.mlp.up_proj.weight", file_find, f);
        int plain = nf4_load(&p, "model.norm.weight", file_find, f);  // not quantized: 0, p untouched
        nf4_dequantize(&q, d1);
        nf4_dequantize(&p, d2);
        char name[64];
        snprintf(name, sizeof name, "roundtrip_%s", nested ? "nested" : "plain");
        check(name, names_ok && got == 1 && plain == 0 && same_weight(&q, &p) && memcmp(d1, d2, n * 4) == 0,
              "names %d, load %d/%d, same %d", names_ok, got, plain, same_weight(&q, &p));
        st_close(f);
        nf4_free(&q);
        nf4_free(&p);
        free(w);
        free(d1);
        free(d2);
    }
}

// ---------------------------------------------------------------------------------------
// Error paths: a child loads a tampered copy of an emitted tensor list.

static StTensor g_t[NF4_MAX_TENSORS];
static int g_k;
static Nf4Weight g_q;

static void make_list(int nested) {
    static float w[200];
    for (int i = 0; i < 200; i++) w[i] = (float)(i % 13) - 6.0f;
    int64_t shape[2] = {10, 20};
    nf4_quantize(&g_q, w, 2, shape, 64, nested, "bfloat16", "e");
    g_k = nf4_emit(&g_q, "x.weight", g_t);
}

static StTensor *get(const char *sfx) {
    char full[128];
    snprintf(full, sizeof full, "x.weight%s", sfx);
    for (int i = 0; i < g_k; i++)
        if (strcmp(g_t[i].name, full) == 0) return &g_t[i];
    fprintf(stderr, "no %s\n", full);
    exit(2);
}

static void drop(const char *sfx) {
    StTensor *t = get(sfx);
    snprintf(t->name, strlen(t->name) + 1, "%s", "zz");
}

// Replaces the quant_state JSON with `head` (an object without its closing brace) plus, for a
// nested list, the nested keys.
static void set_json(const char *head) {
    static char js[1024];
    snprintf(js, sizeof js, "%s%s}", head,
             g_q.nested ? ", \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": 1.5" : "");
    StTensor *t = get(".quant_state.bitsandbytes__nf4");
    t->data = js;
    t->nbytes = strlen(js);
}

static void load_list(void) {
    TList l = {g_t, g_k};
    Nf4Weight q;
    nf4_load(&q, "x.weight", tlist_find, &l);
}

typedef void (*child_fn)(int arg);

static void c_bad_json(int a) { make_list(a); set_json("{\"quant_type\": \"nf4\", "); get(".quant_state.bitsandbytes__nf4")->nbytes -= 2; load_list(); }
static void c_fp4_type(int a) {
    make_list(a);
    set_json("{\"quant_type\": \"fp4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [10, 20]");
    load_list();
}
static void c_fp4_key(int a) {
    make_list(a);
    StTensor *t = get(".quant_state.bitsandbytes__nf4");
    snprintf(t->name, strlen(t->name) + 1, "x.weight.quant_state.bitsandbytes__fp4");
    load_list();
}
static void c_unknown_key(int a) {
    make_list(a);
    set_json("{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [10, 20], \"zap\": 1");
    load_list();
}
static void c_shape_mismatch(int a) {
    make_list(a);
    set_json("{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [10, 21]");
    load_list();
}
static void c_bad_blocksize(int a) {
    make_list(a);
    set_json("{\"quant_type\": \"nf4\", \"blocksize\": 48, \"dtype\": \"bfloat16\", \"shape\": [10, 20]");
    load_list();
}
static void c_absmax_size(int a) { make_list(a); get(".absmax")->nbytes -= a ? 1 : 4; get(".absmax")->shape[0]--; load_list(); }
static void c_packed_size(int a) { make_list(a); get("")->nbytes--; load_list(); }
static void c_no_nested_map(int a) { make_list(a); drop(".nested_quant_map"); load_list(); }
static void c_no_nested_absmax(int a) { make_list(a); drop(".nested_absmax"); drop(".nested_quant_map"); load_list(); }
static void c_bad_quant_map(int a) {
    make_list(a);
    static float m[16];
    memcpy(m, nf4_code, sizeof m);
    m[3] += 0.01f;
    get(".quant_map")->data = m;
    load_list();
}
static void c_no_quant_state(int a) { make_list(a); drop(".quant_state.bitsandbytes__nf4"); load_list(); }
static void c_nonfinite(int a) {
    float w[4] = {1, NAN, 2, 3};
    int64_t shape[1] = {4};
    Nf4Weight q;
    nf4_quantize(&q, w, 1, shape, 64, a, "float32", "layer.w");
}
static void c_bad_dtype(int a) {
    float w[4] = {1, 2, 2, 3};
    int64_t shape[1] = {4};
    Nf4Weight q;
    nf4_quantize(&q, w, 1, shape, 64, a, "int8", "layer.w");
}

// Runs fn(arg) in a child; passes if it exits 1 after one "error: " line containing needle.
static void expect_fail(const char *name, child_fn fn, int arg, const char *needle) {
    int fds[2];
    if (pipe(fds) != 0) { perror("pipe"); exit(2); }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); exit(2); }
    if (pid == 0) {
        in_child = 1;
        close(fds[0]);
        dup2(fds[1], 2);
        close(fds[1]);
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    char msg[4096];
    size_t len = 0;
    ssize_t r;
    while ((r = read(fds[0], msg + len, sizeof msg - 1 - len)) > 0) len += (size_t)r;
    close(fds[0]);
    msg[len] = 0;
    int status;
    waitpid(pid, &status, 0);
    if (len && msg[len - 1] == '\n') msg[--len] = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 1)
        check(name, 0, "child did not exit 1 (status 0x%x), stderr: %s", status, msg);
    else if (strncmp(msg, "error: ", 7) != 0 || strchr(msg, '\n'))
        check(name, 0, "expected one 'error: ' line, got: %s", msg);
    else
        check(name, strstr(msg, needle) != NULL, "message lacks '%s': %s", needle, msg);
}

static void test_errors(void) {
    for (int nested = 0; nested < 2; nested++) {
        char name[64];
#define EF(label, fn, needle)                                                            \
    snprintf(name, sizeof name, "error_%s_%s", label, nested ? "nested" : "plain"); \
    expect_fail(name, fn, nested, needle)
        EF("bad_json", c_bad_json, "x.weight.quant_state.bitsandbytes__nf4: not a JSON object");
        EF("fp4_type", c_fp4_type, "quant_type 'fp4' is not supported");
        EF("fp4_key", c_fp4_key, "x.weight.quant_state.bitsandbytes__fp4: quant_type fp4 is not supported");
        EF("unknown_key", c_unknown_key, "unknown key 'zap'");
        EF("shape_mismatch", c_shape_mismatch, "x.weight: 100 bytes of U8, expected 105");
        EF("bad_blocksize", c_bad_blocksize, "blocksize");
        EF("absmax_size", c_absmax_size, "x.weight.absmax");
        EF("packed_size", c_packed_size, "x.weight: 99 bytes");
        EF("bad_quant_map", c_bad_quant_map, "x.weight.quant_map: entry 3");
        EF("no_quant_state", c_no_quant_state, "x.weight.absmax: present but x.weight.quant_state.bitsandbytes__nf4 is missing");
        EF("nonfinite", c_nonfinite, "layer.w: element 1 is not finite");
        EF("bad_dtype", c_bad_dtype, "layer.w: dtype 'int8'");
        if (nested) {
            EF("no_nested_map", c_no_nested_map, "x.weight.nested_quant_map: missing");
            EF("no_nested_absmax", c_no_nested_absmax, "has nested_* keys but x.weight.nested_absmax is missing");
        }
#undef EF
    }
}

// ---------------------------------------------------------------------------------------
// Helper modes

static void *slurp(const char *path, size_t *len) {
    void *p = read_file(path, len);
    if (!p) fail("%s: cannot read", path);
    return p;
}

static void put_rec(FILE *f, const char *name, const char *dtype, int ndim, const int64_t *shape,
                    const void *data, uint64_t nbytes) {
    uint32_t l = (uint32_t)strlen(name);
    fwrite(&l, 4, 1, f);
    fwrite(name, 1, l, f);
    l = (uint32_t)strlen(dtype);
    fwrite(&l, 4, 1, f);
    fwrite(dtype, 1, l, f);
    uint32_t nd = (uint32_t)ndim;
    fwrite(&nd, 4, 1, f);
    fwrite(shape, 8, (size_t)ndim, f);
    fwrite(&nbytes, 8, 1, f);
    fwrite(data, 1, nbytes, f);
}

static int mode_quantize(int argc, char **argv) {
    if (argc < 9) fail("usage: --quantize in.f32 out.rec NAME DTYPE BLOCKSIZE NESTED D0 [D1 ...]");
    size_t len;
    float *w = slurp(argv[2], &len);
    int ndim = argc - 8;
    int64_t shape[ST_MAX_DIMS];
    for (int i = 0; i < ndim && i < ST_MAX_DIMS; i++) shape[i] = atoll(argv[8 + i]);
    Nf4Weight q;
    nf4_quantize(&q, w, ndim, shape, atoi(argv[6]), atoi(argv[7]), argv[5], argv[4]);
    if (q.n * 4 != len) fail("%s: %zu bytes for %zu elements", argv[2], len, q.n);
    StTensor t[NF4_MAX_TENSORS];
    int k = nf4_emit(&q, argv[4], t);
    FILE *f = fopen(argv[3], "wb");
    if (!f) fail("%s: cannot write", argv[3]);
    for (int i = 0; i < k; i++) put_rec(f, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, t[i].data, t[i].nbytes);
    float *d = xmalloc(q.n * 4);
    nf4_dequantize(&q, d);
    put_rec(f, "__deq__", "F32", ndim, shape, d, q.n * 4);
    if (fclose(f) != 0) fail("%s: write failed", argv[3]);
    nf4_emit_free(t, k);
    nf4_free(&q);
    free(d);
    free(w);
    return 0;
}

static int mode_load(int argc, char **argv) {
    if (argc != 5) fail("usage: --load in.safetensors NAME out.f32");
    StFile *f = st_open(argv[2]);
    Nf4Weight q;
    if (!nf4_load(&q, argv[3], file_find, f)) {
        st_close(f);
        return 3;
    }
    float *d = xmalloc(q.n * 4);
    nf4_dequantize(&q, d);
    FILE *o = fopen(argv[4], "wb");
    if (!o || fwrite(d, 4, q.n, o) != q.n || fclose(o) != 0) fail("%s: write failed", argv[4]);
    free(d);
    nf4_free(&q);
    st_close(f);
    return 0;
}

static int mode_repr(int argc, char **argv) {
    if (argc != 3) fail("usage: --repr in.f64");
    size_t len;
    double *v = slurp(argv[2], &len);
    char buf[32];
    for (size_t i = 0; i < len / 8; i++) {
        nf4_py_repr(v[i], buf);
        printf("%s\n", buf);
    }
    free(v);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--quantize") == 0) return mode_quantize(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--load") == 0) return mode_load(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--repr") == 0) return mode_repr(argc, argv);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_nf4_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 2; }
    test_code_table();
    test_thresholds();
    test_dynamic_map();
    test_small_blocks();
    test_error_bounds();
    test_nested_fields();
    test_py_repr();
    test_json();
    test_roundtrip();
    test_errors();
    remove_tree(tmpdir);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
