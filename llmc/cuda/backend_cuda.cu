// backend_cuda.cu: the CUDA backend -- backend.h's table over CUDA streams, events, cuBLASLt and
// the hand-written kernels of llmc/cuda/*.cu.
//
// STATUS: has run on one GPU once (an H200, 2026-11-27: scripts/gpu_check.sh, every part green
// after four fixes; dev/results/gpu_h200_2026-11-27/): kernels against CPU references, fp32
// training against the CPU backend, every memory mode bit-identical, NCCL at a world of one,
// compute-sanitizer clean. The kernels and this file's logic also run on the CPU under the SIMT
// emulator (dev/cuda/emu), with stream order checked.
//
// Devices: backend_cuda_available creates no CUDA context (it compares compute capabilities
// with __CUDA_ARCH_LIST__); backend_cuda_create calls cudaSetDevice(device_index) before any
// other call that would make one, so an MPI or launcher-free rank touches only its own GPU.
//
// Memory: dev_alloc counts bytes against mem.limit exactly as the CPU backend does (same
// message, naming `what`, with bk->oom_hint appended), then cudaMalloc; a real out-of-memory
// from the driver fails with the same shape of message. host_alloc is counted in
// host_in_use/host_peak and pinned (cudaMallocHost) only within a cap, because pinned memory is
// locked out of the host's page cache and swap (pinning everything took about 96 GB for an 8B
// offload run, which most hosts refuse): a buffer is pinned when it is at most
// LLMC_PIN_MAX_BUFFER_MB (default 256 MiB: staging buffers and per-tensor activation copies,
// which the copy engines stream) and the pinned total stays within LLMC_PINNED_LIMIT_MB
// (default 4096 MiB; 0 pins nothing). Anything else (the streamed-weight blob, host optimizer
// state, buffers past the cap) is pageable, with one note naming the first such buffer. Copies
// to and from pageable memory stay correct (CUDA stages them; a device-to-host copy into
// pageable memory returns only when it is done) but stop overlapping with the host thread.
// A failed pin falls back to pageable memory the same way. Kernel scratch (cuBLASLt
// workspace, classifier chunk logits, reduction partials, attention row sums, embedding
// sort) belongs to the backend and is not counted, as the CPU kernels' malloc'd scratch is not.
//
// Ordering: the compute queue is a non-blocking stream created here (never the legacy
// default stream, which would serialise with every other stream); queue_create makes more
// non-blocking streams, events are cudaEvents without timing. Copies are cudaMemcpyAsync on the
// given stream: a copy into or out of pageable host memory still completes (or, host to device,
// has staged its source) before it returns, as CUDA documents, so callers that pass malloc'd
// memory with q NULL keep the CPU backend's semantics; pinned memory from host_alloc is truly
// asynchronous and must be waited for through an event or sync, as backend.h says.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.cuh"
extern "C" {
#include "../backend.h"
}
static_assert(ADAM8_BLOCK == ADAM8_BLOCK_CU && ADAM4_BLOCK == ADAM4_BLOCK_CU, "adamw.cu's blocks are backend.h's");

void cuda_fail(const char *what, cudaError_t e, const char *file, int line) {
    fail("CUDA: %s failed at %s:%d: %s (%s)", what, file, line, cudaGetErrorString(e), cudaGetErrorName(e));
}

// ---- CudaCtx ------------------------------------------------------------------------------
#define LT_WORKSPACE_BYTES ((size_t)32 << 20)

__global__ void probe_kernel(int *x) {
    if (x) *x = 1;
}

CudaCtx *cuda_ctx_create(int bf16, int device) {
    CudaCtx *c = (CudaCtx *)xcalloc(1, sizeof(CudaCtx));
    c->bf16 = bf16 ? 1 : 0;
    c->device = device;
    CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    c->num_sms = prop.multiProcessorCount;
    c->smem_optin = prop.sharedMemPerBlockOptin;
    // The mma.sync attention kernels unless LLMC_ATT_MMA=0 (the WMMA ones: 4-5x slower on the
    // H200, kept as a second path to compare with; dev/results/gpu_h200_2026-11-28)
    const char *mma = getenv("LLMC_ATT_MMA");
    c->mma_attention = !(mma && !strcmp(mma, "0"));
    const char *one_grid = getenv("LLMC_ATT_BWD_ONE_GRID");  // not yet timed on a GPU, hence opt-in
    c->att_bwd_one_grid = one_grid && !strcmp(one_grid, "1");
    const char *pipe = getenv("LLMC_ATT_PIPELINE");  // not yet timed on a GPU either
    c->att_pipeline = pipe && !strcmp(pipe, "1");
    c->att_kv_split = 1;
    const char *split = getenv("LLMC_ATT_KV_SPLIT");
    if (split && *split) {
        char *end;
        long n = strtol(split, &end, 10);
        if (*end || n < 1 || n > 64) fail("LLMC_ATT_KV_SPLIT=%s: expected an integer from 1 to 64 (parts of a GQA group)", split);
        c->att_kv_split = (int)n;
    }
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt: cublasLtCreate failed");
    c->workspace_bytes = LT_WORKSPACE_BYTES;
    CUDA_CHECK(cudaMalloc(&c->workspace, c->workspace_bytes));
    CUDA_CHECK(cudaMallocHost((void **)&c->host_result, sizeof(double)));
    CUDA_CHECK(cudaMalloc((void **)&c->dev_result, sizeof(double)));
    k_nf4_init();
    return c;
}

void cuda_ctx_destroy(CudaCtx *c) {
    if (!c) return;
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    for (int i = 0; i < SCR_COUNT; i++)
        if (c->scratch[i]) CUDA_CHECK(cudaFree(c->scratch[i]));
    lt_cache_free(c->cache);
    cublasLtDestroy(c->lt);
    CUDA_CHECK(cudaFree(c->workspace));
    CUDA_CHECK(cudaFree(c->dev_result));
    CUDA_CHECK(cudaFreeHost(c->host_result));
    CUDA_CHECK(cudaStreamDestroy(c->stream));
    free(c);
}

void *ctx_scratch(CudaCtx *c, int slot, size_t bytes) {
    if (bytes <= c->scratch_bytes[slot]) return c->scratch[slot];
    // Grow by at least a quarter so a slowly growing request does not reallocate every call;
    // the old buffer may still be in use by queued kernels, so drain the stream first.
    size_t want = bytes + bytes / 4;
    want = (want + 4095) & ~(size_t)4095;
    if (c->scratch[slot]) {
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        CUDA_CHECK(cudaFree(c->scratch[slot]));
        c->scratch[slot] = NULL;
        c->scratch_bytes[slot] = 0;
    }
    cudaError_t e = cudaMalloc(&c->scratch[slot], want);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        char need[32];
        format_bytes(need, sizeof need, (double)want);
        static const char *names[SCR_COUNT] = {"reduction partials", "classifier chunk logits",
                                               "classifier chunk gradient", "attention backward row sums",
                                               "attention backward dK/dV parts", "embedding backward order",
                                               "sumsq list"};
        fail("out of device memory allocating %s of kernel scratch (%s): %s", need, names[slot],
             cudaGetErrorString(e));
    }
    c->scratch_bytes[slot] = want;
    return c->scratch[slot];
}

size_t ctx_scratch_total(const CudaCtx *c) {
    size_t s = c->workspace_bytes;
    for (int i = 0; i < SCR_COUNT; i++) s += c->scratch_bytes[i];
    return s;
}

// ---- allocation sizes: pointer -> bytes (open addressing, tombstones) -------------------------
typedef struct {
    uintptr_t key;  // 0 empty, 1 tombstone
    size_t bytes;
    int pageable;   // host: fell back to malloc
} Slot;
typedef struct {
    Slot *s;
    size_t cap, used;  // used counts live entries and tombstones
} PtrMap;

static size_t ptr_hash(uintptr_t p, size_t cap) { return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ULL) & (cap - 1); }

static void map_put(PtrMap *m, uintptr_t key, size_t bytes, int pageable);
static void map_grow(PtrMap *m) {
    PtrMap old = *m;
    m->cap = old.cap ? old.cap * 2 : 1024;
    m->s = (Slot *)xcalloc(m->cap, sizeof(Slot));
    m->used = 0;
    for (size_t i = 0; i < old.cap; i++)
        if (old.s[i].key > 1) map_put(m, old.s[i].key, old.s[i].bytes, old.s[i].pageable);
    free(old.s);
}
static void map_put(PtrMap *m, uintptr_t key, size_t bytes, int pageable) {
    if ((m->used + 1) * 2 > m->cap) map_grow(m);
    size_t i = ptr_hash(key, m->cap);
    while (m->s[i].key > 1) i = (i + 1) & (m->cap - 1);
    if (m->s[i].key == 0) m->used++;
    m->s[i].key = key, m->s[i].bytes = bytes, m->s[i].pageable = pageable;
}
static Slot *map_find(PtrMap *m, uintptr_t key) {
    if (!m->cap) return NULL;
    size_t i = ptr_hash(key, m->cap);
    while (m->s[i].key != 0) {
        if (m->s[i].key == key) return &m->s[i];
        i = (i + 1) & (m->cap - 1);
    }
    return NULL;
}

// ---- the backend ----------------------------------------------------------------------------
struct Queue {
    cudaStream_t s;
};
struct Event {
    cudaEvent_t e;
};

typedef struct {
    CudaCtx *ctx;
    PtrMap dev, host;
    int warned_pageable;
    size_t pinned, pinned_limit, pin_max_buffer;  // bytes
} CudaImpl;

static size_t env_mb(const char *name, size_t dflt_mb) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt_mb << 20;
    char *end;
    double mb = strtod(v, &end);
    if (*end || mb < 0) fail("%s=%s: expected a size in MiB (a number >= 0)", name, v);
    return (size_t)(mb * 1048576.0);
}

static CudaImpl *impl_of(Backend *bk) { return (CudaImpl *)bk->impl; }
static CudaCtx *ctx_of(Backend *bk) { return ((CudaImpl *)bk->impl)->ctx; }
static cudaStream_t stream_of(Backend *bk, Queue *q) { return q ? q->s : ctx_of(bk)->stream; }

static void *cu_dev_alloc(Backend *bk, size_t bytes, const char *what) {
    MemStats *m = &bk->mem;
    char need[32], used[32], lim[32];
    if (m->limit && m->in_use + bytes > m->limit) {
        format_bytes(need, sizeof need, (double)bytes);
        format_bytes(used, sizeof used, (double)m->in_use);
        format_bytes(lim, sizeof lim, (double)m->limit);
        fail("device memory limit reached allocating %s for %s (%s in use, limit %s)%s%s", need, what, used,
             lim, bk->oom_hint ? "; modes that fit: " : "", bk->oom_hint ? bk->oom_hint : "");
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky-free error so the message is the only effect
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        char fr[32];
        format_bytes(need, sizeof need, (double)bytes);
        format_bytes(used, sizeof used, (double)m->in_use);
        format_bytes(fr, sizeof fr, (double)free_b);
        fail("out of device memory allocating %s for %s (%s in use by this run, %s free on the GPU: %s)%s%s",
             need, what, used, fr, cudaGetErrorString(e), bk->oom_hint ? "; modes that fit: " : "",
             bk->oom_hint ? bk->oom_hint : "");
    }
    map_put(&impl_of(bk)->dev, (uintptr_t)p, bytes, 0);
    m->in_use += bytes;
    if (m->in_use > m->peak) m->peak = m->in_use;
    return p;
}

static void cu_dev_free(Backend *bk, void *p) {
    if (!p) return;
    Slot *s = map_find(&impl_of(bk)->dev, (uintptr_t)p);
    if (!s) fail("internal: dev_free of %p, which dev_alloc did not return", p);
    bk->mem.in_use -= s->bytes;
    s->key = 1;
    CUDA_CHECK(cudaFree(p));  // synchronises with the device: no queued kernel still uses p
}

static void *cu_host_alloc(Backend *bk, size_t bytes, const char *what) {
    CudaImpl *ci = impl_of(bk);
    void *p = NULL;
    const size_t b = bytes ? bytes : 1;
    int pin = b <= ci->pin_max_buffer && ci->pinned + b <= ci->pinned_limit;
    const char *why = pin ? "cudaMallocHost failed" : b > ci->pin_max_buffer ? "larger than LLMC_PIN_MAX_BUFFER_MB"
                                                                         : "past LLMC_PINNED_LIMIT_MB";
    if (pin && cudaMallocHost(&p, b) != cudaSuccess) {
        (void)cudaGetLastError();
        p = NULL, pin = 0;
    }
    if (!pin) {
        p = malloc(b);
        if (!p) fail("out of host memory allocating %zu bytes for %s", bytes, what);
        if (!ci->warned_pageable) {
            char sz[32], cap[32];
            format_bytes(sz, sizeof sz, (double)bytes);
            format_bytes(cap, sizeof cap, (double)ci->pinned_limit);
            fprintf(stderr, "note: %s for %s is pageable host memory (%s; pinned cap %s): copies of it do not "
                            "overlap the host thread\n", sz, what, why, cap);
            ci->warned_pageable = 1;
        }
    } else {
        ci->pinned += b;
    }
    map_put(&ci->host, (uintptr_t)p, bytes, !pin);
    bk->mem.host_in_use += bytes;
    if (bk->mem.host_in_use > bk->mem.host_peak) bk->mem.host_peak = bk->mem.host_in_use;
    return p;
}

static void cu_host_free(Backend *bk, void *p) {
    if (!p) return;
    Slot *s = map_find(&impl_of(bk)->host, (uintptr_t)p);
    if (!s) fail("internal: host_free of %p, which host_alloc did not return", p);
    bk->mem.host_in_use -= s->bytes;
    s->key = 1;
    if (s->pageable) {
        // a copy queued from or into it has completed already (pageable copies do not return
        // before their source is staged / their result is written), but wait for the device
        // anyway: a kernel may still read it through a mapped pointer in a later backend
        CUDA_CHECK(cudaDeviceSynchronize());
        free(p);
    } else {
        impl_of(bk)->pinned -= s->bytes ? s->bytes : 1;
        // pinned memory may be the source or target of a queued copy
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaFreeHost(p));
    }
}

static void cu_memzero(Backend *bk, void *dst, size_t bytes, Queue *q) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_of(bk, q)));
}
static void cu_copy_h2d(Backend *bk, void *dst, const void *src, size_t bytes, Queue *q) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_of(bk, q)));
}
static void cu_copy_d2h(Backend *bk, void *dst, const void *src, size_t bytes, Queue *q) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(bk, q)));
}
static void cu_copy_d2d(Backend *bk, void *dst, const void *src, size_t bytes, Queue *q) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_of(bk, q)));
}
static void cu_copy_2d(Backend *bk, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t rows, Queue *q) {
    if (width && rows)
        CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice,
                                     stream_of(bk, q)));
}

// ---- host-side float <-> bf16 (round to nearest even, NaN kept a quiet NaN) -----------------
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void cu_host_from_f32(Backend *bk, void *dst, const float *src, size_t n) {
    if (bk->act_bytes == 4) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *d = (uint16_t *)dst;
    for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
}
static void cu_host_to_f32(Backend *bk, float *dst, const void *src, size_t n) {
    if (bk->act_bytes == 4) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t *s = (const uint16_t *)src;
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
}

#define CONVERT_CHUNK ((size_t)1 << 22)  // elements per staging chunk

// Synchronous, ordered after the compute queue's work.
static void cu_upload_act(Backend *bk, void *dst, const float *src, size_t n) {
    cudaStream_t s = ctx_of(bk)->stream;
    if (bk->act_bytes == 4) {
        if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, s));
    } else {
        // pageable staging: each copy has staged its source when it returns, so the buffer can
        // be refilled at once
        uint16_t *tmp = (uint16_t *)xmalloc(sizeof(uint16_t) * (n < CONVERT_CHUNK ? (n ? n : 1) : CONVERT_CHUNK));
        for (size_t i = 0; i < n; i += CONVERT_CHUNK) {
            size_t len = n - i < CONVERT_CHUNK ? n - i : CONVERT_CHUNK;
            for (size_t j = 0; j < len; j++) tmp[j] = f32_to_bf16(src[i + j]);
            CUDA_CHECK(cudaMemcpyAsync((uint16_t *)dst + i, tmp, len * 2, cudaMemcpyHostToDevice, s));
        }
        CUDA_CHECK(cudaStreamSynchronize(s));
        free(tmp);
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
}

static void cu_download_act(Backend *bk, float *dst, const void *src, size_t n) {
    cudaStream_t s = ctx_of(bk)->stream;
    if (bk->act_bytes == 4) {
        if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        return;
    }
    uint16_t *tmp = (uint16_t *)xmalloc(sizeof(uint16_t) * (n < CONVERT_CHUNK ? (n ? n : 1) : CONVERT_CHUNK));
    for (size_t i = 0; i < n; i += CONVERT_CHUNK) {
        size_t len = n - i < CONVERT_CHUNK ? n - i : CONVERT_CHUNK;
        CUDA_CHECK(cudaMemcpyAsync(tmp, (const uint16_t *)src + i, len * 2, cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        for (size_t j = 0; j < len; j++) dst[i + j] = bf16_to_f32(tmp[j]);
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
    free(tmp);
}

// ---- ordering ---------------------------------------------------------------------------------
static Queue *cu_queue_create(Backend *bk) {
    (void)bk;
    Queue *q = (Queue *)xcalloc(1, sizeof(Queue));
    CUDA_CHECK(cudaStreamCreateWithFlags(&q->s, cudaStreamNonBlocking));
    return q;
}
static void cu_queue_destroy(Backend *bk, Queue *q) {
    (void)bk;
    if (!q) return;
    CUDA_CHECK(cudaStreamSynchronize(q->s));
    CUDA_CHECK(cudaStreamDestroy(q->s));
    free(q);
}
static Event *cu_event_create(Backend *bk) {
    (void)bk;
    Event *e = (Event *)xcalloc(1, sizeof(Event));
    CUDA_CHECK(cudaEventCreateWithFlags(&e->e, cudaEventDisableTiming));
    return e;
}
static void cu_event_destroy(Backend *bk, Event *e) {
    (void)bk;
    if (!e) return;
    CUDA_CHECK(cudaEventDestroy(e->e));
    free(e);
}
static void cu_event_record(Backend *bk, Event *e, Queue *q) { CUDA_CHECK(cudaEventRecord(e->e, stream_of(bk, q))); }
// Waiting for an event never recorded returns at once, as on the CPU backend.
static void cu_queue_wait(Backend *bk, Queue *q, Event *e) { CUDA_CHECK(cudaStreamWaitEvent(stream_of(bk, q), e->e, 0)); }
static void cu_event_sync(Backend *bk, Event *e) {
    (void)bk;
    CUDA_CHECK(cudaEventSynchronize(e->e));
}
static void cu_sync(Backend *bk) {
    (void)bk;
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaGetLastError());
}

// ---- compute -----------------------------------------------------------------------------------
static void cu_matmul(Backend *bk, void *C, const void *A, const void *B, int M, int N, int K, int ta,
                      int tb, float alpha, float beta) {
    k_matmul(ctx_of(bk), C, A, B, M, N, K, ta, tb, alpha, beta);
}
// Weight gradients: bf16 (or float) operands, fp32 C/D (CUBLAS_COMPUTE_32F), beta 1.
static void cu_matmul_dw(Backend *bk, float *dW, const void *A, const void *B, int M, int N, int K, int ta,
                         int tb, float alpha) {
    k_matmul_f32out(ctx_of(bk), dW, A, B, M, N, K, ta, tb, alpha, 1.0f);
}
static void cu_add_bias(Backend *bk, void *y, const void *b, int N, int D) { k_add_bias(ctx_of(bk), y, b, N, D); }
static void cu_bias_grad(Backend *bk, float *db, const void *dy, int N, int D) { k_bias_grad(ctx_of(bk), db, dy, N, D); }
static void cu_add(Backend *bk, void *y, const void *a, const void *b, size_t n) { k_add(ctx_of(bk), y, a, b, n); }
static void cu_accumulate(Backend *bk, void *y, const void *x, size_t n) { k_accumulate(ctx_of(bk), y, x, n); }
static void cu_accumulate_f32(Backend *bk, float *y, const float *x, size_t n) { k_accumulate_f32(ctx_of(bk), y, x, n); }
static void cu_scale(Backend *bk, void *y, float s, size_t n) { k_scale(ctx_of(bk), y, s, n); }
static void cu_embedding_fwd(Backend *bk, void *out, const int32_t *tok, const void *table, int N, int C) {
    k_embedding_fwd(ctx_of(bk), out, tok, table, N, C);
}
static void cu_embedding_bwd(Backend *bk, float *dt, const void *dout, const int32_t *tok, int N, int C, int V) {
    k_embedding_bwd(ctx_of(bk), dt, dout, tok, N, C, V);
}
static void cu_rmsnorm_fwd(Backend *bk, void *out, float *rstd, const void *x, const void *w, float w_add, int N,
                           int C, float eps) {
    k_rmsnorm_fwd(ctx_of(bk), out, rstd, x, w, w_add, N, C, eps);
}
static void cu_rmsnorm_bwd(Backend *bk, void *dx, float *dw, const void *dy, const void *x, const void *w,
                           float w_add, const float *rstd, int N, int C) {
    k_rmsnorm_bwd(ctx_of(bk), dx, dw, dy, x, w, w_add, rstd, N, C);
}
static void cu_layernorm_fwd(Backend *bk, void *out, float *mean, float *rstd, const void *x, const void *w,
                             const void *b, int N, int C, float eps) {
    k_layernorm_fwd(ctx_of(bk), out, mean, rstd, x, w, b, N, C, eps);
}
static void cu_layernorm_bwd(Backend *bk, void *dx, float *dw, float *db, const void *dy, const void *x, const void *w,
                             const float *mean, const float *rstd, int N, int C) {
    k_layernorm_bwd(ctx_of(bk), dx, dw, db, dy, x, w, mean, rstd, N, C);
}
static void cu_gelu_fwd(Backend *bk, void *y, const void *x, size_t n) { k_gelu_fwd(ctx_of(bk), y, x, n); }
static void cu_gelu_bwd(Backend *bk, void *dx, const void *dy, const void *x, size_t n) { k_gelu_bwd(ctx_of(bk), dx, dy, x, n); }
static void cu_pos_fwd(Backend *bk, void *out, const void *wpe, int B, int T, int C) { k_pos_fwd(ctx_of(bk), out, wpe, B, T, C); }
static void cu_pos_bwd(Backend *bk, float *dwpe, const void *dout, int B, int T, int C) { k_pos_bwd(ctx_of(bk), dwpe, dout, B, T, C); }
static void cu_rope_fwd(Backend *bk, void *x, const float *c, const float *s, const int32_t *pos,
                        int B, int T, int H, int D, int rot) {
    k_rope(ctx_of(bk), x, c, s, pos, B, T, H, D, rot, 1);
}
static void cu_rope_bwd(Backend *bk, void *x, const float *c, const float *s, const int32_t *pos,
                        int B, int T, int H, int D, int rot) {
    k_rope(ctx_of(bk), x, c, s, pos, B, T, H, D, rot, -1);
}
// The sliding window and the document mask (backend.h) are implemented in attention.cu (checked
// against a reference on the emulator and on the H200, 2026-11-27; not in training runs there).
static void cu_attention_fwd(Backend *bk, void *out, float *lse, const void *q, const void *k, const void *v,
                             int B, int T, int q0, int nq, int Hq, int Hkv, int D, int window,
                             const int32_t *doc_start, float scale, float softcap) {
    k_attention_fwd(ctx_of(bk), out, lse, q, k, v, B, T, q0, nq, Hq, Hkv, D, window, doc_start, scale, softcap);
}
static void cu_attention_bwd(Backend *bk, void *dq, void *dk, void *dv, const void *dout, const void *q,
                             const void *k, const void *v, const void *out, const float *lse, int B, int T,
                             int q0, int nq, int Hq, int Hkv, int D, int window, const int32_t *doc_start,
                             int accumulate, float *dk_f32, float *dv_f32, float scale, float softcap) {
    // bf16 gradients summed tile by tile would round once per tile: the sums stay in float.
    if (bk->act_bytes < 4 && (q0 != 0 || nq != T) && !(dk_f32 && dv_f32))
        fail("internal: bf16 attention over query tiles without float dK/dV sums");
    k_attention_bwd(ctx_of(bk), dq, dk, dv, dout, q, k, v, out, lse, B, T, q0, nq, Hq, Hkv, D, window, doc_start,
                    accumulate, bk->act_bytes < 4 ? dk_f32 : NULL, bk->act_bytes < 4 ? dv_f32 : NULL, scale, softcap);
}
static void cu_dropout(Backend *bk, void *y, const void *x, size_t n, float p, uint64_t seed, size_t first) {
    k_dropout(ctx_of(bk), y, x, n, p, seed, first);
}
static void cu_swiglu_fwd(Backend *bk, void *h, const void *g, const void *u, size_t n) {
    k_swiglu_fwd(ctx_of(bk), h, g, u, n);
}
static void cu_swiglu_bwd(Backend *bk, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n) {
    k_swiglu_bwd(ctx_of(bk), dg, du, dh, g, u, n);
}
static void cu_geglu_fwd(Backend *bk, void *h, const void *g, const void *u, size_t n, int exact) {
    k_geglu_fwd(ctx_of(bk), h, g, u, n, exact);
}
static void cu_geglu_bwd(Backend *bk, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n,
                         int exact) {
    k_geglu_bwd(ctx_of(bk), dg, du, dh, g, u, n, exact);
}
static void cu_classifier_ce(Backend *bk, float *losses, void *dx, float *dW, const void *x, const void *W,
                             const int32_t *tgt, int N, int V, int C, float scale, float softcap) {
    k_classifier_ce(ctx_of(bk), losses, dx, dW, x, W, tgt, N, V, C, scale, softcap);
}
static double cu_sum_f32(Backend *bk, const float *x, size_t n) { return k_sum_f32(ctx_of(bk), x, n); }
static const char *cu_attention_path(const Backend *bk, int D) { return k_attention_path(ctx_of((Backend *)bk), D); }
static void cu_sumsq_many(Backend *bk, const float *const *x, const size_t *n, int count, double *each) {
    k_sumsq_many(ctx_of(bk), x, n, count, each);
}
static void cu_adamw(Backend *bk, void *p, float *master, const float *g, float *m, float *v, size_t n, float lr,
                     float b1, float b2, float eps, float wd, float gscale, int t) {
    k_adamw(ctx_of(bk), p, master, g, m, v, n, lr, b1, b2, eps, wd, gscale, t);
}
static void cu_adamw8(Backend *bk, void *p, float *master, const float *g, uint8_t *qm, uint8_t *qv, float *am,
                      float *av, const float *maps, size_t n, float lr, float b1, float b2, float eps, float wd,
                      float gscale, int t, int flavor) {
    k_adamw8(ctx_of(bk), p, master, g, qm, qv, am, av, maps, n, lr, b1, b2, eps, wd, gscale, t, flavor);
}
static void cu_dequantize(Backend *bk, void *out, const void *region, size_t n, int format) {
    if (format == 1) k_int8_dequantize(ctx_of(bk), out, region, n);  // REGION_INT8 (nf4.h)
    else k_nf4_dequantize(ctx_of(bk), out, region, n);
}

static void cu_destroy(Backend *bk) {
    CudaImpl *ci = impl_of(bk);
    CUDA_CHECK(cudaDeviceSynchronize());
    cuda_ctx_destroy(ci->ctx);
    free(ci->dev.s);
    free(ci->host.s);
    free(ci);
    free(bk);
}

// Availability creates no CUDA context: under MPI every rank asks before it knows its GPU, and a
// probe here (cudaFuncGetAttributes needs a context) would put one on GPU 0 for every rank. So
// it compares the device's compute capability with the oldest architecture this build has code
// for (__CUDA_ARCH_LIST__); backend_cuda_create then probes the kernels on its own device, after
// cudaSetDevice.
#ifdef __CUDA_ARCH_LIST__
static const int k_arch_list[] = {__CUDA_ARCH_LIST__};
#else
static const int k_arch_list[] = {0};  // the CPU emulator
#endif
extern "C" int backend_cuda_available(char *why, size_t cap) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (why && cap) snprintf(why, cap, "no usable CUDA GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "no device found");
        (void)cudaGetLastError();
        return 0;
    }
    int oldest = k_arch_list[0];
    for (size_t i = 1; i < sizeof k_arch_list / sizeof k_arch_list[0]; i++)
        if (k_arch_list[i] < oldest) oldest = k_arch_list[i];
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major * 100 + prop.minor * 10 < oldest) {
        if (why && cap)
            snprintf(why, cap, "GPU 0 (%s, compute capability %d.%d) is older than this build's oldest target "
                     "(compute_%d); rebuild with CUDA_GENCODE naming its architecture", prop.name, prop.major,
                     prop.minor, oldest / 10);
        return 0;
    }
    if (why && cap) why[0] = 0;
    return 1;
}

// The kernels of this build load on the current device (needs its context).
static void probe_kernels(int device) {
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, probe_kernel);
    if (e != cudaSuccess) {
        cudaDeviceProp prop;
        int ok = cudaGetDeviceProperties(&prop, device) == cudaSuccess;
        fail("device: cuda: GPU %d (%s, compute capability %d.%d) cannot run this build's kernels (%s); rebuild "
             "with CUDA_GENCODE naming its architecture", device, ok ? prop.name : "?", ok ? prop.major : 0,
             ok ? prop.minor : 0, cudaGetErrorString(e));
    }
}

extern "C" Backend *backend_cuda_create(int dtype_bf16, int device_index) {
    char why[256];
    if (!backend_cuda_available(why, sizeof why)) fail("device: cuda: %s", why);
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    if (device_index < 0 || device_index >= n)
        fail("device: cuda: GPU index %d does not exist (%d visible)", device_index, n);
    CUDA_CHECK(cudaSetDevice(device_index));  // the first call that makes a context: on this GPU only
    probe_kernels(device_index);
    CudaImpl *ci = (CudaImpl *)xcalloc(1, sizeof(CudaImpl));
    ci->pinned_limit = env_mb("LLMC_PINNED_LIMIT_MB", 4096);
    ci->pin_max_buffer = env_mb("LLMC_PIN_MAX_BUFFER_MB", 256);
    ci->ctx = cuda_ctx_create(dtype_bf16, device_index);
    Backend *bk = (Backend *)xcalloc(1, sizeof(Backend));
    bk->name = "cuda";
    bk->act_bytes = dtype_bf16 ? 2 : 4;
    bk->att_block = 64;  // attention.cu's WMMA tile (a multiple of the generic one)
    bk->threads = ci->ctx->num_sms;  // streaming multiprocessors, for the config box
    bk->impl = ci;
    bk->dev_alloc = cu_dev_alloc;
    bk->dev_free = cu_dev_free;
    bk->host_alloc = cu_host_alloc;
    bk->host_free = cu_host_free;
    bk->memzero = cu_memzero;
    bk->copy_h2d = cu_copy_h2d;
    bk->copy_d2h = cu_copy_d2h;
    bk->copy_d2d = cu_copy_d2d;
    bk->copy_2d = cu_copy_2d;
    bk->upload_act = cu_upload_act;
    bk->download_act = cu_download_act;
    bk->host_from_f32 = cu_host_from_f32;
    bk->host_to_f32 = cu_host_to_f32;
    bk->queue_create = cu_queue_create;
    bk->queue_destroy = cu_queue_destroy;
    bk->event_create = cu_event_create;
    bk->event_destroy = cu_event_destroy;
    bk->event_record = cu_event_record;
    bk->queue_wait = cu_queue_wait;
    bk->event_sync = cu_event_sync;
    bk->sync = cu_sync;
    bk->matmul = cu_matmul;
    bk->matmul_dw = cu_matmul_dw;
    bk->add_bias = cu_add_bias;
    bk->bias_grad = cu_bias_grad;
    bk->add = cu_add;
    bk->accumulate = cu_accumulate;
    bk->accumulate_f32 = cu_accumulate_f32;
    bk->embedding_fwd = cu_embedding_fwd;
    bk->embedding_bwd = cu_embedding_bwd;
    bk->rmsnorm_fwd = cu_rmsnorm_fwd;
    bk->rmsnorm_bwd = cu_rmsnorm_bwd;
    bk->layernorm_fwd = cu_layernorm_fwd;
    bk->layernorm_bwd = cu_layernorm_bwd;
    bk->gelu_fwd = cu_gelu_fwd;
    bk->gelu_bwd = cu_gelu_bwd;
    bk->pos_fwd = cu_pos_fwd;
    bk->pos_bwd = cu_pos_bwd;
    bk->rope_fwd = cu_rope_fwd;
    bk->rope_bwd = cu_rope_bwd;
    bk->attention_fwd = cu_attention_fwd;
    bk->attention_bwd = cu_attention_bwd;
    bk->dropout = cu_dropout;
    bk->swiglu_fwd = cu_swiglu_fwd;
    bk->swiglu_bwd = cu_swiglu_bwd;
    bk->geglu_fwd = cu_geglu_fwd;
    bk->geglu_bwd = cu_geglu_bwd;
    bk->classifier_ce = cu_classifier_ce;
    bk->sumsq_many = cu_sumsq_many;
    bk->attention_path = cu_attention_path;
    bk->sum_f32 = cu_sum_f32;
    bk->scale = cu_scale;
    bk->adamw = cu_adamw;
    bk->adamw8 = cu_adamw8;
    bk->dequantize = cu_dequantize;
    bk->destroy = cu_destroy;
    return bk;
}

// The compute stream, for collectives that must be ordered with the compute (NCCL).
extern "C" void *backend_cuda_stream(Backend *bk) { return (void *)ctx_of(bk)->stream; }
