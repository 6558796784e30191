// dev/cuda/attention.cu: causal GQA flash attention forward (out, lse) and backward (dq, dk, dv)
// against a naive double reference (full softmax per row); shapes exercise GQA groups, T not a
// multiple of the tile, the WMMA bf16 path (D 16/64/128), the generic path (fp32, odd D, and
// bf16 forced generic); the masks of backend.h: a sliding window (keys i - W < j <= i) and
// packed documents (doc_start: keys of the query's own document only), alone and together,
// with documents and windows short enough that whole key tiles are skipped; the backward must
// be bit-identical on repeat; on the mma path the backward in one grid (LLMC_ATT_BWD_ONE_GRID) must
// give the two kernels' bits, with GQA, dK/dV in parts (LLMC_ATT_KV_SPLIT) must meet the same
// tolerances, whole and over query tiles, and the pipelined kernels (LLMC_ATT_PIPELINE) must give
// the same bits as the others. Then TFLOP/s (causal FLOPs: forward 2 * 2 * B * Hq * T^2/2 * D,
// backward 2.5x that).
#include <algorithm>
#include "dev_common.cuh"

struct Ref {
    std::vector<double> out, lse, dq, dk, dv;
};

// lo(i): the first key query i of row b sees (backend.h), written out directly.
static int ref_lo(int b, int i, int T, int window, const std::vector<int32_t> &ds) {
    int lo = 0;
    if (window > 0) lo = std::max(lo, i - window + 1);
    if (!ds.empty()) lo = std::max(lo, (int)ds[(size_t)b * T + i]);
    return lo;
}

static Ref reference(const std::vector<float> &q, const std::vector<float> &k, const std::vector<float> &v,
                     const std::vector<float> &dO, int B, int T, int Hq, int Hkv, int D, int window,
                     const std::vector<int32_t> &ds, double scale = 0, double cap = 0) {
    Ref r;
    const int g = Hq / Hkv;
    const double sc = scale > 0 ? scale : 1.0 / sqrt((double)D);
    r.out.assign((size_t)B * T * Hq * D, 0), r.lse.assign((size_t)B * Hq * T, 0);
    r.dq.assign(r.out.size(), 0), r.dk.assign((size_t)B * T * Hkv * D, 0), r.dv.assign(r.dk.size(), 0);
    std::vector<double> p(T), dp(T), slope(T, 1.0);  // slope: the soft-cap's derivative
    auto Q = [&](int b, int t, int h) { return &q[(((size_t)b * T + t) * Hq + h) * D]; };
    auto K = [&](int b, int t, int h) { return &k[(((size_t)b * T + t) * Hkv + h) * D]; };
    auto V = [&](int b, int t, int h) { return &v[(((size_t)b * T + t) * Hkv + h) * D]; };
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < T; i++) {
                const int hk = h / g, lo = ref_lo(b, i, T, window, ds);
                double mx = -INFINITY, s = 0;
                for (int j = lo; j <= i; j++) {
                    double d = 0;
                    for (int e = 0; e < D; e++) d += (double)Q(b, i, h)[e] * K(b, j, hk)[e];
                    p[j] = d * sc;
                    if (cap > 0) {  // Gemma 2's soft-capping: cap tanh(s / cap)
                        const double t = tanh(p[j] / cap);
                        p[j] = cap * t, slope[j] = 1 - t * t;
                    }
                    mx = fmax(mx, p[j]);
                }
                for (int j = lo; j <= i; j++) s += exp(p[j] - mx);
                const double lse = mx + log(s);
                r.lse[((size_t)b * Hq + h) * T + i] = lse;
                double *o = &r.out[(((size_t)b * T + i) * Hq + h) * D];
                for (int j = lo; j <= i; j++) {
                    p[j] = exp(p[j] - lse);
                    for (int e = 0; e < D; e++) o[e] += p[j] * V(b, j, hk)[e];
                }
                const float *go = &dO[(((size_t)b * T + i) * Hq + h) * D];
                double Di = 0;
                for (int e = 0; e < D; e++) Di += go[e] * o[e];
                for (int j = lo; j <= i; j++) {
                    double d = 0;
                    for (int e = 0; e < D; e++) d += (double)go[e] * V(b, j, hk)[e];
                    const double ds = p[j] * (d - Di) * slope[j];
                    for (int e = 0; e < D; e++) {
                        r.dq[(((size_t)b * T + i) * Hq + h) * D + e] += sc * ds * K(b, j, hk)[e];
                        r.dk[(((size_t)b * T + j) * Hkv + hk) * D + e] += sc * ds * Q(b, i, h)[e];
                        r.dv[(((size_t)b * T + j) * Hkv + hk) * D + e] += p[j] * go[e];
                    }
                }
            }
    return r;
}

// Packed documents: each row cut into documents of 1..maxlen tokens (doc_start per token).
static std::vector<int32_t> make_docs(int B, int T, int maxlen) {
    std::vector<int32_t> ds((size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0, start = 0, left = 0; t < T; t++) {
            if (left == 0) start = t, left = 1 + (int)(urand() * maxlen);
            ds[(size_t)b * T + t] = start;
            left--;
        }
    return ds;
}

// window 0: none; docs 0: one document per row, else documents of at most docs tokens.
// path: 0 WMMA where it fits (the trainer's LLMC_ATT_MMA=0), 1 generic forced, 2 the mma kernels
// (the trainer's default)
// scale: the score scale (0: 1/sqrt(D)); cap: soft-capping (0: none; the generic kernels only).
static void one(CudaCtx *c, int B, int T, int Hq, int Hkv, int D, int path, int window = 0, int docs = 0,
                int tile = 0, float scale = 0, float cap = 0) {
    const int bf = c->bf16;
    c->force_generic_attention = path == 1;
    c->mma_attention = path == 2;
    char tag[160], name[256];
    snprintf(tag, sizeof tag, "%s [%s] B=%d T=%d Hq=%d Hkv=%d D=%d%s", prec(bf), k_attention_path(c, D), B, T, Hq,
             Hkv, D, window && docs ? " window+docs" : window ? " window" : docs ? " docs" : "");
    if (window) snprintf(tag + strlen(tag), sizeof tag - strlen(tag), " W=%d", window);
    if (docs) snprintf(tag + strlen(tag), sizeof tag - strlen(tag), " doclen<=%d", docs);
    if (scale > 0) snprintf(tag + strlen(tag), sizeof tag - strlen(tag), " scale=%.3f", scale);
    if (cap > 0)  // the WMMA path has no capped kernels: the generic ones run
        snprintf(tag + strlen(tag), sizeof tag - strlen(tag), " softcap=%.2f%s", cap,
                 !strncmp(k_attention_path(c, D), "wmma", 4) ? " (generic kernels)" : "");
    const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D;
    std::vector<float> q = randn(nq), k = randn(nk), v = randn(nk), dO = randn(nq);
    round_act(q, bf), round_act(k, bf), round_act(v, bf), round_act(dO, bf);
    std::vector<int32_t> ds = docs ? make_docs(B, T, docs) : std::vector<int32_t>();
    int32_t *d_ds = docs ? (int32_t *)up_bytes(ds.data(), ds.size() * 4) : nullptr;
    Ref r = reference(q, k, v, dO, B, T, Hq, Hkv, D, window, ds, scale, cap);
    void *dq_in = up_act(q, bf), *dk_in = up_act(k, bf), *dv_in = up_act(v, bf), *ddo = up_act(dO, bf);
    const size_t es = bf ? 2 : 4;
    void *out = dmalloc(nq * es), *dq = dmalloc(nq * es), *dk = dmalloc(nk * es), *dv = dmalloc(nk * es);
    float *lse = (float *)dmalloc((size_t)B * Hq * T * 4);
    k_attention_fwd(c, out, lse, dq_in, dk_in, dv_in, B, T, 0, T, Hq, Hkv, D, window, d_ds, scale, cap);
    const std::vector<float> f_out = down_act(out, nq, bf), f_lse = down_f32(lse, r.lse.size());
    snprintf(name, sizeof name, "attention_fwd out %s", tag);
    check(name, f_out, r.out, tol_for(bf));
    // lse is compared with an absolute tolerance relative to its typical size (~log T)
    snprintf(name, sizeof name, "attention_fwd lse %s", tag);
    check(name, f_lse, r.lse, bf ? 2e-3 : 1e-5);
    k_attention_bwd(c, dq, dk, dv, ddo, dq_in, dk_in, dv_in, out, lse, B, T, 0, T, Hq, Hkv, D, window, d_ds, 0, nullptr,
                    nullptr, scale, cap);
    std::vector<float> g_dq = down_act(dq, nq, bf), g_dk = down_act(dk, nk, bf), g_dv = down_act(dv, nk, bf);
    snprintf(name, sizeof name, "attention_bwd dq %s", tag);
    check(name, g_dq, r.dq, bf ? 2e-2 : 1e-5);
    snprintf(name, sizeof name, "attention_bwd dk %s", tag);
    check(name, g_dk, r.dk, bf ? 2e-2 : 1e-5);
    snprintf(name, sizeof name, "attention_bwd dv %s", tag);
    check(name, g_dv, r.dv, tol_for(bf));
    // The repeat, into poisoned (NaN) buffers, must give the same bits; on the mma path it runs in
    // one grid (LLMC_ATT_BWD_ONE_GRID=1) where the first run was two kernels.
    auto poison_grads = [&] {  // NaN bytes, so an element a run does not write shows
        cudaMemsetAsync(dq, 0xff, nq * es, c->stream), cudaMemsetAsync(dk, 0xff, nk * es, c->stream);
        cudaMemsetAsync(dv, 0xff, nk * es, c->stream);
    };
    poison_grads();
    c->att_bwd_one_grid = path == 2;
    k_attention_bwd(c, dq, dk, dv, ddo, dq_in, dk_in, dv_in, out, lse, B, T, 0, T, Hq, Hkv, D, window, d_ds, 0, nullptr,
                    nullptr, scale, cap);
    c->att_bwd_one_grid = 0;
    std::vector<float> h_dq = down_act(dq, nq, bf), h_dk = down_act(dk, nk, bf), h_dv = down_act(dv, nk, bf);
    snprintf(name, sizeof name, "attention_bwd %s %s",
             path == 2 ? "in one grid is bit-identical to two kernels" : "repeat is bit-identical", tag);
    check_true(name, !memcmp(g_dq.data(), h_dq.data(), nq * 4) && !memcmp(g_dk.data(), h_dk.data(), nk * 4) &&
                         !memcmp(g_dv.data(), h_dv.data(), nk * 4), "two runs differ");
    const int group = Hq / Hkv, split = path == 2 && group > 1;
    if (split) {  // GQA's dK/dV in parts (LLMC_ATT_KV_SPLIT), one per query head: the reference's
        // tolerances, dQ bit-identical to the unsplit run's, and one grid bit-identical to two kernels
        c->att_kv_split = group;
        for (int one_grid = 0; one_grid < 2; one_grid++) {
            c->att_bwd_one_grid = one_grid;
            poison_grads();
            k_attention_bwd(c, dq, dk, dv, ddo, dq_in, dk_in, dv_in, out, lse, B, T, 0, T, Hq, Hkv, D, window, d_ds, 0,
                            nullptr, nullptr, scale, cap);
            std::vector<float> s_dq = down_act(dq, nq, bf), s_dk = down_act(dk, nk, bf), s_dv = down_act(dv, nk, bf);
            if (!one_grid) {
                snprintf(name, sizeof name, "attention_bwd dk, dK/dV in %d parts, %s", group, tag);
                check(name, s_dk, r.dk, 2e-2);
                snprintf(name, sizeof name, "attention_bwd dv, dK/dV in %d parts, %s", group, tag);
                check(name, s_dv, r.dv, tol_for(bf));
                snprintf(name, sizeof name, "attention_bwd dq, dK/dV in %d parts, is the unsplit run's, %s", group, tag);
                check_true(name, !memcmp(g_dq.data(), s_dq.data(), nq * 4), "dq differs");
                h_dk = s_dk, h_dv = s_dv;
            } else {
                snprintf(name, sizeof name, "attention_bwd, dK/dV in %d parts, in one grid is bit-identical to two kernels, %s",
                         group, tag);
                check_true(name, !memcmp(g_dq.data(), s_dq.data(), nq * 4) && !memcmp(h_dk.data(), s_dk.data(), nk * 4) &&
                                     !memcmp(h_dv.data(), s_dv.data(), nk * 4), "two runs differ");
            }
        }
        c->att_bwd_one_grid = 0, c->att_kv_split = 1;
    }
    if (path == 2) {  // pipelined (LLMC_ATT_PIPELINE=1, cp.async): the same bits, into NaN-poisoned buffers
        c->att_pipeline = 1;
        for (int variant = 0; variant < 1 + split; variant++) {  // two kernels; then one grid, dK/dV in parts
            c->att_bwd_one_grid = variant, c->att_kv_split = variant ? group : 1;
            cudaMemsetAsync(out, 0xff, nq * es, c->stream), cudaMemsetAsync(lse, 0xff, (size_t)B * Hq * T * 4, c->stream);
            poison_grads();
            k_attention_fwd(c, out, lse, dq_in, dk_in, dv_in, B, T, 0, T, Hq, Hkv, D, window, d_ds, scale, cap);
            k_attention_bwd(c, dq, dk, dv, ddo, dq_in, dk_in, dv_in, out, lse, B, T, 0, T, Hq, Hkv, D, window, d_ds, 0,
                            nullptr, nullptr, scale, cap);
            const std::vector<float> &wk = variant ? h_dk : g_dk, &wv = variant ? h_dv : g_dv;
            snprintf(name, sizeof name, "attention pipelined (cp.async)%s: the same out, lse, dq, dk, dv bits, %s",
                     variant ? ", one grid, dK/dV in parts" : "", tag);
            check_true(name, down_act(out, nq, bf) == f_out && down_f32(lse, r.lse.size()) == f_lse &&
                                 down_act(dq, nq, bf) == g_dq && down_act(dk, nk, bf) == wk && down_act(dv, nk, bf) == wv,
                       "they differ");
        }
        c->att_pipeline = 0, c->att_bwd_one_grid = 0, c->att_kv_split = 1;
    }
    // query tiles of each row (tiled_attention): the same reference, the same tolerances; on the
    // mma path again pipelined, with GQA's dK/dV in parts (their sums accumulate across the tiles)
    for (int again = 0; tile && again <= (path == 2); again++) {
        const int parts = again && group > 1 ? group : 1;
        c->att_kv_split = parts, c->att_pipeline = again;
        const size_t lq = (size_t)Hq * D * es, lk = (size_t)Hkv * D * es, nkv = (size_t)T * Hkv * D;
        char *o2 = (char *)dmalloc(nq * es), *dq2 = (char *)dmalloc(nq * es), *dk2 = (char *)dmalloc(nk * es),
             *dv2 = (char *)dmalloc(nk * es);
        float *l2 = (float *)dmalloc((size_t)B * Hq * T * 4), *fk = (float *)dmalloc(nk * 4), *fv = (float *)dmalloc(nk * 4);
        for (int pass = 0; pass < 2; pass++)
            for (int b = 0; b < B; b++)
                for (int t0 = 0; t0 < T; t0 += tile) {
                    const int n = std::min(tile, T - t0);
                    const size_t r = (size_t)b * T + t0;
                    const char *qi = (const char *)dq_in + r * lq, *ki = (const char *)dk_in + b * T * lk,
                               *vi = (const char *)dv_in + b * T * lk;
                    const int32_t *dsb = d_ds ? d_ds + (size_t)b * T : nullptr;
                    if (pass == 0)
                        k_attention_fwd(c, o2 + r * lq, l2 + (size_t)b * Hq * T, qi, ki, vi, 1, T, t0, n, Hq, Hkv, D,
                                        window, dsb, scale, cap);
                    else
                        k_attention_bwd(c, dq2 + r * lq, dk2 + b * T * lk, dv2 + b * T * lk, (const char *)ddo + r * lq,
                                        qi, ki, vi, o2 + r * lq, l2 + (size_t)b * Hq * T, 1, T, t0, n, Hq, Hkv, D,
                                        window, dsb, t0 > 0, bf ? fk + b * nkv : nullptr, bf ? fv + b * nkv : nullptr, scale, cap);
                }
        c->att_kv_split = 1, c->att_pipeline = 0;
        char ttag[200];
        snprintf(ttag, sizeof ttag, "query tiles of %d%s%s, %s", tile, again ? ", pipelined" : "",
                 parts > 1 ? ", dK/dV in parts" : "", tag);
        if (!again) {
            snprintf(name, sizeof name, "attention_fwd out, query tiles of %d, %s", tile, tag);
            check(name, down_act(o2, nq, bf), r.out, tol_for(bf));
            snprintf(name, sizeof name, "attention_fwd lse, query tiles of %d, %s", tile, tag);
            check(name, down_f32(l2, r.lse.size()), r.lse, bf ? 2e-3 : 1e-5);
        }
        snprintf(name, sizeof name, "attention_bwd dq, %s", ttag);
        check(name, down_act(dq2, nq, bf), r.dq, bf ? 2e-2 : 1e-5);
        snprintf(name, sizeof name, "attention_bwd dk (summed over tiles), %s", ttag);
        check(name, down_act(dk2, nk, bf), r.dk, bf ? 2e-2 : 1e-5);
        snprintf(name, sizeof name, "attention_bwd dv (summed over tiles), %s", ttag);
        check(name, down_act(dv2, nk, bf), r.dv, tol_for(bf));
        cudaFree(o2), cudaFree(dq2), cudaFree(dk2), cudaFree(dv2), cudaFree(l2), cudaFree(fk), cudaFree(fv);
    }
    cudaFree(dq_in), cudaFree(dk_in), cudaFree(dv_in), cudaFree(ddo), cudaFree(out), cudaFree(dq), cudaFree(dk),
        cudaFree(dv), cudaFree(lse);
    if (d_ds) cudaFree(d_ds);
    c->force_generic_attention = 0, c->mma_attention = 0;
}

static void bench(CudaCtx *c, int B, int T, int Hq, int Hkv, int D) {
    const int bf = c->bf16;
    const size_t es = bf ? 2 : 4, nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D;
    void *q = dmalloc(nq * es), *k = dmalloc(nk * es), *v = dmalloc(nk * es), *o = dmalloc(nq * es), *g = dmalloc(nq * es);
    void *dq = dmalloc(nq * es), *dk = dmalloc(nk * es), *dv = dmalloc(nk * es);
    float *lse = (float *)dmalloc((size_t)B * Hq * T * 4);
    dev_noise(q, nq * es, es);
    dev_noise(k, nk * es, es);
    dev_noise(v, nk * es, es);
    dev_noise(g, nq * es, es);
    const double flops = 2.0 * 2.0 * B * Hq * ((double)T * T / 2) * D;
    char name[160];
    // mma: as it is, then pipelined (cp.async); the backward as two kernels, then one grid; with
    // GQA each again with dK/dV in 2, 4, .. parts (one per query head at most)
    const int mma = c->mma_attention && bf, most = mma ? Hq / Hkv : 1;
    for (int pipe = 0; pipe <= mma; pipe++) {
        c->att_pipeline = pipe;
        snprintf(name, sizeof name, "attention_fwd %s [%s] B=%d T=%d Hq=%d Hkv=%d D=%d", prec(bf), k_attention_path(c, D), B, T, Hq, Hkv, D);
        report_flops(name, bench_ms(c, 5, [&] { k_attention_fwd(c, o, lse, q, k, v, B, T, 0, T, Hq, Hkv, D, 0, nullptr, 0, 0); }), flops);
        for (int parts = 1; parts <= most; parts *= 2)
            for (int one = 0; one <= mma; one++) {
                c->att_bwd_one_grid = one, c->att_kv_split = parts;
                snprintf(name, sizeof name, "attention_bwd %s [%s] B=%d T=%d Hq=%d Hkv=%d D=%d", prec(bf),
                         k_attention_path(c, D), B, T, Hq, Hkv, D);
                report_flops(name, bench_ms(c, 5, [&] { k_attention_bwd(c, dq, dk, dv, g, q, k, v, o, lse, B, T, 0, T, Hq, Hkv, D, 0, nullptr, 0, nullptr, nullptr, 0, 0); }), 2.5 * flops);
            }
    }
    c->att_pipeline = 0, c->att_bwd_one_grid = 0, c->att_kv_split = 1;
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(g), cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(lse);
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    for (int bf = 0; bf < 2; bf++) {
        CudaCtx *c = cuda_ctx_create(bf, 0);
        one(c, 2, 70, 4, 2, 16, 0);
        one(c, 1, 130, 2, 1, 64, 0);
        one(c, 1, 40, 3, 3, 24, 0);  // D not a multiple of 16: generic in bf16 too
        if (bf) one(c, 1, 70, 2, 1, 64, 1);
        // masks: windows and documents shorter than a tile (whole key tiles skipped), both paths
        one(c, 1, 130, 2, 1, 16, 0, 20, 0);   // window (bf16: WMMA, 64-row tiles)
        one(c, 2, 100, 2, 2, 24, 0, 0, 40);   // documents, generic (D 24)
        one(c, 1, 150, 4, 2, 16, 0, 45, 30);  // window and documents, GQA
        if (bf) one(c, 1, 130, 2, 1, 16, 1, 33, 50);  // bf16 forced generic
        // query tiles of 64 (tiled_attention): uneven last tile, GQA, window + documents, both paths
        one(c, 2, 200, 4, 2, 16, 0, 45, 70, 64);
        one(c, 1, 150, 2, 1, 24, 0, 0, 0, 64);  // generic (D 24)
        // Gemma 2: a given score scale and soft-capped scores (the generic kernels, the mma
        // kernels' capped instances; the WMMA path falls back to the generic ones), with a
        // window, GQA and query tiles
        one(c, 1, 70, 4, 2, 16, 0, 0, 0, 0, 0.2f, 0.9f);
        one(c, 2, 130, 4, 2, 16, bf ? 2 : 0, 20, 0, 64, 0.3f, 1.5f);
        if (bf) {  // the mma kernels' capped instances at other head dims, with documents, GQA 4
            one(c, 1, 130, 2, 1, 64, 2, 0, 0, 0, 0.125f, 2.0f);
            one(c, 1, 150, 8, 2, 128, 2, 45, 30, 0, 0, 1.0f);
        }
        one(c, 1, 130, 2, 1, 64, bf ? 2 : 0, 0, 0, 0, 0.11f);  // a given scale alone: the tensor-core kernels
        if (bf) {  // the mma.sync kernels (the trainer's default), every head-dim instance and mask
            one(c, 2, 70, 4, 2, 16, 2);
            one(c, 1, 130, 2, 1, 64, 2);
            one(c, 1, 100, 2, 2, 32, 2);
            one(c, 1, 70, 2, 1, 96, 2);
            one(c, 1, 70, 2, 1, 128, 2);
            one(c, 1, 130, 2, 1, 16, 2, 20, 0);
            one(c, 1, 150, 4, 2, 16, 2, 45, 30);
            one(c, 2, 200, 4, 2, 16, 2, 45, 70, 64);
            one(c, 1, 130, 8, 2, 32, 2, 0, 0, 64);  // a group of 4: dK/dV in 4 parts, summed in order
        }
        if (!g_quick) {
            one(c, 1, 200, 4, 1, 128, 0);
            // two square shapes, then the trainer's: the 1.1B benchmark (GQA 32/4, one row) and
            // GPT-2 124M at llm.c's B 16, T 1024
            const int shapes[4][5] = {{4, 4096, 32, 8, 128}, {8, 2048, 32, 32, 64}, {1, 4096, 32, 4, 64}, {16, 1024, 12, 12, 64}};
            for (int mma = 0; mma <= bf; mma++) {  // WMMA (generic in fp32), then the mma kernels
                c->mma_attention = mma;
                for (const auto &s : shapes) bench(c, s[0], s[1], s[2], s[3], s[4]);
            }
            c->mma_attention = 0;
        }
        cuda_ctx_destroy(c);
    }
    return dev_finish("attention");
}
