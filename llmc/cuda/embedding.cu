// embedding.cu: token embedding forward, and a deterministic backward.
// Run on one GPU once (H200, 2026-11-27: dev/results/gpu_h200_2026-11-27/).
//
// Backward: dtable[tok[n]] += dout[n] for every n. Repeated tokens must add in a fixed order
// (no float atomics), so the rows are first grouped by token with a stable counting sort:
//   1. counts[v]  = occurrences of v          (integer atomics: the counts are exact)
//   2. cursor[v]  = exclusive prefix sum      (one block)
//   3. order[]    = positions n grouped by token, ascending n within a group (one block walks
//                   the tokens in chunks of 1024 in order; a token's rank inside a chunk is the
//                   number of equal tokens before it in the chunk)
//   4. one block per group start (x) and column slice (y) sums its group's rows in ascending n,
//      in float, and adds the sum to the table row once.
// The result is the same on every run; it matches the CPU, which also adds rows in ascending n,
// up to float rounding of the sum (the CPU adds into the table row by row).
#include "kernels.cuh"

template <class T, int V> __global__ void embedding_fwd_kernel(T *out, const int32_t *tok, const T *table,
                                                              int N, int C) {
    const int cv = C / V;
    size_t total = (size_t)N * cv;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / cv, c = (i % cv) * V;
        const T *src = table + (size_t)tok[n] * C + c;
        T *dst = out + n * C + c;
        if constexpr (V * sizeof(T) == 16) {
            EMU_CHECK_ALIGN(src, 16);
            EMU_CHECK_ALIGN(dst, 16);
            *reinterpret_cast<Raw16 *>(dst) = *reinterpret_cast<const Raw16 *>(src);
        } else {
#pragma unroll
            for (int k = 0; k < V; k++) dst[k] = src[k];
        }
    }
}

void k_embedding_fwd(CudaCtx *c, void *out, const int32_t *tokens, const void *table, int N, int C) {
    size_t total = (size_t)N * C;
    if (!total) return;
    if (c->bf16) {
        if (C % 8 == 0 && can_vec<bf16>(total, out, table))
            LAUNCH(grid_for(total / 8, 256), 256, 0, c->stream, embedding_fwd_kernel<bf16, 8>)((bf16 *)out, tokens, (const bf16 *)table, N, C);
        else
            LAUNCH(grid_for(total, 256), 256, 0, c->stream, embedding_fwd_kernel<bf16, 1>)((bf16 *)out, tokens, (const bf16 *)table, N, C);
    } else {
        if (C % 4 == 0 && can_vec<float>(total, out, table))
            LAUNCH(grid_for(total / 4, 256), 256, 0, c->stream, embedding_fwd_kernel<float, 4>)((float *)out, tokens, (const float *)table, N, C);
        else
            LAUNCH(grid_for(total, 256), 256, 0, c->stream, embedding_fwd_kernel<float, 1>)((float *)out, tokens, (const float *)table, N, C);
    }
    LAUNCH_CHECK("embedding_fwd");
}

// 1. counts
__global__ void emb_count_kernel(int *counts, const int32_t *tok, int N, int V) {
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
        int t = tok[n];
        atomicAdd(&counts[t >= 0 && t < V ? t : V], 1);
    }
}

// 2. exclusive scan of counts into cursor, one block of SCAN_THREADS threads: each thread owns a
// contiguous slice, the slice totals are scanned in shared memory.
#define SCAN_THREADS 1024
__global__ void emb_scan_kernel(int *cursor, const int *counts, int V) {
    __shared__ int tot[SCAN_THREADS];
    const int t = threadIdx.x, per = (V + SCAN_THREADS - 1) / SCAN_THREADS;
    const int a = t * per < V ? t * per : V, b = a + per < V ? a + per : V;
    int s = 0;
    for (int i = a; i < b; i++) s += counts[i];
    tot[t] = s;
    __syncthreads();
    // Hillis-Steele inclusive scan over the slice totals
    for (int off = 1; off < SCAN_THREADS; off <<= 1) {
        int v = t >= off ? tot[t - off] : 0;
        __syncthreads();
        tot[t] += v;
        __syncthreads();
    }
    int run = tot[t] - s;  // exclusive start of this slice
    for (int i = a; i < b; i++) {
        cursor[i] = run;
        run += counts[i];
    }
}

// 3. stable placement, one block of SCAN_THREADS threads walking the tokens chunk by chunk.
__global__ void emb_place_kernel(int *order, int *cursor, const int32_t *tok, int N, int V) {
    __shared__ int st[SCAN_THREADS];
    const int t = threadIdx.x;
    for (int c0 = 0; c0 < N; c0 += SCAN_THREADS) {
        int n = c0 + t;
        int mine = n < N ? tok[n] : -1;
        if (n < N && (mine < 0 || mine >= V)) mine = V;  // out of range: a bucket of its own
        st[t] = mine;
        __syncthreads();
        int rank = 0, last = 1;
        const int len = N - c0 < SCAN_THREADS ? N - c0 : SCAN_THREADS;
        for (int u = 0; u < len; u++) {
            int o = st[u];
            rank += u < t && o == mine;
            last &= !(u > t && o == mine);
        }
        int base = mine >= 0 ? cursor[mine] : 0;
        __syncthreads();  // every read of cursor in this chunk happens before any update
        if (mine >= 0) {
            order[base + rank] = n;
            if (last) cursor[mine] = base + rank + 1;
        }
        __syncthreads();
    }
}

// 4. group sums: block x = position in the sorted order; only a group's first position works.
template <class T, int V> __global__ void emb_sum_kernel(float *dtable, const T *dout, const int32_t *tok,
                                                        const int *order, int N, int C, int total, int Vocab) {
    const int i = blockIdx.x;
    if (i >= total) return;
    const int v = tok[order[i]];
    if (v < 0 || v >= Vocab) return;  // out-of-range tokens (the data loader rejects them) are skipped
    if (i > 0 && tok[order[i - 1]] == v) return;
    const int c = (blockIdx.y * blockDim.x + threadIdx.x) * V;
    if (c >= C) return;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; k++) acc[k] = 0.0f;
    for (int j = i; j < total; j++) {
        int n = order[j];
        if (tok[n] != v) break;
        float x[V];
        load_f<V>(x, dout + (size_t)n * C + c);
#pragma unroll
        for (int k = 0; k < V; k++) acc[k] += x[k];
    }
    float d[V];
    float *dst = dtable + (size_t)v * C + c;  // the float gradient (backend.h)
    load_f<V>(d, dst);
#pragma unroll
    for (int k = 0; k < V; k++) d[k] += acc[k];
    store_f<V>(dst, d);
}

void k_embedding_bwd(CudaCtx *c, float *dtable, const void *dout, const int32_t *tokens, int N,
                     int C, int V) {
    if (N <= 0 || C <= 0) return;
    // counts and cursors have a bucket V for out-of-range tokens, so every position is placed
    int *counts = (int *)ctx_scratch(c, SCR_EMB, ((size_t)2 * (V + 1) + N) * sizeof(int));
    int *cursor = counts + (V + 1), *order = cursor + (V + 1);
    CUDA_CHECK(cudaMemsetAsync(counts, 0, (size_t)(V + 1) * sizeof(int), c->stream));
    LAUNCH(grid_for(N, 256, 1024), 256, 0, c->stream, emb_count_kernel)(counts, tokens, N, V);
    LAUNCH(1, SCAN_THREADS, 0, c->stream, emb_scan_kernel)(cursor, counts, V + 1);
    LAUNCH(1, SCAN_THREADS, 0, c->stream, emb_place_kernel)(order, cursor, tokens, N, V);
    const int threads = 128;
    if (c->bf16) {
        const int vec = C % 8 == 0 && can_vec<bf16>((size_t)C, dout, dtable) ? 8 : 1;
        dim3 g(N, (C / vec + threads - 1) / threads);
        if (vec == 8) LAUNCH(g, threads, 0, c->stream, emb_sum_kernel<bf16, 8>)(dtable, (const bf16 *)dout, tokens, order, N, C, N, V);
        else LAUNCH(g, threads, 0, c->stream, emb_sum_kernel<bf16, 1>)(dtable, (const bf16 *)dout, tokens, order, N, C, N, V);
    } else {
        const int vec = C % 4 == 0 && can_vec<float>((size_t)C, dout, dtable) ? 4 : 1;
        dim3 g(N, (C / vec + threads - 1) / threads);
        if (vec == 4) LAUNCH(g, threads, 0, c->stream, emb_sum_kernel<float, 4>)(dtable, (const float *)dout, tokens, order, N, C, N, V);
        else LAUNCH(g, threads, 0, c->stream, emb_sum_kernel<float, 1>)(dtable, (const float *)dout, tokens, order, N, C, N, V);
    }
    LAUNCH_CHECK("embedding_bwd");
}
