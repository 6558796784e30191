// matmul.cu: row-major GEMMs through cuBLASLt. Run on one GPU once (H200, 2026-11-27).
//
// cuBLASLt is column-major. A row-major C[M,N] is the column-major C^T[N,M], and
// C^T = op(B)^T op(A)^T, so each call passes our B as cuBLASLt's A and our A as its B:
//   our B stored [K,N] (tb=0) is column-major [N,K] = op(B)^T as it is  -> opA = N, rows N, ld N
//   our B stored [N,K] (tb=1) is column-major [K,N]; its transpose      -> opA = T, rows K, ld K
//   our A stored [M,K] (ta=0) is column-major [K,M] = op(A)^T            -> opB = N, rows K, ld K
//   our A stored [K,M] (ta=1) is column-major [M,K]; its transpose      -> opB = T, rows M, ld M
//   C: column-major [N,M], ld N.
// Compute is fp32 (CUBLAS_COMPUTE_32F) in both precisions: bf16 inputs accumulate in fp32, and
// float mode is true fp32 (no TF32), so it can be compared with the CPU backend. Weight
// gradients (backend.h's matmul_dw) take bf16 A/B with fp32 C/D and beta 1, so a gradient summed
// over micro-batches, tiles and chunks is never rounded to bf16.
//
// Plans (descriptors + the heuristic's algorithm) are cached by shape, transposes, types and
// the pointers' alignments: cuBLASLt's heuristic assumes 256-byte aligned pointers unless told
// otherwise, and act_at() offsets are often less aligned than that.
#include <stdlib.h>
#include <string.h>
#include "kernels.cuh"

#define LT_CHECK(call)                                                                       \
    do {                                                                                     \
        cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt: %s failed with status %d", #call, (int)s_); \
    } while (0)

struct LtKey {
    int M, N, K, ta, tb, ab_type, c_type;
    unsigned al_a, al_b, al_c;
};

struct LtPlan {
    LtKey key;
    int used;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

#define LT_CACHE_SIZE 1024
struct LtCache {
    LtPlan plan[LT_CACHE_SIZE];
};

static uint64_t key_hash(const LtKey *k) {
    uint64_t h = 1469598103934665603ULL;
    const unsigned char *p = (const unsigned char *)k;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static void plan_destroy(LtPlan *p) {
    if (!p->used) return;
    cublasLtMatmulDescDestroy(p->op);
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    p->used = 0;
}

void lt_cache_free(LtCache *cache) {
    if (!cache) return;
    for (int i = 0; i < LT_CACHE_SIZE; i++) plan_destroy(&cache->plan[i]);
    free(cache);
}

static LtPlan *get_plan(CudaCtx *c, const LtKey *key) {
    if (!c->cache) {
        c->cache = (LtCache *)calloc(1, sizeof(LtCache));
        if (!c->cache) fail("out of host memory for the cuBLASLt plan cache");
    }
    uint64_t h = key_hash(key);
    LtPlan *slot = NULL;
    for (int probe = 0; probe < 8; probe++) {
        LtPlan *p = &c->cache->plan[(h + probe) % LT_CACHE_SIZE];
        if (p->used && !memcmp(&p->key, key, sizeof *key)) return p;
        if (!p->used && !slot) slot = p;
    }
    if (!slot) slot = &c->cache->plan[h % LT_CACHE_SIZE];  // full neighbourhood: replace
    plan_destroy(slot);
    memset(slot, 0, sizeof *slot);
    slot->key = *key;

    const cudaDataType_t abt = (cudaDataType_t)key->ab_type, ct = (cudaDataType_t)key->c_type;
    LT_CHECK(cublasLtMatmulDescCreate(&slot->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opA = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
    cublasOperation_t opB = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is our A
    LT_CHECK(cublasLtMatmulDescSetAttribute(slot->op, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA));
    LT_CHECK(cublasLtMatmulDescSetAttribute(slot->op, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB));
    const int M = key->M, N = key->N, K = key->K;
    // layouts describe the matrices as stored (column-major view)
    if (key->tb) LT_CHECK(cublasLtMatrixLayoutCreate(&slot->la, abt, K, N, K));
    else LT_CHECK(cublasLtMatrixLayoutCreate(&slot->la, abt, N, K, N));
    if (key->ta) LT_CHECK(cublasLtMatrixLayoutCreate(&slot->lb, abt, M, K, M));
    else LT_CHECK(cublasLtMatrixLayoutCreate(&slot->lb, abt, K, M, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&slot->lc, ct, N, M, N));

    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = c->workspace_bytes;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    uint32_t al_a = key->al_b, al_b = key->al_a, al_c = key->al_c;  // cuBLASLt's A is our B
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, slot->op, slot->la, slot->lb, slot->lc,
                                                       slot->lc, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found < 1)
        fail("cuBLASLt has no algorithm for C[%d,%d] = op(A)[%d,%d] op(B)[%d,%d] (transA %d, transB %d, "
             "%s in, %s out, alignments %u/%u/%u bytes): status %d", M, N, M, K, K, N, key->ta, key->tb,
             abt == CUDA_R_16BF ? "bf16" : "fp32", ct == CUDA_R_16BF ? "bf16" : "fp32", key->al_a,
             key->al_b, key->al_c, (int)st);
    slot->algo = res.algo;
    slot->used = 1;
    return slot;
}

static void matmul_any(CudaCtx *c, void *C, int c_f32, const void *A, const void *B, int M, int N,
                       int K, int ta, int tb, float alpha, float beta) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {  // empty sum: C = beta C
        if (beta == 0.0f) CUDA_CHECK(cudaMemsetAsync(C, 0, (size_t)M * N * (c_f32 ? 4 : act_size(c)), c->stream));
        else if (beta != 1.0f) {
            if (c_f32 && c->bf16) fail("internal: matmul with K = 0 and beta %g on float output", beta);
            k_scale(c, C, beta, (size_t)M * N);
        }
        return;
    }
    LtKey key;
    memset(&key, 0, sizeof key);
    key.M = M, key.N = N, key.K = K, key.ta = ta, key.tb = tb;
    key.ab_type = c->bf16 ? CUDA_R_16BF : CUDA_R_32F;
    key.c_type = c_f32 || !c->bf16 ? CUDA_R_32F : CUDA_R_16BF;
    key.al_a = ptr_align(A), key.al_b = ptr_align(B), key.al_c = ptr_align(C);
    LtPlan *p = get_plan(c, &key);
    LT_CHECK(cublasLtMatmul(c->lt, p->op, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                            &p->algo, c->workspace, c->workspace_bytes, c->stream));
}

void k_matmul(CudaCtx *c, void *C, const void *A, const void *B, int M, int N, int K, int ta,
              int tb, float alpha, float beta) {
    matmul_any(c, C, 0, A, B, M, N, K, ta, tb, alpha, beta);
}

void k_matmul_f32out(CudaCtx *c, float *C, const void *A, const void *B, int M, int N, int K,
                     int ta, int tb, float alpha, float beta) {
    matmul_any(c, C, 1, A, B, M, N, K, ta, tb, alpha, beta);
}
