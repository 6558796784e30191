// attention.cu: causal grouped-query flash attention, forward and backward, with the sliding
// window and packed-document masks. Every path has run on an H200 (2026-11-27: WMMA and
// generic; 2026-11-28: mma, now the default): dev/cuda/attention's checks, masks included,
// compute-sanitizer racecheck, and every memory mode bit-identical to the plain run.
//
// Mask (backend.h): query i of row b sees keys j with lo(i) <= j <= i, where
//   lo(i) = max(doc_start[b*T + i], i - window + 1)   (window 0: no window; doc_start NULL: 0).
// lo is non-decreasing in i (a document starts at or after the previous token's), so a query
// tile's first row has the smallest lo: the forward and dQ kernels start at the key tile that
// holds it, and the dK/dV kernel stops at the first query tile whose first row cannot see its
// key tile. Key tiles that no row of a query tile sees are never loaded.
//
// Semantics (backend.h): q [B,T,Hq,D], k/v [B,T,Hkv,D], out like q, lse [B,Hq,T] = natural
// log-sum-exp of the scaled scores (scale 1/sqrt(D)); query head h reads kv head h/(Hq/Hkv)
// straight from k/v (no replicated K/V in memory). Only lse is saved for the backward, which
// recomputes each score tile: P = exp(S - lse), dP = dO V^T, dS = P (dP - rowsum(dO O)),
// dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
//
// Determinism: no atomics. The backward runs two kernels: one owns a (batch, kv head, key tile)
// and walks every query head of its group and every query tile at or below the diagonal,
// accumulating dK and dV in shared memory; the other owns a (batch, query head, query tile) and
// accumulates dQ. Scores are recomputed in both (7 tile GEMMs instead of 5), the price of a
// fixed summation order without a float atomicAdd on dQ.
//
// Paths:
//  - mma (the default in bf16; LLMC_ATT_MMA=0 turns it off): see its section.
//  - wmma (LLMC_ATT_MMA=0, or a head dim without an mma instance; bf16, head_dim a multiple
//    of 16 up to 128, 16-byte aligned tensors): 64 x 64 tiles,
//    4 warps, each warp owns 16 rows; the tile products run on tensor cores through WMMA
//    (bf16 inputs, fp32 accumulation); the running output and gradient accumulators live in
//    shared memory as fp32, where the softmax rescaling is done by ordinary threads (WMMA's
//    fragment layout is opaque, so per-row scaling cannot be done in registers portably).
//  - generic (float mode, or any other shape): 32 x 32 tiles in shared memory as float, scalar
//    FMAs. It is the reference path of this file and the fp32 path the CPU backend is compared
//    with.
// Work per block grows with the query-tile index (causal), so the forward and dQ grids are
// walked heaviest tile first, and the dK/dV grid (heaviest = key tile 0) in natural order.
#include "kernels.cuh"

static inline float att_scale(int D) { return (float)(1.0 / sqrt((double)D)); }

// First visible key of query i; ds is the row's doc_start (NULL: the row is one document).
__device__ __forceinline__ int att_lo(int i, int window, const int32_t *ds) {
    int lo = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
    if (ds) {
        const int d = ds[i];
        if (d > lo) lo = d < i ? d : i;
    }
    return lo;
}

// The first key tile (of size tile) a query tile starting at i0 needs.
__device__ __forceinline__ int att_first_tile(int i0, int T_, int tile, int window, const int32_t *ds) {
    return i0 < T_ ? att_lo(i0, window, ds) / tile * tile : 0;
}

// A query span (backend.h's query tiles): queries q0 .. qend-1 of each row, whose q/out/dq/dout
// rows are stored compactly ([B, nq, H, D]); k/v/dk/dv, lse and Di are indexed by the whole T.
struct AttSpan {
    int q0, qend, nq;
};
__device__ __forceinline__ size_t qrow(const AttSpan &sp, int b, int i) { return (size_t)b * sp.nq + (i - sp.q0); }

// ==== generic path ========================================================================
#define GB 32   // query and key rows per tile
#define GT 128  // threads per block

template <class T> __device__ __forceinline__ float ldf(const T *p) { return to_f<T>(*p); }

template <class T>
__global__ void __launch_bounds__(GT) att_fwd_generic(T *out, float *lse, const T *q, const T *k, const T *v,
                                                     int T_, AttSpan sp, int Hq, int Hkv, int D, float scale,
                                                     int window, const int32_t *doc_start, float softcap) {
    DYNAMIC_SMEM(smem);
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (Hq / Hkv), i0 = sp.q0 + qb * GB, ldq = Hq * D, ldk = Hkv * D, DK = D + 1;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t *drow = doc_start ? doc_start + (size_t)b * T_ : nullptr;
    float *sQ = (float *)smem, *sK = sQ + GB * D, *sV = sK + GB * DK, *sO = sV + GB * D;
    float *sS = sO + GB * D, *sM = sS + GB * (GB + 1), *sL = sM + GB, *sC = sL + GB;
    int *sLo = (int *)(sC + GB);
    for (int e = tid; e < GB * D; e += GT) {
        const int r = e / D, d = e % D, i = i0 + r;
        sQ[e] = i < sp.qend ? ldf(q + qrow(sp, b, i) * ldq + (size_t)h * D + d) : 0.0f;
        sO[e] = 0.0f;
    }
    if (tid < GB) sM[tid] = -INFINITY, sL[tid] = 0.0f, sLo[tid] = i0 + tid < sp.qend ? att_lo(i0 + tid, window, drow) : 0;
    __syncthreads();
    const int jend = i0 + GB < sp.qend ? i0 + GB : sp.qend;
    for (int j0 = att_first_tile(i0, T_, GB, window, drow); j0 < jend; j0 += GB) {
        for (int e = tid; e < GB * D; e += GT) {
            const int r = e / D, d = e % D, j = j0 + r;
            const size_t o = ((size_t)b * T_ + j) * ldk + (size_t)hk * D + d;
            sK[r * DK + d] = j < T_ ? ldf(k + o) : 0.0f;
            sV[e] = j < T_ ? ldf(v + o) : 0.0f;
        }
        __syncthreads();
        for (int e = tid; e < GB * GB; e += GT) {
            const int r = e / GB, cc = e % GB, i = i0 + r, j = j0 + cc;
            float s = -INFINITY;
            if (j <= i && j < T_ && j >= sLo[r]) {
                float acc = 0.0f;
                for (int d = 0; d < D; d++) acc += sQ[r * D + d] * sK[cc * DK + d];
                s = soft_cap(acc * scale, softcap);  // Gemma 2's attn_logit_softcapping
            }
            sS[r * (GB + 1) + cc] = s;
        }
        __syncthreads();
        for (int r = warp; r < GB; r += GT / 32) {  // a warp per row, a lane per key
            const float s = sS[r * (GB + 1) + lane];
            const float mold = sM[r], mnew = fmaxf(mold, warp_max(s));
            const float p = s == -INFINITY ? 0.0f : expf(s - mnew);
            const float sum = warp_sum(p);
            sS[r * (GB + 1) + lane] = p;
            // every lane has read sM[r] before lane 0 rewrites it: the shuffles above exchange
            // values but do not order shared memory (compute-sanitizer racecheck on an H200
            // reported the read/write pair, 2026-11-27)
            __syncwarp();
            if (lane == 0) {
                const float corr = mnew == -INFINITY ? 1.0f : expf(mold - mnew);  // nothing visible yet
                sC[r] = corr;
                sL[r] = sL[r] * corr + sum;
                sM[r] = mnew;
            }
        }
        __syncthreads();
        for (int e = tid; e < GB * D; e += GT) {
            const int r = e / D, d = e % D;
            float acc = sO[e] * sC[r];
            for (int cc = 0; cc < GB; cc++) acc += sS[r * (GB + 1) + cc] * sV[cc * D + d];
            sO[e] = acc;
        }
        __syncthreads();
    }
    for (int e = tid; e < GB * D; e += GT) {
        const int r = e / D, d = e % D, i = i0 + r;
        if (i < sp.qend) out[qrow(sp, b, i) * ldq + (size_t)h * D + d] = from_f<T>(sO[e] * (1.0f / sL[r]));
    }
    if (tid < GB && i0 + tid < sp.qend) lse[((size_t)b * Hq + h) * T_ + i0 + tid] = sM[tid] + logf(sL[tid]);
}

static size_t generic_fwd_smem(int D) { return sizeof(float) * ((size_t)GB * (4 * D + 1) + GB * (GB + 1) + 4 * GB); }

// Di[b,h,i] = sum_d dO * O: a warp per (b, i, h) row of the span.
template <class T>
__global__ void att_bwd_dot(float *Di, const T *dout, const T *out, int B, int T_, AttSpan sp, int Hq, int D) {
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= (size_t)B * sp.nq * Hq) return;
    const T *g = dout + row * D, *o = out + row * D;
    float s = 0.0f;
    for (int d = lane; d < D; d += 32) s += to_f<T>(g[d]) * to_f<T>(o[d]);
    s = warp_sum(s);
    const int h = (int)(row % Hq), i = sp.q0 + (int)((row / Hq) % sp.nq), b = (int)(row / ((size_t)Hq * sp.nq));
    if (lane == 0) Di[((size_t)b * Hq + h) * T_ + i] = s;
}

// Stores one dK/dV element. Query spans of a row come one call each: the first writes, later
// ones add. With float running sums (acck/accv, when dk/dv are bf16) the sums stay in float and
// dk/dv get each call's rounded total, so the last span leaves bf16(the float sum).
template <class T>
__device__ __forceinline__ void att_store_dkdv(T *dk, T *dv, float *acck, float *accv, size_t o, float gk, float gv,
                                               int accumulate) {
    if (acck) {
        if (accumulate) gk += acck[o], gv += accv[o];
        acck[o] = gk, accv[o] = gv;
    } else if (accumulate) {
        gk += to_f<T>(dk[o]), gv += to_f<T>(dv[o]);
    }
    dk[o] = from_f<T>(gk);
    dv[o] = from_f<T>(gv);
}

// dK, dV for one key tile of one kv head, summed over the group's query heads and query tiles.
template <class T>
__global__ void __launch_bounds__(GT) att_bwd_dkdv_generic(T *dk, T *dv, const T *dout, const T *q, const T *k,
                                                          const T *v, const float *lse, const float *Di,
                                                          int T_, AttSpan sp, int Hq, int Hkv, int D, float scale,
                                                          int window, const int32_t *doc_start, int accumulate,
                                                          float *acck, float *accv, float softcap) {
    DYNAMIC_SMEM(smem);
    const int kb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, group = Hq / Hkv;
    const int j0 = kb * GB, ldq = Hq * D, ldk = Hkv * D, DK = D + 1, tid = threadIdx.x;
    if (accumulate && j0 >= sp.qend) return;  // no query of the span sees these keys
    const int jlast = (j0 + GB < T_ ? j0 + GB : T_) - 1;
    const int32_t *drow = doc_start ? doc_start + (size_t)b * T_ : nullptr;
    float *sK = (float *)smem, *sV = sK + GB * DK, *sdK = sV + GB * DK, *sdV = sdK + GB * D;
    float *sQ = sdV + GB * D, *sdO = sQ + GB * D, *sP = sdO + GB * D, *sdS = sP + GB * (GB + 1);
    float *sL = sdS + GB * (GB + 1), *sDi = sL + GB;
    int *sLo = (int *)(sDi + GB);
    for (int e = tid; e < GB * D; e += GT) {
        const int r = e / D, d = e % D, j = j0 + r;
        const size_t o = ((size_t)b * T_ + j) * ldk + (size_t)hk * D + d;
        sK[r * DK + d] = j < T_ ? ldf(k + o) : 0.0f;
        sV[r * DK + d] = j < T_ ? ldf(v + o) : 0.0f;
        sdK[e] = sdV[e] = 0.0f;
    }
    for (int h = hk * group; h < (hk + 1) * group; h++)
        for (int i0 = j0 > sp.q0 ? j0 : sp.q0; i0 < sp.qend; i0 += GB) {
            if (att_lo(i0, window, drow) > jlast) break;  // neither this query tile nor a later one sees the keys
            __syncthreads();  // the previous tile's readers are done
            for (int e = tid; e < GB * D; e += GT) {
                const int r = e / D, d = e % D, i = i0 + r;
                const size_t o = qrow(sp, b, i < sp.qend ? i : sp.q0) * ldq + (size_t)h * D + d;
                sQ[e] = i < sp.qend ? ldf(q + o) : 0.0f;
                sdO[e] = i < sp.qend ? ldf(dout + o) : 0.0f;
            }
            if (tid < GB) {
                const int i = i0 + tid;
                sL[tid] = i < sp.qend ? lse[((size_t)b * Hq + h) * T_ + i] : 0.0f;
                sDi[tid] = i < sp.qend ? Di[((size_t)b * Hq + h) * T_ + i] : 0.0f;
                sLo[tid] = i < sp.qend ? att_lo(i, window, drow) : 0;
            }
            __syncthreads();
            for (int e = tid; e < GB * GB; e += GT) {
                const int r = e / GB, cc = e % GB, i = i0 + r, j = j0 + cc;
                float p = 0.0f, ds = 0.0f;
                if (i < sp.qend && j <= i && j >= sLo[r]) {
                    float s = 0.0f, dp = 0.0f;
                    for (int d = 0; d < D; d++) {
                        s += sQ[r * D + d] * sK[cc * DK + d];
                        dp += sdO[r * D + d] * sV[cc * DK + d];
                    }
                    const float sc = soft_cap(s * scale, softcap);
                    p = expf(sc - sL[r]);
                    ds = p * (dp - sDi[r]) * soft_cap_slope(sc, softcap);
                }
                sP[r * (GB + 1) + cc] = p;
                sdS[r * (GB + 1) + cc] = ds * scale;
            }
            __syncthreads();
            for (int e = tid; e < GB * D; e += GT) {
                const int cc = e / D, d = e % D;
                float av = 0.0f, ak = 0.0f;
                for (int r = 0; r < GB; r++) {
                    av += sP[r * (GB + 1) + cc] * sdO[r * D + d];
                    ak += sdS[r * (GB + 1) + cc] * sQ[r * D + d];
                }
                sdV[e] += av;
                sdK[e] += ak;
            }
        }
    __syncthreads();
    for (int e = tid; e < GB * D; e += GT) {
        const int r = e / D, d = e % D, j = j0 + r;
        if (j < T_) {
            const size_t o = ((size_t)b * T_ + j) * ldk + (size_t)hk * D + d;
            att_store_dkdv(dk, dv, acck, accv, o, sdK[e], sdV[e], accumulate);
        }
    }
}

static size_t generic_dkdv_smem(int D) {
    return sizeof(float) * ((size_t)2 * GB * (D + 1) + 4 * (size_t)GB * D + 2 * GB * (GB + 1) + 3 * GB);
}

// dQ for one query tile of one query head, summed over the key tiles at or below the diagonal.
template <class T>
__global__ void __launch_bounds__(GT) att_bwd_dq_generic(T *dq, const T *dout, const T *q, const T *k, const T *v,
                                                        const float *lse, const float *Di, int T_, AttSpan sp,
                                                        int Hq, int Hkv, int D, float scale, int window,
                                                        const int32_t *doc_start, float softcap) {
    DYNAMIC_SMEM(smem);
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (Hq / Hkv), i0 = sp.q0 + qb * GB, ldq = Hq * D, ldk = Hkv * D, DK = D + 1;
    const int tid = threadIdx.x;
    const int32_t *drow = doc_start ? doc_start + (size_t)b * T_ : nullptr;
    float *sQ = (float *)smem, *sdO = sQ + GB * D, *sdQ = sdO + GB * D, *sK = sdQ + GB * D;
    float *sV = sK + GB * DK, *sdS = sV + GB * DK, *sL = sdS + GB * (GB + 1), *sDi = sL + GB;
    int *sLo = (int *)(sDi + GB);
    for (int e = tid; e < GB * D; e += GT) {
        const int r = e / D, d = e % D, i = i0 + r;
        const size_t o = qrow(sp, b, i < sp.qend ? i : sp.q0) * ldq + (size_t)h * D + d;
        sQ[e] = i < sp.qend ? ldf(q + o) : 0.0f;
        sdO[e] = i < sp.qend ? ldf(dout + o) : 0.0f;
        sdQ[e] = 0.0f;
    }
    if (tid < GB) {
        const int i = i0 + tid;
        sL[tid] = i < sp.qend ? lse[((size_t)b * Hq + h) * T_ + i] : 0.0f;
        sDi[tid] = i < sp.qend ? Di[((size_t)b * Hq + h) * T_ + i] : 0.0f;
        sLo[tid] = i < sp.qend ? att_lo(i, window, drow) : 0;
    }
    const int jend = i0 + GB < sp.qend ? i0 + GB : sp.qend;
    for (int j0 = att_first_tile(i0, T_, GB, window, drow); j0 < jend; j0 += GB) {
        __syncthreads();
        for (int e = tid; e < GB * D; e += GT) {
            const int r = e / D, d = e % D, j = j0 + r;
            const size_t o = ((size_t)b * T_ + j) * ldk + (size_t)hk * D + d;
            sK[r * DK + d] = j < T_ ? ldf(k + o) : 0.0f;
            sV[r * DK + d] = j < T_ ? ldf(v + o) : 0.0f;
        }
        __syncthreads();
        for (int e = tid; e < GB * GB; e += GT) {
            const int r = e / GB, cc = e % GB, i = i0 + r, j = j0 + cc;
            float ds = 0.0f;
            if (i < sp.qend && j <= i && j >= sLo[r]) {
                float s = 0.0f, dp = 0.0f;
                for (int d = 0; d < D; d++) {
                    s += sQ[r * D + d] * sK[cc * DK + d];
                    dp += sdO[r * D + d] * sV[cc * DK + d];
                }
                const float sc = soft_cap(s * scale, softcap);
                const float p = expf(sc - sL[r]);
                ds = p * (dp - sDi[r]) * soft_cap_slope(sc, softcap);
            }
            sdS[r * (GB + 1) + cc] = ds * scale;
        }
        __syncthreads();
        for (int e = tid; e < GB * D; e += GT) {
            const int r = e / D, d = e % D;
            float acc = 0.0f;
            for (int cc = 0; cc < GB; cc++) acc += sdS[r * (GB + 1) + cc] * sK[cc * DK + d];
            sdQ[e] += acc;
        }
    }
    __syncthreads();
    for (int e = tid; e < GB * D; e += GT) {
        const int r = e / D, d = e % D, i = i0 + r;
        if (i < sp.qend) dq[qrow(sp, b, i) * ldq + (size_t)h * D + d] = from_f<T>(sdQ[e]);
    }
}

static size_t generic_dq_smem(int D) {
    return sizeof(float) * ((size_t)3 * GB * D + 2 * GB * (D + 1) + GB * (GB + 1) + 3 * GB);
}

// ==== WMMA path (bf16) =====================================================================
#define WB 64   // rows per tile
#define WT 128  // 4 warps; warp w owns rows [16w, 16w + 16) of its tile
using namespace nvcuda;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> FragAT;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragB;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBT;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

// Padded leading dimensions (elements): bf16 tiles D+8, float score tiles WB+4, bf16 P tiles
// WB+8, float accumulators D+4. Every fragment pointer is then 32-byte aligned and each ldm a
// multiple of 16 bytes, as WMMA requires; the padding also staggers rows across banks.
struct WLayout {
    int ldh, lds, ldp, ldo;
};
static __host__ __device__ inline WLayout wlayout(int D) { return WLayout{D + 8, WB + 4, WB + 8, D + 4}; }

// Copies rows [r0, r0 + WB) of one head (row stride ld elements, head offset col) into a
// padded bf16 tile; rows at or past T are zero. 16-byte vectors.
__device__ __forceinline__ void load_tile(bf16 *dst, int ldh, const bf16 *src, size_t row0, int r0, int T_,
                                          size_t ld, size_t col, int D) {
    const int per = D / 8;
    for (int e = threadIdx.x; e < WB * per; e += WT) {
        const int r = e / per, c8 = (e % per) * 8;
        Raw16 val = {{0u, 0u, 0u, 0u}};
        if (r0 + r < T_) {
            EMU_CHECK_ALIGN(src + (row0 + r) * ld + col + c8, 16);
            val = *reinterpret_cast<const Raw16 *>(src + (row0 + r) * ld + col + c8);
        }
        EMU_CHECK_ALIGN(dst + r * ldh + c8, 16);
        *reinterpret_cast<Raw16 *>(dst + r * ldh + c8) = val;
    }
}

// dst[16 x 64] (float, ld lds) = A[16 x D] B^T where A rows are at a (ld ldh) and B rows at b.
__device__ __forceinline__ void tile_qkT(float *dst, int lds, const bf16 *a, const bf16 *b, int ldh, int D) {
    for (int nt = 0; nt < WB / 16; nt++) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < D / 16; kk++) {
            FragA fa;
            FragBT fb;
            wmma::load_matrix_sync(fa, a + kk * 16, ldh);
            wmma::load_matrix_sync(fb, b + nt * 16 * ldh + kk * 16, ldh);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(dst + nt * 16, acc, lds, wmma::mem_row_major);
    }
}

__global__ void __launch_bounds__(WT) att_fwd_wmma(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                                  const bf16 *v, int T_, AttSpan sp, int Hq, int Hkv, int D,
                                                  float scale, int window, const int32_t *doc_start) {
    DYNAMIC_SMEM(smem);
    const WLayout L = wlayout(D);
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (Hq / Hkv), i0 = sp.q0 + qb * WB, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t ldq = (size_t)Hq * D, ldk = (size_t)Hkv * D;
    const int32_t *drow = doc_start ? doc_start + (size_t)b * T_ : nullptr;
    bf16 *sQ = (bf16 *)smem, *sK = sQ + WB * L.ldh, *sV = sK + WB * L.ldh;
    float *sS = (float *)(sV + WB * L.ldh);
    bf16 *sP = (bf16 *)(sS + WB * L.lds);
    float *sO = (float *)(sP + WB * L.ldp);
    int *sLo = (int *)(sO + WB * L.ldo);
    load_tile(sQ, L.ldh, q, qrow(sp, b, i0), i0, sp.qend, ldq, (size_t)h * D, D);
    for (int e = threadIdx.x; e < WB * L.ldo; e += WT) sO[e] = 0.0f;
    for (int e = threadIdx.x; e < WB; e += WT) sLo[e] = i0 + e < sp.qend ? att_lo(i0 + e, window, drow) : 0;
    // running max and sum of row 16*warp + lane live in lane `lane` (< 16) of the owning warp
    float m_run = -INFINITY, l_run = 0.0f;
    const int r0 = 16 * warp;
    const int jend = i0 + WB < sp.qend ? i0 + WB : sp.qend;
    for (int j0 = att_first_tile(i0, T_, WB, window, drow); j0 < jend; j0 += WB) {
        __syncthreads();  // previous K/V readers are done (and, first time, sQ/sO are ready)
        load_tile(sK, L.ldh, k, (size_t)b * T_ + j0, j0, T_, ldk, (size_t)hk * D, D);
        load_tile(sV, L.ldh, v, (size_t)b * T_ + j0, j0, T_, ldk, (size_t)hk * D, D);
        __syncthreads();
        tile_qkT(sS + r0 * L.lds, L.lds, sQ + r0 * L.ldh, sK, L.ldh, D);
        __syncwarp();
        for (int rr = 0; rr < 16; rr++) {
            const int r = r0 + rr, i = i0 + r;
            const int ja = j0 + lane, jb = j0 + lane + 32;
            const bool va = ja <= i && ja < T_ && ja >= sLo[r], vb = jb <= i && jb < T_ && jb >= sLo[r];
            const float sa = sS[r * L.lds + lane] * scale, sb = sS[r * L.lds + lane + 32] * scale;
            const float mx = warp_max(fmaxf(va ? sa : -INFINITY, vb ? sb : -INFINITY));
            const float mold = __shfl_sync(0xffffffffu, m_run, rr), lold = __shfl_sync(0xffffffffu, l_run, rr);
            const float mnew = fmaxf(mold, mx);
            const float pa = va ? expf(sa - mnew) : 0.0f, pb = vb ? expf(sb - mnew) : 0.0f;
            const float sum = warp_sum(pa + pb);
            const float corr = mnew == -INFINITY ? 1.0f : expf(mold - mnew);  // nothing visible yet
            sP[r * L.ldp + lane] = __float2bfloat16_rn(pa);
            sP[r * L.ldp + lane + 32] = __float2bfloat16_rn(pb);
            if (lane == rr) m_run = mnew, l_run = lold * corr + sum;
            for (int d = lane; d < D; d += 32) sO[r * L.ldo + d] *= corr;
        }
        __syncwarp();
        for (int nt = 0; nt < D / 16; nt++) {
            FragC acc;
            wmma::load_matrix_sync(acc, sO + r0 * L.ldo + nt * 16, L.ldo, wmma::mem_row_major);
            for (int kk = 0; kk < WB / 16; kk++) {
                FragA fa;
                FragB fb;
                wmma::load_matrix_sync(fa, sP + r0 * L.ldp + kk * 16, L.ldp);
                wmma::load_matrix_sync(fb, sV + kk * 16 * L.ldh + nt * 16, L.ldh);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(sO + r0 * L.ldo + nt * 16, acc, L.ldo, wmma::mem_row_major);
        }
    }
    __syncwarp();
    for (int rr = 0; rr < 16; rr++) {
        const int r = r0 + rr, i = i0 + r;
        const float l = __shfl_sync(0xffffffffu, l_run, rr), m = __shfl_sync(0xffffffffu, m_run, rr);
        if (i >= sp.qend) continue;
        const float inv = 1.0f / l;
        bf16 *o = out + qrow(sp, b, i) * ldq + (size_t)h * D;
        for (int d = lane; d < D; d += 32) o[d] = __float2bfloat16_rn(sO[r * L.ldo + d] * inv);
        if (lane == 0) lse[((size_t)b * Hq + h) * T_ + i] = m + logf(l);
    }
}

static size_t wmma_fwd_smem(int D) {
    const WLayout L = wlayout(D);
    return (size_t)WB * (3 * L.ldh * 2 + L.lds * 4 + L.ldp * 2 + L.ldo * 4 + 4);
}

// P and scale*dS of a warp's 16 query rows against a 64-key tile, from the score and dP tiles.
__device__ __forceinline__ void wmma_probs(bf16 *sP, bf16 *sdS, const float *sS, const float *sdP, const float *sL,
                                           const float *sDi, const int *sLo, WLayout L, int r0, int i0, int j0,
                                           int qend, float scale) {
    const int lane = threadIdx.x & 31;
    for (int e = lane; e < 16 * WB; e += 32) {
        const int r = r0 + e / WB, cc = e % WB, i = i0 + r, j = j0 + cc;
        float p = 0.0f, ds = 0.0f;
        if (i < qend && j <= i && j >= sLo[r]) {
            p = expf(sS[r * L.lds + cc] * scale - sL[r]);
            ds = p * (sdP[r * L.lds + cc] - sDi[r]);
        }
        if (sP) sP[r * L.ldp + cc] = __float2bfloat16_rn(p);
        sdS[r * L.ldp + cc] = __float2bfloat16_rn(ds * scale);
    }
}

__global__ void __launch_bounds__(WT) att_bwd_dkdv_wmma(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q,
                                                       const bf16 *k, const bf16 *v, const float *lse,
                                                       const float *Di, int T_, AttSpan sp, int Hq, int Hkv,
                                                       int D, float scale, int window, const int32_t *doc_start,
                                                       int accumulate, float *acck, float *accv) {
    DYNAMIC_SMEM(smem);
    const WLayout L = wlayout(D);
    const int kb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, group = Hq / Hkv;
    const int j0 = kb * WB, warp = threadIdx.x >> 5, r0 = 16 * warp;
    if (accumulate && j0 >= sp.qend) return;  // no query of the span sees these keys
    const int jlast = (j0 + WB < T_ ? j0 + WB : T_) - 1;
    const int32_t *drow = doc_start ? doc_start + (size_t)b * T_ : nullptr;
    const size_t ldq = (size_t)Hq * D, ldk = (size_t)Hkv * D;
    bf16 *sK = (bf16 *)smem, *sV = sK + WB * L.ldh, *sQ = sV + WB * L.ldh, *sdO = sQ + WB * L.ldh;
    float *sdK = (float *)(sdO + WB * L.ldh), *sdV = sdK + WB * L.ldo;
    float *sS = sdV + WB * L.ldo, *sdP = sS + WB * L.lds;
    bf16 *sP = (bf16 *)(sdP + WB * L.lds), *sdS = sP + WB * L.ldp;
    float *sL = (float *)(sdS + WB * L.ldp), *sDi = sL + WB;
    int *sLo = (int *)(sDi + WB);
    load_tile(sK, L.ldh, k, (size_t)b * T_ + j0, j0, T_, ldk, (size_t)hk * D, D);
    load_tile(sV, L.ldh, v, (size_t)b * T_ + j0, j0, T_, ldk, (size_t)hk * D, D);
    for (int e = threadIdx.x; e < WB * L.ldo; e += WT) sdK[e] = sdV[e] = 0.0f;
    for (int h = hk * group; h < (hk + 1) * group; h++)
        for (int i0 = j0 > sp.q0 ? j0 : sp.q0; i0 < sp.qend; i0 += WB) {
            if (att_lo(i0, window, drow) > jlast) break;  // neither this query tile nor a later one sees the keys
            __syncthreads();  // the previous tile's readers are done
            load_tile(sQ, L.ldh, q, qrow(sp, b, i0), i0, sp.qend, ldq, (size_t)h * D, D);
            load_tile(sdO, L.ldh, dout, qrow(sp, b, i0), i0, sp.qend, ldq, (size_t)h * D, D);
            if (threadIdx.x < WB) {
                const int i = i0 + threadIdx.x;
                sL[threadIdx.x] = i < sp.qend ? lse[((size_t)b * Hq + h) * T_ + i] : 0.0f;
                sDi[threadIdx.x] = i < sp.qend ? Di[((size_t)b * Hq + h) * T_ + i] : 0.0f;
                sLo[threadIdx.x] = i < sp.qend ? att_lo(i, window, drow) : 0;
            }
            __syncthreads();
            // this warp's 16 query rows: S = Q K^T, dP = dO V^T
            tile_qkT(sS + r0 * L.lds, L.lds, sQ + r0 * L.ldh, sK, L.ldh, D);
            tile_qkT(sdP + r0 * L.lds, L.lds, sdO + r0 * L.ldh, sV, L.ldh, D);
            __syncwarp();
            wmma_probs(sP, sdS, sS, sdP, sL, sDi, sLo, L, r0, i0, j0, sp.qend, scale);
            __syncthreads();  // the products below read every warp's rows of P and dS
            // this warp's 16 key rows: dV += P^T dO, dK += dS^T Q
            for (int nt = 0; nt < D / 16; nt++) {
                FragC av, ak;
                wmma::load_matrix_sync(av, sdV + r0 * L.ldo + nt * 16, L.ldo, wmma::mem_row_major);
                wmma::load_matrix_sync(ak, sdK + r0 * L.ldo + nt * 16, L.ldo, wmma::mem_row_major);
                for (int kk = 0; kk < WB / 16; kk++) {
                    FragAT fp, fs;
                    FragB fo, fq;
                    wmma::load_matrix_sync(fp, sP + kk * 16 * L.ldp + r0, L.ldp);
                    wmma::load_matrix_sync(fo, sdO + kk * 16 * L.ldh + nt * 16, L.ldh);
                    wmma::mma_sync(av, fp, fo, av);
                    wmma::load_matrix_sync(fs, sdS + kk * 16 * L.ldp + r0, L.ldp);
                    wmma::load_matrix_sync(fq, sQ + kk * 16 * L.ldh + nt * 16, L.ldh);
                    wmma::mma_sync(ak, fs, fq, ak);
                }
                wmma::store_matrix_sync(sdV + r0 * L.ldo + nt * 16, av, L.ldo, wmma::mem_row_major);
                wmma::store_matrix_sync(sdK + r0 * L.ldo + nt * 16, ak, L.ldo, wmma::mem_row_major);
            }
        }
    __syncthreads();
    for (int e = threadIdx.x; e < WB * D; e += WT) {
        const int r = e / D, d = e % D, j = j0 + r;
        if (j < T_) {
            const size_t o = ((size_t)b * T_ + j) * ldk + (size_t)hk * D + d;
            att_store_dkdv(dk, dv, acck, accv, o, sdK[r * L.ldo + d], sdV[r * L.ldo + d], accumulate);
        }
    }
}

static size_t wmma_dkdv_smem(int D) {
    const WLayout L = wlayout(D);
    return (size_t)WB * (4 * L.ldh * 2 + 2 * L.ldo * 4 + 2 * L.lds * 4 + 2 * L.ldp * 2 + 3 * 4);
}

__global__ void __launch_bounds__(WT) att_bwd_dq_wmma(bf16 *dq, const bf16 *dout, const bf16 *q, const bf16 *k,
                                                     const bf16 *v, const float *lse, const float *Di, int T_,
                                                     AttSpan sp, int Hq, int Hkv, int D, float scale, int window,
                                                     const int32_t *doc_start) {
    DYNAMIC_SMEM(smem);
    const WLayout L = wlayout(D);
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (Hq / Hkv), i0 = sp.q0 + qb * WB, warp = threadIdx.x >> 5, r0 = 16 * warp;
    const size_t ldq = (size_t)Hq * D, ldk = (size_t)Hkv * D;
    const int32_t *drow = doc_start ? doc_start + (size_t)b * T_ : nullptr;
    bf16 *sQ = (bf16 *)smem, *sdO = sQ + WB * L.ldh, *sK = sdO + WB * L.ldh, *sV = sK + WB * L.ldh;
    float *sdQ = (float *)(sV + WB * L.ldh), *sS = sdQ + WB * L.ldo, *sdP = sS + WB * L.lds;
    bf16 *sdS = (bf16 *)(sdP + WB * L.lds);
    float *sL = (float *)(sdS + WB * L.ldp), *sDi = sL + WB;
    int *sLo = (int *)(sDi + WB);
    load_tile(sQ, L.ldh, q, qrow(sp, b, i0), i0, sp.qend, ldq, (size_t)h * D, D);
    load_tile(sdO, L.ldh, dout, qrow(sp, b, i0), i0, sp.qend, ldq, (size_t)h * D, D);
    for (int e = threadIdx.x; e < WB * L.ldo; e += WT) sdQ[e] = 0.0f;
    if (threadIdx.x < WB) {
        const int i = i0 + threadIdx.x;
        sL[threadIdx.x] = i < sp.qend ? lse[((size_t)b * Hq + h) * T_ + i] : 0.0f;
        sDi[threadIdx.x] = i < sp.qend ? Di[((size_t)b * Hq + h) * T_ + i] : 0.0f;
        sLo[threadIdx.x] = i < sp.qend ? att_lo(i, window, drow) : 0;
    }
    const int jend = i0 + WB < sp.qend ? i0 + WB : sp.qend;
    for (int j0 = att_first_tile(i0, T_, WB, window, drow); j0 < jend; j0 += WB) {
        __syncthreads();
        load_tile(sK, L.ldh, k, (size_t)b * T_ + j0, j0, T_, ldk, (size_t)hk * D, D);
        load_tile(sV, L.ldh, v, (size_t)b * T_ + j0, j0, T_, ldk, (size_t)hk * D, D);
        __syncthreads();
        tile_qkT(sS + r0 * L.lds, L.lds, sQ + r0 * L.ldh, sK, L.ldh, D);
        tile_qkT(sdP + r0 * L.lds, L.lds, sdO + r0 * L.ldh, sV, L.ldh, D);
        __syncwarp();
        wmma_probs(nullptr, sdS, sS, sdP, sL, sDi, sLo, L, r0, i0, j0, sp.qend, scale);
        __syncwarp();
        for (int nt = 0; nt < D / 16; nt++) {
            FragC acc;
            wmma::load_matrix_sync(acc, sdQ + r0 * L.ldo + nt * 16, L.ldo, wmma::mem_row_major);
            for (int kk = 0; kk < WB / 16; kk++) {
                FragA fa;
                FragB fb;
                wmma::load_matrix_sync(fa, sdS + r0 * L.ldp + kk * 16, L.ldp);
                wmma::load_matrix_sync(fb, sK + kk * 16 * L.ldh + nt * 16, L.ldh);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(sdQ + r0 * L.ldo + nt * 16, acc, L.ldo, wmma::mem_row_major);
        }
    }
    __syncwarp();
    for (int e = threadIdx.x & 31; e < 16 * D; e += 32) {
        const int r = r0 + e / D, d = e % D, i = i0 + r;
        if (i < sp.qend) dq[qrow(sp, b, i) * ldq + (size_t)h * D + d] = __float2bfloat16_rn(sdQ[r * L.ldo + d]);
    }
}

static size_t wmma_dq_smem(int D) {
    const WLayout L = wlayout(D);
    return (size_t)WB * (4 * L.ldh * 2 + L.ldo * 4 + 2 * L.lds * 4 + L.ldp * 2 + 3 * 4);
}

// Raises a kernel's dynamic shared-memory limit when it needs more than the default 48 KiB.
template <class K> static void smem_optin(CudaCtx *c, K kernel, size_t bytes, int D) {
    if (bytes > c->smem_optin)
        fail("attention: head_dim %d needs %zu bytes of shared memory per block; this GPU allows %zu",
             D, bytes, c->smem_optin);
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// ==== mma path (the default; LLMC_ATT_MMA=0: WMMA) ==========================================
// FlashAttention-2's forward with PTX mma.sync m16n8k16 (bf16 in, fp32 accumulate): a warp owns
// 16 query rows and keeps its Q fragments, scores, probabilities and output accumulators in
// registers, so the softmax rescaling is done where the products land (the score tile's
// accumulator layout is the probability tile's A-operand layout: no shared-memory round trip).
// Shared memory holds Q, one K tile and one V tile, all row-major; fragments come through ldmatrix
// (V's through .trans). Written after the first GPU run (2026-11-27: the WMMA forward ran at 24-34
// TFLOP/s); on the H200 (2026-11-28, random inputs) 109-122 TFLOP/s forward, 75-106 backward.
#define MB 64   // query rows per block (4 warps x 16) and keys per tile
#define MT 128
// Scores go through exp2f in log2 units (scale * log2 e folded into the score, the saved lse
// turned into log2 units when loaded): one ex2 and no range reduction, where expf is several
// instructions for each of the T^2 / 2 scores. The lse written stays a natural log, as on every path.
#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f

// d += a b for one warp (fragment layout: the PTX ISA's m16n8k16; dev/cuda/emu implements the
// same layout, see mma_bf16_16816 in cuda_emu.cpp)
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef LLMC_EMU
    emu::mma_bf16_16816(d, a, b);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
// ldmatrix .x4: four 8 x 8 bf16 matrices from shared memory in one warp instruction; lane 8 i + r
// passes the address of row r of matrix i (16-byte aligned) and receives in d[i] the pair (l / 4,
// 2 (l % 4) .. +1) of each, (2 (l % 4) .. +1, l / 4) with .trans: the mma fragment layouts, so
// tiles stay row-major in shared memory and nothing is transposed by hand. The "memory" clobber
// keeps the loads after the __syncthreads that publish the tile. (The emulator's
// emu::ldmatrix_x4 implements the same layout.)
__device__ __forceinline__ void ldsm_x4(uint32_t d[4], const bf16 *row, int trans) {
#ifdef LLMC_EMU
    emu::ldmatrix_x4(d, row, trans);
#else
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a) : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a) : "memory");
#endif
}
// cp.async (sm_80 on): a global -> shared copy that does not pass through registers and does not
// stall the thread; commit_group closes the thread's copies so far into a group, wait_group n
// returns once at most the n latest groups are still in flight (then a barrier publishes them to
// the block). The pipelined kernels (LLMC_ATT_PIPELINE=1) load the next tile this way while the
// current one is multiplied. (The emulator holds each copy back until its wait: cuda_emu.h.)
template <int N> __device__ __forceinline__ void cp_async(void *dst, const void *src) {  // N bytes: 4, 8 or 16
#ifdef LLMC_EMU
    emu::cp_async(dst, src, N);
#else
    if (N == 16)  // .cg: through L2 only (the tiles are read once per block)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                     "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                     "l"(src), "n"(N) : "memory");
#endif
}
__device__ __forceinline__ void cp_commit() {
#ifdef LLMC_EMU
    emu::cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void cp_wait() {
#ifdef LLMC_EMU
    emu::cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
// load_tile through cp.async: rows past T are zeroed with ordinary stores, the rest in flight
// until the caller's cp_wait and barrier.
__device__ __forceinline__ void load_tile_async(bf16 *dst, int ldh, const bf16 *src, size_t row0, int r0, int T_,
                                                size_t ld, size_t col, int D) {
    const int per = D / 8;
    for (int e = threadIdx.x; e < MB * per; e += MT) {
        const int r = e / per, c8 = (e % per) * 8;
        if (r0 + r < T_) cp_async<16>(dst + r * ldh + c8, src + (row0 + r) * ld + col + c8);
        else *reinterpret_cast<Raw16 *>(dst + r * ldh + c8) = Raw16{{0u, 0u, 0u, 0u}};
    }
}

// The forward's and dQ's walk over key tiles: K then V of tile j0 at dst (ordinary loads, or with
// ASYNC copies in flight until the caller's cp_wait and barrier).
template <int D, bool ASYNC>
__device__ __forceinline__ void att_kv_copy(bf16 *dst, const bf16 *k, const bf16 *v, int b, int j0, int T_, size_t ldk,
                                            int hk) {
    constexpr int LDH = D + 8;
    const size_t row = (size_t)b * T_ + j0, col = (size_t)hk * D;
    if (ASYNC) {
        load_tile_async(dst, LDH, k, row, j0, T_, ldk, col, D);
        load_tile_async(dst + MB * LDH, LDH, v, row, j0, T_, ldk, col, D);
    } else {
        load_tile(dst, LDH, k, row, j0, T_, ldk, col, D);
        load_tile(dst + MB * LDH, LDH, v, row, j0, T_, ldk, col, D);
    }
}
// Makes key tile j0 ready in buffer buf of sK0 between two barriers. Without P it is loaded
// there; with P it is already in flight (issued a step earlier, or before the loop): the next
// tile goes into the other buffer (whose readers the first barrier waits for), then this one's
// copies are waited for.
template <int D, bool P>
__device__ __forceinline__ void att_kv_step(bf16 *sK0, int buf, int j0, int jend, const bf16 *k, const bf16 *v, int b,
                                            int T_, size_t ldk, int hk) {
    constexpr int LDH = D + 8;
    __syncthreads();  // the previous tile's readers are done
    if (P) {
        if (j0 + MB < jend) att_kv_copy<D, true>(sK0 + (buf ^ 1) * 2 * MB * LDH, k, v, b, j0 + MB, T_, ldk, hk);
        cp_commit();
        cp_wait<1>();
    } else {
        att_kv_copy<D, false>(sK0 + buf * 2 * MB * LDH, k, v, b, j0, T_, ldk, hk);
    }
    __syncthreads();
}

__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
    const bf16 a = __float2bfloat16_rn(lo), b = __float2bfloat16_rn(hi);
    return (uint32_t)*reinterpret_cast<const uint16_t *>(&a) | ((uint32_t)*reinterpret_cast<const uint16_t *>(&b) << 16);
}
// The A fragment of rows [r, r + 16) and columns [c, c + 16) of a bf16 tile (row stride ld): the
// matrices (r, c), (r + 8, c), (r, c + 8), (r + 8, c + 8).
__device__ __forceinline__ void ld_afrag(uint32_t a[4], const bf16 *tile, int ld, int r, int c) {
    const int lane = threadIdx.x & 31;
    ldsm_x4(a, tile + (r + (lane & 15)) * ld + c + (lane >> 4) * 8, 0);
}
// acc[0] and acc[1] (n-tiles [n0, n0 + 8) and [n0 + 8, n0 + 16)) += A B over k in [k0, k0 + 16),
// both B fragments from one ldmatrix.x4: B(k, n) = tile[n][k] (the reduced dim along the tile's
// rows: K for S = Q K^T), or with trans B(k, n) = tile[k][n] (a row-major tile read down its
// columns: V for O = P V, through .trans).
__device__ __forceinline__ void mma_x2(float (*acc)[4], const uint32_t a[4], const bf16 *tile, int ld, int n0, int k0,
                                       int trans) {
    const int lane = threadIdx.x & 31;
    uint32_t d[4];
    if (trans) ldsm_x4(d, tile + (k0 + (lane & 15)) * ld + n0 + (lane >> 4) * 8, 1);
    else ldsm_x4(d, tile + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8, 0);
    const uint32_t b0[2] = {d[0], d[1]}, b1[2] = {d[2], d[3]};
    mma_16816(acc[0], a, b0);
    mma_16816(acc[1], a, b1);
}

// The A fragment (bf16) of columns [16 ks, 16 ks + 16) of a 16-row accumulator tile held as
// n-tiles of 8 columns (acc[nt][4], mma's D layout): a product's result is the next product's
// A operand without a trip through shared memory (D's layout of two adjacent n-tiles is A's).
__device__ __forceinline__ void acc_afrag(uint32_t a[4], const float (*acc)[4], int ks) {
    a[0] = pack_pair(acc[2 * ks][0], acc[2 * ks][1]), a[1] = pack_pair(acc[2 * ks][2], acc[2 * ks][3]);
    a[2] = pack_pair(acc[2 * ks + 1][0], acc[2 * ks + 1][1]), a[3] = pack_pair(acc[2 * ks + 1][2], acc[2 * ks + 1][3]);
}

// P (LLMC_ATT_PIPELINE=1): two K/V buffers, the next tile's copies in flight (cp.async) while
// the current one is multiplied; the same arithmetic in the same order, so the same bits.
// CAP (Gemma 2's soft-capped scores, cap tanh(s / cap) of the scaled score; its own instances, so
// the uncapped kernels are compiled as before): cap is the cap.
template <int D, bool P, bool CAP>
__global__ void __launch_bounds__(MT) att_fwd_mma(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                                                 int T_, AttSpan sp, int Hq, int Hkv, float scale, int window,
                                                 const int32_t *doc_start, float cap) {
    DYNAMIC_SMEM(smem);
    constexpr int LDH = D + 8;  // padded rows (elements): 16-byte aligned; ldmatrix's 8 rows hit 8 bank groups
    const float sl2 = scale * ATT_LOG2E;
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (Hq / Hkv), i0 = sp.q0 + qb * MB, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3, r0 = 16 * warp;
    const size_t ldq = (size_t)Hq * D, ldk = (size_t)Hkv * D;
    const int32_t *drow = doc_start ? doc_start + (size_t)b * T_ : nullptr;
    bf16 *sQ = (bf16 *)smem, *sK0 = sQ + MB * LDH;  // then K, V (and with P a second K, V)
    int *sLo = (int *)(sK0 + (P ? 4 : 2) * MB * LDH);
    load_tile(sQ, LDH, q, qrow(sp, b, i0), i0, sp.qend, ldq, (size_t)h * D, D);
    for (int e = threadIdx.x; e < MB; e += MT) sLo[e] = i0 + e < sp.qend ? att_lo(i0 + e, window, drow) : 0;
    __syncthreads();
    uint32_t qa[D / 16][4];  // this warp's 16 rows of Q as A fragments
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) ld_afrag(qa[kk], sQ, LDH, r0, kk * 16);
    float o[D / 8][4];
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    // rows g and g + 8 of the warp: running max (same in the 4 lanes of a quad) and this lane's
    // part of the running sum (its columns; the quad's parts are added at the end)
    float m_run[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.0f, 0.0f};
    const int ia = i0 + r0 + g, ib = ia + 8, loa = sLo[r0 + g], lob = sLo[r0 + g + 8];
    const int jend = i0 + MB < sp.qend ? i0 + MB : sp.qend, jfirst = att_first_tile(i0, T_, MB, window, drow);
    if (P && jfirst < jend) att_kv_copy<D, true>(sK0, k, v, b, jfirst, T_, ldk, hk), cp_commit();
    for (int j0 = jfirst, buf = 0; j0 < jend; j0 += MB, buf ^= P) {
        bf16 *sK = sK0 + buf * 2 * MB * LDH, *sV = sK + MB * LDH;
        att_kv_step<D, P>(sK0, buf, j0, jend, k, v, b, T_, ldk, hk);
        float s[MB / 8][4];  // scores: key tile nt, (row g | g+8, key 2t | 2t+1)
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt += 2) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            s[nt + 1][0] = s[nt + 1][1] = s[nt + 1][2] = s[nt + 1][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                mma_x2(&s[nt], qa[kk], sK, LDH, nt * 8, kk * 16, 0);
            }
        }
        float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = j0 + nt * 8 + 2 * t + (e & 1), i = e < 2 ? ia : ib, lo = e < 2 ? loa : lob;
                s[nt][e] = j <= i && j < T_ && j >= lo
                               ? (CAP ? soft_cap(s[nt][e] * scale, cap) * ATT_LOG2E : s[nt][e] * sl2)
                               : -INFINITY;
                mt[e >> 1] = fmaxf(mt[e >> 1], s[nt][e]);
            }
        float corr[2], mnew[2];
#pragma unroll
        for (int x = 0; x < 2; x++) {
            mt[x] = fmaxf(mt[x], __shfl_xor_sync(0xffffffffu, mt[x], 1));
            mt[x] = fmaxf(mt[x], __shfl_xor_sync(0xffffffffu, mt[x], 2));
            mnew[x] = fmaxf(m_run[x], mt[x]);
            corr[x] = mnew[x] == -INFINITY ? 1.0f : exp2f(m_run[x] - mnew[x]);  // nothing visible yet: 1
            m_run[x] = mnew[x];
            l_part[x] *= corr[x];
        }
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = s[nt][e] == -INFINITY ? 0.0f : exp2f(s[nt][e] - mnew[e >> 1]);
                s[nt][e] = p;
                l_part[e >> 1] += p;
            }
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) o[nd][0] *= corr[0], o[nd][1] *= corr[0], o[nd][2] *= corr[1], o[nd][3] *= corr[1];
#pragma unroll
        for (int ks = 0; ks < MB / 16; ks++) {  // O += P V, 16 keys at a time; P rounded to bf16
            uint32_t pa[4];
            acc_afrag(pa, s, ks);
#pragma unroll
            for (int nd = 0; nd < D / 8; nd += 2) {
                mma_x2(&o[nd], pa, sV, LDH, nd * 8, ks * 16, 1);
            }
        }
    }
    float l[2];
#pragma unroll
    for (int x = 0; x < 2; x++) {
        l[x] = l_part[x] + __shfl_xor_sync(0xffffffffu, l_part[x], 1);
        l[x] += __shfl_xor_sync(0xffffffffu, l[x], 2);
    }
#pragma unroll
    for (int x = 0; x < 2; x++) {
        const int i = x ? ib : ia;
        if (i >= sp.qend) continue;
        const float inv = 1.0f / l[x];
        bf16 *orow = out + qrow(sp, b, i) * ldq + (size_t)h * D;
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) {
            orow[nd * 8 + 2 * t] = __float2bfloat16_rn(o[nd][2 * x] * inv);
            orow[nd * 8 + 2 * t + 1] = __float2bfloat16_rn(o[nd][2 * x + 1] * inv);
        }
        if (t == 0) lse[((size_t)b * Hq + h) * T_ + i] = m_run[x] * ATT_LN2 + logf(l[x]);  // natural log, as every path
    }
}

static size_t mma_fwd_smem(int D, bool P) { return sizeof(bf16) * (size_t)(P ? 5 : 3) * MB * (D + 8) + MB * sizeof(int); }
// The backward's: dK/dV and dQ hold the same four tiles (K, V, Q, dO; with P two more) and the rows'
// lse, D and first key (twice with P).
static size_t mma_bwd_smem(int D, bool P) {
    return sizeof(bf16) * (size_t)(P ? 6 : 4) * MB * (D + 8) + (P ? 2 : 1) * MB * (2 * sizeof(float) + sizeof(int));
}
// The pipelined kernels where their two buffers fit (an H100's 227 KiB: every head dim up to 128).
static int att_pipelined(const CudaCtx *c, int D) {
    return c->att_pipeline && mma_bwd_smem(D, true) <= c->smem_optin && mma_fwd_smem(D, true) <= c->smem_optin;
}

template <int D, bool P, bool CAP>
static void launch_fwd_mma_p(CudaCtx *c, void *out, float *lse, const void *q, const void *k, const void *v, int B,
                             int T, AttSpan sp, int Hq, int Hkv, float scale, int window, const int32_t *doc_start,
                             float cap) {
    const size_t sm = mma_fwd_smem(D, P);
    smem_optin(c, att_fwd_mma<D, P, CAP>, sm, D);
    dim3 g((sp.nq + MB - 1) / MB, Hq, B);
    LAUNCH(g, MT, sm, c->stream, att_fwd_mma<D, P, CAP>)((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, T, sp, Hq, Hkv, scale, window, doc_start, cap);
}
template <int D>
static void launch_fwd_mma(CudaCtx *c, void *out, float *lse, const void *q, const void *k, const void *v, int B,
                           int T, AttSpan sp, int Hq, int Hkv, float scale, int window, const int32_t *doc_start,
                           float cap) {
    if (cap > 0.0f)  // soft-capped: the unpipelined kernel only, as in the backward
        launch_fwd_mma_p<D, false, true>(c, out, lse, q, k, v, B, T, sp, Hq, Hkv, scale, window, doc_start, cap);
    else if (att_pipelined(c, D))
        launch_fwd_mma_p<D, true, false>(c, out, lse, q, k, v, B, T, sp, Hq, Hkv, scale, window, doc_start, 0.0f);
    else launch_fwd_mma_p<D, false, false>(c, out, lse, q, k, v, B, T, sp, Hq, Hkv, scale, window, doc_start, 0.0f);
}

// The backward in the same style (chosen with the forward): the two kernels of the WMMA path,
// each tile product an mma.sync over register fragments. dK/dV: a warp owns 16 keys and computes
// S^T = K Q^T and dP^T = V dO^T for 64 queries at a time, so P^T and dS^T land in registers in
// the A-operand layout of dV += P^T dO and dK += dS^T Q (dO's and Q's B fragments through
// ldmatrix .trans). dQ: a warp owns 16 queries, S = Q K^T and dP = dO V^T in registers, dQ += dS K
// (K's B fragments through .trans).
// P and dS are rounded to bf16 for the products, as on the WMMA path.

// One block's work of each kernel, on the block's dynamic shared memory: att_bwd_mma below runs
// both kinds of block in one grid.
template <int D, bool P, bool CAP>
__device__ __forceinline__ void att_bwd_dkdv_block(unsigned char *smem, int kb, int hk, int b, bf16 *dk, bf16 *dv,
                                                   const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                                                   const float *lse, const float *Di, int T_, AttSpan sp, int Hq,
                                                   int Hkv, float scale, int window, const int32_t *doc_start,
                                                   int accumulate, float *acck, float *accv, int s, int nsplit,
                                                   float *pk, float *pv, float cap) {
    constexpr int LDH = D + 8;
    const float sl2 = scale * ATT_LOG2E;
    const int group = Hq / Hkv, hpart = group / nsplit, h1 = hk * group + s * hpart;
    const int j0 = kb * MB, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = 16 * warp;
    if (accumulate && j0 >= sp.qend) return;  // no query of the span sees these keys
    const int jlast = (j0 + MB < T_ ? j0 + MB : T_) - 1;
    const int32_t *drow = doc_start ? doc_start + (size_t)b * T_ : nullptr;
    const size_t ldq = (size_t)Hq * D, ldk = (size_t)Hkv * D;
    // K, V; then per buffer (two with P) a Q and a dO tile; then per buffer the rows' lse, D, lo
    bf16 *sK = (bf16 *)smem, *sV = sK + MB * LDH, *sQ0 = sV + MB * LDH;
    float *sL0 = (float *)(sQ0 + (P ? 4 : 2) * MB * LDH);
    load_tile(sK, LDH, k, (size_t)b * T_ + j0, j0, T_, ldk, (size_t)hk * D, D);
    load_tile(sV, LDH, v, (size_t)b * T_ + j0, j0, T_, ldk, (size_t)hk * D, D);
    float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[nd][e] = dva[nd][e] = 0.0f;
    const int ja = j0 + r0 + g, jb = ja + 8;
    // The steps: each head of the part, and for it each query tile from the diagonal on that sees
    // the keys (lo is non-decreasing, so they are the first ni; the same for every head)
    const int ifirst = j0 > sp.q0 ? j0 : sp.q0;
    int ni = 0;
    while (ifirst + ni * MB < sp.qend && att_lo(ifirst + ni * MB, window, drow) <= jlast) ni++;
    const int nsteps = ni * hpart;
    // Step st's Q and dO tiles and rows into buffer bb (lse raw: turned into log2 units where read)
    auto stage = [&](int step, int bb) {
        const int h = h1 + step / ni, i0 = ifirst + step % ni * MB;
        bf16 *bQ = sQ0 + bb * 2 * MB * LDH, *bdO = bQ + MB * LDH;
        float *bL = sL0 + bb * 3 * MB, *bDi = bL + MB;
        int *bLo = (int *)(bDi + MB);
        if (P) {
            load_tile_async(bQ, LDH, q, qrow(sp, b, i0), i0, sp.qend, ldq, (size_t)h * D, D);
            load_tile_async(bdO, LDH, dout, qrow(sp, b, i0), i0, sp.qend, ldq, (size_t)h * D, D);
        } else {
            load_tile(bQ, LDH, q, qrow(sp, b, i0), i0, sp.qend, ldq, (size_t)h * D, D);
            load_tile(bdO, LDH, dout, qrow(sp, b, i0), i0, sp.qend, ldq, (size_t)h * D, D);
        }
        for (int e = threadIdx.x; e < MB; e += MT) {
            const int i = i0 + e;
            const size_t o = ((size_t)b * Hq + h) * T_ + i;
            if (i >= sp.qend) bL[e] = bDi[e] = 0.0f;
            else if (P) cp_async<4>(&bL[e], &lse[o]), cp_async<4>(&bDi[e], &Di[o]);
            else bL[e] = lse[o], bDi[e] = Di[o];
            bLo[e] = i < sp.qend ? att_lo(i, window, drow) : 0;
        }
    };
    if (P && nsteps > 0) stage(0, 0), cp_commit();
    for (int step = 0, buf = 0; step < nsteps; step++, buf ^= P) {
        const int i0 = ifirst + step % ni * MB;
        const bf16 *sQ = sQ0 + buf * 2 * MB * LDH, *sdO = sQ + MB * LDH;
        const float *sL = sL0 + buf * 3 * MB, *sDi = sL + MB;
        const int *sLo = (const int *)(sDi + MB);
        __syncthreads();  // the previous step's readers are done
        if (P) {  // the next step into the other buffer, then wait for this one's copies
            if (step + 1 < nsteps) stage(step + 1, buf ^ 1);
            cp_commit();
            cp_wait<1>();
        } else {
            stage(step, 0);
        }
        __syncthreads();
        float st[MB / 8][4], dpt[MB / 8][4];  // this warp's 16 keys x 64 queries
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) st[nt][e] = dpt[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t ak[4], av[4];
            ld_afrag(ak, sK, LDH, r0, kk * 16);
            ld_afrag(av, sV, LDH, r0, kk * 16);
#pragma unroll
            for (int nt = 0; nt < MB / 8; nt += 2) {
                mma_x2(&st[nt], ak, sQ, LDH, nt * 8, kk * 16, 0);
                mma_x2(&dpt[nt], av, sdO, LDH, nt * 8, kk * 16, 0);
            }
        }
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = nt * 8 + 2 * t + (e & 1), i = i0 + col, j = e < 2 ? ja : jb;
                const bool vis = i < sp.qend && j <= i && j < T_ && j >= sLo[col];
                const float sc = CAP ? soft_cap(st[nt][e] * scale, cap) : 0.0f;  // the capped score
                const float p = vis ? exp2f((CAP ? sc * ATT_LOG2E : st[nt][e] * sl2) - __fmul_rn(sL[col], ATT_LOG2E)) : 0.0f;
                dpt[nt][e] = vis ? p * (dpt[nt][e] - sDi[col]) * (CAP ? soft_cap_slope(sc, cap) * scale : scale) : 0.0f;
                st[nt][e] = p;
            }
#pragma unroll
        for (int ks = 0; ks < MB / 16; ks++) {
            uint32_t pa[4], sa[4];
            acc_afrag(pa, st, ks), acc_afrag(sa, dpt, ks);
#pragma unroll
            for (int nd = 0; nd < D / 8; nd += 2) {
                mma_x2(&dva[nd], pa, sdO, LDH, nd * 8, ks * 16, 1);
                mma_x2(&dka[nd], sa, sQ, LDH, nd * 8, ks * 16, 1);
            }
        }
    }
#pragma unroll
    for (int x = 0; x < 2; x++) {
        const int j = x ? jb : ja;
        if (j >= T_) continue;
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const size_t o = ((size_t)b * T_ + j) * ldk + (size_t)hk * D + nd * 8 + 2 * t + e;
                if (pk) pk[o] = dka[nd][2 * x + e], pv[o] = dva[nd][2 * x + e];  // this part's sums
                else att_store_dkdv(dk, dv, acck, accv, o, dka[nd][2 * x + e], dva[nd][2 * x + e], accumulate);
            }
    }
}

template <int D, bool P, bool CAP>
__device__ __forceinline__ void att_bwd_dq_block(unsigned char *smem, int qb, int h, int b, bf16 *dq,
                                                 const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                                                 const float *lse, const float *Di, int T_, AttSpan sp, int Hq,
                                                 int Hkv, float scale, int window, const int32_t *doc_start, float cap) {
    constexpr int LDH = D + 8;
    const float sl2 = scale * ATT_LOG2E;
    const int hk = h / (Hq / Hkv), i0 = sp.q0 + qb * MB, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3, r0 = 16 * warp;
    const size_t ldq = (size_t)Hq * D, ldk = (size_t)Hkv * D;
    const int32_t *drow = doc_start ? doc_start + (size_t)b * T_ : nullptr;
    // Q, dO; then per buffer (two with P) a K and a V tile; then the rows' lse, D, lo
    bf16 *sQ = (bf16 *)smem, *sdO = sQ + MB * LDH, *sK0 = sdO + MB * LDH;
    float *sL = (float *)(sK0 + (P ? 4 : 2) * MB * LDH), *sDi = sL + MB;
    int *sLo = (int *)(sDi + MB);
    load_tile(sQ, LDH, q, qrow(sp, b, i0), i0, sp.qend, ldq, (size_t)h * D, D);
    load_tile(sdO, LDH, dout, qrow(sp, b, i0), i0, sp.qend, ldq, (size_t)h * D, D);
    for (int e = threadIdx.x; e < MB; e += MT) {
        const int i = i0 + e;
        sL[e] = i < sp.qend ? lse[((size_t)b * Hq + h) * T_ + i] * ATT_LOG2E : 0.0f;  // log2 units
        sDi[e] = i < sp.qend ? Di[((size_t)b * Hq + h) * T_ + i] : 0.0f;
        sLo[e] = i < sp.qend ? att_lo(i, window, drow) : 0;
    }
    __syncthreads();
    uint32_t qa[D / 16][4], oa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) ld_afrag(qa[kk], sQ, LDH, r0, kk * 16), ld_afrag(oa[kk], sdO, LDH, r0, kk * 16);
    float dqa[D / 8][4];
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++) dqa[nd][0] = dqa[nd][1] = dqa[nd][2] = dqa[nd][3] = 0.0f;
    const int ia = i0 + r0 + g, ib = ia + 8;
    const float La = sL[r0 + g], Lb = sL[r0 + g + 8], Da = sDi[r0 + g], Db = sDi[r0 + g + 8];
    const int loa = sLo[r0 + g], lob = sLo[r0 + g + 8];
    const int jend = i0 + MB < sp.qend ? i0 + MB : sp.qend, jfirst = att_first_tile(i0, T_, MB, window, drow);
    if (P && jfirst < jend) att_kv_copy<D, true>(sK0, k, v, b, jfirst, T_, ldk, hk), cp_commit();
    for (int j0 = jfirst, buf = 0; j0 < jend; j0 += MB, buf ^= P) {
        bf16 *sK = sK0 + buf * 2 * MB * LDH, *sV = sK + MB * LDH;
        att_kv_step<D, P>(sK0, buf, j0, jend, k, v, b, T_, ldk, hk);
        float s[MB / 8][4], dp[MB / 8][4];
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt += 2) {
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = s[nt + 1][e] = dp[nt + 1][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                mma_x2(&s[nt], qa[kk], sK, LDH, nt * 8, kk * 16, 0);
                mma_x2(&dp[nt], oa[kk], sV, LDH, nt * 8, kk * 16, 0);
            }
        }
#pragma unroll
        for (int nt = 0; nt < MB / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = j0 + nt * 8 + 2 * t + (e & 1), i = e < 2 ? ia : ib, lo = e < 2 ? loa : lob;
                const bool vis = i < sp.qend && j <= i && j < T_ && j >= lo;
                const float sc = CAP ? soft_cap(s[nt][e] * scale, cap) : 0.0f;  // the capped score
                const float p = vis ? exp2f((CAP ? sc * ATT_LOG2E : s[nt][e] * sl2) - (e < 2 ? La : Lb)) : 0.0f;
                s[nt][e] = vis ? p * (dp[nt][e] - (e < 2 ? Da : Db)) * (CAP ? soft_cap_slope(sc, cap) * scale : scale)
                               : 0.0f;  // now dS
            }
#pragma unroll
        for (int ks = 0; ks < MB / 16; ks++) {
            uint32_t sa[4];
            acc_afrag(sa, s, ks);
#pragma unroll
            for (int nd = 0; nd < D / 8; nd += 2) {
                mma_x2(&dqa[nd], sa, sK, LDH, nd * 8, ks * 16, 1);
            }
        }
    }
#pragma unroll
    for (int x = 0; x < 2; x++) {
        const int i = x ? ib : ia;
        if (i >= sp.qend) continue;
        bf16 *row = dq + qrow(sp, b, i) * ldq + (size_t)h * D;
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) {
            row[nd * 8 + 2 * t] = __float2bfloat16_rn(dqa[nd][2 * x]);
            row[nd * 8 + 2 * t + 1] = __float2bfloat16_rn(dqa[nd][2 * x + 1]);
        }
    }
}

// GQA's dK/dV split (LLMC_ATT_KV_SPLIT=N): a dK/dV block walks every query head of its kv
// head's group, so at the 1.1B shape (32 query heads on 4 kv heads, T 4096) there are 256 blocks
// and key tile 0's walks 8 x 64 query tiles: about twice the average, on an H200's 132 SMs two
// blocks each. Split, each (kv head, key tile) becomes nsplit blocks over group / nsplit query
// heads each, which write their float sums to parts [nsplit][B, T, Hkv, D] (dK, then as many for
// dV); att_dkdv_parts_sum adds the parts in order (part 0 first) and stores as the unsplit block
// would. Deterministic, but not the unsplit bits: the sums are grouped differently.
static const size_t ATT_KV_PARTS_MAX_BYTES = (size_t)64 << 20;  // within the plan's kernel-scratch allowance

// The number of parts: the largest divisor of the group at most c->att_kv_split whose parts fit
// ATT_KV_PARTS_MAX_BYTES (1: unsplit). It depends on the shape only, not on the query span, so
// every memory mode (they walk the same spans) splits alike.
static int att_kv_parts(const CudaCtx *c, int B, int T, int Hq, int Hkv, int D) {
    const int group = Hq / Hkv;
    const size_t one = (size_t)2 * B * T * Hkv * D * sizeof(float);  // a part's dK and dV
    for (int n = c->att_kv_split < group ? c->att_kv_split : group; n > 1; n--)
        if (group % n == 0 && one * n <= ATT_KV_PARTS_MAX_BYTES) return n;
    return 1;
}

// dK/dV from the parts; rows of key tiles the span's queries cannot see are left alone when
// accumulating, as the unsplit block leaves them.
__global__ void att_dkdv_parts_sum(bf16 *dk, bf16 *dv, float *acck, float *accv, const float *parts, int nsplit,
                                   size_t n, int T_, int ldk, int qend, int accumulate) {
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < n; o += (size_t)gridDim.x * blockDim.x) {
        const int j = (int)(o / (size_t)ldk % (size_t)T_);
        if (accumulate && j / MB * MB >= qend) continue;
        float gk = parts[o], gv = parts[(size_t)nsplit * n + o];
        for (int s = 1; s < nsplit; s++) gk += parts[(size_t)s * n + o], gv += parts[(size_t)(nsplit + s) * n + o];
        att_store_dkdv(dk, dv, acck, accv, o, gk, gv, accumulate);
    }
}

// The backward's blocks in one list: every dK/dV block (key tile 0 of every (row, kv head, part)
// first, the longest: it walks every later query tile of every head of its group or part), then
// every dQ block (heaviest query tile first). ROLE 1 runs the dK/dV blocks, ROLE 2 the dQ blocks
// (two kernels, each with its own register allocation, one after the other: the default); ROLE 0
// runs the whole list in one grid (LLMC_ATT_BWD_ONE_GRID=1), where dQ blocks fill the SMs that
// the last, longest dK/dV blocks leave idle. The blocks write disjoint outputs, so neither the
// order nor the grid changes a bit. parts: NULL unsplit, else nsplit parts (see above).
// Pipelined (P), at least 2 blocks an SM: left to itself ptxas gave D 64's dK/dV 168 registers and
// 156 bytes of spill; asked for 2 blocks it uses 237 and spills nothing (0: no minimum, so the
// unpipelined kernels keep the registers they ran with on the H200).
template <int D, int ROLE, bool P, bool CAP>
__global__ void __launch_bounds__(MT, P ? 2 : 0) att_bwd_mma(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q,
                                                 const bf16 *k, const bf16 *v, const float *lse, const float *Di,
                                                 int B_, int T_, AttSpan sp, int Hq, int Hkv, float scale, int window,
                                                 const int32_t *doc_start, int accumulate, float *acck, float *accv,
                                                 int nsplit, float *parts, float cap) {
    DYNAMIC_SMEM(smem);
    const int nkv = Hkv * nsplit;  // dK/dV blocks per (row, key tile)
    int id = (int)blockIdx.x, kb = blockIdx.z, b = blockIdx.y;
    if (ROLE == 0) {  // one grid: the whole list
        const int n1 = (T_ + MB - 1) / MB * nkv * B_;
        if (id >= n1) {
            const int i = id - n1, nqb = (sp.nq + MB - 1) / MB, r = i % (Hq * B_);
            att_bwd_dq_block<D, P, CAP>(smem, nqb - 1 - i / (Hq * B_), r % Hq, r / Hq, dq, dout, q, k, v, lse, Di, T_, sp,
                                     Hq, Hkv, scale, window, doc_start, cap);
            return;
        }
        kb = id / (nkv * B_), b = id % (nkv * B_) / nkv, id %= nkv;
    }
    if (ROLE == 2) {  // grid (Hq, B, query tiles): the last (heaviest) query tile first
        att_bwd_dq_block<D, P, CAP>(smem, gridDim.z - 1 - blockIdx.z, blockIdx.x, blockIdx.y, dq, dout, q, k, v, lse, Di,
                                 T_, sp, Hq, Hkv, scale, window, doc_start, cap);
        return;
    }
    // ROLE 1: grid (Hkv x parts, B, key tiles): key tile 0 of every (row, kv head, part) first
    const int hk = id / nsplit, s = id % nsplit;
    const size_t n = (size_t)B_ * T_ * Hkv * D;
    float *pk = parts ? parts + (size_t)s * n : nullptr, *pv = parts ? parts + (size_t)(nsplit + s) * n : nullptr;
    att_bwd_dkdv_block<D, P, CAP>(smem, kb, hk, b, dk, dv, dout, q, k, v, lse, Di, T_, sp, Hq, Hkv, scale, window,
                               doc_start, accumulate, acck, accv, s, nsplit, pk, pv, cap);
}

template <int D, bool P, bool CAP>
static void launch_bwd_mma_p(CudaCtx *c, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                             const void *v, const float *lse, const float *Di, int B, int T, AttSpan sp, int Hq, int Hkv,
                             float scale, int window, const int32_t *doc_start, int accumulate, float *acck, float *accv,
                             float cap) {
    const size_t smem = mma_bwd_smem(D, P);
    const int nsplit = att_kv_parts(c, B, T, Hq, Hkv, D);
    const size_t n = (size_t)B * T * Hkv * D;
    float *parts = nsplit > 1 ? (float *)ctx_scratch(c, SCR_ATT_KV, 2 * nsplit * n * sizeof(float)) : nullptr;
    const int n1 = (T + MB - 1) / MB * Hkv * nsplit * B, n2 = (sp.nq + MB - 1) / MB * Hq * B;
#define ATT_BWD_ARGS (bf16 *)dq, (bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, \
        (const bf16 *)v, lse, Di, B, T, sp, Hq, Hkv, scale, window, doc_start, accumulate, acck, accv, nsplit, parts, cap
    if (c->att_bwd_one_grid) {
        smem_optin(c, att_bwd_mma<D, 0, P, CAP>, smem, D);
        LAUNCH(dim3(n1 + n2), MT, smem, c->stream, att_bwd_mma<D, 0, P, CAP>)(ATT_BWD_ARGS);
    } else {
        smem_optin(c, att_bwd_mma<D, 1, P, CAP>, smem, D);
        smem_optin(c, att_bwd_mma<D, 2, P, CAP>, smem, D);
        LAUNCH(dim3(Hkv * nsplit, B, (T + MB - 1) / MB), MT, smem, c->stream, att_bwd_mma<D, 1, P, CAP>)(ATT_BWD_ARGS);
        LAUNCH(dim3(Hq, B, (sp.nq + MB - 1) / MB), MT, smem, c->stream, att_bwd_mma<D, 2, P, CAP>)(ATT_BWD_ARGS);
    }
#undef ATT_BWD_ARGS
    if (parts) {
        const unsigned blocks = (unsigned)((n + 255) / 256 < 8192 ? (n + 255) / 256 : 8192);
        LAUNCH(blocks, 256, 0, c->stream, att_dkdv_parts_sum)((bf16 *)dk, (bf16 *)dv, acck, accv, parts, nsplit, n, T,
                                                              Hkv * D, sp.qend, accumulate);
    }
}
template <int D>
static void launch_bwd_mma(CudaCtx *c, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                           const void *v, const float *lse, const float *Di, int B, int T, AttSpan sp, int Hq, int Hkv,
                           float scale, int window, const int32_t *doc_start, int accumulate, float *acck, float *accv,
                           float cap) {
    if (cap > 0.0f)  // soft-capped: the unpipelined kernels only (fewer instances to compile)
        launch_bwd_mma_p<D, false, true>(c, dq, dk, dv, dout, q, k, v, lse, Di, B, T, sp, Hq, Hkv, scale, window,
                                         doc_start, accumulate, acck, accv, cap);
    else if (att_pipelined(c, D))
        launch_bwd_mma_p<D, true, false>(c, dq, dk, dv, dout, q, k, v, lse, Di, B, T, sp, Hq, Hkv, scale, window, doc_start,
                                         accumulate, acck, accv, 0.0f);
    else
        launch_bwd_mma_p<D, false, false>(c, dq, dk, dv, dout, q, k, v, lse, Di, B, T, sp, Hq, Hkv, scale, window,
                                          doc_start, accumulate, acck, accv, 0.0f);
}

// ==== dispatch ===============================================================================
static int use_wmma(const CudaCtx *c, int D, const void *const *ptrs, int np) {
    if (!c->bf16 || c->force_generic_attention || D % 16 != 0 || D > 128) return 0;
    for (int i = 0; i < np; i++)
        if (ptr_align(ptrs[i]) < 16) return 0;
    return wmma_dkdv_smem(D) <= c->smem_optin;  // the largest of the three
}
// The mma kernels (the default) where the WMMA path would run and the head dim has an instance.
static int use_mma(const CudaCtx *c, int D, const void *const *ptrs, int np) {
    return c->mma_attention && (D == 16 || D == 32 || D == 64 || D == 96 || D == 128) && use_wmma(c, D, ptrs, np);
}

// The path's name, with the mma backward's opt-in variants (the config box and dev/cuda name them).
const char *k_attention_path(const CudaCtx *c, int D) {
    const void *dummy[1] = {(const void *)(uintptr_t)256};
    if (!use_mma(c, D, dummy, 1)) return use_wmma(c, D, dummy, 1) ? "wmma-bf16" : "generic";
    static char name[96];
    snprintf(name, sizeof name, "mma-bf16%s%s", att_pipelined(c, D) ? ", pipelined" : "",
             c->att_bwd_one_grid ? ", backward in one grid" : "");
    if (c->att_kv_split > 1)
        snprintf(name + strlen(name), sizeof name - strlen(name), ", GQA dK/dV in up to %d parts", c->att_kv_split);
    return name;
}

void k_attention_fwd(CudaCtx *c, void *out, float *lse, const void *q, const void *k, const void *v,
                     int B, int T, int q0, int nq, int Hq, int Hkv, int D, int window, const int32_t *doc_start,
                     float scale, float softcap) {
    if (B <= 0 || T <= 0 || nq <= 0) return;
    if (!(scale > 0.0f)) scale = att_scale(D);
    const AttSpan sp = {q0, q0 + nq, nq};
    const void *ptrs[] = {out, q, k, v};
    // Soft-capped scores: the mma kernels' capped instances, else the generic kernels (the WMMA
    // ones do not cap).
    const bool mma = use_mma(c, D, ptrs, 4), wmma = softcap <= 0.0f && !mma && use_wmma(c, D, ptrs, 4);
    if (mma) {
        switch (D) {
        case 16: launch_fwd_mma<16>(c, out, lse, q, k, v, B, T, sp, Hq, Hkv, scale, window, doc_start, softcap); break;
        case 32: launch_fwd_mma<32>(c, out, lse, q, k, v, B, T, sp, Hq, Hkv, scale, window, doc_start, softcap); break;
        case 64: launch_fwd_mma<64>(c, out, lse, q, k, v, B, T, sp, Hq, Hkv, scale, window, doc_start, softcap); break;
        case 96: launch_fwd_mma<96>(c, out, lse, q, k, v, B, T, sp, Hq, Hkv, scale, window, doc_start, softcap); break;
        default: launch_fwd_mma<128>(c, out, lse, q, k, v, B, T, sp, Hq, Hkv, scale, window, doc_start, softcap); break;
        }
    } else if (wmma) {
        const size_t sm = wmma_fwd_smem(D);
        smem_optin(c, att_fwd_wmma, sm, D);
        dim3 g((nq + WB - 1) / WB, Hq, B);
        LAUNCH(g, WT, sm, c->stream, att_fwd_wmma)((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, T, sp, Hq, Hkv, D, scale, window, doc_start);
    } else {
        const size_t sm = generic_fwd_smem(D);
        dim3 g((nq + GB - 1) / GB, Hq, B);
        if (c->bf16) {
            smem_optin(c, att_fwd_generic<bf16>, sm, D);
            LAUNCH(g, GT, sm, c->stream, att_fwd_generic<bf16>)((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, T, sp, Hq, Hkv, D, scale, window, doc_start, softcap);
        } else {
            smem_optin(c, att_fwd_generic<float>, sm, D);
            LAUNCH(g, GT, sm, c->stream, att_fwd_generic<float>)((float *)out, lse, (const float *)q, (const float *)k, (const float *)v, T, sp, Hq, Hkv, D, scale, window, doc_start, softcap);
        }
    }
    LAUNCH_CHECK("attention_fwd");
}

void k_attention_bwd(CudaCtx *c, void *dq, void *dk, void *dv, const void *dout, const void *q,
                     const void *k, const void *v, const void *out, const float *lse, int B, int T, int q0,
                     int nq, int Hq, int Hkv, int D, int window, const int32_t *doc_start, int accumulate,
                     float *acck, float *accv, float scale, float softcap) {
    if (B <= 0 || T <= 0 || nq <= 0) return;
    if (!(scale > 0.0f)) scale = att_scale(D);
    const AttSpan sp = {q0, q0 + nq, nq};
    float *Di = (float *)ctx_scratch(c, SCR_ATT_D, (size_t)B * Hq * T * sizeof(float));
    const size_t rows = (size_t)B * nq * Hq;
    const unsigned dot_blocks = (unsigned)((rows + 7) / 8);
    if (c->bf16) LAUNCH(dot_blocks, 256, 0, c->stream, att_bwd_dot<bf16>)(Di, (const bf16 *)dout, (const bf16 *)out, B, T, sp, Hq, D);
    else LAUNCH(dot_blocks, 256, 0, c->stream, att_bwd_dot<float>)(Di, (const float *)dout, (const float *)out, B, T, sp, Hq, D);
    LAUNCH_CHECK("attention_bwd dot");
    const void *ptrs[] = {dq, dk, dv, dout, q, k, v};
    const bool mma = use_mma(c, D, ptrs, 7), wmma = softcap <= 0.0f && !mma && use_wmma(c, D, ptrs, 7);
    if (mma) {
        switch (D) {
        case 16: launch_bwd_mma<16>(c, dq, dk, dv, dout, q, k, v, lse, Di, B, T, sp, Hq, Hkv, scale, window, doc_start, accumulate, acck, accv, softcap); break;
        case 32: launch_bwd_mma<32>(c, dq, dk, dv, dout, q, k, v, lse, Di, B, T, sp, Hq, Hkv, scale, window, doc_start, accumulate, acck, accv, softcap); break;
        case 64: launch_bwd_mma<64>(c, dq, dk, dv, dout, q, k, v, lse, Di, B, T, sp, Hq, Hkv, scale, window, doc_start, accumulate, acck, accv, softcap); break;
        case 96: launch_bwd_mma<96>(c, dq, dk, dv, dout, q, k, v, lse, Di, B, T, sp, Hq, Hkv, scale, window, doc_start, accumulate, acck, accv, softcap); break;
        default: launch_bwd_mma<128>(c, dq, dk, dv, dout, q, k, v, lse, Di, B, T, sp, Hq, Hkv, scale, window, doc_start, accumulate, acck, accv, softcap); break;
        }
    } else if (wmma) {
        const size_t s1 = wmma_dkdv_smem(D), s2 = wmma_dq_smem(D);
        smem_optin(c, att_bwd_dkdv_wmma, s1, D);
        smem_optin(c, att_bwd_dq_wmma, s2, D);
        dim3 g1((T + WB - 1) / WB, Hkv, B), g2((nq + WB - 1) / WB, Hq, B);
        LAUNCH(g1, WT, s1, c->stream, att_bwd_dkdv_wmma)((bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, lse, Di, T, sp, Hq, Hkv, D, scale, window, doc_start, accumulate, acck, accv);
        LAUNCH(g2, WT, s2, c->stream, att_bwd_dq_wmma)((bf16 *)dq, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, lse, Di, T, sp, Hq, Hkv, D, scale, window, doc_start);
    } else {
        const size_t s1 = generic_dkdv_smem(D), s2 = generic_dq_smem(D);
        dim3 g1((T + GB - 1) / GB, Hkv, B), g2((nq + GB - 1) / GB, Hq, B);
        if (c->bf16) {
            smem_optin(c, att_bwd_dkdv_generic<bf16>, s1, D);
            smem_optin(c, att_bwd_dq_generic<bf16>, s2, D);
            LAUNCH(g1, GT, s1, c->stream, att_bwd_dkdv_generic<bf16>)((bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, lse, Di, T, sp, Hq, Hkv, D, scale, window, doc_start, accumulate, acck, accv, softcap);
            LAUNCH(g2, GT, s2, c->stream, att_bwd_dq_generic<bf16>)((bf16 *)dq, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, lse, Di, T, sp, Hq, Hkv, D, scale, window, doc_start, softcap);
        } else {
            smem_optin(c, att_bwd_dkdv_generic<float>, s1, D);
            smem_optin(c, att_bwd_dq_generic<float>, s2, D);
            LAUNCH(g1, GT, s1, c->stream, att_bwd_dkdv_generic<float>)((float *)dk, (float *)dv, (const float *)dout, (const float *)q, (const float *)k, (const float *)v, lse, Di, T, sp, Hq, Hkv, D, scale, window, doc_start, accumulate, acck, accv, softcap);
            LAUNCH(g2, GT, s2, c->stream, att_bwd_dq_generic<float>)((float *)dq, (const float *)dout, (const float *)q, (const float *)k, (const float *)v, lse, Di, T, sp, Hq, Hkv, D, scale, window, doc_start, softcap);
        }
    }
    LAUNCH_CHECK("attention_bwd");
}
