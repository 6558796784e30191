// cuda_emu.h: a small SIMT emulator, so that llmc/cuda/*.cu can run on a machine without a GPU.
//
// With -DLLMC_EMU, llmc/cuda/common.cuh includes this header instead of the CUDA headers and
// g++ compiles the kernels as ordinary C++. A launch runs each CUDA thread of a block as a
// fiber (ucontext) of the launching host thread, in thread order, the blocks of the grid one
// after another; __syncthreads is a barrier over the block's threads, __syncwarp and the
// shuffles a barrier over the warp's 32 threads (a fiber parks there until all have arrived),
// __shared__ variables are function statics (one block runs at a time), dynamic shared memory
// is a buffer filled with NaN bytes before each block. WMMA fragments hold the whole 16x16
// tile in every lane (load/mma/store follow the documented row/col-major meaning;
// the real per-lane layout is never needed by code that only loads, multiplies and stores).
// The CUDA runtime and cuBLASLt calls the backend makes are implemented on host memory in
// cuda_emu.cpp (cuBLASLt's column-major semantics, from its documentation, over OpenBLAS).
//
// What this checks: indexing, bounds, barriers (a missing barrier shows as a wrong result: a
// fiber runs until it reaches a barrier, so it reads what lower-numbered threads wrote and not
// what higher ones will; threads that disagree on the barriers they reach stop the program),
// vector-access and WMMA alignment, shared memory limits, the row-major -> column-major
// cuBLASLt mapping. What it cannot check: timing, the real tensor-core fragment layouts and
// accumulation order, real cuBLASLt algorithms, warp-synchronous code that relies on lockstep
// (none is written on purpose), device-memory limits, real stream concurrency (the emulator
// runs every stream in issue order).
//
// Stream order IS checked (EMU_HAZARDS=0 turns it off, =warn only reports): every operation
// on a stream (kernel launch, async copy or memset, cuBLASLt matmul, NCCL collective, and the
// legacy-stream cudaMemcpy / cudaMemset) is stamped with a vector clock, and every operand that
// lies in a cudaMalloc / cudaMallocHost allocation is checked against the allocation's last
// writer and readers: an access from another stream with no event wait, stream or device
// synchronisation (or legacy-stream implicit ordering) between them is a hazard and stops the
// program with a message naming both operations and streams. Kernel pointer arguments count as
// reads when the pointee is const and as writes otherwise; pointers inside by-value structs as reads. Devices: EMU_DEVICES (default 1);
// emu_context_mask() says on which devices a context was created (cudaSetDevice, allocations,
// streams, launches), to test that a rank touches only its own GPU. NCCL: a world of one, with
// EMU_NCCL_DELAY_MS making a collective look unfinished to cudaStreamQuery for that long.
#pragma once
#include <cuda_runtime_api.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

// host_defines.h already maps __global__/__device__/__host__/__constant__ to nothing for a host
// compiler; shared memory must be per block and shared by the block's threads:
#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)
#define __restrict__ __restrict

namespace emu {
extern thread_local dim3 tl_thread, tl_block;
extern dim3 g_bdim, g_gdim;
extern unsigned char *g_dyn_smem;
void syncthreads();
void syncwarp();
uint64_t shfl_bits(uint64_t bits, int src_lane);
int lane_id();
// PTX mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d += a b, a warp-collective: each lane
// passes its fragment registers (the PTX ISA's layout; llmc/cuda/attention.cu's mma_16816 says it)
void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]);
// PTX ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16, a warp-collective: lane 8 i + r passes
// the address of row r of 8 x 8 matrix i (8 16-bit elements, 16-byte aligned, in dynamic shared
// memory); lane l receives in d[i] the elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of
// matrix i, or with trans (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4); the first in the low half.
void ldmatrix_x4(uint32_t d[4], const void *row, int trans);
// PTX cp.async.{ca,cg}.shared.global (bytes 4, 8 or 16), cp.async.commit_group and
// cp.async.wait_group n. The source is read at the call; the shared-memory write is held back
// until the thread's wait_group retires its group (the latest moment the PTX ISA allows), so a
// read before the wait, or by another thread without a barrier after it, sees the old bytes.
// A block that ends with copies not waited for stops the program.
void cp_async(void *smem_dst, const void *src, int bytes);
void cp_async_commit();
void cp_async_wait(int n);
void check_align(const void *p, unsigned bytes, const char *what);
void fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

// Launch: runs body() as every thread of every block.
void launch(const void *fn, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);
// Stream-order checking: hz_begin stamps a new operation on stream st; hz_ptr checks one operand
// of it (write: the operation may modify it) against earlier accesses on other streams.
void hz_begin(cudaStream_t st, const char *what);
void hz_ptr(const void *p, int write);
void ctx_touch();  // the current device gets a context

// A pointer argument is a read (const pointee) or a write; pointers inside a struct passed by
// value (the elementwise ops' functors) cannot be told apart, so every aligned word of such a
// struct that points into an allocation is checked as a read only.
template <class T> inline void hz_arg(const T &v) {
    if constexpr (std::is_pointer<T>::value) {
        hz_ptr((const void *)v, !std::is_const<typename std::remove_pointer<T>::type>::value);
    } else if constexpr (std::is_class<T>::value && std::is_trivially_copyable<T>::value && sizeof(T) >= sizeof(void *)) {
        for (size_t o = 0; o + sizeof(void *) <= sizeof(T); o += alignof(void *)) {
            const void *p;
            memcpy(&p, (const char *)&v + o, sizeof p);
            hz_ptr(p, 0);
        }
    }
}
template <class Tup, size_t... I> inline void hz_args(const Tup &t, std::index_sequence<I...>) {
    (hz_arg(std::get<I>(t)), ...);
}
size_t smem_limit(const void *fn);
void set_smem_limit(const void *fn, size_t bytes);

template <class... P> struct Launcher {
    void (*fn)(P...);
    dim3 grid, block;
    size_t smem;
    cudaStream_t st;
    template <class... A> void operator()(A &&...a) const {
        std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
        hz_begin(st, "kernel launch");
        hz_args(args, std::index_sequence_for<P...>{});
        auto f = fn;
        launch((const void *)fn, grid, block, smem, [&]() { std::apply(f, args); });
    }
};
template <class... P> Launcher<P...> make_launcher(dim3 g, dim3 b, size_t s, cudaStream_t st, void (*fn)(P...)) {
    return Launcher<P...>{fn, g, b, s, st};
}
}  // namespace emu
extern "C" unsigned emu_context_mask(void);  // bit d: a context was created on device d
extern "C" void emu_context_reset(void);
extern "C" long emu_pinned_bytes(void);     // cudaMallocHost bytes live now

#define threadIdx (emu::tl_thread)
#define blockIdx (emu::tl_block)
#define blockDim (emu::g_bdim)
#define gridDim (emu::g_gdim)
#define LAUNCH(g, b, s, st, ...) emu::make_launcher(dim3(g), dim3(b), (size_t)(s), (cudaStream_t)(st), __VA_ARGS__)
#define DYNAMIC_SMEM(name) unsigned char *name = emu::g_dyn_smem
#define EMU_CHECK_ALIGN(p, n) emu::check_align((p), (n), "vector access")

inline void __syncthreads() { emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    if (mask != 0xffffffffu) emu::fatal("emu: __syncwarp with a partial mask is not emulated");
    emu::syncwarp();
}
template <class T> inline T emu_shfl(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    b = emu::shfl_bits(b, src & 31);
    T r;
    memcpy(&r, &b, sizeof(T));
    return r;
}
template <class T> inline T __shfl_sync(unsigned, T v, int src) { return emu_shfl(v, src); }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int m) { return emu_shfl(v, emu::lane_id() ^ m); }
template <class T> inline T __shfl_down_sync(unsigned, T v, unsigned d) {
    int s = emu::lane_id() + (int)d;
    T r = emu_shfl(v, s < 32 ? s : emu::lane_id());
    return r;
}
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float __fmul_rn(float a, float b) {
    volatile float r = a * b;
    return r;
}
inline float __fadd_rn(float a, float b) {
    volatile float r = a + b;
    return r;
}
inline float __expf(float x) { return expf(x); }

// Runtime entry points that cuda_runtime.h provides as C++ templates.
template <class T> cudaError_t cudaFuncSetAttribute(T *fn, cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) emu::set_smem_limit((const void *)fn, (size_t)value);
    return cudaSuccess;
}
template <class T> cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, T *fn) {
    (void)fn;
    emu::ctx_touch();
    memset(a, 0, sizeof *a);
    a->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}
template <class T> cudaError_t cudaMemcpyToSymbol(T &symbol, const void *src, size_t count, size_t offset = 0,
                                                  cudaMemcpyKind kind = cudaMemcpyHostToDevice) {
    (void)kind;
    memcpy((char *)&symbol + offset, src, count);
    return cudaSuccess;
}

// ---- WMMA -----------------------------------------------------------------------------------
namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

// The logical 16x16 tile, element (r, c) at v[r * 16 + c], held whole by every lane.
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulator knows m16n16k16 only");
    float v[256];
};

template <class Use, class T, class L>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float x) {
    for (int i = 0; i < 256; i++) f.v[i] = x;
}

template <class T> inline float emu_val(const T &x);
template <> inline float emu_val<float>(const float &x) { return x; }
template <> inline float emu_val<__nv_bfloat16>(const __nv_bfloat16 &x) { return __bfloat162float(x); }

inline void check_frag_ptr(const void *p, unsigned ldm, size_t elem) {
    emu::check_align(p, 32, "WMMA pointer (must be 256-bit aligned)");
    if ((ldm * elem) % 16) emu::fatal("emu: WMMA ldm %u is not a multiple of 16 bytes", ldm);
}

// matrix_a (16 x K): row_major a(r,k) = p[r*ldm + k]; col_major a(r,k) = p[k*ldm + r]
// matrix_b (K x 16): row_major b(k,n) = p[k*ldm + n]; col_major b(k,n) = p[n*ldm + k]
template <class T> inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, row_major> &f, const T *p, unsigned ldm) {
    check_frag_ptr(p, ldm, sizeof(T));
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.v[r * 16 + c] = emu_val<T>(p[(size_t)r * ldm + c]);
}
template <class T> inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, col_major> &f, const T *p, unsigned ldm) {
    check_frag_ptr(p, ldm, sizeof(T));
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.v[r * 16 + c] = emu_val<T>(p[(size_t)c * ldm + r]);
}
template <class T> inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, row_major> &f, const T *p, unsigned ldm) {
    check_frag_ptr(p, ldm, sizeof(T));
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 16; n++) f.v[k * 16 + n] = emu_val<T>(p[(size_t)k * ldm + n]);
}
template <class T> inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, col_major> &f, const T *p, unsigned ldm) {
    check_frag_ptr(p, ldm, sizeof(T));
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 16; n++) f.v[k * 16 + n] = emu_val<T>(p[(size_t)n * ldm + k]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm, layout_t l) {
    check_frag_ptr(p, ldm, sizeof(float));
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.v[r * 16 + c] = l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}
// Only the warp's last lane writes (every lane holds the same tile) and fibers run in lane
// order, so a reader in another lane that skips the __syncwarp the real code needs reads the
// old contents (NaN bytes in dynamic shared memory): a wrong result.
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm, layout_t l) {
    check_frag_ptr(p, ldm, sizeof(float));
    if (emu::lane_id() != 31) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            if (l == mem_row_major) p[(size_t)r * ldm + c] = f.v[r * 16 + c];
            else p[(size_t)c * ldm + r] = f.v[r * 16 + c];
        }
}
template <class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b, const fragment<accumulator, 16, 16, 16, float> &c) {
    float out[256];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = c.v[r * 16 + n];
            for (int k = 0; k < 16; k++) s += a.v[r * 16 + k] * b.v[k * 16 + n];
            out[r * 16 + n] = s;
        }
    memcpy(d.v, out, sizeof out);
}
}  // namespace wmma
}  // namespace nvcuda
