// cuda_emu.cpp: the emulator's runtime (see cuda_emu.h): kernel launches over a thread pool,
// barriers, shuffles, and the CUDA runtime / cuBLASLt entry points the backend uses, on host
// memory. Test infrastructure only; never linked into a GPU build.
#include "cuda_emu.h"
#include <cblas.h>
#include <pthread.h>
#include <stdarg.h>
#include <time.h>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace emu {
thread_local dim3 tl_thread, tl_block;
thread_local int tl_tid = -1;
dim3 g_bdim, g_gdim;
unsigned char *g_dyn_smem;
static cudaError_t g_last_error = cudaSuccess;

void fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

void check_align(const void *p, unsigned bytes, const char *what) {
    if ((uintptr_t)p % bytes) fatal("emu: %s at %p is not %u-byte aligned", what, p, bytes);
}

// A reusable barrier; a wait longer than a minute means mismatched barriers (a deadlock).
struct Barrier {
    std::mutex mu;
    std::condition_variable cv;
    int n = 0, count = 0;
    uint64_t gen = 0;
    void wait(const char *what) {
        std::unique_lock<std::mutex> lk(mu);
        uint64_t g = gen;
        if (++count == n) {
            count = 0;
            gen++;
            cv.notify_all();
            return;
        }
        if (!cv.wait_for(lk, std::chrono::seconds(60), [&] { return gen != g; }))
            fatal("emu: %s barrier timed out (threads disagree on the barriers they reach)", what);
    }
};

struct Job {
    const std::function<void()> *body;
    dim3 grid, block;
    size_t smem;
    int nthreads;
    Barrier block_bar;
    std::vector<Barrier> warp_bar;
    std::vector<uint64_t> slots;  // one per thread, for shuffles
    unsigned char *dyn;  // 128-byte aligned, as CUDA's dynamic shared memory is here
};
static Job *g_job;

void syncthreads() { g_job->block_bar.wait("__syncthreads"); }
int lane_id() { return tl_tid & 31; }
void syncwarp() { g_job->warp_bar[tl_tid >> 5].wait("__syncwarp"); }
uint64_t shfl_bits(uint64_t bits, int src) {
    Job *j = g_job;
    const int w = tl_tid >> 5;
    j->slots[tl_tid] = bits;
    j->warp_bar[w].wait("shuffle");
    uint64_t r = j->slots[w * 32 + src];
    j->warp_bar[w].wait("shuffle");
    return r;
}

// Persistent pool: worker i runs thread i of each block of the current job.
// Heap-allocated and never destroyed, its threads detached: they live until the process exits.
struct Pool {
    std::mutex mu;
    std::condition_variable go, done;
    int workers = 0;
    uint64_t gen = 0;
    int finished = 0;
};
static Pool &pool = *new Pool;

static void run_thread(Job *j, int tid) {
    tl_tid = tid;
    tl_thread = dim3(tid % j->block.x, (tid / j->block.x) % j->block.y, tid / (j->block.x * j->block.y));
    for (unsigned bz = 0; bz < j->grid.z; bz++)
        for (unsigned by = 0; by < j->grid.y; by++)
            for (unsigned bx = 0; bx < j->grid.x; bx++) {
                tl_block = dim3(bx, by, bz);
                (*j->body)();
                j->block_bar.wait("end of block");
                if (tid == 0 && j->smem) memset(j->dyn, 0xff, j->smem);  // NaN bytes
                j->block_bar.wait("end of block");
            }
}

static void worker(int id) {
    uint64_t seen = 0;
    for (;;) {
        Job *j;
        {
            std::unique_lock<std::mutex> lk(pool.mu);
            pool.go.wait(lk, [&] { return pool.gen != seen; });
            seen = pool.gen;
            j = g_job;
        }
        if (id < j->nthreads) run_thread(j, id);
        std::lock_guard<std::mutex> lk(pool.mu);
        if (++pool.finished == pool.workers) pool.done.notify_all();
    }
}

static std::map<const void *, size_t> g_smem_limits;
size_t smem_limit(const void *fn) {
    auto it = g_smem_limits.find(fn);
    return it == g_smem_limits.end() ? 48 * 1024 : it->second;
}
void set_smem_limit(const void *fn, size_t bytes) { g_smem_limits[fn] = bytes; }

void launch(const void *fn, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
    const int nt = (int)(block.x * block.y * block.z);
    if (nt < 1 || nt > 1024 || nt % 32 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
        grid.z > 65535) {
        g_last_error = cudaErrorInvalidConfiguration;
        return;
    }
    if (smem > smem_limit(fn) || smem > 227 * 1024) {
        g_last_error = cudaErrorInvalidValue;
        return;
    }
    Job j;
    j.body = &body;
    j.grid = grid, j.block = block, j.smem = smem, j.nthreads = nt;
    j.block_bar.n = nt;
    j.warp_bar = std::vector<Barrier>(nt / 32);
    for (auto &b : j.warp_bar) b.n = 32;
    j.slots.assign(nt, 0);
    const size_t dbytes = ((smem ? smem : 16) + 127) & ~(size_t)127;
    j.dyn = (unsigned char *)aligned_alloc(128, dbytes);
    memset(j.dyn, 0xff, dbytes);
    g_bdim = block, g_gdim = grid, g_dyn_smem = j.dyn;
    std::unique_lock<std::mutex> lk(pool.mu);
    while (pool.workers < nt) std::thread(worker, pool.workers++).detach();
    g_job = &j;
    pool.finished = 0;
    pool.gen++;
    pool.go.notify_all();
    pool.done.wait(lk, [&] { return pool.finished == pool.workers; });
    g_job = nullptr;
    free(j.dyn);
}
}  // namespace emu

// ---- CUDA runtime on host memory --------------------------------------------------------------
extern "C" {
cudaError_t cudaGetLastError(void) {
    cudaError_t e = emu::g_last_error;
    emu::g_last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return emu::g_last_error; }
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (emulated)";
    case cudaErrorInvalidValue: return "invalid argument (emulated)";
    case cudaErrorMemoryAllocation: return "out of memory (emulated)";
    default: return "emulated error";
    }
}
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }
cudaError_t cudaGetDeviceCount(int *n) {
    *n = getenv("EMU_NO_GPU") ? 0 : 1;
    return *n ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    (void)d;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CPU SIMT emulator");
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = 4;
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = 227 * 1024;
    p->totalGlobalMem = (size_t)8 << 30;
    p->l2CacheSize = 50 << 20;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) {
    *f = (size_t)4 << 30, *t = (size_t)8 << 30;
    return cudaSuccess;
}
static size_t round256(size_t b) { return (b + 255) & ~(size_t)255; }
cudaError_t cudaMalloc(void **p, size_t bytes) {
    const char *lim = getenv("EMU_FAIL_MALLOC_ABOVE");  // tests: a real driver OOM
    if (lim && bytes > (size_t)atoll(lim)) {
        *p = NULL;
        return cudaErrorMemoryAllocation;
    }
    *p = aligned_alloc(256, round256(bytes ? bytes : 1));
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0xa5, round256(bytes ? bytes : 1));  // device memory is not zeroed
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) {
    *p = aligned_alloc(256, round256(bytes ? bytes : 1));
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    (void)k;
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    (void)k, (void)st;
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) {
    memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
    (void)st;
    memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) {
    (void)f;
    *s = (cudaStream_t)malloc(16);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    free((void *)s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f) {
    (void)s, (void)e, (void)f;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
struct EmuEvent {
    double t;
};
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) {
    (void)f;
    *e = (cudaEvent_t)calloc(1, sizeof(EmuEvent));
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free((void *)e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    (void)s;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ((EmuEvent *)e)->t = ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    (void)e;
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float)(((EmuEvent *)b)->t - ((EmuEvent *)a)->t);
    return cudaSuccess;
}
}  // extern "C"

// ---- cuBLASLt (column-major, as documented) over OpenBLAS ----------------------------------------
struct EmuDesc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
};
struct EmuLayout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct EmuPref {
    uint64_t ws = 0;
    uint32_t al[4] = {256, 256, 256, 256};
};
// What the returned "algorithm" remembers: the alignments it was chosen for.
struct EmuAlgo {
    uint32_t al[4];
};
static_assert(sizeof(EmuAlgo) <= sizeof(cublasLtMatmulAlgo_t), "algo");

extern "C" {
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = (cublasLtHandle_t)malloc(16);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    free((void *)h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t c, cudaDataType_t s) {
    EmuDesc *e = new EmuDesc;
    e->compute = c, e->scale = s;
    *d = (cublasLtMatmulDesc_t)e;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete (EmuDesc *)d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                              const void *buf, size_t n) {
    EmuDesc *e = (EmuDesc *)d;
    if (n != sizeof(cublasOperation_t) && (a == CUBLASLT_MATMUL_DESC_TRANSA || a == CUBLASLT_MATMUL_DESC_TRANSB))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (a == CUBLASLT_MATMUL_DESC_TRANSA) memcpy(&e->ta, buf, n);
    else if (a == CUBLASLT_MATMUL_DESC_TRANSB) memcpy(&e->tb, buf, n);
    else return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    if (ld < (int64_t)rows) return CUBLAS_STATUS_INVALID_VALUE;
    EmuLayout *e = new EmuLayout{t, rows, cols, ld};
    *l = (cublasLtMatrixLayout_t)e;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete (EmuLayout *)l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = (cublasLtMatmulPreference_t) new EmuPref;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete (EmuPref *)p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a, const void *buf,
                                                    size_t n) {
    EmuPref *e = (EmuPref *)p;
    switch (a) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: memcpy(&e->ws, buf, n); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: memcpy(&e->al[0], buf, n); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: memcpy(&e->al[1], buf, n); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: memcpy(&e->al[2], buf, n); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: memcpy(&e->al[3], buf, n); break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

static void op_dims(const EmuLayout *l, cublasOperation_t op, uint64_t *r, uint64_t *c) {
    *r = op == CUBLAS_OP_N ? l->rows : l->cols;
    *c = op == CUBLAS_OP_N ? l->cols : l->rows;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A,
                                              cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                                              cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t p, int req,
                                              cublasLtMatmulHeuristicResult_t *res, int *found) {
    (void)h, (void)req;
    EmuDesc *e = (EmuDesc *)d;
    uint64_t am, ak, bk, bn;
    op_dims((EmuLayout *)A, e->ta, &am, &ak);
    op_dims((EmuLayout *)B, e->tb, &bk, &bn);
    const EmuLayout *lc = (EmuLayout *)C, *ld = (EmuLayout *)D;
    if (ak != bk || am != lc->rows || bn != lc->cols || ld->rows != lc->rows || ld->cols != lc->cols) {
        *found = 0;
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    memset(res, 0, sizeof *res);
    EmuAlgo a;
    memcpy(a.al, ((EmuPref *)p)->al, sizeof a.al);
    memcpy(&res->algo, &a, sizeof a);
    res->state = CUBLAS_STATUS_SUCCESS;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static float get_el(const void *p, cudaDataType t, size_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Al, const void *B, cublasLtMatrixLayout_t Bl,
                              const void *beta, const void *C, cublasLtMatrixLayout_t Cl, void *Dp,
                              cublasLtMatrixLayout_t Dl, const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsb,
                              cudaStream_t st) {
    (void)h, (void)ws, (void)wsb, (void)st;
    const EmuDesc *e = (const EmuDesc *)d;
    const EmuLayout *la = (const EmuLayout *)Al, *lb = (const EmuLayout *)Bl, *lc = (const EmuLayout *)Cl,
                    *ld = (const EmuLayout *)Dl;
    EmuAlgo a;
    memcpy(&a, algo, sizeof a);
    const void *ptrs[4] = {A, B, C, Dp};
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)ptrs[i] % a.al[i])
            emu::fatal("emu: cuBLASLt: matrix %c at %p is less aligned than the %u bytes its algorithm was chosen for",
                       "ABCD"[i], ptrs[i], a.al[i]);
    if (e->compute != CUBLAS_COMPUTE_32F || e->scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    uint64_t m, k, k2, n;
    op_dims(la, e->ta, &m, &k);
    op_dims(lb, e->tb, &k2, &n);
    if (k != k2 || m != lc->rows || n != lc->cols || ld->rows != m || ld->cols != n) return CUBLAS_STATUS_INVALID_VALUE;
    // dense float copies of A and B as stored (column-major), then sgemm
    std::vector<float> fa(la->rows * la->cols), fb(lb->rows * lb->cols), fc(m * n);
    for (uint64_t c = 0; c < la->cols; c++)
        for (uint64_t r = 0; r < la->rows; r++) fa[c * la->rows + r] = get_el(A, la->type, c * la->ld + r);
    for (uint64_t c = 0; c < lb->cols; c++)
        for (uint64_t r = 0; r < lb->rows; r++) fb[c * lb->rows + r] = get_el(B, lb->type, c * lb->ld + r);
    const float al = *(const float *)alpha, be = *(const float *)beta;
    if (k > 0)
        cblas_sgemm(CblasColMajor, e->ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                    e->tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, (int)m, (int)n, (int)k, al, fa.data(),
                    (int)la->rows, fb.data(), (int)lb->rows, 0.0f, fc.data(), (int)m);
    for (uint64_t c = 0; c < n; c++)
        for (uint64_t r = 0; r < m; r++) {
            float v = fc[c * m + r];
            if (be != 0.0f) v += be * get_el(C, lc->type, c * lc->ld + r);
            size_t o = c * ld->ld + r;
            if (ld->type == CUDA_R_32F) ((float *)Dp)[o] = v;
            else ((__nv_bfloat16 *)Dp)[o] = __float2bfloat16_rn(v);
        }
    return CUBLAS_STATUS_SUCCESS;
}
}  // extern "C"
