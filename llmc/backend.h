// backend.h: the one interface between the training logic and the hardware.
//
// Everything above this file (the model, the training loop, optimizer, checkpoints) is written
// once against this table and never asks whether it runs on a CPU or a GPU. A backend fills
// the table: the CPU backend (llmc/cpu/) holds the reference semantics, the CUDA backend is
// checked against it kernel by kernel.
//
// Three groups of entries:
//   memory    device allocation against a budget, pinned host allocation, copies
//   ordering  queues and events; ops run on the compute queue in issue order
//   compute   the kernels of a Llama block, forward and backward
//
// Tensors are plain device pointers. "act" tensors (weights in compute precision, activations
// and their gradients) hold elements of bk->act_bytes bytes each (4 on the CPU, 2 for bf16 on a
// GPU). Tensors named *_f32 are always float: master weights, AdamW moments, parameter
// gradients, RMSNorm's saved reciprocal std, attention's log-sum-exp, per-token losses, RoPE
// tables. Token ids are int32.
//
// Parameter gradients are float on every backend, whatever the act precision: a weight's
// gradient is a sum over micro-batches (gradient accumulation), over attention query tiles and
// MLP row chunks, and over sequence spans, and a bf16 sum loses the small late terms (bf16
// keeps 8 significant bits: adding 1e-3 to 1.0 changes nothing). Every op that accumulates a
// weight gradient (matmul_dw, bias_grad, the norms' dw/db, embedding_bwd, pos_bwd,
// classifier_ce's dW) reads act operands and adds into a float gradient, rounding once per
// call; AdamW, sumsq (the gradient norm) and the gradient collectives (comm.h) read float.
// Matrices are row-major; a linear layer's weight is [out, in] as Hugging Face stores it.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct Backend Backend;

// adamw8's blocks: the elements that share one absmax (optim.h: 8-bit AdamW; torchao's 4-bit
// one: ADAM4_BLOCK).
#define ADAM8_BLOCK 256
#define ADAM4_BLOCK 128
typedef struct Queue Queue;  // an in-order stream of work (a CUDA stream; immediate on the CPU)
typedef struct Event Event;  // a point in a queue that other queues or the host can wait for

// One of a batch of independent products for matmul_many: matmul's arguments (dw 0), or
// matmul_dw's (dw 1: C is a float gradient, beta ignored, the product is added).
typedef struct {
    void *C;
    const void *A, *B;
    int M, N, K, ta, tb;
    float alpha, beta;
    int dw;
} Matmul;

typedef struct {
    size_t in_use, peak, limit;  // device bytes; limit 0 means no budget
    size_t host_in_use, host_peak;
    size_t disk_in_use, disk_peak;
} MemStats;

struct Backend {
    const char *name;
    int act_bytes;
    int threads;
    char detail[96];  // shown after the device in the config box (CPU: BLAS core, kernel set)
    // Which attention kernels run at head dim D (the config box; NULL where there is one kind).
    const char *(*attention_path)(const Backend *, int head_dim);
    int dry_run;  // allocations are only counted (the planner); no op may run
    int att_block;  // attention query tiles must start at multiples of it (0: no query tiles)
    const char *oom_hint;  // appended to the out-of-memory message (e.g. modes that would fit)
    MemStats mem;
    void *impl;

    // ---- memory --------------------------------------------------------------------------
    // Device allocations are counted against mem.limit; past it dev_alloc fails with a message
    // that names `what`. Memory is not zeroed.
    void *(*dev_alloc)(Backend *, size_t bytes, const char *what);
    void (*dev_free)(Backend *, void *p);
    void *(*host_alloc)(Backend *, size_t bytes, const char *what);  // pinned where it matters
    void (*host_free)(Backend *, void *p);
    void (*memzero)(Backend *, void *dst, size_t bytes, Queue *q);
    // Copies are raw bytes; q NULL means the compute queue. Host memory given to an async copy
    // must come from host_alloc.
    void (*copy_h2d)(Backend *, void *dst, const void *src, size_t bytes, Queue *q);
    void (*copy_d2h)(Backend *, void *dst, const void *src, size_t bytes, Queue *q);
    void (*copy_d2d)(Backend *, void *dst, const void *src, size_t bytes, Queue *q);
    // rows x width bytes between device buffers with row pitches (sequence parallelism's
    // head <-> sequence reshuffles).
    void (*copy_2d)(Backend *, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                    size_t rows, Queue *q);
    // Convert between host float32 and a device act tensor (synchronous).
    void (*upload_act)(Backend *, void *dst, const float *src, size_t n);
    void (*download_act)(Backend *, float *dst, const void *src, size_t n);
    // The same conversions into / out of host memory in act precision (streamed weights).
    void (*host_from_f32)(Backend *, void *dst, const float *src, size_t n);
    void (*host_to_f32)(Backend *, float *dst, const void *src, size_t n);

    // ---- ordering ------------------------------------------------------------------------
    Queue *(*queue_create)(Backend *);
    void (*queue_destroy)(Backend *, Queue *);
    Event *(*event_create)(Backend *);
    void (*event_destroy)(Backend *, Event *);
    void (*event_record)(Backend *, Event *, Queue *q);  // q NULL: compute queue
    void (*queue_wait)(Backend *, Queue *q, Event *);    // q waits for the event
    void (*event_sync)(Backend *, Event *);              // host waits for the event
    void (*sync)(Backend *);                             // host waits for everything

    // ---- compute (on the compute queue) ----------------------------------------------------
    // C[M,N] = alpha * op(A) @ op(B) + beta * C, op(A) [M,K], op(B) [K,N]; trans flags mean the
    // stored matrix is the transpose (A stored [K,M], B stored [N,K]).
    void (*matmul)(Backend *, void *C, const void *A, const void *B, int M, int N, int K,
                   int transA, int transB, float alpha, float beta);
    // A weight gradient: dW_f32[M,N] += alpha * op(A) @ op(B), act operands, float dW (fp32
    // accumulation, as cuBLASLt's bf16 inputs with fp32 C/D).
    void (*matmul_dw)(Backend *, float *dW_f32, const void *A, const void *B, int M, int N, int K,
                      int transA, int transB, float alpha);
    // Products no one of which reads or writes another's C: the same as matmul / matmul_dw on
    // each in turn, run side by side where the backend can. NULL: the engine runs them in turn.
    void (*matmul_many)(Backend *, const Matmul *jobs, int n);
    void (*add_bias)(Backend *, void *y, const void *bias, int N, int D);         // y[n,:] += bias
    void (*bias_grad)(Backend *, float *dbias_f32, const void *dy, int N, int D); // dbias += sum_n dy
    void (*add)(Backend *, void *y, const void *a, const void *b, size_t n);      // y = a + b
    void (*accumulate)(Backend *, void *y, const void *x, size_t n);              // y += x
    void (*accumulate_f32)(Backend *, float *y, const float *x, size_t n);        // y += x, float

    void (*embedding_fwd)(Backend *, void *out, const int32_t *tokens, const void *table, int N,
                          int C);
    // dtable[tok] += dout rows; deterministic (no races on repeated tokens).
    void (*embedding_bwd)(Backend *, float *dtable_f32, const void *dout, const int32_t *tokens, int N,
                          int C, int V);

    // out = x * rsqrt(mean(x^2) + eps) * (w + w_add); saves rstd_f32[N]. w_add is 0, or 1
    // for Gemma's norms, whose files hold w with the norm applying 1 + w (added in float).
    void (*rmsnorm_fwd)(Backend *, void *out, float *rstd_f32, const void *x, const void *w,
                        float w_add, int N, int C, float eps);
    // dx += d/dx, dw += d/dw (dw NULL: frozen weight).
    void (*rmsnorm_bwd)(Backend *, void *dx, float *dw_f32, const void *dout, const void *x,
                        const void *w, float w_add, const float *rstd_f32, int N, int C);

    // GPT-2's LayerNorm: out = (x - mean) * rstd * w + b, saving mean_f32 and rstd_f32 [N].
    // Backward: dx += ..., dw += ..., db += ... (dw/db NULL: frozen).
    void (*layernorm_fwd)(Backend *, void *out, float *mean_f32, float *rstd_f32, const void *x,
                          const void *w, const void *b, int N, int C, float eps);
    void (*layernorm_bwd)(Backend *, void *dx, float *dw_f32, float *db_f32, const void *dout,
                          const void *x, const void *w, const float *mean_f32, const float *rstd_f32,
                          int N, int C);
    // GELU (tanh approximation). gelu_bwd: dx = dout * gelu'(x); dx may alias dout.
    void (*gelu_fwd)(Backend *, void *y, const void *x, size_t n);
    void (*gelu_bwd)(Backend *, void *dx, const void *dout, const void *x, size_t n);
    // Learned positions: out[b,t,:] += wpe[t,:]; pos_bwd: dwpe[t,:] += sum over b of dout[b,t,:].
    void (*pos_fwd)(Backend *, void *out, const void *wpe, int B, int T, int C);
    void (*pos_bwd)(Backend *, float *dwpe_f32, const void *dout, int B, int T, int C);

    // In place on x [B,T,H,D], rotating each head's first rot dimensions (rot even, <= D; rot D:
    // all; Phi-4-mini's partial rotary: 96 of 128) and passing the rest; tables are [T, rot/2]
    // (HF rotate_half pairs i and i + rot/2). The position of row (b, t) is pos[b*T + t]
    // (device int32 [B*T], each < T: packed documents restart at 0) or, with pos NULL, t.
    // rope_bwd applies the inverse rotation.
    void (*rope_fwd)(Backend *, void *x, const float *cos_f32, const float *sin_f32,
                     const int32_t *pos, int B, int T, int H, int D, int rot);
    void (*rope_bwd)(Backend *, void *dx, const float *cos_f32, const float *sin_f32,
                     const int32_t *pos, int B, int T, int H, int D, int rot);

    // Causal grouped-query attention, flash style: q [B,T,Hq,D], k/v [B,T,Hkv,D], out like q,
    // lse_f32 [B,Hq,T] (natural log-sum-exp of the scaled scores). No T x T matrix is stored.
    // Query t of a row attends keys j with lo(t) <= j <= t, where
    //   lo(t) = max(doc_start[b*T + t], t - window + 1)
    // window 0 means no window (Mistral/Qwen2 sliding window: window keys including t itself, as
    // transformers' mask kv_idx > q_idx - sliding_window). doc_start (device int32 [B*T], the
    // in-row index of the first token of t's document, for packed samples) may be NULL: the row
    // is one document. A backend that does not implement a mask it is given fails, naming it.
    // Query tiles: only queries q0 .. q0+nq-1 of each row are computed (q0 = 0, nq = T: all);
    // q and out then hold just those rows, [B,nq,Hq,D], while k/v, lse and doc_start stay whole.
    // Tiles start at multiples of att_block; on the CPU they give the bits one call over all
    // rows gives. Scores are q.k * scale (scale 0: 1/sqrt(D)); softcap > 0 caps them as
    // softcap * tanh(s / softcap) before the mask (Gemma 2), 0: not capped.
    void (*attention_fwd)(Backend *, void *out, float *lse_f32, const void *q, const void *k,
                          const void *v, int B, int T, int q0, int nq, int Hq, int Hkv, int D,
                          int window, const int32_t *doc_start, float scale, float softcap);
    // Writes dq (tile rows, like q); writes dk, dv, or adds to them when accumulate is set, so
    // a run of query tiles in order sums the key/value gradients as one call would. dk_f32 /
    // dv_f32 (float, shaped like dk/dv) carry those sums between tiles where activations are
    // narrower than float (bf16), so dk/dv are rounded once, not once per tile; NULL for float
    // activations or a single call. window/doc_start as in the forward.
    void (*attention_bwd)(Backend *, void *dq, void *dk, void *dv, const void *dout,
                          const void *q, const void *k, const void *v, const void *out,
                          const float *lse_f32, int B, int T, int q0, int nq, int Hq, int Hkv,
                          int D, int window, const int32_t *doc_start, int accumulate,
                          float *dk_f32, float *dv_f32, float scale, float softcap);

    // y = x * mask / (1 - p), mask[i] from a hash of (seed, first + i): the same call is its
    // own backward, and a tile of rows gets the mask the whole tensor would. y may alias x.
    void (*dropout)(Backend *, void *y, const void *x, size_t n, float p, uint64_t seed, size_t first);
    // h = silu(gate) * up. In backward dgate may alias dh (saves a T x I buffer).
    void (*swiglu_fwd)(Backend *, void *h, const void *gate, const void *up, size_t n);
    void (*swiglu_bwd)(Backend *, void *dgate, void *dup, const void *dh, const void *gate,
                       const void *up, size_t n);
    // h = gelu(gate) * up, GELU's tanh approximation (gelu_pytorch_tanh: Gemma's) or with
    // exact set the erf one (transformers' "gelu"); backward as swiglu_bwd's.
    void (*geglu_fwd)(Backend *, void *h, const void *gate, const void *up, size_t n, int exact);
    void (*geglu_bwd)(Backend *, void *dgate, void *dup, const void *dh, const void *gate,
                      const void *up, size_t n, int exact);

    // Fused, chunked classifier + cross-entropy over N rows of x [N,C] and W [V,C]; the N x V
    // logits never exist whole. losses_f32[n] = -log softmax(x W^T)[n, target[n]], 0 where
    // target < 0 (ignored). If dx is non-NULL it is written with scale * dloss/dx, and dW (if
    // non-NULL) accumulates scale * dloss/dW, where scale multiplies every token's loss.
    // softcap > 0: the logits are softcap * tanh(z / softcap) (Gemma 2's final cap), 0: as they are.
    void (*classifier_ce)(Backend *, float *losses_f32, void *dx, float *dW_f32, const void *x,
                          const void *W, const int32_t *targets, int N, int V, int C,
                          float scale, float softcap);

    // each[i] = the sum of squares of float tensor x[i] (n[i] elements, a gradient), in double,
    // returned to the host; one synchronisation for the whole list (the gradient norm: a wait a
    // tensor was 2% of a GPU step).
    void (*sumsq_many)(Backend *, const float *const *x, const size_t *n, int count, double *each);
    double (*sum_f32)(Backend *, const float *x, size_t n);
    // y *= s
    void (*scale)(Backend *, void *y, float s, size_t n);

    // AdamW with PyTorch semantics on n elements: the gradient is first multiplied by
    // grad_scale (clipping), then p -= lr*wd*p, moments, bias correction by step t (1-based).
    // master_f32 is the fp32 copy when act precision is not fp32 (else NULL: params updated).
    void (*adamw)(Backend *, void *params, float *master_f32, const float *grads_f32, float *m_f32,
                  float *v_f32, size_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, float grad_scale, int t);
    // Blockwise low-bit AdamW on one tensor of n elements (optim.h): flavor 0 bitsandbytes'
    // 8-bit, 1 torchao's 8-bit (its update and rounding), 2 torchao's 4-bit (two codes a byte,
    // ADAM4_BLOCK); moments as bytes q_m/q_v with one absmax per block; maps: adam8_maps' (or
    // adam4_maps') 512 floats in device memory. params/master_f32 as adamw.
    void (*adamw8)(Backend *, void *params, float *master_f32, const float *grads_f32, uint8_t *q_m, uint8_t *q_v,
                   float *absmax_m, float *absmax_v, const float *maps, size_t n, float lr, float beta1,
                   float beta2, float eps, float weight_decay, float grad_scale, int t, int flavor);

    // QLoRA and load_in_8bit: out[n] (act) = the weight held in a region (nf4.h's device
    // layout; format REGION_NF4 or REGION_INT8, as its header says).
    void (*dequantize)(Backend *, void *out, const void *region, size_t n, int format);

    void (*destroy)(Backend *);
};

Backend *backend_cpu_create(int threads);
// CUDA backend (llmc/cuda/): act tensors in bf16 (dtype_bf16 1; fp32 master weights and
// moments) or float (0, to compare with the CPU backend) on GPU device_index. Fails with one
// line when no usable GPU is there. backend_cuda_available returns 1 when a GPU can run this
// build's kernels, else 0 with the reason in why (no GPU, no driver, a GPU the build has no
// code for, or a build without CUDA: then the Makefile compiled llmc/cuda/backend_cuda_stub.c
// and LLMC_CUDA is not defined).
Backend *backend_cuda_create(int dtype_bf16, int device_index);
int backend_cuda_available(char *why, size_t cap);
// Call first thing in main: on virtual machines that hide the CPU model, OpenBLAS falls back
// to its generic SSE3 (Prescott) kernels, 2-3x slower; this re-executes the program with
// OPENBLAS_CORETYPE naming the kernels the CPU's features support. No-op when already set.
void backend_cpu_preinit(char **argv);

// Allocation helpers that keep call sites short.
static inline void *dev_alloc_zero(Backend *bk, size_t bytes, const char *what) {
    void *p = bk->dev_alloc(bk, bytes, what);
    bk->memzero(bk, p, bytes, NULL);
    return p;
}
// Host memory from host_alloc, zeroed (the planner's counting backend hands out fake
// addresses: nothing to zero there).
static inline void *host_alloc_zero(Backend *bk, size_t bytes, const char *what) {
    void *p = bk->host_alloc(bk, bytes, what);
    if (!bk->dry_run) memset(p, 0, bytes);
    return p;
}
// Pointer to element i of an act tensor.
static inline void *act_at(const Backend *bk, const void *base, size_t i) {
    return (char *)base + i * (size_t)bk->act_bytes;
}
