// kernels.h: CPU kernels in float (what the backend runs) and double (what the
// finite-difference tests differentiate). One source, kernels.inc, defines both.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "../backend.h"  // Matmul, matmul_many's products (element type: the kernel set's)

#define DECLARE_KERNELS(R, S)                                                                    \
    void matmul_##S(R *C, const R *A, const R *B, int M, int N, int K, int ta, int tb, R alpha,  \
                    R beta);                                                                     \
    void matmul_many_##S(const Matmul *jobs, int n);                                             \
    void add_bias_##S(R *y, const R *bias, int N, int D);                                        \
    void bias_grad_##S(R *dbias, const R *dy, int N, int D);                                     \
    void add_##S(R *y, const R *a, const R *b, size_t n);                                        \
    void accumulate_##S(R *y, const R *x, size_t n);                                             \
    void scale_##S(R *y, R s, size_t n);                                                         \
    void embedding_fwd_##S(R *out, const int32_t *tok, const R *table, int N, int C);            \
    void embedding_bwd_##S(R *dtable, const R *dout, const int32_t *tok, int N, int C);          \
    void rmsnorm_fwd_##S(R *out, R *rstd, const R *x, const R *w, R w_add, int N, int C, R eps); \
    void rmsnorm_bwd_##S(R *dx, R *dw, const R *dy, const R *x, const R *w, R w_add,             \
                         const R *rstd, int N, int C);                                           \
    void layernorm_fwd_##S(R *out, float *mean, float *rstd, const R *x, const R *w, const R *b,   \
                           int N, int C, R eps);                                                 \
    void layernorm_bwd_##S(R *dx, R *dw, R *db, const R *dy, const R *x, const R *w,             \
                           const float *mean, const float *rstd, int N, int C);                  \
    void gelu_fwd_##S(R *y, const R *x, size_t n);                                               \
    void gelu_bwd_##S(R *dx, const R *dy, const R *x, size_t n);                                 \
    void geglu_fwd_##S(R *h, const R *gate, const R *up, size_t n, int exact);                   \
    void geglu_bwd_##S(R *dgate, R *dup, const R *dh, const R *gate, const R *up, size_t n,      \
                       int exact);                                                               \
    void pos_fwd_##S(R *out, const R *wpe, int B, int T, int C);                                 \
    void pos_bwd_##S(R *dwpe, const R *dout, int B, int T, int C);                               \
    void rope_fwd_##S(R *x, const float *cosv, const float *sinv, const int32_t *pos, int B,    \
                      int T, int H, int D, int rot);                                            \
    void rope_bwd_##S(R *dx, const float *cosv, const float *sinv, const int32_t *pos, int B,   \
                      int T, int H, int D, int rot);                                            \
    int attention_block_##S(void);                                                               \
    void attention_fwd_##S(R *out, float *lse, const R *q, const R *k, const R *v, int B,        \
                           int T, int q0, int nq, int Hq, int Hkv, int D, int window,            \
                           const int32_t *doc_start, R scale, R softcap);                        \
    void attention_bwd_##S(R *dq, R *dk, R *dv, const R *dout, const R *q, const R *k,           \
                           const R *v, const R *out, const float *lse, int B, int T, int q0,     \
                           int nq, int Hq, int Hkv, int D, int window, const int32_t *doc_start, \
                           int accumulate, R scale, R softcap);                                  \
    void attention_chunking_##S(size_t kc_bytes, int qc);                                        \
    void swiglu_fwd_##S(R *h, const R *gate, const R *up, size_t n);                             \
    void dropout_##S(R *y, const R *x, size_t n, float p, uint64_t seed, size_t first);          \
    void swiglu_bwd_##S(R *dgate, R *dup, const R *dh, const R *gate, const R *up, size_t n);    \
    void classifier_ce_##S(float *losses, R *dx, R *dW, const R *x, const R *W,                  \
                           const int32_t *tgt, int N, int V, int C, R scale, R softcap);         \
    double sumsq_##S(const R *x, size_t n);                                                      \
    void exp_inplace_##S(R *x, size_t n);                                                        \
    void adamw_##S(R *p, const R *g, float *m, float *v, size_t n, float lr, float b1, float b2, \
                   float eps, float wd, float gscale, int t);                                    \
    void adamw8_##S(R *p, const R *g, uint8_t *qm, uint8_t *qv, float *am, float *av,            \
                    const float *map, size_t n, float lr, float b1, float b2, float eps, float wd, \
                    float gscale, int t, int flavor);                                           \
    uint8_t adam8_code_##S(const float *map, float x, int torchao);

DECLARE_KERNELS(float, f32)
DECLARE_KERNELS(float, f32_base)    // any x86-64
DECLARE_KERNELS(float, f32_avx2)    // AVX2 + FMA
DECLARE_KERNELS(float, f32_avx512)  // AVX-512 F/BW/DQ/VL
DECLARE_KERNELS(double, f64)

// Every kernel's name, for the per-CPU dispatch in kernels_f32.c.
#define KERNEL_NAMES(X) \
    X(matmul) X(matmul_many) X(add_bias) X(bias_grad) X(add) X(accumulate) X(scale) X(embedding_fwd) \
    X(embedding_bwd) X(rmsnorm_fwd) X(rmsnorm_bwd) X(layernorm_fwd) X(layernorm_bwd) \
    X(gelu_fwd) X(gelu_bwd) X(geglu_fwd) X(geglu_bwd) X(pos_fwd) X(pos_bwd) X(rope_fwd) X(rope_bwd) X(attention_block) \
    X(attention_fwd) X(attention_bwd) X(attention_chunking) X(swiglu_fwd) X(dropout) X(swiglu_bwd) X(classifier_ce) \
    X(sumsq) X(exp_inplace) X(adamw) X(adamw8) X(adam8_code)

// SwiGLU's outputs from this size up are written with streaming stores in the AVX2 and AVX-512
// variants (kernels.inc); test_cpu_variants checks those against the base variant too.
#define KERNEL_STREAM_MIN_BYTES ((size_t)4 << 20)

// Which variant name_f32 runs on this CPU: 0 base, 1 AVX2, 2 AVX-512.
int kernels_f32_level(void);
