// kernels.cuh: the CUDA kernels' host-side launchers, one group per file:
//   matmul.cu       cuBLASLt GEMMs (row-major, transposes, alpha/beta)
//   elementwise.cu  add, accumulate, scale, bias, SwiGLU, dropout
//   reduce.cu       sumsq, sum_f32 (deterministic, in double)
//   embedding.cu    embedding forward / deterministic backward
//   norms.cu        RMSNorm forward / backward (dw reduced in a fixed order)
//   gpt2.cu         LayerNorm, GELU, learned positions (GPT-2)
//   rope.cu         rotary embeddings
//   attention.cu    causal GQA flash attention forward / backward
//   classifier.cu   fused chunked classifier + cross-entropy
//   adamw.cu        fused AdamW (fp32 master for bf16 params)
//   nf4.cu          NF4 dequantization of a device region
// Each launcher enqueues on ctx->stream and reads the act precision from ctx->bf16; parameter
// gradients are float in both precisions (backend.h); the semantics are those of the same-named
// op in backend.h (the CPU kernels in
// llmc/cpu/kernels.inc are the reference). Run on one GPU once (H200, 2026-11-27: dev/results/gpu_h200_2026-11-27/).
#pragma once
#include "common.cuh"
// adamw8 blocks: backend.h's ADAM8_BLOCK and ADAM4_BLOCK (backend_cuda.cu checks that they agree)
#define ADAM8_BLOCK_CU 256
#define ADAM4_BLOCK_CU 128
#ifndef LLMC_EMU
#include <cublasLt.h>
#endif

// Scratch buffers the kernels need beyond their arguments. They belong to the backend, grow on
// demand (stream-ordered: the old one is freed after the stream drains) and are not counted
// against the device-memory budget, just as the CPU kernels' malloc'd scratch is not.
enum {
    SCR_PARTIAL,    // reduction partials (rmsnorm dw, bias grad, sums)
    SCR_CE_LOGITS,  // classifier chunk logits (fp32)
    SCR_CE_GRAD,    // classifier chunk gradient (act precision, bf16 mode only)
    SCR_ATT_D,      // attention backward: rowsum(dO * O) per (b, h, t)
    SCR_ATT_KV,     // attention backward, GQA's dK/dV split: each part's float sums
    SCR_EMB,        // embedding backward: counts/cursors [V] and the sorted order [N]
    SCR_LIST,       // sumsq_many: the list's pointers and lengths, and its sums
    SCR_COUNT
};

struct LtCache;

struct CudaCtx {
    cudaStream_t stream;  // the compute stream
    int bf16;             // act precision: 1 bf16, 0 float
    int device, num_sms;
    size_t smem_optin;    // most dynamic shared memory a block may ask for
    int force_generic_attention;  // tests: use the scalar attention path even where WMMA fits
    int mma_attention;            // the mma.sync attention kernels (default; LLMC_ATT_MMA=0: WMMA)
    size_t ce_chunk_elems;        // dev/cuda/classifier's timings: logits a classifier chunk holds (0: CE_CHUNK_ELEMS)
    int att_bwd_one_grid;         // LLMC_ATT_BWD_ONE_GRID=1: the mma backward's two kinds of block in one grid
    int att_kv_split;             // LLMC_ATT_KV_SPLIT=N: GQA's dK/dV blocks in up to N parts (1: unsplit)
    int att_pipeline;             // LLMC_ATT_PIPELINE=1: the mma kernels load the next tile by cp.async
    void *scratch[SCR_COUNT];
    size_t scratch_bytes[SCR_COUNT];
    double *host_result;  // pinned, for reductions returned to the host
    double *dev_result;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    LtCache *cache;
};

// Creates the context on `device` (cudaSetDevice, streams, cuBLASLt, pinned result slot).
CudaCtx *cuda_ctx_create(int bf16, int device);
void cuda_ctx_destroy(CudaCtx *c);
// Scratch slot `slot` with at least `bytes` bytes.
void *ctx_scratch(CudaCtx *c, int slot, size_t bytes);
// Bytes of scratch currently held (for reports).
size_t ctx_scratch_total(const CudaCtx *c);
static inline size_t act_size(const CudaCtx *c) { return c->bf16 ? 2 : 4; }

// ---- matmul.cu ---------------------------------------------------------------------------
// C[M,N] = alpha op(A) op(B) + beta C, row-major, in act precision (backend.h's matmul).
void k_matmul(CudaCtx *c, void *C, const void *A, const void *B, int M, int N, int K, int ta,
              int tb, float alpha, float beta);
// The same with C (and the output) in float whatever the act precision (classifier logits,
// weight gradients: backend.h's matmul_dw is this with beta 1).
void k_matmul_f32out(CudaCtx *c, float *C, const void *A, const void *B, int M, int N, int K,
                     int ta, int tb, float alpha, float beta);
void lt_cache_free(LtCache *cache);

// ---- elementwise.cu ------------------------------------------------------------------------
void k_add(CudaCtx *c, void *y, const void *a, const void *b, size_t n);
void k_accumulate(CudaCtx *c, void *y, const void *x, size_t n);
void k_accumulate_f32(CudaCtx *c, float *y, const float *x, size_t n);  // float whatever the act precision
void k_scale(CudaCtx *c, void *y, float s, size_t n);
void k_add_bias(CudaCtx *c, void *y, const void *bias, int N, int D);
void k_bias_grad(CudaCtx *c, float *dbias, const void *dy, int N, int D);
void k_swiglu_fwd(CudaCtx *c, void *h, const void *gate, const void *up, size_t n);
void k_swiglu_bwd(CudaCtx *c, void *dgate, void *dup, const void *dh, const void *gate,
                  const void *up, size_t n);
// GeGLU: GELU's tanh approximation, or with exact set the erf one.
void k_geglu_fwd(CudaCtx *c, void *h, const void *gate, const void *up, size_t n, int exact);
void k_geglu_bwd(CudaCtx *c, void *dgate, void *dup, const void *dh, const void *gate,
                 const void *up, size_t n, int exact);
void k_dropout(CudaCtx *c, void *y, const void *x, size_t n, float p, uint64_t seed, size_t first);
// float <-> act conversion on the device (src and dst may not overlap).
void k_f32_to_act(CudaCtx *c, void *dst, const float *src, size_t n);
void k_act_to_f32(CudaCtx *c, float *dst, const void *src, size_t n);

// ---- reduce.cu -------------------------------------------------------------------------------
// Sums in double with a fixed grid, so the result does not depend on the GPU; synchronises.
// sumsq reads float (gradients).
double k_sumsq(CudaCtx *c, const float *x, size_t n);
// each[i] = k_sumsq(c, x[i], n[i]) for i < count, bit for bit, with one wait for all.
void k_sumsq_many(CudaCtx *c, const float *const *x, const size_t *n, int count, double *each);
double k_sum_f32(CudaCtx *c, const float *x, size_t n);

// ---- embedding.cu ----------------------------------------------------------------------------
void k_embedding_fwd(CudaCtx *c, void *out, const int32_t *tokens, const void *table, int N, int C);
void k_embedding_bwd(CudaCtx *c, float *dtable, const void *dout, const int32_t *tokens, int N,
                     int C, int V);

// ---- norms.cu --------------------------------------------------------------------------------
// w_add: the norm applies w + w_add (1: Gemma's 1 + w), added in float.
void k_rmsnorm_fwd(CudaCtx *c, void *out, float *rstd, const void *x, const void *w, float w_add, int N,
                   int C, float eps);
void k_rmsnorm_bwd(CudaCtx *c, void *dx, float *dw, const void *dout, const void *x, const void *w,
                   float w_add, const float *rstd, int N, int C);

// ---- gpt2.cu (GPT-2's ops) ------------------------------------------------------------------
void k_layernorm_fwd(CudaCtx *c, void *out, float *mean, float *rstd, const void *x, const void *w, const void *b,
                     int N, int C, float eps);
void k_layernorm_bwd(CudaCtx *c, void *dx, float *dw, float *db, const void *dout, const void *x, const void *w,
                     const float *mean, const float *rstd, int N, int C);
void k_gelu_fwd(CudaCtx *c, void *y, const void *x, size_t n);
void k_gelu_bwd(CudaCtx *c, void *dx, const void *dout, const void *x, size_t n);
void k_pos_fwd(CudaCtx *c, void *out, const void *wpe, int B, int T, int C);
void k_pos_bwd(CudaCtx *c, float *dwpe, const void *dout, int B, int T, int C);

// ---- rope.cu ---------------------------------------------------------------------------------
// The first rot dimensions of each head (backend.h); sign +1: forward rotation; -1: the inverse (backward).
void k_rope(CudaCtx *c, void *x, const float *cosv, const float *sinv, const int32_t *pos, int B,
            int T, int H, int D, int rot, int sign);

// ---- attention.cu ----------------------------------------------------------------------------
// window (0: none) and doc_start (device [B*T], NULL: one document per row): backend.h's mask.
// Query spans (backend.h): queries q0 .. q0+nq-1 of each row; q/out/dq/dout hold those rows.
// dk/dv are written, or added to when accumulate is set; acck/accv (float [B,T,Hkv,D], or NULL
// in float mode) carry the running sums between spans so bf16 dk/dv are rounded once per call.
void k_attention_fwd(CudaCtx *c, void *out, float *lse, const void *q, const void *k, const void *v,
                     int B, int T, int q0, int nq, int Hq, int Hkv, int D, int window, const int32_t *doc_start,
                     float scale, float softcap);
void k_attention_bwd(CudaCtx *c, void *dq, void *dk, void *dv, const void *dout, const void *q,
                     const void *k, const void *v, const void *out, const float *lse, int B, int T, int q0,
                     int nq, int Hq, int Hkv, int D, int window, const int32_t *doc_start, int accumulate,
                     float *acck, float *accv, float scale, float softcap);
const char *k_attention_path(const CudaCtx *c, int D);

// ---- classifier.cu ---------------------------------------------------------------------------
void k_classifier_ce(CudaCtx *c, float *losses, void *dx, float *dW, const void *x, const void *W,
                     const int32_t *targets, int N, int V, int C, float scale, float softcap);
// Rows per chunk for a vocabulary of V (the chunk's logits are at most CE_CHUNK_ELEMS).
// Not yet measured on a GPU: at V 128256 a chunk has 130 rows, and dW's product (V x C, K = the
// chunk's rows) reads and writes the fp32 V x C gradient once a chunk, which on the CPU backend
// made it memory-bound (there chunks now hold at least 256 rows: llmc/cpu/kernels.inc).
#define CE_CHUNK_ELEMS ((size_t)1 << 24)

// ---- adamw.cu --------------------------------------------------------------------------------
void k_adamw(CudaCtx *c, void *params, float *master, const float *grads, float *m, float *v,
             size_t n, float lr, float beta1, float beta2, float eps, float wd, float grad_scale,
             int t);
// Blockwise low-bit AdamW on one tensor (llmc/optim.h), flavor 0 bitsandbytes' 8-bit, 1
// torchao's 8-bit, 2 torchao's 4-bit; maps: 512 device floats.
void k_adamw8(CudaCtx *c, void *params, float *master, const float *grads, unsigned char *qm, unsigned char *qv,
              float *am, float *av, const float *maps, size_t n, float lr, float beta1, float beta2, float eps,
              float wd, float grad_scale, int t, int flavor);

// ---- nf4.cu ----------------------------------------------------------------------------------
void k_nf4_dequantize(CudaCtx *c, void *out, const void *region, size_t n);
// ---- int8.cu: an 8-bit region (llmc/int8.h) -----------------------------------------------
void k_int8_dequantize(CudaCtx *c, void *out, const void *region, size_t n);
// Copies the 16 NF4 values into constant memory (once per context).
void k_nf4_init(void);
