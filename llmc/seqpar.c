// seqpar.c: see seqpar.h.
#include "seqpar.h"
#include <stdio.h>
#include <string.h>
#include "util.h"

const char *seqpar_unsupported(int n, int T, int Hq, int Hkv) {
    static char why[256];
    why[0] = 0;
    if (n < 1) snprintf(why, sizeof why, "the degree must be at least 1, not %d", n);
    else if (T % n)
        snprintf(why, sizeof why, "sequence_len %d is not divisible by %d (each rank holds an equal slice)", T, n);
    else if (Hq % n)
        snprintf(why, sizeof why, "the %d attention heads do not split over %d ranks", Hq, n);
    else if (Hkv % n && n % Hkv)
        snprintf(why, sizeof why, "the %d key/value heads neither split over %d ranks nor divide %d", Hkv, n, n);
    return why;
}

int seqpar_heads(int n, int H, int kv) { return kv && H < n ? 1 : H / n; }

int seqpar_first(int n, int H, int kv, int r) {
    // Key/value heads fewer than ranks: rank r's query heads all use head r * H / n.
    return kv && H < n ? (int)((long)r * H / n) : r * (H / n);
}

// Bytes of one head-sharded query-layout and key/value-layout tensor; the staging is the
// largest reshuffle, one sequence-sharded tensor of Hq heads.
static void sizes(int n, int B, int T, int Hq, int Hkv, int D, size_t e, size_t *qb, size_t *kb) {
    *qb = (size_t)B * T * (Hq / n) * D * e;
    *kb = (size_t)B * T * seqpar_heads(n, Hkv, 1) * D * e;
}

// The all-to-alls run in rounds over slices of the local tokens, so the staging holds one
// slice: at most this much per buffer (and at least one token row per rank).
#define STAGE_BYTES ((size_t)256 << 20)

static size_t stage_bytes(size_t qb) { return qb < STAGE_BYTES ? qb : STAGE_BYTES; }

size_t seqpar_bytes(int n, int B, int T, int Hq, int Hkv, int D, size_t act_bytes) {
    size_t qb, kb;
    sizes(n, B, T, Hq, Hkv, D, act_bytes, &qb, &kb);
    return 2 * stage_bytes(qb) + 4 * qb + 4 * kb;  // staging, q/o/dout/dq, k/v/dk/dv
}

void seqpar_init(SeqPar *sp, Backend *bk, Comm *c, int n, int B, int T, int Hq, int Hkv, int D) {
    if (c->world != n)
        fail("sequence_parallel_degree %d needs exactly %d ranks (this run has %d); data parallelism "
             "across sequence-parallel groups is not implemented", n, n, c->world);
    const char *why = seqpar_unsupported(n, T, Hq, Hkv);
    if (why[0]) fail("sequence_parallel_degree %d: %s", n, why);
    memset(sp, 0, sizeof *sp);
    sp->n = n, sp->rank = c->rank, sp->T = T, sp->comm = c, sp->Hq = Hq, sp->Hkv = Hkv, sp->D = D;
    size_t qb, kb;
    sizes(n, B, T, Hq, Hkv, D, bk->act_bytes, &qb, &kb);
    sp->cap = stage_bytes(qb);
    sp->send = bk->dev_alloc(bk, sp->cap, "sequence-parallel send staging");
    sp->recv = bk->dev_alloc(bk, sp->cap, "sequence-parallel receive staging");
    void **qs[] = {&sp->q, &sp->o, &sp->dout, &sp->dq}, **ks[] = {&sp->k, &sp->v, &sp->dk, &sp->dv};
    for (int i = 0; i < 4; i++) *qs[i] = bk->dev_alloc(bk, qb, "sequence-parallel attention (query heads)");
    for (int i = 0; i < 4; i++) *ks[i] = bk->dev_alloc(bk, kb, "sequence-parallel attention (key/value heads)");
}

void seqpar_free(SeqPar *sp, Backend *bk) {
    void **all[] = {&sp->send, &sp->recv, &sp->q, &sp->o, &sp->dout, &sp->dq, &sp->k, &sp->v, &sp->dk, &sp->dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        if (*all[i]) bk->dev_free(bk, *all[i]);
        *all[i] = NULL;
    }
}

void seqpar_attention_fwd(SeqPar *sp, Backend *bk, void *out, float *lse, const void *q, const void *k,
                          const void *v, int B, int window, const int32_t *doc_start, float scale,
                          float softcap) {
    const int n = sp->n, Hq = sp->Hq, Hkv = sp->Hkv, D = sp->D;
    seqpar_to_heads(sp, bk, sp->q, q, B, Hq, D, 0);
    seqpar_to_heads(sp, bk, sp->k, k, B, Hkv, D, 1);
    seqpar_to_heads(sp, bk, sp->v, v, B, Hkv, D, 1);
    bk->attention_fwd(bk, sp->o, lse, sp->q, sp->k, sp->v, B, sp->T, 0, sp->T, Hq / n, seqpar_heads(n, Hkv, 1), D, window,
                      doc_start, scale, softcap);
    seqpar_to_seq(sp, bk, out, sp->o, B, Hq, D, 0);
}

void seqpar_attention_bwd(SeqPar *sp, Backend *bk, void *dq, void *dk, void *dv, const void *dout,
                          const void *q, const void *k, const void *v, const void *out, const float *lse, int B,
                          int window, const int32_t *doc_start, float scale, float softcap) {
    const int n = sp->n, Hq = sp->Hq, Hkv = sp->Hkv, D = sp->D;
    seqpar_to_heads(sp, bk, sp->q, q, B, Hq, D, 0);
    seqpar_to_heads(sp, bk, sp->k, k, B, Hkv, D, 1);
    seqpar_to_heads(sp, bk, sp->v, v, B, Hkv, D, 1);
    seqpar_to_heads(sp, bk, sp->o, out, B, Hq, D, 0);
    seqpar_to_heads(sp, bk, sp->dout, dout, B, Hq, D, 0);
    bk->attention_bwd(bk, sp->dq, sp->dk, sp->dv, sp->dout, sp->q, sp->k, sp->v, sp->o, lse, B, sp->T, 0, sp->T, Hq / n,
                      seqpar_heads(n, Hkv, 1), D, window, doc_start, 0, NULL, NULL, scale, softcap);
    seqpar_to_seq(sp, bk, dq, sp->dq, B, Hq, D, 0);
    seqpar_to_seq(sp, bk, dk, sp->dk, B, Hkv, D, 1);
    seqpar_to_seq(sp, bk, dv, sp->dv, B, Hkv, D, 1);
}

// Local tokens per round: as many as the staging holds for all n ranks' blocks.
static int round_tokens(const SeqPar *sp, int B, size_t part) {
    const int Tl = sp->T / sp->n;
    size_t m = sp->cap / ((size_t)sp->n * B * part);
    if (m < 1) fail("internal: sequence-parallel staging below one token row");
    return m < (size_t)Tl ? (int)m : Tl;
}

void seqpar_to_heads(SeqPar *sp, Backend *bk, void *x_h, const void *x_loc, int B, int H, int D, int kv) {
    const int n = sp->n, Tl = sp->T / n, h = seqpar_heads(n, H, kv);
    const size_t e = bk->act_bytes, row = (size_t)H * D * e, part = (size_t)h * D * e;
    const int M = round_tokens(sp, B, part);
    for (int t0 = 0; t0 < Tl; t0 += M) {
        const int m = Tl - t0 < M ? Tl - t0 : M;
        const size_t blk = (size_t)B * m * h * D;  // elements per rank this round
        // Block r of send: tokens t0..t0+m of mine (each sequence), rank r's heads.
        for (int r = 0; r < n; r++)
            for (int b = 0; b < B; b++)
                bk->copy_2d(bk, (char *)sp->send + (r * blk + (size_t)b * m * h * D) * e, part,
                            (const char *)x_loc + ((size_t)b * Tl + t0) * row + seqpar_first(n, H, kv, r) * D * e,
                            row, part, (size_t)m, NULL);
        sp->comm->all_to_all(sp->comm, sp->recv, sp->send, blk);
        // Block s of recv: rank s's tokens t0..t0+m -> tokens s Tl + t0.. of each sequence.
        for (int s = 0; s < n; s++)
            bk->copy_2d(bk, (char *)x_h + ((size_t)s * Tl + t0) * part, (size_t)sp->T * part,
                        (char *)sp->recv + s * blk * e, (size_t)m * part, (size_t)m * part, (size_t)B, NULL);
    }
}

void seqpar_to_seq(SeqPar *sp, Backend *bk, void *x_loc, const void *x_h, int B, int H, int D, int kv) {
    const int n = sp->n, Tl = sp->T / n, h = seqpar_heads(n, H, kv);
    const size_t e = bk->act_bytes, row = (size_t)H * D * e, part = (size_t)h * D * e;
    const int M = round_tokens(sp, B, part);
    const int rep = kv && H < n ? n / H : 1;  // ranks that share each key/value head
    for (int t0 = 0; t0 < Tl; t0 += M) {
        const int m = Tl - t0 < M ? Tl - t0 : M;
        const size_t blk = (size_t)B * m * h * D;
        // Block s of send: rank s's tokens t0..t0+m, my heads.
        for (int s = 0; s < n; s++)
            bk->copy_2d(bk, (char *)sp->send + s * blk * e, (size_t)m * part,
                        (const char *)x_h + ((size_t)s * Tl + t0) * part, (size_t)sp->T * part, (size_t)m * part,
                        (size_t)B, NULL);
        sp->comm->all_to_all(sp->comm, sp->recv, sp->send, blk);
        for (int r = 0; r < n; r += rep) {
            char *first = (char *)sp->recv + r * blk * e;
            for (int j = 1; j < rep; j++) bk->accumulate(bk, first, first + (size_t)j * blk * e, blk);
            for (int b = 0; b < B; b++)
                bk->copy_2d(bk, (char *)x_loc + ((size_t)b * Tl + t0) * row + seqpar_first(n, H, kv, r) * D * e, row,
                            first + (size_t)b * m * part, part, part, (size_t)m, NULL);
        }
    }
}
