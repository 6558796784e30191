// cuda_emu.cpp: the emulator's runtime (see cuda_emu.h): kernel launches over fibers,
// barriers, shuffles, and the CUDA runtime / cuBLASLt entry points the backend uses, on host
// memory. Test infrastructure only; never linked into a GPU build.
#include "cuda_emu.h"
#include <cblas.h>
#include <pthread.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <deque>
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

// The threads of a block are fibers (ucontext) run by the launching host thread: a barrier
// parks the fiber and switches to the scheduler, which resumes the parked fibers once the last
// one has arrived. One OS thread per CUDA thread cost a futex sleep and wake-up per thread and
// barrier (on a 2-core machine a training step of a tiny model took about a minute, mostly in
// the kernel's scheduler); a fiber switch costs a few hundred nanoseconds. The scheduler walks
// the fibers in thread order, so a launch runs the same way every time; when no fiber can run
// and some have not finished, the threads disagree on the barriers they reach: that stops the
// program, naming the barriers.
struct Barrier;
struct Fiber {
    ucontext_t ctx;
    void *stack = nullptr;
    int tid = 0;
    bool done = false;
    const Barrier *parked = nullptr;  // waiting there until its generation moves past wait_gen
    uint64_t wait_gen = 0;
    const char *what = nullptr;
    dim3 thread, block;
};
static std::vector<Fiber *> g_fibers;  // grows to the widest block launched; stacks are reused
static ucontext_t g_sched;
static Fiber *g_fiber;
#define FIBER_STACK ((size_t)1 << 20)  // kernels keep whole WMMA tiles per lane: be generous

static void fiber_park(const Barrier *b, uint64_t gen, const char *what) {
    Fiber *f = g_fiber;
    f->parked = b, f->wait_gen = gen, f->what = what;
    if (swapcontext(&f->ctx, &g_sched) != 0) fatal("emu: swapcontext failed");
}

// A reusable barrier of n fibers.
struct Barrier {
    int n = 0, count = 0;
    uint64_t gen = 0;
    void wait(const char *what) {
        uint64_t g = gen;
        if (++count == n) {  // the last to arrive releases the others and goes on
            count = 0;
            gen++;
            return;
        }
        fiber_park(this, g, what);
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
    std::vector<uint32_t> mma_regs;  // six per thread: an mma's a[4], b[2]
    struct Copy {
        unsigned char *dst;
        unsigned char data[16];
        int n;
    };
    std::vector<std::vector<Copy>> cp_open;               // per thread: copies not yet committed
    std::vector<std::deque<std::vector<Copy>>> cp_groups;  // per thread: committed groups, oldest first
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

static float bf_lo(uint32_t r) { uint32_t u = r << 16; float f; memcpy(&f, &u, 4); return f; }
static float bf_hi(uint32_t r) { uint32_t u = r & 0xffff0000u; float f; memcpy(&f, &u, 4); return f; }
// The fragments (PTX ISA, m16n8k16 with 16-bit A/B; g = lane / 4, t = lane % 4, each register two
// bf16, the lower-indexed element in the low half): a[0] A(g, 2t..2t+1), a[1] A(g+8, 2t..),
// a[2] A(g, 2t+8..), a[3] A(g+8, 2t+8..); b[0] B(2t..2t+1, g), b[1] B(2t+8.., g);
// d[0..1] D(g, 2t..2t+1), d[2..3] D(g+8, 2t..).
void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    Job *j = g_job;
    const int w = tl_tid >> 5, lane = tl_tid & 31, g = lane >> 2, t = lane & 3;
    uint32_t *mine = &j->mma_regs[(size_t)tl_tid * 6];
    for (int i = 0; i < 4; i++) mine[i] = a[i];
    mine[4] = b[0], mine[5] = b[1];
    j->warp_bar[w].wait("mma");
    const uint32_t *warp = &j->mma_regs[(size_t)w * 32 * 6];
    auto A = [&](int r, int k) {
        const uint32_t reg = warp[((r & 7) * 4 + (k & 7) / 2) * 6 + (r >= 8) + 2 * (k >= 8)];
        return k & 1 ? bf_hi(reg) : bf_lo(reg);
    };
    auto B = [&](int k, int n) {
        const uint32_t reg = warp[(n * 4 + (k & 7) / 2) * 6 + 4 + (k >= 8)];
        return k & 1 ? bf_hi(reg) : bf_lo(reg);
    };
    float out[4];
    for (int e = 0; e < 4; e++) {
        const int r = g + (e >= 2 ? 8 : 0), n = 2 * t + (e & 1);
        float s = d[e];
        for (int k = 0; k < 16; k++) s += A(r, k) * B(k, n);
        out[e] = s;
    }
    j->warp_bar[w].wait("mma");
    for (int e = 0; e < 4; e++) d[e] = out[e];
}

void ldmatrix_x4(uint32_t d[4], const void *row, int trans) {
    Job *j = g_job;
    const int w = tl_tid >> 5, lane = tl_tid & 31;
    const unsigned char *p = (const unsigned char *)row;
    if (p < j->dyn || p + 16 > j->dyn + j->smem || ((uintptr_t)p & 15))
        fatal("emu: ldmatrix row address %p of lane %d is not a 16-byte aligned row of dynamic shared memory", row, lane);
    j->slots[tl_tid] = (uint64_t)(uintptr_t)row;
    j->warp_bar[w].wait("ldmatrix");
    const int r = lane >> 2, c = 2 * (lane & 3);
    auto at = [&](int m, int row_, int col) {  // element (row_, col) of matrix m
        uint16_t v;
        memcpy(&v, (const unsigned char *)(uintptr_t)j->slots[w * 32 + 8 * m + row_] + 2 * col, 2);
        return (uint32_t)v;
    };
    uint32_t out[4];
    for (int m = 0; m < 4; m++)
        out[m] = trans ? at(m, c, r) | at(m, c + 1, r) << 16 : at(m, r, c) | at(m, r, c + 1) << 16;
    j->warp_bar[w].wait("ldmatrix");
    for (int m = 0; m < 4; m++) d[m] = out[m];
}

void cp_async(void *smem_dst, const void *src, int bytes) {
    Job *j = g_job;
    unsigned char *d = (unsigned char *)smem_dst;
    if (bytes != 4 && bytes != 8 && bytes != 16) fatal("emu: cp.async of %d bytes (4, 8 or 16)", bytes);
    if (d < j->dyn || d + bytes > j->dyn + j->smem || ((uintptr_t)d % bytes) || ((uintptr_t)src % bytes))
        fatal("emu: cp.async of %d bytes from %p to %p (thread %d): not aligned, or not into dynamic shared memory",
              bytes, src, smem_dst, tl_tid);
    Job::Copy c;
    c.dst = d, c.n = bytes;
    memcpy(c.data, src, bytes);
    j->cp_open[tl_tid].push_back(c);
}
void cp_async_commit() {
    Job *j = g_job;
    j->cp_groups[tl_tid].push_back(std::move(j->cp_open[tl_tid]));
    j->cp_open[tl_tid].clear();
}
void cp_async_wait(int n) {
    auto &q = g_job->cp_groups[tl_tid];
    while ((int)q.size() > n) {
        for (const auto &c : q.front()) memcpy(c.dst, c.data, c.n);
        q.pop_front();
    }
}

// Thread tid of every block of the job, blocks one after another.
static void run_thread(Job *j, int tid) {
    tl_thread = dim3(tid % j->block.x, (tid / j->block.x) % j->block.y, tid / (j->block.x * j->block.y));
    for (unsigned bz = 0; bz < j->grid.z; bz++)
        for (unsigned by = 0; by < j->grid.y; by++)
            for (unsigned bx = 0; bx < j->grid.x; bx++) {
                tl_block = dim3(bx, by, bz);
                (*j->body)();
                bool pending = !j->cp_open[tid].empty();
                for (const auto &g : j->cp_groups[tid]) pending |= !g.empty();
                j->cp_groups[tid].clear();  // empty groups still open are harmless
                if (pending)
                    fatal("emu: thread %d of block (%u, %u, %u) ended with cp.async copies it never waited for", tid,
                          bx, by, bz);
                j->block_bar.wait("end of block");
                if (tid == 0 && j->smem) memset(j->dyn, 0xff, j->smem);  // NaN bytes
                j->block_bar.wait("end of block");
            }
}

static void fiber_main() {
    Fiber *f = g_fiber;
    run_thread(g_job, f->tid);
    f->done = true;  // returning resumes g_sched (uc_link)
}

// Runs the job's nt fibers to completion.
static void run_fibers(Job *j) {
    const int nt = j->nthreads;
    while ((int)g_fibers.size() < nt) {
        Fiber *f = new Fiber;
        f->tid = (int)g_fibers.size();
        f->stack = mmap(nullptr, FIBER_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (f->stack == MAP_FAILED) fatal("emu: no memory for a fiber stack");
        mprotect(f->stack, 4096, PROT_NONE);  // guard page: an overflow faults instead of corrupting
        g_fibers.push_back(f);
    }
    for (int i = 0; i < nt; i++) {
        Fiber *f = g_fibers[i];
        f->done = false, f->parked = nullptr;
        if (getcontext(&f->ctx) != 0) fatal("emu: getcontext failed");
        f->ctx.uc_stack.ss_sp = f->stack;
        f->ctx.uc_stack.ss_size = FIBER_STACK;
        f->ctx.uc_link = &g_sched;
        makecontext(&f->ctx, fiber_main, 0);
    }
    for (;;) {
        int left = 0, ran = 0;
        for (int i = 0; i < nt; i++) {
            Fiber *f = g_fibers[i];
            if (f->done) continue;
            left++;
            if (f->parked && f->parked->gen == f->wait_gen) continue;
            f->parked = nullptr;
            g_fiber = f, tl_tid = f->tid, tl_thread = f->thread, tl_block = f->block;
            if (swapcontext(&g_sched, &f->ctx) != 0) fatal("emu: swapcontext failed");
            f->thread = tl_thread, f->block = tl_block;
            ran++;
        }
        if (!left) break;
        if (!ran) {
            char msg[512];
            size_t o = 0;
            for (int i = 0; i < nt && o < sizeof msg - 64; i++)
                if (!g_fibers[i]->done)
                    o += snprintf(msg + o, sizeof msg - o, " thread %d at %s;", i, g_fibers[i]->what);
            fatal("emu: barrier deadlock (threads disagree on the barriers they reach):%s", msg);
        }
    }
    g_fiber = nullptr, tl_tid = -1;
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
    j.mma_regs.assign((size_t)nt * 6, 0);
    j.cp_open.assign(nt, {}), j.cp_groups.assign(nt, {});
    const size_t dbytes = ((smem ? smem : 16) + 127) & ~(size_t)127;
    j.dyn = (unsigned char *)aligned_alloc(128, dbytes);
    memset(j.dyn, 0xff, dbytes);
    static std::mutex launch_mu;  // one launch at a time, whichever host thread makes it
    std::lock_guard<std::mutex> lk(launch_mu);
    g_bdim = block, g_gdim = grid, g_dyn_smem = j.dyn;
    g_job = &j;
    run_fibers(&j);
    g_job = nullptr;
    free(j.dyn);
}

// ---- stream order: vector clocks over streams, checked per allocation ----------------------------
// Each stream has a vector clock (stream id -> number of its operations known to be ordered before
// its next one); events carry a copy; the host has one too, joined when it learns that work is
// complete (stream/event/device synchronisation, a synchronous copy, cudaFree). A new operation
// starts from its stream's clock joined with the host's (work the host saw finish is ordered
// before anything enqueued afterwards) and, on the legacy stream, with every blocking stream's.
typedef std::map<uint64_t, uint64_t> VClock;
struct StreamState {
    VClock vc;
    bool blocking = true;
};
struct Access {
    uint64_t stream = 0, clock = 0;
    const char *op = nullptr;
};
struct Alloc {
    size_t bytes = 0;
    bool pinned = false;  // cudaMallocHost
    bool written = false;
    Access write;
    std::map<uint64_t, Access> reads;  // latest read per stream since the last write
};
static std::recursive_mutex g_hz_mu;
static std::map<uintptr_t, Alloc> g_allocs;
static std::map<uint64_t, StreamState> g_streams;
static VClock g_host;
static uint64_t g_next_stream = 1;
static Access g_cur;
static int g_hz_mode = -1;  // 0 off, 1 fatal, 2 warn
static long g_hz_reported;

static void join(VClock &a, const VClock &b) {
    for (auto &kv : b)
        if (a[kv.first] < kv.second) a[kv.first] = kv.second;
}
struct EmuStream {
    uint64_t id;
    bool blocking;
    bool destroyed;  // kept, not freed: a later use is reported instead of read from freed memory
};
uint64_t stream_id(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return 0;
    EmuStream *es = (EmuStream *)s;
    if (es->destroyed) fatal("emu: stream %llu used after cudaStreamDestroy", (unsigned long long)es->id);
    return es->id;
}
static StreamState &stream_touch(uint64_t id) {
    StreamState &S = g_streams[id];
    join(S.vc, g_host);
    if (id == 0) {
        for (auto &kv : g_streams)
            if (kv.first != 0 && kv.second.blocking) join(S.vc, kv.second.vc);
    } else if (S.blocking) {
        join(S.vc, g_streams[0].vc);
    }
    return S;
}
static void host_join_all() {
    for (auto &kv : g_streams) join(g_host, kv.second.vc);
}
static const char *sname(uint64_t id, char *buf, size_t cap) {
    if (id == 0) snprintf(buf, cap, "the legacy default stream");
    else snprintf(buf, cap, "stream #%llu", (unsigned long long)id);
    return buf;
}
void hz_begin(cudaStream_t st, const char *what) {
    std::lock_guard<std::recursive_mutex> lk(g_hz_mu);
    ctx_touch();
    uint64_t id = stream_id(st);
    StreamState &S = stream_touch(id);
    S.vc[id]++;
    g_cur.stream = id, g_cur.clock = S.vc[id], g_cur.op = what;
}
static bool ordered(const Access &a) {
    if (a.stream == g_cur.stream) return true;
    VClock &vc = g_streams[g_cur.stream].vc;
    auto it = vc.find(a.stream);
    return it != vc.end() && it->second >= a.clock;
}
static void hazard(const char *kind, const void *p, const Alloc &al, uintptr_t base, const Access &prev) {
    if (g_hz_mode < 0) {
        const char *m = getenv("EMU_HAZARDS");
        g_hz_mode = !m ? 1 : !strcmp(m, "0") ? 0 : !strcmp(m, "warn") ? 2 : 1;
    }
    if (g_hz_mode == 0) return;
    char a[48], b[48];
    char msg[1024];
    snprintf(msg, sizeof msg,
             "emu: stream-order hazard (%s): %s on %s uses %p (in a %zu-byte %s allocation at %p), which %s on %s "
             "%s with no event wait or synchronisation ordering the two",
             kind, g_cur.op, sname(g_cur.stream, a, sizeof a), p, al.bytes, al.pinned ? "pinned host" : "device",
             (void *)base, prev.op, sname(prev.stream, b, sizeof b),
             !strcmp(kind, "write after read") ? "read" : "wrote");
    g_hz_reported++;
    if (g_hz_mode == 2) {
        fprintf(stderr, "warning: %s\n", msg);
        return;
    }
    fatal("%s", msg);
}
void hz_ptr(const void *p, int write) {
    if (!p) return;
    std::lock_guard<std::recursive_mutex> lk(g_hz_mu);
    auto it = g_allocs.upper_bound((uintptr_t)p);
    if (it == g_allocs.begin()) return;
    --it;
    Alloc &al = it->second;
    if ((uintptr_t)p >= it->first + (al.bytes ? al.bytes : 1)) return;
    if (al.written && !ordered(al.write)) hazard(write ? "write after write" : "read after write", p, al, it->first, al.write);
    if (write) {
        for (auto &kv : al.reads)
            if (!ordered(kv.second)) hazard("write after read", p, al, it->first, kv.second);
        al.reads.clear();
        al.written = true;
        al.write = g_cur;
    } else {
        al.reads[g_cur.stream] = g_cur;
    }
}
static void hz_alloc(void *p, size_t bytes, bool pinned) {
    std::lock_guard<std::recursive_mutex> lk(g_hz_mu);
    Alloc al;
    al.bytes = bytes, al.pinned = pinned;
    g_allocs[(uintptr_t)p] = al;
}
static bool hz_free(void *p, bool pinned) {  // implies device synchronisation
    std::lock_guard<std::recursive_mutex> lk(g_hz_mu);
    host_join_all();
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end() || it->second.pinned != pinned) return false;
    g_allocs.erase(it);
    return true;
}
enum Where { W_PAGEABLE, W_PINNED, W_DEVICE };
static Where where(const void *p) {
    std::lock_guard<std::recursive_mutex> lk(g_hz_mu);
    auto it = g_allocs.upper_bound((uintptr_t)p);
    if (it == g_allocs.begin()) return W_PAGEABLE;
    --it;
    if ((uintptr_t)p >= it->first + (it->second.bytes ? it->second.bytes : 1)) return W_PAGEABLE;
    return it->second.pinned ? W_PINNED : W_DEVICE;
}
static void host_join_stream(uint64_t id) {
    std::lock_guard<std::recursive_mutex> lk(g_hz_mu);
    join(g_host, g_streams[id].vc);
}

// ---- devices and contexts -----------------------------------------------------------------------
static thread_local int tl_device = 0;
static unsigned g_ctx_mask;
static int device_count() {
    if (getenv("EMU_NO_GPU")) return 0;
    const char *d = getenv("EMU_DEVICES");
    int n = d ? atoi(d) : 1;
    return n < 1 ? 1 : n > 16 ? 16 : n;
}
void ctx_touch() { __atomic_fetch_or(&g_ctx_mask, 1u << tl_device, __ATOMIC_SEQ_CST); }
}  // namespace emu

extern "C" unsigned emu_context_mask(void) { return emu::g_ctx_mask; }
extern "C" void emu_context_reset(void) { emu::g_ctx_mask = 0; }
static long g_pinned_bytes;
extern "C" long emu_pinned_bytes(void) { return g_pinned_bytes; }
namespace emu {
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
    *n = emu::device_count();
    return *n ? cudaSuccess : cudaErrorNoDevice;
}
// As in CUDA 12+, cudaSetDevice initialises the device's primary context.
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= emu::device_count()) return cudaErrorInvalidDevice;
    emu::tl_device = d;
    emu::ctx_touch();
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = emu::tl_device;
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
    emu::ctx_touch();
    *f = (size_t)4 << 30, *t = (size_t)8 << 30;
    return cudaSuccess;
}
static size_t round256(size_t b) { return (b + 255) & ~(size_t)255; }
cudaError_t cudaMalloc(void **p, size_t bytes) {
    emu::ctx_touch();
    const char *lim = getenv("EMU_FAIL_MALLOC_ABOVE");  // tests: a real driver OOM
    if (lim && bytes > (size_t)atoll(lim)) {
        *p = NULL;
        return cudaErrorMemoryAllocation;
    }
    *p = aligned_alloc(256, round256(bytes ? bytes : 1));
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0xa5, round256(bytes ? bytes : 1));  // device memory is not zeroed
    emu::hz_alloc(*p, bytes, false);
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    if (!emu::hz_free(p, false)) return cudaErrorInvalidValue;
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) {
    emu::ctx_touch();
    const char *lim = getenv("EMU_FAIL_PIN_ABOVE");  // tests: pinning refused
    if (lim && bytes > (size_t)atoll(lim)) {
        *p = NULL;
        return cudaErrorMemoryAllocation;
    }
    *p = aligned_alloc(256, round256(bytes ? bytes : 1));
    if (!*p) return cudaErrorMemoryAllocation;
    emu::hz_alloc(*p, bytes, true);
    __atomic_fetch_add(&g_pinned_bytes, (long)bytes, __ATOMIC_SEQ_CST);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    size_t bytes = 0;
    {
        std::lock_guard<std::recursive_mutex> lk(emu::g_hz_mu);
        auto it = emu::g_allocs.find((uintptr_t)p);
        if (it != emu::g_allocs.end()) bytes = it->second.bytes;
    }
    if (!emu::hz_free(p, true)) return cudaErrorInvalidValue;
    __atomic_fetch_sub(&g_pinned_bytes, (long)bytes, __ATOMIC_SEQ_CST);
    free(p);
    return cudaSuccess;
}
// A copy is an operation on its stream that reads src and writes dst. The host learns that it
// completed when CUDA documents the call as synchronous: plain cudaMemcpy except pageable host
// to device (whose DMA may still be in flight) and device to device; cudaMemcpyAsync into
// pageable host memory.
static void copy_op(void *d, const void *s, cudaStream_t st, const char *what, bool sync_call) {
    std::lock_guard<std::recursive_mutex> lk(emu::g_hz_mu);
    emu::Where wd = emu::where(d), ws = emu::where(s);
    emu::hz_begin(st, what);
    emu::hz_ptr(s, 0);
    emu::hz_ptr(d, 1);
    bool host_done = sync_call ? !(wd == emu::W_DEVICE && ws != emu::W_PINNED) : wd == emu::W_PAGEABLE;
    if (host_done) emu::host_join_stream(emu::stream_id(st));
}
// The direction a copy names must be the pointers' (CUDA documents a mismatch as undefined
// behaviour; cudaMemcpyDefault infers it): a copy "to the device" into pinned host memory
// works on some drivers and fails on others, so the emulator stops at it.
static void check_kind(void *d, const void *s, enum cudaMemcpyKind k, const char *what) {
    if (k == cudaMemcpyDefault) return;
    const bool dd = emu::where(d) == emu::W_DEVICE, sd = emu::where(s) == emu::W_DEVICE;
    const bool want_dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    const bool want_sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    static const char *const names[] = {"cudaMemcpyHostToHost", "cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost",
                                        "cudaMemcpyDeviceToDevice"};
    if (dd != want_dd || sd != want_sd)
        emu::fatal("emu: %s with %s copies from %s memory at %p to %s memory at %p", what,
                   (unsigned)k < 4 ? names[k] : "?", sd ? "device" : "host", s, dd ? "device" : "host", d);
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    memset(a, 0, sizeof *a);
    emu::Where w = emu::where(p);
    a->type = w == emu::W_DEVICE ? cudaMemoryTypeDevice : w == emu::W_PINNED ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
    a->devicePointer = w == emu::W_PAGEABLE ? nullptr : (void *)p;
    a->hostPointer = w == emu::W_DEVICE ? nullptr : (void *)p;
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    if (n) check_kind(d, s, k, "cudaMemcpy"), copy_op(d, s, nullptr, "cudaMemcpy", true);
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    if (n) check_kind(d, s, k, "cudaMemcpyAsync"), copy_op(d, s, st, "cudaMemcpyAsync", false);
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t rows,
                              enum cudaMemcpyKind k, cudaStream_t st) {
    if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
    if (width && rows) check_kind(d, s, k, "cudaMemcpy2DAsync");
    for (size_t r = 0; r < rows && width; r++) {
        copy_op((char *)d + r * dpitch, (const char *)s + r * spitch, st, "cudaMemcpy2DAsync", false);
        memmove((char *)d + r * dpitch, (const char *)s + r * spitch, width);
    }
    return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) {
    if (n) emu::hz_begin(nullptr, "cudaMemset"), emu::hz_ptr(d, 1);
    memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
    if (n) emu::hz_begin(st, "cudaMemsetAsync"), emu::hz_ptr(d, 1);
    memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) {
    std::lock_guard<std::recursive_mutex> lk(emu::g_hz_mu);
    emu::ctx_touch();
    emu::EmuStream *es = (emu::EmuStream *)malloc(sizeof(emu::EmuStream));
    es->id = emu::g_next_stream++;
    es->blocking = !(f & cudaStreamNonBlocking);
    es->destroyed = false;
    emu::g_streams[es->id].blocking = es->blocking;
    emu::stream_touch(es->id);
    *s = (cudaStream_t)es;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    // Not freed (a few bytes a stream): its state stays, since accesses stamped with its id may
    // still be checked, and a later launch, copy or sync on it stops the program (a real GPU
    // may crash there: the NCCL barrier after the backend's destroy did, 2026-11-27)
    emu::stream_id(s);
    ((emu::EmuStream *)s)->destroyed = true;
    return cudaSuccess;
}
static long g_nccl_delay_until_ms;  // EMU_NCCL_DELAY_MS: a collective "runs" this long
static double emu_now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    emu::host_join_stream(emu::stream_id(s));
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
    if (emu_now_ms() < (double)g_nccl_delay_until_ms) return cudaErrorNotReady;
    emu::host_join_stream(emu::stream_id(s));
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    std::lock_guard<std::recursive_mutex> lk(emu::g_hz_mu);
    emu::ctx_touch();
    emu::host_join_all();
    return cudaSuccess;
}
struct EmuEvent {
    double t;
    emu::VClock vc;
};
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) {
    (void)f;
    emu::ctx_touch();
    *e = (cudaEvent_t) new EmuEvent();
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete (EmuEvent *)e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    EmuEvent *ev = (EmuEvent *)e;
    ev->t = emu_now_ms();
    std::lock_guard<std::recursive_mutex> lk(emu::g_hz_mu);
    ev->vc = emu::stream_touch(emu::stream_id(s)).vc;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f) {
    (void)f;
    std::lock_guard<std::recursive_mutex> lk(emu::g_hz_mu);
    emu::join(emu::stream_touch(emu::stream_id(s)).vc, ((EmuEvent *)e)->vc);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> lk(emu::g_hz_mu);
    emu::join(emu::g_host, ((EmuEvent *)e)->vc);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float)(((EmuEvent *)b)->t - ((EmuEvent *)a)->t);
    return cudaSuccess;
}

// NCCL (a world of one) lives in nccl_emu.inc, compiled into comm_nccl.cu's emulator object
// (nccl.h needs the real cuda_runtime.h, which this file's header replaces); a collective it
// "runs" looks unfinished to cudaStreamQuery for EMU_NCCL_DELAY_MS.
void emu_busy_for(double ms) { g_nccl_delay_until_ms = (long)(emu_now_ms() + ms); }
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
    emu::ctx_touch();
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
    (void)h, (void)ws, (void)wsb;
    emu::hz_begin(st, "cublasLtMatmul");
    emu::hz_ptr(A, 0), emu::hz_ptr(B, 0), emu::hz_ptr(C, 0), emu::hz_ptr(Dp, 1);
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
