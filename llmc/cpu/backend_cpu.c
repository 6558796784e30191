// backend_cpu.c: the CPU backend. "Device" memory is host memory counted against a budget, so
// every memory mode and every out-of-memory path can be exercised on a machine with no GPU.
// Queues and events exist so the engine's ordering code runs unchanged; work here is
// synchronous, so they only check that they are used consistently.
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include "../backend.h"
#include "../util.h"
#include "kernels.h"
#include "../int8.h"
#include "../nf4.h"

struct Queue { int id; };
struct Event { int recorded; };

// Every allocation carries its size and the address to free in a 64-byte header just before
// the payload (which keeps the payload aligned for SIMD).
#define HDR 64
typedef struct { size_t bytes; char *base; } Header;
_Static_assert(sizeof(Header) <= HDR, "the header fits its slot");

// Buffers of 2 MiB and more start on a 2 MiB boundary, their header at the end of the 4 KiB
// page before it, and ask for transparent huge pages (hosts that give them on madvise only, as
// this project's do, else give 4 KiB pages; the tail rule is below): fewer TLB misses while
// OpenBLAS packs operands out of the activations. Measured at the large bench shape, 2 threads,
// alternated 3 times, with the threshold at 4 MiB: the step's GEMM time 1.1% less, the gate/up
// forward products (whose outputs are the largest buffers) 15.6-15.9 ms a call against
// 16.4-17.9. The header used to sit at the payload's start, 64 bytes that pushed a buffer of
// whole huge pages into one more (so only 4 MiB and up were aligned, and an 8 MiB one held 10);
// since it moved, the small bench shape's 2 MiB activations (layer input, norms, q, attention
// output) get huge pages too.
#define HUGE_PAGE ((size_t)2 << 20)

static void *counted_alloc(size_t bytes, size_t *in_use, size_t *peak) {
    if (bytes > SIZE_MAX - 3 * HUGE_PAGE) return NULL;  // the roundings below must not wrap
    const size_t payload = (bytes + HDR - 1) / HDR * HDR;
    char *base, *q;
    if (bytes >= HUGE_PAGE) {
        // The payload in whole huge pages (its 64-byte rounding never crosses one). aligned_alloc
        // wants a multiple of the alignment; the rounding is address space only (pages never
        // touched cost nothing).
        const size_t up = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
        base = aligned_alloc(HUGE_PAGE, HUGE_PAGE + up);
        if (!base) return NULL;
        q = base + HUGE_PAGE;
        // A tail short of 2 MiB gets a huge page too when that holds at most 1/8 more than asked
        // (a 5.5 MiB buffer: 6 MiB), else stays on 4 KiB pages (a 2.1 MiB one: 2 MiB + 4 KiB pages).
        madvise(q, up - bytes <= bytes / 8 ? up : bytes / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE);  // best effort
    } else {
        base = aligned_alloc(HDR, HDR + payload);
        if (!base) return NULL;
        q = base + HDR;
    }
    *(Header *)(q - HDR) = (Header){bytes, base};
    *in_use += bytes;
    if (*in_use > *peak) *peak = *in_use;
    return q;
}

static size_t counted_free(void *q, size_t *in_use) {
    if (!q) return 0;
    const Header h = *(const Header *)((char *)q - HDR);
    *in_use -= h.bytes;
    free(h.base);
    return h.bytes;
}

static void *cpu_dev_alloc(Backend *bk, size_t bytes, const char *what) {
    MemStats *m = &bk->mem;
    if (m->limit && m->in_use + bytes > m->limit) {
        char need[32], used[32], lim[32];
        format_bytes(need, sizeof need, (double)bytes);
        format_bytes(used, sizeof used, (double)m->in_use);
        format_bytes(lim, sizeof lim, (double)m->limit);
        fail("device memory limit reached allocating %s for %s (%s in use, limit %s)%s%s", need,
             what, used, lim, bk->oom_hint ? "; modes that fit: " : "", bk->oom_hint ? bk->oom_hint : "");
    }
    void *p = counted_alloc(bytes, &m->in_use, &m->peak);
    if (!p) fail("out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

static void cpu_dev_free(Backend *bk, void *p) { counted_free(p, &bk->mem.in_use); }

static void *cpu_host_alloc(Backend *bk, size_t bytes, const char *what) {
    void *p = counted_alloc(bytes, &bk->mem.host_in_use, &bk->mem.host_peak);
    if (!p) fail("out of host memory allocating %zu bytes for %s", bytes, what);
    return p;
}

static void cpu_host_free(Backend *bk, void *p) { counted_free(p, &bk->mem.host_in_use); }

// Clears of NT_CLEAR bytes or more (the gradients, once a step: 340 MB at the large benchmark
// shape) use non-temporal stores, which write whole lines without reading them first and leave
// the caches alone: 340 MB on 2 threads in 10-11 ms against 19 with memset (Intel Xeon, family 6
// model 207, 2026-11-29). Such a buffer is not read again before the forward pass has streamed
// its activations through the caches, so nothing is lost by not caching it; smaller clears
// (a layer's activation gradient, read right after) keep memset.
#define NT_CLEAR ((size_t)64 << 20)
static void clear_lines(char *p, size_t len, int stream) {
#if defined(__SSE2__)
    if (stream) {
        const size_t head = (16 - (uintptr_t)p % 16) % 16 < len ? (16 - (uintptr_t)p % 16) % 16 : len;
        memset(p, 0, head);
        const __m128i z = _mm_setzero_si128();
        size_t o = head;
        for (; o + 16 <= len; o += 16) _mm_stream_si128((__m128i *)(p + o), z);
        memset(p + o, 0, len - o);
        return;
    }
#endif
    (void)stream;
    memset(p, 0, len);
}

// Large clears in parallel chunks: one thread clears ~10 GB/s.
static void cpu_memzero(Backend *bk, void *dst, size_t bytes, Queue *q) {
    (void)bk; (void)q;
    const size_t chunk = (size_t)1 << 20;
    if (bytes < 2 * chunk || omp_in_parallel()) {
        memset(dst, 0, bytes);
        return;
    }
    const long n = (long)((bytes + chunk - 1) / chunk);
    const int stream = bytes >= NT_CLEAR;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (long i = 0; i < n; i++) {
            size_t o = (size_t)i * chunk;
            clear_lines((char *)dst + o, bytes - o < chunk ? bytes - o : chunk, stream);
        }
#if defined(__SSE2__)
        if (stream) _mm_sfence();  // the streamed stores are visible before the region's end
#endif
    }
}

static void cpu_copy(Backend *bk, void *dst, const void *src, size_t bytes, Queue *q) {
    (void)bk; (void)q;
    memcpy(dst, src, bytes);
}
static void cpu_copy_2d(Backend *bk, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t rows, Queue *q) {
    (void)bk; (void)q;
    for (size_t r = 0; r < rows; r++) memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}

static void cpu_upload(Backend *bk, void *dst, const float *src, size_t n) {
    (void)bk;
    memcpy(dst, src, n * sizeof(float));
}

static void cpu_download(Backend *bk, float *dst, const void *src, size_t n) {
    (void)bk;
    memcpy(dst, src, n * sizeof(float));
}

static Queue *cpu_queue_create(Backend *bk) {
    (void)bk;
    return xcalloc(1, sizeof(Queue));
}
static void cpu_queue_destroy(Backend *bk, Queue *q) { (void)bk; free(q); }
static Event *cpu_event_create(Backend *bk) {
    (void)bk;
    return xcalloc(1, sizeof(Event));
}
static void cpu_event_destroy(Backend *bk, Event *e) { (void)bk; free(e); }
static void cpu_event_record(Backend *bk, Event *e, Queue *q) { (void)bk; (void)q; e->recorded = 1; }
static void cpu_queue_wait(Backend *bk, Queue *q, Event *e) { (void)bk; (void)q; (void)e; }
static void cpu_event_sync(Backend *bk, Event *e) { (void)bk; (void)e; }
static void cpu_sync(Backend *bk) { (void)bk; }

// ---- compute: thin casts onto the float kernels ----------------------------------------
static void cpu_matmul(Backend *bk, void *C, const void *A, const void *B, int M, int N, int K,
                       int ta, int tb, float alpha, float beta) {
    (void)bk;
    matmul_f32(C, A, B, M, N, K, ta, tb, alpha, beta);
}
// Activations are float here, so a float weight gradient is an ordinary float matrix.
static void cpu_matmul_dw(Backend *bk, float *dW, const void *A, const void *B, int M, int N, int K,
                          int ta, int tb, float alpha) {
    (void)bk;
    matmul_f32(dW, A, B, M, N, K, ta, tb, alpha, 1.0f);
}
static void cpu_matmul_many(Backend *bk, const Matmul *jobs, int n) {
    (void)bk;
    matmul_many_f32(jobs, n);
}
static void cpu_add_bias(Backend *bk, void *y, const void *b, int N, int D) { (void)bk; add_bias_f32(y, b, N, D); }
static void cpu_bias_grad(Backend *bk, float *db, const void *dy, int N, int D) { (void)bk; bias_grad_f32(db, dy, N, D); }
static void cpu_add(Backend *bk, void *y, const void *a, const void *b, size_t n) { (void)bk; add_f32(y, a, b, n); }
static void cpu_accumulate(Backend *bk, void *y, const void *x, size_t n) { (void)bk; accumulate_f32(y, x, n); }
static void cpu_accumulate_grad(Backend *bk, float *y, const float *x, size_t n) { (void)bk; accumulate_f32(y, x, n); }
static void cpu_scale(Backend *bk, void *y, float s, size_t n) { (void)bk; scale_f32(y, s, n); }

static void cpu_embedding_fwd(Backend *bk, void *out, const int32_t *tok, const void *table,
                              int N, int C) {
    (void)bk;
    embedding_fwd_f32(out, tok, table, N, C);
}
static void cpu_embedding_bwd(Backend *bk, float *dt, const void *dout, const int32_t *tok, int N,
                              int C, int V) {
    (void)bk; (void)V;
    embedding_bwd_f32(dt, dout, tok, N, C);
}
static void cpu_rmsnorm_fwd(Backend *bk, void *out, float *rstd, const void *x, const void *w,
                            float w_add, int N, int C, float eps) {
    (void)bk;
    rmsnorm_fwd_f32(out, rstd, x, w, w_add, N, C, eps);
}
static void cpu_rmsnorm_bwd(Backend *bk, void *dx, float *dw, const void *dy, const void *x,
                            const void *w, float w_add, const float *rstd, int N, int C) {
    (void)bk;
    rmsnorm_bwd_f32(dx, dw, dy, x, w, w_add, rstd, N, C);
}
static void cpu_layernorm_fwd(Backend *bk, void *out, float *mean, float *rstd, const void *x,
                              const void *w, const void *b, int N, int C, float eps) {
    (void)bk;
    layernorm_fwd_f32(out, mean, rstd, x, w, b, N, C, eps);
}
static void cpu_layernorm_bwd(Backend *bk, void *dx, float *dw, float *db, const void *dy,
                              const void *x, const void *w, const float *mean, const float *rstd,
                              int N, int C) {
    (void)bk;
    layernorm_bwd_f32(dx, dw, db, dy, x, w, mean, rstd, N, C);
}
static void cpu_gelu_fwd(Backend *bk, void *y, const void *x, size_t n) { (void)bk; gelu_fwd_f32(y, x, n); }
static void cpu_gelu_bwd(Backend *bk, void *dx, const void *dy, const void *x, size_t n) {
    (void)bk;
    gelu_bwd_f32(dx, dy, x, n);
}
static void cpu_pos_fwd(Backend *bk, void *out, const void *wpe, int B, int T, int C) {
    (void)bk;
    pos_fwd_f32(out, wpe, B, T, C);
}
static void cpu_pos_bwd(Backend *bk, float *dwpe, const void *dout, int B, int T, int C) {
    (void)bk;
    pos_bwd_f32(dwpe, dout, B, T, C);
}
static void cpu_rope_fwd(Backend *bk, void *x, const float *c, const float *s, const int32_t *pos,
                         int B, int T, int H, int D, int rot) {
    (void)bk;
    rope_fwd_f32(x, c, s, pos, B, T, H, D, rot);
}
static void cpu_rope_bwd(Backend *bk, void *x, const float *c, const float *s, const int32_t *pos,
                         int B, int T, int H, int D, int rot) {
    (void)bk;
    rope_bwd_f32(x, c, s, pos, B, T, H, D, rot);
}
static void cpu_attention_fwd(Backend *bk, void *out, float *lse, const void *q, const void *k,
                              const void *v, int B, int T, int q0, int nq, int Hq, int Hkv, int D,
                              int window, const int32_t *doc_start, float scale, float softcap) {
    (void)bk;
    attention_fwd_f32(out, lse, q, k, v, B, T, q0, nq, Hq, Hkv, D, window, doc_start, scale, softcap);
}
static void cpu_attention_bwd(Backend *bk, void *dq, void *dk, void *dv, const void *dout,
                              const void *q, const void *k, const void *v, const void *out,
                              const float *lse, int B, int T, int q0, int nq, int Hq, int Hkv,
                              int D, int window, const int32_t *doc_start, int accumulate, float *dk_f32,
                              float *dv_f32, float scale, float softcap) {
    (void)bk, (void)dk_f32, (void)dv_f32;  // float activations are their own running sums
    attention_bwd_f32(dq, dk, dv, dout, q, k, v, out, lse, B, T, q0, nq, Hq, Hkv, D, window,
                      doc_start, accumulate, scale, softcap);
}
static void cpu_dropout(Backend *bk, void *y, const void *x, size_t n, float p, uint64_t seed,
                        size_t first) {
    (void)bk;
    dropout_f32(y, x, n, p, seed, first);
}
static void cpu_swiglu_fwd(Backend *bk, void *h, const void *g, const void *u, size_t n) {
    (void)bk;
    swiglu_fwd_f32(h, g, u, n);
}
static void cpu_swiglu_bwd(Backend *bk, void *dg, void *du, const void *dh, const void *g,
                           const void *u, size_t n) {
    (void)bk;
    swiglu_bwd_f32(dg, du, dh, g, u, n);
}
static void cpu_geglu_fwd(Backend *bk, void *h, const void *g, const void *u, size_t n, int exact) {
    (void)bk;
    geglu_fwd_f32(h, g, u, n, exact);
}
static void cpu_geglu_bwd(Backend *bk, void *dg, void *du, const void *dh, const void *g,
                          const void *u, size_t n, int exact) {
    (void)bk;
    geglu_bwd_f32(dg, du, dh, g, u, n, exact);
}
static void cpu_classifier_ce(Backend *bk, float *losses, void *dx, float *dW, const void *x,
                              const void *W, const int32_t *tgt, int N, int V, int C, float scale,
                              float softcap) {
    (void)bk;
    classifier_ce_f32(losses, dx, dW, x, W, tgt, N, V, C, scale, softcap);
}
static void cpu_sumsq_many(Backend *bk, const float *const *x, const size_t *n, int count, double *each) {
    (void)bk;
    for (int i = 0; i < count; i++) each[i] = sumsq_f32(x[i], n[i]);
}
static double cpu_sum_f32(Backend *bk, const float *x, size_t n) {
    (void)bk;
    double s = 0;  // sequential: the loss must not depend on the thread count
    for (size_t i = 0; i < n; i++) s += x[i];
    return s;
}
static void cpu_adamw(Backend *bk, void *p, float *master, const float *g, float *m, float *v,
                      size_t n, float lr, float b1, float b2, float eps, float wd, float gscale,
                      int t) {
    (void)bk; (void)master;  // float params are their own master copy
    adamw_f32(p, g, m, v, n, lr, b1, b2, eps, wd, gscale, t);
}
static void cpu_adamw8(Backend *bk, void *p, float *master, const float *g, uint8_t *qm, uint8_t *qv, float *am,
                       float *av, const float *maps, size_t n, float lr, float b1, float b2, float eps, float wd,
                       float gscale, int t, int flavor) {
    (void)bk; (void)master;
    adamw8_f32(p, g, qm, qv, am, av, maps, n, lr, b1, b2, eps, wd, gscale, t, flavor);
}

static void cpu_dequantize(Backend *bk, void *out, const void *region, size_t n, int format) {
    (void)bk, (void)n;
    if (format == REGION_INT8) int8_region_dequantize(region, out);
    else nf4_region_dequantize(region, out);
}

static void cpu_destroy(Backend *bk) { free(bk); }

char *openblas_get_corename(void);

void backend_cpu_preinit(char **argv) {
    if (getenv("OPENBLAS_CORETYPE")) return;  // the user's choice
    const char *core = openblas_get_corename();
    if (!core) return;
    __builtin_cpu_init();
    const int level = kernels_f32_level();  // 2: AVX-512 F/BW/DQ/VL, 1: AVX2 + FMA
    const int avx512 = level == 2 && __builtin_cpu_supports("avx512cd"), avx2 = level >= 1;
    const int core512 = !strcasecmp(core, "skylakex") || !strcasecmp(core, "cooperlake") ||
                        !strcasecmp(core, "sapphirerapids");
    const char *want = NULL;
    // OpenBLAS falls back to its generic (Prescott) kernels on VMs that hide the CPU model, and
    // would run an AVX-512 CPU it does not recognise on AVX2 kernels: its AVX-512 kernels are
    // 2x faster on this project's AMD EPYC (Zen 4) machines (dev/bench_cpu.sh compares them).
    if (avx512 && !core512) want = "SkylakeX";
    else if (!strcasecmp(core, "prescott") && avx2) want = "Haswell";
    if (!want) return;
    setenv("OPENBLAS_CORETYPE", want, 1);
    execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
}

Backend *backend_cpu_create(int threads) {
    if (threads > 0) omp_set_num_threads(threads);
    Backend *bk = xcalloc(1, sizeof(Backend));
    bk->name = "cpu";
    bk->act_bytes = sizeof(float);
    bk->att_block = attention_block_f32();
    bk->threads = omp_get_max_threads();
    // Attention's products are fma chains (attention.inc, att_mm): without FMA every one is a
    // call to glibc's fmaf, ~80x slower than the AVX2 kernels (AMD EPYC, 1 thread, B 8, T 256).
    static const char *kset[] = {"base kernels (no AVX2/FMA: attention ~80x slower)", "AVX2 kernels",
                                 "AVX-512 kernels"};
    const char *core = openblas_get_corename();
    snprintf(bk->detail, sizeof bk->detail, "BLAS %s, %s", core ? core : "?",
             kset[kernels_f32_level()]);
    bk->dev_alloc = cpu_dev_alloc;
    bk->dev_free = cpu_dev_free;
    bk->host_alloc = cpu_host_alloc;
    bk->host_free = cpu_host_free;
    bk->memzero = cpu_memzero;
    bk->copy_h2d = cpu_copy;
    bk->copy_d2h = cpu_copy;
    bk->copy_d2d = cpu_copy;
    bk->copy_2d = cpu_copy_2d;
    bk->upload_act = cpu_upload;
    bk->download_act = cpu_download;
    bk->host_from_f32 = cpu_upload;  // host and "device" are both float arrays here
    bk->host_to_f32 = cpu_download;
    bk->queue_create = cpu_queue_create;
    bk->queue_destroy = cpu_queue_destroy;
    bk->event_create = cpu_event_create;
    bk->event_destroy = cpu_event_destroy;
    bk->event_record = cpu_event_record;
    bk->queue_wait = cpu_queue_wait;
    bk->event_sync = cpu_event_sync;
    bk->sync = cpu_sync;
    bk->matmul = cpu_matmul;
    bk->matmul_dw = cpu_matmul_dw;
    bk->matmul_many = cpu_matmul_many;
    bk->add_bias = cpu_add_bias;
    bk->bias_grad = cpu_bias_grad;
    bk->add = cpu_add;
    bk->accumulate = cpu_accumulate;
    bk->accumulate_f32 = cpu_accumulate_grad;
    bk->embedding_fwd = cpu_embedding_fwd;
    bk->embedding_bwd = cpu_embedding_bwd;
    bk->rmsnorm_fwd = cpu_rmsnorm_fwd;
    bk->rmsnorm_bwd = cpu_rmsnorm_bwd;
    bk->layernorm_fwd = cpu_layernorm_fwd;
    bk->layernorm_bwd = cpu_layernorm_bwd;
    bk->gelu_fwd = cpu_gelu_fwd;
    bk->gelu_bwd = cpu_gelu_bwd;
    bk->pos_fwd = cpu_pos_fwd;
    bk->pos_bwd = cpu_pos_bwd;
    bk->rope_fwd = cpu_rope_fwd;
    bk->rope_bwd = cpu_rope_bwd;
    bk->attention_fwd = cpu_attention_fwd;
    bk->attention_bwd = cpu_attention_bwd;
    bk->swiglu_fwd = cpu_swiglu_fwd;
    bk->dropout = cpu_dropout;
    bk->swiglu_bwd = cpu_swiglu_bwd;
    bk->geglu_fwd = cpu_geglu_fwd;
    bk->geglu_bwd = cpu_geglu_bwd;
    bk->classifier_ce = cpu_classifier_ce;
    bk->sumsq_many = cpu_sumsq_many;
    bk->sum_f32 = cpu_sum_f32;
    bk->scale = cpu_scale;
    bk->adamw = cpu_adamw;
    bk->adamw8 = cpu_adamw8;
    bk->dequantize = cpu_dequantize;
    bk->destroy = cpu_destroy;
    return bk;
}
