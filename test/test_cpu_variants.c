// test_cpu_variants.c: the per-CPU float kernel variants (kernels_f32.c) and vexpf.
//
// 1. vexpf against the correctly rounded float of e^x (exp in double, rounded once) on every
//    61st float in [-104, 89] and on the special values, and against glibc's expf: it must
//    differ from the correctly rounded value on at most 1 in 100 inputs (0.77% of all floats
//    in the range; glibc's expf: 8 in 100,000) and from either by at most 1 ulp anywhere.
// 2. Every variant this CPU can run (base SSE2, AVX2, AVX-512) against the base on the same
//    inputs, compared bit for bit: training must not depend on which machine ran it.
// 3. Which variant name_f32 resolved to: the widest the CPU supports.
// 4. matmul_many's threading by row pieces against whole products (below).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu/kernels.h"
#include "cpu/vexp.h"
#include "optim.h"

static int n_pass, n_fail;

static void check(int ok, const char *name, const char *detail) {
    if (ok) printf("PASS %s\n", name), n_pass++;
    else printf("FAIL %s: %s\n", name, detail), n_fail++;
    fflush(stdout);
}

static int32_t fbits(float x) {
    int32_t i;
    memcpy(&i, &x, sizeof i);
    return i;
}

static void test_vexpf(void) {
    long n = 0, off_cr = 0, off_glibc = 0, worst = 0;
    const int32_t step = 61;
    // Positive floats up to 89 and negative ones down to -104, as bit patterns.
    for (int side = 0; side < 2; side++) {
        float lim = side ? -104.0f : 89.0f;
        for (int32_t b = side ? (int32_t)0x80000000u + 1 : 0; ; b += step) {
            float x;
            memcpy(&x, &b, sizeof x);
            if (side ? x < lim : x > lim) break;
            float got = vexpf(x), cr = (float)exp((double)x), gl = expf(x);
            long d1 = labs((long)fbits(got) - fbits(cr)), d2 = labs((long)fbits(got) - fbits(gl));
            off_cr += d1 != 0, off_glibc += d2 != 0, n++;
            if (d1 > worst) worst = d1;
            if (d2 > worst) worst = d2;
        }
    }
    char d[160];
    snprintf(d, sizeof d, "%ld of %ld differ from the correctly rounded value, %ld from glibc, worst %ld ulp",
             off_cr, n, off_glibc, worst);
    check(off_cr * 100 <= n && worst <= 1, "vexpf vs correctly rounded and glibc expf", d);
    printf("     (%s)\n", d);
    int ok = isnan(vexpf(NAN)) && vexpf(INFINITY) == INFINITY && vexpf(-INFINITY) == 0 &&
             vexpf(0.0f) == 1.0f && vexpf(-0.0f) == 1.0f && vexpf(100.0f) == INFINITY &&
             vexpf(-120.0f) == 0 && vexpf(-100.0f) == (float)exp(-100.0) && vexpf(-100.0f) > 0;
    check(ok, "vexpf special values (NaN, +-inf, +-0, overflow, subnormal and zero results)",
          "a special value is wrong");
}

// 1b. Each variant's exponential loops (exp_inplace: the AVX-512 and AVX2 ones run vexpv, 16 and
//     8 lanes an instruction sequence) against vexpf element by element, bit for bit: every 127th float in
//     [-110, 95] and the special values, in runs whose lengths leave a tail of every size.
static void test_exp_loops(void) {
    static void (*const fns[3])(float *, size_t) = {exp_inplace_f32_base, exp_inplace_f32_avx2,
                                                    exp_inplace_f32_avx512};
    static const char *names[3] = {"base", "avx2", "avx512"};
    const float special[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-45f, -1e-45f, 88.72f, 88.73f,
                             89.0f, 89.5f, -87.3f, -87.4f, -103.9f, -104.0f, -104.5f, 1e30f, -1e30f};
    const size_t ns = sizeof special / sizeof special[0], cap = 1 << 20;
    const int nv = kernels_f32_level() + 1 < 3 ? kernels_f32_level() + 1 : 3;
    float *x = malloc(cap * sizeof(float)), *y = malloc(cap * sizeof(float)), *ref = malloc(cap * sizeof(float));
    long n = 0, diff[3] = {0};
    size_t len = ns, run = 0;
    memcpy(x, special, sizeof special);
    for (int side = 0; side < 2; side++)
        for (int32_t b = side ? (int32_t)0x80000001u : 0;; b += 127) {
            float v;
            memcpy(&v, &b, sizeof v);
            const int last = side ? v < -110.0f : v > 95.0f;
            if (!last) x[len++] = v;
            if (len == cap - run % 17 || (last && len)) {  // run lengths vary: every tail size
                for (size_t i = 0; i < len; i++) ref[i] = vexpf(x[i]);
                for (int l = 0; l < nv; l++) {
                    memcpy(y, x, len * sizeof(float));
                    fns[l](y, len);
                    for (size_t i = 0; i < len; i++) diff[l] += fbits(y[i]) != fbits(ref[i]);
                }
                n += (long)len, len = 0, run++;
            }
            if (last) break;
        }
    for (int l = 0; l < nv; l++) {
        char name[96], d[96];
        snprintf(name, sizeof name, "kernels_f32_%s exponential loops == vexpf, bit for bit", names[l]);
        snprintf(d, sizeof d, "%ld of %ld differ", diff[l], n);
        check(diff[l] == 0 && n > 3000000, name, d);
    }
    free(x), free(y), free(ref);
}

// ---- variants ---------------------------------------------------------------------------------

typedef struct {
    const char *name;
    void (*attention_fwd)(float *, float *, const float *, const float *, const float *, int, int,
                          int, int, int, int, int, int, const int32_t *, float, float);
    void (*attention_bwd)(float *, float *, float *, const float *, const float *, const float *,
                          const float *, const float *, const float *, int, int, int, int, int, int,
                          int, int, const int32_t *, int, float, float);
    void (*classifier_ce)(float *, float *, float *, const float *, const float *, const int32_t *,
                          int, int, int, float, float);
    void (*swiglu_fwd)(float *, const float *, const float *, size_t);
    void (*swiglu_bwd)(float *, float *, const float *, const float *, const float *, size_t);
    void (*rmsnorm_fwd)(float *, float *, const float *, const float *, float, int, int, float);
    void (*rmsnorm_bwd)(float *, float *, const float *, const float *, const float *, float,
                        const float *, int, int);
    void (*adamw)(float *, const float *, float *, float *, size_t, float, float, float, float,
                  float, float, int);
    double (*sumsq)(const float *, size_t);
    void (*gelu_bwd)(float *, const float *, const float *, size_t);
    void (*geglu_fwd)(float *, const float *, const float *, size_t, int);
    void (*geglu_bwd)(float *, float *, const float *, const float *, const float *, size_t, int);
    void (*adamw8)(float *, const float *, uint8_t *, uint8_t *, float *, float *, const float *, size_t, float,
                   float, float, float, float, float, int, int);
} Variant;

#define VARIANT(S)                                                                               \
    {#S, attention_fwd_f32_##S, attention_bwd_f32_##S, classifier_ce_f32_##S, swiglu_fwd_f32_##S, \
     swiglu_bwd_f32_##S, rmsnorm_fwd_f32_##S, rmsnorm_bwd_f32_##S, adamw_f32_##S, sumsq_f32_##S,   \
     gelu_bwd_f32_##S, geglu_fwd_f32_##S, geglu_bwd_f32_##S, adamw8_f32_##S}

static const Variant variants[] = {VARIANT(base), VARIANT(avx2), VARIANT(avx512)};

static uint64_t rs = 0x9E3779B97F4A7C15ULL;
static float rnd(float scale) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return ((float)(rs >> 40) / (float)(1 << 24) * 2 - 1) * scale;
}
static float *arr(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = rnd(scale);
    return x;
}

// Outputs of one variant on fixed inputs, concatenated.
typedef struct { float *v; size_t n; } Outs;

static void put(Outs *o, const float *x, size_t n) {
    o->v = realloc(o->v, (o->n + n) * sizeof(float));
    memcpy(o->v + o->n, x, n * sizeof(float));
    o->n += n;
}

static Outs run_variant(const Variant *k) {
    Outs o = {0};
    rs = 0x9E3779B97F4A7C15ULL;  // every variant sees the same inputs
    // Attention with a window and documents: 2 rows, T 300 (two key tiles of 256, the second
    // partial, for the last query block), GQA 4/2, D 40 (not a multiple of the lanes).
    const int B = 2, T = 300, Hq = 4, Hkv = 2, D = 40, window = 260;
    size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D;
    float *q = arr(nq, 2), *kk = arr(nk, 2), *v = arr(nk, 1), *dout = arr(nq, 1);
    int32_t *ds = malloc(sizeof(int32_t) * B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) ds[b * T + t] = b == 1 && t >= 97 ? 97 : 0;
    float *out = calloc(nq, sizeof(float)), *lse = calloc((size_t)B * Hq * T, sizeof(float));
    float *dq = calloc(nq, sizeof(float)), *dk = calloc(nk, sizeof(float)), *dv = calloc(nk, sizeof(float));
    k->attention_fwd(out, lse, q, kk, v, B, T, 0, T, Hq, Hkv, D, window, ds, 0, 0);
    k->attention_bwd(dq, dk, dv, dout, q, kk, v, out, lse, B, T, 0, T, Hq, Hkv, D, window, ds, 0, 0, 0);
    put(&o, out, nq), put(&o, lse, (size_t)B * Hq * T), put(&o, dq, nq), put(&o, dk, nk), put(&o, dv, nk);
    // Gemma 2: a score scale of its own and soft-capped scores
    k->attention_fwd(out, lse, q, kk, v, B, T, 0, T, Hq, Hkv, D, window, ds, 0.2f, 1.5f);
    k->attention_bwd(dq, dk, dv, dout, q, kk, v, out, lse, B, T, 0, T, Hq, Hkv, D, window, ds, 0, 0.2f, 1.5f);
    put(&o, out, nq), put(&o, lse, (size_t)B * Hq * T), put(&o, dq, nq), put(&o, dk, nk), put(&o, dv, nk);
    free(q), free(kk), free(v), free(dout), free(ds), free(out), free(lse), free(dq), free(dk), free(dv);
    // Cross-entropy over a vocabulary that is not a multiple of the lanes, one ignored row.
    const int N = 37, V = 203, C = 24;
    float *x = arr((size_t)N * C, 1), *W = arr((size_t)V * C, 3), *losses = calloc(N, sizeof(float));
    float *dx = calloc((size_t)N * C, sizeof(float)), *dW = calloc((size_t)V * C, sizeof(float));
    int32_t tgt[37];
    for (int n = 0; n < N; n++) tgt[n] = n == 5 ? -100 : (n * 31) % V;
    k->classifier_ce(losses, dx, dW, x, W, tgt, N, V, C, 1.0f / N, 0);
    put(&o, losses, N), put(&o, dx, (size_t)N * C), put(&o, dW, (size_t)V * C);
    k->classifier_ce(losses, dx, dW, x, W, tgt, N, V, C, 1.0f / N, 2.5f);  // soft-capped logits
    put(&o, losses, N), put(&o, dx, (size_t)N * C), put(&o, dW, (size_t)V * C);
    free(x), free(W), free(losses), free(dx), free(dW);
    // Elementwise and norms, with a length that leaves a tail.
    const size_t n = 1001;
    float *g = arr(n, 12), *u = arr(n, 2), *h = calloc(n, sizeof(float)), *dh = arr(n, 1);
    float *dg = calloc(n, sizeof(float)), *du = calloc(n, sizeof(float));
    k->swiglu_fwd(h, g, u, n);
    k->swiglu_bwd(dg, du, dh, g, u, n);
    k->gelu_bwd(dh, u, g, n);
    put(&o, h, n), put(&o, dg, n), put(&o, du, n), put(&o, dh, n);
    for (int exact = 0; exact < 2; exact++) {  // GELU's tanh approximation, then the erf one
        k->geglu_fwd(h, g, u, n, exact);
        k->geglu_bwd(dg, du, dh, g, u, n, exact);
        put(&o, h, n), put(&o, dg, n), put(&o, du, n);
    }
    {  // outputs past KERNEL_STREAM_MIN_BYTES, aligned: the streaming stores, and a tail
        const size_t nb = KERNEL_STREAM_MIN_BYTES / sizeof(float) + 1003;
        float *gb = arr(nb, 12), *ub = arr(nb, 2), *dhb = arr(nb, 1);
        float *hb = aligned_alloc(64, (nb * sizeof(float) + 63) / 64 * 64);
        float *dub = aligned_alloc(64, (nb * sizeof(float) + 63) / 64 * 64);
        k->swiglu_fwd(hb, gb, ub, nb);
        k->swiglu_bwd(dhb, dub, dhb, gb, ub, nb);  // dgate over dh, as the trainer calls it
        put(&o, hb, nb), put(&o, dhb, nb), put(&o, dub, nb);
        free(gb), free(ub), free(dhb), free(hb), free(dub);
    }
    // sumsq in double, all its bits: the stretches (SUMSQ_STREAMS x LANES), a tail, and on each thread
    const size_t ns = 5003;
    float *sq = arr(ns, 3), sb[2];
    const double s = k->sumsq(sq, ns);
    memcpy(sb, &s, sizeof s);
    put(&o, sb, 2);
    free(sq);
    const int R = 7, Cn = 143;
    float *xn = arr((size_t)R * Cn, 3), *w = arr(Cn, 1), *y = calloc((size_t)R * Cn, sizeof(float));
    float *rstd = calloc(R, sizeof(float)), *dy = arr((size_t)R * Cn, 1);
    float *dxn = calloc((size_t)R * Cn, sizeof(float)), *dw = calloc(Cn, sizeof(float));
    for (int a = 0; a < 2; a++) {  // w_add 0 and Gemma's 1
        k->rmsnorm_fwd(y, rstd, xn, w, (float)a, R, Cn, 1e-5f);
        k->rmsnorm_bwd(dxn, dw, dy, xn, w, (float)a, rstd, R, Cn);
        put(&o, y, (size_t)R * Cn), put(&o, rstd, R), put(&o, dxn, (size_t)R * Cn), put(&o, dw, Cn);
    }
    float *p = arr(n, 1), *m = arr(n, 0.1f), *vv = arr(n, 0.1f);
    for (size_t i = 0; i < n; i++) vv[i] = fabsf(vv[i]);
    k->adamw(p, u, m, vv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.5f, 3);
    put(&o, p, n), put(&o, m, n), put(&o, vv, n);
    {  // 8-bit AdamW: two steps from zero states, the weights and the block scales
        float maps[512], *am = calloc((n + ADAM8_BLOCK - 1) / ADAM8_BLOCK, sizeof(float)),
                         *av = calloc((n + ADAM8_BLOCK - 1) / ADAM8_BLOCK, sizeof(float));
        uint8_t *qm = calloc(n, 1), *qv = calloc(n, 1);
        adam8_maps(maps);
        for (int t = 1; t <= 4; t++)  // bitsandbytes' steps, then torchao's
            k->adamw8(p, u, qm, qv, am, av, maps, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.5f, t, t > 2);
        put(&o, p, n), put(&o, am, (n + ADAM8_BLOCK - 1) / ADAM8_BLOCK), put(&o, av, (n + ADAM8_BLOCK - 1) / ADAM8_BLOCK);
        float *bytes = malloc(n * sizeof(float));  // the moments' bytes, both in one float each
        for (size_t i = 0; i < n; i++) bytes[i] = qm[i] + 256.0f * qv[i];
        put(&o, bytes, n);
        free(am), free(av), free(qm), free(qv), free(bytes);
    }
    free(g), free(u), free(h), free(dh), free(dg), free(du), free(xn), free(w), free(y), free(rstd);
    free(dy), free(dxn), free(dw), free(p), free(m), free(vv);
    return o;
}

static void test_variants(void) {
    const int level = kernels_f32_level();
    Outs base = run_variant(&variants[0]);
    for (int l = 1; l <= 2; l++) {
        char name[96], d[96];
        snprintf(name, sizeof name, "kernels_f32_%s == kernels_f32_base, bit for bit", variants[l].name);
        if (l > level) {
            printf("SKIP %s: this CPU lacks %s\n", name, variants[l].name);
            continue;
        }
        Outs o = run_variant(&variants[l]);
        size_t diff = 0;
        for (size_t i = 0; i < o.n; i++) diff += fbits(o.v[i]) != fbits(base.v[i]);
        snprintf(d, sizeof d, "%zu of %zu outputs differ", diff, o.n);
        check(o.n == base.n && diff == 0, name, d);
        free(o.v);
    }
    free(base.v);
    // The dispatched names are bound to the widest variant (ifunc addresses are the targets').
    const Variant *w = &variants[level];
    int bound = (void *)attention_fwd_f32 == (void *)w->attention_fwd &&
                (void *)attention_bwd_f32 == (void *)w->attention_bwd &&
                (void *)classifier_ce_f32 == (void *)w->classifier_ce && (void *)adamw_f32 == (void *)w->adamw;
    char name[96];
    snprintf(name, sizeof name, "name_f32 is bound to kernels_f32_%s on this CPU", w->name);
    check(bound, name, "another variant is bound");
}

// 4. matmul_many (the CPU backend's independent products, whole products side by side on the
//    threads) against its products alone, bit for bit, for 1-4 threads: single-threaded when
//    there are at least as many products as threads, else through matmul (row pieces on the
//    threads, or OpenBLAS's threading for small products) at the same thread count. Batches
//    of the benchmark
//    model's shapes (q/k/v, gate/up, a linear's dx + dW pair), small odd ones, every
//    transpose, alpha/beta. Run for each OpenBLAS core type the CPU can use (their kernel
//    tiles differ), each in a child process (the core type is read at load time).
static int test_matmul_many(void) {
    static const int shapes[][5] = {  // ta, tb, M, N, K
        {0, 1, 2048, 256, 256}, {0, 1, 2048, 128, 256}, {0, 1, 2048, 128, 256},  // q, k, v
        {0, 1, 1000, 344, 256}, {0, 1, 1000, 344, 256},                          // gate, up
        {0, 0, 2048, 256, 344}, {1, 0, 344, 256, 2048},                          // dx, dW
        {1, 1, 37, 29, 17}, {0, 0, 300, 48, 64}, {1, 0, 64, 48, 300}, {0, 1, 1000, 8, 3}};
    static const int batches[][2] = {{0, 3}, {3, 2}, {5, 2}, {7, 1}, {8, 2}, {7, 4}, {0, 11}};
    enum { NJ = 11 };
    const int saved = omp_get_max_threads();
    Matmul job[NJ];
    float *ref[NJ], *one[NJ], *out[NJ];
    for (int i = 0; i < NJ; i++) {
        const int *s = shapes[i];
        size_t na = (size_t)s[2] * s[4], nb = (size_t)s[4] * s[3], nc = (size_t)s[2] * s[3];
        float *a = malloc(sizeof(float) * na), *b = malloc(sizeof(float) * nb);
        ref[i] = malloc(sizeof(float) * nc), one[i] = malloc(sizeof(float) * nc), out[i] = malloc(sizeof(float) * nc);
        for (size_t k = 0; k < na; k++) a[k] = (float)sin(0.37 * k + i);
        for (size_t k = 0; k < nb; k++) b[k] = (float)cos(0.21 * k - i);
        job[i] = (Matmul){ref[i], a, b, s[2], s[3], s[4], s[0], s[1], i % 2 ? 0.7 : 1.0, i % 3 ? 0.0 : 0.5};
    }
#define FILL(p, i) for (size_t k = 0; k < (size_t)job[i].M * job[i].N; k++) (p)[k] = (float)k * 1e-3f
#define ALONE(j, c) matmul_f32((c), (j).A, (j).B, (j).M, (j).N, (j).K, (j).ta, (j).tb, (float)(j).alpha, (float)(j).beta)
    omp_set_num_threads(1);
    for (int i = 0; i < NJ; i++) {
        FILL(ref[i], i);
        ALONE(job[i], ref[i]);
    }
    size_t diff = 0, diff1 = 0, n = 0;
    for (int t = 1; t <= 4; t++) {
        omp_set_num_threads(t);
        for (int i = 0; i < NJ; i++) {
            FILL(one[i], i);
            ALONE(job[i], one[i]);
        }
        for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++) {
            Matmul j[NJ];
            const int first = batches[bi][0], cnt = batches[bi][1];
            for (int i = first; i < first + cnt; i++) {
                j[i - first] = job[i];
                j[i - first].C = out[i];
                FILL(out[i], i);
            }
            matmul_many_f32(j, cnt);
            // At least as many products as threads: each whole on one thread, so the bits of the
            // single-threaded product; fewer: one after another, each through matmul.
            for (int i = first; i < first + cnt; i++)
                for (size_t k = 0; k < (size_t)job[i].M * job[i].N; k++) {
                    diff += fbits(out[i][k]) != fbits((cnt >= t ? ref : one)[i][k]);
                    diff1 += fbits(one[i][k]) != fbits(ref[i][k]);
                    n++;
                }
        }
    }
#undef FILL
#undef ALONE
    omp_set_num_threads(saved);
    char name[128], d[128];
    const char *core = getenv("OPENBLAS_CORETYPE");
    snprintf(name, sizeof name, "matmul_many (1-4 threads) == its products alone, bit for bit (OpenBLAS core %s)",
             core ? core : "detected");
    snprintf(d, sizeof d, "%zu of %zu outputs differ", diff, n);
    check(diff == 0, name, d);
    // Why every mode must batch the same products the same way: a product made on several
    // threads (in row pieces, or threaded by OpenBLAS) differs from the single-threaded one.
    printf("     (products on 1-4 threads vs single-threaded: %zu of %zu outputs differ)\n", diff1, n);
    for (int i = 0; i < NJ; i++) free((void *)job[i].A), free((void *)job[i].B), free(ref[i]), free(one[i]), free(out[i]);
    return diff == 0;
}

// The same under each OpenBLAS core type this CPU runs, in children of this program.
static void test_matmul_many_cores(const char *self) {
    static const char *cores[] = {"Prescott", "Haswell", "Zen", "SkylakeX", "Cooperlake"};
    __builtin_cpu_init();
    for (size_t c = 0; c < sizeof cores / sizeof *cores; c++) {
        int need512 = c >= 3, need2 = c >= 1;
        if ((need512 && !__builtin_cpu_supports("avx512bw")) || (need2 && !__builtin_cpu_supports("avx2")) ||
            (c == 4 && !__builtin_cpu_supports("avx512bf16")))
            continue;
        char cmd[512];
        snprintf(cmd, sizeof cmd, "OPENBLAS_CORETYPE=%s '%s' --matmul-only", cores[c], self);
        int st = system(cmd);
        char name[96];
        snprintf(name, sizeof name, "matmul_many child for core %s ran clean", cores[c]);
        check(st == 0, name, "the child failed (its FAIL line is above)");
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--matmul-only")) return test_matmul_many() ? 0 : 1;
    test_vexpf();
    test_exp_loops();
    test_variants();
    test_matmul_many();
    test_matmul_many_cores(argv[0]);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
