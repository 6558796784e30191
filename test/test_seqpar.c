// test_seqpar.c: sequence parallelism's reshuffles and attention through them, run by
// test/test_seqpar.py as one process and under `mpirun -np N`. Every rank builds the same
// global q/k/v (a function of their indices), keeps its token slice, and checks:
//   to_heads       its head-sharded tensors are exactly the global ones' heads;
//   round trip     to_seq(to_heads(x)) = x for query-layout tensors, bit for bit;
//   replicated     key/value pieces of ranks sharing a head are summed in rank order;
//   attention      forward through the reshuffles = the slice of full attention (bit for bit)
//                  and backward dq/dk/dv within 1e-6 (a replicated head's sum is reordered),
//                  with a sliding window and a document map over the whole sequence.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmc/backend.h"
#include "llmc/comm.h"
#include "llmc/seqpar.h"
#include "llmc/util.h"

static int bad;
static Comm *C;

static void expect(int ok, const char *what, double err) {
    if (!ok) {
        if (bad < 5) fprintf(stderr, "rank %d: %s (error %g)\n", C->rank, what, err);
        bad++;
    }
}

static float val(int t, int h, int d, int b, int which) {
    return sinf(0.37f * t + 1.3f * h + 0.11f * d + 2.1f * b + 0.7f * which);
}

// x[B][T][H][D] global -> slice [B][Tl][H][D] of rank r
static void slice(float *out, const float *x, int B, int T, int Tl, int H, int D, int r) {
    for (int b = 0; b < B; b++)
        memcpy(out + (size_t)b * Tl * H * D, x + ((size_t)b * T + (size_t)r * Tl) * H * D, sizeof(float) * Tl * H * D);
}

static float maxdiff(const float *a, const float *b, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

// rounds > 0: the staging holds that many query-layout tokens per rank, so the all-to-alls run
// in several (uneven) rounds, as they do at long context.
static void run_shape(Backend *bk, int n, int B, int T, int Hq, int Hkv, int D, int window, int docs, int rounds) {
    const int r = C->rank, Tl = T / n, hq = seqpar_heads(n, Hq, 0), hk = seqpar_heads(n, Hkv, 1);
    const size_t NQ = (size_t)B * T * Hq * D, NK = (size_t)B * T * Hkv * D;
    float *q = xmalloc(4 * NQ), *k = xmalloc(4 * NK), *v = xmalloc(4 * NK), *o = xmalloc(4 * NQ);
    float *dq = xmalloc(4 * NQ), *dk = xmalloc(4 * NK), *dv = xmalloc(4 * NK), *dout = xmalloc(4 * NQ);
    float *lse = xmalloc(4 * (size_t)B * Hq * T);
    int32_t *ds = xmalloc(4 * (size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) ds[(size_t)b * T + t] = docs ? (t < T / 3 ? 0 : t < T / 3 + 5 ? T / 3 : T / 3 + 5) : 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < Hq; h++)
                for (int d = 0; d < D; d++) {
                    size_t i = (((size_t)b * T + t) * Hq + h) * D + d;
                    q[i] = val(t, h, d, b, 0), dout[i] = val(t, h, d, b, 3);
                }
            for (int h = 0; h < Hkv; h++)
                for (int d = 0; d < D; d++) {
                    size_t i = (((size_t)b * T + t) * Hkv + h) * D + d;
                    k[i] = val(t, h, d, b, 1), v[i] = val(t, h, d, b, 2);
                }
        }
    const int32_t *dmap = docs ? ds : NULL;
    // Full attention on every rank: the reference.
    bk->attention_fwd(bk, o, lse, q, k, v, B, T, 0, T, Hq, Hkv, D, window, dmap, 0, 0);
    bk->attention_bwd(bk, dq, dk, dv, dout, q, k, v, o, lse, B, T, 0, T, Hq, Hkv, D, window, dmap, 0, NULL, NULL, 0, 0);

    SeqPar sp;
    seqpar_init(&sp, bk, C, n, B, T, Hq, Hkv, D);
    if (rounds) sp.cap = (size_t)n * B * hq * D * sizeof(float) * rounds;  // within what was allocated
    const size_t nq = (size_t)B * Tl * Hq * D, nk = (size_t)B * Tl * Hkv * D;
    const size_t hq_n = (size_t)B * T * hq * D, hk_n = (size_t)B * T * hk * D;
    float *ql = xmalloc(4 * nq), *kl = xmalloc(4 * nk), *vl = xmalloc(4 * nk), *dol = xmalloc(4 * nq);
    slice(ql, q, B, T, Tl, Hq, D, r), slice(kl, k, B, T, Tl, Hkv, D, r), slice(vl, v, B, T, Tl, Hkv, D, r);
    slice(dol, dout, B, T, Tl, Hq, D, r);
    float *qh = xmalloc(4 * hq_n), *kh = xmalloc(4 * hk_n), *vh = xmalloc(4 * hk_n), *oh = xmalloc(4 * hq_n);
    float *doh = xmalloc(4 * hq_n), *dqh = xmalloc(4 * hq_n), *dkh = xmalloc(4 * hk_n), *dvh = xmalloc(4 * hk_n);
    float *lseh = xmalloc(4 * (size_t)B * hq * T);
    seqpar_to_heads(&sp, bk, qh, ql, B, Hq, D, 0);
    seqpar_to_heads(&sp, bk, kh, kl, B, Hkv, D, 1);
    seqpar_to_heads(&sp, bk, vh, vl, B, Hkv, D, 1);
    // to_heads: exactly the global heads of this rank
    float e = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < hq; h++)
                for (int d = 0; d < D; d++)
                    e = fmaxf(e, fabsf(qh[(((size_t)b * T + t) * hq + h) * D + d] -
                                       q[(((size_t)b * T + t) * Hq + seqpar_first(n, Hq, 0, r) + h) * D + d]));
            for (int h = 0; h < hk; h++)
                for (int d = 0; d < D; d++)
                    e = fmaxf(e, fabsf(kh[(((size_t)b * T + t) * hk + h) * D + d] -
                                       k[(((size_t)b * T + t) * Hkv + seqpar_first(n, Hkv, 1, r) + h) * D + d]));
        }
    expect(e == 0, "to_heads differs from the global heads", e);
    // round trip of a query-layout tensor
    float *back = xmalloc(4 * nq);
    seqpar_to_seq(&sp, bk, back, qh, B, Hq, D, 0);
    expect(maxdiff(back, ql, nq) == 0, "to_seq(to_heads(q)) != q", maxdiff(back, ql, nq));
    // attention through the reshuffles
    bk->attention_fwd(bk, oh, lseh, qh, kh, vh, B, T, 0, T, hq, hk, D, window, dmap, 0, 0);
    float *ol = xmalloc(4 * nq), *oref = xmalloc(4 * nq);
    seqpar_to_seq(&sp, bk, ol, oh, B, Hq, D, 0);
    slice(oref, o, B, T, Tl, Hq, D, r);
    expect(maxdiff(ol, oref, nq) == 0, "attention forward through the reshuffles differs", maxdiff(ol, oref, nq));
    seqpar_to_heads(&sp, bk, doh, dol, B, Hq, D, 0);
    bk->attention_bwd(bk, dqh, dkh, dvh, doh, qh, kh, vh, oh, lseh, B, T, 0, T, hq, hk, D, window, dmap, 0, NULL, NULL, 0, 0);
    float *dql = xmalloc(4 * nq), *dkl = xmalloc(4 * nk), *dvl = xmalloc(4 * nk);
    float *rq = xmalloc(4 * nq), *rk = xmalloc(4 * nk), *rv = xmalloc(4 * nk);
    seqpar_to_seq(&sp, bk, dql, dqh, B, Hq, D, 0);
    seqpar_to_seq(&sp, bk, dkl, dkh, B, Hkv, D, 1);
    seqpar_to_seq(&sp, bk, dvl, dvh, B, Hkv, D, 1);
    slice(rq, dq, B, T, Tl, Hq, D, r), slice(rk, dk, B, T, Tl, Hkv, D, r), slice(rv, dv, B, T, Tl, Hkv, D, r);
    float eq = maxdiff(dql, rq, nq), ek = maxdiff(dkl, rk, nk), ev = maxdiff(dvl, rv, nk);
    expect(eq <= 1e-6f && ek <= 1e-6f && ev <= 1e-6f, "attention backward through the reshuffles differs",
           fmaxf(eq, fmaxf(ek, ev)));
    if (Hkv >= n) expect(eq == 0 && ek == 0 && ev == 0, "backward not bit-identical without replication",
                         fmaxf(eq, fmaxf(ek, ev)));
    // the same through the layer-level wrappers (lse kept head-sharded)
    seqpar_attention_fwd(&sp, bk, ol, lseh, ql, kl, vl, B, window, dmap, 0, 0);
    expect(maxdiff(ol, oref, nq) == 0, "seqpar_attention_fwd differs", maxdiff(ol, oref, nq));
    seqpar_attention_bwd(&sp, bk, dql, dkl, dvl, dol, ql, kl, vl, ol, lseh, B, window, dmap, 0, 0);
    eq = maxdiff(dql, rq, nq), ek = maxdiff(dkl, rk, nk), ev = maxdiff(dvl, rv, nk);
    expect(eq <= 1e-6f && ek <= 1e-6f && ev <= 1e-6f, "seqpar_attention_bwd differs", fmaxf(eq, fmaxf(ek, ev)));
    seqpar_free(&sp, bk);
    free(q), free(k), free(v), free(o), free(dq), free(dk), free(dv), free(dout), free(lse), free(ds);
    free(ql), free(kl), free(vl), free(dol), free(qh), free(kh), free(vh), free(oh), free(doh), free(dqh);
    free(dkh), free(dvh), free(lseh), free(back), free(ol), free(oref), free(dql), free(dkl), free(dvl);
    free(rq), free(rk), free(rv);
}

int main(int argc, char **argv) {
    C = comm_create(&argc, &argv);
    Backend *bk = backend_cpu_create(1);
    const int n = C->world;
    // (Hq, Hkv): even splits, replicated key/value heads (Hkv < n), multi-query
    static const int shapes[][2] = {{4, 2}, {4, 4}, {6, 3}, {6, 1}, {8, 2}, {12, 4}};
    int ran = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int Hq = shapes[s][0], Hkv = shapes[s][1], T = 24;
        if (seqpar_unsupported(n, T, Hq, Hkv)[0]) continue;
        run_shape(bk, n, 2, T, Hq, Hkv, 8, 0, 0, 0);
        run_shape(bk, n, 1, T, Hq, Hkv, 8, 5, 1, 0);  // window 5 and three documents
        run_shape(bk, n, 2, T, Hq, Hkv, 8, 5, 1, 5);  // the same in rounds of 5 tokens (5, 5, 2 at n = 2)
        ran++;
    }
    double b = bad;
    C->all_reduce_sum_f64(C, &b, 1);
    if (C->rank == 0) {
        if (b == 0) printf("PASS sequence parallel reshuffles and attention, %d ranks (%d head layouts)\n", n, ran);
        else printf("FAIL sequence parallel, %d ranks: %.0f failed checks\n", n, b);
    }
    bk->destroy(bk);
    C->destroy(C);
    return b == 0 ? 0 : 1;
}
