// seqpar.c: see seqpar.h.
#include "seqpar.h"
#include <stdio.h>
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

void seqpar_init(SeqPar *sp, Backend *bk, Comm *c, int n, int B, int T, int Hq, int D) {
    sp->n = n, sp->rank = c->rank % n, sp->T = T, sp->comm = c;
    // Every reshuffle moves at most one sequence-sharded tensor of Hq heads (the largest).
    sp->cap = (size_t)B * (T / n) * Hq * D * bk->act_bytes;
    sp->send = bk->dev_alloc(bk, sp->cap, "sequence-parallel send staging");
    sp->recv = bk->dev_alloc(bk, sp->cap, "sequence-parallel receive staging");
}

void seqpar_free(SeqPar *sp, Backend *bk) {
    if (sp->send) bk->dev_free(bk, sp->send);
    if (sp->recv) bk->dev_free(bk, sp->recv);
    sp->send = sp->recv = NULL;
}

void seqpar_to_heads(SeqPar *sp, Backend *bk, void *x_h, const void *x_loc, int B, int H, int D, int kv) {
    const int n = sp->n, Tl = sp->T / n, h = seqpar_heads(n, H, kv);
    const size_t e = bk->act_bytes, row = (size_t)H * D * e, part = (size_t)h * D * e;
    const size_t blk = (size_t)B * Tl * h * D;  // elements per rank
    if (blk * e * n > sp->cap) fail("internal: sequence-parallel staging too small");
    // Block r of send: my tokens, rank r's heads.
    for (int r = 0; r < n; r++)
        bk->copy_2d(bk, (char *)sp->send + r * blk * e, part, (const char *)x_loc + seqpar_first(n, H, kv, r) * D * e,
                    row, part, (size_t)B * Tl, NULL);
    sp->comm->all_to_all(sp->comm, sp->recv, sp->send, blk);
    // Block s of recv: rank s's tokens, my heads -> tokens [s Tl, (s + 1) Tl) of each sequence.
    for (int s = 0; s < n; s++)
        bk->copy_2d(bk, (char *)x_h + (size_t)s * Tl * part, (size_t)sp->T * part, (char *)sp->recv + s * blk * e,
                    (size_t)Tl * part, (size_t)Tl * part, (size_t)B, NULL);
}

void seqpar_to_seq(SeqPar *sp, Backend *bk, void *x_loc, const void *x_h, int B, int H, int D, int kv) {
    const int n = sp->n, Tl = sp->T / n, h = seqpar_heads(n, H, kv);
    const size_t e = bk->act_bytes, row = (size_t)H * D * e, part = (size_t)h * D * e;
    const size_t blk = (size_t)B * Tl * h * D;
    if (blk * e * n > sp->cap) fail("internal: sequence-parallel staging too small");
    // Block s of send: rank s's tokens, my heads.
    for (int s = 0; s < n; s++)
        bk->copy_2d(bk, (char *)sp->send + s * blk * e, (size_t)Tl * part, (const char *)x_h + (size_t)s * Tl * part,
                    (size_t)sp->T * part, (size_t)Tl * part, (size_t)B, NULL);
    sp->comm->all_to_all(sp->comm, sp->recv, sp->send, blk);
    const int rep = kv && H < n ? n / H : 1;  // ranks that share each key/value head
    for (int r = 0; r < n; r += rep) {
        char *first = (char *)sp->recv + r * blk * e;
        for (int j = 1; j < rep; j++) bk->accumulate(bk, first, first + (size_t)j * blk * e, blk);
        bk->copy_2d(bk, (char *)x_loc + seqpar_first(n, H, kv, r) * D * e, row, first, part, part,
                    (size_t)B * Tl, NULL);
    }
}
