// forward_backward.c: the forward and backward of Llama-family (and GPT-2) models over
// backend ops, written once; which hardware runs them is the backend's business. The model's
// table, memory and parameters are model.c's.
#include "model_internal.h"
#include "family.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "stb_ds.h"
#include "actstore.h"
#include "nf4.h"
#include "comm.h"
#include "cpu/kernels.h"
#include "seqpar.h"
#include "weights.h"
#include "util.h"

// ---- forward / backward -----------------------------------------------------------------

// The document map of the current batch for attention and RoPE (NULL: one document per row).
#define DOC_START(m) ((m)->has_docs ? (const int32_t *)(m)->doc_start : NULL)
#define DOC_POS(m) ((m)->has_pos ? (const int32_t *)(m)->pos : NULL)

// ---- attention spans ----------------------------------------------------------------------
// The attention half of a layer works on spans of rows: the whole batch, or (tiles) times
// t0 .. t0+n-1 of sequence b. A span's rows are contiguous: [b0*T + t0, + nb*n).
typedef struct { int b0, nb, t0, n; } Span;

static Span span_at(int B, int T, int rows, int k) {
    if (rows >= T) return (Span){0, B, 0, T};
    const int per = (T + rows - 1) / rows, t0 = (k % per) * rows;
    return (Span){k / per, 1, t0, T - t0 < rows ? T - t0 : rows};
}
static size_t span_r0(Span s, int T) { return (size_t)s.b0 * T + s.t0; }
static int span_rows(Span s) { return s.nb * s.n; }

// RoPE positions of rows from r0 (NULL: each row's index in its sequence, valid for whole rows).
static const int32_t *pos_at(const Model *m, size_t r0, Span s) {
    if (!m->has_pos && s.t0) fail("internal: a tile of rows without a position table");
    return m->has_pos ? (const int32_t *)m->pos + r0 : NULL;
}

// The attention's score scale: Gemma's query_pre_attn_scalar^-0.5 where it is not head_dim
// (Gemma 2 27B: 144 against 128; Gemma 3 27B: 168), else 0: the op's head_dim^-0.5.
static float att_scale(const ModelConfig *c) {
    const int qpas = c->query_pre_attn_scalar;
    return qpas > 0 && qpas != c->head_dim ? (float)(1.0 / sqrt((double)qpas)) : 0.0f;
}

// Attention for a span's queries against its sequences' keys: the backend's op, or through
// sequence parallelism's reshuffles (whole batch only) when each rank holds a slice of every
// sequence. q, out, dq, dout hold the span's rows; k, v, dk, dv, lse are whole. Gemma's score
// scale and soft-cap (ModelConfig.attn_softcap) go to the op.
static void attend_fwd(Model *m, void *out, float *lse, const void *q, const void *k, const void *v, Span s,
                       int T, int window) {
    const ModelConfig *c = &m->cfg;
    const int Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, D = c->head_dim;
    const int32_t *ds = DOC_START(m);
    if (m->sp) {
        seqpar_attention_fwd(m->sp, m->bk, out, lse, q, k, v, s.nb, window, ds, att_scale(c),
                             (float)c->attn_softcap);
        return;
    }
    const size_t kv = (size_t)s.b0 * T * Hkv * D;
    m->bk->attention_fwd(m->bk, out, lse + (size_t)s.b0 * Hq * T, q, act_at(m->bk, k, kv), act_at(m->bk, v, kv),
                         s.nb, T, s.t0, s.n, Hq, Hkv, D, window, ds ? ds + (size_t)s.b0 * T : NULL, att_scale(c),
                         (float)c->attn_softcap);
}

static void attend_bwd(Model *m, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                       const void *v, const void *out, const float *lse, Span s, int T, int window) {
    const ModelConfig *c = &m->cfg;
    const int Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, D = c->head_dim;
    const int32_t *ds = DOC_START(m);
    if (m->sp) {
        seqpar_attention_bwd(m->sp, m->bk, dq, dk, dv, dout, q, k, v, out, lse, s.nb, window, ds, att_scale(c),
                             (float)c->attn_softcap);
        return;
    }
    Backend *bk = m->bk;
    const size_t kv = (size_t)s.b0 * T * Hkv * D;
    // A sequence's first tile writes its key/value gradients, later tiles add to them (through
    // float sums when activations are bf16).
    float *fk = m->dkv_f32, *fv = fk ? fk + (size_t)m->B * T * Hkv * D : NULL;
    bk->attention_bwd(bk, dq, act_at(bk, dk, kv), act_at(bk, dv, kv), dout, q, act_at(bk, k, kv), act_at(bk, v, kv),
                      out, lse + (size_t)s.b0 * Hq * T, s.nb, T, s.t0, s.n, Hq, Hkv, D, window,
                      ds ? ds + (size_t)s.b0 * T : NULL, s.t0 > 0, fk ? fk + kv : NULL, fv ? fv + kv : NULL, att_scale(c),
                      (float)c->attn_softcap);
}

// A parameter on the device; a streamed one lives in its layer's slot while acquired.
// ZeRO-3: the gathered buffer that holds unit u now.
static void *z3_unit_buf(const Model *m, int u) {
    const int nl = m->tab.nl_units;
    if (u < nl) {
        if (m->z3_nl_unit != u) fail("internal: unit %d (embedding/head) used while unit %d is gathered", u, m->z3_nl_unit);
        return m->z3_nl;
    }
    for (int k = 0; k < 2; k++)
        if (m->z3_slot_layer[k] == u - nl) return m->z3_slot[k];
    fail("internal: layer %d used before it was gathered", u - nl);
}

static void *P(const Model *m, int i) {
    const ParamSpec *p = &m->tab.specs[i];
    if (p->quant) return act_at(m->bk, m->deq, p->deq_off);
    if (p->trainable && m->opt.zero_stage >= 3) {
        return act_at(m->bk, z3_unit_buf(m, p->unit), p->goff - m->tab.units[p->unit]);
    }
    return act_at(m->bk, p->streamed ? m->layer_block[p->layer] : m->params, p->offset);
}

static void z3_layer(Model *m, int l);
static void z3_reduce(Model *m, int u, float *full);

// Frozen-layer streaming around each use of layer l's weights; `next` is the layer the engine
// will need after it (prefetched now), -1 if none.
static void weights_acquire(Model *m, int l, int next) {
    if (m->opt.zero_stage >= 3) {
        // Gather this layer (if the slot does not hold it) and the next one into the other
        // slot. MPI's gathers are blocking, so on the CPU they do not overlap compute.
        z3_layer(m, l);
        m->z3_last = l;
        if (next >= 0) z3_layer(m, next);
    }
    if (m->streamer) {
        m->layer_block[l] = streamer_acquire(m->streamer, l);
        streamer_prefetch(m->streamer, next);
    }
    // QLoRA / load_in_8bit: dequantize the layer's matrices into the scratch, unless it already holds them
    // (a recompute followed by the same layer's backward dequantizes once).
    if (!m->tab.qregion || m->deq_layer == l) return;
    const char *region = m->streamer ? (const char *)m->layer_block[l] + quant_base(m)
                                     : (const char *)m->qweights + (size_t)l * m->tab.qregion;
    for (int k = 0; k < P_PER_LAYER; k++) {
        int i = param_index(&m->tab, l, k);
        if (i < 0 || !m->tab.specs[i].quant) continue;
        const ParamSpec *p = &m->tab.specs[i];
        m->bk->dequantize(m->bk, act_at(m->bk, m->deq, p->deq_off), region + p->qoff, p->numel,
                          p->quant == 8 ? REGION_INT8 : REGION_NF4);
    }
    m->deq_layer = l;
}
// After layer l's backward (grads != 0) its full gradients go to their owners (ZeRO-3).
static void weights_release(Model *m, int l, int grads) {
    if (m->streamer) streamer_release(m->streamer, l);
    if (grads && m->opt.zero_stage >= 3) z3_reduce(m, m->tab.nl_units + l, m->z3_layer_grad);
}
// Gradient (float) of a trainable tensor; NULL for a frozen one (its backward skips the weight
// grad).
static float *G(const Model *m, int i) {
    const ParamSpec *p = &m->tab.specs[i];
    if (!p->trainable) return NULL;
    if (m->lisa && p->layer >= 0 && !m->lisa->on[p->layer]) return NULL;  // LISA: not drawn this step
    if (m->opt.zero_stage >= 3)  // full-size gradients of the unit being back-propagated
        return (p->unit < m->tab.nl_units ? m->z3_nl_grad : m->z3_layer_grad) + (p->goff - m->tab.units[p->unit]);
    return model_grad_at(m, p, p->goff);
}

// ZeRO-3: all-gather unit u (every rank's piece) into buf. Under offload_params the piece
// comes up from host memory.
static void z3_gather(Model *m, int u, void *buf) {
    Comm *c = m->opt.comm;
    Backend *bk = m->bk;
    size_t s = unit_shard(&m->tab, u), loc = 0;
    for (int v = 0; v < u; v++) loc += unit_shard(&m->tab, v);
    if (!s) return;
    void *mine = act_at(bk, buf, (size_t)c->rank * s);
    if (m->opt.offload_params) bk->copy_h2d(bk, mine, act_at(bk, m->pieces, loc), s * bk->act_bytes, NULL);
    else bk->copy_d2d(bk, mine, act_at(bk, m->pieces, loc), s * bk->act_bytes, NULL);
    c->all_gather(c, buf, mine, s);
}

// ZeRO-3: sum unit u's full gradients over ranks into this rank's piece of the gradients.
static void z3_reduce(Model *m, int u, float *full) {
    Comm *c = m->opt.comm;
    Backend *bk = m->bk;
    size_t s = unit_shard(&m->tab, u), loc = 0;
    for (int v = 0; v < u; v++) loc += unit_shard(&m->tab, v);
    if (!s) return;
    // Padding past the unit's end is zero in every rank's buffer, so it reduces to zero.
    c->reduce_scatter_sum(c, full, full, s);
    if (!m->opt.offload_params) {
        bk->accumulate_f32(bk, m->grads + loc, full, s);
        return;
    }
    // offload_params: the piece goes down and is added on the host, one float add per element
    // as accumulate_f32 makes (the same bits). The wait keeps `full` from being overwritten by
    // the next unit's backward before the copy has read it.
    bk->copy_d2h(bk, m->z3_host_grad, full, s * sizeof(float), NULL);
    bk->sync(bk);
    accumulate_f32(m->grads + loc, m->z3_host_grad, s);  // the CPU's kernel, on host memory
}

void model_zero_grad_range(Model *m, float *g, size_t n) {
    if (m->opt.offload_params) memset(g, 0, n * sizeof(float));  // host memory
    else m->bk->memzero(m->bk, g, n * sizeof(float), NULL);
}

void model_zero_grads(Model *m) {
    model_zero_grad_range(m, m->grads, m->grads_n);
}

// ZeRO-3: unit u's full-size gradients in `full` start from zero.
static void z3_zero_grad(Model *m, int u, float *full) {
    m->bk->memzero(m->bk, full, unit_shard(&m->tab, u) * m->opt.comm->world * sizeof(float), NULL);
}

// The embedding's or the head's unit (u < nl_units) into z3_nl, unless it holds it already.
// The layer slots lie inside z3_nl (model.c): either gather spoils the other's contents. Every
// use goes through z3_unit_buf, which fails on a unit not gathered. All on one stream (the
// collectives and copies run on the compute stream), so a gather never overtakes a use.
static void z3_nl_gather(Model *m, int u) {
    if (m->z3_nl_unit == u) return;
    z3_gather(m, u, m->z3_nl);
    m->z3_nl_unit = u;
    m->z3_slot_layer[0] = m->z3_slot_layer[1] = -1;
}

// Gathered copies are valid until the next optimizer step; a pass starts with none.
static void z3_begin_pass(Model *m) {
    m->z3_slot_layer[0] = m->z3_slot_layer[1] = -1;
    m->z3_nl_unit = -1;
    z3_nl_gather(m, 0);
}

static void z3_layer(Model *m, int l) {
    for (int k = 0; k < 2; k++)
        if (m->z3_slot_layer[k] == l) return;
    int k = m->z3_slot_layer[0] == m->z3_last ? 1 : 0;  // never the slot just in use
    z3_gather(m, m->tab.nl_units + l, m->z3_slot[k]);
    m->z3_slot_layer[k] = l;
    m->z3_nl_unit = -1;
}

// ZeRO-3, after the layers: the head's unit into z3_nl for the final norm and the classifier
// (and, training, its gradients start from zero in z3_nl_grad); a tied embedding's unit, which
// holds the head, is gathered again (the layer slots overwrote it).
static void z3_head_begin(Model *m, int train) {
    if (m->opt.zero_stage < 3) return;
    if (m->tab.nl_units < 2) {
        z3_nl_gather(m, 0);
        return;
    }
    z3_nl_gather(m, 1);
    if (train)
        z3_zero_grad(m, 1, m->z3_nl_grad);
}

static void *LP(const Model *m, int l, int k) { return P(m, param_index(&m->tab, l, k)); }
static float *LG(const Model *m, int l, int k) { return G(m, param_index(&m->tab, l, k)); }

// Independent products in one call, side by side where the backend can.
static void matmuls(Backend *bk, const Matmul *j, int n) {
    if (bk->matmul_many) {
        bk->matmul_many(bk, j, n);
        return;
    }
    for (int i = 0; i < n; i++) {
        if (j[i].dw) bk->matmul_dw(bk, j[i].C, j[i].A, j[i].B, j[i].M, j[i].N, j[i].K, j[i].ta, j[i].tb, j[i].alpha);
        else bk->matmul(bk, j[i].C, j[i].A, j[i].B, j[i].M, j[i].N, j[i].K, j[i].ta, j[i].tb, j[i].alpha, j[i].beta);
    }
}

// The product of a linear layer's forward, y[N,out] = x[N,in] W^T.
static Matmul fwd_product(void *y, const void *x, const void *W, int N, int in, int out) {
    return (Matmul){.C = y, .A = x, .B = W, .M = N, .N = out, .K = in, .tb = 1, .alpha = 1.0f};
}

// y[N,out] = x[N,in] W^T (+ b)
static void linear_fwd(Backend *bk, void *y, const void *x, const void *W, const void *b, int N,
                       int in, int out) {
    bk->matmul(bk, y, x, W, N, out, in, 0, 1, 1.0f, 0.0f);
    if (b) bk->add_bias(bk, y, b, N, out);
}

// dx (=, or += when accumulate) dy W; dW += dy^T x; db += sum dy (float gradients). dx and dW
// are independent products: one call.
static void linear_bwd(Backend *bk, void *dx, float *dW, float *db, const void *dy, const void *x,
                       const void *W, int N, int in, int out, int accumulate) {
    Matmul j[2] = {{0}};  // np <= 2
    int n = 0;
    if (dx) j[n++] = (Matmul){.C = dx, .A = dy, .B = W, .M = N, .N = in, .K = out, .alpha = 1.0f,
                              .beta = accumulate ? 1.0f : 0.0f};
    if (dW) j[n++] = (Matmul){.C = dW, .A = dy, .B = x, .M = out, .N = in, .K = N, .ta = 1, .alpha = 1.0f, .dw = 1};
    if (n) matmuls(bk, j, n);
    if (db) bk->bias_grad(bk, db, dy, N, out);
}

// An optional parameter (a bias, GPT-2's final norm bias) or NULL.
static const void *opt_param_global(const Model *m, int i) { return i < 0 ? NULL : P(m, i); }
static const void *opt_param(const Model *m, int l, int k) {
    int i = param_index(&m->tab, l, k);
    return i < 0 ? NULL : P(m, i);
}
// Its gradient, or NULL (absent or frozen).
static float *opt_grad_global(const Model *m, int i) { return i < 0 ? NULL : G(m, i); }
static float *opt_grad(const Model *m, int l, int k) {
    int i = param_index(&m->tab, l, k);
    return i < 0 ? NULL : G(m, i);
}

// ---- LoRA: y += scale * B(A(dropout(x))) on an adapted projection -------------------------
static uint64_t lora_seed(const Model *m, int l, int t) {
    uint64_t z = m->dropout_seed ^ ((uint64_t)(l + 1) << 32) ^ (uint64_t)(t + 1) * 0x9E3779B97F4A7C15ULL;
    return z * 0xbf58476d1ce4e5b9ULL + 0x94d049bb133111ebULL;
}

// The dropped-out input (x itself when dropout is 0). Rows start at row0 of the micro-batch,
// so a tiled MLP draws the same mask as an untiled one.
static const void *lora_input(Model *m, int l, int t, const void *x, int row0, int N, int in) {
    if (m->tab.lora.dropout <= 0) return x;
    m->bk->dropout(m->bk, m->lora_xd, x, (size_t)N * in, m->tab.lora.dropout, lora_seed(m, l, t),
                   (m->row_base + (size_t)row0) * in);
    return m->lora_xd;
}


static void lora_fwd(Model *m, int l, int t, void *y, const void *x, int row0, int N, int in, int out) {
    size_t brow;
    const int s = model_lora_slot(m, l, t, &brow);
    if (s < 0 || m->adapters_off) return;
    Backend *bk = m->bk;
    const int r = m->tab.lora.r;
    const void *xd = lora_input(m, l, s, x, row0, N, in);
    const void *B = act_at(bk, LP(m, l, P_LORA_B + s), brow * r);
    bk->matmul(bk, m->lora_tmp, xd, LP(m, l, P_LORA_A + s), N, r, in, 0, 1, 1.0f, 0.0f);
    bk->matmul(bk, y, m->lora_tmp, B, N, out, r, 0, 1, m->tab.lora_scale, 1.0f);
}

// dx += the adapter path's input gradient; dA, dB accumulate. The [N, r] intermediate is
// recomputed rather than kept: it costs one thin matmul. (GPT-2's q, k and v each add their
// part to c_attn's shared dA.)
static void lora_bwd(Model *m, int l, int t, void *dx, const void *dy, const void *x, int row0,
                     int N, int in, int out) {
    size_t brow;
    const int sl = model_lora_slot(m, l, t, &brow);
    if (sl < 0) return;
    Backend *bk = m->bk;
    const int r = m->tab.lora.r;
    const float s = m->tab.lora_scale;
    const void *xd = lora_input(m, l, sl, x, row0, N, in);
    const void *A = LP(m, l, P_LORA_A + sl), *B = act_at(bk, LP(m, l, P_LORA_B + sl), brow * r);
    bk->matmul(bk, m->lora_tmp, xd, A, N, r, in, 0, 1, 1.0f, 0.0f);
    bk->matmul_dw(bk, LG(m, l, P_LORA_B + sl) + brow * r, dy, m->lora_tmp, out, r, N, 1, 0, s);  // fp32 grads
    bk->matmul(bk, m->lora_dtmp, dy, B, N, r, out, 0, 0, s, 0.0f);
    bk->matmul_dw(bk, LG(m, l, P_LORA_A + sl), m->lora_dtmp, xd, r, in, N, 1, 0, 1.0f);
    if (m->tab.lora.dropout <= 0) {
        bk->matmul(bk, dx, m->lora_dtmp, A, N, in, r, 0, 0, 1.0f, 1.0f);
    } else {
        bk->matmul(bk, m->lora_dxd, m->lora_dtmp, A, N, in, r, 0, 0, 1.0f, 0.0f);
        bk->dropout(bk, m->lora_dxd, m->lora_dxd, (size_t)N * in, m->tab.lora.dropout, lora_seed(m, l, sl),
                    (m->row_base + (size_t)row0) * in);
        bk->accumulate(bk, dx, m->lora_dxd, (size_t)N * in);
    }
}

// Two projections of the same rows x[n, in] (k and v; gate and up): the products in one
// call, then each output's bias and LoRA term. w and b are P_ indices (b -1: none).
typedef struct { void *y; int w, b, lora, out; } Proj;
static void projs_fwd(Model *m, int l, const Proj *p, int np, const void *x, int r0, int n, int in) {
    Backend *bk = m->bk;
    Matmul j[2] = {{0}};  // np <= 2
    for (int i = 0; i < np; i++) j[i] = fwd_product(p[i].y, x, LP(m, l, p[i].w), n, in, p[i].out);
    matmuls(bk, j, np);
    for (int i = 0; i < np; i++) {
        const void *b = p[i].b < 0 ? NULL : opt_param(m, l, p[i].b);
        if (b) bk->add_bias(bk, p[i].y, b, n, p[i].out);
        lora_fwd(m, l, p[i].lora, p[i].y, x, r0, n, in, p[i].out);
    }
}

// RMSNorm (Llama) or LayerNorm with bias (GPT-2) of rows [r0, r0+n) of an N-row tensor (x, out
// and dout point at row r0 already); stats holds N rstd, or N means then N rstd.
static void norm_fwd_rows(Model *m, void *out, float *stats, size_t N, size_t r0, const void *x, const void *w,
                          const void *b, int n) {
    Backend *bk = m->bk;
    const ModelConfig *c = &m->cfg;
    if (c->arch == ARCH_GPT2) bk->layernorm_fwd(bk, out, stats + r0, stats + N + r0, x, w, b, n, c->hidden_size, c->rms_norm_eps);
    else bk->rmsnorm_fwd(bk, out, stats + r0, x, w, family_norm_add(c), n, c->hidden_size, c->rms_norm_eps);
}

static void norm_bwd_rows(Model *m, void *dx, float *dw, float *db, const void *dout, const void *x, const void *w,
                          const float *stats, size_t N, size_t r0, int n) {
    Backend *bk = m->bk;
    if (m->cfg.arch == ARCH_GPT2)
        bk->layernorm_bwd(bk, dx, dw, db, dout, x, w, stats + r0, stats + N + r0, n, m->cfg.hidden_size);
    else bk->rmsnorm_bwd(bk, dx, dw, dout, x, w, family_norm_add(&m->cfg), stats + r0, n, m->cfg.hidden_size);
}

static void norm_fwd(Model *m, void *out, float *stats, const void *x, const void *w, const void *b, int N) {
    norm_fwd_rows(m, out, stats, N, 0, x, w, b, N);
}

// The gated MLP's activation: Llama's SwiGLU or Gemma's GeGLU.
static void glu_fwd(Model *m, void *h, const void *gate, const void *up, size_t n) {
    if (family_gelu_mlp(&m->cfg)) m->bk->geglu_fwd(m->bk, h, gate, up, n, m->cfg.gelu_exact);
    else m->bk->swiglu_fwd(m->bk, h, gate, up, n);
}
static void glu_bwd(Model *m, void *dgate, void *dup, const void *dh, const void *gate, const void *up, size_t n) {
    if (family_gelu_mlp(&m->cfg)) m->bk->geglu_bwd(m->bk, dgate, dup, dh, gate, up, n, m->cfg.gelu_exact);
    else m->bk->swiglu_bwd(m->bk, dgate, dup, dh, gate, up, n);
}

// A sandwich norm (Gemma 3) of rows [r0, r0+n): out = norm(x) (x, out pointing at row r0).
static void post_norm_fwd(Model *m, void *out, float *rstd, const void *x, int l, int kind, size_t r0, int n) {
    const ModelConfig *c = &m->cfg;
    m->bk->rmsnorm_fwd(m->bk, out, rstd + r0, x, LP(m, l, kind), family_norm_add(c), n, c->hidden_size, c->rms_norm_eps);
}
// Its backward: dx = d(norm input) rows, written (cleared first), from dy rows.
static void post_norm_bwd(Model *m, void *dx, const void *dy, const void *x, const float *rstd, int l, int kind,
                          size_t r0, int n) {
    Backend *bk = m->bk;
    const int C = m->cfg.hidden_size;
    bk->memzero(bk, dx, (size_t)n * C * bk->act_bytes, NULL);
    bk->rmsnorm_bwd(bk, dx, LG(m, l, kind), dy, x, LP(m, l, kind), family_norm_add(&m->cfg), rstd + r0, n, C);
}

// The MLP's first half for rows [r0, r0+n), into the tile buffers when tiled, else into the
// full tensors: Llama h = silu(gate) * up; GPT-2 h = gelu(fc), fc kept in the gate buffer.
static void mlp_tile_fwd(Model *m, int l, const LayerActs *a, int r0, int n) {
    const int tiled = m->pol.tiled_mlp;
    Backend *bk = m->bk;
    const int C = m->cfg.hidden_size, I = m->cfg.intermediate_size;
    const size_t off = tiled ? 0 : (size_t)r0 * I;
    const void *ln2 = tiled ? a->ln2 : act_at(bk, a->ln2, (size_t)r0 * C);
    void *gate = act_at(bk, a->gate, off), *up = act_at(bk, a->up, off), *h = act_at(bk, a->h, off);
    if (m->cfg.arch == ARCH_GPT2) {
        linear_fwd(bk, gate, ln2, LP(m, l, P_WUP), opt_param(m, l, P_BUP), n, C, I);
        lora_fwd(m, l, LORA_UP, gate, ln2, r0, n, C, I);
        bk->gelu_fwd(bk, h, gate, (size_t)n * I);
        return;
    }
    const Proj p[2] = {{gate, P_WGATE, -1, LORA_GATE, I}, {up, P_WUP, -1, LORA_UP, I}};
    projs_fwd(m, l, p, 2, ln2, r0, n, C);
    glu_fwd(m, h, gate, up, (size_t)n * I);
}

// The span's rows of a query-sized tensor (or ln1): the tile buffer itself under tiled
// attention, else a view into the whole tensor.
static void *qrows(const Model *m, void *t, size_t r0, size_t width) {
    return m->pol.tiled_attention ? t : act_at(m->bk, t, r0 * width);
}

// The RoPE tables of layer l: Gemma 3's sliding layers have their own (rope_local_base_freq).
#define ROPE_COS(m, l) (family_layer_local_rope(&(m)->cfg, l) ? (m)->rope_loc_cos : (m)->rope_cos)
#define ROPE_SIN(m, l) (family_layer_local_rope(&(m)->cfg, l) ? (m)->rope_loc_sin : (m)->rope_sin)

// RoPE, and first the per-head q/k norms of families that have them (Qwen3): q' =
// rope(rmsnorm(q) * q_norm), likewise k. Without norms the projection is rotated in place;
// with them a->q/a->k keep the projections and attention reads the copies in q_rot/k_rot, with
// each head row's rstd in qk_rstd (q rows, then k rows). Deterministic: remade in backward,
// they are bit-identical. Returns what attention reads.
static const void *q_rotate(Model *m, int l, void *q, Span s, int T) {
    Backend *bk = m->bk;
    const ModelConfig *c = &m->cfg;
    const int Hq = c->num_attention_heads, D = c->head_dim, n = span_rows(s);
    const size_t r0 = span_r0(s, T);
    void *x = q;
    if (m->q_rot) {
        x = qrows(m, m->q_rot, r0, (size_t)Hq * D);
        bk->rmsnorm_fwd(bk, x, m->qk_rstd + r0 * Hq, q, LP(m, l, P_QNORM), family_norm_add(c), n * Hq, D, c->rms_norm_eps);
    }
    bk->rope_fwd(bk, x, ROPE_COS(m, l), ROPE_SIN(m, l), pos_at(m, r0, s), s.nb, s.n, Hq, D, rope_dims(c));
    return x;
}

static void k_rotate(Model *m, int l, const LayerActs *a, Span s, int B, int T) {
    Backend *bk = m->bk;
    const ModelConfig *c = &m->cfg;
    const int Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, D = c->head_dim, n = span_rows(s);
    const size_t r0 = span_r0(s, T), N = (size_t)B * T;
    void *k = act_at(bk, a->k, r0 * Hkv * D), *x = k;
    if (m->k_rot) {
        x = act_at(bk, m->k_rot, r0 * Hkv * D);
        bk->rmsnorm_fwd(bk, x, m->qk_rstd + N * Hq + r0 * Hkv, k, LP(m, l, P_KNORM), family_norm_add(c), n * Hkv, D,
                        c->rms_norm_eps);
    }
    bk->rope_fwd(bk, x, ROPE_COS(m, l), ROPE_SIN(m, l), pos_at(m, r0, s), s.nb, s.n, Hkv, D, rope_dims(c));
}

// Norm, q/k/v projections, RoPE, attention and the output projection of a span's rows: x_mid =
// xin + o_proj(attention). Keys and values go to the whole a->k / a->v, earlier spans' included.
static void attn_fwd_span(Model *m, int l, const LayerActs *a, Span s, int B, int T) {
    Backend *bk = m->bk;
    const ModelConfig *c = &m->cfg;
    const int C = c->hidden_size, QD = c->num_attention_heads * c->head_dim;
    const int KD = c->num_key_value_heads * c->head_dim, n = span_rows(s);
    const size_t r0 = span_r0(s, T), N = (size_t)B * T;
    void *ln1 = qrows(m, a->ln1, r0, C), *q = qrows(m, a->q, r0, QD), *att = qrows(m, a->att, r0, QD);
    void *k = act_at(bk, a->k, r0 * KD), *v = act_at(bk, a->v, r0 * KD), *xm = act_at(bk, a->x_mid, r0 * C);
    const void *xin = act_at(bk, a->xin, r0 * C);
    norm_fwd_rows(m, ln1, a->rstd1, N, r0, xin, LP(m, l, P_LN1), opt_param(m, l, P_LN1B), n);
    // q alone, as tiled attention's backward remakes it: a batched product can differ in the
    // last bit from the same product alone (matmul_many), and the remade q must be the same.
    linear_fwd(bk, q, ln1, LP(m, l, P_WQ), opt_param(m, l, P_BQ), n, C, QD);
    lora_fwd(m, l, LORA_Q, q, ln1, r0, n, C, QD);
    const Proj p[2] = {{k, P_WK, P_BK, LORA_K, KD}, {v, P_WV, P_BV, LORA_V, KD}};
    projs_fwd(m, l, p, 2, ln1, r0, n, C);
    const void *qa = q;
    if (c->arch == ARCH_LLAMA) {  // GPT-2 has learned positions instead
        qa = q_rotate(m, l, q, s, T);
        k_rotate(m, l, a, s, B, T);
    }
    attend_fwd(m, att, a->lse, qa, m->k_rot ? m->k_rot : a->k, a->v, s, T, family_layer_window(c, l));
    // Gemma 3: o_proj's output is kept and normalized into x_mid before the residual.
    void *o = a->ao ? act_at(bk, a->ao, r0 * C) : xm;
    linear_fwd(bk, o, att, LP(m, l, P_WO), opt_param(m, l, P_BO), n, QD, C);
    lora_fwd(m, l, LORA_O, o, att, r0, n, QD, C);
    if (a->ao) post_norm_fwd(m, xm, a->rstd_pa, o, l, P_LNPA, r0, n);
    bk->accumulate(bk, xm, xin, (size_t)n * C);
}

// Every mode walks the same spans (tiles when the backend has query tiles): GEMMs of another
// height may round differently, and weight gradients must sum in one order, so tiled
// attention changes no bits.
static int span_count(int B, int T, int arows) { return att_span_count(B, T, arows); }

// ln2 of MLP chunk [r0, r0+n): into the chunk buffer (tiled MLP) or the whole tensor.
static void ln2_fwd(Model *m, int l, const LayerActs *a, int N, int r0, int n) {
    const size_t C = m->cfg.hidden_size;
    void *ln2 = m->pol.tiled_mlp ? a->ln2 : act_at(m->bk, a->ln2, (size_t)r0 * C);
    norm_fwd_rows(m, ln2, a->rstd2, N, r0, act_at(m->bk, a->x_mid, (size_t)r0 * C), LP(m, l, P_LN2),
                  opt_param(m, l, P_LN2B), n);
}

static void layer_forward(Model *m, int l, const LayerActs *a, void *out, int B, int T, int tile, int arows) {
    Backend *bk = m->bk;
    const ModelConfig *c = &m->cfg;
    const int N = B * T, C = c->hidden_size, I = c->intermediate_size;
    for (int k = 0, ns = span_count(B, T, arows); k < ns; k++) attn_fwd_span(m, l, a, span_at(B, T, arows, k), B, T);
    // The MLP runs over row chunks; tiled, a chunk's ln2, gate, up and h are all that exist of
    // them (T x intermediate never does).
    for (int r0 = 0; r0 < N; r0 += tile) {
        int n = N - r0 < tile ? N - r0 : tile;
        ln2_fwd(m, l, a, N, r0, n);
        mlp_tile_fwd(m, l, a, r0, n);
        const void *h = m->pol.tiled_mlp ? a->h : act_at(bk, a->h, (size_t)r0 * I);
        void *y = act_at(bk, out, (size_t)r0 * C), *o = a->fo ? act_at(bk, a->fo, (size_t)r0 * C) : y;
        linear_fwd(bk, o, h, LP(m, l, P_WDOWN), opt_param(m, l, P_BDOWN), n, I, C);
        lora_fwd(m, l, LORA_DOWN, o, h, r0, n, I, C);
        if (a->fo) post_norm_fwd(m, y, a->rstd_pf, o, l, P_LNPF, r0, n);  // Gemma 3
    }
    bk->accumulate(bk, out, a->x_mid, (size_t)N * C);
}

// Selective checkpointing keeps matmul and attention outputs; these are the cheap rest (under
// tiled attention ln1 is remade tile by tile in backward anyway).
static void recompute_cheap(Model *m, int l, const LayerActs *a, int N) {
    Backend *bk = m->bk;
    const ModelConfig *c = &m->cfg;
    if (!m->pol.tiled_attention) norm_fwd(m, a->ln1, a->rstd1, a->xin, LP(m, l, P_LN1), opt_param(m, l, P_LN1B), N);
    if (m->pol.tiled_mlp) return;  // ln2 and the MLP are remade chunk by chunk
    norm_fwd(m, a->ln2, a->rstd2, a->x_mid, LP(m, l, P_LN2), opt_param(m, l, P_LN2B), N);
    if (c->arch == ARCH_GPT2) bk->gelu_fwd(bk, a->h, a->gate, (size_t)N * c->intermediate_size);
    else glu_fwd(m, a->h, a->gate, a->up, (size_t)N * c->intermediate_size);
}

// On entry m->d_res holds dLoss/d(layer output); on exit dLoss/d(layer input).
static void layer_backward(Model *m, int l, const LayerActs *a, int B, int T, int tile, int arows) {
    Backend *bk = m->bk;
    const ModelConfig *c = &m->cfg;
    const int N = B * T, C = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    const int Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, QD = Hq * D, KD = Hkv * D;
    const int tiled = m->pol.tiled_attention, window = family_layer_window(c, l);
    // MLP: out = x_mid + down(silu(gate) * up); d_res carries d(out) = part of d(x_mid). Chunk
    // by chunk, ending with ln2's backward for the chunk's rows (so its weight gradient sums
    // per chunk in every mode). Tiled: the chunk's ln2, gate, up and h are remade first.
    for (int r0 = 0; r0 < N; r0 += tile) {
        int n = N - r0 < tile ? N - r0 : tile;
        if (m->pol.tiled_mlp) ln2_fwd(m, l, a, N, r0, n), mlp_tile_fwd(m, l, a, r0, n);
        const size_t off = m->pol.tiled_mlp ? 0 : (size_t)r0 * I;
        const void *dres = act_at(bk, m->d_res, (size_t)r0 * C), *dy = dres;
        const void *ln2 = m->pol.tiled_mlp ? a->ln2 : act_at(bk, a->ln2, (size_t)r0 * C);
        void *dln2 = act_at(bk, m->d_ln, (size_t)r0 * C);
        const void *h = act_at(bk, a->h, off);
        if (a->fo) {  // Gemma 3: through the output's norm first, into dln2's rows (free until the gate's backward)
            post_norm_bwd(m, dln2, dres, act_at(bk, a->fo, (size_t)r0 * C), a->rstd_pf, l, P_LNPF, r0, n);
            dy = dln2;
        }
        linear_bwd(bk, m->d_ff1, LG(m, l, P_WDOWN), opt_grad(m, l, P_BDOWN), dy, h, LP(m, l, P_WDOWN), n, I, C, 0);
        lora_bwd(m, l, LORA_DOWN, m->d_ff1, dy, h, r0, n, I, C);
        if (c->arch == ARCH_GPT2) {
            bk->gelu_bwd(bk, m->d_ff1, m->d_ff1, act_at(bk, a->gate, off), (size_t)n * I);
            linear_bwd(bk, dln2, LG(m, l, P_WUP), opt_grad(m, l, P_BUP), m->d_ff1, ln2, LP(m, l, P_WUP), n, C, I, 0);
            lora_bwd(m, l, LORA_UP, dln2, m->d_ff1, ln2, r0, n, C, I);
        } else {
            glu_bwd(m, m->d_ff1, m->d_ff2, m->d_ff1, act_at(bk, a->gate, off), act_at(bk, a->up, off), (size_t)n * I);
            linear_bwd(bk, dln2, LG(m, l, P_WGATE), NULL, m->d_ff1, ln2, LP(m, l, P_WGATE), n, C, I, 0);
            lora_bwd(m, l, LORA_GATE, dln2, m->d_ff1, ln2, r0, n, C, I);
            linear_bwd(bk, dln2, LG(m, l, P_WUP), NULL, m->d_ff2, ln2, LP(m, l, P_WUP), n, C, I, 1);
            lora_bwd(m, l, LORA_UP, dln2, m->d_ff2, ln2, r0, n, C, I);
        }
        norm_bwd_rows(m, (void *)dres, LG(m, l, P_LN2), opt_grad(m, l, P_LN2B), dln2,
                      act_at(bk, a->x_mid, (size_t)r0 * C), LP(m, l, P_LN2), a->rstd2, N, r0, n);
    }
    // Attention: x_mid = x + o_proj(att); d_res now holds d(x_mid), which is also part of d(x).
    // Query spans in order: d(att), then attention's backward, which gives the span's dq and
    // adds to the whole dk/dv; then the q projection. Tiled, each span's ln1, q and attention
    // output are remade first (bit-identical to the forward's).
    const int ns = span_count(B, T, arows);
    const void *ka = a->k;
    if (m->k_rot) k_rotate(m, l, a, span_at(B, T, T, 0), B, T), ka = m->k_rot;  // remade from the kept projections
    for (int k = 0; k < ns; k++) {
        const Span s = span_at(B, T, arows, k);
        const size_t r0 = span_r0(s, T);
        const int n = span_rows(s);
        void *ln1 = qrows(m, a->ln1, r0, C), *q = qrows(m, a->q, r0, QD), *att = qrows(m, a->att, r0, QD);
        void *datt = qrows(m, m->d_att, r0, QD), *dq = qrows(m, m->d_q, r0, QD), *dln = act_at(bk, m->d_ln, r0 * C);
        const void *dy = act_at(bk, m->d_res, r0 * C);
        if (tiled) {
            norm_fwd_rows(m, ln1, a->rstd1, N, r0, act_at(bk, a->xin, r0 * C), LP(m, l, P_LN1), opt_param(m, l, P_LN1B), n);
            linear_fwd(bk, q, ln1, LP(m, l, P_WQ), opt_param(m, l, P_BQ), n, C, QD);
            lora_fwd(m, l, LORA_Q, q, ln1, r0, n, C, QD);
        }
        // Rotated in place (no q norms) a kept q is ready; a remade one, or the q-norm copy, is made here.
        const void *qa = c->arch == ARCH_LLAMA && (tiled || m->q_rot) ? q_rotate(m, l, q, s, T) : q;
        if (tiled) attend_fwd(m, att, a->lse, qa, ka, a->v, s, T, window);
        if (a->ao) {  // Gemma 3: through o_proj's output norm, into dln's rows (free until q's backward)
            post_norm_bwd(m, dln, dy, act_at(bk, a->ao, r0 * C), a->rstd_pa, l, P_LNPA, r0, n);
            dy = dln;
        }
        linear_bwd(bk, datt, LG(m, l, P_WO), opt_grad(m, l, P_BO), dy, att, LP(m, l, P_WO), n, QD, C, 0);
        lora_bwd(m, l, LORA_O, datt, dy, att, r0, n, QD, C);
        attend_bwd(m, dq, m->d_k, m->d_v, datt, qa, ka, a->v, att, a->lse, s, T, window);
        void *dqx = dq;
        if (c->arch == ARCH_LLAMA)
            bk->rope_bwd(bk, dq, ROPE_COS(m, l), ROPE_SIN(m, l), pos_at(m, r0, s), s.nb, s.n, Hq, D, rope_dims(c));
        if (m->q_rot) {  // through the q norm; the rotated copy is dead now and takes the gradient
            dqx = qrows(m, m->q_rot, r0, QD);
            bk->memzero(bk, dqx, (size_t)n * QD * bk->act_bytes, NULL);
            bk->rmsnorm_bwd(bk, dqx, opt_grad(m, l, P_QNORM), dq, q, LP(m, l, P_QNORM), family_norm_add(c),
                            m->qk_rstd + r0 * Hq, n * Hq, D);
        }
        linear_bwd(bk, dln, LG(m, l, P_WQ), opt_grad(m, l, P_BQ), dqx, ln1, LP(m, l, P_WQ), n, C, QD, 0);
        lora_bwd(m, l, LORA_Q, dln, dqx, ln1, r0, n, C, QD);
    }
    // Keys and values: their gradients are whole now.
    void *dk = m->d_k;
    if (c->arch == ARCH_LLAMA) bk->rope_bwd(bk, m->d_k, ROPE_COS(m, l), ROPE_SIN(m, l), DOC_POS(m), B, T, Hkv, D, rope_dims(c));
    if (m->k_rot) {
        bk->memzero(bk, m->k_rot, (size_t)N * KD * bk->act_bytes, NULL);
        bk->rmsnorm_bwd(bk, m->k_rot, opt_grad(m, l, P_KNORM), m->d_k, a->k, LP(m, l, P_KNORM), family_norm_add(c),
                        m->qk_rstd + (size_t)N * Hq, N * Hkv, D);
        dk = m->k_rot;
    }
    for (int k = 0; k < ns; k++) {
        const Span s = span_at(B, T, arows, k);
        const size_t r0 = span_r0(s, T);
        const int n = span_rows(s);
        void *ln1 = qrows(m, a->ln1, r0, C), *dln = act_at(bk, m->d_ln, r0 * C);
        const void *xin = act_at(bk, a->xin, r0 * C), *dks = act_at(bk, dk, r0 * KD), *dvs = act_at(bk, m->d_v, r0 * KD);
        if (tiled) norm_fwd_rows(m, ln1, a->rstd1, N, r0, xin, LP(m, l, P_LN1), opt_param(m, l, P_LN1B), n);
        linear_bwd(bk, dln, LG(m, l, P_WK), opt_grad(m, l, P_BK), dks, ln1, LP(m, l, P_WK), n, C, KD, 1);
        lora_bwd(m, l, LORA_K, dln, dks, ln1, r0, n, C, KD);
        linear_bwd(bk, dln, LG(m, l, P_WV), opt_grad(m, l, P_BV), dvs, ln1, LP(m, l, P_WV), n, C, KD, 1);
        lora_bwd(m, l, LORA_V, dln, dvs, ln1, r0, n, C, KD);
        norm_bwd_rows(m, act_at(bk, m->d_res, r0 * C), LG(m, l, P_LN1), opt_grad(m, l, P_LN1B), dln, xin,
                      LP(m, l, P_LN1), a->rstd1, N, r0, n);
    }
}

// Gemma's embedding scale, sqrt(hidden_size) in the activations' type (transformers multiplies
// by the scale cast to the weights' dtype: bf16 weights, a bf16 scale).
static float embed_scale(const Model *m) {
    float s = (float)sqrt((double)m->cfg.hidden_size);
    if (m->bk->act_bytes != 2) return s;
    const uint32_t x = (uint32_t)float_to_bf16(s) << 16;
    memcpy(&s, &x, 4);
    return s;
}

// Forward through every layer; each layer's kept tensors go where the store says.
static void forward_layers(Model *m, ActStore *st, int B, int T, int for_backward) {
    Backend *bk = m->bk;
    const int N = B * T, L = m->cfg.num_hidden_layers;
    void *x0 = act_fwd_output(st, -1);
    bk->embedding_fwd(bk, x0, m->tokens, P(m, m->tab.embed), N, m->cfg.hidden_size);
    if (family_embed_scale(&m->cfg)) bk->scale(bk, x0, embed_scale(m), (size_t)N * m->cfg.hidden_size);
    if (m->tab.pos_embed >= 0) bk->pos_fwd(bk, x0, P(m, m->tab.pos_embed), B, T, m->cfg.hidden_size);
    for (int l = 0; l < L; l++) {
        LayerActs a;
        act_fwd_layer(st, l, &a);
        weights_acquire(m, l, l + 1 < L ? l + 1 : -1);
        layer_forward(m, l, &a, act_fwd_output(st, l), B, T, act_tile_rows(st), act_att_rows(st));
        weights_release(m, l, 0);
        act_fwd_done(st, l, for_backward);
    }
}

// Backward through every layer, top down. Full checkpointing works a segment at a time:
// recompute its layers forward from the kept input, then run their backward.
static void backward_layers(Model *m, int B, int T) {
    ActStore *st = m->store;
    act_bwd_begin(st);
    for (int l = m->cfg.num_hidden_layers - 1; l >= 0;) {
        int s = act_segment_start(st, l), full = m->pol.recompute == RC_FULL;
        // The layer whose weights are needed after this segment: the next segment's first
        // recomputed layer, or simply the layer below.
        int after = s == 0 ? -1 : full ? act_segment_start(st, s - 1) : s - 1;
        LayerActs a;
        if (full)
            for (int j = s; j <= l; j++) {
                LayerActs next;
                act_bwd_layer(st, j, &a);
                if (j < l) act_bwd_layer(st, j + 1, &next);  // in the segment: no fetch
                weights_acquire(m, j, j < l ? j + 1 : (l > s ? l - 1 : after));
                layer_forward(m, j, &a, j < l ? next.xin : act_recompute_sink(st), B, T, act_tile_rows(st),
                              act_att_rows(st));
                weights_release(m, j, 0);
            }
        for (int j = l; j >= s; j--) {
            act_bwd_layer(st, j, &a);
            weights_acquire(m, j, j > s ? j - 1 : after);
            if (m->pol.recompute == RC_SELECTIVE) recompute_cheap(m, j, &a, B * T);
            if (m->opt.zero_stage >= 3)
                z3_zero_grad(m, m->tab.nl_units + j, m->z3_layer_grad);
            layer_backward(m, j, &a, B, T, act_tile_rows(st), act_att_rows(st));
            weights_release(m, j, 1);
        }
        act_bwd_layer_done(st, s);
        l = s - 1;
    }
}

// The lookup's gradient into the embedding. transformers builds it as nn.Embedding(...,
// padding_idx=pad_token_id), whose backward adds nothing to that row: the row (which may
// hold a tied head's gradient and earlier micro-batches') is kept across the scatter.
static void embedding_bwd(Model *m, int N) {
    Backend *bk = m->bk;
    const int C = m->cfg.hidden_size;
    // The gradient is float whatever the activations are (bf16 on the GPU took half the row
    // at the wrong place before 2026-12-02: test_cuda_emu_train (h), Gemma's pad row 0).
    float *g = G(m, m->tab.embed), *pad = m->pad_row ? g + (size_t)m->cfg.pad_token_id * C : NULL;
    if (pad) bk->copy_d2d(bk, m->pad_row, pad, (size_t)C * sizeof(float), NULL);
    if (family_embed_scale(&m->cfg)) bk->scale(bk, m->d_res, embed_scale(m), (size_t)N * C);
    bk->embedding_bwd(bk, g, m->d_res, m->tokens, N, C, m->cfg.vocab_size);
    if (pad) bk->copy_d2d(bk, pad, m->pad_row, (size_t)C * sizeof(float), NULL);
}

// The forward up to the token losses (m->losses), and ZeRO-3's head gathered for what follows.
// for_backward keeps what the backward needs. Returns the final residual.
static void *forward_to_head(Model *m, int B, int T, int for_backward) {
    if (B != m->B || T != m->T) fail("internal: batch %dx%d differs from the activations' %dx%d", B, T, m->B, m->T);
    // ZeRO-3: the embedding's unit is gathered for the lookup (tied, it holds the head too and
    // stays for the pass; its gradients start from zero here and are reduced at the end).
    if (m->opt.zero_stage >= 3) {
        z3_begin_pass(m);
        if (for_backward && m->tab.nl_units == 1) z3_zero_grad(m, 0, m->z3_nl_grad);
    }
    forward_layers(m, m->store, B, T, for_backward);
    z3_head_begin(m, for_backward);
    return act_final_residual(m->store);
}

// The final norm of rows [r0, r0+n) into m->final_ln (a chunk: the norm's output exists one
// of the MLP's row chunks at a time).
static void final_norm_chunk(Model *m, void *res, int N, int r0, int n) {
    const ParamTable *t = &m->tab;
    norm_fwd_rows(m, m->final_ln, m->final_rstd, N, r0, act_at(m->bk, res, (size_t)r0 * m->cfg.hidden_size),
                  P(m, t->final_norm), opt_param_global(m, t->final_norm_bias), n);
}

// The classifier of rows [r0, r0+n) whose final norm is in m->final_ln from row c0 on: the
// token losses, and with grad their gradients times scale into d_ln and the head's gradient.
static void head_rows(Model *m, int c0, int r0, int n, int grad, float scale) {
    Backend *bk = m->bk;
    const int C = m->cfg.hidden_size;
    bk->classifier_ce(bk, m->losses + r0, grad ? act_at(bk, m->d_ln, (size_t)r0 * C) : NULL,
                      grad ? G(m, m->tab.lm_head) : NULL, act_at(bk, m->final_ln, (size_t)(r0 - c0) * C),
                      P(m, m->tab.lm_head), m->targets + r0, n, m->cfg.vocab_size, C, scale,
                      (float)m->cfg.final_softcap);
}

// A token classifier's head (a process reward model) on rows [r0, r0+n), their final norm in
// m->final_ln: each row's classes score.weight h + score.bias, brought to the host, where every
// labelled row's cross-entropy goes to m->losses (0 for the rest) and, with grad, its d logits
// (softmax - onehot) x scale return for the products: d final_ln = dlogits score.weight,
// score.weight += dlogits^T h, score.bias += the column sums. Also counts the argmax hits.
static void token_cls_rows(Model *m, int r0, int n, int grad, float scale) {
    Backend *bk = m->bk;
    const ParamTable *t = &m->tab;
    const int C = m->cfg.hidden_size, K = m->cfg.num_labels;
    float *lg = xmalloc(sizeof(float) * (size_t)n * (K + 1)), *loss = lg + (size_t)n * K;
    int32_t *tgt = xmalloc(sizeof(int32_t) * (size_t)n);
    bk->matmul(bk, m->logits, m->final_ln, P(m, t->lm_head), n, K, C, 0, 1, 1.0f, 0.0f);
    bk->add_bias(bk, m->logits, P(m, t->score_bias), n, K);
    bk->download_act(bk, lg, m->logits, (size_t)n * K);
    bk->copy_d2h(bk, tgt, m->targets + r0, sizeof(int32_t) * (size_t)n, NULL);
    bk->sync(bk);
    for (int r = 0; r < n; r++) {
        float *z = lg + (size_t)r * K;
        loss[r] = 0;
        if (tgt[r] < 0 || tgt[r] >= K) {  // unlabelled (the rows file holds labels below 2 = K)
            for (int k = 0; k < K; k++) z[k] = 0;
            continue;
        }
        double mx = z[0], sum = 0;
        int best = 0;
        for (int k = 1; k < K; k++)
            if (z[k] > mx) mx = z[k], best = k;
        for (int k = 0; k < K; k++) sum += exp(z[k] - mx);
        loss[r] = (float)(log(sum) + mx - z[tgt[r]]);
        m->cls_correct += best == tgt[r], m->cls_labelled++;
        for (int k = 0; k < K; k++) z[k] = (float)((exp(z[k] - mx) / sum - (k == tgt[r])) * scale);
    }
    bk->copy_h2d(bk, m->losses + r0, loss, sizeof(float) * (size_t)n, NULL);
    if (grad) {
        bk->upload_act(bk, m->logits, lg, (size_t)n * K);
        bk->matmul(bk, act_at(bk, m->d_ln, (size_t)r0 * C), m->logits, P(m, t->lm_head), n, C, K, 0, 0, 1.0f, 0.0f);
        if (G(m, t->lm_head)) bk->matmul_dw(bk, G(m, t->lm_head), m->logits, m->final_ln, K, C, n, 1, 0, 1.0f);
        if (G(m, t->score_bias)) bk->bias_grad(bk, G(m, t->score_bias), m->logits, n, K);
    }
    bk->sync(bk);  // lg and loss are freed below; copies may be asynchronous
    free(lg);
    free(tgt);
}

// From d_ln (dLoss/d final norm output) down through the final norm, the layers and the
// embedding into the gradients.
static void backward_from_head(Model *m, int B, int T, void *res) {
    Backend *bk = m->bk;
    const ParamTable *t = &m->tab;
    const int N = B * T, C = m->cfg.hidden_size, R = act_tile_rows(m->store);
    bk->memzero(bk, m->d_res, (size_t)N * C * bk->act_bytes, NULL);
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = N - r0 < R ? N - r0 : R;
        norm_bwd_rows(m, act_at(bk, m->d_res, (size_t)r0 * C), G(m, t->final_norm),
                      opt_grad_global(m, t->final_norm_bias), act_at(bk, m->d_ln, (size_t)r0 * C),
                      act_at(bk, res, (size_t)r0 * C), P(m, t->final_norm), m->final_rstd, N, r0, n);
    }
    // An untied head's gradients are complete: reduced now, and z3_nl_grad is the embedding's
    // after the layers' backward.
    const int split = m->opt.zero_stage >= 3 && t->nl_units == 2;
    if (split) z3_reduce(m, 1, m->z3_nl_grad);
    backward_layers(m, B, T);
    if (split) z3_zero_grad(m, 0, m->z3_nl_grad);
    if (G(m, t->embed)) embedding_bwd(m, N);
    if (t->pos_embed >= 0 && G(m, t->pos_embed)) bk->pos_bwd(bk, G(m, t->pos_embed), m->d_res, B, T, C);
    if (m->opt.zero_stage >= 3) z3_reduce(m, 0, m->z3_nl_grad);
}

double model_forward_backward(Model *m, int B, int T, float loss_scale) {
    const int N = B * T, R = act_tile_rows(m->store);
    const int train = loss_scale > 0;
    void *res = forward_to_head(m, B, T, train);
    // The fused classifier produces d(final_ln) and the head's gradient in the same pass.
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = N - r0 < R ? N - r0 : R;
        final_norm_chunk(m, res, N, r0, n);
        if (m->cfg.token_cls) token_cls_rows(m, r0, n, train, loss_scale);
        else head_rows(m, r0, r0, n, train, loss_scale);
    }
    double loss = m->bk->sum_f32(m->bk, m->losses, N);
    if (train) backward_from_head(m, B, T, res);
    return loss;
}

// Preference losses need every row's log-likelihood before any gradient can be scaled: the
// forward ends at the token losses, and the backward runs the classifier again (one more head
// product per token) with each row's own scale.
void model_forward_rows(Model *m, int B, int T, int for_backward, const int *split, double *row_loss,
                        double *head_loss) {
    const int N = B * T, R = act_tile_rows(m->store);
    void *res = forward_to_head(m, B, T, for_backward);
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = N - r0 < R ? N - r0 : R;
        final_norm_chunk(m, res, N, r0, n);
        head_rows(m, r0, r0, n, 0, 0.0f);
    }
    float *tl = xmalloc(sizeof(float) * (size_t)N);
    m->bk->copy_d2h(m->bk, tl, m->losses, sizeof(float) * (size_t)N, NULL);
    m->bk->sync(m->bk);
    for (int b = 0; b < B; b++) {
        const int h = split ? split[b] : 0;
        double s = 0, sh = 0;
        for (int t = 0; t < h; t++) sh += tl[(size_t)b * T + t];
        for (int t = h; t < T; t++) s += tl[(size_t)b * T + t];
        row_loss[b] = s;
        if (split) head_loss[b] = sh;
    }
    free(tl);
}

void model_backward_rows(Model *m, int B, int T, const float *row_scale, const int *split, const float *head_scale) {
    const int N = B * T, R = act_tile_rows(m->store);
    void *res = act_final_residual(m->store);
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = N - r0 < R ? N - r0 : R;
        final_norm_chunk(m, res, N, r0, n);
        for (int p0 = r0; p0 < r0 + n;) {  // the chunk's pieces of each row, its head apart
            const int b = p0 / T, h = b * T + (split ? split[b] : 0);
            int p1 = (b + 1) * T < r0 + n ? (b + 1) * T : r0 + n;
            if (p0 < h && h < p1) p1 = h;
            head_rows(m, r0, p0, p1 - p0, 1, p0 < h ? head_scale[b] : row_scale[b]);
            p0 = p1;
        }
    }
    backward_from_head(m, B, T, res);
}

// A reward model's rows end at one number each: score.weight . final_norm(h) at the row's
// position pos[b] (-1: none here, score 0; sequence parallel ranks hold other positions). Only
// the chunks that hold such a position are normalized.
void model_forward_scores(Model *m, int B, int T, int for_backward, const int *pos, double *score) {
    Backend *bk = m->bk;
    const int N = B * T, R = act_tile_rows(m->store), C = m->cfg.hidden_size;
    void *res = forward_to_head(m, B, T, for_backward);
    for (int b = 0; b < B; b++) score[b] = 0;
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = N - r0 < R ? N - r0 : R;
        int normed = 0;
        for (int b = 0; b < B; b++) {
            const int row = b * T + pos[b];
            if (pos[b] < 0 || row < r0 || row >= r0 + n) continue;
            if (!normed) final_norm_chunk(m, res, N, r0, n), normed = 1;
            bk->matmul(bk, m->logits, act_at(bk, m->final_ln, (size_t)(row - r0) * C), P(m, m->tab.lm_head), 1, 1, C,
                       0, 1, 1.0f, 0.0f);
            float v;
            bk->download_act(bk, &v, m->logits, 1);
            score[b] = v;
        }
    }
}

// d(loss)/d(score) of each row into the model: d final_norm(h) at pos[b] is dscore[b] times
// score.weight (every other position 0), and score.weight's gradient gets dscore[b] times the
// normalized row; products with K = 1 against a device 1, alpha the float scale.
void model_backward_scores(Model *m, int B, int T, const int *pos, const float *dscore) {
    Backend *bk = m->bk;
    const int N = B * T, R = act_tile_rows(m->store), C = m->cfg.hidden_size;
    void *res = act_final_residual(m->store);
    float *dW = G(m, m->tab.lm_head);
    const float one = 1.0f;
    bk->memzero(bk, m->d_ln, (size_t)N * C * bk->act_bytes, NULL);
    bk->upload_act(bk, m->logits, &one, 1);
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = N - r0 < R ? N - r0 : R;
        final_norm_chunk(m, res, N, r0, n);  // every chunk: the norm's backward reads each row's rstd
        for (int b = 0; b < B; b++) {
            const int row = b * T + pos[b];
            if (pos[b] < 0 || row < r0 || row >= r0 + n) continue;
            bk->matmul(bk, act_at(bk, m->d_ln, (size_t)row * C), m->logits, P(m, m->tab.lm_head), 1, C, 1, 0, 0,
                       dscore[b], 0.0f);
            if (dW) bk->matmul_dw(bk, dW, m->logits, act_at(bk, m->final_ln, (size_t)(row - r0) * C), 1, C, 1, 0, 0,
                                  dscore[b]);
        }
    }
    backward_from_head(m, B, T, res);
}

// Sampling runs forward only at batch 1 on its own small store: one layer's working set plus
// each layer's input (nothing is kept for a backward).
void model_last_logits(Model *m, int T, float *out) {
    Backend *bk = m->bk;
    const ModelConfig *c = &m->cfg;
    const int C = c->hidden_size;
    if (!m->sample_store) {
        MemPolicy p = {.recompute = RC_FULL, .every = 1, .tier = TIER_DEVICE,
                       .tiled_mlp = m->pol.tiled_mlp, .mlp_shards = m->pol.mlp_shards,
                       .tiled_attention = m->pol.tiled_attention};
        m->sample_store = actstore_create(bk, c, &p, 1, m->T, bk->att_block);
        act_set_sink(m->sample_store, m->d_ln);
    }
    if (m->opt.zero_stage >= 3) z3_begin_pass(m);
    forward_layers(m, m->sample_store, 1, T, 0);
    z3_head_begin(m, 0);
    void *res = act_final_residual(m->sample_store);
    // Only the last position's logits are needed: its row alone is normalized.
    norm_fwd_rows(m, m->final_ln, m->final_rstd, T, T - 1, act_at(bk, res, (size_t)(T - 1) * C),
                  P(m, m->tab.final_norm), opt_param_global(m, m->tab.final_norm_bias), 1);
    bk->matmul(bk, m->logits, m->final_ln, P(m, m->tab.lm_head),
               1, c->vocab_size, C, 0, 1, 1.0f, 0.0f);
    bk->download_act(bk, out, m->logits, c->vocab_size);
    if (c->final_softcap > 0)  // as the classifier caps them (Gemma 2's final_logit_softcapping)
        for (int v = 0; v < c->vocab_size; v++) out[v] = (float)(c->final_softcap * tanh(out[v] / c->final_softcap));
}
